//! {{name}}: a Ringmaster router. It sends each request to the healthy server where its
//! prefill would start soonest: the prompt tokens queued there plus the part of this prompt
//! its cache does not hold. Edit `choose`; `cargo test` runs its tests natively, and
//! `ringmaster policy build` makes the component.

use ringmaster_policy_sdk::decide::{backlog, healthy, matched, ring_rank, uncached_tokens};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The server for a request of `prompt_tokens` tokens and `prefix_hashes` prefix hashes,
/// given what the host said; `None` when no server is healthy.
pub fn choose<'a>(
    servers: &'a [Server],
    matches: &[(String, u32)],
    backlogs: &[(String, u64)],
    prompt_tokens: u32,
    prefix_hashes: usize,
    ring_order: &[String],
) -> Option<&'a Server> {
    healthy(servers).min_by_key(|s| {
        let cost = backlog(backlogs, &s.id)
            + uncached_tokens(prompt_tokens, matched(matches, &s.id), prefix_hashes);
        (cost, s.in_flight, ring_rank(ring_order, &s.id))
    })
}

/// The component's export.
#[derive(Debug)]
pub struct Policy;

impl Guest for Policy {
    fn route(req: &Request) -> Decision {
        let servers = cluster::servers();
        let matches = host::prefix_matches_for(req.prefix_hash_count());
        let backlogs = cluster::prefill_backlog();
        let order = ring::candidates(req.routing_key(), servers.len() as u32);
        let prefix_hashes = req.prefix_hash_count() as usize;
        match choose(&servers, &matches, &backlogs, req.prompt_tokens(), prefix_hashes, &order) {
            Some(server) => Decision::Route(server.id.clone()),
            None => Decision::Reject("no healthy GPU server".to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    #[test]
    fn the_server_holding_the_prompt_wins_until_its_queue_is_long() {
        let servers = [server("a"), server("b")];
        let matches = [("a".to_owned(), 8)];
        let order = ["b".to_owned(), "a".to_owned()];
        let pick = choose(&servers, &matches, &[], 1000, 10, &order).unwrap();
        assert_eq!(pick.id, "a");
        let queued = [("a".to_owned(), 5_000)];
        let pick = choose(&servers, &matches, &queued, 1000, 10, &order).unwrap();
        assert_eq!(pick.id, "b");
    }

    #[test]
    fn unhealthy_servers_are_never_chosen() {
        let servers = [server("a").unhealthy()];
        assert!(choose(&servers, &[], &[], 10, 0, &[]).is_none());
    }
}
