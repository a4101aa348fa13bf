//! The decision path of pods that kube-scheduler's inter-pod, spread, port or volume plugins
//! concern: node fit and the NUMA verdicts as every pod gets them (cached when not explained),
//! then [`crate::constraints`]' filters on the nodes that pass, its scores added over those that
//! still do, and the best node as usual. Other pods never come here.
//!
//! A child module of `cluster` so that it reads the index's private scan helpers; the rest of
//! the index reaches it only through the index events and one call at the top of
//! `schedule_prepared` and `decide`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;

use super::{Cluster, Config, Decision, NodeVerdict, aggregate_message};
use crate::{
    cache::ShapeKey,
    constraints::{ConstraintIndex, SpreadDefaults},
    node::NodeBasics,
    prepared::PreparedPod,
};

impl Cluster {
    /// The constraint index (pods' facts, node labels, Namespaces).
    pub fn constraint_index(&self) -> &ConstraintIndex {
        &self.constraints
    }

    /// Sets kube-scheduler's `defaultConstraints` for pods without spread constraints.
    pub fn set_spread_defaults(&mut self, defaults: SpreadDefaults) {
        self.constraints.set_defaults(defaults);
    }

    /// Adds or replaces a Namespace (its labels, for `namespaceSelector`).
    pub fn apply_namespace(&mut self, ns: &Namespace) {
        if let Some(name) = ns.metadata.name.as_deref() {
            self.constraints
                .set_namespace(name, ns.metadata.labels.clone().unwrap_or_default());
        }
    }

    /// Removes a Namespace.
    pub fn delete_namespace(&mut self, name: &str) {
        self.constraints.delete_namespace(name);
    }

    /// Replaces every Namespace (the watch relisted).
    pub fn reset_namespaces(&mut self, all: &[Namespace]) {
        self.constraints.reset_namespaces(all.iter().filter_map(|n| {
            let labels: BTreeMap<String, String> = n.metadata.labels.clone().unwrap_or_default();
            n.metadata.name.clone().map(|name| (name, labels))
        }));
    }

    /// The decision for a pod the constraint plugins concern; `None` for any other pod (the
    /// caller's usual path decides it). With `explain`, every node's verdict with reasons;
    /// without, cached verdicts, and the explained decision when no node fits.
    pub(super) fn schedule_constrained(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        explain: bool,
    ) -> Option<Decision> {
        let cons = self
            .constraints
            .prepare(&prepared.spec.facts, || self.nodes().collect())?;
        let nodes: Vec<&NodeBasics> = self.nodes().collect();
        if !explain {
            return Some(self.constrained_quick(cfg, prepared, &cons, &nodes));
        }
        let mut verdicts: Vec<NodeVerdict> = nodes
            .iter()
            .map(|n| self.evaluate(cfg, prepared, n, true))
            .collect();
        for (v, n) in verdicts.iter_mut().zip(&nodes) {
            let Some(f) = cons.check(n) else { continue };
            // kube-scheduler reports a node under its first failing plugin: the constraint's
            // reason replaces a later plugin's (NodePorts runs before NodeResourcesFit, the
            // volume plugins and the NUMA filter), and a node that passed fails with it.
            if v.feasible || v.filter.is_none_or(|earlier| f.filter < earlier) {
                v.feasible = false;
                v.score = None;
                v.filter = Some(f.filter);
                v.categories = vec![f.category];
                v.reasons = vec![f.message];
            }
        }
        let feasible: Vec<usize> = (0..verdicts.len()).filter(|&i| verdicts[i].feasible).collect();
        let feasible_nodes: Vec<&NodeBasics> = feasible.iter().map(|&i| nodes[i]).collect();
        for (&i, extra) in feasible.iter().zip(cons.scores(&feasible_nodes, &nodes)) {
            verdicts[i].score = verdicts[i].score.map(|s| s.saturating_add(extra));
        }
        let best = verdicts
            .iter()
            .filter(|v| v.feasible)
            .max_by(|a, b| a.score.cmp(&b.score).then_with(|| b.node.cmp(&a.node)))
            .map(|v| (v.node.clone(), v.score.unwrap_or(0)));
        let pod = prepared.spec.key();
        Some(match best {
            None => Decision {
                pod,
                node: None,
                message: aggregate_message(&verdicts),
                placement: None,
                allocation: None,
                nodes: verdicts,
            },
            Some((node, _)) => {
                let (placement, allocation) = self.placement_on(prepared, &node);
                Decision {
                    message: format!("Successfully assigned {pod} to {node}"),
                    pod,
                    node: Some(node),
                    placement,
                    allocation,
                    nodes: verdicts,
                }
            }
        })
    }

    /// [`Self::schedule_constrained`] without explanations: the cached verdicts, the
    /// constraints on the nodes that pass, and the explained decision when none does.
    fn constrained_quick(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        cons: &crate::constraints::PodConstraints<'_>,
        nodes: &[&NodeBasics],
    ) -> Decision {
        let mut scores: Vec<Option<i64>> = self.with_cache(|shapes| match shapes {
            Some(shapes) => {
                self.best_cached(cfg, prepared, shapes);
                let entries = shapes.entries(ShapeKey::of(cfg, prepared.spec), self.slots.len());
                self.order.iter().map(|&s| entries[s].score).collect()
            }
            None => self.judge_slots(cfg, prepared, &self.order),
        });
        if !cons.scored() {
            // No score plugin: the best node by the NUMA score that passes the filters, found
            // by checking the nodes best first (a heap, not a check of every node).
            let mut heap: std::collections::BinaryHeap<(i64, std::cmp::Reverse<usize>)> = scores
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.map(|s| (s, std::cmp::Reverse(i))))
                .collect();
            while let Some((score, std::cmp::Reverse(i))) = heap.pop() {
                if cons.check(nodes[i]).is_none() {
                    return self.decision_on(prepared, nodes[i].name.clone(), score);
                }
            }
            return self.schedule_prepared(cfg, prepared, true);
        }
        for (score, n) in scores.iter_mut().zip(nodes) {
            if score.is_some() && cons.check(n).is_some() {
                *score = None;
            }
        }
        let feasible: Vec<usize> = (0..scores.len()).filter(|&i| scores[i].is_some()).collect();
        let feasible_nodes: Vec<&NodeBasics> = feasible.iter().map(|&i| nodes[i]).collect();
        for (&i, extra) in feasible.iter().zip(cons.scores(&feasible_nodes, nodes)) {
            scores[i] = scores[i].map(|s| s.saturating_add(extra));
        }
        // Highest score, then the lowest name (nodes are in name order).
        let mut best: Option<(usize, i64)> = None;
        for &i in &feasible {
            let s = scores[i].unwrap_or(0);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((i, s));
            }
        }
        match best {
            Some((i, score)) => self.decision_on(prepared, nodes[i].name.clone(), score),
            // No node fits: the explained decision says why.
            None => self.schedule_prepared(cfg, prepared, true),
        }
    }
}
