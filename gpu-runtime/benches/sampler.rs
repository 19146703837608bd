//! One row's draw at SmolLM2's vocabulary (49,152 logits), the sampler against the sort-based
//! one it replaced (kept here only as the baseline, verbatim in its algorithm): temperature
//! alone, top-k 50 with top-p 0.9, top-p 0.9 alone, and greedy.
//! `cargo bench -p ringmaster-gpu-runtime --bench sampler`.

use criterion::{Criterion, criterion_group, criterion_main};
use ringmaster_gpu_runtime::model::sampler::{Draw, argmax};

const VOCAB: usize = 49_152;

/// Logits shaped like a language model's: normal-ish noise (σ ≈ 3) with a few peaks.
fn logits() -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..VOCAB)
        .map(|i| {
            let mut sum = 0.0;
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                sum += (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            sum * 5.2 + if i % 9_973 == 0 { 15.0 } else { 0.0 }
        })
        .collect()
}

/// The sampler before issue 42: the whole vocabulary sorted by logit unless top-k selects
/// first, f64 weights, an inverse-CDF walk in sorted order.
fn sort_based(logits: &[f32], t: f32, top_k: Option<usize>, top_p: Option<f64>, u: f64) -> u32 {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if let Some(k) = top_k.filter(|k| *k < order.len()) {
        order.select_nth_unstable_by(k - 1, by_logit);
        order.truncate(k);
    }
    order.sort_unstable_by(by_logit);
    let max = logits[order[0] as usize];
    let mut weights: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i as usize] - max) / f64::from(t)).exp())
        .collect();
    if let Some(p) = top_p {
        let total: f64 = weights.iter().sum();
        let mut mass = 0.0;
        let mut keep = weights.len();
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= p {
                keep = i + 1;
                break;
            }
        }
        weights.truncate(keep);
        order.truncate(keep);
    }
    let draw = u * weights.iter().sum::<f64>();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if draw < acc {
            return order[i];
        }
    }
    order[order.len() - 1]
}

fn sampler(c: &mut Criterion) {
    let logits = logits();
    let mut group = c.benchmark_group("sample_49152");
    let cases: [(&str, u32, f32); 3] = [
        ("temperature", 0, 1.0),
        ("top_k50_top_p0.9", 50, 0.9),
        ("top_p0.9", 0, 0.9),
    ];
    for (name, top_k, top_p) in cases {
        let draw = Draw {
            temperature: 1.0,
            top_k,
            top_p,
            uniform: 0.37,
        };
        group.bench_function(format!("{name}/selection"), |b| {
            b.iter(|| draw.pick(std::hint::black_box(&logits)))
        });
        let k = (top_k > 0).then_some(top_k as usize);
        let p = (top_p < 1.0).then_some(f64::from(top_p));
        group.bench_function(format!("{name}/sort"), |b| {
            b.iter(|| sort_based(std::hint::black_box(&logits), 1.0, k, p, 0.37))
        });
    }
    group.bench_function("greedy", |b| {
        b.iter(|| argmax(std::hint::black_box(&logits)))
    });
    group.finish();
}

criterion_group!(benches, sampler);
criterion_main!(benches);
