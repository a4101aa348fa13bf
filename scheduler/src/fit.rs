//! Node fit basics that every scheduler must apply, since pods that select numaplane bypass
//! kube-scheduler: resources, nodeName, nodeSelector, required node affinity, taints,
//! unschedulable nodes and the pod count. Reasons use kube-scheduler's wording so the
//! aggregate "0/N nodes are available" line reads the same.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, Taint, Toleration};

use crate::{
    pod::PodSpec,
    resources::{Dense, PODS, ResList, Resources},
};

/// Node-level state the fit checks read.
#[derive(Clone, Debug, Default)]
pub struct NodeBasics {
    /// Node name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Dense,
    /// Sum of effective requests of non-terminal pods bound to the node.
    pub requested: Dense,
    /// Number of non-terminal pods bound to the node.
    pub pod_count: i64,
}

/// A failed node-level check: aggregate category and the node's own message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitFailure {
    /// kube-scheduler style category, e.g. `Insufficient cpu`.
    pub category: String,
    /// Detail for this node.
    pub message: String,
}

fn fail(category: impl Into<String>, message: impl Into<String>) -> FitFailure {
    FitFailure {
        category: category.into(),
        message: message.into(),
    }
}

/// Runs every node-level check; returns all failures (empty = fits).
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

/// The checks behind [`check`] and [`fits`]: with `out`, records every failure; without, stops
/// at the first. Returns whether all passed.
fn run(
    res: &Resources,
    node: &NodeBasics,
    pod: &PodSpec,
    request: &ResList,
    mut out: Option<&mut Vec<FitFailure>>,
) -> bool {
    let mut ok = true;
    // Records a failure (built lazily); false means "stop, the caller only wants a yes/no".
    let mut failed = |f: &dyn Fn() -> FitFailure| -> bool {
        ok = false;
        match out.as_deref_mut() {
            Some(out) => {
                out.push(f());
                true
            }
            None => false,
        }
    };
    if let Some(want) = &pod.node_name
        && want != &node.name
    {
        failed(&|| {
            fail(
                "node(s) didn't match the requested node name",
                format!("pod requires node {want}"),
            )
        });
        return false;
    }
    if node.unschedulable
        && !tolerates_unschedulable(&pod.tolerations)
        && !failed(&|| {
            fail(
                "node(s) were unschedulable",
                "node is cordoned (spec.unschedulable)",
            )
        })
    {
        return false;
    }
    if (!selector_matches(&pod.node_selector, &node.labels)
        // hook (issue 19): required node affinity parsed once, with upstream's parse errors.
        || !pod.facts.node_affinity.matches(&node.name, &node.labels))
        && !failed(&|| {
            fail(
                "node(s) didn't match Pod's node affinity/selector",
                "node labels do not satisfy nodeSelector / required node affinity",
            )
        })
    {
        return false;
    }
    if let Some(t) = untolerated_taint(&node.taints, &pod.tolerations)
        && !failed(&|| {
            let value = t.value.as_deref().map(|v| format!(": {v}")).unwrap_or_default();
            fail(
                format!("node(s) had untolerated taint {{{}{value}}}", t.key),
                format!("taint {}{value}:{} is not tolerated", t.key, t.effect),
            )
        })
    {
        return false;
    }
    let max_pods = node.allocatable.get(PODS).unwrap_or(i64::MAX);
    if node.pod_count.saturating_add(1) > max_pods
        && !failed(&|| {
            fail(
                "Too many pods",
                format!("node runs {} of {max_pods} pods", node.pod_count),
            )
        })
    {
        return false;
    }
    for (id, want) in request.positive() {
        if id == PODS {
            continue;
        }
        let alloc = node.allocatable.get_or_zero(id);
        let used = node.requested.get_or_zero(id);
        // `used` sums requests of pods bound by anyone: saturated, never wrapped.
        let free = alloc.saturating_sub(used);
        if want > free
            && !failed(&|| {
                fail(
                    format!("Insufficient {}", res.name(id)),
                    format!(
                        "{} requested {} but only {} of {} is free",
                        res.name(id),
                        res.render(id, want),
                        res.render(id, free.max(0)),
                        res.render(id, alloc)
                    ),
                )
            })
        {
            return false;
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
        // hook (issue 19): as `ToleratesTaint`, an empty key with `Equal` compares values.
        "Equal" | "" => tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

fn selector_matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Required node affinity (hook, issue 19): component-helpers' `LazyErrorNodeSelector`, as
/// [`crate::constraints::nodeaffinity`] parses it.
pub fn affinity_matches(sel: &NodeSelector, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    crate::constraints::nodeaffinity::RequiredNodeAffinity::new(&BTreeMap::new(), Some(sel))
        .matches(node_name, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

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
