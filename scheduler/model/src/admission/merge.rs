//! The Topology Manager merge of the providers' hints under the node's policy and scope: a
//! fast path for the common shapes, the general merge otherwise, and best-effort admission.

use super::*;
use crate::admission::cpu::cpu_hints;
use crate::admission::cpu::exclusive_cpus;
use crate::admission::devices::device_hints;
use crate::admission::devices::hosting;
use crate::admission::hints::Hints;
use crate::admission::hints::PooledScratch;
use crate::admission::hints::masks_of_size;
use crate::admission::memory::Groups;
use crate::admission::memory::memory_hints;
use crate::admission::memory::memory_rejection;
use crate::admission::memory::memory_requests;
use crate::{
    node::NumaTopology,
    prepared::Unit,
    resources::{CPU, ResKind, Resources},
    topology_manager::{
        MergeOutcome, NumaMask, Policy, ResourceHints, TopologyHint, TopologyManagerError,
        merge_resource_hints, validate_config,
    },
};

pub(super) fn collect_hints(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    st: &PodState,
    u: &Unit<'_>,
) -> Result<Hints, Rejection> {
    let reuse = &st.reuse;
    let req = &u.request;
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
    let wants = memory_requests(res, topo, u);
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
pub(super) fn fast_merge(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    u: &Unit<'_>,
) -> Result<Option<MergeOutcome>, Rejection> {
    let req = &u.request;
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
    let wants = memory_requests(res, topo, u);
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
pub(super) struct SizedRow {
    pub(super) need: i64,
    pub(super) free: Vec<i64>,
    pub(super) allocatable: Option<Vec<i64>>,
    /// Zone positions the resource's hints may use (devices: [`hosting`]; others: all).
    pub(super) hosting: usize,
}

impl SizedRow {
    pub(super) fn sum(n: usize, need: i64, free: impl Fn(usize) -> i64) -> Self {
        SizedRow {
            need,
            free: (0..n).map(free).collect(),
            allocatable: None,
            hosting: usize::MAX,
        }
    }

    /// The mask (subset bits over zone positions) is one of the resource's hints and can hold
    /// the need.
    pub(super) fn fits(&self, bits: usize) -> bool {
        bits & !self.hosting == 0
            && mask_sum(&self.free, bits) >= self.need
            && self
                .allocatable
                .as_ref()
                .is_none_or(|a| mask_sum(a, bits) >= self.need)
    }
}

/// Sum of `values` over the zone positions in `bits`, saturating like [`subset_sums`].
pub(super) fn mask_sum(values: &[i64], bits: usize) -> i64 {
    values
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .fold(0i64, |acc, (_, v)| acc.saturating_add(*v))
}

/// The smallest number of zones whose `registered` amounts cover `need` (the provider's
/// `minAffinitySize`): the largest zones first, since every mask of that size sums less.
pub(super) fn min_size(n: usize, registered: impl Fn(usize) -> i64, need: i64) -> Option<u32> {
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

/// Merged hint for one request unit: the direct computation where it applies, else the
/// kubelet's literal hint generation and merge.
///
/// The direct computations ignore reusable items, so they run only while the pod's init
/// containers hold nothing; `best-effort`'s also returns "any" as the mask, which would misplace
/// what an init container leaves for the next containers, so init containers take the literal
/// path under it.
pub(super) fn decide(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    st: &PodState,
    u: &Unit<'_>,
    explain: bool,
) -> Result<(MergeOutcome, Option<Hints>), Rejection> {
    let memory = !memory_requests(res, topo, u).is_empty();
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

pub(super) fn merge_rejection(e: TopologyManagerError) -> Rejection {
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
pub(super) fn best_effort_admission(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    groups: &Groups,
    u: &Unit<'_>,
) -> Result<Option<(MergeOutcome, Option<Hints>)>, Rejection> {
    validate_config(topo.policy, &topo.options, &topo.info).map_err(merge_rejection)?;
    let wants = memory_requests(res, topo, u);
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

pub(super) fn merge(topo: &NumaTopology, hints: &Hints) -> Result<MergeOutcome, TopologyManagerError> {
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

pub(super) fn policy_where(policy: Policy) -> &'static str {
    match policy {
        Policy::SingleNumaNode => "on one NUMA node",
        Policy::Restricted => "on the narrowest aligned NUMA node set",
        Policy::BestEffort | Policy::None => "on this node",
    }
}
