//! The nodes of one claim shape in the order the search of a decision with claims tries them:
//! by the most each can score (its score plus the most its alignment can add there), kept
//! from one decision to the next and brought up to date from the nodes that changed since.
//!
//! Without it every decision reads every node's score and bound to find the few best; with
//! it a decision re-ranks the nodes changed since the last one of its shape (a bound pod, a
//! device taken, a search's verdict) and reads the best few off the top. What each node adds
//! to the message of a pod that fits nowhere is kept beside it the same way, so that message
//! too reads only the nodes changed since the last one.

use std::collections::{BTreeSet, HashMap};

use super::{Cluster, Config};
use crate::prepared::PreparedPod;

/// The ranked nodes of one claim shape.
#[derive(Debug, Default)]
pub(super) struct Ranking {
    /// Every node where the shape may fit, by its rank ([`rank_of`]): the most it can score,
    /// then its position in name order. Ranks are unique (they hold the position).
    ranked: BTreeSet<u128>,
    /// By slot: its rank in `ranked` (0: not ranked, it fits nowhere or is known to fail).
    rank: Vec<u128>,
    /// By slot: its score, where it has one.
    score: Vec<i64>,
    /// By slot: its position in name order, and by position its slot (the order is fixed
    /// while the ranking is kept: a node added or removed drops it).
    position: Vec<usize>,
    slot_at: Vec<usize>,
    /// What each node adds to the message of a pod of the shape that fits nowhere, kept as
    /// the nodes are: by slot, its [`Share`] (0: not known).
    share: Vec<u32>,
    /// Nodes per share.
    shares: HashMap<u32, usize>,
    /// Whether `share` holds every node but `unshared`.
    tallied: bool,
    /// Nodes whose share is to be found again (changed since it was found).
    pub(super) unshared: Vec<usize>,
}

/// A node's share of the message: the claims fail there because of their alignment
/// ([`Share::NUMA`]), otherwise ([`Share::OTHER`]), or the pod fails there without them
/// (`Share::PLAIN` + the interned set of its categories).
pub(super) struct Share;

impl Share {
    pub(super) const NUMA: u32 = 1;
    pub(super) const OTHER: u32 = 2;
    pub(super) const PLAIN: u32 = 3;
}

impl Ranking {
    /// The ranked nodes, best first, as (rank, position, slot, score).
    pub(super) fn best_first(&self) -> impl Iterator<Item = (u128, usize, usize, i64)> + '_ {
        self.ranked.iter().rev().filter_map(|&rank| {
            let position = position_of(rank);
            let slot = self.slot_at.get(position).copied()?;
            Some((rank, position, slot, self.score.get(slot).copied()?))
        })
    }

    /// Whether every node's share is known but those in `unshared`.
    pub(super) fn tallied(&self) -> bool {
        self.tallied
    }

    /// Starts a tally: every node's share is to be found.
    pub(super) fn reset_tally(&mut self) {
        self.share.fill(0);
        self.shares.clear();
        self.unshared.clear();
        self.tallied = false;
    }

    /// Marks the tally complete (every share known but `unshared`), or not: a tally not
    /// complete is started again by the next message.
    pub(super) fn set_tallied(&mut self, tallied: bool) {
        self.tallied = tallied;
    }

    /// The position of the node in `slot`, if it is in the order ranked.
    pub(super) fn position(&self, slot: usize) -> Option<usize> {
        self.position.get(slot).copied().filter(|&p| p != usize::MAX)
    }

    /// Records the share of the node in `slot` (0: not known).
    pub(super) fn share(&mut self, slot: usize, share: u32) {
        let Some(old) = self.share.get_mut(slot) else {
            return;
        };
        if *old != 0
            && let Some(n) = self.shares.get_mut(old)
        {
            *n = n.saturating_sub(1);
        }
        *old = share;
        if share != 0 {
            *self.shares.entry(share).or_default() += 1;
        }
    }

    /// Nodes per share.
    pub(super) fn shares(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.shares.iter().map(|(&s, &n)| (s, n)).filter(|&(_, n)| n > 0)
    }

    fn set(&mut self, slot: usize, rank: u128, score: i64) {
        match self.rank.get_mut(slot) {
            // A node re-ranked often keeps its rank (a verdict that its bound already said).
            Some(old) if *old == rank => {}
            Some(old) => {
                if *old != 0 {
                    self.ranked.remove(old);
                }
                *old = rank;
                if rank != 0 {
                    self.ranked.insert(rank);
                }
            }
            None if rank != 0 => {
                self.ranked.insert(rank);
            }
            None => {}
        }
        if let Some(s) = self.score.get_mut(slot) {
            *s = score;
        }
    }
}

impl Cluster {
    /// A ranking of the nodes for `prepared`, brought up to date: `kept` with the nodes in
    /// `changed` re-ranked, or, without one (a new shape, nodes added or removed, too many
    /// changes), rebuilt from every node's score. `bonus` is the most the alignment can add on
    /// a node, `None` where the claims are known not to fit. With `keep` (the pod's digest),
    /// the CPU predictions of the changed nodes re-judged are kept: the search tries those
    /// first.
    pub(super) fn synced_ranking(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        (kept, changed): (Option<Ranking>, Vec<usize>),
        bonus: &dyn Fn(usize) -> Option<i64>,
        keep: Option<u64>,
    ) -> Ranking {
        let rank = |score: Option<i64>, slot: usize, position: usize| match (score, bonus(slot)) {
            (Some(score), Some(bonus)) => rank_of(score.saturating_add(bonus), position),
            _ => 0,
        };
        match kept {
            Some(mut r) if r.rank.len() == self.slots.len() => {
                let mut changed = changed;
                changed.sort_unstable();
                changed.dedup();
                changed.retain(|&s| s < self.slots.len());
                for (&slot, score) in changed.iter().zip(self.scores_at(cfg, prepared, &changed, keep)) {
                    let position = r.position.get(slot).copied().unwrap_or(usize::MAX);
                    let at = if position == usize::MAX {
                        0
                    } else {
                        rank(score, slot, position)
                    };
                    r.set(slot, at, score.unwrap_or(0));
                }
                if r.tallied {
                    r.unshared.extend(changed);
                }
                r
            }
            _ => {
                let n = self.slots.len();
                let mut r = Ranking {
                    ranked: BTreeSet::new(),
                    rank: vec![0; n],
                    score: vec![0; n],
                    position: vec![usize::MAX; n],
                    slot_at: self.order.clone(),
                    share: vec![0; n],
                    shares: HashMap::new(),
                    tallied: false,
                    unshared: Vec::new(),
                };
                self.scan_scores(cfg, prepared, |position, slot, score| {
                    if let Some(p) = r.position.get_mut(slot) {
                        *p = position;
                    }
                    r.set(slot, rank(score, slot, position), score.unwrap_or(0));
                });
                r
            }
        }
    }
}

/// A node's rank in the search, as one integer: its bound, then its position in name order
/// (lower first); higher ranks are tried first.
pub(super) fn rank_of(bound: i64, position: usize) -> u128 {
    let bound = (i128::from(bound) - i128::from(i64::MIN)) as u128;
    (bound << 64) | u128::from(u64::MAX - position as u64)
}

/// The position a [`rank_of`] was made from.
pub(super) fn position_of(rank: u128) -> usize {
    (u64::MAX - (rank & u128::from(u64::MAX)) as u64) as usize
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{position_of, rank_of};
    use crate::{cluster::Cluster, dra::numa::DraNumaAlignment, model_config::Config, pod::PodSpec};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// Nodes `a` and `b` (2 NUMA nodes of 4 CPUs, single-numa-node), one GPU each.
    fn two_nodes_one_gpu_each() -> Cluster {
        let mut c = Cluster::default();
        c.dra.enable();
        c.dra.apply_class(from(json!({"metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}})));
        for name in ["a", "b"] {
            let amounts = json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
            c.apply_node(&from(json!({"metadata": {"name": name},
                "status": {"capacity": amounts, "allocatable": amounts}})))
                .unwrap();
            let zones: Vec<Value> = (0..2)
                .map(|z| {
                    json!({"name": format!("node-{z}"), "type": "Node",
                    "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]})
                })
                .collect();
            c.apply_nrt(&from(json!({"apiVersion": "topology.node.k8s.io/v1alpha2",
                "kind": "NodeResourceTopology", "metadata": {"name": name},
                "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
                "zones": zones})))
                .unwrap();
            c.dra
                .apply_slice(from(json!({"metadata": {"name": format!("{name}-gpu")},
                "spec": {"driver": "gpu.example.com", "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0"}]}})));
        }
        for claim in ["c1", "c2", "c3"] {
            c.dra.apply_claim(from(json!({"metadata": {"name": claim, "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}})));
        }
        c
    }

    fn pod(c: &mut Cluster, claim: &str) -> PodSpec {
        let r = json!({"cpu": "1", "memory": "1Gi"});
        let pod = from(
            json!({"metadata": {"name": format!("p-{claim}"), "namespace": "ns"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [{"name": "main", "resources": {"requests": r, "limits": r,
                    "claims": [{"name": "gpu"}]}}]}}),
        );
        PodSpec::from_pod(&mut c.res, &pod).unwrap()
    }

    #[test]
    fn a_node_whose_device_comes_back_is_ranked_again() {
        for mode in [DraNumaAlignment::Ignore, DraNumaAlignment::Required] {
            let mut cfg = Config::default();
            cfg.dra_numa.alignment = mode;
            let mut c = two_nodes_one_gpu_each();
            let mut first_node = None;
            for claim in ["c1", "c2"] {
                let spec = pod(&mut c, claim);
                let (decision, outcome) = c.decide_with_claims(&cfg, &spec);
                assert!(decision.node.is_some(), "{mode:?} {claim}: {}", decision.message);
                first_node = first_node.or(decision.node.clone());
                c.assume(&spec, &decision);
                c.commit_claims(&spec, &outcome.claims);
            }
            // Both GPUs taken: the third fits nowhere, and both nodes are known to fail.
            let third = pod(&mut c, "c3");
            assert_eq!(c.decide_with_claims(&cfg, &third).0.node, None, "{mode:?}");
            // The first claim goes, its GPU with it: its node fits again, though nothing else
            // of it changed.
            c.dra.delete_claim("ns", "c1");
            assert_eq!(c.decide_with_claims(&cfg, &third).0.node, first_node, "{mode:?}");
        }
    }

    #[test]
    fn ranks_order_by_bound_then_by_name_order() {
        assert!(rank_of(10, 5) > rank_of(9, 0));
        assert!(rank_of(10, 1) > rank_of(10, 2));
        assert!(rank_of(i64::MIN, 0) > rank_of(i64::MIN, 1));
        assert!(rank_of(i64::MAX, usize::MAX >> 1) > rank_of(i64::MAX - 1, 0));
        // Every rank is above 0, the search's "nothing kept".
        assert!(rank_of(i64::MIN, u64::MAX as usize - 1) > 0);
        for (bound, position) in [(0, 0), (-7, 3), (100, 4999), (i64::MAX, 17)] {
            assert_eq!(position_of(rank_of(bound, position)), position);
        }
    }
}
