//! `[policies]`: the policy engine's limits and what each slot (router variants and the
//! shadow, admission, safety filter) loads at start, validated.

use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawPolicies;

/// Requests that may wait in the admission queue, unless configured.
pub const DEFAULT_QUEUE_CAPACITY: u32 = 256;
/// How long a request may wait in the admission queue, unless configured.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// Waiting this long raises a waiter one queue-priority level, unless configured.
pub const DEFAULT_QUEUE_AGING: Duration = Duration::from_secs(10);
/// Output bytes the safety filter checks at a time (and holds back), unless configured.
pub const DEFAULT_OUTPUT_WINDOW_BYTES: usize = 256;

/// The built-in policies a config may name as `builtin:NAME`, with the slot each one fills:
/// the ones the policy engine embeds (a test of the slots crate, which knows both crates,
/// keeps the names equal and loads each into its slot; this crate is a leaf and cannot ask
/// the engine).
pub const BUILTIN_POLICIES: [(&str, SlotKind); 15] = [
    ("consistent-hash", SlotKind::Router),
    ("cache-aware", SlotKind::Router),
    ("prefix-affinity", SlotKind::Router),
    ("kv-cost", SlotKind::Router),
    ("weighted-scorers", SlotKind::Router),
    ("prefix-cache", SlotKind::Router),
    ("least-loaded", SlotKind::Router),
    ("round-robin", SlotKind::Router),
    ("pair-prefix", SlotKind::Router),
    ("pair-llm-d", SlotKind::Router),
    ("pair-dynamo", SlotKind::Router),
    ("pair-split", SlotKind::Router),
    ("learned-ttft", SlotKind::Router),
    ("tiered", SlotKind::Admission),
    ("blocklist", SlotKind::Safety),
];

/// The slot a policy is loaded into, which decides the world its component must target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// A router variant or the shadow (world `router` or `learning-router`).
    Router,
    /// The admission slot (world `admission`).
    Admission,
    /// The safety filter (world `safety-filter`).
    Safety,
}

impl SlotKind {
    /// What a policy of this slot is called in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Router => "router",
            Self::Admission => "admission",
            Self::Safety => "safety-filter",
        }
    }

    /// The built-ins that fill this slot, for errors.
    fn builtins(self) -> String {
        BUILTIN_POLICIES
            .iter()
            .filter(|(_, slot)| *slot == self)
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How the host guards a router policy's choices with the bounded-load cap: an explicit part
/// of the router slot's contract (`[policies] router_bounded_load`, `router_load_factor`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CapGuard {
    /// A choice at its cap `ceil(c × (total + 1) × weight / total-weight)` is spilled onward
    /// on the ring, with `c` the slot's factor (`None`: the ring's `load_factor`).
    Host {
        /// The slot's own factor.
        load_factor: Option<f64>,
    },
    /// The policy decides alone: any routable server it names gets the request.
    Policy,
}

impl Default for CapGuard {
    fn default() -> Self {
        Self::Host { load_factor: None }
    }
}

impl CapGuard {
    /// A stable name for config, logs and the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host { .. } => "host",
            Self::Policy => "policy",
        }
    }
}

/// Where a policy's component comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// One embedded in the binary.
    Builtin(String),
    /// A file, reloaded when it changes.
    File(std::path::PathBuf),
}

impl PolicySource {
    /// `builtin:NAME` (one that exists and fills `slot`) or a file path; `key` names the
    /// setting in errors. A built-in in another slot's place is refused here, where
    /// `check-config` and `serve` both look, rather than when the engine loads it; a file's
    /// world is known only once it is loaded.
    pub fn parse(source: &str, key: &str, slot: SlotKind) -> Result<Self, ConfigError> {
        match source.strip_prefix("builtin:") {
            Some(name) => match BUILTIN_POLICIES.iter().find(|(n, _)| *n == name) {
                None => Err(invalid(
                    key,
                    format!(
                        "no built-in policy {name:?}; built-in {} policies: {}",
                        slot.as_str(),
                        slot.builtins()
                    ),
                )),
                Some((_, filled)) if *filled != slot => Err(invalid(
                    key,
                    format!(
                        "builtin:{name} fills the {} slot, not the {} slot; built-in {} \
                         policies: {}",
                        filled.as_str(),
                        slot.as_str(),
                        slot.as_str(),
                        slot.builtins()
                    ),
                )),
                Some(_) => Ok(Self::Builtin(name.to_owned())),
            },
            None if source.is_empty() => Err(invalid(
                key,
                "must be builtin:NAME or a path to a .wasm component",
            )),
            None => Ok(Self::File(std::path::PathBuf::from(source))),
        }
    }
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin(name) => write!(f, "builtin:{name}"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A router variant to load at start.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterVariantSpec {
    /// Name.
    pub name: String,
    /// Component source.
    pub source: PolicySource,
    /// Traffic weight.
    pub weight: u32,
    /// Shadow instead of live.
    pub shadow: bool,
    /// Its configuration.
    pub config: std::collections::BTreeMap<String, String>,
    /// Ramp it in progressively (it starts at weight 0 and the rollout raises it).
    pub rollout: Option<crate::rollout::RolloutPlan>,
}

/// `[[policies.router]] rollout`, `rollout_step`, `rollout_min_samples` as a plan, if given.
fn rollout_plan(
    key: &str,
    variant: &crate::raw::RawRouterVariant,
    shadow: bool,
) -> Result<Option<crate::rollout::RolloutPlan>, ConfigError> {
    let Some(steps) = &variant.rollout else {
        if variant.rollout_step.is_some() || variant.rollout_min_samples.is_some() {
            return Err(invalid(
                format!("{key}.rollout"),
                "rollout_step and rollout_min_samples need rollout (the steps)",
            ));
        }
        return Ok(None);
    };
    if shadow {
        return Err(invalid(
            format!("{key}.rollout"),
            "a shadow takes no traffic, so it cannot roll out",
        ));
    }
    let step = match variant.rollout_step.as_deref() {
        None => crate::rollout::DEFAULT_ROLLOUT_STEP,
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            invalid(
                format!("{key}.rollout_step"),
                format!("{text:?} is not a duration like \"10m\": {e}"),
            )
        })?,
    };
    crate::rollout::RolloutPlan::new(steps, step, variant.rollout_min_samples)
        .map(Some)
        .map_err(|e| invalid(format!("{key}.rollout"), e))
}

/// The policy in a single-policy slot (admission or safety filter).
#[derive(Clone, Debug, PartialEq)]
pub struct SlotPolicySpec {
    /// Name (metric label, log tag).
    pub name: String,
    /// Component source.
    pub source: PolicySource,
    /// Its configuration.
    pub config: std::collections::BTreeMap<String, String>,
}

/// Where compiled components are cached (`[policies] cache_dir`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ComponentCache {
    /// The user's cache folder (`$XDG_CACHE_HOME/ringmaster/policies` or the like).
    #[default]
    UserCache,
    /// This folder.
    Dir(std::path::PathBuf),
    /// None: every component is compiled at each load (`cache_dir = ""`).
    Off,
}

/// `[policies]`' limits for the policy engine: overrides of its defaults (`None`: the
/// engine's own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyEngineSettings {
    /// The per-call deadline (1 ms to 10 s).
    pub call_deadline: Option<Duration>,
    /// The per-instance memory cap, bytes.
    pub memory_limit_bytes: Option<usize>,
    /// The most entries one policy's `state` store holds.
    pub state_max_entries: Option<u32>,
    /// The most bytes one policy's `state` store holds.
    pub state_max_bytes: Option<u64>,
    /// Where compiled components are cached.
    pub cache: ComponentCache,
}

/// The policy engine's settings and every slot's contents.
#[derive(Clone, Debug)]
pub struct PoliciesConfig {
    /// Engine limits.
    pub engine: PolicyEngineSettings,
    /// Router variants (never empty: `[routing] router` when `[[policies.router]]` names
    /// none).
    pub router: Vec<RouterVariantSpec>,
    /// Whether candidates are stopped when worse beyond doubt (the experiments' guardrails).
    pub guardrails: bool,
    /// How the host guards the router's choices with the bounded-load cap.
    pub router_guard: CapGuard,
    /// The admission policy (none: every request is admitted).
    pub admission: Option<SlotPolicySpec>,
    /// Requests that may wait in the gateway's queue.
    pub queue_capacity: u32,
    /// How long a request may wait in the queue.
    pub queue_timeout: Duration,
    /// Queue priority per tier (others 0): the order waiters run in.
    pub queue_priority: std::collections::HashMap<String, u8>,
    /// Waiting this long raises a waiter one queue-priority level.
    pub queue_aging: Duration,
    /// The safety filter (none: nothing is filtered).
    pub safety: Option<SlotPolicySpec>,
    /// Output bytes per safety check.
    pub safety_window_bytes: usize,
    /// Block when the safety filter faults.
    pub safety_fail_closed: bool,
    /// Lower-case header names passed to policies.
    pub pass_headers: Vec<String>,
}

impl PoliciesConfig {
    /// Every configured policy that comes from a file, as `(slot, name, path)`.
    pub fn files(&self) -> Vec<(&'static str, &str, &std::path::Path)> {
        let router = self.router.iter().map(|v| ("router", &v.name, &v.source));
        let admission = self
            .admission
            .iter()
            .map(|p| ("admission", &p.name, &p.source));
        let safety = self
            .safety
            .iter()
            .map(|p| ("safety-filter", &p.name, &p.source));
        router
            .chain(admission)
            .chain(safety)
            .filter_map(|(slot, name, source)| match source {
                PolicySource::File(path) => Some((slot, name.as_str(), path.as_path())),
                PolicySource::Builtin(_) => None,
            })
            .collect()
    }
}

/// Validates `[policies]`; `default_router` (from `[routing]`) routes when no variant is
/// named here, and `router_named` says whether `[routing]` named it explicitly (which with
/// `[[policies.router]]` variants is a contradiction).
pub(crate) fn policies_config(
    raw: RawPolicies,
    (default_router, router_named): (crate::policies::PolicySource, bool),
) -> Result<PoliciesConfig, ConfigError> {
    let mut engine = PolicyEngineSettings::default();
    if let Some(ms) = raw.call_deadline_ms {
        if !(1..=10_000).contains(&ms) {
            return Err(invalid(
                "policies.call_deadline_ms",
                "must be between 1 and 10000",
            ));
        }
        engine.call_deadline = Some(Duration::from_millis(ms));
    }
    if let Some(mb) = raw.memory_limit_mb {
        if !(1..=4096).contains(&mb) {
            return Err(invalid(
                "policies.memory_limit_mb",
                "must be between 1 and 4096",
            ));
        }
        engine.memory_limit_bytes = Some(mb * 1024 * 1024);
    }
    if let Some(entries) = raw.state_max_entries {
        if !(1..=16_777_216).contains(&entries) {
            return Err(invalid(
                "policies.state_max_entries",
                "must be between 1 and 16777216",
            ));
        }
        engine.state_max_entries = Some(entries);
    }
    if let Some(mb) = raw.state_max_mb {
        if !(1..=4096).contains(&mb) {
            return Err(invalid(
                "policies.state_max_mb",
                "must be between 1 and 4096",
            ));
        }
        engine.state_max_bytes = Some(mb * 1024 * 1024);
    }
    // The compiled-component cache is on unless turned off with an empty path: a Python
    // component compiles for seconds and loads from the cache in milliseconds.
    engine.cache = match raw.cache_dir.as_deref() {
        Some("") => ComponentCache::Off,
        Some(dir) => ComponentCache::Dir(std::path::PathBuf::from(dir)),
        None => ComponentCache::UserCache,
    };
    let mut router = Vec::new();
    for (i, variant) in raw.router.unwrap_or_default().into_iter().enumerate() {
        let key = format!("policies.router[{i}]");
        let source = policy_source(&key, &variant.source, SlotKind::Router)?;
        if router
            .iter()
            .any(|v: &RouterVariantSpec| v.name == variant.name)
        {
            return Err(invalid(
                format!("{key}.name"),
                format!("duplicate variant {:?}", variant.name),
            ));
        }
        let shadow = variant.shadow.unwrap_or(false);
        if shadow && router.iter().any(|v: &RouterVariantSpec| v.shadow) {
            return Err(invalid(
                format!("{key}.shadow"),
                "only one shadow variant is allowed",
            ));
        }
        let rollout = rollout_plan(&key, &variant, shadow)?;
        router.push(RouterVariantSpec {
            name: variant.name,
            source,
            // A rollout's candidate takes no traffic until the rollout gives it some.
            weight: if rollout.is_some() {
                0
            } else {
                variant.weight.unwrap_or(100)
            },
            shadow,
            config: policy_config(variant.config),
            rollout,
        });
    }
    let rollouts = router.iter().filter(|v| v.rollout.is_some()).count();
    if rollouts > 1 {
        return Err(invalid(
            "policies.router",
            "only one variant at a time can roll out",
        ));
    }
    if rollouts == 1
        && !router
            .iter()
            .any(|v| v.rollout.is_none() && !v.shadow && v.weight > 0)
    {
        return Err(invalid(
            "policies.router",
            "a rollout needs a live variant to compare the candidate with (the control)",
        ));
    }
    let router_guard = match (raw.router_bounded_load.as_deref(), raw.router_load_factor) {
        // A factor alone asks for the host's guard; nothing at all lets the policy decide.
        (None, None) | (Some("policy"), None) => CapGuard::Policy,
        (None, factor @ Some(_)) | (Some("host"), factor) => {
            if let Some(f) = factor
                && !(f.is_finite() && f >= 1.0)
            {
                return Err(invalid(
                    "policies.router_load_factor",
                    "must be a number of at least 1.0",
                ));
            }
            CapGuard::Host {
                load_factor: factor,
            }
        }
        (Some("policy"), Some(_)) => {
            return Err(invalid(
                "policies.router_load_factor",
                "has no effect with router_bounded_load = \"policy\" (the policy decides alone)",
            ));
        }
        (Some(other), _) => {
            return Err(invalid(
                "policies.router_bounded_load",
                format!("{other:?} is not \"host\" or \"policy\""),
            ));
        }
    };
    let mut queue_capacity = DEFAULT_QUEUE_CAPACITY;
    let mut queue_timeout = DEFAULT_QUEUE_TIMEOUT;
    let mut queue_priority = std::collections::HashMap::new();
    let mut queue_aging = DEFAULT_QUEUE_AGING;
    let admission = match raw.admission {
        None => None,
        Some(a) => {
            for (tier, priority) in a.queue_priority.unwrap_or_default() {
                let priority = u8::try_from(priority).map_err(|_| {
                    invalid(
                        format!("policies.admission.queue_priority.{tier}"),
                        "must be between 0 and 255",
                    )
                })?;
                queue_priority.insert(tier, priority);
            }
            if let Some(ms) = a.queue_aging_ms {
                if !(1..=3_600_000).contains(&ms) {
                    return Err(invalid(
                        "policies.admission.queue_aging_ms",
                        "must be between 1 and 3600000",
                    ));
                }
                queue_aging = Duration::from_millis(ms);
            }
            if let Some(n) = a.queue_capacity {
                if n > 1_000_000 {
                    return Err(invalid(
                        "policies.admission.queue_capacity",
                        "must be at most 1000000",
                    ));
                }
                queue_capacity = n;
            }
            if let Some(ms) = a.queue_timeout_ms {
                if !(1..=3_600_000).contains(&ms) {
                    return Err(invalid(
                        "policies.admission.queue_timeout_ms",
                        "must be between 1 and 3600000",
                    ));
                }
                queue_timeout = Duration::from_millis(ms);
            }
            Some(SlotPolicySpec {
                name: slot_policy_name("policies.admission.name", a.name, "admission")?,
                source: policy_source("policies.admission", &a.source, SlotKind::Admission)?,
                config: policy_config(a.config),
            })
        }
    };
    let mut safety_window_bytes = DEFAULT_OUTPUT_WINDOW_BYTES;
    let mut safety_fail_closed = false;
    let safety = match raw.safety {
        None => None,
        Some(f) => {
            if let Some(n) = f.window_bytes {
                if !(16..=1_048_576).contains(&n) {
                    return Err(invalid(
                        "policies.safety.window_bytes",
                        "must be between 16 and 1048576",
                    ));
                }
                safety_window_bytes = n;
            }
            safety_fail_closed = f.fail_closed.unwrap_or(false);
            Some(SlotPolicySpec {
                name: slot_policy_name("policies.safety.name", f.name, "safety")?,
                source: policy_source("policies.safety", &f.source, SlotKind::Safety)?,
                config: policy_config(f.config),
            })
        }
    };
    let mut pass_headers = Vec::new();
    for (i, name) in raw.pass_headers.unwrap_or_default().into_iter().enumerate() {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(invalid(
                format!("policies.pass_headers[{i}]"),
                format!("{name:?} is not a valid header name"),
            ));
        }
        pass_headers.push(name.to_ascii_lowercase());
    }
    if router.is_empty() {
        router.push(RouterVariantSpec {
            name: "default".to_owned(),
            source: default_router,
            weight: 100,
            shadow: false,
            config: Default::default(),
            rollout: None,
        });
    } else if router_named {
        return Err(invalid(
            "routing.router",
            "names the router, and so do the [[policies.router]] variants: give one of them",
        ));
    }
    Ok(PoliciesConfig {
        engine,
        guardrails: raw.guardrails.unwrap_or(false),
        router,
        router_guard,
        admission,
        queue_capacity,
        queue_timeout,
        queue_priority,
        queue_aging,
        safety,
        safety_window_bytes,
        safety_fail_closed,
        pass_headers,
    })
}

/// `builtin:NAME` or a file path, checked.
fn policy_source(key: &str, source: &str, slot: SlotKind) -> Result<PolicySource, ConfigError> {
    PolicySource::parse(source, &format!("{key}.source"), slot)
}

/// A policy's configuration as the strings the `config` import hands out.
fn policy_config(
    raw: Option<std::collections::BTreeMap<String, toml::Value>>,
) -> std::collections::BTreeMap<String, String> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                toml::Value::String(s) => s,
                other => other.to_string(),
            };
            (k, text)
        })
        .collect()
}

fn slot_policy_name(key: &str, name: Option<String>, default: &str) -> Result<String, ConfigError> {
    let name = name.unwrap_or_else(|| default.to_owned());
    if name.is_empty() || name.len() > 64 {
        return Err(invalid(key, "must be 1 to 64 characters"));
    }
    Ok(name)
}
