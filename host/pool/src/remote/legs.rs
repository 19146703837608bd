//! A disaggregated request's two legs as the engines' protocols define them: what the
//! prefill and the decode server are sent, made from the request one server of their kind
//! would get whole ([`UpstreamRequest`]), and the prefill's answer read
//! ([`PrefillAnswer`]).
//!
//! - vLLM's `NixlConnector` (and `ringmaster worker`, which speaks the same exchange): the
//!   prefill leg first, whole, with one output token and `kv_transfer_params` asking for a
//!   remote decode (vllm-project/vllm
//!   `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`,
//!   `send_request_to_service`); the decode leg is the request as it was, plus the parameters
//!   the prefill returned, verbatim.
//! - SGLang: one body for both legs, sent at once, with `bootstrap_host`, `bootstrap_port` and
//!   `bootstrap_room` (sgl-project/sglang `python/sglang/srt/entrypoints/openai/protocol.py`,
//!   "For PD disaggregation"), and each leg's data-parallel rank.
//!
//! Only the body's top level is edited; the rest reaches the servers as it was encoded.

use ringmaster_gpu_runtime::{FinishReason, GenerateEvent};
use ringmaster_tls::credential::WorkerSecret;
use ringmaster_wire::object::{ObjectWriter, TopLevel};
use ringmaster_wire::reserved;
use serde_json::value::RawValue;

use super::{Endpoint, ReplyMode, UpstreamRequest};

/// What a NIXL prefill leg is sent in `kv_transfer_params`: compute the prompt, keep its KV
/// cache for a remote decode.
pub const NIXL_PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The header vLLM's proxies send both legs, with the same id (the prefill's blocks are
/// found by it).
pub const REQUEST_ID_HEADER: http::HeaderName =
    http::HeaderName::from_static(reserved::REQUEST_ID_HEADER);

/// The header that pins a vLLM leg to one data-parallel rank.
pub const DP_RANK_HEADER: http::HeaderName =
    http::HeaderName::from_static(reserved::DP_RANK_HEADER);

/// The header that carries a `ringmaster worker` leg's credential.
pub const LEG_CREDENTIAL_HEADER: http::HeaderName =
    http::HeaderName::from_static(reserved::LEG_CREDENTIAL_HEADER);

/// A leg's body could not be made.
#[derive(Debug, thiserror::Error)]
#[error("a disaggregated leg's body could not be made: {0}")]
pub struct LegError(String);

/// Where SGLang's decode server fetches the prompt's KV cache from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The prefill server's host.
    pub host: String,
    /// Its bootstrap port (`None`: the server has none, sent as `null`).
    pub port: Option<u16>,
    /// The pair's rendezvous, random in `[0, 2^63 - 1]`.
    pub room: u64,
}

impl Bootstrap {
    /// A new room on the prefill server at `host`:`port`.
    pub fn new(host: &str, port: Option<u16>) -> Self {
        Self {
            host: host.to_owned(),
            port,
            room: uuid::Uuid::new_v4().as_u64_pair().0 >> 1,
        }
    }
}

/// The token limits an API's body carries: the first one is always set on a prefill leg.
fn token_limits(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::Chat | Endpoint::Completions => &["max_tokens", "max_completion_tokens"],
        Endpoint::Messages => &["max_tokens"],
        Endpoint::Responses => &["max_output_tokens"],
    }
}

/// What a prefill leg may not carry (it answers with one token, whole): a stream and its
/// options, minimum lengths that conflict with one token, and any transfer parameters of
/// the client's own.
const NOT_ON_A_PREFILL: &[&str] = &[
    "stream",
    "stream_options",
    "min_tokens",
    "min_completion_tokens",
    "kv_transfer_params",
];

impl UpstreamRequest {
    /// The NIXL prefill leg of this request (the one the decode server's kind would get
    /// whole): one output token (`max_tokens`, and `max_completion_tokens` when present; a
    /// Responses body's `max_output_tokens`), no stream, no `stream_options`, no minimum
    /// lengths, `kv_transfer_params` asking for a remote decode; the same `X-Request-Id` as
    /// the decode leg; with `secret` (a `ringmaster worker`'s leg), the leg's credential.
    pub fn nixl_prefill(
        &self,
        pair_id: &str,
        secret: Option<&WorkerSecret>,
    ) -> Result<Self, LegError> {
        let top = parse(&self.body)?;
        let limits = token_limits(self.endpoint);
        let mut out = ObjectWriter::with_capacity(self.body.len() + NIXL_PREFILL_PARAMS.len() + 64);
        for (key, value) in &top.0 {
            if NOT_ON_A_PREFILL.contains(&key.as_str()) || limits[0] == key {
                continue;
            }
            let text = if limits.contains(&key.as_str()) {
                "1"
            } else {
                value.get()
            };
            out.field(key, text);
        }
        out.field(limits[0], "1");
        out.field("stream", "false");
        out.field("kv_transfer_params", NIXL_PREFILL_PARAMS);
        Ok(self
            .with_body(out.finish(), ReplyMode::Whole)
            .with_header(REQUEST_ID_HEADER, pair_id)
            .signed(secret, pair_id, NIXL_PREFILL_PARAMS))
    }

    /// The NIXL decode leg: this request as it was, with the prefill's
    /// `kv_transfer_params` as it returned them, and the prefill leg's `X-Request-Id`; with
    /// `secret` (a `ringmaster worker`'s leg), the leg's credential.
    pub fn nixl_decode(
        &self,
        params: &RawValue,
        pair_id: &str,
        secret: Option<&WorkerSecret>,
    ) -> Result<Self, LegError> {
        let top = parse(&self.body)?;
        let mut out = ObjectWriter::with_capacity(self.body.len() + params.get().len() + 32);
        for (key, value) in &top.0 {
            if key != "kv_transfer_params" {
                out.field(key, value.get());
            }
        }
        out.field("kv_transfer_params", params.get());
        Ok(self
            .with_body(out.finish(), self.mode)
            .with_header(REQUEST_ID_HEADER, pair_id)
            .signed(secret, pair_id, params.get()))
    }

    /// This leg with its credential over `pair_id` and `params` (the `kv_transfer_params`
    /// text it carries), when there is a secret to make one with.
    fn signed(self, secret: Option<&WorkerSecret>, pair_id: &str, params: &str) -> Self {
        match secret {
            Some(secret) => {
                let credential = secret.leg_credential(pair_id, params);
                self.with_header(LEG_CREDENTIAL_HEADER, &credential)
            }
            None => self,
        }
    }

    /// An SGLang leg: this request with the pair's bootstrap (the same on both legs), the
    /// leg's own data-parallel rank (`routed_dp_rank`) and, on the decode leg, the prefill's
    /// (`disagg_prefill_dp_rank`).
    pub fn sglang_leg(
        &self,
        bootstrap: &Bootstrap,
        routed_dp_rank: Option<u32>,
        prefill_dp_rank: Option<u32>,
    ) -> Result<Self, LegError> {
        const OURS: &[&str] = &[
            "bootstrap_host",
            "bootstrap_port",
            "bootstrap_room",
            "routed_dp_rank",
            "disagg_prefill_dp_rank",
        ];
        let top = parse(&self.body)?;
        let mut out = ObjectWriter::with_capacity(self.body.len() + 160);
        for (key, value) in &top.0 {
            if !OURS.contains(&key.as_str()) {
                out.field(key, value.get());
            }
        }
        out.field(
            "bootstrap_host",
            &serde_json::Value::from(bootstrap.host.as_str()).to_string(),
        );
        out.field(
            "bootstrap_port",
            &bootstrap.port.map_or("null".to_owned(), |p| p.to_string()),
        );
        out.field("bootstrap_room", &bootstrap.room.to_string());
        if let Some(rank) = routed_dp_rank {
            out.field("routed_dp_rank", &rank.to_string());
        }
        if let Some(rank) = prefill_dp_rank {
            out.field("disagg_prefill_dp_rank", &rank.to_string());
        }
        Ok(self.with_body(out.finish(), self.mode))
    }

    /// This request with `name` set to `value` (a value that is not a valid header is left
    /// out: the ids and ranks set here always are).
    pub fn with_header(mut self, name: http::HeaderName, value: &str) -> Self {
        if let Ok(value) = http::HeaderValue::from_str(value) {
            self.headers.retain(|(n, _)| *n != name);
            self.headers.push((name, value));
        }
        self
    }

    fn with_body(&self, body: Vec<u8>, mode: ReplyMode) -> Self {
        Self {
            body: bytes::Bytes::from(body),
            mode,
            ..self.clone()
        }
    }
}

fn parse(body: &[u8]) -> Result<TopLevel<'_>, LegError> {
    TopLevel::parse(body).map_err(|e| LegError(format!("the body is not a JSON object: {e}")))
}

/// A prefill leg's whole answer, as the decode leg and the accounting need it.
#[derive(Clone, Debug, Default)]
pub struct PrefillAnswer {
    /// The `kv_transfer_params` the prefill returned (`None`: it returned none, and the
    /// decode server computes the prompt itself).
    pub kv_transfer_params: Option<Box<RawValue>>,
    /// Prompt tokens, as the prefill server counted them.
    pub prompt_tokens: Option<u32>,
    /// Of those, the tokens its prefix cache held.
    pub cached_tokens: Option<u32>,
    /// Why it stopped (vLLM returns the parameters only for a length-capped prefill).
    pub finish: Option<FinishReason>,
}

impl PrefillAnswer {
    /// Reads a prefill server's whole answer in `api`'s shape.
    pub fn read(body: &[u8], endpoint: Endpoint) -> Self {
        let kv_transfer_params = TopLevel::parse(body)
            .ok()
            .and_then(|top| top.get("kv_transfer_params"))
            .filter(|params| {
                let text = params.get().trim();
                text != "null" && text != "{}"
            })
            .map(ToOwned::to_owned);
        let mut events = Vec::new();
        super::dialects::Decoder::of(endpoint.api()).whole(body, &mut events);
        let mut answer = Self {
            kv_transfer_params,
            ..Self::default()
        };
        for event in events {
            if let GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                ..
            } = event
            {
                answer.prompt_tokens = Some(prompt_tokens);
                answer.cached_tokens = Some(cached_tokens);
                answer.finish = Some(reason);
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn request(endpoint: Endpoint, body: Value, mode: ReplyMode) -> UpstreamRequest {
        UpstreamRequest::relayed(
            endpoint,
            bytes::Bytes::from(body.to_string()),
            mode,
            "req_1".into(),
            Vec::new(),
        )
    }

    fn body(request: &UpstreamRequest) -> Value {
        serde_json::from_slice(request.body()).unwrap()
    }

    fn header<'a>(request: &'a UpstreamRequest, name: &str) -> Option<&'a str> {
        request
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    /// vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
    /// `send_request_to_service`: the prefill's body.
    #[test]
    fn a_nixl_prefill_asks_for_one_token_whole_and_a_remote_decode() {
        let chat = request(
            Endpoint::Chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true, "stream_options": {"include_usage": true},
                   "max_completion_tokens": 50, "min_tokens": 4, "temperature": 0}),
            ReplyMode::Stream,
        );
        let prefill = chat.nixl_prefill("pair-1", None).unwrap();
        assert_eq!(prefill.mode, ReplyMode::Whole);
        assert_eq!(
            body(&prefill),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "max_completion_tokens": 1, "temperature": 0, "max_tokens": 1,
                   "stream": false,
                   "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                       "remote_engine_id": null, "remote_block_ids": null,
                       "remote_host": null, "remote_port": null}})
        );
        assert_eq!(header(&prefill, "x-request-id"), Some("pair-1"));
        assert_eq!(header(&prefill, "x-ringmaster-leg-credential"), None);
        // A `ringmaster worker`'s leg carries the credential over its id and its parameters.
        let secret = WorkerSecret::new("test", b"the fleet's shared secret").unwrap();
        let signed = chat.nixl_prefill("pair-1", Some(&secret)).unwrap();
        let credential = header(&signed, "x-ringmaster-leg-credential").unwrap();
        assert!(secret.verify_leg("pair-1", NIXL_PREFILL_PARAMS, credential));
        // Only the limits a body has are set, and the first always.
        let responses = request(
            Endpoint::Responses,
            json!({"model": "m", "input": "hi", "max_output_tokens": 9, "stream": true}),
            ReplyMode::Stream,
        );
        let body = body(&responses.nixl_prefill("pair-2", None).unwrap());
        assert_eq!(body["max_output_tokens"], 1);
        assert!(body.get("max_tokens").is_none(), "{body}");
        assert_eq!(body["stream"], false);
    }

    #[test]
    fn a_nixl_decode_gets_the_request_as_it_was_and_the_params_verbatim() {
        let chat = request(
            Endpoint::Chat,
            json!({"model": "m", "messages": [], "stream": true, "max_tokens": 50,
                   "min_tokens": 4, "kv_transfer_params": {"client": "own"}}),
            ReplyMode::Stream,
        );
        let params: Box<RawValue> = serde_json::from_str(
            r#"{"do_remote_prefill": true, "remote_block_ids": [[1,2]], "remote_port": 5600}"#,
        )
        .unwrap();
        let secret = WorkerSecret::new("test", b"the fleet's shared secret").unwrap();
        let decode = chat.nixl_decode(&params, "pair-1", Some(&secret)).unwrap();
        let credential = header(&decode, "x-ringmaster-leg-credential").unwrap();
        assert!(secret.verify_leg("pair-1", params.get(), credential));
        assert_eq!(decode.mode, ReplyMode::Stream);
        let text = std::str::from_utf8(decode.body()).unwrap();
        assert!(text.ends_with(&format!(r#""kv_transfer_params":{}}}"#, params.get())));
        let body = body(&decode);
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["min_tokens"], 4);
        assert_eq!(body["stream"], true);
        assert_eq!(header(&decode, "x-request-id"), Some("pair-1"));
    }

    #[test]
    fn sglang_legs_share_the_bootstrap_and_carry_their_ranks() {
        let chat = request(
            Endpoint::Chat,
            json!({"model": "m", "messages": [], "stream": true, "bootstrap_room": 1}),
            ReplyMode::Stream,
        );
        let bootstrap = Bootstrap::new("10.0.0.7", Some(8998));
        assert!(bootstrap.room < 1 << 63);
        let prefill = body(&chat.sglang_leg(&bootstrap, Some(1), None).unwrap());
        let decode = body(&chat.sglang_leg(&bootstrap, Some(0), Some(1)).unwrap());
        for leg in [&prefill, &decode] {
            assert_eq!(leg["bootstrap_host"], "10.0.0.7");
            assert_eq!(leg["bootstrap_port"], 8998);
            assert_eq!(leg["bootstrap_room"], bootstrap.room);
            assert_eq!(leg["stream"], true);
        }
        assert_eq!(prefill["routed_dp_rank"], 1);
        assert!(prefill.get("disagg_prefill_dp_rank").is_none());
        assert_eq!(decode["routed_dp_rank"], 0);
        assert_eq!(decode["disagg_prefill_dp_rank"], 1);
        let none = body(
            &chat
                .sglang_leg(&Bootstrap::new("h", None), None, None)
                .unwrap(),
        );
        assert_eq!(none["bootstrap_port"], Value::Null);
        assert!(none.get("routed_dp_rank").is_none());
    }

    #[test]
    fn a_prefill_answer_gives_its_params_and_cached_tokens() {
        let answer = PrefillAnswer::read(
            br#"{"id":"c","object":"chat.completion","model":"m",
                 "choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],
                 "usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101,
                          "prompt_tokens_details":{"cached_tokens":64}},
                 "kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e"}}"#,
            Endpoint::Chat,
        );
        assert_eq!(
            answer.kv_transfer_params.unwrap().get(),
            r#"{"do_remote_prefill":true,"remote_engine_id":"e"}"#
        );
        assert_eq!(answer.prompt_tokens, Some(100));
        assert_eq!(answer.cached_tokens, Some(64));
        assert_eq!(answer.finish, Some(FinishReason::MaxTokens));
        let none = PrefillAnswer::read(
            br#"{"id":"c","object":"chat.completion","model":"m","choices":[],"kv_transfer_params":null}"#,
            Endpoint::Chat,
        );
        assert!(none.kv_transfer_params.is_none());
    }
}
