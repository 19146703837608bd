//! The Responses door's replies: the stream's events in the API's order, the whole response
//! object (also what the store keeps), and the error event.
//!
//! A stream is `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its part's `content_part.added`, deltas
//! (`output_text.delta`, `reasoning_text.delta`, `function_call_arguments.delta`), the
//! `.done` events with the whole text, `output_item.done` with the whole item, and last
//! `response.completed` (or `.incomplete` when `max_output_tokens` or a filter cut it short,
//! `.failed` when it failed) with the whole response. Every event carries its
//! `sequence_number`. The writer folds what it writes, so the `.done` events and the last
//! response need no second pass, and a finished stream hands its response to the store.

use ringmaster_wire::responses::{
    Echo, IncompleteDetails, InputTokensDetails, OutputItem, OutputPart, OutputTokensDetails,
    Response, ResponseError, ResponseUsage, StreamEvent,
};
use ringmaster_wire::sse;

use super::{ReplyEvent, StopReason, UsablePart, Usage, WholeReply, unix_now};
use crate::error::ApiError;
use crate::request::Request;

/// An output item being written.
#[derive(Debug)]
enum Item {
    Message {
        id: String,
        text: String,
    },
    Reasoning {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        namespace: Option<String>,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Self::Message { id, .. } | Self::Reasoning { id, .. } | Self::Call { id, .. } => id,
        }
    }

    /// The item as written, `done` or still in progress (then with no content yet).
    fn wire(&self, done: bool) -> OutputItem<'_> {
        let status = if done { "completed" } else { "in_progress" };
        match self {
            Self::Message { id, text } => OutputItem::Message {
                id,
                status,
                role: "assistant",
                content: if done {
                    vec![OutputPart::text(text)]
                } else {
                    Vec::new()
                },
            },
            Self::Reasoning { id, text } => OutputItem::Reasoning {
                id,
                status,
                summary: [],
                content: if done {
                    vec![OutputPart::ReasoningText { text }]
                } else {
                    Vec::new()
                },
                encrypted_content: None,
            },
            Self::Call {
                id,
                call_id,
                namespace,
                name,
                arguments,
            } => OutputItem::FunctionCall {
                id,
                status,
                call_id,
                name,
                namespace: namespace.as_deref(),
                arguments: if done { arguments } else { "" },
            },
        }
    }
}

/// The response's shape apart from its output: id, model, echo, status.
#[derive(Debug)]
struct Frame {
    id: String,
    model: String,
    created_at: u64,
    echo: Echo,
    namespaces: Vec<String>,
}

impl Frame {
    fn new(id: String, request: &Request) -> Self {
        let context = request.responses.as_deref();
        Self {
            id,
            model: request.model.clone(),
            created_at: unix_now(),
            echo: context.map(|c| c.echo.clone()).unwrap_or_default(),
            namespaces: context.map(|c| c.namespaces.clone()).unwrap_or_default(),
        }
    }

    fn response<'a>(
        &'a self,
        status: &'a str,
        output: &'a [OutputItem<'a>],
        usage: Option<Usage>,
        ending: Ending<'a>,
    ) -> Response<'a> {
        Response {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            status,
            incomplete_details: match ending {
                Ending::Incomplete(reason) => Some(IncompleteDetails { reason }),
                _ => None,
            },
            error: match ending {
                Ending::Failed(error) => Some(ResponseError {
                    code: failure_code(error),
                    message: error.message(),
                }),
                _ => None,
            },
            model: &self.model,
            output,
            usage: usage.map(response_usage),
            echo: &self.echo,
        }
    }

    /// `(namespace, name)` of a function the model called.
    fn split<'a>(&self, name: &'a str) -> (Option<&'a str>, &'a str) {
        crate::responses::split_namespaced(&self.namespaces, name)
    }
}

/// How a response ended, for its status and details.
#[derive(Clone, Copy, Debug)]
enum Ending<'a> {
    Running,
    Completed,
    Incomplete(&'static str),
    Failed(&'a ApiError),
}

impl Ending<'_> {
    fn status(self) -> &'static str {
        match self {
            Self::Running => "in_progress",
            Self::Completed => "completed",
            Self::Incomplete(_) => "incomplete",
            Self::Failed(_) => "failed",
        }
    }
}

fn ending(reason: StopReason) -> Ending<'static> {
    match reason {
        StopReason::MaxTokens => Ending::Incomplete("max_output_tokens"),
        StopReason::Refusal => Ending::Incomplete("content_filter"),
        StopReason::EndTurn | StopReason::StopSequence | StopReason::ToolUse => Ending::Completed,
    }
}

fn failure_code(error: &ApiError) -> &'static str {
    match error.kind() {
        crate::ErrorKind::RateLimit => "rate_limit_exceeded",
        _ => "server_error",
    }
}

fn response_usage(usage: Usage) -> ResponseUsage {
    ResponseUsage {
        input_tokens: usage.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: usage.cached_tokens,
        },
        output_tokens: usage.output_tokens,
        output_tokens_details: OutputTokensDetails::default(),
        total_tokens: usage.prompt_tokens.saturating_add(usage.output_tokens),
    }
}

/// Writes a reply as the Responses API's stream.
#[derive(Debug)]
pub struct StreamWriter {
    frame: Frame,
    sequence: u64,
    items: Vec<Item>,
    /// The last item is still being written.
    open: bool,
    /// The finished response (the last event's), for the store.
    finished: Option<Vec<u8>>,
}

impl StreamWriter {
    /// The writer of response `id` to `request`.
    pub fn new(id: String, request: &Request) -> Self {
        Self {
            frame: Frame::new(id, request),
            sequence: 0,
            items: Vec::new(),
            open: false,
            finished: None,
        }
    }

    /// The finished response's JSON (the last event's response), once the stream ended.
    pub fn finished_response(&self) -> Option<Vec<u8>> {
        self.finished.clone()
    }

    fn next(&mut self) -> u64 {
        let n = self.sequence;
        self.sequence += 1;
        n
    }

    fn item_id(&self, prefix: &str) -> String {
        let unique = self
            .frame
            .id
            .strip_prefix("resp_")
            .unwrap_or(&self.frame.id);
        format!("{prefix}_{unique}_{}", self.items.len())
    }

    fn output_index(&self) -> u32 {
        u32::try_from(self.items.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Opens `item`: `output_item.added`, and its part's `content_part.added`.
    fn open_item(&mut self, item: Item, out: &mut Vec<u8>) {
        self.close(out);
        self.items.push(item);
        self.open = true;
        let output_index = self.output_index();
        let sequence_number = self.next();
        let Some(item) = self.items.last() else {
            return;
        };
        StreamEvent::OutputItemAdded {
            sequence_number,
            output_index,
            item: item.wire(false),
        }
        .write_sse(out);
        let part = match item {
            Item::Message { .. } => OutputPart::text(""),
            Item::Reasoning { .. } => OutputPart::ReasoningText { text: "" },
            Item::Call { .. } => return,
        };
        let sequence_number = self.next();
        let Some(item) = self.items.last() else {
            return;
        };
        StreamEvent::ContentPartAdded {
            sequence_number,
            item_id: item.id(),
            output_index,
            content_index: 0,
            part,
        }
        .write_sse(out);
    }

    /// Closes the open item: its `.done` events with the whole text or arguments.
    fn close(&mut self, out: &mut Vec<u8>) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let output_index = self.output_index();
        let first = self.next();
        let (second, third) = (first + 1, first + 2);
        let Some(item) = self.items.last() else {
            return;
        };
        let item_id = item.id();
        let used = match item {
            Item::Message { text, .. } => {
                StreamEvent::OutputTextDone {
                    sequence_number: first,
                    item_id,
                    output_index,
                    content_index: 0,
                    text,
                    logprobs: [],
                }
                .write_sse(out);
                StreamEvent::ContentPartDone {
                    sequence_number: second,
                    item_id,
                    output_index,
                    content_index: 0,
                    part: OutputPart::text(text),
                }
                .write_sse(out);
                third
            }
            Item::Reasoning { text, .. } => {
                StreamEvent::ReasoningTextDone {
                    sequence_number: first,
                    item_id,
                    output_index,
                    content_index: 0,
                    text,
                }
                .write_sse(out);
                StreamEvent::ContentPartDone {
                    sequence_number: second,
                    item_id,
                    output_index,
                    content_index: 0,
                    part: OutputPart::ReasoningText { text },
                }
                .write_sse(out);
                third
            }
            Item::Call {
                name, arguments, ..
            } => {
                StreamEvent::FunctionCallArgumentsDone {
                    sequence_number: first,
                    item_id,
                    output_index,
                    name,
                    arguments,
                }
                .write_sse(out);
                second
            }
        };
        StreamEvent::OutputItemDone {
            sequence_number: used,
            output_index,
            item: item.wire(true),
        }
        .write_sse(out);
        self.sequence = used + 1;
    }

    /// The response's last event, and the response kept for the store.
    fn end(&mut self, ending: Ending<'_>, usage: Option<Usage>, out: &mut Vec<u8>) {
        self.close(out);
        let sequence_number = self.next();
        let output: Vec<OutputItem<'_>> = self.items.iter().map(|i| i.wire(true)).collect();
        let response = self.frame.response(ending.status(), &output, usage, ending);
        self.finished = serde_json::to_vec(&response).ok();
        match ending {
            Ending::Failed(_) => StreamEvent::Failed {
                sequence_number,
                response,
            },
            Ending::Incomplete(_) => StreamEvent::Incomplete {
                sequence_number,
                response,
            },
            Ending::Running | Ending::Completed => StreamEvent::Completed {
                sequence_number,
                response,
            },
        }
        .write_sse(out);
    }

    /// More text, or more reasoning: into the open item of its kind, else a new one.
    fn append(&mut self, reasoning: bool, text: &str, out: &mut Vec<u8>) {
        let open_kind = match self.items.last() {
            Some(Item::Reasoning { .. }) if self.open => Some(true),
            Some(Item::Message { .. }) if self.open => Some(false),
            _ => None,
        };
        if open_kind != Some(reasoning) {
            let (prefix, text) = (if reasoning { "rs" } else { "msg" }, String::new());
            let id = self.item_id(prefix);
            let item = if reasoning {
                Item::Reasoning { id, text }
            } else {
                Item::Message { id, text }
            };
            self.open_item(item, out);
        }
        let sequence_number = self.next();
        let output_index = self.output_index();
        let Some(Item::Message { id, text: so_far } | Item::Reasoning { id, text: so_far }) =
            self.items.last_mut()
        else {
            return;
        };
        so_far.push_str(text);
        let (item_id, delta) = (id.as_str(), text);
        let event = if reasoning {
            StreamEvent::ReasoningTextDelta {
                sequence_number,
                item_id,
                output_index,
                content_index: 0,
                delta,
            }
        } else {
            StreamEvent::OutputTextDelta {
                sequence_number,
                item_id,
                output_index,
                content_index: 0,
                delta,
                logprobs: [],
            }
        };
        event.write_sse(out);
    }

    /// Appends what `event` is in the Responses stream.
    pub fn write(&mut self, event: &ReplyEvent<'_>, out: &mut Vec<u8>) {
        match *event {
            ReplyEvent::Start { .. } => {
                let response = self
                    .frame
                    .response("in_progress", &[], None, Ending::Running);
                StreamEvent::Created {
                    sequence_number: 0,
                    response,
                }
                .write_sse(out);
                let response = self
                    .frame
                    .response("in_progress", &[], None, Ending::Running);
                StreamEvent::InProgress {
                    sequence_number: 1,
                    response,
                }
                .write_sse(out);
                self.sequence = 2;
            }
            ReplyEvent::Text(text) => self.append(false, text, out),
            ReplyEvent::Reasoning(text) => self.append(true, text, out),
            ReplyEvent::ToolCallStart { id, name } => {
                let (namespace, name) = self.frame.split(name);
                let item = Item::Call {
                    id: self.item_id("fc"),
                    call_id: id.to_owned(),
                    namespace: namespace.map(str::to_owned),
                    name: name.to_owned(),
                    arguments: String::new(),
                };
                self.open_item(item, out);
            }
            ReplyEvent::ToolArguments(piece) => {
                if !self.open {
                    return;
                }
                let sequence_number = self.next();
                let output_index = self.output_index();
                if let Some(Item::Call { id, arguments, .. }) = self.items.last_mut() {
                    arguments.push_str(piece);
                    StreamEvent::FunctionCallArgumentsDelta {
                        sequence_number,
                        item_id: id,
                        output_index,
                        delta: piece,
                    }
                    .write_sse(out);
                }
            }
            ReplyEvent::Stop { reason, usage, .. } => {
                if self.items.is_empty() {
                    // Nothing was written: the whole response's one empty message.
                    self.write(&ReplyEvent::Text(""), out);
                }
                self.end(ending(reason), Some(usage), out);
            }
            ReplyEvent::Error(error) => self.end(Ending::Failed(error), None, out),
            ReplyEvent::Ping => out.extend_from_slice(sse::KEEP_ALIVE),
        }
    }
}

/// The `error` event of a stream that failed outside a response.
pub fn error_event(error: &ApiError, out: &mut Vec<u8>) {
    StreamEvent::Error {
        sequence_number: 0,
        code: failure_code(error),
        message: error.message(),
        param: None,
    }
    .write_sse(out);
}

/// The whole response `id` to `request`.
pub fn whole_body(reply: &WholeReply, id: &str, request: &Request) -> Result<Vec<u8>, ApiError> {
    let parts = reply.usable_parts()?;
    let frame = Frame::new(id.to_owned(), request);
    let unique = id.strip_prefix("resp_").unwrap_or(id);
    let ids: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let prefix = match part {
                UsablePart::Text(_) => "msg",
                UsablePart::Reasoning(_) => "rs",
                UsablePart::Call(..) => "fc",
            };
            format!("{prefix}_{unique}_{i}")
        })
        .collect();
    let has_calls = parts.iter().any(|p| matches!(p, UsablePart::Call(..)));
    let mut output = Vec::with_capacity(parts.len());
    for (part, item_id) in parts.iter().zip(&ids) {
        match part {
            UsablePart::Text(text) if text.is_empty() && has_calls => {}
            UsablePart::Text(text) => output.push(OutputItem::Message {
                id: item_id,
                status: "completed",
                role: "assistant",
                content: vec![OutputPart::text(text)],
            }),
            UsablePart::Reasoning(text) => output.push(OutputItem::Reasoning {
                id: item_id,
                status: "completed",
                summary: [],
                content: vec![OutputPart::ReasoningText { text }],
                encrypted_content: None,
            }),
            UsablePart::Call(call, arguments) => {
                let (namespace, name) = frame.split(&call.name);
                output.push(OutputItem::FunctionCall {
                    id: item_id,
                    status: "completed",
                    call_id: &call.id,
                    name,
                    namespace,
                    arguments,
                });
            }
        }
    }
    let ending = reply
        .stop
        .as_ref()
        .map_or(Ending::Completed, |(r, _)| ending(*r));
    let response = frame.response(ending.status(), &output, Some(reply.usage), ending);
    Ok(serde_json::to_vec(&response).unwrap_or_default())
}
