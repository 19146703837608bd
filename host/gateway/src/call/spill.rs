//! Spilling to a `[[fallback]]` pool: when a model's own servers cannot take a request (none
//! reachable, every queue full, the router policy declined), the first rule that covers the
//! model and the reason sends it to its spill-over pool instead, under the name that pool
//! serves it as, unless the caller's tenant is kept off fallbacks or no server of the pool
//! can take it either. The spill-over pool is routed on its own ring, not by the router's
//! policies (they choose among the model's own servers, and may be what declined). Counted in
//! `ringmaster_fallback_requests_total{pool,reason}`; the rest of the request (attempts,
//! tokens, usage, limits) goes as for any other pool.

use std::sync::Arc;

use ringmaster_config::SpillReason;
use ringmaster_pool::PoolSnapshot;

use crate::metrics::FallbackLabels;
use crate::state::Gateway;

/// Where a request spills.
pub(crate) struct Spill {
    /// The spill-over pool's name.
    pub(crate) name: String,
    /// Its servers.
    pub(crate) pool: Arc<PoolSnapshot>,
    /// The name they serve the request's model under.
    pub(crate) served_model: String,
}

/// The spill for a request of `tenant` for `model` that its own pool cannot take for
/// `reason`, counted; `None` when no rule covers it, the tenant may not spill, or the pool has
/// no routable server. `named_only`: only a rule that names the model (a model no own server
/// serves at all is not every rule's business).
pub(crate) fn spill(
    gateway: &Gateway,
    fleet: &PoolSnapshot,
    tenant: &str,
    model: &str,
    reason: SpillReason,
    named_only: bool,
) -> Option<Spill> {
    let config = &gateway.config;
    if config.fallback.is_empty()
        || gateway
            .keys
            .current()
            .tenant(tenant)
            .is_some_and(|t| !t.fallback)
    {
        return None;
    }
    let rule = config
        .fallback
        .iter()
        .filter(|rule| !named_only || rule.models.is_some())
        .find(|rule| rule.covers(model, reason))?;
    let pool = fleet.spill_pools.get(&rule.pool)?;
    if !pool.servers.iter().any(|s| s.is_routable()) {
        return None;
    }
    gateway
        .metrics
        .fallback_requests
        .get_or_create(&FallbackLabels {
            pool: rule.pool.clone(),
            reason: reason.as_str(),
        })
        .inc();
    tracing::debug!(pool = %rule.pool, reason = reason.as_str(), model, "request.fallback");
    Some(Spill {
        name: rule.pool.clone(),
        pool: pool.clone(),
        served_model: rule.model.clone().unwrap_or_else(|| model.to_owned()),
    })
}
