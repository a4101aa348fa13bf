//! The scheduler's plain view of a node: its Node-level state ([`NodeBasics`]) and its NUMA
//! topology, built from its NodeResourceTopology.
//!
//! Everything that can be wrong with an NRT is a typed [`NrtError`]; such a node is reported
//! as "topology unknown or invalid" and never panics the scheduler.

use std::collections::BTreeMap;

use numaplane::{
    nrt::{self, NodeResourceTopology},
    quantity::Quantity,
};

use k8s_openapi::api::core::v1::Taint;

use crate::{
    resources::{Dense, ResId, ResKind, Resources},
    topology_manager::{NumaDistances, NumaInfo, Policy, PolicyOptions, Scope, TopologyManagerError},
};

/// Node-level state (the Node object and its bound pods) that the fit checks and the
/// constraint plugins read.
#[derive(Clone, Debug, Default)]
pub struct NodeBasics {
    /// Node name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Dense,
    /// Sum of effective requests of non-terminal pods bound to the node.
    pub requested: Dense,
    /// Number of non-terminal pods bound to the node.
    pub pod_count: i64,
}

/// Attribute carrying the kubelet option `prefer-closest-numa-nodes`.
pub const ATTR_PREFER_CLOSEST: &str = nrt::attr::TOPOLOGY_MANAGER_PREFER_CLOSEST;

/// Topology Manager configuration read from an NRT, without defaults (upstream §3 semantics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TmConfig {
    /// Policy, if set and valid.
    pub policy: Option<Policy>,
    /// Scope, if set and valid.
    pub scope: Option<Scope>,
    /// `topologyManagerMaxNUMANodes`, if set and valid (> 1, clamped at 1024).
    pub max_numa_nodes: Option<usize>,
    /// `prefer-closest-numa-nodes`, if published.
    pub prefer_closest: Option<bool>,
}

impl TmConfig {
    /// Resolves the configuration as scheduler-plugins does: element 0 of the legacy
    /// `topologyPolicies` first, then attributes in order (later entries win); invalid values
    /// are ignored and the previous value kept.
    pub fn from_nrt(nrt: &NodeResourceTopology) -> Self {
        let mut c = TmConfig::default();
        if let Some(first) = nrt.topology_policies.as_ref().and_then(|p| p.first()) {
            let (policy, scope) = match first.as_str() {
                "SingleNUMANodeContainerLevel" => (Some(Policy::SingleNumaNode), Some(Scope::Container)),
                "SingleNUMANodePodLevel" => (Some(Policy::SingleNumaNode), Some(Scope::Pod)),
                "RestrictedContainerLevel" => (Some(Policy::Restricted), Some(Scope::Container)),
                "RestrictedPodLevel" => (Some(Policy::Restricted), Some(Scope::Pod)),
                "BestEffortContainerLevel" => (Some(Policy::BestEffort), Some(Scope::Container)),
                "BestEffortPodLevel" => (Some(Policy::BestEffort), Some(Scope::Pod)),
                _ => (None, None),
            };
            c.policy = policy.or(c.policy);
            c.scope = scope.or(c.scope);
        }
        for a in nrt.attributes.iter().flatten() {
            match a.name.as_str() {
                nrt::attr::TOPOLOGY_MANAGER_POLICY => {
                    if let Ok(p) = a.value.parse::<Policy>() {
                        c.policy = Some(p);
                    }
                }
                nrt::attr::TOPOLOGY_MANAGER_SCOPE => {
                    if let Ok(s) = a.value.parse::<Scope>() {
                        c.scope = Some(s);
                    }
                }
                nrt::attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES => {
                    if let Ok(n) = a.value.parse::<i64>()
                        && n > 1
                    {
                        c.max_numa_nodes = Some(usize::try_from(n.min(1024)).unwrap_or(1024));
                    }
                }
                ATTR_PREFER_CLOSEST => match a.value.as_str() {
                    "true" => c.prefer_closest = Some(true),
                    "false" => c.prefer_closest = Some(false),
                    _ => {}
                },
                _ => {}
            }
        }
        c
    }
}

/// One NUMA zone.
#[derive(Clone, Debug, PartialEq)]
pub struct NumaZone {
    /// NUMA node id.
    pub id: u32,
    /// Capacity per resource.
    pub capacity: Dense,
    /// Allocatable per resource.
    pub allocatable: Dense,
    /// Available per resource (what the scheduler consumes).
    pub available: Dense,
    /// Free device IDs per extended resource, when the exporter publishes them.
    pub free_devices: BTreeMap<ResId, Vec<String>>,
    /// Physical cores whose every CPU is free (`numaplane.io/free-cores`), when published.
    pub free_cores: Option<i64>,
}

/// The free devices of one resource that have no NUMA node
/// (`numaplane.io/devices-without-numa.<resource>`): in no zone, yet handed out by the kubelet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unaligned {
    /// How many are free.
    pub free: i64,
    /// The free IDs the exporter could list (at most `free`), sorted.
    pub ids: Vec<String>,
}

/// A node's NUMA topology and Topology Manager configuration.
#[derive(Clone, Debug)]
pub struct NumaTopology {
    /// Policy (default `none`).
    pub policy: Policy,
    /// Scope (default `container`).
    pub scope: Scope,
    /// Kubelet policy options.
    pub options: PolicyOptions,
    /// `topologyManagerMaxNUMANodes` (default 8), used by LeastNUMANodes normalisation.
    pub max_numa_nodes: usize,
    /// NUMA ids and distances.
    pub info: NumaInfo,
    /// Zones sorted by id.
    pub zones: Vec<NumaZone>,
    /// Zones in NRT list order (indexes into `zones`), for upstream-order-dependent scoring.
    pub list_order: Vec<usize>,
    /// Distance rows from zone costs, indexed by zone position in `zones`; 255 when unknown.
    pub costs: Vec<Vec<u64>>,
    /// Memory or hugepages are published: the kubelet runs the Static memory manager.
    pub memory_managed: bool,
    /// Pod-set fingerprint published by the exporter.
    pub fingerprint: Option<String>,
    /// The fingerprint covers only pods with exclusive resources (method
    /// `with-exclusive-resources`); otherwise every pod the kubelet reports.
    pub fingerprint_exclusive_only: bool,
    /// NUMA mask of every subset of zone positions (index = subset bits), precomputed once.
    pub masks: Vec<crate::topology_manager::NumaMask>,
    /// Device resources whose IDs appear in several zones (devices attached to several NUMA
    /// nodes), which must be counted by ID union rather than by summing zones.
    pub shared_devices: std::collections::BTreeSet<ResId>,
    /// Cluster-shared device resources (allocator pools with `shared: cluster`) and the IDs
    /// this node's pods hold: an ID held on one node is not free on any other.
    pub cluster_held: BTreeMap<ResId, Vec<String>>,
    /// Threads per core when the kubelet runs the static CPU manager with `full-pcpus-only`
    /// on an SMT machine (published attributes); `None` otherwise, or when not published.
    pub full_pcpus_threads: Option<i64>,
    /// The static CPU manager splits multi-NUMA allocations evenly (`distribute-cpus-across-numa`).
    pub cpu_distribute: bool,
    /// Kubelet options published for this node whose effect the model cannot predict: its
    /// predictions here are approximate, for these reasons.
    pub approximate: Vec<crate::kubelet_options::Approximation>,
    /// The Static memory manager's groups holding memory, by NUMA id, when the exporter read
    /// them from the kubelet's checkpoint; `None`: unknown (the model then guesses safely).
    pub memory_groups: Option<Vec<Vec<u32>>>,
    /// Free devices without a NUMA node, per device resource that has any, when published.
    /// A resource listed here and in no zone is one whose devices have no NUMA node at all.
    pub unaligned_devices: BTreeMap<ResId, Unaligned>,
    /// When the NRT describes every extended resource its Node allocates (numaplane-exporter's
    /// `numaplane.io/node-level-resources`): the resources it names as node-level (no device,
    /// no NUMA affinity). `None` for NRTs that promise nothing (other exporters).
    pub node_level: Option<std::collections::BTreeSet<ResId>>,
    /// Extended resources the Node allocates that this NRT, although it promises to describe
    /// them all, neither places in a zone nor lists as without NUMA or node-level: the NRT lags
    /// the node (a device plugin registered since its last scan). Set by the cluster index from
    /// the Node ([`Self::lagging_behind`]); a pod requesting one of them is not admitted here.
    pub lagging: Vec<ResId>,
    /// Which NUMA node each PCI bus range hangs off (the NRT's
    /// [`numaplane::nrt::attr::PCI_LOCALITY`]), to place DRA devices that name only their PCI
    /// address; empty when not published (or not decodable, which is logged).
    pub pci_locality: Vec<numaplane::pci_locality::PciBusRange>,
    /// Why the published PCI locality could not be decoded (reported by `simulate` and the
    /// live scheduler's gauge `nrt_pci_locality_invalid`).
    pub pci_locality_error: Option<String>,
}

/// Hint enumeration is exponential in the zone count, as in the kubelet; beyond this the
/// node is refused rather than stalling the scheduler.
pub const MAX_ZONES: usize = 16;

/// Why an NRT cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NrtError {
    /// The object lists no NUMA (`Node`) zone.
    #[error("no NUMA zone (type Node) listed")]
    MissingZones,
    /// A `Node` zone name is not `node-<id>` with id < 64.
    #[error("zone {zone:?} is not named node-<id> with id 0..63")]
    ParseZoneName {
        /// The zone name.
        zone: String,
    },
    /// The same NUMA id appears twice.
    #[error("zone {zone:?} is listed twice")]
    DuplicateZone {
        /// The zone name.
        zone: String,
    },
    /// A quantity does not parse.
    #[error("zone {zone:?}: resource {resource}: {field}")]
    ParseQuantity {
        /// Zone name.
        zone: String,
        /// Resource name.
        resource: String,
        /// capacity, allocatable or available.
        field: &'static str,
        /// Why.
        #[source]
        source: numaplane::quantity::QuantityError,
    },
    /// A quantity is negative or out of range.
    #[error("zone {zone:?}: resource {resource}: {field} {value:?} is negative or out of range")]
    QuantityOutOfRange {
        /// Zone name.
        zone: String,
        /// Resource name.
        resource: String,
        /// capacity, allocatable or available.
        field: &'static str,
        /// As written.
        value: String,
    },
    /// A zone lists the same resource twice.
    #[error("zone {zone:?}: resource {resource} is listed twice")]
    DuplicateResource {
        /// Zone name.
        zone: String,
        /// Resource name.
        resource: String,
    },
    /// The memory-groups attribute does not parse, or names a NUMA node without a zone.
    #[error("attribute numaplane.io/memory-groups: {0}")]
    ParseMemoryGroups(String),
    /// A devices-without-NUMA attribute does not parse, or counts more than the model's bound.
    #[error("attribute numaplane.io/devices-without-numa.{resource}: {message}")]
    ParseDevicesWithoutNuma {
        /// Resource name.
        resource: String,
        /// What is wrong.
        message: String,
    },
    /// More NUMA zones than the model enumerates.
    #[error("{zones} NUMA zones exceed the supported {MAX_ZONES}")]
    TooManyZones {
        /// Zone count.
        zones: usize,
    },
    /// The NUMA node set is not one the Topology Manager model accepts.
    #[error("NUMA layout rejected")]
    NumaLayout(#[source] TopologyManagerError),
    /// The zones of one resource add up to more than the model's arithmetic bound.
    #[error(
        "resource {resource}: {field} summed over the zones exceeds {}",
        MAX_NODE_AMOUNT
    )]
    AmountOverflow {
        /// Resource name.
        resource: String,
        /// capacity, allocatable or available.
        field: &'static str,
    },
}

/// Upper bound of one resource summed over a node's zones (in the model's units: millicores,
/// bytes, devices), about 8 PiB of memory. Every sum and product the filter and the scores form
/// from zone amounts (sums over zone subsets, ×100 in scores) then stays far inside `i64`, so
/// no NRT can make the arithmetic wrap; a real node is many orders of magnitude below it.
pub const MAX_NODE_AMOUNT: i64 = i64::MAX / 1024;

impl NrtError {
    /// Bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            NrtError::MissingZones => "missing_zones",
            NrtError::ParseZoneName { .. } => "zone_name",
            NrtError::DuplicateZone { .. } => "duplicate_zone",
            NrtError::ParseQuantity { .. } => "quantity",
            NrtError::QuantityOutOfRange { .. } => "quantity_range",
            NrtError::DuplicateResource { .. } => "duplicate_resource",
            NrtError::TooManyZones { .. } => "too_many_zones",
            NrtError::ParseMemoryGroups(_) => "memory_groups",
            NrtError::ParseDevicesWithoutNuma { .. } => "devices_without_numa",
            NrtError::NumaLayout(_) => "numa_layout",
            NrtError::AmountOverflow { .. } => "amount_overflow",
        }
    }
}

fn parse_amount(
    res: &Resources,
    id: ResId,
    zone: &str,
    resource: &str,
    field: &'static str,
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
) -> Result<i64, NrtError> {
    let parsed = Quantity::parse(&q.0).map_err(|source| NrtError::ParseQuantity {
        zone: zone.to_owned(),
        resource: resource.to_owned(),
        field,
        source,
    })?;
    let out_of_range = || NrtError::QuantityOutOfRange {
        zone: zone.to_owned(),
        resource: resource.to_owned(),
        field,
        value: q.0.clone(),
    };
    if parsed < Quantity::zero() {
        return Err(out_of_range());
    }
    res.amount(id, &parsed).map_err(|_| out_of_range())
}

/// SMT width under `full-pcpus-only`: the static CPU manager with that option set to true, on a
/// machine with more than one thread per core (kubelet-topology-manager.md: SMTAlignmentError).
fn full_pcpus_threads(obj: &NodeResourceTopology) -> Option<i64> {
    if obj.attribute(nrt::attr::CPU_MANAGER_POLICY)? != "static" {
        return None;
    }
    let on = nrt::split_cpu_manager_options(obj.attribute(nrt::attr::CPU_MANAGER_POLICY_OPTIONS)?)
        .iter()
        .any(|(k, v)| k == "full-pcpus-only" && numaplane::parse_go_bool(v) == Some(true));
    let threads = obj
        .attribute(nrt::attr::THREADS_PER_CORE)?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|t| *t > 1 && *t <= 64)?;
    on.then_some(threads)
}

impl NumaTopology {
    /// Validates and converts an NRT.
    pub fn from_nrt(res: &mut Resources, obj: &NodeResourceTopology) -> Result<Self, NrtError> {
        let cfg = TmConfig::from_nrt(obj);
        let mut zones: Vec<NumaZone> = Vec::new();
        let mut raw_costs: Vec<Vec<(u32, i64)>> = Vec::new();
        let mut list_ids = Vec::new();
        for z in obj.zones.iter().filter(|z| z.zone_type == nrt::ZONE_TYPE_NODE) {
            let id = nrt::parse_zone_name(&z.name)
                .ok_or_else(|| NrtError::ParseZoneName { zone: z.name.clone() })?;
            if list_ids.contains(&id) {
                return Err(NrtError::DuplicateZone { zone: z.name.clone() });
            }
            list_ids.push(id);
            let mut zone = NumaZone {
                id,
                capacity: Dense::default(),
                allocatable: Dense::default(),
                available: Dense::default(),
                free_devices: BTreeMap::new(),
                free_cores: None,
            };
            for r in z.resources.iter().flatten() {
                let rid = res.intern(&r.name);
                if zone.available.get(rid).is_some() {
                    return Err(NrtError::DuplicateResource {
                        zone: z.name.clone(),
                        resource: r.name.clone(),
                    });
                }
                zone.capacity.set(
                    rid,
                    parse_amount(res, rid, &z.name, &r.name, "capacity", &r.capacity)?,
                );
                zone.allocatable.set(
                    rid,
                    parse_amount(res, rid, &z.name, &r.name, "allocatable", &r.allocatable)?,
                );
                zone.available.set(
                    rid,
                    parse_amount(res, rid, &z.name, &r.name, "available", &r.available)?,
                );
            }
            for a in z.attributes.iter().flatten() {
                if a.name == nrt::attr::FREE_CORES {
                    zone.free_cores = a.value.trim().parse::<i64>().ok().filter(|n| *n >= 0);
                }
                if let Some(resource) = a.name.strip_prefix(nrt::attr::FREE_DEVICES_PREFIX) {
                    let rid = res.intern(resource);
                    zone.free_devices.insert(rid, nrt::split_device_ids(&a.value));
                }
            }
            raw_costs.push(
                z.costs
                    .iter()
                    .flatten()
                    .filter_map(|c| nrt::parse_zone_name(&c.name).map(|to| (to, c.value)))
                    .collect(),
            );
            zones.push(zone);
        }
        if zones.is_empty() {
            return Err(NrtError::MissingZones);
        }
        if zones.len() > MAX_ZONES {
            return Err(NrtError::TooManyZones { zones: zones.len() });
        }
        for (field, pick) in [
            (
                "capacity",
                (|z: &NumaZone| &z.capacity) as fn(&NumaZone) -> &Dense,
            ),
            ("allocatable", |z: &NumaZone| &z.allocatable),
            ("available", |z: &NumaZone| &z.available),
        ] {
            let mut sums: BTreeMap<ResId, i64> = BTreeMap::new();
            for z in &zones {
                for (rid, v) in pick(z).iter() {
                    let sum = sums.entry(rid).or_default();
                    *sum = sum
                        .checked_add(v)
                        .filter(|s| *s <= MAX_NODE_AMOUNT)
                        .ok_or_else(|| NrtError::AmountOverflow {
                            resource: res.name(rid).to_owned(),
                            field,
                        })?;
                }
            }
        }
        // The published free IDs are the specific truth; never count more than are listed.
        for z in &mut zones {
            for (rid, ids) in &z.free_devices {
                let listed = i64::try_from(ids.len()).unwrap_or(i64::MAX);
                let avail = z.available.get_or_zero(*rid);
                z.available.set(*rid, avail.min(listed));
            }
        }
        // Keep list order for upstream-compatible scoring, and sort zones by id for the model.
        let mut order: Vec<usize> = (0..zones.len()).collect();
        order.sort_by_key(|&i| zones[i].id);
        let sorted: Vec<NumaZone> = order.iter().map(|&i| zones[i].clone()).collect();
        let sorted_costs: Vec<&Vec<(u32, i64)>> = order.iter().map(|&i| &raw_costs[i]).collect();
        let list_order: Vec<usize> = (0..zones.len())
            .map(|li| order.iter().position(|&o| o == li).unwrap_or(li))
            .collect();
        let ids: Vec<u32> = sorted.iter().map(|z| z.id).collect();
        let costs: Vec<Vec<u64>> = sorted_costs
            .iter()
            .map(|row| {
                ids.iter()
                    .map(|to| {
                        row.iter()
                            .find(|(t, _)| t == to)
                            .and_then(|(_, v)| u64::try_from(*v).ok())
                            .unwrap_or(255)
                    })
                    .collect()
            })
            .collect();
        let has_all_costs = sorted_costs
            .iter()
            .all(|row| ids.iter().all(|to| row.iter().any(|(t, _)| t == to)));
        let distances = if has_all_costs {
            let size = ids.iter().max().map_or(0, |m| *m as usize + 1);
            let mut rows = vec![vec![0u64; size]; size];
            for (i, from) in ids.iter().enumerate() {
                for (j, to) in ids.iter().enumerate() {
                    rows[*from as usize][*to as usize] = costs[i][j];
                }
            }
            Some(NumaDistances::new(rows).map_err(NrtError::NumaLayout)?)
        } else {
            None
        };
        let max_numa_nodes = cfg.max_numa_nodes.unwrap_or(8);
        let prefer_closest = cfg.prefer_closest.unwrap_or(false) && distances.is_some();
        let options = PolicyOptions {
            prefer_closest_numa_nodes: prefer_closest,
            max_allowable_numa_nodes: max_numa_nodes.max(8),
        };
        let info = NumaInfo::new(ids, distances).map_err(NrtError::NumaLayout)?;
        let memory_managed = sorted
            .iter()
            .any(|z| z.available.iter().any(|(id, _)| res.kind(id).is_memory_like()));
        let fingerprint = obj
            .attribute(nrt::attr::PODS_FINGERPRINT)
            .or_else(|| {
                obj.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(nrt::ANNOTATION_FINGERPRINT))
                    .map(String::as_str)
            })
            .map(str::to_owned);
        let fingerprint_exclusive_only = obj
            .attribute(nrt::attr::PODS_FINGERPRINT_METHOD)
            .is_some_and(|m| {
                m.parse::<numaplane::fingerprint::Method>()
                    == Ok(numaplane::fingerprint::Method::WithExclusiveResources)
            });
        let masks = (0..(1usize << sorted.len()))
            .map(|bits| {
                crate::topology_manager::NumaMask::from_ids(
                    (0..sorted.len())
                        .filter(|i| bits & (1 << i) != 0)
                        .map(|i| sorted[i].id),
                )
                .unwrap_or(crate::topology_manager::NumaMask::EMPTY)
            })
            .collect();
        let mut shared_devices = std::collections::BTreeSet::new();
        let mut seen: std::collections::HashMap<(ResId, &str), usize> = std::collections::HashMap::new();
        for (zi, z) in sorted.iter().enumerate() {
            for (rid, ids) in &z.free_devices {
                for dev in ids {
                    if let Some(prev) = seen.insert((*rid, dev.as_str()), zi)
                        && prev != zi
                    {
                        shared_devices.insert(*rid);
                    }
                }
            }
        }
        let cluster_held = obj
            .cluster_held()
            .into_iter()
            .map(|(name, ids)| (res.intern(&name), ids))
            .collect();
        let full_pcpus_threads = full_pcpus_threads(obj);
        let memory_groups = match obj.attribute(nrt::attr::MEMORY_GROUPS) {
            None => None,
            Some(value) => {
                let groups = nrt::split_memory_groups(value)
                    .map_err(|e| NrtError::ParseMemoryGroups(e.to_string()))?;
                if let Some(id) = groups
                    .iter()
                    .flatten()
                    .find(|id| !sorted.iter().any(|z| z.id == **id))
                {
                    return Err(NrtError::ParseMemoryGroups(format!("NUMA node {id} has no zone")));
                }
                Some(groups)
            }
        };
        let mut unaligned_devices = BTreeMap::new();
        for (resource, parsed) in obj.devices_without_numa() {
            let bad = |message: String| NrtError::ParseDevicesWithoutNuma {
                resource: resource.clone(),
                message,
            };
            let parsed = parsed.map_err(|e| bad(e.to_string()))?;
            // Within the per-resource bound, so zone sums plus these never wrap.
            let free = i64::try_from(parsed.free)
                .ok()
                .filter(|f| *f <= MAX_NODE_AMOUNT)
                .ok_or_else(|| bad(format!("{} free exceeds {MAX_NODE_AMOUNT}", parsed.free)))?;
            unaligned_devices.insert(
                res.intern(&resource),
                Unaligned {
                    free,
                    ids: parsed.ids,
                },
            );
        }
        let node_level = obj.node_level_resources().map(|names| {
            names
                .iter()
                .map(|n| res.intern(n))
                .collect::<std::collections::BTreeSet<ResId>>()
        });
        let (pci_locality, pci_locality_error) = match obj.pci_locality() {
            None => (Vec::new(), None),
            Some(Ok(ranges)) => (ranges, None),
            Some(Err(e)) => {
                // Only the placement of DRA devices by PCI address depends on it: the rest of
                // the NRT stays usable, and such devices count as without NUMA node.
                tracing::warn!(
                    nrt = obj.metadata.name.as_deref().unwrap_or(""),
                    error = %e,
                    "ignoring the PCI locality attribute"
                );
                (Vec::new(), Some(e.to_string()))
            }
        };
        let policy = cfg.policy.unwrap_or(Policy::None);
        let cpu_options = crate::kubelet_options::cpu_manager_options(obj, policy == Policy::SingleNumaNode);
        let mut approximate = crate::kubelet_options::topology_manager_approximations(obj);
        approximate.extend(cpu_options.approximate.iter().cloned());
        Ok(NumaTopology {
            node_level,
            lagging: Vec::new(),
            pci_locality,
            pci_locality_error,
            unaligned_devices,
            memory_groups,
            masks,
            shared_devices,
            cluster_held,
            full_pcpus_threads,
            cpu_distribute: cpu_options.distribute_across_numa,
            approximate,
            policy: cfg.policy.unwrap_or(Policy::None),
            scope: cfg.scope.unwrap_or(Scope::Container),
            options,
            max_numa_nodes,
            info,
            zones: sorted,
            list_order,
            costs,
            memory_managed,
            fingerprint,
            fingerprint_exclusive_only,
        })
    }

    /// Whether any zone lists `id`.
    pub fn lists(&self, id: ResId) -> bool {
        self.zones.iter().any(|z| z.available.get(id).is_some())
    }

    /// The extended resources `node_allocatable` (the Node's `status.allocatable`) has that
    /// this NRT does not describe although it promises to ([`Self::node_level`]): in no zone,
    /// not without NUMA, not node-level. Empty for an NRT that promises nothing: there a
    /// resource missing from the zones is taken to have no NUMA affinity, as upstream does.
    pub fn lagging_behind(&self, res: &Resources, node_allocatable: &Dense) -> Vec<ResId> {
        let Some(node_level) = &self.node_level else {
            return Vec::new();
        };
        node_allocatable
            .iter()
            .filter(|&(id, amount)| {
                amount > 0
                    && res.kind(id) == ResKind::Extended
                    && !self.lists(id)
                    && !self.unaligned_devices.contains_key(&id)
                    && !node_level.contains(&id)
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// The first resource `request` asks for that this NRT lags the node on ([`Self::lagging`]).
    pub fn lags_for(&self, request: &crate::resources::ResList) -> Option<ResId> {
        if self.lagging.is_empty() {
            return None;
        }
        request
            .positive()
            .map(|(id, _)| id)
            .find(|id| self.lagging.contains(id))
    }
}

/// The verdict reason for a node whose NRT lags it on `resource` (see
/// [`NumaTopology::lagging_behind`]).
pub fn lag_reason(resource: &str) -> String {
    format!("NRT lags the node: {resource} allocatable on the node, not in its NodeResourceTopology")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nrt(json: serde_json::Value) -> NodeResourceTopology {
        serde_json::from_value(json).expect("nrt")
    }

    #[test]
    fn attributes_override_legacy_policies() {
        let n = nrt(
            serde_json::json!({"topologyPolicies": ["BestEffortPodLevel"], "zones": [],
            "attributes": [{"name": "topologyManagerScope", "value": "container"},
                           {"name": "topologyManagerPolicy", "value": "Pod"}]}),
        );
        let c = TmConfig::from_nrt(&n);
        assert_eq!(c.policy, Some(Policy::BestEffort));
        assert_eq!(c.scope, Some(Scope::Container));
    }

    #[test]
    fn max_numa_nodes_rules() {
        let with = |v: &str| {
            TmConfig::from_nrt(&nrt(serde_json::json!({"zones": [],
                "attributes": [{"name": "topologyManagerMaxNUMANodes", "value": v}]})))
            .max_numa_nodes
        };
        assert_eq!(with("16"), Some(16));
        assert_eq!(with("65535"), Some(1024));
        assert_eq!(with("1"), None);
        assert_eq!(with("A"), None);
    }

    #[test]
    fn malformed_nrts_are_typed_errors() {
        let mut r = Resources::default();
        let zone = |name: &str, avail: &str| {
            serde_json::json!({"name": name, "type": "Node",
                "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": avail}]})
        };
        let check = |zones: Vec<serde_json::Value>, label: &str, r: &mut Resources| {
            let err = NumaTopology::from_nrt(r, &nrt(serde_json::json!({"zones": zones}))).expect_err(label);
            assert_eq!(err.metric_label(), label, "{err}");
        };
        check(vec![], "missing_zones", &mut r);
        check(vec![zone("numa-0", "1")], "zone_name", &mut r);
        check(vec![zone("node-64", "1")], "zone_name", &mut r);
        check(
            vec![zone("node-0", "1"), zone("node-0", "1")],
            "duplicate_zone",
            &mut r,
        );
        check(vec![zone("node-0", "lots")], "quantity", &mut r);
        check(vec![zone("node-0", "-1")], "quantity_range", &mut r);
    }

    #[test]
    fn zones_sorted_with_costs_and_free_devices() {
        let mut r = Resources::default();
        let n = nrt(serde_json::json!({"zones": [
            {"name": "node-4", "type": "Node", "costs": [{"name": "node-0", "value": 21}, {"name": "node-4", "value": 10}],
             "attributes": [{"name": "numaplane.io/free-devices.nvidia.com/gpu", "value": "gpu-3,gpu-2"}],
             "resources": [{"name": "nvidia.com/gpu", "capacity": "2", "allocatable": "2", "available": "2"}]},
            {"name": "node-0", "type": "Node", "costs": [{"name": "node-0", "value": 10}, {"name": "node-4", "value": 21}],
             "resources": [{"name": "memory", "capacity": "1Gi", "allocatable": "1Gi", "available": "1Gi"}]},
            {"name": "socket-0", "type": "Socket"}
        ]}));
        let t = NumaTopology::from_nrt(&mut r, &n).expect("valid");
        assert_eq!(t.zones.iter().map(|z| z.id).collect::<Vec<_>>(), vec![0, 4]);
        assert_eq!(t.costs, vec![vec![10, 21], vec![21, 10]]);
        assert_eq!(t.list_order, vec![1, 0]);
        let gpu = r.get("nvidia.com/gpu").expect("interned");
        assert_eq!(t.zones[1].free_devices[&gpu], vec!["gpu-2", "gpu-3"]);
        assert!(t.memory_managed);
        assert_eq!(t.policy, Policy::None);
    }
}
