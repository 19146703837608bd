//! Unit tests, the pinned distribution, the balance measurement and the ring's laws (proptest).
//!
//! Statistics used for tolerances: with `M` virtual nodes placed by a uniform hash, a member that
//! owns `V` of them owns a Beta(V, M − V) share of the key space: mean `p = V/M`, coefficient of
//! variation `sqrt((1 − p)/V) <= 1/sqrt(V)`. With 160 vnodes per unit of weight that is at most
//! `1/sqrt(160 · w)` (7.9 % at weight 1). Counting `K` sampled keys adds binomial noise of
//! `sqrt(p(1 − p)/K)`. The laws below allow [`Z`] standard deviations of both, so a correct ring
//! fails a check with probability well under 10⁻⁵ per check, while a ring that moved keys
//! wholesale or ignored weights fails at once.

use super::*;

/// The members `sim://gpu-0` .. `sim://gpu-{n-1}`, weight 1.
fn sim_members(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| Member::new(format!("sim://gpu-{i}"), 1))
        .collect()
}

fn sim_ring(n: usize) -> Ring {
    Ring::new(sim_members(n), RingConfig::default()).expect("valid members")
}

/// `key_hash("{prefix}{i}")` for `i` in `0..count`.
fn named_keys(prefix: &str, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| key_hash(format!("{prefix}{i}").as_bytes()))
        .collect()
}

/// Keys for one property-test case: `key_hash(seed ‖ i)`.
fn seeded_keys(seed: u64, count: usize) -> Vec<u64> {
    (0..count as u64)
        .map(|i| {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&seed.to_le_bytes());
            bytes[8..].copy_from_slice(&i.to_le_bytes());
            key_hash(&bytes)
        })
        .collect()
}

fn owner_id(ring: &Ring, key: u64) -> &str {
    &ring.members()[ring.lookup(key).expect("non-empty ring")].id
}

// ---------------------------------------------------------------------------------------------
// The pinned distribution.

/// Pins the hash, the vnode naming, the sort and the wrap. If this fails, every deployed ring
/// would move keys (and lose their KV caches) on upgrade: change it only on purpose. The values
/// were cross-checked against an independent Python implementation (`xxhash.xxh3_64`, `bisect`).
#[test]
fn golden_distribution_is_pinned() {
    assert_eq!(key_hash(b"hello"), 10_760_762_337_991_515_389);
    assert_eq!(key_hash(b"k0"), 13_524_466_254_824_444_083);

    let ring = sim_ring(4);
    assert_eq!(ring.vnode_count(), 4 * 160);
    assert_eq!(
        ring.points.first().map(|p| p.hash),
        Some(61_296_460_332_233_181)
    );
    assert_eq!(
        ring.points.last().map(|p| p.hash),
        Some(18_404_650_860_606_948_763)
    );

    let owners: Vec<usize> = named_keys("k", 10)
        .into_iter()
        .map(|key| ring.lookup(key).expect("non-empty ring"))
        .collect();
    assert_eq!(owners, [1, 2, 2, 3, 1, 1, 0, 3, 3, 2]);

    let candidates: Vec<Vec<usize>> = named_keys("k", 4)
        .into_iter()
        .map(|key| ring.candidates(key, 4))
        .collect();
    assert_eq!(
        candidates,
        [[1, 0, 3, 2], [2, 1, 0, 3], [2, 3, 0, 1], [3, 2, 0, 1]]
    );

    let mut counts = [0u32; 4];
    for key in named_keys("key-", 10_000) {
        counts[ring.lookup(key).expect("non-empty ring")] += 1;
    }
    assert_eq!(counts, [2284, 2715, 2621, 2380]);
}

// ---------------------------------------------------------------------------------------------
// Balance over many keys.

/// max/mean keys per member over 100k keys `key_hash("key-{i}")`, members `sim://gpu-{i}`.
fn max_over_mean(ring: &Ring, keys: &[u64]) -> f64 {
    let mut counts = vec![0u64; ring.len()];
    for &key in keys {
        counts[ring.lookup(key).expect("non-empty ring")] += 1;
    }
    let max = counts.iter().copied().max().unwrap_or(0);
    max as f64 * ring.len() as f64 / keys.len() as f64
}

/// The issue asked for max/mean ≤ 1.15 over 100k keys for N in 4..64 at 160 vnodes. That is not a
/// law of ketama at 160 vnodes: a member's share varies by 7.9 % (1/sqrt(160)) and 100k keys add
/// `sqrt(N/100k)` of counting noise, so the most loaded of N members sits about
/// `z_N · sqrt(1/160 + N/100_000)` above the mean, with `z_N` ≈ 2.0 at N = 8 and ≈ 2.4 at N = 64
/// (≈ 1.20 at N = 64), and some N land a standard deviation higher. For these names the data
/// (identical in an independent Python implementation) is: ≤ 1.15 for every N in 4..=11, first
/// above at N = 12 (1.161), worst N = 35 (1.232). So this asserts what holds, with no tuning of
/// names or hash: ≤ 1.25 for every N in 4..=64 and ≤ 1.15 for N in 4..=11. Run
/// `cargo run --release -p ringmaster-ring --example balance` for the table and the vnode count
/// that would be needed for 1.15 at N = 64.
#[test]
fn balance_over_100k_keys_is_within_measured_bounds() {
    /// Holds for every N in 4..=64 (worst measured: 1.232 at N = 35).
    const BOUND_ALL: f64 = 1.25;
    /// The target; holds for N in 4..=11 with these names.
    const BOUND_SMALL: f64 = 1.15;
    let keys = named_keys("key-", 100_000);
    let mut worst = (0, 0.0);
    for n in 4..=64 {
        let ratio = max_over_mean(&sim_ring(n), &keys);
        assert!(
            ratio <= BOUND_ALL,
            "N = {n}: max/mean {ratio:.3} > {BOUND_ALL}"
        );
        if n <= 11 {
            assert!(
                ratio <= BOUND_SMALL,
                "N = {n}: max/mean {ratio:.3} > {BOUND_SMALL}"
            );
        }
        if ratio > worst.1 {
            worst = (n, ratio);
        }
    }
    // The bound is not loose by accident: the worst case really is above the target.
    assert!(worst.1 > BOUND_SMALL, "worst {worst:?}");
}

// ---------------------------------------------------------------------------------------------
// Configuration and construction errors.

#[test]
fn default_config_is_ketama_160_and_c_1_25() {
    let config = RingConfig::default();
    assert_eq!(config.vnodes_per_weight, DEFAULT_VNODES_PER_WEIGHT);
    assert_eq!(config.vnodes_per_weight, 160);
    assert_eq!(config.load_factor, 1.25);
    assert_eq!(RingConfig::new(160, 1.25), Ok(config));
}

#[test]
fn config_accepts_its_boundaries() {
    assert!(RingConfig::new(1, 1.0).is_ok());
    assert!(RingConfig::new(MAX_VNODES_PER_WEIGHT, 1e9).is_ok());
}

#[test]
fn config_rejects_bad_vnode_counts() {
    for bad in [0, MAX_VNODES_PER_WEIGHT + 1, u32::MAX] {
        let err = RingConfig::new(bad, 1.25).unwrap_err();
        assert_eq!(
            err,
            RingError::InvalidVnodesPerWeight {
                got: bad,
                max: MAX_VNODES_PER_WEIGHT
            }
        );
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
}

#[test]
fn config_rejects_bad_load_factors() {
    for bad in [0.0, 0.999, -1.0, f64::INFINITY, f64::NEG_INFINITY] {
        let err = RingConfig::new(160, bad).unwrap_err();
        assert_eq!(err, RingError::InvalidLoadFactor(bad));
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
    // NaN != NaN, so match instead of comparing.
    assert!(matches!(
        RingConfig::new(160, f64::NAN),
        Err(RingError::InvalidLoadFactor(c)) if c.is_nan()
    ));
}

#[test]
fn ring_validates_a_config_built_by_hand() {
    let config = RingConfig {
        vnodes_per_weight: 0,
        load_factor: 1.25,
    };
    assert!(matches!(
        Ring::new(sim_members(2), config),
        Err(RingError::InvalidVnodesPerWeight { got: 0, .. })
    ));
    let config = RingConfig {
        vnodes_per_weight: 160,
        load_factor: 0.5,
    };
    assert_eq!(
        Ring::new(sim_members(2), config).unwrap_err(),
        RingError::InvalidLoadFactor(0.5)
    );
}

#[test]
fn ring_rejects_an_empty_id() {
    let members = vec![Member::new("a", 1), Member::new("", 1)];
    let err = Ring::new(members, RingConfig::default()).unwrap_err();
    assert_eq!(err, RingError::EmptyId);
    assert!(err.to_string().contains("empty id"), "{err}");
}

#[test]
fn ring_rejects_a_duplicate_id() {
    let members = vec![
        Member::new("sim://gpu-0", 1),
        Member::new("sim://gpu-1", 1),
        Member::new("sim://gpu-0", 3),
    ];
    let err = Ring::new(members, RingConfig::default()).unwrap_err();
    assert_eq!(err, RingError::DuplicateMember("sim://gpu-0".into()));
    assert!(err.to_string().contains("`sim://gpu-0`"), "{err}");
}

#[test]
fn ring_rejects_a_zero_weight() {
    let members = vec![Member::new("sim://gpu-0", 1), Member::new("sim://gpu-1", 0)];
    let err = Ring::new(members, RingConfig::default()).unwrap_err();
    assert_eq!(err, RingError::ZeroWeight("sim://gpu-1".into()));
    assert!(err.to_string().contains("`sim://gpu-1`"), "{err}");
}

#[test]
fn ring_rejects_too_many_vnodes() {
    let members = vec![Member::new("a", u32::MAX), Member::new("b", u32::MAX)];
    let err = Ring::new(members, RingConfig::default()).unwrap_err();
    assert_eq!(
        err,
        RingError::TooManyVnodes {
            requested: 2 * u64::from(u32::MAX) * 160,
            max: MAX_TOTAL_VNODES
        }
    );
    assert!(
        err.to_string().contains(&MAX_TOTAL_VNODES.to_string()),
        "{err}"
    );

    // At the cap the capacity arithmetic stays in bounds: one member of the largest weight with
    // u64::MAX load. (Built by hand: 2^24 hashed vnodes would slow the debug suite for nothing.)
    let ring = Ring {
        members: vec![Member::new("big", u32::try_from(MAX_TOTAL_VNODES).unwrap())],
        config: RingConfig::new(1, 1.25).unwrap(),
        points: vec![Point { hash: 1, member: 0 }],
        total_weight: MAX_TOTAL_VNODES,
    };
    assert_eq!(ring.capacity(0, u64::MAX), u64::MAX);
    assert_eq!(
        ring.capacity_wide(0, u128::from(u64::MAX)),
        23_058_430_092_136_939_520
    );
}

#[test]
fn lookup_bounded_rejects_a_loads_slice_of_the_wrong_length() {
    let ring = sim_ring(3);
    for got in [0, 2, 4] {
        let err = ring.lookup_bounded(1, &vec![0; got]).unwrap_err();
        assert_eq!(err, RingError::LoadsLength { expected: 3, got });
        assert!(err.to_string().contains(&format!("{got} entries")), "{err}");
    }
    let empty = Ring::new(Vec::new(), RingConfig::default()).unwrap();
    assert_eq!(
        empty.lookup_bounded(1, &[0]).unwrap_err(),
        RingError::LoadsLength {
            expected: 0,
            got: 1
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Shape and lookups.

#[test]
fn an_empty_ring_answers_none() {
    let ring = Ring::new(Vec::new(), RingConfig::default()).unwrap();
    assert!(ring.is_empty());
    assert_eq!(ring.len(), 0);
    assert_eq!(ring.vnode_count(), 0);
    assert_eq!(ring.lookup(42), None);
    assert!(ring.candidates(42, 3).is_empty());
    assert_eq!(ring.lookup_bounded(42, &[]), Ok(None));
    assert!(ring.key_shares().is_empty());
}

#[test]
fn accessors_report_what_was_built() {
    let members = vec![
        Member::new("b", 2),
        Member::new("a", 1),
        Member::new("c", 3),
    ];
    let config = RingConfig::new(10, 1.5).unwrap();
    let ring = Ring::new(members.clone(), config.clone()).unwrap();
    assert_eq!(ring.members(), members.as_slice());
    assert_eq!(ring.len(), 3);
    assert!(!ring.is_empty());
    assert_eq!(ring.config(), &config);
    assert_eq!(ring.vnode_count(), 60);
    assert!(ring.points.windows(2).all(|w| w[0].hash <= w[1].hash));
}

#[test]
fn vnodes_are_named_id_hash_i() {
    let ring = Ring::new(vec![Member::new("x", 2)], RingConfig::new(3, 1.25).unwrap()).unwrap();
    let mut expected: Vec<u64> = (0..6)
        .map(|i| key_hash(format!("x#{i}").as_bytes()))
        .collect();
    expected.sort_unstable();
    let got: Vec<u64> = ring.points.iter().map(|p| p.hash).collect();
    assert_eq!(got, expected);
}

#[test]
fn lookup_takes_the_first_vnode_at_or_after_the_key_and_wraps() {
    let ring = Ring::new(sim_members(5), RingConfig::new(4, 1.25).unwrap()).unwrap();
    let first = ring.points[0];
    let last = *ring.points.last().unwrap();
    // A key equal to a vnode's hash belongs to that vnode.
    for point in &ring.points {
        assert_eq!(ring.lookup(point.hash), Some(point.member as usize));
    }
    // One past a vnode belongs to the next one.
    let second = ring.points[1];
    assert_eq!(ring.lookup(first.hash + 1), Some(second.member as usize));
    // Below the first and above the last both belong to the first: the ring wraps.
    assert_eq!(ring.lookup(0), Some(first.member as usize));
    assert_eq!(
        ring.lookup(first.hash.saturating_sub(1)),
        Some(first.member as usize)
    );
    if last.hash < u64::MAX {
        assert_eq!(ring.lookup(last.hash + 1), Some(first.member as usize));
        assert_eq!(ring.lookup(u64::MAX), Some(first.member as usize));
    }
}

#[test]
fn equal_hashes_are_ordered_by_member_id() {
    // An xxh3 collision cannot be produced on demand, so the tie-break is tested on its own.
    let members = vec![
        Member::new("zeta", 1),
        Member::new("alpha", 1),
        Member::new("mid", 1),
    ];
    let mut points = vec![
        Point { hash: 7, member: 0 },
        Point { hash: 7, member: 2 },
        Point { hash: 3, member: 0 },
        Point { hash: 7, member: 1 },
    ];
    sort_points(&mut points, &members);
    let order: Vec<(u64, &str)> = points
        .iter()
        .map(|p| (p.hash, members[p.member as usize].id.as_str()))
        .collect();
    assert_eq!(order, [(3, "zeta"), (7, "alpha"), (7, "mid"), (7, "zeta")]);
}

#[test]
fn a_single_member_owns_everything() {
    let ring = Ring::new(vec![Member::new("only", 3)], RingConfig::default()).unwrap();
    for key in [0, 1, u64::MAX / 2, u64::MAX] {
        assert_eq!(ring.lookup(key), Some(0));
        assert_eq!(ring.candidates(key, 5), [0]);
    }
    assert_eq!(ring.key_shares(), [1.0]);
    let one_vnode = Ring::new(
        vec![Member::new("only", 1)],
        RingConfig::new(1, 1.0).unwrap(),
    );
    assert_eq!(one_vnode.unwrap().key_shares(), [1.0]);
}

#[test]
fn key_shares_sum_to_one_and_match_sampled_keys() {
    let ring = sim_ring(8);
    let shares = ring.key_shares();
    let sum: f64 = shares.iter().sum();
    assert!((sum - 1.0).abs() < 1e-9, "{sum}");
    let keys = named_keys("key-", 100_000);
    let mut counts = [0f64; 8];
    for &key in &keys {
        counts[ring.lookup(key).unwrap()] += 1.0;
    }
    for (share, count) in shares.iter().zip(counts) {
        let sampled = count / keys.len() as f64;
        let sd = (share * (1.0 - share) / keys.len() as f64).sqrt();
        assert!((sampled - share).abs() <= Z * sd, "{sampled} vs {share}");
    }
}

#[test]
fn candidates_cap_at_member_count_and_switch_visited_sets_consistently() {
    let ring = sim_ring(40);
    for key in named_keys("c", 50) {
        let all = ring.candidates(key, usize::MAX);
        assert_eq!(all.len(), 40);
        for n in [0, 1, 3, LINEAR_SEEN_MAX, LINEAR_SEEN_MAX + 1, 39, 40, 41] {
            let some = ring.candidates(key, n);
            assert_eq!(some, all[..n.min(40)], "n = {n}");
        }
    }
}

#[test]
fn debug_output_leaves_out_the_vnodes() {
    let text = format!("{:?}", sim_ring(2));
    assert!(text.contains("sim://gpu-1"), "{text}");
    assert!(text.contains("vnode_count: 320"), "{text}");
    assert!(text.len() < 500, "{text}");
}

#[test]
fn a_ring_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Ring>();
    assert_send_sync::<RingError>();
}

// ---------------------------------------------------------------------------------------------
// Capacity and bounded loads.

#[test]
fn capacity_follows_the_formula() {
    // Equal weights: ceil(c · (T + 1) / n).
    let ring = sim_ring(4);
    assert_eq!(ring.capacity(0, 0), 1); // ceil(1.25 · 1 / 4)
    assert_eq!(ring.capacity(0, 3), 2); // ceil(1.25 · 4 / 4) = ceil(1.25)
    assert_eq!(ring.capacity(3, 15), 5); // ceil(1.25 · 16 / 4)
    assert_eq!(ring.capacity(3, 99), 32); // ceil(31.25)

    // Weighted: ceil(c · (T + 1) · w / W), W = 1 + 3 = 4.
    let members = vec![Member::new("small", 1), Member::new("large", 3)];
    let ring = Ring::new(members, RingConfig::new(160, 2.0).unwrap()).unwrap();
    assert_eq!(ring.capacity(0, 99), 50); // 2 · 100 · 1/4
    assert_eq!(ring.capacity(1, 99), 150); // 2 · 100 · 3/4
    assert_eq!(ring.capacity(1, 100), 152); // ceil(151.5)

    // c = 1 leaves no slack, and rounding never drops a capacity below the exact share.
    let ring = Ring::new(sim_members(3), RingConfig::new(160, 1.0).unwrap()).unwrap();
    assert_eq!(ring.capacity(0, 2), 1); // 3 / 3
    assert_eq!(ring.capacity(0, 3), 2); // ceil(4 / 3)
    assert_eq!(ring.capacity(0, 299), 100);

    // Saturation.
    assert_eq!(ring.capacity(0, u64::MAX), 6_148_914_691_236_517_206); // ceil(2^64 / 3)
    let ring = Ring::new(sim_members(1), RingConfig::new(1, 2.0).unwrap()).unwrap();
    assert_eq!(ring.capacity(0, u64::MAX), u64::MAX);
}

#[test]
fn bounded_lookup_keeps_the_preferred_member_while_it_has_room() {
    let ring = sim_ring(4);
    for key in named_keys("b", 100) {
        let choice = ring.lookup_bounded(key, &[5, 5, 5, 5]).unwrap().unwrap();
        let preferred = ring.lookup(key).unwrap();
        assert_eq!(
            choice,
            BoundedChoice {
                member: preferred,
                preferred,
                skipped: Vec::new(),
                capacity: 7, // ceil(1.25 · 21 / 4)
            }
        );
        assert!(!choice.spilled());
    }
}

#[test]
fn bounded_lookup_spills_clockwise_past_full_members() {
    let ring = sim_ring(4);
    for key in named_keys("b", 100) {
        let order = ring.candidates(key, 4);
        // The preferred member and the next one are full: T = 14, cap = ceil(1.25 · 15 / 4) = 5.
        let mut loads = [2u64; 4];
        loads[order[0]] = 5;
        loads[order[1]] = 5;
        let choice = ring.lookup_bounded(key, &loads).unwrap().unwrap();
        assert_eq!(
            choice,
            BoundedChoice {
                member: order[2],
                preferred: order[0],
                skipped: vec![order[0], order[1]],
                capacity: 5,
            }
        );
        assert!(choice.spilled());
    }
}

#[test]
fn bounded_lookup_spills_on_a_large_ring_too() {
    // Above LINEAR_SEEN_MAX members the spill walk tracks visits in a Vec<bool>.
    // With c = 1 every member but one can be full at once.
    let config = RingConfig::new(160, 1.0).unwrap();
    let ring = Ring::new(sim_members(LINEAR_SEEN_MAX + 8), config).unwrap();
    let n = ring.len();
    for key in named_keys("b", 100) {
        let order = ring.candidates(key, n);
        // Every member but the last in ring order is full: n = 24, T = 10 · 23 = 230,
        // cap = ceil(231 / 24) = 10.
        let mut loads = vec![10u64; n];
        loads[order[n - 1]] = 0;
        assert_eq!(ring.capacity(0, 230), 10);
        let choice = ring.lookup_bounded(key, &loads).unwrap().unwrap();
        assert_eq!(choice.member, order[n - 1]);
        assert_eq!(choice.skipped, order[..n - 1]);
    }
}

#[test]
fn bounded_lookup_survives_loads_near_u64_max() {
    let ring = sim_ring(3);
    for key in named_keys("x", 20) {
        let choice = ring
            .lookup_bounded(key, &[u64::MAX, u64::MAX, u64::MAX])
            .unwrap()
            .unwrap();
        // Σ loads overflows u64; each capacity exceeds u64::MAX and is reported saturated.
        assert_eq!(choice.member, choice.preferred);
        assert_eq!(choice.capacity, u64::MAX);

        let mut loads = [u64::MAX; 3];
        let target = ring.candidates(key, 3)[2];
        loads[target] = 0;
        let choice = ring.lookup_bounded(key, &loads).unwrap().unwrap();
        assert!(loads[choice.member] < u64::MAX);
    }
}

/// Proves by exhaustion on small cases what `capacity`'s doc argues in general: on a non-empty
/// ring some member always has room, so `lookup_bounded` never comes back empty.
#[test]
fn bounded_lookup_always_finds_a_member_exhaustively() {
    let members = vec![
        Member::new("a", 1),
        Member::new("b", 2),
        Member::new("c", 3),
    ];
    let keys = named_keys("e", 16);
    for c in [1.0, 1.01, 1.25, 2.0] {
        let ring = Ring::new(members.clone(), RingConfig::new(8, c).unwrap()).unwrap();
        for l0 in 0..8 {
            for l1 in 0..8 {
                for l2 in 0..8 {
                    let loads = [l0, l1, l2];
                    let total: u64 = loads.iter().sum();
                    let capacities: u64 = (0..3).map(|i| ring.capacity(i, total)).sum();
                    assert!(capacities > total, "c = {c}, loads {loads:?}");
                    for &key in &keys {
                        let choice = ring.lookup_bounded(key, &loads).unwrap().unwrap();
                        assert!(loads[choice.member] < ring.capacity(choice.member, total));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Laws.

/// Standard deviations allowed by the statistical laws (see the module doc).
const Z: f64 = 5.0;

/// Sampled keys per statistical case.
const KEYS_PER_CASE: usize = 20_000;

/// `Z` standard deviations of a member's share of the key space, for a member holding
/// `member_vnodes` virtual nodes and expected share `p`: Beta spread `p / sqrt(V)` (the upper bound
/// of the coefficient of variation), plus the binomial noise of `keys` sampled keys.
fn share_tolerance(p: f64, member_vnodes: usize, keys: usize) -> f64 {
    let ring_sd = p / (member_vnodes as f64).sqrt();
    let sample_sd = (p * (1.0 - p) / keys as f64).sqrt();
    Z * (ring_sd * ring_sd + sample_sd * sample_sd).sqrt()
}

mod laws {
    use super::*;
    use proptest::prelude::*;

    /// A family of ids: `{scheme}://node-{i}`, with a random scheme so each case sees new hashes.
    fn ids(scheme: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{scheme}://node-{i}")).collect()
    }

    fn unit_members(scheme: &str, n: usize) -> Vec<Member> {
        ids(scheme, n)
            .into_iter()
            .map(|id| Member::new(id, 1))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Adding a server to N moves keys only to the new server, and about 1/(N+1) of them.
        #[test]
        fn adding_a_server_moves_keys_only_to_it(
            scheme in "[a-z]{1,8}",
            n in 1usize..32,
            seed in any::<u64>(),
        ) {
            let before = Ring::new(unit_members(&scheme, n), RingConfig::default()).unwrap();
            let mut members = unit_members(&scheme, n);
            members.push(Member::new(format!("{scheme}://new"), 1));
            let after = Ring::new(members, RingConfig::default()).unwrap();

            let keys = seeded_keys(seed, KEYS_PER_CASE);
            let mut moved = 0usize;
            for &key in &keys {
                let (old, new) = (owner_id(&before, key), owner_id(&after, key));
                if old != new {
                    prop_assert_eq!(new, format!("{scheme}://new"));
                    moved += 1;
                }
            }
            let p = 1.0 / (n + 1) as f64;
            let share = moved as f64 / keys.len() as f64;
            let tolerance = share_tolerance(p, 160, keys.len());
            prop_assert!((share - p).abs() <= tolerance,
                "N = {}: moved {:.4}, expected {:.4} ± {:.4}", n, share, p, tolerance);
            // Exactly the new server's share of the ring moved, up to sampling noise.
            let exact = after.key_shares()[n];
            let sample_sd = (exact * (1.0 - exact) / keys.len() as f64).sqrt();
            prop_assert!((share - exact).abs() <= Z * sample_sd);
        }

        /// Removing a server moves only the keys it owned.
        #[test]
        fn removing_a_server_moves_only_its_keys(
            scheme in "[a-z]{1,8}",
            n in 2usize..33,
            removed in any::<prop::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let members = unit_members(&scheme, n);
            let removed = removed.index(n);
            let gone = members[removed].id.clone();
            let before = Ring::new(members.clone(), RingConfig::default()).unwrap();
            let mut rest = members;
            rest.remove(removed);
            let after = Ring::new(rest, RingConfig::default()).unwrap();

            let keys = seeded_keys(seed, KEYS_PER_CASE);
            let mut moved = 0usize;
            for &key in &keys {
                let (old, new) = (owner_id(&before, key), owner_id(&after, key));
                if old != new {
                    prop_assert_eq!(old, gone.as_str());
                    moved += 1;
                } else {
                    prop_assert_ne!(old, gone.as_str());
                }
            }
            let p = 1.0 / n as f64;
            let share = moved as f64 / keys.len() as f64;
            let tolerance = share_tolerance(p, 160, keys.len());
            prop_assert!((share - p).abs() <= tolerance,
                "N = {}: moved {:.4}, expected {:.4} ± {:.4}", n, share, p, tolerance);
        }

        /// The owner of a key depends on the member set, not on the order it was listed in.
        #[test]
        fn member_order_does_not_change_owners(
            scheme in "[a-z]{1,8}",
            weights in prop::collection::vec(1u32..5, 1..12),
            vnodes in 1u32..200,
            shuffle_seed in any::<u64>(),
            seed in any::<u64>(),
        ) {
            let members: Vec<Member> = ids(&scheme, weights.len())
                .into_iter()
                .zip(&weights)
                .map(|(id, &w)| Member::new(id, w))
                .collect();
            let mut shuffled = members.clone();
            // A Fisher–Yates shuffle driven by the case's seed.
            let mut state = shuffle_seed;
            for i in (1..shuffled.len()).rev() {
                state = key_hash(&state.to_le_bytes());
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let config = RingConfig::new(vnodes, 1.25).unwrap();
            let a = Ring::new(members, config.clone()).unwrap();
            let b = Ring::new(shuffled, config).unwrap();
            for key in seeded_keys(seed, 500) {
                prop_assert_eq!(owner_id(&a, key), owner_id(&b, key));
                let ids_a: Vec<&str> =
                    a.candidates(key, 3).into_iter().map(|i| a.members()[i].id.as_str()).collect();
                let ids_b: Vec<&str> =
                    b.candidates(key, 3).into_iter().map(|i| b.members()[i].id.as_str()).collect();
                prop_assert_eq!(ids_a, ids_b);
            }
        }

        /// A member of weight w owns about w/W of the keys.
        #[test]
        fn keys_follow_weights(
            scheme in "[a-z]{1,8}",
            weights in prop::collection::vec(1u32..=8, 2..12),
            seed in any::<u64>(),
        ) {
            let members: Vec<Member> = ids(&scheme, weights.len())
                .into_iter()
                .zip(&weights)
                .map(|(id, &w)| Member::new(id, w))
                .collect();
            let ring = Ring::new(members, RingConfig::default()).unwrap();
            let total_weight: u32 = weights.iter().sum();
            let keys = seeded_keys(seed, KEYS_PER_CASE);
            let mut counts = vec![0usize; weights.len()];
            for &key in &keys {
                counts[ring.lookup(key).unwrap()] += 1;
            }
            for (i, (&w, &count)) in weights.iter().zip(&counts).enumerate() {
                let p = f64::from(w) / f64::from(total_weight);
                let share = count as f64 / keys.len() as f64;
                let tolerance = share_tolerance(p, 160 * w as usize, keys.len());
                prop_assert!((share - p).abs() <= tolerance,
                    "member {} (w = {}): {:.4}, expected {:.4} ± {:.4}", i, w, share, p, tolerance);
            }
        }

        /// Bounded lookup respects every cap, always answers on a non-empty ring, keeps the
        /// preferred member when it has room, and reports its skips in ring order.
        #[test]
        fn bounded_lookup_laws(
            scheme in "[a-z]{1,8}",
            weights in prop::collection::vec(1u32..5, 1..40),
            vnodes in 1u32..100,
            c in 1.0f64..3.0,
            load_scale in prop_oneof![Just(3u64), Just(50), Just(10_000), Just(u64::MAX / 64)],
            load_seed in any::<u64>(),
            key in any::<u64>(),
        ) {
            let members: Vec<Member> = ids(&scheme, weights.len())
                .into_iter()
                .zip(&weights)
                .map(|(id, &w)| Member::new(id, w))
                .collect();
            let ring = Ring::new(members, RingConfig::new(vnodes, c).unwrap()).unwrap();
            let loads: Vec<u64> = seeded_keys(load_seed, ring.len())
                .into_iter()
                .map(|h| h % (load_scale + 1))
                .collect();
            let total: u64 = loads.iter().sum();

            let choice = ring.lookup_bounded(key, &loads).unwrap();
            prop_assert!(choice.is_some());
            let choice = choice.unwrap();
            let cap = |i: usize| ring.capacity(i, total);

            prop_assert!(loads[choice.member] < cap(choice.member));
            prop_assert_eq!(choice.capacity, cap(choice.member));
            prop_assert_eq!(Some(choice.preferred), ring.lookup(key));
            if loads[choice.preferred] < cap(choice.preferred) {
                prop_assert_eq!(choice.member, choice.preferred);
                prop_assert!(choice.skipped.is_empty());
                prop_assert!(!choice.spilled());
            } else {
                prop_assert!(choice.spilled());
            }
            let order = ring.candidates(key, ring.len());
            let k = choice.skipped.len();
            prop_assert_eq!(&choice.skipped[..], &order[..k]);
            prop_assert_eq!(choice.member, order[k]);
            for &skipped in &choice.skipped {
                prop_assert!(loads[skipped] >= cap(skipped));
            }
        }

        /// The capacities always add up to more than the total load — why `lookup_bounded` always
        /// finds a member.
        #[test]
        fn capacities_exceed_the_total_load(
            weights in prop::collection::vec(1u32..1000, 1..64),
            c in 1.0f64..4.0,
            total in prop_oneof![0u64..1000, any::<u64>()],
        ) {
            let members: Vec<Member> = weights
                .iter()
                .enumerate()
                .map(|(i, &w)| Member::new(format!("m{i}"), w))
                .collect();
            let ring = Ring::new(members, RingConfig::new(1, c).unwrap()).unwrap();
            let sum: u128 = (0..ring.len())
                .map(|i| ring.capacity_wide(i, u128::from(total)))
                .sum();
            prop_assert!(sum > u128::from(total));
            // The u64 fast path and the u128 path agree.
            for (i, &w) in weights.iter().enumerate() {
                prop_assert_eq!(
                    ring.capacity_wide(i, u128::from(total)),
                    ring.capacity_u128(w, u128::from(total))
                );
            }
            // And the guard against rounding never strays from the formula by more than one.
            let total_weight: u32 = weights.iter().sum();
            for (i, &w) in weights.iter().enumerate() {
                let formula =
                    (c * (total as f64 + 1.0) * f64::from(w) / f64::from(total_weight)).ceil();
                let got = ring.capacity_wide(i, u128::from(total)) as f64;
                prop_assert!(got >= formula * (1.0 - 1e-12) && got <= formula * (1.0 + 1e-12) + 1.0,
                    "member {}: {} vs {}", i, got, formula);
            }
        }

        /// Candidates are distinct, start at the owner, and shorter lists are prefixes of longer.
        #[test]
        fn candidates_laws(
            scheme in "[a-z]{1,8}",
            n_members in 1usize..40,
            vnodes in 1u32..50,
            n in 0usize..50,
            key in any::<u64>(),
        ) {
            let ring = Ring::new(unit_members(&scheme, n_members), RingConfig::new(vnodes, 1.25).unwrap())
                .unwrap();
            let got = ring.candidates(key, n);
            prop_assert_eq!(got.len(), n.min(n_members));
            let mut sorted = got.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), got.len());
            if n > 0 {
                prop_assert_eq!(Some(got[0]), ring.lookup(key));
            }
            let all = ring.candidates(key, n_members);
            prop_assert_eq!(&got[..], &all[..got.len()]);
        }

        /// Lookup agrees with a brute-force scan over independently computed virtual nodes.
        #[test]
        fn lookup_matches_a_linear_scan(
            scheme in "[a-z]{1,8}",
            weights in prop::collection::vec(1u32..4, 1..8),
            vnodes in 1u32..20,
            key in any::<u64>(),
        ) {
            let members: Vec<Member> = ids(&scheme, weights.len())
                .into_iter()
                .zip(&weights)
                .map(|(id, &w)| Member::new(id, w))
                .collect();
            let mut all: Vec<(u64, &str)> = Vec::new();
            for m in &members {
                for i in 0..m.weight * vnodes {
                    all.push((key_hash(format!("{}#{i}", m.id).as_bytes()), m.id.as_str()));
                }
            }
            let expected = all
                .iter()
                .filter(|(h, _)| *h >= key)
                .min()
                .or_else(|| all.iter().min())
                .map(|(_, id)| *id);
            let ring = Ring::new(members.clone(), RingConfig::new(vnodes, 1.25).unwrap()).unwrap();
            prop_assert_eq!(ring.lookup(key).map(|i| members[i].id.as_str()), expected);
        }
    }
}
