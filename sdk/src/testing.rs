//! Builders for native unit tests of policy logic.
//!
//! The decision helpers in [`decide`](crate::decide) and a policy's own pure functions take
//! plain values: [`Server`] records, and the few request fields a decision reads (the request
//! itself is a resource that exists only inside the gateway, so the `Guest` shim reads those
//! fields and hands them down). These builders make servers short to write:
//!
//! ```
//! use ringmaster_policy_sdk::testing::{server, ServerBuilder};
//!
//! let servers = [server("gpu-0").in_flight(3), server("gpu-1").unhealthy()];
//! assert!(servers[0].healthy && !servers[1].healthy);
//! ```

use crate::types::{Role, Server};

/// A healthy server of weight 1 that takes whole requests, with no load and an empty KV cache
/// of 1024 blocks.
pub fn server(id: &str) -> Server {
    Server {
        id: id.to_owned(),
        role: Role::Both,
        healthy: true,
        weight: 1,
        in_flight: 0,
        waiting: 0,
        kv_blocks_used: 0,
        kv_blocks_total: 1024,
    }
}

/// Chainable setters for a [`Server`].
pub trait ServerBuilder: Sized {
    /// Sets the in-flight requests.
    fn in_flight(self, n: u32) -> Self;
    /// Sets the requests waiting inside the server.
    fn waiting(self, n: u32) -> Self;
    /// Sets the ring weight.
    fn weight(self, w: u32) -> Self;
    /// Marks the server as not serving.
    fn unhealthy(self) -> Self;
    /// Sets the KV-cache blocks in use and in all.
    fn kv_blocks(self, used: u32, total: u32) -> Self;
    /// Sets what it does in a disaggregated fleet.
    fn role(self, role: Role) -> Self;
}

impl ServerBuilder for Server {
    fn in_flight(mut self, n: u32) -> Self {
        self.in_flight = n;
        self
    }
    fn waiting(mut self, n: u32) -> Self {
        self.waiting = n;
        self
    }
    fn weight(mut self, w: u32) -> Self {
        self.weight = w;
        self
    }
    fn unhealthy(mut self) -> Self {
        self.healthy = false;
        self
    }
    fn kv_blocks(mut self, used: u32, total: u32) -> Self {
        self.kv_blocks_used = used;
        self.kv_blocks_total = total;
        self
    }
    fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }
}
