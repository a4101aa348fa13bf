//! kube-scheduler's standard filters and scores that depend on other pods: NodePorts,
//! VolumeRestrictions (in-tree disks), PodTopologySpread and InterPodAffinity, plus the parsed
//! required node affinity fit uses. Pure: the cluster index feeds [`ConstraintIndex`] and asks
//! [`ConstraintIndex::prepare`] once per decision; `simulate`, `kubectl numa explain` and the live
//! scheduler go through the same calls.
//!
//! Scores are added as kube-scheduler's default profile weighs them: PodTopologySpread 2,
//! InterPodAffinity 2, NodeAffinity (preferred terms) 2, each normalised to 0..=100 over the
//! nodes that pass every filter.

pub mod config;
pub mod index;
pub mod interpod;
pub mod ports;
pub mod spread;
pub mod volumes;

pub use index::{ConstraintIndex, SpreadDefaults};

use crate::{fit::Filter, node::NodeBasics, pod_facts::PodFacts};

/// A fast, non-keyed hasher for the per-decision maps of topology values (the FxHash
/// multiply-rotate): the keys are node label values, and the per-node lookups of a decision
/// over thousands of nodes are its hot path. Not for maps whose keys an attacker picks to
/// collide at scale; label values of the cluster's own nodes are bounded by the node count.
#[derive(Clone, Copy, Debug, Default)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0xf135_7aea_2e62_a9c5;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(26) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(26) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// `HashMap` with [`FxHasher`].
pub type FxMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// Weight of the InterPodAffinity score in kube-scheduler's default profile.
pub const INTER_POD_AFFINITY_WEIGHT: i64 = 2;
/// Weight of the PodTopologySpread score in kube-scheduler's default profile.
pub const POD_TOPOLOGY_SPREAD_WEIGHT: i64 = 2;
/// Weight of the NodeAffinity score in kube-scheduler's default profile (v1.36
/// `pkg/scheduler/apis/config/v1/default_plugins.go`).
pub const NODE_AFFINITY_WEIGHT: i64 = 2;
/// The error text of a preferred node affinity that does not parse.
pub const NODE_AFFINITY_PRESCORE: &str = "running PreScore plugin \"NodeAffinity\"";

/// kube-scheduler's `helper.DefaultNormalizeScore(MaxNodeScore, false, scores)`: each score
/// scaled to `0..=100` by the highest one; all left as they are when the highest is not positive.
pub fn default_normalize(scores: &mut [i64]) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max <= 0 {
        return;
    }
    for s in scores {
        *s = i64::try_from(i128::from(crate::score::MAX_SCORE) * i128::from(*s) / i128::from(max))
            .unwrap_or(0);
    }
}

/// A failed constraint on one node: the plugin, kube-scheduler's category, and the node's
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The plugin that failed.
    pub filter: Filter,
    /// Aggregate category (kube-scheduler's reason text).
    pub category: String,
    /// Detail.
    pub message: String,
}

fn failure(filter: Filter, category: &str, message: impl Into<String>) -> Failure {
    Failure {
        filter,
        category: category.to_owned(),
        message: message.into(),
    }
}

/// One decision's constraint state (kube-scheduler's PreFilter results for these plugins).
#[derive(Debug)]
pub struct PodConstraints<'a> {
    index: &'a ConstraintIndex,
    pod: &'a PodFacts,
    /// The pod itself is invalid for a plugin: every node fails with this.
    reject_all: Option<Failure>,
    interpod: Option<interpod::Filter<'a>>,
    spread: Option<spread::Filter>,
    /// Whether a score plugin applies: without, the best node is the best one by the NUMA
    /// score that passes the filters.
    scored: bool,
}

impl ConstraintIndex {
    /// Prepares the checks of `pod`; `nodes` lists every indexed node, called only when a
    /// spread constraint's eligible domains need a scan. `None` when no constraint plugin has
    /// anything to filter or score for it (the common case: the cached fast path then decides
    /// alone).
    pub fn prepare<'a, 'n>(
        &'a self,
        pod: &'a PodFacts,
        nodes: impl FnOnce() -> Vec<&'n NodeBasics>,
    ) -> Option<PodConstraints<'a>> {
        let reject_all = pod
            .affinity
            .as_deref()
            .and_then(|a| a.error.as_deref())
            .map(|e| {
                failure(
                    Filter::InterPodAffinity,
                    "node(s) didn't match pod affinity/anti-affinity",
                    format!("parsing pod: {e}"),
                )
            })
            .or_else(|| {
                pod.spread_error.as_deref().map(|e| {
                    failure(
                        Filter::PodTopologySpread,
                        spread::CONSTRAINTS_NOT_MATCH,
                        format!("parsing pod: {e}"),
                    )
                })
            })
            .or_else(|| {
                // kube-scheduler's NodeAffinity PreScore fails the cycle with this error; the
                // pod is then placed nowhere, as here.
                pod.preferred_node.error().map(|e| {
                    failure(
                        Filter::NodeAffinity,
                        NODE_AFFINITY_PRESCORE,
                        format!("{NODE_AFFINITY_PRESCORE}: {e}"),
                    )
                })
            });
        let interpod = interpod::Filter::new(self, pod);
        let spread = spread::Filter::new(self, pod, spread::hard_constraints(self, pod), nodes);
        let has_preferred = pod
            .affinity
            .as_deref()
            .is_some_and(|a| !a.preferred.is_empty() || !a.preferred_anti.is_empty());
        let scored = has_preferred
            || !pod.preferred_node.is_empty()
            || spread::has_soft(self, pod)
            || (self.has_groups() && interpod::Score::new(self, pod).is_some());
        let active = scored
            || reject_all.is_some()
            || interpod.is_some()
            || spread.is_some()
            || !pod.host_ports.is_empty()
            || !pod.volumes.is_empty();
        active.then_some(PodConstraints {
            index: self,
            pod,
            reject_all,
            interpod,
            spread,
            scored,
        })
    }
}

impl PodConstraints<'_> {
    /// Whether a score plugin applies (see [`Self::scores`]).
    pub fn scored(&self) -> bool {
        self.scored
    }

    /// The first constraint `node` fails, in kube-scheduler's plugin order (NodePorts,
    /// VolumeRestrictions, PodTopologySpread, InterPodAffinity).
    pub fn check(&self, node: &NodeBasics) -> Option<Failure> {
        if let Some(f) = &self.reject_all {
            return Some(f.clone());
        }
        if !ports::fits(self.index, &self.pod.host_ports, &node.name) {
            return Some(failure(
                Filter::NodePorts,
                ports::NO_FREE_PORTS,
                "a requested host port is bound by a pod on the node",
            ));
        }
        if !volumes::fits(self.index, &self.pod.volumes, &node.name) {
            return Some(failure(
                Filter::VolumeRestrictions,
                volumes::DISK_CONFLICT,
                "a volume of the pod is in use by a pod on the node (VolumeRestrictions)",
            ));
        }
        if let Some(r) = self.spread.as_ref().and_then(|s| s.check(node)) {
            return Some(failure(
                Filter::PodTopologySpread,
                r,
                "a topology spread constraint (DoNotSchedule) is violated here",
            ));
        }
        if let Some(r) = self.interpod.as_ref().and_then(|s| s.check(self.index, node)) {
            return Some(failure(
                Filter::InterPodAffinity,
                r,
                r.trim_start_matches("node(s) "),
            ));
        }
        None
    }

    /// What the score plugins add to each of the `feasible` nodes (in order): weighted,
    /// normalised InterPodAffinity, NodeAffinity and PodTopologySpread scores; `all` is every
    /// indexed node.
    pub fn scores(&self, feasible: &[&NodeBasics], all: &[&NodeBasics]) -> Vec<i64> {
        let mut out = vec![0i64; feasible.len()];
        if !self.scored || feasible.is_empty() {
            return out;
        }
        if let Some(s) = interpod::Score::new(self.index, self.pod) {
            for (o, v) in out.iter_mut().zip(s.normalised(feasible)) {
                *o = o.saturating_add(v.saturating_mul(INTER_POD_AFFINITY_WEIGHT));
            }
        }
        if !self.pod.preferred_node.is_empty() {
            // NodeAffinity: the matching preferred terms' weights, normalised over the nodes
            // that pass the filters (`node_affinity.go` Score and NormalizeScore).
            let mut raw: Vec<i64> = feasible
                .iter()
                .map(|n| self.pod.preferred_node.score(&n.name, &n.labels))
                .collect();
            default_normalize(&mut raw);
            for (o, v) in out.iter_mut().zip(raw) {
                *o = o.saturating_add(v.saturating_mul(NODE_AFFINITY_WEIGHT));
            }
        }
        if let Some(v) = spread::score(self.index, self.pod, feasible, all) {
            for (o, v) in out.iter_mut().zip(v) {
                *o = o.saturating_add(v.saturating_mul(POD_TOPOLOGY_SPREAD_WEIGHT));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::default_normalize;

    #[test]
    fn default_normalize_scales_by_the_highest_score() {
        let mut s = vec![0, 3, 8, 5];
        default_normalize(&mut s);
        // 100 * s / 8, truncated, as Go's integer division.
        assert_eq!(s, [0, 37, 100, 62]);
        let mut zero = vec![0, 0];
        default_normalize(&mut zero);
        assert_eq!(zero, [0, 0]);
    }
}
