//! The index: nodes, NodeResourceTopologies and bound pods in; each node's usage and the
//! topology the model sees (the NRT minus what bound and assumed pods hold) out.

use super::*;
use crate::cluster::assume::take;
use crate::cluster::shared_slots::strip;
use crate::{
    node::NodeBasics,
    node::{NrtError, NumaTopology},
    pod::{PodError, PodSpec},
    resources::{Dense, ResList},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::{nrt::NodeResourceTopology, quantity::Quantity};
use std::collections::{BTreeMap, BTreeSet};

impl Cluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    // === index events ===

    /// Adds or replaces a Node.
    pub fn apply_node(&mut self, node: &Node) -> Result<(), NodeError> {
        let name = node.metadata.name.clone().ok_or(NodeError::MissingName)?;
        let mut allocatable = Dense::default();
        let status_alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        for (rname, q) in status_alloc.into_iter().flatten() {
            let bad = || NodeError::ParseAllocatable {
                node: name.clone(),
                resource: rname.clone(),
                value: q.0.clone(),
            };
            let parsed = Quantity::parse(&q.0).map_err(|_| bad())?;
            let id = self.res.intern(rname);
            allocatable.set(id, self.res.amount(id, &parsed).map_err(|_| bad())?);
        }
        let spec = node.spec.clone().unwrap_or_default();
        // A node new to the index starts with the pods already known bound to it: the pod
        // watch may have listed them before the node watch listed the node, or the node was
        // deleted and re-added under its name while they stayed bound.
        let (requested, pod_count) = match self.index.get(&name).and_then(|&i| self.slots[i].as_ref()) {
            Some(n) => (n.requested.clone(), n.pod_count),
            None => self.usage_of(&name),
        };
        let basics = NodeBasics {
            name: name.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable,
            requested,
            pod_count,
        };
        let slot = match self.index.get(&name) {
            Some(&slot) => slot,
            None => self.new_slot(&name),
        };
        self.constraints.set_node(&name, &basics.labels);
        let lagging = self
            .published
            .get(&name)
            .map(|t| t.lagging_behind(&self.res, &basics.allocatable));
        // The allocation reads a node's labels (node selectors of slices and claims).
        if self.slots[slot]
            .as_ref()
            .is_none_or(|old| old.labels != basics.labels)
        {
            self.dra.node_changed(&name);
        }
        self.slots[slot] = Some(basics);
        self.touch(slot);
        // What the NRT lags the Node on follows the Node's allocatable too.
        if let Some(lagging) = lagging
            && !matches!(self.topology(&name), TopologyState::Valid(t) if t.lagging == lagging)
        {
            self.recompute(&name);
        }
        Ok(())
    }

    /// What the pods known bound to `node` request together, and how many they are.
    pub(super) fn usage_of(&self, node: &str) -> (Dense, i64) {
        let mut requested = Dense::default();
        let mut count = 0i64;
        for p in self
            .node_pods
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
        {
            for (id, v) in p.request.iter() {
                requested.set(id, requested.get_or_zero(id).saturating_add(v));
            }
            count = count.saturating_add(1);
        }
        (requested, count)
    }

    /// A slot for a new node, placed in `order` by name.
    pub(super) fn new_slot(&mut self, name: &str) -> usize {
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.generations.push(0);
            self.slots.len() - 1
        });
        let at = self
            .order
            .partition_point(|&s| self.slots[s].as_ref().is_some_and(|n| n.name.as_str() < name));
        self.order.insert(at, slot);
        self.index.insert(name.to_owned(), slot);
        self.claim_verdicts.forget_order();
        slot
    }

    /// Marks `slot` changed: cached verdicts of it no longer apply.
    pub(super) fn touch(&mut self, slot: usize) {
        self.last_generation += 1;
        self.generations[slot] = self.last_generation;
        self.claim_verdicts.forget_slot(slot);
    }

    /// [`Self::touch`] by node name, if the node is indexed.
    pub(super) fn touch_name(&mut self, name: &str) {
        if let Some(&slot) = self.index.get(name) {
            self.touch(slot);
        }
    }

    /// Removes a Node. Its pods stay known (they are the pod watch's): if a node of that name
    /// comes back, they count against it again.
    pub fn delete_node(&mut self, name: &str) {
        let Some(slot) = self.index.remove(name) else {
            return;
        };
        self.constraints.delete_node(name);
        self.slots[slot] = None;
        self.order.retain(|&s| s != slot);
        self.claim_verdicts.forget_order();
        self.free_slots.push(slot);
        self.touch(slot);
    }

    /// Adds or replaces an NRT; an invalid one is kept as [`TopologyState::Invalid`] so the
    /// node is rejected with the reason instead of silently treated as having no topology.
    pub fn apply_nrt(&mut self, nrt: &NodeResourceTopology) -> Result<(), NrtError> {
        let name = nrt.metadata.name.clone().unwrap_or_default();
        match NumaTopology::from_nrt(&mut self.res, nrt) {
            Ok(t) => {
                let held = t.cluster_held.clone();
                let old = self.published.insert(name.clone(), t).map(|o| o.cluster_held);
                self.reconcile(&name);
                self.recompute(&name);
                self.set_shared(&name, old.unwrap_or_default(), &held);
                Ok(())
            }
            Err(e) => {
                let old = self.published.get(&name).map(|o| o.cluster_held.clone());
                self.set_shared(&name, old.unwrap_or_default(), &BTreeMap::new());
                *self
                    .anomalies
                    .invalid_nrt
                    .entry(e.metric_label().to_owned())
                    .or_default() += 1;
                self.touch_name(&name);
                self.published.remove(&name);
                self.topologies.insert(
                    name,
                    TopologyState::Invalid {
                        reason: numaplane::error_chain(&e),
                        label: e.metric_label(),
                    },
                );
                Err(e)
            }
        }
    }

    /// Removes an NRT.
    pub fn delete_nrt(&mut self, name: &str) {
        self.topologies.remove(name);
        let old = self.published.remove(name).map(|o| o.cluster_held);
        self.set_shared(name, old.unwrap_or_default(), &BTreeMap::new());
        self.touch_name(name);
    }

    /// Rebuilds the effective topology of `node`: the published one minus every pending
    /// assumption there.
    pub(super) fn recompute(&mut self, node: &str) {
        let Some(base) = self.published.get(node) else {
            return;
        };
        let mut topo = base.clone();
        for key in self.node_pods.get(node).into_iter().flatten() {
            if let Some(a) = self.assumed.get(key).filter(|a| a.node == node) {
                take(&mut topo, a);
            }
        }
        for a in self.preemption.holds_on(node) {
            take(&mut topo, a);
        }
        for rid in base.cluster_held.keys() {
            let taken = self.taken_in_cluster(*rid, node);
            if !taken.is_empty() {
                strip(&mut topo, *rid, &taken);
            }
        }
        if let Some(b) = self.node_basics(node) {
            topo.lagging = base.lagging_behind(&self.res, &b.allocatable);
        }
        self.topologies
            .insert(node.to_owned(), TopologyState::Valid(Box::new(topo)));
        self.touch_name(node);
    }

    /// Adds or replaces a pod. Bound, non-terminal pods count against their node. Returns what
    /// was read of it, so a caller that needs it too does not parse the pod again.
    pub fn apply_pod(&mut self, pod: &Pod) -> Result<AppliedPod, PodError> {
        let spec = match PodSpec::from_pod(&mut self.res, pod) {
            Ok(s) => s,
            Err(e) => {
                self.anomalies.invalid_pods += 1;
                return Err(e);
            }
        };
        let key = spec.key();
        let starting = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Pending");
        let node = spec.node_name.clone().filter(|_| !spec.terminal);
        // An assumption ends when its pod finishes or is bound elsewhere, or when the pod of
        // that name is another one (recreated, and bound by someone else).
        let other_pod = |a: &Assumption| a.uid.is_some() && spec.uid.is_some() && a.uid != spec.uid;
        if self
            .assumed
            .get(&key)
            .is_some_and(|a| Some(&a.node) != node.as_ref() || other_pod(a))
            && self.release(&key)
        {
            self.assumption_stats.gone += 1;
        }
        let old = self.unbind(&key);
        let mut new = None;
        let mut kept = None;
        if let Some(node) = node {
            let mut bound = BoundPod::new(&self.res, &spec, node.clone(), starting);
            let record = self.record_for(pod, &node);
            if let Some(r) = &record {
                bound.claims = super::shared_slots::claims_of(&mut self.res, r);
            }
            new = Some((node.clone(), bound.claims.clone())).filter(|(_, c)| !c.is_empty());
            self.charge(&node, &bound.request, 1);
            self.constraints.set_pod(&key, &node, &spec.facts);
            self.volumes.note_user(&spec, &node); // ReadWriteOncePod, attach limits
            self.node_pods
                .entry(node.clone())
                .or_default()
                .insert(key.clone());
            self.pods.insert(key.clone(), bound);
            self.preemption
                .note_pod(&mut self.res, &key, pod, &spec, record.as_ref());
            self.settle(&node);
            kept = record;
        }
        self.index_claims(&key, old, new);
        Ok(AppliedPod { spec, record: kept })
    }

    /// Confirms the assumptions of `node` its NRT shows, now that the pods known there
    /// changed: whether a pod arrives before or after the NRT that names it, or another pod
    /// leaves before or after it, the outcome is the same.
    pub(super) fn settle(&mut self, node: &str) {
        if self.published.contains_key(node) {
            let before = self.assumed.len();
            self.reconcile(node);
            if self.assumed.len() != before {
                self.recompute(node);
            }
        }
    }

    /// Removes a pod by `namespace/name`; its assumption, if any, ends.
    pub fn delete_pod(&mut self, key: &str) {
        if self.release(key) {
            self.assumption_stats.gone += 1;
        }
        let node = self.pods.get(key).map(|p| p.node.clone());
        let old = self.unbind(key);
        self.index_claims(key, old, None);
        if let Some(node) = node {
            self.settle(&node);
        }
    }

    /// Removes the node-level charge of a pod; returns its node and claims (for
    /// [`Self::index_claims`]).
    pub(super) fn unbind(&mut self, key: &str) -> Option<(String, Claims)> {
        let old = self.pods.remove(key)?;
        self.constraints.remove_pod(key);
        self.volumes.drop_user(key);
        self.preemption.forget_pod(key);
        if let Some(set) = self.node_pods.get_mut(&old.node) {
            set.remove(key);
            if set.is_empty() {
                self.node_pods.remove(&old.node);
            }
        }
        self.charge(&old.node, &old.request, -1);
        Some((old.node, old.claims)).filter(|(_, c)| !c.is_empty())
    }

    /// Replaces the whole state (a watch restart's initial list). Placements whose Binding is
    /// in flight or not yet shown by the pod watch are kept (see [`Self::reset_pods`]).
    pub fn reset(&mut self, nodes: &[Node], nrts: &[NodeResourceTopology], pods: &[Pod]) {
        self.reset_nodes(nodes);
        self.reset_nrts(nrts);
        self.reset_pods(pods, 0);
    }

    /// Replaces every Node (the node watch relisted). Pod charges are kept: they belong to
    /// the pod watch.
    pub fn reset_nodes(&mut self, nodes: &[Node]) {
        let keep: BTreeSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        let gone: Vec<String> = self
            .index
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.delete_node(&n);
        }
        for n in nodes {
            if self.apply_node(n).is_err() {
                self.anomalies.invalid_nodes += 1;
            }
        }
    }

    /// Replaces every NRT (the NRT watch relisted).
    pub fn reset_nrts(&mut self, nrts: &[NodeResourceTopology]) {
        let keep: BTreeSet<&str> = nrts.iter().filter_map(|t| t.metadata.name.as_deref()).collect();
        let gone: Vec<String> = self
            .topologies
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.delete_nrt(&n);
        }
        for t in nrts {
            let _ = self.apply_nrt(t);
        }
    }

    /// Replaces every bound pod (the pod watch relisted, the list having started at
    /// `listed_from_ms` on the caller's clock); pods no longer listed end, with their
    /// assumptions.
    ///
    /// Except our own placements the pod watch has not shown bound yet: a list does not show
    /// a pod whose Binding is still in flight, nor one whose Binding the API server accepted
    /// after the list began. Dropping those would free their zones while the pods are being
    /// bound there, and the next pod would get the same zone. Only a placement whose Binding
    /// was accepted before the list began, and that the list does not show, is gone (the pod
    /// was deleted since). `listed_from_ms = 0` keeps every such placement.
    pub fn reset_pods(&mut self, pods: &[Pod], listed_from_ms: u64) {
        let keep: BTreeSet<String> = pods
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let unreflected =
            |p: &BoundPod| p.assumed_only && p.bound_at_ms.is_none_or(|at| at >= listed_from_ms);
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(k, p)| !keep.contains(*k) && !unreflected(p))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.delete_pod(&k);
        }
        for p in pods {
            let _ = self.apply_pod(p);
        }
    }

    /// Adds (`sign` 1) or removes (`sign` -1) a pod's request on its node, if indexed.
    ///
    /// Requests come from pods any scheduler bound, so they may be anything the API server
    /// accepts: sums saturate (a node whose sum saturated is full for any pod). Removing a pod
    /// from a saturated sum cannot know what was lost, so the node's pods are summed again
    /// (`unbind` has already taken the pod out of `node_pods`): the sum is exact once it fits.
    pub(super) fn charge(&mut self, node: &str, request: &ResList, sign: i64) {
        let Some(&slot) = self.index.get(node) else { return };
        let mut resum = false;
        let Some(n) = self.slots[slot].as_mut() else {
            return;
        };
        for (id, v) in request.iter() {
            let cur = n.requested.get_or_zero(id);
            if sign < 0 && (cur == i64::MAX || cur == i64::MIN) {
                resum = true;
            }
            let next = if sign < 0 {
                cur.saturating_sub(v)
            } else {
                cur.saturating_add(v)
            };
            n.requested.set(id, next);
        }
        n.pod_count = n.pod_count.saturating_add(sign);
        if resum {
            let (requested, _) = self.usage_of(node);
            if let Some(n) = self.slots[slot].as_mut() {
                n.requested = requested;
            }
        }
        self.touch(slot);
    }

    /// Nodes in name order.
    pub(super) fn nodes(&self) -> impl Iterator<Item = &NodeBasics> {
        self.order.iter().filter_map(|&s| self.slots[s].as_ref())
    }

    /// Node names known to the index, sorted.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes().map(|n| n.name.as_str())
    }

    /// The node-level state of `node` (labels, allocatable, what its pods request), if the
    /// node is indexed.
    pub fn node_basics(&self, node: &str) -> Option<&NodeBasics> {
        self.index.get(node).and_then(|&s| self.slots[s].as_ref())
    }

    /// The topology state of `node`.
    pub fn topology(&self, node: &str) -> &TopologyState {
        self.topologies.get(node).unwrap_or(&TopologyState::Missing)
    }

    /// Whether the pod watch has shown the pod `key` bound (not only our placement of it).
    pub fn seen_bound(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(|p| !p.assumed_only)
    }

    /// The node the pod `key` is known bound (or being bound) to.
    pub fn pod_node(&self, key: &str) -> Option<&str> {
        self.pods.get(key).map(|p| p.node.as_str())
    }
}

/// What [`Cluster::apply_pod`] read of a pod.
#[derive(Debug)]
pub struct AppliedPod {
    /// Its spec as the model reads it.
    pub spec: PodSpec,
    /// For a pod counted on a node: its allocation record for that node, when it has a valid
    /// one.
    pub record: Option<numaplane::allocation::Allocation>,
}
