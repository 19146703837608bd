//! The pool as a router policy's imports see it during one call ([`PoolView`]), and how
//! much of a request's prompt each server holds ([`prefix_matches`]): from the server's own
//! report of its cache, or the gateway's routing history.

use ringmaster_policy_engine::{PolicyRole, RouterHost, ServerView};
use ringmaster_pool::kv_view::{ChatPrompt, PromptBlocks, in_prefix_units};
use ringmaster_pool::prefix_index::PrefixIndex;
use ringmaster_pool::{Pool, PoolSnapshot};

use ringmaster_pool::RoutingInput;

/// The pool as a router policy's imports see it during one call.
pub struct PoolView<'a> {
    snapshot: &'a PoolSnapshot,
    prefixes: &'a PrefixIndex,
    input: &'a RoutingInput,
    chat: ChatPrompt<'a>,
    /// The request's prefix matches, computed once (on the first ask) for every variant and
    /// every call that asks (the shadow's included).
    matches: std::sync::OnceLock<Vec<(String, u32)>>,
}

impl std::fmt::Debug for PoolView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolView").finish_non_exhaustive()
    }
}

impl<'a> PoolView<'a> {
    /// The view of `snapshot` for the request `input` describes.
    pub fn new(
        snapshot: &'a PoolSnapshot,
        pool: &'a Pool,
        input: &'a RoutingInput,
        chat: ChatPrompt<'a>,
    ) -> Self {
        Self {
            snapshot,
            prefixes: pool.prefixes(),
            input,
            chat,
            matches: std::sync::OnceLock::new(),
        }
    }

    fn view(server: &ringmaster_pool::Server) -> ServerView {
        let load = server.engine().load();
        ServerView {
            id: server.id().to_owned(),
            role: match server.role().role {
                ringmaster_config::Role::Both => PolicyRole::Both,
                ringmaster_config::Role::Prefill => PolicyRole::Prefill,
                ringmaster_config::Role::Decode => PolicyRole::Decode,
            },
            healthy: !server.is_draining(),
            weight: server.weight(),
            in_flight: u32::try_from(server.fleet_in_flight()).unwrap_or(u32::MAX),
            waiting: load.waiting,
            kv_blocks_used: load.kv_blocks_used,
            kv_blocks_total: load.kv_blocks_total,
        }
    }
}

impl RouterHost for PoolView<'_> {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        let i = self.snapshot.ring.lookup(key)?;
        Some(self.snapshot.servers[i].id().to_owned())
    }

    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        self.snapshot
            .ring
            .candidates(key, n as usize)
            .into_iter()
            .map(|i| self.snapshot.servers[i].id().to_owned())
            .collect()
    }

    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        let loads: Vec<u64> = self
            .snapshot
            .servers
            .iter()
            .map(|s| s.fleet_in_flight())
            .collect();
        let choice = self.snapshot.ring.lookup_bounded(key, &loads).ok()??;
        Some(self.snapshot.servers[choice.member].id().to_owned())
    }

    fn servers(&self) -> Vec<ServerView> {
        self.snapshot
            .servers
            .iter()
            .map(|s| Self::view(s))
            .collect()
    }

    fn server(&self, id: &str) -> Option<ServerView> {
        self.snapshot.server(id).map(|s| Self::view(s))
    }

    // Checked on every answer: skip the engine load report that a full view reads.
    fn routable(&self, id: &str) -> bool {
        self.snapshot.server(id).is_some_and(|s| !s.is_draining())
    }

    fn prefix_matches(&self) -> Vec<(String, u32)> {
        self.matches
            .get_or_init(|| {
                prefix_matches(self.snapshot, self.prefixes, (self.input, self.chat))
                    .into_iter()
                    .filter(|m| m.hashes > 0)
                    .map(|m| (m.server, m.hashes))
                    .collect()
            })
            .clone()
    }

    fn adapters(&self) -> Vec<(String, Vec<String>)> {
        self.snapshot
            .servers
            .iter()
            .filter_map(|s| {
                let held: Vec<String> = s.adapters().into_keys().collect();
                (!held.is_empty()).then(|| (s.id().to_owned(), held))
            })
            .collect()
    }

    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        backlogs(&self.snapshot.servers)
    }

    fn prefill_servers(&self) -> Vec<ServerView> {
        self.snapshot
            .prefill
            .iter()
            .map(|s| Self::view(s))
            .collect()
    }

    fn prefill_prefix_matches(&self) -> Vec<(String, u32)> {
        if self.snapshot.prefill.is_empty() {
            return Vec::new();
        }
        prefix_matches_of(
            &self.snapshot.prefill,
            self.prefixes,
            (self.input, self.chat),
        )
        .into_iter()
        .filter(|m| m.hashes > 0)
        .map(|m| (m.server, m.hashes))
        .collect()
    }

    fn prefill_servers_backlog(&self) -> Vec<(String, u64)> {
        backlogs(&self.snapshot.prefill)
    }

    fn prefill_routable(&self, id: &str) -> bool {
        self.snapshot
            .prefill
            .iter()
            .any(|s| s.id() == id && s.is_routable())
    }
}

/// Each of `servers`' prefill backlog (those with none left out).
fn backlogs(servers: &[std::sync::Arc<ringmaster_pool::Server>]) -> Vec<(String, u64)> {
    servers
        .iter()
        .filter_map(|s| {
            let tokens = s.fleet_prefill_backlog();
            (tokens > 0).then(|| (s.id().to_owned(), tokens))
        })
        .collect()
}

impl PoolView<'_> {
    /// The prompt tokens of the request that `server` is expected to compute: all of them,
    /// less the share of its prefix hashes the server was found to hold when some call
    /// asked for the prefix matches (the ring alone never does; then no credit is given).
    pub(crate) fn uncached_tokens(&self, server: &str, prompt_tokens: u32) -> u64 {
        let held = self
            .matches
            .get()
            .map_or(0, |matches| matched_hashes(matches, server));
        let chunks = self.input.prompt_chunks.max(self.input.prefix_hashes.len());
        if chunks == 0 || held == 0 {
            return u64::from(prompt_tokens);
        }
        let held = (held as usize).min(chunks);
        u64::from(prompt_tokens) * (chunks - held) as u64 / chunks as u64
    }
}

impl PoolView<'_> {
    /// The prompt tokens the best-placed server holds, and those `chosen` holds: hashes
    /// held over the prompt's chunks, of its `prompt_tokens` (the matches are found now if
    /// no policy asked for them).
    pub(crate) fn reach(&self, chosen: &str, prompt_tokens: u32) -> (u64, u64) {
        let matches = self.matches.get_or_init(|| {
            prefix_matches(self.snapshot, self.prefixes, (self.input, self.chat))
                .into_iter()
                .filter(|m| m.hashes > 0)
                .map(|m| (m.server, m.hashes))
                .collect()
        });
        let chunks = self.input.prompt_chunks.max(self.input.prefix_hashes.len());
        if chunks == 0 {
            return (0, 0);
        }
        let tokens = |held: u32| {
            u64::from(prompt_tokens) * (held as usize).min(chunks) as u64 / chunks as u64
        };
        let best = matches.iter().map(|(_, n)| *n).max().unwrap_or(0);
        (tokens(best), tokens(matched_hashes(matches, chosen)))
    }

    /// The leading prefix hashes `server` was found to hold, when a call asked.
    pub(crate) fn matched(&self, server: &str) -> Option<u32> {
        self.matches
            .get()
            .map(|matches| matched_hashes(matches, server))
    }
}

fn matched_hashes(matches: &[(String, u32)], server: &str) -> u32 {
    matches
        .iter()
        .find(|(id, _)| id == server)
        .map_or(0, |(_, n)| *n)
}

/// Where a server's prefix match came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchSource {
    /// The server's own report of its cache (see [`ringmaster_pool::kv_view`]), or, when more, the
    /// prompts of the requests in flight there (held once prefilled, before the report
    /// shows them).
    Reported,
    /// The gateway's routing history ([`PrefixIndex`]): the server reports nothing now.
    Estimated,
}

impl MatchSource {
    /// A stable name for the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Estimated => "estimated",
        }
    }
}

/// How much of one request's prompt one server holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The server.
    pub server: String,
    /// Leading prefix hashes held (the unit of `cluster.prefix-matches`).
    pub hashes: u32,
    /// Leading prompt tokens held, when the server reports its cache.
    pub tokens: Option<usize>,
    /// Where the answer came from.
    pub source: MatchSource,
}

/// For every server in `snapshot` (its ring: the prefill servers are asked apart, see
/// [`prefix_matches_of`]), how much of the prompt of `input` it holds: from the server's own
/// report of its cache when it has one, else from the routing history.
pub fn prefix_matches(
    snapshot: &PoolSnapshot,
    prefixes: &PrefixIndex,
    prompt: (&RoutingInput, ChatPrompt<'_>),
) -> Vec<PrefixMatch> {
    prefix_matches_of(&snapshot.servers, prefixes, prompt)
}

/// [`prefix_matches`] for `servers`.
pub fn prefix_matches_of(
    servers: &[std::sync::Arc<ringmaster_pool::Server>],
    prefixes: &PrefixIndex,
    (input, chat): (&RoutingInput, ChatPrompt<'_>),
) -> Vec<PrefixMatch> {
    let mut estimated: Option<Vec<(usize, u32)>> = None;
    let mut blocks = PromptBlocks::new(chat);
    let hashes = input.prefix_hashes.len();
    servers
        .iter()
        .map(|s| {
            let reported = s.cache_scheme().and_then(|scheme| {
                let (prompt_blocks, prompt_tokens) = blocks.keyed(&scheme);
                let held = s.held_blocks(prompt_blocks)?;
                Some((held, prompt_tokens))
            });
            match reported {
                Some((held, prompt_tokens)) => PrefixMatch {
                    server: s.id().to_owned(),
                    hashes: in_prefix_units(held, prompt_tokens, input.prompt_chunks, hashes)
                        .max(s.pending_prefix(&input.prefix_hashes)),
                    tokens: Some(
                        (held * ringmaster_pool::engine_index::BLOCK_SIZE).min(prompt_tokens),
                    ),
                    source: MatchSource::Reported,
                },
                None => {
                    let by_slot =
                        estimated.get_or_insert_with(|| prefixes.matches(&input.prefix_hashes));
                    PrefixMatch {
                        server: s.id().to_owned(),
                        hashes: by_slot
                            .iter()
                            .find(|(slot, _)| *slot == s.slot())
                            .map_or(0, |(_, n)| *n),
                        tokens: None,
                        source: MatchSource::Estimated,
                    }
                }
            }
        })
        .collect()
}
