//! The allocation that follows admission: CPUs, memory and concrete device IDs taken from the
//! working zones, container by container.

use super::*;
use crate::admission::cpu::exclusive_cpus;
use crate::admission::init_reuse::ReusableItem;
use crate::admission::init_reuse::Reuse;
use crate::admission::init_reuse::hold_unaligned;
use crate::admission::init_reuse::take_reusing;
use crate::admission::init_reuse::take_unaligned;
use crate::admission::memory::memory_mask;
use crate::admission::memory::memory_rejection;
use crate::admission::memory::memory_requests;
use crate::admission::smt::smt_aligned;
use crate::{
    node::NumaTopology,
    prepared::Unit,
    resources::{CPU, ResId, ResKind, Resources},
    topology_manager::NumaMask,
};

/// The NUMA ids of the zone positions set in `bits`, ascending.
pub(super) fn zone_ids(w: &WorkingZones, bits: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..w.ids.len())
        .filter(|i| bits & (1 << i) != 0)
        .map(|i| w.ids[i])
        .collect();
    ids.sort_unstable();
    ids
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
pub(super) fn allocate(
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
    let req = &u.request;
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
        placement.exclusive_cpus = n;
        let mut touched = 0;
        let reused = take_reusing(
            w,
            reuse,
            &in_mask,
            &rest,
            CPU,
            n.saturating_mul(1000),
            init,
            Some(topo),
            &mut touched,
        )
        .map_err(|_| exhausted("exclusive cpu".to_owned()))?;
        placement.cpu_zones = touched;
        *pool_cpus_taken = pool_cpus_taken.saturating_add(n.saturating_sub(reused / 1000));
        if reused > 0 && !init {
            notes.push(format!(
                "reuses {} exclusive CPUs of the init containers",
                reused / 1000
            ));
        }
    }
    let wants = memory_requests(res, topo, u);
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
            placement.memory_numa_nodes = Some(zone_ids(w, bits));
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
                        ReusableItem {
                            bits,
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
            // Every reusable device first, those on a NUMA node before those without (the tie
            // rule the published-ID path follows too: the device manager's own order is Go map
            // order), then the zones, then the free devices without a NUMA node.
            let aligned_reusable = reuse.total_aligned(id).min(need);
            let reused_unaligned = reuse.take_unaligned(id, need - aligned_reusable, init);
            let left = need - reused_unaligned;
            let in_zones = w
                .available
                .iter()
                .fold(0i64, |a, z| a.saturating_add(z.get_or_zero(id)))
                .saturating_add(reuse.total_aligned(id));
            let from_zones = left.min(in_zones);
            let reused = take_reusing(w, reuse, &in_mask, &rest, id, from_zones, init, None, &mut 0)
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

/// Allocate for a resource whose devices have no NUMA node at all: the pod's reusable devices
/// first (listed IDs lowest first, then counted ones), then free ones (IDs when choosing
/// concrete devices, else by count). Fails when too few are left.
#[allow(clippy::too_many_arguments)]
pub(super) fn allocate_unaligned_only(
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

/// Takes `need` of `id` from zones in `order`; fails without partial effect if short.
pub(super) fn take_fill(w: &mut WorkingZones, order: &[usize], id: ResId, need: i64) -> Result<(), ()> {
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
