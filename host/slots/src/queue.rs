//! The admission queue's order: who runs next when a server frees up.
//!
//! Waiters are ordered by their tier's queue priority, raised one level for every `aging`
//! interval waited (so nothing starves); within a level, by their tenant's virtual token
//! counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024: each tenant's
//! counter grows by the tokens it is served, input weighted 1 and output 2, and a tenant that
//! starts waiting is lifted to the least counter of those already waiting, so idle time earns
//! no credit); then by arrival. Only the head of the queue listens for a freed server slot;
//! the others sleep on their own wake-up, which the head pulls when it leaves the queue (by
//! running, being refused, timing out or being dropped), so a freed slot wakes one waiter,
//! not all of them.
//!
//! This module holds only the order and the counters; asking the admission policy and waiting
//! are the gateway's admission gate's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The weight of an input (prompt) token in the virtual token counter.
pub const INPUT_WEIGHT: f64 = 1.0;
/// The weight of an output (generated) token: decoding costs about twice as much per token.
pub const OUTPUT_WEIGHT: f64 = 2.0;
pub use ringmaster_config::policies::DEFAULT_QUEUE_AGING as DEFAULT_AGING;

/// One waiter in the queue.
#[derive(Debug)]
struct Waiter {
    id: u64,
    priority: u32,
    tenant: Arc<str>,
    arrived: Instant,
    /// Estimated tokens (prompt plus `max_tokens`): the autoscaling signal's queued work.
    tokens: u64,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct State {
    waiters: Vec<Waiter>,
    /// Virtual token counters by tenant.
    counters: HashMap<Arc<str>, f64>,
    next_id: u64,
    queued_tokens: u64,
}

/// The queue: its waiters, in no stored order (the head is found when asked: the aging moves
/// it with time), and the tenants' counters.
#[derive(Debug)]
pub struct FairQueue {
    state: Mutex<State>,
    aging: Duration,
    priorities: HashMap<String, u8>,
}

/// A waiter's place: its id and its own wake-up.
#[derive(Debug)]
pub struct Place {
    /// The waiter's id.
    pub id: u64,
    /// Pulled when the waiter becomes the head (or should look again).
    pub wake: Arc<Notify>,
}

impl FairQueue {
    /// An empty queue: `priorities` maps tiers to queue priority (others get 0).
    pub fn new(aging: Duration, priorities: HashMap<String, u8>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            aging: aging.max(Duration::from_millis(1)),
            priorities,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue priority of `tier`.
    pub fn tier_priority(&self, tier: &str) -> u32 {
        u32::from(self.priorities.get(tier).copied().unwrap_or(0))
    }

    /// Adds a waiter; the tenant's counter is lifted if it was not waiting already.
    pub fn join(&self, tier: &str, tenant: &str, tokens: u64) -> Place {
        let priority = self.tier_priority(tier);
        let mut state = self.lock();
        let tenant: Arc<str> = match state.counters.get_key_value(tenant) {
            Some((name, _)) => name.clone(),
            None => Arc::from(tenant),
        };
        let backlogged = state.waiters.iter().any(|w| w.tenant == tenant);
        if !backlogged {
            let least_waiting = state
                .waiters
                .iter()
                .filter_map(|w| state.counters.get(&w.tenant).copied())
                .reduce(f64::min);
            let counter = state.counters.entry(tenant.clone()).or_insert(0.0);
            if let Some(least) = least_waiting {
                *counter = counter.max(least);
            }
        }
        state.next_id += 1;
        let id = state.next_id;
        let wake = Arc::new(Notify::new());
        state.queued_tokens += tokens;
        state.waiters.push(Waiter {
            id,
            priority,
            tenant,
            arrived: Instant::now(),
            tokens,
            wake: wake.clone(),
        });
        Place { id, wake }
    }

    /// Takes the waiter out (it runs, was refused, timed out or went away) and wakes the new
    /// head, if the head changed.
    pub fn leave(&self, id: u64) {
        let mut state = self.lock();
        let was_head = head(&state, self.aging, Instant::now()) == Some(id);
        if let Some(i) = state.waiters.iter().position(|w| w.id == id) {
            let waiter = state.waiters.swap_remove(i);
            state.queued_tokens -= waiter.tokens;
        }
        if was_head {
            Self::wake_head(&state, self.aging);
        }
    }

    /// Whether `id` is the one to run next.
    pub fn is_head(&self, id: u64) -> bool {
        head(&self.lock(), self.aging, Instant::now()) == Some(id)
    }

    /// Wakes whoever is the head now (after an arrival that may have overtaken it, or a
    /// freed slot the head did not take).
    pub fn wake_head_now(&self) {
        Self::wake_head(&self.lock(), self.aging);
    }

    fn wake_head(state: &State, aging: Duration) {
        if let Some(id) = head(state, aging, Instant::now())
            && let Some(waiter) = state.waiters.iter().find(|w| w.id == id)
        {
            waiter.wake.notify_one();
        }
    }

    /// Counts `tokens` served to `tenant` at `weight` (a request's input once it runs, its
    /// output as it streams).
    pub fn served(&self, tenant: &str, tokens: u32, weight: f64) {
        let mut state = self.lock();
        let amount = f64::from(tokens) * weight;
        match state.counters.get_mut(tenant) {
            Some(counter) => *counter += amount,
            None => {
                state.counters.insert(Arc::from(tenant), amount);
            }
        }
    }

    /// A tenant's virtual token counter.
    pub fn counter(&self, tenant: &str) -> f64 {
        self.lock().counters.get(tenant).copied().unwrap_or(0.0)
    }

    /// Waiters now.
    pub fn len(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Estimated tokens of everything waiting (prompt plus `max_tokens` of each).
    pub fn queued_tokens(&self) -> u64 {
        self.lock().queued_tokens
    }
}

/// The waiter to run next: the highest aged priority, then the least counter, then the
/// earliest arrival.
fn head(state: &State, aging: Duration, now: Instant) -> Option<u64> {
    let aged = |w: &Waiter| {
        let levels = now.saturating_duration_since(w.arrived).as_nanos() / aging.as_nanos();
        u64::from(w.priority) + u64::try_from(levels).unwrap_or(u64::MAX)
    };
    state
        .waiters
        .iter()
        .min_by(|a, b| {
            aged(b)
                .cmp(&aged(a))
                .then_with(|| {
                    let counter =
                        |w: &Waiter| state.counters.get(&w.tenant).copied().unwrap_or(0.0);
                    counter(a).total_cmp(&counter(b))
                })
                .then_with(|| a.arrived.cmp(&b.arrived))
                .then_with(|| a.id.cmp(&b.id))
        })
        .map(|w| w.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> FairQueue {
        FairQueue::new(
            Duration::from_secs(3600),
            HashMap::from([("gold".to_owned(), 2), ("silver".to_owned(), 1)]),
        )
    }

    #[test]
    fn higher_tiers_run_first_and_arrival_breaks_ties() {
        let q = queue();
        let free = q.join("free", "a", 10);
        let gold = q.join("gold", "b", 10);
        let free2 = q.join("free", "c", 10);
        assert!(q.is_head(gold.id));
        assert_eq!(q.queued_tokens(), 30);
        q.leave(gold.id);
        assert!(q.is_head(free.id));
        q.leave(free.id);
        assert!(q.is_head(free2.id));
        q.leave(free2.id);
        assert!(q.is_empty());
        assert_eq!(q.queued_tokens(), 0);
    }

    #[test]
    fn within_a_tier_the_tenant_served_least_goes_first() {
        let q = queue();
        q.served("heavy", 10_000, INPUT_WEIGHT);
        let heavy = q.join("free", "heavy", 1);
        let light = q.join("free", "light", 1);
        // The light tenant starts waiting after the heavy one: lifted to the heavy one's
        // counter, no lower (idle time earns no credit)...
        assert_eq!(q.counter("light"), 10_000.0);
        // ...so arrival decides, until the heavy one is served more.
        assert!(q.is_head(heavy.id));
        q.served("heavy", 5, OUTPUT_WEIGHT);
        assert!(q.is_head(light.id));
    }

    #[test]
    fn aging_lifts_a_long_waiter_over_a_higher_tier() {
        let q = FairQueue::new(
            Duration::from_millis(20),
            HashMap::from([("gold".to_owned(), 1)]),
        );
        let old = q.join("free", "a", 1);
        std::thread::sleep(Duration::from_millis(45));
        let gold = q.join("gold", "b", 1);
        // Two levels of aging beat one of tier.
        assert!(q.is_head(old.id));
        q.leave(old.id);
        assert!(q.is_head(gold.id));
    }

    #[tokio::test]
    async fn leaving_wakes_only_the_new_head() {
        let q = queue();
        let first = q.join("gold", "a", 1);
        let second = q.join("silver", "b", 1);
        let third = q.join("free", "c", 1);
        q.leave(first.id);
        tokio::time::timeout(Duration::from_millis(100), second.wake.notified())
            .await
            .expect("the new head is woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), third.wake.notified())
                .await
                .is_err(),
            "a waiter behind the head is not woken"
        );
        // A waiter that is not the head leaving wakes nobody.
        q.leave(third.id);
        assert!(q.is_head(second.id));
    }
}
