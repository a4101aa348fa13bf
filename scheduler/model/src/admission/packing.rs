//! How the CPU manager packs exclusive CPUs onto zones (fullest first), for allocation and
//! for init-container reuse.

use super::*;
use crate::{
    node::{MAX_ZONES, NumaTopology},
    resources::CPU,
};

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
pub(super) fn cpu_packing(
    topo: &NumaTopology,
    w: &WorkingZones,
    zones: &[usize],
    need: i64,
) -> [i64; MAX_ZONES] {
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
