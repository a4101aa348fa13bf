//! Per-shape verdict reuse: unexplained scheduling judges each node once per pod shape and
//! reuses the verdict until the node changes (`cache.rs`); parallel judging for large clusters.

use super::*;
use crate::{
    admission::{self, WorkingZones},
    cache::{Entry, ShapeKey, Shapes, UNKNOWN_FAILURE},
    fit,
    node::NodeBasics,
    prepared::PreparedPod,
};
use std::sync::{OnceLock, TryLockError};

/// Below this many nodes to evaluate, a second thread costs more than it saves.
pub(super) const PARALLEL_MIN: usize = 64;

/// Available cores, asked once: the query reads cgroup files, too slow for every pod.
pub(super) fn parallelism() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

impl Cluster {
    // === scheduling ===

    /// The verdict of `pod` on one node without messages (what the cache holds): the score
    /// when feasible. The checks of [`Self::evaluate`] and [`Self::topology_verdict_into`],
    /// with `w` as reusable working space.
    pub(super) fn judge(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        basics: &NodeBasics,
        w: &mut WorkingZones,
        keep: Option<(usize, u64)>,
    ) -> Option<i64> {
        if !fit::fits(&self.res, basics, pod.spec, &pod.fit_request) {
            return None;
        }
        if !pod.volumes.admits(&basics.name, &basics.labels) {
            return None;
        }
        match self.topology(&basics.name) {
            TopologyState::Missing => (cfg.no_topology != NoTopology::Reject)
                .then(|| cfg.scorer.score_prepared(&self.res, None, pod)),
            TopologyState::Invalid { .. } => None,
            TopologyState::Valid(topo) => {
                w.reset_from(topo);
                let admitted = match keep {
                    // The search with claims predicts the node next: the prediction made
                    // here is kept for it (the same run; only the recording differs).
                    Some((slot, digest)) => match admission::predict_prepared(&self.res, topo, w, pod) {
                        Ok(placement) => {
                            let generation = self.generations.get(slot).copied().unwrap_or(0);
                            self.predictions.put(slot, generation, digest, placement);
                            true
                        }
                        Err(_) => false,
                    },
                    None => admission::admits_prepared(&self.res, topo, w, pod),
                };
                admitted.then(|| cfg.scorer.score_prepared(&self.res, Some(topo), pod))
            }
        }
    }

    /// [`Self::judge`] for each slot of `slots`, on two threads when there are many.
    pub(super) fn judge_slots(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        slots: &[usize],
    ) -> Vec<Option<i64>> {
        self.judge_slots_keeping(cfg, pod, slots, None)
    }

    /// [`Self::judge_slots`]; with `keep` (the pod's digest), each node's CPU prediction is
    /// kept for the search with claims that tries it next.
    fn judge_slots_keeping(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        slots: &[usize],
        keep: Option<u64>,
    ) -> Vec<Option<i64>> {
        let run = |part: &[usize]| -> Vec<Option<i64>> {
            let mut w = WorkingZones::default();
            part.iter()
                .map(|&s| {
                    self.slots[s]
                        .as_ref()
                        .and_then(|n| self.judge(cfg, pod, n, &mut w, keep.map(|d| (s, d))))
                })
                .collect()
        };
        if slots.len() < PARALLEL_MIN || parallelism() < 2 {
            return run(slots);
        }
        let (first, second) = slots.split_at(slots.len() / 2);
        std::thread::scope(|scope| {
            let other = scope.spawn(|| run(second));
            let mut out = run(first);
            // A panicking helper is re-run here, so its panic surfaces on this thread.
            out.extend(other.join().unwrap_or_else(|_| run(second)));
            out
        })
    }

    /// Filters and scores every node (no sampling) through the verdict cache, re-evaluating
    /// the nodes changed since their entry was made, and returns the best slot and score:
    /// highest score, then lowest name.
    pub(super) fn best_cached(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        shapes: &mut Shapes,
    ) -> Option<(usize, i64)> {
        let mut best: Option<(i64, usize)> = None;
        self.visit_cached(cfg, pod, shapes, |position, _, score| {
            if let Some(score) = score
                && best.is_none_or(|(b, p)| score > b || (score == b && position < p))
            {
                best = Some((score, position));
            }
        });
        best.map(|(score, position)| (self.order[position], score))
    }

    /// Calls `visit(position, slot, score)` once for every node with its verdict (the score
    /// when feasible) through the verdict cache, re-evaluating the nodes changed since their
    /// entry was made: the valid entries first in name order, then the re-evaluated ones.
    /// One pass, so a caller that ranks nodes adds no pass of its own.
    pub(super) fn visit_cached(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        shapes: &mut Shapes,
        mut visit: impl FnMut(usize, usize, Option<i64>),
    ) {
        let entries = shapes.entries(ShapeKey::of_prepared(cfg, pod), self.slots.len());
        let (mut stale, mut positions) = (Vec::new(), Vec::new());
        for (position, &slot) in self.order.iter().enumerate() {
            let entry = entries[slot];
            if entry.generation == self.generations[slot] {
                visit(position, slot, entry.score);
            } else {
                stale.push(slot);
                positions.push(position);
            }
        }
        let fresh = self.judge_slots(cfg, pod, &stale);
        for ((&slot, &position), score) in stale.iter().zip(&positions).zip(fresh) {
            entries[slot] = Entry {
                generation: self.generations[slot],
                score,
                failure: UNKNOWN_FAILURE,
            };
            visit(position, slot, score);
        }
    }

    /// [`Self::visit_cached`], or without the cache when another thread holds it.
    pub(super) fn scan_scores(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        mut visit: impl FnMut(usize, usize, Option<i64>),
    ) {
        self.with_cache(|shapes| match shapes {
            Some(shapes) => self.visit_cached(cfg, pod, shapes, visit),
            None => {
                let scores = self.judge_slots(cfg, pod, &self.order);
                for ((position, &slot), score) in self.order.iter().enumerate().zip(scores) {
                    visit(position, slot, score);
                }
            }
        });
    }

    /// The scores of `slots` (as [`Self::judge`] gives them), from the verdict cache where
    /// its entries are valid, the others judged and remembered; with `keep`, as
    /// [`Self::judge_slots_keeping`].
    pub(super) fn scores_at(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        slots: &[usize],
        keep: Option<u64>,
    ) -> Vec<Option<i64>> {
        self.with_cache(|shapes| {
            let Some(shapes) = shapes else {
                return self.judge_slots_keeping(cfg, pod, slots, keep);
            };
            let entries = shapes.entries(ShapeKey::of_prepared(cfg, pod), self.slots.len());
            let valid = |s: usize| entries.get(s).map(|e| e.generation) == self.generations.get(s).copied();
            let stale: Vec<usize> = slots.iter().copied().filter(|&s| !valid(s)).collect();
            for (&slot, score) in stale.iter().zip(self.judge_slots_keeping(cfg, pod, &stale, keep)) {
                if let (Some(e), Some(&generation)) = (entries.get_mut(slot), self.generations.get(slot)) {
                    *e = Entry {
                        generation,
                        score,
                        failure: UNKNOWN_FAILURE,
                    };
                }
            }
            slots
                .iter()
                .map(|&s| entries.get(s).and_then(|e| e.score))
                .collect()
        })
    }

    /// [`Self::best_cached`] without the cache (when another thread holds it).
    pub(super) fn best_uncached(&self, cfg: &Config, pod: &PreparedPod<'_>) -> Option<(usize, i64)> {
        let mut best: Option<(usize, i64)> = None;
        for (&slot, score) in self.order.iter().zip(self.judge_slots(cfg, pod, &self.order)) {
            if let Some(score) = score
                && best.is_none_or(|(_, b)| score > b)
            {
                best = Some((slot, score));
            }
        }
        best
    }

    /// The best node's slot and score: from the verdict cache, or without it when another
    /// thread holds it.
    pub(super) fn best_node(&self, cfg: &Config, pod: &PreparedPod<'_>) -> Option<(usize, i64)> {
        self.with_cache(|shapes| match shapes {
            Some(shapes) => self.best_cached(cfg, pod, shapes),
            None => self.best_uncached(cfg, pod),
        })
    }

    /// Runs `f` with the verdict cache, or with `None` when another thread is using it.
    pub(super) fn with_cache<T>(&self, f: impl FnOnce(Option<&mut Shapes>) -> T) -> T {
        match self.verdicts.0.try_lock() {
            Ok(mut shapes) => f(Some(&mut shapes)),
            Err(TryLockError::Poisoned(p)) => {
                // A panic mid-scan may have left entries half written: start over.
                let mut shapes = p.into_inner();
                *shapes = Shapes::default();
                self.verdicts.0.clear_poison();
                f(Some(&mut shapes))
            }
            Err(TryLockError::WouldBlock) => f(None),
        }
    }
}
