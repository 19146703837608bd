//! The Messages door's parser: what it accepts, what it refuses and how it says so.

use super::*;
use crate::{ErrorKind, Limits, Request};
use ringmaster_wire::chat::{Role, ToolCall, ToolChoice};

fn limits() -> (Vec<String>, u32) {
    (vec!["sim-llama-3-8b".to_owned()], 4096)
}

fn parse(body: &str) -> Result<Request, ApiError> {
    let (models, max) = limits();
    super::parse(body.as_bytes(), Limits::new(&models, max))
}

#[test]
fn fields_agents_send_are_served_or_noted_and_only_what_changes_the_answer_is_refused() {
    let with = |extra: &str| {
        parse(&format!(
            r#"{{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
        ))
    };
    // Accepted; what the request does not carry is noted by name.
    for (ok, noted) in [
        (r#","tools":[]"#, None),
        (r#","tool_choice":{"type":"auto"}"#, None),
        (r#","service_tier":"priority""#, Some("service_tier")),
        (
            r#","cache_control":{"type":"ephemeral"}"#,
            Some("cache_control"),
        ),
        (
            r#","context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}"#,
            Some("context_management"),
        ),
        (
            r#","tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}]"#,
            Some("tools.web_search"),
        ),
        (r#","thinking":{"type":"disabled"}"#, None),
    ] {
        let req = with(ok).unwrap_or_else(|e| panic!("{ok}: {}", e.message()));
        assert_eq!(req.fields.unused.first().copied(), noted, "{ok}");
        assert!(
            req.fields.unknown.is_empty(),
            "{ok}: {:?}",
            req.fields.unknown
        );
    }
    // Thinking and effort ask a reasoning server; adaptive thinking is shown.
    let req = with(r#","thinking":{"type":"adaptive","display":"omitted"},"output_config":{"effort":"medium"}"#).unwrap();
    assert!(req.show_reasoning);
    assert_eq!(req.effort, Some(ringmaster_wire::chat::Effort::Medium));
    assert_eq!(req.fields.reasoning, Some("thinking"));
    let req = with(r#","thinking":{"type":"enabled","budget_tokens":1024}"#).unwrap();
    assert_eq!(req.effort, Some(ringmaster_wire::chat::Effort::Low));
    // Refused, naming the field and the feature: what would change the answer.
    for (extra, field, feature) in [
        (
            r#","mcp_servers":[{"type":"url","url":"https://x","name":"x"}]"#,
            "mcp_servers",
            "MCP",
        ),
        (
            r#","tools":[{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"tool","name":"web_search"}"#,
            "tool_choice.name",
            "server tool",
        ),
        (
            r#","thinking":{"type":"enabled"}"#,
            "thinking.budget_tokens",
            "field required",
        ),
    ] {
        let err = with(extra).unwrap_err();
        let message = err.message();
        assert!(
            message.starts_with(&format!("{field}: ")) && message.contains(feature),
            "{extra}: {message}"
        );
    }
    let err = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x/y.pdf"}}]}]}"#,
    )
    .unwrap_err();
    assert!(
        err.message()
            .starts_with("messages.0.content.0.source.type:")
            && err.message().contains("documents are not supported"),
        "{}",
        err.message()
    );
    // A field nobody defines is noted, not refused (unless the operator says so).
    let req = with(r#","colour":"blue""#).unwrap();
    assert_eq!(req.fields.unknown, ["colour"]);
}

/// Found by the fuzzer: a conversation of blocks no API version defines left no message.
#[test]
fn a_conversation_of_unknown_blocks_only_is_refused_not_sent_empty() {
    let err = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":16,"messages":[{"role":"user","content":[{"type":"tenumext","text":"Hi"}]}]}"#,
    )
    .unwrap_err();
    assert!(
        err.message().starts_with("messages: no message"),
        "{}",
        err.message()
    );
}

#[test]
fn claude_codes_first_request_is_served() {
    let (models, max) = limits();
    let volatile = crate::VolatileLines::new([crate::volatile::CLAUDE_CODE_BILLING_LINE]).unwrap();
    let limits = Limits {
        volatile: &volatile,
        ..Limits::new(&models, max)
    };
    let req = super::parse(
        br##"{"model":"sim-llama-3-8b","max_tokens":32000,
            "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch=3f2a1;"},
                      {"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>hi</system-reminder>"},{"type":"text","text":"say hi","cache_control":{"type":"ephemeral"}}]},
                        {"role":"system","content":[{"type":"text","text":"# Environment"}]},
                        {"role":"assistant","content":[{"type":"thinking","thinking":"Hm.","signature":"abc"},{"type":"text","text":"Hi!"}]},
                        {"role":"user","content":"again"}],
            "tools":[{"name":"Bash","description":"Run","input_schema":{"type":"object"},"defer_loading":true}],
            "metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s-1\"}"},
            "thinking":{"type":"adaptive"},"output_config":{"effort":"medium"},
            "context_management":{"edits":[]},"stream":true}"##,
        limits,
    )
    .unwrap();
    assert_eq!(req.max_tokens, max, "above the gateway's limit: the limit");
    assert_eq!(
        req.clamped.map(|c| c.header_value()),
        Some(format!("max_tokens=32000->{max}"))
    );
    assert_eq!(req.system.as_deref(), Some("You are Claude Code."));
    assert_eq!(
        req.messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::User, Role::System, Role::Assistant, Role::User]
    );
    assert_eq!(req.messages[2].text, "Hi!");
    assert!(req.session.as_deref().unwrap().contains("s-1"));
    assert!(req.fields.unknown.is_empty(), "{:?}", req.fields.unknown);
    assert_eq!(
        req.fields.unused,
        [
            "context_management",
            "cache_control",
            "messages.content.thinking"
        ]
    );
}

#[test]
fn the_billing_line_is_taken_out_of_the_system_prompt() {
    let (models, max) = limits();
    let volatile = crate::VolatileLines::new([crate::volatile::CLAUDE_CODE_BILLING_LINE]).unwrap();
    let limits = Limits {
        volatile: &volatile,
        ..Limits::new(&models, max)
    };
    let body = |cch: &str| {
        format!(
            r#"{{"model":"sim-llama-3-8b","max_tokens":8,"system":[{{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch={cch};"}},{{"type":"text","text":"You are Claude Code."}}],"messages":[{{"role":"user","content":"Hi"}}]}}"#
        )
    };
    let a = super::parse(body("3f2a1").as_bytes(), limits).unwrap();
    let b = super::parse(body("99b0c").as_bytes(), limits).unwrap();
    assert_eq!(a.system, b.system);
    assert_eq!(a.system.as_deref(), Some("You are Claude Code."));
    assert!(a.volatile.unwrap().contains("cch=3f2a1"));
}

#[test]
fn tools_and_tool_blocks_become_an_offer_and_messages() {
    let req = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":16,
            "tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object"},
                      "cache_control":{"type":"ephemeral"}}],
            "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
            "messages":[{"role":"user","content":"Weather in Paris?"},
                        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},
                        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"18 C","is_error":true},
                                                  {"type":"text","text":"Thanks"}]}]}"#,
    )
    .unwrap();
    let offer = req.tools.as_deref().unwrap();
    assert_eq!(offer.tools.len(), 1);
    assert_eq!(offer.tools[0].name, "get_weather");
    assert_eq!(offer.tools[0].description.as_deref(), Some("Weather"));
    assert_eq!(offer.choice, Some(ToolChoice::Named("get_weather".into())));
    assert_eq!(offer.parallel, Some(false));
    assert!(req.uses_tools());
    assert_eq!(req.messages.len(), 4);
    assert_eq!(req.messages[1].role, Role::Assistant);
    assert_eq!(
        req.messages[1].tool_calls,
        [ToolCall {
            id: "t1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into()
        }]
    );
    assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("t1"));
    assert_eq!(req.messages[2].text, "Error: 18 C");
    assert_eq!(req.messages[3].text, "Thanks");
    assert_eq!(req.messages[3].tool_call_id, None);

    // `tool_choice` none with no tools is nothing; asking for a call with none is an error.
    let none = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":8,"tools":[],"tool_choice":{"type":"none"},"messages":[{"role":"user","content":"Hi"}]}"#,
    )
    .unwrap();
    assert!(none.tools.is_none() && !none.uses_tools());
    for (body, starts) in [
        (
            r#""tool_choice":{"type":"any"}"#,
            "tool_choice: asks for a tool call",
        ),
        (
            r#""tools":[{"name":"x","input_schema":{}}],"tool_choice":{"type":"tool","name":"y"}"#,
            "tool_choice.name:",
        ),
        (r#""tools":[{"name":"x"}]"#, "tools.0.input_schema:"),
        (r#""tools":[{"input_schema":{}}]"#, "tools.0.name:"),
        (
            r#""tools":{}"#,
            "request body does not match the expected schema: tools: invalid type",
        ),
    ] {
        let err = parse(&format!(
            r#"{{"model":"sim-llama-3-8b","max_tokens":8,{body},"messages":[{{"role":"user","content":"Hi"}}]}}"#
        ))
        .unwrap_err();
        assert!(
            err.message().starts_with(starts),
            "{body}: {}",
            err.message()
        );
    }
    // Blocks in the wrong turn.
    for (role, block, starts) in [
        (
            "user",
            r#"{"type":"tool_use","id":"t","name":"x","input":{}}"#,
            "messages.0.content.0.type: a \"tool_use\" block belongs in an assistant message",
        ),
        (
            "assistant",
            r#"{"type":"tool_result","tool_use_id":"t","content":"x"}"#,
            "messages.0.content.0.type: a \"tool_result\" block belongs in a user message",
        ),
        (
            "assistant",
            r#"{"type":"tool_use","id":"t","name":"x","input":[1]}"#,
            "messages.0.content.0.input: must be an object",
        ),
    ] {
        assert_block_refused(role, block, starts);
    }
}

/// A one-message request whose `role` turn holds `block` is refused with a message that
/// starts with `starts`.
fn assert_block_refused(role: &str, block: &str, starts: &str) {
    let err = parse(&format!(
        r#"{{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{{"role":"{role}","content":[{block}]}}]}}"#
    ))
    .unwrap_err();
    assert!(
        err.message().starts_with(starts),
        "{block}: {}",
        err.message()
    );
}

#[test]
fn image_blocks_become_urls_of_user_messages() {
    let req = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{"role":"user","content":[
            {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
            {"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}},
            {"type":"text","text":"What are these?"}]}]}"#,
    )
    .unwrap();
    assert!(req.uses_images());
    let urls: Vec<&str> = req.messages[0]
        .images
        .iter()
        .map(|i| i.url.as_str())
        .collect();
    assert_eq!(
        urls,
        [
            "data:image/png;base64,iVBORw0KGgo=",
            "https://example.com/cat.jpg"
        ]
    );
    assert_eq!(req.messages[0].text, "What are these?");
    for (block, role, starts) in [
        (
            r#"{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"x"}}"#,
            "user",
            "messages.0.content.0.source.media_type: must be one of",
        ),
        (
            r#"{"type":"image","source":{"type":"base64","media_type":"image/png"}}"#,
            "user",
            "messages.0.content.0.source.data: field required",
        ),
        (
            r#"{"type":"image","source":{"type":"url","url":"ftp://x"}}"#,
            "user",
            "messages.0.content.0.source.url:",
        ),
        (
            r#"{"type":"image","source":{"type":"file","file_id":"f"}}"#,
            "user",
            "messages.0.content.0.source.type: \"file\"",
        ),
        (
            r#"{"type":"image","source":{"type":"url","url":"https://x/y.png"}}"#,
            "assistant",
            "messages.0.content.0.type: a \"image\" block belongs in a user message",
        ),
    ] {
        assert_block_refused(role, block, starts);
    }
}

#[test]
fn accepts_string_and_block_content() {
    let req = parse(
        r#"{"model":"sim-llama-3-8b","max_tokens":16,
            "system":[{"type":"text","text":"Be "},{"type":"text","text":"brief.","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"Hi"},
                        {"role":"assistant","content":[{"type":"text","text":"Hello"}]},
                        {"role":"user","content":"More"}],
            "stream":true,"temperature":0.5,"top_p":0.9,"top_k":40,
            "stop_sequences":["END"],"metadata":{"user_id":"session-7"}}"#,
    )
    .unwrap();
    assert_eq!(req.system.as_deref(), Some("Be brief."));
    assert_eq!(req.messages.len(), 3);
    assert_eq!(req.messages[1].role, Role::Assistant);
    assert_eq!(req.messages[1].text, "Hello");
    assert!(req.stream);
    assert_eq!(req.sampling.top_k, Some(40));
    assert_eq!(req.session.as_deref(), Some("session-7"));
}

#[test]
fn names_the_problem() {
    let cases = [
        ("", "empty"),
        ("{", "not valid JSON"),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"x"}]}"#,
            "max_tokens: field required",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":"ten","messages":[]}"#,
            "expected i64",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
            "at least 1",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[]}"#,
            "at least one message",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"robot","content":"x"}]}"#,
            "unknown variant `robot`",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}"#,
            "messages.0.content.0.source.type: must be",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"temperature":1.5}"#,
            "temperature",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}"#,
            "tools.0.input_schema: field required",
        ),
        (
            r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"stop_sequences":[""]}"#,
            "stop_sequences.0",
        ),
    ];
    for (body, needle) in cases {
        let err = parse(body).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{body}");
        assert!(err.message().contains(needle), "{body}: {}", err.message());
    }
}

#[test]
fn invalid_utf8_is_a_client_error() {
    let (models, max) = limits();
    let err =
        crate::messages::parse(b"{\"model\":\"\xff\"}", Limits::new(&models, max)).unwrap_err();
    assert!(err.message().contains("UTF-8"), "{}", err.message());
}

#[test]
fn unknown_model_is_not_found() {
    let err =
        parse(r#"{"model":"gpt-9","max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#)
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.message().contains("gpt-9"));
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::from),
            Just(serde_json::Value::from("sim-llama-3-8b")),
            Just(serde_json::Value::from("user")),
            Just(serde_json::Value::from("text")),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("model".to_owned()),
                        Just("max_tokens".to_owned()),
                        Just("messages".to_owned()),
                        Just("role".to_owned()),
                        Just("content".to_owned()),
                        Just("type".to_owned()),
                        Just("text".to_owned()),
                        Just("system".to_owned()),
                        Just("stream".to_owned()),
                        Just("top_k".to_owned()),
                        Just("metadata".to_owned()),
                        Just("user_id".to_owned()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..6,
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_give_a_client_error(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let (models, max) = limits();
            if let Err(e) = crate::messages::parse(&bytes, Limits::new(&models, max)) {
                prop_assert!(e.kind().status().is_client_error());
                prop_assert!(!e.message().is_empty());
            }
        }

        #[test]
        fn near_valid_json_gives_a_request_or_a_client_error(value in json_value()) {
            let (models, max) = limits();
            let bytes = serde_json::to_vec(&value).unwrap();
            match crate::messages::parse(&bytes, Limits::new(&models, max)) {
                Ok(request) => {
                    prop_assert!(!request.messages.is_empty());
                    prop_assert!(request.max_tokens >= 1 && request.max_tokens <= max);
                }
                Err(e) => prop_assert!(e.kind().status().is_client_error()),
            }
        }
    }
}
