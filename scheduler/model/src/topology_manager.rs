//! Model of the kubelet Topology Manager (`pkg/kubelet/cm/topologymanager`, v1.27+ behaviour):
//! given the policy, its options, the machine's NUMA nodes and what each hint provider answered,
//! predict the merged NUMA affinity and whether the kubelet admits the pod.
//!
//! Pure and synchronous: no I/O, no Kubernetes types. The rules, restated in
//! `kubelet-topology-manager.md` §2 and checked against the upstream test tables
//! (`tests/topology_manager_conformance.rs`):
//!
//! * each provider's map is normalised into per-resource lists (nil map / nil list → "any node,
//!   preferred", empty list → "any node, not preferred");
//! * every permutation (one hint per list) is merged: mask = AND of the masks (maskless hints
//!   contribute all nodes), preferred = all hints preferred **and** all masked hints carry the
//!   same mask; empty masks are dropped;
//! * the best merged hint: the narrowest preferred one, else the non-preferred one whose node
//!   count is closest to (not above) `BestNonPreferredAffinityCount`; ties by mask value, or by
//!   average distance first with `prefer-closest-numa-nodes`; nothing → all nodes, not preferred;
//! * policies: `none` admits without a hint, `best-effort` always admits, `restricted` admits
//!   preferred results, `single-numa-node` first keeps only preferred single-node/maskless hints,
//!   turns an all-nodes result into "no mask" and admits preferred results.
//!
//! Configuration errors are those that stop the kubelet from starting, among them a machine
//! with more NUMA nodes than `max-allowable-numa-nodes` under a policy other than `none`
//! ([`TopologyManagerError::TooManyNumaNodes`]).
//!
//! Deviation: an empty NUMA node list is an error ([`TopologyManagerError::NoNumaNodes`]); the
//! kubelet always sees at least one node.

mod config;
mod error;
mod hint;
mod mask;
mod merge;
mod numa;

#[cfg(test)]
mod tests;

pub use config::{
    DEFAULT_MAX_ALLOWABLE_NUMA_NODES, MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES, Policy,
    PolicyOptions, Scope,
};
pub use error::TopologyManagerError;
pub use hint::{ProviderHints, ResourceHints, TopologyHint};
pub use mask::{MAX_NUMA_NODE_ID, NumaMask, NumaMaskIter};
pub use merge::{
    Choice, MergeOutcome, TieBreak, compare, compare_with, merge_hints, merge_resource_hints, validate_config,
};
pub use numa::{NumaDistances, NumaInfo, average_distance};
