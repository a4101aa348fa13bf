//! Scheduling gates (kube-scheduler's SchedulingGates PreEnqueue): a pod with a non-empty
//! `spec.schedulingGates` is not decided, assumed or bound (the API server refuses its Binding)
//! and gets no `FailedScheduling`; it carries `PodScheduled=False, reason SchedulingGated` and
//! waits for an update that removes its gates (gates can only be removed after creation). Pure.

use k8s_openapi::api::core::v1::Pod;

use crate::decision::Decision;

/// The `PodScheduled` reason of a gated pod.
pub const REASON: &str = "SchedulingGated";
/// The `PodScheduled` message of a gated pod, as the API server and kube-scheduler word it.
pub const MESSAGE: &str = "Scheduling is blocked due to non-empty scheduling gates";

/// Whether `pod` has scheduling gates.
pub fn gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// The names of `pod`'s scheduling gates.
pub fn gate_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

/// Whether `pod` already carries `PodScheduled=False, reason SchedulingGated`.
pub fn condition_set(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some(REASON)
            })
        })
}

/// What `simulate` and `kubectl numa explain` say of a gated pod instead of a decision: no
/// node is evaluated.
pub fn gated_decision(pod: &Pod) -> Decision {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("<unnamed>")
    );
    Decision {
        pod: key,
        node: None,
        message: format!("{MESSAGE}: {}", gate_names(pod).join(", ")),
        placement: None,
        allocation: None,
        nodes: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn gates_and_their_condition_are_read() {
        let gated_pod = pod(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "schedulingGates": [{"name": "a"}, {"name": "b"}]}}));
        assert!(gated(&gated_pod));
        assert!(!condition_set(&gated_pod));
        let d = gated_decision(&gated_pod);
        assert_eq!(d.pod, "ns/p");
        assert!(d.node.is_none() && d.nodes.is_empty());
        assert_eq!(d.message, format!("{MESSAGE}: a, b"));
        assert!(!gated(&pod(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "schedulingGates": []}})
        )));
        assert!(!gated(&Pod::default()));
        let written = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": REASON}]}}));
        assert!(condition_set(&written));
        let other = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}));
        assert!(!condition_set(&other));
    }
}
