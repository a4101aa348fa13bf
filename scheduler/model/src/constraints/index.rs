//! The pods, node labels and Namespaces the constraint plugins read, kept up to date by the
//! cluster index's events, with what kube-scheduler's PreFilter would recompute every cycle
//! maintained incrementally instead: the terms of existing pods' (anti-)affinity, grouped by
//! identical term, each with its pod count per topology value; and label, namespace and owner
//! postings to find the pods a selector matches without scanning every pod.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use crate::{
    pod_facts::{AffinityTerm, PodFacts, SpreadConstraint, SpreadSelector},
    selector::{Op, Selector},
};

/// The role of an existing pod's term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TermKind {
    /// Required anti-affinity: the symmetry filter.
    RequiredAnti,
    /// Required affinity: scored with `hardPodAffinityWeight`.
    RequiredAffinity,
    /// Preferred affinity: scored with its weight.
    Preferred,
    /// Preferred anti-affinity: scored with minus its weight.
    PreferredAnti,
}

/// Identical terms of existing pods, counted per topology value of their pods' nodes.
#[derive(Clone, Debug, Default)]
pub struct Group {
    /// Pods per topology value (only pods on known nodes carrying the topology key).
    pub counts: super::FxMap<String, i64>,
    /// Pods holding the term, anywhere.
    pods: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GroupKey {
    kind: TermKind,
    weight: i32,
    term: AffinityTerm,
}

/// An indexed pod.
#[derive(Clone, Debug)]
pub struct Entry {
    /// `namespace/name`.
    pub key: String,
    /// Its node.
    pub node: String,
    /// Its facts.
    pub facts: Arc<PodFacts>,
}

/// kube-scheduler's `defaultConstraints` for pods without their own spread constraints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpreadDefaults {
    /// The constraints (selector ignored: the pod's controller's pods count).
    pub constraints: Vec<SpreadConstraint>,
    /// `defaultingType: System` (nodes without the zone label still get hostname spreading).
    pub system: bool,
}

impl Default for SpreadDefaults {
    /// The system defaults: hostname maxSkew 3 and zone maxSkew 5, ScheduleAnyway.
    fn default() -> Self {
        let c = |key: &str, skew: i32| SpreadConstraint {
            max_skew: skew,
            topology_key: key.to_owned(),
            hard: false,
            selector: SpreadSelector::Labels(Selector::Nothing),
            min_domains: 1,
            honor_node_affinity: true,
            honor_node_taints: false,
        };
        SpreadDefaults {
            constraints: vec![
                c("kubernetes.io/hostname", 3),
                c("topology.kubernetes.io/zone", 5),
            ],
            system: true,
        }
    }
}

/// The constraint index.
#[derive(Clone, Debug, Default)]
pub struct ConstraintIndex {
    /// Labels of the known nodes (the copy group counts are keyed by).
    node_labels: HashMap<String, BTreeMap<String, String>>,
    /// Per label key, the known nodes per value: the topology domains without a scan.
    label_values: super::FxMap<String, super::FxMap<String, u32>>,
    /// Pod ids per node name (nodes known or not).
    node_pods: HashMap<String, Vec<u32>>,
    /// Pods by id; `None` for a free id.
    pods: Vec<Option<Entry>>,
    free: Vec<u32>,
    ids: HashMap<String, u32>,
    /// Namespace labels by name.
    namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Pod ids by label key, then value.
    by_label: HashMap<String, HashMap<String, HashSet<u32>>>,
    /// Pod ids by namespace.
    by_namespace: HashMap<String, HashSet<u32>>,
    /// Pod ids by controller.
    by_owner: HashMap<String, HashSet<u32>>,
    /// Existing pods' terms.
    groups: HashMap<GroupKey, Group>,
    /// Default spread constraints.
    pub(crate) defaults: SpreadDefaults,
}

/// kube-scheduler's default `hardPodAffinityWeight`.
pub const HARD_POD_AFFINITY_WEIGHT: i32 = 1;

impl ConstraintIndex {
    /// Sets the default spread constraints.
    pub fn set_defaults(&mut self, defaults: SpreadDefaults) {
        self.defaults = defaults;
    }

    /// Adds or updates a node's labels; its pods' term counts follow the new labels.
    pub fn set_node(&mut self, name: &str, labels: &BTreeMap<String, String>) {
        if self.node_labels.get(name) == Some(labels) {
            return;
        }
        let ids = self.node_pods.get(name).cloned().unwrap_or_default();
        for &id in &ids {
            self.count_terms(id, -1, false);
        }
        if let Some(old) = self.node_labels.insert(name.to_owned(), labels.clone()) {
            self.count_values(&old, -1);
        }
        self.count_values(labels, 1);
        for &id in &ids {
            self.count_terms(id, 1, false);
        }
    }

    fn count_values(&mut self, labels: &BTreeMap<String, String>, sign: i32) {
        for (k, v) in labels {
            let values = self.label_values.entry(k.clone()).or_default();
            let n = values.entry(v.clone()).or_default();
            *n = n.saturating_add_signed(sign);
            if *n == 0 {
                values.remove(v);
            }
            if values.is_empty() {
                self.label_values.remove(k);
            }
        }
    }

    /// The values label `key` has on known nodes, with how many nodes have each.
    pub fn label_values(&self, key: &str) -> Option<&super::FxMap<String, u32>> {
        self.label_values.get(key)
    }

    /// Removes a node: its pods stay indexed but no longer count (they are in no node's
    /// snapshot), until a node of that name returns.
    pub fn delete_node(&mut self, name: &str) {
        let ids = self.node_pods.get(name).cloned().unwrap_or_default();
        for &id in &ids {
            self.count_terms(id, -1, false);
        }
        if let Some(old) = self.node_labels.remove(name) {
            self.count_values(&old, -1);
        }
    }

    /// Adds or updates a Namespace's labels.
    pub fn set_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        self.namespaces.insert(name.to_owned(), labels);
    }

    /// Removes a Namespace.
    pub fn delete_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Replaces every Namespace.
    pub fn reset_namespaces(&mut self, all: impl IntoIterator<Item = (String, BTreeMap<String, String>)>) {
        self.namespaces = all.into_iter().collect();
    }

    /// The labels of a known Namespace.
    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(name)
    }

    /// Records the pod `key` on `node` (bound or assumed), replacing what was known of it.
    pub fn set_pod(&mut self, key: &str, node: &str, facts: &Arc<PodFacts>) {
        self.remove_pod(key);
        let id = self.free.pop().unwrap_or_else(|| {
            self.pods.push(None);
            u32::try_from(self.pods.len() - 1).unwrap_or(u32::MAX)
        });
        let Some(slot) = self.pods.get_mut(id as usize) else {
            return;
        };
        *slot = Some(Entry {
            key: key.to_owned(),
            node: node.to_owned(),
            facts: Arc::clone(facts),
        });
        self.ids.insert(key.to_owned(), id);
        self.node_pods.entry(node.to_owned()).or_default().push(id);
        for (k, v) in &facts.labels {
            self.by_label
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(id);
        }
        self.by_namespace
            .entry(facts.namespace.clone())
            .or_default()
            .insert(id);
        if let Some(o) = &facts.owner {
            self.by_owner.entry(o.id.clone()).or_default().insert(id);
        }
        self.count_terms(id, 1, true);
    }

    /// Forgets the pod `key`.
    pub fn remove_pod(&mut self, key: &str) {
        let Some(id) = self.ids.remove(key) else { return };
        self.count_terms(id, -1, true);
        let Some(e) = self.pods.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        if let Some(ids) = self.node_pods.get_mut(&e.node) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.node_pods.remove(&e.node);
            }
        }
        for (k, v) in &e.facts.labels {
            if let Some(values) = self.by_label.get_mut(k) {
                if let Some(set) = values.get_mut(v) {
                    set.remove(&id);
                    if set.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.by_label.remove(k);
                }
            }
        }
        remove_posting(&mut self.by_namespace, &e.facts.namespace, id);
        if let Some(o) = &e.facts.owner {
            remove_posting(&mut self.by_owner, &o.id, id);
        }
        self.free.push(id);
    }

    /// Adds (`sign` 1) or removes (-1) pod `id` to or from its groups' counts (by its node's
    /// current labels), and, with `membership`, to or from the groups themselves.
    fn count_terms(&mut self, id: u32, sign: i64, membership: bool) {
        let Some(e) = self.pods.get(id as usize).and_then(Option::as_ref) else {
            return;
        };
        let Some(a) = e.facts.affinity.as_deref() else {
            return;
        };
        let labels = self.node_labels.get(&e.node);
        let terms = a
            .required_anti
            .iter()
            .map(|t| (TermKind::RequiredAnti, 0, t))
            .chain(
                a.required
                    .iter()
                    .map(|t| (TermKind::RequiredAffinity, HARD_POD_AFFINITY_WEIGHT, t)),
            )
            .chain(a.preferred.iter().map(|(w, t)| (TermKind::Preferred, *w, t)))
            .chain(
                a.preferred_anti
                    .iter()
                    .map(|(w, t)| (TermKind::PreferredAnti, *w, t)),
            );
        for (kind, weight, term) in terms {
            let key = GroupKey {
                kind,
                weight,
                term: term.clone(),
            };
            let value = labels.and_then(|l| l.get(&term.topology_key));
            let group = self.groups.entry(key.clone()).or_default();
            if membership {
                group.pods = group.pods.saturating_add(sign);
            }
            if let Some(v) = value {
                let c = group.counts.entry(v.clone()).or_default();
                *c = c.saturating_add(sign);
                if *c <= 0 {
                    group.counts.remove(v);
                }
            }
            if group.pods <= 0 {
                self.groups.remove(&key);
            }
        }
    }

    /// Existing pods' term groups of `kind` (with the weight scoring uses).
    pub fn groups(&self, kind: TermKind) -> impl Iterator<Item = (&AffinityTerm, i32, &Group)> {
        self.groups
            .iter()
            .filter(move |(k, _)| k.kind == kind)
            .map(|(k, g)| (&k.term, k.weight, g))
    }

    /// Whether any existing pod has a term of `kind`.
    pub fn has_groups(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The labels of a known node.
    pub fn node_labels(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.node_labels.get(node)
    }

    /// The pods indexed on `node`.
    pub fn pods_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.node_pods
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|&id| self.pods.get(id as usize).and_then(Option::as_ref))
    }

    /// Pods on known nodes that may match `selector` (a superset: callers check each), found
    /// through the narrowest posting an `In` or `Exists` requirement gives, else all pods of
    /// `namespace` when given, else every pod.
    pub fn candidates<'a>(
        &'a self,
        selector: &'a Selector,
        namespace: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Entry> + 'a> {
        let Selector::All(reqs) = selector else {
            return Box::new(std::iter::empty());
        };
        let mut best: Option<(usize, Vec<&HashSet<u32>>)> = None;
        for r in reqs {
            let sets: Vec<&HashSet<u32>> = match r.op {
                Op::In => {
                    let values = self.by_label.get(&r.key);
                    r.values
                        .iter()
                        .filter_map(|v| values.and_then(|m| m.get(v)))
                        .collect()
                }
                Op::Exists => self
                    .by_label
                    .get(&r.key)
                    .into_iter()
                    .flat_map(|m| m.values())
                    .collect(),
                _ => continue,
            };
            let size: usize = sets.iter().map(|s| s.len()).sum();
            if best.as_ref().is_none_or(|(b, _)| size < *b) {
                best = Some((size, sets));
            }
        }
        let ids: Box<dyn Iterator<Item = u32> + 'a> = match (best, namespace) {
            (Some((_, sets)), _) => Box::new(sets.into_iter().flatten().copied()),
            (None, Some(ns)) => Box::new(self.by_namespace.get(ns).into_iter().flatten().copied()),
            (None, None) => Box::new(0..u32::try_from(self.pods.len()).unwrap_or(u32::MAX)),
        };
        Box::new(
            ids.filter_map(|id| self.pods.get(id as usize).and_then(Option::as_ref))
                .filter(|e| self.node_labels.contains_key(&e.node)),
        )
    }

    /// Pods on known nodes owned by controller `owner`.
    pub fn owned<'a>(&'a self, owner: &str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.by_owner
            .get(owner)
            .into_iter()
            .flatten()
            .filter_map(|&id| self.pods.get(id as usize).and_then(Option::as_ref))
            .filter(|e| self.node_labels.contains_key(&e.node))
    }

    /// Number of indexed pods (tests).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

fn remove_posting(map: &mut HashMap<String, HashSet<u32>>, key: &str, id: u32) {
    if let Some(set) = map.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn facts(v: serde_json::Value) -> Arc<PodFacts> {
        let pod: Pod = serde_json::from_value(v).expect("pod");
        Arc::new(PodFacts::from_pod(
            &pod,
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        ))
    }

    fn anti_pod() -> Arc<PodFacts> {
        facts(
            serde_json::json!({"metadata": {"name": "a", "labels": {"app": "db"}}, "spec": {"containers": [],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}]}}}}),
        )
    }

    fn zone(z: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("zone".to_owned(), z.to_owned())])
    }

    #[test]
    fn groups_follow_pods_and_node_labels() {
        let mut ix = ConstraintIndex::default();
        ix.set_node("n1", &zone("a"));
        ix.set_pod("default/a", "n1", &anti_pod());
        ix.set_pod("default/b", "n1", &anti_pod());
        let counts = |ix: &ConstraintIndex| -> Vec<(String, i64)> {
            let mut v: Vec<(String, i64)> = ix
                .groups(TermKind::RequiredAnti)
                .flat_map(|(_, _, g)| g.counts.iter().map(|(k, c)| (k.clone(), *c)))
                .collect();
            v.sort();
            v
        };
        assert_eq!(counts(&ix), vec![("a".to_owned(), 2)]);
        ix.set_node("n1", &zone("b"));
        assert_eq!(counts(&ix), vec![("b".to_owned(), 2)]);
        ix.remove_pod("default/a");
        assert_eq!(counts(&ix), vec![("b".to_owned(), 1)]);
        ix.delete_node("n1");
        assert!(counts(&ix).is_empty());
        assert!(ix.has_groups(), "the pod still holds its term");
        ix.remove_pod("default/b");
        assert!(!ix.has_groups());
        assert!(ix.is_empty());
    }

    #[test]
    fn candidates_use_the_narrowest_posting_and_skip_unknown_nodes() {
        let mut ix = ConstraintIndex::default();
        ix.set_node("n1", &zone("a"));
        for i in 0..5 {
            let f = facts(serde_json::json!({"metadata": {"name": format!("p{i}"),
                "labels": {"app": "web", "idx": i.to_string()}}, "spec": {"containers": []}}));
            ix.set_pod(&format!("default/p{i}"), if i == 4 { "gone" } else { "n1" }, &f);
        }
        let s: Selector = Selector::from_label_selector(Some(
            &serde_json::from_value(serde_json::json!({"matchLabels": {"app": "web", "idx": "1"}}))
                .expect("sel"),
        ))
        .expect("valid");
        let found: Vec<&str> = ix.candidates(&s, None).map(|e| e.key.as_str()).collect();
        assert_eq!(found, vec!["default/p1"]);
        let all = Selector::everything();
        assert_eq!(ix.candidates(&all, Some("default")).count(), 4);
        assert_eq!(ix.candidates(&Selector::Nothing, None).count(), 0);
    }
}
