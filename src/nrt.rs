//! NodeResourceTopology `topology.node.k8s.io/v1alpha2`, wire-compatible with the upstream CRD
//! (k8stopologyawareschedwg/noderesourcetopology-api) and with scheduler-plugins.
//!
//! The upstream object keeps `zones`, `attributes` and `topologyPolicies` at the top level, with
//! no `spec`, which kube's `CustomResource` derive cannot express; so the type implements
//! [`kube_core::Resource`] by hand. Quantities stay Kubernetes quantity strings on the wire so that
//! objects round-trip unchanged; the scheduler parses them into exact values with typed errors.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta};
use kube_core::ClusterResourceScope;
use serde::{Deserialize, Deserializer, Serialize};

/// API group of the NodeResourceTopology CRD.
pub const GROUP: &str = "topology.node.k8s.io";
/// Storage version written by numaplane.
pub const VERSION: &str = "v1alpha2";
/// Kind of the object.
pub const KIND: &str = "NodeResourceTopology";
/// Plural resource name.
pub const PLURAL: &str = "noderesourcetopologies";
/// `apiVersion` of objects written by numaplane.
pub const API_VERSION: &str = "topology.node.k8s.io/v1alpha2";
/// The CRD's name, as `kubectl get crd` shows it.
pub const CRD_NAME: &str = "noderesourcetopologies.topology.node.k8s.io";
/// What the exporter and the scheduler say, in logs and in `/readyz`, while the CRD is missing.
pub const CRD_MISSING: &str =
    "the NodeResourceTopology CRD (noderesourcetopologies.topology.node.k8s.io) is not installed";
/// Zone type of a NUMA node zone (exact, case-sensitive).
pub const ZONE_TYPE_NODE: &str = "Node";
/// Prefix of NUMA zone names: `node-<os id>`.
pub const ZONE_NAME_PREFIX: &str = "node-";

/// Well-known attribute names.
pub mod attr {
    /// Kubelet Topology Manager policy (`none`, `best-effort`, `restricted`, `single-numa-node`).
    pub const TOPOLOGY_MANAGER_POLICY: &str = "topologyManagerPolicy";
    /// Kubelet Topology Manager scope (`container`, `pod`).
    pub const TOPOLOGY_MANAGER_SCOPE: &str = "topologyManagerScope";
    /// Kubelet `max-allowable-numa-nodes` policy option (integer > 1).
    pub const TOPOLOGY_MANAGER_MAX_NUMA_NODES: &str = "topologyManagerMaxNUMANodes";
    /// Kubelet `prefer-closest-numa-nodes` policy option (`true`/`false`), upstream's naming
    /// convention `topologyManagerOption<OptionNameCamel>`.
    pub const TOPOLOGY_MANAGER_PREFER_CLOSEST: &str = "topologyManagerOptionPreferClosestNumaNodes";
    /// Pod-set fingerprint, `pfp0v001…`.
    pub const PODS_FINGERPRINT: &str = crate::fingerprint::ATTRIBUTE_FINGERPRINT;
    /// Which pods enter the fingerprint: `all` or `with-exclusive-resources`.
    pub const PODS_FINGERPRINT_METHOD: &str = crate::fingerprint::ATTRIBUTE_METHOD;
    /// Kubelet CPU manager policy (`none`, `static`); numaplane extension, published when the
    /// kubelet config is read.
    pub const CPU_MANAGER_POLICY: &str = "numaplane.io/cpu-manager-policy";
    /// Kubelet CPU manager policy options, `name=value` pairs sorted by name and joined by
    /// commas (e.g. `full-pcpus-only=true`); absent when none are set.
    pub const CPU_MANAGER_POLICY_OPTIONS: &str = "numaplane.io/cpu-manager-policy-options";
    /// Kubelet Topology Manager policy options, every one the configuration sets (known or
    /// not), `name=value` pairs sorted by name and joined by commas, as
    /// [`CPU_MANAGER_POLICY_OPTIONS`]; absent when none are set. The scheduler names the ones
    /// its model does not know as making its predictions approximate.
    pub const TOPOLOGY_MANAGER_POLICY_OPTIONS: &str = "numaplane.io/topology-manager-policy-options";
    /// Kubelet `reservedSystemCPUs`, as the kubelet config writes it (a cpuset, e.g. `0-1,8`).
    pub const RESERVED_CPUS: &str = "numaplane.io/reserved-cpus";
    /// Kubelet memory manager policy (`None`, `Static`).
    pub const MEMORY_MANAGER_POLICY: &str = "numaplane.io/memory-manager-policy";
    /// Logical CPUs per physical core on this machine (the SMT width; the widest core).
    pub const THREADS_PER_CORE: &str = "numaplane.io/threads-per-core";
    /// Zone attribute: physical cores of the zone whose every logical CPU is allocatable and
    /// held by no pod (what `full-pcpus-only` can hand out whole).
    pub const FREE_CORES: &str = "numaplane.io/free-cores";
    /// Node attribute (numaplane extension): where the resources init containers still hold
    /// were read from, per kind: `cpu=checkpoint,devices=pod-spec,memory=none`.
    pub const INIT_HELD_SOURCE: &str = "numaplane.io/init-held-source";
    /// Node attribute (numaplane extension): the Static memory manager's NUMA groups that hold
    /// memory now, read from its checkpoint; see [`super::join_memory_groups`]. Absent: unknown.
    pub const MEMORY_GROUPS: &str = "numaplane.io/memory-groups";
    /// Zone attribute prefix (numaplane extension) carrying the free device IDs of one
    /// resource in a zone: `numaplane.io/free-devices.<resource name>` → comma-separated IDs.
    /// Upstream consumers ignore zone attributes outside preemption, so this is harmless to them.
    pub const FREE_DEVICES_PREFIX: &str = "numaplane.io/free-devices.";
    /// Node attribute prefix (numaplane extension) for a resource whose device slots are one
    /// cluster-wide set (pools with `shared: cluster`): `numaplane.io/cluster-held.<resource
    /// name>` → the comma-separated IDs that this node's pods hold (empty when none). Its
    /// presence marks the resource cluster-shared: an ID held on one node is not free on any
    /// other.
    pub const CLUSTER_HELD_PREFIX: &str = "numaplane.io/cluster-held.";
    /// Node attribute prefix (numaplane extension) for the devices of one resource that have no
    /// NUMA node (the device plugin gives them no topology), which no zone can carry:
    /// `numaplane.io/devices-without-numa.<resource name>` → how many are free, then the free
    /// IDs that can be listed; see [`super::join_devices_without_numa`]. Published for every
    /// resource with at least one such allocatable device, also when none is free (`0`).
    pub const DEVICES_WITHOUT_NUMA_PREFIX: &str = "numaplane.io/devices-without-numa.";
    /// Node attribute (numaplane extension), written by numaplane-exporter only, which marks an
    /// NRT that describes every extended resource its Node allocates: each one is in a zone,
    /// under [`DEVICES_WITHOUT_NUMA_PREFIX`], or named here. The value names, sorted and
    /// comma-separated (empty when none), the extended resources the Node allocates that the
    /// kubelet's device manager serves no device of (a Node status patched by hand): node-level
    /// fit only, no NUMA affinity; see [`super::join_resource_names`]. Absent (other exporters,
    /// or the exporter does not see its Node yet): nothing is promised, and a resource missing
    /// from the zones is taken to have no NUMA affinity.
    pub const NODE_LEVEL_RESOURCES: &str = "numaplane.io/node-level-resources";
    /// Node attribute (numaplane extension): the NUMA node of each PCI bus range of the machine,
    /// read by the exporter from hwloc's host bridges; see [`crate::pci_locality`] for the form
    /// (`0000:00-7f=0,0000:80-ff=1`). The scheduler places a DRA device that only names its
    /// `resource.kubernetes.io/pciBusID` or `pcieRoot` through it. Absent: unknown.
    pub const PCI_LOCALITY: &str = "numaplane.io/pci-locality";
    /// Zone attribute (numaplane extension, written by numaplane-exporter): the DRA devices of
    /// this node's ResourceSlices and of its pods' claims that sit on the zone's NUMA node, per
    /// driver, free and in all; see [`super::join_dra_devices`] (`gpu.example.com=1/4`). For
    /// reading only (`kubectl numa top`); no scheduler decision uses it. Absent: no DRA device
    /// is known on the zone, or the exporter does not see the node's ResourceSlices.
    pub const DRA_DEVICES: &str = "numaplane.io/dra-devices";
    /// Node attribute (numaplane extension): [`DRA_DEVICES`] for the devices no source places on
    /// a NUMA node. Absent when there are none.
    pub const DRA_DEVICES_WITHOUT_NUMA: &str = "numaplane.io/dra-devices-without-numa";
}

/// Names of the kubelet's Topology Manager policy options (`topologyManagerPolicyOptions`), read
/// by the exporter from the kubelet configuration and by the scheduler's model.
pub mod kubelet_option {
    /// Prefers NUMA sets with the shortest average distance (published as
    /// [`super::attr::TOPOLOGY_MANAGER_PREFER_CLOSEST`]).
    pub const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
    /// Caps the NUMA nodes the Topology Manager considers (published as
    /// [`super::attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES`]).
    pub const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
}

/// Encodes [`attr::CPU_MANAGER_POLICY_OPTIONS`]: `name=value` pairs in name order joined by
/// commas (`full-pcpus-only=true`).
pub fn join_cpu_manager_options(options: &std::collections::BTreeMap<String, String>) -> String {
    options
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Decodes [`join_cpu_manager_options`]: the `name=value` pairs, trimmed; an entry without `=`
/// is skipped.
pub fn split_cpu_manager_options(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The value of a device-ID list attribute ([`attr::FREE_DEVICES_PREFIX`],
/// [`attr::CLUSTER_HELD_PREFIX`]): sorted, deduplicated, comma-separated.
pub fn join_device_ids<'a>(ids: impl IntoIterator<Item = &'a String>) -> String {
    let set: std::collections::BTreeSet<&String> = ids.into_iter().collect();
    set.into_iter().map(String::as_str).collect::<Vec<_>>().join(",")
}

/// Whether `id` survives a device-ID list attribute unchanged: not empty, no comma, no
/// surrounding blanks (the reader splits on commas and trims).
pub fn is_listable_device_id(id: &str) -> bool {
    !id.is_empty() && !id.contains(',') && id.trim() == id
}

/// Parses a device-ID list attribute value: trimmed, empty entries dropped, sorted, deduplicated.
pub fn split_device_ids(value: &str) -> Vec<String> {
    let mut ids: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Encodes [`attr::NODE_LEVEL_RESOURCES`]: resource names sorted, deduplicated and joined by
/// commas (a resource name has no comma).
pub fn join_resource_names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    join_device_ids(names)
}

/// Decodes [`join_resource_names`]: trimmed, empty entries dropped, sorted, deduplicated.
pub fn split_resource_names(value: &str) -> Vec<String> {
    split_device_ids(value)
}

/// Encodes the memory manager's groups in use for [`attr::MEMORY_GROUPS`]: groups sorted and
/// separated by `;`, each its NUMA ids ascending joined by `+` (`0+1;3`: one allocation group
/// over nodes 0 and 1, single-node allocations on node 3). Empty: no memory is assigned.
pub fn join_memory_groups(groups: &[Vec<u32>]) -> String {
    let mut sets: Vec<Vec<u32>> = groups
        .iter()
        .map(|g| {
            let mut g = g.clone();
            g.sort_unstable();
            g.dedup();
            g
        })
        .filter(|g| !g.is_empty())
        .collect();
    sets.sort();
    sets.dedup();
    sets.iter()
        .map(|g| g.iter().map(u32::to_string).collect::<Vec<_>>().join("+"))
        .collect::<Vec<_>>()
        .join(";")
}

/// A [`attr::MEMORY_GROUPS`] value that is not `id+id;id`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memory groups {value:?} are not NUMA ids joined by + and separated by ;")]
pub struct MemoryGroupsError {
    /// The value as published.
    pub value: String,
}

/// Decodes [`join_memory_groups`]; a NUMA id in two groups is an error (groups are disjoint).
pub fn split_memory_groups(value: &str) -> Result<Vec<Vec<u32>>, MemoryGroupsError> {
    let err = || MemoryGroupsError {
        value: value.to_owned(),
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut groups = Vec::new();
    for group in value.split(';').map(str::trim).filter(|g| !g.is_empty()) {
        let mut ids = Vec::new();
        for id in group.split('+') {
            let id: u32 = id.trim().parse().map_err(|_| err())?;
            if !seen.insert(id) {
                return Err(err());
            }
            ids.push(id);
        }
        ids.sort_unstable();
        groups.push(ids);
    }
    groups.sort();
    Ok(groups)
}

/// The free devices of one resource without a NUMA node ([`attr::DEVICES_WITHOUT_NUMA_PREFIX`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicesWithoutNuma {
    /// How many are free.
    pub free: u64,
    /// The free IDs that a device-ID list can carry ([`is_listable_device_id`]), sorted; at most
    /// `free` of them (fewer when some IDs cannot be listed).
    pub ids: Vec<String>,
}

/// Encodes [`attr::DEVICES_WITHOUT_NUMA_PREFIX`]: the free count, then `:` and the listable free
/// IDs joined as [`join_device_ids`] does when there are any (`2:dev-a,dev-b`, `0`). The count
/// comes first and has no `:`, so IDs containing `:` (PCI addresses) survive. IDs that cannot
/// be listed are counted and left out of the list.
pub fn join_devices_without_numa<'a>(free: u64, ids: impl IntoIterator<Item = &'a String>) -> String {
    let listed = join_device_ids(ids.into_iter().filter(|id| is_listable_device_id(id)));
    if listed.is_empty() {
        free.to_string()
    } else {
        format!("{free}:{listed}")
    }
}

/// A [`attr::DEVICES_WITHOUT_NUMA_PREFIX`] value that is not `<count>[:<ids>]` with at most
/// `<count>` IDs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("devices without NUMA node {value:?} are not a free count followed by at most that many IDs")]
pub struct DevicesWithoutNumaError {
    /// The value as published.
    pub value: String,
}

/// Decodes [`join_devices_without_numa`].
pub fn split_devices_without_numa(value: &str) -> Result<DevicesWithoutNuma, DevicesWithoutNumaError> {
    let err = || DevicesWithoutNumaError {
        value: value.to_owned(),
    };
    let (count, ids) = value.split_once(':').unwrap_or((value, ""));
    let count = count.trim();
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let free: u64 = count.parse().map_err(|_| err())?;
    let ids = split_device_ids(ids);
    if u64::try_from(ids.len()).unwrap_or(u64::MAX) > free {
        return Err(err());
    }
    Ok(DevicesWithoutNuma { free, ids })
}

/// DRA devices of one driver in one place (a NUMA zone, or without NUMA node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraDeviceCount {
    /// Devices no claim of a pod on the node holds.
    pub free: u64,
    /// All devices (free and held).
    pub total: u64,
}

/// Encodes [`attr::DRA_DEVICES`]: `<driver>=<free>/<total>` per driver, sorted by driver and
/// joined by commas (`gpu.example.com=1/4,nic.example.com=0/2`). Driver names are DNS
/// subdomains, so they hold no `=`, `/` or `,`.
pub fn join_dra_devices(counts: &std::collections::BTreeMap<String, DraDeviceCount>) -> String {
    counts
        .iter()
        .map(|(driver, c)| format!("{driver}={}/{}", c.free, c.total))
        .collect::<Vec<_>>()
        .join(",")
}

/// A [`attr::DRA_DEVICES`] value that is not `<driver>=<free>/<total>` entries with
/// `free <= total`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DRA device counts {value:?} are not <driver>=<free>/<total> entries with free at most total")]
pub struct DraDevicesError {
    /// The value as published.
    pub value: String,
}

/// Decodes [`join_dra_devices`]. Empty: no driver.
pub fn split_dra_devices(
    value: &str,
) -> Result<std::collections::BTreeMap<String, DraDeviceCount>, DraDevicesError> {
    let err = || DraDevicesError {
        value: value.to_owned(),
    };
    let number = |s: &str| {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse::<u64>().ok()
    };
    let mut out = std::collections::BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (driver, counts) = entry.split_once('=').ok_or_else(err)?;
        let (free, total) = counts.split_once('/').ok_or_else(err)?;
        let (free, total) = (number(free).ok_or_else(err)?, number(total).ok_or_else(err)?);
        let driver = driver.trim();
        if driver.is_empty() || free > total {
            return Err(err());
        }
        out.insert(driver.to_owned(), DraDeviceCount { free, total });
    }
    Ok(out)
}

/// Legacy fingerprint annotation, read by the scheduler-plugins cache as a fallback.
pub use crate::fingerprint::ANNOTATION_FINGERPRINT;

/// NodeResourceTopology describes node resources and their topology (v1alpha2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourceTopology {
    /// Always `topology.node.k8s.io/v1alpha2` for objects we write.
    #[serde(default = "default_api_version")]
    pub api_version: String,
    /// Always `NodeResourceTopology`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Standard object metadata; the name is the node name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Deprecated (to be removed in v1beta1); only element 0 is read by consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_policies: Option<Vec<String>>,
    /// The zones; required by the CRD (may be empty).
    #[serde(default)]
    pub zones: Vec<Zone>,
    /// Node-level attributes (Topology Manager configuration, fingerprint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Vec<AttributeInfo>>,
}

fn default_api_version() -> String {
    API_VERSION.to_owned()
}
fn default_kind() -> String {
    KIND.to_owned()
}

/// A resource topology zone, e.g. a NUMA node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Zone {
    /// `node-<id>` for NUMA zones.
    pub name: String,
    /// `Node` for NUMA zones.
    #[serde(rename = "type")]
    pub zone_type: String,
    /// Unused by the scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Distance row to other zones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<Vec<CostInfo>>,
    /// Zone attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Vec<AttributeInfo>>,
    /// Resources of the zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceInfo>>,
}

/// Capacity, allocatable and available quantity of one resource in a zone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    /// Kubernetes resource name.
    pub name: String,
    /// Total on the zone.
    #[serde(deserialize_with = "int_or_string")]
    pub capacity: Quantity,
    /// Capacity minus system reservations.
    #[serde(deserialize_with = "int_or_string")]
    pub allocatable: Quantity,
    /// Allocatable minus what running containers hold exclusively.
    #[serde(deserialize_with = "int_or_string")]
    pub available: Quantity,
}

/// Distance from the enclosing zone to the named zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostInfo {
    /// Target zone name.
    pub name: String,
    /// Distance (SLIT-like, 10 = local).
    pub value: i64,
}

/// A name/value attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributeInfo {
    /// Attribute name.
    pub name: String,
    /// Attribute value.
    pub value: String,
}

/// The CRD declares quantities as int-or-string, so accept JSON numbers as well. A visitor,
/// not an untagged enum: that one buffers every value and builds two errors per string
/// before it tries the string, which was a fifth of reading a 5,000-node dump.
fn int_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<Quantity, D::Error> {
    struct IntOrString;
    impl serde::de::Visitor<'_> for IntOrString {
        type Value = Quantity;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a quantity (a string or a number)")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
            Ok(Quantity(v.to_string()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
            // Past i64, as a float: what the int-or-float-or-string reading gave.
            Ok(Quantity(match i64::try_from(v) {
                Ok(i) => i.to_string(),
                #[allow(clippy::cast_precision_loss)]
                Err(_) => (v as f64).to_string(),
            }))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
            Ok(Quantity(v.to_string()))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
            Ok(Quantity(v.to_owned()))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Quantity, E> {
            Ok(Quantity(v))
        }
    }
    d.deserialize_any(IntOrString)
}

impl kube_core::Resource for NodeResourceTopology {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl NodeResourceTopology {
    /// An empty object for `node_name`.
    pub fn new(node_name: &str) -> Self {
        Self {
            api_version: default_api_version(),
            kind: default_kind(),
            metadata: ObjectMeta {
                name: Some(node_name.to_owned()),
                ..ObjectMeta::default()
            },
            topology_policies: None,
            zones: Vec::new(),
            attributes: None,
        }
    }

    /// First attribute with this name (upstream lookup semantics).
    pub fn attribute(&self, name: &str) -> Option<&str> {
        find_attribute(self.attributes.as_deref(), name)
    }

    /// The cluster-shared resources this node publishes ([`attr::CLUSTER_HELD_PREFIX`]), with
    /// the IDs its pods hold (first attribute per resource).
    pub fn cluster_held(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut out = std::collections::BTreeMap::new();
        for a in self.attributes.iter().flatten() {
            if let Some(resource) = a.name.strip_prefix(attr::CLUSTER_HELD_PREFIX)
                && !resource.is_empty()
            {
                out.entry(resource.to_owned())
                    .or_insert_with(|| split_device_ids(&a.value));
            }
        }
        out
    }

    /// [`attr::NODE_LEVEL_RESOURCES`]: `None` when the attribute is absent (the NRT promises
    /// nothing about resources missing from its zones), else the node-level resources it names.
    pub fn node_level_resources(&self) -> Option<Vec<String>> {
        self.attribute(attr::NODE_LEVEL_RESOURCES)
            .map(split_resource_names)
    }

    /// [`attr::PCI_LOCALITY`]: `None` when absent, else the decoded ranges or the decoding error.
    pub fn pci_locality(
        &self,
    ) -> Option<Result<Vec<crate::pci_locality::PciBusRange>, crate::pci_locality::PciLocalityError>> {
        self.attribute(attr::PCI_LOCALITY)
            .map(crate::pci_locality::split_pci_locality)
    }

    /// The devices without a NUMA node this node publishes, per resource (first attribute per
    /// resource), each decoded or the decoding error.
    pub fn devices_without_numa(
        &self,
    ) -> std::collections::BTreeMap<String, Result<DevicesWithoutNuma, DevicesWithoutNumaError>> {
        let mut out = std::collections::BTreeMap::new();
        for a in self.attributes.iter().flatten() {
            if let Some(resource) = a.name.strip_prefix(attr::DEVICES_WITHOUT_NUMA_PREFIX)
                && !resource.is_empty()
            {
                out.entry(resource.to_owned())
                    .or_insert_with(|| split_devices_without_numa(&a.value));
            }
        }
        out
    }
}

impl Zone {
    /// First zone attribute with this name.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        find_attribute(self.attributes.as_deref(), name)
    }
}

fn find_attribute<'a>(attrs: Option<&'a [AttributeInfo]>, name: &str) -> Option<&'a str> {
    attrs?.iter().find(|a| a.name == name).map(|a| a.value.as_str())
}

/// Legacy `topologyPolicies` value for a (policy, scope) pair, as NFD writes it.
pub fn legacy_topology_policy(policy: &str, scope: &str) -> &'static str {
    match (policy, scope) {
        ("single-numa-node", "pod") => "SingleNUMANodePodLevel",
        ("single-numa-node", _) => "SingleNUMANodeContainerLevel",
        ("restricted", "pod") => "RestrictedPodLevel",
        ("restricted", _) => "RestrictedContainerLevel",
        ("best-effort", "pod") => "BestEffortPodLevel",
        ("best-effort", _) => "BestEffortContainerLevel",
        _ => "None",
    }
}

/// Name of the zone for NUMA node `id`.
pub fn zone_name(id: u32) -> String {
    format!("{ZONE_NAME_PREFIX}{id}")
}

/// Parses `node-<id>` as upstream does (base-10, ≥ 0); ids ≥ 64 are rejected because NUMA
/// masks are 64 bits wide (upstream would index out of bounds at 64).
pub fn parse_zone_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(ZONE_NAME_PREFIX)?;
    let digits = digits.strip_prefix('+').unwrap_or(digits);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: u32 = digits.parse().ok()?;
    (id < 64).then_some(id)
}

#[cfg(test)]
mod tests {

    #[test]
    fn quantities_read_as_strings_or_numbers() {
        let read = |v: serde_json::Value| -> Result<super::ResourceInfo, serde_json::Error> {
            serde_json::from_value(
                serde_json::json!({"name": "cpu", "capacity": v, "allocatable": "16", "available": 8}),
            )
        };
        let q = |r: super::ResourceInfo| (r.capacity.0, r.allocatable.0, r.available.0);
        assert_eq!(
            q(read("8Gi".into()).unwrap()),
            ("8Gi".into(), "16".into(), "8".into())
        );
        assert_eq!(q(read((-3).into()).unwrap()).0, "-3");
        assert_eq!(q(read(1.5.into()).unwrap()).0, "1.5");
        assert_eq!(q(read(u64::MAX.into()).unwrap()).0, "18446744073709552000");
        for bad in [
            serde_json::json!(true),
            serde_json::json!(null),
            serde_json::json!([1]),
        ] {
            let e = read(bad).unwrap_err().to_string();
            assert!(e.contains("a quantity (a string or a number)"), "{e}");
        }
    }

    #[test]
    fn dra_device_counts_round_trip_and_reject_malformed_values() {
        use super::{DraDeviceCount, join_dra_devices, split_dra_devices};
        let counts = std::collections::BTreeMap::from([
            ("nic.example.com".to_owned(), DraDeviceCount { free: 0, total: 2 }),
            ("gpu.example.com".to_owned(), DraDeviceCount { free: 1, total: 4 }),
        ]);
        let value = join_dra_devices(&counts);
        assert_eq!(value, "gpu.example.com=1/4,nic.example.com=0/2");
        assert_eq!(split_dra_devices(&value).unwrap(), counts);
        assert!(split_dra_devices("").unwrap().is_empty());
        for bad in ["gpu=1", "gpu=5/4", "=1/4", "gpu=-1/4", "gpu=1/x", "gpu"] {
            let e = split_dra_devices(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn cpu_manager_options_round_trip_and_skip_entries_without_a_value() {
        let options = std::collections::BTreeMap::from([
            ("full-pcpus-only".to_owned(), "true".to_owned()),
            ("align-by-socket".to_owned(), "false".to_owned()),
        ]);
        let encoded = super::join_cpu_manager_options(&options);
        assert_eq!(encoded, "align-by-socket=false,full-pcpus-only=true");
        let decoded = super::split_cpu_manager_options(&encoded);
        assert_eq!(
            decoded.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            options
        );
        assert_eq!(
            super::split_cpu_manager_options(" full-pcpus-only = true ,junk,"),
            vec![("full-pcpus-only".to_owned(), "true".to_owned())]
        );
        assert_eq!(super::join_cpu_manager_options(&Default::default()), "");
    }

    #[test]
    fn memory_groups_round_trip_and_reject_what_is_not_a_partition() {
        let groups = vec![vec![3], vec![1, 0], vec![0, 1]];
        let text = join_memory_groups(&groups);
        assert_eq!(text, "0+1;3");
        assert_eq!(split_memory_groups(&text), Ok(vec![vec![0, 1], vec![3]]));
        assert_eq!(split_memory_groups(""), Ok(vec![]));
        assert_eq!(join_memory_groups(&[]), "");
        assert!(split_memory_groups("0+x").is_err());
        assert!(split_memory_groups("0+1;1").is_err(), "a node in two groups");
        assert!(split_memory_groups("-1").is_err());
    }
    use super::*;

    #[test]
    fn zone_names_parse_like_upstream() {
        assert_eq!(parse_zone_name("node-0"), Some(0));
        assert_eq!(parse_zone_name("node-63"), Some(63));
        assert_eq!(parse_zone_name("node-007"), Some(7));
        for bad in [
            "Node-1", "node_3", "node 4", "node-5-1", "node6", "cell-1", "node--1", "node-", "node-64",
        ] {
            assert_eq!(parse_zone_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn scheduler_conformance_nrts_round_trip() {
        let cases: serde_json::Value =
            serde_json::from_str(include_str!("testdata/scheduler_cases.json")).expect("vectors parse");
        let mut seen = 0;
        for case in cases["cases"].as_array().expect("cases") {
            for node in case["nodes"].as_array().into_iter().flatten() {
                let raw = &node["nrt"];
                if raw.is_null() {
                    continue;
                }
                let nrt: NodeResourceTopology =
                    serde_json::from_value(raw.clone()).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
                let back = serde_json::to_value(&nrt).expect("serialize");
                assert_eq!(&back, raw, "{}", case["name"]);
                seen += 1;
            }
        }
        assert!(seen > 50, "only {seen} NRT objects found");
    }

    #[test]
    fn cluster_held_ids_round_trip_through_the_attribute() {
        let ids = ["lic-1".to_owned(), "lic-0".to_owned(), "lic-1".to_owned()];
        let value = join_device_ids(&ids);
        assert_eq!(value, "lic-0,lic-1");
        let mut nrt = NodeResourceTopology::new("n1");
        nrt.attributes = Some(vec![
            AttributeInfo {
                name: format!("{}example.com/lic", attr::CLUSTER_HELD_PREFIX),
                value,
            },
            AttributeInfo {
                name: format!("{}example.com/cam", attr::CLUSTER_HELD_PREFIX),
                value: String::new(),
            },
            AttributeInfo {
                name: attr::CLUSTER_HELD_PREFIX.to_owned(),
                value: "x".into(),
            },
        ]);
        let held = nrt.cluster_held();
        assert_eq!(held.len(), 2, "{held:?}");
        assert_eq!(held["example.com/lic"], ["lic-0", "lic-1"]);
        assert!(held["example.com/cam"].is_empty());
        assert_eq!(split_device_ids(" a, ,b,a"), ["a", "b"]);
        // What the writer lets through, the reader gives back.
        let ids: Vec<String> = ["gpu-0", "0000:3b:00.0", "a b"].map(str::to_owned).to_vec();
        assert!(ids.iter().all(|i| is_listable_device_id(i)));
        assert_eq!(split_device_ids(&join_device_ids(&ids)), {
            let mut sorted = ids.clone();
            sorted.sort();
            sorted
        });
        for bad in ["", "a,b", " a", "b "] {
            assert!(!is_listable_device_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn devices_without_numa_round_trip_through_the_attribute() {
        let ids = ["0000:3b:00.0".to_owned(), "dev-a".to_owned(), "a,b".to_owned()];
        // Three free, one of which cannot be listed: counted, not listed.
        let value = join_devices_without_numa(3, &ids);
        assert_eq!(value, "3:0000:3b:00.0,dev-a");
        assert_eq!(
            split_devices_without_numa(&value),
            Ok(DevicesWithoutNuma {
                free: 3,
                ids: vec!["0000:3b:00.0".to_owned(), "dev-a".to_owned()],
            })
        );
        assert_eq!(join_devices_without_numa(0, []), "0");
        assert_eq!(split_devices_without_numa("0"), Ok(DevicesWithoutNuma::default()));
        for bad in ["", "x", "-1", "1:a,b", " :a", "18446744073709551616"] {
            assert!(split_devices_without_numa(bad).is_err(), "{bad:?}");
        }
        let mut nrt = NodeResourceTopology::new("n1");
        nrt.attributes = Some(vec![
            AttributeInfo {
                name: format!("{}example.com/fpga", attr::DEVICES_WITHOUT_NUMA_PREFIX),
                value: "1:fpga-9".into(),
            },
            AttributeInfo {
                name: format!("{}example.com/fpga", attr::DEVICES_WITHOUT_NUMA_PREFIX),
                value: "bad".into(),
            },
            AttributeInfo {
                name: attr::DEVICES_WITHOUT_NUMA_PREFIX.to_owned(),
                value: "1".into(),
            },
        ]);
        let got = nrt.devices_without_numa();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            got["example.com/fpga"],
            Ok(DevicesWithoutNuma {
                free: 1,
                ids: vec!["fpga-9".to_owned()]
            })
        );
    }

    #[test]
    fn node_level_resources_round_trip_and_absence_promises_nothing() {
        let names = [
            "vendor.com/b".to_owned(),
            "vendor.com/a".to_owned(),
            "vendor.com/b".to_owned(),
        ];
        let value = join_resource_names(&names);
        assert_eq!(value, "vendor.com/a,vendor.com/b");
        let mut nrt = NodeResourceTopology::new("n1");
        assert_eq!(nrt.node_level_resources(), None);
        nrt.attributes = Some(vec![AttributeInfo {
            name: attr::NODE_LEVEL_RESOURCES.to_owned(),
            value,
        }]);
        assert_eq!(
            nrt.node_level_resources(),
            Some(vec!["vendor.com/a".to_owned(), "vendor.com/b".to_owned()])
        );
        nrt.attributes = Some(vec![AttributeInfo {
            name: attr::NODE_LEVEL_RESOURCES.to_owned(),
            value: String::new(),
        }]);
        assert_eq!(nrt.node_level_resources(), Some(Vec::new()));
    }

    #[test]
    fn integer_quantities_are_accepted() {
        let nrt: NodeResourceTopology = serde_json::from_str(
            r#"{"zones":[{"name":"node-0","type":"Node","resources":[{"name":"cpu","capacity":4,"allocatable":4,"available":2}]}]}"#,
        )
        .expect("parse");
        let r = &nrt.zones[0].resources.as_ref().expect("resources")[0];
        assert_eq!(r.available, Quantity("2".into()));
        assert_eq!(nrt.api_version, API_VERSION);
    }

    #[test]
    fn legacy_policies() {
        assert_eq!(
            legacy_topology_policy("single-numa-node", "pod"),
            "SingleNUMANodePodLevel"
        );
        assert_eq!(
            legacy_topology_policy("restricted", "container"),
            "RestrictedContainerLevel"
        );
        assert_eq!(legacy_topology_policy("none", "container"), "None");
    }
}

#[cfg(test)]
mod crd_name {
    #[test]
    fn crd_name_is_plural_dot_group_and_the_missing_message_names_it() {
        assert_eq!(super::CRD_NAME, format!("{}.{}", super::PLURAL, super::GROUP));
        assert!(super::CRD_MISSING.contains(super::CRD_NAME));
    }
}
