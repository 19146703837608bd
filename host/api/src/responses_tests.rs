//! The Responses door's parser and writer: Codex's requests, the conversation from items, the
//! namespaces, what is dropped and what is refused, and the stream's event sequence.

use super::*;
use crate::reply::{ReplyEvent, StopReason, Usage, WholeReply};
use crate::{Door, Limits, Request};
use ringmaster_wire::chat::Effort;

const MODEL: &str = "sim-llama-3-8b";

fn parse_body(body: &str, prior: Option<Prior<'_>>) -> Result<Request, ApiError> {
    let models = vec![MODEL.to_owned()];
    super::parse(body.as_bytes(), Limits::new(&models, 4096), prior)
}

fn parse(body: &str) -> Result<Request, ApiError> {
    parse_body(body, None)
}

#[test]
fn a_codex_request_becomes_one_conversation_with_namespaced_tools() {
    let req = parse(
        r#"{"model":"sim-llama-3-8b","instructions":"Be a coding agent.","stream":true,"store":false,
            "input":[
              {"type":"message","id":"msg_1","role":"developer","content":[{"type":"input_text","text":"Skills: none."}]},
              {"type":"message","role":"user","content":[{"type":"input_text","text":"<env/>"}]},
              {"type":"message","role":"user","content":[{"type":"input_text","text":"say hi"}]},
              {"type":"reasoning","summary":[],"encrypted_content":"gAAA"},
              {"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"echo hi\"}"},
              {"type":"function_call","call_id":"c2","name":"close_agent","namespace":"multi_agent_v1","arguments":"{}"},
              {"type":"function_call_output","call_id":"c1","output":"hi\n"},
              {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"closed"}]},
              {"type":"message","role":"developer","content":"Approvals changed."}],
            "tools":[{"type":"function","name":"exec_command","strict":false,"parameters":{"type":"object"}},
                     {"type":"namespace","name":"multi_agent_v1","description":"Agents","tools":[{"type":"function","name":"close_agent","parameters":{"type":"object"}}]},
                     {"type":"web_search","external_web_access":false}],
            "tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"medium","summary":"auto"},
            "include":["reasoning.encrypted_content"],"prompt_cache_key":"sess-1",
            "client_metadata":{"x-codex-window-id":"w"}}"#,
    )
    .unwrap();
    assert_eq!(req.door, Door::Responses);
    assert_eq!(
        req.system.as_deref(),
        Some("Be a coding agent.\n\nSkills: none.")
    );
    let roles: Vec<Role> = req.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::User,
            Role::System
        ]
    );
    let calls = &req.messages[2].tool_calls;
    assert_eq!(calls.len(), 2, "both calls join one assistant turn");
    assert_eq!(calls[1].name, "multi_agent_v1__close_agent");
    assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(req.messages[4].text, "closed");
    let offer = req.tools.as_deref().unwrap();
    let names: Vec<&str> = offer.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["exec_command", "multi_agent_v1__close_agent"]);
    assert_eq!(offer.choice, Some(ToolChoice::Auto));
    assert_eq!(req.session.as_deref(), Some("sess-1"));
    assert_eq!(req.effort, Some(Effort::Medium));
    assert!(req.stream);
    let context = req.responses.as_deref().unwrap();
    assert!(!context.store);
    assert_eq!(
        context.split_name("multi_agent_v1__close_agent"),
        (Some("multi_agent_v1"), "close_agent")
    );
    assert_eq!(context.split_name("exec_command"), (None, "exec_command"));
    // Codex's own field is unknown; the hosted tool and the reasoning items are dropped.
    assert_eq!(req.fields.unknown, ["client_metadata"]);
    for noted in ["include", "tools.web_search", "input.reasoning"] {
        assert!(
            req.fields.unused.contains(&noted),
            "{noted}: {:?}",
            req.fields.unused
        );
    }
}

#[test]
fn a_string_input_is_one_user_message_and_the_echo_keeps_the_settings() {
    let req = parse(
        r#"{"model":"sim-llama-3-8b","input":"Hi","metadata":{"k":"v"},"temperature":0.5,"max_output_tokens":64,
            "text":{"format":{"type":"json_schema","name":"reply","schema":{"type":"object"},"strict":true}}}"#,
    )
    .unwrap();
    assert_eq!(req.messages.len(), 1);
    assert_eq!(req.messages[0].text, "Hi");
    assert_eq!(req.max_tokens, 64);
    assert!(
        matches!(req.output_format.as_deref(), Some(OutputFormat::JsonSchema { name, .. }) if name == "reply")
    );
    let context = req.responses.as_deref().unwrap();
    assert!(context.store, "store defaults to true");
    assert_eq!(context.echo.metadata.get(), r#"{"k":"v"}"#);
    assert_eq!(context.echo.max_output_tokens, Some(64));
    let items: serde_json::Value = serde_json::from_str(&context.input_items).unwrap();
    assert_eq!(items[0]["role"], "user");
    assert_eq!(items[0]["content"][0]["text"], "Hi");
}

#[test]
fn a_previous_response_continues_its_conversation() {
    let prior = Prior {
        id: "resp_1",
        items: r#"[{"type":"message","role":"user","content":"What is 2+2?"},
                   {"type":"message","id":"msg_a","role":"assistant","status":"completed","content":[{"type":"output_text","text":"4","annotations":[]}]}]"#,
    };
    let body = r#"{"model":"sim-llama-3-8b","previous_response_id":"resp_1","input":"And 3+3?"}"#;
    assert_eq!(
        previous_response_id(body.as_bytes()).as_deref(),
        Some("resp_1")
    );
    let req = parse_body(body, Some(prior)).unwrap();
    let texts: Vec<&str> = req.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["What is 2+2?", "4", "And 3+3?"]);
    assert_eq!(
        req.responses
            .as_deref()
            .unwrap()
            .echo
            .previous_response_id
            .as_deref(),
        Some("resp_1")
    );
    // Not found: the caller found none.
    let err = parse(body).unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::NotFound);
    assert!(
        err.message().starts_with("previous_response_id:"),
        "{}",
        err.message()
    );
    assert_eq!(previous_response_id(br#"{"input":"x"}"#), None);
}

#[test]
fn what_would_change_the_answer_is_refused_by_name() {
    for (extra, field) in [
        (r#","background":true"#, "background"),
        (r#","conversation":"conv_1""#, "conversation"),
        (r#","prompt":{"id":"pmpt_1"}"#, "prompt"),
        (
            r#","tools":[{"type":"web_search"}],"tool_choice":{"type":"web_search"}"#,
            "tool_choice.type",
        ),
        (r#","top_logprobs":2"#, "top_logprobs"),
    ] {
        let err = parse(&format!(
            r#"{{"model":"sim-llama-3-8b","input":"Hi"{extra}}}"#
        ))
        .unwrap_err();
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{extra}: {}",
            err.message()
        );
    }
    let err =
        parse(r#"{"model":"sim-llama-3-8b","input":[{"type":"item_reference","id":"msg_1"}]}"#)
            .unwrap_err();
    assert!(
        err.message().starts_with("input.0.type:"),
        "{}",
        err.message()
    );
    let req = parse(
        r#"{"model":"sim-llama-3-8b","input":"Hi","tools":[{"type":"function","name":"a"},{"type":"function","name":"b"}],
            "tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"b"}]}}"#,
    )
    .unwrap();
    let offer = req.tools.as_deref().unwrap();
    assert_eq!(offer.tools.len(), 1);
    assert_eq!(offer.choice, Some(ToolChoice::Required));
}

fn events(
    writer: &mut crate::reply::StreamWriter,
    events: &[ReplyEvent<'_>],
) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for event in events {
        writer.write(event, &mut out);
    }
    String::from_utf8(out)
        .unwrap()
        .split("\n\n")
        .filter_map(|frame| frame.split_once("data: ").map(|(_, data)| data.to_owned()))
        .map(|data| serde_json::from_str(&data).unwrap())
        .collect()
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 30,
        cached_tokens: 16,
        output_tokens: 5,
    }
}

#[test]
fn a_stream_is_the_apis_event_sequence_and_folds_into_the_stored_response() {
    let request = parse(
        r#"{"model":"sim-llama-3-8b","input":"Hi","stream":true,
            "tools":[{"type":"namespace","name":"ns","tools":[{"type":"function","name":"f"}]}]}"#,
    )
    .unwrap();
    let mut writer = Door::Responses.stream_writer("resp_abc".into(), &request);
    let written = events(
        &mut writer,
        &[
            ReplyEvent::Start { usage: usage() },
            ReplyEvent::Reasoning("Think."),
            ReplyEvent::Text("Let me "),
            ReplyEvent::Text("call."),
            ReplyEvent::ToolCallStart {
                id: "call_1",
                name: "ns__f",
            },
            ReplyEvent::ToolArguments("{\"a\":"),
            ReplyEvent::ToolArguments("1}"),
            ReplyEvent::Stop {
                reason: StopReason::ToolUse,
                stop_sequence: None,
                usage: usage(),
            },
        ],
    );
    let types: Vec<&str> = written
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = written
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>());
    assert_eq!(written[12]["text"], "Let me call.");
    let call = &written[19]["item"];
    assert_eq!(call["name"], "f");
    assert_eq!(call["namespace"], "ns");
    assert_eq!(call["arguments"], "{\"a\":1}");
    let done = &written[20]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 16);
    assert_eq!(done["output"].as_array().unwrap().len(), 3);
    // What the store keeps is that last response, and the whole answer is the same.
    let stored: serde_json::Value =
        serde_json::from_slice(&writer.finished_response().unwrap()).unwrap();
    assert_eq!(&stored, done);
    let mut whole = WholeReply::default();
    for event in [
        ReplyEvent::Start { usage: usage() },
        ReplyEvent::Reasoning("Think."),
        ReplyEvent::Text("Let me call."),
        ReplyEvent::ToolCallStart {
            id: "call_1",
            name: "ns__f",
        },
        ReplyEvent::ToolArguments("{\"a\":1}"),
        ReplyEvent::Stop {
            reason: StopReason::ToolUse,
            stop_sequence: None,
            usage: usage(),
        },
    ] {
        whole.push(&event);
    }
    let body: serde_json::Value = serde_json::from_slice(
        &Door::Responses
            .whole_body(&whole, "resp_abc", &request)
            .unwrap(),
    )
    .unwrap();
    let without_time = |mut v: serde_json::Value| {
        v["created_at"] = 0.into();
        v
    };
    assert_eq!(without_time(body), without_time(stored));
}

#[test]
fn a_reply_cut_at_max_output_tokens_is_incomplete_and_a_failure_fails() {
    let request = parse(r#"{"model":"sim-llama-3-8b","input":"Hi","stream":true}"#).unwrap();
    let mut writer = Door::Responses.stream_writer("resp_x".into(), &request);
    let written = events(
        &mut writer,
        &[
            ReplyEvent::Start { usage: usage() },
            ReplyEvent::Text("Once"),
            ReplyEvent::Stop {
                reason: StopReason::MaxTokens,
                stop_sequence: None,
                usage: usage(),
            },
        ],
    );
    let last = written.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    let mut writer = Door::Responses.stream_writer("resp_y".into(), &request);
    let error = ApiError::internal("the GPU server failed");
    let written = events(
        &mut writer,
        &[
            ReplyEvent::Start { usage: usage() },
            ReplyEvent::Error(&error),
        ],
    );
    let last = written.last().unwrap();
    assert_eq!(last["type"], "response.failed");
    assert_eq!(
        last["response"]["error"]["message"],
        "the GPU server failed"
    );
}
