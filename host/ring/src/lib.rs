//! The consistent-hash ring that maps a routing key to an inference server.
//!
//! This crate owns one thing: given the server set (ids and weights) and a 64-bit key, say which
//! server owns the key, which servers follow it clockwise, and — with bounded loads — which server
//! should take a request when the owner is already at its share. It must not touch anything else:
//! no I/O, no async, no clocks, no logging, no server health and no load counting. The caller
//! (the gateway) builds a [`Ring`] from its server list, publishes it as an immutable snapshot
//! (behind `Arc`/`ArcSwap`), and passes in the current loads when it asks for a bounded choice.
//!
//! # How it works
//!
//! Each member gets `vnodes_per_weight × weight` virtual nodes. Virtual node `i` of the member
//! with id `id` sits at [`key_hash`]`("{id}#{i}")` (xxh3-64). All virtual nodes live in one sorted
//! array; a key belongs to the first virtual node clockwise from it (the first with a hash
//! `>= key`, wrapping past the top of the `u64` space to the first node). Adding or removing one
//! of N equal servers therefore moves about 1/N of the keys, and only the keys of the server that
//! came or went.
//!
//! [`Ring::lookup_bounded`] implements consistent hashing with bounded loads (Mirrokni, Thorup,
//! Zadimoghaddam, *Consistent Hashing with Bounded Loads*, SODA 2018): a member whose load would
//! exceed its capacity `ceil(c · (total_load + 1) · weight / total_weight)` is passed over and the
//! walk continues clockwise to the next distinct member.
//!
//! ```
//! use ringmaster_ring::{Member, Ring, RingConfig, key_hash};
//!
//! let members = vec![Member::new("sim://gpu-0", 1), Member::new("sim://gpu-1", 2)];
//! let ring = Ring::new(members, RingConfig::default())?;
//! let key = key_hash(b"session-42");
//! let owner = ring.lookup(key).expect("the ring is not empty");
//! assert!(owner < ring.len());
//!
//! // Member 0 carries all 10 requests; its capacity is ceil(1.25 · 11 · 1/3) = 5, so a request
//! // that prefers it spills clockwise to member 1 (capacity ceil(1.25 · 11 · 2/3) = 10).
//! let choice = ring.lookup_bounded(key, &[10, 0])?.expect("the ring is not empty");
//! assert_eq!(choice.preferred, owner);
//! assert_eq!(choice.member, 1);
//! assert_eq!(choice.capacity, 10);
//! assert_eq!(choice.spilled(), owner == 0);
//! # Ok::<(), ringmaster_ring::RingError>(())
//! ```
//!
//! # What can go wrong
//!
//! Building a ring fails with a [`RingError`] on an empty or duplicate member id, a zero weight,
//! an out-of-range configuration, or a member set that would need more than
//! [`MAX_TOTAL_VNODES`] virtual nodes. Lookups never fail, except that
//! [`Ring::lookup_bounded`] rejects a loads slice whose length is not the member count. The
//! distribution is pinned by a golden test: changing the hash, the vnode naming or the tie-break
//! moves keys between servers (and so throws away their KV caches), and must be a deliberate act.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fmt;
use std::fmt::Write as _;

/// Virtual nodes per unit of weight when the configuration does not say otherwise.
///
/// 160 is the ketama tradition (libketama places 40 MD5 digests × 4 points per server, and
/// pingora-ketama keeps the same count). With `V` virtual nodes a member's share of the key space
/// is Beta-distributed with a coefficient of variation of at most `1/sqrt(V)`: 7.9 % at 160.
/// Measured over 100k keys (`examples/balance.rs`; names `sim://gpu-{i}`, keys `key-{i}`), the
/// most loaded of N members carries 1.093 × the mean at N = 4, 1.139 at 8, 1.125 at 16, 1.130 at
/// 32 and 1.164 at 64; the worst N in 4..=64 reaches 1.232 (N = 35). Keeping every member within
/// 1.15 of the mean at N = 64 takes about 300 vnodes for half of all id families and 800–1000 for
/// nearly all of them, at that many times the memory and build time; 160 is kept as the default
/// and the count is configurable.
pub const DEFAULT_VNODES_PER_WEIGHT: u32 = 160;

/// The bounded-loads factor `c` when the configuration does not say otherwise.
///
/// This is the `c = 1 + ε` of Mirrokni, Thorup and Zadimoghaddam: no member takes more than
/// `ceil(c × average)` requests. Smaller values balance tighter but move more requests away from
/// the server that holds their KV cache (the paper bounds the expected moves per insertion by
/// `O(1/ε²)`); 1.25 lets a server run 25 % above average before anything spills.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

/// The largest accepted `vnodes_per_weight`.
///
/// At 10 000 virtual nodes a member's share varies by about 1 %, below the noise of any real
/// workload; beyond it the ring only grows (16 bytes per virtual node) and builds slower.
pub const MAX_VNODES_PER_WEIGHT: u32 = 10_000;

/// The largest number of virtual nodes one ring may hold (`vnodes_per_weight × Σ weight`).
///
/// 2²⁴ virtual nodes take 256 MiB; a ring that big is a misconfiguration (for example a weight
/// meant as a percentage multiplied by a large vnode count), not a deployment. The cap also keeps
/// member indices within `u32` and the capacity arithmetic within `u128`.
pub const MAX_TOTAL_VNODES: u64 = 1 << 24;

/// Above this many wanted candidates (or members, for [`Ring::lookup_bounded`]'s spill walk), a
/// walk tracks visited members in a `Vec<bool>` instead of scanning the (short) result list.
const LINEAR_SEEN_MAX: usize = 16;

/// Hashes a routing key or a virtual-node name: xxh3-64 with the default seed.
///
/// This is the one hash the ring uses for both sides; callers must hash their routing keys with
/// it (or another function that spreads uniformly over `u64`) before calling [`Ring::lookup`].
#[must_use]
#[inline]
pub fn key_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Why a ring or a lookup was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum RingError {
    /// A member has an empty id.
    #[error("a ring member has an empty id")]
    EmptyId,
    /// Two members share an id.
    #[error("member id `{0}` appears more than once")]
    DuplicateMember(String),
    /// A member has weight 0; to take a server out, leave it out of the member list.
    #[error("member `{0}` has weight 0; weights must be at least 1")]
    ZeroWeight(String),
    /// `vnodes_per_weight` is outside `1..=MAX_VNODES_PER_WEIGHT`.
    #[error("vnodes_per_weight must be in 1..={max}, got {got}")]
    InvalidVnodesPerWeight {
        /// The rejected value.
        got: u32,
        /// [`MAX_VNODES_PER_WEIGHT`].
        max: u32,
    },
    /// `load_factor` is not a finite number `>= 1.0`.
    #[error("load_factor must be a finite number >= 1.0, got {0}")]
    InvalidLoadFactor(f64),
    /// The members' weights times `vnodes_per_weight` exceed [`MAX_TOTAL_VNODES`].
    #[error("the ring would hold {requested} virtual nodes, more than the maximum {max}")]
    TooManyVnodes {
        /// `vnodes_per_weight × Σ weight` (saturating).
        requested: u64,
        /// [`MAX_TOTAL_VNODES`].
        max: u64,
    },
    /// The loads slice passed to [`Ring::lookup_bounded`] does not have one entry per member.
    #[error("loads has {got} entries but the ring has {expected} members")]
    LoadsLength {
        /// The ring's member count.
        expected: usize,
        /// The length of the slice that was passed.
        got: usize,
    },
}

/// How a ring is laid out and how far bounded loads let a member run above average.
#[derive(Clone, Debug, PartialEq)]
pub struct RingConfig {
    /// Virtual nodes per unit of weight, in `1..=MAX_VNODES_PER_WEIGHT`.
    pub vnodes_per_weight: u32,
    /// The bounded-loads factor `c`, finite and `>= 1.0`.
    pub load_factor: f64,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            vnodes_per_weight: DEFAULT_VNODES_PER_WEIGHT,
            load_factor: DEFAULT_LOAD_FACTOR,
        }
    }
}

impl RingConfig {
    /// A validated configuration.
    ///
    /// # Errors
    ///
    /// [`RingError::InvalidVnodesPerWeight`] unless `1 <= vnodes_per_weight <=
    /// MAX_VNODES_PER_WEIGHT`; [`RingError::InvalidLoadFactor`] unless `load_factor` is finite and
    /// `>= 1.0`.
    pub fn new(vnodes_per_weight: u32, load_factor: f64) -> Result<Self, RingError> {
        let config = Self {
            vnodes_per_weight,
            load_factor,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants [`RingConfig::new`] enforces; [`Ring::new`] calls it too, because the
    /// fields are public.
    ///
    /// # Errors
    ///
    /// As for [`RingConfig::new`].
    pub fn validate(&self) -> Result<(), RingError> {
        if !(1..=MAX_VNODES_PER_WEIGHT).contains(&self.vnodes_per_weight) {
            return Err(RingError::InvalidVnodesPerWeight {
                got: self.vnodes_per_weight,
                max: MAX_VNODES_PER_WEIGHT,
            });
        }
        if !self.load_factor.is_finite() || self.load_factor < 1.0 {
            return Err(RingError::InvalidLoadFactor(self.load_factor));
        }
        Ok(())
    }
}

/// One server on the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The server's stable id; its virtual nodes are named `"{id}#{i}"`, so renaming a server
    /// moves its keys.
    pub id: String,
    /// Relative capacity, at least 1: a member of weight 2 gets twice the virtual nodes (and about
    /// twice the keys) of a member of weight 1.
    pub weight: u32,
}

impl Member {
    /// A member with the given id and weight (validated when the ring is built).
    #[must_use]
    pub fn new(id: impl Into<String>, weight: u32) -> Self {
        Self {
            id: id.into(),
            weight,
        }
    }
}

/// One virtual node: its position and the index of the member it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    hash: u64,
    member: u32,
}

/// An immutable consistent-hash ring; build a new one to change the member set.
///
/// Cloning copies the virtual-node array; to share one ring between threads, put it in an `Arc`.
#[derive(Clone)]
pub struct Ring {
    members: Vec<Member>,
    config: RingConfig,
    /// Sorted by hash, ties by member id.
    points: Vec<Point>,
    /// Σ weight, at most [`MAX_TOTAL_VNODES`].
    total_weight: u64,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The virtual nodes are left out: thousands of hashes help nobody reading a log.
        f.debug_struct("Ring")
            .field("members", &self.members)
            .field("config", &self.config)
            .field("vnode_count", &self.points.len())
            .finish_non_exhaustive()
    }
}

/// The outcome of [`Ring::lookup_bounded`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundedChoice {
    /// The member index chosen.
    pub member: usize,
    /// The member plain [`Ring::lookup`] picks for the key (the affinity owner).
    pub preferred: usize,
    /// Members passed over because they were at capacity, in ring order (starting with
    /// `preferred` when it was passed over; empty when it was not).
    pub skipped: Vec<usize>,
    /// The chosen member's capacity at decision time (saturated at `u64::MAX`).
    pub capacity: u64,
}

impl BoundedChoice {
    /// Whether the request left its affinity owner (`member != preferred`).
    #[must_use]
    pub fn spilled(&self) -> bool {
        self.member != self.preferred
    }
}

impl Ring {
    /// Builds a ring over `members` (kept in the order given). An empty member list is allowed;
    /// every lookup on it returns `None`.
    ///
    /// # Errors
    ///
    /// [`RingError::EmptyId`], [`RingError::ZeroWeight`] or [`RingError::DuplicateMember`] for the
    /// first offending member; the config's own errors (see [`RingConfig::new`]);
    /// [`RingError::TooManyVnodes`] when the ring would exceed [`MAX_TOTAL_VNODES`].
    pub fn new(members: Vec<Member>, config: RingConfig) -> Result<Ring, RingError> {
        config.validate()?;
        let mut seen = HashSet::with_capacity(members.len());
        let mut total_weight: u64 = 0;
        for member in &members {
            if member.id.is_empty() {
                return Err(RingError::EmptyId);
            }
            if member.weight == 0 {
                return Err(RingError::ZeroWeight(member.id.clone()));
            }
            if !seen.insert(member.id.as_str()) {
                return Err(RingError::DuplicateMember(member.id.clone()));
            }
            total_weight = total_weight.saturating_add(u64::from(member.weight));
        }
        let requested = total_weight.saturating_mul(u64::from(config.vnodes_per_weight));
        if requested > MAX_TOTAL_VNODES {
            return Err(RingError::TooManyVnodes {
                requested,
                max: MAX_TOTAL_VNODES,
            });
        }

        // Both conversions hold: `requested <= MAX_TOTAL_VNODES`, and every member has at least
        // one virtual node, so the member count is at most that too.
        let mut points = Vec::with_capacity(requested as usize);
        let mut name = String::new();
        for (index, member) in members.iter().enumerate() {
            let index = u32::try_from(index).expect("member count is bounded by MAX_TOTAL_VNODES");
            let count = u64::from(member.weight) * u64::from(config.vnodes_per_weight);
            for i in 0..count {
                name.clear();
                // Identical to `format!("{id}#{i}")` without an allocation per node. The name
                // splits uniquely at its last '#' (the suffix is all digits), so two members can
                // never name the same virtual node.
                let _ = write!(name, "{}#{i}", member.id);
                points.push(Point {
                    hash: key_hash(name.as_bytes()),
                    member: index,
                });
            }
        }
        sort_points(&mut points, &members);

        Ok(Ring {
            members,
            config,
            points,
            total_weight,
        })
    }

    /// The members, in the order given to [`Ring::new`]; a "member index" indexes this slice.
    #[must_use]
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The number of members.
    #[must_use]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ring has no members.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The configuration the ring was built with.
    #[must_use]
    pub fn config(&self) -> &RingConfig {
        &self.config
    }

    /// The number of virtual nodes (`vnodes_per_weight × Σ weight`).
    #[must_use]
    pub fn vnode_count(&self) -> usize {
        self.points.len()
    }

    /// The fraction of the `u64` key space each member owns, indexed like [`Ring::members`];
    /// the fractions sum to 1 (empty for an empty ring).
    ///
    /// This is the exact balance of the ring, free of key-sampling noise: uniformly spread keys
    /// land on member `i` with probability `key_shares()[i]`. It walks every virtual node, so it
    /// is meant for tests, admin pages and metrics, not for the request path.
    #[must_use]
    pub fn key_shares(&self) -> Vec<f64> {
        const SPACE: f64 = 18_446_744_073_709_551_616.0; // 2^64
        let mut arcs = vec![0u128; self.len()];
        let (Some(first), Some(last)) = (self.points.first(), self.points.last()) else {
            return Vec::new();
        };
        // A virtual node owns the arc from its predecessor (exclusive) up to itself (inclusive);
        // the first one's arc wraps around from the last.
        arcs[first.member as usize] +=
            u128::from(first.hash) + (1u128 << 64) - u128::from(last.hash);
        for pair in self.points.windows(2) {
            arcs[pair[1].member as usize] += u128::from(pair[1].hash - pair[0].hash);
        }
        arcs.into_iter().map(|arc| arc as f64 / SPACE).collect()
    }

    /// The member index owning `key`: the member of the first virtual node clockwise from the key
    /// (hash `>= key`, wrapping to the lowest hash). `None` only for an empty ring.
    #[must_use]
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<usize> {
        self.start(key).map(|at| self.points[at].member as usize)
    }

    /// The first `n` distinct members met walking clockwise from `key`; the first is
    /// [`Ring::lookup`]'s answer. `n` is capped at [`Ring::len`], so the result has
    /// `min(n, len)` entries.
    #[must_use]
    pub fn candidates(&self, key: u64, n: usize) -> Vec<usize> {
        let n = n.min(self.len());
        let mut out = Vec::with_capacity(n);
        let Some(start) = self.start(key) else {
            return out;
        };
        let walk = self.clockwise(start);
        if n <= LINEAR_SEEN_MAX {
            for member in walk {
                if out.len() == n {
                    break;
                }
                if !out.contains(&member) {
                    out.push(member);
                }
            }
        } else {
            let mut seen = vec![false; self.len()];
            for member in walk {
                if out.len() == n {
                    break;
                }
                if !std::mem::replace(&mut seen[member], true) {
                    out.push(member);
                }
            }
        }
        out
    }

    /// The most requests `member` may carry, counting the one being placed, when the members
    /// carry `total_load` in all: `ceil(c · (total_load + 1) · weight / total_weight)`; with equal
    /// weights `ceil(c · (total_load + 1) / len)`.
    ///
    /// The capacities of all members sum to at least `total_load + 1`, so some member always has
    /// room. The product is formed in `f64` and, so that rounding can never break that sum, the
    /// result is never below the exact integer `ceil((total_load + 1) · weight / total_weight)`.
    /// It saturates at `u64::MAX`.
    ///
    /// # Panics
    ///
    /// If `member >= self.len()`.
    #[must_use]
    pub fn capacity(&self, member: usize, total_load: u64) -> u64 {
        saturate(self.capacity_wide(member, u128::from(total_load)))
    }

    /// [`Ring::capacity`] with the factor `load_factor` instead of the ring's own (a router
    /// slot may set its own; see the gateway's `[policies] router_load_factor`). A factor
    /// below 1 or not finite is taken as 1.
    #[must_use]
    pub fn capacity_with(&self, member: usize, total_load: u64, load_factor: f64) -> u64 {
        let factor = if load_factor.is_finite() {
            load_factor.max(1.0)
        } else {
            1.0
        };
        let weight = self.members[member].weight;
        let placed = u128::from(total_load) + 1;
        let exact_floor = (placed * u128::from(weight)).div_ceil(u128::from(self.total_weight));
        let scaled =
            (factor * placed as f64 * f64::from(weight) / self.total_weight as f64).ceil() as u128;
        saturate(scaled.max(exact_floor))
    }

    /// Consistent hashing with bounded loads: walking clockwise from `key` over distinct members,
    /// the first member `i` with `loads[i] + 1 <= capacity(i, Σ loads)`.
    ///
    /// `loads[i]` is the current load of member `i`. Returns `Ok(None)` only for an empty ring;
    /// on a non-empty ring some member always has room (see [`Ring::capacity`]). When the
    /// preferred member has room this is as cheap as [`Ring::lookup`] and does not allocate.
    ///
    /// # Errors
    ///
    /// [`RingError::LoadsLength`] if `loads.len() != self.len()`.
    pub fn lookup_bounded(
        &self,
        key: u64,
        loads: &[u64],
    ) -> Result<Option<BoundedChoice>, RingError> {
        if loads.len() != self.len() {
            return Err(RingError::LoadsLength {
                expected: self.len(),
                got: loads.len(),
            });
        }
        let Some(start) = self.start(key) else {
            return Ok(None);
        };
        // Summed in u128 so that no load pattern can overflow; every comparison below is exact.
        let total: u128 = loads.iter().map(|&load| u128::from(load)).sum();
        let has_room = |member: usize| -> Option<u128> {
            let capacity = self.capacity_wide(member, total);
            (u128::from(loads[member]) < capacity).then_some(capacity)
        };

        let preferred = self.points[start].member as usize;
        if let Some(capacity) = has_room(preferred) {
            return Ok(Some(BoundedChoice {
                member: preferred,
                preferred,
                skipped: Vec::new(),
                capacity: saturate(capacity),
            }));
        }

        // Every member visited so far is in `skipped` (the walk returns at the first one with
        // room), so on small rings `skipped` doubles as the visited set.
        let mut skipped = vec![preferred];
        let mut seen = if self.len() > LINEAR_SEEN_MAX {
            let mut seen = vec![false; self.len()];
            seen[preferred] = true;
            seen
        } else {
            Vec::new()
        };
        for member in self.clockwise(start) {
            let visited = if seen.is_empty() {
                skipped.contains(&member)
            } else {
                std::mem::replace(&mut seen[member], true)
            };
            if visited {
                continue;
            }
            if let Some(capacity) = has_room(member) {
                return Ok(Some(BoundedChoice {
                    member,
                    preferred,
                    skipped,
                    capacity: saturate(capacity),
                }));
            }
            skipped.push(member);
        }
        // Σ capacity(i) >= Σ ceil((T + 1) · wᵢ / W) >= T + 1 > T = Σ loads[i], so some member has
        // loads[i] < capacity(i); every member has a virtual node, so the walk above meets it.
        unreachable!("bounded lookup found no member with room; capacities sum above total load")
    }

    /// The index into `points` of the first virtual node with hash `>= key`, wrapping to 0.
    #[inline]
    fn start(&self, key: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let at = self.points.partition_point(|point| point.hash < key);
        Some(if at == self.points.len() { 0 } else { at })
    }

    /// Member indices of every virtual node once, clockwise from `points[start]`.
    fn clockwise(&self, start: usize) -> impl Iterator<Item = usize> + '_ {
        let (before, after) = self.points.split_at(start);
        after
            .iter()
            .chain(before)
            .map(|point| point.member as usize)
    }

    /// [`Ring::capacity`] without the saturation, for any total.
    fn capacity_wide(&self, member: usize, total_load: u128) -> u128 {
        let weight = self.members[member].weight;
        // Any realistic load takes this path: native u64 arithmetic, same result as the u128 one.
        if let Ok(total) = u64::try_from(total_load)
            && let Some(placed) = total.checked_add(1)
            && let Some(share) = placed.checked_mul(u64::from(weight))
        {
            let exact_floor = share.div_ceil(self.total_weight);
            return self
                .scaled(placed as f64, weight)
                .max(u128::from(exact_floor));
        }
        self.capacity_u128(weight, total_load)
    }

    /// [`Ring::capacity_wide`] in `u128` throughout, for totals that overflow `u64`.
    fn capacity_u128(&self, weight: u32, total_load: u128) -> u128 {
        let placed = total_load + 1;
        // No overflow: placed <= 2^24 · 2^64 + 1 (at most 2^24 members of u64 load) and
        // weight <= 2^24 (MAX_TOTAL_VNODES), so the product stays below 2^113.
        let exact_floor = (placed * u128::from(weight)).div_ceil(u128::from(self.total_weight));
        self.scaled(placed as f64, weight).max(exact_floor)
    }

    /// `ceil(c · placed · weight / total_weight)` in `f64`.
    fn scaled(&self, placed: f64, weight: u32) -> u128 {
        // `as` saturates; the factor is finite and >= 1, so the product is never NaN.
        (self.config.load_factor * placed * f64::from(weight) / self.total_weight as f64).ceil()
            as u128
    }
}

/// Sorts virtual nodes by hash; equal hashes (an xxh3 collision) are ordered by member id, so the
/// owner of every key depends only on the member set, not on the order it was listed in.
fn sort_points(points: &mut [Point], members: &[Member]) {
    points.sort_unstable_by(|a, b| {
        a.hash.cmp(&b.hash).then_with(|| {
            members[a.member as usize]
                .id
                .cmp(&members[b.member as usize].id)
        })
    });
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
