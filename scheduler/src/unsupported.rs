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
//! PersistentVolumeClaims with CSI attach limits, scheduling gates and priority.

use k8s_openapi::api::core::v1::Pod;

/// One field that is set and not enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Unsupported {
    /// The field path (the metric's `field` label).
    pub field: &'static str,
    /// What kube-scheduler would do with it and numaplane does not.
    pub rule: &'static str,
}

/// `spec.resourceClaims` (and containers' `resources.claims`), in the live scheduler only:
/// `simulate` and `explain` allocate claims (the DynamicResources filter), the live loop does
/// not write allocations yet.
pub const RESOURCE_CLAIMS: Unsupported = Unsupported {
    field: "spec.resourceClaims",
    rule: "DynamicResources: the live scheduler does not allocate the claimed devices yet; the pod is placed as if it claimed none",
};
/// `spec.schedulingGroup` (gang scheduling).
pub const SCHEDULING_GROUP: Unsupported = Unsupported {
    field: "spec.schedulingGroup",
    rule: "GangScheduling: the pods of the group are placed one by one, not all or none",
};

/// Every field this module can report: the bounded values of the metric's `field` label.
pub const ALL: [Unsupported; 2] = [RESOURCE_CLAIMS, SCHEDULING_GROUP];

/// The event reason of the live scheduler's warning.
pub const EVENT_REASON: &str = "UnsupportedConstraint";

/// The fields `pod` sets that the model (`simulate`, `explain`) does not enforce, in [`ALL`]
/// order: [`detect_live`] without the resource claims, which the model allocates.
pub fn detect(pod: &Pod) -> Vec<Unsupported> {
    let mut out = detect_live(pod);
    out.retain(|u| *u != RESOURCE_CLAIMS);
    out
}

/// The fields `pod` sets that the live scheduler does not enforce, in [`ALL`] order.
pub fn detect_live(pod: &Pod) -> Vec<Unsupported> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let mut out = Vec::new();
    let container_claims = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        });
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) || container_claims {
        out.push(RESOURCE_CLAIMS);
    }
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
        detect_live(p).into_iter().map(|u| u.field).collect()
    }

    #[test]
    fn the_model_enforces_resource_claims_the_live_loop_does_not() {
        let p = pod(json!({"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]}));
        assert!(detect(&p).is_empty());
        assert_eq!(detect_live(&p), [RESOURCE_CLAIMS]);
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
        assert!(detect_live(&p).is_empty(), "{:?}", detect_live(&p));
        assert!(detect_live(&Pod::default()).is_empty());
    }

    #[test]
    fn each_unenforced_field_is_named() {
        assert_eq!(
            fields(&pod(
                json!({"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]})
            )),
            ["spec.resourceClaims"]
        );
        assert_eq!(
            fields(&pod(
                json!({"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]})
            )),
            ["spec.resourceClaims"]
        );
        assert_eq!(
            fields(&pod(
                json!({"containers": [], "schedulingGroup": {"podGroupName": "g"}})
            )),
            ["spec.schedulingGroup"]
        );
    }

    #[test]
    fn several_fields_are_reported_in_one_message_in_a_fixed_order() {
        let p = pod(json!({
            "containers": [],
            "schedulingGroup": {"podGroupName": "g"},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]
        }));
        let found = detect_live(&p);
        assert_eq!(
            found.iter().map(|u| u.field).collect::<Vec<_>>(),
            ["spec.resourceClaims", "spec.schedulingGroup"]
        );
        let m = message(&found);
        assert!(
            m.starts_with("not enforced by numaplane: spec.resourceClaims (DynamicResources"),
            "{m}"
        );
        assert!(m.contains("; spec.schedulingGroup (GangScheduling"), "{m}");
        assert!(ALL.iter().all(|u| u.field.starts_with("spec.")));
    }
}
