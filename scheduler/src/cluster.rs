//! The scheduler's in-memory cluster: an index fed by apply/delete/reset events (nodes, NRTs,
//! bound pods), the filter/score cycle over every node, and `assume`, which applies a placement
//! so the next pod sees it. Unexplained scheduling reuses per-node verdicts across pods of the
//! same shape (`cache.rs`); explained scheduling evaluates every node afresh.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{OnceLock, TryLockError},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::{nrt::NodeResourceTopology, quantity::Quantity};
use serde::Serialize;

use crate::{
    admission::{self, Placement, WorkingZones},
    allocation::{Allocation, ContainerAllocation, VERSION},
    cache::{Entry, ShapeKey, Shapes, UNKNOWN_FAILURE, VerdictCache},
    fit::{self, NodeBasics},
    node::{NrtError, NumaTopology},
    pod::{PodError, PodSpec, Qos},
    prepared::PreparedPod,
    resources::{Dense, ResId, ResKind, ResList, Resources},
};

pub use crate::config::{Config, NoTopology};

// hook (issue 19): kube-scheduler's constraint plugins on the decision path.
mod constrained;

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
    /// The pod's UID: a pod deleted and recreated under its name is another pod, and what
    /// happens to one (a late Binding failure) must not end the other's placement.
    uid: Option<String>,
    request: ResList,
    /// Phase `Pending`: the kubelet may not have admitted it yet, so a node's NRT may or may
    /// not count it (the uncertain pods of [`Cluster::reconcile`]).
    starting: bool,
    /// Guaranteed with an integral cpu or a memory/hugepages request in an app or sidecar
    /// container: exclusive on every node (fingerprint method `with-exclusive-resources`).
    guaranteed_exclusive: bool,
    /// Extended resources its app and sidecar containers request: exclusive where the node's
    /// zones list them.
    extended: Vec<ResId>,
    /// Charged by [`Cluster::assume_at`] and not yet seen bound by the pod watch: a failed
    /// binding undoes it.
    assumed_only: bool,
    /// When the API server accepted the Binding of an `assumed_only` pod (caller's clock); `None`
    /// while it is in flight. A relist that started later and does not show the pod means the
    /// pod is gone; one that started earlier may simply predate the Binding.
    bound_at_ms: Option<u64>,
    /// Device IDs its allocation record (or our assumption) names for its node, per
    /// resource: for cluster-shared resources they are kept off every other node.
    claims: Claims,
}

/// Device IDs per resource that one pod holds or is about to hold.
type Claims = Vec<(ResId, Vec<String>)>;

impl BoundPod {
    fn new(res: &Resources, spec: &PodSpec, node: String, starting: bool) -> Self {
        // Ordinary init containers are left out: they finish before the kubelet reports the
        // pod, as the exporter's fingerprint does (nrt-scheduling §5).
        let containers = || {
            spec.init_containers
                .iter()
                .filter(|c| c.sidecar)
                .chain(&spec.containers)
        };
        let guaranteed_exclusive = spec.qos == Qos::Guaranteed
            && containers().any(|c| {
                c.requests.positive().any(|(id, _)| {
                    (res.kind(id) == ResKind::Cpu && c.integer_cpu) || res.kind(id).is_memory_like()
                })
            });
        let mut extended: Vec<ResId> = containers()
            .flat_map(|c| c.requests.positive().map(|(id, _)| id))
            .filter(|&id| res.kind(id) == ResKind::Extended)
            .collect();
        extended.sort_unstable();
        extended.dedup();
        BoundPod {
            node,
            uid: spec.uid.clone(),
            request: spec.effective_request(),
            starting,
            guaranteed_exclusive,
            extended,
            assumed_only: false,
            bound_at_ms: None,
            claims: Vec::new(),
        }
    }

    /// Whether the node's exporter counts this pod under `method` `with-exclusive-resources`.
    fn has_exclusive(&self, topo: &NumaTopology) -> bool {
        self.guaranteed_exclusive || self.extended.iter().any(|&id| topo.lists(id))
    }
}

/// A placement this scheduler made that the node's NRT does not show yet: what it took from
/// which zone, so it can be taken again from every newer NRT until that NRT shows the pod.
#[derive(Clone, Debug)]
pub struct Assumption {
    /// Node the pod was placed on.
    pub node: String,
    /// UID of the pod placed (the key is its name, which a recreated pod shares).
    pub uid: Option<String>,
    /// Caller's clock (milliseconds) when the placement was assumed.
    pub since_ms: u64,
    /// Amounts taken, per zone id.
    taken: Vec<(u32, ResList)>,
    /// Device IDs taken, per zone id and resource.
    devices: Vec<(u32, ResId, Vec<String>)>,
    /// Devices without a NUMA node taken, per resource: how many, and which of the listed IDs.
    unaligned: Vec<(ResId, i64, Vec<String>)>,
    /// The Static memory manager's groups the placement forms, by NUMA id, in allocation
    /// order (a later one replaces an earlier one's nodes, as the kubelet's `Cells`): known to
    /// the next decision before the exporter publishes them (`numaplane.io/memory-groups`).
    /// Multi-node groups always; a single node only if its allocations were known or no memory
    /// was in use there (else an unknown earlier allocation there, maybe of a group whose first
    /// node it used up, would pass for known and the model would stop suspecting it).
    memory_groups: Vec<Vec<u32>>,
}

/// How assumptions ended, counted for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AssumptionStats {
    /// The node's NRT fingerprint showed the kubelet accounted for the pod.
    pub confirmed: u64,
    /// Timed out before any NRT showed the pod.
    pub expired: u64,
    /// The pod was deleted, finished or bound elsewhere.
    pub gone: u64,
    /// Dropped by the scheduler (failed binding).
    pub forgotten: u64,
}

/// At most this many uncertain pods per node are tried when matching a fingerprint
/// (2^N subsets); beyond it the newest assumptions are kept until the next NRT or expiry.
const MAX_UNCERTAIN: usize = 10;

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
    /// Bound pods whose allocation record does not parse (their devices are not claimed).
    pub invalid_records: u64,
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
    /// Effective topology per node: the published one minus the pending assumptions.
    topologies: HashMap<String, TopologyState>,
    /// Valid topologies as published, before assumptions.
    published: HashMap<String, NumaTopology>,
    pods: HashMap<String, BoundPod>,
    /// Pod keys per node name (bound, non-terminal).
    node_pods: HashMap<String, BTreeSet<String>>,
    /// Pending assumptions by pod key.
    assumed: HashMap<String, Assumption>,
    /// Per cluster-shared resource, the nodes whose NRT publishes it.
    shared_nodes: HashMap<ResId, BTreeSet<String>>,
    /// Per device resource, the IDs each bound pod claims (pod key → node, IDs).
    claims: HashMap<ResId, BTreeMap<String, (String, Vec<String>)>>,
    /// How assumptions ended.
    pub assumption_stats: AssumptionStats,
    /// Malformed input counters.
    pub anomalies: Anomalies,
    verdicts: VerdictCache,
    /// hook (issue 19): pods' constraint facts, node labels and Namespaces.
    constraints: crate::constraints::ConstraintIndex,
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
        // A node new to the index starts with the pods already known bound to it: the pod
        // watch may have listed them before the node watch listed the node, or the node was
        // deleted and re-added under its name while they stayed bound.
        let (requested, pod_count) = match self.index.get(&name).and_then(|&i| self.slots[i].as_ref()) {
            Some(n) => (n.requested.clone(), n.pod_count),
            None => self.usage_of(&name),
        };
        let basics = NodeBasics {
            name: name.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable,
            requested,
            pod_count,
        };
        let slot = match self.index.get(&name) {
            Some(&slot) => slot,
            None => self.new_slot(&name),
        };
        self.constraints.set_node(&name, &basics.labels); // hook (issue 19)
        self.slots[slot] = Some(basics);
        self.touch(slot);
        Ok(())
    }

    /// What the pods known bound to `node` request together, and how many they are.
    fn usage_of(&self, node: &str) -> (Dense, i64) {
        let mut requested = Dense::default();
        let mut count = 0i64;
        for p in self
            .node_pods
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
        {
            for (id, v) in p.request.iter() {
                requested.set(id, requested.get_or_zero(id).saturating_add(v));
            }
            count = count.saturating_add(1);
        }
        (requested, count)
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

    /// Removes a Node. Its pods stay known (they are the pod watch's): if a node of that name
    /// comes back, they count against it again.
    pub fn delete_node(&mut self, name: &str) {
        let Some(slot) = self.index.remove(name) else {
            return;
        };
        self.constraints.delete_node(name); // hook (issue 19)
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
                let held = t.cluster_held.clone();
                let old = self.published.insert(name.clone(), t).map(|o| o.cluster_held);
                self.reconcile(&name);
                self.recompute(&name);
                self.set_shared(&name, old.unwrap_or_default(), &held);
                Ok(())
            }
            Err(e) => {
                let old = self.published.get(&name).map(|o| o.cluster_held.clone());
                self.set_shared(&name, old.unwrap_or_default(), &BTreeMap::new());
                *self
                    .anomalies
                    .invalid_nrt
                    .entry(e.metric_label().to_owned())
                    .or_default() += 1;
                self.touch_name(&name);
                self.published.remove(&name);
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
        let old = self.published.remove(name).map(|o| o.cluster_held);
        self.set_shared(name, old.unwrap_or_default(), &BTreeMap::new());
        self.touch_name(name);
    }

    /// Records which cluster-shared resources `node` publishes, with the IDs held there, and
    /// refreshes the other nodes sharing a resource whose held IDs changed. Call after
    /// `published` holds the node's new NRT (or none).
    fn set_shared(
        &mut self,
        node: &str,
        old: BTreeMap<ResId, Vec<String>>,
        new: &BTreeMap<ResId, Vec<String>>,
    ) {
        for rid in old.keys().filter(|r| !new.contains_key(r)) {
            if let Some(nodes) = self.shared_nodes.get_mut(rid) {
                nodes.remove(node);
                if nodes.is_empty() {
                    self.shared_nodes.remove(rid);
                }
            }
        }
        for rid in new.keys() {
            self.shared_nodes.entry(*rid).or_default().insert(node.to_owned());
        }
        // Unchanged held IDs need no refresh of the others (an NRT is republished often).
        if old == *new {
            return;
        }
        let changed: BTreeSet<ResId> = old
            .keys()
            .chain(new.keys())
            .copied()
            .filter(|r| old.get(r) != new.get(r))
            .collect();
        self.refresh_shared(&changed, node);
    }

    /// Recomputes every node sharing one of `rids`, except `except`.
    fn refresh_shared(&mut self, rids: &BTreeSet<ResId>, except: &str) {
        let nodes: BTreeSet<String> = rids
            .iter()
            .filter_map(|r| self.shared_nodes.get(r))
            .flatten()
            .filter(|n| n.as_str() != except)
            .cloned()
            .collect();
        for n in nodes {
            self.recompute(&n);
        }
    }

    /// Updates the claims index for `key` from `old` to `new` (node, claims) and refreshes the
    /// nodes sharing a resource whose claims changed.
    fn index_claims(&mut self, key: &str, old: Option<(String, Claims)>, new: Option<(String, Claims)>) {
        if old == new {
            return;
        }
        let mut changed: BTreeSet<ResId> = BTreeSet::new();
        if let Some((_, claims)) = &old {
            for (rid, _) in claims {
                if let Some(m) = self.claims.get_mut(rid) {
                    m.remove(key);
                    if m.is_empty() {
                        self.claims.remove(rid);
                    }
                }
                changed.insert(*rid);
            }
        }
        if let Some((node, claims)) = new {
            for (rid, ids) in claims {
                self.claims
                    .entry(rid)
                    .or_default()
                    .insert(key.to_owned(), (node.clone(), ids));
                changed.insert(rid);
            }
        }
        changed.retain(|r| self.shared_nodes.contains_key(r));
        if !changed.is_empty() {
            self.refresh_shared(&changed, "");
        }
    }

    /// IDs of cluster-shared resource `rid` that are not free for `node`: held on another node
    /// (its NRT) or claimed by a bound pod's record anywhere.
    fn taken_in_cluster(&self, rid: ResId, node: &str) -> BTreeSet<&str> {
        let mut out: BTreeSet<&str> = BTreeSet::new();
        for other in self.shared_nodes.get(&rid).into_iter().flatten() {
            if other != node
                && let Some(ids) = self.published.get(other).and_then(|t| t.cluster_held.get(&rid))
            {
                out.extend(ids.iter().map(String::as_str));
            }
        }
        // Claims on this node too: a pod bound here that the NRT does not show yet (after a
        // restart it has no assumption), or one the kubelet gave other slots than recorded,
        // keeps its planned slot off until it is gone. Under-use for a while, never over-use.
        for (_, ids) in self.claims.get(&rid).into_iter().flat_map(|m| m.values()) {
            out.extend(ids.iter().map(String::as_str));
        }
        out
    }

    /// Rebuilds the effective topology of `node`: the published one minus every pending
    /// assumption there.
    fn recompute(&mut self, node: &str) {
        let Some(base) = self.published.get(node) else {
            return;
        };
        let mut topo = base.clone();
        for key in self.node_pods.get(node).into_iter().flatten() {
            if let Some(a) = self.assumed.get(key).filter(|a| a.node == node) {
                take(&mut topo, a);
            }
        }
        for rid in base.cluster_held.keys() {
            let taken = self.taken_in_cluster(*rid, node);
            if !taken.is_empty() {
                strip(&mut topo, *rid, &taken);
            }
        }
        self.topologies
            .insert(node.to_owned(), TopologyState::Valid(Box::new(topo)));
        self.touch_name(node);
    }

    /// Releases the assumptions of `node` that its published NRT already shows.
    ///
    /// The NRT's pod-set fingerprint names the pods the kubelet reports. The known pods on the
    /// node are certain except those that may not be admitted yet (our pending assumptions
    /// and pods still `Pending`); the subset of those that makes the fingerprints equal is the
    /// set the kubelet has not reported yet, so the other assumptions are confirmed. No match
    /// (no fingerprint, or pods we do not know of) keeps every assumption: counting a pod twice
    /// for a while is safe, counting it never is not.
    fn reconcile(&mut self, node: &str) {
        let Some(topo) = self.published.get(node) else {
            return;
        };
        let Some(expected) = topo.fingerprint.as_deref() else {
            return;
        };
        let Some(keys) = self.node_pods.get(node) else {
            return;
        };
        let pending: Vec<&String> = keys
            .iter()
            .filter(|k| self.assumed.get(*k).is_some_and(|a| a.node == node))
            .collect();
        if pending.is_empty() {
            return;
        }
        let exclusive_only = topo.fingerprint_exclusive_only;
        let counted = |k: &String| {
            self.pods
                .get(k)
                .is_some_and(|p| !exclusive_only || p.has_exclusive(topo))
        };
        let mut certain = Vec::new();
        let mut uncertain: Vec<&String> = Vec::new();
        // Newest assumptions first, then pods still starting.
        let mut by_age = pending.clone();
        by_age.sort_by_key(|k| std::cmp::Reverse(self.assumed.get(*k).map_or(0, |a| a.since_ms)));
        for k in by_age {
            if counted(k) && uncertain.len() < MAX_UNCERTAIN {
                uncertain.push(k);
            }
        }
        for k in keys.iter().filter(|k| counted(k)) {
            if uncertain.contains(&k) {
                continue;
            }
            let starting = self.pods.get(k).is_some_and(|p| p.starting) && !self.assumed.contains_key(k);
            if starting && uncertain.len() < MAX_UNCERTAIN {
                uncertain.push(k);
            } else {
                certain.push(k);
            }
        }
        let hash = |k: &String| {
            let (ns, name) = k.split_once('/').unwrap_or(("", k));
            numaplane::fingerprint::pod_hash(ns, name)
        };
        let certain: Vec<u64> = certain.into_iter().map(hash).collect();
        let uncertain_hashes: Vec<u64> = uncertain.iter().map(|k| hash(k)).collect();
        // Fewest unreported pods first: the most that the NRT can have confirmed.
        let mut subsets: Vec<u32> = (0..(1u32 << uncertain.len())).collect();
        subsets.sort_by_key(|m| m.count_ones());
        let found = subsets.into_iter().find(|&missing| {
            let mut fp = numaplane::fingerprint::Fingerprint::new(certain.len() + uncertain.len());
            for &h in &certain {
                fp.add_hash(h);
            }
            for (i, &h) in uncertain_hashes.iter().enumerate() {
                if missing & (1 << i) == 0 {
                    fp.add_hash(h);
                }
            }
            fp.check(expected).is_ok()
        });
        let Some(missing) = found else {
            return;
        };
        let not_reported: BTreeSet<&String> = uncertain
            .iter()
            .enumerate()
            .filter(|(i, _)| missing & (1 << i) != 0)
            .map(|(_, k)| *k)
            .collect();
        // Assumptions without exclusive resources are not in an exclusive-only fingerprint,
        // and take nothing from the zones' available amounts either: confirm them too.
        let confirmed: Vec<String> = pending
            .into_iter()
            .filter(|k| !not_reported.contains(k))
            .cloned()
            .collect();
        for k in confirmed {
            self.assumed.remove(&k);
            self.assumption_stats.confirmed += 1;
        }
    }

    /// Drops the assumption of `key`, if any, and restores its node's zones.
    fn release(&mut self, key: &str) -> bool {
        match self.assumed.remove(key) {
            Some(a) => {
                self.recompute(&a.node);
                true
            }
            None => false,
        }
    }

    /// Undoes a placement whose binding failed: the assumption goes, and the node-level
    /// charge too unless the pod watch has since shown the pod bound (by someone else).
    ///
    /// `uid` is the UID the Binding was pinned to. A placement under the same name for
    /// another UID belongs to a pod recreated meanwhile, placed after this one: it stays.
    pub fn forget(&mut self, key: &str, uid: Option<&str>) {
        let other = |u: &Option<String>| uid.is_some() && u.is_some() && u.as_deref() != uid;
        if self.assumed.get(key).is_some_and(|a| other(&a.uid))
            || self.pods.get(key).is_some_and(|p| other(&p.uid))
        {
            return;
        }
        if self.release(key) {
            self.assumption_stats.forgotten += 1;
        }
        if self.pods.get(key).is_some_and(|p| p.assumed_only) {
            let old = self.unbind(key);
            self.index_claims(key, old, None);
        }
    }

    /// Drops assumptions older than `timeout_ms` at `now_ms` (caller's clock) and returns
    /// their pod keys: the node's NRT never showed them (no exporter, or a stuck one).
    pub fn expire_assumptions(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<String> {
        let old: Vec<String> = self
            .assumed
            .iter()
            .filter(|(_, a)| now_ms.saturating_sub(a.since_ms) >= timeout_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            if self.release(k) {
                self.assumption_stats.expired += 1;
            }
        }
        old
    }

    /// Pending assumptions.
    pub fn assumptions(&self) -> impl Iterator<Item = (&str, &Assumption)> {
        self.assumed.iter().map(|(k, a)| (k.as_str(), a))
    }

    /// Whether `key` has a pending assumption.
    pub fn is_assumed(&self, key: &str) -> bool {
        self.assumed.contains_key(key)
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
        let starting = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Pending");
        let node = spec.node_name.clone().filter(|_| !spec.terminal);
        // An assumption ends when its pod finishes or is bound elsewhere, or when the pod of
        // that name is another one (recreated, and bound by someone else).
        let other_pod = |a: &Assumption| a.uid.is_some() && spec.uid.is_some() && a.uid != spec.uid;
        if self
            .assumed
            .get(&key)
            .is_some_and(|a| Some(&a.node) != node.as_ref() || other_pod(a))
            && self.release(&key)
        {
            self.assumption_stats.gone += 1;
        }
        let old = self.unbind(&key);
        let mut new = None;
        if let Some(node) = node {
            let mut bound = BoundPod::new(&self.res, &spec, node.clone(), starting);
            bound.claims = self.record_claims(pod, &node);
            new = Some((node.clone(), bound.claims.clone())).filter(|(_, c)| !c.is_empty());
            self.charge(&node, &bound.request, 1);
            self.constraints.set_pod(&key, &node, &spec.facts); // hook (issue 19)
            self.node_pods
                .entry(node.clone())
                .or_default()
                .insert(key.clone());
            self.pods.insert(key.clone(), bound);
            self.settle(&node);
        }
        self.index_claims(&key, old, new);
        Ok(())
    }

    /// Confirms the assumptions of `node` its NRT shows, now that the pods known there
    /// changed: whether a pod arrives before or after the NRT that names it, or another pod
    /// leaves before or after it, the outcome is the same.
    fn settle(&mut self, node: &str) {
        if self.published.contains_key(node) {
            let before = self.assumed.len();
            self.reconcile(node);
            if self.assumed.len() != before {
                self.recompute(node);
            }
        }
    }

    /// The device IDs a bound pod's allocation record names for `node`. A record for another
    /// node (a failed Binding's leftover) claims nothing; one that does not parse is counted.
    fn record_claims(&mut self, pod: &Pod, node: &str) -> Claims {
        let Some(value) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(numaplane::allocation::ANNOTATION))
        else {
            return Vec::new();
        };
        let record = match Allocation::parse(value) {
            Ok(r) => r,
            Err(e) => {
                self.anomalies.invalid_records += 1;
                tracing::debug!(
                    pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
                    error = %numaplane::error_chain(&e),
                    "allocation record ignored"
                );
                return Vec::new();
            }
        };
        if record.node != node {
            return Vec::new();
        }
        claims_of(&mut self.res, &record)
    }

    /// Removes a pod by `namespace/name`; its assumption, if any, ends.
    pub fn delete_pod(&mut self, key: &str) {
        if self.release(key) {
            self.assumption_stats.gone += 1;
        }
        let node = self.pods.get(key).map(|p| p.node.clone());
        let old = self.unbind(key);
        self.index_claims(key, old, None);
        if let Some(node) = node {
            self.settle(&node);
        }
    }

    /// Removes the node-level charge of a pod; returns its node and claims (for
    /// [`Self::index_claims`]).
    fn unbind(&mut self, key: &str) -> Option<(String, Claims)> {
        let old = self.pods.remove(key)?;
        self.constraints.remove_pod(key); // hook (issue 19)
        if let Some(set) = self.node_pods.get_mut(&old.node) {
            set.remove(key);
            if set.is_empty() {
                self.node_pods.remove(&old.node);
            }
        }
        self.charge(&old.node, &old.request, -1);
        Some((old.node, old.claims)).filter(|(_, c)| !c.is_empty())
    }

    /// Replaces the whole state (a watch restart's initial list). Placements whose Binding is
    /// in flight or not yet shown by the pod watch are kept (see [`Self::reset_pods`]).
    pub fn reset(&mut self, nodes: &[Node], nrts: &[NodeResourceTopology], pods: &[Pod]) {
        self.reset_nodes(nodes);
        self.reset_nrts(nrts);
        self.reset_pods(pods, 0);
    }

    /// Replaces every Node (the node watch relisted). Pod charges are kept: they belong to
    /// the pod watch.
    pub fn reset_nodes(&mut self, nodes: &[Node]) {
        let keep: BTreeSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        let gone: Vec<String> = self
            .index
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.delete_node(&n);
        }
        for n in nodes {
            if self.apply_node(n).is_err() {
                self.anomalies.invalid_nodes += 1;
            }
        }
    }

    /// Replaces every NRT (the NRT watch relisted).
    pub fn reset_nrts(&mut self, nrts: &[NodeResourceTopology]) {
        let keep: BTreeSet<&str> = nrts.iter().filter_map(|t| t.metadata.name.as_deref()).collect();
        let gone: Vec<String> = self
            .topologies
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.delete_nrt(&n);
        }
        for t in nrts {
            let _ = self.apply_nrt(t);
        }
    }

    /// Replaces every bound pod (the pod watch relisted, the list having started at
    /// `listed_from_ms` on the caller's clock); pods no longer listed end, with their
    /// assumptions.
    ///
    /// Except our own placements the pod watch has not shown bound yet: a list does not show
    /// a pod whose Binding is still in flight, nor one whose Binding the API server accepted
    /// after the list began. Dropping those would free their zones while the pods are being
    /// bound there, and the next pod would get the same zone. Only a placement whose Binding
    /// was accepted before the list began, and that the list does not show, is gone (the pod
    /// was deleted since). `listed_from_ms = 0` keeps every such placement.
    pub fn reset_pods(&mut self, pods: &[Pod], listed_from_ms: u64) {
        let keep: BTreeSet<String> = pods
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let unreflected =
            |p: &BoundPod| p.assumed_only && p.bound_at_ms.is_none_or(|at| at >= listed_from_ms);
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(k, p)| !keep.contains(*k) && !unreflected(p))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.delete_pod(&k);
        }
        for p in pods {
            let _ = self.apply_pod(p);
        }
    }

    /// The API server accepted the Binding of `key` (pinned to `uid`) at `now_ms`: from now
    /// on a relist that does not show the pod means it is gone ([`Self::reset_pods`]).
    pub fn binding_succeeded(&mut self, key: &str, uid: Option<&str>, now_ms: u64) {
        let same = |p: &BoundPod| uid.is_none() || p.uid.is_none() || p.uid.as_deref() == uid;
        if let Some(p) = self.pods.get_mut(key).filter(|p| p.assumed_only && same(p)) {
            p.bound_at_ms = Some(now_ms);
        }
    }

    /// Adds (`sign` 1) or removes (`sign` -1) a pod's request on its node, if indexed.
    ///
    /// Requests come from pods any scheduler bound, so they may be anything the API server
    /// accepts: sums saturate (a node whose sum saturated is full for any pod). Removing a pod
    /// from a saturated sum cannot know what was lost, so the node's pods are summed again
    /// (`unbind` has already taken the pod out of `node_pods`): the sum is exact once it fits.
    fn charge(&mut self, node: &str, request: &ResList, sign: i64) {
        let Some(&slot) = self.index.get(node) else { return };
        let mut resum = false;
        let Some(n) = self.slots[slot].as_mut() else {
            return;
        };
        for (id, v) in request.iter() {
            let cur = n.requested.get_or_zero(id);
            if sign < 0 && (cur == i64::MAX || cur == i64::MIN) {
                resum = true;
            }
            let next = if sign < 0 {
                cur.saturating_sub(v)
            } else {
                cur.saturating_add(v)
            };
            n.requested.set(id, next);
        }
        n.pod_count = n.pod_count.saturating_add(sign);
        if resum {
            let (requested, _) = self.usage_of(node);
            if let Some(n) = self.slots[slot].as_mut() {
                n.requested = requested;
            }
        }
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

    /// The node-level state of `node` (labels, allocatable, what its pods request), if the
    /// node is indexed.
    pub fn node_basics(&self, node: &str) -> Option<&NodeBasics> {
        self.index.get(node).and_then(|&s| self.slots[s].as_ref())
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
        pod: &PreparedPod<'_>,
        basics: &NodeBasics,
        w: &mut WorkingZones,
    ) -> Option<i64> {
        if !fit::fits(&self.res, basics, pod.spec, &pod.fit_request) {
            return None;
        }
        match self.topology(&basics.name) {
            TopologyState::Missing => (cfg.no_topology != NoTopology::Reject)
                .then(|| cfg.scorer.score_prepared(&self.res, None, pod)),
            TopologyState::Invalid { .. } => None,
            TopologyState::Valid(topo) => {
                w.reset_from(topo);
                admission::admits_prepared(&self.res, topo, w, pod)
                    .then(|| cfg.scorer.score_prepared(&self.res, Some(topo), pod))
            }
        }
    }

    /// [`Self::judge`] for each slot of `slots`, on two threads when there are many.
    fn judge_slots(&self, cfg: &Config, pod: &PreparedPod<'_>, slots: &[usize]) -> Vec<Option<i64>> {
        let run = |part: &[usize]| -> Vec<Option<i64>> {
            let mut w = WorkingZones::default();
            part.iter()
                .map(|&s| {
                    self.slots[s]
                        .as_ref()
                        .and_then(|n| self.judge(cfg, pod, n, &mut w))
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
    fn best_cached(&self, cfg: &Config, pod: &PreparedPod<'_>, shapes: &mut Shapes) -> Option<(usize, i64)> {
        let entries = shapes.entries(ShapeKey::of(cfg, pod.spec), self.slots.len());
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
        let fresh = self.judge_slots(cfg, pod, &stale);
        for ((&slot, &position), score) in stale.iter().zip(&positions).zip(fresh) {
            entries[slot] = Entry {
                generation: self.generations[slot],
                score,
                failure: UNKNOWN_FAILURE,
            };
            consider(score, position);
        }
        best.map(|(score, position)| (self.order[position], score))
    }

    /// [`Self::best_cached`] without the cache (when another thread holds it).
    fn best_uncached(&self, cfg: &Config, pod: &PreparedPod<'_>) -> Option<(usize, i64)> {
        let mut best: Option<(usize, i64)> = None;
        for (&slot, score) in self.order.iter().zip(self.judge_slots(cfg, pod, &self.order)) {
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
        let pod = &PreparedPod::new(pod);
        let scores: Vec<Option<i64>> = self.with_cache(|shapes| match shapes {
            Some(shapes) => {
                self.best_cached(cfg, pod, shapes);
                let entries = shapes.entries(ShapeKey::of(cfg, pod.spec), self.slots.len());
                self.order.iter().map(|&s| entries[s].score).collect()
            }
            None => self.judge_slots(cfg, pod, &self.order),
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

    /// Evaluates `pod` on one node: node fit, then predicted kubelet admission.
    fn evaluate(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
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
        let failures = fit::check(&self.res, basics, pod.spec, &pod.fit_request);
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
        self.topology_verdict_into(cfg, &PreparedPod::new(pod), node, true, &mut verdict);
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
        pod: &PreparedPod<'_>,
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
                verdict.score = Some(cfg.scorer.score_prepared(&self.res, None, pod));
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
                match admission::predict_prepared(&self.res, topo, &mut w, pod) {
                    Ok(_) => {
                        verdict.feasible = true;
                        verdict.score = Some(cfg.scorer.score_prepared(&self.res, Some(topo), pod));
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
        self.schedule_prepared(cfg, &PreparedPod::new(pod), explain)
    }

    /// [`Self::schedule`] for a pod prepared once.
    fn schedule_prepared(&self, cfg: &Config, prepared: &PreparedPod<'_>, explain: bool) -> Decision {
        // hook (issue 19): pods kube-scheduler's constraint plugins concern.
        if let Some(d) = self.schedule_constrained(cfg, prepared, explain) {
            return d;
        }
        let pod = prepared.spec;
        if !explain {
            let best = self.with_cache(|shapes| match shapes {
                Some(shapes) => self.best_cached(cfg, prepared, shapes),
                None => self.best_uncached(cfg, prepared),
            });
            let chosen =
                best.and_then(|(slot, score)| Some((self.slots[slot].as_ref()?.name.clone(), score)));
            let Some((node, score)) = chosen else {
                return self.schedule_prepared(cfg, prepared, true);
            };
            return self.decision_on(prepared, node, score);
        }
        let verdicts: Vec<NodeVerdict> = self
            .nodes()
            .map(|n| self.evaluate(cfg, prepared, n, explain))
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
        let (placement, allocation) = self.placement_on(prepared, &node);
        Decision {
            pod: pod.key(),
            message: format!("Successfully assigned {} to {node}", pod.key()),
            node: Some(node),
            placement,
            allocation,
            nodes: verdicts,
        }
    }

    fn placement_on(&self, pod: &PreparedPod<'_>, node: &str) -> (Option<Placement>, Option<Allocation>) {
        let TopologyState::Valid(topo) = self.topology(node) else {
            return (None, None);
        };
        let mut w = WorkingZones::with_device_ids(topo);
        let Ok(p) = admission::predict_prepared(&self.res, topo, &mut w, pod) else {
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
    /// the node, and its exclusive resources and devices leave the node's zones. Offline use
    /// (no clock): the assumption never expires.
    pub fn assume(&mut self, pod: &PodSpec, decision: &Decision) {
        self.assume_at(pod, decision, 0);
    }

    /// [`Self::assume`] at `now_ms` on the caller's clock. The zones stay reduced, through
    /// every newer NRT of the node, until an NRT's fingerprint shows the kubelet counted the
    /// pod ([`Self::reconcile`]), the pod is gone, or [`Self::expire_assumptions`].
    pub fn assume_at(&mut self, pod: &PodSpec, decision: &Decision, now_ms: u64) {
        let Some(node) = decision.node.clone() else { return };
        let key = pod.key();
        // Predicted on the zones the decision saw, before an earlier placement under this
        // name (a recreated pod's predecessor) is dropped: the assumption is then the
        // decision, and the allocation record, rather than a new choice on freed zones.
        let taken = match self.topologies.get(&node) {
            Some(TopologyState::Valid(topo)) => {
                let mut w = WorkingZones::with_device_ids(topo);
                admission::predict(&self.res, topo, &mut w, pod)
                    .ok()
                    .map(|p| assumption_from(&self.res, topo, &w, &p, &node, pod.uid.as_deref(), now_ms))
            }
            _ => None,
        };
        self.delete_pod(&key);
        if let (Some(a), Some(TopologyState::Valid(topo))) = (&taken, self.topologies.get_mut(&node)) {
            take(topo, a);
        }
        let mut bound = BoundPod::new(&self.res, pod, node.clone(), true);
        bound.assumed_only = true;
        if let Some(alloc) = &decision.allocation {
            bound.claims = claims_of(&mut self.res, alloc);
        }
        let new = Some((node.clone(), bound.claims.clone())).filter(|(_, c)| !c.is_empty());
        self.charge(&node, &bound.request, 1);
        self.constraints.set_pod(&key, &node, &pod.facts); // hook (issue 19)
        self.node_pods.entry(node).or_default().insert(key.clone());
        self.pods.insert(key.clone(), bound);
        if let Some(a) = taken {
            self.assumed.insert(key.clone(), a);
        }
        self.index_claims(&key, None, new);
    }

    /// Re-assumes the placement of a bound pod that carries our allocation record, unless the
    /// node's NRT already shows the pod: after a restart or a leader change (the placements a
    /// previous process made and the NRTs do not show yet), or when the pod watch shows a
    /// pod bound by someone else with a record (another replica, or a Binding of ours that
    /// landed although it was reported failed). Running pods too: the kubelet may have
    /// admitted the pod long before the exporter publishes. Call once the pods, nodes and
    /// NRTs are synced.
    ///
    /// The placement is predicted inside the NUMA nodes the record names, and takes the
    /// device IDs it names: what the kubelet was told, not a new choice. Whether the NRT shows
    /// the pod is decided by its fingerprint ([`Self::reconcile`]); without one, the
    /// placement is held until it expires (counted twice meanwhile, never not at all).
    pub fn restore_assumption(&mut self, pod: &PodSpec, record: Option<&Allocation>, now_ms: u64) {
        let Some(node) = pod.node_name.clone() else { return };
        let key = pod.key();
        let known_here = self
            .pods
            .get(&key)
            .is_some_and(|p| p.node == node && (p.uid.is_none() || p.uid == pod.uid));
        if pod.terminal || self.assumed.contains_key(&key) || !known_here {
            return;
        }
        if record.is_some_and(|r| r.node != node) {
            return;
        }
        let Some(TopologyState::Valid(topo)) = self.topologies.get(&node) else {
            return;
        };
        let confined = record.and_then(recorded_zones).map(|zones| confine(topo, &zones));
        let basis = confined.as_ref().unwrap_or(topo);
        let mut w = WorkingZones::with_device_ids(basis);
        let Ok(p) = admission::predict(&self.res, basis, &mut w, pod) else {
            return;
        };
        let mut a = assumption_from(&self.res, basis, &w, &p, &node, pod.uid.as_deref(), now_ms);
        if let Some(r) = record {
            use_recorded_devices(&mut self.res, topo, r, &mut a);
        }
        if let Some(TopologyState::Valid(topo)) = self.topologies.get_mut(&node) {
            take(topo, &a);
        }
        self.assumed.insert(key.clone(), a);
        self.reconcile(&node);
        if !self.assumed.contains_key(&key) {
            // The NRT shows the pod: there was nothing to restore, so nothing was confirmed.
            self.assumption_stats.confirmed = self.assumption_stats.confirmed.saturating_sub(1);
        }
        self.recompute(&node);
    }

    /// Whether the pod watch has shown the pod `key` bound (not only our placement of it).
    pub fn seen_bound(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(|p| !p.assumed_only)
    }

    /// The node the pod `key` is known bound (or being bound) to.
    pub fn pod_node(&self, key: &str) -> Option<&str> {
        self.pods.get(key).map(|p| p.node.as_str())
    }

    /// The decision for `pod` on `node`, chosen by someone else (kube-scheduler, in extender
    /// mode): the NUMA side is predicted again against the current zones and assumptions, and
    /// the devices are chosen. Node-level fit is the caller's; a node without an NRT is
    /// judged as [`Self::topology_verdict`] judges it, so `filter` and `bind` agree. `Err` carries the verdict that
    /// says why the node cannot admit the pod now.
    pub fn decide_on(&self, cfg: &Config, pod: &PodSpec, node: &str) -> Result<Decision, NodeVerdict> {
        let verdict = self.topology_verdict(cfg, pod, node);
        if !verdict.feasible {
            return Err(verdict);
        }
        Ok(self.decision_on(
            &PreparedPod::new(pod),
            node.to_owned(),
            verdict.score.unwrap_or(0),
        ))
    }

    /// Like [`Self::schedule`] without explanations, for a live loop that retries pods: when
    /// no node fits, the "0/N nodes are available" message comes from per-node failure
    /// categories cached by pod shape, so only nodes changed since the last attempt are
    /// explained again; `nodes` is empty then.
    pub fn decide(&self, cfg: &Config, pod: &PodSpec) -> Decision {
        let prepared = &PreparedPod::new(pod);
        // hook (issue 19): pods kube-scheduler's constraint plugins concern.
        if let Some(d) = self.schedule_constrained(cfg, prepared, false) {
            return d;
        }
        let outcome = self.with_cache(|shapes| {
            let shapes = shapes?;
            if let Some(best) = self.best_cached(cfg, prepared, shapes) {
                return Some(Ok(best));
            }
            Some(Err(self.cached_failure_message(cfg, prepared, shapes)))
        });
        match outcome {
            Some(Ok((slot, score))) => match self.slots[slot].as_ref() {
                Some(n) => self.decision_on(prepared, n.name.clone(), score),
                None => self.schedule_prepared(cfg, prepared, false),
            },
            Some(Err(message)) => Decision {
                pod: pod.key(),
                node: None,
                message,
                placement: None,
                allocation: None,
                nodes: vec![],
            },
            // Another thread holds the cache: the uncached path.
            None => self.schedule_prepared(cfg, prepared, false),
        }
    }

    /// The aggregate message for a pod no node fits, from the cached categories of every
    /// node; nodes without cached categories are explained once and remembered.
    fn cached_failure_message(&self, cfg: &Config, pod: &PreparedPod<'_>, shapes: &mut Shapes) -> String {
        let key = ShapeKey::of(cfg, pod.spec);
        let unknown: Vec<usize> = {
            let entries = shapes.entries(key.clone(), self.slots.len());
            self.order
                .iter()
                .copied()
                .filter(|&s| entries[s].score.is_none() && entries[s].failure == UNKNOWN_FAILURE)
                .collect()
        };
        let mut fresh = Vec::with_capacity(unknown.len());
        for slot in unknown {
            if let Some(n) = self.slots[slot].as_ref() {
                let v = self.evaluate(cfg, pod, n, true);
                fresh.push((slot, shapes.intern_categories(v.categories)));
            }
        }
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        {
            let entries = shapes.entries(key, self.slots.len());
            for (slot, id) in fresh {
                entries[slot].failure = id;
            }
            for &s in &self.order {
                *counts.entry(entries[s].failure).or_default() += 1;
            }
        }
        let mut per_category: BTreeMap<&str, usize> = BTreeMap::new();
        for (&id, &n) in &counts {
            for c in shapes.categories(id) {
                *per_category.entry(c.as_str()).or_default() += n;
            }
        }
        format_aggregate(0, self.order.len(), &per_category)
    }

    /// The decision for a chosen node (placement and allocation record predicted there).
    fn decision_on(&self, pod: &PreparedPod<'_>, node: String, score: i64) -> Decision {
        let (placement, allocation) = self.placement_on(pod, &node);
        Decision {
            pod: pod.spec.key(),
            message: format!("Successfully assigned {} to {node}", pod.spec.key()),
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
        }
    }
}

/// What a prediction consumed: the difference between the topology's zones and `w`, and the
/// memory groups its placement `p` forms.
fn assumption_from(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    p: &Placement,
    node: &str,
    uid: Option<&str>,
    now_ms: u64,
) -> Assumption {
    let mut taken = Vec::new();
    let mut devices = Vec::new();
    for (i, z) in topo.zones.iter().enumerate() {
        let mut amounts = ResList::default();
        if let Some(after) = w.available.get(i) {
            for (id, before) in z.available.iter() {
                let used = before.saturating_sub(after.get_or_zero(id));
                if used > 0 {
                    amounts.set(id, used);
                }
            }
        }
        if !amounts.is_empty() {
            taken.push((z.id, amounts));
        }
        if let Some(after) = w.free_devices.as_ref().and_then(|f| f.get(i)) {
            for (id, ids) in &z.free_devices {
                let left = after.get(id);
                let gone: Vec<String> = ids
                    .iter()
                    .filter(|d| !left.is_some_and(|l| l.contains(d)))
                    .cloned()
                    .collect();
                if !gone.is_empty() {
                    devices.push((z.id, *id, gone));
                }
            }
        }
    }
    let unaligned = topo
        .unaligned_devices
        .iter()
        .filter_map(|(id, before)| {
            let after = w.unaligned.get(id)?;
            let gone: Vec<String> = before
                .ids
                .iter()
                .filter(|d| !after.ids.contains(d))
                .cloned()
                .collect();
            let used = before.free.saturating_sub(after.free);
            (used > 0).then_some((*id, used, gone))
        })
        .collect();
    Assumption {
        node: node.to_owned(),
        uid: uid.map(str::to_owned),
        since_ms: now_ms,
        taken,
        devices,
        unaligned,
        memory_groups: p
            .memory_groups()
            .into_iter()
            .filter(|g| match g.as_slice() {
                [id] => {
                    let known = topo.memory_groups.iter().flatten().flatten().any(|k| k == id);
                    let unused = topo.zones.iter().find(|z| z.id == *id).is_some_and(|z| {
                        z.allocatable
                            .iter()
                            .all(|(r, a)| !res.kind(r).is_memory_like() || z.available.get_or_zero(r) >= a)
                    });
                    known || unused
                }
                _ => true,
            })
            .collect(),
    }
}

/// The NUMA nodes a record places the pod on (all containers, and the pod scope's), if
/// every container has an affinity; `None` when any may use every node.
fn recorded_zones(record: &Allocation) -> Option<BTreeSet<u32>> {
    let mut zones: BTreeSet<u32> = record.pod_numa_nodes.iter().flatten().copied().collect();
    for c in &record.containers {
        zones.extend(c.numa_nodes.as_ref()?.iter().copied());
    }
    (!zones.is_empty()).then_some(zones)
}

/// `topo` with every zone outside `keep` emptied, so a prediction on it can only use `keep`.
fn confine(topo: &NumaTopology, keep: &BTreeSet<u32>) -> NumaTopology {
    let mut t = topo.clone();
    for z in t.zones.iter_mut().filter(|z| !keep.contains(&z.id)) {
        let listed: Vec<ResId> = z.available.iter().map(|(id, _)| id).collect();
        for id in listed {
            z.available.set(id, 0);
        }
        z.free_devices.values_mut().for_each(Vec::clear);
        if let Some(cores) = z.free_cores.as_mut() {
            *cores = 0;
        }
    }
    t
}

/// Replaces the device IDs an assumption takes by those `record` names, for each resource
/// the record names IDs of: the kubelet's allocator was told those. IDs no zone of `topo`
/// lists as free (the NRT shows them taken already) are not taken again.
fn use_recorded_devices(res: &mut Resources, topo: &NumaTopology, record: &Allocation, a: &mut Assumption) {
    let mut by_zone: BTreeMap<(u32, ResId), Vec<String>> = BTreeMap::new();
    let mut named: BTreeSet<ResId> = BTreeSet::new();
    for c in &record.containers {
        for (name, ids) in &c.devices {
            let rid = res.intern(name);
            named.insert(rid);
            for id in ids {
                let zone = topo
                    .zones
                    .iter()
                    .find(|z| z.free_devices.get(&rid).is_some_and(|f| f.contains(id)));
                if let Some(z) = zone {
                    by_zone.entry((z.id, rid)).or_default().push(id.clone());
                }
            }
        }
    }
    a.devices.retain(|(_, rid, _)| !named.contains(rid));
    a.devices
        .extend(by_zone.into_iter().map(|((zone, rid), ids)| (zone, rid, ids)));
}

/// Takes an assumption's amounts and device IDs from a topology's zones (clamped at zero: a
/// newer NRT may already show part of it).
fn take(topo: &mut NumaTopology, a: &Assumption) {
    let threads = topo.full_pcpus_threads;
    for (zone, amounts) in &a.taken {
        if let Some(z) = topo.zones.iter_mut().find(|z| z.id == *zone) {
            for (id, v) in amounts.iter() {
                z.available.sub_clamped(id, v);
            }
            // Under full-pcpus-only exclusive CPUs come in whole cores: those are no longer
            // free either.
            if let (Some(t), Some(free)) = (threads, z.free_cores.as_mut()) {
                let cores = amounts.get(crate::resources::CPU) / 1000 / t;
                *free = free.saturating_sub(cores).max(0);
            }
        }
    }
    for (zone, id, ids) in &a.devices {
        if let Some(free) = topo
            .zones
            .iter_mut()
            .find(|z| z.id == *zone)
            .and_then(|z| z.free_devices.get_mut(id))
        {
            free.retain(|d| !ids.contains(d));
        }
    }
    for (id, used, ids) in &a.unaligned {
        if let Some(u) = topo.unaligned_devices.get_mut(id) {
            u.free = u.free.saturating_sub(*used).max(0);
            u.ids.retain(|d| !ids.contains(d));
            u.ids.truncate(usize::try_from(u.free).unwrap_or(0));
        }
    }
    // The groups become known ones: the model then applies the group rules to their zones
    // exactly (§3.2 steps 2–3). Zones in use outside the known groups stay guessed, whether
    // the exporter publishes groups or not, so adding to an unpublished list is as safe. Later
    // entries replace earlier ones on their nodes (the kubelet's `Cells`), so one already
    // known moves to the end.
    for g in &a.memory_groups {
        let known = topo.memory_groups.get_or_insert_with(Vec::new);
        known.retain(|k| k != g);
        known.push(g.clone());
    }
}

/// Removes `ids` of resource `rid` from a topology's free IDs, and as many from each zone's
/// available count: they are held on another node (cluster-shared slots).
fn strip(topo: &mut NumaTopology, rid: ResId, ids: &BTreeSet<&str>) {
    for z in &mut topo.zones {
        if let Some(free) = z.free_devices.get_mut(&rid) {
            let before = free.len();
            free.retain(|d| !ids.contains(d.as_str()));
            let removed = i64::try_from(before - free.len()).unwrap_or(i64::MAX);
            z.available.sub_clamped(rid, removed);
        }
    }
}

/// The device IDs per resource that a record names, over all containers.
fn claims_of(res: &mut Resources, record: &Allocation) -> Claims {
    let mut by_res: BTreeMap<ResId, BTreeSet<String>> = BTreeMap::new();
    for c in &record.containers {
        for (name, ids) in &c.devices {
            by_res
                .entry(res.intern(name))
                .or_default()
                .extend(ids.iter().cloned());
        }
    }
    by_res
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(rid, ids)| (rid, ids.into_iter().collect()))
        .collect()
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
    let available = verdicts.iter().filter(|v| v.feasible).count();
    format_aggregate(available, verdicts.len(), &counts)
}

/// The kube-scheduler line from per-category node counts.
fn format_aggregate(available: usize, total: usize, counts: &BTreeMap<&str, usize>) -> String {
    let mut parts: Vec<String> = counts.iter().map(|(c, n)| format!("{n} {c}")).collect();
    parts.sort();
    if parts.is_empty() {
        format!("{available}/{total} nodes are available.")
    } else {
        format!("{available}/{total} nodes are available: {}.", parts.join(", "))
    }
}
