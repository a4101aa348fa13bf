//! Cluster-shared device slots: which node's pods claim which device IDs, so that a slot taken
//! on one node is unavailable on every other.

use super::*;
use crate::{
    node::NumaTopology,
    resources::{ResId, Resources},
};
use k8s_openapi::api::core::v1::Pod;
use numaplane::allocation::Allocation;
use std::collections::{BTreeMap, BTreeSet};

impl Cluster {
    /// Records which cluster-shared resources `node` publishes, with the IDs held there, and
    /// refreshes the other nodes sharing a resource whose held IDs changed. Call after
    /// `published` holds the node's new NRT (or none).
    pub(super) fn set_shared(
        &mut self,
        node: &str,
        old: BTreeMap<ResId, Vec<String>>,
        new: &BTreeMap<ResId, Vec<String>>,
    ) {
        for rid in old.keys().filter(|r| !new.contains_key(r)) {
            if let Some(nodes) = self.shared_nodes.get_mut(rid) {
                nodes.remove(node);
                if nodes.is_empty() {
                    self.shared_nodes.remove(rid);
                }
            }
        }
        for rid in new.keys() {
            self.shared_nodes.entry(*rid).or_default().insert(node.to_owned());
        }
        // Unchanged held IDs need no refresh of the others (an NRT is republished often).
        if old == *new {
            return;
        }
        let changed: BTreeSet<ResId> = old
            .keys()
            .chain(new.keys())
            .copied()
            .filter(|r| old.get(r) != new.get(r))
            .collect();
        self.refresh_shared(&changed, node);
    }

    /// Recomputes every node sharing one of `rids`, except `except`.
    pub(super) fn refresh_shared(&mut self, rids: &BTreeSet<ResId>, except: &str) {
        let nodes: BTreeSet<String> = rids
            .iter()
            .filter_map(|r| self.shared_nodes.get(r))
            .flatten()
            .filter(|n| n.as_str() != except)
            .cloned()
            .collect();
        for n in nodes {
            self.recompute(&n);
        }
    }

    /// Updates the claims index for `key` from `old` to `new` (node, claims) and refreshes the
    /// nodes sharing a resource whose claims changed.
    pub(super) fn index_claims(
        &mut self,
        key: &str,
        old: Option<(String, Claims)>,
        new: Option<(String, Claims)>,
    ) {
        if old == new {
            return;
        }
        let mut changed: BTreeSet<ResId> = BTreeSet::new();
        if let Some((_, claims)) = &old {
            for (rid, _) in claims {
                if let Some(m) = self.claims.get_mut(rid) {
                    m.remove(key);
                    if m.is_empty() {
                        self.claims.remove(rid);
                    }
                }
                changed.insert(*rid);
            }
        }
        if let Some((node, claims)) = new {
            for (rid, ids) in claims {
                self.claims
                    .entry(rid)
                    .or_default()
                    .insert(key.to_owned(), (node.clone(), ids));
                changed.insert(rid);
            }
        }
        changed.retain(|r| self.shared_nodes.contains_key(r));
        if !changed.is_empty() {
            self.refresh_shared(&changed, "");
        }
    }

    /// IDs of cluster-shared resource `rid` that are not free for `node`: held on another node
    /// (its NRT) or claimed by a bound pod's record anywhere.
    pub(super) fn taken_in_cluster(&self, rid: ResId, node: &str) -> BTreeSet<&str> {
        let mut out: BTreeSet<&str> = BTreeSet::new();
        for other in self.shared_nodes.get(&rid).into_iter().flatten() {
            if other != node
                && let Some(ids) = self.published.get(other).and_then(|t| t.cluster_held.get(&rid))
            {
                out.extend(ids.iter().map(String::as_str));
            }
        }
        // Claims on this node too: a pod bound here that the NRT does not show yet (after a
        // restart it has no assumption), or one the kubelet gave other slots than recorded,
        // keeps its planned slot off until it is gone. Under-use for a while, never over-use.
        for (_, ids) in self.claims.get(&rid).into_iter().flat_map(|m| m.values()) {
            out.extend(ids.iter().map(String::as_str));
        }
        out
    }

    /// A bound pod's allocation record for `node`, parsed once for its device claims and what
    /// evicting it gives back. A record for another node (a failed Binding's leftover) is
    /// none; one that does not parse is counted.
    pub(super) fn record_for(&mut self, pod: &Pod, node: &str) -> Option<Allocation> {
        let value = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(numaplane::allocation::ANNOTATION))?;
        let record = match Allocation::parse(value) {
            Ok(r) => r,
            Err(e) => {
                self.anomalies.invalid_records += 1;
                tracing::debug!(
                    pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
                    error = %numaplane::error_chain(&e),
                    "allocation record ignored"
                );
                return None;
            }
        };
        (record.node == node).then_some(record)
    }
}

/// Removes `ids` of resource `rid` from a topology's free IDs, and as many from each zone's
/// available count: they are held on another node (cluster-shared slots).
pub(super) fn strip(topo: &mut NumaTopology, rid: ResId, ids: &BTreeSet<&str>) {
    for z in &mut topo.zones {
        if let Some(free) = z.free_devices.get_mut(&rid) {
            let before = free.len();
            free.retain(|d| !ids.contains(d.as_str()));
            let removed = i64::try_from(before - free.len()).unwrap_or(i64::MAX);
            z.available.sub_clamped(rid, removed);
        }
    }
}

/// The device IDs per resource that a record names, over all containers.
pub(super) fn claims_of(res: &mut Resources, record: &Allocation) -> Claims {
    let mut by_res: BTreeMap<ResId, BTreeSet<String>> = BTreeMap::new();
    for c in &record.containers {
        for (name, ids) in &c.devices {
            by_res
                .entry(res.intern(name))
                .or_default()
                .extend(ids.iter().cloned());
        }
    }
    by_res
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(rid, ids)| (rid, ids.into_iter().collect()))
        .collect()
}
