//! Accounting core of the exporter: kubelet pod-resources responses plus the machine model in,
//! NodeResourceTopology zones out. Pure and synchronous: no I/O, no clock, no logging; whatever
//! looks wrong in the kubelet's data is returned as a counted [`Anomaly`] (for a metric and a
//! log line written by the caller), and only what cannot be represented is an error.
//!
//! The rules (research notes `podresources-exporter.md` §2, §3.1 "chosen" column, §5, §6, and
//! the conventions of the shared conformance vectors):
//! - one zone per machine NUMA node, named by its OS id (`node-<id>`, holes allowed), with the
//!   SLIT row as costs;
//! - a resource row exists in a zone only if GetAllocatableResources attributes some of it to
//!   the zone; a zone left without rows gets a single `cpu` row with allocatable 0, so that
//!   every NUMA node stays visible to the scheduler;
//! - capacity: `cpu` = logical CPUs of the node, `memory` = MemTotal, `hugepages-<size>` =
//!   pages × size, devices = allocatable; an unknown capacity, or one below allocatable, is
//!   replaced by allocatable;
//! - used = what List reports as exclusively held, mapped to NUMA nodes; available =
//!   allocatable − used, clamped at 0;
//! - devices are counted once per (device id, NUMA node) entry, as the kubelet emits them;
//! - multi-NUMA memory blocks in List are spread greedily in ascending node order, as the
//!   memory manager fills a group, capped by what each node has left;
//! - pod-level `cpu_ids`/`memory` (fields 4/5) overlap the container values: CPUs are united,
//!   pod-level memory replaces container memory when present.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use glob::Pattern;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use numaplane::fingerprint::{self, Method};
use numaplane::nrt::{self, AttributeInfo, CostInfo, NodeResourceTopology, ResourceInfo, Zone, attr};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use numaplane::quantity::{Format, Quantity};
use numaplane_topology::{Machine, parse_hugepage_resource_name};

use crate::init_held::{Held, Sources};

#[cfg(test)]
mod tests;

pub use numaplane::resource_name::{CPU as RESOURCE_CPU, HUGEPAGES_PREFIX, MEMORY as RESOURCE_MEMORY};
/// Key of [`AccountingConfig::resource_exclude`] that applies to every node.
pub const EXCLUDE_ALL_NODES: &str = "*";

/// Kubelet default Topology Manager policy, published when the configuration gives none.
pub const DEFAULT_TOPOLOGY_MANAGER_POLICY: &str = "none";
/// Kubelet default Topology Manager scope, published when the configuration gives none.
pub const DEFAULT_TOPOLOGY_MANAGER_SCOPE: &str = "container";

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/// The part of the machine model the accounting needs, independent of hwloc so that tests and
/// other sources (sysfs, vectors) can build it directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineView {
    /// NUMA nodes, in any order; ids must be unique.
    pub nodes: Vec<NodeView>,
}

/// One NUMA node of a [`MachineView`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Linux node number (kubelet `NUMANode.ID`).
    pub id: u32,
    /// Online logical CPU ids local to the node (empty for memory-only nodes).
    pub cpus: Vec<u32>,
    /// MemTotal of the node in bytes, hugepages included; `None` when unknown.
    pub memory_bytes: Option<u64>,
    /// Hugepage pool sizes in bytes, keyed by resource name (`hugepages-2Mi`).
    pub hugepages_bytes: BTreeMap<String, u64>,
    /// SLIT row: (destination node id, distance), itself included.
    pub distances: Vec<(u32, u64)>,
    /// Physical cores, each with its logical CPUs; empty when unknown.
    pub cores: Vec<Vec<u32>>,
}

impl From<&Machine> for MachineView {
    fn from(machine: &Machine) -> Self {
        let nodes = machine
            .numa_nodes
            .iter()
            .map(|node| {
                let mut hugepages_bytes = BTreeMap::new();
                for pool in &node.hugepages {
                    let total: &mut u64 = hugepages_bytes.entry(pool.resource_name()).or_default();
                    // Capacity only: saturating keeps an absurd pool visible without wrapping.
                    *total = total.saturating_add(pool.total_bytes());
                }
                NodeView {
                    id: node.id,
                    cpus: node.cpus.clone(),
                    // hwloc reports 0 when it does not know the local memory.
                    memory_bytes: (node.memory_bytes > 0).then_some(node.memory_bytes),
                    hugepages_bytes,
                    distances: node.distances.iter().map(|d| (d.node, d.value)).collect(),
                    cores: node.cores.clone(),
                }
            })
            .collect();
        MachineView { nodes }
    }
}

/// Pods whose namespace and name both match these shell globs are left out of the accounting
/// (RTE's `podExclude`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodExclude {
    /// Glob on the namespace.
    pub namespace_pattern: String,
    /// Glob on the pod name.
    pub name_pattern: String,
}

/// The kubelet's CPU and memory manager settings, as its config file sets them (kubelet
/// defaults for absent fields).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceManagers {
    /// `cpuManagerPolicy` (`none` by default).
    pub cpu_manager_policy: String,
    /// `cpuManagerPolicyOptions`.
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// `reservedSystemCPUs`, when set.
    pub reserved_cpus: Option<String>,
    /// `memoryManagerPolicy` (`None` by default).
    pub memory_manager_policy: String,
}

/// Everything besides the two kubelet responses that shapes the published object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountingConfig {
    /// This node's name, the key for per-node `resource_exclude` entries.
    pub node_name: String,
    /// Resources to leave out, keyed by node name or [`EXCLUDE_ALL_NODES`].
    pub resource_exclude: BTreeMap<String, Vec<String>>,
    /// Account only pods of this namespace; `None`, `""` or `"*"` means all namespaces.
    pub watch_namespace: Option<String>,
    /// Pods to ignore, by namespace and name globs.
    pub pod_exclude: Vec<PodExclude>,
    /// Pods known (from the API server) to be Succeeded or Failed, as (namespace, name): kubelets
    /// before 1.34 still list them with their stale assignments.
    pub terminal_pods: BTreeSet<(String, String)>,
    /// Which pods enter the pod-set fingerprint; `None` disables the fingerprint.
    pub fingerprint_method: Option<Method>,
    /// Kubelet Topology Manager policy; empty means the kubelet default (`none`).
    pub topology_manager_policy: String,
    /// Kubelet Topology Manager scope; empty means the kubelet default (`container`).
    pub topology_manager_scope: String,
    /// Kubelet `max-allowable-numa-nodes`, published as `topologyManagerMaxNUMANodes` when set.
    pub max_numa_nodes: Option<u32>,
    /// Kubelet `prefer-closest-numa-nodes`, published when set.
    pub prefer_closest_numa_nodes: Option<bool>,
    /// CPU and memory manager settings of the kubelet, published when known.
    pub resource_managers: Option<ResourceManagers>,
    /// No configured source of the kubelet's configuration answered: an empty policy or scope
    /// is left out of the object instead of published as the kubelet default (a guess the
    /// scheduler would take as fact).
    pub kubelet_config_unknown: bool,
    /// Resources whose device slots are one cluster-wide set (allocator pools with
    /// `shared: cluster`): the IDs this node's pods hold are published as a node attribute
    /// ([`attr::CLUSTER_HELD_PREFIX`]) so the scheduler and the other nodes keep them off.
    pub cluster_shared: BTreeSet<String>,
    /// What listed pods hold beyond `List` (init containers' leftovers), by (namespace, name);
    /// charged like the pod's own resources. See [`crate::init_held`].
    pub held_beyond_list: BTreeMap<(String, String), Held>,
    /// Where `held_beyond_list` came from; published as [`attr::INIT_HELD_SOURCE`] when set.
    pub held_sources: Option<Sources>,
    /// The Static memory manager's NUMA groups in use (its checkpoint), published as
    /// [`attr::MEMORY_GROUPS`] when known, so the scheduler need not guess them.
    pub memory_groups: Option<Vec<Vec<u32>>>,
}

impl Default for AccountingConfig {
    /// RTE's defaults: fingerprint on with `with-exclusive-resources`, kubelet TM defaults.
    fn default() -> Self {
        Self {
            node_name: String::new(),
            resource_exclude: BTreeMap::new(),
            watch_namespace: None,
            pod_exclude: Vec::new(),
            terminal_pods: BTreeSet::new(),
            fingerprint_method: Some(Method::WithExclusiveResources),
            topology_manager_policy: DEFAULT_TOPOLOGY_MANAGER_POLICY.to_owned(),
            topology_manager_scope: DEFAULT_TOPOLOGY_MANAGER_SCOPE.to_owned(),
            max_numa_nodes: None,
            prefer_closest_numa_nodes: None,
            resource_managers: None,
            kubelet_config_unknown: false,
            cluster_shared: BTreeSet::new(),
            held_beyond_list: BTreeMap::new(),
            held_sources: None,
            memory_groups: None,
        }
    }
}

impl AccountingConfig {
    /// Resources removed from every zone on this node (`*` entries plus this node's entries).
    pub fn excluded_resources(&self) -> BTreeSet<&str> {
        [EXCLUDE_ALL_NODES, self.node_name.as_str()]
            .iter()
            .filter_map(|key| self.resource_exclude.get(*key))
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------------

/// Kinds of suspicious kubelet data. Each is a bounded metric label; none stops the accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AnomalyKind {
    /// A CPU id that is not an online CPU of the machine (skipped).
    UnknownCpu,
    /// A NUMA id ≥ 0 that the machine does not have (that placement is skipped).
    UnknownNuma,
    /// A device without NUMA affinity (no topology or only negative ids): not in any zone.
    /// Informational: the kubelet legitimately reports such devices.
    UnalignedDevice,
    /// A memory block without a usable NUMA node (skipped).
    UnalignedMemory,
    /// The same CPU twice in GetAllocatableResources (counted once).
    DuplicateCpu,
    /// The same (resource, device id, NUMA node) twice in GetAllocatableResources (counted once).
    DuplicateDevice,
    /// The same CPU or (device, NUMA node) reported as held by two pods (counted once).
    DoubleAssignment,
    /// A memory block of GetAllocatableResources on several NUMA nodes; the kubelet sends one
    /// block per node, so the size is split evenly.
    MultiNumaAllocatable,
    /// Used exceeds allocatable (available clamped at 0), or something is used in a zone that
    /// has none of it allocatable. Unhealthy devices still assigned cause this legitimately.
    UsedExceedsAllocatable,
    /// The machine's capacity is below what the kubelet calls allocatable (capacity raised).
    AllocatableExceedsCapacity,
    /// A device resource name or memory type that is empty or collides with `cpu`, `memory` or
    /// `hugepages-*` (skipped, so that zones never carry two rows of one name).
    InvalidResourceName,
    /// A device id that is empty (skipped), or that cannot be carried in the comma-separated
    /// free-devices attribute (counted, left out of the attribute).
    InvalidDeviceId,
}

impl AnomalyKind {
    /// Every kind, for registering metric series up front.
    pub const ALL: [AnomalyKind; 12] = [
        AnomalyKind::UnknownCpu,
        AnomalyKind::UnknownNuma,
        AnomalyKind::UnalignedDevice,
        AnomalyKind::UnalignedMemory,
        AnomalyKind::DuplicateCpu,
        AnomalyKind::DuplicateDevice,
        AnomalyKind::DoubleAssignment,
        AnomalyKind::MultiNumaAllocatable,
        AnomalyKind::UsedExceedsAllocatable,
        AnomalyKind::AllocatableExceedsCapacity,
        AnomalyKind::InvalidResourceName,
        AnomalyKind::InvalidDeviceId,
    ];

    /// The metric label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::UnknownCpu => "unknown_cpu",
            AnomalyKind::UnknownNuma => "unknown_numa",
            AnomalyKind::UnalignedDevice => "unaligned_device",
            AnomalyKind::UnalignedMemory => "unaligned_memory",
            AnomalyKind::DuplicateCpu => "duplicate_cpu",
            AnomalyKind::DuplicateDevice => "duplicate_device",
            AnomalyKind::DoubleAssignment => "double_assignment",
            AnomalyKind::MultiNumaAllocatable => "multi_numa_allocatable",
            AnomalyKind::UsedExceedsAllocatable => "used_exceeds_allocatable",
            AnomalyKind::AllocatableExceedsCapacity => "allocatable_exceeds_capacity",
            AnomalyKind::InvalidResourceName => "invalid_resource_name",
            AnomalyKind::InvalidDeviceId => "invalid_device_id",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One piece of suspicious kubelet data that the accounting worked around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// Bounded label, for a metric.
    pub kind: AnomalyKind,
    /// Human-readable description, for a log line.
    pub detail: String,
}

/// Result of one accounting pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounting {
    /// One zone per machine NUMA node, sorted by name; resources, costs and attributes of each
    /// zone sorted by name.
    pub zones: Vec<Zone>,
    /// Node attributes in RTE order: fingerprint, method (when enabled), scope, policy, then
    /// `topologyManagerMaxNUMANodes` when configured.
    pub attributes: Vec<AttributeInfo>,
    /// Deprecated single `topologyPolicies` value derived from policy and scope.
    pub topology_policy: String,
    /// Object annotations (the legacy fingerprint annotation when enabled).
    pub annotations: BTreeMap<String, String>,
    /// Suspicious data worked around, in the order met.
    pub anomalies: Vec<Anomaly>,
    /// Pods left after the namespace, exclusion and terminal-pod filters.
    pub pods_accounted: usize,
    /// Accounted pods holding at least one exclusive resource (CPUs, NUMA-pinned memory or
    /// NUMA-affine devices).
    pub pods_with_exclusive: usize,
    /// The pod-set fingerprint, when enabled.
    pub fingerprint: Option<String>,
    /// DRA devices (pod-resources `dynamic_resources`) held by accounted pods, per driver.
    /// Read and kept, never charged to a zone: DRA devices bypass the Topology Manager and
    /// pod-resources carries no NUMA node for them, so the zones must say nothing about them.
    pub dra_devices: BTreeMap<String, usize>,
}

impl Accounting {
    /// Number of anomalies of each kind (only kinds that occurred).
    pub fn anomaly_counts(&self) -> BTreeMap<AnomalyKind, usize> {
        let mut counts = BTreeMap::new();
        for a in &self.anomalies {
            *counts.entry(a.kind).or_insert(0) += 1;
        }
        counts
    }

    /// The NodeResourceTopology object for `node_name` (no owner reference: that needs the
    /// Node's uid and belongs to the publisher).
    pub fn to_nrt(&self, node_name: &str) -> NodeResourceTopology {
        let mut nrt = NodeResourceTopology::new(node_name);
        nrt.zones = self.zones.clone();
        nrt.attributes = Some(self.attributes.clone());
        nrt.topology_policies = Some(vec![self.topology_policy.clone()]);
        if !self.annotations.is_empty() {
            nrt.metadata.annotations = Some(self.annotations.clone());
        }
        nrt
    }
}

/// What makes an accounting pass impossible (as opposed to an [`Anomaly`]).
#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    /// A value does not fit the 64-bit signed integers of NRT consumers (the scheduler rejects
    /// such objects), or a sum of kubelet sizes overflows. Never wrapped or saturated, since a
    /// wrong number would be published as truth.
    #[error("{operation} overflows 64-bit accounting ({what} in zone {zone})")]
    Overflow {
        /// What was being computed.
        operation: &'static str,
        /// Zone name.
        zone: String,
        /// Resource or cost concerned.
        what: String,
    },
    /// The machine model lists a NUMA node id twice.
    #[error("cannot index machine: NUMA node {id} is listed twice")]
    IndexNumaNode {
        /// The repeated id.
        id: u32,
    },
    /// The machine model puts one CPU on two NUMA nodes.
    #[error("cannot index machine: CPU {cpu} is listed on NUMA nodes {first} and {second}")]
    IndexCpu {
        /// The CPU id.
        cpu: u32,
        /// First node listing it.
        first: u32,
        /// Second node listing it.
        second: u32,
    },
    /// A pod exclusion glob does not compile.
    #[error("cannot compile pod exclusion pattern {pattern:?}")]
    CompilePodExclude {
        /// The pattern as configured.
        pattern: String,
        /// Why the glob is invalid.
        source: glob::PatternError,
    },
}

// ---------------------------------------------------------------------------------------------
// Pod selection and fingerprint
// ---------------------------------------------------------------------------------------------

struct CompiledExclude {
    namespace: Pattern,
    name: Pattern,
}

fn compile_excludes(cfg: &AccountingConfig) -> Result<Vec<CompiledExclude>, AccountingError> {
    let compile = |pattern: &str| {
        Pattern::new(pattern).map_err(|source| AccountingError::CompilePodExclude {
            pattern: pattern.to_owned(),
            source,
        })
    };
    cfg.pod_exclude
        .iter()
        .map(|e| {
            Ok(CompiledExclude {
                namespace: compile(&e.namespace_pattern)?,
                name: compile(&e.name_pattern)?,
            })
        })
        .collect()
}

/// The pods of `list` that the accounting and the fingerprint consider: in the watched
/// namespace, not matched by a pod exclusion, and not known to be terminal.
pub fn select_pods<'a>(
    list: &'a ListPodResourcesResponse,
    cfg: &AccountingConfig,
) -> Result<Vec<&'a PodResources>, AccountingError> {
    let excludes = compile_excludes(cfg)?;
    // NFD spells "all namespaces" as `*`, RTE as the empty string: accept both.
    let namespace = cfg
        .watch_namespace
        .as_deref()
        .filter(|ns| !ns.is_empty() && *ns != "*");
    Ok(list
        .pod_resources
        .iter()
        .filter(|pod| namespace.is_none_or(|ns| pod.namespace == ns))
        .filter(|pod| {
            !excludes
                .iter()
                .any(|e| e.namespace.matches(&pod.namespace) && e.name.matches(&pod.name))
        })
        .filter(|pod| {
            !cfg.terminal_pods
                .contains(&(pod.namespace.clone(), pod.name.clone()))
        })
        .collect())
}

fn pinned(topology: Option<&TopologyInfo>) -> bool {
    topology.is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0))
}

/// RTE's `with-exclusive-resources` rule: a container holds CPU ids, a memory block with a NUMA
/// id ≥ 0, or a device with a NUMA id ≥ 0. Pod-level CPU ids and memory (fields 4/5) qualify
/// too: RTE predates them, and such a pod does hold exclusive resources, which is what the
/// scheduler's side of the fingerprint counts.
pub fn has_exclusive_resources(pod: &PodResources) -> bool {
    let memory_pinned = |blocks: &[ContainerMemory]| blocks.iter().any(|m| pinned(m.topology.as_ref()));
    !pod.cpu_ids.is_empty()
        || memory_pinned(&pod.memory)
        || pod.containers.iter().any(|c| {
            !c.cpu_ids.is_empty()
                || memory_pinned(&c.memory)
                || c.devices
                    .iter()
                    .any(|d| !d.device_ids.is_empty() && pinned(d.topology.as_ref()))
        })
}

/// The pod-set fingerprint of `pods` under `method`.
pub fn pods_fingerprint(pods: &[&PodResources], method: Method) -> String {
    fingerprint::compute(
        pods.iter()
            .filter(|pod| method == Method::All || has_exclusive_resources(pod))
            .map(|pod| (pod.namespace.as_str(), pod.name.as_str())),
    )
}

// ---------------------------------------------------------------------------------------------
// Machine index
// ---------------------------------------------------------------------------------------------

struct MachineIndex<'m> {
    nodes: BTreeMap<u32, &'m NodeView>,
    cpu_node: BTreeMap<u32, u32>,
}

/// Where a kubelet NUMA id points.
enum Numa {
    Known(u32),
    /// Negative: the kubelet's "no affinity".
    Unaligned,
    Unknown(i64),
}

impl<'m> MachineIndex<'m> {
    fn build(machine: &'m MachineView) -> Result<Self, AccountingError> {
        let mut nodes = BTreeMap::new();
        let mut cpu_node = BTreeMap::new();
        for node in &machine.nodes {
            if nodes.insert(node.id, node).is_some() {
                return Err(AccountingError::IndexNumaNode { id: node.id });
            }
            for &cpu in &node.cpus {
                match cpu_node.insert(cpu, node.id) {
                    Some(first) if first != node.id => {
                        return Err(AccountingError::IndexCpu {
                            cpu,
                            first,
                            second: node.id,
                        });
                    }
                    _ => {}
                }
            }
        }
        Ok(Self { nodes, cpu_node })
    }

    fn numa(&self, id: i64) -> Numa {
        if id < 0 {
            return Numa::Unaligned;
        }
        match u32::try_from(id) {
            Ok(n) if self.nodes.contains_key(&n) => Numa::Known(n),
            _ => Numa::Unknown(id),
        }
    }

    /// (CPU, its NUMA node) for a kubelet CPU id, if the machine has it online.
    fn cpu(&self, id: i64) -> Option<(u32, u32)> {
        let cpu = u32::try_from(id).ok()?;
        self.cpu_node.get(&cpu).map(|&node| (cpu, node))
    }

    fn logical_cpus(&self, node: u32) -> u64 {
        self.nodes
            .get(&node)
            .map_or(0, |n| n.cpus.iter().collect::<BTreeSet<_>>().len() as u64)
    }
}

// ---------------------------------------------------------------------------------------------
// Accumulation
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct ZoneTally {
    alloc_cpus: BTreeSet<u32>,
    used_cpus: BTreeSet<u32>,
    /// Memory type → bytes.
    alloc_memory: BTreeMap<String, u64>,
    used_memory: BTreeMap<String, u64>,
    /// Resource → device ids.
    alloc_devices: BTreeMap<String, BTreeSet<String>>,
    used_devices: BTreeMap<String, BTreeSet<String>>,
}

/// A multi-NUMA memory block from List, spread after all exact single-node blocks are known.
struct SpreadBlock {
    memory_type: String,
    size: u64,
    nodes: Vec<u32>,
}

struct Accumulator<'a, 'm> {
    index: &'a MachineIndex<'m>,
    excluded: BTreeSet<&'a str>,
    zones: BTreeMap<u32, ZoneTally>,
    /// Device resources with at least one NUMA-aligned allocatable device (free-devices
    /// attributes are published for these in every zone).
    device_resources: BTreeSet<String>,
    /// Resource → device ids held by some accounted pod, whatever the node.
    used_device_ids: BTreeMap<String, BTreeSet<String>>,
    /// Resource → allocatable device ids without any NUMA node: in no zone, published as the
    /// node attribute [`attr::DEVICES_WITHOUT_NUMA_PREFIX`] so the scheduler can count them.
    unaligned_devices: BTreeMap<String, BTreeSet<String>>,
    /// (resource, device id) → the NUMA nodes GetAllocatableResources gives it: where a used
    /// device is charged, before the List entry's own topology.
    alloc_nodes: BTreeMap<String, BTreeMap<String, Vec<u32>>>,
    anomalies: Vec<Anomaly>,
}

fn overflow(operation: &'static str, node: u32, what: &str) -> AccountingError {
    AccountingError::Overflow {
        operation,
        zone: nrt::zone_name(node),
        what: what.to_owned(),
    }
}

fn add_bytes(
    map: &mut BTreeMap<String, u64>,
    memory_type: &str,
    bytes: u64,
    node: u32,
    operation: &'static str,
) -> Result<(), AccountingError> {
    let total = map.entry(memory_type.to_owned()).or_default();
    *total = total
        .checked_add(bytes)
        .ok_or_else(|| overflow(operation, node, memory_type))?;
    Ok(())
}

fn valid_memory_type(name: &str) -> bool {
    numaplane::resource_name::is_memory_type(name)
}

fn valid_device_resource(name: &str) -> bool {
    use numaplane::resource_name::{Class, classify};
    !name.is_empty() && !matches!(classify(name), Class::Cpu | Class::Memory | Class::Hugepages)
}

/// The distance of a NUMA node to itself (ACPI SLIT `LOCAL_DISTANCE`).
const LOCAL_DISTANCE: i64 = 10;

/// Whether the scheduler can read the id back from a device-ID list attribute.
fn publishable_device_id(id: &str) -> bool {
    nrt::is_listable_device_id(id)
}

impl<'a, 'm> Accumulator<'a, 'm> {
    fn new(index: &'a MachineIndex<'m>, excluded: BTreeSet<&'a str>) -> Self {
        let zones = index.nodes.keys().map(|&id| (id, ZoneTally::default())).collect();
        Self {
            index,
            excluded,
            zones,
            device_resources: BTreeSet::new(),
            used_device_ids: BTreeMap::new(),
            unaligned_devices: BTreeMap::new(),
            alloc_nodes: BTreeMap::new(),
            anomalies: Vec::new(),
        }
    }

    fn note(&mut self, kind: AnomalyKind, detail: String) {
        self.anomalies.push(Anomaly { kind, detail });
    }

    fn zone(&mut self, node: u32) -> &mut ZoneTally {
        // Every known node got a tally in `new`; callers only pass known nodes.
        self.zones.entry(node).or_default()
    }

    /// Known NUMA nodes of a topology, ascending and deduplicated; unknown ids are noted.
    fn known_nodes(&mut self, topology: Option<&TopologyInfo>, what: &str) -> Vec<u32> {
        let mut known = BTreeSet::new();
        for n in topology.map(|t| t.nodes.as_slice()).unwrap_or_default() {
            match self.index.numa(n.id) {
                Numa::Known(id) => {
                    known.insert(id);
                }
                Numa::Unaligned => {}
                Numa::Unknown(id) => self.note(
                    AnomalyKind::UnknownNuma,
                    format!("{what}: NUMA node {id} is not on this machine"),
                ),
            }
        }
        known.into_iter().collect()
    }

    /// NUMA nodes of a memory block, or `None` when the block is to be skipped (noted).
    fn memory_placement(&mut self, block: &ContainerMemory, what: &str) -> Option<Vec<u32>> {
        if block.size == 0 {
            // The kubelet omits empty blocks; a zero size carries no information.
            return None;
        }
        if !valid_memory_type(&block.memory_type) {
            self.note(
                AnomalyKind::InvalidResourceName,
                format!(
                    "{what}: memory type {:?} is neither memory nor hugepages-<size>",
                    block.memory_type
                ),
            );
            return None;
        }
        if self.excluded.contains(block.memory_type.as_str()) {
            return None;
        }
        let nodes = self.known_nodes(block.topology.as_ref(), what);
        let any_unknown = block
            .topology
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
        if nodes.is_empty() {
            if !any_unknown {
                self.note(
                    AnomalyKind::UnalignedMemory,
                    format!(
                        "{what}: {} block of {} bytes has no NUMA node",
                        block.memory_type, block.size
                    ),
                );
            }
            return None;
        }
        Some(nodes)
    }

    /// NUMA nodes of a device entry, or `None` when the entry is to be skipped (noted).
    fn device_placement(&mut self, dev: &ContainerDevices, what: &str) -> Option<Vec<u32>> {
        self.device_resource_usable(dev, what)
            .then(|| self.entry_nodes(dev, what))
    }

    /// Whether a device entry's resource is accounted: a valid device resource name (noted
    /// otherwise) that is not excluded.
    fn device_resource_usable(&mut self, dev: &ContainerDevices, what: &str) -> bool {
        if !valid_device_resource(&dev.resource_name) {
            self.note(
                AnomalyKind::InvalidResourceName,
                format!(
                    "{what}: device resource name {:?} is empty or reserved",
                    dev.resource_name
                ),
            );
            return false;
        }
        !self.excluded.contains(dev.resource_name.as_str())
    }

    /// The NUMA nodes of a device entry's own topology (a device without any is noted).
    fn entry_nodes(&mut self, dev: &ContainerDevices, what: &str) -> Vec<u32> {
        let nodes = self.known_nodes(dev.topology.as_ref(), what);
        let any_unknown = dev
            .topology
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
        if nodes.is_empty() && !any_unknown && !dev.device_ids.is_empty() {
            self.note(
                AnomalyKind::UnalignedDevice,
                format!(
                    "{what}: {} devices {:?} have no NUMA affinity",
                    dev.resource_name, dev.device_ids
                ),
            );
        }
        nodes
    }

    fn add_allocatable(&mut self, alloc: &AllocatableResourcesResponse) -> Result<(), AccountingError> {
        if !self.excluded.contains(RESOURCE_CPU) {
            let mut seen = BTreeSet::new();
            for &raw in &alloc.cpu_ids {
                if !seen.insert(raw) {
                    self.note(
                        AnomalyKind::DuplicateCpu,
                        format!("allocatable: CPU {raw} is listed twice"),
                    );
                    continue;
                }
                match self.index.cpu(raw) {
                    Some((cpu, node)) => {
                        self.zone(node).alloc_cpus.insert(cpu);
                    }
                    None => self.note(
                        AnomalyKind::UnknownCpu,
                        format!("allocatable: CPU {raw} is not an online CPU of this machine"),
                    ),
                }
            }
        }

        for block in &alloc.memory {
            let Some(nodes) = self.memory_placement(block, "allocatable memory") else {
                continue;
            };
            if let [node] = nodes[..] {
                add_bytes(
                    &mut self.zone(node).alloc_memory,
                    &block.memory_type,
                    block.size,
                    node,
                    "summing allocatable",
                )?;
                continue;
            }
            self.note(
                AnomalyKind::MultiNumaAllocatable,
                format!(
                    "allocatable: {} block of {} bytes spans NUMA nodes {nodes:?}; split evenly",
                    block.memory_type, block.size
                ),
            );
            // The kubelet sends one block per node; should that change, an even split keeps the
            // node total right without inventing a per-node breakdown. The remainder goes to the
            // lowest nodes, a byte each.
            let count = nodes.len() as u64;
            let (share, remainder) = (block.size / count, block.size % count);
            for (i, &node) in nodes.iter().enumerate() {
                let bytes = share + u64::from((i as u64) < remainder);
                add_bytes(
                    &mut self.zone(node).alloc_memory,
                    &block.memory_type,
                    bytes,
                    node,
                    "summing allocatable",
                )?;
            }
        }

        for dev in &alloc.devices {
            let Some(nodes) = self.device_placement(dev, "allocatable") else {
                continue;
            };
            // No NUMA node at all (no topology, or only the kubelet's negative "none"), as
            // opposed to a node this machine lacks (an anomaly, left out).
            let unaligned = nodes.is_empty()
                && !dev
                    .topology
                    .as_ref()
                    .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
            for id in &dev.device_ids {
                if id.is_empty() {
                    self.note(
                        AnomalyKind::InvalidDeviceId,
                        format!("allocatable: empty {} device id", dev.resource_name),
                    );
                    continue;
                }
                if !nodes.is_empty() && !publishable_device_id(id) {
                    self.note(
                        AnomalyKind::InvalidDeviceId,
                        format!(
                            "allocatable: {} device id {id:?} cannot be listed in the free-devices attribute",
                            dev.resource_name
                        ),
                    );
                }
                if unaligned {
                    self.unaligned_devices
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .insert(id.clone());
                }
                if !nodes.is_empty() {
                    self.alloc_nodes
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .entry(id.clone())
                        .or_default()
                        .extend(nodes.iter().copied());
                }
                for &node in &nodes {
                    self.device_resources.insert(dev.resource_name.clone());
                    let ids = self
                        .zone(node)
                        .alloc_devices
                        .entry(dev.resource_name.clone())
                        .or_default();
                    if !ids.insert(id.clone()) {
                        self.note(
                            AnomalyKind::DuplicateDevice,
                            format!(
                                "allocatable: {} device {id} on NUMA node {node} is listed twice",
                                dev.resource_name
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    fn add_used(&mut self, pods: &[&PodResources]) -> Result<(), AccountingError> {
        // Exclusive resources belong to one pod; a second claimant is stale data (e.g. a
        // terminal pod on an old kubelet) and must not be subtracted twice.
        let mut cpu_owner: BTreeMap<u32, usize> = BTreeMap::new();
        let mut device_owner: BTreeMap<(String, String, u32), usize> = BTreeMap::new();
        let mut spread = Vec::new();

        for (pi, pod) in pods.iter().enumerate() {
            let owner = format!("pod {}/{}", pod.namespace, pod.name);

            if !self.excluded.contains(RESOURCE_CPU) {
                // Pod-level CPUs overlap the containers' by design: count each CPU once.
                let cpus: BTreeSet<i64> = pod
                    .cpu_ids
                    .iter()
                    .chain(pod.containers.iter().flat_map(|c| &c.cpu_ids))
                    .copied()
                    .collect();
                for raw in cpus {
                    let Some((cpu, node)) = self.index.cpu(raw) else {
                        self.note(
                            AnomalyKind::UnknownCpu,
                            format!("{owner}: CPU {raw} is not an online CPU of this machine"),
                        );
                        continue;
                    };
                    if let Some(&first) = cpu_owner.get(&cpu) {
                        let first = pods.get(first).map(|p| format!("{}/{}", p.namespace, p.name));
                        self.note(
                            AnomalyKind::DoubleAssignment,
                            format!(
                                "{owner}: CPU {cpu} is also held by pod {}",
                                first.unwrap_or_default()
                            ),
                        );
                        continue;
                    }
                    cpu_owner.insert(cpu, pi);
                    self.zone(node).used_cpus.insert(cpu);
                }
            }

            // Pod-level memory is the pod's whole exclusive memory, container blocks are a view
            // of the same bytes: prefer the pod-level blocks when present.
            let blocks: Vec<&ContainerMemory> = if pod.memory.is_empty() {
                pod.containers.iter().flat_map(|c| &c.memory).collect()
            } else {
                pod.memory.iter().collect()
            };
            for block in blocks {
                let Some(nodes) = self.memory_placement(block, &owner) else {
                    continue;
                };
                if let [node] = nodes[..] {
                    add_bytes(
                        &mut self.zone(node).used_memory,
                        &block.memory_type,
                        block.size,
                        node,
                        "summing used",
                    )?;
                } else {
                    spread.push(SpreadBlock {
                        memory_type: block.memory_type.clone(),
                        size: block.size,
                        nodes,
                    });
                }
            }

            for dev in pod.containers.iter().flat_map(|c| &c.devices) {
                if !self.device_resource_usable(dev, &owner) {
                    continue;
                }
                // The entry's own topology is only the fallback for ids allocatable does not
                // place (a List entry may come without topology).
                let mut entry_nodes: Option<Vec<u32>> = None;
                for id in &dev.device_ids {
                    if id.is_empty() {
                        self.note(
                            AnomalyKind::InvalidDeviceId,
                            format!("{owner}: empty {} device id", dev.resource_name),
                        );
                        continue;
                    }
                    // Marked used whatever its placement, so it is never offered as free.
                    self.used_device_ids
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .insert(id.clone());
                    let placed = self
                        .alloc_nodes
                        .get(dev.resource_name.as_str())
                        .and_then(|ids| ids.get(id.as_str()));
                    let nodes = match placed {
                        Some(n) => n.clone(),
                        None => {
                            if entry_nodes.is_none() {
                                entry_nodes = Some(self.entry_nodes(dev, &owner));
                            }
                            entry_nodes.clone().unwrap_or_default()
                        }
                    };
                    for &node in &nodes {
                        let key = (dev.resource_name.clone(), id.clone(), node);
                        if let Some(&first) = device_owner.get(&key) {
                            if first != pi {
                                let first = pods.get(first).map(|p| format!("{}/{}", p.namespace, p.name));
                                self.note(
                                    AnomalyKind::DoubleAssignment,
                                    format!(
                                        "{owner}: {} device {id} is also held by pod {}",
                                        dev.resource_name,
                                        first.unwrap_or_default()
                                    ),
                                );
                            }
                            continue;
                        }
                        device_owner.insert(key, pi);
                        self.zone(node)
                            .used_devices
                            .entry(dev.resource_name.clone())
                            .or_default()
                            .insert(id.clone());
                    }
                }
            }
        }

        for block in spread {
            self.spread_memory(&block)?;
        }
        Ok(())
    }

    /// Spreads a multi-NUMA block the way the memory manager filled it: ascending node order,
    /// each node up to what it has left; whatever does not fit stays on the last node, where it
    /// shows up as used beyond allocatable instead of vanishing.
    fn spread_memory(&mut self, block: &SpreadBlock) -> Result<(), AccountingError> {
        let mut remaining = block.size;
        let last = block.nodes.len().saturating_sub(1);
        for (i, &node) in block.nodes.iter().enumerate() {
            let tally = self.zone(node);
            let alloc = tally.alloc_memory.get(&block.memory_type).copied().unwrap_or(0);
            let used = tally.used_memory.get(&block.memory_type).copied().unwrap_or(0);
            let take = if i == last {
                remaining
            } else {
                remaining.min(alloc.saturating_sub(used))
            };
            if take == 0 {
                continue;
            }
            add_bytes(
                &mut tally.used_memory,
                &block.memory_type,
                take,
                node,
                "spreading multi-NUMA memory",
            )?;
            remaining -= take;
        }
        Ok(())
    }

    /// Charges what a pod's init containers hold in number only (pod-spec source): free CPUs
    /// and devices next to the pod's own first (the kubelet aligned them with the same hint),
    /// then in the zones with the most free, lowest IDs first.
    fn add_counted(&mut self, pod: &PodResources, held: &Held) {
        let owner = format!("pod {}/{}", pod.namespace, pod.name);
        if held.cpu_count > 0 && !self.excluded.contains(RESOURCE_CPU) {
            let own: BTreeSet<u32> = pod
                .containers
                .iter()
                .flat_map(|c| &c.cpu_ids)
                .filter_map(|&c| self.index.cpu(c).map(|(_, node)| node))
                .collect();
            let order = self.zone_order(&own, |t| t.alloc_cpus.difference(&t.used_cpus).count());
            let mut left = held.cpu_count;
            for node in order {
                let tally = self.zone(node);
                let free: Vec<u32> = tally.alloc_cpus.difference(&tally.used_cpus).copied().collect();
                for cpu in free.into_iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
                    tally.used_cpus.insert(cpu);
                    left -= 1;
                }
            }
            if left > 0 {
                self.note(
                    AnomalyKind::UsedExceedsAllocatable,
                    format!("{owner}: init containers hold {left} more CPUs than are free"),
                );
            }
        }
        for (resource, &count) in &held.device_counts {
            if count == 0 || self.excluded.contains(resource.as_str()) {
                continue;
            }
            let own: BTreeSet<u32> = pod
                .containers
                .iter()
                .flat_map(|c| &c.devices)
                .filter(|d| &d.resource_name == resource)
                .flat_map(|d| &d.device_ids)
                .filter_map(|id| self.alloc_nodes.get(resource).and_then(|ids| ids.get(id)))
                .flatten()
                .copied()
                .collect();
            let used_anywhere = self.used_device_ids.get(resource).cloned().unwrap_or_default();
            let free_in = |t: &ZoneTally| -> Vec<String> {
                t.alloc_devices
                    .get(resource)
                    .into_iter()
                    .flatten()
                    .filter(|id| !used_anywhere.contains(*id))
                    .cloned()
                    .collect()
            };
            let order = self.zone_order(&own, |t| free_in(t).len());
            let mut left = count;
            for node in order {
                let free = free_in(self.zone(node));
                for id in free.into_iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
                    if !self
                        .used_device_ids
                        .entry(resource.clone())
                        .or_default()
                        .insert(id.clone())
                    {
                        continue;
                    }
                    self.zone(node)
                        .used_devices
                        .entry(resource.clone())
                        .or_default()
                        .insert(id);
                    left -= 1;
                }
            }
            if left > 0 {
                self.note(
                    AnomalyKind::UsedExceedsAllocatable,
                    format!("{owner}: init containers hold {left} more {resource} than are free"),
                );
            }
        }
    }

    /// The pod's own zones ascending, then the others by most free (`free`), then by id.
    fn zone_order(&self, own: &BTreeSet<u32>, free: impl Fn(&ZoneTally) -> usize) -> Vec<u32> {
        let mut others: Vec<(usize, u32)> = self
            .zones
            .iter()
            .filter(|(id, _)| !own.contains(id))
            .map(|(&id, t)| (free(t), id))
            .collect();
        others.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        own.iter()
            .copied()
            .filter(|id| self.zones.contains_key(id))
            .chain(others.into_iter().map(|(_, id)| id))
            .collect()
    }

    fn build_zones(&mut self) -> Result<Vec<Zone>, AccountingError> {
        let index = self.index;
        let tallies = std::mem::take(&mut self.zones);
        let mut zones = Vec::with_capacity(tallies.len());
        for (&id, node) in &index.nodes {
            let empty = ZoneTally::default();
            let tally = tallies.get(&id).unwrap_or(&empty);
            zones.push(self.build_zone(id, node, tally)?);
        }
        zones.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(zones)
    }

    fn build_zone(&mut self, id: u32, node: &NodeView, tally: &ZoneTally) -> Result<Zone, AccountingError> {
        let zone = nrt::zone_name(id);
        let mut rows = Vec::new();
        let cpu_published = !self.excluded.contains(RESOURCE_CPU);
        let logical_cpus = self.index.logical_cpus(id);

        if cpu_published && !tally.alloc_cpus.is_empty() {
            let (alloc, used) = (tally.alloc_cpus.len() as u64, tally.used_cpus.len() as u64);
            rows.push(self.row(&zone, RESOURCE_CPU, Some(logical_cpus), alloc, used)?);
        }
        for (memory_type, &alloc) in &tally.alloc_memory {
            let used = tally.used_memory.get(memory_type).copied().unwrap_or(0);
            rows.push(self.row(
                &zone,
                memory_type,
                memory_capacity(node, memory_type),
                alloc,
                used,
            )?);
        }
        for (resource, ids) in &tally.alloc_devices {
            let used = tally.used_devices.get(resource).map_or(0, BTreeSet::len) as u64;
            rows.push(self.row(&zone, resource, None, ids.len() as u64, used)?);
        }
        // Every NUMA node stays visible, even one with nothing allocatable (memory-only nodes,
        // CPU manager policy `none` without devices or memory).
        if rows.is_empty() && cpu_published {
            rows.push(self.row(
                &zone,
                RESOURCE_CPU,
                Some(logical_cpus),
                0,
                tally.used_cpus.len() as u64,
            )?);
        }

        // Used where nothing is allocatable: no row to subtract from, but worth counting.
        let has_row = |name: &str| rows.iter().any(|r: &ResourceInfo| r.name == name);
        let mut orphans = Vec::new();
        if !tally.used_cpus.is_empty() && !has_row(RESOURCE_CPU) {
            orphans.push((RESOURCE_CPU.to_owned(), tally.used_cpus.len() as u64));
        }
        for (memory_type, &used) in &tally.used_memory {
            if used > 0 && !has_row(memory_type) {
                orphans.push((memory_type.clone(), used));
            }
        }
        for (resource, ids) in &tally.used_devices {
            if !ids.is_empty() && !has_row(resource) {
                orphans.push((resource.clone(), ids.len() as u64));
            }
        }
        for (resource, used) in orphans {
            self.note(
                AnomalyKind::UsedExceedsAllocatable,
                format!("{zone}: {used} of {resource} used but none allocatable"),
            );
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));

        let mut attributes = Vec::new();
        for resource in &self.device_resources {
            let used = self.used_device_ids.get(resource);
            let free = tally
                .alloc_devices
                .get(resource)
                .into_iter()
                .flatten()
                .filter(|id| publishable_device_id(id) && !used.is_some_and(|u| u.contains(*id)));
            attributes.push(AttributeInfo {
                name: format!("{}{resource}", attr::FREE_DEVICES_PREFIX),
                value: nrt::join_device_ids(free),
            });
        }
        if !node.cores.is_empty() && !self.excluded.contains(RESOURCE_CPU) {
            let free_cores = node
                .cores
                .iter()
                .filter(|core| {
                    !core.is_empty()
                        && core
                            .iter()
                            .all(|c| tally.alloc_cpus.contains(c) && !tally.used_cpus.contains(c))
                })
                .count();
            attributes.push(AttributeInfo {
                name: attr::FREE_CORES.to_owned(),
                value: free_cores.to_string(),
            });
        }
        attributes.sort_by(|a, b| a.name.cmp(&b.name));

        let mut costs = Vec::new();
        let mut seen = BTreeSet::new();
        for &(to, distance) in &node.distances {
            if !seen.insert(to) {
                continue;
            }
            let name = nrt::zone_name(to);
            let value = i64::try_from(distance).map_err(|_| overflow("publishing distance", id, &name))?;
            costs.push(CostInfo { name, value });
        }
        // hwloc has no matrix on a one-node machine (and the kernel row may be missing): a zone
        // is always at the local distance from itself, as RTE and NFD publish it.
        if seen.insert(id) {
            costs.push(CostInfo {
                name: nrt::zone_name(id),
                value: LOCAL_DISTANCE,
            });
        }
        costs.sort_by(|a, b| a.name.cmp(&b.name));

        Ok(Zone {
            name: zone,
            zone_type: nrt::ZONE_TYPE_NODE.to_owned(),
            parent: None,
            costs: (!costs.is_empty()).then_some(costs),
            attributes: (!attributes.is_empty()).then_some(attributes),
            resources: Some(rows),
        })
    }

    fn row(
        &mut self,
        zone: &str,
        name: &str,
        capacity: Option<u64>,
        allocatable: u64,
        used: u64,
    ) -> Result<ResourceInfo, AccountingError> {
        let capacity = match capacity {
            Some(c) if c >= allocatable => c,
            Some(c) if c > 0 => {
                self.note(
                    AnomalyKind::AllocatableExceedsCapacity,
                    format!("{zone}: {name} allocatable {allocatable} exceeds machine capacity {c}"),
                );
                allocatable
            }
            _ => allocatable,
        };
        if used > allocatable {
            self.note(
                AnomalyKind::UsedExceedsAllocatable,
                format!(
                    "{zone}: {name} used {used} exceeds allocatable {allocatable}; available clamped to 0"
                ),
            );
        }
        let available = allocatable.saturating_sub(used);
        let quantity = |value: u64, field: &'static str| {
            i64::try_from(value)
                .map(|v| K8sQuantity::from(Quantity::from_int(v, Format::DecimalSI)))
                .map_err(|_| AccountingError::Overflow {
                    operation: field,
                    zone: zone.to_owned(),
                    what: name.to_owned(),
                })
        };
        Ok(ResourceInfo {
            name: name.to_owned(),
            capacity: quantity(capacity, "publishing capacity")?,
            allocatable: quantity(allocatable, "publishing allocatable")?,
            available: quantity(available, "publishing available")?,
        })
    }
}

/// Machine capacity of a memory type on a node (`None` when unknown or zero).
fn memory_capacity(node: &NodeView, memory_type: &str) -> Option<u64> {
    if memory_type == RESOURCE_MEMORY {
        return node.memory_bytes.filter(|&b| b > 0);
    }
    if let Some(&bytes) = node.hugepages_bytes.get(memory_type) {
        return Some(bytes).filter(|&b| b > 0);
    }
    // Same page size spelled differently (`hugepages-2048Ki` vs `hugepages-2Mi`).
    let size = parse_hugepage_resource_name(memory_type)?;
    node.hugepages_bytes
        .iter()
        .find(|(name, _)| parse_hugepage_resource_name(name) == Some(size))
        .map(|(_, &bytes)| bytes)
        .filter(|&b| b > 0)
}

fn or_default<'s>(value: &'s str, default: &'s str) -> &'s str {
    if value.is_empty() { default } else { value }
}

// ---------------------------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------------------------

/// DRA devices per driver across `pods` (each claim device once per pod, though several
/// containers may share the claim).
fn dra_devices(pods: &[&PodResources]) -> BTreeMap<String, usize> {
    let mut seen: BTreeSet<(&str, &str, &str, &str, &str, &str)> = BTreeSet::new();
    for pod in pods {
        for c in &pod.containers {
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    seen.insert((
                        pod.namespace.as_str(),
                        pod.name.as_str(),
                        claim.claim_name.as_str(),
                        r.driver_name.as_str(),
                        r.pool_name.as_str(),
                        r.device_name.as_str(),
                    ));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (_, _, _, driver, _, _) in seen {
        *out.entry(driver.to_owned()).or_insert(0) += 1;
    }
    out
}

/// Name of the pseudo-container that carries what a pod's init containers still hold.
const HELD_BY_INIT: &str = "(held by init containers)";

fn topology(nodes: &[i64]) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: nodes.iter().map(|&id| NumaNode { id }).collect(),
    })
}

/// `pod` with the identified part of `held` added as one more container (memory at pod level
/// when the kubelet reports pod-level memory, since that replaces the containers' blocks).
fn with_held(pod: &PodResources, held: &Held) -> PodResources {
    let mut pod = pod.clone();
    let mut extra = ContainerResources {
        name: HELD_BY_INIT.to_owned(),
        cpu_ids: held.cpu_ids.iter().map(|&c| i64::from(c)).collect(),
        ..Default::default()
    };
    for (resource, ids) in &held.device_ids {
        // One entry per NUMA placement, as the kubelet groups them.
        let mut by_nodes: BTreeMap<&[i64], Vec<String>> = BTreeMap::new();
        for (id, nodes) in ids {
            by_nodes.entry(nodes.as_slice()).or_default().push(id.clone());
        }
        for (nodes, device_ids) in by_nodes {
            extra.devices.push(ContainerDevices {
                resource_name: resource.clone(),
                device_ids,
                topology: topology(nodes),
            });
        }
    }
    let memory = held.memory.iter().map(|b| ContainerMemory {
        memory_type: b.memory_type.clone(),
        size: b.size,
        topology: topology(&b.numa_affinity),
    });
    if pod.memory.is_empty() {
        extra.memory.extend(memory);
    } else {
        pod.memory.extend(memory);
    }
    pod.containers.push(extra);
    pod
}

/// Accounts one List response against the allocatable resources and the machine.
///
/// Errors only for what cannot be published truthfully (overflowing sizes, an inconsistent
/// machine model, an invalid exclusion glob); everything else is an [`Anomaly`].
pub fn account(
    machine: &MachineView,
    allocatable: &AllocatableResourcesResponse,
    list: &ListPodResourcesResponse,
    cfg: &AccountingConfig,
) -> Result<Accounting, AccountingError> {
    let index = MachineIndex::build(machine)?;
    let pods = select_pods(list, cfg)?;

    let mut acc = Accumulator::new(&index, cfg.excluded_resources());
    acc.add_allocatable(allocatable)?;
    // Init containers' leftovers with known identities are charged as part of their pod (so the
    // pod's own CPUs and devices are never counted twice); counted ones once all IDs are known.
    let charged: Vec<Cow<'_, PodResources>> = pods
        .iter()
        .map(
            |p| match cfg.held_beyond_list.get(&(p.namespace.clone(), p.name.clone())) {
                Some(held) => Cow::Owned(with_held(p, held)),
                None => Cow::Borrowed(*p),
            },
        )
        .collect();
    let charged: Vec<&PodResources> = charged.iter().map(AsRef::as_ref).collect();
    acc.add_used(&charged)?;
    for pod in &charged {
        if let Some(held) = cfg
            .held_beyond_list
            .get(&(pod.namespace.clone(), pod.name.clone()))
        {
            acc.add_counted(pod, held);
        }
    }
    let zones = acc.build_zones()?;

    let mut attributes = Vec::new();
    let mut annotations = BTreeMap::new();
    let fingerprint = cfg
        .fingerprint_method
        .map(|method| pods_fingerprint(&pods, method));
    if let (Some(fp), Some(method)) = (&fingerprint, cfg.fingerprint_method) {
        attributes.push(AttributeInfo {
            name: attr::PODS_FINGERPRINT.to_owned(),
            value: fp.clone(),
        });
        attributes.push(AttributeInfo {
            name: attr::PODS_FINGERPRINT_METHOD.to_owned(),
            value: method.to_string(),
        });
        annotations.insert(nrt::ANNOTATION_FINGERPRINT.to_owned(), fp.clone());
    }
    // Empty values would be ignored by the scheduler anyway; publish what the kubelet runs with,
    // unless it is not known at all.
    let scope = or_default(&cfg.topology_manager_scope, DEFAULT_TOPOLOGY_MANAGER_SCOPE);
    let policy = or_default(&cfg.topology_manager_policy, DEFAULT_TOPOLOGY_MANAGER_POLICY);
    let publish = |value: &str| !value.is_empty() || !cfg.kubelet_config_unknown;
    if publish(&cfg.topology_manager_scope) {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_SCOPE.to_owned(),
            value: scope.to_owned(),
        });
    }
    if publish(&cfg.topology_manager_policy) {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_POLICY.to_owned(),
            value: policy.to_owned(),
        });
    }
    if let Some(max) = cfg.max_numa_nodes {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES.to_owned(),
            value: max.to_string(),
        });
    }
    if let Some(rm) = &cfg.resource_managers {
        attributes.push(AttributeInfo {
            name: attr::CPU_MANAGER_POLICY.to_owned(),
            value: rm.cpu_manager_policy.clone(),
        });
        if !rm.cpu_manager_policy_options.is_empty() {
            let options: Vec<String> = rm
                .cpu_manager_policy_options
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            attributes.push(AttributeInfo {
                name: attr::CPU_MANAGER_POLICY_OPTIONS.to_owned(),
                value: options.join(","),
            });
        }
        if let Some(reserved) = &rm.reserved_cpus {
            attributes.push(AttributeInfo {
                name: attr::RESERVED_CPUS.to_owned(),
                value: reserved.clone(),
            });
        }
        attributes.push(AttributeInfo {
            name: attr::MEMORY_MANAGER_POLICY.to_owned(),
            value: rm.memory_manager_policy.clone(),
        });
    }
    if let Some(width) = machine.nodes.iter().flat_map(|n| &n.cores).map(Vec::len).max() {
        attributes.push(AttributeInfo {
            name: attr::THREADS_PER_CORE.to_owned(),
            value: width.to_string(),
        });
    }
    if let Some(closest) = cfg.prefer_closest_numa_nodes {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_PREFER_CLOSEST.to_owned(),
            value: closest.to_string(),
        });
    }
    if let Some(groups) = &cfg.memory_groups {
        attributes.push(AttributeInfo {
            name: attr::MEMORY_GROUPS.to_owned(),
            value: nrt::join_memory_groups(groups),
        });
    }
    if let Some(sources) = &cfg.held_sources {
        attributes.push(AttributeInfo {
            name: attr::INIT_HELD_SOURCE.to_owned(),
            value: sources.to_string(),
        });
    }
    for resource in &cfg.cluster_shared {
        let held = acc
            .used_device_ids
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|id| publishable_device_id(id));
        attributes.push(AttributeInfo {
            name: format!("{}{resource}", attr::CLUSTER_HELD_PREFIX),
            value: nrt::join_device_ids(held),
        });
    }

    // Devices without a NUMA node are in no zone; the kubelet still hands them out (and its
    // Topology Manager decides differently for them), so the scheduler needs what is free.
    for (resource, ids) in &acc.unaligned_devices {
        let used = acc.used_device_ids.get(resource);
        let free: Vec<&String> = ids
            .iter()
            .filter(|id| !used.is_some_and(|u| u.contains(*id)))
            .collect();
        attributes.push(AttributeInfo {
            name: format!("{}{resource}", attr::DEVICES_WITHOUT_NUMA_PREFIX),
            value: nrt::join_devices_without_numa(u64::try_from(free.len()).unwrap_or(u64::MAX), free),
        });
    }

    Ok(Accounting {
        zones,
        attributes,
        topology_policy: nrt::legacy_topology_policy(policy, scope).to_owned(),
        annotations,
        anomalies: acc.anomalies,
        pods_accounted: pods.len(),
        pods_with_exclusive: pods.iter().filter(|p| has_exclusive_resources(p)).count(),
        dra_devices: dra_devices(&pods),
        fingerprint,
    })
}
