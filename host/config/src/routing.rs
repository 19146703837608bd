//! `[routing]`: the ring (virtual nodes, the bounded-load factor), the prefix hashes, the
//! session headers, and which router policy routes when `[[policies.router]]` names none.

use crate::error::{ConfigError, invalid};
use crate::policies::{PolicySource, SlotKind};
use crate::raw::RawRouting;

/// Default size of one prefix-hash chunk, in bytes of canonical prompt text (~64 tokens).
pub const DEFAULT_PREFIX_CHUNK_BYTES: usize = 256;
/// Default cap on prefix hashes per request (128 KiB of prompt at the default chunk size);
/// the prompt past it is not hashed, which only makes cache estimates conservative.
pub const DEFAULT_MAX_PREFIX_HASHES: usize = 512;
/// The headers read for a session id unless `[routing] session_headers` says otherwise, in
/// order: the generic one, then the ones Claude Code and Codex send on every request of a
/// session.
pub const DEFAULT_SESSION_HEADERS: [&str; 3] =
    ["x-session-id", "x-claude-code-session-id", "session-id"];
/// The system-prompt lines left out unless `[routing] volatile_prefix` says otherwise:
/// Claude Code's billing line (`x-anthropic-billing-header: cc_version=…; cch=…;`), new on
/// every request (anthropics/claude-code#24168).
pub const DEFAULT_VOLATILE_PREFIX: [&str; 1] = [r"^x-anthropic-billing-header:"];
/// The router that routes when the config names none: docs/policies.md, "Which default, and why".
pub const DEFAULT_ROUTER: &str = "builtin:prefix-affinity";

/// Virtual nodes per unit of server weight unless `[routing] vnodes_per_weight` says otherwise.
pub const DEFAULT_VNODES_PER_WEIGHT: u32 = 160;
/// The most virtual nodes per unit of weight (the ring refuses more).
pub const MAX_VNODES_PER_WEIGHT: u32 = 10_000;
/// The bounded-load factor `c` unless `[routing] load_factor` says otherwise: a server is
/// passed over while its load exceeds `ceil(c × average)`.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

/// The ring's layout (`[routing] vnodes_per_weight`, `load_factor`), validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RingSettings {
    /// Virtual nodes per unit of weight, `1..=MAX_VNODES_PER_WEIGHT`.
    pub vnodes_per_weight: u32,
    /// The bounded-loads factor `c`, finite and `>= 1.0`.
    pub load_factor: f64,
}

impl Default for RingSettings {
    fn default() -> Self {
        Self {
            vnodes_per_weight: DEFAULT_VNODES_PER_WEIGHT,
            load_factor: DEFAULT_LOAD_FACTOR,
        }
    }
}

/// How prefix hashes are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixHashing {
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Most hashes per request.
    pub max_hashes: usize,
}

impl Default for PrefixHashing {
    fn default() -> Self {
        Self {
            chunk_bytes: DEFAULT_PREFIX_CHUNK_BYTES,
            max_hashes: DEFAULT_MAX_PREFIX_HASHES,
        }
    }
}

/// `[routing]`, validated.
#[derive(Clone, Debug)]
pub(crate) struct Routing {
    pub(crate) ring: RingSettings,
    pub(crate) prefix_hashing: PrefixHashing,
    pub(crate) session_headers: Vec<http::HeaderName>,
    /// The router when `[[policies.router]]` names none.
    pub(crate) router: PolicySource,
    /// Whether the router was named here (else it is the default).
    pub(crate) router_named: bool,
    /// Patterns of volatile system-prompt lines (checked to compile).
    pub(crate) volatile_prefix: Vec<String>,
    /// What the section says that is deprecated, for the log.
    pub(crate) warnings: Vec<String>,
}

/// Validates `[routing]`.
pub(crate) fn routing(routing: RawRouting) -> Result<Routing, ConfigError> {
    let mut warnings = Vec::new();
    // `strategy` was the routing choice before routers were policies: it names one now.
    let from_strategy = match routing.strategy.as_deref() {
        None => None,
        Some(strategy @ ("consistent-hash" | "round-robin")) => {
            let router = if strategy == "round-robin" {
                "builtin:round-robin"
            } else {
                DEFAULT_ROUTER
            };
            warnings.push(format!(
                "routing.strategy = {strategy:?} is deprecated: the router is a policy; write \
                 routing.router = {router:?} instead"
            ));
            Some(router)
        }
        Some(other) => {
            return Err(invalid(
                "routing.strategy",
                format!(
                    "{other:?}: the strategy setting is deprecated; name a router policy \
                     instead (routing.router = \"builtin:NAME\" or a component file)"
                ),
            ));
        }
    };
    if from_strategy.is_some() && routing.router.is_some() {
        return Err(invalid(
            "routing",
            "give routing.router only (routing.strategy is its deprecated spelling)",
        ));
    }
    // The deprecated strategy never contradicted router variants: they route, it is ignored.
    let router_named = routing.router.is_some();
    let router_text = routing
        .router
        .as_deref()
        .or(from_strategy)
        .unwrap_or(DEFAULT_ROUTER);
    let router = PolicySource::parse(router_text, "routing.router", SlotKind::Router)?;
    let ring = RingSettings {
        vnodes_per_weight: routing
            .vnodes_per_weight
            .unwrap_or(DEFAULT_VNODES_PER_WEIGHT),
        load_factor: routing.load_factor.unwrap_or(DEFAULT_LOAD_FACTOR),
    };
    if !(1..=MAX_VNODES_PER_WEIGHT).contains(&ring.vnodes_per_weight) {
        return Err(invalid(
            "routing.vnodes_per_weight",
            format!(
                "{} is outside 1..={MAX_VNODES_PER_WEIGHT}",
                ring.vnodes_per_weight
            ),
        ));
    }
    if !(ring.load_factor.is_finite() && ring.load_factor >= 1.0) {
        return Err(invalid(
            "routing.load_factor",
            format!("{} is not a finite number >= 1.0", ring.load_factor),
        ));
    }
    let prefix_hashing = PrefixHashing {
        chunk_bytes: routing
            .prefix_chunk_bytes
            .unwrap_or(DEFAULT_PREFIX_CHUNK_BYTES),
        max_hashes: routing
            .max_prefix_hashes
            .unwrap_or(DEFAULT_MAX_PREFIX_HASHES),
    };
    if !(16..=65536).contains(&prefix_hashing.chunk_bytes) {
        return Err(invalid(
            "routing.prefix_chunk_bytes",
            "must be between 16 and 65536",
        ));
    }
    if prefix_hashing.max_hashes > 65536 {
        return Err(invalid(
            "routing.max_prefix_hashes",
            "must be at most 65536",
        ));
    }
    let session_headers = match &routing.session_headers {
        None => DEFAULT_SESSION_HEADERS
            .iter()
            .map(|h| http::HeaderName::from_static(h))
            .collect(),
        Some(names) => names
            .iter()
            .map(|name| {
                http::HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()).map_err(
                    |_| {
                        invalid(
                            "routing.session_headers",
                            format!("{name:?} is not a valid header name"),
                        )
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let volatile_prefix = match routing.volatile_prefix {
        None => DEFAULT_VOLATILE_PREFIX
            .iter()
            .map(|p| (*p).to_owned())
            .collect(),
        Some(patterns) => patterns,
    };
    if let Err(e) = regex::RegexSet::new(&volatile_prefix) {
        return Err(invalid(
            "routing.volatile_prefix",
            format!("not a list of regular expressions: {e}"),
        ));
    }
    Ok(Routing {
        ring,
        prefix_hashing,
        session_headers,
        router,
        router_named,
        volatile_prefix,
        warnings,
    })
}
