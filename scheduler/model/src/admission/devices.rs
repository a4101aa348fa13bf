//! The device manager's hint provider (hosting zones, devices without a NUMA node) and the
//! device part of an explanation.

use super::*;
use crate::admission::hints::Scratch;
use crate::admission::hints::hints_from_sums;
use crate::admission::hints::subset_sums;
use crate::admission::init_reuse::Reuse;
use crate::{node::NumaTopology, resources::ResId, topology_manager::TopologyHint};

/// Zone positions (subset bits) hosting devices of `id`: the NUMA nodes the v1.36 device
/// manager builds the resource's hints over (verified-facts.md, "Device hints are built only
/// over the NUMA nodes that host devices of that resource"). A zone hosts the resource when its
/// allocatable count is positive; a zone that lists none (or 0) is in no hint mask of it.
pub(super) fn hosting(topo: &NumaTopology, id: ResId) -> usize {
    topo.zones
        .iter()
        .enumerate()
        .filter(|(_, z)| z.allocatable.get_or_zero(id) > 0)
        .fold(0, |bits, (i, _)| bits | 1 << i)
}

/// Device hints (§3.3): zone allocatable counts give `minAffinitySize`; free counts (or the
/// union of free IDs, for devices attached to several NUMA nodes) decide feasibility. Only
/// masks inside the zones hosting the resource are hints ([`hosting`]).
pub(super) fn device_hints(
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

pub(super) fn explain_devices(p: &ContainerPlacement) -> String {
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
