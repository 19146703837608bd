//! The host side of every `ringmaster:policy` interface, for every contract version, generated
//! by `wasmtime::component::bindgen!` from the WIT files (`wit/policy.wit` for 0.3.0,
//! `wit/deps/policy-0.2.0/` and `wit/deps/policy-0.1.0/` for the older ones) and implemented
//! here on [`StoreData`].
//!
//! This module owns the mapping from each generated trait method to the host's answer and
//! nothing else: what a call may see comes from [`crate::host`]'s call context, state from
//! [`crate::state`]. The versions share their answers; they differ in the generated types
//! (0.2.0's request is a resource whose getters read the request of the call) and in what
//! 0.3.0's `cluster` adds (servers' roles, the prefill servers).
//!
//! The request resource carries no data of its own: the host passes every call a borrow of
//! one placeholder handle, and each getter reads the request of the call running on this
//! thread. A borrow cannot outlive the call it was passed to (the component model checks it),
//! so a guest cannot read another call's request through it.

use wasmtime::component::{HasSelf, Linker, Resource};

use crate::host::{self, StoreData};
use crate::types::{Level, PolicyRequest, PolicyRole, ServerView};

/// Bindings for `ringmaster:policy@0.1.0`. The `router` world imports every interface the
/// other worlds do, so its bindings cover all of them.
pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        world: "router",
        path: "../../wit/deps/policy-0.1.0",
    });
}

/// Bindings for `ringmaster:policy@0.2.0`; `learning-router` imports every interface.
pub(crate) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "learning-router",
        path: "../../wit/deps/policy-0.2.0",
        with: {
            "ringmaster:policy/types.request": super::RequestRep,
        },
    });
}

/// Bindings for `ringmaster:policy@0.3.0`; `learning-router` imports every interface.
pub(crate) mod v0_3 {
    wasmtime::component::bindgen!({
        world: "learning-router",
        path: "../../wit",
        with: {
            "ringmaster:policy/types.request": super::RequestRep,
        },
    });
}

use v0_1::ringmaster::policy as p1;
use v0_2::ringmaster::policy as p2;
use v0_3::ringmaster::policy0_3_0 as p3;

/// The host's type for 0.2.0's `request` resource: a placeholder, see the module docs.
#[derive(Debug)]
pub struct RequestRep;

/// The borrow every 0.2.0 and 0.3.0 call passes its guest as the request.
pub(crate) fn request_borrow() -> Resource<RequestRep> {
    Resource::new_borrow(0)
}

/// Links both versions' interfaces (and WASI 0.2, with nothing granted). Which of them a
/// given world may use is checked when a policy is loaded.
pub(crate) fn define_imports(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    v0_1::Router::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |s| s)?;
    v0_2::LearningRouter::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |s| s)?;
    v0_3::LearningRouter::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |s| s)?;
    Ok(())
}

fn request<R: Default>(f: impl FnOnce(&PolicyRequest) -> R) -> R {
    host::current_request(f).unwrap_or_default()
}

// ---- 0.2.0 and 0.3.0: the request resource and `state` ----

/// Implements the request resource's getters and `state` for one version's generated module
/// (0.2.0's and 0.3.0's are the same functions over different generated types).
macro_rules! resource_imports {
    ($p:ident) => {
        impl $p::types::Host for StoreData {}

        impl $p::types::HostRequest for StoreData {
            fn id(&mut self, _: Resource<RequestRep>) -> String {
                request(|r| r.id.clone())
            }
            fn model(&mut self, _: Resource<RequestRep>) -> String {
                request(|r| r.model.clone())
            }
            fn tier(&mut self, _: Resource<RequestRep>) -> String {
                request(|r| r.tier.clone())
            }
            fn session_id(&mut self, _: Resource<RequestRep>) -> Option<String> {
                request(|r| r.session_id.clone())
            }
            fn routing_key(&mut self, _: Resource<RequestRep>) -> u64 {
                request(|r| r.routing_key)
            }
            fn prefix_hash_count(&mut self, _: Resource<RequestRep>) -> u32 {
                request(|r| u32::try_from(r.prefix_hashes.len()).unwrap_or(u32::MAX))
            }
            fn prefix_hashes(&mut self, _: Resource<RequestRep>, start: u32, max: u32) -> Vec<u64> {
                request(|r| {
                    let start = (start as usize).min(r.prefix_hashes.len());
                    let end = start
                        .saturating_add(max as usize)
                        .min(r.prefix_hashes.len());
                    r.prefix_hashes[start..end].to_vec()
                })
            }
            fn prompt_tokens(&mut self, _: Resource<RequestRep>) -> u32 {
                request(|r| r.prompt_tokens)
            }
            fn max_tokens(&mut self, _: Resource<RequestRep>) -> u32 {
                request(|r| r.max_tokens)
            }
            fn priority(&mut self, _: Resource<RequestRep>) -> u8 {
                request(|r| r.priority)
            }
            fn stream(&mut self, _: Resource<RequestRep>) -> bool {
                request(|r| r.stream)
            }
            fn header(&mut self, _: Resource<RequestRep>, name: String) -> Option<String> {
                request(|r| {
                    r.headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(&name))
                        .map(|(_, v)| v.clone())
                })
            }
            fn headers(&mut self, _: Resource<RequestRep>) -> Vec<(String, String)> {
                request(|r| r.headers.clone())
            }
            fn door(&mut self, _: Resource<RequestRep>) -> String {
                request(|r| r.door.to_owned())
            }
            fn drop(&mut self, _: Resource<RequestRep>) -> wasmtime::Result<()> {
                // Guests only ever hold borrows, which are not dropped through the host.
                Ok(())
            }
        }

        impl $p::state::Host for StoreData {
            fn get(&mut self, key: String) -> Option<Vec<u8>> {
                self.policy.state().get(&key)
            }
            fn set(&mut self, key: String, value: Vec<u8>) -> bool {
                self.policy.state().set(key, value)
            }
            fn remove(&mut self, key: String) -> bool {
                self.policy.state().remove(&key)
            }
            fn add(&mut self, key: String, delta: i64) -> i64 {
                self.policy.state().add(&key, delta)
            }
            fn usage(&mut self) -> $p::state::Fill {
                let usage = self.policy.state().usage();
                $p::state::Fill {
                    entries: usage.entries,
                    bytes: usage.bytes,
                    max_entries: usage.max_entries,
                    max_bytes: usage.max_bytes,
                }
            }
        }
    };
}

resource_imports!(p2);
resource_imports!(p3);

// ---- 0.1.0 ----

impl p1::types::Host for StoreData {}

// ---- what both versions share ----

/// Implements the interfaces whose functions are the same in every version (`ring`, `log`,
/// `metrics`, `config`) for one version's generated module: only the generated types differ.
macro_rules! shared_imports {
    ($p:ident) => {
        impl $p::ring::Host for StoreData {
            fn lookup(&mut self, key: u64) -> Option<String> {
                host::ask(|h| h.ring_lookup(key))
            }
            fn candidates(&mut self, key: u64, n: u32) -> Vec<String> {
                host::ask(|h| h.ring_candidates(key, n))
            }
            fn lookup_bounded(&mut self, key: u64) -> Option<String> {
                host::ask(|h| h.ring_lookup_bounded(key))
            }
        }

        impl $p::log::Host for StoreData {
            fn write(&mut self, level: $p::log::Level, message: String) {
                let level = match level {
                    $p::log::Level::Debug => Level::Debug,
                    $p::log::Level::Info => Level::Info,
                    $p::log::Level::Warn => Level::Warn,
                    $p::log::Level::Error => Level::Error,
                };
                self.policy.write_log(level, &message);
            }
        }

        impl $p::metrics::Host for StoreData {
            fn counter_add(&mut self, name: String, value: u64) {
                self.policy.counter_add(&name, value);
            }
        }

        impl $p::config::Host for StoreData {
            fn get(&mut self, key: String) -> Option<String> {
                self.policy.config.get(&key).cloned()
            }
            fn entries(&mut self) -> Vec<(String, String)> {
                self.policy.config_entries()
            }
        }
    };
}

/// 0.1.0's and 0.2.0's `cluster`: the servers a router may route to, as they were before
/// roles (the prefill servers are not there). 0.2.0's also has `adapters`.
macro_rules! cluster_before_roles {
    ($p:ident { $($cluster_only:tt)* }) => {
        impl $p::cluster::Host for StoreData {
            fn servers(&mut self) -> Vec<$p::types::Server> {
                host::ask(|h| h.servers())
                    .into_iter()
                    .map(Into::into)
                    .collect()
            }
            fn get(&mut self, id: String) -> Option<$p::types::Server> {
                host::ask(|h| h.server(&id)).map(Into::into)
            }
            fn prefix_matches(&mut self) -> Vec<(String, u32)> {
                StoreData::prefix_matches(self)
            }
            fn prefill_backlog(&mut self) -> Vec<(String, u64)> {
                host::ask(|h| h.prefill_backlog())
            }
            $($cluster_only)*
        }

        impl From<ServerView> for $p::types::Server {
            fn from(s: ServerView) -> Self {
                Self {
                    id: s.id,
                    healthy: s.healthy,
                    weight: s.weight,
                    in_flight: s.in_flight,
                    waiting: s.waiting,
                    kv_blocks_used: s.kv_blocks_used,
                    kv_blocks_total: s.kv_blocks_total,
                }
            }
        }
    };
}

shared_imports!(p1);
shared_imports!(p2);
shared_imports!(p3);
cluster_before_roles!(p1 {});
cluster_before_roles!(p2 {
    fn adapters(&mut self) -> Vec<(String, Vec<String>)> {
        host::ask(|h| h.adapters())
    }
});

// ---- 0.3.0's `cluster`: roles and the prefill servers ----

impl p3::cluster::Host for StoreData {
    fn servers(&mut self) -> Vec<p3::types::Server> {
        host::ask(|h| h.servers())
            .into_iter()
            .map(Into::into)
            .collect()
    }
    fn prefill_servers(&mut self) -> Vec<p3::types::Server> {
        host::ask(|h| h.prefill_servers())
            .into_iter()
            .map(Into::into)
            .collect()
    }
    fn get(&mut self, id: String) -> Option<p3::types::Server> {
        host::ask(|h| {
            h.server(&id)
                .or_else(|| h.prefill_servers().into_iter().find(|s| s.id == id))
        })
        .map(Into::into)
    }
    fn prefix_matches(&mut self) -> Vec<(String, u32)> {
        let mut matches = StoreData::prefix_matches(self);
        matches.extend(host::ask(|h| h.prefill_prefix_matches()));
        matches
    }
    fn prefill_backlog(&mut self) -> Vec<(String, u64)> {
        host::ask(|h| {
            let mut backlog = h.prefill_backlog();
            backlog.extend(h.prefill_servers_backlog());
            backlog
        })
    }
    fn adapters(&mut self) -> Vec<(String, Vec<String>)> {
        host::ask(|h| h.adapters())
    }
}

impl From<ServerView> for p3::types::Server {
    fn from(s: ServerView) -> Self {
        Self {
            id: s.id,
            role: match s.role {
                PolicyRole::Both => p3::types::Role::Both,
                PolicyRole::Prefill => p3::types::Role::Prefill,
                PolicyRole::Decode => p3::types::Role::Decode,
            },
            healthy: s.healthy,
            weight: s.weight,
            in_flight: s.in_flight,
            waiting: s.waiting,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_total: s.kv_blocks_total,
        }
    }
}
