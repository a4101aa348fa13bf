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
//!
//! Modules: [`machine`] (the CPU/zone index), [`select`] (which pods, the fingerprint, DRA),
//! [`tally`] (what pods hold, per zone), [`init_held_merge`] (init containers' leftovers),
//! [`zones`] (the NRT zones), [`attributes`] (every NRT attribute); [`account`] ties them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use numaplane::nrt::{self, AttributeInfo, NodeResourceTopology, Zone};
use numaplane::proto::podresources::{AllocatableResourcesResponse, ListPodResourcesResponse, PodResources};

mod attributes;
mod config;
mod init_held_merge;
mod machine;
mod select;
mod tally;
mod zones;

#[cfg(test)]
mod tests;

pub use config::{
    AccountingConfig, DEFAULT_TOPOLOGY_MANAGER_POLICY, DEFAULT_TOPOLOGY_MANAGER_SCOPE, EXCLUDE_ALL_NODES,
    PodExclude, ResourceManagers,
};
pub use machine::{MachineView, NodeView};
pub use numaplane::resource_name::{CPU as RESOURCE_CPU, HUGEPAGES_PREFIX, MEMORY as RESOURCE_MEMORY};
pub use select::{has_exclusive_resources, pods_fingerprint, select_pods};

use attributes::or_default;
use init_held_merge::with_held;
use machine::MachineIndex;
use select::dra_devices;
use tally::Accumulator;

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

    let fingerprint = cfg
        .fingerprint_method
        .map(|method| pods_fingerprint(&pods, method));
    let node_level = cfg.node_level.as_ref().map(|input| {
        let kubelet_devices: std::collections::BTreeSet<&str> = allocatable
            .devices
            .iter()
            .map(|d| d.resource_name.as_str())
            .collect();
        crate::allocatable_follow::node_level(input, &kubelet_devices, &cfg.excluded_resources())
    });
    let (attributes, annotations) = attributes::attributes(
        machine,
        cfg,
        &pods,
        &acc,
        fingerprint.as_ref(),
        node_level.as_ref(),
    );
    let scope = or_default(&cfg.topology_manager_scope, DEFAULT_TOPOLOGY_MANAGER_SCOPE);
    let policy = or_default(&cfg.topology_manager_policy, DEFAULT_TOPOLOGY_MANAGER_POLICY);

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
