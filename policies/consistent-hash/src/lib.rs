//! The default router: the host's consistent-hash ring with bounded loads.
//!
//! Every request goes to the first server clockwise from its routing key whose in-flight load
//! is under its bounded-load cap (`ring.lookup-bounded`), so every turn of a conversation
//! lands where its KV cache already is until that server is overloaded. When the ring has no
//! healthy server the request is rejected. There is no configuration.

use ringmaster_policy_sdk::host::ring;
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::Request;

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The decision for the ring's answer.
pub fn decide(owner: Option<String>) -> Decision {
    match owner {
        Some(server) => Decision::Route(server),
        None => Decision::Reject(NO_SERVER.to_owned()),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct ConsistentHash;

impl Guest for ConsistentHash {
    fn route(req: &Request) -> Decision {
        decide(ring::lookup_bounded(req.routing_key()))
    }
}

ringmaster_policy_sdk::router::export!(ConsistentHash);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_to_the_owner() {
        assert_eq!(
            decide(Some("gpu-1".into())),
            Decision::Route("gpu-1".into())
        );
    }

    #[test]
    fn rejects_without_a_server() {
        assert_eq!(
            decide(None),
            Decision::Reject("no healthy GPU server".into())
        );
    }
}
