//! An engine in this process reporting its cache as vLLM does (`[simulator] cache_view =
//! "vllm_events"`): each step's changes are written as one vLLM KV event batch (msgpack,
//! positional), read back by the same decoder and [`EngineIndex`] that follow a real vLLM
//! server, and routing reads the resulting [`ReportedCache`] instead of the engine.
//!
//! It exists to measure the engine-event view where the truth is known: the replay runs the
//! same trace with routing reading the engine directly, this view, and the routing-history
//! estimate. It owns the encode → decode → index loop for one server and touches nothing
//! else; it must not read the engine's cache itself (that would be the in-process view).

use std::sync::Arc;

use ringmaster_gpu_runtime::{EngineHandle, KvEvent, StoredBlock};
use ringmaster_kv_events::{
    Batch, BlockRemoved, BlockStored, Encoding, EngineHash, Event, decode_batch, encode_batch,
};

use crate::engine_index::EngineIndex;
use crate::kv_view::{ReportedCache, Scheme};

/// Starts following `engine`'s cache through vLLM's event wire; the returned view is live
/// (synced, keyed under the engine's tokenizer) and stays so while the engine runs. Each
/// engine step's changes are one batch, as vLLM publishes them, and none is lost (the engine's
/// step subscription is unbounded; this task reads it as fast as the engine writes it).
pub(crate) fn follow(server: &str, engine: &EngineHandle) -> Arc<ReportedCache> {
    let cache = Arc::new(ReportedCache::default());
    cache.set_scheme_built(Scheme::of(engine.tokenizer().clone()));
    cache.mark_synced();
    let mut steps = engine.kv_subscribe_steps();
    let view = Arc::downgrade(&cache);
    let server = server.to_owned();
    tokio::spawn(async move {
        let mut index = EngineIndex::default();
        while let Some(events) = steps.recv().await {
            let Some(cache) = view.upgrade() else { return };
            let payload = encode_batch(&vllm_batch(&events), Encoding::Positional);
            match decode_batch(&payload) {
                Ok(batch) => {
                    index.apply(&batch, &cache);
                }
                Err(e) => {
                    // Our own encoder's output: a failure here is a bug, said loudly.
                    tracing::error!(server = %server, error = %e, "pool.local_events_undecodable");
                }
            }
        }
    });
    cache
}

/// The engine's changes as vLLM writes them: a run of stored blocks that chain (each the
/// parent of the next) is one `BlockStored`, a run of evictions one `BlockRemoved`.
pub(crate) fn vllm_batch(events: &[KvEvent]) -> Batch {
    let mut out: Vec<Event> = Vec::new();
    for event in events {
        match event {
            KvEvent::Stored(block) => {
                if let Some(Event::Stored(run)) = out.last_mut()
                    && run.block_hashes.last() == block.parent.map(engine_hash).as_ref()
                {
                    run.block_hashes.push(engine_hash(block.hash));
                    run.token_ids.extend_from_slice(&block.tokens);
                    continue;
                }
                out.push(Event::Stored(stored(block)));
            }
            KvEvent::Evicted(hash) => {
                if let Some(Event::Removed(run)) = out.last_mut() {
                    run.block_hashes.push(engine_hash(*hash));
                    continue;
                }
                out.push(Event::Removed(BlockRemoved {
                    block_hashes: vec![engine_hash(*hash)],
                    medium: Some("GPU".into()),
                    group_idx: None,
                }));
            }
        }
    }
    Batch {
        ts: 0.0,
        events: out,
        data_parallel_rank: None,
    }
}

fn stored(block: &StoredBlock) -> BlockStored {
    BlockStored {
        block_hashes: vec![engine_hash(block.hash)],
        parent_block_hash: block.parent.map(engine_hash),
        token_ids: block.tokens.to_vec(),
        block_size: block.tokens.len() as u32,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
        extra_keys: None,
        group_idx: None,
    }
}

fn engine_hash(hash: ringmaster_gpu_runtime::block::BlockHash) -> EngineHash {
    EngineHash::Int(i128::from(hash.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_gpu_runtime::BLOCK_SIZE;
    use ringmaster_gpu_runtime::block::{BlockHash, block_hashes};

    fn blocks(tokens: &[u32]) -> Vec<KvEvent> {
        let hashes = block_hashes(tokens);
        hashes
            .iter()
            .enumerate()
            .map(|(i, &hash)| {
                let mut block = [0; BLOCK_SIZE];
                block.copy_from_slice(&tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
                KvEvent::Stored(StoredBlock {
                    hash,
                    parent: i.checked_sub(1).map(|p| hashes[p]),
                    tokens: block,
                })
            })
            .collect()
    }

    #[test]
    fn a_chain_of_stores_is_one_event_and_evictions_another() {
        let prompt: Vec<u32> = (0..48).collect();
        let mut events = blocks(&prompt);
        events.push(KvEvent::Evicted(BlockHash(7)));
        events.push(KvEvent::Evicted(BlockHash(8)));
        let batch = vllm_batch(&events);
        assert_eq!(batch.events.len(), 2);
        let Event::Stored(run) = &batch.events[0] else {
            panic!("stores first")
        };
        assert_eq!(run.block_hashes.len(), 3);
        assert_eq!(run.token_ids, prompt);
        assert_eq!(run.parent_block_hash, None);
        let Event::Removed(gone) = &batch.events[1] else {
            panic!("then removals")
        };
        assert_eq!(gone.block_hashes.len(), 2);
    }

    #[test]
    fn what_the_engine_stores_is_what_the_index_holds_under_its_own_hash() {
        let prompt: Vec<u32> = (100..164).collect();
        let cache = ReportedCache::default();
        cache.mark_synced();
        let mut index = EngineIndex::default();
        let batch = decode_batch(&encode_batch(
            &vllm_batch(&blocks(&prompt)),
            Encoding::Positional,
        ))
        .unwrap();
        index.apply(&batch, &cache);
        let ours = block_hashes(&prompt);
        assert_eq!(cache.held_blocks(&ours), Some(4));
        // The last two evicted: the prompt's first two blocks lead.
        let removed = [KvEvent::Evicted(ours[2]), KvEvent::Evicted(ours[3])];
        let batch =
            decode_batch(&encode_batch(&vllm_batch(&removed), Encoding::Positional)).unwrap();
        index.apply(&batch, &cache);
        assert_eq!(cache.held_blocks(&ours), Some(2));
    }
}
