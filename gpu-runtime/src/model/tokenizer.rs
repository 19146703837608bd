//! The tokenizer and chat template of a GGUF model, from its metadata.
//!
//! The vocabulary and merges (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`) make a
//! byte-level BPE model (the `tokenizers` crate). The pre-tokenizer follows the file's
//! `tokenizer.ggml.pre`: for `smollm` it is individual digits, then byte-level splitting
//! without a prefix space; candle's GGUF tokenizer gets this wrong (it adds a prefix space and
//! does not split digits), which the golden-token test pins. Control tokens
//! (`tokenizer.ggml.token_type` 3) are matched as whole special tokens. The chat template is
//! ChatML (`<|im_start|>role\n…<|im_end|>\n`), with the template's own default system prompt
//! when the request has none.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::gguf::{ModelFile, meta_str};
use crate::request::ChatMessage;
use crate::tokenizer::{Tokenizer, TokenizerSpec};

/// A GGUF model's tokenizer.
#[derive(Debug)]
pub struct GgufTokenizer {
    inner: HfTokenizer,
    /// Each token's bytes (byte-level BPE pieces decoded; control tokens empty).
    bytes: Vec<Vec<u8>>,
    end_of_turn: Vec<u32>,
    default_system: Option<String>,
    /// What it was built from, for routers that tokenize as this engine does.
    spec: BpeSpec,
}

/// A byte-level BPE tokenizer as a GGUF file's metadata describes it: everything needed to
/// build the same [`GgufTokenizer`] elsewhere (a gateway fetches it from a worker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpeSpec {
    /// `tokenizer.ggml.tokens`: each id's piece, in GPT-2's byte alphabet.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (3 = control token); empty when the file has none.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"a b"` pairs, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`.
    pub pre: String,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// The chat template's literal default system prompt.
    pub default_system: Option<String>,
}

impl BpeSpec {
    /// Reads the tokenizer's metadata from `file`.
    pub fn from_file(file: &ModelFile) -> Result<Self, String> {
        let content = &file.content;
        let model = meta_str(content, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(format!(
                "tokenizer model {model:?} is not supported (only byte-level BPE, \"gpt2\")"
            ));
        }
        let list = |key: &str| -> Result<Vec<String>, String> {
            let values = content
                .metadata
                .get(key)
                .ok_or_else(|| format!("metadata key {key} is missing"))?
                .to_vec()
                .map_err(|e| format!("{key}: {e}"))?;
            values
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| format!("{key}: {e}")))
                .collect()
        };
        let token_types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| format!("tokenizer.ggml.token_type: {e}"))?
                .iter()
                .map(|t| t.to_i32().unwrap_or(1))
                .collect(),
            None => Vec::new(),
        };
        Ok(Self {
            tokens: list("tokenizer.ggml.tokens")?,
            token_types,
            merges: list("tokenizer.ggml.merges")?,
            pre: meta_str(content, "tokenizer.ggml.pre")
                .unwrap_or("default")
                .to_owned(),
            eos_token_id: content
                .metadata
                .get("tokenizer.ggml.eos_token_id")
                .and_then(|v| v.to_u32().ok()),
            default_system: meta_str(content, "tokenizer.chat_template")
                .ok()
                .and_then(default_system_prompt),
        })
    }
}

impl GgufTokenizer {
    /// Builds the tokenizer from `file`'s metadata.
    pub fn from_file(file: &ModelFile) -> Result<Self, String> {
        Self::from_spec(BpeSpec::from_file(file)?)
    }

    /// Builds the tokenizer from its description.
    pub fn from_spec(spec: BpeSpec) -> Result<Self, String> {
        let tokens = &spec.tokens;
        if !spec.token_types.is_empty() && spec.token_types.len() != tokens.len() {
            return Err(format!(
                "{} token types for {} tokens",
                spec.token_types.len(),
                tokens.len()
            ));
        }
        let type_of = |i: usize| spec.token_types.get(i).copied().unwrap_or(1);
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges: Vec<(String, String)> = spec
            .merges
            .iter()
            .filter_map(|m| m.split_once(' '))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| format!("building the BPE model: {e}"))?;
        let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
        let pre_tokenizer = match spec.pre.as_str() {
            "smollm" | "llama-bpe" | "default" | "gpt2" => Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level,
            ]),
            other => {
                return Err(format!(
                    "pre-tokenizer {other:?} is not supported (smollm, llama-bpe, gpt2)"
                ));
            }
        };
        let mut inner = HfTokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevel::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| type_of(*i) == 3)
            .map(|(_, text)| AddedToken::from(text.clone(), true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| format!("adding the special tokens: {e}"))?;
        let decode_table = byte_decoder();
        let bytes = tokens
            .iter()
            .enumerate()
            .map(|(i, text)| {
                if type_of(i) == 3 {
                    Vec::new()
                } else {
                    text.chars()
                        .map(|c| decode_table.get(&c).copied().unwrap_or(b'?'))
                        .collect()
                }
            })
            .collect();
        let id_of = |text: &str| tokens.iter().position(|t| t == text).map(|i| i as u32);
        let mut end_of_turn: Vec<u32> = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| id_of(t))
            .collect();
        if let Some(eos) = spec.eos_token_id
            && !end_of_turn.contains(&eos)
        {
            end_of_turn.push(eos);
        }
        if id_of("<|im_start|>").is_none() {
            return Err(
                "the vocabulary has no <|im_start|>: only ChatML models are supported".into(),
            );
        }
        Ok(Self {
            inner,
            bytes,
            end_of_turn,
            default_system: spec.default_system.clone(),
            spec,
        })
    }

    /// The token ids of `text` (special tokens in it are matched whole).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.inner.encode_fast(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            // Byte-level BPE covers every byte; an error here is a broken vocabulary.
            Err(_) => Vec::new(),
        }
    }

    /// The ChatML text of a conversation, with the generation prompt.
    pub fn render_chat(&self, system: Option<&str>, messages: &[ChatMessage]) -> String {
        let mut text = String::new();
        if let Some(system) = system.or(self.default_system.as_deref()) {
            text.push_str(&format!("<|im_start|>system\n{system}<|im_end|>\n"));
        }
        for message in messages {
            let role = message.role.as_str();
            text.push_str(&format!("<|im_start|>{role}\n{}<|im_end|>\n", message.text));
        }
        text.push_str("<|im_start|>assistant\n");
        text
    }
}

impl Tokenizer for GgufTokenizer {
    fn encode_plain(&self, text: &str) -> Vec<u32> {
        self.encode(text)
    }

    fn encode_chat(&self, system: Option<&str>, messages: &[ChatMessage]) -> Vec<u32> {
        self.encode(&self.render_chat(system, messages))
    }

    fn token_bytes(&self, id: u32) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.bytes.get(id as usize).map_or(&[][..], Vec::as_slice))
    }

    fn is_end_of_turn(&self, id: u32) -> bool {
        self.end_of_turn.contains(&id)
    }

    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec::Bpe(Box::new(self.spec.clone()))
    }
}

/// The system prompt a ChatML template inserts when there is none: the literal text between
/// `<|im_start|>system\n` and `<|im_end|>` in the template, if it is a literal (not built
/// from template expressions).
fn default_system_prompt(template: &str) -> Option<String> {
    let start = template
        .find("<|im_start|>system\\n")
        .map(|i| (i, 20))
        .or_else(|| template.find("<|im_start|>system\n").map(|i| (i, 19)))?;
    let rest = &template[start.0 + start.1..];
    let end = rest.find("<|im_end|>")?;
    let text = &rest[..end];
    let templated = ["{{", "{%", "' +", "+ '"].iter().any(|t| text.contains(t));
    (!templated && !text.is_empty()).then(|| text.to_owned())
}

/// GPT-2's byte-level alphabet, reversed: the character standing for each byte.
fn byte_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0;
    for byte in 0..=255u32 {
        let ch = if printable.contains(&byte) {
            byte
        } else {
            extra += 1;
            255 + extra
        };
        map.insert(char::from_u32(ch).expect("valid"), byte as u8);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_a_bijection() {
        let map = byte_decoder();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn the_default_system_prompt_is_read_from_a_template() {
        let template = "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{% endfor %}";
        assert_eq!(
            default_system_prompt(template).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        assert_eq!(
            default_system_prompt("{{ '<|im_start|>system\\n' + m.content + '<|im_end|>' }}"),
            None
        );
    }
}
