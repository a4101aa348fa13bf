//! The filter/score cycle over every node: verdicts, the best node, the decision and its
//! messages.

use super::*;
use crate::{
    admission::{self, Placement, WorkingZones},
    cache::{ShapeKey, Shapes, UNKNOWN_FAILURE},
    fit,
    model_config::UnknownKubeletOptions,
    node::NodeBasics,
    pod::PodSpec,
    prepared::PreparedPod,
};
use numaplane::allocation::{Allocation, ContainerAllocation, VERSION};
use std::collections::BTreeMap;

impl Cluster {
    /// Every node's verdict (score when feasible, no reasons), in name order, as the cached
    /// fast path of [`Self::schedule`] sees them; `explain = true` gives the uncached ones.
    /// Every node's NUMA score (None when infeasible) in name order, from the verdict cache
    /// when there is one.
    pub(super) fn cached_scores(&self, cfg: &Config, pod: &PreparedPod<'_>) -> Vec<Option<i64>> {
        let mut scores = vec![None; self.order.len()];
        self.scan_scores(cfg, pod, |position, _, score| {
            if let Some(s) = scores.get_mut(position) {
                *s = score;
            }
        });
        scores
    }

    pub fn quick_verdicts(&self, cfg: &Config, pod: &PodSpec) -> Vec<NodeVerdict> {
        let scores = self.cached_scores(cfg, &self.prepare(pod));
        self.nodes()
            .zip(scores)
            .map(|(n, score)| NodeVerdict {
                node: n.name.clone(),
                kubelet_reason: None,
                approximate: Box::default(),
                feasible: score.is_some(),
                score,
                reasons: vec![],
                categories: vec![],
                filter: None,
            })
            .collect()
    }

    /// Evaluates `pod` on one node: node fit, then predicted kubelet admission.
    pub(super) fn evaluate(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        basics: &NodeBasics,
        explain: bool,
    ) -> NodeVerdict {
        let mut verdict = NodeVerdict {
            node: basics.name.clone(),
            kubelet_reason: None,
            approximate: Box::default(),
            feasible: false,
            score: None,
            reasons: vec![],
            categories: vec![],
            filter: None,
        };
        let mut failures = fit::check(&self.res, basics, pod.spec, &pod.fit_request);
        // After node fit, as kube-scheduler's filter order has it.
        if failures.is_empty() {
            failures = pod.volumes.failures(&basics.name, &basics.labels);
        }
        if !failures.is_empty() {
            if explain {
                verdict.filter = failures.first().map(|f| f.filter);
                verdict.kubelet_reason = self.kubelet_reason_if_bound(pod, &basics.name, &failures);
                for f in failures {
                    verdict.categories.push(f.category);
                    verdict.reasons.push(f.message);
                }
            }
            return verdict;
        }
        self.topology_verdict_into(cfg, pod, &basics.name, explain, &mut verdict);
        verdict
    }

    /// What the kubelet would answer were the pod bound to a node that fails node fit: the
    /// kubelet's admission runs the Topology Manager and its managers' allocations before the
    /// resource-fit predicate (verified-facts.md, "OutOfcpu comes after the Topology Manager"),
    /// so a predicted admission failure is its reason; otherwise the first short resource is
    /// `OutOf<resource>`, as the kubelet's predicate names it. `None` when the failure is not the
    /// kubelet's to find (taints, affinity, ports, volumes).
    fn kubelet_reason_if_bound(
        &self,
        pod: &PreparedPod<'_>,
        node: &str,
        failures: &[fit::FitFailure],
    ) -> Option<Box<str>> {
        // Only a node short of resources alone: elsewhere the scheduler's own filters decide,
        // and the kubelet's answer would be spent work on the explanation path.
        if failures.iter().any(|f| f.filter != fit::Filter::NodeResourcesFit) {
            return None;
        }
        if let TopologyState::Valid(topo) = self.topology(node) {
            let mut w = WorkingZones::from_topology(topo);
            if let Err(r) = admission::predict_prepared(&self.res, topo, &mut w, pod)
                && !r.kubelet_reason.is_empty()
            {
                return Some(r.kubelet_reason.into());
            }
        }
        failures
            .iter()
            .filter(|f| f.filter == fit::Filter::NodeResourcesFit)
            .find_map(|f| f.category.strip_prefix("Insufficient "))
            .map(|r| format!("OutOf{r}").into())
    }

    /// The NUMA part of the filter alone (predicted kubelet admission from the node's NRT),
    /// without node-level fit: what the upstream NodeResourceTopologyMatch Filter decides,
    /// and what `kubectl numa why` style diagnostics want.
    pub fn topology_verdict(&self, cfg: &Config, pod: &PodSpec, node: &str) -> NodeVerdict {
        let mut verdict = NodeVerdict {
            node: node.to_owned(),
            kubelet_reason: None,
            approximate: Box::default(),
            feasible: false,
            score: None,
            reasons: vec![],
            categories: vec![],
            filter: None,
        };
        self.topology_verdict_into(cfg, &PreparedPod::new(pod), node, true, &mut verdict);
        verdict
    }

    /// The score of `pod` on `node` alone (as upstream Score runs without Filter).
    pub fn score_node(&self, cfg: &Config, pod: &PodSpec, node: &str) -> i64 {
        match self.topology(node) {
            TopologyState::Valid(t) => cfg.scorer.score(&self.res, Some(t), pod),
            _ => cfg.scorer.score(&self.res, None, pod),
        }
    }

    pub(super) fn topology_verdict_into(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        node: &str,
        explain: bool,
        verdict: &mut NodeVerdict,
    ) {
        if explain {
            // Cleared below when the node passes.
            verdict.filter = Some(fit::Filter::NumaTopology);
        }
        match self.topology(node) {
            TopologyState::Missing => {
                if cfg.no_topology == NoTopology::Reject {
                    if explain {
                        verdict
                            .categories
                            .push("node(s) had no NodeResourceTopology".to_owned());
                        verdict
                            .reasons
                            .push("no NodeResourceTopology published for this node".to_owned());
                    }
                    return;
                }
                verdict.feasible = true;
                verdict.filter = None;
                verdict.score = Some(cfg.scorer.score_prepared(&self.res, None, pod));
            }
            TopologyState::Invalid { reason, .. } => {
                if explain {
                    verdict
                        .categories
                        .push("node(s) had topology unknown or invalid".to_owned());
                    verdict
                        .reasons
                        .push(format!("topology unknown or invalid: {reason}"));
                }
            }
            TopologyState::Valid(topo) => {
                if explain && !topo.approximate.is_empty() {
                    verdict.approximate = topo.approximate.iter().map(ToString::to_string).collect();
                }
                if cfg.unknown_kubelet_options == UnknownKubeletOptions::Avoid
                    && !topo.approximate.is_empty()
                    && pod.spec.topology_aligned(&self.res)
                {
                    if explain {
                        verdict
                            .categories
                            .push("node(s) had kubelet options the model cannot predict".to_owned());
                        verdict.reasons.push(format!(
                            "avoided (--unknown-kubelet-options=Avoid): the prediction here is approximate: {}",
                            verdict.approximate.join("; ")
                        ));
                    }
                    return;
                }
                let mut w = WorkingZones::from_topology(topo);
                match admission::predict_prepared(&self.res, topo, &mut w, pod) {
                    Ok(_) => {
                        verdict.feasible = true;
                        verdict.filter = None;
                        verdict.score = Some(cfg.scorer.score_prepared(&self.res, Some(topo), pod));
                    }
                    Err(r) => {
                        if explain {
                            verdict.kubelet_reason =
                                (!r.kubelet_reason.is_empty()).then(|| r.kubelet_reason.into());
                            verdict.categories.push(r.category);
                            verdict.reasons.push(r.message);
                        }
                    }
                }
            }
        }
    }

    /// Filters and scores every node (no sampling) and picks the best: highest score, then
    /// lowest name, so the result is deterministic. Does not change the cluster (only its
    /// verdict cache).
    ///
    /// With `explain`, every node is evaluated afresh and `nodes` holds every node's verdict
    /// with reasons. Without, verdicts come from the cache (recomputed for nodes changed since)
    /// and `nodes` holds only the chosen node's verdict; [`Self::quick_verdicts`] gives all of
    /// them. When no node fits, the result is the explained one either way.
    pub fn schedule(&self, cfg: &Config, pod: &PodSpec, explain: bool) -> Decision {
        self.schedule_prepared(cfg, &self.prepare(pod), explain)
    }

    /// [`PreparedPod::new`] with what the pod's volumes allow.
    pub(super) fn prepare<'a>(&self, pod: &'a PodSpec) -> PreparedPod<'a> {
        let mut prepared = PreparedPod::new(pod);
        prepared.volumes = self.volumes.filter(pod);
        prepared
    }

    /// [`Self::schedule`] for a pod prepared once.
    pub(super) fn schedule_prepared(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        explain: bool,
    ) -> Decision {
        let pod = prepared.spec;
        if self.dra.enabled() && !pod.resource_claims.is_empty() {
            let explain = if explain {
                super::Explain::Every
            } else {
                super::Explain::Failures
            };
            return self.schedule_claims(cfg, prepared, explain).0;
        }
        // Kube-scheduler's PreFilter rejects the pod once, not per node.
        if let Some(reason) = prepared.volumes.blocked() {
            return crate::decision::blocked_decision(pod, reason, self.node_names());
        }
        // Pods kube-scheduler's constraint plugins concern.
        if let Some(d) = self.schedule_constrained(cfg, prepared, explain) {
            return d;
        }
        if !explain {
            let best = self.best_node(cfg, prepared);
            let chosen =
                best.and_then(|(slot, score)| Some((self.slots[slot].as_ref()?.name.clone(), score)));
            let Some((node, score)) = chosen else {
                return self.schedule_prepared(cfg, prepared, true);
            };
            return self.decision_on(prepared, node, score);
        }
        let verdicts: Vec<NodeVerdict> = self
            .nodes()
            .map(|n| self.evaluate(cfg, prepared, n, explain))
            .collect();
        let best = verdicts
            .iter()
            .filter(|v| v.feasible)
            .max_by(|a, b| a.score.cmp(&b.score).then_with(|| b.node.cmp(&a.node)))
            .map(|v| v.node.clone());
        let Some(node) = best else {
            let message = aggregate_message(&verdicts);
            return Decision {
                pod: pod.key(),
                node: None,
                message,
                placement: None,
                allocation: None,
                nodes: verdicts,
            };
        };
        let (placement, allocation) = self.placement_on(prepared, &node);
        Decision {
            pod: pod.key(),
            message: format!("Successfully assigned {} to {node}", pod.key()),
            node: Some(node),
            placement,
            allocation,
            nodes: verdicts,
        }
    }

    pub(super) fn placement_on(
        &self,
        pod: &PreparedPod<'_>,
        node: &str,
    ) -> (Option<Placement>, Option<Allocation>) {
        let TopologyState::Valid(topo) = self.topology(node) else {
            return (None, None);
        };
        self.placement_in(pod, node, topo)
    }

    /// The predicted placement of `pod` in `topo` (the zones of `node`) and its record.
    pub(super) fn placement_in(
        &self,
        pod: &PreparedPod<'_>,
        node: &str,
        topo: &NumaTopology,
    ) -> (Option<Placement>, Option<Allocation>) {
        let mut w = WorkingZones::with_device_ids(topo);
        let Ok(p) = admission::predict_prepared(&self.res, topo, &mut w, pod) else {
            return (None, None);
        };
        let allocation = Allocation {
            version: VERSION.to_owned(),
            node: node.to_owned(),
            policy: topo.policy.to_string(),
            scope: topo.scope.to_string(),
            pod_numa_nodes: p.pod_numa_nodes.clone(),
            containers: p
                .containers
                .iter()
                .map(|c| ContainerAllocation {
                    name: c.name.clone(),
                    kind: c.kind,
                    numa_nodes: c.numa_nodes.clone(),
                    devices: c.devices.clone(),
                    device_counts: c.device_counts.clone(),
                })
                .collect(),
            nrt_fingerprint: topo.fingerprint.clone(),
        };
        (Some(p), Some(allocation))
    }

    /// The decision for `pod` on `node`, chosen by someone else (kube-scheduler, in extender
    /// mode): the NUMA side is predicted again against the current zones and assumptions, and
    /// the devices are chosen. Node-level fit is the caller's; a node without an NRT is
    /// judged as [`Self::topology_verdict`] judges it, so `filter` and `bind` agree. `Err` carries the verdict that
    /// says why the node cannot admit the pod now.
    pub fn decide_on(&self, cfg: &Config, pod: &PodSpec, node: &str) -> Result<Decision, Box<NodeVerdict>> {
        let verdict = self.topology_verdict(cfg, pod, node);
        if !verdict.feasible {
            return Err(Box::new(verdict));
        }
        Ok(self.decision_on(
            &PreparedPod::new(pod),
            node.to_owned(),
            verdict.score.unwrap_or(0),
        ))
    }

    /// Like [`Self::schedule`] without explanations, for a live loop that retries pods: when
    /// no node fits, the "0/N nodes are available" message comes from per-node failure
    /// categories cached by pod shape, so only nodes changed since the last attempt are
    /// explained again; `nodes` is empty then.
    pub fn decide(&self, cfg: &Config, pod: &PodSpec) -> Decision {
        let prepared = &self.prepare(pod);
        if let Some(reason) = prepared.volumes.blocked() {
            let mut d = crate::decision::blocked_decision(pod, reason, self.node_names());
            d.nodes.clear();
            return d;
        }
        if self.dra.enabled() && !pod.resource_claims.is_empty() {
            return self.schedule_claims(cfg, prepared, super::Explain::Message).0;
        }
        // Pods kube-scheduler's constraint plugins concern.
        if let Some(d) = self.schedule_constrained(cfg, prepared, false) {
            return d;
        }
        let outcome = self.with_cache(|shapes| {
            let shapes = shapes?;
            if let Some(best) = self.best_cached(cfg, prepared, shapes) {
                return Some(Ok(best));
            }
            Some(Err(self.cached_failure_message(cfg, prepared, shapes)))
        });
        match outcome {
            Some(Ok((slot, score))) => match self.slots[slot].as_ref() {
                Some(n) => self.decision_on(prepared, n.name.clone(), score),
                None => self.schedule_prepared(cfg, prepared, false),
            },
            Some(Err(message)) => Decision {
                pod: pod.key(),
                node: None,
                message,
                placement: None,
                allocation: None,
                nodes: vec![],
            },
            // Another thread holds the cache: the uncached path.
            None => self.schedule_prepared(cfg, prepared, false),
        }
    }

    /// The aggregate message for a pod no node fits, from the cached categories of every
    /// node; nodes without cached categories are explained once and remembered.
    pub(super) fn cached_failure_message(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        shapes: &mut Shapes,
    ) -> String {
        let per_category = self.cached_failure_counts(cfg, pod, shapes);
        let per_category: BTreeMap<&str, usize> =
            per_category.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        format_aggregate(0, self.order.len(), &per_category)
    }

    /// The nodes per failure category of the nodes the pod's shape fails on, from the cached
    /// categories; nodes without cached categories are explained once and remembered.
    pub(super) fn cached_failure_counts(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        shapes: &mut Shapes,
    ) -> BTreeMap<String, usize> {
        let key = ShapeKey::of_prepared(cfg, pod);
        let infeasible: Vec<usize> = {
            let entries = shapes.entries(key.clone(), self.slots.len());
            self.order
                .iter()
                .copied()
                .filter(|&s| entries[s].score.is_none())
                .collect()
        };
        let ids = self.failure_ids_in(cfg, pod, shapes, &key, &infeasible);
        // By category set id: the ids are few and dense, and this runs over every node for
        // every pod that fits nowhere (a map entry per node was a twentieth of its time).
        // (An id past the interned sets names no category: it is not counted.)
        let mut counts: Vec<usize> = vec![0; shapes.category_set_count() + 1];
        for id in ids {
            if let Some(n) = counts.get_mut(id as usize) {
                *n += 1;
            }
        }
        let mut per_category: BTreeMap<String, usize> = BTreeMap::new();
        for (id, &n) in counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            for c in shapes.categories(u32::try_from(id).unwrap_or(u32::MAX)) {
                *per_category.entry(c.clone()).or_default() += n;
            }
        }
        per_category
    }

    /// The interned failure category set ([`Shapes::categories`]) of each of `slots`, nodes the
    /// pod's shape fails on (their verdict cache entries valid): from the cache, or explained
    /// once and remembered. `None` when another thread holds the cache.
    pub(super) fn failure_ids(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        slots: &[usize],
    ) -> Option<Vec<u32>> {
        self.with_cache(|shapes| {
            let key = ShapeKey::of_prepared(cfg, pod);
            Some(self.failure_ids_in(cfg, pod, shapes?, &key, slots))
        })
    }

    /// [`Self::failure_ids`] with the cache held, for the shape `key` of `pod`.
    fn failure_ids_in(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        shapes: &mut Shapes,
        key: &ShapeKey,
        slots: &[usize],
    ) -> Vec<u32> {
        let known: Vec<u32> = {
            let entries = shapes.entries(key.clone(), self.slots.len());
            slots
                .iter()
                .map(|&s| entries.get(s).map_or(UNKNOWN_FAILURE, |e| e.failure))
                .collect()
        };
        let mut ids = Vec::with_capacity(slots.len());
        let mut fresh = Vec::new();
        for (&slot, id) in slots.iter().zip(known) {
            let id = match (id, self.slots.get(slot).and_then(Option::as_ref)) {
                (UNKNOWN_FAILURE, Some(n)) => {
                    let id = shapes.intern_categories(self.evaluate(cfg, pod, n, true).categories);
                    fresh.push((slot, id));
                    id
                }
                (id, _) => id,
            };
            ids.push(id);
        }
        let entries = shapes.entries(key.clone(), self.slots.len());
        for (slot, id) in fresh {
            if let Some(e) = entries.get_mut(slot) {
                e.failure = id;
            }
        }
        ids
    }

    /// The categories of each interned failure category set, by id (`None`: the cache is held
    /// by another thread).
    pub(super) fn failure_categories(&self, ids: &[u32]) -> Option<Vec<Vec<String>>> {
        self.with_cache(|shapes| {
            let shapes = shapes?;
            Some(ids.iter().map(|&id| shapes.categories(id).to_vec()).collect())
        })
    }

    /// Why predictions on `node` are approximate (kubelet options the model cannot predict).
    fn approximations(&self, node: &str) -> Box<[String]> {
        match self.topology(node) {
            TopologyState::Valid(t) => t.approximate.iter().map(ToString::to_string).collect(),
            _ => Box::default(),
        }
    }

    /// The decision for a chosen node (placement and allocation record predicted there).
    pub(super) fn decision_on(&self, pod: &PreparedPod<'_>, node: String, score: i64) -> Decision {
        let (placement, allocation) = self.placement_on(pod, &node);
        Decision {
            pod: pod.spec.key(),
            message: format!("Successfully assigned {} to {node}", pod.spec.key()),
            nodes: vec![NodeVerdict {
                node: node.clone(),
                kubelet_reason: None,
                approximate: self.approximations(&node),
                feasible: true,
                score: Some(score),
                reasons: vec![],
                categories: vec![],
                filter: None,
            }],
            node: Some(node),
            placement,
            allocation,
        }
    }
}

/// `0/N nodes are available: 3 insufficient cpu on any single NUMA node, 2 node(s) had …`:
/// counts per category, sorted as strings, as kube-scheduler prints them.
pub fn aggregate_message(verdicts: &[NodeVerdict]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in verdicts.iter().filter(|v| !v.feasible) {
        let mut cats: Vec<&str> = v.categories.iter().map(String::as_str).collect();
        cats.sort_unstable();
        cats.dedup();
        for c in cats {
            *counts.entry(c).or_default() += 1;
        }
    }
    let available = verdicts.iter().filter(|v| v.feasible).count();
    format_aggregate(available, verdicts.len(), &counts)
}

/// The kube-scheduler line from per-category node counts.
pub(super) fn format_aggregate(available: usize, total: usize, counts: &BTreeMap<&str, usize>) -> String {
    let mut parts: Vec<String> = counts.iter().map(|(c, n)| format!("{n} {c}")).collect();
    parts.sort();
    if parts.is_empty() {
        format!("{available}/{total} nodes are available.")
    } else {
        format!("{available}/{total} nodes are available: {}.", parts.join(", "))
    }
}
