//! An OpenAI-compatible server's own load, read from its Prometheus `/metrics`: requests
//! running and queued, KV-cache usage and capacity, and its token counters, for vLLM, SGLang,
//! TGI and llama.cpp's server (each documented in the README's compatibility table). Parsing
//! is `openmetrics-parser`'s; this module only knows which family means what.
//!
//! Series are summed across their labels (a data-parallel engine reports one series per
//! rank). A scrape with none of the known families is `None`: the server keeps the view the
//! gateway had before (its own in-flight counts).

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricsExposition, PrometheusType, PrometheusValue};
use ringmaster_gpu_runtime::{BLOCK_SIZE, LoadReport};

type Exposition = MetricsExposition<PrometheusType, PrometheusValue>;

/// The engine that answered, told by its families' prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// `vllm:*`.
    Vllm,
    /// `sglang:*`.
    Sglang,
    /// `tgi_*`.
    Tgi,
    /// `llamacpp:*`.
    LlamaCpp,
}

/// KV blocks reported when the engine gives a usage ratio but not its block count: the ratio
/// in thousandths.
pub const KV_RATIO_SCALE: u32 = 1000;

/// Reads one scrape into the load policies see; `None` if it holds nothing known.
pub fn read_metrics(text: &str) -> Option<(EngineKind, LoadReport)> {
    let exposition = parse_prometheus(text).ok()?;
    let sum = |names: &[&str]| -> Option<f64> {
        names.iter().find_map(|name| family_sum(&exposition, name))
    };
    let kind = if sum(&["vllm:num_requests_running"]).is_some() {
        EngineKind::Vllm
    } else if sum(&["sglang:num_running_reqs"]).is_some() {
        EngineKind::Sglang
    } else if sum(&["tgi_queue_size", "tgi_batch_current_size"]).is_some() {
        EngineKind::Tgi
    } else if sum(&["llamacpp:requests_processing"]).is_some() {
        EngineKind::LlamaCpp
    } else {
        return None;
    };
    let (running, waiting, usage, capacity_blocks, prompt, cached, generated) = match kind {
        EngineKind::Vllm => (
            sum(&["vllm:num_requests_running"]),
            sum(&["vllm:num_requests_waiting"]),
            sum(&["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]),
            label_number(&exposition, "vllm:cache_config_info", "num_gpu_blocks"),
            sum(&["vllm:prompt_tokens_total", "vllm:prompt_tokens"]),
            sum(&["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"]),
            sum(&["vllm:generation_tokens_total", "vllm:generation_tokens"]),
        ),
        EngineKind::Sglang => (
            sum(&["sglang:num_running_reqs"]),
            sum(&["sglang:num_queue_reqs"]),
            sum(&["sglang:token_usage"]),
            sum(&["sglang:max_total_num_tokens"]).map(|t| t / BLOCK_SIZE as f64),
            sum(&["sglang:prompt_tokens_total", "sglang:prompt_tokens"]),
            sum(&["sglang:cached_tokens_total", "sglang:cached_tokens"]),
            sum(&["sglang:generation_tokens_total", "sglang:generation_tokens"]),
        ),
        EngineKind::Tgi => (
            sum(&["tgi_batch_current_size"]),
            sum(&["tgi_queue_size"]),
            None,
            None,
            None,
            None,
            None,
        ),
        EngineKind::LlamaCpp => (
            sum(&["llamacpp:requests_processing"]),
            sum(&["llamacpp:requests_deferred"]),
            sum(&["llamacpp:kv_cache_usage_ratio"]),
            None,
            sum(&["llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens"]),
            None,
            sum(&[
                "llamacpp:tokens_predicted_total",
                "llamacpp:tokens_predicted",
            ]),
        ),
    };
    let count = |v: Option<f64>| v.map_or(0, |v| v.clamp(0.0, f64::from(u32::MAX)) as u32);
    let total = |v: Option<f64>| v.map_or(0, |v| v.max(0.0) as u64);
    let mut load = LoadReport {
        running: count(running),
        waiting: count(waiting),
        prompt_tokens_total: total(prompt),
        cached_prompt_tokens_total: total(cached),
        generated_tokens_total: total(generated),
        ..LoadReport::default()
    };
    if let Some(usage) = usage.filter(|u| u.is_finite()) {
        let blocks = capacity_blocks
            .filter(|b| *b >= 1.0)
            .map_or(KV_RATIO_SCALE, |b| b.min(f64::from(u32::MAX)) as u32);
        load.kv_blocks_total = blocks;
        load.kv_blocks_used = (usage.clamp(0.0, 1.0) * f64::from(blocks)).round() as u32;
    }
    Some((kind, load))
}

/// A family's samples summed; `None` if absent or not a plain number.
fn family_sum(exposition: &Exposition, name: &str) -> Option<f64> {
    let family = exposition.families.get(name)?;
    let mut sum = None;
    for sample in family.iter_samples() {
        let value = match &sample.value {
            PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
            PrometheusValue::Counter(c) => c.value.as_f64(),
            PrometheusValue::Histogram(_) | PrometheusValue::Summary(_) => continue,
        };
        *sum.get_or_insert(0.0) += value;
    }
    sum
}

/// A number carried in a label of a family's first sample (vLLM's `cache_config_info`).
fn label_number(exposition: &Exposition, family: &str, label: &str) -> Option<f64> {
    let family = exposition.families.get(family)?;
    family
        .iter_samples()
        .find_map(|s| s.get_labelset().ok()?.get_label_value(label)?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="40000"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 12345.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 2345.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 999.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
"#;

    #[test]
    fn vllm_families_are_summed_over_ranks_and_usage_scaled_to_its_blocks() {
        let (kind, load) = read_metrics(VLLM).unwrap();
        assert_eq!(kind, EngineKind::Vllm);
        assert_eq!((load.running, load.waiting), (5, 7));
        assert_eq!(
            (load.kv_blocks_used, load.kv_blocks_total),
            (10_000, 40_000)
        );
        assert_eq!(load.prompt_tokens_total, 12_345);
        assert_eq!(load.cached_prompt_tokens_total, 2_345);
        assert_eq!(load.generated_tokens_total, 999);
    }

    #[test]
    fn sglang_tgi_and_llama_cpp_are_read() {
        let sglang = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 4\n\
                      # TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 9\n\
                      # TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n\
                      # TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name=\"m\"} 32000\n";
        let (kind, load) = read_metrics(sglang).unwrap();
        assert_eq!(kind, EngineKind::Sglang);
        assert_eq!((load.running, load.waiting), (4, 9));
        assert_eq!((load.kv_blocks_used, load.kv_blocks_total), (1_000, 2_000));
        let tgi = "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 8\n";
        let (kind, load) = read_metrics(tgi).unwrap();
        assert_eq!(kind, EngineKind::Tgi);
        assert_eq!(
            (load.running, load.waiting, load.kv_blocks_total),
            (8, 3, 0)
        );
        let llama = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n\
                     # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n\
                     # TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n";
        let (kind, load) = read_metrics(llama).unwrap();
        assert_eq!(kind, EngineKind::LlamaCpp);
        assert_eq!((load.running, load.waiting), (1, 2));
        // No block count: the ratio in thousandths.
        assert_eq!(
            (load.kv_blocks_used, load.kv_blocks_total),
            (125, KV_RATIO_SCALE)
        );
    }

    #[test]
    fn unknown_or_broken_scrapes_keep_the_old_view() {
        assert_eq!(read_metrics(""), None);
        assert_eq!(
            read_metrics("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"),
            None
        );
        assert_eq!(read_metrics("vllm:num_requests_running{{{ garbage"), None);
        assert_eq!(read_metrics("<html>not metrics</html>"), None);
    }
}
