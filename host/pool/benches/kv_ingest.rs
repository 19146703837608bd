//! Engine KV event ingest on one core: a vLLM batch's msgpack decoded and applied to a
//! server's index (our own chained hashes, the shared view updated). The target is at
//! least 100,000 blocks per second; criterion reports throughput in blocks ("elements").
//!
//! Each iteration stores a 64-block prompt (one event, 16-token blocks) chained to a shared
//! 8-block prefix, then removes it, so the index stays at its steady size.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringmaster_kv_events::{
    Batch, BlockRemoved, BlockStored, Encoding, EngineHash, Event, decode_batch, encode_batch,
};
use ringmaster_pool::engine_index::EngineIndex;
use ringmaster_pool::kv_view::ReportedCache;

const BLOCKS: usize = 64;

fn batch(events: Vec<Event>) -> Batch {
    Batch {
        ts: 0.0,
        events,
        data_parallel_rank: None,
    }
}

fn ingest(c: &mut Criterion) {
    let prefix = Event::Stored(BlockStored {
        block_hashes: (0..8).map(EngineHash::Int).collect(),
        token_ids: (0..8 * 16).collect(),
        block_size: 16,
        ..BlockStored::default()
    });
    let stored = |encoding| {
        encode_batch(
            &batch(vec![Event::Stored(BlockStored {
                block_hashes: (1_000..1_000 + BLOCKS as i128)
                    .map(EngineHash::Int)
                    .collect(),
                parent_block_hash: Some(EngineHash::Int(7)),
                token_ids: (5_000..5_000 + (BLOCKS * 16) as u32).collect(),
                block_size: 16,
                medium: Some("GPU".into()),
                ..BlockStored::default()
            })]),
            encoding,
        )
    };
    let removed = encode_batch(
        &batch(vec![Event::Removed(BlockRemoved {
            block_hashes: (1_000..1_000 + BLOCKS as i128)
                .map(EngineHash::Int)
                .collect(),
            medium: Some("GPU".into()),
            group_idx: None,
        })]),
        Encoding::Positional,
    );
    let mut group = c.benchmark_group("kv_ingest");
    // Stored and removed: 2 × BLOCKS engine blocks per iteration.
    group.throughput(Throughput::Elements(2 * BLOCKS as u64));
    for (name, encoding) in [
        ("positional", Encoding::Positional),
        ("tagged", Encoding::Tagged),
    ] {
        let stored = stored(encoding);
        let cache = ReportedCache::default();
        let mut index = EngineIndex::default();
        index.apply(&batch(vec![prefix.clone()]), &cache);
        group.bench_function(name, |b| {
            b.iter(|| {
                let s = decode_batch(&stored).expect("decodes");
                index.apply(&s, &cache);
                let r = decode_batch(&removed).expect("decodes");
                index.apply(&r, &cache);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
