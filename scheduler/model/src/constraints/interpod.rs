//! kube-scheduler's InterPodAffinity: the incoming pod's required affinity and anti-affinity,
//! existing pods' required anti-affinity (symmetry) in the filter; preferred terms both ways and
//! existing pods' required affinity (`hardPodAffinityWeight`) in the score.

use std::collections::BTreeMap;

use super::{
    FxMap,
    index::{ConstraintIndex, Entry, Group, TermKind},
};
use crate::{
    node::NodeBasics,
    pod_facts::{AffinityTerm, PodFacts},
};

/// kube-scheduler's reason texts.
pub const AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
/// See [`AFFINITY_NOT_MATCH`].
pub const ANTI_AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod anti-affinity rules";
/// See [`AFFINITY_NOT_MATCH`].
pub const EXISTING_ANTI_AFFINITY_NOT_MATCH: &str = "node(s) didn't satisfy existing pods anti-affinity rules";

/// Pods per topology key, then value.
type Counts = FxMap<String, FxMap<String, i64>>;

fn bump(counts: &mut Counts, key: &str, labels: &BTreeMap<String, String>, by: i64) {
    if let Some(v) = labels.get(key) {
        let c = counts
            .entry(key.to_owned())
            .or_default()
            .entry(v.clone())
            .or_default();
        *c = c.saturating_add(by);
    }
}

fn count(counts: &Counts, key: &str, value: &str) -> i64 {
    counts.get(key).and_then(|m| m.get(value)).copied().unwrap_or(0)
}

/// Whether an incoming pod's term selects the existing pod `other`: its namespace is named, or
/// the namespace selector is empty (every namespace), or it selects the namespace's labels
/// (known Namespaces only: upstream merges the selector against the Namespace lister).
pub fn incoming_term_matches(ix: &ConstraintIndex, t: &AffinityTerm, other: &PodFacts) -> bool {
    let ns = t.namespaces.contains(&other.namespace)
        || t.namespace_selector.is_everything()
        || (!t.namespace_selector.requirements().is_empty()
            && ix
                .namespace_labels(&other.namespace)
                .is_some_and(|l| t.namespace_selector.matches(l)));
    ns && t.selector.matches(&other.labels)
}

/// Whether an existing pod's term selects the incoming pod (its namespace's labels, or none when
/// the Namespace is unknown, as `GetNamespaceLabelsSnapshot` gives).
pub fn existing_term_matches(ix: &ConstraintIndex, t: &AffinityTerm, incoming: &PodFacts) -> bool {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    let ns = t.namespaces.contains(&incoming.namespace)
        || t.namespace_selector
            .matches(ix.namespace_labels(&incoming.namespace).unwrap_or(&EMPTY));
    ns && t.selector.matches(&incoming.labels)
}

/// The filter's pre-computed state (upstream `preFilterState`).
#[derive(Debug)]
pub struct Filter<'a> {
    pod: &'a PodFacts,
    /// Existing pods' anti-affinity groups that select the incoming pod.
    existing_anti: Vec<(&'a str, &'a Group)>,
    affinity: Counts,
    anti: Counts,
}

impl<'a> Filter<'a> {
    /// PreFilter; `None` when the plugin would skip (nothing to check).
    pub fn new(ix: &'a ConstraintIndex, pod: &'a PodFacts) -> Option<Self> {
        let existing_anti: Vec<(&str, &Group)> = ix
            .groups(TermKind::RequiredAnti)
            .filter(|(t, _, g)| !g.counts.is_empty() && existing_term_matches(ix, t, pod))
            .map(|(t, _, g)| (t.topology_key.as_str(), g))
            .collect();
        let a = pod.affinity.as_deref();
        let required = a.map_or(&[][..], |a| &a.required);
        let required_anti = a.map_or(&[][..], |a| &a.required_anti);
        if existing_anti.is_empty() && required.is_empty() && required_anti.is_empty() {
            return None;
        }
        let mut affinity = Counts::default();
        let mut anti = Counts::default();
        let labels_of = |e: &Entry| ix.node_labels(&e.node);
        if let Some(first) = required.first() {
            // Pods matching every term count once per term.
            for e in ix.candidates(&first.selector, None) {
                if required.iter().all(|t| incoming_term_matches(ix, t, &e.facts))
                    && let Some(l) = labels_of(e)
                {
                    for t in required {
                        bump(&mut affinity, &t.topology_key, l, 1);
                    }
                }
            }
        }
        for t in required_anti {
            for e in ix.candidates(&t.selector, None) {
                if incoming_term_matches(ix, t, &e.facts)
                    && let Some(l) = labels_of(e)
                {
                    bump(&mut anti, &t.topology_key, l, 1);
                }
            }
        }
        Some(Filter {
            pod,
            existing_anti,
            affinity,
            anti,
        })
    }

    /// Filter: the reason the node fails, if it does.
    pub fn check(&self, ix: &ConstraintIndex, node: &NodeBasics) -> Option<&'static str> {
        if !self.affinity_ok(ix, node) {
            return Some(AFFINITY_NOT_MATCH);
        }
        let anti_terms = self.pod.affinity.as_deref().map_or(&[][..], |a| &a.required_anti);
        if !self.anti.is_empty()
            && anti_terms.iter().any(|t| {
                node.labels
                    .get(&t.topology_key)
                    .is_some_and(|v| count(&self.anti, &t.topology_key, v) > 0)
            })
        {
            return Some(ANTI_AFFINITY_NOT_MATCH);
        }
        if self.existing_anti.iter().any(|(key, g)| {
            node.labels
                .get(*key)
                .is_some_and(|v| g.counts.get(v).is_some_and(|c| *c > 0))
        }) {
            return Some(EXISTING_ANTI_AFFINITY_NOT_MATCH);
        }
        None
    }

    fn affinity_ok(&self, ix: &ConstraintIndex, node: &NodeBasics) -> bool {
        let terms = self.pod.affinity.as_deref().map_or(&[][..], |a| &a.required);
        let mut pods_exist = true;
        for t in terms {
            let Some(v) = node.labels.get(&t.topology_key) else {
                // Every topology label must exist on the node.
                return false;
            };
            if count(&self.affinity, &t.topology_key, v) <= 0 {
                pods_exist = false;
            }
        }
        // The first pod of a group that selects itself may go anywhere its topology keys
        // exist, while no pod matches.
        pods_exist
            || (self.affinity.is_empty() && terms.iter().all(|t| incoming_term_matches(ix, t, self.pod)))
    }
}

/// The score before normalisation: per topology key and value, the summed weights.
#[derive(Debug)]
pub struct Score {
    topology: Counts,
}

impl Score {
    /// PreScore; `None` when the plugin would skip (no term of either side applies).
    pub fn new(ix: &ConstraintIndex, pod: &PodFacts) -> Option<Self> {
        let mut topology = Counts::default();
        if let Some(a) = pod.affinity.as_deref() {
            let terms = a
                .preferred
                .iter()
                .map(|(w, t)| (i64::from(*w), t))
                .chain(a.preferred_anti.iter().map(|(w, t)| (-i64::from(*w), t)));
            for (w, t) in terms {
                for e in ix.candidates(&t.selector, None) {
                    if incoming_term_matches(ix, t, &e.facts)
                        && let Some(l) = ix.node_labels(&e.node)
                    {
                        bump(&mut topology, &t.topology_key, l, w);
                    }
                }
            }
        }
        for (kind, sign) in [
            (TermKind::RequiredAffinity, 1i64),
            (TermKind::Preferred, 1),
            (TermKind::PreferredAnti, -1),
        ] {
            for (t, weight, g) in ix.groups(kind) {
                if g.counts.is_empty() || !existing_term_matches(ix, t, pod) {
                    continue;
                }
                let per_pod = sign.saturating_mul(i64::from(weight));
                let m = topology.entry(t.topology_key.clone()).or_default();
                for (v, n) in &g.counts {
                    let c = m.entry(v.clone()).or_default();
                    *c = c.saturating_add(per_pod.saturating_mul(*n));
                }
            }
        }
        (!topology.is_empty()).then_some(Score { topology })
    }

    /// Scores of `nodes`, normalised to 0..=100 as upstream's NormalizeScore.
    pub fn normalised(&self, nodes: &[&NodeBasics]) -> Vec<i64> {
        let raw: Vec<i64> = nodes
            .iter()
            .map(|n| {
                self.topology
                    .iter()
                    .filter_map(|(k, m)| n.labels.get(k).and_then(|v| m.get(v)))
                    .fold(0i64, |a, b| a.saturating_add(*b))
            })
            .collect();
        let (Some(min), Some(max)) = (raw.iter().min().copied(), raw.iter().max().copied()) else {
            return raw;
        };
        let diff = max.saturating_sub(min);
        raw.iter()
            .map(|s| {
                if diff > 0 {
                    (100.0 * (s.saturating_sub(min) as f64 / diff as f64)) as i64
                } else {
                    0
                }
            })
            .collect()
    }
}
