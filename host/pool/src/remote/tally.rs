//! [`Tally`]: what one reply has said so far, whatever its server's API (its id, whether it
//! began, how it finished, its usage, the pieces counted when the server counts none), and the
//! one way a reply starts and ends as engine events. Each API's decoder ([`super::chunks`],
//! [`super::dialects`]) reads its own events into one.

use ringmaster_gpu_runtime::{FinishReason, GenerateEvent};

/// What one reply has said so far, whatever its API.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) reply_id: Option<String>,
    pub(super) started: bool,
    pub(super) finish: Option<FinishReason>,
    pub(super) prompt: Option<u32>,
    pub(super) cached: Option<u32>,
    pub(super) output: Option<u32>,
    /// Text, reasoning and argument pieces seen: the output count when the server gives none.
    pub(super) pieces: u32,
    pub(super) done: bool,
}

impl Tally {
    pub(super) fn start(&mut self, out: &mut Vec<GenerateEvent>) {
        if !self.started {
            self.started = true;
            out.push(GenerateEvent::Started {
                prompt_tokens: self.prompt.unwrap_or(0),
                cached_tokens: self.cached.unwrap_or(0),
            });
        }
    }

    pub(super) fn push(&mut self, event: GenerateEvent, out: &mut Vec<GenerateEvent>) {
        self.start(out);
        self.pieces += 1;
        out.push(event);
    }

    pub(super) fn fail(&mut self, message: String, out: &mut Vec<GenerateEvent>) {
        if !self.done {
            self.done = true;
            out.push(GenerateEvent::Failed { message });
        }
    }

    /// The reply ended: finished when it said how (`clean`: a last event came), failed
    /// otherwise.
    pub(super) fn end(&mut self, out: &mut Vec<GenerateEvent>, clean: bool) {
        if self.done {
            return;
        }
        let reason = match self.finish.take() {
            Some(reason) => reason,
            None if clean && self.started => FinishReason::EndOfTurn,
            None => {
                self.fail(
                    "the GPU server closed the stream before finishing the reply".into(),
                    out,
                );
                return;
            }
        };
        self.start(out);
        self.done = true;
        out.push(GenerateEvent::Finished {
            reason,
            prompt_tokens: self.prompt.unwrap_or(0),
            cached_tokens: self.cached.unwrap_or(0),
            output_tokens: self.output.unwrap_or(self.pieces),
        });
    }
}
