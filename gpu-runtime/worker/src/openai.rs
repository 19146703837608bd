//! The OpenAI request and response shapes the worker speaks, and their mapping onto the
//! engine's [`GenerateRequest`]. Unknown fields are ignored, as OpenAI-compatible servers do;
//! fields that are present must be well-formed.

use ringmaster_gpu_runtime::{ChatMessage, FinishReason, GenerateRequest, Role, SamplingParams};
use serde::Deserialize;
use serde_json::{Value, json};

/// `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// A bad request, with the message the client sees.
#[derive(Debug)]
pub struct Invalid(pub String);

/// Message content: a string, or an array of parts of which the text ones count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
    /// vLLM's extension: usage in every chunk (how a gateway learns the prompt and cached
    /// token counts with the first token).
    #[serde(default)]
    continuous_usage_stats: bool,
}

/// The fields of `/v1/chat/completions` and `/v1/completions` the worker reads.
#[derive(Debug, Deserialize)]
struct RawRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<u32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    /// vLLM's extension: keep generating past the end of the turn, to `max_tokens`.
    #[serde(default)]
    ignore_eos: bool,
    /// Ringmaster's extension: the scheduling priority, 0 = lowest (preempted first).
    #[serde(default)]
    ringmaster_priority: Option<u8>,
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: messages through the chat template.
    Chat,
    /// `/v1/completions`: a raw prompt.
    Completions,
}

/// A validated request.
#[derive(Debug)]
pub struct Request {
    /// What to run.
    pub generate: GenerateRequest,
    /// Whether to stream server-sent events.
    pub stream: bool,
    /// Whether a streamed reply ends with a usage chunk.
    pub include_usage: bool,
    /// Whether every streamed chunk carries the usage so far.
    pub continuous_usage: bool,
}

impl Request {
    /// Parses and checks a request body for `endpoint` on a worker serving `model`.
    pub fn parse(
        body: &[u8],
        endpoint: Endpoint,
        model: &str,
        request_id: &str,
    ) -> Result<Self, Invalid> {
        let raw: RawRequest = serde_json::from_slice(body)
            .map_err(|e| Invalid(format!("the request body is not a valid request: {e}")))?;
        if let Some(asked) = &raw.model
            && asked != model
        {
            return Err(Invalid(format!(
                "this worker serves the model {model:?}, not {asked:?}"
            )));
        }
        let (system, messages, prompt) = match endpoint {
            Endpoint::Chat => {
                let messages = raw
                    .messages
                    .ok_or_else(|| Invalid("`messages` is required".into()))?;
                let (system, messages) = chat(messages)?;
                (system, messages, None)
            }
            Endpoint::Completions => {
                let prompt = raw
                    .prompt
                    .ok_or_else(|| Invalid("`prompt` is required (one string)".into()))?;
                if prompt.is_empty() {
                    return Err(Invalid("`prompt` is empty".into()));
                }
                (None, Vec::new(), Some(prompt))
            }
        };
        if let Some(t) = raw.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(Invalid(format!("`temperature` {t} is not within 0 to 2")));
        }
        if let Some(p) = raw.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(Invalid(format!("`top_p` {p} is not within (0, 1]")));
        }
        let stop_sequences = match raw.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        Ok(Self {
            generate: GenerateRequest {
                request_id: request_id.to_owned(),
                system,
                messages,
                max_tokens: raw
                    .max_completion_tokens
                    .or(raw.max_tokens)
                    .unwrap_or(DEFAULT_MAX_TOKENS),
                stop_sequences,
                sampling: SamplingParams {
                    temperature: raw.temperature,
                    top_p: raw.top_p,
                    top_k: raw.top_k,
                    seed: raw.seed,
                    ignore_eos: raw.ignore_eos,
                },
                prompt,
                priority: raw.ringmaster_priority.unwrap_or(0),
                tools: None,
            },
            stream: raw.stream,
            include_usage: raw.stream_options.as_ref().is_some_and(|o| o.include_usage),
            continuous_usage: raw
                .stream_options
                .as_ref()
                .is_some_and(|o| o.continuous_usage_stats),
        })
    }
}

/// Splits OpenAI messages into the system prompt and the conversation.
fn chat(messages: Vec<Message>) -> Result<(Option<String>, Vec<ChatMessage>), Invalid> {
    let mut system: Option<String> = None;
    let mut out = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(Invalid(format!(
                                "messages[{i}]: content parts of type {kind:?} are not supported (text only)"
                            )));
                        }
                    }
                }
                text
            }
        };
        match m.role.as_str() {
            "system" | "developer" => match &mut system {
                Some(s) => {
                    s.push('\n');
                    s.push_str(&text);
                }
                None => system = Some(text),
            },
            "user" => out.push(ChatMessage {
                role: Role::User,
                text,
                ..Default::default()
            }),
            "assistant" => out.push(ChatMessage {
                role: Role::Assistant,
                text,
                ..Default::default()
            }),
            other => {
                return Err(Invalid(format!(
                    "messages[{i}]: role {other:?} is not one of system, developer, user, assistant"
                )));
            }
        }
    }
    if out.is_empty() {
        return Err(Invalid(
            "`messages` needs at least one user or assistant message".into(),
        ));
    }
    Ok((system, out))
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::EndOfTurn | FinishReason::StopSequence(_) => "stop",
        FinishReason::MaxTokens => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
    }
}

/// The `usage` object.
pub fn usage(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
        "prompt_tokens_details": { "cached_tokens": cached_tokens },
    })
}

/// An OpenAI error body.
pub fn error(kind: &str, message: &str) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": null, "code": null } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str, endpoint: Endpoint) -> Result<Request, Invalid> {
        Request::parse(body.as_bytes(), endpoint, "m", "r1")
    }

    #[test]
    fn a_chat_request_maps_onto_the_engine() {
        let r = parse(
            r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
                {"role":"user","content":[{"type":"text","text":"Hi"}]}],
                "max_completion_tokens":7,"temperature":0,"stop":"x","stream":true,
                "stream_options":{"include_usage":true},"seed":3}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(r.generate.system.as_deref(), Some("Be brief."));
        assert_eq!(r.generate.messages.len(), 1);
        assert_eq!(r.generate.messages[0].text, "Hi");
        assert_eq!(r.generate.max_tokens, 7);
        assert_eq!(r.generate.stop_sequences, ["x"]);
        assert_eq!(r.generate.sampling.seed, Some(3));
        assert!(r.stream && r.include_usage);
        assert!(r.generate.prompt.is_none());
    }

    #[test]
    fn a_completion_request_is_a_raw_prompt() {
        let r = parse(
            r#"{"prompt":"Once upon","max_tokens":5}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(r.generate.prompt.as_deref(), Some("Once upon"));
        assert_eq!(r.generate.max_tokens, 5);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        for (body, endpoint, says) in [
            ("{", Endpoint::Chat, "not a valid request"),
            (r#"{"messages":[]}"#, Endpoint::Chat, "at least one"),
            (
                r#"{"prompt":"x"}"#,
                Endpoint::Chat,
                "`messages` is required",
            ),
            (
                r#"{"messages":[{"role":"tool","content":"x"}]}"#,
                Endpoint::Chat,
                "role \"tool\"",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                Endpoint::Chat,
                "image_url",
            ),
            (
                r#"{"model":"other","prompt":"x"}"#,
                Endpoint::Completions,
                "serves the model",
            ),
            (r#"{"prompt":""}"#, Endpoint::Completions, "empty"),
            (
                r#"{"prompt":"x","temperature":5}"#,
                Endpoint::Completions,
                "temperature",
            ),
            (
                r#"{"prompt":"x","top_p":0}"#,
                Endpoint::Completions,
                "top_p",
            ),
        ] {
            let Invalid(message) = parse(body, endpoint).unwrap_err();
            assert!(message.contains(says), "{body}: {message}");
        }
    }
}
