//! The search of a decision with claims: nodes ranked by their score and the most their
//! alignment can add, tried best first, and the message of a pod that fits nowhere built from
//! what is known of every node.

use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::{
    super::{Config, Decision, TopologyState},
    CATEGORY, ClaimsOutcome, Explain, NUMA_CATEGORY, Step, Tried,
};
use crate::{
    cluster::{
        Cluster,
        claims_cache::{BOUND_FAILED, BOUND_UNKNOWN, Known, ShapeView},
        ranking::{Ranking, Share, position_of, rank_of},
    },
    dra::{
        numa::{DraNumaAlignment, MAX_BONUS},
        state::{ClaimAllocation, ResolvedClaims},
    },
    pod::PodSpec,
    prepared::PreparedPod,
    topology_manager::Policy,
};

impl Cluster {
    /// The search half of [`Self::schedule_claims`]: the best node where the claims fit, or
    /// (no node fits) the decision that says why, built from the searches made and the nodes
    /// known to fail (`cache`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn search_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        tried: Tried,
        share: &dyn Fn(usize, usize) -> String,
        explain: Explain,
        mut cache: Option<&mut ShapeView<'_>>,
    ) -> (Decision, ClaimsOutcome) {
        let pod = prepared.spec;
        // Nodes are tried best first by their score plus the most the alignment can add
        // there (MAX_BONUS on a node with a Topology Manager policy, the known bonus where the
        // claims are known to fit), until no node left can beat the best found; nodes known
        // to fail are not tried. Without alignment (Ignore, no container naming a claim) the
        // bound is the score, so the first node that fits wins.
        let aligns = cfg.dra_numa.alignment != DraNumaAlignment::Ignore
            && pod
                .init_containers
                .iter()
                .chain(&pod.containers)
                .any(|c| !c.claims.is_empty());
        let most = if aligns { MAX_BONUS } else { 0 };
        // With the cache, the nodes ranked as the last decision of this shape left them, those
        // changed since re-ranked: each round reads its best candidates off the top instead of
        // reading every node. Given back once the decision is made.
        let keep = if aligns { resolved.pod_digest } else { None };
        let mut ranking = cache.as_deref_mut().map(|c| {
            let taken = c.take_ranking();
            let bounds = c.bounds();
            let bonus = |slot: usize| match bounds.get(slot).copied().unwrap_or(BOUND_UNKNOWN) {
                BOUND_FAILED => None,
                BOUND_UNKNOWN => Some(most),
                known => Some(i64::from(known)),
            };
            self.synced_ranking(cfg, prepared, taken, &bonus, keep)
        });
        let decided = self.search_ranked(
            cfg,
            prepared,
            resolved,
            tried,
            share,
            explain,
            cache.as_deref_mut(),
            ranking.as_mut(),
            aligns,
        );
        if let (Some(c), Some(r)) = (cache, ranking) {
            c.put_ranking(r);
        }
        decided
    }

    /// [`Self::search_claims`] with the ranking of the shape, when there is one.
    #[allow(clippy::too_many_arguments)]
    fn search_ranked(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        mut tried: Tried,
        share: &dyn Fn(usize, usize) -> String,
        explain: Explain,
        mut cache: Option<&mut ShapeView<'_>>,
        ranking: Option<&mut Ranking>,
        aligns: bool,
    ) -> (Decision, ClaimsOutcome) {
        let pod = prepared.spec;
        // A topology lookup per node per pod was most of a DRA pod's decision time: looked
        // up only when alignment can add to the score, and remembered by the cache.
        let potential = |slot: usize| {
            let aligned_policy = aligns
                && self.slots.get(slot).and_then(Option::as_ref).is_some_and(
                    |n| matches!(self.topology(&n.name), TopologyState::Valid(t) if t.policy != Policy::None),
                );
            if aligned_policy { MAX_BONUS } else { 0 }
        };
        let beats = |rank: u128, best: &Option<(i64, usize, Vec<ClaimAllocation>)>| {
            best.as_ref()
                .is_none_or(|(total, at, _)| rank > rank_of(*total, *at))
        };
        let mut best: Option<(i64, usize, Vec<ClaimAllocation>)> = None;
        // Positions tried in this decision that did not fail (or failed on an invalid pool).
        let mut done: Vec<usize> = Vec::new();
        // Positions whose attempt was deferred ([`Step::Ranked`]).
        let mut deferred: Vec<usize> = Vec::new();
        // Each round scans every node once and keeps the `keep` best candidates, so a decision
        // where the first few nodes settle it costs one pass and no sort; a round that runs out
        // of candidates before settling scans again for more (ever more).
        let mut keep = 8usize;
        let most = if aligns { MAX_BONUS } else { 0 };
        loop {
            // Without a ranking, a copy of the cache's bound of each node: the pass reads it
            // beside the scores.
            let bounds = match (ranking.as_deref(), cache.as_ref()) {
                (None, Some(c)) => c.bounds().to_vec(),
                _ => Vec::new(),
            };
            let mut pass = Pass {
                top: BinaryHeap::with_capacity(keep + 1),
                keep,
                threshold: 0,
                beyond: 0,
                tried: &tried,
                done: &done,
                cache: cache.as_deref_mut(),
                potential: &potential,
            };
            if let Some(r) = ranking.as_deref() {
                // Best first: once one cannot make the kept ones, none after it can.
                for (rank, position, slot, score) in r.best_first() {
                    if rank <= pass.threshold {
                        pass.beyond = pass.beyond.max(rank);
                        break;
                    }
                    pass.consider(position, slot, score);
                }
            } else {
                self.scan_scores(cfg, prepared, |position, slot, score| {
                    let Some(score) = score else { return };
                    // A node that cannot make the kept ones even with the most its alignment can
                    // add is passed over without looking it up: most nodes, once `keep` are kept,
                    // so this test is all the pass does for them (the rest is out of line).
                    let bonus = match bounds.get(slot).copied().unwrap_or(BOUND_UNKNOWN) {
                        BOUND_FAILED => return,
                        BOUND_UNKNOWN => most,
                        known => i64::from(known),
                    };
                    let upper = rank_of(score.saturating_add(bonus), position);
                    if upper <= pass.threshold {
                        pass.beyond = pass.beyond.max(upper);
                        return;
                    }
                    pass.consider(position, slot, score);
                });
            }
            let Pass { top, beyond, .. } = pass;
            let mut settled = false;
            // Best first; a node deferred goes back in at the score its misaligned allocation
            // would get, tried again when that is still the best left.
            let mut queue: BinaryHeap<(u128, i64, usize)> =
                top.into_iter().map(|std::cmp::Reverse(c)| c).collect();
            while let Some((rank, score, slot)) = queue.pop() {
                if !beats(rank, &best) {
                    settled = true;
                    break;
                }
                if rank <= beyond {
                    // A node not kept may rank above it: the next round finds it.
                    break;
                }
                let position = position_of(rank);
                let Some(Some(n)) = self.slots.get(slot) else {
                    continue;
                };
                // Where its alignment can add nothing (its bound is its score: deferred once,
                // or known to fit only misaligned), nothing is deferred.
                let step = if rank == rank_of(score, position) || deferred.contains(&position) {
                    Step::Search
                } else {
                    Step::Ranked
                };
                let Some(attempt) = self
                    .try_claims_at(cfg, prepared, resolved, self.on(n), share, step)
                    .transpose()
                else {
                    if let Some(c) = cache.as_mut() {
                        c.only_misaligned(slot);
                    }
                    deferred.push(position);
                    queue.push((rank_of(score, position), score, slot));
                    continue;
                };
                match attempt {
                    Ok(Ok((claims, bonus))) => {
                        if let Some(c) = cache.as_mut() {
                            c.fits(slot, bonus);
                        }
                        done.push(position);
                        let total = score.saturating_add(bonus);
                        if beats(rank_of(total, position), &best) {
                            best = Some((total, position, claims));
                        }
                    }
                    Ok(Err(not_here)) => {
                        if let Some(c) = cache.as_mut() {
                            c.failed(slot, not_here.as_ref());
                        }
                        tried.insert(position, Err(not_here));
                    }
                    Err(e) if e.is_node_error() => done.push(position),
                    Err(e) => return self.claims_failed(pod, n, e),
                }
            }
            if settled || beyond == 0 || !beats(beyond, &best) {
                break;
            }
            keep = keep.saturating_mul(8);
        }
        if let Some((total, i, claims)) = best
            && let Some((_, n)) = self.at_position(i)
        {
            return (
                self.decision_on(prepared, n.name.clone(), total),
                ClaimsOutcome { claims, error: None },
            );
        }
        // No node fits: say why.
        if explain == Explain::Message
            && let Some(found) = self.claims_failure_message(
                cfg,
                prepared,
                resolved,
                &mut tried,
                share,
                cache.as_deref_mut(),
                ranking,
            )
        {
            return found;
        }
        self.claims_explained(cfg, prepared, resolved, None, tried, share, cache)
    }

    /// The decision for a pod whose claims fit on no node, with only its aggregate message
    /// (no per-node verdicts), from the plain path's cached categories and the claims'
    /// verdicts already known. `None` when the message cannot be built that way (the plain
    /// cache is in use elsewhere, or a node turns out to fit after all): the caller explains
    /// every node instead.
    #[allow(clippy::too_many_arguments)]
    fn claims_failure_message(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        tried: &mut Tried,
        share: &dyn Fn(usize, usize) -> String,
        mut cache: Option<&mut ShapeView<'_>>,
        ranking: Option<&mut Ranking>,
    ) -> Option<(Decision, ClaimsOutcome)> {
        let pod = prepared.spec;
        if let (Some(c), Some(r)) = (cache.as_deref_mut(), ranking) {
            return self.tallied_failure_message(cfg, prepared, resolved, tried, share, c, r);
        }
        let scores = self.cached_scores(cfg, prepared);
        let mut counts =
            self.with_cache(|shapes| Some(self.cached_failure_counts(cfg, prepared, shapes?)))?;
        // Nodes the claims fail on: because of the alignment, and otherwise.
        let (mut numa, mut other) = (0usize, 0usize);
        // The attempts of this decision, walked beside the nodes in position order (a lookup
        // per node was a tenth of an unplaced pod's time); what is not consumed goes back.
        let mut attempts = std::mem::take(tried).into_iter().peekable();
        for (i, score) in scores.iter().enumerate() {
            if score.is_none() {
                continue;
            }
            while let Some(skipped) = attempts.next_if(|(p, _)| *p < i) {
                tried.insert(skipped.0, skipped.1);
            }
            let here = attempts.next_if(|(p, _)| *p == i).map(|(_, a)| a);
            let Some(&slot) = self.order.get(i) else {
                continue;
            };
            match self.node_share(
                cfg,
                prepared,
                resolved,
                share,
                cache.as_deref_mut(),
                tried,
                (i, slot),
                here,
            ) {
                NodeShare::Numa => numa += 1,
                NodeShare::Other | NodeShare::NodeError => other += 1,
                NodeShare::Gone => {}
                NodeShare::FitsAfterAll => {
                    tried.extend(attempts);
                    return None;
                }
                NodeShare::Failed(failed) => return Some(*failed),
            }
        }
        tried.extend(attempts);
        for (category, n) in [(NUMA_CATEGORY, numa), (CATEGORY, other)] {
            if n > 0 {
                *counts.entry(category.to_owned()).or_default() += n;
            }
        }
        Some(self.nowhere(pod, &counts))
    }

    /// The decision for `pod` placed nowhere, with the nodes per category.
    fn nowhere(&self, pod: &PodSpec, counts: &BTreeMap<String, usize>) -> (Decision, ClaimsOutcome) {
        let counts: BTreeMap<&str, usize> = counts.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        (
            Decision {
                pod: pod.key(),
                node: None,
                message: crate::cluster::format_aggregate(0, self.order.len(), &counts),
                placement: None,
                allocation: None,
                nodes: Vec::new(),
            },
            ClaimsOutcome::default(),
        )
    }

    /// [`Self::claims_failure_message`] from the shares of the nodes kept with the shape's
    /// ranking: only the nodes changed since the last such message (and those tried in this
    /// decision) are looked at again, where the plain path reads every node.
    #[allow(clippy::too_many_arguments)]
    fn tallied_failure_message(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        tried: &mut Tried,
        share: &dyn Fn(usize, usize) -> String,
        cache: &mut ShapeView<'_>,
        r: &mut Ranking,
    ) -> Option<(Decision, ClaimsOutcome)> {
        let pod = prepared.spec;
        let mut slots: Vec<usize> = if r.tallied() {
            let mut slots = std::mem::take(&mut r.unshared);
            slots.extend_from_slice(cache.changed_now());
            slots.extend(tried.keys().filter_map(|&p| self.order.get(p).copied()));
            slots.sort_unstable();
            slots.dedup();
            slots
        } else {
            r.reset_tally();
            self.order.clone()
        };
        slots.retain(|&s| r.position(s).is_some());
        // Until every share below is found, the tally is not complete.
        r.set_tallied(false);
        let scores = self.scores_at(cfg, prepared, &slots, None);
        let infeasible: Vec<usize> = slots
            .iter()
            .zip(&scores)
            .filter(|(_, s)| s.is_none())
            .map(|(&s, _)| s)
            .collect();
        for (&slot, id) in infeasible
            .iter()
            .zip(self.failure_ids(cfg, prepared, &infeasible)?)
        {
            r.share(slot, Share::PLAIN.saturating_add(id));
        }
        // Nodes with an invalid pool are asked again every time, as without the tally.
        let mut again = Vec::new();
        for (&slot, score) in slots.iter().zip(&scores) {
            if score.is_none() {
                continue;
            }
            let Some(position) = r.position(slot) else {
                continue;
            };
            let here = tried.remove(&position);
            let found = self.node_share(
                cfg,
                prepared,
                resolved,
                share,
                Some(&mut *cache),
                tried,
                (position, slot),
                here,
            );
            match found {
                NodeShare::Numa => r.share(slot, Share::NUMA),
                NodeShare::Other => r.share(slot, Share::OTHER),
                NodeShare::NodeError => {
                    r.share(slot, Share::OTHER);
                    again.push(slot);
                }
                NodeShare::Gone => r.share(slot, 0),
                NodeShare::FitsAfterAll => return None,
                NodeShare::Failed(failed) => return Some(*failed),
            }
        }
        let shares: Vec<(u32, usize)> = r.shares().collect();
        let plain: Vec<u32> = shares
            .iter()
            .filter_map(|&(s, _)| s.checked_sub(Share::PLAIN))
            .collect();
        let categories = self.failure_categories(&plain)?;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut plain_categories = plain.iter().zip(categories).collect::<HashMap<_, _>>();
        for (s, n) in shares {
            let names = match s {
                Share::NUMA => vec![NUMA_CATEGORY.to_owned()],
                Share::OTHER => vec![CATEGORY.to_owned()],
                s => plain_categories.remove(&(s - Share::PLAIN)).unwrap_or_default(),
            };
            for c in names {
                *counts.entry(c).or_default() += n;
            }
        }
        r.set_tallied(true);
        r.unshared = again;
        Some(self.nowhere(pod, &counts))
    }

    /// What the node at `position` adds to the message of the pod (its plain verdict holds
    /// there): from the attempt of this decision (`here`) or what the cache knows, or an
    /// explanation searched now and remembered.
    #[allow(clippy::too_many_arguments)]
    fn node_share(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        share: &dyn Fn(usize, usize) -> String,
        mut cache: Option<&mut ShapeView<'_>>,
        tried: &mut Tried,
        (position, slot): (usize, usize),
        here: Option<super::Attempt>,
    ) -> NodeShare {
        let known = cache.as_ref().map_or(Known::Nothing, |c| c.known(slot));
        if here.is_none()
            && let Known::Explained(not_here) = known
        {
            // From the cache: nothing is searched or copied.
            return NodeShare::of(not_here);
        }
        // Its basics (a cache miss each) are read only to explain it.
        let Some((_, n)) = self.at_position(position) else {
            if let Some(a) = here {
                tried.insert(position, a);
            }
            return NodeShare::Gone;
        };
        match self.explain_attempt(cfg, prepared, resolved, n, share, here, known) {
            Ok(Ok(found)) => {
                // Fits after all (an unaligned allocation where nothing is required).
                tried.insert(position, Ok(found));
                NodeShare::FitsAfterAll
            }
            Ok(Err(not_here)) => {
                if let Some(c) = cache.as_mut() {
                    c.failed(slot, Some(&not_here));
                }
                let found = NodeShare::of(&not_here);
                tried.insert(position, Err(Some(not_here)));
                found
            }
            Err(e) if e.is_node_error() => NodeShare::NodeError,
            Err(e) => NodeShare::Failed(Box::new(self.claims_failed(prepared.spec, n, e))),
        }
    }
}

/// What a node adds to the message of a pod that fits nowhere.
enum NodeShare {
    /// The claims fail there because of their alignment.
    Numa,
    /// They fail there otherwise.
    Other,
    /// A pool there is invalid (asked again every time).
    NodeError,
    /// The node is gone.
    Gone,
    /// They fit there after all: the message is not the decision.
    FitsAfterAll,
    /// The attempt failed with an error: this decision.
    Failed(Box<(Decision, ClaimsOutcome)>),
}

impl NodeShare {
    fn of(not_here: &crate::dra::numa::NotHere) -> Self {
        if not_here.alignment {
            NodeShare::Numa
        } else {
            NodeShare::Other
        }
    }
}

/// One ranked pass over the nodes: the `keep` best candidates and the best rank of one not
/// kept.
struct Pass<'p, 'v> {
    top: BinaryHeap<std::cmp::Reverse<(u128, i64, usize)>>,
    keep: usize,
    /// The worst rank kept once `keep` are kept (0 ranks below every node).
    threshold: u128,
    /// The best rank of a candidate not kept (0: none).
    beyond: u128,
    tried: &'p Tried,
    done: &'p [usize],
    cache: Option<&'p mut ShapeView<'v>>,
    potential: &'p dyn Fn(usize) -> i64,
}

impl Pass<'_, '_> {
    /// A node that may make the kept ones: its bound looked up, kept if it does.
    #[inline(never)]
    fn consider(&mut self, position: usize, slot: usize, score: i64) {
        if self.tried.contains_key(&position) || self.done.contains(&position) {
            return;
        }
        let potential = self.potential;
        let bonus = match self.cache.as_mut() {
            Some(c) => match c.bonus_bound(slot, || potential(slot)) {
                Some(b) => b,
                None => return,
            },
            None => potential(slot),
        };
        let rank = rank_of(score.saturating_add(bonus), position);
        if rank <= self.threshold {
            self.beyond = self.beyond.max(rank);
            return;
        }
        self.top.push(std::cmp::Reverse((rank, score, slot)));
        if self.top.len() > self.keep
            && let Some(std::cmp::Reverse((dropped, _, _))) = self.top.pop()
        {
            self.beyond = self.beyond.max(dropped);
        }
        if self.top.len() == self.keep
            && let Some(std::cmp::Reverse((worst, _, _))) = self.top.peek()
        {
            self.threshold = *worst;
        }
    }
}
