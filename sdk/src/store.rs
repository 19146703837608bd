//! Typed helpers over the host's `state` interface: the bounded key/value store every warm
//! instance of a policy shares (see `wit/policy.wit`).
//!
//! The store holds bytes; these helpers keep numbers and strings in it in one agreed layout
//! (little-endian `u64`/`i64`/`f64`, UTF-8 strings), so that what one instance writes another
//! reads. Inside the gateway they call the host; in a native test, where no host exists, they
//! panic, so keep decisions in pure functions over the values read here (see [`crate`]).
//!
//! Each call is atomic on its own; a read followed by a write is not (two instances may both
//! read the old value). For counters use [`add`], which is atomic; for averages that many
//! instances update, the occasional lost update of [`get_f64`] + [`set_f64`] is usually fine.

use crate::host::state;

/// The `u64` under `key` (absent or not 8 bytes: `None`).
pub fn get_u64(key: &str) -> Option<u64> {
    decode_u64(&state::get(key)?)
}

/// Stores `value` under `key`; false when the store refused it (larger than its byte cap).
pub fn set_u64(key: &str, value: u64) -> bool {
    state::set(key, &value.to_le_bytes())
}

/// The `f64` under `key` (absent or not 8 bytes: `None`).
pub fn get_f64(key: &str) -> Option<f64> {
    decode_u64(&state::get(key)?).map(f64::from_bits)
}

/// Stores `value` under `key`.
pub fn set_f64(key: &str, value: f64) -> bool {
    state::set(key, &value.to_bits().to_le_bytes())
}

/// The UTF-8 string under `key` (absent or not UTF-8: `None`).
pub fn get_string(key: &str) -> Option<String> {
    String::from_utf8(state::get(key)?).ok()
}

/// Stores `value` under `key`.
pub fn set_string(key: &str, value: &str) -> bool {
    state::set(key, value.as_bytes())
}

/// Adds `delta` to the counter under `key`, atomically across instances; the new value.
pub fn add(key: &str, delta: i64) -> i64 {
    state::add(key, delta)
}

/// Removes `key`; whether it was there.
pub fn remove(key: &str) -> bool {
    state::remove(key)
}

/// The 8 little-endian bytes of a `u64` (or the bits of an `f64`), if `bytes` is exactly that.
pub fn decode_u64(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_le_bytes)
}

/// An exponentially weighted moving average's next value: `old` moved toward `sample` by
/// `weight` (0 to 1); the first sample is taken as it is.
pub fn ewma(old: Option<f64>, sample: f64, weight: f64) -> f64 {
    match old {
        Some(old) if old.is_finite() => old + weight.clamp(0.0, 1.0) * (sample - old),
        _ => sample,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_only_eight_bytes() {
        assert_eq!(decode_u64(&7u64.to_le_bytes()), Some(7));
        assert_eq!(decode_u64(b"short"), None);
        assert_eq!(
            decode_u64(&1.5f64.to_bits().to_le_bytes()).map(f64::from_bits),
            Some(1.5)
        );
    }

    #[test]
    fn ewma_moves_toward_samples() {
        assert_eq!(ewma(None, 100.0, 0.2), 100.0);
        assert_eq!(ewma(Some(100.0), 200.0, 0.25), 125.0);
        assert_eq!(ewma(Some(f64::NAN), 50.0, 0.5), 50.0);
        assert_eq!(ewma(Some(10.0), 20.0, 3.0), 20.0, "weight is clamped to 1");
    }
}
