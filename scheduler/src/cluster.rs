//! The scheduler's in-memory cluster: an index fed by apply/delete/reset events (nodes, NRTs,
//! bound pods), the filter/score cycle over every node, and `assume`, which applies a placement
//! so the next pod sees it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::{nrt::NodeResourceTopology, quantity::Quantity};
use serde::Serialize;

use crate::{
    admission::{self, Placement, WorkingZones},
    allocation::{Allocation, ContainerAllocation, VERSION},
    fit::{self, NodeBasics},
    node::{NrtError, NumaTopology},
    pod::{PodError, PodSpec},
    resources::{Dense, PODS, ResList, Resources},
    score::Scorer,
};

/// What to do with nodes that publish no NRT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
pub enum NoTopology {
    /// Treat as Topology Manager policy `none` (kubelet admits on node-level fit).
    #[default]
    AssumeNone,
    /// Reject such nodes.
    Reject,
}

/// Scheduler configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Scoring.
    pub scorer: Scorer,
    /// Nodes without NRT.
    pub no_topology: NoTopology,
}

/// A node's topology as the index knows it.
#[derive(Clone, Debug)]
pub enum TopologyState {
    /// No NRT object.
    Missing,
    /// An NRT exists but cannot be used.
    Invalid {
        /// Human reason.
        reason: String,
        /// Bounded metric label.
        label: &'static str,
    },
    /// Usable topology.
    Valid(Box<NumaTopology>),
}

#[derive(Clone, Debug)]
struct BoundPod {
    node: String,
    request: ResList,
}

/// A node that could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The Node has no name.
    #[error("node without metadata.name")]
    MissingName,
    /// An allocatable quantity does not parse.
    #[error("node {node}: allocatable {resource}={value:?} is not a valid quantity")]
    ParseAllocatable {
        /// Node name.
        node: String,
        /// Resource.
        resource: String,
        /// As written.
        value: String,
    },
}

/// Counters of malformed input seen by the index (exported as metrics by the live scheduler).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Anomalies {
    /// Invalid NRTs by error label.
    pub invalid_nrt: BTreeMap<String, u64>,
    /// Pods that could not be modelled.
    pub invalid_pods: u64,
    /// Nodes that could not be indexed.
    pub invalid_nodes: u64,
}

/// The cluster index.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Interned resource names.
    pub res: Resources,
    nodes: BTreeMap<String, NodeBasics>,
    topologies: HashMap<String, TopologyState>,
    pods: HashMap<String, BoundPod>,
    /// Malformed input counters.
    pub anomalies: Anomalies,
}

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
    /// Aggregate categories (kube-scheduler style) when infeasible.
    #[serde(skip)]
    pub categories: Vec<String>,
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
    /// Per-node verdicts (sorted by node name).
    pub nodes: Vec<NodeVerdict>,
}

impl Cluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    // === index events ===

    /// Adds or replaces a Node.
    pub fn apply_node(&mut self, node: &Node) -> Result<(), NodeError> {
        let name = node.metadata.name.clone().ok_or(NodeError::MissingName)?;
        let mut allocatable = Dense::default();
        let status_alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        for (rname, q) in status_alloc.into_iter().flatten() {
            let bad = || NodeError::ParseAllocatable {
                node: name.clone(),
                resource: rname.clone(),
                value: q.0.clone(),
            };
            let parsed = Quantity::parse(&q.0).map_err(|_| bad())?;
            let id = self.res.intern(rname);
            allocatable.set(id, self.res.amount(id, &parsed).map_err(|_| bad())?);
        }
        let spec = node.spec.clone().unwrap_or_default();
        let existing = self.nodes.get(&name);
        let basics = NodeBasics {
            name: name.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable,
            requested: existing.map(|n| n.requested.clone()).unwrap_or_default(),
            pod_count: existing.map_or(0, |n| n.pod_count),
        };
        self.nodes.insert(name, basics);
        Ok(())
    }

    /// Removes a Node.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Adds or replaces an NRT; an invalid one is kept as [`TopologyState::Invalid`] so the
    /// node is rejected with the reason instead of silently treated as having no topology.
    pub fn apply_nrt(&mut self, nrt: &NodeResourceTopology) -> Result<(), NrtError> {
        let name = nrt.metadata.name.clone().unwrap_or_default();
        match NumaTopology::from_nrt(&mut self.res, nrt) {
            Ok(t) => {
                self.topologies.insert(name, TopologyState::Valid(Box::new(t)));
                Ok(())
            }
            Err(e) => {
                *self
                    .anomalies
                    .invalid_nrt
                    .entry(e.metric_label().to_owned())
                    .or_default() += 1;
                self.topologies.insert(
                    name,
                    TopologyState::Invalid {
                        reason: numaplane::error_chain(&e),
                        label: e.metric_label(),
                    },
                );
                Err(e)
            }
        }
    }

    /// Removes an NRT.
    pub fn delete_nrt(&mut self, name: &str) {
        self.topologies.remove(name);
    }

    /// Adds or replaces a pod. Bound, non-terminal pods count against their node.
    pub fn apply_pod(&mut self, pod: &Pod) -> Result<(), PodError> {
        let spec = match PodSpec::from_pod(&mut self.res, pod) {
            Ok(s) => s,
            Err(e) => {
                self.anomalies.invalid_pods += 1;
                return Err(e);
            }
        };
        let key = spec.key();
        self.delete_pod(&key);
        if let (Some(node), false) = (spec.node_name.clone(), spec.terminal) {
            let request = spec.effective_request();
            self.charge(&node, &request, 1);
            self.pods.insert(key, BoundPod { node, request });
        }
        Ok(())
    }

    /// Removes a pod by `namespace/name`.
    pub fn delete_pod(&mut self, key: &str) {
        if let Some(old) = self.pods.remove(key) {
            self.charge(&old.node, &old.request, -1);
        }
    }

    /// Replaces the whole state (a watch restart's initial list).
    pub fn reset(&mut self, nodes: &[Node], nrts: &[NodeResourceTopology], pods: &[Pod]) {
        self.nodes.clear();
        self.topologies.clear();
        self.pods.clear();
        for n in nodes {
            if self.apply_node(n).is_err() {
                self.anomalies.invalid_nodes += 1;
            }
        }
        for t in nrts {
            let _ = self.apply_nrt(t);
        }
        for p in pods {
            let _ = self.apply_pod(p);
        }
    }

    fn charge(&mut self, node: &str, request: &ResList, sign: i64) {
        let Some(n) = self.nodes.get_mut(node) else { return };
        for (id, v) in request.iter() {
            let cur = n.requested.get_or_zero(id);
            n.requested.set(id, cur + sign * v);
        }
        n.pod_count += sign;
    }

    /// Node names known to the index.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The topology state of `node`.
    pub fn topology(&self, node: &str) -> &TopologyState {
        self.topologies.get(node).unwrap_or(&TopologyState::Missing)
    }

    // === scheduling ===

    /// Evaluates `pod` on one node: node fit, then predicted kubelet admission.
    fn evaluate(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        request: &ResList,
        basics: &NodeBasics,
        explain: bool,
    ) -> NodeVerdict {
        let mut verdict = NodeVerdict {
            node: basics.name.clone(),
            feasible: false,
            score: None,
            reasons: vec![],
            categories: vec![],
        };
        let failures = fit::check(&self.res, basics, pod, request);
        if !failures.is_empty() {
            if explain {
                for f in failures {
                    verdict.categories.push(f.category);
                    verdict.reasons.push(f.message);
                }
            }
            return verdict;
        }
        self.topology_verdict_into(cfg, pod, &basics.name, explain, &mut verdict);
        verdict
    }

    /// The NUMA part of the filter alone (predicted kubelet admission from the node's NRT),
    /// without node-level fit: what the upstream NodeResourceTopologyMatch Filter decides,
    /// and what `kubectl numa why` style diagnostics want.
    pub fn topology_verdict(&self, cfg: &Config, pod: &PodSpec, node: &str) -> NodeVerdict {
        let mut verdict = NodeVerdict {
            node: node.to_owned(),
            feasible: false,
            score: None,
            reasons: vec![],
            categories: vec![],
        };
        self.topology_verdict_into(cfg, pod, node, true, &mut verdict);
        verdict
    }

    /// The score of `pod` on `node` alone (as upstream Score runs without Filter).
    pub fn score_node(&self, cfg: &Config, pod: &PodSpec, node: &str) -> i64 {
        match self.topology(node) {
            TopologyState::Valid(t) => cfg.scorer.score(&self.res, Some(t), pod),
            _ => cfg.scorer.score(&self.res, None, pod),
        }
    }

    fn topology_verdict_into(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        node: &str,
        explain: bool,
        verdict: &mut NodeVerdict,
    ) {
        match self.topology(node) {
            TopologyState::Missing => {
                if cfg.no_topology == NoTopology::Reject {
                    if explain {
                        verdict
                            .categories
                            .push("node(s) had no NodeResourceTopology".to_owned());
                        verdict
                            .reasons
                            .push("no NodeResourceTopology published for this node".to_owned());
                    }
                    return;
                }
                verdict.feasible = true;
                verdict.score = Some(cfg.scorer.score(&self.res, None, pod));
            }
            TopologyState::Invalid { reason, .. } => {
                if explain {
                    verdict
                        .categories
                        .push("node(s) had topology unknown or invalid".to_owned());
                    verdict
                        .reasons
                        .push(format!("topology unknown or invalid: {reason}"));
                }
            }
            TopologyState::Valid(topo) => {
                let mut w = WorkingZones::from_topology(topo);
                match admission::predict(&self.res, topo, &mut w, pod) {
                    Ok(_) => {
                        verdict.feasible = true;
                        verdict.score = Some(cfg.scorer.score(&self.res, Some(topo), pod));
                    }
                    Err(r) => {
                        if explain {
                            verdict.categories.push(r.category);
                            verdict.reasons.push(r.message);
                        }
                    }
                }
            }
        }
    }

    /// Filters and scores every node (no sampling) and picks the best: highest score, then
    /// lowest name, so the result is deterministic. Does not change the cluster.
    pub fn schedule(&self, cfg: &Config, pod: &PodSpec, explain: bool) -> Decision {
        let request = {
            let mut r = pod.effective_request();
            r.set(PODS, 1);
            r
        };
        let mut verdicts: Vec<NodeVerdict> = self
            .nodes
            .values()
            .map(|n| self.evaluate(cfg, pod, &request, n, explain))
            .collect();
        let best = verdicts
            .iter()
            .filter(|v| v.feasible)
            .max_by(|a, b| a.score.cmp(&b.score).then_with(|| b.node.cmp(&a.node)))
            .map(|v| v.node.clone());
        let Some(node) = best else {
            if !explain {
                return self.schedule(cfg, pod, true);
            }
            let message = aggregate_message(&verdicts);
            return Decision {
                pod: pod.key(),
                node: None,
                message,
                placement: None,
                allocation: None,
                nodes: verdicts,
            };
        };
        let (placement, allocation) = self.placement_on(pod, &node);
        if !explain {
            verdicts.retain(|v| v.feasible);
        }
        Decision {
            pod: pod.key(),
            message: format!("Successfully assigned {} to {node}", pod.key()),
            node: Some(node),
            placement,
            allocation,
            nodes: verdicts,
        }
    }

    fn placement_on(&self, pod: &PodSpec, node: &str) -> (Option<Placement>, Option<Allocation>) {
        let TopologyState::Valid(topo) = self.topology(node) else {
            return (None, None);
        };
        let mut w = WorkingZones::with_device_ids(topo);
        let Ok(p) = admission::predict(&self.res, topo, &mut w, pod) else {
            return (None, None);
        };
        let allocation = Allocation {
            version: VERSION.to_owned(),
            node: node.to_owned(),
            policy: topo.policy.to_string(),
            scope: topo.scope.to_string(),
            pod_numa_nodes: p.pod_numa_nodes.clone(),
            containers: p
                .containers
                .iter()
                .map(|c| ContainerAllocation {
                    name: c.name.clone(),
                    kind: c.kind,
                    numa_nodes: c.numa_nodes.clone(),
                    devices: c.devices.clone(),
                    device_counts: c.device_counts.clone(),
                })
                .collect(),
            nrt_fingerprint: topo.fingerprint.clone(),
        };
        (Some(p), Some(allocation))
    }

    /// Applies a decision: the pod is bound to the chosen node, its requests count against
    /// the node, and its exclusive resources and devices leave the node's zones.
    pub fn assume(&mut self, pod: &PodSpec, decision: &Decision) {
        let Some(node) = decision.node.clone() else { return };
        if let Some(TopologyState::Valid(topo)) = self.topologies.get_mut(&node) {
            let mut w = WorkingZones::with_device_ids(topo);
            if admission::predict(&self.res, topo, &mut w, pod).is_ok() {
                let free = w.free_devices.unwrap_or_default();
                for (i, (z, avail)) in topo.zones.iter_mut().zip(w.available).enumerate() {
                    z.available = avail;
                    if let Some(f) = free.get(i) {
                        z.free_devices = f.clone();
                    }
                }
            }
        }
        let request = pod.effective_request();
        let key = pod.key();
        self.delete_pod(&key);
        self.charge(&node, &request, 1);
        self.pods.insert(key, BoundPod { node, request });
    }
}

/// `0/N nodes are available: 3 insufficient cpu on any single NUMA node, 2 node(s) had …`:
/// counts per category, sorted as strings, as kube-scheduler prints them.
pub fn aggregate_message(verdicts: &[NodeVerdict]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in verdicts.iter().filter(|v| !v.feasible) {
        let mut cats: Vec<&str> = v.categories.iter().map(String::as_str).collect();
        cats.sort_unstable();
        cats.dedup();
        for c in cats {
            *counts.entry(c).or_default() += 1;
        }
    }
    let mut parts: Vec<String> = counts.iter().map(|(c, n)| format!("{n} {c}")).collect();
    parts.sort();
    let available = verdicts.iter().filter(|v| v.feasible).count();
    if parts.is_empty() {
        format!("{available}/{} nodes are available.", verdicts.len())
    } else {
        format!(
            "{available}/{} nodes are available: {}.",
            verdicts.len(),
            parts.join(", ")
        )
    }
}
