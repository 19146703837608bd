//! The ring's hot paths: plain lookup, three candidates, and the bounded-loads choice, on rings of
//! 8 and 64 equal servers at the default 160 vnodes; plus building a 64-server ring, which the
//! gateway pays on every membership change.
//!
//! ```text
//! cargo bench -p ringmaster-ring --bench lookup
//! ```
//!
//! Keys are hashed up front and cycled, so the numbers are the ring's cost alone. The bounded
//! benches run twice: with even loads (the preferred server has room: the common case) and with
//! every other server loaded past capacity (about half the requests spill, walking the ring).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ringmaster_ring::{Member, Ring, RingConfig, key_hash};

/// Pre-hashed keys cycled through by every bench (a power of two, for a cheap wrap).
const KEYS: usize = 4096;

/// Ring sizes measured.
const SIZES: [usize; 2] = [8, 64];

fn members(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| Member::new(format!("sim://gpu-{i}"), 1))
        .collect()
}

fn keys() -> Vec<u64> {
    (0..KEYS)
        .map(|i| key_hash(format!("session-{i}").as_bytes()))
        .collect()
}

fn ring_benches(c: &mut Criterion) {
    let keys = keys();
    let mut group = c.benchmark_group("ring");
    for n in SIZES {
        let ring = Ring::new(members(n), RingConfig::default()).expect("valid ring");
        let even_loads = vec![100u64; n];
        let hot_loads: Vec<u64> = (0..n).map(|i| if i % 2 == 0 { 100 } else { 0 }).collect();

        group.bench_with_input(BenchmarkId::new("lookup", n), &ring, |b, ring| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & (KEYS - 1);
                ring.lookup(black_box(keys[i]))
            });
        });
        group.bench_with_input(BenchmarkId::new("candidates3", n), &ring, |b, ring| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & (KEYS - 1);
                ring.candidates(black_box(keys[i]), 3)
            });
        });
        for (name, loads) in [("bounded_even", &even_loads), ("bounded_hot", &hot_loads)] {
            group.bench_with_input(BenchmarkId::new(name, n), &ring, |b, ring| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) & (KEYS - 1);
                    ring.lookup_bounded(black_box(keys[i]), black_box(loads))
                });
            });
        }
    }
    group.bench_function(BenchmarkId::new("build", 64), |b| {
        b.iter(|| Ring::new(black_box(members(64)), RingConfig::default()));
    });
    group.finish();
}

criterion_group!(benches, ring_benches);
criterion_main!(benches);
