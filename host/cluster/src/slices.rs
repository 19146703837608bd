//! Slices of the shared token buckets that this replica holds, so that most admissions need
//! no Redis round trip: when a take goes to Redis, the script also grants a slice of each
//! bucket it draws on (what the bucket refills in [`SLICE_WINDOW`], when that is a whole unit
//! or more), already taken from the shared level; later admissions pay from the slices, and
//! the reply's charges settle against them. A slice unused for [`SLICE_HOLD`] goes back as a
//! refund. Every unit a replica spends was taken from the shared bucket first, so the fleet
//! never admits past a limit; what a slice costs is that another replica may be refused for
//! up to [`SLICE_HOLD`] while this one holds unused units. Buckets too small to slice (under
//! one unit per window: 30 a minute refills 0.025 in 50 ms) go to Redis on every admission,
//! exactly as before. Pure bookkeeping here; the Redis side is [`crate::buckets`].

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A slice is what the bucket refills in this long.
pub const SLICE_WINDOW: Duration = Duration::from_millis(50);
/// A slice left this long since its last grant goes back to the shared bucket.
pub const SLICE_HOLD: Duration = Duration::from_millis(250);

/// The slice to ask for of a bucket of `per_minute`: [`SLICE_WINDOW`]'s refill, or nothing
/// when that is under one unit.
pub fn slice_of(per_minute: u32) -> f64 {
    let slice = f64::from(per_minute) * SLICE_WINDOW.as_secs_f64() / 60.0;
    if slice >= 1.0 { slice } else { 0.0 }
}

/// One bucket's slice held here.
#[derive(Debug)]
struct Slice {
    per_minute: u32,
    level: f64,
    granted: Instant,
}

/// This replica's slices, by bucket id.
#[derive(Debug, Default)]
pub(crate) struct Slices {
    held: Mutex<HashMap<String, Slice>>,
}

impl Slices {
    /// Pays every draw — (bucket id, amount, whether it is only a debt check) — from the
    /// slices held, or none: a take needs its amount, a debt check a slice with something
    /// left (the bucket was not in debt when it was granted, and this replica's settlements
    /// have not used it up since).
    pub(crate) fn pay<'a, I>(&self, draws: I) -> bool
    where
        I: IntoIterator<Item = (&'a str, f64, bool)> + Clone,
    {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let covered = draws.clone().into_iter().all(|(id, amount, debt_check)| {
            held.get(id).is_some_and(|slice| {
                if debt_check {
                    slice.level > 0.0
                } else {
                    slice.level >= amount
                }
            })
        });
        if covered {
            for (id, amount, _) in draws.into_iter().filter(|d| !d.2) {
                if let Some(slice) = held.get_mut(id) {
                    slice.level -= amount;
                }
            }
        }
        covered
    }

    /// Adds a grant of `amount` to bucket `id`'s slice.
    pub(crate) fn grant(&self, id: &str, per_minute: u32, amount: f64) {
        if amount <= 0.0 {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let slice = held.entry(id.to_owned()).or_insert(Slice {
            per_minute,
            level: 0.0,
            granted: Instant::now(),
        });
        slice.per_minute = per_minute;
        slice.level += amount;
        slice.granted = Instant::now();
    }

    /// Settles a charge (`delta` > 0) or refund (`delta` < 0) against bucket `id`'s slice,
    /// as far as it goes; returns what is left for the shared bucket.
    pub(crate) fn settle(&self, id: &str, delta: f64) -> f64 {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slice) = held.get_mut(id) else {
            return delta;
        };
        if delta < 0.0 {
            // Units taken from the shared bucket either way: held here until the slice goes
            // back.
            slice.level -= delta;
            return 0.0;
        }
        let paid = delta.min(slice.level.max(0.0));
        slice.level -= paid;
        delta - paid
    }

    /// Removes the slices not granted to for [`SLICE_HOLD`] by `now`: (id, size, what is
    /// left to return).
    pub(crate) fn expired(&self, now: Instant) -> Vec<(String, u32, f64)> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let old: Vec<String> = held
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.granted) >= SLICE_HOLD)
            .map(|(id, _)| id.clone())
            .collect();
        old.into_iter()
            .filter_map(|id| {
                let slice = held.remove(&id)?;
                Some((id, slice.per_minute, slice.level))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(id: &str, amount: f64) -> (&str, f64, bool) {
        (id, amount, false)
    }

    fn debt(id: &str) -> (&str, f64, bool) {
        (id, 0.0, true)
    }

    #[test]
    fn small_buckets_are_not_sliced_and_large_ones_by_their_refill() {
        assert_eq!(slice_of(30), 0.0);
        assert_eq!(slice_of(600), 0.0);
        assert_eq!(slice_of(60_000), 50.0);
    }

    #[test]
    fn draws_are_paid_from_slices_all_or_nothing() {
        let slices = Slices::default();
        assert!(!slices.pay([take("requests", 1.0)]), "nothing held yet");
        slices.grant("requests", 60_000, 2.0);
        slices.grant("output", 60_000, 10.0);
        assert!(slices.pay([take("requests", 1.0), debt("output")]));
        // Input tokens have no slice: nothing is paid, the request slice keeps its unit.
        assert!(!slices.pay([take("requests", 1.0), take("input", 5.0)]));
        assert!(slices.pay([take("requests", 1.0)]));
        assert!(!slices.pay([take("requests", 1.0)]), "the slice is spent");
        // Output settles against its slice; past it, the rest is the shared bucket's, and
        // a debt check no longer passes here.
        assert_eq!(slices.settle("output", 4.0), 0.0);
        assert_eq!(slices.settle("output", 10.0), 4.0);
        assert!(!slices.pay([debt("output")]));
        assert_eq!(slices.settle("input", 3.0), 3.0, "no slice: all shared");
        assert_eq!(
            slices.settle("output", -2.0),
            0.0,
            "a refund stays in the slice"
        );
        assert!(slices.pay([debt("output")]));
    }

    #[test]
    fn an_idle_slice_goes_back_with_what_is_left() {
        let slices = Slices::default();
        slices.grant("requests", 60_000, 5.0);
        assert!(slices.pay([take("requests", 2.0)]));
        assert!(slices.expired(Instant::now()).is_empty());
        let back = slices.expired(Instant::now() + SLICE_HOLD);
        assert_eq!(back, [("requests".to_owned(), 60_000, 3.0)]);
        assert!(!slices.pay([take("requests", 1.0)]), "returned");
    }
}
