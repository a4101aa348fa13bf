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

/// [`cpu_packing`] under `distribute-cpus-across-numa`: the CPU manager's
/// `takeByTopologyNUMADistributed` at the NUMA level, over the free CPUs of `zones` (the pool of
/// one `allocateCPUs` pass). The fewest NUMA nodes the request can need by NUMA node size are
/// tried first, more only when none of that many can hold it; among the combinations (in the
/// pool's order: fewest free CPUs first, then id) the one that leaves the free CPUs of the pool's
/// nodes most even (population standard deviation, rounded to 3 decimals as the kubelet rounds
/// it; the first on ties) gets an equal share each, in groups of `group` CPUs (threads per core
/// under `full-pcpus-only`, else 1), and the remainder goes group by group to the subset of them
/// that balances best. Inside one NUMA node the kubelet packs, which changes no NUMA count.
/// Falls back to the packed order where the kubelet does (no combination fits, or the request is
/// not a multiple of `group`). Amounts are millicores, as in [`cpu_packing`].
pub(super) fn cpu_distributed(
    topo: &NumaTopology,
    w: &WorkingZones,
    zones: &[usize],
    need: i64,
    group: i64,
) -> [i64; MAX_ZONES] {
    let mut takes = [0i64; MAX_ZONES];
    let n = need / 1000;
    let g = group.max(1);
    if n <= 0 {
        return takes;
    }
    if n % g != 0 {
        return cpu_packing(topo, w, zones, need);
    }
    let free_cpus = |i: usize| w.available.get(i).map_or(0, |a| a.get_or_zero(CPU)).max(0) / 1000;
    // The pool's NUMA nodes with a free CPU, fewest free first, then id: the kubelet's order.
    let mut numas: Vec<usize> = zones.iter().copied().filter(|&i| free_cpus(i) > 0).collect();
    numas.sort_unstable_by_key(|&i| (free_cpus(i), w.ids.get(i).copied().unwrap_or(u32::MAX)));
    let free: Vec<i64> = numas.iter().map(|&i| free_cpus(i)).collect();
    if free.iter().sum::<i64>() < n {
        return cpu_packing(topo, w, zones, need);
    }
    // `rangeNUMANodesNeededToSatisfy`: NUMA node size from the whole machine's CPUs.
    let machine_cpus: i64 = topo
        .zones
        .iter()
        .map(|z| z.capacity.get_or_zero(CPU) / 1000)
        .sum();
    let nodes = i64::try_from(topo.zones.len()).unwrap_or(1).max(1);
    let groups_total = (machine_cpus.max(1) - 1) / g + 1;
    let groups_per_node = (groups_total - 1) / nodes + 1;
    let groups_needed = (n - 1) / g + 1;
    let min_k = usize::try_from((groups_needed - 1) / groups_per_node.max(1) + 1).unwrap_or(1);
    let max_k = usize::try_from(groups_needed)
        .unwrap_or(usize::MAX)
        .min(numas.len());
    for k in min_k..=max_k {
        let mut best: Option<(f64, Vec<usize>, Vec<usize>)> = None;
        for combo in combinations(numas.len(), k) {
            if best.as_ref().is_some_and(|(b, _, _)| *b == 0.0) {
                break;
            }
            let k_i = i64::try_from(k).unwrap_or(1);
            if combo.iter().map(|&c| free[c]).sum::<i64>() < n
                || combo.iter().map(|&c| free[c] / g * g).sum::<i64>() < n
            {
                continue;
            }
            let share = n / k_i / g * g;
            if combo.iter().any(|&c| free[c] < share) {
                continue;
            }
            let mut after = free.clone();
            for &c in &combo {
                after[c] -= share;
            }
            let rem = n - share * k_i;
            let (balance, remainder) = if rem == 0 {
                (deviation(&after), Vec::new())
            } else {
                let candidates: Vec<usize> = combo.iter().copied().filter(|&c| after[c] >= g).collect();
                let mut local: Option<(f64, Vec<usize>)> = None;
                for j in (1..=candidates.len()).rev() {
                    for pick in combinations(candidates.len(), j) {
                        let subset: Vec<usize> = pick.iter().map(|&p| candidates[p]).collect();
                        let mut a = after.clone();
                        if subset.iter().map(|&c| a[c]).sum::<i64>() < rem
                            || !hand_out(&mut a, &subset, rem, g)
                        {
                            continue;
                        }
                        let b = deviation(&a);
                        if local.as_ref().is_none_or(|(lb, _)| b < *lb) {
                            local = Some((b, subset));
                        }
                    }
                }
                match local {
                    Some(l) => l,
                    None => continue,
                }
            };
            if best.as_ref().is_none_or(|(b, _, _)| balance < *b) {
                best = Some((balance, combo, remainder));
            }
        }
        let Some((_, combo, remainder)) = best else {
            continue;
        };
        let share = n / i64::try_from(combo.len()).unwrap_or(1) / g * g;
        let mut after = free.clone();
        for &c in &combo {
            after[c] -= share;
            if let Some(t) = takes.get_mut(numas[c]) {
                *t += share * 1000;
            }
        }
        let rem = n - share * i64::try_from(combo.len()).unwrap_or(1);
        let before = after.clone();
        if hand_out(&mut after, &remainder, rem, g) {
            for &c in &remainder {
                if let Some(t) = takes.get_mut(numas[c]) {
                    *t += (before[c] - after[c]) * 1000;
                }
            }
        }
        return takes;
    }
    cpu_packing(topo, w, zones, need)
}

/// Takes `rem` CPUs from `free` over `subset`, `group` at a time round-robin, skipping nodes
/// with less than a group left; false when a round takes nothing (it cannot be done).
fn hand_out(free: &mut [i64], subset: &[usize], mut rem: i64, group: i64) -> bool {
    while rem > 0 {
        let mut took = false;
        for &c in subset {
            if rem == 0 {
                break;
            }
            if free[c] < group {
                continue;
            }
            free[c] -= group;
            rem -= group;
            took = true;
        }
        if !took {
            return false;
        }
    }
    true
}

/// The kubelet's `standardDeviation`: population deviation with the mean and the result each
/// rounded to 3 decimals.
fn deviation(xs: &[i64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let len = xs.len() as f64;
    let mean = (xs.iter().map(|&x| x as f64).sum::<f64>() / len * 1000.0).round() / 1000.0;
    let var = xs
        .iter()
        .map(|&x| (x as f64 - mean) * (x as f64 - mean))
        .sum::<f64>()
        / len;
    (var.sqrt() * 1000.0).round() / 1000.0
}

/// Every `k`-subset of `0..n`, in lexicographic order (the kubelet's `iterateCombinations`),
/// one at a time: on 16 NUMA nodes there are thousands, and the search often stops early.
fn combinations(n: usize, k: usize) -> Combinations {
    Combinations {
        n,
        next: (k > 0 && k <= n).then(|| (0..k).collect()),
    }
}

/// The iterator of [`combinations`].
struct Combinations {
    n: usize,
    next: Option<Vec<usize>>,
}

impl Iterator for Combinations {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let current = self.next.take()?;
        let k = current.len();
        if let Some(i) = (0..k).rev().find(|&i| current[i] != i + self.n - k) {
            let mut idx = current.clone();
            idx[i] += 1;
            for j in i + 1..k {
                idx[j] = idx[j - 1] + 1;
            }
            self.next = Some(idx);
        }
        Some(current)
    }
}

#[cfg(test)]
mod distributed_tests {
    use super::{combinations, deviation};

    #[test]
    fn combinations_come_in_lexicographic_order() {
        let all = |n, k| combinations(n, k).collect::<Vec<_>>();
        assert_eq!(all(3, 2), [vec![0, 1], vec![0, 2], vec![1, 2]]);
        assert_eq!(all(2, 3), Vec::<Vec<usize>>::new());
        assert_eq!(all(4, 4), [vec![0, 1, 2, 3]]);
        assert_eq!(all(16, 8).len(), 12_870);
    }

    #[test]
    fn deviation_rounds_as_the_kubelet_does() {
        assert_eq!(deviation(&[0, 1]), 0.5);
        // The research trace for 6 CPUs on 4 x 4 with CPU 0 reserved: 1.785 and 1.299.
        assert_eq!(deviation(&[0, 1, 4, 4]), 1.785);
        assert_eq!(deviation(&[3, 1, 1, 4]), 1.299);
    }
}
