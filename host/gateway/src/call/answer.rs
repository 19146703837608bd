//! Phase 5, the reply: the started generation handed to the reply machine ([`crate::reply`]),
//! collected into one body or streamed in the door's terms, and a stream adopted for resuming
//! when streams are resumable. It must not decide anything about routing or retries.

use http::Response;
use http::header::HeaderValue;
use ringmaster_api::ApiError;

use super::attempt::Started;
use super::{Call, json_body};
use crate::body::ResponseBody;
use crate::respond::header_names;
use crate::track::Tracker;
use ringmaster_responses::Saver;

impl Call {
    /// Phase 5: the reply to this call, whose generation has `started`, as a stream or one body.
    pub(super) async fn answer(
        self,
        tracker: Tracker,
        started: Started,
    ) -> Result<Response<ResponseBody>, ApiError> {
        let call = self;
        let Started {
            generation,
            in_flight,
            ..
        } = started;
        let door = call.request.door;
        let relay = generation.relay_state();
        let reply_id = || match relay.as_ref().and_then(|r| r.reply_id.clone()) {
            // A relayed reply keeps the server's id, which its relayed chunks carry.
            Some(id) if door.relays_chat_chunks() => id,
            _ => door.reply_id(
                uuid::Uuid::new_v4()
                    .simple()
                    .encode_lower(&mut uuid::Uuid::encode_buffer()),
            ),
        };
        // A Responses reply is stored at its end (unless `store: false`) and can be cancelled
        // while it runs.
        let saver = |id: &str| {
            call.request.responses.as_deref().map(|context| {
                Saver::new(call.gateway.responses(), id, &call.caller.owner, context)
            })
        };
        if !call.request.stream {
            let mut in_flight = in_flight;
            // A server's answer kept for a relay goes out as it came; its events still run
            // through the machine for the accounting.
            let mut generation = generation;
            let relayed = generation.take_answer();
            // An answer relayed as the server sent it carries the server's own id (a Responses
            // reply is never relayed whole: the gateway stores it under its own): none is drawn.
            let id = if relayed.is_some() && call.request.responses.is_none() {
                String::new()
            } else {
                reply_id()
            };
            let saver = saver(&id);
            let collected = crate::reply::collect::collect(&tracker, generation, &mut in_flight);
            let whole = match &saver {
                Some(saver) => tokio::select! {
                    whole = collected => whole,
                    () = saver.cancel.cancelled() => Err(ApiError::new(
                        ringmaster_api::ErrorKind::Conflict,
                        ringmaster_responses::CANCELLED,
                    )),
                },
                None => collected.await,
            }?;
            drop(in_flight);
            let body = match relayed {
                Some(body) => body,
                None => door.whole_body(&whole, &id, &call.request)?,
            };
            if let Some(saver) = saver {
                saver.finished(&body);
            }
            return Ok(json_body(body));
        }
        let id = reply_id();
        let saver = saver(&id);
        let writer = door.stream_writer(id, &call.request);
        let response = crate::reply::stream::response(
            tracker,
            writer,
            (generation, relay.is_some()),
            in_flight,
            saver,
        );
        let streams = &call.gateway.streams;
        if !streams.enabled() {
            return Ok(response);
        }
        let (mut parts, body) = response.into_parts();
        // The stream is known by its request's id, which a stream that started early (before this
        // point) already named in its headers.
        let body = streams.adopt(&call.id, &call.caller.owner, body);
        if let Ok(value) = HeaderValue::from_str(&call.id) {
            parts.headers.insert(&header_names::STREAM_ID, value);
        }
        Ok(Response::from_parts(parts, body))
    }
}
