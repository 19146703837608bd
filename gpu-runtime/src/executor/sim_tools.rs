//! The simulated model's tool calls: whether a request that offers tools is answered with a
//! call, which tool it calls, and arguments that are valid for the tool's schema.
//!
//! This module owns that decision and the arguments' construction, as pure functions of the
//! request, so a given conversation always gets the same answer. It must not know about
//! steps, blocks or the clock: the engine streams the planned call over the tokens the
//! simulated executor generates ([`crate::EngineHandle::submit`]). Only the simulated executor
//! answers with calls ([`crate::Executor::simulates_tool_calls`]); a model executor has no
//! tool-calling chat template, and its engine refuses tools.
//!
//! # The rule
//!
//! The simulated model calls at most one tool per turn:
//!
//! - `tool_choice` forces a call (a named tool, or `required` / Anthropic's `any`): it calls
//!   the named tool, or the first tool offered, on every turn, as a real model forced to must.
//! - `tool_choice` `none`, or no tools offered: it answers with text.
//! - `auto` (or no `tool_choice`): it answers with text when the conversation's current user
//!   turn (the messages after the last assistant message) carries a tool's result, so an
//!   agent's loop always ends. Otherwise, when the turn's last user message (system messages
//!   after it, an agent's notes, are not the user's words) names one of the offered tools as
//!   a whole word (case-sensitive; `Bash`, `shell`), it calls the tool named first in that
//!   text; else it answers with text.
//!
//! The arguments are the smallest object the tool's JSON schema accepts, built by
//! [`arguments_for`]: every required property filled by its type (strings empty or of their
//! `minLength`, numbers their `minimum` or 0, booleans `false`, arrays of `minItems` items or
//! empty, objects recursively), `const` and the first of `enum` where given, the first branch
//! of `anyOf` / `oneOf`, local `$ref`s followed.

use serde_json::{Map, Value};

use crate::request::{ChatMessage, Role, ToolCall, ToolChoice, ToolOffer};

/// How deep [`arguments_for`] follows nested schemas (and `$ref`s) before it stops with
/// `null`: a recursive schema (a tree node whose children are tree nodes) must not recurse
/// forever, and no tool's arguments nest anywhere near this deep.
const MAX_SCHEMA_DEPTH: usize = 32;

/// Most items [`arguments_for`] puts in an array whose schema asks for at least `minItems`:
/// a schema demanding more than this is not one a tool would offer, and the arguments stay
/// small.
const MAX_MIN_ITEMS: u64 = 16;

/// Longest string [`arguments_for`] writes for a `minLength`, for the same reason.
const MAX_MIN_LENGTH: u64 = 256;

/// The call the simulated model makes for this request, if any (see the module's rule).
/// `key` (the prompt's fingerprint, seeded) makes the call's id.
pub(crate) fn plan(offer: &ToolOffer, messages: &[ChatMessage], key: u64) -> Option<ToolCall> {
    let spec = match offer.choice.as_ref().unwrap_or(&ToolChoice::Auto) {
        ToolChoice::None => None,
        ToolChoice::Required => offer.tools.first(),
        ToolChoice::Named(name) => {
            // The doors refuse a named tool that is not offered; should one come anyway, the
            // call is still made, with the one object every schema-less tool takes.
            return Some(ToolCall {
                id: call_id(key),
                name: name.clone(),
                arguments: offer
                    .tools
                    .iter()
                    .find(|t| &t.name == name)
                    .map_or_else(|| "{}".to_owned(), |t| arguments_text(t.parameters.get())),
            });
        }
        ToolChoice::Auto => named_in_last_message(offer, messages),
    }?;
    Some(ToolCall {
        id: call_id(key),
        name: spec.name.clone(),
        arguments: arguments_text(spec.parameters.get()),
    })
}

/// Under `auto`: the offered tool the current turn's last user message names first, unless
/// the turn answers a call (then the model reports on the result in text).
fn named_in_last_message<'a>(
    offer: &'a ToolOffer,
    messages: &[ChatMessage],
) -> Option<&'a crate::request::ToolSpec> {
    let turn_start = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .map_or(0, |i| i + 1);
    let turn = &messages[turn_start..];
    if turn.iter().any(|m| m.tool_call_id.is_some()) {
        return None;
    }
    let last = turn.iter().rev().find(|m| m.role == Role::User)?;
    offer
        .tools
        .iter()
        .filter_map(|t| first_word_at(&last.text, &t.name).map(|at| (at, t)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, t)| t)
}

/// Where `word` first stands in `text` as a whole word: not preceded or followed by a
/// character that could continue a tool's name (alphanumerics, `_`, `-`).
fn first_word_at(text: &str, word: &str) -> Option<usize> {
    if word.is_empty() {
        return None;
    }
    let continues = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(continues) && !after.is_some_and(continues)
    })
}

/// A call id unique to the prompt (the same prompt and seed give the same id).
fn call_id(key: u64) -> String {
    format!("call_{key:016x}")
}

/// [`arguments_for`] the schema given as JSON text, as compact JSON text; a schema that is
/// not JSON (the doors pass only JSON) gets the empty object.
fn arguments_text(schema: &str) -> String {
    let schema = serde_json::from_str(schema).unwrap_or(Value::Null);
    arguments_for(&schema).to_string()
}

/// The smallest arguments object `schema` (a tool's parameters) accepts, as the module's
/// rule builds it. Always an object: a tool's arguments are one, whatever its schema says.
pub fn arguments_for(schema: &Value) -> Value {
    match value_for(schema, schema, 0) {
        object @ Value::Object(_) => object,
        _ => Value::Object(Map::new()),
    }
}

/// A value `schema` accepts; `root` is the document local `$ref`s point into.
fn value_for(schema: &Value, root: &Value, depth: usize) -> Value {
    let Some(schema) = schema.as_object() else {
        // `true` or a missing schema: anything goes, and null is the least of anything.
        return Value::Null;
    };
    if depth >= MAX_SCHEMA_DEPTH {
        return Value::Null;
    }
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| resolve(root, r))
    {
        return value_for(target, root, depth + 1);
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema
            .get(key)
            .and_then(Value::as_array)
            .and_then(|b| b.first())
        {
            // `allOf`'s first branch alone is what a tool's schema means in practice (one
            // object, perhaps with a refinement); the other two accept any one branch.
            return value_for(first, root, depth + 1);
        }
    }
    match type_of(schema) {
        "string" => {
            let len = schema
                .get("minLength")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(MAX_MIN_LENGTH);
            Value::String("x".repeat(len as usize))
        }
        "integer" => {
            let at_least = lower_bound(schema);
            Value::from(at_least.ceil() as i64)
        }
        "number" => {
            let at_least = lower_bound(schema);
            serde_json::Number::from_f64(at_least).map_or(Value::from(0), Value::Number)
        }
        "boolean" => Value::Bool(false),
        "array" => {
            let count = schema
                .get("minItems")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(MAX_MIN_ITEMS);
            let items = schema.get("items").unwrap_or(&Value::Null);
            Value::Array(
                (0..count)
                    .map(|_| value_for(items, root, depth + 1))
                    .collect(),
            )
        }
        "object" => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let required = schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            let mut object = Map::new();
            for name in required {
                let property = properties
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties"))
                    .unwrap_or(&Value::Null);
                object.insert(name.to_owned(), value_for(property, root, depth + 1));
            }
            Value::Object(object)
        }
        _ => Value::Null,
    }
}

/// The schema's type: `type` itself, the first non-null one of a list, or what its keywords
/// imply (`properties`: an object, `items`: an array); `"null"` when nothing says.
fn type_of(schema: &Map<String, Value>) -> &str {
    match schema.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.contains_key("properties") || schema.contains_key("required") => "object",
        _ if schema.contains_key("items") => "array",
        _ => "null",
    }
}

/// A number the schema accepts: its `minimum`, or just above its `exclusiveMinimum` (by 1,
/// which serves integers and numbers alike); with neither, 0, or a negative `maximum` when 0
/// is above it.
fn lower_bound(schema: &Map<String, Value>) -> f64 {
    let minimum = schema.get("minimum").and_then(Value::as_f64);
    let exclusive = match schema.get("exclusiveMinimum") {
        // Draft 4's form: a flag on `minimum`.
        Some(Value::Bool(true)) => minimum.map(|m| m + 1.0),
        Some(bound) => bound.as_f64().map(|m| m + 1.0),
        None => None,
    };
    match (minimum, exclusive) {
        (None, None) => {
            let maximum = schema.get("maximum").and_then(Value::as_f64);
            maximum.filter(|&m| m < 0.0).unwrap_or(0.0)
        }
        (a, b) => a.unwrap_or(f64::MIN).max(b.unwrap_or(f64::MIN)),
    }
}

/// The schema a local `$ref` (`#/$defs/Name`, `#/definitions/Name`, any JSON pointer into
/// the document) points at.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests;
