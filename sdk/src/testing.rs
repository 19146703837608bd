//! Builders for native unit tests of policy logic.
//!
//! The decision helpers in [`decide`](crate::decide) and a policy's own pure functions take
//! plain [`Server`] and [`Request`] values; these builders make them short to write:
//!
//! ```
//! use ringmaster_policy_sdk::testing::{request, server, RequestBuilder, ServerBuilder};
//!
//! let servers = [server("gpu-0").in_flight(3), server("gpu-1").unhealthy()];
//! let req = request().tier("pro").prefix_len(4);
//! assert!(servers[0].healthy && !servers[1].healthy);
//! assert_eq!(req.prefix_hashes.len(), 4);
//! ```

use crate::types::{Request, Server};

/// A healthy server of weight 1 with no load and an empty KV cache of 1024 blocks.
pub fn server(id: &str) -> Server {
    Server {
        id: id.to_owned(),
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
}

/// A request `req_test` for model `test-model` from tier `anonymous`, routing key 0, no
/// prefix hashes, 100 prompt tokens, 64 max tokens, priority 1, not streamed, no headers.
pub fn request() -> Request {
    Request {
        id: "req_test".to_owned(),
        model: "test-model".to_owned(),
        tier: "anonymous".to_owned(),
        session_id: None,
        routing_key: 0,
        prefix_hashes: Vec::new(),
        prompt_tokens: 100,
        max_tokens: 64,
        priority: 1,
        stream: false,
        headers: Vec::new(),
    }
}

/// Chainable setters for a [`Request`].
pub trait RequestBuilder: Sized {
    /// Sets the caller's tier.
    fn tier(self, tier: &str) -> Self;
    /// Sets the routing key.
    fn routing_key(self, key: u64) -> Self;
    /// Gives the request `n` (distinct, made-up) prefix hashes.
    fn prefix_len(self, n: usize) -> Self;
    /// Sets the session id.
    fn session(self, id: &str) -> Self;
}

impl RequestBuilder for Request {
    fn tier(mut self, tier: &str) -> Self {
        self.tier = tier.to_owned();
        self
    }
    fn routing_key(mut self, key: u64) -> Self {
        self.routing_key = key;
        self
    }
    fn prefix_len(mut self, n: usize) -> Self {
        self.prefix_hashes = (0..n as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5)
            .collect();
        self
    }
    fn session(mut self, id: &str) -> Self {
        self.session_id = Some(id.to_owned());
        self
    }
}
