//! What routing knows about one request, computed once by the gateway and handed down: the
//! ring key and the prefix hashes. The pool reads it and never recomputes it.

/// Where a routing key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// One of the configured session headers (`[routing] session_headers`).
    SessionHeader,
    /// The body's session key: Anthropic's `metadata.user_id`, OpenAI's `prompt_cache_key`
    /// or `user`.
    BodySession,
    /// The system prompt and first user turn.
    Prefix,
}

impl KeySource {
    /// A stable name for logs and the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionHeader => "session-header",
            Self::BodySession => "body-session",
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
}
