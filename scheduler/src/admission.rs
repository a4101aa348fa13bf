//! Exact prediction of kubelet admission: the CPU, memory and device hint providers computed
//! from NRT zones (kubelet-topology-manager.md §3), the Topology Manager merge under the node's
//! policy and scope (§2), and the allocation that follows, including the concrete device IDs.
//!
//! Pure and synchronous: a node's zones are copied into a [`WorkingZones`] and consumed
//! container by container, as the kubelet's managers do.

use std::collections::BTreeMap;

use crate::{
    node::NumaTopology,
    pod::{PodSpec, Qos},
    resources::{CPU, ResId, ResKind, ResList, Resources},
    topology_manager::{
        MergeOutcome, NumaMask, Policy, ResourceHints, Scope, TopologyHint, TopologyManagerError,
        merge_resource_hints,
    },
};

/// Mutable per-zone state while one pod is admitted.
#[derive(Clone, Debug)]
pub struct WorkingZones {
    /// Zone ids, ascending.
    pub ids: Vec<u32>,
    /// Available per zone (dense by ResId; absent = not listed).
    pub available: Vec<crate::resources::Dense>,
    /// Free device IDs per zone and resource.
    pub free_devices: Vec<BTreeMap<ResId, Vec<String>>>,
}

impl WorkingZones {
    /// Copies the zones of `topo`.
    pub fn from_topology(topo: &NumaTopology) -> Self {
        WorkingZones {
            ids: topo.zones.iter().map(|z| z.id).collect(),
            available: topo.zones.iter().map(|z| z.available.clone()).collect(),
            free_devices: topo.zones.iter().map(|z| z.free_devices.clone()).collect(),
        }
    }

    fn zone_index(&self, id: u32) -> Option<usize> {
        self.ids.iter().position(|z| *z == id)
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
}

/// Container role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// Regular init container.
    Init,
    /// Restartable init container.
    Sidecar,
    /// App container.
    App,
}

impl ContainerKind {
    fn noun(self) -> &'static str {
        match self {
            ContainerKind::Init => "init container",
            ContainerKind::Sidecar => "sidecar container",
            ContainerKind::App => "container",
        }
    }
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

fn mask_ids(m: Option<NumaMask>) -> Option<Vec<u32>> {
    m.map(|m| m.iter().collect())
}

/// Enumerates all non-empty subsets of `ids` as masks.
fn all_masks(ids: &[u32]) -> impl Iterator<Item = (NumaMask, Vec<usize>)> + '_ {
    let n = ids.len().min(20);
    (1u32..(1u32 << n)).map(move |bits| {
        let idx: Vec<usize> = (0..n).filter(|i| bits & (1 << i) != 0).collect();
        let mask = NumaMask::from_ids(idx.iter().map(|&i| ids[i])).unwrap_or(NumaMask::EMPTY);
        (mask, idx)
    })
}

/// One request unit's hint lists, in provider order (device, cpu, memory).
struct Hints {
    lists: Vec<(ResId, Option<Vec<TopologyHint>>)>,
}

/// Device hints (§3.3): zone allocatable counts give `minAffinitySize`; free IDs (when
/// published) or available counts decide which masks can hold the request.
fn device_hints(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    id: ResId,
    need: i64,
) -> Option<Vec<TopologyHint>> {
    if !topo.lists(id) {
        return None;
    }
    let has_ids = w.free_devices.iter().any(|f| f.contains_key(&id));
    let free_in = |idx: &[usize]| -> i64 {
        if has_ids {
            let mut set: Vec<&String> = idx.iter().filter_map(|&i| w.free_devices[i].get(&id)).flatten().collect();
            set.sort_unstable();
            set.dedup();
            i64::try_from(set.len()).unwrap_or(i64::MAX)
        } else {
            idx.iter().map(|&i| w.available[i].get_or_zero(id)).sum()
        }
    };
    let all: Vec<usize> = (0..w.ids.len()).collect();
    if free_in(&all) < need {
        return Some(Vec::new());
    }
    let _ = res;
    let mut min_affinity = usize::MAX;
    let mut hints = Vec::new();
    for (mask, idx) in all_masks(&w.ids) {
        let registered: i64 = idx.iter().map(|&i| topo.zones[i].allocatable.get_or_zero(id)).sum();
        if registered >= need {
            min_affinity = min_affinity.min(idx.len());
        }
        if free_in(&idx) >= need {
            hints.push(TopologyHint::new(mask, false));
        }
    }
    mark_preferred(&mut hints, min_affinity);
    Some(hints)
}

fn mark_preferred(hints: &mut [TopologyHint], min_affinity: usize) {
    for h in hints {
        h.preferred = h.mask.is_some_and(|m| m.count() as usize == min_affinity);
    }
}

/// CPU hints (§3.1): capacity gives `minAffinitySize`, available decides feasibility.
fn cpu_hints(topo: &NumaTopology, w: &WorkingZones, need_cpus: i64) -> Option<Vec<TopologyHint>> {
    let mut min_affinity = usize::MAX;
    let mut hints = Vec::new();
    for (mask, idx) in all_masks(&w.ids) {
        let total: i64 = idx.iter().map(|&i| topo.zones[i].capacity.get_or_zero(CPU) / 1000).sum();
        if total >= need_cpus {
            min_affinity = min_affinity.min(idx.len());
        }
        let free: i64 = idx.iter().map(|&i| w.available[i].get_or_zero(CPU) / 1000).sum();
        if free >= need_cpus {
            hints.push(TopologyHint::new(mask, false));
        }
    }
    mark_preferred(&mut hints, min_affinity);
    Some(hints)
}

/// Memory-manager hints (§3.2) for every memory-like request: the same masks for all types.
/// Returns `None` when no mask qualifies (the kubelet then fails in Allocate).
fn memory_hints(topo: &NumaTopology, w: &WorkingZones, wants: &[(ResId, i64)]) -> Option<Vec<TopologyHint>> {
    let mut min_affinity = usize::MAX;
    let mut hints = Vec::new();
    for (mask, idx) in all_masks(&w.ids) {
        let fits_alloc = wants.iter().all(|&(id, need)| {
            idx.iter().map(|&i| topo.zones[i].allocatable.get_or_zero(id)).sum::<i64>() >= need
        });
        if !fits_alloc {
            continue;
        }
        min_affinity = min_affinity.min(idx.len());
        let fits_free = wants
            .iter()
            .all(|&(id, need)| idx.iter().map(|&i| w.available[i].get_or_zero(id)).sum::<i64>() >= need);
        if fits_free {
            hints.push(TopologyHint::new(mask, false));
        }
    }
    if hints.is_empty() {
        return None;
    }
    mark_preferred(&mut hints, min_affinity);
    Some(hints)
}

/// What the CPU manager grants exclusively: Guaranteed pods with a whole, positive CPU request.
fn exclusive_cpus(qos: Qos, req: &ResList, topo: &NumaTopology) -> Option<i64> {
    let cpu = req.get(CPU);
    let cpu_managed = topo.zones.iter().any(|z| z.allocatable.get_or_zero(CPU) > 0);
    (qos == Qos::Guaranteed && cpu > 0 && cpu % 1000 == 0 && cpu_managed).then_some(cpu / 1000)
}

fn collect_hints(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    qos: Qos,
    req: &ResList,
) -> Result<Hints, Rejection> {
    let mut lists = Vec::new();
    for (id, need) in req.positive() {
        if res.kind(id) == ResKind::Extended {
            lists.push((id, device_hints(res, topo, w, id, need)));
        }
    }
    if let Some(n) = exclusive_cpus(qos, req, topo) {
        lists.push((CPU, cpu_hints(topo, w, n)));
    }
    if topo.memory_managed && qos == Qos::Guaranteed {
        let wants: Vec<(ResId, i64)> = req.positive().filter(|(id, _)| res.kind(*id).is_memory_like()).collect();
        if !wants.is_empty() {
            match memory_hints(topo, w, &wants) {
                Some(h) => {
                    for &(id, _) in &wants {
                        lists.push((id, Some(h.clone())));
                    }
                }
                None => {
                    let names = wants.iter().map(|(id, _)| res.name(*id)).collect::<Vec<_>>().join(", ");
                    return Err(Rejection {
                        category: format!("insufficient {names} in NUMA zones"),
                        message: format!("memory manager cannot place {names}: no NUMA node set has enough free"),
                        kubelet_reason: "UnexpectedAdmissionError",
                    });
                }
            }
        }
    }
    Ok(Hints { lists })
}

fn merge(topo: &NumaTopology, hints: &Hints) -> Result<MergeOutcome, TopologyManagerError> {
    let lists: Vec<ResourceHints<'_>> = hints
        .lists
        .iter()
        .map(|(_, h)| match h {
            None => ResourceHints::NoPreference,
            Some(v) if v.is_empty() => ResourceHints::CannotSatisfy,
            Some(v) => ResourceHints::Hints(v),
        })
        .collect();
    merge_resource_hints(topo.policy, &topo.options, &topo.info, &lists)
}

fn policy_where(policy: Policy) -> &'static str {
    match policy {
        Policy::SingleNumaNode => "on one NUMA node",
        Policy::Restricted => "on the narrowest aligned NUMA node set",
        Policy::BestEffort | Policy::None => "on this node",
    }
}

/// The zone that comes closest to holding `req` (largest minimum coverage ratio).
fn best_zone_text(res: &Resources, w: &WorkingZones, req: &ResList, aligned: &[ResId]) -> String {
    let mut best: Option<(usize, f64)> = None;
    for i in 0..w.ids.len() {
        let ratio = aligned
            .iter()
            .map(|&id| {
                let need = req.get(id);
                if need <= 0 { 1.0 } else { (w.available[i].get_or_zero(id) as f64 / need as f64).min(1.0) }
            })
            .fold(1.0f64, f64::min);
        if best.is_none_or(|(_, r)| ratio > r) {
            best = Some((i, ratio));
        }
    }
    match best {
        Some((i, _)) => {
            let have = aligned
                .iter()
                .map(|&id| format!("{}={}", res.name(id), res.render(id, w.available[i].get_or_zero(id))))
                .collect::<Vec<_>>()
                .join(", ");
            format!("best zone node-{} has {have}", w.ids[i])
        }
        None => "no zone".to_owned(),
    }
}

fn rejection_for(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    req: &ResList,
    hints: &Hints,
    who: &str,
) -> Rejection {
    // Resources the providers constrained, and those no single zone can hold.
    let aligned: Vec<ResId> = hints.lists.iter().filter(|(_, h)| h.is_some()).map(|(id, _)| *id).collect();
    let short: Vec<&str> = aligned
        .iter()
        .filter(|&&id| !(0..w.ids.len()).any(|i| w.available[i].get_or_zero(id) >= req.get(id)))
        .map(|&id| res.name(id))
        .collect();
    let category = match (topo.policy, short.is_empty()) {
        (Policy::SingleNumaNode, false) => format!("insufficient {} on any single NUMA node", short.join(", ")),
        (Policy::SingleNumaNode, true) => "resources not alignable on a single NUMA node".to_owned(),
        _ => format!(
            "cannot align {} on preferred NUMA nodes",
            aligned.iter().map(|&id| res.name(id)).collect::<Vec<_>>().join(", ")
        ),
    };
    let need = ResList(aligned.iter().map(|&id| (id, req.get(id))).collect()).describe(res);
    Rejection {
        category,
        message: format!(
            "cannot align {who}: {}/{} needs {need} {}; {}",
            topo.policy,
            topo.scope,
            policy_where(topo.policy),
            best_zone_text(res, w, req, &aligned)
        ),
        kubelet_reason: "TopologyAffinityError",
    }
}

/// Consumes `req` from the working zones under `mask`, as the kubelet's managers allocate:
/// exclusive CPUs and memory from the mask's nodes first (ascending), then from the rest;
/// devices aligned first, lowest zone and lowest ID first.
fn allocate(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    qos: Qos,
    req: &ResList,
    mask: Option<NumaMask>,
    placement: &mut ContainerPlacement,
) -> Result<(), Rejection> {
    let in_mask: Vec<usize> = (0..w.ids.len()).filter(|&i| mask.is_none_or(|m| m.contains(w.ids[i]))).collect();
    let rest: Vec<usize> = (0..w.ids.len()).filter(|i| !in_mask.contains(i)).collect();
    let order: Vec<usize> = in_mask.iter().chain(rest.iter()).copied().collect();
    let exhausted = |what: String| Rejection {
        category: format!("insufficient {what} on the node's NUMA zones"),
        message: format!("kubelet cannot allocate {what}: not enough free in any NUMA zone"),
        kubelet_reason: "UnexpectedAdmissionError",
    };
    if let Some(n) = exclusive_cpus(qos, req, topo) {
        take_fill(w, &order, CPU, n * 1000).map_err(|_| exhausted("exclusive cpu".to_owned()))?;
    }
    if topo.memory_managed && qos == Qos::Guaranteed {
        for (id, need) in req.positive().filter(|(id, _)| res.kind(*id).is_memory_like()) {
            take_fill(w, &order, id, need).map_err(|_| exhausted(res.name(id).to_owned()))?;
        }
    }
    for (id, need) in req.positive().filter(|(id, _)| res.kind(*id) == ResKind::Extended) {
        if !topo.lists(id) {
            continue;
        }
        let has_ids = w.free_devices.iter().any(|f| f.contains_key(&id));
        if has_ids {
            let mut chosen: Vec<String> = Vec::new();
            for &i in &order {
                let Some(free) = w.free_devices[i].get(&id) else { continue };
                for dev in free {
                    if chosen.len() as i64 >= need {
                        break;
                    }
                    if !chosen.contains(dev) {
                        chosen.push(dev.clone());
                    }
                }
            }
            if (chosen.len() as i64) < need {
                return Err(exhausted(res.name(id).to_owned()));
            }
            // A device on several NUMA nodes is listed (and counted) in each of them.
            for i in 0..w.ids.len() {
                if let Some(free) = w.free_devices[i].get_mut(&id) {
                    let before = free.len();
                    free.retain(|d| !chosen.contains(d));
                    let removed = i64::try_from(before - free.len()).unwrap_or(0);
                    w.available[i].sub_clamped(id, removed);
                }
            }
            placement.devices.insert(res.name(id).to_owned(), chosen);
        } else {
            take_fill(w, &order, id, need).map_err(|_| exhausted(res.name(id).to_owned()))?;
            placement.device_counts.insert(res.name(id).to_owned(), need);
        }
    }
    Ok(())
}

/// Takes `need` of `id` from zones in `order`; fails without partial effect if short.
fn take_fill(w: &mut WorkingZones, order: &[usize], id: ResId, need: i64) -> Result<(), ()> {
    let total: i64 = order.iter().map(|&i| w.available[i].get_or_zero(id)).sum();
    if total < need {
        return Err(());
    }
    let mut left = need;
    for &i in order {
        if left == 0 {
            break;
        }
        let have = w.available[i].get_or_zero(id);
        let take = have.min(left);
        if take > 0 {
            w.available[i].sub_clamped(id, take);
            left -= take;
        }
    }
    Ok(())
}

fn explain_devices(p: &ContainerPlacement) -> String {
    if p.devices.is_empty() && p.device_counts.is_empty() {
        return String::new();
    }
    let nodes = p
        .numa_nodes
        .as_ref()
        .map_or_else(|| "any NUMA node".to_owned(), |n| format!("NUMA {n:?}"));
    let ids = p.devices.iter().map(|(r, ids)| format!("{r}={}", ids.join(","))).collect::<Vec<_>>();
    let counts = p.device_counts.iter().map(|(r, n)| format!("{r}×{n} (no IDs published)")).collect::<Vec<_>>();
    format!(
        "lowest free IDs inside the predicted affinity {nodes}: {}",
        ids.into_iter().chain(counts).collect::<Vec<_>>().join("; ")
    )
}

/// Predicts whether the kubelet admits `pod` on a node with topology `topo`, consuming the
/// pod's exclusive resources from `w` on success.
pub fn predict(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    pod: &PodSpec,
) -> Result<Placement, Rejection> {
    let tm_error = |e: TopologyManagerError| Rejection {
        category: "topology manager refuses this node".to_owned(),
        message: format!("topology unknown or invalid: {e}"),
        kubelet_reason: "TopologyManagerError",
    };
    let units: Vec<(&crate::pod::ContainerSpec, ContainerKind)> = pod
        .init_containers
        .iter()
        .map(|c| (c, if c.sidecar { ContainerKind::Sidecar } else { ContainerKind::Init }))
        .chain(pod.containers.iter().map(|c| (c, ContainerKind::App)))
        .collect();
    let mut out = Placement { pod_numa_nodes: None, containers: Vec::new(), max_span: 0 };
    let pod_scope = topo.scope == Scope::Pod && topo.policy != Policy::None;
    let mut pod_mask = None;
    if pod_scope {
        let mut req = pod.effective_request();
        // The kubelet's pod-level requests do not include overhead.
        for (id, v) in pod.overhead.iter() {
            req.add(id, -v);
        }
        let hints = collect_hints(res, topo, w, pod.qos, &req)?;
        let merged = merge(topo, &hints).map_err(tm_error)?;
        if !merged.admit {
            return Err(rejection_for(res, topo, w, &req, &hints, "pod"));
        }
        pod_mask = merged.hint.mask;
        out.pod_numa_nodes = mask_ids(pod_mask);
    }
    for (c, kind) in units {
        let mask = if pod_scope {
            pod_mask
        } else if topo.policy == Policy::None {
            None
        } else {
            let hints = collect_hints(res, topo, w, pod.qos, &c.requests)?;
            let merged = merge(topo, &hints).map_err(tm_error)?;
            if !merged.admit {
                let who = format!("{} `{}`", kind.noun(), c.name);
                return Err(rejection_for(res, topo, w, &c.requests, &hints, &who));
            }
            merged.hint.mask
        };
        let mut placement = ContainerPlacement {
            name: c.name.clone(),
            kind,
            numa_nodes: mask_ids(mask),
            devices: BTreeMap::new(),
            device_counts: BTreeMap::new(),
            explanation: String::new(),
        };
        // Regular init containers finish before the app containers start: the kubelet lets
        // later containers reuse what they held, so their allocation is not kept.
        if kind == ContainerKind::Init {
            let mut scratch = w.clone();
            allocate(res, topo, &mut scratch, pod.qos, &c.requests, mask, &mut placement)?;
        } else {
            allocate(res, topo, w, pod.qos, &c.requests, mask, &mut placement)?;
        }
        placement.explanation = explain_devices(&placement);
        out.max_span = out.max_span.max(mask.map_or(w.ids.len(), |m| m.count() as usize));
        out.containers.push(placement);
    }
    Ok(out)
}

/// Index of zone `id` in `w` (for callers that map placements back to zones).
pub fn zone_position(w: &WorkingZones, id: u32) -> Option<usize> {
    w.zone_index(id)
}
