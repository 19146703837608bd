//! Each door's writing of the same reply events.

use super::*;
use crate::{ApiError, Door, ErrorKind, Request};

const MODEL: &str = "sim-llama-3-8b";

fn data_chunks(out: &[u8]) -> Vec<String> {
    String::from_utf8(out.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

fn stop(reason: StopReason, prompt: u32, cached: u32, output: u32) -> ReplyEvent<'static> {
    ReplyEvent::Stop {
        reason,
        stop_sequence: None,
        usage: Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            output_tokens: output,
        },
    }
}

#[test]
fn a_stream_is_written_as_openai_chunks_ending_in_done() {
    let mut writer = StreamWriter::new(Door::Chat, "chatcmpl-1".into(), MODEL.into(), true);
    let mut out = Vec::new();
    for event in [
        ReplyEvent::Start {
            usage: Usage::default(),
        },
        ReplyEvent::Ping,
        ReplyEvent::Text("Hel"),
        ReplyEvent::Text("lo"),
        stop(StopReason::MaxTokens, 8, 5, 2),
    ] {
        writer.write(&event, &mut out);
    }
    let text = String::from_utf8(out.clone()).unwrap();
    assert!(text.contains(": ping\n\n"));
    let data = data_chunks(&out);
    assert_eq!(data.len(), 6, "{text}");
    let chunks: Vec<serde_json::Value> = data[..5]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hel");
    assert_eq!(chunks[2]["choices"][0]["delta"]["content"], "lo");
    assert_eq!(
        chunks[2]["choices"][0]["finish_reason"],
        serde_json::Value::Null
    );
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["choices"], serde_json::json!([]));
    assert_eq!(chunks[4]["usage"]["prompt_tokens"], 8);
    assert_eq!(chunks[4]["usage"]["total_tokens"], 10);
    assert_eq!(
        chunks[4]["usage"]["prompt_tokens_details"]["cached_tokens"],
        5
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(data[5], "[DONE]");
}

#[test]
fn tool_calls_are_written_as_indexed_pieces_and_a_whole_message() {
    let mut writer = StreamWriter::new(Door::Chat, "chatcmpl-1".into(), MODEL.into(), false);
    let mut out = Vec::new();
    for call in ["call_a", "call_b"] {
        writer.write(
            &ReplyEvent::ToolCallStart {
                id: call,
                name: "lookup",
            },
            &mut out,
        );
        writer.write(&ReplyEvent::ToolArguments("{\"q\":1}"), &mut out);
    }
    let chunks: Vec<serde_json::Value> = data_chunks(&out)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&serde_json::Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["delta"]["tool_calls"][0])
        .collect();
    assert_eq!(calls.len(), 4);
    assert_eq!(
        *calls[0],
        serde_json::json!({"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "lookup", "arguments": ""}})
    );
    assert_eq!(
        *calls[1],
        serde_json::json!({"index": 0, "function": {"arguments": "{\"q\":1}"}})
    );
    assert_eq!(calls[2]["index"], 1, "the second call is OpenAI's index 1");
    assert_eq!(calls[3]["index"], 1);

    let mut whole = WholeReply::default();
    for event in [
        ReplyEvent::Start {
            usage: Usage::default(),
        },
        ReplyEvent::ToolCallStart {
            id: "call_a",
            name: "lookup",
        },
        ReplyEvent::ToolArguments("{\"q\":"),
        ReplyEvent::ToolArguments("1}"),
        stop(StopReason::ToolUse, 3, 0, 4),
    ] {
        whole.push(&event);
    }
    let body: serde_json::Value = serde_json::from_slice(
        &Door::Chat
            .whole_body(
                &whole,
                "chatcmpl-1",
                &Request::new(Door::Chat, MODEL.into()),
            )
            .unwrap(),
    )
    .unwrap();
    let reply = &body["choices"][0];
    assert_eq!(reply["finish_reason"], "tool_calls");
    assert_eq!(reply["message"]["content"], serde_json::Value::Null);
    assert_eq!(
        reply["message"]["tool_calls"],
        serde_json::json!([{"id": "call_a", "type": "function",
                            "function": {"name": "lookup", "arguments": "{\"q\":1}"}}])
    );
    let body: serde_json::Value = serde_json::from_slice(
        &Door::Messages
            .whole_body(&whole, "msg_1", &Request::new(Door::Messages, MODEL.into()))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        body["content"],
        serde_json::json!([{"type": "tool_use", "id": "call_a", "name": "lookup", "input": {"q": 1}}]),
        "the empty text before the call says nothing"
    );
    assert_eq!(body["stop_reason"], "tool_use");
}

#[test]
fn a_messages_stream_opens_blocks_for_text_and_each_call() {
    let mut writer = StreamWriter::new(Door::Messages, "msg_1".into(), MODEL.into(), false);
    let mut out = Vec::new();
    for event in [
        ReplyEvent::Start {
            usage: Usage {
                prompt_tokens: 10,
                cached_tokens: 4,
                output_tokens: 0,
            },
        },
        ReplyEvent::Text("Let me look."),
        ReplyEvent::ToolCallStart {
            id: "toolu_1",
            name: "lookup",
        },
        ReplyEvent::ToolArguments("{}"),
        stop(StopReason::ToolUse, 10, 4, 6),
    ] {
        writer.write(&event, &mut out);
    }
    let text = String::from_utf8(out).unwrap();
    let names: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("event: ")?.split('\n').next())
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(
        text.contains(r#""usage":{"input_tokens":6,"output_tokens":1,"cache_read_input_tokens":4"#)
    );
    assert!(text.contains(
        r#""content_block":{"type":"tool_use","id":"toolu_1","name":"lookup","input":{}}"#
    ));
    assert!(text.contains(r#""delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":6,"output_tokens":6"#));
}

#[test]
fn a_whole_reply_with_arguments_that_are_not_an_object_fails_and_a_refusal_drops_its_calls() {
    let mut whole = WholeReply::default();
    for event in [
        ReplyEvent::ToolCallStart { id: "c", name: "f" },
        ReplyEvent::ToolArguments("[1, 2]"),
        stop(StopReason::ToolUse, 1, 0, 1),
    ] {
        whole.push(&event);
    }
    let err = Door::Messages
        .whole_body(&whole, "msg_1", &Request::new(Door::Messages, MODEL.into()))
        .unwrap_err();
    assert!(
        err.message().contains("not a JSON object"),
        "{}",
        err.message()
    );
    whole.stop = Some((StopReason::Refusal, None));
    let body: serde_json::Value = serde_json::from_slice(
        &Door::Messages
            .whole_body(&whole, "msg_1", &Request::new(Door::Messages, MODEL.into()))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        body["content"],
        serde_json::json!([{"type": "text", "text": ""}])
    );
}

#[test]
fn errors_have_each_doors_shape_and_status() {
    let overloaded = ApiError::new(ErrorKind::Overloaded, "full");
    assert_eq!(
        Door::Chat.error_status(&overloaded),
        http::StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(Door::Messages.error_status(&overloaded).as_u16(), 529);
    let limited = ApiError::new(ErrorKind::RateLimit, "slow down");
    let body: serde_json::Value = serde_json::from_slice(&Door::Chat.error_body(&limited)).unwrap();
    assert_eq!(body["error"]["message"], "slow down");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let body: serde_json::Value =
        serde_json::from_slice(&Door::Messages.error_body(&limited)).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    );
}
