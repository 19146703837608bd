//! End-to-end tests of the engine with the simulated executor.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::*;
use crate::Role;
use crate::tokenizer::{SIM_WORDS, SimTokenizer};

fn fast(name: &str) -> EngineConfig {
    EngineConfig {
        time_scale: 0.0,
        ..EngineConfig::simulated(name)
    }
}

fn user(text: &str) -> ChatMessage {
    ChatMessage {
        role: Role::User,
        text: text.to_string(),
        ..Default::default()
    }
}

fn assistant(text: &str) -> ChatMessage {
    ChatMessage {
        role: Role::Assistant,
        text: text.to_string(),
        ..Default::default()
    }
}

fn request(system: Option<&str>, messages: Vec<ChatMessage>, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        request_id: "test".into(),
        system: system.map(str::to_string),
        messages,
        max_tokens,
        stop_sequences: vec![],
        sampling: SamplingParams::default(),
        prompt: None,
        priority: 0,
        tools: None,
        effort: None,
        output_format: None,
    }
}

/// A long system prompt of about `n` tokens.
fn long_system(n: usize) -> String {
    (0..n)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug)]
struct Reply {
    prompt_tokens: u32,
    cached_tokens: u32,
    tokens: Vec<String>,
    reason: FinishReason,
    output_tokens: u32,
}

impl Reply {
    fn text(&self) -> String {
        self.tokens.concat()
    }
}

async fn collect(mut stream: GenerationStream) -> Reply {
    let first = stream.next().await.expect("an event");
    let GenerateEvent::Started {
        prompt_tokens,
        cached_tokens,
    } = first
    else {
        panic!("first event must be Started, got {first:?}");
    };
    let mut tokens = Vec::new();
    loop {
        match stream.next().await.expect("stream ends with Finished") {
            GenerateEvent::Token { text } => tokens.push(text),
            GenerateEvent::Finished {
                reason,
                prompt_tokens: p,
                cached_tokens: c,
                output_tokens,
            } => {
                assert_eq!((p, c), (prompt_tokens, cached_tokens));
                assert_eq!(stream.next().await, None, "None after Finished");
                return Reply {
                    prompt_tokens,
                    cached_tokens,
                    tokens,
                    reason,
                    output_tokens,
                };
            }
            GenerateEvent::Started { .. } => panic!("Started twice"),
            GenerateEvent::Failed { message } => panic!("a local engine failed: {message}"),
            GenerateEvent::ToolCall { .. } => panic!("a local engine called a tool"),
            GenerateEvent::Reasoning { .. } => panic!("a local engine reasoned apart"),
        }
    }
}

async fn generate(engine: &EngineHandle, req: GenerateRequest) -> Reply {
    collect(engine.submit(req).unwrap()).await
}

/// Waits until `cond` holds on the engine's load (yielding at first, then sleeping a
/// millisecond at a time, up to about 5 s), or fails.
async fn wait_for(engine: &EngineHandle, cond: impl Fn(&LoadReport) -> bool) -> LoadReport {
    for i in 0..5_000 {
        let load = engine.load();
        if cond(&load) {
            return load;
        }
        if i < 100 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    panic!("condition never held: {:?}", engine.load());
}

#[tokio::test]
async fn text_is_deterministic_and_ends_the_turn() {
    let a = EngineHandle::spawn(fast("a")).unwrap();
    let b = EngineHandle::spawn(fast("b")).unwrap();
    let req = request(Some("Be helpful."), vec![user("Tell me a story.")], 1000);
    let ra = generate(&a, req.clone()).await;
    let rb = generate(&b, req.clone()).await;
    assert_eq!(ra.text(), rb.text());
    assert_eq!(ra.reason, FinishReason::EndOfTurn);
    assert!(
        (17..=256).contains(&ra.output_tokens),
        "{}",
        ra.output_tokens
    );
    assert_eq!(
        ra.tokens.len() as u32,
        ra.output_tokens - 1,
        "one word per token"
    );
    assert!(ra.tokens.iter().all(|t| SIM_WORDS.contains(&t.as_str())));
    assert_eq!(
        ra.prompt_tokens,
        a.count_prompt_tokens(req.system.as_deref(), &req.messages)
    );
    // Same engine again: same text, now from the cache.
    let again = generate(&a, req.clone()).await;
    assert_eq!(again.text(), ra.text());
    assert!(again.cached_tokens > 0);
    // A seed varies the text.
    let mut seeded = req;
    seeded.sampling.seed = Some(7);
    assert_ne!(generate(&a, seeded).await.text(), ra.text());
    let load = a.load();
    assert_eq!(load.requests_finished, 3);
    assert_eq!(load.kv_blocks_used, 0);
    assert!(load.kv_blocks_cached > 0);
}

#[tokio::test]
async fn max_tokens_ends_with_max_tokens() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    let r = generate(&engine, request(None, vec![user("Hi")], 5)).await;
    assert_eq!(r.reason, FinishReason::MaxTokens);
    assert_eq!((r.output_tokens, r.tokens.len()), (5, 5));
    let zero = generate(&engine, request(None, vec![user("Hi")], 0)).await;
    assert_eq!(
        (zero.reason, zero.output_tokens),
        (FinishReason::MaxTokens, 0)
    );
    assert_eq!(engine.load().generated_tokens_total, 5);
}

#[tokio::test]
async fn ignore_eos_runs_to_max_tokens_past_the_end_of_the_turn() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    // Past the longest reply the simulated model would give on its own.
    let wanted = crate::executor::SIM_MAX_REPLY_TOKENS as u32 + 200;
    let plain = generate(&engine, request(None, vec![user("Hi")], wanted)).await;
    assert_eq!(plain.reason, FinishReason::EndOfTurn);
    let mut long = request(None, vec![user("Hi")], wanted);
    long.sampling.ignore_eos = true;
    let long = generate(&engine, long).await;
    assert_eq!(long.reason, FinishReason::MaxTokens);
    assert_eq!(
        (long.output_tokens, long.tokens.len() as u32),
        (wanted, wanted)
    );
    assert!(
        long.text().starts_with(&plain.text()),
        "the same reply, carried on"
    );
    assert!(!long.text().contains("<|im_end|>"));
}

#[tokio::test]
async fn stop_sequences_end_generation_and_are_never_streamed() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    let req = request(None, vec![user("Write something.")], 1000);
    let full = generate(&engine, req.clone()).await;
    // Stop at the 5th and 6th words together, wherever they first occur.
    let stop = format!("{}{}", full.tokens[4], full.tokens[5]);
    let expected = full.text()[..full.text().find(&stop).unwrap()].to_string();
    let mut with_stop = req;
    with_stop.stop_sequences = vec!["never matches".into(), stop.clone()];
    let r = generate(&engine, with_stop).await;
    assert_eq!(r.reason, FinishReason::StopSequence(stop.clone()));
    assert_eq!(r.text(), expected);
    assert!(!r.text().contains(&stop));
    // Held-back text is released in later events, never as empty ones.
    assert!(r.tokens.iter().all(|t| !t.is_empty()));
}

#[tokio::test]
async fn a_shared_system_prompt_hits_the_prefix_cache() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    let system = long_system(300);
    let first = generate(
        &engine,
        request(Some(&system), vec![user("first question")], 8),
    )
    .await;
    assert_eq!(first.cached_tokens, 0);
    let second = generate(&engine, request(Some(&system), vec![user("second one")], 8)).await;
    assert!(second.cached_tokens >= 288, "{}", second.cached_tokens);
    assert_eq!(second.cached_tokens % BLOCK_SIZE as u32, 0);
    let load = engine.load();
    assert_eq!(
        load.cached_prompt_tokens_total,
        u64::from(second.cached_tokens)
    );
    assert_eq!(
        load.prompt_tokens_total,
        u64::from(first.prompt_tokens + second.prompt_tokens)
    );
}

#[tokio::test]
async fn a_conversation_hits_its_own_earlier_turns() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    let mut messages = vec![user("Hello, who are you?")];
    let turn1 = generate(&engine, request(Some("Be kind."), messages.clone(), 1000)).await;
    messages.push(assistant(&turn1.text()));
    messages.push(user("And then?"));
    let turn2 = generate(&engine, request(Some("Be kind."), messages.clone(), 1000)).await;
    // Everything computed in turn 1 (prompt and reply, but the final end-of-turn token, whose
    // KV was never computed), in whole blocks.
    let computed = turn1.prompt_tokens + turn1.output_tokens - 1;
    let expected = computed / BLOCK_SIZE as u32 * BLOCK_SIZE as u32;
    assert_eq!(turn2.cached_tokens, expected);
    assert!(
        turn2.cached_tokens > turn1.prompt_tokens,
        "the reply itself was hit"
    );
    messages.push(assistant(&turn2.text()));
    messages.push(user("Thanks."));
    let turn3 = generate(&engine, request(Some("Be kind."), messages, 1000)).await;
    assert!(turn3.cached_tokens > turn2.prompt_tokens);
}

#[tokio::test]
async fn dropping_the_stream_cancels_and_frees_blocks() {
    let engine = EngineHandle::spawn(fast("e")).unwrap();
    let mut stream = engine
        .submit(request(Some(&long_system(200)), vec![user("go")], 200))
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(GenerateEvent::Started { .. })
    ));
    assert!(engine.load().kv_blocks_used > 0);
    drop(stream);
    let load = wait_for(&engine, |l| l.requests_cancelled == 1).await;
    assert_eq!((load.kv_blocks_used, load.running), (0, 0));
    assert_eq!(load.requests_finished, 0);
    // A stream dropped before the engine even took the request in.
    let stream = engine.submit(request(None, vec![user("x")], 10)).unwrap();
    drop(stream);
    wait_for(&engine, |l| l.requests_cancelled == 2 && l.waiting == 0).await;
}

#[tokio::test(start_paused = true)]
async fn cancellation_wakes_a_sleeping_engine() {
    // One step of 8192 prefill tokens at real time takes ~827 ms; the cancellation must not
    // wait for it.
    let engine = EngineHandle::spawn(EngineConfig::simulated("e")).unwrap();
    let stream = engine
        .submit(request(Some(&long_system(20_000)), vec![user("go")], 10))
        .unwrap();
    wait_for(&engine, |l| l.running == 1).await;
    let start = Instant::now();
    drop(stream);
    // Let the engine run without advancing the clock.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(engine.load().kv_blocks_used, 0);
    assert_eq!(engine.load().requests_cancelled, 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// Wraps the simulated executor to count prefill tokens and notice its own drop.
struct Counting {
    inner: SimExecutor,
    prefill_tokens: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
}

impl Counting {
    fn new() -> (Self, Arc<AtomicU64>, Arc<AtomicBool>) {
        let prefill = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let me = Self {
            inner: SimExecutor::new(crate::SimCostModel::default()),
            prefill_tokens: prefill.clone(),
            dropped: dropped.clone(),
        };
        (me, prefill, dropped)
    }
}

impl Executor for Counting {
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        self.prefill_tokens
            .fetch_add(plan.num_prefill_tokens() as u64, Ordering::Relaxed);
        self.inner.execute(plan)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn concurrent_requests_compute_a_shared_prompt_once() {
    let (executor, prefill_tokens, _) = Counting::new();
    let engine = EngineHandle::spawn_with_executor(fast("e"), executor).unwrap();
    let system = long_system(1000);
    let streams: Vec<GenerationStream> = (0..25)
        .map(|i| {
            engine
                .submit(request(
                    Some(&system),
                    vec![user(&format!("question number {i}"))],
                    4,
                ))
                .unwrap()
        })
        .collect();
    assert_eq!(engine.load().waiting, 25);
    let mut replies = Vec::new();
    for s in streams {
        replies.push(collect(s).await);
    }
    let prompt_tokens = replies[0].prompt_tokens as u64;
    assert!(prompt_tokens > 1000);
    let shared = (prompt_tokens - 10) / BLOCK_SIZE as u64 * BLOCK_SIZE as u64;
    let computed = prefill_tokens.load(Ordering::Relaxed);
    // One system prompt plus each request's distinct tail (under two blocks each).
    assert!(
        computed <= prompt_tokens + 24 * 2 * BLOCK_SIZE as u64,
        "computed {computed} prompt tokens for 25 × {prompt_tokens}"
    );
    assert!(
        replies[1..]
            .iter()
            .all(|r| u64::from(r.cached_tokens) >= shared)
    );
    let load = engine.load();
    assert_eq!(load.requests_finished, 25);
    assert_eq!(
        load.prompt_tokens_total - load.cached_prompt_tokens_total,
        computed,
        "no preemption: what was not cached was computed once"
    );
}

#[tokio::test]
async fn preempted_requests_finish_with_the_same_text() {
    let reqs: Vec<GenerateRequest> = (0..6)
        .map(|i| request(None, vec![user(&format!("request {i}"))], 100))
        .collect();
    let roomy = EngineHandle::spawn(fast("roomy")).unwrap();
    let tight = EngineHandle::spawn(EngineConfig {
        kv_blocks: 16,
        ..fast("tight")
    })
    .unwrap();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| tight.submit(r.clone()).unwrap())
        .collect();
    for (r, s) in reqs.iter().zip(streams) {
        want.push(generate(&roomy, r.clone()).await.text());
        got.push(collect(s).await.text());
    }
    assert_eq!(got, want);
    let load = tight.load();
    assert!(load.preemptions > 0, "{load:?}");
    assert_eq!((load.requests_finished, load.kv_blocks_used), (6, 0));
}

#[tokio::test]
async fn a_prompt_that_can_never_fit_is_rejected_at_submit() {
    let engine = EngineHandle::spawn(EngineConfig {
        kv_blocks: 8,
        ..fast("small")
    })
    .unwrap();
    let long = request(Some(&long_system(200)), vec![user("hi")], 10);
    match engine.submit(long) {
        Err(EngineError::PromptTooLong {
            prompt_tokens,
            max_tokens,
            capacity_tokens,
        }) => {
            assert!(prompt_tokens > 200);
            assert_eq!((max_tokens, capacity_tokens), (10, 128));
        }
        other => panic!("expected PromptTooLong, got {other:?}"),
    }
    // A short prompt with a huge max_tokens cannot fit either.
    let greedy = request(None, vec![user("hi")], 1_000);
    assert!(matches!(
        engine.submit(greedy),
        Err(EngineError::PromptTooLong { .. })
    ));
    // One that fits runs.
    let ok = generate(&engine, request(None, vec![user("hi")], 50)).await;
    assert!(ok.output_tokens > 0);
}

#[tokio::test]
async fn in_flight_requests_finish_after_the_last_handle_is_dropped() {
    let (executor, _, dropped) = Counting::new();
    let engine = EngineHandle::spawn_with_executor(fast("e"), executor).unwrap();
    let stream = engine.submit(request(None, vec![user("hi")], 20)).unwrap();
    drop(engine);
    let r = collect(stream).await;
    assert_eq!(r.output_tokens, 20);
    for _ in 0..100 {
        if dropped.load(Ordering::Relaxed) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the engine task did not end");
}

#[tokio::test]
async fn invalid_configs_are_refused() {
    let bad = EngineConfig {
        max_running: 0,
        ..fast("e")
    };
    assert!(matches!(
        EngineHandle::spawn(bad),
        Err(EngineError::InvalidConfig(_))
    ));
}

#[test]
fn spawning_outside_a_runtime_is_refused() {
    assert!(matches!(
        EngineHandle::spawn(fast("e")),
        Err(EngineError::InvalidConfig(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn the_modelled_clock_scales_step_durations() {
    let engine = EngineHandle::spawn(EngineConfig {
        time_scale: 0.1,
        ..EngineConfig::simulated("clocked")
    })
    .unwrap();
    let system = long_system(990);
    let messages = vec![user("q")];
    let prompt_tokens = engine.count_prompt_tokens(Some(&system), &messages);
    assert!((995..1005).contains(&prompt_tokens), "{prompt_tokens}");
    let start = Instant::now();
    let mut stream = engine.submit(request(Some(&system), messages, 11)).unwrap();
    assert!(matches!(
        stream.next().await,
        Some(GenerateEvent::Started { .. })
    ));
    // Prefill: 8 ms base + ~1000 tokens / 10k tok/s = ~108 ms, × 0.1.
    let prefill = start.elapsed();
    assert!(
        (Duration::from_micros(10_500)..=Duration::from_millis(12)).contains(&prefill),
        "{prefill:?}"
    );
    // Ten decode steps of 8.1 ms × 0.1 = 8.1 ms in all: sub-millisecond steps accumulate
    // instead of each rounding up to a whole millisecond.
    let decode_start = Instant::now();
    let r = collect_rest(&mut stream).await;
    assert_eq!(r, 11);
    let decode = decode_start.elapsed();
    assert!(
        (Duration::from_micros(7_500)..=Duration::from_millis(10)).contains(&decode),
        "{decode:?}"
    );
}

/// Reads to `Finished`; returns the output token count.
async fn collect_rest(stream: &mut GenerationStream) -> u32 {
    loop {
        if let Some(GenerateEvent::Finished { output_tokens, .. }) = stream.next().await {
            return output_tokens;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_on_a_multi_threaded_runtime() {
    let engine = EngineHandle::spawn(EngineConfig {
        kv_blocks: 64,
        time_scale: 0.001,
        ..EngineConfig::simulated("mt")
    })
    .unwrap();
    let system = long_system(100);
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let engine = engine.clone();
            let system = system.clone();
            tokio::spawn(async move {
                let req = request(Some(&system), vec![user(&format!("client {i}"))], 40);
                let mut stream = engine.submit(req).unwrap();
                if i % 4 == 0 {
                    // Cancel after the first event.
                    stream.next().await;
                    return None;
                }
                Some(collect(stream).await)
            })
        })
        .collect();
    let mut finished = 0;
    for t in tasks {
        if let Some(r) = t.await.unwrap() {
            assert!(r.output_tokens > 0);
            finished += 1;
        }
    }
    assert_eq!(finished, 30);
    let load = wait_for(&engine, |l| {
        l.requests_cancelled + l.requests_finished == 40
    })
    .await;
    assert_eq!((load.kv_blocks_used, load.running, load.waiting), (0, 0, 0));
    assert!(load.cached_prompt_tokens_total > 0);
}

/// Applies `events` to `view` as a router outside the engine would.
fn apply_kv_events(view: &mut HashSet<u64>, events: &mut broadcast::Receiver<KvEvent>) {
    loop {
        match events.try_recv() {
            Ok(KvEvent::Stored(stored)) => view.insert(stored.hash.0),
            Ok(KvEvent::Evicted(h)) => view.remove(&h.0),
            Err(broadcast::error::TryRecvError::Empty) => return,
            Err(e) => panic!("the subscriber fell behind: {e}"),
        };
    }
}

#[tokio::test]
async fn the_published_cache_holds_a_finished_prompt_before_its_reply_ends() {
    let engine = EngineHandle::spawn(fast("kv")).unwrap();
    let req = request(Some(&long_system(200)), vec![user("Hello there.")], 4);
    let prompt = engine
        .tokenizer()
        .encode_chat(req.system.as_deref(), &req.messages);
    let hashes = crate::block::block_hashes(&prompt);
    assert!(hashes.len() >= 10);
    assert_eq!(engine.cached_prefix_blocks(&hashes), 0);
    let (snapshot, mut events) = engine.kv_subscribe();
    assert!(snapshot.is_empty());
    generate(&engine, req.clone()).await;
    // As soon as the reply is out, the prompt's blocks are published: every full block of it.
    assert_eq!(engine.cached_prefix_blocks(&hashes), hashes.len());
    let mut view = HashSet::new();
    apply_kv_events(&mut view, &mut events);
    assert!(hashes.iter().all(|h| view.contains(&h.0)));
    // A late subscriber starts from a snapshot holding the same blocks.
    let (snapshot, _) = engine.kv_subscribe();
    let snapshot: HashSet<u64> = snapshot.iter().map(|h| h.0).collect();
    assert_eq!(snapshot, view);
}

#[tokio::test]
async fn eviction_is_published_and_the_snapshot_plus_events_track_the_cache() {
    // A pool so small that each new prompt evicts the previous one's blocks.
    let engine = EngineHandle::spawn(EngineConfig {
        kv_blocks: 40,
        ..fast("kv-small")
    })
    .unwrap();
    let (snapshot, mut events) = engine.kv_subscribe();
    let mut view: HashSet<u64> = snapshot.iter().map(|h| h.0).collect();
    let mut first = None;
    for i in 0..4 {
        // Distinct from the first token on, so no prompt shares a block with another.
        let system = format!("v{i} {}", long_system(300));
        let req = request(Some(&system), vec![user("Hi.")], 4);
        let prompt = engine
            .tokenizer()
            .encode_chat(req.system.as_deref(), &req.messages);
        first.get_or_insert(crate::block::block_hashes(&prompt));
        generate(&engine, req).await;
        apply_kv_events(&mut view, &mut events);
        let (now, _) = engine.kv_subscribe();
        let now: HashSet<u64> = now.iter().map(|h| h.0).collect();
        assert_eq!(view, now, "after prompt {i}");
    }
    let first = first.unwrap();
    assert!(
        engine.cached_prefix_blocks(&first) < first.len(),
        "the first prompt was evicted"
    );
    assert!(view.len() <= 40);
}

#[test]
fn the_simulated_tokenizer_travels_as_a_spec() {
    let spec = SimTokenizer::new().spec();
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json, r#"{"kind":"sim"}"#);
    let back: crate::TokenizerSpec = serde_json::from_str(&json).unwrap();
    let rebuilt = back.build().unwrap();
    let messages = [user("Count to 3, then stop.")];
    assert_eq!(
        rebuilt.encode_chat(Some("sys"), &messages),
        SimTokenizer::new().encode_chat(Some("sys"), &messages)
    );
    assert_eq!(back.fingerprint(), spec.fingerprint());
}

#[tokio::test]
async fn a_prefill_hands_its_prompt_to_a_decode_engine_which_continues_as_whole() {
    let prefill = EngineHandle::spawn(fast("prefill")).unwrap();
    let decode = EngineHandle::spawn(fast("decode")).unwrap();
    let whole = EngineHandle::spawn(fast("whole")).unwrap();
    let ask = || request(Some(&long_system(300)), vec![user("go on")], 24);
    let (stream, handoff) = prefill.submit_prefill(ask()).unwrap();
    let prefilled = collect(stream).await;
    assert_eq!(prefilled.output_tokens, 1, "a prefill samples one token");
    let handoff = handoff.await.expect("a finished prefill hands its KV over");
    let prompt = prefilled.prompt_tokens as usize;
    assert_eq!(handoff.blocks.len(), prompt / BLOCK_SIZE);
    assert_eq!(handoff.contents, crate::KvContents::Modelled);
    assert_eq!(
        handoff.transfer_bytes(handoff.blocks.len()),
        (handoff.blocks.len() * BLOCK_SIZE) as u64 * crate::cost::KV_BYTES_PER_TOKEN
    );
    // Chained: each block names the one before it.
    for pair in handoff.blocks.windows(2) {
        assert_eq!(pair[1].parent, Some(pair[0].hash));
    }
    let decoded = collect(decode.submit_with_kv(ask(), handoff.clone()).unwrap()).await;
    let reference = collect(whole.submit(ask()).unwrap()).await;
    assert_eq!(
        decoded.text(),
        reference.text(),
        "the same tokens as served whole"
    );
    assert_eq!(decoded.output_tokens, 24);
    // The decode engine computed only what the handed-over blocks do not cover (the match
    // always leaves the prompt's last token to compute).
    let covered = (handoff.blocks.len() * BLOCK_SIZE).min(prompt - 1) / BLOCK_SIZE * BLOCK_SIZE;
    assert_eq!(decoded.cached_tokens as usize, covered);
    assert_eq!(reference.cached_tokens, 0);
    // And it keeps them for the next request with that prompt.
    assert_eq!(
        decode.cached_prefix_blocks(&handoff.hashes()),
        handoff.blocks.len()
    );
    // A decode engine that is handed blocks of contents it cannot write computes the prompt.
    let unreadable = crate::KvHandoff {
        contents: crate::KvContents::Unavailable,
        ..handoff
    };
    let fresh = EngineHandle::spawn(fast("fresh")).unwrap();
    let computed = collect(fresh.submit_with_kv(ask(), unreadable).unwrap()).await;
    assert_eq!(computed.cached_tokens, 0);
    assert_eq!(computed.text(), reference.text());
}

#[tokio::test]
async fn a_planted_handoff_is_refused_counted_and_the_prompt_computed_here() {
    let prefill = EngineHandle::spawn(fast("prefill")).unwrap();
    let whole = EngineHandle::spawn(fast("whole")).unwrap();
    let victim = || request(Some(&long_system(300)), vec![user("go on")], 24);
    let planted = || {
        let system = format!("another tenant's {}", long_system(300));
        request(Some(&system), vec![user("go on")], 24)
    };
    let reference = collect(whole.submit(victim()).unwrap()).await;
    // Blocks computed for another prompt, handed in with this one.
    let (stream, other) = prefill.submit_prefill(planted()).unwrap();
    collect(stream).await;
    let other = other.await.unwrap();
    // The request's own blocks, one of them under a hash that is not its tokens'.
    let (stream, own) = prefill.submit_prefill(victim()).unwrap();
    collect(stream).await;
    let mut forged = own.await.unwrap();
    forged.blocks[2].hash = crate::block::BlockHash(0x5eed);
    // (Each with the first block that is not the request's own.)
    for (handoff, reason, foreign) in [
        (other, crate::ImportRefusal::Tokens, 0),
        (forged, crate::ImportRefusal::Hash, 2),
    ] {
        let decode = EngineHandle::spawn(fast("decode")).unwrap();
        let hashes = handoff.hashes();
        let served = collect(decode.submit_with_kv(victim(), handoff).unwrap()).await;
        assert_eq!(served.text(), reference.text(), "{reason:?}: still right");
        assert_eq!(served.cached_tokens, 0, "{reason:?}: computed here");
        // What the engine holds now is what it computed: no foreign block under any hash.
        assert_eq!(
            decode.cached_prefix_blocks(&hashes[foreign..]),
            0,
            "{reason:?}: nothing planted"
        );
        let load = wait_for(&decode, |l| {
            l.kv_import_refused_hash + l.kv_import_refused_tokens > 0
        })
        .await;
        let counted = match reason {
            crate::ImportRefusal::Hash => load.kv_import_refused_hash,
            crate::ImportRefusal::Tokens => load.kv_import_refused_tokens,
            crate::ImportRefusal::Shape => load.kv_import_refused_shape,
        };
        assert_eq!(counted, 1, "{reason:?}");
    }
}

#[tokio::test]
async fn a_cancelled_prefill_hands_nothing_over() {
    let prefill = EngineHandle::spawn(EngineConfig {
        time_scale: 1.0,
        ..EngineConfig::simulated("prefill")
    })
    .unwrap();
    let (stream, handoff) = prefill
        .submit_prefill(request(Some(&long_system(2000)), vec![user("hi")], 50))
        .unwrap();
    drop(stream);
    assert!(handoff.await.is_err());
}

#[tokio::test]
async fn a_burst_fills_its_steps_and_every_ready_sequence_decodes() {
    // Two running at a time, eight submitted: six wait, so the first steps run under load.
    let engine = EngineHandle::spawn(EngineConfig {
        max_running: 2,
        step_token_budget: 64,
        prefill_tokens_while_decoding: 16,
        ..fast("burst")
    })
    .unwrap();
    let mut streams = Vec::new();
    for i in 0..8 {
        let mut req = request(None, vec![user(&long_system(40 + i))], 12);
        req.sampling.ignore_eos = true;
        streams.push(engine.submit(req).unwrap());
    }
    for stream in streams {
        collect(stream).await;
    }
    let load = wait_for(&engine, |l| l.requests_finished == 8).await;
    assert!(load.loaded_steps > 0, "{load:?}");
    assert!(load.loaded_steps < load.steps);
    assert!(load.loaded_step_tokens_total <= load.loaded_step_capacity_tokens_total);
    // Admission is bounded by max_running, not by tokens: a loaded step holding two decodes
    // has room for 16 prompt tokens only while another prompt still prefills.
    let fill = load.loaded_step_tokens_total as f64 / load.loaded_step_capacity_tokens_total as f64;
    assert!(fill > 0.0 && fill <= 1.0, "{fill}");
    // Nothing was preempted, so every sequence ready to decode decoded in every step.
    assert_eq!(load.preemptions, 0);
    assert_eq!(load.decode_tokens_total, load.decode_ready_total);
    assert!(load.decode_ready_total > 0);
}
