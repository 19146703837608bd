//! The Responses door, inbound: `POST /v1/responses` bodies into the one [`Request`]. (Its
//! replies are written by [`crate::reply::responses`]; the response store is the gateway's.)
//!
//! `input` as text or items (messages with `input_text`/`input_image` parts, `function_call`,
//! `function_call_output`, earlier output items), `instructions`, `developer` and `system`
//! messages, function tools and the functions inside `namespace` tools (offered to servers as
//! `NAMESPACE__NAME`, and written back as the function and its namespace), `tool_choice`
//! (`allowed_tools` too), `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`,
//! `text.format` (structured output), `reasoning.effort`, `metadata`, `prompt_cache_key`
//! (the session key, else `user`). A `previous_response_id` is resolved by the caller: the
//! earlier conversation comes in as [`Prior`] items, read like `input`'s. Hosted tools the
//! fleet cannot run (`web_search`, `file_search`, `code_interpreter`, …) and their calls in
//! earlier turns are dropped and noted; forcing one with `tool_choice` is refused, as are
//! background responses, the Conversations API, stored prompts and items by reference.

use ringmaster_wire::chat::{
    ChatMessage, Image, OutputFormat, Role, ToolCall, ToolChoice, ToolSpec,
};
use ringmaster_wire::responses::{
    self as wire, Content, Echo, Input, Item, Part, ReasoningConfig, TextConfig, Tool,
    ToolChoiceObject,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::fields::FieldNotes;
use crate::json::read_tracked;
use crate::request::{Limits, Request};
use crate::{Door, rules};

/// Joins a `namespace` tool's name and one of its functions' into the one name servers see.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// The schema of a function offered without one.
const EMPTY_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

/// What only the Responses door needs, carried with the request to its reply and its store.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The request's settings, echoed in the response.
    pub echo: Echo,
    /// Whether the response is kept (`store`, true unless set false).
    pub store: bool,
    /// The namespaces of the functions offered inside `namespace` tools.
    pub namespaces: Vec<String>,
    /// The conversation before this request (the stored items of `previous_response_id`'s
    /// response and its output), as a JSON array's text.
    pub prior_items: Option<String>,
    /// This request's input items, as a JSON array's text (a string input as one user
    /// message).
    pub input_items: String,
}

impl Context {
    /// A function call's name as the client knows it: `(namespace, name)` for a function
    /// offered inside a namespace.
    pub fn split_name<'a>(&self, name: &'a str) -> (Option<&'a str>, &'a str) {
        split_namespaced(&self.namespaces, name)
    }
}

/// `NAMESPACE__NAME` as `(Some(NAMESPACE), NAME)` when NAMESPACE is one of `namespaces`.
pub fn split_namespaced<'a>(namespaces: &[String], name: &'a str) -> (Option<&'a str>, &'a str) {
    for namespace in namespaces {
        if let Some(rest) = name
            .strip_prefix(namespace.as_str())
            .and_then(|rest| rest.strip_prefix(NAMESPACE_SEPARATOR))
        {
            return (Some(&name[..namespace.len()]), rest);
        }
    }
    (None, name)
}

/// The conversation a `previous_response_id` continues: its items (JSON array text, the
/// earlier input followed by the earlier output).
#[derive(Clone, Copy, Debug)]
pub struct Prior<'a> {
    /// The response's id.
    pub id: &'a str,
    /// The items, as a JSON array's text.
    pub items: &'a str,
}

/// Parses and validates a `POST /v1/responses` body, continuing `prior` when the body names
/// a `previous_response_id` (the caller looked it up; a body that names one the caller did
/// not find is refused here).
pub fn parse(
    body: &[u8],
    limits: Limits<'_>,
    prior: Option<Prior<'_>>,
) -> Result<Request, ApiError> {
    let (raw, unknown): (wire::Request<'_>, _) = read_tracked(body)?;
    let mut notes = FieldNotes {
        unknown,
        ..FieldNotes::default()
    };
    refused_fields(&raw)?;
    for (field, present) in [
        ("max_tool_calls", raw.max_tool_calls.is_some()),
        (
            "prompt_cache_retention",
            raw.prompt_cache_retention.is_some(),
        ),
        ("safety_identifier", raw.safety_identifier.is_some()),
        ("stream_options", raw.stream_options.is_some()),
        ("truncation", raw.truncation.is_some()),
        ("service_tier", raw.service_tier.is_some()),
        (
            "include",
            raw.include.as_ref().is_some_and(|i| !i.is_empty()),
        ),
    ] {
        if present {
            notes.unused(field);
        }
    }
    if raw.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let previous = match (raw.previous_response_id.as_deref(), prior) {
        (None, _) => None,
        (Some(id), Some(prior)) if prior.id == id => Some(prior),
        (Some(id), _) => {
            return Err(ApiError::not_found(format!(
                "previous_response_id: no response {id:?} is stored here (it was not stored, \
                 was deleted, or expired)"
            )));
        }
    };
    let (max_tokens, clamped) = match raw.max_output_tokens {
        None => (limits.max_output_tokens, None),
        Some(n) => rules::max_tokens(n, "max_output_tokens", limits)?,
    };
    let temperature = rules::in_range(raw.temperature, "temperature", true, 2.0)?;
    let top_p = rules::in_range(raw.top_p, "top_p", false, 1.0)?;
    let top_k = rules::openai_top_k(raw.top_k)?;
    let (specs, namespaces, hosted) = match raw.tools {
        None => (Vec::new(), Vec::new(), Vec::new()),
        Some(tools) => tool_specs(nested(tools, "tools", &mut notes)?, &mut notes)?,
    };
    let choice = match raw.tool_choice {
        None => None,
        Some(choice) => Some(nested(choice, "tool_choice", &mut notes)?),
    };
    let tools = tool_offer(specs, choice, raw.parallel_tool_calls, &hosted)?;
    let text: Option<TextConfig<'_>> = match raw.text {
        None => None,
        Some(text) => Some(nested(text, "text", &mut notes)?),
    };
    if text.as_ref().is_some_and(|t| t.verbosity.is_some()) {
        notes.unused("text.verbosity");
    }
    let output_format = output_format(text.as_ref())?;
    let reasoning: Option<ReasoningConfig<'_>> = match raw.reasoning {
        None => None,
        Some(reasoning) => Some(nested(reasoning, "reasoning", &mut notes)?),
    };
    let effort = rules::effort(
        reasoning.as_ref().and_then(|r| r.effort.as_deref()),
        "reasoning.effort",
    )?;
    if effort.is_some() {
        notes.reasoning = Some("reasoning");
    }
    // The conversation: the earlier one, then this input.
    let mut turn = Turn::default();
    if let Some(prior) = previous {
        let items: Vec<Item<'_>> = serde_json::from_str(prior.items).map_err(|e| {
            ApiError::internal(format!(
                "the stored response {:?} is unreadable: {e}",
                prior.id
            ))
        })?;
        for (i, item) in items.into_iter().enumerate() {
            turn.item(item, &format!("previous_response.{i}"), &mut notes)?;
        }
    }
    let Some(input) = raw.input else {
        return Err(ApiError::invalid("input: field required"));
    };
    let input_items = match nested::<Input<'_>>(input, "input", &mut notes)? {
        Input::Text(text) => {
            let items = serde_json::json!([{
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": &*text}],
            }]);
            turn.message(Role::User, text.into_owned(), Vec::new());
            items.to_string()
        }
        Input::List(items) => {
            for (i, item) in items.into_iter().enumerate() {
                turn.item(item, &format!("input.{i}"), &mut notes)?;
            }
            input.get().to_owned()
        }
    };
    let Turn {
        system,
        mut messages,
        ..
    } = turn;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "input: at least one user or assistant message is required",
        ));
    }
    // `instructions` go first; the leading developer and system messages follow them.
    let system = match (
        raw.instructions.as_deref().filter(|s| !s.is_empty()),
        system,
    ) {
        (Some(instructions), Some(system)) => Some(format!("{instructions}\n\n{system}")),
        (Some(instructions), None) => Some(instructions.to_owned()),
        (None, system) => system,
    };
    let (system, volatile) = match system {
        Some(text) => {
            let (kept, taken) = limits.volatile.take_out(text);
            (Some(kept).filter(|s| !s.is_empty()), taken)
        }
        None => (None, None),
    };
    messages.shrink_to_fit();
    let session = rules::session(raw.prompt_cache_key.clone(), "prompt_cache_key")?
        .or(rules::session(raw.user.clone(), "user")?);
    let model = rules::served_model(raw.model.clone(), limits)?;
    let store = raw.store.unwrap_or(true);
    let echo = Echo {
        instructions: raw.instructions.as_deref().map(str::to_owned),
        metadata: raw
            .metadata
            .filter(|m| m.get() != "null")
            .map_or_else(|| raw_json("{}"), RawValue::to_owned),
        max_output_tokens: raw.max_output_tokens.map(|_| max_tokens),
        parallel_tool_calls: raw.parallel_tool_calls.unwrap_or(true),
        previous_response_id: previous.map(|p| p.id.to_owned()),
        reasoning: raw.reasoning.map_or_else(
            || raw_json(r#"{"effort":null,"summary":null}"#),
            RawValue::to_owned,
        ),
        store,
        temperature,
        text: raw.text.map_or_else(
            || raw_json(r#"{"format":{"type":"text"}}"#),
            RawValue::to_owned,
        ),
        tool_choice: raw
            .tool_choice
            .map_or_else(|| raw_json(r#""auto""#), RawValue::to_owned),
        tools: raw.tools.map_or_else(|| raw_json("[]"), RawValue::to_owned),
        top_p,
        truncation: "disabled",
        user: raw.user.as_deref().map(str::to_owned),
        prompt_cache_key: raw.prompt_cache_key.as_deref().map(str::to_owned),
    };
    let mut request = Request::new(Door::Responses, model);
    request.system = system;
    request.volatile = volatile;
    request.messages = messages;
    request.max_tokens = max_tokens;
    request.clamped = clamped;
    request.stream = raw.stream.unwrap_or(false);
    request.sampling.temperature = temperature;
    request.sampling.top_p = top_p;
    request.sampling.top_k = top_k;
    request.session = session;
    request.tools = tools;
    request.output_format = output_format;
    request.effort = effort;
    request.show_reasoning = true;
    request.responses = Some(Box::new(Context {
        echo,
        store,
        namespaces,
        prior_items: previous.map(|p| p.items.to_owned()),
        input_items,
    }));
    notes.settle(limits.unknown_fields)?;
    request.fields = notes;
    Ok(request.estimate())
}

/// The `previous_response_id` a body names, read without reading the rest: only a body that
/// mentions the field at all is parsed for it.
pub fn previous_response_id(body: &[u8]) -> Option<String> {
    const NEEDLE: &[u8] = b"\"previous_response_id\"";
    if !body.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
        return None;
    }
    #[derive(Deserialize)]
    struct Previous {
        #[serde(default)]
        previous_response_id: Option<String>,
    }
    serde_json::from_slice::<Previous>(body)
        .ok()?
        .previous_response_id
        .filter(|id| !id.is_empty())
}

/// Refuses what would change the answer if ignored and cannot be served here.
fn refused_fields(raw: &wire::Request<'_>) -> Result<(), ApiError> {
    if raw.background == Some(true) {
        return Err(rules::refused("background", "background responses"));
    }
    if raw.conversation.is_some() {
        return Err(rules::refused(
            "conversation",
            "the Conversations API (use previous_response_id)",
        ));
    }
    if raw.prompt.is_some() {
        return Err(rules::refused("prompt", "stored prompt templates"));
    }
    if raw.top_logprobs.is_some_and(|n| n > 0) {
        return Err(rules::refused("top_logprobs", "log probabilities"));
    }
    Ok(())
}

/// Reads a nested value of the body, noting its unknown fields under `field`.
fn nested<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    field: &str,
    notes: &mut FieldNotes,
) -> Result<T, ApiError> {
    let (value, unknown) = read_tracked::<T>(raw.get().as_bytes())
        .map_err(|e| ApiError::invalid(format!("{field}: {}", e.message())))?;
    notes
        .unknown
        .extend(unknown.into_iter().map(|path| format!("{field}.{path}")));
    Ok(value)
}

fn raw_json(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_default()
}

/// The functions offered, the namespaces they came in, and the hosted tools dropped (their
/// types and names).
type Offered = (Vec<ToolSpec>, Vec<String>, Vec<String>);

/// The tools offered: functions (those inside namespaces as `NAMESPACE__NAME`), the
/// namespaces, and the names of hosted tools dropped.
fn tool_specs(tools: Vec<Tool<'_>>, notes: &mut FieldNotes) -> Result<Offered, ApiError> {
    let mut specs = Vec::with_capacity(tools.len());
    let mut namespaces = Vec::new();
    let mut hosted = Vec::new();
    for (i, tool) in tools.into_iter().enumerate() {
        let at = format!("tools.{i}");
        match tool.kind.as_deref() {
            Some("function") => specs.push(function(tool, &at, None)?),
            Some("namespace") => {
                let Some(namespace) = tool.name.as_deref().filter(|n| !n.is_empty()) else {
                    return Err(ApiError::invalid(format!(
                        "{at}.name: field required (the namespace's name)"
                    )));
                };
                let namespace = namespace.to_owned();
                for (j, inner) in tool.tools.unwrap_or_default().into_iter().enumerate() {
                    let inner_at = format!("{at}.tools.{j}");
                    match inner.kind.as_deref() {
                        Some("function") | None => {
                            specs.push(function(inner, &inner_at, Some(&namespace))?);
                        }
                        Some(_) => notes.unused("tools.namespace.custom"),
                    }
                }
                namespaces.push(namespace);
            }
            // Custom (free-form grammar) tools and hosted tools: no server here runs them.
            Some(kind) => {
                notes.unused(hosted_tool_field(kind));
                hosted.push(kind.to_owned());
                if let Some(name) = tool.name {
                    hosted.push(name.into_owned());
                }
            }
            None => {
                return Err(ApiError::invalid(format!(
                    "{at}.type: field required (\"function\", \"namespace\", …)"
                )));
            }
        }
    }
    Ok((specs, namespaces, hosted))
}

/// The name a dropped tool is counted under (few labels: the known types, else `tools.other`).
fn hosted_tool_field(kind: &str) -> &'static str {
    match kind {
        "web_search" | "web_search_preview" | "web_search_2025_08_26" => "tools.web_search",
        "file_search" => "tools.file_search",
        "code_interpreter" => "tools.code_interpreter",
        "image_generation" => "tools.image_generation",
        "computer_use_preview" | "computer" => "tools.computer_use",
        "mcp" => "tools.mcp",
        "local_shell" | "shell" => "tools.local_shell",
        "custom" => "tools.custom",
        _ => "tools.other",
    }
}

/// A function tool's spec, named `NAMESPACE__NAME` inside a namespace.
fn function(tool: Tool<'_>, at: &str, namespace: Option<&str>) -> Result<ToolSpec, ApiError> {
    let name = match (namespace, tool.name) {
        (Some(namespace), Some(name)) if !name.is_empty() => {
            Some(format!("{namespace}{NAMESPACE_SEPARATOR}{}", &*name).into())
        }
        (_, name) => name,
    };
    rules::tool_spec(
        at,
        name,
        tool.description,
        ("parameters", tool.parameters, Some(EMPTY_PARAMETERS)),
    )
}

/// `tool_choice` over the functions offered; forcing a hosted tool is refused.
fn tool_offer(
    mut specs: Vec<ToolSpec>,
    choice: Option<wire::ToolChoice<'_>>,
    parallel: Option<bool>,
    hosted: &[String],
) -> Result<Option<Box<ringmaster_wire::chat::ToolOffer>>, ApiError> {
    let choice = match choice {
        None => None,
        Some(wire::ToolChoice::Mode(mode)) => Some(mode_choice(&mode, "tool_choice")?),
        Some(wire::ToolChoice::Object(object)) => Some(object_choice(object, &mut specs, hosted)?),
    };
    rules::tool_offer(specs, choice, parallel)
}

fn mode_choice(mode: &str, field: &str) -> Result<ToolChoice, ApiError> {
    match mode {
        "auto" => Ok(ToolChoice::Auto),
        "none" => Ok(ToolChoice::None),
        "required" => Ok(ToolChoice::Required),
        other => Err(ApiError::invalid(format!(
            "{field}: {other:?} is not one of \"auto\", \"none\", \"required\""
        ))),
    }
}

fn object_choice(
    object: ToolChoiceObject<'_>,
    specs: &mut Vec<ToolSpec>,
    hosted: &[String],
) -> Result<ToolChoice, ApiError> {
    match object.kind.as_deref() {
        Some("function") => rules::named_tool(
            object.name,
            specs,
            "tool_choice.name",
            "with type \"function\"",
        ),
        Some("allowed_tools") => {
            let allowed: Vec<String> = object
                .tools
                .unwrap_or_default()
                .into_iter()
                .filter_map(|t| t.name.map(|n| n.into_owned()))
                .collect();
            specs.retain(|spec| allowed.contains(&spec.name));
            mode_choice(object.mode.as_deref().unwrap_or("auto"), "tool_choice.mode")
        }
        Some(kind) => Err(ApiError::invalid(format!(
            "tool_choice.type: {kind:?} {}, which no server behind this gateway can run; it \
             cannot be forced",
            if hosted.iter().any(|h| h == kind) {
                "is a hosted tool"
            } else {
                "names a tool that is not a function"
            }
        ))),
        None => Err(ApiError::invalid("tool_choice.type: field required")),
    }
}

/// `text.format`: text, any JSON object, or JSON following a schema.
fn output_format(text: Option<&TextConfig<'_>>) -> Result<Option<Box<OutputFormat>>, ApiError> {
    let Some(format) = text.and_then(|t| t.format.as_ref()) else {
        return Ok(None);
    };
    match format.kind.as_deref() {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Box::new(OutputFormat::JsonObject))),
        Some("json_schema") => {
            let Some(schema) = format.schema.filter(|s| rules::is_object(s)) else {
                return Err(ApiError::invalid(
                    "text.format.schema: field required (a JSON schema object)",
                ));
            };
            Ok(Some(Box::new(OutputFormat::JsonSchema {
                name: format.name.as_deref().unwrap_or("output").to_owned(),
                schema: schema.to_owned(),
                strict: format.strict,
            })))
        }
        Some(other) => Err(ApiError::invalid(format!(
            "text.format.type: {other:?} is not one of \"text\", \"json_object\", \"json_schema\""
        ))),
    }
}

/// The conversation being read: the system prompt from the leading developer and system
/// messages, then the messages, with each function call joined to the assistant turn it
/// belongs to.
#[derive(Default)]
struct Turn {
    system: Option<String>,
    messages: Vec<ChatMessage>,
}

impl Turn {
    fn message(&mut self, role: Role, text: String, images: Vec<Image>) {
        if role == Role::System && self.messages.is_empty() {
            match self.system.as_mut() {
                Some(system) => {
                    system.push_str("\n\n");
                    system.push_str(&text);
                }
                None => self.system = Some(text),
            }
            return;
        }
        self.messages.push(ChatMessage {
            role,
            text,
            images,
            ..ChatMessage::default()
        });
    }

    /// The assistant turn a function call joins: the last message when it is the
    /// assistant's, else a new one.
    fn assistant(&mut self) -> &mut ChatMessage {
        let joins = self
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Assistant && m.tool_call_id.is_none());
        if !joins {
            self.messages.push(ChatMessage {
                role: Role::Assistant,
                ..ChatMessage::default()
            });
        }
        let last = self.messages.len() - 1;
        &mut self.messages[last]
    }

    fn item(&mut self, item: Item<'_>, at: &str, notes: &mut FieldNotes) -> Result<(), ApiError> {
        let kind = item.kind.as_deref().unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    Some(other) => {
                        return Err(ApiError::invalid(format!(
                            "{at}.role: {other:?} is not one of \"user\", \"assistant\", \
                             \"system\", \"developer\""
                        )));
                    }
                    None => return Err(ApiError::invalid(format!("{at}.role: field required"))),
                };
                let (text, images) = match item.content {
                    None => (String::new(), Vec::new()),
                    Some(content) => parts(content, &format!("{at}.content"), notes)?,
                };
                if !images.is_empty() && role != Role::User {
                    return Err(ApiError::invalid(format!(
                        "{at}.content: images go in user messages"
                    )));
                }
                if role == Role::Assistant
                    && let Some(last) = self.messages.last_mut()
                    && last.role == Role::Assistant
                    && last.tool_calls.is_empty()
                    && last.tool_call_id.is_none()
                {
                    // Several output messages of one turn are one assistant message.
                    last.text.push_str(&text);
                    return Ok(());
                }
                self.message(role, text, images);
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (item.call_id, item.name) else {
                    return Err(ApiError::invalid(format!(
                        "{at}: a function_call needs a call_id and a name"
                    )));
                };
                let name = match item.namespace.as_deref().filter(|n| !n.is_empty()) {
                    Some(namespace) => format!("{namespace}{NAMESPACE_SEPARATOR}{}", &*name),
                    None => name.into_owned(),
                };
                let arguments = item
                    .arguments
                    .map_or_else(|| "{}".to_owned(), |a| a.into_owned());
                self.assistant().tool_calls.push(ToolCall {
                    id: call_id.into_owned(),
                    name,
                    arguments,
                });
            }
            "function_call_output" => {
                let Some(call_id) = item.call_id else {
                    return Err(ApiError::invalid(format!("{at}.call_id: field required")));
                };
                let (text, images) = match item.output {
                    None => (String::new(), Vec::new()),
                    Some(output) => parts(output, &format!("{at}.output"), notes)?,
                };
                self.messages.push(ChatMessage {
                    role: Role::User,
                    text,
                    images,
                    tool_call_id: Some(call_id.into_owned()),
                    ..ChatMessage::default()
                });
            }
            // A reasoning model makes its own reasoning again; OpenAI's encrypted reasoning
            // means nothing to other servers.
            "reasoning" => notes.unused("input.reasoning"),
            "item_reference" => {
                return Err(rules::refused(
                    &format!("{at}.type"),
                    "items by reference (send the item itself, or use previous_response_id)",
                ));
            }
            // Hosted tools' calls, custom tools' calls and compactions of earlier turns.
            _ => notes.unused(input_item_field(kind)),
        }
        Ok(())
    }
}

/// The name a dropped input item is counted under.
fn input_item_field(kind: &str) -> &'static str {
    match kind {
        "web_search_call" => "input.web_search_call",
        "file_search_call" => "input.file_search_call",
        "code_interpreter_call" => "input.code_interpreter_call",
        "computer_call" | "computer_call_output" => "input.computer_call",
        "image_generation_call" => "input.image_generation_call",
        "local_shell_call" | "local_shell_call_output" => "input.local_shell_call",
        "custom_tool_call" | "custom_tool_call_output" => "input.custom_tool_call",
        k if k.starts_with("mcp_") => "input.mcp",
        k if k.starts_with("compaction") => "input.compaction",
        _ => "input.other",
    }
}

/// Content's text and images: `input_text`, `output_text`, `text`, `summary_text` and
/// `reasoning_text` parts are text; `input_image` parts are images; files are refused;
/// refusals are noted.
fn parts(
    content: Content<'_>,
    field: &str,
    notes: &mut FieldNotes,
) -> Result<(String, Vec<Image>), ApiError> {
    let parts: Vec<Part<'_>> = match content {
        Content::Text(text) => return Ok((text.into_owned(), Vec::new())),
        Content::List(parts) => parts,
    };
    let mut text = String::new();
    let mut images = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        let at = format!("{field}.{i}");
        match part.kind.as_deref() {
            Some("input_text" | "output_text" | "text") => match part.text {
                Some(t) => text.push_str(&t),
                None => return Err(ApiError::invalid(format!("{at}.text: field required"))),
            },
            Some("input_image") => {
                if part.file_id.is_some() {
                    return Err(ApiError::invalid(format!(
                        "{at}.file_id: the Files API is not supported by this gateway; send \
                         the image as an image_url (http(s) or data:)"
                    )));
                }
                match part.image_url.and_then(|url| rules::image_url(url, true)) {
                    Some(image) => images.push(image),
                    None => {
                        return Err(ApiError::invalid(format!(
                            "{at}.image_url: field required (an http(s) URL or a data:image/… \
                             URL)"
                        )));
                    }
                }
            }
            Some("input_file") => {
                return Err(rules::refused(&at, "file input"));
            }
            Some("refusal") => notes.unused("input.content.refusal"),
            _ => notes.unknown.push(format!("{at}.type")),
        }
    }
    Ok((text, images))
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
