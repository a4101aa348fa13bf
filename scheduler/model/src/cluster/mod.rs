//! The scheduler's in-memory cluster: an index fed by apply/delete/reset events (nodes, NRTs,
//! bound pods), the filter/score cycle over every node, and `assume`, which applies a placement
//! so the next pod sees it. Unexplained scheduling reuses per-node verdicts across pods of the
//! same shape (`cache.rs`); explained scheduling evaluates every node afresh.
//!
//! One module per concern: [`index`] (nodes, NRTs and bound pods in, per-node state out),
//! [`assume`] (the assumption lifecycle and its release by fingerprint reconciliation),
//! [`shared_slots`] (cluster-shared device claims), [`decision_cache`] (per-shape verdict reuse)
//! and [`decide`] (the filter/score cycle and its messages); this module holds the types.

pub use crate::model_config::{Config, NoTopology};
use crate::{
    cache::VerdictCache,
    decision::{Decision, NodeVerdict},
    node::NodeBasics,
    node::NumaTopology,
    pod::{PodSpec, Qos},
    resources::{ResId, ResList, Resources},
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod assume;
mod decide;
mod decision_cache;
mod index;
mod preemption;
// kube-scheduler's constraint plugins on the decision path.
mod constrained;
mod shared_slots;
// kube-scheduler's DynamicResources filter for pods with resource claims.
mod claims;
mod claims_cache;
mod predictions;
mod ranking;
#[cfg(test)]
mod volume_tests;

pub use claims::ClaimsOutcome;
pub use index::AppliedPod;

pub use preemption::{Hold, Preemption};

pub use decide::aggregate_message;
use decide::format_aggregate;

/// How much of a decision is explained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Explain {
    /// Every node's verdict, with reasons, placed or not.
    Every,
    /// Every node's verdict when no node fits.
    Failures,
    /// Only the aggregate message when no node fits (the live loop's `decide`).
    Message,
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
        // A pod with pod-level resources gets no exclusive CPUs or memory (see `Unit::managed`).
        let guaranteed_exclusive = spec.qos == Qos::Guaranteed
            && !spec.pod_level
            && containers().any(|c| c.pinned_if_guaranteed(res));
        let mut extended: Vec<ResId> = containers().flat_map(|c| c.extended(res)).collect();
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
    /// Nodes where claims of a shape cannot be allocated.
    claim_verdicts: claims_cache::ClaimVerdictCache,
    /// What searches of a node's devices found, shared across claim shapes.
    device_outcomes: claims_cache::DeviceOutcomeCache,
    /// CPU predictions of pods with claims, per node.
    predictions: predictions::PredictionMemo,
    /// PersistentVolumeClaims, PersistentVolumes and StorageClasses.
    pub volumes: crate::volume_binding::VolumeIndex,
    /// Victim candidates, disruption budgets and preemptors' holds.
    preemption: preemption::State,
    /// Pods' constraint facts, node labels and Namespaces.
    constraints: crate::constraints::ConstraintIndex,
    /// DeviceClasses, ResourceSlices and ResourceClaims, and the devices claims hold.
    pub dra: crate::dra::state::DraState,
}
