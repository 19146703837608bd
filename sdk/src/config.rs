//! Typed configuration values, with defaults and clear errors.
//!
//! A policy's configuration is the key/value pairs under its entry in the gateway config; the
//! host hands them over as strings through the `config` interface. This module turns them
//! into typed values: a missing key gives the default, a malformed one a [`ConfigError`] that
//! names the key, the value and what was expected.
//!
//! The `get_*` functions read from any [`ConfigSource`], so the parsing is testable natively
//! with a slice of pairs; the `config_*` functions at the crate root read from the host
//! ([`HostConfig`]):
//!
//! ```
//! use ringmaster_policy_sdk::config::{get_f64, get_list};
//!
//! let cfg = [("cache_threshold", "0.75"), ("patterns", "foo, bar\nbaz")];
//! assert_eq!(get_f64(&cfg[..], "cache_threshold", 0.5), Ok(0.75));
//! assert_eq!(get_f64(&cfg[..], "missing", 0.5), Ok(0.5));
//! assert_eq!(get_list(&cfg[..], "patterns"), vec!["foo", "bar", "baz"]);
//! let err = get_f64(&[("cache_threshold", "most")][..], "cache_threshold", 0.5).unwrap_err();
//! assert_eq!(err.to_string(), "config `cache_threshold` = \"most\": expected a number");
//! ```
//!
//! What to do with an error is the policy's choice; [`OrTrap::or_trap`] logs it and traps,
//! which makes the gateway keep the previous version (a new version is probed before it goes
//! live) or fall back to its built-in decision.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

/// Where configuration values come from.
pub trait ConfigSource {
    /// The raw value for `key`, if the key is set.
    fn value(&self, key: &str) -> Option<String>;
}

/// The policy's configuration as the host holds it (the `config` import).
///
/// Outside the gateway, in a native test, reading from it panics; test with a slice of pairs
/// or a map instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostConfig;

impl ConfigSource for HostConfig {
    fn value(&self, key: &str) -> Option<String> {
        crate::host::config::get(key)
    }
}

impl ConfigSource for [(&str, &str)] {
    fn value(&self, key: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| (*v).to_owned())
    }
}

impl ConfigSource for [(String, String)] {
    fn value(&self, key: &str) -> Option<String> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
}

impl ConfigSource for BTreeMap<String, String> {
    fn value(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

impl<S: std::hash::BuildHasher> ConfigSource for HashMap<String, String, S> {
    fn value(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

impl<T: ConfigSource + ?Sized> ConfigSource for &T {
    fn value(&self, key: &str) -> Option<String> {
        (**self).value(key)
    }
}

/// A configuration value that is set but cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    value: String,
    expected: String,
}

impl ConfigError {
    /// An error for `key`, whose raw value is `value`; `expected` completes "expected …".
    pub fn new(key: &str, value: &str, expected: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            value: value.to_owned(),
            expected: expected.into(),
        }
    }

    /// The key whose value is wrong.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The raw value as configured.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config `{}` = {:?}: expected {}",
            self.key, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// Turns a configuration error into a trap, after logging it.
pub trait OrTrap<T> {
    /// The value, or: write the error to the host's log at `error` level, then panic (a trap).
    ///
    /// Only for use inside the gateway: the log call panics in a native test too, with a less
    /// helpful message.
    fn or_trap(self) -> T;
}

impl<T> OrTrap<T> for Result<T, ConfigError> {
    fn or_trap(self) -> T {
        match self {
            Ok(value) => value,
            Err(err) => {
                let message = err.to_string();
                crate::host::error(&message);
                panic!("{message}");
            }
        }
    }
}

/// Parses `key` with [`FromStr`] after trimming; `default` when the key is not set.
pub fn get_parsed<T: FromStr>(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: T,
    expected: &str,
) -> Result<T, ConfigError> {
    match source.value(key) {
        None => Ok(default),
        Some(raw) => raw
            .trim()
            .parse()
            .map_err(|_| ConfigError::new(key, &raw, expected)),
    }
}

/// A finite number; `default` when `key` is not set.
pub fn get_f64(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: f64,
) -> Result<f64, ConfigError> {
    let value: f64 = get_parsed(source, key, default, "a number")?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ConfigError::new(
            key,
            &source.value(key).unwrap_or_default(),
            "a finite number",
        ))
    }
}

/// A number within `min..=max`; `default` when `key` is not set.
pub fn get_f64_in(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: f64,
    min: f64,
    max: f64,
) -> Result<f64, ConfigError> {
    let value = get_f64(source, key, default)?;
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        let expected = if max == f64::INFINITY {
            format!("a number of at least {min}")
        } else {
            format!("a number from {min} to {max}")
        };
        Err(ConfigError::new(
            key,
            &source.value(key).unwrap_or_default(),
            expected,
        ))
    }
}

/// An integer from 0 to 4294967295; `default` when `key` is not set.
pub fn get_u32(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: u32,
) -> Result<u32, ConfigError> {
    get_parsed(source, key, default, "an integer from 0 to 4294967295")
}

/// An integer from 0 to 255; `default` when `key` is not set.
pub fn get_u8(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: u8,
) -> Result<u8, ConfigError> {
    get_parsed(source, key, default, "an integer from 0 to 255")
}

/// `true`/`false` (also `yes`/`no`, `on`/`off`, `1`/`0`, any case); `default` when not set.
pub fn get_bool(
    source: &(impl ConfigSource + ?Sized),
    key: &str,
    default: bool,
) -> Result<bool, ConfigError> {
    match source.value(key) {
        None => Ok(default),
        Some(raw) => match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(true),
            "false" | "no" | "off" | "0" => Ok(false),
            _ => Err(ConfigError::new(key, &raw, "true or false")),
        },
    }
}

/// The raw string; `default` when `key` is not set.
pub fn get_string(source: &(impl ConfigSource + ?Sized), key: &str, default: &str) -> String {
    source.value(key).unwrap_or_else(|| default.to_owned())
}

/// A list separated by newlines or commas, each item trimmed, empty items dropped; empty when
/// `key` is not set.
pub fn get_list(source: &(impl ConfigSource + ?Sized), key: &str) -> Vec<String> {
    source
        .value(key)
        .map(|raw| split_list(&raw))
        .unwrap_or_default()
}

/// Splits `raw` at newlines and commas, trims each item and drops the empty ones.
pub fn split_list(raw: &str) -> Vec<String> {
    raw.split(['\n', ','])
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// [`get_f64`] from the host's configuration.
pub fn config_f64(key: &str, default: f64) -> Result<f64, ConfigError> {
    get_f64(&HostConfig, key, default)
}

/// [`get_u32`] from the host's configuration.
pub fn config_u32(key: &str, default: u32) -> Result<u32, ConfigError> {
    get_u32(&HostConfig, key, default)
}

/// [`get_u8`] from the host's configuration.
pub fn config_u8(key: &str, default: u8) -> Result<u8, ConfigError> {
    get_u8(&HostConfig, key, default)
}

/// [`get_bool`] from the host's configuration.
pub fn config_bool(key: &str, default: bool) -> Result<bool, ConfigError> {
    get_bool(&HostConfig, key, default)
}

/// [`get_string`] from the host's configuration.
pub fn config_string(key: &str, default: &str) -> String {
    get_string(&HostConfig, key, default)
}

/// [`get_list`] from the host's configuration.
pub fn config_list(key: &str) -> Vec<String> {
    get_list(&HostConfig, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_give_the_default() {
        let cfg: [(&str, &str); 0] = [];
        assert_eq!(get_f64(&cfg[..], "x", 1.5), Ok(1.5));
        assert_eq!(get_u32(&cfg[..], "x", 7), Ok(7));
        assert_eq!(get_u8(&cfg[..], "x", 3), Ok(3));
        assert_eq!(get_bool(&cfg[..], "x", true), Ok(true));
        assert_eq!(get_string(&cfg[..], "x", "d"), "d");
        assert!(get_list(&cfg[..], "x").is_empty());
    }

    #[test]
    fn values_are_trimmed_and_parsed() {
        let cfg = [("f", " 0.25 "), ("u", "64\n"), ("b", "Yes"), ("p", "7")];
        assert_eq!(get_f64(&cfg[..], "f", 0.0), Ok(0.25));
        assert_eq!(get_u32(&cfg[..], "u", 0), Ok(64));
        assert_eq!(get_bool(&cfg[..], "b", false), Ok(true));
        assert_eq!(get_u8(&cfg[..], "p", 0), Ok(7));
    }

    #[test]
    fn errors_name_the_key_the_value_and_what_was_expected() {
        let cfg = [
            ("n", "lots"),
            ("p", "300"),
            ("u", "-1"),
            ("f", "NaN"),
            ("b", "maybe"),
        ];
        let cases = [
            (
                get_f64(&cfg[..], "n", 0.0).map(drop),
                "config `n` = \"lots\": expected a number",
            ),
            (
                get_u8(&cfg[..], "p", 0).map(drop),
                "config `p` = \"300\": expected an integer from 0 to 255",
            ),
            (
                get_u32(&cfg[..], "u", 0).map(drop),
                "config `u` = \"-1\": expected an integer from 0 to 4294967295",
            ),
            (
                get_f64(&cfg[..], "f", 0.0).map(drop),
                "config `f` = \"NaN\": expected a finite number",
            ),
            (
                get_bool(&cfg[..], "b", false).map(drop),
                "config `b` = \"maybe\": expected true or false",
            ),
        ];
        for (result, message) in cases {
            assert_eq!(result.unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn ranges_are_checked() {
        let cfg = [("t", "1.5"), ("r", "0.5")];
        let err = get_f64_in(&cfg[..], "t", 0.5, 0.0, 1.0).unwrap_err();
        assert_eq!(err.key(), "t");
        assert_eq!(err.value(), "1.5");
        assert_eq!(
            err.to_string(),
            "config `t` = \"1.5\": expected a number from 0 to 1"
        );
        let err = get_f64_in(&cfg[..], "r", 1.5, 1.0, f64::INFINITY).unwrap_err();
        assert_eq!(
            err.to_string(),
            "config `r` = \"0.5\": expected a number of at least 1"
        );
        assert_eq!(get_f64_in(&cfg[..], "missing", 0.5, 0.0, 1.0), Ok(0.5));
    }

    #[test]
    fn lists_split_at_newlines_and_commas() {
        assert_eq!(
            split_list(" a, b ,\n\nc,,\r\n d e "),
            vec!["a", "b", "c", "d e"]
        );
        assert!(split_list(" , \n").is_empty());
    }

    #[test]
    fn maps_are_sources() {
        let mut map = BTreeMap::new();
        map.insert("k".to_owned(), "2".to_owned());
        assert_eq!(get_u32(&map, "k", 0), Ok(2));
        let hash: HashMap<String, String> = map.clone().into_iter().collect();
        assert_eq!(get_u32(&hash, "k", 0), Ok(2));
        let owned = [("k".to_owned(), "3".to_owned())];
        assert_eq!(get_u32(&owned[..], "k", 0), Ok(3));
    }
}
