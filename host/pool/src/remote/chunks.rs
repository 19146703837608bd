//! OpenAI-compatible replies as engine events: the stream chunks and whole answers that vLLM,
//! SGLang, TGI, llama.cpp's server, Ollama and `ringmaster worker` send, decoded with typed
//! structs that borrow from the read buffer (the wire crate's [`Chunk`]), into the
//! [`GenerateEvent`]s a local engine sends.
//!
//! The shapes differ in where the usage comes (see the README's compatibility table):
//! in every chunk (vLLM's `continuous_usage_stats`), in the finishing chunk (TGI, llama.cpp),
//! in a chunk of its own after it (OpenAI's `include_usage`: no choices), or not at all (then
//! the output is counted here, one token per text chunk, and the prompt reads as 0). So the
//! reply is finished only when nothing more can come: at a usage chunk after the finish, at
//! `data: [DONE]`, or at the end of the body. An error object in the stream (OpenAI's
//! `{"error": {...}}`, TGI's `{"error": "..."}`, vLLM's `{"object": "error", ...}`) ends it as
//! [`GenerateEvent::Failed`]; so does malformed JSON, and a body that ends before a finish.

use ringmaster_gpu_runtime::{FinishReason, GenerateEvent};
use ringmaster_wire::openai::{Chunk, MatchedStop, Timings, Usage as UsageWire};

use super::tally::Tally;

/// Bytes of text per token, to estimate a whole answer's output when the server reports none.
const BYTES_PER_TOKEN_ESTIMATE: usize = 4;

/// Why a server's bytes could not be read as a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not the JSON of a chunk.
    #[error("the server sent malformed JSON: {0}")]
    Malformed(String),
}

/// The message of an OpenAI-style error body (`{"error": {"message": ...}}` and the variants
/// above), if `body` is one.
pub fn error_message(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Chunk<'_>>(body).ok()?.error()
}

/// Records the usage a chunk reports (and llama.cpp's `timings`) in `tally`.
fn update_usage(tally: &mut Tally, wire: Option<UsageWire>, timings: Option<Timings>) {
    if let Some(wire) = wire {
        tally.prompt = wire.prompt_tokens.or(tally.prompt);
        tally.output = wire.completion_tokens.or(tally.output);
        if let Some(cached) = wire.prompt_tokens_details.and_then(|d| d.cached_tokens) {
            tally.cached = Some(cached);
        }
    }
    if let Some(cached) = timings.and_then(|t| t.cache_n) {
        tally.cached = Some(cached);
    }
}

/// What one SSE event of a stream was, for a relay that passes the server's own chunks on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKind {
    /// A chunk with a choice: text, a tool call's piece, the role, the finish.
    Content {
        /// It carried the `finish_reason`.
        finish: bool,
    },
    /// A chunk with usage and no choice.
    Usage,
    /// `[DONE]`, an error object, malformed JSON, or anything after the end.
    Other,
}

/// Turns one reply's chunks into engine events, in order.
#[derive(Debug, Default)]
pub struct ReplyDecoder {
    tally: Tally,
    /// Text bytes seen: a whole answer's output estimate when the server reports none.
    text_bytes: usize,
    /// The server's own bytes go to the client ([`Self::relaying`]): text and reasoning are
    /// counted, not copied into their events.
    relaying: bool,
}

impl ReplyDecoder {
    /// A decoder for a reply relayed as the server sent it: its events carry the counts (and
    /// tool calls whole) but no text, which nothing after it reads; no `String` per chunk.
    pub fn relaying() -> Self {
        Self {
            relaying: true,
            ..Self::default()
        }
    }

    /// `text` as an event's own, or nothing when the reply is relayed.
    fn owned(&self, text: std::borrow::Cow<'_, str>) -> String {
        if self.relaying {
            String::new()
        } else {
            text.into_owned()
        }
    }

    /// Whether the last event was produced; the rest of the body can be read and dropped.
    pub fn is_done(&self) -> bool {
        self.tally.done
    }

    /// Whether the server reported no output count (the count is this decoder's own).
    pub fn counted_output(&self) -> bool {
        self.tally.output.is_none()
    }

    /// The server's id of the reply, once a chunk named it.
    pub fn reply_id(&self) -> Option<&str> {
        self.tally.reply_id.as_deref()
    }

    /// One SSE event's data; says what the event was.
    pub fn data(&mut self, data: &[u8], out: &mut Vec<GenerateEvent>) -> ChunkKind {
        if self.tally.done {
            return ChunkKind::Other;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.tally.end(out, true);
            return ChunkKind::Other;
        }
        let chunk = match serde_json::from_slice::<Chunk<'_>>(data) {
            Ok(chunk) => chunk,
            Err(e) => {
                self.tally
                    .fail(DecodeError::Malformed(e.to_string()).to_string(), out);
                return ChunkKind::Other;
            }
        };
        if self.tally.reply_id.is_none()
            && let Some(id) = &chunk.id
        {
            self.tally.reply_id = Some(id.to_string());
        }
        self.chunk(chunk, out)
    }

    /// A whole (non-streamed) answer: the server ignored `stream: true`.
    ///
    /// Without usage in it, the output is estimated at four bytes of text per token (the
    /// stream's one-token-per-chunk count does not apply to one chunk).
    pub fn whole(&mut self, body: &[u8], out: &mut Vec<GenerateEvent>) {
        let _ = self.data(body, out);
        if self.tally.output.is_none() {
            self.tally.pieces = u32::try_from(self.text_bytes.div_ceil(BYTES_PER_TOKEN_ESTIMATE))
                .unwrap_or(u32::MAX);
        }
        self.tally.end(out, true);
    }

    /// The body ended (EOF) before or after a finish.
    pub fn end_of_body(&mut self, out: &mut Vec<GenerateEvent>) {
        self.tally.end(out, false);
    }

    /// The stream broke, or said something this decoder cannot read.
    pub fn fail(&mut self, message: String, out: &mut Vec<GenerateEvent>) {
        self.tally.fail(message, out);
    }

    fn chunk(&mut self, chunk: Chunk<'_>, out: &mut Vec<GenerateEvent>) -> ChunkKind {
        if let Some(message) = chunk.error() {
            self.tally
                .fail(format!("the GPU server reported an error: {message}"), out);
            return ChunkKind::Other;
        }
        let has_usage = chunk.usage.is_some();
        update_usage(&mut self.tally, chunk.usage, chunk.timings);
        let Some(choice) = chunk.choices.into_iter().next() else {
            // A usage-only chunk: after the finish it is the last thing that matters.
            if has_usage {
                self.tally.start(out);
            }
            if self.tally.finish.is_some() {
                self.tally.end(out, true);
            }
            return if has_usage {
                ChunkKind::Usage
            } else {
                ChunkKind::Other
            };
        };
        let (content, tool_calls, reasoning) = match (choice.delta, choice.message) {
            (Some(delta), _) => (
                delta.content,
                delta.tool_calls.unwrap_or_default(),
                delta.reasoning_content.or(delta.reasoning),
            ),
            (None, Some(message)) => (
                message.content,
                message.tool_calls.unwrap_or_default(),
                message.reasoning_content.or(message.reasoning),
            ),
            (None, None) => (None, Vec::new(), None),
        };
        let text = content.or(choice.text).unwrap_or_default().0;
        let reasoning = reasoning.unwrap_or_default().0;
        let finish = choice.finish_reason.as_deref().map(|reason| {
            let matched = choice.stop_reason.or(choice.matched_stop);
            finish_reason(reason, matched)
        });
        if has_usage
            || !text.is_empty()
            || !reasoning.is_empty()
            || !tool_calls.is_empty()
            || finish.is_some()
        {
            self.tally.start(out);
        }
        if !reasoning.is_empty() {
            self.text_bytes += reasoning.len();
            self.tally.push(
                GenerateEvent::Reasoning {
                    text: self.owned(reasoning),
                },
                out,
            );
        }
        if !text.is_empty() {
            self.text_bytes += text.len();
            self.tally.push(
                GenerateEvent::Token {
                    text: self.owned(text),
                },
                out,
            );
        }
        for (position, call) in tool_calls.into_iter().enumerate() {
            let (name, arguments) = match call.function {
                Some(function) => (
                    function.name.map(|n| n.into_owned()),
                    function
                        .arguments
                        .map(|arguments| arguments.into_text())
                        .unwrap_or_default(),
                ),
                None => (None, String::new()),
            };
            self.text_bytes += arguments.len();
            self.tally.push(
                GenerateEvent::ToolCall {
                    index: call
                        .index
                        .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX)),
                    id: call.id.map(|id| id.into_owned()),
                    name,
                    arguments,
                },
                out,
            );
        }
        let finished = finish.is_some();
        if finished {
            self.tally.finish = finish;
        }
        ChunkKind::Content { finish: finished }
    }
}

fn finish_reason(reason: &str, matched: Option<MatchedStop<'_>>) -> FinishReason {
    match reason {
        "length" => FinishReason::MaxTokens,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        // "stop", TGI's "eos_token" and "stop_sequence", and anything unknown.
        _ => match matched {
            Some(MatchedStop::Text(text)) if !text.is_empty() => {
                FinishReason::StopSequence(text.into_owned())
            }
            _ => FinishReason::EndOfTurn,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frames: &[&str]) -> Vec<GenerateEvent> {
        let mut decoder = ReplyDecoder::default();
        let mut out = Vec::new();
        for frame in frames {
            decoder.data(frame.as_bytes(), &mut out);
        }
        decoder.end_of_body(&mut out);
        out
    }

    fn started(prompt_tokens: u32, cached_tokens: u32) -> GenerateEvent {
        GenerateEvent::Started {
            prompt_tokens,
            cached_tokens,
        }
    }

    fn token(text: &str) -> GenerateEvent {
        GenerateEvent::Token { text: text.into() }
    }

    fn finished(reason: FinishReason, prompt: u32, cached: u32, output: u32) -> GenerateEvent {
        GenerateEvent::Finished {
            reason,
            prompt_tokens: prompt,
            cached_tokens: cached,
            output_tokens: output,
        }
    }

    #[test]
    fn usage_in_every_chunk_then_a_usage_chunk_vllm() {
        let events = decode(&[
            r#"{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":{"prompt_tokens":40,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":32}}}"#,
            r#"{"choices":[{"delta":{"content":"Hel"},"finish_reason":null}],"usage":{"prompt_tokens":40,"completion_tokens":1}}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop","stop_reason":"END"}],"usage":{"prompt_tokens":40,"completion_tokens":2}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}"#,
            "[DONE]",
        ]);
        assert_eq!(
            events,
            [
                started(40, 32),
                token("Hel"),
                finished(FinishReason::StopSequence("END".into()), 40, 32, 3)
            ]
        );
    }

    #[test]
    fn usage_in_a_chunk_of_its_own_openai_include_usage() {
        let events = decode(&[
            r#"{"choices":[{"delta":{"role":"assistant"},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"length"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#,
            "[DONE]",
        ]);
        assert_eq!(
            events,
            [
                started(0, 0),
                token("Hi"),
                finished(FinishReason::MaxTokens, 9, 0, 1)
            ]
        );
    }

    #[test]
    fn usage_in_the_finishing_chunk_tgi_and_llama_cpp() {
        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"A"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"B"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14},"timings":{"cache_n":8,"prompt_n":4}}"#,
            "[DONE]",
        ]);
        assert_eq!(
            events,
            [
                started(0, 0),
                token("A"),
                token("B"),
                finished(FinishReason::EndOfTurn, 12, 8, 2)
            ]
        );
    }

    #[test]
    fn no_usage_at_all_counts_the_output_ollama() {
        let mut decoder = ReplyDecoder::default();
        let mut out = Vec::new();
        for frame in [
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"x"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"y"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"tool_calls"}]}"#,
        ] {
            decoder.data(frame.as_bytes(), &mut out);
        }
        decoder.end_of_body(&mut out);
        assert!(decoder.counted_output());
        assert_eq!(
            out,
            [
                started(0, 0),
                token("x"),
                token("y"),
                finished(FinishReason::ToolCalls, 0, 0, 2)
            ]
        );
    }

    #[test]
    fn a_stream_ending_in_eof_without_done_still_finishes() {
        let events = decode(&[
            r#"{"choices":[{"text":"Once","finish_reason":null}]}"#,
            r#"{"choices":[{"text":"","finish_reason":"content_filter"}]}"#,
        ]);
        assert_eq!(
            events,
            [
                started(0, 0),
                token("Once"),
                finished(FinishReason::ContentFilter, 0, 0, 1)
            ]
        );
    }

    #[test]
    fn errors_in_the_stream_end_it() {
        for error in [
            r#"{"error":{"message":"out of memory","type":"server_error","code":500}}"#,
            r#"{"error":"out of memory","error_type":"generation"}"#,
            r#"{"object":"error","message":"out of memory","type":"InternalServerError","code":500}"#,
        ] {
            let events = decode(&[r#"{"choices":[{"delta":{"content":"a"}}]}"#, error]);
            assert_eq!(events.len(), 3, "{error}");
            assert!(
                matches!(&events[2], GenerateEvent::Failed { message } if message.contains("out of memory")),
                "{events:?}"
            );
        }
    }

    #[test]
    fn malformed_json_and_a_body_that_stops_early_fail() {
        let events = decode(&["{\"choices\": [", "[DONE]"]);
        assert!(
            matches!(&events[..], [GenerateEvent::Failed { message }] if message.contains("malformed JSON")),
            "{events:?}"
        );
        let events = decode(&[r#"{"choices":[{"delta":{"content":"a"}}]}"#]);
        assert!(
            matches!(&events[..], [_, _, GenerateEvent::Failed { message }] if message.contains("before finishing")),
            "{events:?}"
        );
    }

    #[test]
    fn a_whole_answer_where_a_stream_was_asked() {
        let mut decoder = ReplyDecoder::default();
        let mut out = Vec::new();
        decoder.whole(
            br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":16}}}"#,
            &mut out,
        );
        assert_eq!(
            out,
            [
                started(20, 16),
                token("Paris."),
                finished(FinishReason::EndOfTurn, 20, 16, 3)
            ]
        );
    }

    #[test]
    fn a_whole_answer_without_usage_estimates_its_output_from_its_text() {
        let mut decoder = ReplyDecoder::default();
        let mut out = Vec::new();
        decoder.whole(
            br#"{"choices":[{"message":{"content":"twelve bytes"},"finish_reason":"stop"}]}"#,
            &mut out,
        );
        assert!(decoder.counted_output());
        assert_eq!(
            out.last(),
            Some(&finished(FinishReason::EndOfTurn, 0, 0, 3))
        );
    }

    #[test]
    fn escaped_text_is_unescaped_and_plain_text_is_borrowed() {
        let data = br#"{"choices":[{"delta":{"content":"plain"}}]}"#;
        let chunk: Chunk<'_> = serde_json::from_slice(data).unwrap();
        let content = chunk.choices[0].delta.as_ref().unwrap().content.as_ref();
        assert!(content.is_some_and(|c| c == "plain" && c.is_borrowed()));
        let events = decode(&[
            r#"{"choices":[{"delta":{"content":"a\"b\n\u00e9"}}]}"#,
            "[DONE]",
        ]);
        assert_eq!(events[1], token("a\"b\né"));
    }

    #[test]
    fn error_bodies_of_every_shape_give_their_message() {
        assert_eq!(
            error_message(br#"{"error":{"message":"bad"}}"#).as_deref(),
            Some("bad")
        );
        assert_eq!(error_message(br#"{"error":"bad"}"#).as_deref(), Some("bad"));
        assert_eq!(
            error_message(br#"{"object":"error","message":"bad"}"#).as_deref(),
            Some("bad")
        );
        assert_eq!(error_message(b"<html>"), None);
    }
}
