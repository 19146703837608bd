//! The Anthropic Messages door, inbound: `POST /v1/messages` and `count_tokens` bodies into the
//! one [`Request`]. (Its replies are written by [`crate::reply::messages`].)
//!
//! Text, `image`, `tool_use` and `tool_result` content; client tools and `tool_choice`. Fields
//! current SDKs send that change nothing here are accepted (`service_tier` auto or
//! standard_only, a top-level `cache_control`, `thinking` disabled); the features this gateway
//! does not serve are refused by name (server tools, documents, extended thinking, MCP
//! servers, containers, the Files API), never as unknown fields.

use ringmaster_gpu_runtime::{ChatMessage, Image, Role, ToolCall, ToolChoice, ToolSpec};
use ringmaster_wire::anthropic::{self, Block, Content};

use crate::error::ApiError;
use crate::json::read;
use crate::request::{Limits, Request};
use crate::{Door, rules};

/// Parses and validates a `POST /v1/messages` body.
pub fn parse(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let raw: anthropic::Request<'_> = read(body)?;
    validate(raw, limits)
}

/// Parses and validates a `POST /v1/messages/count_tokens` body: a Messages request whose
/// `max_tokens` may be left out (nothing is generated).
pub fn parse_count_tokens(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let mut raw: anthropic::Request<'_> = read(body)?;
    raw.max_tokens.get_or_insert(1);
    validate(raw, limits)
}

/// Refuses, by name, the known fields this gateway cannot honour, and lets through those that
/// change nothing here.
fn refused_fields(raw: &anthropic::Request<'_>) -> Result<(), ApiError> {
    if let Some(tier) = &raw.service_tier
        && !matches!(tier.as_str(), Some("auto" | "standard_only"))
    {
        return Err(rules::refused(
            "service_tier",
            "a service tier other than \"auto\" or \"standard_only\" (tiers come from the API key)",
        ));
    }
    if let Some(thinking) = &raw.thinking
        && thinking.get("type").and_then(|t| t.as_str()) != Some("disabled")
    {
        return Err(rules::refused("thinking", "extended thinking"));
    }
    if raw.mcp_servers.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(rules::refused("mcp_servers", "the MCP connector"));
    }
    if raw.container.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(rules::refused("container", "code execution containers"));
    }
    Ok(())
}

fn validate(mut raw: anthropic::Request<'_>, limits: Limits<'_>) -> Result<Request, ApiError> {
    refused_fields(&raw)?;
    if raw.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let max_tokens = match raw.max_tokens {
        None => return Err(ApiError::invalid("max_tokens: field required")),
        Some(n) => rules::max_tokens(n, "max_tokens", limits)?,
    };
    let Some(raw_messages) = raw.messages.take() else {
        return Err(ApiError::invalid("messages: field required"));
    };
    if raw_messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let tools = tool_offer(raw.tools.take(), raw.tool_choice.take())?;
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, m) in raw_messages.into_iter().enumerate() {
        let role = match m.role {
            anthropic::Role::User => Role::User,
            anthropic::Role::Assistant => Role::Assistant,
        };
        match m.content {
            Content::Text(text) => messages.push(ChatMessage {
                role,
                text: text.into_owned(),
                ..ChatMessage::default()
            }),
            Content::List(blocks) => {
                message_blocks(
                    role,
                    blocks,
                    &format!("messages.{i}.content"),
                    &mut messages,
                )?;
            }
        }
    }
    let system = raw
        .system
        .map(|s| content_text(s, "system"))
        .transpose()?
        .filter(|s| !s.is_empty());
    let temperature = rules::in_range(raw.temperature, "temperature", true, 1.0)?;
    let top_p = rules::in_range(raw.top_p, "top_p", false, 1.0)?;
    let top_k = match raw.top_k {
        None => None,
        Some(k) if k < 0 => {
            return Err(ApiError::invalid(format!(
                "top_k: must be non-negative, got {k}"
            )));
        }
        Some(k) => Some(
            u32::try_from(k).map_err(|_| ApiError::invalid(format!("top_k: {k} is too large")))?,
        ),
    };
    let stop_sequences =
        rules::stop_sequences(raw.stop_sequences.unwrap_or_default(), "stop_sequences")?;
    let session = rules::session(raw.metadata.and_then(|m| m.user_id), "metadata.user_id")?;
    let model = rules::served_model(raw.model, limits)?;
    let mut request = Request::new(Door::Messages, model);
    request.system = system;
    request.messages = messages;
    request.max_tokens = max_tokens;
    request.stream = raw.stream.unwrap_or(false);
    request.sampling.temperature = temperature;
    request.sampling.top_p = top_p;
    request.sampling.top_k = top_k;
    request.sampling.ignore_eos = raw.ignore_eos.unwrap_or(false);
    request.stop_sequences = stop_sequences;
    request.session = session;
    request.tools = tools;
    Ok(request.estimate())
}

/// The tools offered (`tools`, `tool_choice`), validated: each a client tool with a name and
/// an input schema (server tools, which Anthropic runs itself, are refused by name).
fn tool_offer(
    tools: Option<Vec<anthropic::Tool<'_>>>,
    choice: Option<anthropic::ToolChoice<'_>>,
) -> Result<Option<Box<ringmaster_gpu_runtime::ToolOffer>>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        if let Some(kind) = tool.kind.as_deref()
            && kind != "custom"
        {
            return Err(ApiError::invalid(format!(
                "tools.{i}.type: {kind:?} is a server tool, and server tools are not supported \
                 by this gateway (it runs no tools itself); only client tools (with an \
                 input_schema) are"
            )));
        }
        specs.push(rules::tool_spec(
            &format!("tools.{i}"),
            tool.name,
            tool.description,
            ("input_schema", tool.input_schema, None),
        )?);
    }
    let (choice, parallel) = match choice {
        None => (ToolChoice::Auto, None),
        Some(choice) => {
            let parallel = choice.disable_parallel_tool_use.map(|disabled| !disabled);
            let choice = match choice.kind.as_deref() {
                Some("auto") => ToolChoice::Auto,
                Some("none") => ToolChoice::None,
                Some("any") => ToolChoice::Required,
                Some("tool") => rules::named_tool(
                    choice.name,
                    &specs,
                    "tool_choice.name",
                    "with type \"tool\"",
                )?,
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice.type: must be one of \"auto\", \"any\", \"tool\", \"none\"",
                    ));
                }
            };
            (choice, parallel)
        }
    };
    rules::tool_offer(specs, choice, parallel)
}

/// One message's content blocks as messages: an assistant's text and `tool_use` blocks make
/// one message with its calls; a user's `tool_result` blocks make one tool-result message
/// each (first, as OpenAI servers expect them right after the calls), then its text.
fn message_blocks(
    role: Role,
    blocks: Vec<Block<'_>>,
    field: &str,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    if blocks.is_empty() {
        return Err(ApiError::invalid(format!(
            "{field}: at least one content block is required"
        )));
    }
    let mut message = ChatMessage {
        role,
        ..ChatMessage::default()
    };
    let mut has_text = false;
    for (i, block) in blocks.into_iter().enumerate() {
        let at = format!("{field}.{i}");
        match (&*block.kind, role) {
            ("text", _) => {
                let Some(text) = block.text else {
                    return Err(ApiError::invalid(format!("{at}.text: field required")));
                };
                message.text.push_str(&text);
                has_text = true;
            }
            ("tool_use", Role::Assistant) => {
                let (Some(id), Some(name)) = (block.id, block.name) else {
                    return Err(ApiError::invalid(format!(
                        "{at}: a tool_use block needs an id and a name"
                    )));
                };
                let arguments = match block.input {
                    Some(input) if rules::is_object(input) => input.get().to_owned(),
                    None => "{}".to_owned(),
                    Some(input) if input.get() == "null" => "{}".to_owned(),
                    Some(_) => {
                        return Err(ApiError::invalid(format!("{at}.input: must be an object")));
                    }
                };
                message.tool_calls.push(ToolCall {
                    id: id.into_owned(),
                    name: name.into_owned(),
                    arguments,
                });
            }
            ("tool_result", Role::User) => {
                let Some(id) = block.tool_use_id else {
                    return Err(ApiError::invalid(format!(
                        "{at}.tool_use_id: field required"
                    )));
                };
                let mut text = match block.content {
                    None => String::new(),
                    Some(content) => content_text(*content, &format!("{at}.content"))?,
                };
                if block.is_error == Some(true) {
                    text.insert_str(0, "Error: ");
                }
                out.push(ChatMessage {
                    role: Role::User,
                    text,
                    tool_call_id: Some(id.into_owned()),
                    ..ChatMessage::default()
                });
            }
            ("image", Role::User) => message.images.push(image(block.source, &at)?),
            (kind @ ("tool_use" | "tool_result" | "image"), _) => {
                return Err(ApiError::invalid(format!(
                    "{at}.type: a {kind:?} block belongs in {} message",
                    if kind == "tool_use" {
                        "an assistant"
                    } else {
                        "a user"
                    }
                )));
            }
            (other, _) => return Err(unsupported_block(other, &at)),
        }
    }
    if has_text || !message.tool_calls.is_empty() || !message.images.is_empty() {
        out.push(message);
    }
    Ok(())
}

/// An `image` block's source as the URL OpenAI servers take: `base64` data becomes a `data:`
/// URL, a `url` stays as it is.
fn image(source: Option<anthropic::ImageSource<'_>>, at: &str) -> Result<Image, ApiError> {
    let source = source.unwrap_or_default();
    match source.kind.as_deref() {
        Some("base64") => {
            let media_type = source.media_type.as_deref().unwrap_or_default();
            if !rules::IMAGE_TYPES.contains(&media_type) {
                return Err(ApiError::invalid(format!(
                    "{at}.source.media_type: must be one of {}",
                    rules::IMAGE_TYPES.join(", ")
                )));
            }
            let Some(data) = source.data.filter(|d| !d.is_empty()) else {
                return Err(ApiError::invalid(format!(
                    "{at}.source.data: field required (the image, base64-encoded)"
                )));
            };
            Ok(Image {
                url: format!("data:{media_type};base64,{}", &*data),
            })
        }
        Some("url") => source
            .url
            .and_then(|url| rules::image_url(url, false))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "{at}.source.url: field required (an http or https URL)"
                ))
            }),
        Some("file") => Err(ApiError::invalid(format!(
            "{at}.source.type: \"file\" (the Files API) is not supported by this gateway; \
             send the image as base64 or a URL"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{at}.source.type: must be \"base64\" or \"url\""
        ))),
    }
}

/// The 400 for a content block this gateway does not take, naming its feature.
fn unsupported_block(kind: &str, at: &str) -> ApiError {
    let feature = match kind {
        "server_tool_use" | "web_search_tool_result" | "mcp_tool_use" | "mcp_tool_result" => {
            " (server tools are not supported by this gateway)"
        }
        "image" => " (images go in user messages)",
        "document" => " (documents are not supported by this gateway yet)",
        "thinking" | "redacted_thinking" => {
            " (extended thinking is not supported by this gateway yet)"
        }
        _ => "",
    };
    ApiError::invalid(format!(
        "{at}.type: content blocks of type {kind:?} are not supported here; \"text\", \
         \"tool_use\" and \"tool_result\" are{feature}"
    ))
}

/// The text of a system prompt or a tool's result: its text blocks, joined.
fn content_text(content: Content<'_>, field: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text.into_owned()),
        Content::List(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.into_iter().enumerate() {
                if *block.kind != *"text" {
                    return Err(unsupported_block(&block.kind, &format!("{field}.{i}")));
                }
                let Some(block_text) = block.text else {
                    return Err(ApiError::invalid(format!(
                        "{field}.{i}.text: field required"
                    )));
                };
                text.push_str(&block_text);
            }
            Ok(text)
        }
    }
}

#[cfg(test)]
#[path = "messages_tests.rs"]
mod tests;
