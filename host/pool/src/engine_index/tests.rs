use ringmaster_gpu_runtime::block::block_hashes;
use ringmaster_kv_events::{Batch, BlockRemoved, BlockStored, EngineHash, Event};

use super::*;

fn tokens(n: u32) -> Vec<u32> {
    (1000..1000 + n).collect()
}

fn batch(events: Vec<Event>) -> Batch {
    Batch {
        ts: 0.0,
        events,
        data_parallel_rank: None,
    }
}

/// `n` engine blocks of `size` tokens each over `tokens`, hashes `first..`, after `parent`.
fn stored(tokens: &[u32], size: usize, first: i128, parent: Option<i128>) -> Event {
    let n = tokens.len() / size;
    Event::Stored(BlockStored {
        block_hashes: (first..first + n as i128).map(EngineHash::Int).collect(),
        parent_block_hash: parent.map(EngineHash::Int),
        token_ids: tokens[..n * size].to_vec(),
        block_size: size as u32,
        ..BlockStored::default()
    })
}

fn removed(hashes: impl IntoIterator<Item = i128>) -> Event {
    Event::Removed(BlockRemoved {
        block_hashes: hashes.into_iter().map(EngineHash::Int).collect(),
        ..BlockRemoved::default()
    })
}

fn synced() -> ReportedCache {
    let cache = ReportedCache::default();
    cache.mark_synced();
    cache
}

#[test]
fn stored_blocks_match_the_prompt_under_our_own_hash() {
    let prompt = tokens(64);
    let ours = block_hashes(&prompt);
    assert_eq!(
        salted_block_hashes(&prompt, 0),
        ours,
        "salt 0 is the plain chain"
    );
    let cache = synced();
    let mut index = EngineIndex::default();
    // The engine's hashes are arbitrary numbers: nothing of them reaches the key.
    let a = index.apply(&batch(vec![stored(&prompt[..32], 16, 7_000, None)]), &cache);
    assert_eq!(a.stored, 2);
    assert_eq!(cache.held_blocks(&ours), Some(2));
    // The rest, chained to the engine's hash of block 2.
    index.apply(
        &batch(vec![stored(&prompt[32..], 16, 9_000, Some(7_001))]),
        &cache,
    );
    assert_eq!(cache.held_blocks(&ours), Some(4));
    // Removing block 3 cuts the lead at 2.
    let a = index.apply(&batch(vec![removed([9_000])]), &cache);
    assert_eq!(a.removed, 1);
    assert_eq!(cache.held_blocks(&ours), Some(2));
    assert_eq!(index.engine_blocks(), 3);
    assert_eq!(index.blocks(), 3);
}

#[test]
fn any_engine_block_size_lands_on_our_blocks() {
    let prompt = tokens(64);
    let ours = block_hashes(&prompt);
    for size in [1usize, 4, 16, 32, 64] {
        let cache = synced();
        let mut index = EngineIndex::default();
        // One event per engine block, each chained to the one before (as SGLang sends pages).
        let mut parent = None;
        for (i, chunk) in prompt.chunks_exact(size).enumerate() {
            let hash = 100 + i as i128;
            index.apply(&batch(vec![stored(chunk, size, hash, parent)]), &cache);
            parent = Some(hash);
        }
        assert_eq!(
            cache.held_blocks(&ours),
            Some(4),
            "engine block size {size}"
        );
        // Removing the engine's last block drops those of ours it completed.
        index.apply(&batch(vec![removed([parent.unwrap()])]), &cache);
        let completed_by_last = (size / 16).max(1);
        assert_eq!(
            cache.held_blocks(&ours),
            Some(4 - completed_by_last),
            "engine block size {size}"
        );
    }
}

#[test]
fn an_adapter_or_extra_keys_never_match_the_base_prompt() {
    let prompt = tokens(32);
    let cache = synced();
    let mut index = EngineIndex::default();
    let Event::Stored(mut lora) = stored(&prompt, 16, 1, None) else {
        unreachable!()
    };
    lora.lora_name = Some("sql-adapter".into());
    index.apply(&batch(vec![Event::Stored(lora)]), &cache);
    assert_eq!(cache.held_blocks(&block_hashes(&prompt)), Some(0));
    let salt = chain_salt(Some("sql-adapter"), None);
    assert_eq!(
        cache.held_blocks(&salted_block_hashes(&prompt, salt)),
        Some(2)
    );
    // The second block carries an image id: its key moves off the plain chain.
    let Event::Stored(mut image) = stored(&prompt, 16, 50, None) else {
        unreachable!()
    };
    image.extra_keys = Some(vec![rmpv::Value::Nil, rmpv::Value::from("mm-hash-1")]);
    let cache = synced();
    let mut index = EngineIndex::default();
    index.apply(&batch(vec![Event::Stored(image)]), &cache);
    assert_eq!(cache.held_blocks(&block_hashes(&prompt)), Some(1));
}

#[test]
fn orphans_and_misfit_tokens_are_passed_over() {
    let prompt = tokens(48);
    let cache = synced();
    let mut index = EngineIndex::default();
    // Parent 77 was never seen (stored before the gateway joined).
    let a = index.apply(&batch(vec![stored(&prompt[16..], 16, 1, Some(77))]), &cache);
    assert_eq!((a.stored, a.orphans), (0, 2));
    // Two hashes but 20 tokens at block size 16.
    let a = index.apply(
        &batch(vec![Event::Stored(BlockStored {
            block_hashes: vec![EngineHash::Int(1), EngineHash::Int(2)],
            token_ids: prompt[..20].to_vec(),
            block_size: 16,
            ..BlockStored::default()
        })]),
        &cache,
    );
    assert_eq!((a.stored, a.orphans), (0, 2));
    assert!(cache.is_empty());
    // Removing what was never stored changes nothing.
    assert_eq!(index.apply(&batch(vec![removed([5])]), &cache).removed, 0);
}

#[test]
fn media_are_counted_apart_and_a_clear_empties_all() {
    let prompt = tokens(16);
    let ours = block_hashes(&prompt);
    let cache = synced();
    let mut index = EngineIndex::default();
    let Event::Stored(mut on_cpu) = stored(&prompt, 16, 1, None) else {
        unreachable!()
    };
    on_cpu.medium = Some("CPU".into());
    index.apply(
        &batch(vec![stored(&prompt, 16, 1, None), Event::Stored(on_cpu)]),
        &cache,
    );
    assert_eq!(index.engine_blocks(), 2);
    // Gone from the GPU, still offloaded to CPU memory: still reusable.
    index.apply(&batch(vec![removed([1])]), &cache);
    assert_eq!(cache.held_blocks(&ours), Some(1));
    let Event::Removed(mut from_cpu) = removed([1]) else {
        unreachable!()
    };
    from_cpu.medium = Some("CPU".into());
    index.apply(&batch(vec![Event::Removed(from_cpu)]), &cache);
    assert_eq!(cache.held_blocks(&ours), Some(0));
    // Stored and cleared in one batch, then stored again: only what follows the clear.
    let a = index.apply(
        &batch(vec![
            stored(&prompt, 16, 1, None),
            Event::AllCleared,
            stored(&tokens(32)[16..], 16, 2, None),
        ]),
        &cache,
    );
    assert!(a.cleared);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.held_blocks(&ours), Some(0));
}

#[test]
fn a_block_stored_and_removed_and_stored_in_one_batch_is_held() {
    let prompt = tokens(16);
    let ours = block_hashes(&prompt);
    let cache = synced();
    let mut index = EngineIndex::default();
    index.apply(
        &batch(vec![
            stored(&prompt, 16, 1, None),
            removed([1]),
            stored(&prompt, 16, 2, None),
        ]),
        &cache,
    );
    assert_eq!(cache.held_blocks(&ours), Some(1));
    index.apply(&batch(vec![removed([1])]), &cache);
    assert_eq!(cache.held_blocks(&ours), Some(1), "1 was already gone");
    index.apply(&batch(vec![removed([2])]), &cache);
    assert_eq!(cache.held_blocks(&ours), Some(0));
}
