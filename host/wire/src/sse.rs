//! Server-sent event frames, written into a buffer (no I/O): `data: JSON\n\n` (OpenAI's
//! streams, the worker's events) and `event: NAME\ndata: JSON\n\n` (Anthropic's).

use serde::Serialize;

/// Appends `data: JSON\n\n`.
pub fn data(out: &mut Vec<u8>, value: &impl Serialize) {
    out.extend_from_slice(b"data: ");
    json(out, value);
    out.extend_from_slice(b"\n\n");
}

/// Appends `event: NAME\ndata: JSON\n\n`.
pub fn event(out: &mut Vec<u8>, name: &str, value: &impl Serialize) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    json(out, value);
    out.extend_from_slice(b"\n\n");
}

/// A comment line: ignored by every SSE client, and traffic for every proxy between.
pub const KEEP_ALIVE: &[u8] = b": ping\n\n";

/// Appends `text` as a JSON string (quoted, escaped).
pub fn json_string(out: &mut Vec<u8>, text: &str) {
    json(out, &text);
}

fn json(out: &mut Vec<u8>, value: &impl Serialize) {
    // The wire types serialize infallibly (no maps with non-string keys); an empty object
    // keeps the frame well-formed should one ever fail.
    let start = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"{}");
    }
}
