//! Replies of servers that speak Anthropic's Messages API or OpenAI's Responses API, as the
//! same engine events a chat server's chunks become ([`super::chunks`]), and [`Decoder`], the
//! one decoder a reader holds whatever the server's API.
//!
//! A Messages server's stream is `message_start` (the prompt's usage), content blocks
//! (`text`, `thinking`, `tool_use` with `input_json_delta` pieces), `message_delta` (the stop
//! reason and the output count) and `message_stop`; a Responses server's is
//! `response.created`, output items (messages, reasoning, function calls) with their deltas,
//! and `response.completed` (or `.incomplete`, `.failed`) with the usage. Both also come
//! whole (the message, the response object). An `error` event, a failed response or
//! malformed JSON ends the reply as [`GenerateEvent::Failed`]; so does a body that ends
//! before the last event.

use ringmaster_gpu_runtime::{FinishReason, GenerateEvent};
use ringmaster_wire::{Api, anthropic, responses};

use super::chunks::{ChunkKind, ReplyDecoder};
use super::tally::Tally;

/// A Messages server's reply.
#[derive(Debug, Default)]
pub struct MessagesDecoder {
    tally: Tally,
    /// Per block index: the call's number when the block is a `tool_use`.
    calls: Vec<(u32, u32)>,
    next_call: u32,
}

impl MessagesDecoder {
    fn usage(&mut self, usage: Option<anthropic::UsageIn>) {
        let Some(usage) = usage else {
            return;
        };
        // Anthropic counts the prompt apart from what the cache held.
        if usage.input_tokens.is_some() || usage.cache_read_input_tokens.is_some() {
            let cached = usage.cache_read_input_tokens.unwrap_or(0);
            let prompt = usage.input_tokens.unwrap_or(0)
                + cached
                + usage.cache_creation_input_tokens.unwrap_or(0);
            self.tally.prompt = Some(prompt);
            self.tally.cached = Some(cached);
        }
        if usage.output_tokens.is_some() {
            self.tally.output = usage.output_tokens;
        }
    }

    fn stop(&mut self, reason: Option<&str>, sequence: Option<&str>) {
        let Some(reason) = reason else {
            return;
        };
        self.tally.finish = Some(match reason {
            "max_tokens" | "model_context_window_exceeded" => FinishReason::MaxTokens,
            "tool_use" => FinishReason::ToolCalls,
            "refusal" => FinishReason::ContentFilter,
            "stop_sequence" => match sequence {
                Some(s) if !s.is_empty() => FinishReason::StopSequence(s.to_owned()),
                _ => FinishReason::EndOfTurn,
            },
            // end_turn, pause_turn, and anything newer.
            _ => FinishReason::EndOfTurn,
        });
    }

    fn block(&mut self, index: u32, block: anthropic::BlockIn<'_>, out: &mut Vec<GenerateEvent>) {
        match block.kind.as_deref() {
            Some("text") => {
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    self.tally.push(
                        GenerateEvent::Token {
                            text: text.into_owned(),
                        },
                        out,
                    );
                }
            }
            Some("thinking") => {
                if let Some(text) = block.thinking.filter(|t| !t.is_empty()) {
                    self.tally.push(
                        GenerateEvent::Reasoning {
                            text: text.into_owned(),
                        },
                        out,
                    );
                }
            }
            Some("tool_use") => {
                let call = self.next_call;
                self.next_call += 1;
                self.calls.push((index, call));
                // A stream's block starts with `{}` and sends its input as deltas; a whole
                // answer's block carries it.
                let arguments = block
                    .input
                    .map(|input| input.get())
                    .filter(|input| *input != "{}")
                    .unwrap_or_default()
                    .to_owned();
                self.tally.push(
                    GenerateEvent::ToolCall {
                        index: call,
                        id: block.id.map(|id| id.into_owned()),
                        name: block.name.map(|n| n.into_owned()),
                        arguments,
                    },
                    out,
                );
            }
            _ => {}
        }
    }

    /// One SSE event's data, or a whole answer.
    pub fn data(&mut self, data: &[u8], out: &mut Vec<GenerateEvent>) {
        if self.tally.done {
            return;
        }
        let event = match serde_json::from_slice::<anthropic::StreamEventIn<'_>>(data) {
            Ok(event) => event,
            Err(e) => {
                self.tally
                    .fail(format!("the server sent malformed JSON: {e}"), out);
                return;
            }
        };
        match event.kind.as_deref() {
            Some("message_start") => {
                if let Some(message) = event.message {
                    if self.tally.reply_id.is_none() {
                        self.tally.reply_id = message.id.map(|id| id.into_owned());
                    }
                    self.usage(message.usage);
                }
                self.tally.start(out);
            }
            Some("content_block_start") => {
                if let Some(block) = event.content_block {
                    self.block(event.index.unwrap_or(0), block, out);
                }
            }
            Some("content_block_delta") => {
                let Some(delta) = event.delta else {
                    return;
                };
                let index = event.index.unwrap_or(0);
                match delta.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(text) = delta.text.filter(|t| !t.is_empty()) {
                            self.tally.push(
                                GenerateEvent::Token {
                                    text: text.into_owned(),
                                },
                                out,
                            );
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(text) = delta.thinking.filter(|t| !t.is_empty()) {
                            self.tally.push(
                                GenerateEvent::Reasoning {
                                    text: text.into_owned(),
                                },
                                out,
                            );
                        }
                    }
                    Some("input_json_delta") => {
                        let call = self.calls.iter().find(|(i, _)| *i == index).map(|c| c.1);
                        if let (Some(call), Some(piece)) = (call, delta.partial_json) {
                            self.tally.push(
                                GenerateEvent::ToolCall {
                                    index: call,
                                    id: None,
                                    name: None,
                                    arguments: piece.into_owned(),
                                },
                                out,
                            );
                        }
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                self.usage(event.usage);
                if let Some(delta) = event.delta {
                    self.stop(delta.stop_reason.as_deref(), delta.stop_sequence.as_deref());
                }
            }
            Some("message_stop") => self.tally.end(out, true),
            Some("error") => {
                let message = event
                    .error
                    .and_then(|e| e.message)
                    .map_or_else(|| "(no message)".to_owned(), |m| m.into_owned());
                self.tally
                    .fail(format!("the GPU server reported an error: {message}"), out);
            }
            // A whole answer: the message itself.
            Some("message") => {
                if self.tally.reply_id.is_none()
                    && let Some(id) = event.message.as_ref().and_then(|m| m.id.as_ref())
                {
                    self.tally.reply_id = Some(id.to_string());
                }
                self.usage(event.usage);
                self.tally.start(out);
                for (i, block) in event.content.unwrap_or_default().into_iter().enumerate() {
                    self.block(u32::try_from(i).unwrap_or(u32::MAX), block, out);
                }
                self.stop(event.stop_reason.as_deref(), event.stop_sequence.as_deref());
                self.tally.end(out, true);
            }
            // `ping`, and events of newer versions.
            _ => {}
        }
    }
}

/// A Responses server's reply.
#[derive(Debug, Default)]
pub struct ResponsesDecoder {
    tally: Tally,
    /// The open function call's number, and whether its arguments came as deltas.
    call: Option<(u32, bool)>,
    next_call: u32,
}

impl ResponsesDecoder {
    fn usage(&mut self, usage: Option<responses::UsageIn>) {
        let Some(usage) = usage else {
            return;
        };
        self.tally.prompt = usage.input_tokens.or(self.tally.prompt);
        self.tally.output = usage.output_tokens.or(self.tally.output);
        if let Some(cached) = usage.input_tokens_details.and_then(|d| d.cached_tokens) {
            self.tally.cached = Some(cached);
        }
    }

    /// A function call's name as servers see it: `NAMESPACE__NAME` inside a namespace.
    fn call_name(item: &responses::ItemIn<'_>) -> Option<String> {
        let name = item.name.as_deref()?;
        Some(match item.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(namespace) => format!("{namespace}__{name}"),
            None => name.to_owned(),
        })
    }

    /// An item begins (or, `whole`, comes whole).
    fn item(&mut self, item: responses::ItemIn<'_>, whole: bool, out: &mut Vec<GenerateEvent>) {
        match item.kind.as_deref() {
            Some("function_call") => {
                let call = self.next_call;
                self.next_call += 1;
                let arguments = if whole {
                    item.arguments.as_deref().unwrap_or_default().to_owned()
                } else {
                    String::new()
                };
                let name = Self::call_name(&item);
                self.tally.push(
                    GenerateEvent::ToolCall {
                        index: call,
                        id: item.call_id.map(|id| id.into_owned()),
                        name,
                        arguments,
                    },
                    out,
                );
                self.call = (!whole).then_some((call, false));
            }
            Some("message" | "reasoning") if whole => {
                let reasoning = item.kind.as_deref() == Some("reasoning");
                for part in item.content.unwrap_or_default() {
                    let Some(text) = part.text.filter(|t| !t.is_empty()) else {
                        continue;
                    };
                    let text = text.into_owned();
                    let event = if reasoning {
                        GenerateEvent::Reasoning { text }
                    } else {
                        GenerateEvent::Token { text }
                    };
                    self.tally.push(event, out);
                }
            }
            _ => {}
        }
    }

    /// The response ended as `status` says (`reason`: why it is incomplete).
    fn ended(&mut self, status: Option<&str>, reason: Option<&str>, out: &mut Vec<GenerateEvent>) {
        match (status, reason) {
            (Some("failed"), _) => {}
            (Some("incomplete"), Some("content_filter")) => {
                self.tally.finish = Some(FinishReason::ContentFilter);
            }
            (Some("incomplete"), _) => self.tally.finish = Some(FinishReason::MaxTokens),
            _ if self.next_call > 0 => self.tally.finish = Some(FinishReason::ToolCalls),
            _ => self.tally.finish = Some(FinishReason::EndOfTurn),
        }
        self.tally.end(out, true);
    }

    /// One SSE event's data, or a whole answer.
    pub fn data(&mut self, data: &[u8], out: &mut Vec<GenerateEvent>) {
        if self.tally.done {
            return;
        }
        let event = match serde_json::from_slice::<responses::StreamEventIn<'_>>(data) {
            Ok(event) => event,
            Err(e) => {
                self.tally
                    .fail(format!("the server sent malformed JSON: {e}"), out);
                return;
            }
        };
        let Some(kind) = event.kind.as_deref() else {
            return self.whole(event, out);
        };
        match kind {
            "response.created" | "response.in_progress" => {
                if self.tally.reply_id.is_none()
                    && let Some(id) = event.response.as_ref().and_then(|r| r.id.as_ref())
                {
                    self.tally.reply_id = Some(id.to_string());
                }
                self.tally.start(out);
            }
            "response.output_item.added" => {
                if let Some(item) = event.item {
                    self.item(item, false, out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(text) = event.delta.filter(|t| !t.is_empty()) {
                    self.tally.push(
                        GenerateEvent::Token {
                            text: text.into_owned(),
                        },
                        out,
                    );
                }
            }
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                if let Some(text) = event.delta.filter(|t| !t.is_empty()) {
                    self.tally.push(
                        GenerateEvent::Reasoning {
                            text: text.into_owned(),
                        },
                        out,
                    );
                }
            }
            "response.function_call_arguments.delta" => {
                if let (Some((call, _)), Some(piece)) = (self.call, event.delta) {
                    self.call = Some((call, true));
                    self.tally.push(
                        GenerateEvent::ToolCall {
                            index: call,
                            id: None,
                            name: None,
                            arguments: piece.into_owned(),
                        },
                        out,
                    );
                }
            }
            "response.output_item.done" => {
                // A server that sent a call's arguments only whole.
                if let (Some((call, false)), Some(item)) = (self.call.take(), event.item)
                    && let Some(arguments) = item.arguments.filter(|a| !a.is_empty())
                {
                    self.tally.push(
                        GenerateEvent::ToolCall {
                            index: call,
                            id: None,
                            name: None,
                            arguments: arguments.into_owned(),
                        },
                        out,
                    );
                }
                self.call = None;
            }
            "response.completed" | "response.incomplete" => {
                let response = event.response.unwrap_or_default();
                self.usage(response.usage);
                let reason = response
                    .incomplete_details
                    .and_then(|d| d.reason)
                    .map(|r| r.into_owned());
                let status = if kind == "response.incomplete" {
                    "incomplete"
                } else {
                    "completed"
                };
                self.ended(Some(status), reason.as_deref(), out);
            }
            "response.failed" => {
                let message = event
                    .response
                    .and_then(|r| r.error)
                    .and_then(|e| e.message)
                    .map_or_else(|| "(no message)".to_owned(), |m| m.into_owned());
                self.tally
                    .fail(format!("the GPU server reported an error: {message}"), out);
            }
            "error" => {
                let message = event
                    .message
                    .or(event.error.and_then(|e| e.message))
                    .map_or_else(|| "(no message)".to_owned(), |m| m.into_owned());
                self.tally
                    .fail(format!("the GPU server reported an error: {message}"), out);
            }
            _ => {}
        }
    }

    /// A whole answer: the response object.
    fn whole(&mut self, response: responses::StreamEventIn<'_>, out: &mut Vec<GenerateEvent>) {
        if let Some(error) = response.error.and_then(|e| e.message) {
            self.tally
                .fail(format!("the GPU server reported an error: {error}"), out);
            return;
        }
        self.tally.reply_id = response.id.map(|id| id.into_owned());
        self.usage(response.usage);
        self.tally.start(out);
        for item in response.output.unwrap_or_default() {
            self.item(item, true, out);
        }
        let reason = response
            .incomplete_details
            .and_then(|d| d.reason)
            .map(|r| r.into_owned());
        let status = response.status.map(|s| s.into_owned());
        self.ended(status.as_deref(), reason.as_deref(), out);
    }
}

/// The decoder of a reply, for the API its server speaks.
#[derive(Debug)]
pub enum Decoder {
    /// OpenAI chat and completion chunks.
    Chat(ReplyDecoder),
    /// Anthropic's Messages events.
    Messages(MessagesDecoder),
    /// OpenAI's Responses events.
    Responses(ResponsesDecoder),
}

impl Decoder {
    /// The decoder of `api`'s replies.
    pub fn of(api: Api) -> Self {
        match api {
            Api::Chat => Self::Chat(ReplyDecoder::default()),
            Api::Messages => Self::Messages(MessagesDecoder::default()),
            Api::Responses => Self::Responses(ResponsesDecoder::default()),
        }
    }

    /// The decoder of `api`'s replies when the server's own bytes go to the client: a chat
    /// reply's text is counted, not copied ([`ReplyDecoder::relaying`]).
    pub fn relaying(api: Api) -> Self {
        match api {
            Api::Chat => Self::Chat(ReplyDecoder::relaying()),
            api => Self::of(api),
        }
    }

    /// One SSE event's data; says what it was (only a chat server's chunks can be relayed).
    pub fn data(&mut self, data: &[u8], out: &mut Vec<GenerateEvent>) -> ChunkKind {
        match self {
            Self::Chat(decoder) => decoder.data(data, out),
            Self::Messages(decoder) => {
                decoder.data(data, out);
                ChunkKind::Other
            }
            Self::Responses(decoder) => {
                decoder.data(data, out);
                ChunkKind::Other
            }
        }
    }

    /// A whole answer.
    pub fn whole(&mut self, body: &[u8], out: &mut Vec<GenerateEvent>) {
        match self {
            Self::Chat(decoder) => decoder.whole(body, out),
            Self::Messages(decoder) => {
                decoder.data(body, out);
                decoder.tally.end(out, false);
            }
            Self::Responses(decoder) => {
                decoder.data(body, out);
                decoder.tally.end(out, false);
            }
        }
    }

    /// The body ended.
    pub fn end_of_body(&mut self, out: &mut Vec<GenerateEvent>) {
        match self {
            Self::Chat(decoder) => decoder.end_of_body(out),
            Self::Messages(decoder) => decoder.tally.end(out, false),
            Self::Responses(decoder) => decoder.tally.end(out, false),
        }
    }

    /// The reply broke off.
    pub fn fail(&mut self, message: String, out: &mut Vec<GenerateEvent>) {
        match self {
            Self::Chat(decoder) => decoder.fail(message, out),
            Self::Messages(decoder) => decoder.tally.fail(message, out),
            Self::Responses(decoder) => decoder.tally.fail(message, out),
        }
    }

    /// Whether the last event was produced.
    pub fn is_done(&self) -> bool {
        match self {
            Self::Chat(decoder) => decoder.is_done(),
            Self::Messages(decoder) => decoder.tally.done,
            Self::Responses(decoder) => decoder.tally.done,
        }
    }

    /// Whether the output count is this decoder's own.
    pub fn counted_output(&self) -> bool {
        match self {
            Self::Chat(decoder) => decoder.counted_output(),
            Self::Messages(decoder) => decoder.tally.output.is_none(),
            Self::Responses(decoder) => decoder.tally.output.is_none(),
        }
    }

    /// The server's id of the reply.
    pub fn reply_id(&self) -> Option<&str> {
        match self {
            Self::Chat(decoder) => decoder.reply_id(),
            Self::Messages(decoder) => decoder.tally.reply_id.as_deref(),
            Self::Responses(decoder) => decoder.tally.reply_id.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(api: Api, frames: &[&str]) -> Vec<GenerateEvent> {
        let mut decoder = Decoder::of(api);
        let mut out = Vec::new();
        for frame in frames {
            decoder.data(frame.as_bytes(), &mut out);
        }
        decoder.end_of_body(&mut out);
        out
    }

    fn token(text: &str) -> GenerateEvent {
        GenerateEvent::Token { text: text.into() }
    }

    #[test]
    fn a_messages_stream_with_thinking_and_a_tool_call() {
        let events = decode(
            Api::Messages,
            &[
                r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":10,"cache_read_input_tokens":30,"output_tokens":1}}}"#,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hm."}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Running."}}"#,
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}"#,
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\":"}}"#,
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"ls\"}"}}"#,
                r#"{"type":"ping"}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}"#,
                r#"{"type":"message_stop"}"#,
            ],
        );
        assert_eq!(
            events,
            [
                GenerateEvent::Started {
                    prompt_tokens: 40,
                    cached_tokens: 30
                },
                GenerateEvent::Reasoning { text: "Hm.".into() },
                token("Running."),
                GenerateEvent::ToolCall {
                    index: 0,
                    id: Some("toolu_1".into()),
                    name: Some("Bash".into()),
                    arguments: String::new()
                },
                GenerateEvent::ToolCall {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: "{\"command\":".into()
                },
                GenerateEvent::ToolCall {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: "\"ls\"}".into()
                },
                GenerateEvent::Finished {
                    reason: FinishReason::ToolCalls,
                    prompt_tokens: 40,
                    cached_tokens: 30,
                    output_tokens: 12
                },
            ]
        );
    }

    #[test]
    fn a_whole_message_and_errors() {
        let mut decoder = Decoder::of(Api::Messages);
        let mut out = Vec::new();
        decoder.whole(
            br#"{"type":"message","id":"msg_2","content":[{"type":"text","text":"Paris."}],"stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":5,"output_tokens":2}}"#,
            &mut out,
        );
        assert_eq!(
            out.last(),
            Some(&GenerateEvent::Finished {
                reason: FinishReason::StopSequence("END".into()),
                prompt_tokens: 5,
                cached_tokens: 0,
                output_tokens: 2
            })
        );
        assert_eq!(out[1], token("Paris."));
        let events = decode(
            Api::Messages,
            &[
                r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}"#,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ],
        );
        assert!(
            matches!(events.last(), Some(GenerateEvent::Failed { message }) if message.contains("Overloaded"))
        );
        let events = decode(
            Api::Messages,
            &[r#"{"type":"message_start","message":{"id":"m"}}"#],
        );
        assert!(
            matches!(events.last(), Some(GenerateEvent::Failed { message }) if message.contains("before finishing"))
        );
    }

    #[test]
    fn a_responses_stream_with_a_namespaced_call() {
        let events = decode(
            Api::Responses,
            &[
                r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","output":[]}}"#,
                r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1"}}"#,
                r#"{"type":"response.reasoning_text.delta","output_index":0,"delta":"Think."}"#,
                r#"{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"msg_1","role":"assistant","content":[]}}"#,
                r#"{"type":"response.output_text.delta","output_index":1,"delta":"Hi"}"#,
                r#"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","call_id":"c1","name":"f","namespace":"ns","arguments":""}}"#,
                r#"{"type":"response.function_call_arguments.delta","output_index":2,"delta":"{}"}"#,
                r#"{"type":"response.output_item.done","output_index":2,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}}"#,
                r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":50,"output_tokens":7,"input_tokens_details":{"cached_tokens":32}}}}"#,
            ],
        );
        assert_eq!(
            events,
            [
                GenerateEvent::Started {
                    prompt_tokens: 0,
                    cached_tokens: 0
                },
                GenerateEvent::Reasoning {
                    text: "Think.".into()
                },
                token("Hi"),
                GenerateEvent::ToolCall {
                    index: 0,
                    id: Some("c1".into()),
                    name: Some("ns__f".into()),
                    arguments: String::new()
                },
                GenerateEvent::ToolCall {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: "{}".into()
                },
                GenerateEvent::Finished {
                    reason: FinishReason::ToolCalls,
                    prompt_tokens: 50,
                    cached_tokens: 32,
                    output_tokens: 7
                },
            ]
        );
    }

    #[test]
    fn a_whole_response_an_incomplete_one_and_a_failed_one() {
        let mut decoder = Decoder::of(Api::Responses);
        let mut out = Vec::new();
        decoder.whole(
            br#"{"id":"resp_2","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
                "output":[{"type":"message","content":[{"type":"output_text","text":"Once upon"}]}],
                "usage":{"input_tokens":9,"output_tokens":4}}"#,
            &mut out,
        );
        assert_eq!(out[1], token("Once upon"));
        assert!(matches!(
            out.last(),
            Some(GenerateEvent::Finished {
                reason: FinishReason::MaxTokens,
                output_tokens: 4,
                ..
            })
        ));
        let events = decode(
            Api::Responses,
            &[
                r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
            ],
        );
        assert!(
            matches!(events.last(), Some(GenerateEvent::Failed { message }) if message.contains("boom"))
        );
    }
}
