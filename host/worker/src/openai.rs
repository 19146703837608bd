//! The worker's OpenAI endpoints: a request ([`ringmaster_wire::openai::Request`], read
//! leniently, as OpenAI-compatible servers do) mapped onto the engine's [`GenerateRequest`],
//! and the reply's chunks and whole answer in the wire crate's shapes. Fields that are
//! present must be well-formed; fields the worker does not use are ignored.

use ringmaster_gpu_runtime::{ChatMessage, FinishReason, GenerateRequest, Role, SamplingParams};
use ringmaster_wire::Str;
use ringmaster_wire::openai::{
    self, CHAT_CHUNK, CHAT_COMPLETION, Choice, Chunk, Content, Delta, ErrorResponse, MatchedStop,
    Prompt, ReplyMessage, Stop, TEXT_COMPLETION, Usage,
};

/// `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// A bad request, with the message the client sees.
#[derive(Debug)]
pub struct Invalid(pub String);

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

/// A count from the wire that must fit a `u32`.
fn count(value: Option<i64>, field: &str) -> Result<Option<u32>, Invalid> {
    value
        .map(|n| u32::try_from(n).map_err(|_| Invalid(format!("`{field}` {n} is out of range"))))
        .transpose()
}

impl Request {
    /// Parses and checks a request body for `endpoint` on a worker serving `model`.
    pub fn parse(
        body: &[u8],
        endpoint: Endpoint,
        model: &str,
        request_id: &str,
    ) -> Result<Self, Invalid> {
        let raw: openai::Request<'_> = serde_json::from_slice(body)
            .map_err(|e| Invalid(format!("the request body is not a valid request: {e}")))?;
        if let Some(asked) = &raw.model
            && *asked != *model
        {
            return Err(Invalid(format!(
                "this worker serves the model {model:?}, not {:?}",
                &**asked
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
                let prompt = match raw.prompt {
                    Some(Prompt::Text(text)) => text.into_owned(),
                    _ => return Err(Invalid("`prompt` is required (one string)".into())),
                };
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
            Some(Stop::Text(s)) => vec![s.into_owned()],
            Some(Stop::List(v)) => v.into_iter().map(Str::into_owned).collect(),
        };
        let max_tokens = count(raw.max_completion_tokens, "max_completion_tokens")?
            .or(count(raw.max_tokens, "max_tokens")?)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        let options = raw.stream_options.unwrap_or_default();
        Ok(Self {
            generate: GenerateRequest {
                request_id: request_id.to_owned(),
                system,
                messages,
                max_tokens,
                stop_sequences,
                sampling: SamplingParams {
                    temperature: raw.temperature.map(|t| t as f32),
                    top_p: raw.top_p.map(|p| p as f32),
                    top_k: count(raw.top_k, "top_k")?,
                    seed: raw.seed.and_then(|s| u64::try_from(s).ok()),
                    ignore_eos: raw.ignore_eos.unwrap_or(false),
                },
                prompt,
                priority: raw.ringmaster_priority.unwrap_or(0),
                tools: None,
                effort: None,
                output_format: None,
            },
            stream: raw.stream.unwrap_or(false),
            include_usage: options.include_usage.unwrap_or(false),
            continuous_usage: options.continuous_usage_stats.unwrap_or(false),
        })
    }
}

/// Splits OpenAI messages into the system prompt and the conversation.
fn chat(messages: Vec<openai::Message<'_>>) -> Result<(Option<String>, Vec<ChatMessage>), Invalid> {
    let mut system: Option<String> = None;
    let mut out = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.into_owned(),
            Some(Content::List(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (&*part.kind, part.text) {
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
        match &*m.role {
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

/// OpenAI's `finish_reason` for the engine's own reason. The doors' twin
/// (`ringmaster_api::reply::openai::finish_reason`) maps the door-neutral `StopReason`, which
/// has lost the matched stop sequence this one still carries; the worker builds no door.
pub fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::EndOfTurn | FinishReason::StopSequence(_) => "stop",
        FinishReason::MaxTokens => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
    }
}

/// The `usage` object.
pub fn usage(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Usage {
    Usage::new(prompt_tokens, cached_tokens, output_tokens)
}

/// An OpenAI error body.
pub fn error<'a>(kind: &'a str, message: &'a str) -> ErrorResponse<'a> {
    ErrorResponse::new(kind, message, None)
}

/// What every chunk or answer of one request repeats.
#[derive(Debug)]
pub struct Reply {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// The endpoint (chat or completion shapes).
    pub endpoint: Endpoint,
    /// The model served.
    pub model: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => CHAT_COMPLETION,
            (Endpoint::Chat, true) => CHAT_CHUNK,
            (Endpoint::Completions, _) => TEXT_COMPLETION,
        }
    }

    fn frame<'a>(
        &'a self,
        chunk: bool,
        choice: Option<Choice<'a>>,
        usage: Option<Usage>,
    ) -> Chunk<'a> {
        Chunk {
            id: Some(self.id.as_str().into()),
            object: Some(self.object(chunk).into()),
            created: Some(self.created),
            model: Some(self.model.as_str().into()),
            choices: choice.into_iter().collect(),
            usage,
            ..Chunk::default()
        }
    }

    /// The whole answer: `text`, why it finished, and the usage.
    pub fn whole<'a>(&'a self, text: &'a str, finish: &'a str, usage: Usage) -> Chunk<'a> {
        let choice = match self.endpoint {
            Endpoint::Chat => Choice {
                message: Some(ReplyMessage {
                    role: Some("assistant".into()),
                    content: Some(text.into()),
                    refusal: None,
                    tool_calls: None,
                    reasoning_content: None,
                    reasoning: None,
                }),
                finish_reason: Some(finish.into()),
                ..Choice::default()
            },
            Endpoint::Completions => Choice {
                text: Some(text.into()),
                finish_reason: Some(finish.into()),
                ..Choice::default()
            },
        };
        self.frame(false, Some(choice), Some(usage))
    }

    /// A streamed chunk: text (the first chat chunk, empty, also names the role), or the
    /// finish with the stop sequence that matched (vLLM's `stop_reason`); `usage` so far when
    /// the client asked for it in every chunk.
    pub fn chunk<'a>(
        &'a self,
        text: Option<&'a str>,
        finish: Option<(&'a str, Option<&'a str>)>,
        usage: Option<Usage>,
    ) -> Chunk<'a> {
        let choice = match self.endpoint {
            Endpoint::Chat => Choice {
                delta: Some(match text {
                    Some("") => Delta {
                        role: Some("assistant".into()),
                        content: Some("".into()),
                        ..Delta::default()
                    },
                    Some(t) => Delta {
                        content: Some(t.into()),
                        ..Delta::default()
                    },
                    None => Delta::default(),
                }),
                ..Choice::default()
            },
            Endpoint::Completions => Choice {
                text: Some(text.unwrap_or("").into()),
                ..Choice::default()
            },
        };
        let choice = Choice {
            finish_reason: finish.map(|(reason, _)| reason.into()),
            stop_reason: finish
                .and_then(|(_, matched)| matched)
                .map(|m| MatchedStop::Text(m.into())),
            ..choice
        };
        self.frame(true, Some(choice), usage)
    }

    /// The usage chunk that ends a stream whose client asked for it.
    pub fn usage_chunk(&self, usage: Usage) -> Chunk<'_> {
        self.frame(true, None, Some(usage))
    }
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
                "stream_options":{"include_usage":true},"seed":3,"logprobs":false,"user":"u"}"#,
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
            (
                r#"{"prompt":"x","max_tokens":-1}"#,
                Endpoint::Completions,
                "max_tokens",
            ),
        ] {
            let Invalid(message) = parse(body, endpoint).unwrap_err();
            assert!(message.contains(says), "{body}: {message}");
        }
    }

    #[test]
    fn chunks_name_the_role_first_and_the_matched_stop_last() {
        let reply = Reply {
            id: "chatcmpl-1".into(),
            endpoint: Endpoint::Chat,
            model: "m".into(),
            created: 7,
        };
        let first = serde_json::to_value(reply.chunk(Some(""), None, None)).unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let last =
            serde_json::to_value(reply.chunk(None, Some(("stop", Some("END"))), None)).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["choices"][0]["stop_reason"], "END");
        assert_eq!(last["choices"][0]["delta"], serde_json::json!({}));
    }
}
