//! A Hugging Face model folder's tokenizer: `tokenizer.json` (read by the `tokenizers` crate)
//! and the chat template of `tokenizer_config.json` (or `chat_template.jinja`), rendered with
//! `minijinja` as vLLM's chat endpoint renders it: the turns as `messages`,
//! `add_generation_prompt = true`, `bos_token` and `eos_token` from the config, then encoded
//! without adding special tokens (the template writes them). A router that renders and encodes
//! a request this way computes the token ids the engine caches, so its blocks match.
//!
//! Python's string methods that templates call (`strip`, `startswith`, `split`…) come from
//! `minijinja-contrib`'s pycompat; `raise_exception` fails the rendering with the template's
//! message; `strftime_now` formats today's date (Llama 3.1's templates put it in the system
//! prompt, so the router's rendering matches the engine's on the same day).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Tokenizer, TokenizerSpec};
use crate::request::ChatMessage;

/// A folder's tokenizer as data (what a worker could hand a gateway).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HfSpec {
    /// `tokenizer.json`, whole.
    pub tokenizer_json: String,
    /// The chat template (Jinja).
    pub chat_template: String,
    /// `bos_token`, as the template sees it.
    pub bos_token: Option<String>,
    /// `eos_token`, as the template sees it.
    pub eos_token: Option<String>,
}

/// A special token in `tokenizer_config.json`: a string, or `{"content": …}`.
fn special_token(config: &serde_json::Value, name: &str) -> Option<String> {
    match config.get(name)? {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

impl HfSpec {
    /// Reads `dir/tokenizer.json` and the chat template and special tokens of
    /// `dir/tokenizer_config.json` (a template in `dir/chat_template.jinja` wins, as in
    /// `transformers`).
    pub fn from_dir(dir: &Path) -> Result<Self, String> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        let tokenizer_json = read("tokenizer.json")?;
        let config: serde_json::Value = match read("tokenizer_config.json") {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| format!("{}: {e}", dir.join("tokenizer_config.json").display()))?,
            Err(_) => serde_json::Value::Null,
        };
        let in_config = match config.get("chat_template") {
            Some(serde_json::Value::String(template)) => Some(template.clone()),
            // A list of named templates: the default one.
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or_else(|| named.first())
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
            _ => None,
        };
        let chat_template = read("chat_template.jinja")
            .ok()
            .or(in_config)
            .ok_or_else(|| {
                format!(
                    "{}: no chat template (neither chat_template.jinja nor tokenizer_config.json's \
                     chat_template)",
                    dir.display()
                )
            })?;
        Ok(Self {
            tokenizer_json,
            chat_template,
            bos_token: special_token(&config, "bos_token"),
            eos_token: special_token(&config, "eos_token"),
        })
    }
}

/// The tokenizer of a Hugging Face folder.
#[derive(Debug)]
pub struct HfTokenizer {
    spec: Arc<HfSpec>,
    tokenizer: tokenizers::Tokenizer,
    env: minijinja::Environment<'static>,
    end_of_turn: Vec<u32>,
}

const TEMPLATE: &str = "chat";

impl HfTokenizer {
    /// Builds the tokenizer and compiles the template; an error names what is wrong.
    pub fn from_spec(spec: HfSpec) -> Result<Self, String> {
        let tokenizer: tokenizers::Tokenizer = spec
            .tokenizer_json
            .parse()
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    message,
                ))
            },
        );
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_template_owned(TEMPLATE, spec.chat_template.clone())
            .map_err(|e| format!("the chat template: {e}"))?;
        let end_of_turn = spec
            .eos_token
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t))
            .collect();
        Ok(Self {
            spec: Arc::new(spec),
            tokenizer,
            env,
            end_of_turn,
        })
    }

    /// The chat as the template renders it, generation prompt included.
    pub fn render(&self, system: Option<&str>, messages: &[ChatMessage]) -> Result<String, String> {
        let mut turns = Vec::with_capacity(messages.len() + 1);
        if let Some(system) = system {
            turns.push(serde_json::json!({"role": "system", "content": system}));
        }
        for m in messages {
            let mut turn = match &m.tool_call_id {
                Some(id) => {
                    serde_json::json!({"role": "tool", "content": m.text, "tool_call_id": id})
                }
                None => serde_json::json!({"role": m.role.as_str(), "content": m.text}),
            };
            if !m.tool_calls.is_empty() {
                turn["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "id": c.id, "type": "function",
                            "function": {
                                "name": c.name,
                                "arguments": serde_json::from_str::<serde_json::Value>(&c.arguments)
                                    .unwrap_or_else(|_| c.arguments.clone().into()),
                            },
                        })
                    })
                    .collect();
            }
            turns.push(turn);
        }
        let template = self.env.get_template(TEMPLATE).map_err(|e| e.to_string())?;
        template
            .render(minijinja::context! {
                messages => turns,
                add_generation_prompt => true,
                bos_token => self.spec.bos_token.clone().unwrap_or_default(),
                eos_token => self.spec.eos_token.clone().unwrap_or_default(),
            })
            .map_err(|e| format!("the chat template: {e}"))
    }

    fn encode_text(&self, text: &str) -> Vec<u32> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

impl Tokenizer for HfTokenizer {
    fn encode_chat(&self, system: Option<&str>, messages: &[ChatMessage]) -> Vec<u32> {
        match self.render(system, messages) {
            Ok(text) => self.encode_text(&text),
            // A template that refuses the chat (raise_exception): nothing to match.
            Err(_) => Vec::new(),
        }
    }

    fn encode_plain(&self, text: &str) -> Vec<u32> {
        self.encode_text(text)
    }

    fn token_bytes(&self, id: u32) -> Cow<'_, [u8]> {
        Cow::Owned(
            self.tokenizer
                .decode(&[id], false)
                .map(String::into_bytes)
                .unwrap_or_default(),
        )
    }

    fn is_end_of_turn(&self, id: u32) -> bool {
        self.end_of_turn.contains(&id)
    }

    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec::HuggingFace(Box::new((*self.spec).clone()))
    }
}

/// Today's date (UTC) in a `strftime` format: `%d`, `%m`, `%Y`, `%b`, `%B`, `%%`.
fn strftime_now(format: &str) -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Role;

    /// A word-level vocabulary and a ChatML template, as a small model folder would hold.
    fn folder() -> tempdir::Folder {
        let folder = tempdir::Folder::new();
        let vocab: serde_json::Map<String, serde_json::Value> = [
            "[UNK]",
            "<|im_start|>",
            "<|im_end|>",
            "system",
            "user",
            "assistant",
            "Be",
            "brief",
            ".",
            "What",
            "is",
            "a",
            "ring",
            "?",
        ]
        .iter()
        .enumerate()
        .map(|(i, w)| ((*w).to_owned(), serde_json::json!(i)))
        .collect();
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 1, "content": "<|im_start|>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
        });
        folder.write("tokenizer.json", &tokenizer.to_string());
        let template = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        folder.write(
            "tokenizer_config.json",
            &serde_json::json!({
                "chat_template": template,
                "bos_token": null,
                "eos_token": {"content": "<|im_end|>"},
            })
            .to_string(),
        );
        folder
    }

    /// A scratch folder removed when dropped (no extra crate for it).
    mod tempdir {
        pub struct Folder(pub std::path::PathBuf);
        impl Folder {
            pub fn new() -> Self {
                let path = std::env::temp_dir().join(format!(
                    "ringmaster-hf-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&path).unwrap();
                Self(path)
            }
            pub fn write(&self, name: &str, text: &str) {
                std::fs::write(self.0.join(name), text).unwrap();
            }
        }
        impl Drop for Folder {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_chat_is_rendered_by_its_template_and_encoded_without_added_specials() {
        let folder = folder();
        let spec = HfSpec::from_dir(&folder.0).unwrap();
        assert_eq!(spec.eos_token.as_deref(), Some("<|im_end|>"));
        let tokenizer = HfTokenizer::from_spec(spec.clone()).unwrap();
        let messages = [ChatMessage {
            role: Role::User,
            text: "  What is a ring ?  ".into(),
            ..Default::default()
        }];
        let text = tokenizer.render(Some("Be brief ."), &messages).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief .<|im_end|>\n<|im_start|>user\nWhat is a ring ?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            tokenizer.encode_chat(Some("Be brief ."), &messages),
            [1, 3, 6, 7, 8, 2, 1, 4, 9, 10, 11, 12, 13, 2, 1, 5]
        );
        assert!(tokenizer.is_end_of_turn(2));
        // The spec rebuilds the same tokenizer, and says who it is.
        let rebuilt = tokenizer.spec().build().unwrap();
        assert_eq!(
            rebuilt.encode_chat(Some("Be brief ."), &messages),
            tokenizer.encode_chat(Some("Be brief ."), &messages)
        );
        assert_eq!(
            tokenizer.spec().fingerprint(),
            TokenizerSpec::HuggingFace(Box::new(spec)).fingerprint()
        );
    }

    #[test]
    fn a_template_may_refuse_a_chat_and_python_methods_work() {
        let folder = folder();
        folder.write(
            "chat_template.jinja",
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system prompt is required') }}{% endif %}{{ messages[0]['content'].upper() }}|{{ strftime_now('%Y') | length }}",
        );
        let tokenizer = HfTokenizer::from_spec(HfSpec::from_dir(&folder.0).unwrap()).unwrap();
        let user = [ChatMessage {
            role: Role::User,
            text: "hi".into(),
            ..Default::default()
        }];
        let err = tokenizer.render(None, &user).unwrap_err();
        assert!(err.contains("a system prompt is required"), "{err}");
        assert_eq!(tokenizer.render(Some("be"), &user).unwrap(), "BE|4");
        assert!(tokenizer.encode_chat(None, &user).is_empty());
    }

    #[test]
    fn missing_or_broken_files_are_named() {
        let folder = folder();
        std::fs::remove_file(folder.0.join("tokenizer_config.json")).unwrap();
        let err = HfSpec::from_dir(&folder.0).unwrap_err();
        assert!(err.contains("no chat template"), "{err}");
        let err = HfSpec::from_dir(Path::new("/nonexistent/model")).unwrap_err();
        assert!(err.contains("tokenizer.json"), "{err}");
        let broken = HfSpec {
            tokenizer_json: "{".into(),
            chat_template: String::new(),
            bos_token: None,
            eos_token: None,
        };
        assert!(HfTokenizer::from_spec(broken).is_err());
    }

    #[test]
    fn dates_convert() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
