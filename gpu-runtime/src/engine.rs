//! The async engine: one task that owns a scheduler and an executor, and the handles that talk
//! to it.
//!
//! This module owns the engine loop, request intake, per-request event streams, cancellation,
//! the modelled clock and the published [`LoadReport`]. It must not make scheduling decisions
//! ([`crate::scheduler`] does) nor compute tokens (the [`Executor`] does), and it never logs
//! prompt or output text.
//!
//! # How to use it
//!
//! [`EngineHandle::spawn`] starts the engine on the current tokio runtime and returns a cheap,
//! cloneable handle. [`EngineHandle::submit`] tokenizes a request in the caller's task, rejects
//! one that can never fit, and returns a [`GenerationStream`] of [`GenerateEvent`]s:
//! `Started`, then `Token`s, then `Finished`. A request that offers tools is refused
//! ([`EngineError::ToolsUnsupported`]) unless the executor simulates tool calls
//! ([`Executor::simulates_tool_calls`]); then, where the simulated model calls a tool, the
//! `Token`s are `ToolCall` pieces of that call instead, one per generated token, and
//! `Finished` says [`FinishReason::ToolCalls`]. [`EngineHandle::load`] reads the last published
//! [`LoadReport`] without waiting for the engine.
//!
//! # The loop
//!
//! Each iteration takes new submissions, drops cancelled requests (freeing their KV blocks),
//! asks the scheduler for a step, runs it on the executor, waits for the modelled clock, and
//! turns the sampled tokens into events. The clock keeps a deadline: the sum of all step
//! durations × `time_scale` since the engine last went idle, and sleeps until it, so many
//! sub-millisecond steps do not each round up to the timer's millisecond. With `time_scale`
//! 0.0 the engine never sleeps; it yields to the runtime after every step. When there is
//! nothing to do it waits for a submission or a cancellation, without spinning. An executor
//! that measures its steps (a real model) already spent that time, so the deadline is already
//! past and the engine does not sleep on top of it (use `time_scale` 1.0 there). The clock
//! never lags real time by more than a few milliseconds: past that it stops catching up.
//!
//! # What can go wrong
//!
//! - Dropping a [`GenerationStream`] before `Finished` cancels the request: the engine is woken
//!   (even mid-step) and frees the request's blocks at once; at the latest it does so at the
//!   next step boundary. Cancellations count in [`LoadReport::requests_cancelled`].
//! - The engine task ends when every [`EngineHandle`] is dropped and no request is left
//!   running or waiting: in-flight requests finish first. After that (or if the task
//!   panicked) [`EngineHandle::submit`] returns [`EngineError::Stopped`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};
use xxhash_rust::xxh3::xxh3_64;

use crate::block::{BlockHash, KvEvent, SeqId, blocks_for};
use crate::executor::{Executor, SampledToken, SimExecutor, StepOutcome, StepPlan, sim_tools};
use crate::generation::GenerationStream;
use crate::handoff::{ImportRefusal, KvContents, KvHandoff};
use crate::output::OutputText;
use crate::request::{
    ChatMessage, FinishReason, GenerateEvent, GenerateRequest, SamplingParams, ToolCall,
};
use crate::scheduler::{
    ADMISSION_HEADROOM_BLOCKS, NewSequence, Schedule, Scheduler, SchedulerConfig,
};
use crate::tokenizer::Tokenizer;
use crate::{BLOCK_SIZE, EngineConfig, EngineError};

/// How far the modelled clock may fall behind real time before the engine stops trying to
/// catch up. Timer wake-ups are late by up to about a millisecond in normal operation, so a
/// few milliseconds of lag is ordinary jitter that the deadline absorbs (keeping
/// sub-millisecond steps accurate on average); more means the host could not keep up.
const MAX_CLOCK_LAG: Duration = Duration::from_millis(5);

/// Prefix-cache events kept for slow subscribers (see [`EngineHandle::kv_subscribe`]).
pub const KV_EVENT_BUFFER: usize = 4096;

/// A snapshot of an engine's load and cumulative counters, published after every step: the
/// worker protocol's `GET /load` shape itself, so that a worker serves it and a gateway reads it
/// with no copy between the engine's terms and the wire's.
pub use ringmaster_wire::worker::Load as LoadReport;

/// State shared by the engine task, its handles and its streams.
#[derive(Debug)]
struct Shared {
    /// The last published report.
    load: Mutex<LoadReport>,
    /// Requests submitted but not yet taken in by the engine.
    inbox: AtomicU32,
    /// Wakes the engine when a stream is dropped.
    wake: Arc<Notify>,
    /// Prefix-cache changes, published after each step.
    kv_events: broadcast::Sender<KvEvent>,
    /// The hashes the prefix cache holds, as of the last published event. Events are applied
    /// and sent under this lock, so a snapshot plus a subscription taken together miss nothing.
    kv_cached: Mutex<HashSet<u64>>,
    /// Subscribers to each step's changes as one batch, unbounded (see
    /// [`EngineHandle::kv_subscribe_steps`]).
    kv_steps: Mutex<Vec<mpsc::UnboundedSender<Vec<KvEvent>>>>,
}

#[derive(Debug)]
struct HandleInner {
    name: String,
    tokenizer: Arc<dyn Tokenizer>,
    kv_blocks: u32,
    max_positions: Option<usize>,
    /// The executor answers tools as the simulated model does; else they are refused.
    simulates_tool_calls: bool,
    submissions: mpsc::UnboundedSender<Submission>,
    shared: Arc<Shared>,
    next_seq: AtomicU64,
}

/// A handle to a running engine; cheap to clone. The engine stops once every handle is dropped
/// and its last request has finished.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct Submission {
    seq_id: SeqId,
    request_id: String,
    prompt: Vec<u32>,
    prompt_fingerprint: u64,
    max_tokens: u32,
    stop_sequences: Vec<String>,
    sampling: SamplingParams,
    priority: u8,
    events: mpsc::UnboundedSender<GenerateEvent>,
    /// A prefill for another engine: its prompt's KV cache goes here when it finishes.
    export: Option<oneshot::Sender<KvHandoff>>,
    /// A decode of a prompt another engine prefilled: its blocks, registered before it is
    /// admitted.
    import: Option<KvHandoff>,
    /// The simulated model's answer is this tool call, not text.
    tool_call: Option<ToolCall>,
}

impl EngineHandle {
    /// Spawns an engine with the simulated executor on the current tokio runtime.
    pub fn spawn(config: EngineConfig) -> Result<EngineHandle, EngineError> {
        let executor = SimExecutor::new(config.cost.clone());
        Self::spawn_with_executor(config, executor)
    }

    /// Spawns an engine with `executor` on the current tokio runtime. The engine uses the
    /// executor's tokenizer.
    pub fn spawn_with_executor<E: Executor>(
        config: EngineConfig,
        executor: E,
    ) -> Result<EngineHandle, EngineError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            EngineError::InvalidConfig("an engine must be spawned within a tokio runtime".into())
        })?;
        let tokenizer = executor.tokenizer();
        let max_positions = executor.max_positions();
        let simulates_tool_calls = executor.simulates_tool_calls();
        let shared = Arc::new(Shared {
            load: Mutex::new(LoadReport {
                kv_blocks_total: config.kv_blocks,
                ..LoadReport::default()
            }),
            inbox: AtomicU32::new(0),
            wake: Arc::new(Notify::new()),
            kv_events: broadcast::channel(KV_EVENT_BUFFER).0,
            kv_cached: Mutex::new(HashSet::new()),
            kv_steps: Mutex::new(Vec::new()),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let engine = Engine {
            name: config.name.clone(),
            tokenizer: tokenizer.clone(),
            blocking: executor.runs_blocking(),
            executor: Some(Box::new(executor)),
            scheduler: Scheduler::new(SchedulerConfig {
                kv_blocks: config.kv_blocks,
                max_running: config.max_running,
                step_token_budget: config.step_token_budget,
                prefill_tokens_while_decoding: config.prefill_tokens_while_decoding,
            }),
            requests: HashMap::new(),
            submissions: rx,
            shared: shared.clone(),
            counters: Counters::default(),
            closed: false,
            config: config.clone(),
        };
        runtime.spawn(engine.run());
        Ok(EngineHandle {
            inner: Arc::new(HandleInner {
                name: config.name,
                tokenizer,
                kv_blocks: config.kv_blocks,
                max_positions,
                simulates_tool_calls,
                submissions: tx,
                shared,
                next_seq: AtomicU64::new(0),
            }),
        })
    }

    /// The engine's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Tokens of the rendered prompt for this chat, as [`submit`](Self::submit) would count
    /// them.
    pub fn count_prompt_tokens(&self, system: Option<&str>, messages: &[ChatMessage]) -> u32 {
        saturating_u32(self.inner.tokenizer.encode_chat(system, messages).len())
    }

    /// Submits a request. Tokenizes it in the caller's task, rejects it with
    /// [`EngineError::PromptTooLong`] if it could never fit in the KV cache (prompt plus
    /// `max_tokens`, with the admission headroom of one block), and returns its stream.
    ///
    /// A request with `max_tokens` 0 is answered at once (`Started`, then `Finished` with
    /// [`FinishReason::MaxTokens`]) without reaching the engine.
    pub fn submit(&self, request: GenerateRequest) -> Result<GenerationStream, EngineError> {
        self.submit_with(request, None, None)
    }

    /// Submits the prefill leg of a request another engine decodes: the prompt is computed
    /// and one token sampled (`max_tokens` is taken as 1), and when it finishes its prompt's
    /// KV cache ([`KvHandoff`]) is sent on the returned receiver, before the stream's
    /// `Finished`. A cancelled prefill sends nothing.
    pub fn submit_prefill(
        &self,
        mut request: GenerateRequest,
    ) -> Result<(GenerationStream, oneshot::Receiver<KvHandoff>), EngineError> {
        request.max_tokens = 1;
        let (tx, rx) = oneshot::channel();
        let stream = self.submit_with(request, Some(tx), None)?;
        Ok((stream, rx))
    }

    /// Submits the decode leg of a request another engine prefilled: `handoff`'s blocks are
    /// registered in this engine's prefix cache (those its executor can take, and those it
    /// has room for) before the request is admitted, so that it computes only what they do
    /// not cover.
    pub fn submit_with_kv(
        &self,
        request: GenerateRequest,
        handoff: KvHandoff,
    ) -> Result<GenerationStream, EngineError> {
        self.submit_with(request, None, Some(handoff))
    }

    fn submit_with(
        &self,
        request: GenerateRequest,
        export: Option<oneshot::Sender<KvHandoff>>,
        import: Option<KvHandoff>,
    ) -> Result<GenerationStream, EngineError> {
        let inner = &*self.inner;
        if inner.submissions.is_closed() {
            return Err(EngineError::Stopped);
        }
        if request.tools.is_some() && !inner.simulates_tool_calls {
            return Err(EngineError::ToolsUnsupported);
        }
        if request.messages.iter().any(|m| !m.images.is_empty()) {
            return Err(EngineError::ImagesUnsupported);
        }
        let prompt = match &request.prompt {
            Some(raw) => {
                let prompt = inner.tokenizer.encode_plain(raw);
                if prompt.is_empty() {
                    return Err(EngineError::EmptyPrompt);
                }
                prompt
            }
            None => inner
                .tokenizer
                .encode_chat(request.system.as_deref(), &request.messages),
        };
        if prompt.is_empty() {
            // The tokenizer is broken (a chat template always adds a generation prompt).
            return Err(EngineError::InvalidConfig(
                "the tokenizer rendered an empty prompt".into(),
            ));
        }
        let prompt_tokens = saturating_u32(prompt.len());
        // KV slots the sequence can ever hold: the last sampled token is never computed.
        let max_kv_tokens = prompt.len() + (request.max_tokens as usize).saturating_sub(1);
        if let Some(limit) = inner.max_positions
            && prompt.len() + request.max_tokens as usize > limit
        {
            return Err(EngineError::ContextTooLong {
                prompt_tokens,
                max_tokens: request.max_tokens,
                context_tokens: saturating_u32(limit),
            });
        }
        if blocks_for(max_kv_tokens) + ADMISSION_HEADROOM_BLOCKS > inner.kv_blocks as usize {
            return Err(EngineError::PromptTooLong {
                prompt_tokens,
                max_tokens: request.max_tokens,
                capacity_tokens: inner.kv_blocks.saturating_mul(BLOCK_SIZE as u32),
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = GenerationStream::from_engine(rx, inner.shared.wake.clone());
        if request.max_tokens == 0 {
            let _ = tx.send(GenerateEvent::Started {
                prompt_tokens,
                cached_tokens: 0,
            });
            let _ = tx.send(GenerateEvent::Finished {
                reason: FinishReason::MaxTokens,
                prompt_tokens,
                cached_tokens: 0,
                output_tokens: 0,
            });
            return Ok(stream);
        }
        let prompt_bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
        let prompt_fingerprint = xxh3_64(&prompt_bytes);
        // A raw prompt has no conversation to call a tool in.
        let tool_call = match (&request.tools, &request.prompt) {
            (Some(offer), None) => sim_tools::plan(
                offer,
                &request.messages,
                prompt_fingerprint ^ request.sampling.seed.unwrap_or(0),
            ),
            _ => None,
        };
        let submission = Submission {
            seq_id: SeqId(inner.next_seq.fetch_add(1, Ordering::Relaxed)),
            request_id: request.request_id,
            prompt_fingerprint,
            prompt,
            max_tokens: request.max_tokens,
            stop_sequences: request.stop_sequences,
            sampling: request.sampling,
            priority: request.priority,
            events: tx,
            export,
            import,
            tool_call,
        };
        inner.shared.inbox.fetch_add(1, Ordering::Relaxed);
        if inner.submissions.send(submission).is_err() {
            inner.shared.inbox.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineError::Stopped);
        }
        Ok(stream)
    }

    /// Whether the engine has stopped (its task ended); submissions then fail.
    pub fn is_stopped(&self) -> bool {
        self.inner.submissions.is_closed()
    }

    /// What the prefix cache holds now, and a subscription to its changes (blocks stored and
    /// evicted, by hash) from that moment: taken together under one lock, so applying the
    /// events in order to the snapshot tracks the cache exactly. A subscriber that falls more
    /// than [`KV_EVENT_BUFFER`] events behind gets `Lagged` and must take a new snapshot.
    pub fn kv_subscribe(&self) -> (Vec<BlockHash>, broadcast::Receiver<KvEvent>) {
        let shared = &self.inner.shared;
        let cached = shared
            .kv_cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let events = shared.kv_events.subscribe();
        (cached.iter().map(|h| BlockHash(*h)).collect(), events)
    }

    /// Each step's prefix-cache changes from now on, as one batch per step (what vLLM
    /// publishes as one KV event batch). Unlike [`Self::kv_subscribe`] nothing is ever
    /// dropped: a step that evicts thousands of blocks for one long prompt arrives whole. The
    /// channel is unbounded, so the subscriber must keep reading (an in-process consumer, such
    /// as the replay's vLLM-event view); dropping the receiver unsubscribes.
    pub fn kv_subscribe_steps(&self) -> mpsc::UnboundedReceiver<Vec<KvEvent>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .shared
            .kv_steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        rx
    }

    /// How many of `hashes` (a prompt's chained block hashes, in order) lead the prompt in
    /// the prefix cache now: the blocks a request with that prompt would not recompute.
    pub fn cached_prefix_blocks(&self, hashes: &[BlockHash]) -> usize {
        let cached = self
            .inner
            .shared
            .kv_cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        hashes.iter().take_while(|h| cached.contains(&h.0)).count()
    }

    /// Blocks the published prefix cache holds.
    pub fn cached_block_count(&self) -> usize {
        self.inner
            .shared
            .kv_cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the engine takes requests that offer tools: its executor simulates the calls
    /// ([`Executor::simulates_tool_calls`]). An engine that does not refuses them.
    pub fn simulates_tool_calls(&self) -> bool {
        self.inner.simulates_tool_calls
    }

    /// The engine's tokenizer: what a router needs to compute a prompt's block hashes.
    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.inner.tokenizer
    }

    /// The engine's load as of its last step (waiting includes requests submitted since).
    /// Takes a short lock; never waits for a step.
    pub fn load(&self) -> LoadReport {
        let shared = &self.inner.shared;
        let mut report = shared
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        report.waiting = report
            .waiting
            .saturating_add(shared.inbox.load(Ordering::Relaxed));
        report
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Debug, Default)]
struct Counters {
    prompt_tokens_total: u64,
    cached_prompt_tokens_total: u64,
    generated_tokens_total: u64,
    requests_finished: u64,
    requests_cancelled: u64,
    last_batch_size: u32,
    step_sequences_total: u64,
    step_tokens_total: u64,
    step_budget_tokens_total: u64,
    prefill_tokens_total: u64,
    decode_tokens_total: u64,
    busy_seconds_total: f64,
    loaded_steps: u64,
    loaded_step_tokens_total: u64,
    loaded_step_capacity_tokens_total: u64,
    decode_ready_total: u64,
    /// Handoffs refused, by [`ImportRefusal`].
    kv_import_refused: HashMap<ImportRefusal, u64>,
}

#[derive(Debug)]
struct Request {
    request_id: String,
    events: mpsc::UnboundedSender<GenerateEvent>,
    prompt_tokens: u32,
    cached_tokens: u32,
    output_tokens: u32,
    max_tokens: u32,
    /// The end-of-turn token does not end the reply (see [`SamplingParams::ignore_eos`]).
    ignore_eos: bool,
    started: bool,
    output: OutputText,
    /// Where a prefill's KV cache goes when it finishes.
    export: Option<oneshot::Sender<KvHandoff>>,
    /// The simulated model's tool call, sent in place of the generated text.
    tool_call: Option<CallOutput>,
}

struct Engine {
    name: String,
    config: EngineConfig,
    tokenizer: Arc<dyn Tokenizer>,
    /// `None` only while a blocking step runs.
    executor: Option<Box<dyn Executor>>,
    blocking: bool,
    scheduler: Scheduler,
    requests: HashMap<SeqId, Request>,
    submissions: mpsc::UnboundedReceiver<Submission>,
    shared: Arc<Shared>,
    counters: Counters,
    /// Every handle is gone: no more submissions.
    closed: bool,
}

impl Engine {
    async fn run(mut self) {
        info!(engine = %self.name, kv_blocks = self.config.kv_blocks, "engine.started");
        let mut deadline = Instant::now();
        loop {
            self.take_submissions();
            self.reap_cancelled();
            if self.scheduler.is_idle() {
                self.publish();
                if self.closed {
                    break;
                }
                self.wait_for_work().await;
                deadline = Instant::now();
                continue;
            }

            // A clock far behind real time (an overloaded host, or an executor whose measured
            // durations miss the engine's own overhead) forgives the difference instead of
            // bursting steps to catch up.
            let now = Instant::now();
            if let Some(floor) = now.checked_sub(MAX_CLOCK_LAG) {
                deadline = deadline.max(floor);
            }

            let schedule = self.scheduler.schedule();
            self.note_schedule(&schedule);
            // Publish the admissions now: the step may take a while on the modelled clock.
            self.publish();
            if schedule.plan.is_empty() {
                // The scheduler always makes progress while it holds sequences (admission
                // checks at submit guarantee it); never spin if that is ever broken.
                debug_assert!(false, "empty step with work pending");
                warn!(engine = %self.name, "engine.stalled");
                self.publish();
                self.wait_for_work().await;
                continue;
            }
            let Some((plan, outcome)) = self.execute(schedule.plan).await else {
                break;
            };
            if self.config.time_scale > 0.0 {
                deadline += outcome.duration.mul_f64(self.config.time_scale);
                self.sleep_until(deadline).await;
            } else {
                tokio::task::yield_now().await;
            }
            self.count_step(&plan, &outcome);
            let tokens = self.scheduler.apply(&plan, &outcome);
            // Before any token goes out: a client that sees its answer and sends the next turn
            // must find this step's blocks in the published cache.
            self.publish_kv_events();
            for token in tokens {
                self.on_token(token);
            }
            debug!(
                engine = %self.name,
                step = plan.step,
                tokens = plan.num_tokens(),
                decodes = plan.num_decodes(),
                duration_us = outcome.duration.as_micros() as u64,
                running = self.scheduler.num_running(),
                waiting = self.scheduler.num_waiting(),
                "engine.step"
            );
            self.publish();
        }
        info!(engine = %self.name, "engine.stopped");
    }

    /// Runs one step on the executor, on the blocking pool if the executor asks for it.
    /// `None` if the runtime is shutting down.
    async fn execute(&mut self, plan: StepPlan) -> Option<(StepPlan, StepOutcome)> {
        if !self.blocking {
            let executor = self.executor.as_mut().expect("present between steps");
            let outcome = executor.execute(&plan);
            return Some((plan, outcome));
        }
        let mut executor = self.executor.take().expect("present between steps");
        let joined = tokio::task::spawn_blocking(move || {
            let outcome = executor.execute(&plan);
            (executor, plan, outcome)
        })
        .await;
        match joined {
            Ok((executor, plan, outcome)) => {
                self.executor = Some(executor);
                Some((plan, outcome))
            }
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => None,
            },
        }
    }

    /// Sleeps until the modelled clock's deadline, dropping cancelled requests meanwhile.
    async fn sleep_until(&mut self, deadline: Instant) {
        let shared = self.shared.clone();
        let sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return,
                () = shared.wake.notified() => self.reap_cancelled(),
            }
        }
    }

    /// Waits for a submission, a cancellation, or the last handle going away.
    async fn wait_for_work(&mut self) {
        let shared = self.shared.clone();
        tokio::select! {
            submission = self.submissions.recv() => match submission {
                Some(s) => self.take_submission(s),
                None => self.closed = true,
            },
            () = shared.wake.notified() => {}
        }
    }

    fn take_submissions(&mut self) {
        loop {
            match self.submissions.try_recv() {
                Ok(s) => self.take_submission(s),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
    }

    fn take_submission(&mut self, s: Submission) {
        self.shared.inbox.fetch_sub(1, Ordering::Relaxed);
        if s.events.is_closed() {
            self.counters.requests_cancelled += 1;
            debug!(engine = %self.name, request_id = %s.request_id, "request.cancelled");
            return;
        }
        let prompt_tokens = saturating_u32(s.prompt.len());
        debug!(engine = %self.name, request_id = %s.request_id, seq = %s.seq_id, prompt_tokens, "request.queued");
        if let Some(handoff) = &s.import {
            self.import(&s.request_id, &s.prompt, handoff);
        }
        let ignore_eos = s.sampling.ignore_eos;
        self.scheduler.add(NewSequence {
            seq_id: s.seq_id,
            prompt: s.prompt,
            prompt_fingerprint: s.prompt_fingerprint,
            sampling: s.sampling,
            priority: s.priority,
        });
        self.requests.insert(
            s.seq_id,
            Request {
                request_id: s.request_id,
                events: s.events,
                prompt_tokens,
                cached_tokens: 0,
                output_tokens: 0,
                max_tokens: s.max_tokens,
                ignore_eos,
                started: false,
                output: OutputText::new(&s.stop_sequences),
                export: s.export,
                tool_call: s.tool_call.map(|call| CallOutput::new(call, s.max_tokens)),
            },
        );
    }

    /// Registers a prefill's blocks (another engine's) in the prefix cache and writes their
    /// contents, before the request that brought them is queued; a handoff that is not the
    /// request's own `prompt` or not of this executor's shape is refused whole and counted
    /// ([`KvHandoff::verify`]), and the prompt is computed here.
    fn import(&mut self, request_id: &str, prompt: &[u32], handoff: &KvHandoff) {
        let Some(executor) = self.executor.as_mut() else {
            return;
        };
        let checked = handoff.verify(prompt).and_then(|()| {
            match (&handoff.contents, executor.accepts(&handoff.contents)) {
                (_, true) => Ok(true),
                // Nothing to import: the prefill's executor could not read its blocks out.
                (KvContents::Unavailable, false) => Ok(false),
                (_, false) => Err(ImportRefusal::Shape),
            }
        });
        match checked {
            Ok(true) => {}
            Ok(false) => {
                debug!(engine = %self.name, request_id, "request.kv_not_imported");
                return;
            }
            Err(reason) => {
                *self.counters.kv_import_refused.entry(reason).or_default() += 1;
                warn!(
                    engine = %self.name,
                    request_id,
                    reason = reason.as_str(),
                    blocks = handoff.blocks.len(),
                    "request.kv_import_refused"
                );
                return;
            }
        }
        let written = self.scheduler.import_blocks(&handoff.blocks);
        executor.import_blocks(&written, &handoff.contents);
        debug!(
            engine = %self.name,
            request_id,
            handed_over = handoff.blocks.len(),
            imported = written.len(),
            "request.kv_imported"
        );
        self.publish_kv_events();
    }

    /// A finished prefill's handoff: its prompt's blocks and their contents (before the
    /// sequence's blocks are freed).
    fn export(&self, seq_id: SeqId) -> Option<KvHandoff> {
        let executor = self.executor.as_ref()?;
        let (blocks, ids): (Vec<_>, Vec<_>) =
            self.scheduler.prompt_blocks(seq_id).into_iter().unzip();
        Some(KvHandoff {
            contents: executor.export_blocks(&ids),
            blocks,
        })
    }

    /// Drops every request whose stream is gone and frees its blocks.
    fn reap_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in gone {
            let request = self.requests.remove(&id).expect("listed above");
            self.scheduler.abort(id);
            if let Some(executor) = self.executor.as_mut() {
                executor.sequence_finished(id);
            }
            self.counters.requests_cancelled += 1;
            debug!(engine = %self.name, request_id = %request.request_id, seq = %id, "request.cancelled");
        }
        self.publish();
    }

    fn note_schedule(&mut self, schedule: &Schedule) {
        if !schedule.plan.is_empty() {
            let c = &mut self.counters;
            c.decode_ready_total += schedule.decode_ready as u64;
            // Requests still waiting after admission: the step ran under load, and any room
            // it left was room the scheduler could not use.
            if self.scheduler.num_waiting() > 0 {
                c.loaded_steps += 1;
                c.loaded_step_tokens_total += schedule.plan.num_tokens() as u64;
                c.loaded_step_capacity_tokens_total += schedule.capacity_tokens as u64;
            }
        }
        for a in &schedule.admitted {
            if let Some(r) = self.requests.get_mut(&a.seq_id) {
                r.cached_tokens = a.cached_tokens;
                self.counters.prompt_tokens_total += u64::from(r.prompt_tokens);
                self.counters.cached_prompt_tokens_total += u64::from(a.cached_tokens);
                debug!(
                    engine = %self.name,
                    request_id = %r.request_id,
                    prompt_tokens = r.prompt_tokens,
                    cached_tokens = a.cached_tokens,
                    "request.admitted"
                );
            }
        }
        for id in &schedule.preempted {
            if let Some(r) = self.requests.get(id) {
                debug!(engine = %self.name, request_id = %r.request_id, "request.preempted");
            }
        }
    }

    fn on_token(&mut self, token: SampledToken) {
        let Some(r) = self.requests.get_mut(&token.seq_id) else {
            return;
        };
        r.output_tokens += 1;
        self.counters.generated_tokens_total += 1;
        if !r.started {
            r.started = true;
            let _ = r.events.send(GenerateEvent::Started {
                prompt_tokens: r.prompt_tokens,
                cached_tokens: r.cached_tokens,
            });
        }
        let reason = if let Some(call) = r.tool_call.as_mut() {
            // Each generated token carries the next piece of the call, whatever its text.
            let _ = r.events.send(call.next_piece());
            call.is_done().then_some(FinishReason::ToolCalls)
        } else if !r.ignore_eos && self.tokenizer.is_end_of_turn(token.token_id) {
            send_text(&r.events, r.output.flush());
            Some(FinishReason::EndOfTurn)
        } else {
            let released = r.output.push(&self.tokenizer.token_bytes(token.token_id));
            send_text(&r.events, released.text);
            if let Some(stop) = released.stop {
                Some(FinishReason::StopSequence(stop))
            } else if r.output_tokens >= r.max_tokens {
                send_text(&r.events, r.output.flush());
                Some(FinishReason::MaxTokens)
            } else {
                None
            }
        };
        let Some(reason) = reason else {
            return;
        };
        if let Some(export) = r.export.take() {
            // Before the stream's end: whoever reads the stream to its end finds it.
            if let Some(handoff) = self.export(token.seq_id) {
                let _ = export.send(handoff);
            }
        }
        let Some(r) = self.requests.remove(&token.seq_id) else {
            return;
        };
        let _ = r.events.send(GenerateEvent::Finished {
            reason: reason.clone(),
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            output_tokens: r.output_tokens,
        });
        debug!(
            engine = %self.name,
            request_id = %r.request_id,
            reason = ?reason,
            output_tokens = r.output_tokens,
            "request.finished"
        );
        self.scheduler.finish(token.seq_id);
        if let Some(executor) = self.executor.as_mut() {
            executor.sequence_finished(token.seq_id);
        }
        self.counters.requests_finished += 1;
    }

    fn count_step(&mut self, plan: &StepPlan, outcome: &StepOutcome) {
        let c = &mut self.counters;
        c.last_batch_size = saturating_u32(plan.seqs.len());
        c.step_sequences_total += plan.seqs.len() as u64;
        c.step_tokens_total += plan.num_tokens() as u64;
        c.step_budget_tokens_total += u64::from(self.config.step_token_budget);
        c.prefill_tokens_total += plan.num_prefill_tokens() as u64;
        c.decode_tokens_total += plan.num_decodes() as u64;
        c.busy_seconds_total += outcome.duration.as_secs_f64();
    }

    /// Applies the step's prefix-cache changes to the shared mirror and sends them to
    /// subscribers, under the mirror's lock (see [`EngineHandle::kv_subscribe`]).
    fn publish_kv_events(&mut self) {
        let events = self.scheduler.take_kv_events();
        if events.is_empty() {
            return;
        }
        let mut cached = self
            .shared
            .kv_cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &event in &events {
            match event {
                KvEvent::Stored(stored) => cached.insert(stored.hash.0),
                KvEvent::Evicted(h) => cached.remove(&h.0),
            };
            // No subscriber is the common case, not an error.
            let _ = self.shared.kv_events.send(event);
        }
        let mut steps = self
            .shared
            .kv_steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !steps.is_empty() {
            steps.retain(|tx| tx.send(events.clone()).is_ok());
        }
    }

    fn refused(&self, reason: ImportRefusal) -> u64 {
        self.counters
            .kv_import_refused
            .get(&reason)
            .copied()
            .unwrap_or(0)
    }

    fn publish(&self) {
        let blocks = self.scheduler.blocks();
        let stats = self.scheduler.stats();
        let report = LoadReport {
            running: saturating_u32(self.scheduler.num_running()),
            waiting: saturating_u32(self.scheduler.num_waiting()),
            kv_blocks_total: saturating_u32(blocks.total_blocks()),
            kv_blocks_used: saturating_u32(blocks.used_blocks()),
            kv_blocks_cached: saturating_u32(blocks.cached_blocks()),
            prompt_tokens_total: self.counters.prompt_tokens_total,
            cached_prompt_tokens_total: self.counters.cached_prompt_tokens_total,
            generated_tokens_total: self.counters.generated_tokens_total,
            requests_finished: self.counters.requests_finished,
            requests_cancelled: self.counters.requests_cancelled,
            preemptions: stats.preemptions,
            steps: stats.steps,
            last_batch_size: self.counters.last_batch_size,
            step_sequences_total: self.counters.step_sequences_total,
            step_tokens_total: self.counters.step_tokens_total,
            step_budget_tokens_total: self.counters.step_budget_tokens_total,
            prefill_tokens_total: self.counters.prefill_tokens_total,
            decode_tokens_total: self.counters.decode_tokens_total,
            busy_seconds_total: self.counters.busy_seconds_total,
            loaded_steps: self.counters.loaded_steps,
            loaded_step_tokens_total: self.counters.loaded_step_tokens_total,
            loaded_step_capacity_tokens_total: self.counters.loaded_step_capacity_tokens_total,
            decode_ready_total: self.counters.decode_ready_total,
            kv_import_refused_hash: self.refused(ImportRefusal::Hash),
            kv_import_refused_tokens: self.refused(ImportRefusal::Tokens),
            kv_import_refused_shape: self.refused(ImportRefusal::Shape),
        };
        *self
            .shared
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = report;
    }
}

fn send_text(events: &mpsc::UnboundedSender<GenerateEvent>, text: String) {
    if !text.is_empty() {
        let _ = events.send(GenerateEvent::Token { text });
    }
}

/// About how many characters of a call's arguments one generated token carries, as a
/// model's tokenizer splits JSON: the call takes about as many tokens as a model would spend
/// on it, and streams in as many pieces.
const SIM_CALL_CHARS_PER_TOKEN: usize = 4;

/// A tool call being streamed: one piece per generated token, the id and the name with the
/// first, the arguments' text spread over all of them.
#[derive(Debug)]
struct CallOutput {
    id: String,
    name: String,
    /// The arguments' text, cut into the pieces still to send (last first).
    pieces: Vec<String>,
    started: bool,
}

impl CallOutput {
    /// `call`, in at most `max_tokens` pieces: a call never ends at `max_tokens` half
    /// written, as an agent could not run it.
    fn new(call: ToolCall, max_tokens: u32) -> Self {
        let chars: Vec<char> = call.arguments.chars().collect();
        let tokens = (max_tokens as usize).max(1);
        let per_piece = SIM_CALL_CHARS_PER_TOKEN.max(chars.len().div_ceil(tokens));
        let mut pieces: Vec<String> = chars
            .chunks(per_piece)
            .map(|c| c.iter().collect())
            .collect();
        if pieces.is_empty() {
            pieces.push(String::new());
        }
        pieces.reverse();
        Self {
            id: call.id,
            name: call.name,
            pieces,
            started: false,
        }
    }

    /// The next piece's event.
    fn next_piece(&mut self) -> GenerateEvent {
        let first = !std::mem::replace(&mut self.started, true);
        GenerateEvent::ToolCall {
            index: 0,
            id: first.then(|| self.id.clone()),
            name: first.then(|| self.name.clone()),
            arguments: self.pieces.pop().unwrap_or_default(),
        }
    }

    /// Whether every piece was sent.
    fn is_done(&self) -> bool {
        self.pieces.is_empty()
    }
}

#[cfg(test)]
mod tests;
