//! [`Door`]: which API a request came in by, matched in this one place. The door parses the
//! body, names the reply's id, writes the reply (streamed or whole) and the errors, each in
//! its own API's terms, and says which server API is its own.

use http::StatusCode;
use ringmaster_wire::Api;

use crate::error::ApiError;
use crate::reply::{self, StreamWriter, WholeReply};
use crate::request::{Limits, Request};

/// An API a request can come in by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Door {
    /// Anthropic's Messages API: `POST /v1/messages`.
    #[default]
    Messages,
    /// OpenAI's chat completions: `POST /v1/chat/completions`.
    Chat,
    /// OpenAI's (legacy) completions: `POST /v1/completions`.
    Completions,
    /// OpenAI's Responses API: `POST /v1/responses`.
    Responses,
}

impl Door {
    /// Every door.
    pub const ALL: [Door; 4] = [
        Door::Messages,
        Door::Chat,
        Door::Completions,
        Door::Responses,
    ];

    /// The door at `path`, if it is one.
    pub fn at(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|door| door.path() == path)
    }

    /// The door named `name` (its [`Self::label`], or `chat`).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "chat" => Some(Self::Chat),
            name => Self::ALL.into_iter().find(|door| door.label() == name),
        }
    }

    /// Its path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Messages => "/v1/messages",
            Self::Chat => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Responses => "/v1/responses",
        }
    }

    /// Its name in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Messages => "messages",
            Self::Chat => "chat_completions",
            Self::Completions => "completions",
            Self::Responses => "responses",
        }
    }

    /// The server API that speaks this door's wire format: a request relayed to such a server
    /// keeps its body as it came.
    pub fn api(self) -> Api {
        match self {
            Self::Messages => Api::Messages,
            Self::Chat | Self::Completions => Api::Chat,
            Self::Responses => Api::Responses,
        }
    }

    /// Whose API it is (`anthropic`, `openai`): the GenAI conventions' provider name.
    pub fn provider(self) -> &'static str {
        match self {
            Self::Messages => "anthropic",
            Self::Chat | Self::Completions | Self::Responses => "openai",
        }
    }

    /// Whether its clients read OpenAI's `x-ratelimit-*` headers (besides Anthropic's).
    pub fn openai_rate_limit_headers(self) -> bool {
        self.provider() == "openai"
    }

    /// Whether a reply can be a relay of a chat server's own chunks (the chunks are this
    /// door's).
    pub fn relays_chat_chunks(self) -> bool {
        matches!(self, Self::Chat | Self::Completions)
    }

    /// Parses and validates a body that came in by this door.
    pub fn parse(self, body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
        self.parse_continuing(body, limits, None)
    }

    /// Parses and validates a body that came in by this door, continuing `prior` (a
    /// Responses request's `previous_response_id`, looked up by the caller).
    pub fn parse_continuing(
        self,
        body: &[u8],
        limits: Limits<'_>,
        prior: Option<crate::responses::Prior<'_>>,
    ) -> Result<Request, ApiError> {
        match self {
            Self::Messages => crate::messages::parse(body, limits),
            Self::Chat => crate::openai::parse_chat(body, limits),
            Self::Completions => crate::openai::parse_completion(body, limits),
            Self::Responses => crate::responses::parse(body, limits, prior),
        }
    }

    /// A fresh id for a reply (`msg_…`, `chatcmpl-…`, `cmpl-…`, `resp_…`) from a random
    /// `unique` part.
    pub fn reply_id(self, unique: &str) -> String {
        let prefix = match self {
            Self::Messages => "msg_",
            Self::Chat => "chatcmpl-",
            Self::Completions => "cmpl-",
            Self::Responses => "resp_",
        };
        let mut id = String::with_capacity(prefix.len() + unique.len());
        id.push_str(prefix);
        id.push_str(unique);
        id
    }

    /// The status of an error answer (OpenAI has no `529`: `503` there).
    pub fn error_status(self, error: &ApiError) -> StatusCode {
        match self {
            Self::Messages => error.kind().status(),
            Self::Chat | Self::Completions | Self::Responses => reply::openai::error_status(error),
        }
    }

    /// The body of an error answer.
    pub fn error_body(self, error: &ApiError) -> Vec<u8> {
        match self {
            Self::Messages => reply::messages::error_body(error),
            Self::Chat | Self::Completions | Self::Responses => reply::openai::error_body(error),
        }
    }

    /// Appends an error to a stream that has begun (Anthropic's `event: error`, OpenAI's error
    /// chunk, the Responses API's `error` event).
    pub fn error_event(self, error: &ApiError, out: &mut Vec<u8>) {
        match self {
            Self::Messages => reply::messages::error_event(error, out),
            Self::Chat | Self::Completions => reply::openai::error_event(error, out),
            Self::Responses => reply::responses::error_event(error, out),
        }
    }

    /// The writer of a streamed reply `id` to `request`.
    pub fn stream_writer(self, id: String, request: &Request) -> StreamWriter {
        match self {
            Self::Messages => StreamWriter::Messages(reply::messages::StreamWriter::new(
                id,
                request.model.clone(),
                request.show_reasoning,
            )),
            Self::Chat | Self::Completions => {
                StreamWriter::new(self, id, request.model.clone(), request.include_usage)
            }
            Self::Responses => {
                StreamWriter::Responses(Box::new(reply::responses::StreamWriter::new(id, request)))
            }
        }
    }

    /// The body of a whole reply `id` to `request`.
    pub fn whole_body(
        self,
        reply: &WholeReply,
        id: &str,
        request: &Request,
    ) -> Result<Vec<u8>, ApiError> {
        let model = &request.model;
        match self {
            Self::Messages => reply::messages::whole_body(reply, id, model, request.show_reasoning),
            Self::Chat => reply::openai::whole_body(reply, id, model, true),
            Self::Completions => reply::openai::whole_body(reply, id, model, false),
            Self::Responses => reply::responses::whole_body(reply, id, request),
        }
    }
}
