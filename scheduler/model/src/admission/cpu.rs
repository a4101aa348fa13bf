//! The CPU manager's hint provider and its packing of exclusive CPUs onto zones.

use super::*;
use crate::admission::hints::Scratch;
use crate::admission::hints::hints_from_sums;
use crate::admission::hints::subset_sums;
use crate::admission::init_reuse::Reuse;
use crate::{node::NumaTopology, prepared::Unit, resources::CPU, topology_manager::TopologyHint};

/// CPU hints (§3.1): capacity gives `minAffinitySize`, available decides feasibility.
pub(super) fn cpu_hints(
    topo: &NumaTopology,
    w: &WorkingZones,
    reuse: &Reuse,
    need_cpus: i64,
    scratch: &mut Scratch,
) -> Option<Vec<TopologyHint>> {
    let n = w.ids.len();
    subset_sums(
        n,
        |i| topo.zones[i].capacity.get_or_zero(CPU) / 1000,
        &mut scratch.a,
    );
    subset_sums(n, |i| w.available[i].get_or_zero(CPU) / 1000, &mut scratch.b);
    let reusable = reuse.total(CPU) / 1000;
    Some(hints_from_sums(
        topo,
        &scratch.a,
        &scratch.b,
        need_cpus,
        reusable,
        |bits| reuse.allows(CPU, bits),
    ))
}

/// What the CPU manager grants exclusively: Guaranteed pods with a whole, positive CPU request.
/// (The pod side is prepared once per decision: [`Unit::whole_cpus`].)
pub(super) fn exclusive_cpus(u: &Unit<'_>, topo: &NumaTopology) -> Option<i64> {
    let cpu_managed = || topo.zones.iter().any(|z| z.allocatable.get_or_zero(CPU) > 0);
    u.whole_cpus.filter(|_| cpu_managed())
}
