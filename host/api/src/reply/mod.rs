//! Replies, door-neutral: the events every reply is made of ([`ReplyEvent`]), written as each
//! door's stream by a [`StreamWriter`], or folded into one [`WholeReply`] that each door
//! writes as its body ([`crate::Door::whole_body`]).
//!
//! The gateway's reply state machine (the safety filter, the token charges) speaks only these
//! events; which door the client came in by is decided here, once. An OpenAI reply never
//! passes through Anthropic's types, and a tool call's arguments stay the JSON text they
//! arrived as.

pub mod messages;
pub mod openai;
pub mod responses;

use crate::Door;
use crate::error::ApiError;

/// Why a reply stopped: the Messages API's stop reasons, which every door's reply maps from
/// (a filter's block, the gateway's or the server's own, is a `Refusal`).
pub use ringmaster_wire::anthropic::StopReason;

/// A reply's token accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every prompt token, cached or not.
    pub prompt_tokens: u32,
    /// Of those, the ones the server's prefix cache held.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
}

/// One event of a reply, borrowing what it carries.
#[derive(Clone, Copy, Debug)]
pub enum ReplyEvent<'a> {
    /// The reply began: the server counted the prompt.
    Start {
        /// The prompt's tokens and the cache's share of them.
        usage: Usage,
    },
    /// Text.
    Text(&'a str),
    /// The model's reasoning, before its answer (a door shows it where its client asked).
    Reasoning(&'a str),
    /// A tool call begins.
    ToolCallStart {
        /// The call's id.
        id: &'a str,
        /// The tool.
        name: &'a str,
    },
    /// More of the open tool call's arguments (JSON text).
    ToolArguments(&'a str),
    /// The reply ended.
    Stop {
        /// Why.
        reason: StopReason,
        /// The stop sequence that matched.
        stop_sequence: Option<&'a str>,
        /// The final accounting.
        usage: Usage,
    },
    /// The reply failed after it began.
    Error(&'a ApiError),
    /// Keep-alive.
    Ping,
}

/// A streamed reply's writer, for its door.
#[derive(Debug)]
pub enum StreamWriter {
    /// Anthropic's events.
    Messages(messages::StreamWriter),
    /// OpenAI's chunks.
    OpenAi(openai::StreamWriter),
    /// The Responses API's events.
    Responses(Box<responses::StreamWriter>),
}

impl StreamWriter {
    /// The writer of a `door` reply `id` from `model` (`include_usage`: OpenAI's last usage
    /// chunk), for a request with nothing else to say about its reply (no reasoning shown,
    /// no Responses settings to echo: [`Door::stream_writer`] knows the request).
    pub fn new(door: Door, id: String, model: String, include_usage: bool) -> Self {
        match door {
            Door::Messages => Self::Messages(messages::StreamWriter::new(id, model, false)),
            Door::Chat | Door::Completions => Self::OpenAi(openai::StreamWriter::new(
                id,
                model,
                door == Door::Chat,
                include_usage,
            )),
            Door::Responses => Self::Responses(Box::new(responses::StreamWriter::new(
                id,
                &crate::Request::new(Door::Responses, model),
            ))),
        }
    }

    /// Appends `event` as this door writes it (some events are nothing on some doors).
    pub fn write(&mut self, event: &ReplyEvent<'_>, out: &mut Vec<u8>) {
        match self {
            Self::Messages(writer) => writer.write(event, out),
            Self::OpenAi(writer) => writer.write(event, out),
            Self::Responses(writer) => writer.write(event, out),
        }
    }

    /// The response a finished Responses stream made (the object `GET /v1/responses/{id}`
    /// returns), for the response store; `None` on other doors and before the end.
    pub fn finished_response(&self) -> Option<Vec<u8>> {
        match self {
            Self::Responses(writer) => writer.finished_response(),
            _ => None,
        }
    }

    /// The reply is a relay of the server's own chunks (its door is the server's), `finish`
    /// once the server's finishing chunk went out: from now on only what those lack is
    /// written. Nothing changes for a door that cannot relay.
    pub fn relay_from(&mut self, finish: bool) {
        if let Self::OpenAi(writer) = self {
            writer.relay_from(finish);
        }
    }
}

/// A tool call of a whole reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WholeCall {
    /// Its id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, the JSON text its pieces made.
    pub arguments: String,
}

/// A piece of a whole reply, in order: text, reasoning, or a tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WholePart {
    /// Text.
    Text(String),
    /// The model's reasoning.
    Reasoning(String),
    /// A tool call.
    Call(WholeCall),
}

/// A reply folded into one message, for a client that asked for no stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WholeReply {
    /// The text and the tool calls, in order.
    pub parts: Vec<WholePart>,
    /// Why it stopped, and the stop sequence that matched (`None`: it never stopped).
    pub stop: Option<(StopReason, Option<String>)>,
    /// The accounting.
    pub usage: Usage,
}

impl WholeReply {
    /// Folds one more event in.
    pub fn push(&mut self, event: &ReplyEvent<'_>) {
        match *event {
            ReplyEvent::Start { usage } => {
                self.usage = usage;
                self.parts.push(WholePart::Text(String::new()));
            }
            ReplyEvent::Text(text) => match self.parts.last_mut() {
                Some(WholePart::Text(so_far)) => so_far.push_str(text),
                _ => self.parts.push(WholePart::Text(text.to_owned())),
            },
            ReplyEvent::Reasoning(text) => {
                // The reasoning comes before the answer: an empty text part opened at the
                // start gives way to it.
                if matches!(self.parts.last(), Some(WholePart::Text(t)) if t.is_empty()) {
                    self.parts.pop();
                }
                match self.parts.last_mut() {
                    Some(WholePart::Reasoning(so_far)) => so_far.push_str(text),
                    _ => self.parts.push(WholePart::Reasoning(text.to_owned())),
                }
            }
            ReplyEvent::ToolCallStart { id, name } => self.parts.push(WholePart::Call(WholeCall {
                id: id.to_owned(),
                name: name.to_owned(),
                arguments: String::new(),
            })),
            ReplyEvent::ToolArguments(piece) => {
                if let Some(WholePart::Call(call)) = self.parts.last_mut() {
                    call.arguments.push_str(piece);
                }
            }
            ReplyEvent::Stop {
                reason,
                stop_sequence,
                usage,
            } => {
                self.stop = Some((reason, stop_sequence.map(str::to_owned)));
                self.usage = usage;
            }
            ReplyEvent::Error(_) | ReplyEvent::Ping => {}
        }
    }

    /// The text, all of it.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|part| match part {
                WholePart::Text(text) => Some(text.as_str()),
                WholePart::Reasoning(_) | WholePart::Call(_) => None,
            })
            .collect()
    }

    /// Whether the model called a tool.
    pub fn has_calls(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, WholePart::Call(_)))
    }

    /// The parts a client gets, each call's arguments checked: no calls after a refusal (the
    /// filter may have cut their input off, and the reply stopped for the refusal, not to use
    /// tools); a call's arguments a JSON object (`{}` when empty), else the reply fails, as the
    /// client could not use them.
    pub(crate) fn usable_parts(&self) -> Result<Vec<UsablePart<'_>>, ApiError> {
        let refused = matches!(self.stop, Some((StopReason::Refusal, _)));
        let mut usable = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part {
                WholePart::Text(text) => usable.push(UsablePart::Text(text)),
                WholePart::Reasoning(text) => usable.push(UsablePart::Reasoning(text)),
                WholePart::Call(_) if refused => {}
                WholePart::Call(call) => {
                    let arguments = call.arguments.trim();
                    if arguments.is_empty() {
                        usable.push(UsablePart::Call(call, "{}"));
                        continue;
                    }
                    match serde_json::from_str::<&serde_json::value::RawValue>(arguments) {
                        Ok(raw) if crate::rules::is_object(raw) => {
                            usable.push(UsablePart::Call(call, arguments));
                        }
                        _ => {
                            return Err(ApiError::internal(format!(
                                "the GPU server called the tool {:?} with arguments that are not \
                                 a JSON object: {:?}",
                                call.name, call.arguments
                            )));
                        }
                    }
                }
            }
        }
        Ok(usable)
    }
}

/// A part of a whole reply as a client gets it: text, or a call with its arguments checked.
#[derive(Clone, Copy, Debug)]
pub(crate) enum UsablePart<'a> {
    /// Text.
    Text(&'a str),
    /// Reasoning.
    Reasoning(&'a str),
    /// A call, and its arguments (a JSON object's text).
    Call(&'a WholeCall, &'a str),
}

/// Seconds since the Unix epoch, for OpenAI's `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
