//! What scheduling one pod produces: every node's verdict and the decision, as the front ends
//! (`simulate`, the extender, the live scheduler, `kubectl numa explain`) report them. Its own
//! module, below the cluster index that computes it, so that the gates and the volume rules can
//! speak of a decision without importing the index.

use numaplane::allocation::Allocation;
use serde::Serialize;

use crate::{admission::Placement, fit::Filter, pod::PodSpec};

/// One node's verdict for one pod.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    /// Node name.
    pub node: String,
    /// The pod can run there (fit and predicted kubelet admission).
    pub feasible: bool,
    /// Score when feasible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<i64>,
    /// Human reasons when infeasible.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The reason the kubelet would reject the pod with, were it bound here anyway
    /// (`TopologyAffinityError`, `UnexpectedAdmissionError`, `SMTAlignmentError`,
    /// `OutOf<resource>`), when infeasible and explained; absent when the kubelet would not be
    /// the one to refuse it (taints, affinity, volumes, no NRT).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_reason: Option<Box<str>>,
    /// Why the model's prediction for this node is approximate: kubelet options it cannot
    /// predict (`kubelet option align-by-socket=true: …`); empty when it is exact.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub approximate: Box<[String]>,
    /// Aggregate categories (kube-scheduler style) when infeasible: the reasons of the first
    /// plugin that rejects the node, as kube-scheduler counts it.
    #[serde(skip)]
    pub categories: Vec<String>,
    /// That plugin, when infeasible and explained.
    #[serde(skip)]
    pub filter: Option<Filter>,
}

/// The outcome of scheduling one pod.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// `namespace/name`.
    pub pod: String,
    /// Chosen node, if any.
    pub node: Option<String>,
    /// kube-scheduler style message: `Successfully assigned …` or `0/N nodes are available: …`.
    pub message: String,
    /// Predicted placement on the chosen node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The annotation value recorded on the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation: Option<Allocation>,
    /// Per-node verdicts, sorted by node name: every node's when explained (and whenever no
    /// node fits), else only the chosen node's.
    pub nodes: Vec<NodeVerdict>,
}

/// The decision for a pod that a PreFilter rejects everywhere (its volumes fit nowhere):
/// kube-scheduler's PreFilter message (`0/N nodes are available: <reason>.`, the reason once,
/// not per node), every node rejected with it.
pub fn blocked_decision<'a>(pod: &PodSpec, reason: &str, nodes: impl Iterator<Item = &'a str>) -> Decision {
    let verdicts: Vec<NodeVerdict> = nodes
        .map(|n| NodeVerdict {
            node: n.to_owned(),
            kubelet_reason: None,
            approximate: Box::default(),
            feasible: false,
            score: None,
            reasons: vec![reason.to_owned()],
            categories: vec![reason.to_owned()],
            filter: None,
        })
        .collect();
    Decision {
        pod: pod.key(),
        node: None,
        message: format!("0/{} nodes are available: {reason}.", verdicts.len()),
        placement: None,
        allocation: None,
        nodes: verdicts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_decisions_carry_the_reason_once() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .expect("pod");
        let p = PodSpec::from_pod(&mut crate::resources::Resources::default(), &pod).expect("a pod");
        let d = blocked_decision(
            &p,
            "persistentvolumeclaim \"c\" not found",
            ["a", "b"].into_iter(),
        );
        assert_eq!(
            d.message,
            "0/2 nodes are available: persistentvolumeclaim \"c\" not found."
        );
        assert_eq!(d.pod, "ns/web-0");
        assert_eq!(d.nodes.len(), 2);
        assert!(
            d.nodes
                .iter()
                .all(|v| !v.feasible && v.categories == [v.reasons[0].clone()])
        );
    }
}
