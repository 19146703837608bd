//! Ringmaster's client-facing request model: one validated [`Request`], the [`Door`] it came
//! in by, and one codec per door, with no I/O, no async, and no knowledge of the pool or the
//! policies.
//!
//! A door's codec turns the body's wire shape ([`ringmaster_wire`]) into the one [`Request`]
//! (its prompt already the engines' chat, its token estimate made once), refusing with an
//! [`ApiError`] that names the field; and it writes the reply's door-neutral events
//! ([`reply::ReplyEvent`]) as its own API's stream or whole body. The rules the doors share
//! (tools, images, refused features, `max_tokens`) are written once ([`rules`], with each
//! door's field names passed in).
//!
//! ```
//! use ringmaster_api::{Door, Limits};
//!
//! let models = ["sim-llama-3-8b".to_owned()];
//! let limits = Limits::new(&models, 4096);
//! let body = br#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}]}"#;
//! let request = Door::Chat.parse(body, limits).unwrap();
//! assert_eq!(request.messages[0].text, "Hi");
//! assert_eq!(request.max_tokens, 4096);
//! ```

#![deny(missing_docs)]

mod door;
pub mod error;
pub mod fields;
mod json;
pub mod messages;
pub mod openai;
pub mod relay;
pub mod reply;
mod request;
pub mod responses;
mod rules;
pub mod volatile;

pub use door::Door;
pub use error::{ApiError, ErrorKind};
pub use fields::{FieldNotes, UnknownFields};
pub use json::read_json;
pub use request::{
    Clamped, ESTIMATED_BYTES_PER_TOKEN, ESTIMATED_TOKENS_PER_IMAGE, Limits, MAX_SESSION_CHARS,
    Request,
};
pub use volatile::VolatileLines;
