//! A round-robin router: the healthy servers in turn.
//!
//! Each call takes the next healthy server in id order from a counter kept in the instance.
//! The counter lives as long as the instance does: if the gateway creates a fresh instance
//! for a call, that call starts again from the first server, so the rotation is only as even
//! as the instance's lifetime is long. It ignores cache locality entirely; it is a baseline for
//! comparisons, not a good router for LLM traffic. With no healthy server the request is
//! rejected. There is no configuration.

use std::sync::atomic::{AtomicU64, Ordering};

use ringmaster_policy_sdk::decide::round_robin;
use ringmaster_policy_sdk::host::cluster;
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// Calls so far in this instance.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// The decision for the `counter`-th call.
pub fn decide(servers: &[Server], counter: u64) -> Decision {
    match round_robin(servers, counter) {
        Some(server) => Decision::Route(server.id.clone()),
        None => Decision::Reject(NO_SERVER.to_owned()),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct RoundRobin;

impl Guest for RoundRobin {
    fn route(_req: &Request) -> Decision {
        let counter = CALLS.fetch_add(1, Ordering::Relaxed);
        decide(&cluster::servers(), counter)
    }
}

ringmaster_policy_sdk::router::export!(RoundRobin);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    #[test]
    fn rotates_over_healthy_servers_in_id_order() {
        let servers = [
            server("b"),
            server("x").unhealthy(),
            server("a"),
            server("c"),
        ];
        let picks: Vec<_> = (0..4).map(|n| decide(&servers, n)).collect();
        let route = |id: &str| Decision::Route(id.to_owned());
        assert_eq!(picks, [route("a"), route("b"), route("c"), route("a")]);
    }

    #[test]
    fn rejects_without_a_healthy_server() {
        let servers = [server("a").unhealthy()];
        assert_eq!(decide(&servers, 5), Decision::Reject(NO_SERVER.into()));
    }
}
