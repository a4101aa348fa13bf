//! The `full-pcpus-only` check: exclusive CPUs in whole physical cores.

use super::*;
use crate::node::NumaTopology;

/// The static CPU manager's `full-pcpus-only` check (after the Topology Manager admitted): an
/// exclusive CPU count that is not a multiple of the SMT width, or more CPUs than the free whole
/// cores hold (published free cores minus pending placements, minus what earlier containers of
/// the pod took from the pool: `taken`), is rejected with `SMTAlignmentError` whatever the
/// hint. The kubelet checks the shared pool before it looks at reusable init CPUs, so a
/// container that will reuse them still needs that many CPUs free in whole cores.
pub(super) fn smt_aligned(
    topo: &NumaTopology,
    cpus: i64,
    taken: i64,
    container: &str,
) -> Result<(), Rejection> {
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
