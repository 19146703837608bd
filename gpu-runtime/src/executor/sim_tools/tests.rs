//! The simulated model's tool calls: the rule (forced by name, forced any, auto with the tool
//! named, after a result, none), arguments built for the schema, and the calls as an engine
//! streams them.

use serde_json::{Value, json};

use super::*;
use crate::request::{GenerateEvent, GenerateRequest, SamplingParams, ToolSpec};
use crate::{EngineConfig, EngineError, EngineHandle, Executor, FinishReason, SimCostModel};
use crate::{SimExecutor, StepOutcome, StepPlan};

fn tool(name: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: None,
        parameters: serde_json::value::to_raw_value(&parameters).unwrap(),
    }
}

/// Claude Code's shell tool and a reading tool, as they offer them (abridged).
fn tools() -> Vec<ToolSpec> {
    vec![
        tool(
            "Bash",
            json!({"type": "object", "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number"},
            }, "required": ["command"], "additionalProperties": false}),
        ),
        tool(
            "Read",
            json!({"type": "object", "properties": {
                "file_path": {"type": "string"},
                "offset": {"type": "integer"},
            }, "required": ["file_path"]}),
        ),
    ]
}

fn offer(choice: Option<ToolChoice>) -> ToolOffer {
    ToolOffer {
        tools: tools(),
        choice,
        parallel: None,
    }
}

fn message(role: Role, text: &str) -> ChatMessage {
    ChatMessage {
        role,
        text: text.to_owned(),
        ..ChatMessage::default()
    }
}

fn user(text: &str) -> ChatMessage {
    message(Role::User, text)
}

fn called(call: Option<ToolCall>) -> (String, Value) {
    let call = call.expect("a tool call");
    (call.name, serde_json::from_str(&call.arguments).unwrap())
}

#[test]
fn a_named_tool_choice_calls_that_tool_with_its_required_arguments() {
    let forced = offer(Some(ToolChoice::Named("Read".into())));
    let (name, arguments) = called(plan(&forced, &[user("hello")], 1));
    assert_eq!(name, "Read");
    assert_eq!(arguments, json!({"file_path": ""}));
}

#[test]
fn a_required_tool_choice_calls_the_first_tool_on_every_turn() {
    let forced = offer(Some(ToolChoice::Required));
    let (name, arguments) = called(plan(&forced, &[user("hello")], 1));
    assert_eq!(name, "Bash");
    assert_eq!(arguments, json!({"command": ""}));
    // Forced is forced: a tool's result does not let the model off.
    let after_result = [
        user("hello"),
        ChatMessage {
            role: Role::Assistant,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "Bash".into(),
                arguments: "{}".into(),
            }],
            ..ChatMessage::default()
        },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..user("done")
        },
    ];
    assert!(plan(&forced, &after_result, 1).is_some());
}

#[test]
fn auto_calls_the_tool_the_last_user_message_names_first() {
    for choice in [None, Some(ToolChoice::Auto)] {
        let auto = offer(choice);
        let (name, _) = called(plan(&auto, &[user("Use Read, then Bash, on it.")], 1));
        assert_eq!(name, "Read");
        let (name, _) = called(plan(&auto, &[user("Run `Bash` with ls")], 1));
        assert_eq!(name, "Bash");
    }
}

#[test]
fn auto_answers_text_when_no_tool_is_named_as_a_word() {
    let auto = offer(Some(ToolChoice::Auto));
    assert_eq!(plan(&auto, &[user("say hi")], 1), None);
    // A part of a word, another case or a tool named only earlier is no request for it.
    assert_eq!(plan(&auto, &[user("Bashful readers, hello")], 1), None);
    assert_eq!(plan(&auto, &[user("Bash_x and Read-only")], 1), None);
    let earlier = [
        user("Run Bash"),
        message(Role::Assistant, "Done."),
        user("thanks"),
    ];
    assert_eq!(plan(&auto, &earlier, 1), None);
    // The user's words, not the notes of a system message.
    let system_last = [user("hello"), message(Role::System, "Bash is available")];
    assert_eq!(plan(&auto, &system_last, 1), None);
}

#[test]
fn auto_reads_the_users_message_before_an_agents_system_notes() {
    // Claude Code ends its first request with a system message (its environment).
    let conversation = [
        user("Run Bash, then say what it printed."),
        message(Role::System, "Today's date is 2026-12-07."),
    ];
    let (name, _) = called(plan(&offer(None), &conversation, 1));
    assert_eq!(name, "Bash");
}

#[test]
fn auto_answers_text_after_a_tools_result_even_if_the_turn_names_a_tool() {
    let auto = offer(None);
    let conversation = [
        user("Run Bash"),
        ChatMessage {
            role: Role::Assistant,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "Bash".into(),
                arguments: "{\"command\":\"\"}".into(),
            }],
            ..ChatMessage::default()
        },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..user("ok")
        },
        // Claude Code puts reminders after a result; they may name tools.
        user("<system-reminder>Bash is still there</system-reminder>"),
    ];
    assert_eq!(plan(&auto, &conversation, 1), None);
}

#[test]
fn none_or_no_tools_answers_text() {
    let none = offer(Some(ToolChoice::None));
    assert_eq!(plan(&none, &[user("Run Bash")], 1), None);
    let empty = ToolOffer {
        tools: vec![],
        choice: Some(ToolChoice::Required),
        parallel: None,
    };
    assert_eq!(plan(&empty, &[user("Run Bash")], 1), None);
}

#[test]
fn the_call_id_is_deterministic_per_prompt() {
    let forced = offer(Some(ToolChoice::Required));
    let a = plan(&forced, &[user("x")], 7).unwrap();
    assert_eq!(a, plan(&forced, &[user("x")], 7).unwrap());
    assert_ne!(a.id, plan(&forced, &[user("x")], 8).unwrap().id);
    assert!(a.id.starts_with("call_"), "{}", a.id);
}

#[test]
fn arguments_fill_every_required_property_by_its_type() {
    let schema = json!({
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "argv": {"type": "array", "items": {"type": "string"}},
            "timeout_ms": {"type": "integer"},
            "ratio": {"type": "number"},
            "background": {"type": "boolean"},
            "nothing": {"type": "null"},
            "optional": {"type": "string"},
            "env": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "level": {"type": "integer"}},
                "required": ["name", "level"],
            },
        },
        "required": ["command", "argv", "timeout_ms", "ratio", "background", "nothing", "env"],
    });
    assert_eq!(
        arguments_for(&schema),
        json!({
            "command": "",
            "argv": [],
            "timeout_ms": 0,
            "ratio": 0.0,
            "background": false,
            "nothing": null,
            "env": {"name": "", "level": 0},
        })
    );
}

#[test]
fn arguments_honour_enums_consts_bounds_unions_and_refs() {
    let schema = json!({
        "type": "object",
        "$defs": {"Step": {"type": "object", "properties": {
            "status": {"enum": ["pending", "in_progress", "completed"]},
        }, "required": ["status"]}},
        "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "kind": {"const": "patch"},
            "name": {"type": "string", "minLength": 3},
            "count": {"type": "integer", "minimum": 2},
            "above": {"type": "integer", "exclusiveMinimum": 5},
            "below": {"type": "number", "maximum": -1},
            "old": {"type": "integer", "minimum": 0, "exclusiveMinimum": true},
            "either": {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
            "nullable": {"type": ["null", "string"]},
            "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "minItems": 1},
            "implied": {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
        "required": ["mode", "kind", "name", "count", "above", "below", "old", "either",
                     "nullable", "steps", "implied"],
    });
    assert_eq!(
        arguments_for(&schema),
        json!({
            "mode": "fast",
            "kind": "patch",
            "name": "xxx",
            "count": 2,
            "above": 6,
            "below": -1.0,
            "old": 1,
            "either": false,
            "nullable": "",
            "steps": [{"status": "pending"}],
            "implied": {"x": 0},
        })
    );
}

#[test]
fn arguments_are_an_object_whatever_the_schema() {
    assert_eq!(arguments_for(&json!({})), json!({}));
    assert_eq!(arguments_for(&json!({"type": "string"})), json!({}));
    assert_eq!(arguments_for(&json!(true)), json!({}));
    // A schema that refers to itself ends, with null where it would go on.
    let tree = json!({"type": "object", "properties": {"child": {"$ref": "#"}},
                      "required": ["child"]});
    let mut value = &arguments_for(&tree);
    let mut depth = 0;
    while let Some(child) = value.get("child") {
        value = child;
        depth += 1;
    }
    assert!(value.is_null() && depth < 2 * MAX_SCHEMA_DEPTH, "{depth}");
}

fn ask(tools: Option<ToolOffer>, text: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        request_id: "tools".into(),
        system: Some("You are an agent.".into()),
        messages: vec![user(text)],
        max_tokens,
        stop_sequences: vec![],
        sampling: SamplingParams::default(),
        prompt: None,
        priority: 0,
        tools: tools.map(Box::new),
        effort: None,
        output_format: None,
    }
}

fn fast() -> EngineConfig {
    EngineConfig {
        time_scale: 0.0,
        ..EngineConfig::simulated("gpu-0")
    }
}

async fn events(engine: &EngineHandle, request: GenerateRequest) -> Vec<GenerateEvent> {
    let mut stream = engine.submit(request).unwrap();
    let mut out = Vec::new();
    while let Some(event) = stream.next().await {
        out.push(event);
    }
    out
}

/// The call's id, name and whole arguments, the number of pieces, and the finish.
fn assembled(events: &[GenerateEvent]) -> (String, String, String, usize, &GenerateEvent) {
    let (mut id, mut name, mut arguments, mut pieces) = (None, None, String::new(), 0);
    for event in events {
        match event {
            GenerateEvent::Token { text } => panic!("text beside a call: {text:?}"),
            GenerateEvent::ToolCall {
                index,
                id: i,
                name: n,
                arguments: a,
            } => {
                assert_eq!(*index, 0);
                assert_eq!(
                    i.is_some(),
                    pieces == 0,
                    "the id comes with the first piece"
                );
                assert_eq!(
                    n.is_some(),
                    pieces == 0,
                    "the name comes with the first piece"
                );
                id = id.or(i.clone());
                name = name.or(n.clone());
                arguments.push_str(a);
                pieces += 1;
            }
            _ => {}
        }
    }
    let finished = events.last().unwrap();
    (id.unwrap(), name.unwrap(), arguments, pieces, finished)
}

#[tokio::test]
async fn a_simulated_engine_streams_a_forced_call_one_piece_a_token() {
    let engine = EngineHandle::spawn(fast()).unwrap();
    let forced = offer(Some(ToolChoice::Named("Bash".into())));
    let got = events(&engine, ask(Some(forced.clone()), "list the files", 64)).await;
    assert!(matches!(got[0], GenerateEvent::Started { .. }), "{got:?}");
    let (id, name, arguments, pieces, finished) = assembled(&got);
    assert_eq!(name, "Bash");
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"command": ""})
    );
    let GenerateEvent::Finished {
        reason,
        output_tokens,
        ..
    } = finished
    else {
        panic!("{finished:?}")
    };
    assert_eq!(*reason, FinishReason::ToolCalls);
    assert_eq!(
        *output_tokens as usize, pieces,
        "one piece a generated token"
    );
    assert!(pieces > 1, "streamed in pieces: {pieces}");
    // The same conversation gets the same call.
    let again = events(&engine, ask(Some(forced), "list the files", 64)).await;
    assert_eq!(assembled(&again).0, id);
}

#[tokio::test]
async fn a_call_fits_a_small_max_tokens_whole() {
    let engine = EngineHandle::spawn(fast()).unwrap();
    let got = events(
        &engine,
        ask(Some(offer(Some(ToolChoice::Required))), "hi", 1),
    )
    .await;
    let (_, name, arguments, pieces, finished) = assembled(&got);
    assert_eq!((name.as_str(), pieces), ("Bash", 1));
    assert_eq!(arguments, "{\"command\":\"\"}");
    assert!(matches!(
        finished,
        GenerateEvent::Finished {
            reason: FinishReason::ToolCalls,
            output_tokens: 1,
            ..
        }
    ));
}

#[tokio::test]
async fn a_simulated_engine_answers_text_when_no_call_is_due() {
    let engine = EngineHandle::spawn(fast()).unwrap();
    for tools in [None, Some(offer(None))] {
        let got = events(&engine, ask(tools, "say hi", 64)).await;
        assert!(got.iter().any(|e| matches!(e, GenerateEvent::Token { .. })));
        assert!(
            !got.iter()
                .any(|e| matches!(e, GenerateEvent::ToolCall { .. }))
        );
        assert!(matches!(
            got.last(),
            Some(GenerateEvent::Finished {
                reason: FinishReason::EndOfTurn | FinishReason::MaxTokens,
                ..
            })
        ));
    }
    // Auto with a tool named: the call.
    let got = events(&engine, ask(Some(offer(None)), "Use Read on it", 64)).await;
    assert_eq!(assembled(&got).1, "Read");
}

/// The simulated executor as a model executor would be: no simulated calls.
#[derive(Debug)]
struct NoTools(SimExecutor);

impl Executor for NoTools {
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        self.0.execute(plan)
    }
}

#[tokio::test]
async fn an_engine_whose_executor_does_not_simulate_calls_refuses_tools() {
    let engine = EngineHandle::spawn_with_executor(
        fast(),
        NoTools(SimExecutor::new(SimCostModel::default())),
    )
    .unwrap();
    assert!(!engine.simulates_tool_calls());
    assert!(EngineHandle::spawn(fast()).unwrap().simulates_tool_calls());
    let refused = engine.submit(ask(Some(offer(Some(ToolChoice::Required))), "hi", 8));
    assert!(matches!(refused, Err(EngineError::ToolsUnsupported)));
    // Without tools it serves as before.
    assert!(engine.submit(ask(None, "hi", 8)).is_ok());
}
