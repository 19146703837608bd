//! `GET /admin/cluster`: the replicas of this gateway's fleet (each one's applied revision,
//! lease age and view of the servers), the log's head, and whether Redis answers; and the
//! other replicas' experiment figures that `/admin/experiments` adds to this one's.

use std::collections::HashMap;
use std::sync::Arc;

use http::{Response, StatusCode};
use ringmaster_api::ApiError;
use ringmaster_experiments::VariantFigures;
use ringmaster_gateway::respond::json_response;
use ringmaster_gateway::{Gateway, ResponseBody};
use serde_json::json;

use crate::changes::unavailable;

pub(crate) async fn cluster_json(
    gateway: &Arc<Gateway>,
) -> Result<Response<ResponseBody>, ApiError> {
    Ok(json_response(
        StatusCode::OK,
        &cluster_value(gateway).await?,
    ))
}

/// What `GET /admin/cluster` answers, as a value (the status page's replicas too).
pub(crate) async fn cluster_value(gateway: &Arc<Gateway>) -> Result<serde_json::Value, ApiError> {
    let Some(cluster) = gateway.cluster() else {
        return Ok(
            json!({ "cluster": null, "replicas": [], "note": "this gateway runs alone (no --cluster)" }),
        );
    };
    let head = cluster.head().await.map_err(unavailable)?;
    let mut replicas = cluster.replicas().await.map_err(unavailable)?;
    replicas.sort_by(|a, b| a.lease.replica.cmp(&b.lease.replica));
    let replicas: Vec<_> = replicas
        .into_iter()
        .map(|l| {
            json!({
                "replica": l.lease.replica,
                "applied_revision": l.lease.applied,
                "behind": head.saturating_sub(l.lease.applied),
                "lease_age_ms": l.age_ms,
                "started_ms": l.lease.started_ms,
                "servers": l.lease.servers,
                "this": l.lease.replica == cluster.replica(),
            })
        })
        .collect();
    let spec = cluster.spec();
    Ok(json!({
            "cluster": {
                "replica": cluster.replica(),
                "namespace": spec.namespace,
                "redis_up": cluster.is_up(),
                "head_revision": head,
                "applied_revision": cluster.applied().get(),
                "live_replicas": cluster.live_replicas(),
                "deadline_ms": spec.deadline.as_secs_f64() * 1000.0,
                "fail_open": spec.fail_open,
                "other_replicas_reporting_load": cluster.fleet_load().reporting(),
            },
            "replicas": replicas,
    }))
}

/// The other live replicas' figures per router variant, summed (empty alone, or when Redis
/// does not answer: the experiments then show this replica's own).
pub(crate) async fn others_figures(gateway: &Gateway) -> HashMap<String, VariantFigures> {
    let mut sums: HashMap<String, VariantFigures> = HashMap::new();
    let Some(cluster) = gateway.cluster() else {
        return sums;
    };
    let Ok(leases) = cluster.replicas().await else {
        return sums;
    };
    for lease in leases
        .iter()
        .filter(|l| l.lease.replica != cluster.replica())
    {
        let Some(variants) = lease.lease.experiments.as_object() else {
            continue;
        };
        for (name, figures) in variants {
            if let Ok(figures) = serde_json::from_value::<VariantFigures>(figures.clone()) {
                sums.entry(name.clone()).or_default().add(&figures);
            }
        }
    }
    sums
}
