//! The Anthropic Messages door, inbound: `POST /v1/messages` and `count_tokens` bodies into the
//! one [`Request`]. (Its replies are written by [`crate::reply::messages`].)
//!
//! Liberal in what it takes, as the agents that send most of this traffic need (Claude Code
//! sends `context_management`, `thinking: adaptive`, `output_config`, system messages in the
//! middle of the conversation, `cache_control` everywhere, tools with `defer_loading`):
//! text, `image`, plain-text `document`, `tool_use` and `tool_result` content, client tools
//! and `tool_choice`, thinking and effort (for servers with reasoning), structured output.
//! What the request cannot carry and does not change the answer when left out is noted
//! ([`crate::fields::FieldNotes`]): `cache_control`, `context_management`, hosted (server)
//! tools, thinking blocks of earlier turns, `service_tier`. Refused, by name, only what would
//! change the answer if ignored: MCP servers, code-execution containers, documents that are
//! not plain text, a `tool_choice` forcing a server tool.

use ringmaster_wire::anthropic::{self, Block, Content};
use ringmaster_wire::chat::{
    ChatMessage, Effort, Image, OutputFormat, Role, ToolCall, ToolChoice, ToolSpec,
};

use crate::error::ApiError;
use crate::fields::FieldNotes;
use crate::json::read_tracked;
use crate::request::{Limits, Request};
use crate::{Door, rules};

/// Parses and validates a `POST /v1/messages` body.
pub fn parse(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let (raw, unknown): (anthropic::Request<'_>, _) = read_tracked(body)?;
    validate(raw, unknown, limits)
}

/// Parses and validates a `POST /v1/messages/count_tokens` body: a Messages request whose
/// `max_tokens` may be left out (nothing is generated).
pub fn parse_count_tokens(body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
    let (mut raw, unknown): (anthropic::Request<'_>, _) = read_tracked(body)?;
    raw.max_tokens.get_or_insert(1);
    validate(raw, unknown, limits)
}

/// Refuses, by name, the known fields whose features would change the answer if ignored;
/// notes those that would not.
fn known_fields(raw: &anthropic::Request<'_>, notes: &mut FieldNotes) -> Result<(), ApiError> {
    if raw
        .mcp_servers
        .as_ref()
        .is_some_and(|m| !crate::json::is_empty(Some(m)))
    {
        return Err(rules::refused(
            "mcp_servers",
            "the MCP connector (the model would call tools only Anthropic can run)",
        ));
    }
    if raw.container.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(rules::refused("container", "code execution containers"));
    }
    // Tiers come from the API key here; the answer is the same in any tier.
    if raw.service_tier.is_some() {
        notes.unused("service_tier");
    }
    if raw.cache_control.is_some() {
        notes.unused("cache_control");
    }
    if raw.context_management.is_some() {
        notes.unused("context_management");
    }
    if raw.inference_geo.is_some() {
        notes.unused("inference_geo");
    }
    Ok(())
}

/// `thinking` and `output_config.effort`: the effort a reasoning server is asked for, and
/// whether the client shows the reasoning.
fn reasoning(raw: &anthropic::Request<'_>, request: &mut Request) -> Result<(), ApiError> {
    let effort = rules::effort(
        raw.output_config.as_ref().and_then(|c| c.effort.as_deref()),
        "output_config.effort",
    )?;
    if effort.is_some() {
        request.fields.reasoning = Some("output_config.effort");
    }
    request.effort = effort;
    let Some(thinking) = &raw.thinking else {
        return Ok(());
    };
    request.fields.reasoning = Some("thinking");
    match thinking.kind.as_deref() {
        Some("disabled") => request.effort = Some(Effort::None),
        Some("adaptive") => request.show_reasoning = true,
        Some("enabled") => {
            request.show_reasoning = true;
            let budget = thinking.budget_tokens.unwrap_or(0);
            if budget < 1 {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens: field required with type \"enabled\" (at least 1)",
                ));
            }
            request.effort = request.effort.or(Some(Effort::from_budget(
                u32::try_from(budget).unwrap_or(u32::MAX),
            )));
        }
        _ => {
            return Err(ApiError::invalid(
                "thinking.type: must be one of \"enabled\", \"adaptive\", \"disabled\"",
            ));
        }
    }
    Ok(())
}

/// `output_config.format`: structured output.
fn output_format(
    config: Option<&anthropic::OutputConfig<'_>>,
) -> Result<Option<Box<OutputFormat>>, ApiError> {
    let Some(format) = config.and_then(|c| c.format.as_ref()) else {
        return Ok(None);
    };
    match (format.kind.as_deref(), format.schema) {
        (Some("json_schema"), Some(schema)) if rules::is_object(schema) => {
            Ok(Some(Box::new(OutputFormat::JsonSchema {
                name: "output".to_owned(),
                schema: schema.to_owned(),
                strict: Some(true),
            })))
        }
        (Some("json_schema"), _) => Err(ApiError::invalid(
            "output_config.format.schema: field required (a JSON schema object)",
        )),
        _ => Err(ApiError::invalid(
            "output_config.format.type: must be \"json_schema\"",
        )),
    }
}

fn validate(
    mut raw: anthropic::Request<'_>,
    unknown: Vec<String>,
    limits: Limits<'_>,
) -> Result<Request, ApiError> {
    let mut notes = FieldNotes::default();
    known_fields(&raw, &mut notes)?;
    if raw.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let (max_tokens, clamped) = match raw.max_tokens {
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
    let (tools, hosted) = tool_offer(raw.tools.take(), raw.tool_choice.take(), &mut notes)?;
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, m) in raw_messages.into_iter().enumerate() {
        let role = match m.role {
            anthropic::Role::User => Role::User,
            anthropic::Role::Assistant => Role::Assistant,
            anthropic::Role::System => Role::System,
        };
        let field = format!("messages.{i}.content");
        match m.content {
            Content::Text(text) => messages.push(ChatMessage {
                role,
                text: text.into_owned(),
                ..ChatMessage::default()
            }),
            Content::List(blocks) => {
                message_blocks(role, blocks, &field, &mut messages, &mut notes)?;
            }
        }
    }
    if messages.is_empty() {
        // Every block was of a kind the servers cannot take (dropped and noted): nothing is
        // left to answer.
        return Err(ApiError::invalid(
            "messages: no message has content a server here can read (text, images, tool use \
             and tool results); the other blocks were dropped",
        ));
    }
    let (system, volatile) = match raw.system.take() {
        None => (None, None),
        Some(content) => system_text(content, limits.volatile, &mut notes)?,
    };
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
    let stop_sequences = rules::stop_sequences(
        raw.stop_sequences.take().unwrap_or_default(),
        "stop_sequences",
    )?;
    let output_format = output_format(raw.output_config.as_ref())?;
    let model = rules::served_model(raw.model.take(), limits)?;
    let mut request = Request::new(Door::Messages, model);
    reasoning(&raw, &mut request)?;
    let session = rules::session(
        raw.metadata.take().and_then(|m| m.user_id),
        "metadata.user_id",
    )?;
    request.system = system;
    request.volatile = volatile;
    request.messages = messages;
    request.max_tokens = max_tokens;
    request.clamped = clamped;
    request.stream = raw.stream.unwrap_or(false);
    request.sampling.temperature = temperature;
    request.sampling.top_p = top_p;
    request.sampling.top_k = top_k;
    request.sampling.ignore_eos = raw.ignore_eos.unwrap_or(false);
    request.stop_sequences = stop_sequences;
    request.session = session;
    request.tools = tools;
    request.output_format = output_format;
    notes.reasoning = request.fields.reasoning;
    // A hosted tool's own settings are dropped with it, not named one by one.
    notes.unknown = unknown
        .into_iter()
        .filter(|path| {
            !hosted
                .iter()
                .any(|i| path.starts_with(&format!("tools.{i}.")))
        })
        .collect();
    notes.settle(limits.unknown_fields)?;
    request.fields = notes;
    Ok(request.estimate())
}

/// The tools offered (`tools`, `tool_choice`), validated: each client tool with a name and an
/// input schema. Server tools (which Anthropic runs itself) are dropped and noted, unless
/// `tool_choice` forces one, which no server here can honour. Also returns the indices of
/// the tools dropped.
fn tool_offer(
    tools: Option<Vec<anthropic::Tool<'_>>>,
    choice: Option<anthropic::ToolChoice<'_>>,
    notes: &mut FieldNotes,
) -> Result<(Option<Box<ringmaster_wire::chat::ToolOffer>>, Vec<usize>), ApiError> {
    let tools = tools.unwrap_or_default();
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    let mut hosted = Vec::new();
    let mut hosted_names = Vec::new();
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.cache_control.is_some() {
            notes.unused("cache_control");
        }
        if let Some(kind) = tool.kind.as_deref()
            && kind != "custom"
        {
            hosted.push(i);
            notes.unused(hosted_tool_field(kind));
            if let Some(name) = tool.name {
                hosted_names.push(name.into_owned());
            }
            continue;
        }
        specs.push(rules::tool_spec(
            &format!("tools.{i}"),
            tool.name,
            tool.description,
            ("input_schema", tool.input_schema, None),
        )?);
    }
    let (choice, parallel) = match choice {
        None => (None, None),
        Some(choice) => {
            let parallel = choice.disable_parallel_tool_use.map(|disabled| !disabled);
            let choice = match choice.kind.as_deref() {
                Some("auto") => ToolChoice::Auto,
                Some("none") => ToolChoice::None,
                Some("any") => ToolChoice::Required,
                Some("tool") => {
                    if let Some(name) = choice.name.as_deref()
                        && hosted_names.iter().any(|h| h == name)
                    {
                        return Err(ApiError::invalid(format!(
                            "tool_choice.name: {name:?} is a server tool, which no server behind \
                             this gateway can run; it cannot be forced"
                        )));
                    }
                    rules::named_tool(
                        choice.name,
                        &specs,
                        "tool_choice.name",
                        "with type \"tool\"",
                    )?
                }
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice.type: must be one of \"auto\", \"any\", \"tool\", \"none\"",
                    ));
                }
            };
            (Some(choice), parallel)
        }
    };
    Ok((rules::tool_offer(specs, choice, parallel)?, hosted))
}

/// The name a dropped server tool is counted under (`tools.web_search`): its type without
/// its version date, so that the metric's labels stay few.
fn hosted_tool_field(kind: &str) -> &'static str {
    const KNOWN: [(&str, &str); 9] = [
        ("web_search", "tools.web_search"),
        ("web_fetch", "tools.web_fetch"),
        ("code_execution", "tools.code_execution"),
        ("bash", "tools.bash"),
        ("text_editor", "tools.text_editor"),
        ("computer", "tools.computer"),
        ("memory", "tools.memory"),
        ("tool_search", "tools.tool_search"),
        ("mcp_toolset", "tools.mcp_toolset"),
    ];
    KNOWN
        .iter()
        .find(|(prefix, _)| kind.starts_with(prefix))
        .map_or("tools.server_tool", |(_, field)| field)
}

/// One message's content blocks as messages: an assistant's text and `tool_use` blocks make
/// one message with its calls; a user's `tool_result` blocks make one tool-result message
/// each (first, as OpenAI servers expect them right after the calls), then its text.
fn message_blocks(
    role: Role,
    blocks: Vec<Block<'_>>,
    field: &str,
    out: &mut Vec<ChatMessage>,
    notes: &mut FieldNotes,
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
        if block.cache_control.is_some() {
            notes.unused("cache_control");
        }
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
                let mut result = ChatMessage {
                    role: Role::User,
                    tool_call_id: Some(id.into_owned()),
                    ..ChatMessage::default()
                };
                if let Some(content) = block.content {
                    tool_result_content(*content, &format!("{at}.content"), &mut result, notes)?;
                }
                if block.is_error == Some(true) {
                    result.text.insert_str(0, "Error: ");
                }
                out.push(result);
            }
            ("image", Role::User) => message.images.push(image(block.source, &at)?),
            ("document", Role::User | Role::System) => {
                message.text.push_str(&document_text(block, &at, notes)?);
                has_text = true;
            }
            // Earlier turns' reasoning: a server that reasons makes its own.
            ("thinking" | "redacted_thinking", Role::Assistant) => {
                notes.unused("messages.content.thinking");
            }
            // Server tools' calls and results of earlier turns: the server tools were not run
            // here, and their results are in the text the model wrote after them.
            (
                "server_tool_use"
                | "web_search_tool_result"
                | "web_fetch_tool_result"
                | "code_execution_tool_result"
                | "bash_code_execution_tool_result"
                | "text_editor_code_execution_tool_result"
                | "tool_search_tool_result"
                | "mcp_tool_use"
                | "mcp_tool_result"
                | "container_upload",
                _,
            ) => notes.unused("messages.content.server_tool"),
            ("search_result", Role::User) => {
                message
                    .text
                    .push_str(&search_result_text(block, &at, notes)?);
                has_text = true;
            }
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
            // A block of a type no version of the API this gateway knows defines: dropped
            // and noted as an unknown field would be.
            (_, _) => notes.unknown.push(format!("{at}.type")),
        }
    }
    if has_text || !message.tool_calls.is_empty() || !message.images.is_empty() {
        out.push(message);
    }
    Ok(())
}

/// A `tool_result`'s content: its text (joined) and its images, onto `result`.
fn tool_result_content(
    content: Content<'_>,
    field: &str,
    result: &mut ChatMessage,
    notes: &mut FieldNotes,
) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(text) => {
            result.text = text.into_owned();
            return Ok(());
        }
        Content::List(blocks) => blocks,
    };
    for (i, block) in blocks.into_iter().enumerate() {
        let at = format!("{field}.{i}");
        if block.cache_control.is_some() {
            notes.unused("cache_control");
        }
        match &*block.kind {
            "text" => match block.text {
                Some(text) => result.text.push_str(&text),
                None => return Err(ApiError::invalid(format!("{at}.text: field required"))),
            },
            "image" => result.images.push(image(block.source, &at)?),
            "document" => result.text.push_str(&document_text(block, &at, notes)?),
            "search_result" => result
                .text
                .push_str(&search_result_text(block, &at, notes)?),
            // The tool search tool's references: the tools are offered here already.
            "tool_reference" => notes.unused("messages.content.tool_reference"),
            _ => notes.unknown.push(format!("{at}.type")),
        }
    }
    Ok(())
}

/// A `document` block's text: plain-text documents only (a PDF, an image or a URL would
/// have to be read by a server that cannot, and the answer would change without it).
fn document_text(block: Block<'_>, at: &str, notes: &mut FieldNotes) -> Result<String, ApiError> {
    let source = block.source.unwrap_or_default();
    match source.kind.as_deref() {
        Some("text") => match source.data {
            Some(data) => Ok(data.into_owned()),
            None => Err(ApiError::invalid(format!(
                "{at}.source.data: field required"
            ))),
        },
        Some("content") => match block.content {
            Some(content) => content_text(*content, &format!("{at}.source.content"), notes),
            None => Err(ApiError::invalid(format!(
                "{at}.source.content: field required"
            ))),
        },
        Some(other) => Err(ApiError::invalid(format!(
            "{at}.source.type: {other:?} documents are not supported by this gateway (the \
             servers behind it read text); send the document's text"
        ))),
        None => Err(ApiError::invalid(format!(
            "{at}.source.type: field required"
        ))),
    }
}

/// A `search_result` block's text: its text blocks.
fn search_result_text(
    block: Block<'_>,
    at: &str,
    notes: &mut FieldNotes,
) -> Result<String, ApiError> {
    match block.content {
        Some(content) => content_text(*content, &format!("{at}.content"), notes),
        None => Err(ApiError::invalid(format!("{at}.content: field required"))),
    }
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

/// The system prompt's text (its text blocks, joined) without its volatile lines, and those
/// lines. Each block is filtered on its own: blocks are joined as they came, with no line
/// break between them, so a volatile block's line would otherwise run into the next block's
/// first line (Claude Code's billing line is a block of its own).
fn system_text(
    content: Content<'_>,
    volatile: &crate::VolatileLines,
    notes: &mut FieldNotes,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let blocks = match content {
        Content::Text(text) => {
            let (kept, taken) = volatile.take_out(text.into_owned());
            return Ok((Some(kept).filter(|s| !s.is_empty()), taken));
        }
        Content::List(blocks) => blocks,
    };
    let mut text = String::new();
    let mut taken_all: Option<String> = None;
    for (i, block) in blocks.into_iter().enumerate() {
        if block.cache_control.is_some() {
            notes.unused("cache_control");
        }
        if *block.kind != *"text" {
            notes.unknown.push(format!("system.{i}.type"));
            continue;
        }
        let Some(block_text) = block.text else {
            return Err(ApiError::invalid(format!(
                "system.{i}.text: field required"
            )));
        };
        let (kept, taken) = volatile.take_out(block_text.into_owned());
        text.push_str(&kept);
        if let Some(taken) = taken {
            taken_all.get_or_insert_with(String::new).push_str(&taken);
        }
    }
    Ok((Some(text).filter(|s| !s.is_empty()), taken_all))
}

/// The text of a document's content: its text blocks, joined (other
/// blocks are noted and left out).
fn content_text(
    content: Content<'_>,
    field: &str,
    notes: &mut FieldNotes,
) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text.into_owned()),
        Content::List(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.into_iter().enumerate() {
                if block.cache_control.is_some() {
                    notes.unused("cache_control");
                }
                if *block.kind != *"text" {
                    notes.unknown.push(format!("{field}.{i}.type"));
                    continue;
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
