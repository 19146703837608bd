//! The worker's half of a split request, the exchange vLLM's `NixlConnector` defines with the
//! KV blocks moved over HTTP:
//!
//! - a **prefill leg** carries `kv_transfer_params` with `do_remote_decode: true`: the worker
//!   computes the prompt and one token, keeps the prompt's KV blocks for a decode worker
//!   ([`Transfers`], for `kv_lease` and until fetched once), and answers with
//!   `kv_transfer_params` naming them: `do_remote_prefill: true`, `remote_engine_id`,
//!   `remote_request_id`, `remote_host` and `remote_port` (where the gateway reached this
//!   worker), `remote_block_ids` (the blocks' hashes) and `tp_size`;
//! - a **decode leg** carries those parameters back: the worker fetches the blocks from
//!   `http://remote_host:remote_port/kv/transfer/{remote_request_id}`, registers them in its
//!   prefix cache and decodes, computing only the prompt's last tokens. Blocks it cannot fetch
//!   are computed again (vLLM's `kv_load_failure_policy = "recompute"`), and counted.
//!
//! A worker takes part in a transfer only when its gateway asked (see
//! [`ringmaster_tls::credential`]): a leg whose credential is missing or wrong, or a decode
//! leg naming a prefill worker not in its allow-list (`--kv-peer`: never an address a body
//! chose), is served whole instead, and counted ([`TransferRefusal`]); the blocks it keeps are
//! handed only to a fetch that carries the fleet's credential. What the engine is then handed
//! it checks itself against the request's own tokens (`KvHandoff::verify`).
//!
//! This module owns the parameters, the trust rules, the kept blocks and their wire form; the
//! engine owns the blocks themselves.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringmaster_gpu_runtime::block::BlockHash;
use ringmaster_gpu_runtime::{BLOCK_SIZE, KvContents, KvHandoff, StoredBlock};
use ringmaster_tls::credential::WorkerSecret;
use ringmaster_wire::object::TopLevel;
use ringmaster_wire::reserved::LEG_CREDENTIAL_HEADER;
use ringmaster_wire::worker::{HexHash, KvTransfer, TransferBlock};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

/// What a worker does in a disaggregated fleet (`ringmaster worker --role`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Whole requests and either leg (the default).
    #[default]
    Both,
    /// Prefill legs and whole requests; it refuses decode legs.
    Prefill,
    /// Decode legs and whole requests; it refuses prefill legs.
    Decode,
}

impl Role {
    /// The role named `name` (`both`, `prefill`, `decode`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "both" => Some(Self::Both),
            "prefill" => Some(Self::Prefill),
            "decode" => Some(Self::Decode),
            _ => None,
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// A prefill worker a decode worker may fetch blocks from, as the gateway reaches it
/// (`--kv-peer HOST:PORT`): the host and port a prefill leg's parameters name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    host: String,
    port: u16,
}

impl Peer {
    /// `HOST:PORT` (a name, an IPv4 address, or a bracketed IPv6 address).
    pub fn parse(text: &str) -> Result<Self, String> {
        let authority: http::uri::Authority = text
            .parse()
            .map_err(|e| format!("--kv-peer {text:?} is not HOST:PORT: {e}"))?;
        let port = authority
            .port_u16()
            .ok_or_else(|| format!("--kv-peer {text:?} names no port (HOST:PORT)"))?;
        Ok(Self {
            host: authority.host().to_ascii_lowercase(),
            port,
        })
    }

    fn admits(&self, remote: &RemoteBlocks) -> bool {
        self.port == remote.remote_port
            && self
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .eq_ignore_ascii_case(
                    remote
                        .remote_host
                        .trim_start_matches('[')
                        .trim_end_matches(']'),
                )
    }
}

/// Whom a worker takes transfers from.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// The secret shared with the gateways (`None`: no leg is taken; whole requests only).
    pub secret: Option<WorkerSecret>,
    /// The prefill workers a decode leg may fetch from.
    pub peers: Vec<Peer>,
}

/// Why a leg's transfer was not taken (the request was served whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferRefusal {
    /// The leg carried no credential, a wrong one, or this worker has no secret.
    Credential,
    /// A decode leg named a prefill worker outside the allow-list.
    Peer,
}

impl TransferRefusal {
    /// Its `reason` in `ringmaster_kv_import_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credential => "credential",
            Self::Peer => "peer",
        }
    }
}

/// How long kept blocks wait for their decode worker (vLLM's `kv_lease_duration`).
pub const KV_LEASE: Duration = Duration::from_secs(30);
/// Most handoffs kept at once; the oldest goes first.
pub const MAX_KEPT: usize = 256;

/// Which leg a request is, from its `kv_transfer_params`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leg {
    /// No parameters (or none that ask for anything): a whole request.
    Whole,
    /// Compute the prompt for a remote decode.
    Prefill,
    /// Decode from blocks another worker computed.
    Decode(RemoteBlocks),
}

/// Where a decode leg's blocks are.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RemoteBlocks {
    /// The prefill worker's host.
    pub remote_host: String,
    /// Its port.
    pub remote_port: u16,
    /// The prefill's id there.
    pub remote_request_id: String,
    /// The prefill worker's engine id.
    pub remote_engine_id: String,
}

#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    do_remote_decode: bool,
    #[serde(default)]
    do_remote_prefill: bool,
}

/// The `kv_transfer_params` of `body`, as their JSON text (`None`: absent or `null`).
pub fn params_of(body: &[u8]) -> Option<&RawValue> {
    TopLevel::parse(body)
        .ok()
        .and_then(|top| top.get("kv_transfer_params"))
        .filter(|p| p.get().trim() != "null")
}

/// The leg `body` asks for; an error says why its parameters cannot be used.
pub fn leg_of(body: &[u8], role: Role) -> Result<Leg, String> {
    let Some(params) = params_of(body) else {
        return Ok(Leg::Whole);
    };
    let flags: Params =
        serde_json::from_str(params.get()).map_err(|e| format!("kv_transfer_params: {e}"))?;
    match (flags.do_remote_decode, flags.do_remote_prefill) {
        (false, false) => Ok(Leg::Whole),
        (true, true) => Err(
            "kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true"
                .to_owned(),
        ),
        (true, false) if role == Role::Decode => Err(
            "kv_transfer_params asks for a prefill leg (do_remote_decode), and this worker is a \
             decode worker (--role decode)"
                .to_owned(),
        ),
        (true, false) => Ok(Leg::Prefill),
        (false, true) if role == Role::Prefill => Err(
            "kv_transfer_params asks for a decode leg (do_remote_prefill), and this worker is a \
             prefill worker (--role prefill)"
                .to_owned(),
        ),
        (false, true) => serde_json::from_str::<RemoteBlocks>(params.get())
            .map(Leg::Decode)
            .map_err(|e| {
                format!(
                    "kv_transfer_params for a decode leg need remote_host, remote_port, \
                     remote_request_id and remote_engine_id: {e}"
                )
            }),
    }
}

/// The prompts' blocks this worker computed for decode workers, until fetched or expired,
/// and whom it takes legs from.
#[derive(Debug)]
pub struct Transfers {
    /// This worker's engine id (`remote_engine_id`).
    pub engine_id: String,
    /// What it does.
    pub role: Role,
    trust: Trust,
    kept: Mutex<HashMap<String, (Instant, Bytes)>>,
    /// Decode legs whose blocks could not be fetched (their prompts were computed here).
    pub fetch_failures: AtomicU64,
    /// Legs whose credential was missing or wrong (served whole).
    pub refused_credential: AtomicU64,
    /// Decode legs naming a prefill worker outside the allow-list (served whole).
    pub refused_peer: AtomicU64,
    /// Fetches of kept blocks without the fleet's credential (answered 403).
    pub export_refused: AtomicU64,
}

impl Transfers {
    /// An empty table for a worker of `role` that trusts no one (whole requests only).
    pub fn new(role: Role) -> Self {
        Self::trusting(role, Trust::default())
    }

    /// An empty table for a worker of `role` taking legs as `trust` says.
    pub fn trusting(role: Role, trust: Trust) -> Self {
        Self {
            engine_id: format!("ringmaster-{:016x}", uuid::Uuid::new_v4().as_u64_pair().0),
            role,
            trust,
            kept: Mutex::new(HashMap::new()),
            fetch_failures: AtomicU64::new(0),
            refused_credential: AtomicU64::new(0),
            refused_peer: AtomicU64::new(0),
            export_refused: AtomicU64::new(0),
        }
    }

    /// The secret this worker shares with its gateways.
    pub fn secret(&self) -> Option<&WorkerSecret> {
        self.trust.secret.as_ref()
    }

    /// `leg` (of a body whose parameters are `params`, sent with `credential` for the pair
    /// `pair_id`) if this worker takes it, else [`TransferRefusal`] (counted): the request is
    /// then served whole.
    pub fn admit(
        &self,
        leg: Leg,
        params: Option<&RawValue>,
        credential: Option<&str>,
        pair_id: &str,
    ) -> Result<Leg, TransferRefusal> {
        if leg == Leg::Whole {
            return Ok(leg);
        }
        let genuine = match (&self.trust.secret, params, credential) {
            (Some(secret), Some(params), Some(credential)) => {
                secret.verify_leg(pair_id, params.get(), credential)
            }
            _ => false,
        };
        if !genuine {
            self.refused_credential.fetch_add(1, Ordering::Relaxed);
            return Err(TransferRefusal::Credential);
        }
        if let Leg::Decode(remote) = &leg
            && !self.trust.peers.iter().any(|peer| peer.admits(remote))
        {
            self.refused_peer.fetch_add(1, Ordering::Relaxed);
            return Err(TransferRefusal::Peer);
        }
        Ok(leg)
    }

    /// Whether a fetch of `id`'s blocks carries the fleet's credential (counted when not).
    pub fn may_fetch(&self, id: &str, credential: Option<&str>) -> bool {
        let genuine = match (&self.trust.secret, credential) {
            (Some(secret), Some(credential)) => secret.verify_fetch(id, credential),
            _ => false,
        };
        if !genuine {
            self.export_refused.fetch_add(1, Ordering::Relaxed);
        }
        genuine
    }

    /// Keeps `handoff` for request `id`; the `kv_transfer_params` that name it, reached at
    /// `host`:`port`.
    pub fn keep(
        &self,
        id: &str,
        handoff: &KvHandoff,
        (host, port): (&str, u16),
    ) -> serde_json::Value {
        let now = Instant::now();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, (at, _)| now.duration_since(*at) < KV_LEASE);
        while kept.len() >= MAX_KEPT {
            let Some(oldest) = kept
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            kept.remove(&oldest);
        }
        kept.insert(id.to_owned(), (now, encode(handoff)));
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_engine_id": self.engine_id,
            "remote_request_id": id,
            "remote_host": host,
            "remote_port": port,
            "remote_block_ids": handoff.blocks.iter().map(|b| HexHash(b.hash.0)).collect::<Vec<_>>(),
            "tp_size": 1,
        })
    }

    /// Hands over request `id`'s blocks once (`None`: unknown, fetched already, or expired).
    pub fn take(&self, id: &str) -> Option<Bytes> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (at, bytes) = kept.remove(id)?;
        (at.elapsed() < KV_LEASE).then_some(bytes)
    }

    /// Handoffs kept now.
    pub fn kept(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Counts a decode leg whose blocks could not be fetched.
    pub fn fetch_failed(&self) {
        self.fetch_failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// How long fetching a prefill's blocks may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Fetches a decode leg's blocks from the prefill worker that keeps them, with the fleet's
/// credential for them.
pub async fn fetch(remote: &RemoteBlocks, secret: &WorkerSecret) -> Result<KvHandoff, String> {
    use http_body_util::BodyExt;
    let address = format!("{}:{}", remote.remote_host, remote.remote_port);
    let work = async {
        let stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        let (mut send, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("{address}: {e}"))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = http::Request::get(format!("/kv/transfer/{}", remote.remote_request_id))
            .header(http::header::HOST, &address)
            .header(
                LEG_CREDENTIAL_HEADER,
                secret.fetch_credential(&remote.remote_request_id),
            )
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| format!("the request for {address}: {e}"))?;
        let response = send
            .send_request(request)
            .await
            .map_err(|e| format!("{address}: {e}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{address}: the transfer broke off: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{address} answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ));
        }
        decode(&body)
    };
    tokio::time::timeout(FETCH_TIMEOUT, work)
        .await
        .map_err(|_| format!("no transfer from {address} within {FETCH_TIMEOUT:?}"))?
}

/// A handoff's wire form: its [`KvTransfer`] line, then the contents.
pub fn encode(handoff: &KvHandoff) -> Bytes {
    let (contents, block_bytes, data): (&str, usize, &[u8]) = match &handoff.contents {
        KvContents::Bytes { block_bytes, data } => ("bytes", *block_bytes, data),
        KvContents::Modelled => ("modelled", 0, &[]),
        KvContents::Unavailable => ("unavailable", 0, &[]),
    };
    let header = KvTransfer {
        blocks: handoff
            .blocks
            .iter()
            .map(|b| TransferBlock {
                hash: HexHash(b.hash.0),
                parent: b.parent.map(|p| HexHash(p.0)),
                tokens: b.tokens.to_vec(),
            })
            .collect(),
        contents: contents.to_owned(),
        block_bytes,
    };
    let mut out = serde_json::to_vec(&header).unwrap_or_default();
    out.push(b'\n');
    out.extend_from_slice(data);
    Bytes::from(out)
}

/// A handoff read from its wire form, or why it cannot be.
pub fn decode(bytes: &[u8]) -> Result<KvHandoff, String> {
    let split = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("the transfer has no header line")?;
    let header: KvTransfer = serde_json::from_slice(&bytes[..split])
        .map_err(|e| format!("the transfer's header: {e}"))?;
    let data = &bytes[split + 1..];
    let mut blocks = Vec::with_capacity(header.blocks.len());
    for block in &header.blocks {
        let tokens: [u32; BLOCK_SIZE] = block.tokens.as_slice().try_into().map_err(|_| {
            format!(
                "a block of {} tokens (not {BLOCK_SIZE})",
                block.tokens.len()
            )
        })?;
        blocks.push(StoredBlock {
            hash: BlockHash(block.hash.0),
            parent: block.parent.map(|p| BlockHash(p.0)),
            tokens,
        });
    }
    let contents = match header.contents.as_str() {
        "bytes" => {
            if data.len() != header.block_bytes * blocks.len() {
                return Err(format!(
                    "the transfer holds {} bytes, not {} blocks of {}",
                    data.len(),
                    blocks.len(),
                    header.block_bytes
                ));
            }
            KvContents::Bytes {
                block_bytes: header.block_bytes,
                data: data.to_vec(),
            }
        }
        "modelled" => KvContents::Modelled,
        _ => KvContents::Unavailable,
    };
    Ok(KvHandoff { blocks, contents })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handoff(contents: KvContents) -> KvHandoff {
        let tokens: Vec<u32> = (0..2 * BLOCK_SIZE as u32).collect();
        let first = ringmaster_gpu_runtime::block::chain_hash(None, &tokens[..BLOCK_SIZE]);
        let second = ringmaster_gpu_runtime::block::chain_hash(Some(first), &tokens[BLOCK_SIZE..]);
        let block = |hash, parent, chunk: &[u32]| StoredBlock {
            hash,
            parent,
            tokens: chunk.try_into().unwrap(),
        };
        KvHandoff {
            blocks: vec![
                block(first, None, &tokens[..BLOCK_SIZE]),
                block(second, Some(first), &tokens[BLOCK_SIZE..]),
            ],
            contents,
        }
    }

    #[test]
    fn a_handoff_reads_back_as_it_was_written() {
        for contents in [
            KvContents::Bytes {
                block_bytes: 3,
                data: vec![1, 2, 3, 4, 5, 6],
            },
            KvContents::Modelled,
            KvContents::Unavailable,
        ] {
            let handoff = handoff(contents);
            assert_eq!(decode(&encode(&handoff)).unwrap(), handoff);
        }
        let mut short = encode(&handoff(KvContents::Bytes {
            block_bytes: 3,
            data: vec![1, 2, 3, 4, 5, 6],
        }))
        .to_vec();
        short.pop();
        assert!(decode(&short).unwrap_err().contains("not 2 blocks"));
        assert!(decode(b"no header").is_err());
    }

    #[test]
    fn the_legs_are_told_by_their_params_and_checked_against_the_role() {
        let prefill = br#"{"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null}}"#;
        let decode = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.1","remote_port":8001,"remote_request_id":"r","remote_engine_id":"e"}}"#;
        assert_eq!(leg_of(b"{}", Role::Both).unwrap(), Leg::Whole);
        assert_eq!(
            leg_of(br#"{"kv_transfer_params":null}"#, Role::Both).unwrap(),
            Leg::Whole
        );
        assert_eq!(leg_of(prefill, Role::Prefill).unwrap(), Leg::Prefill);
        assert!(
            leg_of(prefill, Role::Decode)
                .unwrap_err()
                .contains("--role decode")
        );
        let Leg::Decode(remote) = leg_of(decode, Role::Decode).unwrap() else {
            panic!("a decode leg");
        };
        assert_eq!(
            (remote.remote_host.as_str(), remote.remote_port),
            ("10.0.0.1", 8001)
        );
        assert!(
            leg_of(decode, Role::Prefill)
                .unwrap_err()
                .contains("--role prefill")
        );
        let incomplete = br#"{"kv_transfer_params":{"do_remote_prefill":true}}"#;
        assert!(
            leg_of(incomplete, Role::Both)
                .unwrap_err()
                .contains("remote_host")
        );
    }

    fn trusting(peers: &[&str]) -> (Transfers, WorkerSecret) {
        let secret = WorkerSecret::new("test", b"the fleet's shared secret").unwrap();
        let trust = Trust {
            secret: Some(secret.clone()),
            peers: peers.iter().map(|p| Peer::parse(p).unwrap()).collect(),
        };
        (Transfers::trusting(Role::Both, trust), secret)
    }

    #[test]
    fn a_leg_is_taken_only_with_the_gateways_credential_and_from_a_known_peer() {
        let (transfers, secret) = trusting(&["10.0.0.1:8001", "[::1]:9000"]);
        let decode = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.1","remote_port":8001,"remote_request_id":"r","remote_engine_id":"e"}}"#;
        let params = params_of(decode).unwrap();
        let leg = leg_of(decode, Role::Both).unwrap();
        let good = secret.leg_credential("pair-1", params.get());
        assert_eq!(
            transfers.admit(leg.clone(), Some(params), Some(&good), "pair-1"),
            Ok(leg.clone())
        );
        // The same parameters for another pair, no credential, another secret's.
        let theirs = WorkerSecret::new("test", b"somebody else's secret")
            .unwrap()
            .leg_credential("pair-1", params.get());
        for (credential, pair) in [
            (Some(good.as_str()), "pair-2"),
            (None, "pair-1"),
            (Some(theirs.as_str()), "pair-1"),
        ] {
            assert_eq!(
                transfers.admit(leg.clone(), Some(params), credential, pair),
                Err(TransferRefusal::Credential)
            );
        }
        assert_eq!(transfers.refused_credential.load(Ordering::Relaxed), 3);
        // A genuine leg naming a worker outside the allow-list.
        let elsewhere = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254","remote_port":80,"remote_request_id":"r","remote_engine_id":"e"}}"#;
        let params = params_of(elsewhere).unwrap();
        let credential = secret.leg_credential("pair-1", params.get());
        assert_eq!(
            transfers.admit(
                leg_of(elsewhere, Role::Both).unwrap(),
                Some(params),
                Some(&credential),
                "pair-1"
            ),
            Err(TransferRefusal::Peer)
        );
        assert_eq!(transfers.refused_peer.load(Ordering::Relaxed), 1);
        let v6 = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"::1","remote_port":9000,"remote_request_id":"r","remote_engine_id":"e"}}"#;
        let params = params_of(v6).unwrap();
        let credential = secret.leg_credential("p", params.get());
        assert!(
            transfers
                .admit(
                    leg_of(v6, Role::Both).unwrap(),
                    Some(params),
                    Some(&credential),
                    "p"
                )
                .is_ok()
        );
        // A worker without a secret takes no leg at all; a whole request needs none.
        let lone = Transfers::new(Role::Both);
        let prefill = br#"{"kv_transfer_params":{"do_remote_decode":true}}"#;
        let params = params_of(prefill).unwrap();
        assert_eq!(
            lone.admit(
                Leg::Prefill,
                Some(params),
                Some(&secret.leg_credential("p", params.get())),
                "p"
            ),
            Err(TransferRefusal::Credential)
        );
        assert_eq!(lone.admit(Leg::Whole, None, None, "p"), Ok(Leg::Whole));
        // Fetches: the fleet's credential for that id alone.
        assert!(transfers.may_fetch("r1", Some(&secret.fetch_credential("r1"))));
        assert!(!transfers.may_fetch("r2", Some(&secret.fetch_credential("r1"))));
        assert!(!transfers.may_fetch("r1", None));
        assert!(!lone.may_fetch("r1", Some(&secret.fetch_credential("r1"))));
        assert_eq!(transfers.export_refused.load(Ordering::Relaxed), 2);
        assert!(Peer::parse("no-port").unwrap_err().contains("no port"));
    }

    #[test]
    fn kept_blocks_go_to_one_decode_worker_once() {
        let transfers = Transfers::new(Role::Prefill);
        let params = transfers.keep("r1", &handoff(KvContents::Modelled), ("10.1.1.1", 8000));
        assert_eq!(params["remote_request_id"], "r1");
        assert_eq!(params["remote_host"], "10.1.1.1");
        assert_eq!(params["remote_port"], 8000);
        assert_eq!(params["do_remote_prefill"], true);
        assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 2);
        assert_eq!(transfers.kept(), 1);
        assert!(transfers.take("r1").is_some());
        assert!(transfers.take("r1").is_none(), "fetched once");
        assert!(transfers.take("other").is_none());
    }
}
