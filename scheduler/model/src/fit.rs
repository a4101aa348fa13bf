//! Node fit basics that every scheduler must apply, since pods that select numaplane bypass
//! kube-scheduler: unschedulable nodes, nodeName, taints, nodeSelector and required node
//! affinity, the pod count and resources, checked in kube-scheduler's plugin order ([`Filter`])
//! and reported in its v1.36 wording, so the aggregate "0/N nodes are available" line reads the
//! same.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::{
    node::NodeBasics,
    pod::PodSpec,
    resources::{PODS, ResList, Resources},
};

/// kube-scheduler's Filter plugins that the model runs, in the order of its default profile
/// (v1.36), with numaplane's NUMA filter (the NodeResourceTopology plugin) after them.
/// kube-scheduler stops at a node's first failing plugin, so the "0/N nodes are available"
/// line counts each node under that plugin's reasons only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Filter {
    /// `spec.unschedulable` without the matching toleration.
    NodeUnschedulable,
    /// `spec.nodeName` names another node.
    NodeName,
    /// An untolerated `NoSchedule`/`NoExecute` taint.
    TaintToleration,
    /// `nodeSelector` and required node affinity.
    NodeAffinity,
    /// Host ports in use.
    NodePorts,
    /// The pod count and the node's allocatable resources.
    NodeResourcesFit,
    /// In-tree disks and `ReadWriteOncePod` claims in use.
    VolumeRestrictions,
    /// PersistentVolumeClaims that cannot be bound or used on the node.
    VolumeBinding,
    /// Bound volumes' zone labels.
    VolumeZone,
    /// `DoNotSchedule` topology spread constraints.
    PodTopologySpread,
    /// Required pod affinity and anti-affinity.
    InterPodAffinity,
    /// Resource claims the allocator cannot satisfy on the node (DynamicResources).
    DynamicResources,
    /// Predicted kubelet Topology Manager admission from the node's NRT.
    NumaTopology,
}

/// A failed node-level check: the plugin, aggregate category and the node's own message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitFailure {
    /// The plugin that failed.
    pub filter: Filter,
    /// kube-scheduler style category, e.g. `Insufficient cpu`.
    pub category: String,
    /// Detail for this node.
    pub message: String,
}

fn fail(filter: Filter, category: impl Into<String>, message: impl Into<String>) -> FitFailure {
    FitFailure {
        filter,
        category: category.into(),
        message: message.into(),
    }
}

/// kube-scheduler's TaintToleration reason (v1.36: the taint itself is no longer named).
pub const UNTOLERATED_TAINT: &str = "node(s) had untolerated taint(s)";

/// Runs the node-level checks in kube-scheduler's plugin order and returns the failures of the
/// first plugin that fails (several only for NodeResourcesFit, one per insufficient resource),
/// as kube-scheduler reports a node; empty = fits.
pub fn check(res: &Resources, node: &NodeBasics, pod: &PodSpec, request: &ResList) -> Vec<FitFailure> {
    let mut out = Vec::new();
    run(res, node, pod, request, Some(&mut out));
    out
}

/// Whether every node-level check passes: [`check`] without building messages, stopping at
/// the first failure (the scheduling hot path).
pub fn fits(res: &Resources, node: &NodeBasics, pod: &PodSpec, request: &ResList) -> bool {
    run(res, node, pod, request, None)
}

/// The checks behind [`check`] and [`fits`]: with `out`, records the first failing plugin's
/// failures; without, stops at the first failure. Returns whether all passed.
fn run(
    res: &Resources,
    node: &NodeBasics,
    pod: &PodSpec,
    request: &ResList,
    mut out: Option<&mut Vec<FitFailure>>,
) -> bool {
    let explain = out.is_some();
    let mut record = |f: &dyn Fn() -> FitFailure| {
        if let Some(out) = out.as_deref_mut() {
            out.push(f());
        }
    };
    if node.unschedulable && !tolerates_unschedulable(&pod.tolerations) {
        record(&|| {
            fail(
                Filter::NodeUnschedulable,
                "node(s) were unschedulable",
                "node is cordoned (spec.unschedulable)",
            )
        });
        return false;
    }
    if let Some(want) = &pod.node_name
        && want != &node.name
    {
        record(&|| {
            fail(
                Filter::NodeName,
                "node(s) didn't match the requested node name",
                format!("pod requires node {want}"),
            )
        });
        return false;
    }
    if let Some(t) = untolerated_taint(&node.taints, &pod.tolerations) {
        record(&|| {
            let value = t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default();
            fail(
                Filter::TaintToleration,
                UNTOLERATED_TAINT,
                format!("taint {}{value}:{} is not tolerated", t.key, t.effect),
            )
        });
        return false;
    }
    if !selector_matches(&pod.node_selector, &node.labels)
        // Required node affinity parsed once, with upstream's parse errors.
        || !pod.facts.node_affinity.matches(&node.name, &node.labels)
    {
        record(&|| {
            fail(
                Filter::NodeAffinity,
                "node(s) didn't match Pod's node affinity/selector",
                "node labels do not satisfy nodeSelector / required node affinity",
            )
        });
        return false;
    }
    // NodeResourcesFit reports every insufficient resource of the node, the pod count first.
    let mut ok = true;
    let max_pods = node.allocatable.get(PODS).unwrap_or(i64::MAX);
    if node.pod_count.saturating_add(1) > max_pods {
        ok = false;
        if !explain {
            return false;
        }
        record(&|| {
            fail(
                Filter::NodeResourcesFit,
                "Too many pods",
                format!("node runs {} of {max_pods} pods", node.pod_count),
            )
        });
    }
    for (id, want) in request.positive() {
        if id == PODS {
            continue;
        }
        let alloc = node.allocatable.get_or_zero(id);
        let used = node.requested.get_or_zero(id);
        // `used` sums requests of pods bound by anyone: saturated, never wrapped.
        let free = alloc.saturating_sub(used);
        if want > free {
            ok = false;
            if !explain {
                return false;
            }
            record(&|| {
                fail(
                    Filter::NodeResourcesFit,
                    format!("Insufficient {}", res.name(id)),
                    format!(
                        "{} requested {} but only {} of {} is free",
                        res.name(id),
                        res.render(id, want),
                        res.render(id, free.max(0)),
                        res.render(id, alloc)
                    ),
                )
            });
        }
    }
    ok
}

fn tolerates_unschedulable(tolerations: &[Toleration]) -> bool {
    let taint = Taint {
        key: "node.kubernetes.io/unschedulable".to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    };
    tolerations.iter().any(|t| tolerates(t, &taint))
}

/// The first NoSchedule/NoExecute taint no toleration matches.
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Kubernetes `Toleration.ToleratesTaint`.
pub fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = tol.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = tol.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        // As `ToleratesTaint`, an empty key with `Equal` compares values.
        "Equal" | "" => tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

fn selector_matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub use crate::nodeaffinity::affinity_matches;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelector;

    fn tol(json: serde_json::Value) -> Toleration {
        serde_json::from_value(json).expect("toleration")
    }

    #[test]
    fn tolerations() {
        let taint = Taint {
            key: "gpu".into(),
            value: Some("yes".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        assert!(tolerates(
            &tol(serde_json::json!({"key": "gpu", "operator": "Equal", "value": "yes"})),
            &taint
        ));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": "gpu", "value": "no"})),
            &taint
        ));
        assert!(tolerates(&tol(serde_json::json!({"operator": "Exists"})), &taint));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"})),
            &taint
        ));
        let pref = Taint {
            effect: "PreferNoSchedule".into(),
            ..taint.clone()
        };
        assert!(untolerated_taint(&[pref], &[]).is_none());
        assert!(untolerated_taint(std::slice::from_ref(&taint), &[]).is_some());
    }

    #[test]
    fn affinity_operators() {
        let sel: NodeSelector = serde_json::from_value(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                  {"key": "cores", "operator": "Gt", "values": ["16"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
        ]}))
        .expect("selector");
        let labels = |z: &str, c: &str| {
            BTreeMap::from([
                ("zone".to_owned(), z.to_owned()),
                ("cores".to_owned(), c.to_owned()),
            ])
        };
        assert!(affinity_matches(&sel, "n1", &labels("a", "32")));
        assert!(!affinity_matches(&sel, "n1", &labels("c", "32")));
        assert!(!affinity_matches(&sel, "n1", &labels("a", "8")));
        assert!(affinity_matches(&sel, "special", &BTreeMap::new()));
    }
}
