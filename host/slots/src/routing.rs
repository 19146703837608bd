//! The routing key and the prefix hashes of a request, computed once, in native code.
//!
//! The key decides where the ring sends a request. It is the session id when the request has
//! one (a configured session header first, then the body's: `metadata.user_id`, OpenAI's
//! `prompt_cache_key` or `user`), so every turn of a session lands
//! on one server. Otherwise it is a hash over the prompt from its start through the end of the
//! first user turn: the system prompt plus the first user message. Every later turn of a
//! conversation repeats exactly those bytes, so it keeps its key; two conversations that share
//! only a system prompt get different keys. (A key over the first fixed-size chunk alone would
//! send every conversation with a shared system prompt to one server: see
//! `tests/traces/README.md`.)
//!
//! The prefix hashes are chained xxh3 hashes of fixed-size chunks of the canonical prompt bytes
//! (`h[i] = xxh3(chunk[i], seed = h[i-1])`), full chunks only, for cache-aware policies to
//! estimate how much of a prompt a server already holds. This module does no I/O.

use ringmaster_api::Request;
use ringmaster_ring::key_hash;
use ringmaster_wire::chat::Role;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use ringmaster_config::routing::{DEFAULT_SESSION_HEADERS, PrefixHashing};
pub use ringmaster_pool::{KeySource, RoutingInput};

/// Longest session id accepted from `x-session-id`.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// Seed of the first link of the prefix-hash chain.
const PREFIX_CHAIN_SEED: u64 = 0x5249_4e47_4d41_5354; // "RINGMAST"
/// Separates a role from its text in the canonical prompt.
const FIELD_SEPARATOR: u8 = 0x1f;
/// Ends one message in the canonical prompt.
const RECORD_SEPARATOR: u8 = 0x1e;

/// Computes the routing key and prefix hashes of `request`.
pub fn routing_input(
    request: &Request,
    session_header: Option<&str>,
    hashing: PrefixHashing,
) -> RoutingInput {
    let (prompt, first_turn_end) = canonical_prompt(request);
    let prefix_hashes = chained_chunk_hashes(&prompt, hashing);
    let prompt_chunks = prompt.len() / hashing.chunk_bytes.max(1);
    let session = session_header
        .filter(|s| !s.is_empty())
        .map(|s| (s, KeySource::SessionHeader))
        .or_else(|| {
            request
                .session
                .as_deref()
                .map(|s| (s, KeySource::BodySession))
        });
    let (key, source) = match session {
        Some((id, source)) => (session_key(id), source),
        None => (key_hash(&prompt[..first_turn_end]), KeySource::Prefix),
    };
    RoutingInput {
        key,
        source,
        prefix_hashes,
        prompt_chunks,
    }
}

fn session_key(id: &str) -> u64 {
    let mut bytes = Vec::with_capacity(id.len() + 8);
    bytes.extend_from_slice(b"session");
    bytes.push(FIELD_SEPARATOR);
    bytes.extend_from_slice(id.as_bytes());
    key_hash(&bytes)
}

/// The prompt as canonical bytes, and the offset just past the first user turn.
fn canonical_prompt(request: &Request) -> (Vec<u8>, usize) {
    let len = request.system.as_ref().map_or(0, String::len)
        + request
            .messages
            .iter()
            .map(|m| m.text.len() + 12)
            .sum::<usize>()
        + 8;
    let mut out = Vec::with_capacity(len);
    let record = |out: &mut Vec<u8>, role: &str, text: &str| {
        out.extend_from_slice(role.as_bytes());
        out.push(FIELD_SEPARATOR);
        out.extend_from_slice(text.as_bytes());
        out.push(RECORD_SEPARATOR);
    };
    if let Some(system) = &request.system {
        record(&mut out, "system", system);
    }
    let mut first_turn_end = None;
    for message in &request.messages {
        let role = match (message.role, &message.tool_call_id) {
            (_, Some(_)) => "tool",
            (Role::User, None) => "user",
            (Role::Assistant, None) => "assistant",
            (Role::System, None) => "system",
        };
        // An image is part of its turn's prefix: by a hash of its URL (data URLs are the
        // image itself, megabytes that would crowd out the text's chunks).
        for image in &message.images {
            let digest = format!("{:016x}", xxh3_64_with_seed(image.url.as_bytes(), 0));
            record(&mut out, "image", &digest);
        }
        record(&mut out, role, &message.text);
        // A tool call is part of its turn's prefix: the name and the arguments as sent.
        for call in &message.tool_calls {
            record(&mut out, "tool_call", &call.name);
            out.truncate(out.len() - 1);
            out.push(FIELD_SEPARATOR);
            out.extend_from_slice(call.arguments.as_bytes());
            out.push(RECORD_SEPARATOR);
        }
        if first_turn_end.is_none() && role == "user" {
            first_turn_end = Some(out.len());
        }
    }
    let end = first_turn_end.unwrap_or(out.len());
    (out, end)
}

fn chained_chunk_hashes(prompt: &[u8], hashing: PrefixHashing) -> Vec<u64> {
    let mut previous = PREFIX_CHAIN_SEED;
    prompt
        .chunks_exact(hashing.chunk_bytes.max(1))
        .take(hashing.max_hashes)
        .map(|chunk| {
            previous = xxh3_64_with_seed(chunk, previous);
            previous
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ringmaster_api::Door;
    use ringmaster_wire::chat::ChatMessage;

    fn request(system: Option<&str>, turns: &[(Role, &str)]) -> Request {
        let mut request = Request::new(Door::Messages, "m".into());
        request.system = system.map(str::to_owned);
        request.messages = turns
            .iter()
            .map(|(role, text)| ChatMessage {
                role: *role,
                text: (*text).to_owned(),
                ..ChatMessage::default()
            })
            .collect();
        request
    }

    #[test]
    fn later_turns_keep_the_first_turns_key() {
        let system = "You are a helpful assistant. ".repeat(40);
        let turn1 = request(Some(&system), &[(Role::User, "Plan a trip to Kyoto")]);
        let turn3 = request(
            Some(&system),
            &[
                (Role::User, "Plan a trip to Kyoto"),
                (Role::Assistant, "Day one: temples."),
                (Role::User, "And day two?"),
            ],
        );
        let a = routing_input(&turn1, None, PrefixHashing::default());
        let b = routing_input(&turn3, None, PrefixHashing::default());
        assert_eq!(a.source, KeySource::Prefix);
        assert_eq!(a.key, b.key);
        // The later turn's hashes extend the earlier turn's.
        assert!(b.prefix_hashes.len() >= a.prefix_hashes.len());
        assert_eq!(
            a.prefix_hashes[..],
            b.prefix_hashes[..a.prefix_hashes.len()]
        );
    }

    #[test]
    fn a_shared_system_prompt_does_not_share_a_key() {
        let system = "Shared system prompt. ".repeat(100);
        let a = routing_input(
            &request(Some(&system), &[(Role::User, "question A")]),
            None,
            PrefixHashing::default(),
        );
        let b = routing_input(
            &request(Some(&system), &[(Role::User, "question B")]),
            None,
            PrefixHashing::default(),
        );
        assert_ne!(a.key, b.key);
        // But their first chunks (inside the system prompt) are the same.
        assert_eq!(a.prefix_hashes[0], b.prefix_hashes[0]);
    }

    #[test]
    fn session_header_wins_over_metadata_and_prefix() {
        let mut req = request(None, &[(Role::User, "hello")]);
        req.session = Some("user-1".into());
        let by_meta = routing_input(&req, None, PrefixHashing::default());
        assert_eq!(by_meta.source, KeySource::BodySession);
        let by_header = routing_input(&req, Some("s-9"), PrefixHashing::default());
        assert_eq!(by_header.source, KeySource::SessionHeader);
        assert_ne!(by_meta.key, by_header.key);
        let mut other = request(None, &[(Role::User, "completely different")]);
        other.session = Some("user-1".into());
        assert_eq!(
            routing_input(&other, None, PrefixHashing::default()).key,
            by_meta.key
        );
    }

    #[test]
    fn hashes_cover_full_chunks_only_and_respect_the_cap() {
        let req = request(None, &[(Role::User, &"x".repeat(1000))]);
        // "user" + 0x1f + 1000 bytes + 0x1e = 1006 bytes.
        let h = routing_input(
            &req,
            None,
            PrefixHashing {
                chunk_bytes: 100,
                max_hashes: 512,
            },
        );
        assert_eq!(h.prefix_hashes.len(), 10);
        let capped = routing_input(
            &req,
            None,
            PrefixHashing {
                chunk_bytes: 100,
                max_hashes: 3,
            },
        );
        assert_eq!(capped.prefix_hashes, h.prefix_hashes[..3]);
    }

    proptest! {
        #[test]
        fn appending_turns_never_changes_key_or_earlier_hashes(
            system in proptest::option::of("[a-z ]{0,600}"),
            first in "[a-z ]{1,400}",
            more in proptest::collection::vec("[a-z ]{0,300}", 0..4),
        ) {
            let mut turns = vec![(Role::User, first.as_str())];
            let base = routing_input(&request(system.as_deref(), &turns), None, PrefixHashing::default());
            for (i, text) in more.iter().enumerate() {
                turns.push((if i % 2 == 0 { Role::Assistant } else { Role::User }, text.as_str()));
            }
            let later = routing_input(&request(system.as_deref(), &turns), None, PrefixHashing::default());
            prop_assert_eq!(base.key, later.key);
            prop_assert_eq!(&base.prefix_hashes[..], &later.prefix_hashes[..base.prefix_hashes.len()]);
        }
    }
}
