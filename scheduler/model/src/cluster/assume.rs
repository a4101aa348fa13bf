//! The assumption lifecycle: a placement applied so that the next pod sees it, kept until the
//! binding is seen, released when the published NRT's pod-set fingerprint shows it, or expired.

use super::*;
use crate::cluster::shared_slots::claims_of;
use crate::{
    admission::{self, Placement, WorkingZones},
    node::NumaTopology,
    pod::PodSpec,
    resources::{ResId, ResList, Resources},
};
use numaplane::allocation::Allocation;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many uncertain pods per node are tried when matching a fingerprint
/// (2^N subsets); beyond it the newest assumptions are kept until the next NRT or expiry.
pub(super) const MAX_UNCERTAIN: usize = 10;

impl Cluster {
    /// Releases the assumptions of `node` that its published NRT already shows.
    ///
    /// The NRT's pod-set fingerprint names the pods the kubelet reports. The known pods on the
    /// node are certain except those that may not be admitted yet (our pending assumptions
    /// and pods still `Pending`); the subset of those that makes the fingerprints equal is the
    /// set the kubelet has not reported yet, so the other assumptions are confirmed. No match
    /// (no fingerprint, or pods we do not know of) keeps every assumption: counting a pod twice
    /// for a while is safe, counting it never is not.
    pub(super) fn reconcile(&mut self, node: &str) {
        let Some(topo) = self.published.get(node) else {
            return;
        };
        let Some(expected) = topo.fingerprint.as_deref() else {
            return;
        };
        let Some(keys) = self.node_pods.get(node) else {
            return;
        };
        let pending: Vec<&String> = keys
            .iter()
            .filter(|k| self.assumed.get(*k).is_some_and(|a| a.node == node))
            .collect();
        if pending.is_empty() {
            return;
        }
        let exclusive_only = topo.fingerprint_exclusive_only;
        let counted = |k: &String| {
            self.pods
                .get(k)
                .is_some_and(|p| !exclusive_only || p.has_exclusive(topo))
        };
        let mut certain = Vec::new();
        let mut uncertain: Vec<&String> = Vec::new();
        // Newest assumptions first, then pods still starting.
        let mut by_age = pending.clone();
        by_age.sort_by_key(|k| std::cmp::Reverse(self.assumed.get(*k).map_or(0, |a| a.since_ms)));
        for k in by_age {
            if counted(k) && uncertain.len() < MAX_UNCERTAIN {
                uncertain.push(k);
            }
        }
        for k in keys.iter().filter(|k| counted(k)) {
            if uncertain.contains(&k) {
                continue;
            }
            let starting = self.pods.get(k).is_some_and(|p| p.starting) && !self.assumed.contains_key(k);
            if starting && uncertain.len() < MAX_UNCERTAIN {
                uncertain.push(k);
            } else {
                certain.push(k);
            }
        }
        let hash = |k: &String| {
            let (ns, name) = k.split_once('/').unwrap_or(("", k));
            numaplane::fingerprint::pod_hash(ns, name)
        };
        let certain: Vec<u64> = certain.into_iter().map(hash).collect();
        let uncertain_hashes: Vec<u64> = uncertain.iter().map(|k| hash(k)).collect();
        // Fewest unreported pods first: the most that the NRT can have confirmed.
        let mut subsets: Vec<u32> = (0..(1u32 << uncertain.len())).collect();
        subsets.sort_by_key(|m| m.count_ones());
        let found = subsets.into_iter().find(|&missing| {
            let mut fp = numaplane::fingerprint::Fingerprint::new(certain.len() + uncertain.len());
            for &h in &certain {
                fp.add_hash(h);
            }
            for (i, &h) in uncertain_hashes.iter().enumerate() {
                if missing & (1 << i) == 0 {
                    fp.add_hash(h);
                }
            }
            fp.check(expected).is_ok()
        });
        let Some(missing) = found else {
            return;
        };
        let not_reported: BTreeSet<&String> = uncertain
            .iter()
            .enumerate()
            .filter(|(i, _)| missing & (1 << i) != 0)
            .map(|(_, k)| *k)
            .collect();
        // Assumptions without exclusive resources are not in an exclusive-only fingerprint,
        // and take nothing from the zones' available amounts either: confirm them too.
        let confirmed: Vec<String> = pending
            .into_iter()
            .filter(|k| !not_reported.contains(k))
            .cloned()
            .collect();
        for k in confirmed {
            self.assumed.remove(&k);
            self.assumption_stats.confirmed += 1;
        }
    }

    /// Drops the assumption of `key`, if any, and restores its node's zones.
    pub(super) fn release(&mut self, key: &str) -> bool {
        match self.assumed.remove(key) {
            Some(a) => {
                self.recompute(&a.node);
                true
            }
            None => false,
        }
    }

    /// Undoes a placement whose binding failed: the assumption goes, and the node-level
    /// charge too unless the pod watch has since shown the pod bound (by someone else).
    ///
    /// `uid` is the UID the Binding was pinned to. A placement under the same name for
    /// another UID belongs to a pod recreated meanwhile, placed after this one: it stays.
    pub fn forget(&mut self, key: &str, uid: Option<&str>) {
        let other = |u: &Option<String>| uid.is_some() && u.is_some() && u.as_deref() != uid;
        if self.assumed.get(key).is_some_and(|a| other(&a.uid))
            || self.pods.get(key).is_some_and(|p| other(&p.uid))
        {
            return;
        }
        if self.release(key) {
            self.assumption_stats.forgotten += 1;
        }
        self.volumes.forget(key);
        if self.pods.get(key).is_some_and(|p| p.assumed_only) {
            let old = self.unbind(key);
            self.index_claims(key, old, None);
        }
    }

    /// Drops assumptions older than `timeout_ms` at `now_ms` (caller's clock) and returns
    /// their pod keys: the node's NRT never showed them (no exporter, or a stuck one).
    pub fn expire_assumptions(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<String> {
        let old: Vec<String> = self
            .assumed
            .iter()
            .filter(|(_, a)| now_ms.saturating_sub(a.since_ms) >= timeout_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            if self.release(k) {
                self.assumption_stats.expired += 1;
            }
        }
        old
    }

    /// Pending assumptions.
    pub fn assumptions(&self) -> impl Iterator<Item = (&str, &Assumption)> {
        self.assumed.iter().map(|(k, a)| (k.as_str(), a))
    }

    /// Whether `key` has a pending assumption.
    pub fn is_assumed(&self, key: &str) -> bool {
        self.assumed.contains_key(key)
    }

    /// The API server accepted the Binding of `key` (pinned to `uid`) at `now_ms`: from now
    /// on a relist that does not show the pod means it is gone ([`Self::reset_pods`]).
    pub fn binding_succeeded(&mut self, key: &str, uid: Option<&str>, now_ms: u64) {
        let same = |p: &BoundPod| uid.is_none() || p.uid.is_none() || p.uid.as_deref() == uid;
        if let Some(p) = self.pods.get_mut(key).filter(|p| p.assumed_only && same(p)) {
            p.bound_at_ms = Some(now_ms);
        }
    }

    /// Applies a decision: the pod is bound to the chosen node, its requests count against
    /// the node, and its exclusive resources and devices leave the node's zones. Offline use
    /// (no clock): the assumption never expires.
    pub fn assume(&mut self, pod: &PodSpec, decision: &Decision) {
        self.assume_at(pod, decision, 0);
    }

    /// [`Self::assume`] at `now_ms` on the caller's clock. The zones stay reduced, through
    /// every newer NRT of the node, until an NRT's fingerprint shows the kubelet counted the
    /// pod ([`Self::reconcile`]), the pod is gone, or [`Self::expire_assumptions`].
    pub fn assume_at(&mut self, pod: &PodSpec, decision: &Decision, now_ms: u64) {
        let Some(node) = decision.node.clone() else { return };
        let key = pod.key();
        // Its WaitForFirstConsumer claims now select the node.
        self.volumes.assume(pod, &node);
        // Predicted on the zones the decision saw, before an earlier placement under this
        // name (a recreated pod's predecessor) is dropped: the assumption is then the
        // decision, and the allocation record, rather than a new choice on freed zones.
        let taken = match self.topologies.get(&node) {
            Some(TopologyState::Valid(topo)) => {
                let mut w = WorkingZones::with_device_ids(topo);
                admission::predict(&self.res, topo, &mut w, pod)
                    .ok()
                    .map(|p| assumption_from(&self.res, topo, &w, &p, &node, pod.uid.as_deref(), now_ms))
            }
            _ => None,
        };
        self.delete_pod(&key);
        if let (Some(a), Some(TopologyState::Valid(topo))) = (&taken, self.topologies.get_mut(&node)) {
            take(topo, a);
        }
        let mut bound = BoundPod::new(&self.res, pod, node.clone(), true);
        bound.assumed_only = true;
        if let Some(alloc) = &decision.allocation {
            bound.claims = claims_of(&mut self.res, alloc);
        }
        let new = Some((node.clone(), bound.claims.clone())).filter(|(_, c)| !c.is_empty());
        self.charge(&node, &bound.request, 1);
        self.constraints.set_pod(&key, &node, &pod.facts);
        self.volumes.note_user(pod, &node); // ReadWriteOncePod, attach limits
        self.node_pods.entry(node).or_default().insert(key.clone());
        self.pods.insert(key.clone(), bound);
        if let Some(a) = taken {
            self.assumed.insert(key.clone(), a);
        }
        self.index_claims(&key, None, new);
    }

    /// Re-assumes the placement of a bound pod that carries our allocation record, unless the
    /// node's NRT already shows the pod: after a restart or a leader change (the placements a
    /// previous process made and the NRTs do not show yet), or when the pod watch shows a
    /// pod bound by someone else with a record (another replica, or a Binding of ours that
    /// landed although it was reported failed). Running pods too: the kubelet may have
    /// admitted the pod long before the exporter publishes. Call once the pods, nodes and
    /// NRTs are synced.
    ///
    /// The placement is predicted inside the NUMA nodes the record names, and takes the
    /// device IDs it names: what the kubelet was told, not a new choice. Whether the NRT shows
    /// the pod is decided by its fingerprint ([`Self::reconcile`]); without one, the
    /// placement is held until it expires (counted twice meanwhile, never not at all).
    pub fn restore_assumption(&mut self, pod: &PodSpec, record: Option<&Allocation>, now_ms: u64) {
        let Some(node) = pod.node_name.clone() else { return };
        let key = pod.key();
        let known_here = self
            .pods
            .get(&key)
            .is_some_and(|p| p.node == node && (p.uid.is_none() || p.uid == pod.uid));
        if pod.terminal || self.assumed.contains_key(&key) || !known_here {
            return;
        }
        if record.is_some_and(|r| r.node != node) {
            return;
        }
        let Some(TopologyState::Valid(topo)) = self.topologies.get(&node) else {
            return;
        };
        let confined = record.and_then(recorded_zones).map(|zones| confine(topo, &zones));
        let basis = confined.as_ref().unwrap_or(topo);
        let mut w = WorkingZones::with_device_ids(basis);
        let Ok(p) = admission::predict(&self.res, basis, &mut w, pod) else {
            return;
        };
        let mut a = assumption_from(&self.res, basis, &w, &p, &node, pod.uid.as_deref(), now_ms);
        if let Some(r) = record {
            use_recorded_devices(&mut self.res, topo, r, &mut a);
        }
        if let Some(TopologyState::Valid(topo)) = self.topologies.get_mut(&node) {
            take(topo, &a);
        }
        self.assumed.insert(key.clone(), a);
        self.reconcile(&node);
        if !self.assumed.contains_key(&key) {
            // The NRT shows the pod: there was nothing to restore, so nothing was confirmed.
            self.assumption_stats.confirmed = self.assumption_stats.confirmed.saturating_sub(1);
        }
        self.recompute(&node);
    }
}

/// What a prediction consumed: the difference between the topology's zones and `w`, and the
/// memory groups its placement `p` forms.
pub(super) fn assumption_from(
    res: &Resources,
    topo: &NumaTopology,
    w: &WorkingZones,
    p: &Placement,
    node: &str,
    uid: Option<&str>,
    now_ms: u64,
) -> Assumption {
    let mut taken = Vec::new();
    let mut devices = Vec::new();
    for (i, z) in topo.zones.iter().enumerate() {
        let mut amounts = ResList::default();
        if let Some(after) = w.available.get(i) {
            for (id, before) in z.available.iter() {
                let used = before.saturating_sub(after.get_or_zero(id));
                if used > 0 {
                    amounts.set(id, used);
                }
            }
        }
        if !amounts.is_empty() {
            taken.push((z.id, amounts));
        }
        if let Some(after) = w.free_devices.as_ref().and_then(|f| f.get(i)) {
            for (id, ids) in &z.free_devices {
                let left = after.get(id);
                let gone: Vec<String> = ids
                    .iter()
                    .filter(|d| !left.is_some_and(|l| l.contains(d)))
                    .cloned()
                    .collect();
                if !gone.is_empty() {
                    devices.push((z.id, *id, gone));
                }
            }
        }
    }
    let unaligned = topo
        .unaligned_devices
        .iter()
        .filter_map(|(id, before)| {
            let after = w.unaligned.get(id)?;
            let gone: Vec<String> = before
                .ids
                .iter()
                .filter(|d| !after.ids.contains(d))
                .cloned()
                .collect();
            let used = before.free.saturating_sub(after.free);
            (used > 0).then_some((*id, used, gone))
        })
        .collect();
    Assumption {
        node: node.to_owned(),
        uid: uid.map(str::to_owned),
        since_ms: now_ms,
        taken,
        devices,
        unaligned,
        memory_groups: p
            .memory_groups()
            .into_iter()
            .filter(|g| match g.as_slice() {
                [id] => {
                    let known = topo.memory_groups.iter().flatten().flatten().any(|k| k == id);
                    let unused = topo.zones.iter().find(|z| z.id == *id).is_some_and(|z| {
                        z.allocatable
                            .iter()
                            .all(|(r, a)| !res.kind(r).is_memory_like() || z.available.get_or_zero(r) >= a)
                    });
                    known || unused
                }
                _ => true,
            })
            .collect(),
    }
}

/// The NUMA nodes a record places the pod on (all containers, and the pod scope's), if
/// every container has an affinity; `None` when any may use every node.
pub(super) fn recorded_zones(record: &Allocation) -> Option<BTreeSet<u32>> {
    let mut zones: BTreeSet<u32> = record.pod_numa_nodes.iter().flatten().copied().collect();
    for c in &record.containers {
        zones.extend(c.numa_nodes.as_ref()?.iter().copied());
    }
    (!zones.is_empty()).then_some(zones)
}

/// `topo` with every zone outside `keep` emptied, so a prediction on it can only use `keep`.
pub(super) fn confine(topo: &NumaTopology, keep: &BTreeSet<u32>) -> NumaTopology {
    let mut t = topo.clone();
    for z in t.zones.iter_mut().filter(|z| !keep.contains(&z.id)) {
        let listed: Vec<ResId> = z.available.iter().map(|(id, _)| id).collect();
        for id in listed {
            z.available.set(id, 0);
        }
        z.free_devices.values_mut().for_each(Vec::clear);
        if let Some(cores) = z.free_cores.as_mut() {
            *cores = 0;
        }
    }
    t
}

/// Replaces the device IDs an assumption takes by those `record` names, for each resource
/// the record names IDs of: the kubelet's allocator was told those. IDs no zone of `topo`
/// lists as free (the NRT shows them taken already) are not taken again.
pub(super) fn use_recorded_devices(
    res: &mut Resources,
    topo: &NumaTopology,
    record: &Allocation,
    a: &mut Assumption,
) {
    let mut by_zone: BTreeMap<(u32, ResId), Vec<String>> = BTreeMap::new();
    let mut named: BTreeSet<ResId> = BTreeSet::new();
    for c in &record.containers {
        for (name, ids) in &c.devices {
            let rid = res.intern(name);
            named.insert(rid);
            for id in ids {
                let zone = topo
                    .zones
                    .iter()
                    .find(|z| z.free_devices.get(&rid).is_some_and(|f| f.contains(id)));
                if let Some(z) = zone {
                    by_zone.entry((z.id, rid)).or_default().push(id.clone());
                }
            }
        }
    }
    a.devices.retain(|(_, rid, _)| !named.contains(rid));
    a.devices
        .extend(by_zone.into_iter().map(|((zone, rid), ids)| (zone, rid, ids)));
}

/// Takes an assumption's amounts and device IDs from a topology's zones (clamped at zero: a
/// newer NRT may already show part of it).
pub(super) fn take(topo: &mut NumaTopology, a: &Assumption) {
    let threads = topo.full_pcpus_threads;
    for (zone, amounts) in &a.taken {
        if let Some(z) = topo.zones.iter_mut().find(|z| z.id == *zone) {
            for (id, v) in amounts.iter() {
                z.available.sub_clamped(id, v);
            }
            // Under full-pcpus-only exclusive CPUs come in whole cores: those are no longer
            // free either.
            if let (Some(t), Some(free)) = (threads, z.free_cores.as_mut()) {
                let cores = amounts.get(crate::resources::CPU) / 1000 / t;
                *free = free.saturating_sub(cores).max(0);
            }
        }
    }
    for (zone, id, ids) in &a.devices {
        if let Some(free) = topo
            .zones
            .iter_mut()
            .find(|z| z.id == *zone)
            .and_then(|z| z.free_devices.get_mut(id))
        {
            free.retain(|d| !ids.contains(d));
        }
    }
    for (id, used, ids) in &a.unaligned {
        if let Some(u) = topo.unaligned_devices.get_mut(id) {
            u.free = u.free.saturating_sub(*used).max(0);
            u.ids.retain(|d| !ids.contains(d));
            u.ids.truncate(usize::try_from(u.free).unwrap_or(0));
        }
    }
    // The groups become known ones: the model then applies the group rules to their zones
    // exactly (§3.2 steps 2–3). Zones in use outside the known groups stay guessed, whether
    // the exporter publishes groups or not, so adding to an unpublished list is as safe. Later
    // entries replace earlier ones on their nodes (the kubelet's `Cells`), so one already
    // known moves to the end.
    for g in &a.memory_groups {
        let known = topo.memory_groups.get_or_insert_with(Vec::new);
        known.retain(|k| k != g);
        known.push(g.clone());
    }
}
