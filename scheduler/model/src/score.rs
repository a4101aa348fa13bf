//! Node scoring, with the formulas and normalisation of the upstream NodeResourceTopologyMatch
//! plugin (nrt-scheduling.md §7): MostAllocated, LeastAllocated, BalancedAllocation (per NUMA
//! zone, minimum non-zero zone, container mean) and LeastNUMANodes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{
    node::NumaTopology,
    pod::{PodSpec, Qos},
    prepared::PreparedPod,
    resources::{ResId, ResKind, ResList, Resources},
    topology_manager::{Policy, Scope},
};

/// Scoring strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Prefer zones the pod fills most.
    MostAllocated,
    /// Prefer zones with the most left over (upstream default).
    #[default]
    LeastAllocated,
    /// Prefer zones where the pod's resource fractions are balanced.
    BalancedAllocation,
    /// Prefer nodes where the pod fits in the fewest, closest NUMA zones.
    #[serde(rename = "LeastNUMANodes")]
    LeastNumaNodes,
}

/// Strategy plus resource weights.
#[derive(Clone, Debug, Default)]
pub struct Scorer {
    /// Strategy.
    pub strategy: Strategy,
    /// Weights by resource; unlisted resources weigh 1, weights below 1 count as 1.
    pub weights: HashMap<ResId, i64>,
}

/// Maximum node score.
pub const MAX_SCORE: i64 = 100;

impl Scorer {
    fn weight(&self, id: ResId) -> i64 {
        // Bounded so weighted sums of 0..100 scores cannot overflow whatever a config says.
        self.weights.get(&id).copied().unwrap_or(1).clamp(1, 1_000_000)
    }

    /// Scores `pod` on a node; `topo` is `None` for nodes without (valid) NRT.
    pub fn score(&self, res: &Resources, topo: Option<&NumaTopology>, pod: &PodSpec) -> i64 {
        self.score_prepared(res, topo, &PreparedPod::new(pod))
    }

    /// [`Self::score`] for a pod prepared once per decision.
    pub fn score_prepared(&self, res: &Resources, topo: Option<&NumaTopology>, pod: &PreparedPod<'_>) -> i64 {
        if pod.qos != Qos::Guaranteed {
            return MAX_SCORE;
        }
        let Some(topo) = topo else { return 0 };
        match self.strategy {
            Strategy::LeastNumaNodes => least_numa_nodes(topo, pod),
            _ if topo.policy != Policy::SingleNumaNode => 0,
            // The mean over the request maps of the scope.
            _ => match topo.scope {
                Scope::Pod => self.request_score(res, topo, &pod.effective),
                Scope::Container => {
                    let count = pod.containers.len();
                    if count == 0 {
                        return 0;
                    }
                    let sum: i64 = pod
                        .containers
                        .iter()
                        .map(|c| self.request_score(res, topo, &c.request))
                        .fold(0i64, i64::saturating_add);
                    sum / i64::try_from(count).unwrap_or(1)
                }
            },
        }
    }

    /// Minimum non-zero zone score for one request map.
    fn request_score(&self, res: &Resources, topo: &NumaTopology, req: &ResList) -> i64 {
        topo.zones
            .iter()
            .map(|z| self.zone_score(res, req, |id| z.available.get_or_zero(id)))
            .filter(|s| *s != 0)
            .min()
            .unwrap_or(0)
    }

    fn zone_score(&self, res: &Resources, req: &ResList, avail: impl Fn(ResId) -> i64) -> i64 {
        let units = |id: ResId, v: i64| {
            if res.kind(id) == ResKind::Cpu {
                // Requests are input (any pod's): round up without overflowing.
                v.saturating_add(999).div_euclid(1000)
            } else {
                v
            }
        };
        match self.strategy {
            Strategy::BalancedAllocation => {
                let fractions: Vec<f64> = req
                    .iter()
                    .map(|(id, r)| {
                        let a = units(id, avail(id));
                        if a == 0 {
                            1.0
                        } else {
                            units(id, r) as f64 / a as f64
                        }
                    })
                    .collect();
                if fractions.iter().any(|f| *f > 1.0) {
                    return 0;
                }
                let variance = sample_variance(&fractions);
                ((1.0 - variance) * MAX_SCORE as f64).trunc() as i64
            }
            Strategy::MostAllocated | Strategy::LeastAllocated | Strategy::LeastNumaNodes => {
                let (mut total, mut weights) = (0i128, 0i128);
                for (id, r) in req.iter() {
                    let (r, a) = (i128::from(units(id, r)), i128::from(units(id, avail(id))));
                    let s = if a == 0 || r > a {
                        0
                    } else if self.strategy == Strategy::MostAllocated {
                        r * 100 / a
                    } else {
                        (a - r) * 100 / a
                    };
                    let w = i128::from(self.weight(id));
                    total += s * w;
                    weights += w;
                }
                if weights == 0 {
                    0
                } else {
                    i64::try_from(total / weights).unwrap_or(0)
                }
            }
        }
    }
}

/// Sample (n−1) variance; one value has no spread, so 0 (upstream would produce NaN).
fn sample_variance(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)
}

/// Average distance of zones (by sorted index) in float32, as upstream computes it.
fn avg_distance(topo: &NumaTopology, idx: &[usize]) -> f32 {
    let mut sum = 0f32;
    for &a in idx {
        for &b in idx {
            sum += topo.costs.get(a).and_then(|r| r.get(b)).copied().unwrap_or(255) as f32;
        }
    }
    let n = idx.len() as f32;
    sum / (n * n)
}

fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur: Vec<usize> = (0..k).collect();
    if k == 0 || k > n {
        return out;
    }
    loop {
        out.push(cur.clone());
        let mut i = k;
        while i > 0 && cur[i - 1] == n - k + i - 1 {
            i -= 1;
        }
        if i == 0 {
            return out;
        }
        cur[i - 1] += 1;
        for j in i..k {
            cur[j] = cur[j - 1] + 1;
        }
    }
}

/// The minimal NUMA set for `req` over zone list positions: (zone count, is-min-distance).
pub fn minimal_numa_set(
    topo: &NumaTopology,
    avail: &[crate::resources::Dense],
    req: &ResList,
) -> Option<(usize, bool, Vec<usize>)> {
    let n = topo.zones.len();
    for k in 1..=n {
        // Subsets of list positions, mapped to sorted zone indexes.
        let subsets: Vec<Vec<usize>> = combinations(n, k)
            .into_iter()
            .map(|c| c.iter().map(|&p| topo.list_order[p]).collect())
            .collect();
        let min_dist = subsets
            .iter()
            .map(|s| avg_distance(topo, s))
            .fold(f32::INFINITY, f32::min);
        let mut best: Option<(f32, &Vec<usize>)> = None;
        for s in &subsets {
            let lists_all = s
                .iter()
                .all(|&z| req.iter().all(|(id, _)| avail[z].get(id).is_some()));
            let covers = req
                .positive()
                .all(|(id, need)| s.iter().map(|&z| avail[z].get_or_zero(id)).sum::<i64>() >= need);
            if !(lists_all && covers) {
                continue;
            }
            let d = avg_distance(topo, s);
            if d == min_dist {
                return Some((k, true, s.clone()));
            }
            if best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, s));
            }
        }
        if let Some((_, s)) = best {
            return Some((k, false, s.clone()));
        }
    }
    None
}

/// LeastNUMANodes normalisation.
pub fn normalize_least_numa(count: usize, is_min_distance: bool, max_numa_nodes: usize) -> i64 {
    let step = MAX_SCORE / i64::try_from(max_numa_nodes.max(1)).unwrap_or(1);
    let mut score = MAX_SCORE - i64::try_from(count).unwrap_or(i64::MAX / 2) * step;
    if is_min_distance {
        score += step / 2;
    }
    score
}

fn least_numa_nodes(topo: &NumaTopology, pod: &PreparedPod<'_>) -> i64 {
    let mut avail: Vec<crate::resources::Dense> = topo.zones.iter().map(|z| z.available.clone()).collect();
    let named_in_zones = |req: &ResList| {
        req.iter()
            .any(|(id, _)| topo.zones.iter().any(|z| z.available.get(id).is_some()))
    };
    match topo.scope {
        Scope::Pod => {
            let req = &pod.effective;
            if !named_in_zones(req) {
                return MAX_SCORE;
            }
            minimal_numa_set(topo, &avail, req)
                .map_or(0, |(k, min, _)| normalize_least_numa(k, min, topo.max_numa_nodes))
        }
        Scope::Container => {
            let (mut max_k, mut all_min, mut counted) = (0usize, true, false);
            for c in &pod.containers {
                if !named_in_zones(&c.request) {
                    continue;
                }
                let Some((k, min, set)) = minimal_numa_set(topo, &avail, &c.request) else {
                    return 0;
                };
                counted = true;
                max_k = max_k.max(k);
                all_min &= min;
                let mut zones = set.clone();
                zones.sort_unstable();
                for (id, need) in c.request.positive() {
                    let mut left = need;
                    for &z in &zones {
                        let Some(have) = avail[z].get(id) else { continue };
                        let take = have.min(left);
                        avail[z].sub_clamped(id, take);
                        left -= take;
                    }
                }
            }
            if counted {
                normalize_least_numa(max_k, all_min, topo.max_numa_nodes)
            } else {
                MAX_SCORE
            }
        }
    }
}

/// Resolves configured resource names to weights.
pub fn weights_from_names(res: &mut Resources, names: &[(String, i64)]) -> HashMap<ResId, i64> {
    names.iter().map(|(n, w)| (res.intern(n), *w)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_numa_normalisation_matches_upstream_table() {
        assert_eq!(normalize_least_numa(1, true, 8), 94);
        assert_eq!(normalize_least_numa(1, false, 8), 88);
        assert_eq!(normalize_least_numa(2, true, 8), 82);
        assert_eq!(normalize_least_numa(2, false, 8), 76);
        assert_eq!(normalize_least_numa(8, false, 8), 4);
    }

    #[test]
    fn combinations_in_lexicographic_order() {
        assert_eq!(combinations(3, 2), vec![vec![0, 1], vec![0, 2], vec![1, 2]]);
        assert_eq!(combinations(2, 3), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn variance_is_sample_variance() {
        assert!((sample_variance(&[0.5, 0.1]) - 0.08).abs() < 1e-12);
        assert_eq!(sample_variance(&[0.3]), 0.0);
    }
}
