//! [`ReplyReader`]: a server's streamed reply, bytes in, engine events out, with the SSE split
//! and the decoding of its API's events as one step (no I/O: the relay, the proptests and the
//! fuzz target all read replies through it). With a relay, a chat server's own content chunks
//! are kept too.

use ringmaster_gpu_runtime::GenerateEvent;
use ringmaster_wire::Api;

use super::chunks::ChunkKind;
use super::dialects::Decoder;
use super::sse::SseDecoder;
use crate::generation::RelayState;

/// A server's streamed reply, bytes in, engine events out: the SSE split ([`SseDecoder`]) and
/// the decoding ([`Decoder`], for the server's API) as one step, with no I/O (the relay, the proptests and
/// the fuzz target all read replies through it). With a relay, the server's own content chunks
/// are also kept, as the SSE frames it sent, for a client that speaks the server's API.
#[derive(Debug)]
pub struct ReplyReader {
    sse: SseDecoder,
    decoder: Decoder,
    /// `None`: no relay.
    relay: Option<Relay>,
}

/// What a relay keeps of the server's chunks.
#[derive(Debug, Default)]
struct Relay {
    /// The content chunks read and not yet taken, as `data: …` frames.
    frames: Vec<u8>,
    /// A content chunk carried the finish.
    finish: bool,
}

/// Decodes one event's data, keeping it for the relay when it was content.
fn read_event(
    decoder: &mut Decoder,
    relay: &mut Option<Relay>,
    data: &[u8],
    out: &mut Vec<GenerateEvent>,
) {
    let kind = decoder.data(data, out);
    if let (ChunkKind::Content { finish }, Some(relay)) = (kind, relay.as_mut()) {
        relay.frames.extend_from_slice(b"data: ");
        relay.frames.extend_from_slice(data);
        relay.frames.extend_from_slice(b"\n\n");
        relay.finish |= finish;
    }
}

impl ReplyReader {
    /// A reader of a chat server's reply that cuts off any line or event longer than
    /// `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self::of(Api::Chat, limit)
    }

    /// A reader of a reply in `api`'s events.
    pub fn of(api: Api, limit: usize) -> Self {
        Self {
            sse: SseDecoder::new(limit),
            decoder: Decoder::of(api),
            relay: None,
        }
    }

    /// A reader that also keeps the server's content chunks for [`Self::take_relayed`].
    pub fn relaying(limit: usize) -> Self {
        Self {
            sse: SseDecoder::new(limit),
            decoder: Decoder::relaying(Api::Chat),
            relay: Some(Relay::default()),
        }
    }

    /// Bytes read from the body; the events they complete go to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<GenerateEvent>) {
        if self.decoder.is_done() {
            return;
        }
        self.sse.push(bytes);
        while let Some(event) = self.sse.next_event() {
            match event {
                Ok(data) => read_event(&mut self.decoder, &mut self.relay, data, out),
                Err(e) => self.decoder.fail(e.to_string(), out),
            }
            if self.decoder.is_done() {
                break;
            }
        }
    }

    /// The body ended: the last event, then the finish (or the failure) if none came.
    pub fn end(&mut self, out: &mut Vec<GenerateEvent>) {
        if !self.decoder.is_done()
            && let Some(event) = self.sse.finish()
        {
            match event {
                Ok(data) => read_event(&mut self.decoder, &mut self.relay, data, out),
                Err(e) => self.decoder.fail(e.to_string(), out),
            }
        }
        self.decoder.end_of_body(out);
    }

    /// The reply broke off.
    pub fn fail(&mut self, message: String, out: &mut Vec<GenerateEvent>) {
        self.decoder.fail(message, out);
    }

    /// Whether the last event was produced.
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// Whether the output count is this reader's own (the server reported none).
    pub fn counted_output(&self) -> bool {
        self.decoder.counted_output()
    }

    /// The content chunks kept since the last call, as the SSE frames the server sent them
    /// (`None` without a relay or with nothing new).
    pub fn take_relayed(&mut self) -> Option<Vec<u8>> {
        let relay = self.relay.as_mut().filter(|r| !r.frames.is_empty())?;
        Some(std::mem::take(&mut relay.frames))
    }

    /// What a relay has passed on so far (`None` without a relay): the server's reply id,
    /// and whether a chunk with the finish was among the chunks.
    pub fn relay_state(&self) -> Option<RelayState> {
        let relay = self.relay.as_ref()?;
        Some(RelayState {
            reply_id: self.decoder.reply_id().map(str::to_owned),
            finish_relayed: relay.finish,
        })
    }
}
