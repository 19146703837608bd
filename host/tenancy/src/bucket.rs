//! [`Bucket`]: a token bucket that refills continuously to its per-minute size, and that output
//! charges may drive below zero (a debt the refill pays back).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A token bucket that refills continuously to `size` per minute, and that output charges may
/// drive below zero (a debt the refill pays back).
#[derive(Debug)]
pub struct Bucket {
    size: f64,
    per_second: f64,
    /// (level, when it was last brought up to date).
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// A full bucket of `per_minute`.
    pub fn per_minute(per_minute: u32) -> Self {
        let size = f64::from(per_minute);
        Self {
            size,
            per_second: size / 60.0,
            state: Mutex::new((size, Instant::now())),
        }
    }

    /// Its size per minute.
    pub fn size_per_minute(&self) -> u32 {
        self.size as u32
    }

    /// The bucket's level now.
    fn level(&self, state: &mut (f64, Instant), now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.per_second).min(self.size);
        state.1 = now;
        state.0
    }

    /// How long until the level reaches `amount` (zero when it is there).
    fn wait_for(&self, level: f64, amount: f64) -> Duration {
        if level >= amount {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((amount - level) / self.per_second)
    }

    /// Takes `amount` if the level covers it; else how long until it would.
    pub fn try_take(&self, amount: f64) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        // A request larger than the whole bucket can never be covered: it waits for a full one.
        let needed = amount.min(self.size);
        if level >= needed {
            state.0 -= amount;
            Ok(())
        } else {
            Err(self.wait_for(level, needed))
        }
    }

    /// How long until the bucket is out of debt (zero when it is not in debt).
    pub fn debt_wait(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        self.wait_for(level, 0.0)
    }

    /// Charges `amount`, into debt if need be.
    pub fn charge(&self, amount: f64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        state.0 = level - amount;
    }

    /// Gives `amount` back (an estimate that was too high), up to the bucket's size.
    pub fn refund(&self, amount: f64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        state.0 = (level + amount).min(self.size);
    }

    /// (size, whole units left, time until full) for the rate-limit headers.
    pub fn report(&self) -> (u64, u64, Duration) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        (
            self.size as u64,
            level.max(0.0) as u64,
            self.wait_for(level, self.size),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_and_pays_back_debt() {
        let bucket = Bucket::per_minute(60);
        bucket.try_take(60.0).unwrap();
        let wait = bucket.try_take(1.0).unwrap_err();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
        bucket.charge(60.0);
        let debt = bucket.debt_wait();
        assert!(debt > Duration::from_secs(59), "{debt:?}");
        // A request larger than the bucket waits for a full bucket, not forever.
        let big = Bucket::per_minute(10);
        big.try_take(100.0).unwrap();
    }
}
