//! What routing knows about one request, computed once by the gateway and handed down: the
//! ring key, the prefix hashes and the chat. The pool reads it and never recomputes it.

use std::sync::Arc;

use crate::kv_view::ChatPrompt;

/// Where a routing key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The `x-session-id` header.
    SessionHeader,
    /// `metadata.user_id`.
    MetadataUserId,
    /// The system prompt and first user turn.
    Prefix,
}

impl KeySource {
    /// A stable name for logs and the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionHeader => "x-session-id",
            Self::MetadataUserId => "metadata.user_id",
            Self::Prefix => "prefix",
        }
    }
}

/// What routing knows about a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingInput {
    /// The ring key.
    pub key: u64,
    /// Where the key came from.
    pub source: KeySource,
    /// Chained hashes of the prompt's full chunks (at most `max_hashes` of them).
    pub prefix_hashes: Vec<u64>,
    /// The prompt's full chunks, counted past the cap on hashes.
    pub prompt_chunks: usize,
    /// The chat, for matching it against the caches servers report (see [`crate::kv_view`]).
    pub chat: Arc<ChatPrompt>,
}
