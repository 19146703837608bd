//! {{name}}: a Ringmaster admission policy. It refuses prompts over a size limit and requests
//! when the gateway's queue is full, queues while every server is busy, and runs the rest with
//! their tier's priority. Edit `admit`; `cargo test` runs its tests natively, and
//! `ringmaster policy build` makes the component.

use ringmaster_policy_sdk::admission::{Guest, Load, Rejection, Verdict};
use ringmaster_policy_sdk::types::Request;

/// Prompts longer than this are refused.
pub const MAX_PROMPT_TOKENS: u32 = 100_000;
/// In-flight requests per healthy server before requests queue.
pub const MAX_IN_FLIGHT_PER_SERVER: u32 = 64;

/// The verdict for a request of `prompt_tokens` from `tier` under `current`.
pub fn admit(tier: &str, prompt_tokens: u32, current: &Load) -> Verdict {
    let reject = |reason: String| {
        Verdict::Reject(Rejection {
            reason,
            retry_after_ms: 1_000,
        })
    };
    if prompt_tokens > MAX_PROMPT_TOKENS {
        return reject(format!(
            "a prompt of {prompt_tokens} tokens is over the {MAX_PROMPT_TOKENS} this gateway admits"
        ));
    }
    if current.queued >= current.queue_capacity {
        return reject("the gateway's queue is full".to_owned());
    }
    let capacity = u64::from(current.servers) * u64::from(MAX_IN_FLIGHT_PER_SERVER);
    if u64::from(current.in_flight) >= capacity {
        return Verdict::Queue;
    }
    Verdict::Accept(match tier {
        "premium" => 3,
        "standard" => 1,
        _ => 0,
    })
}

/// The component's export.
#[derive(Debug)]
pub struct Policy;

impl Guest for Policy {
    fn admit(req: &Request, current: Load) -> Verdict {
        admit(&req.tier(), req.prompt_tokens(), &current)
    }
}

ringmaster_policy_sdk::admission::export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    fn load(in_flight: u32, queued: u32) -> Load {
        Load {
            in_flight,
            queued,
            queue_capacity: 256,
            servers: 4,
        }
    }

    #[test]
    fn runs_with_the_tiers_priority() {
        assert_eq!(admit("premium", 100, &load(0, 0)), Verdict::Accept(3));
        assert_eq!(admit("anonymous", 100, &load(0, 0)), Verdict::Accept(0));
    }

    #[test]
    fn queues_while_busy_and_refuses_when_full_or_too_long() {
        assert_eq!(admit("standard", 100, &load(256, 0)), Verdict::Queue);
        assert!(matches!(
            admit("standard", 100, &load(0, 256)),
            Verdict::Reject(_)
        ));
        match admit("standard", 200_000, &load(0, 0)) {
            Verdict::Reject(r) => assert!(r.reason.contains("200000 tokens"), "{}", r.reason),
            other => panic!("{other:?}"),
        }
    }
}
