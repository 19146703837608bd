//! A least-loaded router: the healthy server with the fewest requests.
//!
//! A server's load is its in-flight requests plus the requests waiting inside it. Among the
//! servers sharing the lowest load, the one that comes first clockwise on the host's ring from
//! the request's routing key wins (`ring.candidates`), so ties keep a conversation's turns
//! together instead of always favouring one server. With no healthy server the request is
//! rejected. There is no configuration.

use ringmaster_policy_sdk::decide::{all_least_loaded, first_in_order};
use ringmaster_policy_sdk::host::{cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// A server's load: in-flight plus waiting requests.
pub fn load(server: &Server) -> u64 {
    u64::from(server.in_flight) + u64::from(server.waiting)
}

/// The least loaded healthy server; ties are broken by `ring_order`, which is only asked for
/// when there is a tie (it costs a host call).
pub fn pick(servers: &[Server], ring_order: impl FnOnce(u32) -> Vec<String>) -> Option<String> {
    let tied = all_least_loaded(servers, load);
    match tied.as_slice() {
        [] => None,
        [only] => Some(only.id.clone()),
        _ => {
            let n = u32::try_from(servers.len()).unwrap_or(u32::MAX);
            first_in_order(&tied, &ring_order(n)).map(|s| s.id.clone())
        }
    }
}

/// The component's export.
#[derive(Debug)]
pub struct LeastLoaded;

impl Guest for LeastLoaded {
    fn route(req: &Request) -> Decision {
        let servers = cluster::servers();
        match pick(&servers, |n| ring::candidates(req.routing_key(), n)) {
            Some(id) => Decision::Route(id),
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(LeastLoaded);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    fn no_ring(_: u32) -> Vec<String> {
        panic!("the ring is only asked on a tie")
    }

    #[test]
    fn picks_the_lowest_in_flight_plus_waiting() {
        let servers = [
            server("a").in_flight(1).waiting(5),
            server("b").in_flight(3).waiting(2),
            server("c").in_flight(9),
        ];
        assert_eq!(pick(&servers, no_ring), Some("b".into()));
    }

    #[test]
    fn ties_go_to_the_first_in_ring_order() {
        let servers = [
            server("a").in_flight(2),
            server("b").in_flight(2),
            server("c").in_flight(2),
        ];
        let order = |n: u32| {
            assert_eq!(n, 3);
            vec!["c".to_owned(), "a".to_owned(), "b".to_owned()]
        };
        assert_eq!(pick(&servers, order), Some("c".into()));
        // Servers the ring does not know fall back to the lowest id.
        assert_eq!(pick(&servers, |_| Vec::new()), Some("a".into()));
    }

    #[test]
    fn unhealthy_servers_are_skipped() {
        let servers = [server("a").unhealthy(), server("b").in_flight(100)];
        assert_eq!(pick(&servers, no_ring), Some("b".into()));
        assert_eq!(pick(&[server("a").unhealthy()], no_ring), None);
        assert_eq!(pick(&[], no_ring), None);
    }

    #[test]
    fn loads_do_not_overflow() {
        let servers = [
            server("a").in_flight(u32::MAX).waiting(u32::MAX),
            server("b").in_flight(u32::MAX),
        ];
        assert_eq!(pick(&servers, no_ring), Some("b".into()));
    }
}
