//! [`Door`]: which API a request came in by, matched in this one place. The door parses the
//! body, names the reply's id, writes the reply (streamed or whole) and the errors, each in
//! its own API's terms.

use http::StatusCode;

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
}

impl Door {
    /// Every door.
    pub const ALL: [Door; 3] = [Door::Messages, Door::Chat, Door::Completions];

    /// The door at `path`, if it is one.
    pub fn at(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|door| door.path() == path)
    }

    /// Its path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Messages => "/v1/messages",
            Self::Chat => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
        }
    }

    /// Its name in metrics and logs.
    pub fn route(self) -> &'static str {
        match self {
            Self::Messages => "messages",
            Self::Chat => "chat_completions",
            Self::Completions => "completions",
        }
    }

    /// Whether its API is OpenAI's (whose clients read `x-ratelimit-*`, and whose servers'
    /// chunks a reply can relay as they came).
    pub fn is_openai(self) -> bool {
        !matches!(self, Self::Messages)
    }

    /// Parses and validates a body that came in by this door.
    pub fn parse(self, body: &[u8], limits: Limits<'_>) -> Result<Request, ApiError> {
        match self {
            Self::Messages => crate::messages::parse(body, limits),
            Self::Chat => crate::openai::parse_chat(body, limits),
            Self::Completions => crate::openai::parse_completion(body, limits),
        }
    }

    /// A fresh id for a reply (`msg_…`, `chatcmpl-…`, `cmpl-…`) from a random `unique` part.
    pub fn reply_id(self, unique: &str) -> String {
        let prefix = match self {
            Self::Messages => "msg_",
            Self::Chat => "chatcmpl-",
            Self::Completions => "cmpl-",
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
            Self::Chat | Self::Completions => reply::openai::error_status(error),
        }
    }

    /// The body of an error answer.
    pub fn error_body(self, error: &ApiError) -> Vec<u8> {
        match self {
            Self::Messages => reply::messages::error_body(error),
            Self::Chat | Self::Completions => reply::openai::error_body(error),
        }
    }

    /// Appends an error to a stream that has begun (Anthropic's `event: error`, OpenAI's error
    /// chunk).
    pub fn error_event(self, error: &ApiError, out: &mut Vec<u8>) {
        match self {
            Self::Messages => reply::messages::error_event(error, out),
            Self::Chat | Self::Completions => reply::openai::error_event(error, out),
        }
    }

    /// The writer of a streamed reply `id` to `request`.
    pub fn stream_writer(self, id: String, request: &Request) -> StreamWriter {
        StreamWriter::new(self, id, request.model.clone(), request.include_usage)
    }

    /// The body of a whole reply `id` from `model`.
    pub fn whole_body(
        self,
        reply: &WholeReply,
        id: &str,
        model: &str,
    ) -> Result<Vec<u8>, ApiError> {
        match self {
            Self::Messages => reply::messages::whole_body(reply, id, model),
            Self::Chat => reply::openai::whole_body(reply, id, model, true),
            Self::Completions => reply::openai::whole_body(reply, id, model, false),
        }
    }
}
