//! The gateway's policy slots, knowing nothing of HTTP: which policy versions decide, how
//! traffic is split between them, and what happens when one misbehaves.
//!
//! - [`router`]: the router slot. Its variants (each a router policy version with a
//!   weight), its shadow, progressive rollouts, rollback after repeated faults, the view of
//!   the pool a policy reads, and the **route** it produces: a server, or a prefill/decode
//!   pair in a disaggregated fleet;
//! - [`routing`]: what the router slot decides on, computed once per request: the routing key
//!   (the session, else the prompt's opening) and the prefix hashes;
//! - [`single`]: the single-policy slots (admission, safety filter): one version, its history,
//!   its fault streak;
//! - [`sources`]: a policy's component from its configured source, the policy engine's
//!   settings from the configuration's;
//! - [`queue`]: the fair admission queue's order (priority by tier, aging, virtual token
//!   counters per tenant).
//!
//! What a decision means for a request (refusing it, queueing it, sending it, filtering its
//! reply) is the gateway's; this crate decides and counts, and is tested without a socket.

#![deny(missing_docs)]

pub mod queue;
pub mod router;
pub mod routing;
pub mod single;
pub mod sources;
