//! The OpenAI doors' replies: chat and completion chunks, whole answers, the error body and
//! status.

use ringmaster_wire::openai::{
    self, CHAT_CHUNK, CHAT_COMPLETION, Choice, Chunk, Delta, ErrorResponse, FunctionCall,
    ReplyMessage, TEXT_COMPLETION, ToolCall,
};
use ringmaster_wire::{Str, sse};

use super::{ReplyEvent, StopReason, UsablePart, Usage, WholeReply, unix_now};
use crate::error::{ApiError, ErrorKind};

/// OpenAI's `finish_reason`.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::MaxTokens => "length",
        StopReason::Refusal => "content_filter",
        StopReason::ToolUse => "tool_calls",
    }
}

fn usage(usage: Usage) -> openai::Usage {
    openai::Usage::new(
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.output_tokens,
    )
}

/// Writes a reply as OpenAI's stream: a role chunk (chat), text chunks, tool-call pieces by
/// their ordinal `index` (chat), the finishing chunk, the usage chunk when asked for, and
/// `data: [DONE]`.
#[derive(Debug)]
pub struct StreamWriter {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    include_usage: bool,
    /// Tool calls so far: the next one's `index`.
    calls: u32,
    /// The frame of a text piece, its fixed parts written once.
    text: openai::TextFrame,
    /// Relaying a server's own chunks: only what they lack is written (the role, text and
    /// tool chunks never; the finish unless the server's came). `None`: everything.
    relay: Option<Relayed>,
}

/// What a relayed server reply has already sent.
#[derive(Clone, Copy, Debug)]
struct Relayed {
    /// The server's chunk with the finish went out.
    finish: bool,
}

impl StreamWriter {
    /// A writer of reply `id` from `model`, a chat's (else a completion's).
    pub fn new(id: String, model: String, chat: bool, include_usage: bool) -> Self {
        let created = unix_now();
        Self {
            text: openai::TextFrame::new(&id, &model, created, chat),
            id,
            model,
            created,
            chat,
            include_usage,
            calls: 0,
            relay: None,
        }
    }

    /// See [`super::StreamWriter::relay_from`].
    pub fn relay_from(&mut self, finish: bool) {
        self.relay = Some(Relayed { finish });
    }

    fn chunk<'a>(&'a self, choice: Option<Choice<'a>>, usage: Option<openai::Usage>) -> Chunk<'a> {
        Chunk {
            id: Some(Str::from(self.id.as_str())),
            object: Some(Str::from(if self.chat {
                CHAT_CHUNK
            } else {
                TEXT_COMPLETION
            })),
            created: Some(self.created),
            model: Some(Str::from(self.model.as_str())),
            choices: choice.into_iter().collect(),
            usage,
            ..Chunk::default()
        }
    }

    /// A chunk with a chat delta, or a completion's text.
    fn content(
        &self,
        delta: Delta<'_>,
        text: Option<&str>,
        finish: Option<&'static str>,
        out: &mut Vec<u8>,
    ) {
        let choice = if self.chat {
            Choice {
                delta: Some(delta),
                finish_reason: finish.map(Str::from),
                ..Choice::default()
            }
        } else {
            Choice {
                text: Some(Str::from(text.unwrap_or(""))),
                finish_reason: finish.map(Str::from),
                ..Choice::default()
            }
        };
        sse::data(out, &self.chunk(Some(choice), None));
    }

    fn finish(&self, reason: StopReason, counted: Usage, out: &mut Vec<u8>) {
        if !self.relay.is_some_and(|r| r.finish) {
            self.content(Delta::default(), Some(""), Some(finish_reason(reason)), out);
        }
        if self.include_usage {
            sse::data(out, &self.chunk(None, Some(usage(counted))));
        }
        out.extend_from_slice(openai::DONE);
    }

    /// Appends what `event` is in OpenAI's stream (some events are nothing there).
    pub fn write(&mut self, event: &ReplyEvent<'_>, out: &mut Vec<u8>) {
        let relayed = self.relay.is_some();
        match *event {
            // The server's chunks carried these.
            ReplyEvent::Start { .. }
            | ReplyEvent::Text(_)
            | ReplyEvent::Reasoning(_)
            | ReplyEvent::ToolCallStart { .. }
            | ReplyEvent::ToolArguments(_)
                if relayed => {}
            ReplyEvent::Start { .. } => {
                if self.chat {
                    let delta = Delta {
                        role: Some("assistant".into()),
                        content: Some("".into()),
                        ..Delta::default()
                    };
                    self.content(delta, None, None, out);
                }
            }
            ReplyEvent::Text(text) => self.text.write(out, text),
            // vLLM's and SGLang's field for it (a completion has no place for it).
            ReplyEvent::Reasoning(text) => {
                if self.chat {
                    let delta = Delta {
                        reasoning_content: Some(text.into()),
                        ..Delta::default()
                    };
                    self.content(delta, None, None, out);
                }
            }
            ReplyEvent::ToolCallStart { id, name } => {
                if self.chat {
                    let call = ToolCall {
                        index: Some(self.calls),
                        id: Some(id.into()),
                        kind: Some("function".into()),
                        function: Some(FunctionCall {
                            name: Some(name.into()),
                            arguments: Some(openai::Arguments::Text("".into())),
                        }),
                    };
                    self.calls += 1;
                    let delta = Delta {
                        tool_calls: Some(vec![call]),
                        ..Delta::default()
                    };
                    self.content(delta, None, None, out);
                }
            }
            ReplyEvent::ToolArguments(piece) => {
                if self.chat && self.calls > 0 {
                    let call = ToolCall {
                        index: Some(self.calls - 1),
                        function: Some(FunctionCall {
                            name: None,
                            arguments: Some(openai::Arguments::Text(piece.into())),
                        }),
                        ..ToolCall::default()
                    };
                    let delta = Delta {
                        tool_calls: Some(vec![call]),
                        ..Delta::default()
                    };
                    self.content(delta, None, None, out);
                }
            }
            ReplyEvent::Stop { reason, usage, .. } => self.finish(reason, usage, out),
            ReplyEvent::Error(error) => error_event(error, out),
            ReplyEvent::Ping => out.extend_from_slice(sse::KEEP_ALIVE),
        }
    }
}

/// OpenAI's status for an error: Anthropic's, but `503` for the non-standard `529`.
pub fn error_status(error: &ApiError) -> http::StatusCode {
    match error.kind() {
        ErrorKind::Overloaded => http::StatusCode::SERVICE_UNAVAILABLE,
        kind => kind.status(),
    }
}

/// OpenAI's error type and code for an error.
fn error_type(error: &ApiError) -> (&'static str, Option<&'static str>) {
    match error.kind() {
        ErrorKind::InvalidRequest
        | ErrorKind::UnsupportedMediaType
        | ErrorKind::MethodNotAllowed
        | ErrorKind::Conflict
        | ErrorKind::RequestTooLarge => ("invalid_request_error", None),
        ErrorKind::RequestTimeout => ("invalid_request_error", Some("request_timeout")),
        ErrorKind::Authentication => ("invalid_request_error", Some("invalid_api_key")),
        ErrorKind::PermissionDenied => ("invalid_request_error", Some("model_not_allowed")),
        ErrorKind::NotFound => ("invalid_request_error", Some("not_found")),
        ErrorKind::RateLimit => ("rate_limit_error", Some("rate_limit_exceeded")),
        ErrorKind::Api => ("server_error", None),
        ErrorKind::Overloaded | ErrorKind::Unavailable => ("server_error", Some("overloaded")),
    }
}

/// OpenAI's error body: `{"error":{"message","type","param","code"}}`.
pub fn error_body(error: &ApiError) -> Vec<u8> {
    let (kind, code) = error_type(error);
    serde_json::to_vec(&ErrorResponse::new(kind, error.message(), code)).unwrap_or_default()
}

/// The error as a stream's chunk.
pub fn error_event(error: &ApiError, out: &mut Vec<u8>) {
    let (kind, code) = error_type(error);
    sse::data(out, &ErrorResponse::new(kind, error.message(), code));
}

/// The whole answer of reply `id` from `model`, a chat's (else a completion's).
pub fn whole_body(
    reply: &WholeReply,
    id: &str,
    model: &str,
    chat: bool,
) -> Result<Vec<u8>, ApiError> {
    let parts = reply.usable_parts()?;
    let text = reply.text();
    let reasoning: String = parts
        .iter()
        .filter_map(|part| match part {
            UsablePart::Reasoning(text) => Some(*text),
            _ => None,
        })
        .collect();
    let finish = reply
        .stop
        .as_ref()
        .map(|(reason, _)| finish_reason(*reason));
    let choice = if chat {
        let calls: Vec<ToolCall<'_>> = parts
            .iter()
            .filter_map(|part| match part {
                UsablePart::Call(call, arguments) => Some(ToolCall {
                    index: None,
                    id: Some(call.id.as_str().into()),
                    kind: Some("function".into()),
                    function: Some(FunctionCall {
                        name: Some(call.name.as_str().into()),
                        arguments: Some(openai::Arguments::Text((*arguments).into())),
                    }),
                }),
                UsablePart::Text(_) | UsablePart::Reasoning(_) => None,
            })
            .collect();
        // OpenAI's shape: no content beside the calls unless the model wrote some.
        let content = (calls.is_empty() || !text.is_empty()).then(|| Str::from(text.as_str()));
        Choice {
            message: Some(ReplyMessage {
                role: Some("assistant".into()),
                content,
                refusal: None,
                tool_calls: (!calls.is_empty()).then_some(calls),
                reasoning_content: (!reasoning.is_empty()).then(|| reasoning.as_str().into()),
                reasoning: None,
            }),
            finish_reason: finish.map(Str::from),
            ..Choice::default()
        }
    } else {
        Choice {
            text: Some(text.as_str().into()),
            finish_reason: finish.map(Str::from),
            ..Choice::default()
        }
    };
    let answer = Chunk {
        id: Some(id.into()),
        object: Some(
            if chat {
                CHAT_COMPLETION
            } else {
                TEXT_COMPLETION
            }
            .into(),
        ),
        created: Some(unix_now()),
        model: Some(model.into()),
        choices: vec![choice],
        usage: Some(usage(reply.usage)),
        ..Chunk::default()
    };
    Ok(serde_json::to_vec(&answer).unwrap_or_default())
}
