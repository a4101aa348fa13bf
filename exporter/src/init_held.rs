//! What the kubelet holds for a pod beyond what pod-resources `List` reports: the CPUs,
//! devices and memory init containers got and no app container reused. `List` shows app
//! containers only (kubernetes#126765), so without this an init container's leftovers are
//! published as free and the next pod placed on them is rejected with `TopologyAffinityError`.
//!
//! Two sources, per kind of resource:
//! - **checkpoint**: the kubelet's own checkpoints ([`crate::checkpoint`]), exact: the pod's
//!   union over all its containers, minus what `List` shows for it;
//! - **pod-spec**: derived from the pod's spec when a checkpoint is not readable: the kubelet
//!   lets later containers reuse a finished init container's CPUs and devices, so a pod holds
//!   `max(0, largest init container − app containers − sidecars)` beyond `List`. Exact in
//!   count for devices (the device manager allocates from the reusable set first); a lower
//!   bound for CPUs (the static policy may take fresh CPUs instead of reusable ones). Which IDs
//!   are held is not known: the accounting charges free IDs next to the pod's own.
//!
//! Pure: the caller reads the checkpoint files and the pod watch.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use numaplane::proto::podresources::{ListPodResourcesResponse, PodResources};
use numaplane::quantity::Quantity;
use numaplane::resource_name::{self, Class};

use crate::checkpoint::{CheckpointError, CpuAssignments, DeviceAssignments, MemoryAssignments, MemoryBlock};

/// (namespace, name).
pub type PodKey = (String, String);

/// Where the held amounts of one kind of resource came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The kubelet's checkpoint, checksum verified.
    Checkpoint,
    /// Derived from the pod spec.
    PodSpec,
    /// Neither: nothing beyond `List` is published for this kind.
    Unknown,
}

impl Source {
    /// The metric label and attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Checkpoint => "checkpoint",
            Source::PodSpec => "pod-spec",
            Source::Unknown => "none",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Source per kind of resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// Exclusive CPUs.
    pub cpu: Source,
    /// Device plugin devices.
    pub devices: Source,
    /// Memory manager memory and hugepages.
    pub memory: Source,
}

impl Default for Sources {
    fn default() -> Self {
        Self {
            cpu: Source::Unknown,
            devices: Source::Unknown,
            memory: Source::Unknown,
        }
    }
}

impl fmt::Display for Sources {
    /// The node attribute value: `cpu=checkpoint,devices=checkpoint,memory=none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu={},devices={},memory={}",
            self.cpu, self.devices, self.memory
        )
    }
}

/// What one pod holds beyond `List`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// CPU ids (checkpoint).
    pub cpu_ids: BTreeSet<u32>,
    /// Resource → device id → NUMA nodes, −1 for none (checkpoint).
    pub device_ids: BTreeMap<String, BTreeMap<String, Vec<i64>>>,
    /// Memory blocks (checkpoint).
    pub memory: Vec<MemoryBlock>,
    /// A number of CPUs, identities unknown (pod spec).
    pub cpu_count: u64,
    /// Resource → number of devices, identities unknown (pod spec).
    pub device_counts: BTreeMap<String, u64>,
}

impl Held {
    /// Whether the pod holds nothing beyond `List`.
    pub fn is_empty(&self) -> bool {
        self.cpu_ids.is_empty()
            && self.device_ids.values().all(BTreeMap::is_empty)
            && self.memory.is_empty()
            && self.cpu_count == 0
            && self.device_counts.values().all(|&n| n == 0)
    }
}

/// What the pod watch knows of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.uid`: the checkpoints' key.
    pub uid: String,
    /// The pod-spec estimate of what init containers leave held.
    pub spec: SpecHeld,
}

/// Amounts init containers leave held, derived from the pod spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecHeld {
    /// Exclusive CPUs (Guaranteed pods with whole-CPU requests, under the static policy).
    pub cpus: u64,
    /// Devices per extended resource.
    pub devices: BTreeMap<String, u64>,
}

/// The checkpoints as read this scan: `None` when the file is absent (or no state directory is
/// configured), an error when it is unusable.
#[derive(Debug, Default)]
pub struct Checkpoints {
    /// `cpu_manager_state`.
    pub cpu: Option<Result<CpuAssignments, CheckpointError>>,
    /// `device-plugins/kubelet_internal_checkpoint`.
    pub devices: Option<Result<DeviceAssignments, CheckpointError>>,
    /// `memory_manager_state`.
    pub memory: Option<Result<MemoryAssignments, CheckpointError>>,
}

/// The three checkpoints below the kubelet's root directory (`/var/lib/kubelet`).
pub async fn read_checkpoints(dir: &std::path::Path) -> Checkpoints {
    use crate::checkpoint::{self as ck, read_one};
    Checkpoints {
        cpu: read_one(dir, ck::CPU_MANAGER_STATE, ck::parse_cpu_manager_state).await,
        devices: read_one(dir, ck::DEVICE_MANAGER_CHECKPOINT, ck::parse_device_checkpoint).await,
        memory: read_one(dir, ck::MEMORY_MANAGER_STATE, ck::parse_memory_manager_state).await,
    }
}

impl Checkpoints {
    /// The files that exist but could not be used.
    pub fn errors(&self) -> Vec<CheckpointError> {
        let mut out = Vec::new();
        if let Some(Err(e)) = &self.cpu {
            out.push(e.clone());
        }
        if let Some(Err(e)) = &self.devices {
            out.push(e.clone());
        }
        if let Some(Err(e)) = &self.memory {
            out.push(e.clone());
        }
        out
    }
}

/// The request of one container for `resource` (requests, else limits), in whole units, if any.
fn container_amount(c: &k8s_openapi::api::core::v1::Container, resource: &str) -> Option<Quantity> {
    let r = c.resources.as_ref()?;
    let q = r
        .requests
        .as_ref()
        .and_then(|m| m.get(resource))
        .or_else(|| r.limits.as_ref().and_then(|m| m.get(resource)))?;
    Quantity::parse(&q.0).ok()
}

/// Whole units of a quantity (`None` when fractional, negative or huge).
fn whole(q: &Quantity) -> Option<u64> {
    q.as_i64_exact().and_then(|v| u64::try_from(v).ok())
}

/// The pod-spec estimate: per resource, the largest non-restartable init container minus what
/// the app containers and sidecars take (they allocate from the init containers' reusable set
/// first). CPUs count only for Guaranteed pods (whole CPUs are exclusive there under the static
/// policy, which the caller checks).
pub fn spec_held(pod: &Pod) -> SpecHeld {
    let Some(spec) = &pod.spec else {
        return SpecHeld::default();
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let is_sidecar =
        |c: &&k8s_openapi::api::core::v1::Container| c.restart_policy.as_deref() == Some("Always");
    let guaranteed = pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) == Some("Guaranteed");

    let mut resources: BTreeSet<String> = BTreeSet::new();
    for c in inits.iter().filter(|c| !is_sidecar(c)) {
        for m in c
            .resources
            .iter()
            .flat_map(|r| r.requests.iter().chain(r.limits.iter()))
        {
            resources.extend(m.keys().cloned());
        }
    }
    let mut out = SpecHeld::default();
    for resource in resources {
        let exclusive = match resource_name::classify(&resource) {
            Class::Cpu => guaranteed,
            Class::Extended => true,
            _ => false,
        };
        if !exclusive {
            continue;
        }
        // Only whole amounts are exclusive (a fractional CPU request shares the pool).
        let amount = |c: &k8s_openapi::api::core::v1::Container| {
            container_amount(c, &resource).and_then(|q| whole(&q))
        };
        let largest_init = inits
            .iter()
            .filter(|c| !is_sidecar(c))
            .filter_map(amount)
            .max()
            .unwrap_or(0);
        let reusers = spec
            .containers
            .iter()
            .chain(inits.iter().filter(is_sidecar))
            .filter_map(amount)
            .fold(0u64, u64::saturating_add);
        let left = largest_init.saturating_sub(reusers);
        if left == 0 {
            continue;
        }
        if resource == resource_name::CPU {
            out.cpus = left;
        } else {
            out.devices.insert(resource, left);
        }
    }
    out
}

fn usable<T>(read: &Option<Result<T, CheckpointError>>) -> Option<&T> {
    read.as_ref().and_then(|r| r.as_ref().ok())
}

/// What each listed pod holds beyond `List`, and where each kind came from.
///
/// `facts`: the pod watch's view (UIDs and spec estimates); without it nothing can be matched
/// (checkpoints are keyed by UID, `List` by name) and every source is [`Source::Unknown`].
/// `static_cpus`: whether the kubelet runs the static CPU manager policy (exclusive CPUs).
pub fn held_beyond_list(
    list: &ListPodResourcesResponse,
    facts: Option<&BTreeMap<PodKey, PodFacts>>,
    checkpoints: &Checkpoints,
    static_cpus: bool,
) -> (BTreeMap<PodKey, Held>, Sources) {
    let Some(facts) = facts else {
        return (BTreeMap::new(), Sources::default());
    };
    let cpu = usable(&checkpoints.cpu);
    let devices = usable(&checkpoints.devices);
    let memory = usable(&checkpoints.memory);
    let sources = Sources {
        cpu: if cpu.is_some() {
            Source::Checkpoint
        } else {
            Source::PodSpec
        },
        devices: if devices.is_some() {
            Source::Checkpoint
        } else {
            Source::PodSpec
        },
        // The memory manager reuses init memory by shrinking the init blocks in its state; the
        // spec cannot tell what is left, so memory comes from the checkpoint or not at all.
        memory: if memory.is_some() {
            Source::Checkpoint
        } else {
            Source::Unknown
        },
    };

    let mut out = BTreeMap::new();
    for pod in &list.pod_resources {
        let key = (pod.namespace.clone(), pod.name.clone());
        let Some(f) = facts.get(&key) else {
            continue;
        };
        let mut held = Held::default();
        match cpu {
            Some(c) => {
                let listed = listed_cpus(pod);
                held.cpu_ids = c
                    .pods
                    .get(&f.uid)
                    .into_iter()
                    .flat_map(BTreeMap::values)
                    .flatten()
                    .filter(|cpu| !listed.contains(cpu))
                    .copied()
                    .collect();
            }
            None if static_cpus => held.cpu_count = f.spec.cpus,
            None => {}
        }
        match devices {
            Some(d) => {
                let listed = listed_devices(pod);
                for by_resource in d.pods.get(&f.uid).into_iter().flat_map(BTreeMap::values) {
                    for (resource, ids) in by_resource {
                        for (id, numa) in ids {
                            if listed.contains(&(resource.as_str(), id.as_str())) {
                                continue;
                            }
                            let nodes = held
                                .device_ids
                                .entry(resource.clone())
                                .or_default()
                                .entry(id.clone())
                                .or_default();
                            nodes.extend(numa.iter().copied());
                            nodes.sort_unstable();
                            nodes.dedup();
                        }
                    }
                }
            }
            None => held.device_counts = f.spec.devices.clone(),
        }
        if let Some(m) = memory {
            held.memory = memory_beyond_list(pod, m.pods.get(&f.uid));
        }
        if !held.is_empty() {
            out.insert(key, held);
        }
    }
    (out, sources)
}

fn listed_cpus(pod: &PodResources) -> BTreeSet<u32> {
    pod.cpu_ids
        .iter()
        .chain(pod.containers.iter().flat_map(|c| &c.cpu_ids))
        .filter_map(|&id| u32::try_from(id).ok())
        .collect()
}

fn listed_devices(pod: &PodResources) -> BTreeSet<(&str, &str)> {
    pod.containers
        .iter()
        .flat_map(|c| &c.devices)
        .flat_map(|d| {
            d.device_ids
                .iter()
                .map(|id| (d.resource_name.as_str(), id.as_str()))
        })
        .collect()
}

/// The checkpoint's blocks of the pod, summed by (type, NUMA nodes), minus what `List` shows.
fn memory_beyond_list(
    pod: &PodResources,
    checkpoint: Option<&BTreeMap<String, Vec<MemoryBlock>>>,
) -> Vec<MemoryBlock> {
    let Some(containers) = checkpoint else {
        return Vec::new();
    };
    let mut held: BTreeMap<(String, Vec<i64>), u64> = BTreeMap::new();
    for b in containers.values().flatten() {
        let mut nodes = b.numa_affinity.clone();
        nodes.sort_unstable();
        nodes.dedup();
        let total = held.entry((b.memory_type.clone(), nodes)).or_default();
        *total = total.saturating_add(b.size);
    }
    let listed_blocks: Vec<_> = if pod.memory.is_empty() {
        pod.containers.iter().flat_map(|c| &c.memory).collect()
    } else {
        pod.memory.iter().collect()
    };
    for b in listed_blocks {
        let mut nodes: Vec<i64> = b.topology.iter().flat_map(|t| &t.nodes).map(|n| n.id).collect();
        nodes.sort_unstable();
        nodes.dedup();
        if let Some(total) = held.get_mut(&(b.memory_type.clone(), nodes)) {
            *total = total.saturating_sub(b.size);
        }
    }
    held.into_iter()
        .filter(|(_, size)| *size > 0)
        .map(|((memory_type, numa_affinity), size)| MemoryBlock {
            numa_affinity,
            memory_type,
            size,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use numaplane::proto::podresources::{ContainerDevices, ContainerResources, NumaNode, TopologyInfo};

    fn pod_json(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_largest_init_container_minus_what_later_containers_reuse_stays_held() {
        // Init takes 2 GPUs and 4 CPUs, the app reuses 1 GPU and 2 CPUs (the real-kubelet case).
        let pod = pod_json(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {
                "initContainers": [
                    {"name": "init", "resources": {"limits": {"cpu": "4", "memory": "1Gi", "nvidia.com/gpu": "2"}}},
                    {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
                ],
                "containers": [{"name": "app", "resources": {"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]
            },
            "status": {"qosClass": "Guaranteed"}
        }));
        let held = spec_held(&pod);
        assert_eq!(held.cpus, 1, "4 − (2 app + 1 sidecar)");
        assert_eq!(held.devices, BTreeMap::from([("nvidia.com/gpu".to_owned(), 1)]));
        // Outside Guaranteed QoS, CPUs are shared: nothing held.
        let mut burstable = pod.clone();
        burstable.status.as_mut().unwrap().qos_class = Some("Burstable".into());
        assert_eq!(spec_held(&burstable).cpus, 0);
    }

    #[test]
    fn pods_without_init_containers_hold_nothing_beyond_list() {
        let pod = pod_json(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}}]},
            "status": {"qosClass": "Guaranteed"}
        }));
        assert_eq!(spec_held(&pod), SpecHeld::default());
    }

    fn listed_pod() -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "app".into(),
                    cpu_ids: vec![2, 3],
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec!["gpu-0".into()],
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 0 }],
                        }),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn facts() -> BTreeMap<PodKey, PodFacts> {
        BTreeMap::from([(
            ("ns".to_owned(), "p".to_owned()),
            PodFacts {
                uid: "u1".into(),
                spec: SpecHeld {
                    cpus: 9,
                    devices: BTreeMap::from([("nvidia.com/gpu".to_owned(), 9)]),
                },
            },
        )])
    }

    #[test]
    fn checkpoints_give_the_exact_leftovers_and_win_over_the_spec() {
        let checkpoints = Checkpoints {
            cpu: Some(Ok(CpuAssignments {
                policy: "static".into(),
                pods: BTreeMap::from([(
                    "u1".to_owned(),
                    BTreeMap::from([
                        ("init".to_owned(), BTreeSet::from([2, 3, 4])),
                        ("app".to_owned(), BTreeSet::from([2, 3])),
                    ]),
                )]),
            })),
            devices: Some(Ok(DeviceAssignments {
                pods: BTreeMap::from([(
                    "u1".to_owned(),
                    BTreeMap::from([(
                        "init".to_owned(),
                        BTreeMap::from([(
                            "nvidia.com/gpu".to_owned(),
                            BTreeMap::from([("gpu-0".to_owned(), vec![0]), ("gpu-1".to_owned(), vec![0])]),
                        )]),
                    )]),
                )]),
            })),
            memory: None,
        };
        let (held, sources) = held_beyond_list(&listed_pod(), Some(&facts()), &checkpoints, true);
        let h = &held[&("ns".to_owned(), "p".to_owned())];
        assert_eq!(h.cpu_ids, BTreeSet::from([4]));
        assert_eq!(
            h.device_ids["nvidia.com/gpu"],
            BTreeMap::from([("gpu-1".to_owned(), vec![0])])
        );
        assert_eq!(
            (h.cpu_count, h.device_counts.len()),
            (0, 0),
            "the spec is not used"
        );
        assert_eq!(
            sources.to_string(),
            "cpu=checkpoint,devices=checkpoint,memory=none"
        );
    }

    #[test]
    fn an_unusable_checkpoint_falls_back_to_the_spec_and_no_pod_watch_means_unknown() {
        let checkpoints = Checkpoints {
            cpu: Some(Err(CheckpointError::VerifyChecksum {
                file: crate::checkpoint::CPU_MANAGER_STATE,
                found: 1,
            })),
            devices: None,
            memory: None,
        };
        let (held, sources) = held_beyond_list(&listed_pod(), Some(&facts()), &checkpoints, true);
        let h = &held[&("ns".to_owned(), "p".to_owned())];
        assert_eq!(h.cpu_count, 9);
        // Without the static policy no CPU is exclusive, whatever the spec says.
        let (shared, _) = held_beyond_list(&listed_pod(), Some(&facts()), &checkpoints, false);
        assert_eq!(shared[&("ns".to_owned(), "p".to_owned())].cpu_count, 0);
        assert_eq!(h.device_counts["nvidia.com/gpu"], 9);
        assert_eq!(sources.to_string(), "cpu=pod-spec,devices=pod-spec,memory=none");

        let (held, sources) = held_beyond_list(&listed_pod(), None, &checkpoints, true);
        assert!(held.is_empty());
        assert_eq!(sources, Sources::default());
    }

    #[test]
    fn memory_held_is_the_checkpoint_total_minus_the_listed_blocks() {
        let mut list = listed_pod();
        list.pod_resources[0].containers[0].memory = vec![numaplane::proto::podresources::ContainerMemory {
            memory_type: "memory".into(),
            size: 1 << 30,
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        }];
        let block = |size| MemoryBlock {
            numa_affinity: vec![1],
            memory_type: "memory".into(),
            size,
        };
        let checkpoints = Checkpoints {
            memory: Some(Ok(MemoryAssignments {
                policy: "Static".into(),
                groups: vec![],
                pods: BTreeMap::from([(
                    "u1".to_owned(),
                    BTreeMap::from([
                        ("init".to_owned(), vec![block(1 << 29)]),
                        ("app".to_owned(), vec![block(1 << 30)]),
                    ]),
                )]),
            })),
            ..Default::default()
        };
        let (held, _) = held_beyond_list(&list, Some(&facts()), &checkpoints, true);
        assert_eq!(
            held[&("ns".to_owned(), "p".to_owned())].memory,
            vec![block(1 << 29)]
        );
    }
}
