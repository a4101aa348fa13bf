//! Pod fields the scheduling model does not enforce, so a pod that sets one is never placed
//! silently as if it did not: the live scheduler gives such a pod a Warning event
//! (`UnsupportedConstraint`, once) and counts it in
//! `numaplane_scheduler_unsupported_constraints_total{field}`; `simulate` and
//! `kubectl numa explain` list the fields next to the decision. Pure.
//!
//! Everything else kube-scheduler's default profile checks for a pod is enforced (docs/scheduler.md
//! lists both): resources with overhead and pod-level `spec.resources`, `nodeName`,
//! `nodeSelector`, required and preferred node affinity, taints and tolerations, unschedulable
//! nodes, the pod count, host ports, inter-pod (anti-)affinity, topology spread,
//! PersistentVolumeClaims with CSI attach limits, resource claims (DynamicResources),
//! scheduling gates and priority.

use k8s_openapi::api::core::v1::Pod;

/// One field that is set and not enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Unsupported {
    /// The field path (the metric's `field` label).
    pub field: &'static str,
    /// What kube-scheduler would do with it and numaplane does not.
    pub rule: &'static str,
}

/// `spec.schedulingGroup` (gang scheduling).
pub const SCHEDULING_GROUP: Unsupported = Unsupported {
    field: "spec.schedulingGroup",
    rule: "GangScheduling: the pods of the group are placed one by one, not all or none",
};

/// Every field this module can report: the bounded values of the metric's `field` label.
pub const ALL: [Unsupported; 1] = [SCHEDULING_GROUP];

/// The event reason of the live scheduler's warning.
pub const EVENT_REASON: &str = "UnsupportedConstraint";

/// The fields `pod` sets that numaplane (the live scheduler, `simulate`, `explain`) does not
/// enforce, in [`ALL`] order.
pub fn detect(pod: &Pod) -> Vec<Unsupported> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let mut out = Vec::new();
    if spec.scheduling_group.is_some() {
        out.push(SCHEDULING_GROUP);
    }
    out
}

/// The warning's text: `not enforced by numaplane: <field> (<rule>); …`.
pub fn message(found: &[Unsupported]) -> String {
    let parts: Vec<String> = found
        .iter()
        .map(|u| format!("{} ({})", u.field, u.rule))
        .collect();
    format!("not enforced by numaplane: {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    fn fields(p: &Pod) -> Vec<&'static str> {
        detect(p).into_iter().map(|u| u.field).collect()
    }

    #[test]
    fn resource_claims_are_enforced() {
        let p = pod(
            json!({"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]}),
        );
        assert!(detect(&p).is_empty());
    }

    #[test]
    fn a_plain_pod_sets_nothing_unsupported() {
        let p = pod(json!({
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}, "ports": [{"containerPort": 80, "hostPort": 80}]}],
            "nodeSelector": {"a": "b"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []},
                                          "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]},
                         "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
            "topologySpreadConstraints": [],
            "schedulingGates": [{"name": "g"}],
            "overhead": {"cpu": "100m"},
            "readinessGates": [{"conditionType": "x"}],
            "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "configMap": {"name": "x"}},
                        {"name": "c", "hostPath": {"path": "/x"}},
                        {"name": "d", "persistentVolumeClaim": {"claimName": "c"}},
                        {"name": "e", "csi": {"driver": "d"}}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
        }));
        assert!(detect(&p).is_empty(), "{:?}", detect(&p));
        assert!(detect(&Pod::default()).is_empty());
    }

    #[test]
    fn gang_scheduling_is_named_in_the_message() {
        let p = pod(json!({"containers": [], "schedulingGroup": {"podGroupName": "g"}}));
        assert_eq!(fields(&p), ["spec.schedulingGroup"]);
        let m = message(&detect(&p));
        assert!(
            m.starts_with("not enforced by numaplane: spec.schedulingGroup (GangScheduling"),
            "{m}"
        );
        assert!(ALL.iter().all(|u| u.field.starts_with("spec.")));
    }
}
