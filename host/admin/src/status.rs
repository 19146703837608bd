//! The status page's data: `GET /admin/status`, one document with everything the page shows
//! (servers with their ring share and KV cache, the policy slots and their versions, the
//! experiment with each variant's TTFT distribution, the autoscaling signal, the replicas, the
//! last errors), and `GET /admin/events`, the same document as server-sent events, sent when
//! it changes (looked at once a second; a comment every 15 s keeps idle proxies from closing
//! it).
//!
//! It reads through the other admin handlers' own builders and changes nothing.

use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use ringmaster_api::ApiError;
use ringmaster_gateway::respond::json_response;
use ringmaster_gateway::{Gateway, ResponseBody};
use serde_json::{Value, json};

/// How often the event stream looks for a change.
const TICK: Duration = Duration::from_secs(1);
/// A comment after this long without an event.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The upper edges of the TTFT distribution's buckets, seconds (the last is open).
const TTFT_EDGES: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.5, 2.5, 4.0, 8.0, 15.0,
];

/// `GET /admin/status`.
pub(crate) async fn status(gateway: &Arc<Gateway>) -> Result<Response<ResponseBody>, ApiError> {
    Ok(json_response(StatusCode::OK, &document(gateway).await))
}

/// Everything the page shows, as of now.
pub(crate) async fn document(gateway: &Arc<Gateway>) -> Value {
    let others = crate::cluster::others_figures(gateway).await;
    let mut servers = crate::servers::servers_json(gateway);
    let snapshot = gateway.pool().snapshot();
    let shares = snapshot.ring.key_shares();
    if let Some(list) = servers["servers"].as_array_mut() {
        for entry in list {
            let share = snapshot
                .servers
                .iter()
                .position(|s| entry["id"].as_str() == Some(s.id()))
                .and_then(|i| shares.get(i).copied());
            entry["ring_share"] = json!(share);
            entry["kv_cache"] = kv_cache(&entry["engine"]);
        }
    }
    let mut experiments = crate::experiments::experiments_json(gateway, &others);
    let set = gateway.router().current();
    if let Some(list) = experiments["variants"].as_array_mut() {
        for (entry, variant) in list.iter_mut().zip(set.variants.iter()) {
            let mut samples = variant.stats.ttft_samples();
            if let Some(other) = others.get(&*variant.name) {
                samples.extend_from_slice(&other.ttft);
            }
            entry["ttft_histogram"] = histogram(&samples);
        }
    }
    let cluster = crate::cluster::cluster_value(gateway)
        .await
        .unwrap_or_else(|e| json!({ "cluster": null, "replicas": [], "error": e.message() }));
    json!({
        "gateway": {
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": gateway.uptime().as_secs(),
            "models": gateway.pool().snapshot().accepted,
        },
        "servers": servers,
        "policies": crate::policies::policies_json(gateway),
        "experiments": experiments,
        "autoscale": gateway.autoscale(),
        "cluster": cluster,
        "errors": gateway.recent_errors().newest_first(),
    })
}

/// A server's KV cache as the page shows it: the blocks live sequences use, the blocks that
/// hold a reusable prefix and nothing else (what the hit ratio beside it comes from), the free
/// ones, of all; `null` for a server that reports no blocks. An idle server uses none, so
/// "used / total" alone read "0 / 26226" beside a 94 % hit ratio.
fn kv_cache(engine: &Value) -> Value {
    let count = |field: &str| engine[field].as_u64().unwrap_or(0);
    let (used, cached, total) = (
        count("kv_blocks_used"),
        count("kv_blocks_cached"),
        count("kv_blocks_total"),
    );
    if total == 0 {
        return Value::Null;
    }
    json!({
        "used": used,
        "cached": cached,
        "free": total.saturating_sub(used + cached),
        "total": total,
        "summary": format!(
            "{} used, {} cached / {} blocks",
            thousands(used),
            thousands(cached),
            thousands(total)
        ),
    })
}

/// `n` with a comma between each three digits (`26,226`).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `samples` (seconds) counted into [`TTFT_EDGES`]'s buckets.
fn histogram(samples: &[f64]) -> Value {
    let mut counts = vec![0u64; TTFT_EDGES.len() + 1];
    for &s in samples {
        let bucket = TTFT_EDGES.partition_point(|&edge| edge < s);
        counts[bucket] += 1;
    }
    json!({ "le": TTFT_EDGES, "counts": counts, "samples": samples.len() })
}

/// `GET /admin/events`: the status document each time it changes, as `event: status`.
pub(crate) fn events(gateway: &Arc<Gateway>) -> Response<ResponseBody> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    tokio::spawn(feed(Arc::downgrade(gateway), tx));
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Sends the document when it differs from the last one sent, until the page goes away (the
/// body is dropped) or the gateway stops.
async fn feed(gateway: Weak<Gateway>, tx: tokio::sync::mpsc::Sender<Bytes>) {
    let mut last = String::new();
    let mut quiet = Duration::ZERO;
    loop {
        let Some(strong) = gateway.upgrade() else {
            return;
        };
        let stopping = strong.stopping().clone();
        let text = document(&strong).await.to_string();
        drop(strong);
        let message = if text != last {
            quiet = Duration::ZERO;
            let message = format!("event: status\ndata: {text}\n\n");
            last = text;
            Some(message)
        } else if quiet >= KEEPALIVE {
            quiet = Duration::ZERO;
            Some(": still here\n\n".to_owned())
        } else {
            None
        };
        if let Some(message) = message
            && tx.send(Bytes::from(message)).await.is_err()
        {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(TICK) => quiet += TICK,
            () = stopping.cancelled() => return,
            () = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_servers_kv_cache_shows_its_cached_blocks_beside_the_used_ones() {
        // An idle simulated server after a Claude Code session: nothing running, 21,000
        // blocks of prefixes kept, a 94 % hit ratio.
        let engine = json!({"kv_blocks_used": 0, "kv_blocks_cached": 21_000,
            "kv_blocks_total": 26_226, "prefix_cache_hit_ratio": 0.94});
        let kv = kv_cache(&engine);
        assert_eq!(kv["summary"], "0 used, 21,000 cached / 26,226 blocks");
        assert_eq!(kv["free"], 5_226);
        let busy = kv_cache(&json!({"kv_blocks_used": 1_234_567, "kv_blocks_cached": 7,
            "kv_blocks_total": 2_000_000}));
        assert_eq!(
            busy["summary"],
            "1,234,567 used, 7 cached / 2,000,000 blocks"
        );
        assert_eq!(kv_cache(&json!({"kv_blocks_total": 0})), Value::Null);
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
    }

    #[test]
    fn ttft_samples_fall_in_their_buckets() {
        let h = histogram(&[0.001, 0.005, 0.006, 0.2, 100.0]);
        let counts = h["counts"].as_array().unwrap();
        assert_eq!(counts.len(), TTFT_EDGES.len() + 1);
        assert_eq!(counts[0], 2, "at or under 5 ms");
        assert_eq!(counts[1], 1);
        assert_eq!(counts[7], 1, "0.15 < 0.2 <= 0.25");
        assert_eq!(counts[TTFT_EDGES.len()], 1, "past the last edge");
        assert_eq!(h["samples"], 5);
    }
}
