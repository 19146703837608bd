//! The autoscaling signal: the fleet's work in tokens over its capacity in tokens, and what an
//! autoscaler should do about it.
//!
//! Work is what waits in the gateway's admission queue (each waiter's estimated prompt plus
//! `max_tokens`), plus what each server holds: its KV blocks in use (×16 tokens) and the prompt
//! tokens routed to it but not yet prefilled. A server that reports no KV cache (a plain
//! OpenAI-compatible server) counts `[autoscale] tokens_per_request` per request in flight, and
//! `[autoscale] server_capacity_tokens` of capacity. Above `scale_up` (0.7) the recommendation
//! is to scale up, below `scale_down` (0.2) to scale down, to the server count that would bring
//! the signal to the middle of the two. Pure arithmetic; the gateway feeds it.

use serde::Serialize;

/// Tokens per KV block.
const BLOCK_TOKENS: u64 = ringmaster_gpu_runtime::block::BLOCK_SIZE as u64;

pub use ringmaster_config::AutoscaleSettings;

/// What one server contributes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerWork {
    /// KV blocks in its pool (0: not reported).
    pub kv_blocks_total: u64,
    /// KV blocks in use.
    pub kv_blocks_used: u64,
    /// Prompt tokens routed to it and not yet prefilled.
    pub prefill_backlog: u64,
    /// Requests in flight on it.
    pub in_flight: u64,
}

/// The signal and the recommendation (`GET /admin/autoscale`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoscaleReport {
    /// Work over capacity.
    pub utilisation: f64,
    /// Estimated tokens waiting in the gateway's queue.
    pub queued_tokens: u64,
    /// Tokens of work the servers hold.
    pub server_tokens: u64,
    /// The fleet's capacity in tokens.
    pub capacity_tokens: u64,
    /// Servers counted.
    pub servers: usize,
    /// `scale_up`, `scale_down` or `hold`.
    pub recommendation: &'static str,
    /// Servers that would bring the utilisation to the middle of the thresholds.
    pub recommended_servers: usize,
    /// The thresholds.
    pub scale_up_threshold: f64,
    /// The thresholds.
    pub scale_down_threshold: f64,
}

/// [`assess`] over `snapshot`'s active servers (a draining one is on its way out).
pub fn assess_pool(
    settings: &AutoscaleSettings,
    queued_tokens: u64,
    snapshot: &crate::PoolSnapshot,
) -> AutoscaleReport {
    let servers: Vec<ServerWork> = snapshot
        .servers
        .iter()
        .filter(|s| !s.is_draining())
        .map(|s| {
            let load = s.engine().load();
            ServerWork {
                kv_blocks_total: u64::from(load.kv_blocks_total),
                kv_blocks_used: u64::from(load.kv_blocks_used),
                prefill_backlog: s.prefill_backlog(),
                in_flight: s.in_flight(),
            }
        })
        .collect();
    assess(settings, queued_tokens, &servers)
}

/// The report for `queued_tokens` waiting and `servers` as they are.
pub fn assess(
    settings: &AutoscaleSettings,
    queued_tokens: u64,
    servers: &[ServerWork],
) -> AutoscaleReport {
    let mut capacity = 0u64;
    let mut held = 0u64;
    for server in servers {
        if server.kv_blocks_total > 0 {
            capacity += server.kv_blocks_total * BLOCK_TOKENS;
            held += server.kv_blocks_used * BLOCK_TOKENS;
        } else {
            capacity += settings.server_capacity_tokens;
            held += server.in_flight * settings.tokens_per_request;
        }
        held += server.prefill_backlog;
    }
    let work = held + queued_tokens;
    let utilisation = if capacity == 0 {
        if work > 0 { f64::INFINITY } else { 0.0 }
    } else {
        work as f64 / capacity as f64
    };
    let per_server = if servers.is_empty() {
        settings.server_capacity_tokens as f64
    } else {
        capacity as f64 / servers.len() as f64
    };
    let target = (settings.scale_up + settings.scale_down) / 2.0;
    let needed = ((work as f64 / (per_server * target)).ceil() as usize).max(1);
    let (recommendation, recommended_servers) = if utilisation > settings.scale_up {
        ("scale_up", needed.max(servers.len() + 1))
    } else if utilisation < settings.scale_down && servers.len() > 1 {
        ("scale_down", needed.min(servers.len() - 1))
    } else {
        ("hold", servers.len())
    };
    AutoscaleReport {
        utilisation: if utilisation.is_finite() {
            utilisation
        } else {
            f64::MAX
        },
        queued_tokens,
        server_tokens: held,
        capacity_tokens: capacity,
        servers: servers.len(),
        recommendation,
        recommended_servers,
        scale_up_threshold: settings.scale_up,
        scale_down_threshold: settings.scale_down,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(total: u64, used: u64) -> ServerWork {
        ServerWork {
            kv_blocks_total: total,
            kv_blocks_used: used,
            ..ServerWork::default()
        }
    }

    #[test]
    fn thresholds_decide_and_the_count_aims_at_the_middle() {
        let settings = AutoscaleSettings::default();
        // Two servers of 1000 blocks (16,000 tokens each), half full: hold.
        let report = assess(&settings, 0, &[server(1000, 500), server(1000, 500)]);
        assert_eq!(report.recommendation, "hold");
        assert!((report.utilisation - 0.5).abs() < 1e-9);
        // Plus 16,000 queued tokens: 32,000 / 32,000 = 1.0 > 0.7, up to 32,000 / (16,000 × 0.45)
        // = 4.4, so 5 servers.
        let report = assess(&settings, 16_000, &[server(1000, 500), server(1000, 500)]);
        assert_eq!(report.recommendation, "scale_up");
        assert_eq!(report.recommended_servers, 5);
        // Nearly idle: down to one server, never to none.
        let report = assess(
            &settings,
            0,
            &[server(1000, 10), server(1000, 10), server(1000, 0)],
        );
        assert_eq!(report.recommendation, "scale_down");
        assert_eq!(report.recommended_servers, 1);
        let report = assess(&settings, 0, &[server(1000, 0)]);
        assert_eq!(report.recommendation, "hold");
    }

    #[test]
    fn servers_without_a_kv_report_count_by_requests() {
        let settings = AutoscaleSettings::default();
        let plain = ServerWork {
            in_flight: 30,
            prefill_backlog: 2_000,
            ..ServerWork::default()
        };
        let report = assess(&settings, 0, &[plain]);
        assert_eq!(report.capacity_tokens, 32_768);
        assert_eq!(report.server_tokens, 30 * 1024 + 2_000);
        assert_eq!(report.recommendation, "scale_up");
        // No servers, work waiting: scale up from nothing.
        let report = assess(&settings, 100, &[]);
        assert_eq!(report.recommendation, "scale_up");
        assert_eq!(report.recommended_servers, 1);
    }
}
