//! Why a pod is rejected, in the kubelet's words plus the best zone's numbers.

use super::*;
use crate::admission::hints::Hints;
use crate::admission::init_reuse::Reuse;
use crate::admission::merge::policy_where;
use crate::{
    node::NumaTopology,
    resources::{ResId, ResList, Resources},
    topology_manager::Policy,
};

/// The zone that comes closest to holding `req` (largest minimum coverage ratio).
pub(super) fn best_zone_text(res: &Resources, w: &WorkingZones, req: &ResList, aligned: &[ResId]) -> String {
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

pub(super) fn rejection_for(
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
