//! Preemption in the index: which bound pods may be evicted (their priority and what they
//! give back, from [`crate::preempt`]), the PodDisruptionBudgets, the what-if check "does
//! the pod fit here with these pods gone", and the holds: once victims are chosen, what the
//! preemptor will take on its nominated node is kept from every other pod until it is placed
//! (the victims leave the node's NRT only when its exporter publishes again).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use numaplane::allocation::Allocation;
use serde::Serialize;

use super::{Assumption, Cluster, Config, Decision, NoTopology, NodeVerdict, TopologyState};
use crate::{
    admission::{self, WorkingZones},
    fit,
    node::NodeBasics,
    node::NumaTopology,
    pod::PodSpec,
    preempt::{self, Budget, NodeVictims, Release, VictimInfo},
    prepared::PreparedPod,
};

/// What the index keeps for preemption.
#[derive(Clone, Debug, Default)]
pub(super) struct State {
    /// Per bound pod key: its preemption view and what evicting it gives back to its zones.
    victims: HashMap<String, (VictimInfo, Release)>,
    /// PodDisruptionBudgets by `namespace/name`.
    budgets: BTreeMap<String, Budget>,
    /// Holds by preemptor key.
    holds: HashMap<String, Hold>,
}

/// What a preemptor will take on its nominated node, kept from every other pod.
#[derive(Clone, Debug)]
pub struct Hold {
    /// The nominated node.
    pub node: String,
    /// The preemptor's UID.
    pub uid: Option<String>,
    /// Caller's clock (ms) when the victims were chosen.
    pub since_ms: u64,
    /// Keys of the victims.
    pub victims: Vec<String>,
    /// The preemptor's predicted placement once the victims are gone.
    taken: Assumption,
}

/// A preemption the model proposes: evict `victims` from `node`, then the pod is admitted
/// there as `decision` predicts.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preemption {
    /// The nominated node.
    pub node: String,
    /// The victims, most important first.
    #[serde(serialize_with = "victim_keys")]
    pub victims: Vec<VictimInfo>,
    /// Victims whose eviction exceeds a PodDisruptionBudget.
    pub budget_violations: usize,
    /// The decision once the victims are gone (placement and allocation record there).
    pub decision: Decision,
}

fn victim_keys<S: serde::Serializer>(v: &[VictimInfo], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|v| v.key.as_str()))
}

impl State {
    /// Holds whose node is `node`.
    pub(super) fn holds_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Assumption> + 'a {
        self.holds
            .values()
            .filter(move |h| h.node == node)
            .map(|h| &h.taken)
    }

    /// Records a bound pod (called by `apply_pod` for a pod bound to a node, with its
    /// allocation record for that node if it has one).
    pub(super) fn note_pod(
        &mut self,
        res: &mut crate::resources::Resources,
        key: &str,
        pod: &Pod,
        spec: &PodSpec,
        record: Option<&Allocation>,
    ) {
        let release = record
            .map(|r| preempt::release_of(res, spec, r))
            .unwrap_or_default();
        self.victims
            .insert(key.to_owned(), (VictimInfo::from_pod(pod), release));
    }

    /// Forgets a pod no longer bound.
    pub(super) fn forget_pod(&mut self, key: &str) {
        self.victims.remove(key);
    }
}

impl Cluster {
    /// Adds or replaces a PodDisruptionBudget.
    pub fn apply_pdb(&mut self, pdb: &PodDisruptionBudget) {
        let key = format!(
            "{}/{}",
            pdb.metadata.namespace.as_deref().unwrap_or("default"),
            pdb.metadata.name.as_deref().unwrap_or_default()
        );
        self.preemption.budgets.insert(key, Budget::from_pdb(pdb));
    }

    /// Removes a PodDisruptionBudget by `namespace/name`.
    pub fn delete_pdb(&mut self, key: &str) {
        self.preemption.budgets.remove(key);
    }

    /// Replaces every PodDisruptionBudget (the watch relisted).
    pub fn reset_pdbs(&mut self, pdbs: &[PodDisruptionBudget]) {
        self.preemption.budgets.clear();
        for p in pdbs {
            self.apply_pdb(p);
        }
    }

    /// The hold of preemptor `key`, if any.
    pub fn hold(&self, key: &str) -> Option<&Hold> {
        self.preemption.holds.get(key)
    }

    /// Ends the hold of `key` (its pod was placed, deleted, or is about to be decided, which
    /// must not see its own hold) and returns it.
    pub fn release_hold(&mut self, key: &str) -> Option<Hold> {
        let h = self.preemption.holds.remove(key)?;
        self.recompute(&h.node);
        Some(h)
    }

    /// Puts back a hold taken with [`Self::release_hold`] (its pod still waits for the
    /// victims to leave the node's NRT).
    pub fn restore_hold(&mut self, key: &str, hold: Hold) {
        let node = hold.node.clone();
        self.preemption.holds.insert(key.to_owned(), hold);
        self.recompute(&node);
    }

    /// Drops holds older than `timeout_ms` at `now_ms` and returns their pod keys: the
    /// victims' node never showed room (a stuck exporter, or victims that did not leave).
    pub fn expire_holds(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<String> {
        let old: Vec<String> = self
            .preemption
            .holds
            .iter()
            .filter(|(_, h)| now_ms.saturating_sub(h.since_ms) >= timeout_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            self.release_hold(k);
        }
        old
    }

    /// The preemption view of the bound pods of `node`, with their keys.
    fn candidates(&self, node: &str) -> Vec<&VictimInfo> {
        self.node_pods
            .get(node)
            .into_iter()
            .flatten()
            .filter(|k| self.pods.get(*k).is_some_and(|p| !p.assumed_only))
            .filter_map(|k| self.preemption.victims.get(k).map(|(v, _)| v))
            .collect()
    }

    /// Whether a pod of `priority` nominated to `node` should wait instead of preempting again:
    /// lower-priority pods there are still terminating because a scheduler preempted them (as
    /// kube-scheduler's `PodEligibleToPreemptOthers`). This holds across a restart or a leader
    /// change, when the nominating replica's hold is gone but its victims are still leaving.
    pub fn victims_leaving(&self, node: &str, priority: i32) -> bool {
        preempt::waits_for_victims(priority, self.candidates(node))
    }

    /// `node`'s topology with the pods `removed` gone: the published zones minus every other
    /// pending assumption and hold (except `own`'s), minus cluster-shared IDs held elsewhere,
    /// plus what each removed pod the NRT counts gives back.
    fn topology_without(&self, node: &str, removed: &BTreeSet<&str>, own: &str) -> Option<NumaTopology> {
        let base = self.published.get(node)?;
        let mut topo = base.clone();
        for key in self.node_pods.get(node).into_iter().flatten() {
            if removed.contains(key.as_str()) {
                continue;
            }
            if let Some(a) = self.assumed.get(key).filter(|a| a.node == node) {
                super::assume::take(&mut topo, a);
            }
        }
        for (k, h) in &self.preemption.holds {
            if h.node == node && k != own {
                super::assume::take(&mut topo, &h.taken);
            }
        }
        for rid in base.cluster_held.keys() {
            let taken = self.taken_in_cluster(*rid, node);
            if !taken.is_empty() {
                super::shared_slots::strip(&mut topo, *rid, &taken);
            }
        }
        for key in removed {
            // A pending assumption was simply not taken; a pod the NRT counts gives back.
            if self.assumed.get(*key).is_some_and(|a| a.node == node) {
                continue;
            }
            if let Some((_, r)) = self.preemption.victims.get(*key) {
                preempt::give_back(&mut topo, r);
            }
        }
        Some(topo)
    }

    /// Node-level state of `basics` with the pods `removed` gone.
    fn basics_without(&self, basics: &NodeBasics, removed: &BTreeSet<&str>) -> NodeBasics {
        let mut b = basics.clone();
        for p in removed.iter().filter_map(|k| self.pods.get(*k)) {
            for (id, v) in p.request.iter() {
                b.requested
                    .set(id, b.requested.get_or_zero(id).saturating_sub(v).max(0));
            }
            b.pod_count = b.pod_count.saturating_sub(1).max(0);
        }
        b
    }

    /// Whether `pod` fits `basics`' node with the pods `removed` gone: node fit, then predicted
    /// admission on the zones they leave (`own`: the pod's key, whose hold is not in its way).
    fn fits_without(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        own: &str,
        basics: &NodeBasics,
        removed: &BTreeSet<&str>,
    ) -> bool {
        let b = self.basics_without(basics, removed);
        if !fit::fits(&self.res, &b, pod.spec, &pod.fit_request) {
            return false;
        }
        let zones = match self.topology(&basics.name) {
            TopologyState::Missing if cfg.no_topology != NoTopology::Reject => None,
            TopologyState::Missing | TopologyState::Invalid { .. } => return false,
            TopologyState::Valid(_) => {
                let Some(t) = self.topology_without(&basics.name, removed, own) else {
                    return false;
                };
                let mut w = WorkingZones::from_topology(&t);
                if !admission::admits_prepared(&self.res, &t, &mut w, pod) {
                    return false;
                }
                Some(t)
            }
        };
        // Checked last: with the zones the victims leave, the claims' devices follow the
        // NUMA nodes the kubelet will pin there.
        self.claims_fit_without(cfg, pod, basics, removed, zones.as_ref())
    }

    /// kube-scheduler's DefaultPreemption for `pod` (priority `priority`), which fits no node
    /// now: on every node, the fewest, least important lower-priority pods whose eviction
    /// lets it pass node fit and predicted admission, PodDisruptionBudgets respected where
    /// possible; then the best node by upstream's order. `None` when no eviction helps.
    pub fn preempt(&self, cfg: &Config, pod: &PodSpec, priority: i32) -> Option<Preemption> {
        self.preempt_among(cfg, pod, priority, |_| true)
    }

    /// [`Self::preempt`] over the nodes `consider` accepts.
    pub fn preempt_among(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        priority: i32,
        consider: impl Fn(&str) -> bool,
    ) -> Option<Preemption> {
        // Nothing anywhere has a lower priority: no node has victims (one pass over the
        // victims, instead of every node's pods looked up by key).
        if !self
            .preemption
            .victims
            .values()
            .any(|(v, _)| v.priority < priority)
        {
            return None;
        }
        let prepared = PreparedPod::new(pod);
        let own = pod.key();
        let budgets: Vec<Budget> = self.preemption.budgets.values().cloned().collect();
        let mut options: Vec<(NodeVictims, Vec<&VictimInfo>)> = Vec::new();
        for basics in self.nodes().filter(|b| consider(&b.name)) {
            let candidates = self.candidates(&basics.name);
            if !candidates.iter().any(|c| c.priority < priority) {
                continue;
            }
            let chosen = preempt::select_victims(&basics.name, &candidates, priority, &budgets, |removed| {
                let keys: BTreeSet<&str> = removed.iter().map(|&i| candidates[i].key.as_str()).collect();
                self.fits_without(cfg, &prepared, &own, basics, &keys)
            });
            if let Some(v) = chosen {
                options.push((v, candidates));
            }
        }
        let picks: Vec<NodeVictims> = options.iter().map(|(v, _)| v.clone()).collect();
        let best = preempt::pick_node(&picks)?;
        let (chosen, candidates) = options.swap_remove(best);
        let victims: Vec<VictimInfo> = chosen.victims.iter().map(|&i| candidates[i].clone()).collect();
        let removed: BTreeSet<&str> = victims.iter().map(|v| v.key.as_str()).collect();
        let decision = self.decision_without(&prepared, &chosen.node, &removed);
        Some(Preemption {
            node: chosen.node,
            victims,
            budget_violations: chosen.budget_violations,
            decision,
        })
    }

    /// Whether `pod` fits `node` once the bound pods with UIDs `uids` are gone (node fit and
    /// predicted admission on the zones they leave): kube-scheduler's victims checked for NUMA
    /// room (the extender's `preempt` verb).
    pub fn fits_after_evicting(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        node: &str,
        uids: &BTreeSet<String>,
    ) -> bool {
        let Some(basics) = self.node_basics(node) else {
            return false;
        };
        let removed: BTreeSet<&str> = self
            .node_pods
            .get(node)
            .into_iter()
            .flatten()
            .filter(|k| {
                self.preemption
                    .victims
                    .get(*k)
                    .and_then(|(v, _)| v.uid.as_ref())
                    .is_some_and(|u| uids.contains(u))
            })
            .map(String::as_str)
            .collect();
        self.fits_without(cfg, &PreparedPod::new(pod), &pod.key(), basics, &removed)
    }

    /// The decision for `pod` on `node` once `removed` are gone.
    fn decision_without(&self, pod: &PreparedPod<'_>, node: &str, removed: &BTreeSet<&str>) -> Decision {
        let key = pod.spec.key();
        let topo = self.topology_without(node, removed, &key);
        let (placement, allocation) = match &topo {
            Some(t) => self.placement_in(pod, node, t),
            None => (None, None),
        };
        Decision {
            pod: key.clone(),
            message: format!("{key} nominated to {node}"),
            node: Some(node.to_owned()),
            placement,
            allocation,
            nodes: vec![NodeVerdict {
                node: node.to_owned(),
                kubelet_reason: None,
                approximate: Box::default(),
                feasible: true,
                score: None,
                reasons: vec![],
                categories: vec![],
                filter: None,
            }],
        }
    }

    /// Starts the hold of a preemption: what the preemptor will take on the nominated node
    /// leaves that node's zones for every other pod (clamped: the victims still hold it until
    /// the NRT shows them gone).
    pub fn hold_for(&mut self, pod: &PodSpec, p: &Preemption, now_ms: u64) {
        let key = pod.key();
        let removed: BTreeSet<&str> = p.victims.iter().map(|v| v.key.as_str()).collect();
        let taken = self.topology_without(&p.node, &removed, &key).and_then(|t| {
            let mut w = WorkingZones::with_device_ids(&t);
            admission::predict(&self.res, &t, &mut w, pod).ok().map(|placed| {
                super::assume::assumption_from(
                    &self.res,
                    &t,
                    &w,
                    &placed,
                    &p.node,
                    pod.uid.as_deref(),
                    now_ms,
                )
            })
        });
        let Some(taken) = taken else { return };
        let hold = Hold {
            node: p.node.clone(),
            uid: pod.uid.clone(),
            since_ms: now_ms,
            victims: p.victims.iter().map(|v| v.key.clone()).collect(),
            taken,
        };
        self.preemption.holds.insert(key, hold);
        self.recompute(&p.node);
    }

    /// Whether preemptor `key` waits for the victims of its hold: some are still bound.
    pub fn hold_waits(&self, key: &str) -> bool {
        self.preemption
            .holds
            .get(key)
            .is_some_and(|h| h.victims.iter().any(|v| self.pods.contains_key(v)))
    }
}
