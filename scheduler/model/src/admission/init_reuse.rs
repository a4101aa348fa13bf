//! Init-container reuse: what an init container held, app containers of the same pod reuse
//! first, as the kubelet's managers do (aligned per zone, unaligned devices by ID).

use super::*;
use crate::admission::packing::{cpu_distributed, cpu_packing};
use crate::{
    node::{MAX_ZONES, NumaTopology, Unaligned},
    resources::{ResId, ResList},
};
use std::collections::BTreeMap;

/// What the pod's finished init containers hold and later containers of the same pod may reuse
/// (kubelet-topology-manager.md §2.7): the CPU manager's `cpusToReuse` and the device manager's
/// `devicesToReuse`. An init container adds what it got; an app or sidecar container removes what
/// it got. Memory is not tracked: an init container's memory is not held (as before).
#[derive(Clone, Debug, Default)]
pub(super) struct Reuse {
    /// Per resource (exclusive `cpu` in millicores, devices in units), the reusable items.
    pub(super) items: BTreeMap<ResId, Vec<ReusableItem>>,
}

/// One reusable item: an amount on one zone (CPUs, devices without published IDs) or one device
/// ID on the zones that list it.
#[derive(Clone, Debug)]
pub(super) struct ReusableItem {
    /// Zone positions (subset bits) the item is attached to; 0 for a device without a NUMA
    /// node, which constrains no hint and counts towards none (§3.3 step 4: the kubelet skips
    /// reusable devices without topology).
    pub(super) bits: usize,
    /// Amount (millicores for cpu, 1 per device ID).
    pub(super) amount: i64,
    /// The device ID, when the node publishes IDs.
    pub(super) id: Option<String>,
}

impl Reuse {
    pub(super) fn is_empty(&self) -> bool {
        self.items.values().all(|v| v.iter().all(|h| h.amount <= 0))
    }

    /// Reusable amount of `id` (CPUs in millicores).
    pub(super) fn total(&self, id: ResId) -> i64 {
        self.items.get(&id).map_or(0, |v| {
            v.iter().fold(0i64, |a, h| a.saturating_add(h.amount.max(0)))
        })
    }

    /// Reusable amount of `id` on some NUMA node: what counts towards a hint's need.
    pub(super) fn total_aligned(&self, id: ResId) -> i64 {
        self.items.get(&id).map_or(0, |v| {
            v.iter()
                .filter(|h| h.bits != 0)
                .fold(0i64, |a, h| a.saturating_add(h.amount.max(0)))
        })
    }

    /// The kubelet's rule: a mask that leaves out a reusable CPU or device (one with topology)
    /// is skipped (§3.1 step 3, §3.3 step 4).
    pub(super) fn allows(&self, id: ResId, bits: usize) -> bool {
        self.items.get(&id).is_none_or(|v| {
            v.iter()
                .all(|h| h.amount <= 0 || h.bits == 0 || h.bits & bits != 0)
        })
    }

    /// Takes up to `want` reusable devices of `id` without a NUMA node and without published
    /// IDs; returns the amount taken. `keep` as in [`Self::take_amount`].
    pub(super) fn take_unaligned(&mut self, id: ResId, want: i64, keep: bool) -> i64 {
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
    pub(super) fn zones_for(&self, req: &ResList) -> usize {
        req.positive()
            .filter_map(|(id, _)| self.items.get(&id))
            .flatten()
            .filter(|h| h.amount > 0)
            .fold(0, |a, h| a | h.bits)
    }

    pub(super) fn add(&mut self, id: ResId, held: ReusableItem) {
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
    pub(super) fn take_amount(&mut self, id: ResId, zone: usize, want: i64, keep: bool) -> i64 {
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

/// Takes `want` free devices of `id` without a NUMA node: the listed IDs first, lowest first,
/// when `with_ids` (choosing concrete devices), the rest by count. Returns the IDs chosen and
/// the number taken by count; fails without effect when fewer are free.
pub(super) fn take_unaligned(
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
pub(super) fn hold_unaligned(reuse: &mut Reuse, id: ResId, ids: &[String], counted: i64) {
    for d in ids {
        reuse.add(
            id,
            ReusableItem {
                bits: 0,
                amount: 1,
                id: Some(d.clone()),
            },
        );
    }
    reuse.add(
        id,
        ReusableItem {
            bits: 0,
            amount: counted,
            id: None,
        },
    );
}

/// Takes `need` of `id` (amounts per zone): CPUs reusable then available in the mask's zones,
/// then the same outside; devices reusable (in the mask's zones first) before any available,
/// then available in the mask's zones, then outside; fails without effect if short. What an init container takes from the
/// available amounts becomes reusable; reusable items an init container takes stay reusable,
/// those another container takes do not. Returns the amount reused.
///
/// Exclusive CPUs (`packing`: the node's topology) are taken from each group's available CPUs
/// as the static CPU manager's `takeByTopology` (NUMA-packed) takes them: [`cpu_packing`].
/// Devices are taken zone by zone in the group's order.
#[allow(clippy::too_many_arguments)]
pub(super) fn take_reusing(
    w: &mut WorkingZones,
    reuse: &mut Reuse,
    in_mask: &[usize],
    rest: &[usize],
    id: ResId,
    need: i64,
    init: bool,
    packing: Option<&NumaTopology>,
    touched: &mut usize,
) -> Result<i64, ()> {
    let available = w
        .available
        .iter()
        .fold(0i64, |a, z| a.saturating_add(z.get_or_zero(id)));
    if available.saturating_add(reuse.total(id)) < need {
        return Err(());
    }
    let (mut left, mut reused) = (need, 0);
    let take_reusable =
        |reuse: &mut Reuse, group: &[usize], left: &mut i64, reused: &mut i64, touched: &mut usize| {
            for &i in group {
                let t = reuse.take_amount(id, i, *left, init);
                if t > 0 {
                    *touched |= 1 << i;
                }
                *left -= t;
                *reused += t;
            }
        };
    // The device manager hands out every reusable device before any free one, wherever it
    // is; the CPU manager takes the mask's CPUs (reusable or free) before the others.
    if packing.is_none() {
        take_reusable(reuse, in_mask, &mut left, &mut reused, touched);
        take_reusable(reuse, rest, &mut left, &mut reused, touched);
    }
    for group in [in_mask, rest] {
        if packing.is_some() {
            take_reusable(reuse, group, &mut left, &mut reused, touched);
        }
        // Amounts per zone position, on the stack: this runs for every node the filter evaluates.
        let takes = match packing {
            Some(topo) if topo.cpu_distribute => {
                cpu_distributed(topo, w, group, left, topo.full_pcpus_threads.unwrap_or(1))
            }
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
                *touched |= 1 << i;
                left -= t;
                if init {
                    reuse.add(
                        id,
                        ReusableItem {
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
