//! Following a vLLM or SGLang engine's KV-cache events: a ZeroMQ SUB socket on its publisher,
//! each batch's sequence checked, gaps repaired from its replay socket, and the batches applied
//! to the server's [`ReportedCache`] through an [`EngineIndex`].
//!
//! The sequence rules, per publisher:
//! - the next number: applied;
//! - a jump forward (batches lost, or the gateway's socket was away): the missing batches are
//!   asked of the replay socket (`[empty, 8-byte start]` on a DEALER; the engine answers each
//!   buffered batch from the start, then a batch numbered −1). If the replay does not begin
//!   where asked, the gap is older than the engine's buffer; if there is no replay socket or it
//!   does not answer, nothing can repair it: either way the server's view is reset to empty,
//!   counted and logged, and rebuilt from what follows;
//! - a number at or below the last one (outside what a replay just delivered): the publisher
//!   restarted, so its cache is empty: the view is reset and followed from there.
//!
//! On joining (and rejoining) with a replay socket, the engine's buffer is replayed first, so
//! the view holds what the engine stored before the gateway started, as far as its buffer
//! reaches. Frames that fail to decode (garbage, a batch over the decoder's bounds) are counted,
//! logged and passed over; they never stop the follower. While the publisher is unreachable
//! the view is stale and the server falls back to the routing-history estimate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ringmaster_config::{KvEventsSpec, TokenizerSource};
use ringmaster_kv_events::{DecodeError, Frame, decode_batch, decode_frame};
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::RemoteWorker;
use crate::engine_index::EngineIndex;
use crate::kv_view::{ReportedCache, Scheme};

/// Longest wait for the publisher's TCP connection before the follower checks on its server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a whole replay may take.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the follower checks that its server is still in the pool while the stream is
/// quiet.
const REMOVED_CHECK: Duration = Duration::from_secs(1);
/// Least time between two warnings about undecodable frames from one publisher.
const GARBAGE_LOG_EVERY: Duration = Duration::from_secs(10);
/// The replay's end marker: sequence −1.
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// One engine feed's counters and state, read by `/admin/servers` and `/metrics`.
#[derive(Debug)]
pub struct EngineFeed {
    /// What the configuration says.
    pub spec: KvEventsSpec,
    /// The configured tokenizer.
    pub tokenizer: Option<TokenizerSource>,
    /// Why the tokenizer could not be built, if it could not.
    tokenizer_error: Mutex<Option<String>>,
    connected: AtomicBool,
    /// The last sequence applied, plus one (0: none yet).
    next_sequence: AtomicU64,
    batches: AtomicU64,
    blocks_stored: AtomicU64,
    blocks_removed: AtomicU64,
    orphans: AtomicU64,
    gaps_repaired: AtomicU64,
    resets: AtomicU64,
    restarts: AtomicU64,
    refused_frames: AtomicU64,
    engine_blocks: AtomicU64,
}

/// A copy of an [`EngineFeed`]'s counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineFeedReport {
    /// Whether the publisher's socket is connected.
    pub connected: bool,
    /// The last batch applied, if any.
    pub last_sequence: Option<u64>,
    /// Batches applied.
    pub batches: u64,
    /// Engine blocks stored and removed.
    pub blocks_stored: u64,
    /// Engine blocks removed.
    pub blocks_removed: u64,
    /// Stored blocks passed over (parent never seen).
    pub orphan_blocks: u64,
    /// Engine blocks indexed now.
    pub engine_blocks: u64,
    /// Gaps repaired from the replay socket.
    pub gaps_repaired: u64,
    /// Times the view was reset: a gap that could not be repaired, or an index that outgrew
    /// its bound.
    pub resets: u64,
    /// Times the publisher restarted (sequence back to an earlier number).
    pub restarts: u64,
    /// Frames that could not be decoded (garbage, oversized batches).
    pub refused_frames: u64,
    /// Why the tokenizer could not be built.
    pub tokenizer_error: Option<String>,
}

impl EngineFeed {
    pub(super) fn new(spec: KvEventsSpec, tokenizer: Option<TokenizerSource>) -> Self {
        Self {
            spec,
            tokenizer,
            tokenizer_error: Mutex::new(None),
            connected: AtomicBool::new(false),
            next_sequence: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            blocks_stored: AtomicU64::new(0),
            blocks_removed: AtomicU64::new(0),
            orphans: AtomicU64::new(0),
            gaps_repaired: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            refused_frames: AtomicU64::new(0),
            engine_blocks: AtomicU64::new(0),
        }
    }

    /// The counters now.
    pub fn report(&self) -> EngineFeedReport {
        let next = self.next_sequence.load(Ordering::Relaxed);
        EngineFeedReport {
            connected: self.connected.load(Ordering::Relaxed),
            last_sequence: next.checked_sub(1),
            batches: self.batches.load(Ordering::Relaxed),
            blocks_stored: self.blocks_stored.load(Ordering::Relaxed),
            blocks_removed: self.blocks_removed.load(Ordering::Relaxed),
            orphan_blocks: self.orphans.load(Ordering::Relaxed),
            engine_blocks: self.engine_blocks.load(Ordering::Relaxed),
            gaps_repaired: self.gaps_repaired.load(Ordering::Relaxed),
            resets: self.resets.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            refused_frames: self.refused_frames.load(Ordering::Relaxed),
            tokenizer_error: self
                .tokenizer_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Builds the configured tokenizer (a while for a real vocabulary: off the async threads).
pub(crate) fn build_scheme(source: &TokenizerSource) -> Result<Scheme, String> {
    use ringmaster_gpu_runtime::{SimTokenizer, Tokenizer};
    let tokenizer: Arc<dyn Tokenizer> = match source {
        TokenizerSource::Sim => Arc::new(SimTokenizer::new()),
        TokenizerSource::Gguf(path) => {
            let file = ringmaster_gpu_runtime::model::ModelFile::open(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Arc::new(
                ringmaster_gpu_runtime::model::GgufTokenizer::from_file(&file)
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            )
        }
        TokenizerSource::HuggingFace(path) => Arc::new(
            ringmaster_gpu_runtime::tokenizer::hugging_face::HfTokenizer::from_spec(
                ringmaster_gpu_runtime::tokenizer::hugging_face::HfSpec::from_dir(path)?,
            )?,
        ),
    };
    Ok(Scheme::of(tokenizer))
}

/// Where the follower is in the publisher's sequence.
#[derive(Debug, Default)]
struct Position {
    /// The next sequence expected; `None` before the first batch.
    next: Option<u64>,
    /// Batches a replay just applied, which the live socket may deliver again.
    replayed: Option<(u64, u64)>,
}

/// What to do with a live batch.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Apply,
    /// Already applied by a replay.
    Skip,
    /// Batches `from..to` are missing.
    Gap {
        from: u64,
        to: u64,
    },
    /// The publisher started over.
    Restart,
}

impl Position {
    fn step(&mut self, sequence: u64) -> Step {
        if let Some((first, last)) = self.replayed {
            if (first..=last).contains(&sequence) {
                return Step::Skip;
            }
            self.replayed = None;
        }
        match self.next {
            None if sequence == 0 => Step::Apply,
            None => Step::Gap {
                from: 0,
                to: sequence,
            },
            Some(next) if sequence == next => Step::Apply,
            Some(next) if sequence > next => Step::Gap {
                from: next,
                to: sequence,
            },
            Some(_) => Step::Restart,
        }
    }
}

/// Follows the engine's events into `kv` while the server is in the pool.
pub(super) async fn follow(
    worker: Weak<RemoteWorker>,
    kv: Arc<ReportedCache>,
    feed: Arc<EngineFeed>,
) {
    let url = match worker.upgrade() {
        Some(w) => w.url.clone(),
        None => return,
    };
    if let Some(source) = feed.tokenizer.clone() {
        let built = tokio::task::spawn_blocking(move || build_scheme(&source)).await;
        match built.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(scheme) => kv.set_scheme_built(scheme),
            Err(why) => {
                warn!(server = %url, %why, "engine.tokenizer_unusable");
                *feed
                    .tokenizer_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(why);
            }
        }
    }
    let mut follower = Follower {
        url,
        kv,
        feed,
        index: EngineIndex::default(),
        position: Position::default(),
        last_garbage_log: None,
    };
    let mut backoff = Duration::from_millis(250);
    loop {
        if worker.strong_count() == 0 {
            return;
        }
        match follower.connect_and_follow(&worker).await {
            Ended::Removed => return,
            Ended::Lost(why) => {
                if follower.kv.is_synced() {
                    warn!(server = %follower.url, endpoint = %follower.feed.spec.endpoint, %why, "engine.events_lost");
                    backoff = Duration::from_millis(250);
                } else {
                    debug!(server = %follower.url, %why, "engine.events_unavailable");
                }
            }
        }
        follower.kv.mark_stale();
        follower.feed.connected.store(false, Ordering::Relaxed);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(super::KV_RECONNECT_MAX);
    }
}

enum Ended {
    Removed,
    Lost(String),
}

struct Follower {
    url: String,
    kv: Arc<ReportedCache>,
    feed: Arc<EngineFeed>,
    index: EngineIndex,
    position: Position,
    last_garbage_log: Option<Instant>,
}

impl Follower {
    async fn connect_and_follow(&mut self, worker: &Weak<RemoteWorker>) -> Ended {
        let mut socket = zeromq::SubSocket::new();
        let mut monitor = socket.monitor();
        match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(&self.feed.spec.endpoint)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Ended::Lost(e.to_string()),
            Err(_) => return Ended::Lost("the publisher did not accept a connection".into()),
        }
        if let Err(e) = socket.subscribe("").await {
            return Ended::Lost(e.to_string());
        }
        self.feed.connected.store(true, Ordering::Relaxed);
        // Catch up on what was published before (or while away), as far as the buffer goes.
        if self.feed.spec.replay.is_some() {
            let from = self.position.next.unwrap_or(0);
            self.repair(from, None).await;
        }
        self.kv.mark_synced();
        info!(server = %self.url, endpoint = %self.feed.spec.endpoint, blocks = self.kv.len(), "engine.events_following");
        let mut check = tokio::time::interval(REMOVED_CHECK);
        loop {
            let message = tokio::select! {
                message = socket.recv() => message,
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | None => {
                        return Ended::Lost("the publisher disconnected".into());
                    }
                    Some(_) => continue,
                },
                _ = check.tick() => {
                    if worker.strong_count() == 0 {
                        return Ended::Removed;
                    }
                    continue;
                }
            };
            let message = match message {
                Ok(message) => message,
                Err(e) => return Ended::Lost(e.to_string()),
            };
            let parts: Vec<&[u8]> = message.iter().map(|b| &b[..]).collect();
            match decode_frame(&parts) {
                Ok(frame) => self.on_live(frame).await,
                Err(e) => self.refused(&e),
            }
        }
    }

    async fn on_live(&mut self, frame: Frame) {
        match self.position.step(frame.sequence) {
            Step::Apply => self.apply(&frame),
            Step::Skip => {}
            Step::Restart => {
                self.feed.restarts.fetch_add(1, Ordering::Relaxed);
                warn!(server = %self.url, sequence = frame.sequence, blocks_dropped = self.index.engine_blocks(), "engine.publisher_restarted");
                self.index.clear(&self.kv);
                self.position = Position::default();
                // Joining the new run late: its earlier batches from the replay.
                if let Step::Gap { from, to } = self.position.step(frame.sequence) {
                    self.repair(from, Some(to)).await;
                }
                self.apply(&frame);
            }
            Step::Gap { from, to } => {
                self.repair(from, Some(to)).await;
                self.apply(&frame);
            }
        }
    }

    /// Applies one batch and moves the position past it.
    fn apply(&mut self, frame: &Frame) {
        let applied = self.index.apply(&frame.batch, &self.kv);
        self.position.next = Some(frame.sequence + 1);
        let feed = &self.feed;
        feed.next_sequence
            .store(frame.sequence + 1, Ordering::Relaxed);
        feed.batches.fetch_add(1, Ordering::Relaxed);
        feed.blocks_stored
            .fetch_add(applied.stored, Ordering::Relaxed);
        feed.blocks_removed
            .fetch_add(applied.removed, Ordering::Relaxed);
        feed.orphans.fetch_add(applied.orphans, Ordering::Relaxed);
        feed.engine_blocks
            .store(self.index.engine_blocks() as u64, Ordering::Relaxed);
        if applied.overflowed {
            feed.resets.fetch_add(1, Ordering::Relaxed);
            warn!(server = %self.url, bound = crate::engine_index::MAX_INDEXED_BLOCKS, "engine.index_overflowed");
        }
    }

    fn reset(&mut self, why: &str) {
        self.feed.resets.fetch_add(1, Ordering::Relaxed);
        warn!(server = %self.url, blocks_dropped = self.index.engine_blocks(), %why, "engine.view_reset");
        self.index.clear(&self.kv);
        self.feed.engine_blocks.store(0, Ordering::Relaxed);
    }

    fn refused(&mut self, error: &DecodeError) {
        self.feed.refused_frames.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        if self
            .last_garbage_log
            .is_none_or(|at| now.duration_since(at) >= GARBAGE_LOG_EVERY)
        {
            self.last_garbage_log = Some(now);
            warn!(server = %self.url, %error, refused_total = self.feed.refused_frames.load(Ordering::Relaxed), "engine.event_refused");
        }
    }

    /// Asks the replay socket for batches from `from` and applies them, up to `to` (exclusive)
    /// when the live stream holds `to`. Resets the view if the gap cannot be closed.
    async fn repair(&mut self, from: u64, to: Option<u64>) {
        let joining = self.position.next.is_none();
        let Some(endpoint) = self.feed.spec.replay.clone() else {
            // Joining late without a replay: what came before is unknown, not lost.
            if to.is_some() && !joining {
                self.reset(&format!(
                    "batches {from}..{} were lost and there is no replay socket",
                    to.unwrap_or(from)
                ));
            }
            return;
        };
        let frames = match tokio::time::timeout(REPLAY_TIMEOUT, replay(&endpoint, from)).await {
            Ok(Ok(frames)) => frames,
            Ok(Err(why)) => {
                if to.is_some() && !joining {
                    self.reset(&format!(
                        "batches from {from} were lost; the replay failed: {why}"
                    ));
                } else {
                    debug!(server = %self.url, %why, "engine.replay_failed");
                }
                return;
            }
            Err(_) => {
                if to.is_some() && !joining {
                    self.reset(&format!(
                        "batches from {from} were lost; the replay timed out"
                    ));
                }
                return;
            }
        };
        let mut frames: Vec<Frame> = frames
            .into_iter()
            .filter_map(|f| match f {
                Ok(frame) => Some(frame),
                Err(e) => {
                    self.refused(&e);
                    None
                }
            })
            .filter(|f| f.sequence >= from && to.is_none_or(|to| f.sequence < to))
            .collect();
        frames.sort_by_key(|f| f.sequence);
        let contiguous_from_start = frames.first().is_none_or(|f| f.sequence == from);
        let closes = match to {
            Some(to) => frames.last().map(|f| f.sequence + 1) == Some(to) && contiguous_from_start,
            None => contiguous_from_start,
        };
        if !closes && !joining {
            let oldest = frames.first().map(|f| f.sequence);
            self.reset(&format!(
                "batches from {from} are older than the engine's replay buffer (oldest held: {oldest:?})"
            ));
        } else if to.is_some() {
            self.feed.gaps_repaired.fetch_add(1, Ordering::Relaxed);
            info!(server = %self.url, from, to = to.unwrap_or(from), "engine.gap_repaired");
        }
        if let (Some(first), Some(last)) = (frames.first(), frames.last()) {
            self.position.replayed = Some((first.sequence, last.sequence));
        }
        for frame in &frames {
            self.apply(frame);
        }
    }
}

/// One replay: every frame the engine holds from `from`, decoded or refused.
async fn replay(endpoint: &str, from: u64) -> Result<Vec<Result<Frame, DecodeError>>, String> {
    let mut socket = zeromq::DealerSocket::new();
    socket.connect(endpoint).await.map_err(|e| e.to_string())?;
    let mut request = ZmqMessage::from(Vec::<u8>::new());
    request.push_back(from.to_be_bytes().to_vec().into());
    socket.send(request).await.map_err(|e| e.to_string())?;
    let mut frames = Vec::new();
    loop {
        let message = socket.recv().await.map_err(|e| e.to_string())?;
        let mut parts: Vec<&[u8]> = message.iter().map(|b| &b[..]).collect();
        // The ROUTER's empty delimiter, then `[seq, payload]` (SGLang, older vLLM) or
        // `[topic, seq, payload]` (newer vLLM).
        if parts.first().is_some_and(|p| p.is_empty()) {
            parts.remove(0);
        }
        let (sequence, payload) = match parts[..] {
            [sequence, payload] | [_, sequence, payload] => (sequence, payload),
            _ => {
                frames.push(Err(DecodeError::Parts { parts: parts.len() }));
                continue;
            }
        };
        if sequence == END_OF_REPLAY {
            return Ok(frames);
        }
        frames.push(match <[u8; 8]>::try_from(sequence) {
            Ok(bytes) => decode_batch(payload).map(|batch| Frame {
                topic: Vec::new(),
                sequence: u64::from_be_bytes(bytes),
                batch,
            }),
            Err(_) => Err(DecodeError::Sequence(sequence.len())),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_applies_skips_repairs_and_restarts() {
        let mut p = Position::default();
        assert_eq!(p.step(0), Step::Apply);
        p.next = Some(1);
        assert_eq!(p.step(1), Step::Apply);
        assert_eq!(p.step(4), Step::Gap { from: 1, to: 4 });
        p.next = Some(5);
        assert_eq!(p.step(5), Step::Apply);
        p.next = Some(6);
        assert_eq!(p.step(2), Step::Restart);
        assert_eq!(p.step(0), Step::Restart);
        // Joining late: everything before is asked of the replay.
        let mut late = Position::default();
        assert_eq!(late.step(40), Step::Gap { from: 0, to: 40 });
        // Batches a replay applied come again on the live socket: passed over once.
        let mut p = Position {
            next: Some(10),
            replayed: Some((3, 9)),
        };
        assert_eq!(p.step(8), Step::Skip);
        assert_eq!(p.step(9), Step::Skip);
        assert_eq!(p.step(10), Step::Apply);
        assert_eq!(p.replayed, None);
        p.next = Some(11);
        assert_eq!(p.step(9), Step::Restart);
    }
}
