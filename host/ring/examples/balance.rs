//! Measures how evenly the ring spreads keys, and what vnode count a balance target needs.
//!
//! ```text
//! cargo run --release -p ringmaster-ring --example balance
//! ```
//!
//! Members are `sim://gpu-{i}` (weight 1) and keys `key_hash("key-{i}")` for 100k keys, as in the
//! crate's balance test. "max/mean" is the most loaded member's key count over the mean; "ring"
//! is the same ratio for the exact key-space shares ([`Ring::key_shares`]), i.e. with infinitely
//! many keys. The second table repeats the N = 64 measurement for 200 other id families
//! (`fam{f}://gpu-{i}`) to show how likely a target is for names nobody chose.

#![allow(clippy::print_stdout, reason = "an example that prints a report")]

use ringmaster_ring::{Member, Ring, RingConfig, key_hash};

/// Keys counted per ring.
const KEYS: usize = 100_000;
/// The target from the issue.
const TARGET: f64 = 1.15;
/// Id families sampled for the "any names" table.
const FAMILIES: usize = 200;

fn ring(scheme: &str, n: usize, vnodes: u32) -> Ring {
    let members = (0..n)
        .map(|i| Member::new(format!("{scheme}://gpu-{i}"), 1))
        .collect();
    Ring::new(
        members,
        RingConfig::new(vnodes, 1.25).expect("valid config"),
    )
    .expect("valid ring")
}

/// (max/mean over the keys, max/mean of the exact shares).
fn balance(ring: &Ring, keys: &[u64]) -> (f64, f64) {
    let n = ring.len() as f64;
    let mut counts = vec![0u64; ring.len()];
    for &key in keys {
        counts[ring.lookup(key).expect("non-empty ring")] += 1;
    }
    let max_count = counts.iter().copied().max().unwrap_or(0) as f64;
    let max_share = ring.key_shares().into_iter().fold(0.0, f64::max);
    (max_count * n / keys.len() as f64, max_share * n)
}

fn main() {
    let keys: Vec<u64> = (0..KEYS)
        .map(|i| key_hash(format!("key-{i}").as_bytes()))
        .collect();

    println!("160 vnodes per weight, {KEYS} keys, members sim://gpu-{{i}}");
    println!("{:>4}  {:>9}  {:>6}", "N", "max/mean", "ring");
    for n in [4, 8, 16, 32, 64] {
        let (sampled, exact) = balance(&ring("sim", n, 160), &keys);
        println!("{n:>4}  {sampled:>9.3}  {exact:>6.3}");
    }
    let ratios: Vec<(usize, f64)> = (4..=64)
        .map(|n| (n, balance(&ring("sim", n, 160), &keys).0))
        .collect();
    let worst = ratios
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("non-empty range");
    let last_within = ratios
        .iter()
        .take_while(|(_, ratio)| *ratio <= TARGET)
        .last()
        .map_or(3, |(n, _)| *n);
    println!(
        "N in 4..=64: worst {:.3} at N = {}; <= {TARGET} for every N in 4..={last_within}",
        worst.1, worst.0
    );

    println!();
    println!("N = 64: vnodes per weight needed for max/mean <= {TARGET}");
    println!(
        "{:>7}  {:>13}  {:>22}  {:>15}",
        "vnodes", "sim max/mean", "P(<= target), families", "median max/mean"
    );
    for vnodes in [
        160, 200, 250, 300, 320, 400, 500, 640, 800, 1000, 1280, 1600,
    ] {
        let (sim, _) = balance(&ring("sim", 64, vnodes), &keys);
        let mut ratios: Vec<f64> = (0..FAMILIES)
            .map(|f| balance(&ring(&format!("fam{f}"), 64, vnodes), &keys).0)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let within = ratios.iter().filter(|&&r| r <= TARGET).count();
        println!(
            "{vnodes:>7}  {sim:>13.3}  {:>22.2}  {:>15.3}",
            within as f64 / FAMILIES as f64,
            ratios[FAMILIES / 2]
        );
    }

    println!();
    println!("N = 64, sim://gpu-{{i}}, vnode counts 160..=1000 in steps of 10:");
    let passing: Vec<bool> = (160..=1000)
        .step_by(10)
        .map(|vnodes| balance(&ring("sim", 64, vnodes), &keys).0 <= TARGET)
        .collect();
    let vnodes_at = |i: usize| 160 + 10 * i;
    match passing.iter().position(|&ok| ok) {
        Some(i) => println!("  first within {TARGET}: {}", vnodes_at(i)),
        None => println!("  none within {TARGET}"),
    }
    match passing.iter().rposition(|&ok| !ok) {
        Some(i) if i + 1 < passing.len() => {
            println!("  within {TARGET} from {} on", vnodes_at(i + 1));
        }
        Some(_) => println!("  not within {TARGET} at 1000"),
        None => println!("  within {TARGET} throughout"),
    }
}
