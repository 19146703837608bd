//! The one request model: what every door's codec makes of a body, and all the rest of the
//! gateway reads. The prompt is already the engines' chat (system prompt, messages with their
//! tool calls, tool results and images), built once while the body was read; the token
//! estimate is made once, here, and used for admission, the token buckets, the policies and
//! `count_tokens` alike.

use ringmaster_wire::chat::{ChatMessage, Effort, OutputFormat, SamplingParams, ToolOffer};

use crate::Door;
use crate::fields::{FieldNotes, UnknownFields};
use crate::volatile::VolatileLines;

/// Tokens per image in an estimate: the most one image costs Claude after its resize (about
/// 1.15 megapixels at 750 pixels a token), so an estimate errs high, as a budget should.
pub const ESTIMATED_TOKENS_PER_IMAGE: u32 = 1_600;

/// Bytes of text per token in an estimate (English text, a BPE tokenizer).
pub const ESTIMATED_BYTES_PER_TOKEN: usize = 4;

/// Longest session id a body may name (`metadata.user_id`, `user`, `prompt_cache_key`):
/// Anthropic's own limit on `metadata.user_id`.
pub const MAX_SESSION_CHARS: usize = 256;

/// What the codecs need to know about the gateway.
#[derive(Clone, Copy, Debug)]
pub struct Limits<'a> {
    /// The models served (and the aliases that name them).
    pub models: &'a [String],
    /// The largest `max_tokens` served (a request asking for more is served at it).
    pub max_output_tokens: u32,
    /// What becomes of fields the door's API does not define.
    pub unknown_fields: UnknownFields,
    /// The system-prompt lines taken out of every request.
    pub volatile: &'a VolatileLines,
}

impl<'a> Limits<'a> {
    /// `models` served, `max_output_tokens` at most, unknown fields passed on, no volatile
    /// lines.
    pub fn new(models: &'a [String], max_output_tokens: u32) -> Self {
        Self {
            models,
            max_output_tokens,
            unknown_fields: UnknownFields::Pass,
            volatile: &VolatileLines::NONE,
        }
    }
}

/// A validated request, whichever door it came in by.
#[derive(Clone, Debug)]
pub struct Request {
    /// The door: the reply is written in its terms.
    pub door: Door,
    /// The model asked for (one this gateway serves, or an alias of one).
    pub model: String,
    /// The system prompt.
    pub system: Option<String>,
    /// The conversation, in the engines' terms. A completion's raw prompt is its one user
    /// message, with [`Self::raw_prompt`] set.
    pub messages: Vec<ChatMessage>,
    /// The prompt is raw text for the model, not a chat to render with its template
    /// (`/v1/completions`).
    pub raw_prompt: bool,
    /// Most tokens to generate, at least 1.
    pub max_tokens: u32,
    /// Whether the reply streams.
    pub stream: bool,
    /// A streamed OpenAI reply ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Strings that end generation.
    pub stop_sequences: Vec<String>,
    /// The tools the model may call.
    pub tools: Option<Box<ToolOffer>>,
    /// The session key the body names (`metadata.user_id`; OpenAI's `prompt_cache_key`, else
    /// `user`).
    pub session: Option<String>,
    /// The prompt's estimated tokens: [`ESTIMATED_BYTES_PER_TOKEN`] over everything a server
    /// reads (text, tool calls, tool results, the tools offered) plus
    /// [`ESTIMATED_TOKENS_PER_IMAGE`] per image.
    pub estimated_tokens: u32,
    /// How hard a reasoning model thinks (`None`: the server's default).
    pub effort: Option<Effort>,
    /// Whether the reply shows the model's reasoning (Messages: `thinking` enabled or
    /// adaptive; the OpenAI doors always pass it on, as their servers do).
    pub show_reasoning: bool,
    /// Structured output (`None`: text).
    pub output_format: Option<Box<OutputFormat>>,
    /// What the door read over: unknown fields, and known ones this request does not carry.
    pub fields: FieldNotes,
    /// The system-prompt lines taken out ([`VolatileLines`]), for a server that wants them.
    pub volatile: Option<String>,
    /// What only the Responses door needs (its echo, storage and tool namespaces).
    pub responses: Option<Box<crate::responses::Context>>,
    /// The output limit the client asked for, when it was above the gateway's
    /// (`[limits] max_output_tokens`) and [`Self::max_tokens`] is the gateway's instead.
    pub clamped: Option<Clamped>,
}

/// A `max_tokens` above the gateway's limit, served at the limit: agents ask for what their
/// own model could write (Claude Code 32,000 to 128,000 tokens), so the reply is cut at the
/// gateway's limit instead of refused, as a server cuts it at its context's end. The client
/// is told by the `x-ringmaster-clamped` response header ([`Clamped::header_value`]), and a
/// server of the door's own API gets the limit in the field it was asked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clamped {
    /// The body's field: `max_tokens`, `max_completion_tokens` or `max_output_tokens`.
    pub field: &'static str,
    /// What the client asked for.
    pub asked: u64,
    /// What is served: the gateway's limit.
    pub served: u32,
}

impl Clamped {
    /// `FIELD=ASKED->SERVED`, e.g. `max_tokens=32000->8192`.
    pub fn header_value(&self) -> String {
        format!("{}={}->{}", self.field, self.asked, self.served)
    }
}

impl Request {
    /// A request of `door` for `model`, with nothing in it yet (the codecs fill it in and end
    /// with [`Self::estimate`]; in-process callers and tests build requests this way too).
    pub fn new(door: Door, model: String) -> Self {
        Self {
            door,
            model,
            system: None,
            messages: Vec::new(),
            raw_prompt: false,
            max_tokens: 1,
            stream: false,
            include_usage: false,
            sampling: SamplingParams::default(),
            stop_sequences: Vec::new(),
            tools: None,
            session: None,
            estimated_tokens: 0,
            effort: None,
            show_reasoning: false,
            output_format: None,
            fields: FieldNotes::default(),
            volatile: None,
            responses: None,
            clamped: None,
        }
    }

    /// Sets [`Self::estimated_tokens`] from the prompt as it stands.
    pub fn estimate(mut self) -> Self {
        let offered = self.tools.as_ref().map_or(0, |offer| {
            offer
                .tools
                .iter()
                .map(|t| {
                    t.name.len()
                        + t.description.as_ref().map_or(0, String::len)
                        + t.parameters.get().len()
                })
                .sum()
        });
        let mut bytes = self.system.as_ref().map_or(0, String::len) + offered;
        let mut images = 0usize;
        for m in &self.messages {
            bytes += m.text.len();
            bytes += m
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>();
            images += m.images.len();
        }
        let tokens = bytes.div_ceil(ESTIMATED_BYTES_PER_TOKEN)
            + images * ESTIMATED_TOKENS_PER_IMAGE as usize;
        self.estimated_tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        self
    }

    /// Whether the conversation offers tools or holds tool calls or results: only servers
    /// that call tools can take it.
    pub fn uses_tools(&self) -> bool {
        self.tools.is_some()
            || self
                .messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || m.tool_call_id.is_some())
    }

    /// Whether a message shows images: only servers that read images can take it.
    pub fn uses_images(&self) -> bool {
        self.messages.iter().any(|m| !m.images.is_empty())
    }

    /// The prompt as a safety filter reads it: the system prompt and every message, in order,
    /// separated by blank lines.
    pub fn prompt_text(&self) -> String {
        let len = self.system.as_ref().map_or(0, String::len)
            + self
                .messages
                .iter()
                .map(|m| m.text.len() + 2)
                .sum::<usize>();
        let mut text = String::with_capacity(len);
        if let Some(system) = &self.system {
            text.push_str(system);
        }
        for message in &self.messages {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&message.text);
        }
        text
    }
}
