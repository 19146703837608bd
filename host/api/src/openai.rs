//! The OpenAI doors, inbound: `POST /v1/chat/completions` and `POST /v1/completions` bodies
//! into the one [`Request`]. (Their replies are written by [`crate::reply::openai`].)
//!
//! Tools (`tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls`, `tool`
//! messages), `image_url` parts, `reasoning_effort` and structured output
//! (`response_format`) are read into the same chat the Messages door makes; system and
//! developer messages after the first turn stay where they are. What does not change the
//! answer when a server never sees it is noted ([`crate::fields::FieldNotes`]: `store`,
//! `metadata`, `verbosity`, `prediction`, `web_search_options`, …); what would change it and
//! cannot be served (logprobs, penalties, `n > 1`, audio, the deprecated `functions`) is
//! refused with a 400 naming the field and the feature. `prompt_cache_key`, else `user`, is
//! the session key.

use ringmaster_wire::chat::{
    ChatMessage, Image, OutputFormat, Role, ToolCall, ToolChoice, ToolSpec,
};
use ringmaster_wire::openai::{self, Content, Prompt, Stop};
use serde_json::Value;

use crate::error::ApiError;
use crate::fields::FieldNotes;
use crate::json::{is_empty, read_tracked};
use crate::request::{Limits, Request};
use crate::{Door, rules};

/// `max_tokens` of a completion that names none (OpenAI's own default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

/// The schema of a function offered without one.
const EMPTY_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

/// Parses and validates a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let (mut raw, unknown): (openai::Request<'_>, _) = read_tracked(body)?;
    let mut notes = FieldNotes {
        unknown,
        ..FieldNotes::default()
    };
    foreign_fields(&raw, &openai::COMPLETIONS_ONLY_FIELDS, &mut notes);
    if !is_empty(raw.functions.as_ref()) || !is_empty(raw.function_call.as_ref()) {
        return Err(rules::refused(
            if raw.functions.is_some() {
                "functions"
            } else {
                "function_call"
            },
            "the deprecated function calling (use tools and tool_choice)",
        ));
    }
    let tools = tool_offer(
        raw.tools.take(),
        raw.tool_choice.take(),
        raw.parallel_tool_calls,
    )?;
    let output_format = response_format(raw.response_format.take())?;
    if !is_empty(raw.top_logprobs.as_ref()) {
        return Err(rules::refused("top_logprobs", "log probabilities"));
    }
    if let Some(modalities) = &raw.modalities
        && modalities
            .as_array()
            .is_none_or(|m| m.iter().any(|x| x.as_str() != Some("text")))
    {
        return Err(rules::refused("modalities", "output other than text"));
    }
    if !is_empty(raw.audio.as_ref()) {
        return Err(rules::refused("audio", "audio output"));
    }
    // Predicted outputs only make a server faster; the hosted web search is a tool the
    // fleet cannot run.
    for (field, value) in [
        ("prediction", &raw.prediction),
        ("web_search_options", &raw.web_search_options),
        ("verbosity", &raw.verbosity),
        ("prompt_cache_retention", &raw.prompt_cache_retention),
    ] {
        if value.is_some() {
            notes.unused(field);
        }
    }
    let effort = rules::effort(raw.reasoning_effort.as_deref(), "reasoning_effort")?;
    let raw_messages = raw.messages.take().unwrap_or_default();
    if raw_messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let (system, messages) = chat_messages(raw_messages, limits.volatile, &mut notes)?;
    let (max_tokens, field) = match raw.max_completion_tokens {
        Some(n) => (Some(n), "max_completion_tokens"),
        None => (raw.max_tokens, "max_tokens"),
    };
    let mut request = common(
        raw,
        Door::Chat,
        (max_tokens, field, limits.max_output_tokens),
        (limits, &mut notes),
    )?;
    (request.system, request.volatile) = system;
    request.messages = messages;
    request.tools = tools;
    request.output_format = output_format;
    request.show_reasoning = true;
    if effort.is_some() {
        request.effort = effort;
        notes.reasoning = Some("reasoning_effort");
    }
    notes.settle(limits.unknown_fields)?;
    request.fields = notes;
    Ok(request.estimate())
}

/// `response_format`: text (nothing to do), any JSON object, or JSON following a schema.
fn response_format(format: Option<Value>) -> Result<Option<Box<OutputFormat>>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Box::new(OutputFormat::JsonObject))),
        Some("json_schema") => {
            let spec = format.get("json_schema");
            let schema = spec
                .and_then(|s| s.get("schema"))
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema: field required (a JSON schema object)",
                    )
                })?;
            let name = spec
                .and_then(|s| s.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("output")
                .to_owned();
            let strict = spec.and_then(|s| s.get("strict")).and_then(Value::as_bool);
            let schema = serde_json::value::to_raw_value(schema).map_err(|e| {
                ApiError::invalid(format!("response_format.json_schema.schema: {e}"))
            })?;
            Ok(Some(Box::new(OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            })))
        }
        _ => Err(ApiError::invalid(
            "response_format.type: must be one of \"text\", \"json_object\", \"json_schema\"",
        )),
    }
}

/// Parses and validates a `/v1/completions` body.
pub fn parse_completion(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let (mut raw, unknown): (openai::Request<'_>, _) = read_tracked(body)?;
    let mut notes = FieldNotes {
        unknown,
        ..FieldNotes::default()
    };
    foreign_fields(&raw, &openai::CHAT_ONLY_FIELDS, &mut notes);
    let prompt = match raw.prompt.take() {
        Some(Prompt::Text(text)) => text.into_owned(),
        Some(Prompt::List(mut items)) if items.len() == 1 && items[0].is_string() => {
            match items.pop() {
                Some(Value::String(text)) => text,
                _ => String::new(),
            }
        }
        Some(Prompt::List(items)) if !items.is_empty() && items.iter().all(Value::is_string) => {
            return Err(rules::refused("prompt", "more than one prompt per request"));
        }
        Some(Prompt::List(items)) if !items.is_empty() => {
            return Err(rules::refused("prompt", "prompts given as token ids"));
        }
        Some(Prompt::List(_)) => String::new(),
        None => return Err(ApiError::invalid("prompt: field required")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt: must not be empty"));
    }
    if raw.echo == Some(true) {
        return Err(rules::refused("echo", "echoing the prompt"));
    }
    if !is_empty(raw.suffix.as_ref()) {
        return Err(rules::refused("suffix", "insertion (suffix)"));
    }
    if raw.best_of.is_some_and(|b| b != 1) {
        return Err(rules::refused("best_of", "best-of sampling"));
    }
    let max_tokens = raw.max_tokens;
    let default = DEFAULT_COMPLETION_MAX_TOKENS.min(limits.max_output_tokens);
    let mut request = common(
        raw,
        Door::Completions,
        (max_tokens, "max_tokens", default),
        (limits, &mut notes),
    )?;
    request.messages = vec![ChatMessage {
        role: Role::User,
        text: prompt,
        ..ChatMessage::default()
    }];
    request.raw_prompt = true;
    notes.settle(limits.unknown_fields)?;
    request.fields = notes;
    Ok(request.estimate())
}

/// The other endpoint's fields are unknown here, as they are to OpenAI: noted as unknown.
fn foreign_fields(raw: &openai::Request<'_>, foreign: &[&'static str], notes: &mut FieldNotes) {
    let present = |field: &str| match field {
        "messages" => raw.messages.is_some(),
        "max_completion_tokens" => raw.max_completion_tokens.is_some(),
        "tools" => raw.tools.is_some(),
        "tool_choice" => raw.tool_choice.is_some(),
        "parallel_tool_calls" => raw.parallel_tool_calls.is_some(),
        "functions" => raw.functions.is_some(),
        "function_call" => raw.function_call.is_some(),
        "response_format" => raw.response_format.is_some(),
        "top_logprobs" => raw.top_logprobs.is_some(),
        "modalities" => raw.modalities.is_some(),
        "audio" => raw.audio.is_some(),
        "prediction" => raw.prediction.is_some(),
        "reasoning_effort" => raw.reasoning_effort.is_some(),
        "web_search_options" => raw.web_search_options.is_some(),
        "prompt" => raw.prompt.is_some(),
        "echo" => raw.echo.is_some(),
        "suffix" => raw.suffix.is_some(),
        "best_of" => raw.best_of.is_some(),
        "ringmaster_priority" => raw.ringmaster_priority.is_some(),
        _ => false,
    };
    for field in foreign.iter().filter(|field| present(field)) {
        notes.unknown.push((*field).to_owned());
    }
}

/// The system prompt and the volatile lines taken out of it.
type SystemPrompt = (Option<String>, Option<String>);

/// The messages of a chat: the leading system and developer messages make the system prompt
/// (without its volatile lines); later ones stay in the conversation as system messages.
fn chat_messages(
    raw_messages: Vec<openai::Message<'_>>,
    volatile: &crate::VolatileLines,
    notes: &mut FieldNotes,
) -> Result<(SystemPrompt, Vec<ChatMessage>), ApiError> {
    let mut system: Option<String> = None;
    let mut taken: Option<String> = None;
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, m) in raw_messages.into_iter().enumerate() {
        if !is_empty(m.function_call.as_ref()) {
            return Err(rules::refused(
                &format!("messages.{i}.function_call"),
                "the deprecated function calling (use tool_calls)",
            ));
        }
        if m.reasoning_content.is_some() || m.reasoning.is_some() {
            notes.unused("messages.reasoning_content");
        }
        let role = match &*m.role {
            "system" | "developer" => None,
            "user" => Some(Role::User),
            "assistant" | "tool" => Some(Role::Assistant),
            "function" => {
                return Err(rules::refused(
                    &format!("messages.{i}.role"),
                    "the deprecated function calling (use role \"tool\")",
                ));
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.role: {other:?} is not one of \"system\", \"developer\", \
                     \"user\", \"assistant\", \"tool\""
                )));
            }
        };
        let tool_call_id = match (&*m.role, m.tool_call_id) {
            ("tool", Some(id)) => Some(id.into_owned()),
            ("tool", None) => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_call_id: field required in a tool message"
                )));
            }
            (_, Some(_)) => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_call_id: only a tool message names a call"
                )));
            }
            (_, None) => None,
        };
        let tool_calls = match m.tool_calls {
            None => Vec::new(),
            Some(_) if *m.role != *"assistant" => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_calls: only an assistant message calls tools"
                )));
            }
            Some(calls) => tool_calls(calls, &format!("messages.{i}.tool_calls"))?,
        };
        let (text, images) = match m.content {
            None => (String::new(), Vec::new()),
            Some(content) => content_parts(content, &format!("messages.{i}.content"), notes)?,
        };
        if !images.is_empty() && *m.role != *"user" {
            return Err(ApiError::invalid(format!(
                "messages.{i}.content: images go in user messages, not in a {:?} message",
                &*m.role
            )));
        }
        match role {
            None if messages.is_empty() => {
                let (text, lines) = volatile.take_out(text);
                if let Some(lines) = lines {
                    taken.get_or_insert_with(String::new).push_str(&lines);
                }
                match system.as_mut() {
                    Some(s) => {
                        s.push_str("\n\n");
                        s.push_str(&text);
                    }
                    None => system = Some(text),
                }
            }
            None => messages.push(ChatMessage {
                role: Role::System,
                text,
                ..ChatMessage::default()
            }),
            Some(_) if tool_call_id.is_some() => messages.push(ChatMessage {
                role: Role::User,
                text,
                tool_call_id,
                ..ChatMessage::default()
            }),
            Some(role) => messages.push(ChatMessage {
                role,
                text,
                tool_calls,
                tool_call_id: None,
                images,
            }),
        }
    }
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one user or assistant message is required",
        ));
    }
    Ok(((system.filter(|s| !s.is_empty()), taken), messages))
}

/// The tools offered (`tools`, `tool_choice`, `parallel_tool_calls`), validated: functions
/// with a name and (optionally) a JSON schema for their parameters.
fn tool_offer(
    tools: Option<Vec<openai::Tool<'_>>>,
    choice: Option<openai::ToolChoice<'_>>,
    parallel: Option<bool>,
) -> Result<Option<Box<ringmaster_wire::chat::ToolOffer>>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        match tool.kind.as_deref() {
            Some("function") => {}
            Some(kind) => {
                return Err(rules::refused(
                    &format!("tools.{i}.type"),
                    &format!("{kind:?} tools"),
                ));
            }
            None => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.type: field required (\"function\")"
                )));
            }
        }
        let Some(function) = tool.function else {
            return Err(ApiError::invalid(format!(
                "tools.{i}.function: field required (an object)"
            )));
        };
        specs.push(rules::tool_spec(
            &format!("tools.{i}.function"),
            function.name,
            function.description,
            ("parameters", function.parameters, Some(EMPTY_PARAMETERS)),
        )?);
    }
    let choice = match choice {
        None => None,
        Some(openai::ToolChoice::Mode(mode)) => Some(match &*mode {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(format!(
                    "tool_choice: {other:?} is not one of \"auto\", \"none\", \"required\" or a \
                     named function"
                )));
            }
        }),
        Some(openai::ToolChoice::Function(named)) => {
            let name = named.function.and_then(|f| f.name);
            if name.is_none() {
                return Err(ApiError::invalid(
                    "tool_choice: must be \"auto\", \"none\", \"required\" or \
                     {\"type\": \"function\", \"function\": {\"name\": …}}",
                ));
            }
            Some(rules::named_tool(
                name,
                &specs,
                "tool_choice.function.name",
                "",
            )?)
        }
    };
    rules::tool_offer(specs, choice, parallel)
}

/// An assistant message's `tool_calls`: each a function call with an id, a name and its
/// arguments as JSON text.
fn tool_calls(calls: Vec<openai::ToolCall<'_>>, field: &str) -> Result<Vec<ToolCall>, ApiError> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            let (name, arguments) = match call.function {
                Some(function) => (function.name, function.arguments),
                None => (None, None),
            };
            let arguments = match arguments {
                None | Some(openai::Arguments::Json(Value::Null)) => "{}".to_owned(),
                Some(openai::Arguments::Json(object @ Value::Object(_))) => object.to_string(),
                Some(openai::Arguments::Text(text)) => text.into_owned(),
                Some(openai::Arguments::Json(_)) => {
                    return Err(ApiError::invalid(format!(
                        "{field}.{i}.function.arguments: must be JSON text"
                    )));
                }
            };
            match (call.id, name) {
                (Some(id), Some(name)) => Ok(ToolCall {
                    id: id.into_owned(),
                    name: name.into_owned(),
                    arguments,
                }),
                _ => Err(ApiError::invalid(format!(
                    "{field}.{i}: a tool call needs an id and a function name"
                ))),
            }
        })
        .collect()
}

/// What both endpoints validate alike; the caller fills in the prompt. `max_tokens` is the
/// value given, its field's name, and the default when none is.
fn common(
    raw: openai::Request<'_>,
    door: Door,
    (max_tokens, max_tokens_field, default_max_tokens): (Option<i64>, &'static str, u32),
    (limits, notes): (Limits<'_>, &mut FieldNotes),
) -> Result<Request, ApiError> {
    if raw.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let (max_tokens, clamped) = match max_tokens {
        None => (default_max_tokens, None),
        Some(n) => rules::max_tokens(n, max_tokens_field, limits)?,
    };
    if raw.n.is_some_and(|n| n != 1) {
        return Err(rules::refused("n", "more than one choice per request"));
    }
    if !is_empty(raw.logprobs.as_ref()) {
        return Err(rules::refused("logprobs", "log probabilities"));
    }
    if !is_empty(raw.logit_bias.as_ref()) {
        return Err(rules::refused("logit_bias", "logit bias"));
    }
    for (field, value) in [
        ("presence_penalty", raw.presence_penalty),
        ("frequency_penalty", raw.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(rules::refused(field, "a non-zero penalty"));
        }
    }
    if raw.repetition_penalty.is_some_and(|v| v != 1.0) {
        return Err(rules::refused("repetition_penalty", "a repetition penalty"));
    }
    // Stored completions, metadata, tiers (they come from the API key here) and the abuse
    // id change nothing in the answer.
    for (field, present) in [
        ("store", raw.store.is_some()),
        ("metadata", raw.metadata.is_some()),
        ("service_tier", raw.service_tier.is_some()),
        ("safety_identifier", raw.safety_identifier.is_some()),
    ] {
        if present {
            notes.unused(field);
        }
    }
    let temperature = rules::in_range(raw.temperature, "temperature", true, 2.0)?;
    let top_p = rules::in_range(raw.top_p, "top_p", false, 1.0)?;
    let top_k = rules::openai_top_k(raw.top_k)?;
    let seed = match raw.seed {
        None => None,
        Some(s) => Some(
            u64::try_from(s)
                .map_err(|_| ApiError::invalid(format!("seed: must be non-negative, got {s}")))?,
        ),
    };
    let stop_sequences = rules::stop_sequences(
        match raw.stop {
            None => Vec::new(),
            Some(Stop::Text(s)) => vec![s],
            Some(Stop::List(v)) => v,
        },
        "stop",
    )?;
    let session = rules::session(raw.prompt_cache_key.or(raw.user), "user")?;
    let model = rules::served_model(raw.model, limits)?;
    let stream = raw.stream.unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options: allowed only when stream is true",
        ));
    }
    let mut request = Request::new(door, model);
    request.max_tokens = max_tokens;
    request.clamped = clamped;
    request.stream = stream;
    request.include_usage = raw
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    request.sampling.temperature = temperature;
    request.sampling.top_p = top_p;
    request.sampling.top_k = top_k;
    request.sampling.seed = seed;
    request.sampling.ignore_eos = raw.ignore_eos.unwrap_or(false);
    request.stop_sequences = stop_sequences;
    request.session = session;
    Ok(request)
}

/// A message's text and images (`image_url` parts: an http(s) or `data:` URL).
fn content_parts(
    content: Content<'_>,
    field: &str,
    notes: &mut FieldNotes,
) -> Result<(String, Vec<Image>), ApiError> {
    match content {
        Content::Text(text) => Ok((text.into_owned(), Vec::new())),
        Content::List(parts) => {
            let mut text = String::new();
            let mut images = Vec::new();
            for (i, part) in parts.into_iter().enumerate() {
                match (&*part.kind, part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    ("text", None) => {
                        return Err(ApiError::invalid(format!(
                            "{field}.{i}.text: field required"
                        )));
                    }
                    ("image_url", _) => {
                        match part
                            .image_url
                            .and_then(|image| rules::image_url(image.url, true))
                        {
                            Some(image) => images.push(image),
                            None => {
                                return Err(ApiError::invalid(format!(
                                    "{field}.{i}.image_url.url: field required (an http(s) URL \
                                     or a data:image/… URL)"
                                )));
                            }
                        }
                    }
                    ("input_audio", _) => {
                        return Err(rules::refused(&format!("{field}.{i}"), "audio input"));
                    }
                    ("file", _) => {
                        return Err(rules::refused(&format!("{field}.{i}"), "file input"));
                    }
                    // An assistant's earlier refusal, or a part of a type no version of the
                    // API this gateway knows defines: dropped and noted.
                    ("refusal", _) => notes.unused("messages.content.refusal"),
                    (_, _) => notes.unknown.push(format!("{field}.{i}.type")),
                }
            }
            Ok((text, images))
        }
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
