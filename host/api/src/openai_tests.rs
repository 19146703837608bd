//! The OpenAI doors' parsers: what they accept, what they refuse and how they say so.

use super::*;
use crate::{Door, Limits, Request};

const MODEL: &str = "sim-llama-3-8b";

fn limits(models: &[String]) -> Limits<'_> {
    Limits::new(models, 4096)
}

fn chat(body: &str) -> Result<Request, ApiError> {
    let models = vec![MODEL.to_owned()];
    parse_chat(body.as_bytes(), limits(&models))
}

fn completion(body: &str) -> Result<Request, ApiError> {
    let models = vec![MODEL.to_owned()];
    parse_completion(body.as_bytes(), limits(&models))
}

#[test]
fn a_chat_request_becomes_the_same_request_the_messages_api_makes() {
    let request = chat(
        r#"{"model":"sim-llama-3-8b","messages":[
            {"role":"system","content":"Be brief."},
            {"role":"developer","content":[{"type":"text","text":"No lists."}]},
            {"role":"user","content":"Hi"},
            {"role":"assistant","content":"Hello"},
            {"role":"user","content":[{"type":"text","text":"More"}]}],
          "max_completion_tokens":20,"temperature":1.5,"stop":"END","seed":7,
          "stream":true,"stream_options":{"include_usage":true},"user":"u-1"}"#,
    )
    .unwrap();
    assert_eq!(request.system.as_deref(), Some("Be brief.\n\nNo lists."));
    assert_eq!(request.messages.len(), 3);
    assert_eq!(request.messages[2].text, "More");
    assert_eq!(request.max_tokens, 20);
    assert_eq!(request.sampling.temperature, Some(1.5));
    assert_eq!(request.stop_sequences, ["END"]);
    assert_eq!(request.sampling.seed, Some(7));
    assert_eq!(request.session.as_deref(), Some("u-1"));
    assert!(request.stream);
    assert_eq!(request.door, Door::Chat);
    assert!(request.include_usage);
    // No max_tokens: the gateway's limit.
    let request =
        chat(r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}]}"#).unwrap();
    assert_eq!(request.max_tokens, 4096);
    assert!(!request.stream);
}

#[test]
fn a_completion_request_carries_its_raw_prompt() {
    let request = completion(r#"{"model":"sim-llama-3-8b","prompt":["Once upon"]}"#).unwrap();
    assert!(request.raw_prompt);
    assert_eq!(request.messages[0].text, "Once upon");
    assert_eq!(request.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS);
    assert_eq!(request.door, Door::Completions);
    assert!(!request.include_usage);
    for (body, needle) in [
        (
            r#"{"model":"sim-llama-3-8b","prompt":["a","b"]}"#,
            "more than one prompt",
        ),
        (
            r#"{"model":"sim-llama-3-8b","prompt":[1,2,3]}"#,
            "token ids",
        ),
        (
            r#"{"model":"sim-llama-3-8b","prompt":""}"#,
            "must not be empty",
        ),
        (
            r#"{"model":"sim-llama-3-8b","prompt":"x","echo":true}"#,
            "echo",
        ),
    ] {
        let err = completion(body).unwrap_err();
        assert!(err.message().contains(needle), "{body}: {}", err.message());
    }
}

#[test]
fn known_features_not_served_are_refused_by_name() {
    let with = |extra: &str| {
        chat(&format!(
            r#"{{"model":"sim-llama-3-8b","messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
        ))
    };
    for ok in [
        r#","tools":[]"#,
        r#","tool_choice":"none""#,
        r#","n":1"#,
        r#","logprobs":false"#,
        r#","presence_penalty":0"#,
        r#","response_format":{"type":"text"}"#,
        r#","service_tier":"auto""#,
        r#","top_k":-1"#,
        r#","metadata":{"a":"b"}"#,
        r#","response_format":{"type":"json_object"}"#,
        r#","service_tier":"flex""#,
        r#","store":true"#,
        r#","reasoning_effort":"low""#,
        r#","verbosity":"low""#,
        r#","frobnicate":1"#,
    ] {
        assert!(with(ok).is_ok(), "{ok}: {:?}", with(ok).err());
    }
    for (extra, field, feature) in [
        (
            r#","functions":[{"name":"f"}]"#,
            "functions",
            "deprecated function calling",
        ),
        (
            r#","tools":[{"type":"custom","custom":{"name":"f"}}]"#,
            "tools.0.type",
            "\"custom\" tools",
        ),
        (r#","n":2"#, "n", "more than one choice"),
        (r#","logprobs":true"#, "logprobs", "log probabilities"),
        (
            r#","frequency_penalty":0.5"#,
            "frequency_penalty",
            "penalty",
        ),
    ] {
        let err = with(extra).unwrap_err();
        assert!(
            err.message().starts_with(&format!("{field}: "))
                && err.message().contains(feature)
                && err.message().contains("not supported"),
            "{extra}: {}",
            err.message()
        );
    }
    let err = chat(
        r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}"#,
    )
    .unwrap_err();
    assert!(err.message().contains("audio input"), "{}", err.message());
    let req = chat(
        r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"text","text":"What is it?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}]}"#,
    )
    .unwrap();
    assert_eq!(req.messages[0].images[0].url, "data:image/png;base64,AAAA");
    assert_eq!(req.messages[0].text, "What is it?");
    for body in [
        r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}"#,
        r#"{"model":"sim-llama-3-8b","messages":[{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#,
    ] {
        let err = chat(body).unwrap_err();
        assert!(
            err.message().starts_with("messages.0.content"),
            "{}",
            err.message()
        );
    }
    // What changes nothing here is noted, what nobody defines too.
    let req = with(r#","store":true,"frobnicate":{"x":1},"prompt":"completions only""#).unwrap();
    assert_eq!(req.fields.unused, ["store"]);
    assert_eq!(req.fields.unknown, ["frobnicate", "prompt"]);
    let req = with(r#","reasoning_effort":"high","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object"},"strict":true}}"#).unwrap();
    assert_eq!(req.effort, Some(ringmaster_wire::chat::Effort::High));
    assert_eq!(req.fields.reasoning, Some("reasoning_effort"));
    assert!(matches!(
        req.output_format.as_deref(),
        Some(ringmaster_wire::chat::OutputFormat::JsonSchema { name, strict: Some(true), .. }) if name == "a"
    ));
}

#[test]
fn unknown_fields_are_refused_only_when_the_operator_says_so() {
    let models = vec![MODEL.to_owned()];
    let body = br#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi","colour":1}],"frobnicate":1}"#;
    let strict = Limits {
        unknown_fields: crate::UnknownFields::Refuse,
        ..limits(&models)
    };
    let err = parse_chat(body, strict).unwrap_err();
    assert!(
        err.message()
            .starts_with("messages.0.colour: unknown field"),
        "{}",
        err.message()
    );
    assert!(parse_chat(body, limits(&models)).is_ok());
}

#[test]
fn system_messages_after_the_first_turn_stay_in_place() {
    let req = chat(
        r#"{"model":"sim-llama-3-8b","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"system","content":"The time is noon."},{"role":"user","content":"Time?"}]}"#,
    )
    .unwrap();
    assert_eq!(req.system.as_deref(), Some("Be brief."));
    assert_eq!(
        req.messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::User, Role::System, Role::User]
    );
}

#[test]
fn tools_tool_calls_and_tool_messages_are_read() {
    let req = chat(
        r#"{"model":"sim-llama-3-8b",
            "tools":[{"type":"function","function":{"name":"lookup","description":"Find","parameters":{"type":"object"}}},
                     {"type":"function","function":{"name":"bare"}}],
            "tool_choice":"required","parallel_tool_calls":true,
            "messages":[{"role":"user","content":"Find Paris"},
                        {"role":"assistant","content":null,"tool_calls":[
                            {"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":1}"}}]},
                        {"role":"tool","tool_call_id":"c1","content":"found"}]}"#,
    )
    .unwrap();
    let offer = req.tools.as_deref().unwrap();
    assert_eq!(offer.tools.len(), 2);
    assert_eq!(offer.tools[0].description.as_deref(), Some("Find"));
    assert_eq!(
        offer.tools[1].parameters.get(),
        EMPTY_PARAMETERS,
        "a function without parameters takes none"
    );
    assert_eq!(offer.choice, Some(ToolChoice::Required));
    assert_eq!(offer.parallel, Some(true));
    assert_eq!(req.messages.len(), 3);
    assert_eq!(req.messages[1].tool_calls[0].arguments, r#"{"q":1}"#);
    assert_eq!(req.messages[1].text, "");
    assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(req.messages[2].role, Role::User);
    assert_eq!(req.messages[2].text, "found");
    for (body, starts) in [
        (
            r#""messages":[{"role":"tool","content":"x"}]"#,
            "messages.0.tool_call_id: field required",
        ),
        (
            r#""messages":[{"role":"user","content":"x","tool_calls":[]}]"#,
            "messages.0.tool_calls: only an assistant",
        ),
        (
            r#""messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"c"}]}]"#,
            "messages.0.tool_calls.0: a tool call needs",
        ),
        (
            r#""messages":[{"role":"user","content":"x"}],"tool_choice":"required""#,
            "tool_choice: asks for a tool call",
        ),
        (
            r#""messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes""#,
            "tool_choice: \"sometimes\"",
        ),
        (
            r#""messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
            "tool_choice.function.name:",
        ),
    ] {
        let err = chat(&format!(r#"{{"model":"sim-llama-3-8b",{body}}}"#)).unwrap_err();
        assert!(
            err.message().starts_with(starts),
            "{body}: {}",
            err.message()
        );
    }
}

#[test]
fn bad_values_name_their_field() {
    for (body, needle) in [
        (
            r#"{"model":"nope","messages":[{"role":"user","content":"Hi"}]}"#,
            "not served",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[]}"#,
            "messages: at least one",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"system","content":"S"}]}"#,
            "user or assistant",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"robot","content":"Hi"}]}"#,
            "messages.0.role",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"temperature":2.5}"#,
            "temperature",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"max_tokens":0}"#,
            "max_tokens: must be at least 1",
        ),
        (
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"stream_options":{"include_usage":true}}"#,
            "stream_options",
        ),
    ] {
        let err = chat(body).unwrap_err();
        assert!(err.message().contains(needle), "{body}: {}", err.message());
    }
}

proptest::proptest! {
    #[test]
    fn any_body_is_a_request_or_a_client_error(
        body in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
        field in "(max_tokens|temperature|n|stop|prompt|messages|tools|seed|top_k)",
        value in "(-?[0-9]{1,12}(\\.[0-9]+)?|\"[a-z ]{0,8}\"|null|true|\\[\\]|\\{\\})",
    ) {
        let models = vec![MODEL.to_owned()];
        let structured = format!(
            r#"{{"model":"sim-llama-3-8b","messages":[{{"role":"user","content":"Hi"}}],"prompt":"x","{field}":{value}}}"#
        );
        for bytes in [body.as_slice(), structured.as_bytes()] {
            for parsed in [
                parse_chat(bytes, limits(&models)),
                parse_completion(bytes, limits(&models)),
            ] {
                match parsed {
                    Ok(request) => proptest::prop_assert!((1..=4096).contains(&request.max_tokens)),
                    Err(error) => proptest::prop_assert!(error.kind().status().is_client_error()),
                }
            }
        }
    }
}
