//! The Messages door's replies: Anthropic's stream events and whole message.

use ringmaster_wire::anthropic::{
    self, BlockDelta, ContentBlock, ErrorObject, ErrorResponse, MessageDelta, MessageResponse,
    StreamEvent,
};
use serde_json::value::RawValue;

use super::{ReplyEvent, UsablePart, Usage, WholeReply};
use crate::error::ApiError;

/// Anthropic's usage: the input is what was computed, the cache's share apart.
fn usage(usage: Usage) -> anthropic::Usage {
    anthropic::Usage {
        input_tokens: usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        output_tokens: usage.output_tokens,
        cache_read_input_tokens: usage.cached_tokens,
        cache_creation_input_tokens: 0,
    }
}

/// The open content block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text(u32),
    Thinking(u32),
    Tool(u32),
}

/// Writes a reply as Anthropic's stream: `message_start` and a `ping`, a `thinking` block
/// with the reasoning when the client asked for it, a text block opened with the first text,
/// a `tool_use` block per call with `input_json_delta` pieces, `message_delta` with the stop
/// and the usage, `message_stop`. The blocks are the whole reply's, in the same order: no
/// empty text block before a tool call, and one empty text block for a reply with nothing in
/// it, as [`whole_body`] writes them.
#[derive(Debug)]
pub struct StreamWriter {
    id: String,
    model: String,
    show_reasoning: bool,
    open: Option<Open>,
    next_block: u32,
}

impl StreamWriter {
    /// The writer of reply `id` from `model` (`show_reasoning`: the client asked for
    /// thinking).
    pub fn new(id: String, model: String, show_reasoning: bool) -> Self {
        Self {
            id,
            model,
            show_reasoning,
            open: None,
            next_block: 0,
        }
    }

    fn open(&mut self, block: ContentBlock<'_>, out: &mut Vec<u8>) -> u32 {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        self.open = Some(match block {
            ContentBlock::ToolUse { .. } => Open::Tool(index),
            ContentBlock::Thinking { .. } => Open::Thinking(index),
            ContentBlock::Text { .. } => Open::Text(index),
        });
        StreamEvent::ContentBlockStart {
            index,
            content_block: block,
        }
        .write_sse(out);
        index
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(Open::Text(index) | Open::Thinking(index) | Open::Tool(index)) =
            self.open.take()
        {
            StreamEvent::ContentBlockStop { index }.write_sse(out);
        }
    }

    /// Appends `event`'s frames.
    pub fn write(&mut self, event: &ReplyEvent<'_>, out: &mut Vec<u8>) {
        match *event {
            ReplyEvent::Start { usage: counted } => {
                // The output so far is the first token.
                let counted = Usage {
                    output_tokens: 1,
                    ..counted
                };
                StreamEvent::MessageStart {
                    message: MessageResponse::empty(&self.id, &self.model, usage(counted)),
                }
                .write_sse(out);
                StreamEvent::Ping.write_sse(out);
            }
            ReplyEvent::Text(text) => {
                let index = match self.open {
                    Some(Open::Text(index)) => index,
                    _ => self.open(ContentBlock::Text { text: "" }, out),
                };
                anthropic::write_text_delta(out, index, text);
            }
            ReplyEvent::Reasoning(text) => {
                if !self.show_reasoning {
                    return;
                }
                let index = match self.open {
                    Some(Open::Thinking(index)) => index,
                    _ => self.open(
                        ContentBlock::Thinking {
                            thinking: "",
                            signature: "",
                        },
                        out,
                    ),
                };
                StreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::ThinkingDelta { thinking: text },
                }
                .write_sse(out);
            }
            ReplyEvent::ToolCallStart { id, name } => {
                let block = ContentBlock::ToolUse {
                    id,
                    name,
                    input: anthropic::empty_input(),
                };
                self.open(block, out);
            }
            ReplyEvent::ToolArguments(piece) => {
                if let Some(Open::Tool(index)) = self.open
                    && !piece.is_empty()
                {
                    StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJsonDelta {
                            partial_json: piece,
                        },
                    }
                    .write_sse(out);
                }
            }
            ReplyEvent::Stop {
                reason,
                stop_sequence,
                usage: counted,
            } => {
                if self.next_block == 0 {
                    // Nothing was written: the whole reply's one empty text block.
                    self.open(ContentBlock::Text { text: "" }, out);
                }
                self.close(out);
                StreamEvent::MessageDelta {
                    delta: MessageDelta {
                        stop_reason: reason,
                        stop_sequence,
                    },
                    usage: usage(counted),
                }
                .write_sse(out);
                StreamEvent::MessageStop.write_sse(out);
            }
            ReplyEvent::Error(error) => error_event(error, out),
            ReplyEvent::Ping => StreamEvent::Ping.write_sse(out),
        }
    }
}

/// `event: error` with Anthropic's error body.
pub fn error_event(error: &ApiError, out: &mut Vec<u8>) {
    StreamEvent::Error {
        error: ErrorObject {
            kind: error.kind().anthropic_type(),
            message: error.message(),
        },
    }
    .write_sse(out);
}

/// Anthropic's error body.
pub fn error_body(error: &ApiError) -> Vec<u8> {
    serde_json::to_vec(&ErrorResponse::new(
        error.kind().anthropic_type(),
        error.message(),
    ))
    .unwrap_or_default()
}

/// The whole message of reply `id` from `model` (`show_reasoning`: with its thinking).
pub fn whole_body(
    reply: &WholeReply,
    id: &str,
    model: &str,
    show_reasoning: bool,
) -> Result<Vec<u8>, ApiError> {
    let parts = reply.usable_parts()?;
    let has_calls = parts.iter().any(|p| matches!(p, UsablePart::Call(..)));
    let inputs: Vec<Option<Box<RawValue>>> = parts
        .iter()
        .map(|part| match part {
            UsablePart::Call(_, arguments) => RawValue::from_string((*arguments).to_owned()).ok(),
            UsablePart::Text(_) | UsablePart::Reasoning(_) => None,
        })
        .collect();
    let mut content = Vec::with_capacity(parts.len().max(1));
    for (part, input) in parts.iter().zip(&inputs) {
        match (part, input) {
            // An empty text block before a tool call says nothing.
            (UsablePart::Text(text), _) if text.is_empty() && has_calls => {}
            (UsablePart::Text(text), _) => content.push(ContentBlock::Text { text }),
            (UsablePart::Reasoning(thinking), _) if show_reasoning => {
                content.push(ContentBlock::Thinking {
                    thinking,
                    signature: "",
                });
            }
            (UsablePart::Reasoning(_), _) => {}
            (UsablePart::Call(call, _), Some(input)) => content.push(ContentBlock::ToolUse {
                id: &call.id,
                name: &call.name,
                input,
            }),
            (UsablePart::Call(..), None) => {}
        }
    }
    if content.is_empty() {
        content.push(ContentBlock::Text { text: "" });
    }
    let (reason, sequence) = match &reply.stop {
        Some((reason, sequence)) => (Some(*reason), sequence.as_deref()),
        None => (None, None),
    };
    let message = MessageResponse {
        content,
        stop_reason: reason,
        stop_sequence: sequence,
        ..MessageResponse::empty(id, model, usage(reply.usage))
    };
    Ok(serde_json::to_vec(&message).unwrap_or_default())
}
