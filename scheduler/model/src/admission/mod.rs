//! Exact prediction of kubelet admission: the CPU, memory and device hint providers computed
//! from NRT zones (kubelet-topology-manager.md §3), the Topology Manager merge under the node's
//! policy and scope (§2), and the allocation that follows, including the concrete device IDs.
//!
//! Pure and synchronous: a node's zones are copied into a [`WorkingZones`] and consumed
//! container by container, as the kubelet's managers do.
//!
//! One module per concern: the hint providers [`cpu`], [`memory`] (with the memory groups) and
//! [`devices`], the shared hint plumbing [`hints`], the Topology Manager [`merge`] (which collects every
//! provider's hints), CPU [`packing`] and the
//! [`rejection`] messages, [`init_reuse`] (what init containers leave for app containers),
//! [`smt`] (full physical cores), and [`allocate`]; this module is the orchestration on top.

use crate::admission::allocate::allocate;
use crate::admission::devices::explain_devices;
use crate::admission::hints::Hints;
use crate::admission::hints::mask_ids;
use crate::admission::init_reuse::Reuse;
use crate::admission::memory::Groups;
use crate::admission::merge::decide;
use crate::admission::rejection::rejection_for;
use crate::{
    node::{NumaTopology, Unaligned},
    pod::{PodSpec, Qos},
    prepared::{PreparedPod, Unit},
    resources::{ResId, Resources},
    topology_manager::{NumaMask, Policy, Scope},
};
pub use numaplane::allocation::ContainerKind;
use std::collections::BTreeMap;

mod allocate;
mod cpu;
mod devices;
mod hints;
mod init_reuse;
mod memory;
mod merge;
mod packing;
mod rejection;
mod smt;

/// Aggregate category of a node whose NRT lags it ([`crate::node::lag_reason`]).
pub const LAG_CATEGORY: &str = "node(s) had a NodeResourceTopology lagging the node";

/// Mutable per-zone state while one pod is admitted.
#[derive(Clone, Debug, Default)]
pub struct WorkingZones {
    /// Zone ids, ascending.
    pub ids: Vec<u32>,
    /// Available per zone (dense by ResId; absent = not listed).
    pub available: Vec<crate::resources::Dense>,
    /// Free device IDs per zone and resource; `None` while only counts are needed (filtering),
    /// so evaluating a node does not copy ID strings.
    pub free_devices: Option<Vec<BTreeMap<ResId, Vec<String>>>>,
    /// Free devices without a NUMA node, per resource (in no zone).
    pub unaligned: BTreeMap<ResId, Unaligned>,
}

impl WorkingZones {
    /// Copies the zones of `topo`.
    pub fn from_topology(topo: &NumaTopology) -> Self {
        if !topo.shared_devices.is_empty() {
            return Self::with_device_ids(topo);
        }
        WorkingZones {
            ids: topo.zones.iter().map(|z| z.id).collect(),
            available: topo.zones.iter().map(|z| z.available.clone()).collect(),
            free_devices: None,
            unaligned: topo.unaligned_devices.clone(),
        }
    }

    /// Becomes [`Self::from_topology`]`(topo)`, reusing this value's buffers (evaluating many
    /// nodes in a row).
    pub fn reset_from(&mut self, topo: &NumaTopology) {
        if !topo.shared_devices.is_empty() {
            *self = Self::with_device_ids(topo);
            return;
        }
        self.ids.clear();
        self.ids.extend(topo.zones.iter().map(|z| z.id));
        self.available.truncate(topo.zones.len());
        for (i, z) in topo.zones.iter().enumerate() {
            match self.available.get_mut(i) {
                Some(a) => a.0.clone_from(&z.available.0),
                None => self.available.push(z.available.clone()),
            }
        }
        self.free_devices = None;
        self.unaligned.clone_from(&topo.unaligned_devices);
    }

    /// Copies the zones including free device IDs, to choose concrete devices.
    pub fn with_device_ids(topo: &NumaTopology) -> Self {
        let mut w = WorkingZones {
            ids: topo.zones.iter().map(|z| z.id).collect(),
            available: topo.zones.iter().map(|z| z.available.clone()).collect(),
            free_devices: None,
            unaligned: topo.unaligned_devices.clone(),
        };
        w.free_devices = Some(topo.zones.iter().map(|z| z.free_devices.clone()).collect());
        w
    }
}

/// Where one container landed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPlacement {
    /// Container name.
    pub name: String,
    /// `init`, `sidecar` or `app`.
    pub kind: ContainerKind,
    /// Predicted NUMA affinity (`None`: any node, e.g. policy `none`).
    pub numa_nodes: Option<Vec<u32>>,
    /// Chosen device IDs per extended resource.
    pub devices: BTreeMap<String, Vec<String>>,
    /// Device counts per resource where the node publishes no IDs.
    pub device_counts: BTreeMap<String, i64>,
    /// Why these devices, in one line.
    pub explanation: String,
    /// The NUMA nodes the Static memory manager takes this container's memory from (the
    /// Topology Manager's mask, or its extension); `None` without memory-manager requests or
    /// for an init container (whose memory is not modelled as held). A multi-node mask forms
    /// a memory group, which the scheduler's assumption must carry (not serialised: the
    /// record and the simulate output stay as they were).
    #[serde(skip)]
    pub memory_mask: Option<NumaMask>,
    /// How many exclusive CPUs the static CPU manager gives it (0: none; not serialised).
    #[serde(skip)]
    pub exclusive_cpus: i64,
    /// Zone positions (bits) its exclusive CPUs come from; filled only when recorded as
    /// [`Self::cpu_numa_nodes`] (not serialised).
    #[serde(skip)]
    pub cpu_zones: usize,
    /// The NUMA nodes its exclusive CPUs come from (the mask's first, then the rest, as the
    /// CPU manager packs or distributes them); `None` without exclusive CPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_numa_nodes: Option<Vec<u32>>,
    /// The NUMA nodes of the Static memory manager's block for it; `None` without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_numa_nodes: Option<Vec<u32>>,
}

/// A predicted admission.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Pod-scope affinity (pod scope only).
    pub pod_numa_nodes: Option<Vec<u32>>,
    /// Per container, init containers first.
    pub containers: Vec<ContainerPlacement>,
    /// Number of NUMA nodes the widest container spans (for explanations).
    pub max_span: usize,
}

impl Placement {
    /// Whether the kubelet gives this pod anything of its own at admission (exclusive CPUs, a
    /// Static memory manager block, devices): then what it gets depends on which pods the
    /// kubelet admitted before it on the node.
    pub fn holds_exclusive(&self) -> bool {
        self.containers.iter().any(|c| {
            c.exclusive_cpus > 0
                || c.memory_numa_nodes.is_some()
                || !c.devices.is_empty()
                || !c.device_counts.is_empty()
        })
    }

    /// The NUMA node sets the Static memory manager allocates this placement's memory from, by
    /// NUMA id (each ascending, no duplicates): a multi-node one is a group, a single node a
    /// single-NUMA allocation. Until the node's NRT shows them, the next decision must know
    /// them from the placement itself.
    pub fn memory_groups(&self) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = Vec::new();
        for m in self.containers.iter().filter_map(|c| c.memory_mask) {
            let ids: Vec<u32> = m.iter().collect();
            if !ids.is_empty() && !out.contains(&ids) {
                out.push(ids);
            }
        }
        out
    }
}

/// Why the kubelet would reject the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Short aggregate category, e.g. `insufficient cpu on any single NUMA node`.
    pub category: String,
    /// Full human message, starting with the upstream prefix (`cannot align container`).
    pub message: String,
    /// Kubelet reject reason the prediction corresponds to.
    pub kubelet_reason: &'static str,
}

/// What the kubelet's managers carry from one container of the pod to the next.
#[derive(Clone, Debug, Default)]
struct PodState {
    reuse: Reuse,
    groups: Groups,
    /// A later container of the pod asks the memory manager too: where this one's memory goes
    /// decides the groups it meets.
    later_memory: bool,
    /// Exclusive CPUs earlier containers of the pod took from the shared pool: no longer among
    /// the free whole cores `full-pcpus-only` counts (reused init CPUs never return to it).
    pool_cpus_taken: i64,
}

/// Predicts whether the kubelet admits `pod` on a node with topology `topo`, consuming the
/// pod's exclusive resources from `w` on success.
pub fn predict(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PodSpec,
) -> Result<Placement, Rejection> {
    run(res, topo, w, &PreparedPod::new(pod), true)
}

/// [`predict`] for a pod prepared once per decision.
pub fn predict_prepared(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PreparedPod<'_>,
) -> Result<Placement, Rejection> {
    run(res, topo, w, pod, true)
}

/// Whether the kubelet admits `pod`, as [`predict`] decides, without recording the placement
/// or explaining a rejection: the filter's hot path. Consumes from `w` like [`predict`].
pub fn admits(res: &Resources, topo: &NumaTopology, w: &mut WorkingZones, pod: &PodSpec) -> bool {
    run(res, topo, w, &PreparedPod::new(pod), false).is_ok()
}

/// [`admits`] for a pod prepared once per decision.
pub fn admits_prepared(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PreparedPod<'_>,
) -> bool {
    run(res, topo, w, pod, false).is_ok()
}

/// [`predict`]; without `record`, the placement is left empty and a rejection carries no text.
fn run(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PreparedPod<'_>,
    record: bool,
) -> Result<Placement, Rejection> {
    // The kubelet may already hold devices of a resource this NRT does not show yet: nothing
    // here can say where they are, so the node waits until its NRT catches up.
    if let Some(id) = topo.lags_for(&pod.effective) {
        return Err(Rejection {
            category: LAG_CATEGORY.to_owned(),
            message: if record {
                crate::node::lag_reason(res.name(id))
            } else {
                String::new()
            },
            kubelet_reason: "",
        });
    }
    let wants_memory = topo.memory_managed
        && pod.qos == Qos::Guaranteed
        && !pod.spec.pod_level
        && pod
            .containers
            .iter()
            .any(|u| u.request.positive().any(|(id, _)| res.kind(id).is_memory_like()));
    // Memory groups may exist on the node: the pod must be admitted in the world where they do
    // too (see [`Groups`]).
    // Groups matter only to containers the memory manager serves.
    let groups = if wants_memory {
        Groups::of(res, topo, w)
    } else {
        Groups::default()
    };
    let before = groups.exhausted.then(|| w.clone());
    let out = run_world(res, topo, w, pod, record, &groups)?;
    if let Some(mut w2) = before
        && let Err(r) = run_world(res, topo, &mut w2, pod, record, &groups.clone().suspecting(true))
    {
        // `w` holds the first world's consumption; callers discard the zones of a rejection.
        return Err(Rejection {
            category: "memory-manager groups not known from the NRT".to_owned(),
            message: format!(
                "a NUMA zone's memory is used up, the trace of a multi-NUMA memory group the NRT \
                 cannot show; if the zones in use belong to it: {}",
                r.message
            ),
            kubelet_reason: r.kubelet_reason,
        });
    }
    Ok(out)
}

/// [`run`] in one world: `groups` as the node's zones show them, suspecting or not.
fn run_world(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PreparedPod<'_>,
    record: bool,
    groups: &Groups,
) -> Result<Placement, Rejection> {
    let silent = || Rejection {
        category: String::new(),
        message: String::new(),
        kubelet_reason: "",
    };
    let mut out = Placement {
        pod_numa_nodes: None,
        containers: Vec::new(),
        max_span: 0,
    };
    let wants_memory = |u: &Unit<'_>| {
        topo.memory_managed
            && u.managed
            && u.qos == Qos::Guaranteed
            && u.request.positive().any(|(id, _)| res.kind(id).is_memory_like())
    };
    // Containers whose memory allocations the memory manager records (init containers' are not
    // modelled as held).
    let memory_users = pod
        .containers
        .iter()
        .filter(|u| u.kind != ContainerKind::Init && wants_memory(u))
        .count();
    let pod_scope = topo.scope == Scope::Pod && topo.policy != Policy::None;
    let mut pod_mask = None;
    if pod_scope {
        // Pod-scope hints come before any allocation: nothing is reusable yet.
        let u = &pod.pod_unit;
        let (merged, hints) = decide(
            res,
            topo,
            w,
            &PodState {
                reuse: Reuse::default(),
                groups: groups.clone(),
                // Every container allocates inside the pod's mask: with two that record memory,
                // where the first lands decides the groups the second meets.
                later_memory: memory_users > 1,
                pool_cpus_taken: 0,
            },
            u,
            record,
        )?;
        if !merged.admit {
            if !record {
                return Err(silent());
            }
            let hints = hints.unwrap_or(Hints { lists: Vec::new() });
            return Err(rejection_for(
                res,
                topo,
                w,
                &Reuse::default(),
                &u.request,
                &hints,
                "pod",
            ));
        }
        pod_mask = merged.hint.mask;
        out.pod_numa_nodes = mask_ids(pod_mask);
    }
    let mut st = PodState {
        reuse: Reuse::default(),
        groups: groups.clone(),
        later_memory: false,
        pool_cpus_taken: 0,
    };
    let last_memory = pod
        .containers
        .iter()
        .rposition(|u| u.kind != ContainerKind::Init && wants_memory(u));
    for (k, u) in pod.containers.iter().enumerate() {
        st.later_memory = last_memory.is_some_and(|l| l > k);
        let mask = if pod_scope {
            pod_mask
        } else if topo.policy == Policy::None {
            None
        } else {
            let (merged, hints) = decide(res, topo, w, &st, u, record)?;
            if !merged.admit {
                if !record {
                    return Err(silent());
                }
                let who = format!("{} `{}`", u.kind.noun(), u.name());
                let hints = hints.unwrap_or(Hints { lists: Vec::new() });
                return Err(rejection_for(res, topo, w, &st.reuse, &u.request, &hints, &who));
            }
            merged.hint.mask
        };
        let mut placement = ContainerPlacement {
            name: if record {
                u.name().to_owned()
            } else {
                String::new()
            },
            kind: u.kind,
            numa_nodes: if record { mask_ids(mask) } else { None },
            devices: BTreeMap::new(),
            device_counts: BTreeMap::new(),
            explanation: String::new(),
            memory_mask: None,
            exclusive_cpus: 0,
            cpu_zones: 0,
            cpu_numa_nodes: None,
            memory_numa_nodes: None,
        };
        // Regular init containers finish before the app containers start: what they got is
        // reusable by the later containers of the pod, and held by the pod otherwise.
        let notes = allocate(res, topo, w, &mut st, u, mask, &mut placement)?;
        if record {
            if placement.exclusive_cpus > 0 {
                placement.cpu_numa_nodes = Some(allocate::zone_ids(w, placement.cpu_zones));
            }
            placement.explanation = std::iter::once(explain_devices(&placement))
                .chain(notes)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            out.max_span = out.max_span.max(mask.map_or(w.ids.len(), |m| m.count() as usize));
            out.containers.push(placement);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::merge::{collect_hints, fast_merge, merge};
    use super::*;
    use crate::resources::{CPU, ResList};
    use crate::{node::NumaTopology, resources::MEMORY};

    /// xorshift64: deterministic, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> i64 {
            i64::try_from(self.next() % n).unwrap_or(0)
        }
    }

    fn random_topology(rng: &mut Rng, res: &mut Resources, policy: &str) -> NumaTopology {
        let zones = if rng.below(4) == 0 {
            8
        } else {
            1 + rng.below(6) as usize
        };
        // Sometimes NIC IDs are published, sometimes with one NIC attached to two zones.
        let publish_ids = rng.below(3) == 0;
        let shared = publish_ids && rng.below(2) == 0;
        let zone_list: Vec<serde_json::Value> = (0..zones)
            .map(|z| {
                let cap = 2 + rng.below(6);
                let avail = rng.below(cap as u64 + 1);
                let mem = 4 + rng.below(8);
                let gpus = rng.below(3);
                let nics = rng.below(3);
                let huge = rng.below(3);
                let costs: Vec<_> = (0..zones)
                    .map(|t| serde_json::json!({"name": format!("node-{t}"), "value": if t == z { 10 } else { 11 + (t + z) as i64 % 3 * 5 }}))
                    .collect();
                let mut ids: Vec<String> = (0..nics).map(|k| format!("nic-{z}-{k}")).collect();
                if shared && z + 1 < zones {
                    ids.push(format!("nic-{}-0", z + 1));
                }
                let attributes = if publish_ids {
                    serde_json::json!([{"name": "numaplane.io/free-devices.vendor.com/nic", "value": ids.join(",")}])
                } else {
                    serde_json::json!([])
                };
                serde_json::json!({"name": format!("node-{z}"), "type": "Node", "costs": costs, "attributes": attributes, "resources": [
                    {"name": "cpu", "capacity": cap.to_string(), "allocatable": cap.to_string(), "available": avail.to_string()},
                    // Allocatable below capacity and available up to capacity: free amounts
                    // alone must not decide the memory manager's qualification.
                    {"name": "memory", "capacity": format!("{mem}Gi"), "allocatable": format!("{}Gi", mem - rng.below(3)), "available": format!("{}Gi", rng.below(mem as u64 + 1))},
                    {"name": "vendor.com/gpu", "capacity": gpus.to_string(), "allocatable": gpus.to_string(), "available": rng.below(gpus as u64 + 1).to_string()},
                    {"name": "vendor.com/nic", "capacity": nics.to_string(), "allocatable": nics.to_string(), "available": rng.below(nics as u64 + 1).to_string()},
                    {"name": "hugepages-1Gi", "capacity": format!("{huge}Gi"), "allocatable": format!("{huge}Gi"), "available": format!("{}Gi", rng.below(huge as u64 + 1))}
                ]})
            })
            .collect();
        let closest = if rng.below(2) == 0 { "true" } else { "false" };
        let mut attributes = vec![
            serde_json::json!({"name": "topologyManagerPolicy", "value": policy}),
            serde_json::json!({"name": "topologyManagerOptionPreferClosestNumaNodes", "value": closest}),
        ];
        // Sometimes GPUs without a NUMA node next to the aligned ones, and FPGAs that have
        // none at all; listed by ID or only counted.
        for resource in ["vendor.com/gpu", "vendor.com/fpga"] {
            if rng.below(3) == 0 {
                let free = rng.below(3);
                let ids: Vec<String> = (0..free).map(|k| format!("x-{k}")).collect();
                let value = if rng.below(2) == 0 {
                    numaplane::nrt::join_devices_without_numa(free as u64, &ids)
                } else {
                    free.to_string()
                };
                attributes.push(serde_json::json!({
                    "name": format!("numaplane.io/devices-without-numa.{resource}"), "value": value}));
            }
        }
        let nrt: numaplane::nrt::NodeResourceTopology = serde_json::from_value(serde_json::json!({
            "zones": zone_list, "attributes": attributes}))
        .expect("nrt");
        NumaTopology::from_nrt(res, &nrt).expect("valid")
    }

    /// A random pod: 1–2 containers, maybe an init container or sidecar, Guaranteed or not,
    /// cpu, memory, hugepages and devices.
    fn random_pod(rng: &mut Rng, res: &mut Resources) -> PodSpec {
        let guaranteed = rng.below(4) != 0;
        let container = |name: &str, rng: &mut Rng| {
            let mut r = serde_json::json!({"cpu": (1 + rng.below(6)).to_string(), "memory": format!("{}Gi", 1 + rng.below(12))});
            for (k, v) in [
                ("vendor.com/gpu", "1"),
                ("vendor.com/nic", "2"),
                ("vendor.com/fpga", "1"),
                ("hugepages-1Gi", "1Gi"),
            ] {
                if rng.below(3) == 0 {
                    r[k] = serde_json::json!(v);
                }
            }
            let lim = if guaranteed {
                r.clone()
            } else {
                serde_json::json!({})
            };
            serde_json::json!({"name": name, "resources": {"requests": r, "limits": lim}})
        };
        let mut containers = vec![container("a", rng)];
        if rng.below(3) == 0 {
            containers.push(container("b", rng));
        }
        let mut spec = serde_json::json!({"containers": containers});
        if rng.below(4) == 0 {
            let mut init = container("i", rng);
            if rng.below(2) == 0 {
                init["restartPolicy"] = serde_json::json!("Always");
            }
            spec["initContainers"] = serde_json::json!([init]);
        }
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
                .expect("pod");
        PodSpec::from_pod(res, &pod).expect("pod spec")
    }

    #[test]
    fn admits_agrees_with_predict() {
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        let mut res = Resources::default();
        let (mut admitted, mut rejected) = (0, 0);
        for round in 0..4000 {
            let policy = ["none", "best-effort", "restricted", "single-numa-node"][round % 4];
            let mut topo = random_topology(&mut rng, &mut res, policy);
            if rng.below(2) == 0 {
                topo.scope = Scope::Pod;
            }
            let pod = random_pod(&mut rng, &mut res);
            let expected = predict(&res, &topo, &mut WorkingZones::from_topology(&topo), &pod).is_ok();
            let mut w = WorkingZones::default();
            w.reset_from(&topo);
            assert_eq!(
                admits(&res, &topo, &mut w, &pod),
                expected,
                "round {round}: {topo:?} {pod:?}"
            );
            if expected {
                admitted += 1;
            } else {
                rejected += 1;
            }
        }
        assert!(
            admitted > 800 && rejected > 800,
            "admitted {admitted}, rejected {rejected}"
        );
    }

    #[test]
    fn fast_and_general_merge_agree() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut res = Resources::default();
        let gpu = res.intern("vendor.com/gpu");
        let nic = res.intern("vendor.com/nic");
        let huge = res.intern("hugepages-1Gi");
        let (mut checked, mut admitted) = (0, 0);
        for round in 0..5000 {
            let policy = if round % 2 == 0 {
                "single-numa-node"
            } else {
                "restricted"
            };
            let topo = random_topology(&mut rng, &mut res, policy);
            let w = WorkingZones::from_topology(&topo);
            let mut req = ResList::default();
            req.set(CPU, 1000 * (1 + rng.below(10)));
            req.set(MEMORY, (1 + rng.below(16)) << 30);
            if rng.below(2) == 0 {
                req.set(gpu, 1 + rng.below(3));
            }
            if rng.below(3) == 0 {
                req.set(nic, 1 + rng.below(3));
            }
            if rng.below(3) == 0 {
                req.set(huge, (1 + rng.below(3)) << 30);
            }
            let qos = if rng.below(4) == 0 {
                Qos::Burstable
            } else {
                Qos::Guaranteed
            };
            let u = Unit::new(None, ContainerKind::App, req.clone(), qos);
            let st = PodState {
                reuse: Reuse::default(),
                groups: Groups::of(&res, &topo, &w),
                later_memory: false,
                pool_cpus_taken: 0,
            };
            let general = collect_hints(&res, &topo, &w, &st, &u).map(|h| merge(&topo, &h).expect("merge"));
            let fast = fast_merge(&res, &topo, &w, &st.groups, &u);
            // Both must agree on admission, and on the merged hint when admitting. Rejections
            // may differ in reason only (which provider is reported first).
            let g = general.as_ref().ok().filter(|g| g.admit).map(|g| g.hint);
            let f = match &fast {
                Ok(Some(f)) => f.admit.then_some(f.hint),
                Ok(None) => continue,
                Err(_) => None,
            };
            assert_eq!(
                g, f,
                "round {round}: {topo:?} {req:?} general {general:?} fast {fast:?}"
            );
            checked += 1;
            admitted += usize::from(g.is_some());
        }
        assert!(
            checked > 2000 && admitted > 300,
            "checked {checked}, admitted {admitted}"
        );
    }
}

#[cfg(test)]
mod distribute_tests {
    //! `distribute-cpus-across-numa`, checked against the kubelet v1.36.2 traces of
    //! tests/oracle (cpu-distribute-across-numa*): where each container's CPUs land.
    use super::*;
    use crate::node::NumaTopology;

    /// An NRT of `zones` NUMA nodes of `cpus` CPUs each, CPU 0 reserved, the static CPU
    /// manager with `options`, under `policy`.
    fn topology(res: &mut Resources, zones: u32, cpus: u32, policy: &str, options: &str) -> NumaTopology {
        let zone = |z: u32| {
            let alloc = if z == 0 { cpus - 1 } else { cpus };
            serde_json::json!({"name": format!("node-{z}"), "type": "Node",
                "costs": (0..zones).map(|t| serde_json::json!({"name": format!("node-{t}"), "value": if t == z { 10 } else { 20 }})).collect::<Vec<_>>(),
                "resources": [{"name": "cpu", "capacity": cpus.to_string(), "allocatable": alloc.to_string(), "available": alloc.to_string()}]})
        };
        let nrt: numaplane::nrt::NodeResourceTopology = serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": "n"},
            "zones": (0..zones).map(zone).collect::<Vec<_>>(),
            "attributes": [
                {"name": "topologyManagerPolicy", "value": policy},
                {"name": "topologyManagerScope", "value": "container"},
                {"name": "numaplane.io/cpu-manager-policy", "value": "static"},
                {"name": "numaplane.io/cpu-manager-policy-options", "value": options},
                {"name": "numaplane.io/reserved-cpus", "value": "0"},
            ],
        }))
        .expect("nrt");
        NumaTopology::from_nrt(res, &nrt).expect("topology")
    }

    fn pod(res: &mut Resources, cpus: u32) -> PodSpec {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": cpus.to_string(), "memory": "64Mi"},
                "limits": {"cpu": cpus.to_string(), "memory": "64Mi"}}}]}
        }))
        .expect("pod");
        PodSpec::from_pod(res, &pod).expect("pod spec")
    }

    /// The CPUs' NUMA nodes of each pod in turn (`None`: rejected).
    fn run(zones: u32, policy: &str, options: &str, pods: &[u32]) -> Vec<Option<Vec<u32>>> {
        let mut res = Resources::default();
        let topo = topology(&mut res, zones, 4, policy, options);
        let mut w = WorkingZones::from_topology(&topo);
        pods.iter()
            .map(|&n| {
                let p = pod(&mut res, n);
                match predict(&res, &topo, &mut w, &p) {
                    Ok(pl) => pl.containers[0].cpu_numa_nodes.clone(),
                    Err(r) => {
                        assert!(!r.kubelet_reason.is_empty(), "{r:?}");
                        None
                    }
                }
            })
            .collect()
    }

    #[test]
    fn six_cpus_split_three_and_three_so_the_next_cpu_is_on_numa_1() {
        let on = "distribute-cpus-across-numa=true";
        for policy in ["best-effort", "restricted"] {
            assert_eq!(
                run(2, policy, on, &[6, 1]),
                [Some(vec![0, 1]), Some(vec![1])],
                "{policy}"
            );
            // Packed, the kubelet fills NUMA 1 and leaves CPU 3 on NUMA 0.
            assert_eq!(
                run(2, policy, "", &[6, 1]),
                [Some(vec![0, 1]), Some(vec![0])],
                "{policy}"
            );
        }
    }

    #[test]
    fn without_a_hint_single_node_requests_go_to_the_best_balance_node() {
        // Topology Manager none: 2 CPUs go to NUMA 1 (4 free), the next 2 to NUMA 0.
        let on = "distribute-cpus-across-numa=true";
        assert_eq!(
            run(2, "none", on, &[2, 2, 3]),
            [Some(vec![1]), Some(vec![0]), Some(vec![0, 1])]
        );
        assert_eq!(run(2, "none", "", &[2, 2]), [Some(vec![0]), Some(vec![0, 1])]);
    }

    #[test]
    fn remainders_and_wider_spans_on_four_numa_nodes() {
        let on = "distribute-cpus-across-numa=true";
        // 7 over {0,1}: 3 + 3, the seventh where the balance is best; 9 over three nodes.
        assert_eq!(
            run(4, "restricted", on, &[7, 9, 2, 2]),
            [Some(vec![0, 1]), None, Some(vec![2]), Some(vec![2])]
        );
    }
}
