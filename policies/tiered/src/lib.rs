//! A tiered admission policy: priorities per tier, a bounded queue, a per-server cap.
//!
//! For each request, in this order:
//!
//! 1. If the gateway's queue is full (`queued >= queue-capacity`), reject it with a
//!    retry-after of `retry_after_ms`.
//! 2. If the servers are saturated (`in-flight >= servers × max_in_flight_per_server`), queue
//!    it. With no healthy server every request waits in the queue (until it is full).
//! 3. Else accept it with its tier's priority.
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `priority.<tier>` | `priority.default` | priority (0 to 255, 0 = lowest) of requests from `<tier>` |
//! | `priority.default` | 1 | priority of tiers without their own key |
//! | `max_in_flight_per_server` | 64 | in-flight requests per healthy server before requests queue |
//! | `retry_after_ms` | 1000 | the retry-after given with a rejection |
//!
//! A malformed value is logged and traps, so a new configuration with one never goes live.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::admission::{Guest, Load, Rejection, Verdict};
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_u8, get_u32};
use ringmaster_policy_sdk::types::Request;

/// The priority of tiers without a `priority.<tier>` key when `priority.default` is not set.
pub const DEFAULT_PRIORITY: u8 = 1;
/// In-flight requests per healthy server before requests queue, unless configured.
pub const DEFAULT_MAX_IN_FLIGHT_PER_SERVER: u32 = 64;
/// The retry-after given with a rejection, unless configured.
pub const DEFAULT_RETRY_AFTER_MS: u32 = 1000;

/// The policy's configuration for one request, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The priority of the request's tier.
    pub priority: u8,
    /// In-flight requests per healthy server before requests queue.
    pub max_in_flight_per_server: u32,
    /// The retry-after given with a rejection.
    pub retry_after_ms: u32,
}

impl Settings {
    /// Reads the settings for a request from `tier`, defaults for the keys that are not set.
    pub fn for_tier(
        source: &(impl ConfigSource + ?Sized),
        tier: &str,
    ) -> Result<Self, ConfigError> {
        let default = get_u8(source, "priority.default", DEFAULT_PRIORITY)?;
        Ok(Self {
            priority: get_u8(source, &format!("priority.{tier}"), default)?,
            max_in_flight_per_server: get_u32(
                source,
                "max_in_flight_per_server",
                DEFAULT_MAX_IN_FLIGHT_PER_SERVER,
            )?,
            retry_after_ms: get_u32(source, "retry_after_ms", DEFAULT_RETRY_AFTER_MS)?,
        })
    }
}

/// The verdict for a request under `load`.
pub fn decide(settings: &Settings, load: &Load) -> Verdict {
    if load.queued >= load.queue_capacity {
        return Verdict::Reject(Rejection {
            reason: format!(
                "the gateway's queue is full ({} of {} waiting)",
                load.queued, load.queue_capacity
            ),
            retry_after_ms: settings.retry_after_ms,
        });
    }
    let cap = u64::from(load.servers) * u64::from(settings.max_in_flight_per_server);
    if u64::from(load.in_flight) >= cap {
        Verdict::Queue
    } else {
        Verdict::Accept(settings.priority)
    }
}

/// The component's export.
#[derive(Debug)]
pub struct Tiered;

impl Guest for Tiered {
    fn admit(req: &Request, current: Load) -> Verdict {
        let settings = Settings::for_tier(&HostConfig, &req.tier()).or_trap();
        decide(&settings, &current)
    }
}

ringmaster_policy_sdk::admission::export!(Tiered);

#[cfg(test)]
mod tests {
    use super::*;

    fn load(in_flight: u32, queued: u32, queue_capacity: u32, servers: u32) -> Load {
        Load {
            in_flight,
            queued,
            queue_capacity,
            servers,
        }
    }

    fn defaults(tier: &str) -> Settings {
        let empty: [(&str, &str); 0] = [];
        Settings::for_tier(&empty[..], tier).unwrap()
    }

    #[test]
    fn priorities_come_from_the_tier_then_the_default() {
        let cfg = [("priority.pro", "200"), ("priority.default", "5")];
        assert_eq!(Settings::for_tier(&cfg[..], "pro").unwrap().priority, 200);
        assert_eq!(Settings::for_tier(&cfg[..], "free").unwrap().priority, 5);
        assert_eq!(defaults("free").priority, 1);
        assert_eq!(defaults("free").max_in_flight_per_server, 64);
        assert_eq!(defaults("free").retry_after_ms, 1000);
    }

    #[test]
    fn bad_priorities_are_errors() {
        let cfg = [("priority.pro", "256")];
        let err = Settings::for_tier(&cfg[..], "pro").unwrap_err();
        assert_eq!(
            err.to_string(),
            "config `priority.pro` = \"256\": expected an integer from 0 to 255"
        );
        // Another tier does not read the bad key.
        assert!(Settings::for_tier(&cfg[..], "free").is_ok());
    }

    #[test]
    fn accepts_under_the_cap() {
        assert_eq!(
            decide(&defaults("x"), &load(127, 0, 100, 2)),
            Verdict::Accept(1)
        );
    }

    #[test]
    fn queues_at_the_cap() {
        assert_eq!(
            decide(&defaults("x"), &load(128, 0, 100, 2)),
            Verdict::Queue
        );
        assert_eq!(decide(&defaults("x"), &load(0, 0, 100, 0)), Verdict::Queue);
    }

    #[test]
    fn rejects_when_the_queue_is_full() {
        let cfg = [("retry_after_ms", "250")];
        let settings = Settings::for_tier(&cfg[..], "x").unwrap();
        let Verdict::Reject(rejection) = decide(&settings, &load(0, 100, 100, 2)) else {
            panic!("expected a rejection");
        };
        assert_eq!(rejection.retry_after_ms, 250);
        assert_eq!(
            rejection.reason,
            "the gateway's queue is full (100 of 100 waiting)"
        );
        // A zero-capacity queue rejects whatever the load.
        assert!(matches!(
            decide(&settings, &load(0, 0, 0, 2)),
            Verdict::Reject(_)
        ));
    }

    #[test]
    fn the_cap_does_not_overflow() {
        let cfg = [("max_in_flight_per_server", "4294967295")];
        let settings = Settings::for_tier(&cfg[..], "x").unwrap();
        assert_eq!(
            decide(&settings, &load(u32::MAX, 0, 1, u32::MAX)),
            Verdict::Accept(1)
        );
    }
}
