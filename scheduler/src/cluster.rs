//! The scheduler's in-memory cluster: an index fed by apply/delete/reset events (nodes, NRTs,
//! bound pods), the filter/score cycle over every node, and `assume`, which applies a placement
//! so the next pod sees it. Unexplained scheduling reuses per-node verdicts across pods of the
//! same shape (`cache.rs`); explained scheduling evaluates every node afresh.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{OnceLock, TryLockError},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::{nrt::NodeResourceTopology, quantity::Quantity};
use serde::Serialize;

use crate::{
    admission::{self, Placement, WorkingZones},
    allocation::{Allocation, ContainerAllocation, VERSION},
    cache::{Entry, ShapeKey, Shapes, VerdictCache},
    fit::{self, NodeBasics},
    node::{NrtError, NumaTopology},
    pod::{PodError, PodSpec},
    resources::{Dense, PODS, ResList, Resources},
    score::Scorer,
};

/// What to do with nodes that publish no NRT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, Serialize)]
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
///
/// Nodes live in slots (stable indexes, reused after a delete) so the scheduling scan walks
/// plain vectors; `order` lists the occupied slots by node name, the scan and tie-break order.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Interned resource names.
    pub res: Resources,
    /// Node name → slot.
    index: HashMap<String, usize>,
    /// Node state by slot; `None` for a free slot.
    slots: Vec<Option<NodeBasics>>,
    free_slots: Vec<usize>,
    /// Occupied slots sorted by node name.
    order: Vec<usize>,
    /// Per slot, renewed on every change of what a verdict reads (node, NRT, bound pods);
    /// never reused, so a cached verdict of a deleted node cannot match its successor.
    generations: Vec<u64>,
    last_generation: u64,
    topologies: HashMap<String, TopologyState>,
    pods: HashMap<String, BoundPod>,
    /// Malformed input counters.
    pub anomalies: Anomalies,
    verdicts: VerdictCache,
}

/// Below this many nodes to evaluate, a second thread costs more than it saves.
const PARALLEL_MIN: usize = 64;

/// Available cores, asked once: the query reads cgroup files, too slow for every pod.
fn parallelism() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
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
    /// Per-node verdicts, sorted by node name: every node's when explained (and whenever no
    /// node fits), else only the chosen node's.
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
        let existing = self.index.get(&name).and_then(|&i| self.slots[i].as_ref());
        let basics = NodeBasics {
            name: name.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable,
            requested: existing.map(|n| n.requested.clone()).unwrap_or_default(),
            pod_count: existing.map_or(0, |n| n.pod_count),
        };
        let slot = match self.index.get(&name) {
            Some(&slot) => slot,
            None => self.new_slot(&name),
        };
        self.slots[slot] = Some(basics);
        self.touch(slot);
        Ok(())
    }

    /// A slot for a new node, placed in `order` by name.
    fn new_slot(&mut self, name: &str) -> usize {
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.generations.push(0);
            self.slots.len() - 1
        });
        let at = self
            .order
            .partition_point(|&s| self.slots[s].as_ref().is_some_and(|n| n.name.as_str() < name));
        self.order.insert(at, slot);
        self.index.insert(name.to_owned(), slot);
        slot
    }

    /// Marks `slot` changed: cached verdicts of it no longer apply.
    fn touch(&mut self, slot: usize) {
        self.last_generation += 1;
        self.generations[slot] = self.last_generation;
    }

    /// [`Self::touch`] by node name, if the node is indexed.
    fn touch_name(&mut self, name: &str) {
        if let Some(&slot) = self.index.get(name) {
            self.touch(slot);
        }
    }

    /// Removes a Node.
    pub fn delete_node(&mut self, name: &str) {
        let Some(slot) = self.index.remove(name) else {
            return;
        };
        self.slots[slot] = None;
        self.order.retain(|&s| s != slot);
        self.free_slots.push(slot);
        self.touch(slot);
    }

    /// Adds or replaces an NRT; an invalid one is kept as [`TopologyState::Invalid`] so the
    /// node is rejected with the reason instead of silently treated as having no topology.
    pub fn apply_nrt(&mut self, nrt: &NodeResourceTopology) -> Result<(), NrtError> {
        let name = nrt.metadata.name.clone().unwrap_or_default();
        match NumaTopology::from_nrt(&mut self.res, nrt) {
            Ok(t) => {
                self.touch_name(&name);
                self.topologies.insert(name, TopologyState::Valid(Box::new(t)));
                Ok(())
            }
            Err(e) => {
                *self
                    .anomalies
                    .invalid_nrt
                    .entry(e.metric_label().to_owned())
                    .or_default() += 1;
                self.touch_name(&name);
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
        self.touch_name(name);
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
        self.index.clear();
        self.slots.clear();
        self.free_slots.clear();
        self.order.clear();
        self.generations.clear();
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
        let Some(&slot) = self.index.get(node) else { return };
        let Some(n) = self.slots[slot].as_mut() else {
            return;
        };
        for (id, v) in request.iter() {
            let cur = n.requested.get_or_zero(id);
            n.requested.set(id, cur + sign * v);
        }
        n.pod_count += sign;
        self.touch(slot);
    }

    /// Nodes in name order.
    fn nodes(&self) -> impl Iterator<Item = &NodeBasics> {
        self.order.iter().filter_map(|&s| self.slots[s].as_ref())
    }

    /// Node names known to the index, sorted.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes().map(|n| n.name.as_str())
    }

    /// The topology state of `node`.
    pub fn topology(&self, node: &str) -> &TopologyState {
        self.topologies.get(node).unwrap_or(&TopologyState::Missing)
    }

    // === scheduling ===

    /// The verdict of `pod` on one node without messages (what the cache holds): the score
    /// when feasible. The checks of [`Self::evaluate`] and [`Self::topology_verdict_into`],
    /// with `w` as reusable working space.
    fn judge(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        request: &ResList,
        basics: &NodeBasics,
        w: &mut WorkingZones,
    ) -> Option<i64> {
        if !fit::fits(&self.res, basics, pod, request) {
            return None;
        }
        match self.topology(&basics.name) {
            TopologyState::Missing => {
                (cfg.no_topology != NoTopology::Reject).then(|| cfg.scorer.score(&self.res, None, pod))
            }
            TopologyState::Invalid { .. } => None,
            TopologyState::Valid(topo) => {
                w.reset_from(topo);
                admission::admits(&self.res, topo, w, pod)
                    .then(|| cfg.scorer.score(&self.res, Some(topo), pod))
            }
        }
    }

    /// [`Self::judge`] for each slot of `slots`, on two threads when there are many.
    fn judge_slots(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        request: &ResList,
        slots: &[usize],
    ) -> Vec<Option<i64>> {
        let run = |part: &[usize]| -> Vec<Option<i64>> {
            let mut w = WorkingZones::default();
            part.iter()
                .map(|&s| {
                    self.slots[s]
                        .as_ref()
                        .and_then(|n| self.judge(cfg, pod, request, n, &mut w))
                })
                .collect()
        };
        if slots.len() < PARALLEL_MIN || parallelism() < 2 {
            return run(slots);
        }
        let (first, second) = slots.split_at(slots.len() / 2);
        std::thread::scope(|scope| {
            let other = scope.spawn(|| run(second));
            let mut out = run(first);
            // A panicking helper is re-run here, so its panic surfaces on this thread.
            out.extend(other.join().unwrap_or_else(|_| run(second)));
            out
        })
    }

    /// Filters and scores every node (no sampling) through the verdict cache, re-evaluating
    /// the nodes changed since their entry was made, and returns the best slot and score:
    /// highest score, then lowest name.
    fn best_cached(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        request: &ResList,
        shapes: &mut Shapes,
    ) -> Option<(usize, i64)> {
        let entries = shapes.entries(ShapeKey::of(cfg, pod), self.slots.len());
        // One pass: the best valid entry, and the stale slots with their position in name
        // order; the best is the highest score, then the lowest position.
        let mut best: Option<(i64, usize)> = None;
        let mut consider = |score: Option<i64>, position: usize| {
            if let Some(score) = score
                && best.is_none_or(|(b, p)| score > b || (score == b && position < p))
            {
                best = Some((score, position));
            }
        };
        let (mut stale, mut positions) = (Vec::new(), Vec::new());
        for (position, &slot) in self.order.iter().enumerate() {
            let entry = entries[slot];
            if entry.generation == self.generations[slot] {
                consider(entry.score, position);
            } else {
                stale.push(slot);
                positions.push(position);
            }
        }
        let fresh = self.judge_slots(cfg, pod, request, &stale);
        for ((&slot, &position), score) in stale.iter().zip(&positions).zip(fresh) {
            entries[slot] = Entry {
                generation: self.generations[slot],
                score,
            };
            consider(score, position);
        }
        best.map(|(score, position)| (self.order[position], score))
    }

    /// [`Self::best_cached`] without the cache (when another thread holds it).
    fn best_uncached(&self, cfg: &Config, pod: &PodSpec, request: &ResList) -> Option<(usize, i64)> {
        let mut best: Option<(usize, i64)> = None;
        for (&slot, score) in self
            .order
            .iter()
            .zip(self.judge_slots(cfg, pod, request, &self.order))
        {
            if let Some(score) = score
                && best.is_none_or(|(_, b)| score > b)
            {
                best = Some((slot, score));
            }
        }
        best
    }

    /// Runs `f` with the verdict cache, or with `None` when another thread is using it.
    fn with_cache<T>(&self, f: impl FnOnce(Option<&mut Shapes>) -> T) -> T {
        match self.verdicts.0.try_lock() {
            Ok(mut shapes) => f(Some(&mut shapes)),
            Err(TryLockError::Poisoned(p)) => {
                // A panic mid-scan may have left entries half written: start over.
                let mut shapes = p.into_inner();
                *shapes = Shapes::default();
                self.verdicts.0.clear_poison();
                f(Some(&mut shapes))
            }
            Err(TryLockError::WouldBlock) => f(None),
        }
    }

    /// Every node's verdict (score when feasible, no reasons), in name order, as the cached
    /// fast path of [`Self::schedule`] sees them; `explain = true` gives the uncached ones.
    pub fn quick_verdicts(&self, cfg: &Config, pod: &PodSpec) -> Vec<NodeVerdict> {
        let request = Self::schedule_request(pod);
        let scores: Vec<Option<i64>> = self.with_cache(|shapes| match shapes {
            Some(shapes) => {
                self.best_cached(cfg, pod, &request, shapes);
                let entries = shapes.entries(ShapeKey::of(cfg, pod), self.slots.len());
                self.order.iter().map(|&s| entries[s].score).collect()
            }
            None => self.judge_slots(cfg, pod, &request, &self.order),
        });
        self.nodes()
            .zip(scores)
            .map(|(n, score)| NodeVerdict {
                node: n.name.clone(),
                feasible: score.is_some(),
                score,
                reasons: vec![],
                categories: vec![],
            })
            .collect()
    }

    /// The request node fit checks: the effective request plus one pod.
    fn schedule_request(pod: &PodSpec) -> ResList {
        let mut r = pod.effective_request();
        r.set(PODS, 1);
        r
    }

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
    /// lowest name, so the result is deterministic. Does not change the cluster (only its
    /// verdict cache).
    ///
    /// With `explain`, every node is evaluated afresh and `nodes` holds every node's verdict
    /// with reasons. Without, verdicts come from the cache (recomputed for nodes changed since)
    /// and `nodes` holds only the chosen node's verdict; [`Self::quick_verdicts`] gives all of
    /// them. When no node fits, the result is the explained one either way.
    pub fn schedule(&self, cfg: &Config, pod: &PodSpec, explain: bool) -> Decision {
        let request = Self::schedule_request(pod);
        if !explain {
            let best = self.with_cache(|shapes| match shapes {
                Some(shapes) => self.best_cached(cfg, pod, &request, shapes),
                None => self.best_uncached(cfg, pod, &request),
            });
            let chosen =
                best.and_then(|(slot, score)| Some((self.slots[slot].as_ref()?.name.clone(), score)));
            let Some((node, score)) = chosen else {
                return self.schedule(cfg, pod, true);
            };
            let (placement, allocation) = self.placement_on(pod, &node);
            return Decision {
                pod: pod.key(),
                message: format!("Successfully assigned {} to {node}", pod.key()),
                nodes: vec![NodeVerdict {
                    node: node.clone(),
                    feasible: true,
                    score: Some(score),
                    reasons: vec![],
                    categories: vec![],
                }],
                node: Some(node),
                placement,
                allocation,
            };
        }
        let verdicts: Vec<NodeVerdict> = self
            .nodes()
            .map(|n| self.evaluate(cfg, pod, &request, n, explain))
            .collect();
        let best = verdicts
            .iter()
            .filter(|v| v.feasible)
            .max_by(|a, b| a.score.cmp(&b.score).then_with(|| b.node.cmp(&a.node)))
            .map(|v| v.node.clone());
        let Some(node) = best else {
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
                let mut free = w.free_devices.unwrap_or_default().into_iter();
                for (z, avail) in topo.zones.iter_mut().zip(w.available) {
                    z.available = avail;
                    if let Some(f) = free.next() {
                        z.free_devices = f;
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
