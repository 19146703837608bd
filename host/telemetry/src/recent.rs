//! The last errors the gateway answered, for the status page: a small ring kept in memory,
//! written only when a request fails (never on the success path) and read by the admin API.
//! It holds what the client was told (status, type, message) and where (route, request id),
//! never a prompt or a key.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many errors the ring keeps.
pub const KEPT: usize = 50;

/// One error answer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RecentError {
    /// When, Unix milliseconds.
    pub at_ms: u64,
    /// `req_…`.
    pub request_id: String,
    /// The route's metric label (`messages`, `openai-chat`, `admin`, …).
    pub route: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// The error's type as the Messages API names it.
    pub kind: &'static str,
    /// The message the client got.
    pub message: String,
}

/// The ring.
#[derive(Debug, Default)]
pub struct RecentErrors {
    ring: Mutex<VecDeque<RecentError>>,
}

impl RecentErrors {
    /// Keeps `error`, dropping the oldest past [`KEPT`].
    pub fn push(&self, error: RecentError) {
        let mut ring = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ring.len() == KEPT {
            ring.pop_front();
        }
        ring.push_back(error);
    }

    /// The kept errors, newest first.
    pub fn newest_first(&self) -> Vec<RecentError> {
        let ring = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ring.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_fifty_newest_first() {
        let ring = RecentErrors::default();
        for i in 0..60u16 {
            ring.push(RecentError {
                at_ms: u64::from(i),
                request_id: format!("req_{i}"),
                route: "messages",
                status: 400 + i,
                kind: "invalid_request_error",
                message: String::new(),
            });
        }
        let kept = ring.newest_first();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].request_id, "req_59");
        assert_eq!(kept[KEPT - 1].request_id, "req_10");
    }
}
