//! The memory manager's hint provider, with its memory groups (the zones a multi-NUMA
//! allocation spans, which later pods must not split).

use super::*;
use crate::admission::hints::Scratch;
use crate::admission::hints::masks_of_size;
use crate::admission::hints::subset_sums;
use crate::{
    node::{MAX_ZONES, NumaTopology},
    pod::Qos,
    resources::{ResId, Resources},
    topology_manager::{NumaMask, TopologyHint},
};

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
pub(super) struct Groups {
    /// Zone positions (subset bits) with memory in use before this pod.
    pub(super) unknown: usize,
    /// Some zone's memory-manager resource is used up: groups may exist among `unknown`.
    pub(super) exhausted: bool,
    /// Predict the world where every zone in use may belong to a group.
    pub(super) suspect: bool,
    /// Per zone position, the mask (subset bits) of its known allocations, the kubelet's
    /// `Cells` of a node with assignments: the zone alone for single-NUMA allocations, the
    /// group otherwise; 0 when none is known (this pod's, the checkpoint's, or assumed).
    pub(super) cells: [usize; MAX_ZONES],
}

impl Groups {
    pub(super) fn of(res: &Resources, topo: &NumaTopology, w: &WorkingZones) -> Self {
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

    pub(super) fn suspecting(mut self, suspect: bool) -> Self {
        self.suspect = suspect && self.exhausted;
        self
    }

    /// Some zone's allocations are known.
    pub(super) fn any_known(&self) -> bool {
        self.cells.iter().any(|c| *c != 0)
    }

    /// The known cells of the zone at position bit `b`.
    pub(super) fn cells_of(&self, b: usize) -> usize {
        self.cells.get(b.trailing_zeros() as usize).copied().unwrap_or(0)
    }

    /// Nothing constrains the masks: the direct computations of [`fast_merge`] apply.
    pub(super) fn trivial(&self) -> bool {
        self.unknown == 0 && !self.any_known()
    }

    /// Whether the memory manager may use the mask (subset bits), §3.2 steps 2–3: a single
    /// zone unless it is in a multi-node group; several zones unless one of them holds
    /// allocations of another mask (a single-NUMA one, or another group).
    pub(super) fn allows(&self, bits: usize) -> bool {
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
    pub(super) fn some_hint(&self, n: usize, usable: impl Fn(usize) -> bool) -> bool {
        if self.any_known() {
            return (1..(1usize << n)).any(|bits| self.allows(bits) && usable(bits));
        }
        let singles = (0..n).map(|i| 1usize << i).any(|b| self.allows(b) && usable(b));
        let unused = ((1usize << n) - 1) & !self.unknown;
        singles || (unused.count_ones() > 1 && usable(unused))
    }

    /// Records an allocation on `bits`: the mask becomes each of its zones' cells.
    pub(super) fn record(&mut self, bits: usize) {
        for (i, cells) in self.cells.iter_mut().enumerate() {
            if bits & (1 << i) != 0 {
                *cells = bits;
            }
        }
    }
}

/// Memory-manager requests (memory and hugepages) the Static policy aligns: Guaranteed pods
/// only (and not those with pod-level resources, [`Unit::managed`]), and only when the node
/// publishes memory rows.
pub(super) fn memory_requests(res: &Resources, topo: &NumaTopology, u: &Unit<'_>) -> Vec<(ResId, i64)> {
    let req = &u.request;
    if !(topo.memory_managed && u.managed && u.qos == Qos::Guaranteed) {
        return Vec::new();
    }
    req.positive()
        .filter(|(id, _)| res.kind(*id).is_memory_like())
        .collect()
}

/// Per mask (index = subset bits), for all memory types together (§3.2): whether the mask
/// qualifies (every type's allocatable covers the request) and whether it is feasible (every
/// type's free amount does too), into `scratch.qualifies` and `scratch.feasible_memory`.
pub(super) fn memory_masks(
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
pub(super) fn memory_hints(
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

/// The memory manager finds no NUMA node set with enough free memory: the kubelet fails the
/// pod in Allocate (`UnexpectedAdmissionError`).
pub(super) fn memory_rejection(res: &Resources, wants: &[(ResId, i64)]) -> Rejection {
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

/// The NUMA nodes the Static memory manager allocates from (§3.2 Allocate): the Topology
/// Manager's mask when its free memory covers every type, else the narrowest superset that does
/// and that the group rules allow (the lowest of equals: its preferred hints are the narrowest);
/// without a mask, its own narrowest allowed hint. `None`: no such set (`UnexpectedAdmissionError`). Subset bits over positions.
pub(super) fn memory_mask(
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
