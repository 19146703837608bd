//! The synthetic inputs a new policy must handle before it is accepted: a four-server cluster
//! (two of them decode servers) with two prefill servers beside it, that answers the `ring`
//! and `cluster` imports, and a few requests and loads that cover the edges (no session, a
//! session, no prefix hashes, many, extreme keys and priorities).

use crate::types::{AdmissionLoad, PolicyRequest, PolicyRole, RouterHost, ServerView};

/// The ids of the probe cluster's servers a request may be routed to.
pub(crate) const PROBE_SERVERS: [&str; 4] = ["probe-0", "probe-1", "probe-2", "probe-3"];
/// The ids of its prefill servers (0.3.0 routers see them).
pub(crate) const PROBE_PREFILL_SERVERS: [&str; 2] = ["probe-p0", "probe-p1"];

/// A four-server cluster, all healthy, with different loads; `probe-2` and `probe-3` are
/// decode servers, with two prefill servers beside them.
#[derive(Debug)]
pub(crate) struct ProbeCluster {
    servers: Vec<ServerView>,
    prefill: Vec<ServerView>,
    prefix_hashes: usize,
}

impl ProbeCluster {
    /// The cluster as it answers during a call for `request`.
    pub(crate) fn new(request: &PolicyRequest) -> Self {
        let servers = PROBE_SERVERS
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let i = u32::try_from(i).unwrap_or(0);
                ServerView {
                    id: (*id).to_owned(),
                    role: if i >= 2 {
                        PolicyRole::Decode
                    } else {
                        PolicyRole::Both
                    },
                    healthy: true,
                    weight: 1 + i % 2,
                    in_flight: i * 3,
                    waiting: i,
                    kv_blocks_used: i * 1000,
                    kv_blocks_total: 26_000,
                }
            })
            .collect();
        let prefill = PROBE_PREFILL_SERVERS
            .iter()
            .enumerate()
            .map(|(i, id)| ServerView {
                id: (*id).to_owned(),
                role: PolicyRole::Prefill,
                healthy: true,
                weight: 1,
                in_flight: u32::try_from(i).unwrap_or(0) * 2,
                waiting: 0,
                kv_blocks_used: 0,
                kv_blocks_total: 26_000,
            })
            .collect();
        Self {
            servers,
            prefill,
            prefix_hashes: request.prefix_hashes.len(),
        }
    }

    fn at(&self, key: u64) -> &str {
        &self.servers[(key % self.servers.len() as u64) as usize].id
    }
}

impl RouterHost for ProbeCluster {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        Some(self.at(key).to_owned())
    }

    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        (0..u64::from(n).min(self.servers.len() as u64))
            .map(|i| self.at(key.wrapping_add(i)).to_owned())
            .collect()
    }

    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        self.ring_lookup(key)
    }

    fn servers(&self) -> Vec<ServerView> {
        self.servers.clone()
    }

    fn server(&self, id: &str) -> Option<ServerView> {
        self.servers.iter().find(|s| s.id == id).cloned()
    }

    fn prefix_matches(&self) -> Vec<(String, u32)> {
        if self.prefix_hashes == 0 {
            return Vec::new();
        }
        let n = u32::try_from(self.prefix_hashes).unwrap_or(u32::MAX);
        vec![
            (self.servers[1].id.clone(), n),
            (self.servers[2].id.clone(), n / 2),
        ]
    }

    fn prefill_servers(&self) -> Vec<ServerView> {
        self.prefill.clone()
    }

    fn prefill_prefix_matches(&self) -> Vec<(String, u32)> {
        let n = u32::try_from(self.prefix_hashes).unwrap_or(u32::MAX);
        if n == 0 {
            return Vec::new();
        }
        vec![(self.prefill[0].id.clone(), n / 3)]
    }

    fn prefill_servers_backlog(&self) -> Vec<(String, u64)> {
        vec![(self.prefill[1].id.clone(), 4096)]
    }

    fn prefill_routable(&self, id: &str) -> bool {
        self.prefill.iter().any(|s| s.id == id)
    }
}

/// The probe requests, each with a short description for error messages.
pub(crate) fn requests() -> Vec<(&'static str, PolicyRequest)> {
    let base = PolicyRequest {
        id: "req_probe_0".into(),
        model: "probe-model".into(),
        tier: "standard".into(),
        session_id: None,
        routing_key: 0x9e37_79b9_7f4a_7c15,
        prefix_hashes: vec![11, 22, 33],
        prompt_tokens: 120,
        max_tokens: 256,
        priority: 1,
        stream: false,
        headers: Vec::new(),
        door: "messages",
    };
    vec![
        ("a plain request", base.clone()),
        (
            "a streamed request in a session with 32 prefix hashes and a header",
            PolicyRequest {
                id: "req_probe_1".into(),
                session_id: Some("probe-session".into()),
                routing_key: u64::MAX,
                prefix_hashes: (1..=32).collect(),
                prompt_tokens: 4096,
                stream: true,
                headers: vec![("x-probe".into(), "1".into())],
                priority: 255,
                door: "responses",
                ..base.clone()
            },
        ),
        (
            "an empty request (key 0, no prefix hashes, no tokens)",
            PolicyRequest {
                id: "req_probe_2".into(),
                model: String::new(),
                tier: "anonymous".into(),
                routing_key: 0,
                prefix_hashes: Vec::new(),
                prompt_tokens: 0,
                max_tokens: 1,
                priority: 0,
                ..base
            },
        ),
    ]
}

/// Loads an admission policy is probed under.
pub(crate) fn loads() -> Vec<(&'static str, AdmissionLoad)> {
    vec![
        (
            "an idle gateway",
            AdmissionLoad {
                in_flight: 0,
                queued: 0,
                queue_capacity: 256,
                servers: 4,
            },
        ),
        (
            "a full queue",
            AdmissionLoad {
                in_flight: 512,
                queued: 256,
                queue_capacity: 256,
                servers: 4,
            },
        ),
        (
            "no healthy servers",
            AdmissionLoad {
                in_flight: 0,
                queued: 3,
                queue_capacity: 256,
                servers: 0,
            },
        ),
    ]
}

/// Texts a safety filter is probed with: `(description, text, is output, is final)`.
pub(crate) fn texts() -> Vec<(&'static str, &'static str, bool, bool)> {
    vec![
        (
            "an ordinary prompt",
            "Please summarise the attached meeting notes in three bullet points.",
            false,
            false,
        ),
        ("an empty prompt", "", false, false),
        (
            "a window of output",
            "Here are the three points: budgets, hiring and the",
            true,
            false,
        ),
        ("the final window", " roadmap for next quarter.", true, true),
    ]
}
