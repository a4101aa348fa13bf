//! The decision path of pods that kube-scheduler's inter-pod, spread, port or volume plugins
//! concern: node fit and the NUMA verdicts as every pod gets them (cached when not explained),
//! then [`crate::constraints`]' filters on the nodes that pass, its scores added over those that
//! still do, and the best node as usual. Other pods never come here.
//!
//! A child module of `cluster` so that it reads the index's private scan helpers; its only
//! hooks in `cluster.rs` are the index events and one call at the top of `schedule_prepared`
//! and `decide`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;

use super::{Cluster, Config, Decision, NodeVerdict, aggregate_message};
use crate::{
    cache::ShapeKey,
    constraints::{ConstraintIndex, SpreadDefaults},
    fit::NodeBasics,
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
        let nodes: Vec<&NodeBasics> = self.nodes().collect();
        let cons = self.constraints.prepare(&prepared.spec.facts, &nodes)?;
        let mut verdicts: Vec<NodeVerdict> = if explain {
            nodes
                .iter()
                .map(|n| self.evaluate(cfg, prepared, n, true))
                .collect()
        } else {
            let scores: Vec<Option<i64>> = self.with_cache(|shapes| match shapes {
                Some(shapes) => {
                    self.best_cached(cfg, prepared, shapes);
                    let entries = shapes.entries(ShapeKey::of(cfg, prepared.spec), self.slots.len());
                    self.order.iter().map(|&s| entries[s].score).collect()
                }
                None => self.judge_slots(cfg, prepared, &self.order),
            });
            nodes
                .iter()
                .zip(scores)
                .map(|(n, score)| NodeVerdict {
                    node: n.name.clone(),
                    feasible: score.is_some(),
                    score,
                    reasons: vec![],
                    categories: vec![],
                })
                .collect()
        };
        for (v, n) in verdicts.iter_mut().zip(&nodes) {
            if !v.feasible && !explain {
                continue;
            }
            if let Some(f) = cons.check(n) {
                v.feasible = false;
                v.score = None;
                if explain {
                    v.categories.push(f.category);
                    v.reasons.push(f.message);
                }
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
            None if !explain => return self.schedule_constrained(cfg, prepared, true),
            None => Decision {
                pod,
                node: None,
                message: aggregate_message(&verdicts),
                placement: None,
                allocation: None,
                nodes: verdicts,
            },
            Some((node, score)) if !explain => self.decision_on(prepared, node, score),
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
}
