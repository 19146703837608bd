//! Iteration-level continuous batching: which sequences compute which tokens in each step.
//!
//! This module owns the waiting queue, the running set and the per-step decisions. It drives
//! the [`BlockManager`] and produces a [`StepPlan`] per step; it must not compute anything
//! (the executor does), nor know about requests' channels, text or stop sequences (the engine
//! does). It is synchronous and deterministic, so it can be tested step by step.
//!
//! # One step
//!
//! [`Scheduler::schedule`] builds a step within a token budget (`step_token_budget`):
//!
//! 1. Cancelled sequences are already gone: the engine calls [`Scheduler::abort`] before each
//!    step, which frees their blocks at once.
//! 2. **Running decodes first**, one token each, oldest first. If a decode needs a new block
//!    and none is free or evictable, the running sequence with the **lowest priority** is
//!    preempted (the newest among equals; if it was already planned this step, its plan is
//!    withdrawn): its blocks
//!    are freed, it goes back to the front of the waiting queue, and it recomputes its prompt
//!    and output so far when readmitted (its registered blocks stay in the prefix cache, so the
//!    recompute is often cheap). No request is lost.
//! 3. **In-progress prefills** continue, oldest first, in chunks that fit the budget (chunked
//!    prefill: a long prompt takes several steps). In a step that decodes, prefill gets at
//!    most `prefill_tokens_while_decoding` tokens (Sarathi-Serve's stall-free batching), so a
//!    long prompt never stalls the running replies; a step with no decode uses the whole
//!    budget.
//! 4. **Admission** (skipped in a step that preempted): waiting sequences in arrival order
//!    while fewer than `max_running` run, budget remains and the KV cache holds the uncached
//!    part of the prompt plus [`ADMISSION_HEADROOM_BLOCKS`] (counting evictable cached
//!    blocks). A sequence whose reusable prefix runs into a block that a running sequence is
//!    computing right now (a *pending* block) is **deferred**, not admitted: it keeps its place
//!    and is admitted once the block is computed, so concurrent requests that share a long
//!    system prompt compute it once. Admission stops at the first sequence the KV cache cannot
//!    hold (first come, first served).
//!
//! After the executor ran the step, [`Scheduler::apply`] advances the computed counts,
//! registers newly full blocks in the prefix cache and appends the sampled tokens. The engine
//! then decides which sequences are finished and calls [`Scheduler::finish`].

use std::collections::{HashMap, VecDeque};

use crate::block::{BLOCK_SIZE, BlockHash, BlockId, BlockManager, SeqId, block_hashes};
use crate::executor::{SampledToken, ScheduledSeq, StepKind, StepOutcome, StepPlan};
use crate::request::SamplingParams;

/// Blocks beyond the prompt's that must be available to admit a sequence: room for its first
/// decode tokens, so that a new sequence does not cause a preemption in its very next step.
/// (vLLM v1 admits on the prompt alone and relies on preemption; one block of slack costs
/// little and avoids admit-then-preempt churn when the cache is nearly full.)
pub const ADMISSION_HEADROOM_BLOCKS: usize = 1;

/// The scheduler's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// KV-cache blocks in the pool.
    pub kv_blocks: u32,
    /// Most sequences running at once.
    pub max_running: u32,
    /// Most tokens computed per step; at least `max_running`.
    pub step_token_budget: u32,
    /// Most prompt tokens computed in a step that also decodes.
    pub prefill_tokens_while_decoding: u32,
}

/// A sequence to schedule.
#[derive(Clone, Debug)]
pub struct NewSequence {
    /// Its id, unique within the scheduler.
    pub seq_id: SeqId,
    /// The prompt's token ids; must not be empty.
    pub prompt: Vec<u32>,
    /// A stable hash of the prompt (passed through to the executor).
    pub prompt_fingerprint: u64,
    /// How to sample (passed through to the executor).
    pub sampling: SamplingParams,
    /// 0 = lowest; the lowest is preempted first.
    pub priority: u8,
}

/// A sequence admitted for the first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The sequence.
    pub seq_id: SeqId,
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: u32,
}

/// One step's decisions.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    /// What to compute.
    pub plan: StepPlan,
    /// Sequences admitted for the first time in this step.
    pub admitted: Vec<Admission>,
    /// Sequences preempted in this step (back in the waiting queue).
    pub preempted: Vec<SeqId>,
    /// Tokens this step could hold: the step budget, or with decodes in it the decodes plus
    /// the prefill allowed beside them.
    pub capacity_tokens: usize,
    /// Running sequences ready to decode when the step was scheduled.
    pub decode_ready: usize,
}

/// Cumulative scheduler counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Non-empty steps scheduled.
    pub steps: u64,
    /// Sequences preempted.
    pub preemptions: u64,
}

#[derive(Debug)]
struct Sequence {
    /// Prompt, then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Hashes of the full blocks of `tokens`, kept while the sequence waits.
    hashes: Vec<BlockHash>,
    /// Tokens whose KV is computed.
    num_computed: usize,
    /// Where this admission's prefill ends (prompt length, or more after a preemption).
    prefill_end: usize,
    prompt_fingerprint: u64,
    sampling: SamplingParams,
    priority: u8,
    admitted_before: bool,
}

impl Sequence {
    fn is_decode(&self) -> bool {
        self.num_computed >= self.prefill_end
    }
}

/// The continuous-batching scheduler (see the module documentation).
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    /// Waiting sequences, front first.
    waiting: VecDeque<SeqId>,
    /// Running sequences, oldest admission first.
    running: Vec<SeqId>,
    seqs: HashMap<SeqId, Sequence>,
    stats: SchedulerStats,
}

impl Scheduler {
    /// An empty scheduler over a fresh pool of `config.kv_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            blocks: BlockManager::new(config.kv_blocks),
            waiting: VecDeque::new(),
            running: Vec::new(),
            seqs: HashMap::new(),
            stats: SchedulerStats::default(),
        }
    }

    /// Queues a new sequence at the back of the waiting queue.
    ///
    /// # Panics
    ///
    /// If the id is in use or the prompt is empty.
    pub fn add(&mut self, seq: NewSequence) {
        assert!(!seq.prompt.is_empty(), "{} has an empty prompt", seq.seq_id);
        let hashes = block_hashes(&seq.prompt);
        let prev = self.seqs.insert(
            seq.seq_id,
            Sequence {
                prompt_len: seq.prompt.len(),
                tokens: seq.prompt,
                hashes,
                num_computed: 0,
                prefill_end: 0,
                prompt_fingerprint: seq.prompt_fingerprint,
                sampling: seq.sampling,
                priority: seq.priority,
                admitted_before: false,
            },
        );
        assert!(prev.is_none(), "{} added twice", seq.seq_id);
        self.waiting.push_back(seq.seq_id);
    }

    /// Removes a sequence wherever it is and frees its blocks. Returns whether it existed.
    pub fn abort(&mut self, seq_id: SeqId) -> bool {
        if self.seqs.remove(&seq_id).is_none() {
            return false;
        }
        if let Some(i) = self.running.iter().position(|&s| s == seq_id) {
            self.running.remove(i);
        } else if let Some(i) = self.waiting.iter().position(|&s| s == seq_id) {
            self.waiting.remove(i);
        }
        self.blocks.free(seq_id);
        true
    }

    /// Removes a finished sequence and frees its blocks (its registered blocks stay in the
    /// prefix cache). Returns whether it existed.
    pub fn finish(&mut self, seq_id: SeqId) -> bool {
        self.abort(seq_id)
    }

    /// A finished prefill's handoff: the registered full blocks of `seq`'s prompt, with the
    /// blocks that hold them (see [`BlockManager::registered_blocks`]). Call before
    /// [`finish`](Self::finish).
    pub fn prompt_blocks(&self, seq_id: SeqId) -> Vec<(crate::block::StoredBlock, BlockId)> {
        let Some(seq) = self.seqs.get(&seq_id) else {
            return Vec::new();
        };
        self.blocks
            .registered_blocks(seq_id, &seq.tokens, seq.prompt_len / BLOCK_SIZE)
    }

    /// Registers another engine's blocks in the prefix cache (see [`BlockManager::import`]).
    pub fn import_blocks(&mut self, blocks: &[crate::block::StoredBlock]) -> Vec<(usize, BlockId)> {
        self.blocks.import(blocks)
    }

    /// Whether nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Sequences running (holding KV blocks).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The prefix-cache changes since the last call (see [`BlockManager::take_events`]).
    pub fn take_kv_events(&mut self) -> Vec<crate::block::KvEvent> {
        self.blocks.take_events()
    }

    /// The block manager, for inspection.
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// Cumulative counters.
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// The tokens of a sequence so far (prompt, then output).
    pub fn tokens(&self, seq_id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq_id).map(|s| s.tokens.as_slice())
    }

    /// Decides the next step (see the module documentation). The plan is empty only when
    /// nothing can run.
    pub fn schedule(&mut self) -> Schedule {
        let mut budget = self.config.step_token_budget as usize;
        let mut planned = Vec::new();
        let mut preempted = Vec::new();
        let decode_ready = self
            .running
            .iter()
            .filter(|id| self.seqs[id].is_decode())
            .count();

        // (2) Decodes, oldest first; preempt the lowest priority (newest among equals) when out
        // of blocks.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            if !seq.is_decode() {
                i += 1;
                continue;
            }
            let needed_tokens = seq.tokens.len();
            let mut preempted_self = false;
            while self.blocks.ensure_capacity(id, needed_tokens).is_err() {
                let victim_at = self.victim();
                let victim = self.running[victim_at];
                self.preempt(victim);
                preempted.push(victim);
                if victim == id {
                    preempted_self = true;
                    break;
                }
                if victim_at < i {
                    // Already planned in this step: withdraw its decode.
                    planned.retain(|p: &ScheduledSeq| p.seq_id != victim);
                    budget += 1;
                    i -= 1;
                }
            }
            if preempted_self {
                // It was the last running sequence: the loop ends.
                continue;
            }
            planned.push(self.entry(id, StepKind::Decode, 1));
            budget -= 1;
            i += 1;
        }

        // Stall-free batching: with decodes in the step, prefill gets only a slice, so that a
        // long prompt never makes a step (and with it every running reply's next token) slow.
        if !planned.is_empty() {
            budget = budget.min(self.config.prefill_tokens_while_decoding as usize);
        }
        let capacity_tokens = planned.len() + budget;

        // (3) Prefills in progress, oldest first.
        for &id in &self.running {
            if budget == 0 {
                break;
            }
            let seq = &self.seqs[&id];
            if seq.is_decode() {
                continue;
            }
            let chunk = (seq.prefill_end - seq.num_computed).min(budget);
            planned.push(self.entry(id, StepKind::Prefill, chunk));
            budget -= chunk;
        }

        // (4) Admission, unless this step had to preempt.
        let mut admitted = Vec::new();
        let mut idx = 0;
        while preempted.is_empty()
            && idx < self.waiting.len()
            && self.running.len() < self.config.max_running as usize
            && budget > 0
        {
            let id = self.waiting[idx];
            let seq = &self.seqs[&id];
            let num_tokens = seq.tokens.len();
            let matched = self.blocks.match_prefix(&seq.hashes, num_tokens);
            if matched.blocked_by_pending {
                tracing::trace!(seq = %id, "scheduler.deferred");
                idx += 1;
                continue;
            }
            if !self.blocks.can_allocate(
                &seq.hashes,
                num_tokens,
                matched,
                ADMISSION_HEADROOM_BLOCKS,
            ) {
                break;
            }
            let cached = self
                .blocks
                .allocate(id, &seq.hashes, num_tokens, matched)
                .expect("can_allocate said yes");
            self.waiting.remove(idx);
            self.running.push(id);
            let seq = self.seqs.get_mut(&id).expect("waiting sequences exist");
            seq.num_computed = cached;
            seq.prefill_end = num_tokens;
            seq.hashes = Vec::new(); // the block manager keeps them now
            if !seq.admitted_before {
                seq.admitted_before = true;
                admitted.push(Admission {
                    seq_id: id,
                    cached_tokens: cached as u32,
                });
            }
            let chunk = (num_tokens - cached).min(budget);
            planned.push(self.entry(id, StepKind::Prefill, chunk));
            budget -= chunk;
        }

        let plan = StepPlan {
            step: self.stats.steps,
            seqs: planned,
        };
        if !plan.is_empty() {
            self.stats.steps += 1;
        }
        Schedule {
            plan,
            admitted,
            preempted,
            capacity_tokens,
            decode_ready,
        }
    }

    /// Applies a computed step: advances computed counts, registers newly full blocks in the
    /// prefix cache and appends sampled tokens. Returns the sampled tokens of sequences still
    /// present (a sequence aborted while the step ran is skipped).
    pub fn apply(&mut self, plan: &StepPlan, outcome: &StepOutcome) -> Vec<SampledToken> {
        let sampled: HashMap<SeqId, u32> = outcome
            .sampled
            .iter()
            .map(|s| (s.seq_id, s.token_id))
            .collect();
        let mut out = Vec::new();
        for entry in &plan.seqs {
            let Some(seq) = self.seqs.get_mut(&entry.seq_id) else {
                continue;
            };
            let token = if entry.sample {
                match sampled.get(&entry.seq_id) {
                    Some(&t) => Some(t),
                    None => {
                        // Leave the sequence as it was: it recomputes this part next step.
                        tracing::warn!(seq = %entry.seq_id, "scheduler.missing_sample");
                        continue;
                    }
                }
            } else {
                None
            };
            seq.num_computed = entry.num_computed_tokens as usize + entry.new_token_ids.len();
            self.blocks
                .commit_computed(entry.seq_id, &seq.tokens, seq.num_computed);
            if let Some(token_id) = token {
                seq.tokens.push(token_id);
                out.push(SampledToken {
                    seq_id: entry.seq_id,
                    token_id,
                });
            }
        }
        out
    }

    /// The index in `running` of the sequence to preempt: the lowest priority, the newest
    /// among equals.
    fn victim(&self) -> usize {
        let mut at = self.running.len() - 1;
        for (i, id) in self.running.iter().enumerate().rev() {
            if self.seqs[id].priority < self.seqs[&self.running[at]].priority {
                at = i;
            }
        }
        at
    }

    /// Frees a running sequence's blocks and puts it back at the front of the waiting queue.
    fn preempt(&mut self, id: SeqId) {
        let i = self
            .running
            .iter()
            .position(|&s| s == id)
            .expect("only running sequences are preempted");
        self.running.remove(i);
        self.blocks.free(id);
        let seq = self.seqs.get_mut(&id).expect("running sequences exist");
        seq.num_computed = 0;
        seq.prefill_end = 0;
        seq.hashes = block_hashes(&seq.tokens);
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
        tracing::debug!(seq = %id, tokens = seq.tokens.len(), "scheduler.preempted");
    }

    fn entry(&self, id: SeqId, kind: StepKind, n: usize) -> ScheduledSeq {
        let seq = &self.seqs[&id];
        let start = seq.num_computed;
        ScheduledSeq {
            seq_id: id,
            kind,
            block_table: self
                .blocks
                .block_table(id)
                .expect("running sequences hold blocks")
                .to_vec(),
            num_computed_tokens: start as u32,
            new_token_ids: seq.tokens[start..start + n].to_vec(),
            sample: start + n == seq.tokens.len(),
            prompt_len: seq.prompt_len as u32,
            prompt_fingerprint: seq.prompt_fingerprint,
            sampling: seq.sampling.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BLOCK_SIZE;
    use crate::cost::SimCostModel;
    use crate::executor::{Executor, SimExecutor};
    use crate::tokenizer::IM_END;

    /// A scheduler whose decoding steps may use the whole budget for prefill.
    fn config(kv_blocks: u32, max_running: u32, budget: u32) -> SchedulerConfig {
        SchedulerConfig {
            kv_blocks,
            max_running,
            step_token_budget: budget,
            prefill_tokens_while_decoding: budget,
        }
    }

    fn new_seq(id: u64, prompt: Vec<u32>) -> NewSequence {
        NewSequence {
            seq_id: SeqId(id),
            prompt_fingerprint: id,
            prompt,
            sampling: SamplingParams::default(),
            priority: 0,
        }
    }

    fn prompt(base: u32, n: usize) -> Vec<u32> {
        (base..base + n as u32).collect()
    }

    /// Runs until idle; a sequence finishes at end of turn or after `max_tokens`. Returns
    /// every sequence's output and every schedule.
    fn run(s: &mut Scheduler, max_tokens: usize) -> (HashMap<SeqId, Vec<u32>>, Vec<Schedule>) {
        let mut ex = SimExecutor::new(SimCostModel::default());
        let mut outputs: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let mut schedules = Vec::new();
        for _ in 0..100_000 {
            if s.is_idle() {
                return (outputs, schedules);
            }
            let sched = s.schedule();
            assert!(
                !sched.plan.is_empty(),
                "a non-idle scheduler always makes progress"
            );
            let out = ex.execute(&sched.plan);
            for t in s.apply(&sched.plan, &out) {
                let o = outputs.entry(t.seq_id).or_default();
                o.push(t.token_id);
                if t.token_id == IM_END || o.len() >= max_tokens {
                    s.finish(t.seq_id);
                }
            }
            s.blocks().assert_consistent();
            schedules.push(sched);
        }
        panic!("did not finish");
    }

    #[test]
    fn token_budget_is_respected_and_long_prompts_are_chunked() {
        let mut s = Scheduler::new(config(100, 4, 64));
        for id in 0..3 {
            s.add(new_seq(id, prompt(id as u32 * 1000, 100)));
        }
        let (outputs, schedules) = run(&mut s, 5);
        assert_eq!(outputs.len(), 3);
        assert!(schedules.iter().all(|x| x.plan.num_tokens() <= 64));
        // Seq 0's 100-token prompt: 64 tokens in step 0, 36 in step 1, which samples.
        let first = &schedules[0].plan.seqs[0];
        assert_eq!(
            (first.seq_id, first.new_token_ids.len(), first.sample),
            (SeqId(0), 64, false)
        );
        let second = &schedules[1].plan.seqs[0];
        assert_eq!(
            (second.num_computed_tokens, second.new_token_ids.len()),
            (64, 36)
        );
        assert!(second.sample);
        // Step 1 also starts seq 1 with the 28 tokens left in the budget.
        assert_eq!(schedules[1].plan.seqs[1].new_token_ids.len(), 28);
    }

    #[test]
    fn a_long_prefill_gets_only_a_slice_of_a_step_that_decodes() {
        let mut s = Scheduler::new(SchedulerConfig {
            prefill_tokens_while_decoding: 32,
            ..config(1000, 4, 512)
        });
        s.add(new_seq(0, prompt(0, 20)));
        // Seq 0 prefills alone (a whole budget's worth would fit), then decodes.
        let (outputs_before, _) = (s.schedule(), ());
        assert_eq!(outputs_before.plan.num_tokens(), 20);
        let mut ex = SimExecutor::new(SimCostModel::default());
        let out = ex.execute(&outputs_before.plan);
        s.apply(&outputs_before.plan, &out);
        // A 2,000-token prompt arrives while seq 0 decodes: 32 of it per step, not 511.
        s.add(new_seq(1, prompt(5000, 2000)));
        for _ in 0..5 {
            let step = s.schedule();
            let prefill: usize = step
                .plan
                .seqs
                .iter()
                .filter(|p| p.seq_id == SeqId(1))
                .map(|p| p.new_token_ids.len())
                .sum();
            assert!(step.plan.seqs.iter().any(|p| p.seq_id == SeqId(0)));
            assert_eq!(prefill, 32);
            // One decode plus the 32 prompt tokens allowed beside it: a full step.
            assert_eq!((step.capacity_tokens, step.decode_ready), (33, 1));
            let out = ex.execute(&step.plan);
            s.apply(&step.plan, &out);
        }
        // Once nothing decodes, prefill takes the whole budget again.
        s.finish(SeqId(0));
        let alone = s.schedule();
        assert_eq!(alone.plan.num_tokens(), 512);
        assert_eq!((alone.capacity_tokens, alone.decode_ready), (512, 0));
    }

    #[test]
    fn decodes_come_first_in_a_step() {
        let mut ex = SimExecutor::new(SimCostModel::default());
        let mut s = Scheduler::new(config(100, 4, 64));
        s.add(new_seq(0, prompt(0, 10)));
        let sched = s.schedule();
        s.apply(&sched.plan, &ex.execute(&sched.plan));
        s.add(new_seq(1, prompt(500, 200)));
        let sched = s.schedule();
        let kinds: Vec<_> = sched
            .plan
            .seqs
            .iter()
            .map(|x| (x.seq_id, x.kind, x.new_token_ids.len()))
            .collect();
        assert_eq!(
            kinds,
            [
                (SeqId(0), StepKind::Decode, 1),
                (SeqId(1), StepKind::Prefill, 63)
            ]
        );
    }

    #[test]
    fn admission_is_limited_by_kv_blocks() {
        // 60-token prompts need 4 blocks + 1 headroom; 10 blocks admit two of them.
        let mut s = Scheduler::new(config(10, 8, 1000));
        for id in 0..3 {
            s.add(new_seq(id, prompt(id as u32 * 1000, 60)));
        }
        let first = s.schedule();
        assert_eq!(first.admitted.len(), 2);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
        let mut ex = SimExecutor::new(SimCostModel::default());
        s.apply(&first.plan, &ex.execute(&first.plan));
        let (outputs, _) = run(&mut s, 8);
        assert_eq!(outputs.len(), 3, "the third request ran once room was made");
    }

    #[test]
    fn admission_is_limited_by_max_running() {
        let mut s = Scheduler::new(config(1000, 2, 1000));
        for id in 0..3 {
            s.add(new_seq(id, prompt(id as u32 * 1000, 20)));
        }
        s.schedule();
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
    }

    #[test]
    fn preemption_recomputes_and_loses_no_request() {
        // Roomy reference run.
        let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(i * 1000, 20)).collect();
        let mut roomy = Scheduler::new(config(1000, 8, 1000));
        for (i, p) in prompts.iter().enumerate() {
            roomy.add(new_seq(i as u64, p.clone()));
        }
        let (want, _) = run(&mut roomy, 60);
        assert_eq!(roomy.stats().preemptions, 0);

        // 8 blocks cannot hold four sequences growing to 80 tokens (5 blocks each).
        let mut tight = Scheduler::new(config(8, 8, 1000));
        for (i, p) in prompts.iter().enumerate() {
            tight.add(new_seq(i as u64, p.clone()));
        }
        let (got, schedules) = run(&mut tight, 60);
        assert!(tight.stats().preemptions > 0);
        assert_eq!(got, want, "every request finished with the same output");
        // Seqs 0-2 were admitted (3 blocks each with headroom); at 33 tokens each needs a
        // third block, seqs 0 and 1 take the last two, and seq 2, the newest, is preempted.
        let first = schedules.iter().find(|x| !x.preempted.is_empty()).unwrap();
        assert_eq!(first.preempted, [SeqId(2)]);
        assert_eq!(tight.blocks().used_blocks(), 0);
    }

    #[test]
    fn the_lowest_priority_is_preempted_first_even_when_already_planned() {
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i * 1000, 20)).collect();
        let mut roomy = Scheduler::new(config(1000, 8, 1000));
        for (i, p) in prompts.iter().enumerate() {
            roomy.add(new_seq(i as u64, p.clone()));
        }
        let (want, _) = run(&mut roomy, 60);
        // As above, but the oldest sequence has the lowest priority: when seq 2 needs a block,
        // seq 0 (already planned to decode in that step) is the one preempted.
        let mut tight = Scheduler::new(config(8, 8, 1000));
        for (i, p) in prompts.iter().enumerate() {
            let mut seq = new_seq(i as u64, p.clone());
            seq.priority = if i == 0 { 0 } else { 5 };
            tight.add(seq);
        }
        let (got, schedules) = run(&mut tight, 60);
        let first = schedules.iter().find(|x| !x.preempted.is_empty()).unwrap();
        assert_eq!(first.preempted, [SeqId(0)]);
        assert!(
            first.plan.seqs.iter().all(|p| p.seq_id != SeqId(0)),
            "the withdrawn decode is not in the plan"
        );
        assert_eq!(got, want, "every request finished with the same output");
        assert_eq!(tight.blocks().used_blocks(), 0);
    }

    #[test]
    fn in_flight_prefixes_are_computed_once() {
        let system = prompt(0, 10 * BLOCK_SIZE);
        let mut s = Scheduler::new(config(1000, 64, 8192));
        for id in 0..5u64 {
            let mut p = system.clone();
            p.extend(prompt(10_000 + id as u32 * 100, 5));
            s.add(new_seq(id, p));
        }
        let mut ex = SimExecutor::new(SimCostModel::default());
        let first = s.schedule();
        assert_eq!(
            first.admitted.len(),
            1,
            "the others wait for the shared prefix"
        );
        assert_eq!(first.plan.num_prefill_tokens(), 165);
        s.apply(&first.plan, &ex.execute(&first.plan));
        let second = s.schedule();
        assert_eq!(second.admitted.len(), 4);
        assert!(second.admitted.iter().all(|a| a.cached_tokens == 160));
        assert_eq!(second.plan.num_prefill_tokens(), 4 * 5);
    }

    #[test]
    fn a_deferred_request_does_not_block_later_ones() {
        let mut s = Scheduler::new(config(1000, 64, 8192));
        s.add(new_seq(0, prompt(0, 40)));
        s.add(new_seq(1, prompt(0, 45))); // shares seq 0's first two blocks
        s.add(new_seq(2, prompt(5000, 40)));
        let first = s.schedule();
        let ids: Vec<_> = first.admitted.iter().map(|a| a.seq_id).collect();
        assert_eq!(ids, [SeqId(0), SeqId(2)]);
        assert_eq!(s.num_waiting(), 1);
    }

    #[test]
    fn abort_frees_blocks_at_once() {
        let mut s = Scheduler::new(config(100, 8, 1000));
        s.add(new_seq(0, prompt(0, 100)));
        s.add(new_seq(1, prompt(1000, 100)));
        let sched = s.schedule();
        assert_eq!(s.blocks().used_blocks(), 14);
        assert!(s.abort(SeqId(0)));
        assert_eq!(s.blocks().used_blocks(), 7);
        // The step that was in flight applies to the survivor only.
        let out = SimExecutor::new(SimCostModel::default()).execute(&sched.plan);
        let sampled = s.apply(&sched.plan, &out);
        assert_eq!(sampled.len(), 1);
        assert!(s.abort(SeqId(1)));
        assert!(!s.abort(SeqId(1)));
        assert!(s.is_idle());
        assert_eq!(s.blocks().used_blocks(), 0);
        s.blocks().assert_consistent();
    }

    #[test]
    fn a_finished_reply_is_hit_by_the_next_turn() {
        let mut s = Scheduler::new(config(100, 8, 1000));
        s.add(new_seq(0, prompt(0, 30)));
        let (outputs, _) = run(&mut s, 40);
        let mut next = prompt(0, 30);
        next.extend(&outputs[&SeqId(0)]);
        next.extend(prompt(7000, 10));
        s.add(new_seq(1, next.clone()));
        let sched = s.schedule();
        // Every full block whose KV was computed: prompt + output minus the last sampled token.
        let computed = 30 + outputs[&SeqId(0)].len() - 1;
        let want =
            (computed / BLOCK_SIZE * BLOCK_SIZE).min((next.len() - 1) / BLOCK_SIZE * BLOCK_SIZE);
        assert_eq!(sched.admitted[0].cached_tokens as usize, want);
        assert!(want >= 32, "the reply's blocks are hit too");
    }
}
