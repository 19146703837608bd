//! Trace requests as Messages requests: text that stands for a trace's prefix blocks, laid out
//! as the conversation the trace implies.
//!
//! This module owns the rendering only; it must not parse traces ([`crate::trace`]) nor send
//! anything. A block id becomes [`TRACE_BLOCK_TOKENS`] words that exist nowhere else (each a
//! single token of the simulated tokenizer: a space and at most 7 characters), so two
//! requests share rendered text exactly where the trace says they share a prefix. Block 0 of
//! a prompt is the system prompt (in the conversation trace every request starts with one
//! shared block). The rest is cut into messages at the turn boundaries: the complete-block
//! counts of the request's earlier turns, and its own. Because a boundary is where an earlier
//! turn's complete blocks end, every turn renders its earlier turns' messages byte for byte
//! as they rendered them, and the first user message, which a session-less routing key is
//! taken from, is the same on every turn of a conversation. Roles alternate by position
//! (user, assistant, user, ...), never by how many messages a request has, for the same
//! reason.

use std::fmt::Write;

use crate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// The model name replayed requests ask for.
pub const REPLAY_MODEL: &str = "replay";

/// Distinct words of at most 7 base-36 digits (what the simulated tokenizer keeps as one
/// piece).
const WORDS: u64 = 36u64.pow(7);

/// The text standing for block `id` cut to its first `tokens` tokens, appended to `out`.
///
/// A small id (Mooncake's ids count up from 0) gets words no other block has; a large one (a
/// synthetic prefix model's hashes) gets hashed words, which another block repeats only by a
/// one-in-78-billion chance per word.
pub fn block_text(id: u64, tokens: u32, out: &mut String) {
    let per_block = u64::from(TRACE_BLOCK_TOKENS);
    for position in 0..tokens {
        let position = u64::from(position);
        let word = match id.checked_mul(per_block).map(|w| w + position) {
            Some(word) if word < WORDS => word,
            _ => xxhash_rust::xxh3::xxh3_64_with_seed(&position.to_le_bytes(), id) % WORDS,
        };
        out.push(' ');
        push_base36(word, out);
    }
}

fn push_base36(mut value: u64, out: &mut String) {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut buf = [0u8; 13];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = DIGITS[(value % 36) as usize];
        value /= 36;
        if value == 0 {
            break;
        }
    }
    // The simulated tokenizer cuts pieces at 8 characters (the space included): 7 base-36
    // digits reach 78 billion words, far past any trace's ids × 512.
    debug_assert!(buf.len() - at <= 7, "a word of more than 7 digits");
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

/// The messages of `request`, given the complete-block counts of its earlier turns, oldest
/// first: `(system, [(is_user, text)])`.
pub fn conversation(
    request: &TraceRequest,
    earlier_turns: &[usize],
) -> (String, Vec<(bool, String)>) {
    let blocks = request.blocks.len();
    let mut system = String::new();
    if blocks <= 1 {
        // A one-block prompt is its own user message.
        let mut text = String::new();
        if let Some(&id) = request.blocks.first() {
            block_text(id, request.block_tokens(0), &mut text);
        }
        return (system, vec![(true, text)]);
    }
    block_text(request.blocks[0], request.block_tokens(0), &mut system);
    let mut cuts: Vec<usize> = earlier_turns
        .iter()
        .copied()
        .chain(std::iter::once(request.complete_blocks()))
        .filter(|&cut| cut > 1 && cut < blocks)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut messages = Vec::with_capacity(cuts.len() + 1);
    let mut start = 1;
    for end in cuts.into_iter().chain(std::iter::once(blocks)) {
        let mut text = String::new();
        for index in start..end {
            block_text(
                request.blocks[index],
                request.block_tokens(index),
                &mut text,
            );
        }
        messages.push((messages.len() % 2 == 0, text));
        start = end;
    }
    (system, messages)
}

/// The JSON body of `request` as a streamed Messages request for exactly its output length.
pub fn messages_body(request: &TraceRequest, earlier_turns: &[usize]) -> Vec<u8> {
    messages_body_as(request, earlier_turns, false)
}

/// Claude Code's billing line for a request, new on every request as Claude Code's is (its
/// `cch` from the request's arrival and length).
pub fn billing_line(request: &TraceRequest) -> String {
    let nonce = xxhash_rust::xxh3::xxh3_64(
        &[
            (request.arrival.as_nanos() as u64).to_le_bytes(),
            u64::from(request.input_tokens).to_le_bytes(),
        ]
        .concat(),
    );
    format!(
        "x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch={:05x};",
        nonce & 0xf_ffff
    )
}

/// [`messages_body`], the system prompt led by Claude Code's billing line when
/// `with_billing_line`; a request of a known session names it as Claude Code does
/// (`metadata.user_id`).
///
/// The line is sent as Claude Code sends it: the first text block of `system`, a block of its
/// own, the system prompt in the next. So a replay with the line goes through the door's own
/// handling of that shape, and what the servers see depends on the gateway taking the line
/// out, not on how it was rendered here.
pub fn messages_body_as(
    request: &TraceRequest,
    earlier_turns: &[usize],
    with_billing_line: bool,
) -> Vec<u8> {
    let (system, messages) = conversation(request, earlier_turns);
    let mut body = String::with_capacity(
        system.len() + messages.iter().map(|(_, t)| t.len() + 40).sum::<usize>() + 300,
    );
    let _ = write!(
        body,
        r#"{{"model":"{REPLAY_MODEL}","max_tokens":{},"stream":true,"ignore_eos":true,"#,
        request.output_tokens.max(1)
    );
    if let Some(session) = request.session {
        let _ = write!(body, r#""metadata":{{"user_id":"session-{session:08x}"}},"#);
    }
    // The words and the line need no escaping.
    match (with_billing_line, system.is_empty()) {
        (true, false) => {
            let _ = write!(
                body,
                r#""system":[{{"type":"text","text":"{}"}},{{"type":"text","text":"{system}"}}],"#,
                billing_line(request)
            );
        }
        (true, true) => {
            let _ = write!(
                body,
                r#""system":[{{"type":"text","text":"{}"}}],"#,
                billing_line(request)
            );
        }
        (false, false) => {
            let _ = write!(body, r#""system":"{system}","#);
        }
        (false, true) => {}
    }
    body.push_str(r#""messages":["#);
    for (index, (is_user, text)) in messages.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        let role = if *is_user { "user" } else { "assistant" };
        // The words are spaces and base-36 digits: nothing to escape.
        let _ = write!(body, r#"{{"role":"{role}","content":"{text}"}}"#);
    }
    body.push_str("]}");
    body.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(input: u32, blocks: &[u64]) -> TraceRequest {
        TraceRequest {
            arrival: Duration::ZERO,
            input_tokens: input,
            output_tokens: 7,
            blocks: blocks.to_vec(),
            session: None,
        }
    }

    #[test]
    fn words_are_single_tokens_and_distinct() {
        let mut a = String::new();
        block_text(3, 512, &mut a);
        let words: Vec<&str> = a.split(' ').skip(1).collect();
        assert_eq!(words.len(), 512);
        assert!(words.iter().all(|w| !w.is_empty() && w.len() <= 7));
        let mut b = String::new();
        block_text(4, 512, &mut b);
        assert!(b.split(' ').skip(1).all(|w| !words.contains(&w)));
    }

    #[test]
    fn large_ids_still_make_single_token_words() {
        let mut text = String::new();
        block_text(u64::MAX - 3, 512, &mut text);
        let words: Vec<&str> = text.split(' ').skip(1).collect();
        assert_eq!(words.len(), 512);
        assert!(words.iter().all(|w| !w.is_empty() && w.len() <= 7));
        let mut again = String::new();
        block_text(u64::MAX - 3, 512, &mut again);
        assert_eq!(text, again);
    }

    #[test]
    fn a_later_turn_starts_with_its_earlier_turns_text() {
        // Turn 1: blocks [0, 1, 2] with 2 partial; turn 2 carries [0, 1] and goes on.
        let first = request(1100, &[0, 1, 2]);
        let second = request(2100, &[0, 1, 5, 6, 7]);
        let (s1, m1) = conversation(&first, &[]);
        let (s2, m2) = conversation(&second, &[first.complete_blocks()]);
        assert_eq!(s1, s2);
        // The first user message (the session-less routing key) is the same.
        assert_eq!(m1[0], m2[0]);
        assert_eq!(m1.len(), 2);
        assert!(m1[0].0 && !m1[1].0 && m2[0].0 && !m2[1].0);
        let body: serde_json::Value =
            serde_json::from_slice(&messages_body(&second, &[2])).unwrap();
        assert_eq!(body["max_tokens"], 7);
        assert_eq!(body["messages"].as_array().unwrap().len(), 3);
        let words = |s: &str| s.split(' ').filter(|w| !w.is_empty()).count();
        let total = words(body["system"].as_str().unwrap())
            + body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| words(m["content"].as_str().unwrap()))
                .sum::<usize>();
        assert_eq!(total, 2100);
    }

    #[test]
    fn the_billing_line_is_a_system_block_of_its_own_and_new_on_every_request() {
        let mut first = request(2100, &[0, 1, 5, 6, 7]);
        first.session = Some(3);
        let mut second = first.clone();
        second.arrival = Duration::from_secs(9);
        let plain: serde_json::Value =
            serde_json::from_slice(&messages_body(&first, &[2])).unwrap();
        let lines: Vec<String> = [&first, &second]
            .iter()
            .map(|r| {
                let body: serde_json::Value =
                    serde_json::from_slice(&messages_body_as(r, &[2], true)).unwrap();
                let system = body["system"].as_array().unwrap();
                assert_eq!(system.len(), 2);
                // The system prompt is the one the body without the line has, untouched.
                assert_eq!(system[1]["text"], plain["system"]);
                assert_eq!(body["messages"], plain["messages"]);
                let line = system[0]["text"].as_str().unwrap().to_owned();
                assert!(
                    line.starts_with("x-anthropic-billing-header: ") && line.contains(" cch="),
                    "{line}"
                );
                line
            })
            .collect();
        assert_ne!(lines[0], lines[1]);
        // A one-block prompt has no system prompt: the line is the whole of `system`.
        let body: serde_json::Value =
            serde_json::from_slice(&messages_body_as(&request(300, &[4]), &[], true)).unwrap();
        assert_eq!(body["system"].as_array().unwrap().len(), 1);
    }
}
