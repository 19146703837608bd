//! The fields and headers only the gateway may set: the engines' orchestration of a split
//! request. A server that reads them acts on them (vLLM's worker fetches KV blocks from the
//! address `kv_transfer_params` names; SGLang's decode server joins the `bootstrap_room` it is
//! told), so they never come from a client: every door takes them out of what it relays, and
//! `[api] unknown_fields = "refuse"` refuses a body that carries one.
//!
//! This module only names them; the doors (`ringmaster-api`) strip them, the pool's legs
//! (`ringmaster-pool`) set them, and `ringmaster worker` checks who set them.

/// Top-level body fields the gateway owns on a split request's legs.
///
/// - vLLM's `NixlConnector` (and `ringmaster worker`): `kv_transfer_params`;
/// - SGLang's disaggregation: `bootstrap_host`, `bootstrap_port`, `bootstrap_room`, and the
///   legs' data-parallel ranks `routed_dp_rank` and `disagg_prefill_dp_rank`.
pub const RESERVED_FIELDS: [&str; 6] = [
    "kv_transfer_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "disagg_prefill_dp_rank",
];

/// The prefix of `ringmaster worker`'s own body fields (`ringmaster_priority`): a worker takes
/// them from its gateway alone.
pub const RESERVED_PREFIX: &str = "ringmaster_";

/// Whether a top-level body field named `name` is the gateway's alone.
pub fn is_reserved_field(name: &str) -> bool {
    RESERVED_FIELDS.contains(&name) || name.starts_with(RESERVED_PREFIX)
}

/// The header that names both legs of a vLLM split request (the prefill's blocks are found
/// by it).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The header that pins a vLLM leg to one data-parallel rank.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// The header that carries a leg's credential to a `ringmaster worker`: an HMAC-SHA256, keyed
/// with the secret the workers share with their gateways, over the leg's id and its transfer
/// parameters (see `ringmaster_worker::transfer`).
pub const LEG_CREDENTIAL_HEADER: &str = "x-ringmaster-leg-credential";

/// Headers the gateway sets on its legs; none is ever passed on from a client.
pub const RESERVED_HEADERS: [&str; 3] = [REQUEST_ID_HEADER, DP_RANK_HEADER, LEG_CREDENTIAL_HEADER];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orchestration_fields_and_the_workers_own_are_reserved() {
        for name in [
            "kv_transfer_params",
            "bootstrap_room",
            "ringmaster_priority",
            "ringmaster_anything",
        ] {
            assert!(is_reserved_field(name), "{name}");
        }
        for name in ["model", "messages", "kv", "bootstrap", "ringmaster"] {
            assert!(!is_reserved_field(name), "{name}");
        }
    }
}
