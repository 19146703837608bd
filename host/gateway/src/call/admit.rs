//! Phase 2, admit: the caller's token buckets (its estimated input tokens, no output owed;
//! with the fleet's shared buckets, its request too, all in one call),
//! then the admission policy and the fair queue. After a wait in the queue the pool has moved
//! on, so the call takes a fresh view of its model's pool.

use ringmaster_api::ApiError;

use super::Call;
use super::prepare::model_pool;
use crate::admission::Asking;

impl Call {
    /// Phase 2: see the module's documentation.
    pub(crate) async fn admit(&mut self) -> Result<(), ApiError> {
        let gateway = self.gateway.clone();
        if self.caller.is_shared() {
            // The fleet's buckets: the request, its input and the output debt in one call.
            self.caller
                .admit_shared(&self.request.model, self.request.estimated_tokens)
                .await
        } else {
            self.caller
                .admit(&self.request.model, self.request.estimated_tokens)
        }
        .map_err(|refusal| {
            crate::auth::count_refusal(&gateway.metrics, &self.caller.tenant, &refusal);
            crate::auth::refused_with_headers(refusal, &self.caller, self.request.door)
        })?;
        let asked_tokens =
            u64::from(self.request.estimated_tokens) + u64::from(self.request.max_tokens);
        let chat = ringmaster_pool::kv_view::ChatPrompt {
            adapter: self.adapter.name(&self.served_model),
            ..super::chat(&self.request)
        };
        let waited = gateway
            .admission
            .admit(
                &gateway.pool,
                &self.pool,
                &gateway.metrics,
                (&self.input, chat),
                &mut self.policy,
                Asking {
                    tenant: &self.caller.tenant,
                    tokens: asked_tokens,
                    deadline: self.queue_timeout,
                },
            )
            .await?;
        if self.trace.is_some() {
            use ringmaster_telemetry::SpanExt;
            let span = tracing::Span::current();
            span.attribute(ringmaster_telemetry::semconv::ADMISSION_QUEUED, waited);
        }
        if waited {
            let (_, pool, adapter) =
                model_pool(&gateway, &gateway.pool.snapshot(), &self.request.model)?;
            self.pool = pool;
            self.adapter = adapter;
        }
        Ok(())
    }
}
