//! Phase 4 for a request split between two of this process's servers: the prefill engine
//! computes the prompt and hands its KV blocks over in memory ([`KvHandoff`]); the decode
//! engine registers them and decodes. Between simulated servers the handoff also takes the
//! time moving those bytes would take over the modelled link (`[disaggregation] link_gbps`,
//! `link_latency_us`), for the blocks the decode server does not hold already.
//!
//! A prefill that fails, or that hands nothing over, leaves the decode server to serve the
//! request whole.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use ringmaster_gpu_runtime::{EngineHandle, GenerateEvent, GenerateRequest, KvHandoff};
use ringmaster_pool::{BackendError, Generation, ServerAddress};
use tracing::{Instrument, debug};

use super::Call;
use super::legs::paired;
use ringmaster_slots::router::pair::PrefillLeg;

impl Call {
    /// Starts a request split between `leg`'s engine (prefill) and `decode`.
    pub(super) async fn local_pair(
        &self,
        decode: &EngineHandle,
        request: GenerateRequest,
        leg: PrefillLeg,
    ) -> Result<Generation, BackendError> {
        let span = self.leg_span(&leg.server, "prefill");
        let simulated = matches!(leg.server.address(), ServerAddress::Simulated { .. });
        let prefilled = match span.clone() {
            Some(span) => self.local_prefill(&request, leg).instrument(span).await,
            None => self.local_prefill(&request, leg).await,
        };
        let Some((handoff, cached)) = prefilled else {
            return decode
                .submit(request)
                .map(Generation::from)
                .map_err(BackendError::Engine);
        };
        if simulated {
            let held = decode.cached_prefix_blocks(&handoff.hashes());
            let moved = handoff.blocks.len().saturating_sub(held);
            let rule = self.gateway.router.pair_rule();
            let bytes = handoff.transfer_bytes(moved);
            let transfer =
                rule.link_latency + Duration::from_secs_f64(bytes as f64 / rule.link_bytes_per_s);
            debug!(
                blocks = moved,
                bytes,
                transfer_us = transfer.as_micros() as u64,
                "pair.kv_transfer"
            );
            tokio::time::sleep(transfer).await;
        }
        let stream = decode
            .submit_with_kv(request, handoff)
            .map_err(BackendError::Engine)?;
        Ok(paired(
            stream.into(),
            Arc::new(AtomicU32::new(cached)),
            None,
        ))
    }

    /// Runs the prefill leg on `leg`'s engine: its handoff and its cached prompt tokens, or
    /// `None` when it failed or handed nothing over (counted, on its span too).
    async fn local_prefill(
        &self,
        request: &GenerateRequest,
        leg: PrefillLeg,
    ) -> Option<(KvHandoff, u32)> {
        let PrefillLeg {
            server,
            mut in_flight,
            ..
        } = leg;
        let span = tracing::Span::current();
        let span = (!span.is_none()).then_some(span);
        let ringmaster_pool::Backend::Local(engine) = server.engine() else {
            return None;
        };
        let (mut stream, handoff) = match engine.submit_prefill(request.clone()) {
            Ok(started) => started,
            Err(error) => {
                self.count_prefill("failed", span.as_ref(), Some(&error.to_string()));
                return None;
            }
        };
        let mut cached = 0;
        while let Some(event) = stream.next().await {
            match event {
                GenerateEvent::Started { cached_tokens, .. } => {
                    in_flight.prefilled();
                    cached = cached_tokens;
                }
                GenerateEvent::Finished { cached_tokens, .. } => cached = cached_tokens,
                _ => {}
            }
        }
        drop(in_flight);
        match handoff.await {
            Ok(handoff) if !handoff.blocks.is_empty() => {
                self.count_prefill("ok", span.as_ref(), None);
                Some((handoff, cached))
            }
            Ok(_) => {
                self.count_prefill("no_params", span.as_ref(), None);
                None
            }
            Err(_) => {
                self.count_prefill("failed", span.as_ref(), Some("the prefill ended early"));
                None
            }
        }
    }
}
