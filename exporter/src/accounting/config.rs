//! What the accounting is told: resource and pod exclusions, the kubelet's resource-manager
//! settings and the published kubelet configuration.

use std::collections::{BTreeMap, BTreeSet};

use numaplane::fingerprint::Method;

use crate::init_held::{Held, Sources};

/// Key of [`AccountingConfig::resource_exclude`] that applies to every node.
pub const EXCLUDE_ALL_NODES: &str = "*";

/// Kubelet default Topology Manager policy, published when the configuration gives none.
pub const DEFAULT_TOPOLOGY_MANAGER_POLICY: &str = "none";
/// Kubelet default Topology Manager scope, published when the configuration gives none.
pub const DEFAULT_TOPOLOGY_MANAGER_SCOPE: &str = "container";

/// Pods whose namespace and name both match these shell globs are left out of the accounting
/// (RTE's `podExclude`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodExclude {
    /// Glob on the namespace.
    pub namespace_pattern: String,
    /// Glob on the pod name.
    pub name_pattern: String,
}

/// The kubelet's CPU and memory manager settings and its Topology Manager options, as its config
/// file sets them (kubelet defaults for absent fields).
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
    /// Every `topologyManagerPolicyOptions` entry, known or not, published whole so that the
    /// scheduler can name the ones its model does not know (the two it knows are also
    /// published on their own).
    pub topology_manager_policy_options: BTreeMap<String, String>,
}

/// Everything besides the two kubelet responses that shapes the published object.
#[derive(Debug, Clone, PartialEq)]
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
    /// The Node's extended resources, when its watch has seen it: the object then names the
    /// node-level ones ([`attr::NODE_LEVEL_RESOURCES`]), promising that it describes every
    /// extended resource the Node allocates. `None`: the attribute is left out.
    pub node_level: Option<crate::allocatable_follow::NodeLevelInput>,
    /// The node's ResourceSlices (once their watch has listed them) and the driver NUMA
    /// attributes: DRA devices are then counted per zone ([`super::DraZones`]). `None`: not
    /// counted, and the DRA attributes are left out.
    pub dra: Option<super::DraInputs>,
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
            node_level: None,
            dra: None,
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
