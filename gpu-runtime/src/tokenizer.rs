//! Tokenizers: the [`Tokenizer`] trait the engine uses, and the simulated server's
//! [`SimTokenizer`].
//!
//! This module owns turning a chat into token ids (rendering the chat template included) and
//! turning generated token ids back into bytes. It must not know about blocks, steps or
//! sampling. An executor supplies its tokenizer ([`crate::Executor::tokenizer`]): the simulated
//! one is [`SimTokenizer`], a model executor brings its model's.
//!
//! # The simulated tokenizer
//!
//! The chat is rendered as ChatML:
//!
//! ```text
//! <|im_start|>system\n{system}<|im_end|>\n        (only if there is a system prompt)
//! <|im_start|>{role}\n{text}<|im_end|>\n          (for each message)
//! <|im_start|>assistant\n                          (the generation prompt)
//! ```
//!
//! `<|im_start|>` and `<|im_end|>` are single special ids ([`IM_START`], [`IM_END`]); text
//! between them is split into pieces **before each whitespace character**: a piece is at most
//! one leading whitespace character followed by non-whitespace, at most [`MAX_PIECE_CHARS`]
//! characters (longer runs are cut). A piece's id is `xxh3(piece) mod TEXT_VOCAB +
//! SPECIAL_TOKENS`. Message text is never parsed for special tokens.
//!
//! Because a piece never spans a whitespace character, `tokens(a + b) == tokens(a) +
//! tokens(b)` whenever `b` starts with whitespace. Simulated output words all start with a
//! space, so a prompt's tokens followed by the generated tokens equal the tokens of the
//! re-rendered conversation that contains the generated text (the concatenated
//! [`crate::GenerateEvent::Token`] texts, unchanged) as the assistant's message: the next turn
//! of a conversation hits the prefix cache on everything before it, its own earlier replies
//! included.

pub mod hugging_face;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::request::ChatMessage;

/// A tokenizer with a chat template, as the engine needs one.
pub trait Tokenizer: Send + Sync + std::fmt::Debug + 'static {
    /// The token ids of the rendered chat, generation prompt included (so never empty).
    fn encode_chat(&self, system: Option<&str>, messages: &[ChatMessage]) -> Vec<u32>;

    /// The token ids of plain text, without the chat template (raw completions).
    fn encode_plain(&self, text: &str) -> Vec<u32>;

    /// The bytes one token stands for. A token may hold part of a UTF-8 character (byte-level
    /// BPE); the engine assembles bytes into text across tokens.
    fn token_bytes(&self, id: u32) -> Cow<'_, [u8]>;

    /// Whether generating this token ends the assistant's turn.
    fn is_end_of_turn(&self, id: u32) -> bool;

    /// A description from which [`TokenizerSpec::build`] makes a tokenizer giving the same
    /// ids: how a router outside the engine computes the block hashes this engine caches.
    fn spec(&self) -> TokenizerSpec;
}

/// A tokenizer as data: serializable, so a worker can hand its tokenizer to a gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TokenizerSpec {
    /// The simulated server's [`SimTokenizer`].
    Sim,
    /// A GGUF model's byte-level BPE tokenizer.
    Bpe(Box<crate::model::BpeSpec>),
    /// A Hugging Face folder's `tokenizer.json` and chat template.
    HuggingFace(Box<hugging_face::HfSpec>),
}

impl TokenizerSpec {
    /// The tokenizer this describes; an error names what is wrong with the description.
    pub fn build(&self) -> Result<Arc<dyn Tokenizer>, String> {
        Ok(match self {
            Self::Sim => Arc::new(SimTokenizer::new()),
            Self::Bpe(spec) => Arc::new(crate::model::GgufTokenizer::from_spec((**spec).clone())?),
            Self::HuggingFace(spec) => {
                Arc::new(hugging_face::HfTokenizer::from_spec((**spec).clone())?)
            }
        })
    }

    /// A hash identifying the description: two tokenizers with one fingerprint tokenize alike.
    pub fn fingerprint(&self) -> u64 {
        match serde_json::to_vec(self) {
            Ok(bytes) => xxh3_64(&bytes),
            // Serializing plain data does not fail; a constant keeps this total anyway.
            Err(_) => 0,
        }
    }
}

/// The id of `<|im_start|>`.
pub const IM_START: u32 = 0;

/// The id of `<|im_end|>`, which ends a turn.
pub const IM_END: u32 = 1;

/// Number of special ids, which come before every text id.
pub const SPECIAL_TOKENS: u32 = 2;

/// Text ids available to pieces: with the specials, the vocabulary has 128,256 ids, the size
/// of Llama 3's.
pub const TEXT_VOCAB: u32 = 128_256 - SPECIAL_TOKENS;

/// Most characters in one piece. Long enough that common English words are one token (as with
/// real BPE vocabularies), short enough that long strings such as URLs cost several.
pub const MAX_PIECE_CHARS: usize = 8;

/// The literal text of `<|im_start|>`.
const IM_START_TEXT: &str = "<|im_start|>";

/// The literal text of `<|im_end|>`.
const IM_END_TEXT: &str = "<|im_end|>";

/// The words the simulated executor generates, one token each, each with a leading space and
/// at most [`MAX_PIECE_CHARS`] characters so that it is a single piece.
pub const SIM_WORDS: [&str; 64] = [
    " the", " of", " and", " to", " in", " is", " it", " that", " for", " on", " with", " as",
    " was", " at", " by", " this", " from", " they", " we", " you", " have", " not", " but",
    " all", " can", " more", " one", " time", " some", " there", " would", " about", " which",
    " when", " other", " these", " make", " like", " into", " model", " data", " system",
    " request", " cache", " server", " token", " quick", " brown", " fox", " jumps", " over",
    " lazy", " dog", " river", " stone", " light", " green", " world", " simple", " answer",
    " because", " every", " small", " clear",
];

/// Splits text into pieces: a new piece starts before each whitespace character and after
/// [`MAX_PIECE_CHARS`] characters.
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    rest: &'a str,
}

impl<'a> Pieces<'a> {
    /// The pieces of `text`.
    pub fn new(text: &'a str) -> Self {
        Self { rest: text }
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        let mut end = self.rest.len();
        for (n, (i, c)) in self.rest.char_indices().enumerate() {
            if n > 0 && (c.is_whitespace() || n == MAX_PIECE_CHARS) {
                end = i;
                break;
            }
        }
        let (piece, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(piece)
    }
}

/// The simulated server's deterministic tokenizer (see the module documentation).
#[derive(Clone, Debug)]
pub struct SimTokenizer {
    /// Reverse map for the pieces the simulated executor generates.
    words: HashMap<u32, &'static str>,
}

impl Default for SimTokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl SimTokenizer {
    /// The tokenizer, with its reverse map of [`SIM_WORDS`].
    pub fn new() -> Self {
        Self {
            words: SIM_WORDS.iter().map(|w| (Self::piece_id(w), *w)).collect(),
        }
    }

    /// The id of one piece.
    pub fn piece_id(piece: &str) -> u32 {
        (xxh3_64(piece.as_bytes()) % u64::from(TEXT_VOCAB)) as u32 + SPECIAL_TOKENS
    }

    /// Appends the ids of plain text (no special tokens are recognised) to `out`.
    pub fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        out.extend(Pieces::new(text).map(Self::piece_id));
    }

    /// The ids of [`SIM_WORDS`], in order.
    pub fn sim_word_ids() -> [u32; SIM_WORDS.len()] {
        SIM_WORDS.map(Self::piece_id)
    }

    /// The text of a special token or of a generated word; `None` for any other id (the
    /// tokenizer keeps no reverse map for prompt text).
    pub fn decode(&self, id: u32) -> Option<&str> {
        match id {
            IM_START => Some(IM_START_TEXT),
            IM_END => Some(IM_END_TEXT),
            _ => self.words.get(&id).copied(),
        }
    }

    fn encode_turn(&self, role: &str, text: &str, out: &mut Vec<u32>) {
        out.push(IM_START);
        self.encode_text(&format!("{role}\n{text}"), out);
        out.push(IM_END);
        self.encode_text("\n", out);
    }
}

impl Tokenizer for SimTokenizer {
    fn encode_plain(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_text(text, &mut out);
        out
    }

    fn encode_chat(&self, system: Option<&str>, messages: &[ChatMessage]) -> Vec<u32> {
        let mut out = Vec::new();
        if let Some(system) = system {
            self.encode_turn("system", system, &mut out);
        }
        for m in messages {
            self.encode_turn(m.role.as_str(), &m.text, &mut out);
        }
        out.push(IM_START);
        self.encode_text("assistant\n", &mut out);
        out
    }

    /// Unknown ids (prompt pieces, which the simulated executor never generates) decode to
    /// U+FFFD, the replacement character.
    fn token_bytes(&self, id: u32) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.decode(id).unwrap_or("\u{FFFD}").as_bytes())
    }

    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec::Sim
    }

    fn is_end_of_turn(&self, id: u32) -> bool {
        id == IM_END
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Role;
    use proptest::prelude::*;

    fn pieces(s: &str) -> Vec<&str> {
        Pieces::new(s).collect()
    }

    fn msg(role: Role, text: &str) -> ChatMessage {
        ChatMessage {
            role,
            text: text.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn pieces_split_before_whitespace_and_after_eight_chars() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("a  b\n\nc"), ["a", " ", " b", "\n", "\nc"]);
        assert_eq!(pieces("abcdefghijk"), ["abcdefgh", "ijk"]);
        assert_eq!(pieces(" abcdefghij"), [" abcdefg", "hij"]);
        assert_eq!(pieces("héllo wörld"), ["héllo", " wörld"]);
        assert!(pieces("").is_empty());
    }

    #[test]
    fn chat_is_rendered_as_chatml() {
        let t = SimTokenizer::new();
        let ids = t.encode_chat(Some("Be brief."), &[msg(Role::User, "Hi there")]);
        let mut want = vec![IM_START];
        t.encode_text("system\nBe brief.", &mut want);
        want.push(IM_END);
        t.encode_text("\n", &mut want);
        want.push(IM_START);
        t.encode_text("user\nHi there", &mut want);
        want.push(IM_END);
        t.encode_text("\n", &mut want);
        want.push(IM_START);
        t.encode_text("assistant\n", &mut want);
        assert_eq!(ids, want);
        // No system prompt: no system turn.
        let ids = t.encode_chat(None, &[msg(Role::User, "Hi there")]);
        assert_eq!(ids[..2], [IM_START, SimTokenizer::piece_id("user")]);
    }

    #[test]
    fn special_token_text_in_messages_is_not_special() {
        let t = SimTokenizer::new();
        let ids = t.encode_chat(None, &[msg(Role::User, "<|im_end|>")]);
        assert_eq!(ids.iter().filter(|&&id| id == IM_END).count(), 1);
    }

    #[test]
    fn generated_words_are_single_pieces_with_distinct_ids() {
        let t = SimTokenizer::new();
        for w in SIM_WORDS {
            assert!(
                w.starts_with(' ') && w.chars().count() <= MAX_PIECE_CHARS,
                "{w:?}"
            );
            assert_eq!(pieces(w), [w]);
            assert_eq!(t.decode(SimTokenizer::piece_id(w)), Some(w));
        }
        assert_eq!(t.words.len(), SIM_WORDS.len(), "no two words share an id");
        assert_eq!(t.decode(IM_END), Some("<|im_end|>"));
        assert!(t.is_end_of_turn(IM_END) && !t.is_end_of_turn(IM_START));
    }

    fn text() -> impl Strategy<Value = String> {
        // Words, whitespace of several kinds, non-ASCII, and long runs.
        prop::collection::vec(
            prop_oneof![
                "[a-z]{1,12}",
                Just(" ".to_string()),
                Just("\n".to_string()),
                Just("\t".to_string()),
                "[é漢字]{1,3}",
                "[.,!?]{1,2}",
            ],
            0..12,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn tokens_are_stable_under_concatenation_at_whitespace(a in text(), b in text()) {
            let b = format!(" {b}");
            let t = SimTokenizer::new();
            let (mut ab, mut sep) = (Vec::new(), Vec::new());
            t.encode_text(&format!("{a}{b}"), &mut ab);
            t.encode_text(&a, &mut sep);
            t.encode_text(&b, &mut sep);
            prop_assert_eq!(ab, sep);
        }

        #[test]
        fn prompt_plus_generated_tokens_is_a_prefix_of_the_next_turn(
            system in prop::option::of(text()),
            turns in prop::collection::vec(text(), 1..4),
            words in prop::collection::vec(0usize..SIM_WORDS.len(), 0..20),
            ended in any::<bool>(),
            next in text(),
        ) {
            let t = SimTokenizer::new();
            let mut messages: Vec<ChatMessage> = turns
                .iter()
                .enumerate()
                .map(|(i, s)| msg(if i % 2 == 0 { Role::User } else { Role::Assistant }, s))
                .collect();
            if messages.len().is_multiple_of(2) {
                messages.push(msg(Role::User, "go on"));
            }
            let prompt = t.encode_chat(system.as_deref(), &messages);
            // What the engine would generate and stream.
            let ids = SimTokenizer::sim_word_ids();
            let mut generated: Vec<u32> = words.iter().map(|&w| ids[w]).collect();
            let reply: String = words.iter().map(|&w| SIM_WORDS[w]).collect();
            if ended {
                generated.push(IM_END);
            }
            messages.push(msg(Role::Assistant, &reply));
            messages.push(msg(Role::User, &next));
            let rerendered = t.encode_chat(system.as_deref(), &messages);
            let mut expected = prompt.clone();
            expected.extend(&generated);
            prop_assert_eq!(&rerendered[..expected.len()], &expected[..]);
        }
    }
}
