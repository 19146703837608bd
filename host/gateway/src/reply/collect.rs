//! A reply collected into one message, for a client that asked for no stream: the same
//! machine's events folded into a [`WholeReply`], which the door writes whole.

use ringmaster_api::ApiError;
use ringmaster_api::reply::WholeReply;
use ringmaster_gpu_runtime::GenerateEvent;
use ringmaster_pool::{Generation, InFlight};
use tracing::debug;

use super::{Ended, ReplyMachine};
use crate::track::Tracker;

/// Counts a client disconnect if a non-streaming reply is dropped before it is complete:
/// hyper drops the handler's future when the connection goes away, and with it the engine's
/// stream, which cancels the generation.
struct UnfinishedReply<'a> {
    tracker: &'a Tracker,
    finished: bool,
}

impl Drop for UnfinishedReply<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.tracker.gateway.metrics.client_disconnects.inc();
            debug!("request.client_disconnected");
        }
    }
}

/// The whole reply as one message.
pub(crate) async fn collect(
    tracker: &Tracker,
    mut generation: Generation,
    in_flight: &mut InFlight,
) -> Result<WholeReply, ApiError> {
    let mut guard = UnfinishedReply {
        tracker,
        finished: false,
    };
    let mut machine = ReplyMachine::new(tracker);
    let mut whole = WholeReply::default();
    loop {
        let event = generation.next().await;
        if matches!(event, Some(GenerateEvent::Started { .. })) {
            in_flight.prefilled();
        }
        if let Some(ended) = machine.on(tracker, event, &mut whole) {
            guard.finished = true;
            // Dropping the stream cancels what is left of the generation (after a refusal).
            drop(generation);
            return match ended {
                Ended::Failed(error) => Err(error),
                Ended::Finished { .. } | Ended::Blocked => Ok(whole),
            };
        }
    }
}
