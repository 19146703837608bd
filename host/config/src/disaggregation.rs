//! Prefill/decode disaggregation: each server's role (`role`, `disaggregation`,
//! `bootstrap_port`, `dp_rank` in a `[[servers]]` entry) and the fleet's rules
//! (`[disaggregation]`: when a request is split, what happens when its prefill fails, and the
//! simulated servers' KV link).
//!
//! Only the values and their validation live here; the gateway carries the pairs out and the
//! pool keeps prefill servers off the ring that whole requests are routed on.

use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawDisaggregation;

/// What a server does in a disaggregated fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Whole requests (the default): prefill and decode on the same server.
    #[default]
    Both,
    /// Prompts only: it computes a prompt's KV cache and hands it to a decode server.
    Prefill,
    /// Decoding from a KV cache another server computed; also whole requests, when a
    /// request is not worth splitting.
    Decode,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Both, Role::Prefill, Role::Decode];

    /// Its name in the config, `/admin/servers` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    /// The role named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// How a prefill server's KV cache reaches the decode server: the engines' protocol, which
/// decides what the gateway sends each leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Connector {
    /// vLLM's `NixlConnector` (pull): the prefill leg runs first with `max_tokens` 1 and
    /// `kv_transfer_params` asking for a remote decode; the decode leg gets the parameters
    /// the prefill returned.
    VllmNixl,
    /// SGLang's bootstrap: the same body to both legs at once, with `bootstrap_host`,
    /// `bootstrap_port` and `bootstrap_room`.
    Sglang,
    /// `ringmaster worker --role prefill|decode` (the NIXL-shaped exchange over HTTP) and
    /// this process's own servers (the KV blocks handed over in memory).
    Ringmaster,
}

impl Connector {
    /// Its name in the config and `/admin/servers`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::VllmNixl => "vllm-nixl",
            Self::Sglang => "sglang",
            Self::Ringmaster => "ringmaster",
        }
    }

    /// The connector named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::VllmNixl, Self::Sglang, Self::Ringmaster]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// One server's part in a disaggregated fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerRole {
    /// What it does.
    pub role: Role,
    /// How its KV cache moves (`None` for a server that only takes whole requests).
    pub connector: Option<Connector>,
    /// SGLang's bootstrap port on a prefill server (`None` elsewhere).
    pub bootstrap_port: Option<u16>,
    /// The engine's data-parallel rank this entry stands for (vLLM: the
    /// `x-data-parallel-rank` header; SGLang: `routed_dp_rank`).
    pub dp_rank: Option<u32>,
}

impl ServerRole {
    /// Validates one entry's `role`, `disaggregation`, `bootstrap_port` and `dp_rank`;
    /// `in_process` for this process's own servers (`sim://`, `gguf:`), whose connector is
    /// always `ringmaster`.
    pub fn new(
        role: Option<&str>,
        connector: Option<&str>,
        bootstrap_port: Option<u16>,
        dp_rank: Option<u32>,
        in_process: bool,
    ) -> Result<Self, String> {
        let role = match role.map(str::trim) {
            None => Role::Both,
            Some(name) => Role::parse(name).ok_or_else(|| {
                format!("role {name:?}: expected \"both\", \"prefill\" or \"decode\"")
            })?,
        };
        let connector = match connector.map(str::trim) {
            None => None,
            Some(name) => Some(Connector::parse(name).ok_or_else(|| {
                format!(
                    "disaggregation {name:?}: expected \"vllm-nixl\", \"sglang\" or \"ringmaster\""
                )
            })?),
        };
        let connector = match (role, connector, in_process) {
            (Role::Both, None, _) => None,
            (_, Some(c), true) if c != Connector::Ringmaster => {
                return Err(format!(
                    "disaggregation {:?}: a server in this process hands its KV cache over \
                     in memory (\"ringmaster\")",
                    c.as_str()
                ));
            }
            (_, _, true) => Some(Connector::Ringmaster),
            (Role::Both, Some(_), false) => {
                return Err(
                    "disaggregation names how a prefill or decode server's KV cache moves: \
                     set role = \"prefill\" or \"decode\" too"
                        .to_owned(),
                );
            }
            (_, None, false) => {
                return Err(format!(
                    "role {:?} needs disaggregation = \"vllm-nixl\", \"sglang\" or \
                     \"ringmaster\" (how its KV cache moves)",
                    role.as_str()
                ));
            }
            (_, Some(c), false) => Some(c),
        };
        let bootstrap_port = match (bootstrap_port, connector, role) {
            (Some(0), _, _) => return Err("bootstrap_port 0: expected 1–65535".to_owned()),
            (Some(_), c, _) if c != Some(Connector::Sglang) => {
                return Err("bootstrap_port is SGLang's (disaggregation = \"sglang\")".to_owned());
            }
            (Some(_), _, Role::Decode) => {
                return Err(
                    "bootstrap_port is a prefill server's (decode servers connect to it)"
                        .to_owned(),
                );
            }
            (port, Some(Connector::Sglang), Role::Prefill) => {
                Some(port.unwrap_or(DEFAULT_BOOTSTRAP_PORT))
            }
            _ => None,
        };
        if dp_rank.is_some() && connector.is_none() {
            return Err("dp_rank describes a prefill or decode server's engine rank".to_owned());
        }
        Ok(Self {
            role,
            connector,
            bootstrap_port,
            dp_rank,
        })
    }

    /// Whether it takes whole requests and decode legs (it is on the ring routers choose
    /// from).
    pub fn decodes(&self) -> bool {
        self.role != Role::Prefill
    }

    /// Whether it can decode a request another server prefilled.
    pub fn takes_handoffs(&self) -> bool {
        self.role == Role::Decode && self.connector.is_some()
    }
}

/// What a prefill failure does to its request (`[disaggregation] on_prefill_failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillFailure {
    /// Another prefill server is tried (up to `[retry] attempts`), then the decode server
    /// serves the request whole.
    #[default]
    Retry,
    /// The decode server serves the request whole at once.
    Decode,
}

/// What a request worth splitting does when the least busy prefill server has more prefill
/// work ahead than its decode server would have doing the prompt itself
/// (`[disaggregation] when_prefill_busy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenPrefillBusy {
    /// The decode server computes the prompt itself (Dynamo's `prefill_load` rule).
    #[default]
    Decode,
    /// It waits in the prefill server's queue all the same.
    Wait,
}

/// `[disaggregation]`: the fleet's rules for split requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DisaggregationSettings {
    /// The host's pair rule: a request is split only when the decode server would compute
    /// at least this many of its prompt tokens itself (fewer: the decode server serves it
    /// whole). A router of `ringmaster:policy@0.3.0` decides for itself.
    pub min_uncached_tokens: u32,
    /// What a prefill that fails before its answer does.
    pub on_prefill_failure: PrefillFailure,
    /// What a request does when every prefill server is busier than its decode server.
    pub when_prefill_busy: WhenPrefillBusy,
    /// Simulated servers' KV link: bytes per second between two servers.
    pub link_bytes_per_s: f64,
    /// Simulated servers' KV link: the time to open one transfer.
    pub link_latency: Duration,
}

/// The host's default pair rule's threshold: vllm-router's sample `pd_uncached_token_threshold`.
pub const DEFAULT_MIN_UNCACHED_TOKENS: u32 = 256;
/// The simulated KV link's default bandwidth: 50 GB/s, an NVLink-class link between two
/// GPUs (a 400 Gb/s RDMA NIC is 50 GB/s too).
pub const DEFAULT_LINK_GBPS: f64 = 50.0;
/// The simulated KV link's default setup time per transfer.
pub const DEFAULT_LINK_LATENCY: Duration = Duration::from_micros(100);

impl Default for DisaggregationSettings {
    fn default() -> Self {
        Self {
            min_uncached_tokens: DEFAULT_MIN_UNCACHED_TOKENS,
            on_prefill_failure: PrefillFailure::Retry,
            when_prefill_busy: WhenPrefillBusy::Decode,
            link_bytes_per_s: DEFAULT_LINK_GBPS * 1e9,
            link_latency: DEFAULT_LINK_LATENCY,
        }
    }
}

pub(crate) fn settings(raw: RawDisaggregation) -> Result<DisaggregationSettings, ConfigError> {
    let invalid = |field: &str, why: &str| invalid(format!("disaggregation.{field}"), why);
    let defaults = DisaggregationSettings::default();
    let on_prefill_failure = match raw.on_prefill_failure.as_deref() {
        None | Some("retry") => PrefillFailure::Retry,
        Some("decode") => PrefillFailure::Decode,
        Some(_) => {
            return Err(invalid(
                "on_prefill_failure",
                "expected \"retry\" (another prefill server, then whole on the decode \
                 server) or \"decode\" (whole on the decode server at once)",
            ));
        }
    };
    let when_prefill_busy = match raw.when_prefill_busy.as_deref() {
        None | Some("decode") => WhenPrefillBusy::Decode,
        Some("wait") => WhenPrefillBusy::Wait,
        Some(_) => {
            return Err(invalid(
                "when_prefill_busy",
                "expected \"decode\" (the decode server computes the prompt when every \
                 prefill server is busier) or \"wait\" (queue at the prefill server)",
            ));
        }
    };
    let gbps = raw.link_gbps.unwrap_or(DEFAULT_LINK_GBPS);
    if !(gbps.is_finite() && gbps > 0.0 && gbps <= 100_000.0) {
        return Err(invalid("link_gbps", "must be above 0 and at most 100000"));
    }
    let latency_us = raw
        .link_latency_us
        .unwrap_or(DEFAULT_LINK_LATENCY.as_micros() as f64);
    if !(latency_us.is_finite() && (0.0..=10_000_000.0).contains(&latency_us)) {
        return Err(invalid(
            "link_latency_us",
            "must be between 0 and 10000000 (10 s)",
        ));
    }
    Ok(DisaggregationSettings {
        min_uncached_tokens: raw
            .min_uncached_tokens
            .unwrap_or(defaults.min_uncached_tokens),
        on_prefill_failure,
        when_prefill_busy,
        link_bytes_per_s: gbps * 1e9,
        link_latency: Duration::from_secs_f64(latency_us / 1e6),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(
        role: Option<&str>,
        connector: Option<&str>,
        port: Option<u16>,
    ) -> Result<ServerRole, String> {
        ServerRole::new(role, connector, port, None, false)
    }

    #[test]
    fn a_plain_server_takes_whole_requests() {
        let plain = remote(None, None, None).unwrap();
        assert_eq!(plain, ServerRole::default());
        assert!(plain.decodes() && !plain.takes_handoffs());
    }

    #[test]
    fn a_split_role_needs_its_connector() {
        let err = remote(Some("prefill"), None, None).unwrap_err();
        assert!(err.contains("needs disaggregation"), "{err}");
        let err = remote(None, Some("vllm-nixl"), None).unwrap_err();
        assert!(err.contains("set role"), "{err}");
        let err = remote(Some("decoder"), Some("sglang"), None).unwrap_err();
        assert!(err.contains("expected \"both\""), "{err}");
        let err = remote(Some("decode"), Some("nixl"), None).unwrap_err();
        assert!(err.contains("expected \"vllm-nixl\""), "{err}");
        let decode = remote(Some("decode"), Some("vllm-nixl"), None).unwrap();
        assert!(decode.decodes() && decode.takes_handoffs());
        let prefill = remote(Some("prefill"), Some("vllm-nixl"), None).unwrap();
        assert!(!prefill.decodes() && !prefill.takes_handoffs());
    }

    #[test]
    fn sglang_prefill_servers_get_a_bootstrap_port() {
        let prefill = remote(Some("prefill"), Some("sglang"), None).unwrap();
        assert_eq!(prefill.bootstrap_port, Some(DEFAULT_BOOTSTRAP_PORT));
        let custom = remote(Some("prefill"), Some("sglang"), Some(9100)).unwrap();
        assert_eq!(custom.bootstrap_port, Some(9100));
        let decode = remote(Some("decode"), Some("sglang"), None).unwrap();
        assert_eq!(decode.bootstrap_port, None);
        assert!(remote(Some("decode"), Some("sglang"), Some(9100)).is_err());
        assert!(remote(Some("prefill"), Some("vllm-nixl"), Some(9100)).is_err());
        assert!(remote(Some("prefill"), Some("sglang"), Some(0)).is_err());
    }

    #[test]
    fn servers_in_this_process_hand_over_in_memory() {
        let sim = ServerRole::new(Some("prefill"), None, None, None, true).unwrap();
        assert_eq!(sim.connector, Some(Connector::Ringmaster));
        assert!(ServerRole::new(Some("decode"), Some("sglang"), None, None, true).is_err());
        assert_eq!(
            ServerRole::new(None, None, None, None, true).unwrap(),
            ServerRole::default()
        );
    }

    #[test]
    fn the_fleet_rules_are_checked() {
        let defaults = settings(RawDisaggregation::default()).unwrap();
        assert_eq!(defaults, DisaggregationSettings::default());
        assert_eq!(defaults.link_bytes_per_s, 50e9);
        let bad = |raw: RawDisaggregation| settings(raw).unwrap_err().to_string();
        assert!(
            bad(RawDisaggregation {
                on_prefill_failure: Some("give-up".into()),
                ..RawDisaggregation::default()
            })
            .contains("on_prefill_failure")
        );
        assert!(
            bad(RawDisaggregation {
                link_gbps: Some(0.0),
                ..RawDisaggregation::default()
            })
            .contains("link_gbps")
        );
        assert!(
            bad(RawDisaggregation {
                when_prefill_busy: Some("later".into()),
                ..RawDisaggregation::default()
            })
            .contains("when_prefill_busy")
        );
        let set = settings(RawDisaggregation {
            min_uncached_tokens: Some(0),
            on_prefill_failure: Some("decode".into()),
            when_prefill_busy: Some("wait".into()),
            link_gbps: Some(25.0),
            link_latency_us: Some(0.0),
        })
        .unwrap();
        assert_eq!(set.when_prefill_busy, WhenPrefillBusy::Wait);
        assert_eq!(set.min_uncached_tokens, 0);
        assert_eq!(set.on_prefill_failure, PrefillFailure::Decode);
        assert_eq!(set.link_latency, Duration::ZERO);
    }
}
