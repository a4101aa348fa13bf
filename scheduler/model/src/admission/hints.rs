//! Hint plumbing shared by the providers: subset sums over zones, hints from sums, the
//! per-thread scratch, and collecting every provider's hints for one admission unit.

use crate::{
    node::NumaTopology,
    resources::ResId,
    topology_manager::{NumaMask, TopologyHint},
};
use std::cell::Cell;

pub(super) fn mask_ids(m: Option<NumaMask>) -> Option<Vec<u32>> {
    m.map(|m| m.iter().collect())
}

/// Per-mask sums of a per-zone value, by subset bits over zone positions (DP over subsets).
pub(super) fn subset_sums(n: usize, value: impl Fn(usize) -> i64, out: &mut Vec<i64>) {
    out.clear();
    out.resize(1 << n, 0);
    for bits in 1..(1usize << n) {
        let low = bits.trailing_zeros() as usize;
        out[bits] = out[bits & (bits - 1)].saturating_add(value(low));
    }
}

/// One request unit's hint lists, in provider order (device, cpu, memory).
pub(super) struct Hints {
    pub(super) lists: Vec<(ResId, Option<Vec<TopologyHint>>)>,
}

/// Hints from per-mask "registered" and "free" sums: a mask is emitted when its free amount
/// covers the need, and preferred when its size is the smallest whose registered amount
/// covers it ("as narrow as possible on an empty machine", as every kubelet provider does).
///
/// With reusable items (init containers of the same pod), `minAffinitySize` is lowered first;
/// then a mask that leaves out a reusable item is skipped, and the reusable amount counts
/// towards the need of every other mask (§3.1 step 3, §3.3 step 4).
pub(super) fn hints_from_sums(
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

/// Reusable per-mask buffers (2^zones entries each: at 8 zones too large for the allocator's
/// fast path, and needed for every container on every node evaluated).
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) a: Vec<i64>,
    pub(super) b: Vec<i64>,
    pub(super) qualifies: Vec<bool>,
    pub(super) feasible_memory: Vec<bool>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// The thread's [`Scratch`], taken for the lifetime of the guard and returned on drop (a
/// nested taker would simply get fresh buffers).
pub(super) struct PooledScratch(pub(super) Scratch);

impl PooledScratch {
    pub(super) fn take() -> Self {
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

/// Subset bits over `n` zone positions with exactly `k` set, ascending (Gosper's hack).
pub(super) fn masks_of_size(n: usize, k: usize) -> impl Iterator<Item = usize> {
    let end = 1usize << n;
    let first = if k == 0 || k > n { end } else { (1usize << k) - 1 };
    std::iter::successors(Some(first), move |&x| {
        let low = x & x.wrapping_neg();
        let ripple = x + low;
        Some((((ripple ^ x) >> 2) / low) | ripple)
    })
    .take_while(move |&x| x < end)
}
