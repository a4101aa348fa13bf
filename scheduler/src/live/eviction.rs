//! The API writes of a preemption, in kube-scheduler's order (`framework/preemption`
//! `PrepareCandidate`): the preemptor's `status.nominatedNodeName`, then per victim the
//! `DisruptionTarget` condition, the deletion (pinned to the victim's UID) and a `Preempted`
//! event. They share the Bindings' budget: a preemption is what lets a waiting pod bind.

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::events::EventType,
};

use super::{api::Writer, metrics::Families};
use crate::preempt::{DISRUPTION_TARGET, PREEMPTION_BY_SCHEDULER, VictimInfo};

/// A preemption write that failed.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// Setting the preemptor's nominated node failed.
    #[error("nominating node {node} for {pod}")]
    Nominate {
        /// `namespace/name`.
        pod: String,
        /// Node.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Deleting a victim failed (other than "already gone").
    #[error("deleting victim {victim}")]
    Delete {
        /// `namespace/name`.
        victim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// `metav1.Time` now.
fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Sets `status.nominatedNodeName` of the preemptor.
pub async fn nominate(w: &Writer, namespace: &str, name: &str, node: &str) -> Result<(), EvictionError> {
    w.priority_budget().await;
    let api: Api<Pod> = Api::namespaced(w.client(), namespace);
    let patch = serde_json::json!({"status": {"nominatedNodeName": node}});
    Families::count(&w.metrics().api_writes, "status");
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| EvictionError::Nominate {
            pod: format!("{namespace}/{name}"),
            node: node.to_owned(),
            source,
        })
}

/// Evicts one victim for `preemptor` (scheduled by `profile`) on `node`: the
/// `DisruptionTarget` condition first (so the workload's controller and PodDisruptionBudget
/// accounting see why), then the deletion pinned to the victim's UID, then the `Preempted`
/// event. A victim already gone (404, or a 409 on the UID: another pod of that name) is not an
/// error: what it held is free either way.
pub async fn evict(
    w: &Writer,
    profile: &str,
    preemptor: &Pod,
    node: &str,
    victim: &VictimInfo,
) -> Result<(), EvictionError> {
    let api: Api<Pod> = Api::namespaced(w.client(), &victim.namespace);
    w.priority_budget().await;
    let condition = serde_json::json!({"status": {"conditions": [{
        "type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_BY_SCHEDULER,
        "message": format!("{profile}: preempting to accommodate a higher priority pod"),
        "lastTransitionTime": now(),
    }]}});
    Families::count(&w.metrics().api_writes, "status");
    if let Err(e) = api
        .patch_status(
            &victim.name,
            &PatchParams::default(),
            &Patch::Strategic(&condition),
        )
        .await
    {
        // The deletion is what frees the node; the condition only explains it.
        w.metrics().status_patch_errors.inc();
        tracing::warn!(victim = %victim.key, error = %numaplane::error_chain(&e), "cannot set the DisruptionTarget condition");
    }
    w.priority_budget().await;
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: victim.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    Families::count(&w.metrics().api_writes, "delete");
    match api.delete(&victim.name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
            tracing::debug!(victim = %victim.key, code = s.code, "victim already gone");
            return Ok(());
        }
        Err(source) => {
            return Err(EvictionError::Delete {
                victim: victim.key.clone(),
                source,
            });
        }
    }
    let reference = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(victim.name.clone()),
            namespace: Some(victim.namespace.clone()),
            uid: victim.uid.clone(),
            ..kube::api::ObjectMeta::default()
        },
        ..Pod::default()
    };
    let uid = preemptor.metadata.uid.as_deref().unwrap_or_default();
    w.event(
        profile,
        &reference,
        EventType::Normal,
        "Preempted",
        "Preempting",
        format!("Preempted by pod {uid} on node {node}"),
    );
    Ok(())
}
