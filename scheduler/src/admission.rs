//! Exact prediction of kubelet admission: the CPU, memory and device hint providers computed
//! from NRT zones (kubelet-topology-manager.md §3), the Topology Manager merge under the node's
//! policy and scope (§2), and the allocation that follows, including the concrete device IDs.
//!
//! Pure and synchronous: a node's zones are copied into a [`WorkingZones`] and consumed
//! container by container, as the kubelet's managers do.

use std::{cell::Cell, collections::BTreeMap};

use crate::{
    node::{MAX_ZONES, NumaTopology, Unaligned},
    pod::{PodSpec, Qos},
    prepared::{PreparedPod, Unit},
    resources::{CPU, ResId, ResKind, ResList, Resources},
    topology_manager::{
        MergeOutcome, NumaMask, Policy, ResourceHints, Scope, TopologyHint, TopologyManagerError,
        merge_resource_hints, validate_config,
    },
};

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
}

pub use numaplane::allocation::ContainerKind;

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

/// What the pod's finished init containers hold and later containers of the same pod may reuse
/// (kubelet-topology-manager.md §2.7): the CPU manager's `cpusToReuse` and the device manager's
/// `devicesToReuse`. An init container adds what it got; an app or sidecar container removes what
/// it got. Memory is not tracked: an init container's memory is not held (as before).
#[derive(Clone, Debug, Default)]
struct Reuse {
    /// Per resource (exclusive `cpu` in millicores, devices in units), the reusable items.
    items: BTreeMap<ResId, Vec<Held>>,
}

/// One reusable item: an amount on one zone (CPUs, devices without published IDs) or one device
/// ID on the zones that list it.
#[derive(Clone, Debug)]
struct Held {
    /// Zone positions (subset bits) the item is attached to; 0 for a device without a NUMA
    /// node, which constrains no hint and counts towards none (§3.3 step 4: the kubelet skips
    /// reusable devices without topology).
    bits: usize,
    /// Amount (millicores for cpu, 1 per device ID).
    amount: i64,
    /// The device ID, when the node publishes IDs.
    id: Option<String>,
}

impl Reuse {
    fn is_empty(&self) -> bool {
        self.items.values().all(|v| v.iter().all(|h| h.amount <= 0))
    }

    /// Reusable amount of `id` (CPUs in millicores).
    fn total(&self, id: ResId) -> i64 {
        self.items.get(&id).map_or(0, |v| {
            v.iter().fold(0i64, |a, h| a.saturating_add(h.amount.max(0)))
        })
    }

    /// Reusable amount of `id` on some NUMA node: what counts towards a hint's need.
    fn total_aligned(&self, id: ResId) -> i64 {
        self.items.get(&id).map_or(0, |v| {
            v.iter()
                .filter(|h| h.bits != 0)
                .fold(0i64, |a, h| a.saturating_add(h.amount.max(0)))
        })
    }

    /// The kubelet's rule: a mask that leaves out a reusable CPU or device (one with topology)
    /// is skipped (§3.1 step 3, §3.3 step 4).
    fn allows(&self, id: ResId, bits: usize) -> bool {
        self.items.get(&id).is_none_or(|v| {
            v.iter()
                .all(|h| h.amount <= 0 || h.bits == 0 || h.bits & bits != 0)
        })
    }

    /// Takes up to `want` reusable devices of `id` without a NUMA node and without published
    /// IDs; returns the amount taken. `keep` as in [`Self::take_amount`].
    fn take_unaligned(&mut self, id: ResId, want: i64, keep: bool) -> i64 {
        let Some(v) = self.items.get_mut(&id) else {
            return 0;
        };
        let mut taken = 0;
        for h in v.iter_mut().filter(|h| h.id.is_none() && h.bits == 0) {
            let t = h.amount.min(want.saturating_sub(taken)).max(0);
            if !keep {
                h.amount -= t;
            }
            taken += t;
        }
        taken
    }

    /// Zone positions holding reusable items of any resource in `req` (for explanations).
    fn zones_for(&self, req: &ResList) -> usize {
        req.positive()
            .filter_map(|(id, _)| self.items.get(&id))
            .flatten()
            .filter(|h| h.amount > 0)
            .fold(0, |a, h| a | h.bits)
    }

    fn add(&mut self, id: ResId, held: Held) {
        if held.amount <= 0 {
            return;
        }
        let v = self.items.entry(id).or_default();
        match v
            .iter_mut()
            .find(|h| h.id.is_none() && held.id.is_none() && h.bits == held.bits)
        {
            Some(h) => h.amount = h.amount.saturating_add(held.amount),
            None => v.push(held),
        }
    }

    /// Takes up to `want` of `id` on zone position `zone` (amount items only); returns the
    /// amount taken. `keep`: an init container reusing items leaves them reusable.
    fn take_amount(&mut self, id: ResId, zone: usize, want: i64, keep: bool) -> i64 {
        let Some(v) = self.items.get_mut(&id) else {
            return 0;
        };
        let mut taken = 0;
        for h in v.iter_mut().filter(|h| h.id.is_none() && h.bits == 1 << zone) {
            let t = h.amount.min(want.saturating_sub(taken)).max(0);
            if !keep {
                h.amount -= t;
            }
            taken += t;
        }
        taken
    }
}

/// The Static memory manager's NUMA groups (kubelet-topology-manager.md §3.2 steps 2–3), as
/// far as an NRT lets them be known. The NRT carries per-zone memory only, not which
/// allocations span which nodes, so zones already in use before this pod are of unknown group.
/// [`run`] predicts in two worlds and admits only if both admit:
///
/// * zones in use hold single-NUMA allocations (no group): a multi-NUMA memory mask over one
///   of them is skipped (step 3), a single-NUMA one is not;
/// * when some zone's memory (or hugepages) is used up, as the greedy fill of a multi-NUMA
///   allocation leaves its group's first node, every zone in use may belong to a group: the
///   single-NUMA masks on them are skipped too (`suspect`).
///
/// A group the NRT cannot reveal either way (formed under `best-effort` by a mask wider than
/// the memory needed, so no zone is used up) is not predicted. The pod's own containers are
/// tracked exactly, as the kubelet's `Cells`: an allocation on a mask makes the mask every one
/// of its nodes' group (a single-NUMA one: the node alone), replacing what the node had — the
/// memory manager takes a Topology Manager mask that fits as it is, over nodes of other
/// allocations too, and then only the latest mask counts for them.
///
/// When the exporter publishes the groups it read from the kubelet's checkpoint
/// (`numaplane.io/memory-groups`), the zones they cover are known exactly, like the pod's own;
/// only zones in use outside them (placements the scheduler assumed and the NRT does not show
/// yet) stay unknown.
#[derive(Clone, Debug, Default)]
struct Groups {
    /// Zone positions (subset bits) with memory in use before this pod.
    unknown: usize,
    /// Some zone's memory-manager resource is used up: groups may exist among `unknown`.
    exhausted: bool,
    /// Predict the world where every zone in use may belong to a group.
    suspect: bool,
    /// Per zone position, the mask (subset bits) of its known allocations, the kubelet's
    /// `Cells` of a node with assignments: the zone alone for single-NUMA allocations, the
    /// group otherwise; 0 when none is known (this pod's, the checkpoint's, or assumed).
    cells: [usize; MAX_ZONES],
}

impl Groups {
    fn of(res: &Resources, topo: &NumaTopology, w: &WorkingZones) -> Self {
        let mut g = Groups::default();
        if !topo.memory_managed {
            return g;
        }
        let mut known = 0usize;
        for group in topo.memory_groups.iter().flatten() {
            let bits = group
                .iter()
                .filter_map(|id| topo.zones.iter().position(|z| z.id == *id))
                .fold(0usize, |b, i| b | (1 << i));
            known |= bits;
            g.record(bits);
        }
        for (i, z) in topo.zones.iter().enumerate() {
            if known & (1 << i) != 0 {
                continue;
            }
            for (id, allocatable) in z.allocatable.iter() {
                if !res.kind(id).is_memory_like() || allocatable <= 0 {
                    continue;
                }
                let free = w.available.get(i).map_or(0, |a| a.get_or_zero(id));
                if free < allocatable {
                    g.unknown |= 1 << i;
                }
                g.exhausted |= free == 0;
            }
        }
        g
    }

    fn suspecting(mut self, suspect: bool) -> Self {
        self.suspect = suspect && self.exhausted;
        self
    }

    /// Some zone's allocations are known.
    fn any_known(&self) -> bool {
        self.cells.iter().any(|c| *c != 0)
    }

    /// The known cells of the zone at position bit `b`.
    fn cells_of(&self, b: usize) -> usize {
        self.cells.get(b.trailing_zeros() as usize).copied().unwrap_or(0)
    }

    /// Nothing constrains the masks: the direct computations of [`fast_merge`] apply.
    fn trivial(&self) -> bool {
        self.unknown == 0 && !self.any_known()
    }

    /// Whether the memory manager may use the mask (subset bits), §3.2 steps 2–3: a single
    /// zone unless it is in a multi-node group; several zones unless one of them holds
    /// allocations of another mask (a single-NUMA one, or another group).
    fn allows(&self, bits: usize) -> bool {
        if bits.count_ones() == 1 {
            let maybe_in_unknown_group = self.suspect && self.unknown & bits != 0;
            return !(self.cells_of(bits).count_ones() > 1 || maybe_in_unknown_group);
        }
        let mut rest = bits;
        while rest != 0 {
            let b = rest & rest.wrapping_neg();
            rest &= rest - 1;
            if self.unknown & b != 0 {
                return false;
            }
            let cells = self.cells_of(b);
            if cells != 0 && cells != bits {
                return false;
            }
        }
        true
    }

    /// Whether some mask of `n` zones that `usable` accepts (qualifies and fits; both grow with
    /// the mask) is allowed. Without the pod's own allocations the allowed masks are the
    /// single zones (outside `unknown` when suspecting) and the sets of zones not in use, of
    /// which the largest is the one to try; otherwise every mask is tried.
    fn some_hint(&self, n: usize, usable: impl Fn(usize) -> bool) -> bool {
        if self.any_known() {
            return (1..(1usize << n)).any(|bits| self.allows(bits) && usable(bits));
        }
        let singles = (0..n).map(|i| 1usize << i).any(|b| self.allows(b) && usable(b));
        let unused = ((1usize << n) - 1) & !self.unknown;
        singles || (unused.count_ones() > 1 && usable(unused))
    }

    /// Records an allocation on `bits`: the mask becomes each of its zones' cells.
    fn record(&mut self, bits: usize) {
        for (i, cells) in self.cells.iter_mut().enumerate() {
            if bits & (1 << i) != 0 {
                *cells = bits;
            }
        }
    }
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

fn mask_ids(m: Option<NumaMask>) -> Option<Vec<u32>> {
    m.map(|m| m.iter().collect())
}

/// Per-mask sums of a per-zone value, by subset bits over zone positions (DP over subsets).
fn subset_sums(n: usize, value: impl Fn(usize) -> i64, out: &mut Vec<i64>) {
    out.clear();
    out.resize(1 << n, 0);
    for bits in 1..(1usize << n) {
        let low = bits.trailing_zeros() as usize;
        out[bits] = out[bits & (bits - 1)].saturating_add(value(low));
    }
}

/// One request unit's hint lists, in provider order (device, cpu, memory).
struct Hints {
    lists: Vec<(ResId, Option<Vec<TopologyHint>>)>,
}

/// Hints from per-mask "registered" and "free" sums: a mask is emitted when its free amount
/// covers the need, and preferred when its size is the smallest whose registered amount
/// covers it ("as narrow as possible on an empty machine", as every kubelet provider does).
///
/// With reusable items (init containers of the same pod), `minAffinitySize` is lowered first;
/// then a mask that leaves out a reusable item is skipped, and the reusable amount counts
/// towards the need of every other mask (§3.1 step 3, §3.3 step 4).
fn hints_from_sums(
    topo: &NumaTopology,
    registered: &[i64],
    free: &[i64],
    need: i64,
    reusable: i64,
    allowed: impl Fn(usize) -> bool,
) -> Vec<TopologyHint> {
    let mut min_affinity = u32::MAX;
    for (bits, r) in registered.iter().enumerate().skip(1) {
        if *r >= need {
            min_affinity = min_affinity.min(bits.count_ones());
        }
    }
    let mut hints = Vec::with_capacity(free.len());
    hints.extend(
        free.iter()
            .enumerate()
            .skip(1)
            .filter(|(bits, f)| f.saturating_add(reusable) >= need && allowed(*bits))
            .map(|(bits, _)| TopologyHint::new(topo.masks[bits], bits.count_ones() == min_affinity)),
    );
    hints
}

/// Zone positions (subset bits) hosting devices of `id`: the NUMA nodes the v1.36 device
/// manager builds the resource's hints over (verified-facts.md, "Device hints are built only
/// over the NUMA nodes that host devices of that resource"). A zone hosts the resource when its
/// allocatable count is positive; a zone that lists none (or 0) is in no hint mask of it.
fn hosting(topo: &NumaTopology, id: ResId) -> usize {
    topo.zones
        .iter()
        .enumerate()
        .filter(|(_, z)| z.allocatable.get_or_zero(id) > 0)
        .fold(0, |bits, (i, _)| bits | 1 << i)
}

/// Device hints (§3.3): zone allocatable counts give `minAffinitySize`; free counts (or the
/// union of free IDs, for devices attached to several NUMA nodes) decide feasibility. Only
/// masks inside the zones hosting the resource are hints ([`hosting`]).
fn device_hints(
    topo: &NumaTopology,
    w: &WorkingZones,
    reuse: &Reuse,
    id: ResId,
    need: i64,
    scratch: &mut Scratch,
) -> Option<Vec<TopologyHint>> {
    if !topo.lists(id) {
        return None;
    }
    let n = w.ids.len();
    subset_sums(n, |i| topo.zones[i].allocatable.get_or_zero(id), &mut scratch.a);
    match (topo.shared_devices.contains(&id), w.free_devices.as_ref()) {
        (true, Some(free)) => {
            scratch.b.clear();
            scratch.b.push(0);
            for bits in 1..(1usize << n) {
                let mut set: Vec<&String> = (0..n)
                    .filter(|i| bits & (1 << i) != 0)
                    .filter_map(|i| free[i].get(&id))
                    .flatten()
                    .collect();
                set.sort_unstable();
                set.dedup();
                scratch.b.push(i64::try_from(set.len()).unwrap_or(i64::MAX));
            }
        }
        _ => subset_sums(n, |i| w.available[i].get_or_zero(id), &mut scratch.b),
    }
    // Available and reusable together fewer than requested: "cannot satisfy". Devices without
    // a NUMA node count here (they are available), and in no mask below: with only those left
    // the list is empty, which single-numa-node and restricted reject although they are free.
    let unaligned = w.unaligned.get(&id).map_or(0, |u| u.free);
    if scratch
        .b
        .last()
        .copied()
        .unwrap_or(0)
        .saturating_add(reuse.total(id))
        .saturating_add(unaligned)
        < need
    {
        return Some(Vec::new());
    }
    let hosts = hosting(topo, id);
    Some(hints_from_sums(
        topo,
        &scratch.a,
        &scratch.b,
        need,
        reuse.total_aligned(id),
        |bits| bits & !hosts == 0 && reuse.allows(id, bits),
    ))
}

/// CPU hints (§3.1): capacity gives `minAffinitySize`, available decides feasibility.
fn cpu_hints(
    topo: &NumaTopology,
    w: &WorkingZones,
    reuse: &Reuse,
    need_cpus: i64,
    scratch: &mut Scratch,
) -> Option<Vec<TopologyHint>> {
    let n = w.ids.len();
    subset_sums(
        n,
        |i| topo.zones[i].capacity.get_or_zero(CPU) / 1000,
        &mut scratch.a,
    );
    subset_sums(n, |i| w.available[i].get_or_zero(CPU) / 1000, &mut scratch.b);
    let reusable = reuse.total(CPU) / 1000;
    Some(hints_from_sums(
        topo,
        &scratch.a,
        &scratch.b,
        need_cpus,
        reusable,
        |bits| reuse.allows(CPU, bits),
    ))
}

/// Memory-manager requests (memory and hugepages) the Static policy aligns: Guaranteed pods
/// only, and only when the node publishes memory rows.
fn memory_requests(res: &Resources, topo: &NumaTopology, qos: Qos, req: &ResList) -> Vec<(ResId, i64)> {
    if !(topo.memory_managed && qos == Qos::Guaranteed) {
        return Vec::new();
    }
    req.positive()
        .filter(|(id, _)| res.kind(*id).is_memory_like())
        .collect()
}

/// Per mask (index = subset bits), for all memory types together (§3.2): whether the mask
/// qualifies (every type's allocatable covers the request) and whether it is feasible (every
/// type's free amount does too), into `scratch.qualifies` and `scratch.feasible_memory`.
fn memory_masks(
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    wants: &[(ResId, i64)],
    scratch: &mut Scratch,
) {
    let n = w.ids.len();
    let masks = 1usize << n;
    let Scratch {
        a,
        b,
        qualifies,
        feasible_memory: feasible,
        ..
    } = scratch;
    qualifies.clear();
    qualifies.resize(masks, true);
    feasible.clear();
    feasible.resize(masks, true);
    for &(id, need) in wants {
        subset_sums(n, |i| topo.zones[i].allocatable.get_or_zero(id), a);
        subset_sums(n, |i| w.available[i].get_or_zero(id), b);
        for bits in 1..masks {
            qualifies[bits] &= a[bits] >= need;
            feasible[bits] &= qualifies[bits] && b[bits] >= need;
        }
    }
    qualifies[0] = false;
    feasible[0] = false;
    if !groups.trivial() {
        for (bits, f) in feasible.iter_mut().enumerate().skip(1) {
            *f &= groups.allows(bits);
        }
    }
}

/// Memory-manager hints: the same masks for all types. `None` when no mask qualifies (the
/// kubelet then fails in Allocate).
fn memory_hints(
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    wants: &[(ResId, i64)],
    scratch: &mut Scratch,
) -> Option<Vec<TopologyHint>> {
    memory_masks(topo, w, groups, wants, scratch);
    let (qualifies, feasible) = (&scratch.qualifies, &scratch.feasible_memory);
    let min_affinity = (1..qualifies.len())
        .filter(|&b| qualifies[b])
        .map(|b| b.count_ones())
        .min()?;
    let hints: Vec<TopologyHint> = (1..feasible.len())
        .filter(|&b| feasible[b])
        .map(|b| TopologyHint::new(topo.masks[b], b.count_ones() == min_affinity))
        .collect();
    (!hints.is_empty()).then_some(hints)
}

/// Reusable per-mask buffers (2^zones entries each: at 8 zones too large for the allocator's
/// fast path, and needed for every container on every node evaluated).
#[derive(Default)]
struct Scratch {
    a: Vec<i64>,
    b: Vec<i64>,
    qualifies: Vec<bool>,
    feasible_memory: Vec<bool>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// The thread's [`Scratch`], taken for the lifetime of the guard and returned on drop (a
/// nested taker would simply get fresh buffers).
struct PooledScratch(Scratch);

impl PooledScratch {
    fn take() -> Self {
        Self(SCRATCH.try_with(Cell::take).unwrap_or_default())
    }
}

impl Drop for PooledScratch {
    fn drop(&mut self) {
        let s = std::mem::take(&mut self.0);
        // During thread teardown the pool is gone; the buffers are then simply freed.
        let _ = SCRATCH.try_with(|c| c.set(s));
    }
}

/// The memory manager finds no NUMA node set with enough free memory: the kubelet fails the
/// pod in Allocate (`UnexpectedAdmissionError`).
fn memory_rejection(res: &Resources, wants: &[(ResId, i64)]) -> Rejection {
    let names = wants
        .iter()
        .map(|(id, _)| res.name(*id))
        .collect::<Vec<_>>()
        .join(", ");
    Rejection {
        category: format!("insufficient {names} in NUMA zones"),
        message: format!("memory manager cannot place {names}: no NUMA node set has enough free"),
        kubelet_reason: "UnexpectedAdmissionError",
    }
}

/// What the CPU manager grants exclusively: Guaranteed pods with a whole, positive CPU request.
/// (The pod side is prepared once per decision: [`Unit::whole_cpus`].)
fn exclusive_cpus(u: &Unit<'_>, topo: &NumaTopology) -> Option<i64> {
    let cpu_managed = || topo.zones.iter().any(|z| z.allocatable.get_or_zero(CPU) > 0);
    u.whole_cpus.filter(|_| cpu_managed())
}

fn collect_hints(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    st: &PodState,
    u: &Unit<'_>,
) -> Result<Hints, Rejection> {
    let reuse = &st.reuse;
    let (qos, req) = (u.qos, &u.request);
    let mut pooled = PooledScratch::take();
    let scratch = &mut pooled.0;
    let mut lists = Vec::new();
    for (id, need) in req.positive() {
        if res.kind(id) == ResKind::Extended {
            lists.push((id, device_hints(topo, w, reuse, id, need, scratch)));
        }
    }
    if let Some(n) = exclusive_cpus(u, topo) {
        lists.push((CPU, cpu_hints(topo, w, reuse, n, scratch)));
    }
    let wants = memory_requests(res, topo, qos, req);
    if !wants.is_empty() {
        let h = memory_hints(topo, w, &st.groups, &wants, scratch);
        // No mask at all: the memory manager gives the Topology Manager no preference (§3.2
        // quirk); its Allocate then decides ([`memory_mask`]).
        for &(id, _) in &wants {
            lists.push((id, h.clone()));
        }
    }
    Ok(Hints { lists })
}

/// The merge's outcome for `single-numa-node` and `restricted`, computed directly from
/// per-zone amounts instead of building hint lists and merging them.
///
/// Both policies admit only a *preferred* merged hint, and a merged hint is preferred only when
/// every resource's hint is preferred and all carry the same mask. A hint is preferred exactly
/// when its size equals the resource's `minAffinitySize`, so an admissible mask must have that
/// size for every constrained resource and be feasible for all of them; the kubelet then picks
/// the narrowest, closest (with `prefer-closest-numa-nodes`), lowest such mask. For
/// `single-numa-node` the size must be 1.
///
/// Amounts are non-negative, so per-mask sums grow with the mask: a resource's
/// `minAffinitySize` is the smallest k whose k largest zones cover the need, and only masks of
/// the common size are enumerated (8 of 255 at size 1 on 8 zones) rather than every mask.
/// Rejections only need to be rejections: [`decide`] rebuilds the hint lists to explain them.
/// `fast_and_general_merge_agree` checks this against the literal merge on random inputs.
fn fast_merge(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    u: &Unit<'_>,
) -> Result<Option<MergeOutcome>, Rejection> {
    let (qos, req) = (u.qos, &u.request);
    let n = w.ids.len();
    let reject = MergeOutcome {
        hint: TopologyHint::any(false),
        admit: false,
    };
    // Per constrained resource: the need and, per zone, the free amount (and, for memory-manager
    // types, the allocatable amount, which must cover the need too).
    let mut rows: Vec<SizedRow> = Vec::new();
    let mut common_min: Option<u32> = None;
    // Records a resource's minimum size; false when the policies cannot admit any more.
    let mut agree = |min: Option<u32>| match min {
        None => false,
        Some(m) if common_min.is_some_and(|c| c != m) => false,
        Some(m) => {
            common_min = Some(m);
            true
        }
    };
    for (id, need) in req.positive() {
        if res.kind(id) != ResKind::Extended || !topo.lists(id) {
            continue;
        }
        if topo.shared_devices.contains(&id) {
            return Ok(None);
        }
        let registered = |i: usize| topo.zones[i].allocatable.get_or_zero(id);
        if !agree(min_size(n, registered, need)) {
            return Ok(Some(reject));
        }
        let mut row = SizedRow::sum(n, need, |i| w.available[i].get_or_zero(id));
        row.hosting = hosting(topo, id);
        rows.push(row);
    }
    if let Some(cpus) = exclusive_cpus(u, topo) {
        let registered = |i: usize| topo.zones[i].capacity.get_or_zero(CPU) / 1000;
        if !agree(min_size(n, registered, cpus)) {
            return Ok(Some(reject));
        }
        rows.push(SizedRow::sum(n, cpus, |i| w.available[i].get_or_zero(CPU) / 1000));
    }
    let wants = memory_requests(res, topo, qos, req);
    if !wants.is_empty() {
        let memory: Vec<SizedRow> = wants
            .iter()
            .map(|&(id, need)| SizedRow {
                need,
                free: (0..n).map(|i| w.available[i].get_or_zero(id)).collect(),
                allocatable: Some(
                    (0..n)
                        .map(|i| topo.zones[i].allocatable.get_or_zero(id))
                        .collect(),
                ),
                hosting: usize::MAX,
            })
            .collect();
        let qualifies = |bits: usize| {
            memory.iter().all(|r| {
                r.allocatable
                    .as_ref()
                    .is_some_and(|a| mask_sum(a, bits) >= r.need)
            })
        };
        // Sums grow with the mask: some mask qualifies iff all zones together do.
        // No mask qualifies: no memory hint, and the merge decides on the other resources.
        if !qualifies((1 << n) - 1) {
            return Ok(None);
        }
        // Group rules may leave the memory manager without any hint too.
        if !groups.trivial() && !groups.some_hint(n, |bits| memory.iter().all(|r| r.fits(bits))) {
            return Ok(None);
        }
        let min = (1..=n).find(|&k| masks_of_size(n, k).any(qualifies));
        if !agree(min.and_then(|k| u32::try_from(k).ok())) {
            return Ok(Some(reject));
        }
        rows.extend(memory);
    }
    let default = topo.info.default_affinity();
    let Some(size) = common_min else {
        // Nothing constrained: every provider is indifferent.
        let mask = if topo.policy == Policy::SingleNumaNode {
            None
        } else {
            Some(default)
        };
        return Ok(Some(MergeOutcome {
            hint: TopologyHint {
                mask,
                preferred: true,
            },
            admit: true,
        }));
    };
    if topo.policy == Policy::SingleNumaNode && size != 1 {
        return Ok(Some(reject));
    }
    let closest = topo.options.prefer_closest_numa_nodes && topo.policy == Policy::Restricted;
    let distance = |m: NumaMask| {
        topo.info
            .distances()
            .and_then(|d| d.distance_sum(m).ok())
            .unwrap_or(0)
    };
    // With memory requested, the memory manager's group rules filter its masks too (a memory
    // provider left with none rejects under these policies either way).
    let grouped = !wants.is_empty() && !groups.trivial();
    let best = masks_of_size(n, size as usize)
        .filter(|&bits| rows.iter().all(|r| r.fits(bits)) && (!grouped || groups.allows(bits)))
        .map(|b| topo.masks[b])
        .min_by_key(|m| (if closest { distance(*m) } else { 0 }, m.value()));
    Ok(Some(match best {
        Some(m) if topo.policy == Policy::SingleNumaNode && m == default => MergeOutcome {
            hint: TopologyHint::any(true),
            admit: true,
        },
        Some(m) => MergeOutcome {
            hint: TopologyHint::new(m, true),
            admit: true,
        },
        None => reject,
    }))
}

/// One constrained resource of [`fast_merge`]: per zone, what is free (and allocatable, for
/// memory-manager types).
struct SizedRow {
    need: i64,
    free: Vec<i64>,
    allocatable: Option<Vec<i64>>,
    /// Zone positions the resource's hints may use (devices: [`hosting`]; others: all).
    hosting: usize,
}

impl SizedRow {
    fn sum(n: usize, need: i64, free: impl Fn(usize) -> i64) -> Self {
        SizedRow {
            need,
            free: (0..n).map(free).collect(),
            allocatable: None,
            hosting: usize::MAX,
        }
    }

    /// The mask (subset bits over zone positions) is one of the resource's hints and can hold
    /// the need.
    fn fits(&self, bits: usize) -> bool {
        bits & !self.hosting == 0
            && mask_sum(&self.free, bits) >= self.need
            && self
                .allocatable
                .as_ref()
                .is_none_or(|a| mask_sum(a, bits) >= self.need)
    }
}

/// Sum of `values` over the zone positions in `bits`, saturating like [`subset_sums`].
fn mask_sum(values: &[i64], bits: usize) -> i64 {
    values
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .fold(0i64, |acc, (_, v)| acc.saturating_add(*v))
}

/// The smallest number of zones whose `registered` amounts cover `need` (the provider's
/// `minAffinitySize`): the largest zones first, since every mask of that size sums less.
fn min_size(n: usize, registered: impl Fn(usize) -> i64, need: i64) -> Option<u32> {
    let mut values: Vec<i64> = (0..n).map(registered).collect();
    values.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0i64;
    for (k, v) in values.iter().enumerate() {
        sum = sum.saturating_add(*v);
        if sum >= need {
            return u32::try_from(k + 1).ok();
        }
    }
    None
}

/// Subset bits over `n` zone positions with exactly `k` set, ascending (Gosper's hack).
fn masks_of_size(n: usize, k: usize) -> impl Iterator<Item = usize> {
    let end = 1usize << n;
    let first = if k == 0 || k > n { end } else { (1usize << k) - 1 };
    std::iter::successors(Some(first), move |&x| {
        let low = x & x.wrapping_neg();
        let ripple = x + low;
        Some((((ripple ^ x) >> 2) / low) | ripple)
    })
    .take_while(move |&x| x < end)
}

/// Merged hint for one request unit: the direct computation where it applies, else the
/// kubelet's literal hint generation and merge.
///
/// The direct computations ignore reusable items, so they run only while the pod's init
/// containers hold nothing; `best-effort`'s also returns "any" as the mask, which would misplace
/// what an init container leaves for the next containers, so init containers take the literal
/// path under it.
fn decide(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    st: &PodState,
    u: &Unit<'_>,
    explain: bool,
) -> Result<(MergeOutcome, Option<Hints>), Rejection> {
    let memory = !memory_requests(res, topo, u.qos, &u.request).is_empty();
    let plain = st.reuse.is_empty();
    if topo.policy == Policy::BestEffort
        && !explain
        && plain
        && u.kind != ContainerKind::Init
        && !(memory && st.later_memory)
        && let Some(decided) = best_effort_admission(res, topo, w, &st.groups, u)?
    {
        return Ok(decided);
    }
    if matches!(topo.policy, Policy::SingleNumaNode | Policy::Restricted) && plain {
        match fast_merge(res, topo, w, &st.groups, u) {
            Ok(Some(outcome)) if outcome.admit || !explain => return Ok((outcome, None)),
            Err(e) if !explain => return Err(e),
            // Rejections are rare: the literal path below gives their exact reason.
            Ok(_) | Err(_) => {}
        }
    }
    let hints = collect_hints(res, topo, w, st, u)?;
    let merged = merge(topo, &hints).map_err(merge_rejection)?;
    Ok((merged, Some(hints)))
}

fn merge_rejection(e: TopologyManagerError) -> Rejection {
    Rejection {
        category: "topology manager refuses this node".to_owned(),
        message: format!("topology unknown or invalid: {e}"),
        kubelet_reason: "TopologyManagerError",
    }
}

/// [`decide`] for `best-effort` when only admission matters (not the mask).
///
/// The merge fails only on configuration, and `best-effort` admits whatever it merges; what can
/// still reject is the memory manager (no mask qualifies and fits, i.e. not even all zones
/// together: sums grow with the mask) and the allocation that follows. Allocation succeeds or
/// fails on totals alone (zones are taken in the mask's order, but all of them), and leaves the
/// same totals for the next container, so any mask gives the same verdict: "any" is returned.
///
/// With memory groups in play the memory manager's masks are filtered by the group rules: some
/// mask must still qualify, fit and be allowed (the Topology Manager's mask then lies inside
/// such a hint, which the memory manager extends to).
fn best_effort_admission(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    u: &Unit<'_>,
) -> Result<Option<(MergeOutcome, Option<Hints>)>, Rejection> {
    let (qos, req) = (u.qos, &u.request);
    validate_config(topo.policy, &topo.options, &topo.info).map_err(merge_rejection)?;
    let wants = memory_requests(res, topo, qos, req);
    let total = |v: &dyn Fn(usize) -> i64| (0..w.ids.len()).fold(0i64, |acc, i| acc.saturating_add(v(i)));
    // Without groups, some mask qualifies and fits iff all zones together do. Qualifying
    // without fitting anywhere is a rejection whatever the mask; fitting without qualifying
    // leaves the memory manager hint-less and the outcome to the mask: the literal path.
    // With groups: if the memory manager has some hint, the merged mask lies inside one and
    // Allocate extends to it; if it has none, the outcome depends on the mask.
    if !groups.trivial() && !wants.is_empty() {
        let sum = |bits: usize, f: &dyn Fn(usize) -> i64| {
            (0..w.ids.len())
                .filter(|i| bits & (1 << i) != 0)
                .fold(0i64, |acc, i| acc.saturating_add(f(i)))
        };
        let usable = |bits: usize| {
            wants.iter().all(|&(id, need)| {
                sum(bits, &|i| topo.zones[i].allocatable.get_or_zero(id)) >= need
                    && sum(bits, &|i| w.available[i].get_or_zero(id)) >= need
            })
        };
        if !groups.some_hint(w.ids.len(), usable) {
            return Ok(None);
        }
        return Ok(Some((
            MergeOutcome {
                hint: TopologyHint::any(true),
                admit: true,
            },
            None,
        )));
    }
    for &(id, need) in &wants {
        if total(&|i| topo.zones[i].allocatable.get_or_zero(id)) < need {
            return Ok(None);
        }
    }
    if wants
        .iter()
        .any(|&(id, need)| total(&|i| w.available[i].get_or_zero(id)) < need)
    {
        return Err(memory_rejection(res, &wants));
    }
    Ok(Some((
        MergeOutcome {
            hint: TopologyHint::any(true),
            admit: true,
        },
        None,
    )))
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
                if need <= 0 {
                    1.0
                } else {
                    (w.available[i].get_or_zero(id) as f64 / need as f64).min(1.0)
                }
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
                .map(|&id| {
                    format!(
                        "{}={}",
                        res.name(id),
                        res.render(id, w.available[i].get_or_zero(id))
                    )
                })
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
    reuse: &Reuse,
    req: &ResList,
    hints: &Hints,
    who: &str,
) -> Rejection {
    // Resources the providers constrained, and those no single zone can hold.
    let aligned: Vec<ResId> = hints
        .lists
        .iter()
        .filter(|(_, h)| h.is_some())
        .map(|(id, _)| *id)
        .collect();
    let short: Vec<&str> = aligned
        .iter()
        .filter(|&&id| !(0..w.ids.len()).any(|i| w.available[i].get_or_zero(id) >= req.get(id)))
        .map(|&id| res.name(id))
        .collect();
    let category = match (topo.policy, short.is_empty()) {
        (Policy::SingleNumaNode, false) => {
            format!("insufficient {} on any single NUMA node", short.join(", "))
        }
        (Policy::SingleNumaNode, true) => "resources not alignable on a single NUMA node".to_owned(),
        _ => format!(
            "cannot align {} on preferred NUMA nodes",
            aligned
                .iter()
                .map(|&id| res.name(id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let need = ResList(aligned.iter().map(|&id| (id, req.get(id))).collect()).describe(res);
    let held = reuse.zones_for(req);
    let reusing = if held == 0 {
        String::new()
    } else {
        let zones: Vec<u32> = (0..w.ids.len())
            .filter(|i| held & (1 << i) != 0)
            .map(|i| w.ids[i])
            .collect();
        format!(
            "; it must reuse what the pod's init containers hold on NUMA {zones:?}, so every hint includes those nodes"
        )
    };
    Rejection {
        category,
        message: format!(
            "cannot align {who}: {}/{} needs {need} {}; {}{reusing}",
            topo.policy,
            topo.scope,
            policy_where(topo.policy),
            best_zone_text(res, w, req, &aligned)
        ),
        kubelet_reason: "TopologyAffinityError",
    }
}

/// Consumes `req` from the working zones under `mask`, each manager by its own rules, as the
/// kubelet allocates after the merge (whether the merged hint is preferred or not): exclusive
/// CPUs from the mask's nodes first, then from the rest, each part NUMA-packed
/// ([`cpu_packing`]); memory on the mask, or the narrowest allowed hint containing it
/// ([`memory_mask`]), filled in ascending node order; devices aligned first, then the other
/// zones, then those without a NUMA node, lowest zone and lowest ID first. Returns notes for
/// the explanation.
///
/// Reusable items of the pod's init containers come first. The device manager takes them
/// before anything else (§3.3 allocation step 1); the CPU manager picks from available ∪
/// reusable, aligned first, packing them with the rest by a topology the NRT only partly
/// shows: the model takes the reusable CPUs first, which is what that packing picks when the
/// pool and the mask are those the init container was given. What an init container takes
/// becomes reusable and stays held by the pod; an app or sidecar container removes what it
/// reused.
fn allocate(
    res: &Resources,
    topo: &NumaTopology,
    w: &mut WorkingZones,
    st: &mut PodState,
    u: &Unit<'_>,
    mask: Option<NumaMask>,
    placement: &mut ContainerPlacement,
) -> Result<Vec<String>, Rejection> {
    let PodState {
        reuse,
        groups,
        pool_cpus_taken,
        ..
    } = st;
    let (qos, req) = (u.qos, &u.request);
    let in_mask: Vec<usize> = (0..w.ids.len())
        .filter(|&i| mask.is_none_or(|m| m.contains(w.ids[i])))
        .collect();
    let rest: Vec<usize> = (0..w.ids.len()).filter(|i| !in_mask.contains(i)).collect();
    let order: Vec<usize> = in_mask.iter().chain(rest.iter()).copied().collect();
    let init = u.kind == ContainerKind::Init;
    let mut notes = Vec::new();
    let exhausted = |what: String| Rejection {
        category: format!("insufficient {what} on the node's NUMA zones"),
        message: format!("kubelet cannot allocate {what}: not enough free in any NUMA zone"),
        kubelet_reason: "UnexpectedAdmissionError",
    };
    if let Some(n) = exclusive_cpus(u, topo) {
        smt_aligned(topo, n, *pool_cpus_taken, &placement.name)?;
        let reused = take_reusing(
            w,
            reuse,
            &in_mask,
            &rest,
            CPU,
            n.saturating_mul(1000),
            init,
            Some(topo),
        )
        .map_err(|_| exhausted("exclusive cpu".to_owned()))?;
        *pool_cpus_taken = pool_cpus_taken.saturating_add(n.saturating_sub(reused / 1000));
        if reused > 0 && !init {
            notes.push(format!(
                "reuses {} exclusive CPUs of the init containers",
                reused / 1000
            ));
        }
    }
    let wants = memory_requests(res, topo, qos, req);
    if !wants.is_empty() {
        let bits = memory_mask(w, groups, &wants, mask).ok_or_else(|| memory_rejection(res, &wants))?;
        // An init container's memory is not modelled as held: it must only fit.
        if !init {
            let zones: Vec<usize> = (0..w.ids.len()).filter(|i| bits & (1 << i) != 0).collect();
            for &(id, need) in &wants {
                take_fill(w, &zones, id, need).map_err(|_| exhausted(res.name(id).to_owned()))?;
            }
            groups.record(bits);
            placement.memory_mask = Some(topo.masks[bits]);
        }
    }
    for (id, need) in req
        .positive()
        .filter(|(id, _)| res.kind(*id) == ResKind::Extended)
    {
        if !topo.lists(id) {
            // A resource whose devices have no NUMA node at all: the device manager gave no
            // preference, so the Topology Manager admitted it under every policy, and its
            // Allocate fails (UnexpectedAdmissionError) when too few are free. A resource the
            // node does not publish at all is left to node fit.
            if w.unaligned.contains_key(&id) {
                allocate_unaligned_only(res, w, reuse, id, need, init, placement, &mut notes)
                    .map_err(|_| exhausted(res.name(id).to_owned()))?;
            }
            continue;
        }
        let has_ids = w
            .free_devices
            .as_ref()
            .is_some_and(|f| f.iter().any(|z| z.contains_key(&id)));
        if let (true, Some(free_devices)) = (has_ids, w.free_devices.as_mut()) {
            // Reusable IDs first, in the order the zones are visited, then by ID.
            let rank = |bits: usize| {
                order
                    .iter()
                    .position(|&i| bits & (1 << i) != 0)
                    .unwrap_or(usize::MAX)
            };
            let mut reusable: Vec<(usize, String)> = reuse
                .items
                .get(&id)
                .into_iter()
                .flatten()
                .filter(|h| h.amount > 0)
                .filter_map(|h| h.id.clone().map(|d| (rank(h.bits), d)))
                .collect();
            reusable.sort_unstable();
            let reusable_count = reusable.len();
            let mut chosen: Vec<String> = reusable
                .into_iter()
                .map(|(_, d)| d)
                .take(usize::try_from(need).unwrap_or(usize::MAX))
                .collect();
            let reused = chosen.len();
            // Reusable devices without a NUMA node and without published IDs come next: the
            // device manager hands out every reusable device before any free one.
            let reused_counted = reuse.take_unaligned(id, need - reused as i64, init);
            let want = need - reused_counted;
            for &i in &order {
                let Some(free) = free_devices[i].get(&id) else {
                    continue;
                };
                for dev in free {
                    if chosen.len() as i64 >= want {
                        break;
                    }
                    if !chosen.contains(dev) {
                        chosen.push(dev.clone());
                    }
                }
            }
            // Then the free devices without a NUMA node (the kubelet's "no topology" set, last).
            let (extra, counted) = take_unaligned(&mut w.unaligned, id, want - chosen.len() as i64, true)
                .map_err(|_| exhausted(res.name(id).to_owned()))?;
            chosen.extend(extra);
            let fresh = &chosen[reused..];
            // A device on several NUMA nodes is listed (and counted) in each of them.
            let mut bits_of: Vec<usize> = vec![0; fresh.len()];
            for (i, zone_free) in free_devices.iter_mut().enumerate() {
                if let Some(free) = zone_free.get_mut(&id) {
                    let before = free.len();
                    free.retain(|d| match fresh.iter().position(|c| c == d) {
                        Some(k) => {
                            bits_of[k] |= 1 << i;
                            false
                        }
                        None => true,
                    });
                    let removed = i64::try_from(before - free.len()).unwrap_or(0);
                    w.available[i].sub_clamped(id, removed);
                }
            }
            if init {
                for (d, bits) in fresh.iter().zip(bits_of) {
                    reuse.add(
                        id,
                        Held {
                            bits,
                            amount: 1,
                            id: Some(d.clone()),
                        },
                    );
                }
                reuse.add(
                    id,
                    Held {
                        bits: 0,
                        amount: counted,
                        id: None,
                    },
                );
            } else if let Some(items) = reuse.items.get_mut(&id) {
                items.retain(|h| h.id.as_ref().is_none_or(|d| !chosen[..reused].contains(d)));
            }
            if reused > 0 && !init {
                let ids = chosen[..reused].join(",");
                notes.push(if reusable_count > reused {
                    format!(
                        "reuses {} {ids} of the init containers' {reusable_count}; which of them \
                         is the device manager's choice (Go map order, not determined): the model \
                         takes the lowest",
                        res.name(id)
                    )
                } else {
                    format!("reuses {} {ids} of the init containers", res.name(id))
                });
            }
            if counted + reused_counted > 0 {
                placement
                    .device_counts
                    .insert(res.name(id).to_owned(), counted + reused_counted);
            }
            placement.devices.insert(res.name(id).to_owned(), chosen);
        } else {
            // Every reusable device first (those without a NUMA node too), then the zones,
            // then the free devices without a NUMA node.
            let reused_unaligned = reuse.take_unaligned(id, need, init);
            let left = need - reused_unaligned;
            let in_zones = w
                .available
                .iter()
                .fold(0i64, |a, z| a.saturating_add(z.get_or_zero(id)))
                .saturating_add(reuse.total_aligned(id));
            let from_zones = left.min(in_zones);
            let reused = take_reusing(w, reuse, &in_mask, &rest, id, from_zones, init, None)
                .map_err(|_| exhausted(res.name(id).to_owned()))?;
            let (ids, counted) =
                take_unaligned(&mut w.unaligned, id, left - from_zones, w.free_devices.is_some())
                    .map_err(|_| exhausted(res.name(id).to_owned()))?;
            if init {
                hold_unaligned(reuse, id, &ids, counted);
            }
            let reused = reused + reused_unaligned;
            if reused > 0 && !init {
                notes.push(format!("reuses {reused} {} of the init containers", res.name(id)));
            }
            if !topo.zones.iter().any(|z| z.free_devices.contains_key(&id)) {
                placement.device_counts.insert(
                    res.name(id).to_owned(),
                    need - i64::try_from(ids.len()).unwrap_or(0),
                );
            }
            if !ids.is_empty() {
                placement.devices.insert(res.name(id).to_owned(), ids);
            }
        }
    }
    Ok(notes)
}

/// Takes `want` free devices of `id` without a NUMA node: the listed IDs first, lowest first,
/// when `with_ids` (choosing concrete devices), the rest by count. Returns the IDs chosen and
/// the number taken by count; fails without effect when fewer are free.
fn take_unaligned(
    unaligned: &mut BTreeMap<ResId, Unaligned>,
    id: ResId,
    want: i64,
    with_ids: bool,
) -> Result<(Vec<String>, i64), ()> {
    if want <= 0 {
        return Ok((Vec::new(), 0));
    }
    let Some(u) = unaligned.get_mut(&id) else {
        return Err(());
    };
    if u.free < want {
        return Err(());
    }
    let by_id = if with_ids {
        usize::try_from(want).unwrap_or(usize::MAX).min(u.ids.len())
    } else {
        0
    };
    let ids: Vec<String> = u.ids.drain(..by_id).collect();
    u.free -= want;
    // Counted devices are not known by name: the list keeps at most what is free.
    u.ids.truncate(usize::try_from(u.free).unwrap_or(0));
    let counted = want - i64::try_from(ids.len()).unwrap_or(0);
    Ok((ids, counted))
}

/// What an init container took without a NUMA node stays reusable by the pod's later
/// containers, constraining none of their hints.
fn hold_unaligned(reuse: &mut Reuse, id: ResId, ids: &[String], counted: i64) {
    for d in ids {
        reuse.add(
            id,
            Held {
                bits: 0,
                amount: 1,
                id: Some(d.clone()),
            },
        );
    }
    reuse.add(
        id,
        Held {
            bits: 0,
            amount: counted,
            id: None,
        },
    );
}

/// Allocate for a resource whose devices have no NUMA node at all: the pod's reusable devices
/// first (listed IDs lowest first, then counted ones), then free ones (IDs when choosing
/// concrete devices, else by count). Fails when too few are left.
#[allow(clippy::too_many_arguments)]
fn allocate_unaligned_only(
    res: &Resources,
    w: &mut WorkingZones,
    reuse: &mut Reuse,
    id: ResId,
    need: i64,
    init: bool,
    placement: &mut ContainerPlacement,
    notes: &mut Vec<String>,
) -> Result<(), ()> {
    let mut reusable: Vec<String> = reuse
        .items
        .get(&id)
        .into_iter()
        .flatten()
        .filter(|h| h.amount > 0)
        .filter_map(|h| h.id.clone())
        .collect();
    reusable.sort_unstable();
    reusable.truncate(usize::try_from(need).unwrap_or(usize::MAX));
    let reused_ids = i64::try_from(reusable.len()).unwrap_or(0);
    let reused_counted = reuse.take_unaligned(id, need - reused_ids, init);
    let with_ids = w.free_devices.is_some();
    let (fresh, counted) =
        take_unaligned(&mut w.unaligned, id, need - reused_ids - reused_counted, with_ids)?;
    if init {
        hold_unaligned(reuse, id, &fresh, counted);
    } else if let Some(items) = reuse.items.get_mut(&id) {
        items.retain(|h| h.id.as_ref().is_none_or(|d| !reusable.contains(d)));
    }
    let reused = reused_ids + reused_counted;
    if reused > 0 && !init {
        notes.push(format!("reuses {reused} {} of the init containers", res.name(id)));
    }
    let by_count = counted + reused_counted;
    if by_count > 0 {
        placement.device_counts.insert(res.name(id).to_owned(), by_count);
    }
    let chosen: Vec<String> = reusable.into_iter().chain(fresh).collect();
    if !chosen.is_empty() {
        placement.devices.insert(res.name(id).to_owned(), chosen);
    }
    Ok(())
}

/// Takes `need` of `id` (amounts per zone): reusable then available in the mask's zones, then
/// the same outside; fails without effect if short. What an init container takes from the
/// available amounts becomes reusable; reusable items an init container takes stay reusable,
/// those another container takes do not. Returns the amount reused.
///
/// Exclusive CPUs (`packing`: the node's topology) are taken from each group's available CPUs
/// as the static CPU manager's `takeByTopology` (NUMA-packed) takes them: [`cpu_packing`].
/// Devices are taken zone by zone in the group's order.
#[allow(clippy::too_many_arguments)]
fn take_reusing(
    w: &mut WorkingZones,
    reuse: &mut Reuse,
    in_mask: &[usize],
    rest: &[usize],
    id: ResId,
    need: i64,
    init: bool,
    packing: Option<&NumaTopology>,
) -> Result<i64, ()> {
    let available = w
        .available
        .iter()
        .fold(0i64, |a, z| a.saturating_add(z.get_or_zero(id)));
    if available.saturating_add(reuse.total(id)) < need {
        return Err(());
    }
    let (mut left, mut reused) = (need, 0);
    for group in [in_mask, rest] {
        for &i in group {
            let t = reuse.take_amount(id, i, left, init);
            left -= t;
            reused += t;
        }
        // Amounts per zone position, on the stack: this runs for every node the filter evaluates.
        let takes = match packing {
            Some(topo) => cpu_packing(topo, w, group, left),
            None => {
                let (mut takes, mut want) = ([0i64; MAX_ZONES], left);
                for &i in group {
                    let t = w.available[i].get_or_zero(id).min(want).max(0);
                    if let Some(slot) = takes.get_mut(i) {
                        *slot = t;
                    }
                    want -= t;
                }
                takes
            }
        };
        for &i in group {
            let t = takes.get(i).copied().unwrap_or(0);
            if t > 0 {
                w.available[i].sub_clamped(id, t);
                left -= t;
                if init {
                    reuse.add(
                        id,
                        Held {
                            bits: 1 << i,
                            amount: t,
                            id: None,
                        },
                    );
                }
            }
        }
    }
    Ok(reused)
}

/// How much of `need` exclusive CPUs (millicores) the static CPU manager takes from each zone of
/// `zones` (positions, ascending), as its default `takeByTopology` (NUMA-packed) does on a
/// machine with a socket per NUMA node: first whole NUMA nodes, every CPU of which is free
/// (capacity = available, so none reserved), while the need covers one, the smallest first;
/// then CPU by CPU from the zones with the fewest free CPUs first, lowest id on ties (the
/// kubelet packs: `sortAvailableNUMANodes` orders by free CPUs ascending). This is where a
/// container's CPUs land inside a multi-node mask and, when the mask runs short, outside it
/// (verified-facts.md: best hint {0}, CPUs on NUMA 3). Deviation: free CPUs count as whole
/// cores; on SMT machines the kubelet takes whole free cores before single threads, which
/// differs only when a zone's free CPUs include partial cores.
/// Returns the amount per zone position.
fn cpu_packing(topo: &NumaTopology, w: &WorkingZones, zones: &[usize], need: i64) -> [i64; MAX_ZONES] {
    let mut free = [0i64; MAX_ZONES];
    let mut order = [0usize; MAX_ZONES];
    let mut n = 0;
    for (&i, slot) in zones.iter().zip(order.iter_mut()) {
        if let Some(f) = free.get_mut(i) {
            *f = w.available.get(i).map_or(0, |a| a.get_or_zero(CPU)).max(0);
            *slot = i;
            n += 1;
        }
    }
    let order = order.get_mut(..n).unwrap_or_default();
    let free_of = |free: &[i64; MAX_ZONES], i: usize| free.get(i).copied().unwrap_or(0);
    let capacity = |i: usize| topo.zones.get(i).map_or(0, |z| z.capacity.get_or_zero(CPU));
    let mut takes = [0i64; MAX_ZONES];
    let mut left = need;
    // Whole free nodes have free = capacity: sorting by free orders them by size, then id.
    order.sort_unstable_by_key(|&i| (free_of(&free, i), i));
    for &i in order.iter() {
        let f = free_of(&free, i);
        if f > 0 && f == capacity(i) && left >= f {
            if let (Some(t), Some(fr)) = (takes.get_mut(i), free.get_mut(i)) {
                *t = f;
                *fr = 0;
            }
            left -= f;
        }
    }
    order.sort_unstable_by_key(|&i| (free_of(&free, i), i));
    for &i in order.iter() {
        if left <= 0 {
            break;
        }
        let t = free_of(&free, i).min(left);
        if let Some(slot) = takes.get_mut(i) {
            *slot += t;
        }
        left -= t;
    }
    takes
}

/// The static CPU manager's `full-pcpus-only` check (after the Topology Manager admitted): an
/// exclusive CPU count that is not a multiple of the SMT width, or more CPUs than the free whole
/// cores hold (published free cores minus pending placements, minus what earlier containers of
/// the pod took from the pool: `taken`), is rejected with `SMTAlignmentError` whatever the
/// hint. The kubelet checks the shared pool before it looks at reusable init CPUs, so a
/// container that will reuse them still needs that many CPUs free in whole cores.
fn smt_aligned(topo: &NumaTopology, cpus: i64, taken: i64, container: &str) -> Result<(), Rejection> {
    let Some(threads) = topo.full_pcpus_threads else {
        return Ok(());
    };
    let reject = |why: String| Rejection {
        category: "SMT alignment (full-pcpus-only)".to_owned(),
        message: format!("SMTAlignmentError: container `{container}` {why}"),
        kubelet_reason: "SMTAlignmentError",
    };
    if cpus % threads != 0 {
        return Err(reject(format!(
            "requests {cpus} exclusive CPUs, not a multiple of the {threads} threads per core"
        )));
    }
    let published: Vec<i64> = topo.zones.iter().filter_map(|z| z.free_cores).collect();
    if published.len() == topo.zones.len() {
        let free: i64 = published.iter().fold(0i64, |a, b| a.saturating_add(*b));
        // CPUs taken by earlier containers came in whole cores too.
        let free = free.saturating_sub(taken / threads).max(0);
        if free.saturating_mul(threads) < cpus {
            let earlier = if taken > 0 {
                format!(" after the pod's earlier containers took {}", taken / threads)
            } else {
                String::new()
            };
            return Err(reject(format!(
                "needs {} whole cores; the node has {free} free{earlier}",
                cpus / threads
            )));
        }
    }
    Ok(())
}

/// The NUMA nodes the Static memory manager allocates from (§3.2 Allocate): the Topology
/// Manager's mask when its free memory covers every type, else the narrowest superset that does
/// and that the group rules allow (the lowest of equals: its preferred hints are the narrowest);
/// without a mask, its own narrowest allowed hint. `None`: no such set (`UnexpectedAdmissionError`). Subset bits over positions.
fn memory_mask(
    w: &WorkingZones,
    groups: &Groups,
    wants: &[(ResId, i64)],
    mask: Option<NumaMask>,
) -> Option<usize> {
    let n = w.ids.len();
    let base = match mask {
        Some(m) => (0..n)
            .filter(|&i| m.contains(w.ids[i]))
            .fold(0usize, |b, i| b | 1 << i),
        None => 0,
    };
    let fits = |bits: usize| {
        wants.iter().all(|&(id, need)| {
            (0..n)
                .filter(|i| bits & (1 << i) != 0)
                .fold(0i64, |a, i| a.saturating_add(w.available[i].get_or_zero(id)))
                >= need
        })
    };
    // The Topology Manager's mask is taken as is when it fits, group or not (the kubelet's
    // Allocate checks only the request); the group rules bound the extension.
    if base != 0 && fits(base) {
        return Some(base);
    }
    (1..=n)
        .flat_map(|k| masks_of_size(n, k))
        .find(|&bits| bits & base == base && fits(bits) && groups.allows(bits))
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
    let ids = p
        .devices
        .iter()
        .map(|(r, ids)| format!("{r}={}", ids.join(",")))
        .collect::<Vec<_>>();
    let counts = p
        .device_counts
        .iter()
        .map(|(r, n)| format!("{r}×{n} (no IDs published)"))
        .collect::<Vec<_>>();
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
    let wants_memory = topo.memory_managed
        && pod.qos == Qos::Guaranteed
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
        };
        // Regular init containers finish before the app containers start: what they got is
        // reusable by the later containers of the pod, and held by the pod otherwise.
        let notes = allocate(res, topo, w, &mut st, u, mask, &mut placement)?;
        if record {
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
    use super::*;
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
