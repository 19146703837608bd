//! A body relayed to a server that speaks the client's own API: the client's JSON as it came,
//! with only what routing must set changed ([`RelayEdits`]): the model's served name, the
//! volatile system-prompt lines taken out, a chat stream's usage asked for, a Responses
//! request's earlier conversation put in front of its input (the gateway keeps the responses,
//! not the server), an output limit above the gateway's lowered to it, the fields only the
//! gateway may set taken out (always: a client's own `kv_transfer_params` must never reach an
//! engine, see [`ringmaster_wire::reserved`]), and, with `[api] unknown_fields = "drop"`, the
//! unknown fields taken out.
//! Everything else, fields this gateway has never heard of included, reaches the server as
//! the client wrote it, so engines that understand more than the gateway serve it.
//!
//! The body is read once at its top level (each value's JSON text borrowed, not parsed); only
//! a value that is edited is parsed and written again.

use ringmaster_wire::object::{ObjectWriter, TopLevel};
use ringmaster_wire::reserved::is_reserved_field;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::Door;
use crate::error::ApiError;
use crate::request::Clamped;
use crate::volatile::VolatileLines;

/// What a relayed body changes.
#[derive(Clone, Copy, Debug)]
pub struct RelayEdits<'a> {
    /// The model's name on the server.
    pub model: &'a str,
    /// The volatile lines to take out (`None`: the server gets them, or there are none).
    pub volatile: Option<&'a VolatileLines>,
    /// Paths of unknown fields to take out (`[api] unknown_fields = "drop"`).
    pub drop: &'a [String],
    /// A chat stream asks for its usage (the gateway counts tokens from it).
    pub stream_usage: bool,
    /// And for it in every chunk (vLLM's `continuous_usage_stats`: the cached-token count
    /// with the first token), for a server known to take it.
    pub usage_stats: bool,
    /// A Responses request's earlier conversation (a JSON array's text), put before its
    /// input; the server stores nothing and is told of no earlier response.
    pub prior_items: Option<&'a str>,
    /// An output limit above the gateway's, lowered to it in the field it was asked in (the
    /// gateway's limit holds whichever server answers).
    pub clamped: Option<Clamped>,
}

/// The body `door`'s client sent, as the server of the same API gets it.
pub fn relay_body(door: Door, body: &[u8], edits: &RelayEdits<'_>) -> Result<Vec<u8>, ApiError> {
    let TopLevel(entries) = TopLevel::parse(body)
        .map_err(|e| ApiError::invalid(format!("request body is not a JSON object: {e}")))?;
    let streamed = entries
        .iter()
        .any(|(k, v)| k == "stream" && v.get().trim() == "true");
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut edited: Vec<(String, String)> = Vec::with_capacity(entries.len() + 2);
    let mut saw_stream_options = false;
    for (key, value) in &entries {
        // The reserved fields go whatever the door noted: this is the last place before a
        // server, so it does not rely on the notes being complete.
        if is_reserved_field(key) || edits.drop.iter().any(|path| path == key) {
            continue;
        }
        let nested: Vec<&str> = edits
            .drop
            .iter()
            .filter_map(|path| path.strip_prefix(key.as_str())?.strip_prefix('.'))
            .collect();
        let text = match (door, key.as_str()) {
            (_, "model") => Some(Value::from(edits.model)),
            (_, field) if edits.clamped.is_some_and(|c| c.field == field) => {
                edits.clamped.map(|c| Value::from(c.served))
            }
            (Door::Messages, "system") if edits.volatile.is_some() => edits
                .volatile
                .map(|v| messages_system(value, v))
                .transpose()?,
            (Door::Chat, "messages") if edits.volatile.is_some() => edits
                .volatile
                .map(|v| chat_messages(value, v))
                .transpose()?,
            (Door::Chat, "stream_options") if streamed && edits.stream_usage => {
                saw_stream_options = true;
                let mut options: Value = parse(value)?;
                if let Some(options) = options.as_object_mut() {
                    options.insert("include_usage".into(), true.into());
                    if edits.usage_stats {
                        options.insert("continuous_usage_stats".into(), true.into());
                    }
                }
                Some(options)
            }
            (Door::Responses, "instructions") if edits.volatile.is_some() => {
                match (value.get().starts_with('"'), edits.volatile) {
                    (true, Some(volatile)) => {
                        let text: String = parse(value)?;
                        Some(Value::from(volatile.take_out(text).0))
                    }
                    _ => None,
                }
            }
            (Door::Responses, "input") => Some(responses_input(value, edits)?),
            (Door::Responses, "previous_response_id") if edits.prior_items.is_some() => continue,
            (Door::Responses, "store") => Some(Value::from(false)),
            _ => None,
        };
        let text = match (text, nested.is_empty()) {
            (None, true) => value.get().to_owned(),
            (text, _) => {
                let mut value = match text {
                    Some(value) => value,
                    None => parse(value)?,
                };
                for path in nested {
                    remove_path(&mut value, path);
                }
                serde_json::to_string(&value).unwrap_or_default()
            }
        };
        edited.push((key.clone(), text));
    }
    if door == Door::Chat && streamed && edits.stream_usage && !saw_stream_options {
        let options = if edits.usage_stats {
            serde_json::json!({"include_usage": true, "continuous_usage_stats": true})
        } else {
            serde_json::json!({"include_usage": true})
        };
        out.push(("stream_options".into(), options));
    }
    if door == Door::Responses && !entries.iter().any(|(k, _)| k == "store") {
        out.push(("store".into(), false.into()));
    }
    let mut object = ObjectWriter::with_capacity(body.len() + 64);
    for (key, text) in &edited {
        object.field(key, text);
    }
    for (key, value) in &out {
        object.field(key, &value.to_string());
    }
    Ok(object.finish())
}

fn parse<T: serde::de::DeserializeOwned>(value: &RawValue) -> Result<T, ApiError> {
    serde_json::from_str(value.get()).map_err(|e| ApiError::invalid(format!("request body: {e}")))
}

/// Removes the field at a dotted path (`messages.0.content.1.colour`) from `value`.
fn remove_path(value: &mut Value, path: &str) {
    let mut segments: Vec<&str> = path.split('.').collect();
    let Some(last) = segments.pop() else {
        return;
    };
    let mut at = value;
    for segment in segments {
        at = match at {
            Value::Object(map) => match map.get_mut(segment) {
                Some(next) => next,
                None => return,
            },
            Value::Array(list) => match segment.parse::<usize>().ok().and_then(|i| list.get_mut(i))
            {
                Some(next) => next,
                None => return,
            },
            _ => return,
        };
    }
    if let Value::Object(map) = at {
        map.remove(last);
    }
}

/// A Messages `system` (text, or text blocks) without its volatile lines; blocks left empty
/// go.
fn messages_system(value: &RawValue, volatile: &VolatileLines) -> Result<Value, ApiError> {
    let mut system: Value = parse(value)?;
    match &mut system {
        Value::String(text) => *text = volatile.take_out(std::mem::take(text)).0,
        Value::Array(blocks) => {
            for block in blocks.iter_mut() {
                if let Some(Value::String(text)) = block.get_mut("text") {
                    *text = volatile.take_out(std::mem::take(text)).0;
                }
            }
            blocks.retain(|block| {
                block.get("type").and_then(Value::as_str) != Some("text")
                    || block
                        .get("text")
                        .and_then(Value::as_str)
                        .is_some_and(|t| !t.is_empty())
            });
        }
        _ => {}
    }
    Ok(system)
}

/// Takes the volatile lines out of a message's content (text, or parts with text).
fn strip_content(content: &mut Value, volatile: &VolatileLines) {
    match content {
        Value::String(text) => *text = volatile.take_out(std::mem::take(text)).0,
        Value::Array(parts) => {
            for part in parts {
                if let Some(Value::String(text)) = part.get_mut("text") {
                    *text = volatile.take_out(std::mem::take(text)).0;
                }
            }
        }
        _ => {}
    }
}

/// A chat's `messages` with the volatile lines out of its leading system and developer
/// messages.
fn chat_messages(value: &RawValue, volatile: &VolatileLines) -> Result<Value, ApiError> {
    let mut messages: Value = parse(value)?;
    if let Value::Array(list) = &mut messages {
        for message in list.iter_mut() {
            let leading = matches!(
                message.get("role").and_then(Value::as_str),
                Some("system" | "developer")
            );
            if !leading {
                break;
            }
            if let Some(content) = message.get_mut("content") {
                strip_content(content, volatile);
            }
        }
    }
    Ok(messages)
}

/// A Responses `input` as items, after the earlier conversation, with the volatile lines out
/// of its leading developer and system messages.
fn responses_input(value: &RawValue, edits: &RelayEdits<'_>) -> Result<Value, ApiError> {
    let input: Value = parse(value)?;
    let mut items: Vec<Value> = match edits.prior_items {
        Some(prior) => serde_json::from_str(prior)
            .map_err(|e| ApiError::internal(format!("a stored response is unreadable: {e}")))?,
        None => Vec::new(),
    };
    match input {
        Value::String(text) => items.push(serde_json::json!({
            "type": "message", "role": "user", "content": text,
        })),
        Value::Array(list) => items.extend(list),
        other => items.push(other),
    }
    if let Some(volatile) = edits.volatile {
        for item in items.iter_mut() {
            let leading = matches!(
                item.get("role").and_then(Value::as_str),
                Some("system" | "developer")
            );
            if !leading {
                break;
            }
            if let Some(content) = item.get_mut("content") {
                strip_content(content, volatile);
            }
        }
    }
    Ok(Value::Array(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edits<'a>(volatile: Option<&'a VolatileLines>) -> RelayEdits<'a> {
        RelayEdits {
            model: "served",
            volatile,
            drop: &[],
            stream_usage: true,
            usage_stats: false,
            prior_items: None,
            clamped: None,
        }
    }

    fn relay(door: Door, body: &str, edits: &RelayEdits<'_>) -> Value {
        serde_json::from_slice(&relay_body(door, body.as_bytes(), edits).unwrap()).unwrap()
    }

    #[test]
    fn a_messages_body_keeps_every_field_but_the_model_and_the_billing_line() {
        let volatile = VolatileLines::new([crate::volatile::CLAUDE_CODE_BILLING_LINE]).unwrap();
        let body = r#"{"model":"claude-opus","max_tokens":32000,"context_management":{"edits":[]},
            "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=ab12;"},
                      {"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"hi"}],"colour":"blue"}"#;
        let relayed = relay(Door::Messages, body, &edits(Some(&volatile)));
        assert_eq!(relayed["model"], "served");
        assert_eq!(
            relayed["context_management"],
            serde_json::json!({"edits": []})
        );
        assert_eq!(relayed["colour"], "blue");
        assert_eq!(
            relayed["system"],
            serde_json::json!([{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}])
        );
        // For a server that wants the line (Anthropic's own API): untouched.
        let kept = relay(Door::Messages, body, &edits(None));
        assert_eq!(
            kept["system"][0]["text"],
            "x-anthropic-billing-header: cc_version=1; cch=ab12;"
        );
        // With unknown fields dropped, nested ones too.
        let drop = ["colour".to_owned(), "messages.0.shade".to_owned()];
        let dropping = RelayEdits {
            drop: &drop,
            ..edits(None)
        };
        let relayed = relay(
            Door::Messages,
            r#"{"model":"m","colour":1,"messages":[{"role":"user","content":"x","shade":2}]}"#,
            &dropping,
        );
        assert_eq!(
            relayed,
            serde_json::json!({"model":"served","messages":[{"role":"user","content":"x"}]})
        );
    }

    #[test]
    fn an_output_limit_above_the_gateways_reaches_the_server_lowered_in_its_own_field() {
        let clamped = |field| RelayEdits {
            clamped: Some(Clamped {
                field,
                asked: 32_000,
                served: 8192,
            }),
            ..edits(None)
        };
        let relayed = relay(
            Door::Messages,
            r#"{"model":"m","max_tokens":32000,"messages":[]}"#,
            &clamped("max_tokens"),
        );
        assert_eq!(relayed["max_tokens"], 8192);
        // Chat's newer field is the one lowered; the older one, not asked in, is left.
        let relayed = relay(
            Door::Chat,
            r#"{"model":"m","max_completion_tokens":32000,"messages":[]}"#,
            &clamped("max_completion_tokens"),
        );
        assert_eq!(relayed["max_completion_tokens"], 8192);
        assert!(relayed.get("max_tokens").is_none());
        let relayed = relay(
            Door::Responses,
            r#"{"model":"m","max_output_tokens":32000,"input":"x"}"#,
            &clamped("max_output_tokens"),
        );
        assert_eq!(relayed["max_output_tokens"], 8192);
        // Without a clamp, the client's number goes as it came.
        let relayed = relay(
            Door::Messages,
            r#"{"model":"m","max_tokens":100,"messages":[]}"#,
            &edits(None),
        );
        assert_eq!(relayed["max_tokens"], 100);
    }

    #[test]
    fn a_chat_stream_asks_for_usage_and_a_responses_body_carries_its_conversation() {
        let relayed = relay(
            Door::Chat,
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"logit_bias":{}}"#,
            &edits(None),
        );
        assert_eq!(relayed["stream_options"]["include_usage"], true);
        assert_eq!(relayed["logit_bias"], serde_json::json!({}));
        let prior = r#"[{"type":"message","role":"user","content":"2+2?"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"4"}]}]"#;
        let relayed = relay(
            Door::Responses,
            r#"{"model":"m","previous_response_id":"resp_1","input":"And 3+3?","store":true}"#,
            &RelayEdits {
                prior_items: Some(prior),
                ..edits(None)
            },
        );
        assert!(relayed.get("previous_response_id").is_none());
        assert_eq!(relayed["store"], false);
        let input = relayed["input"].as_array().unwrap();
        assert_eq!(input.len(), 3);
        assert_eq!(input[2]["content"], "And 3+3?");
        let err = relay_body(Door::Chat, b"[1]", &edits(None)).unwrap_err();
        assert!(
            err.message().contains("not a JSON object"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn the_fields_only_the_gateway_sets_never_leave_whatever_the_door_noted() {
        for door in [
            Door::Messages,
            Door::Chat,
            Door::Completions,
            Door::Responses,
        ] {
            // An escaped key is the same key to the server: it goes too.
            let relayed = relay(
                door,
                r#"{"model":"m","input":"x","messages":[],"kv_transfer_param\u0073":{"do_remote_prefill":true,"remote_host":"10.9.9.9"},
                    "bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":7,"routed_dp_rank":0,
                    "disagg_prefill_dp_rank":1,"ringmaster_priority":9,"colour":"blue"}"#,
                &edits(None),
            );
            let object = relayed.as_object().unwrap();
            for name in ringmaster_wire::reserved::RESERVED_FIELDS {
                assert!(!object.contains_key(name), "{door:?}: {name}");
            }
            assert!(!object.contains_key("ringmaster_priority"), "{door:?}");
            assert_eq!(
                object["colour"], "blue",
                "{door:?}: an unknown field passes"
            );
        }
        let err = relay_body(Door::Chat, b"[1]", &edits(None)).unwrap_err();
        assert!(
            err.message().contains("not a JSON object"),
            "{}",
            err.message()
        );
    }
}
