//! kube-scheduler's PodTopologySpread: `DoNotSchedule` constraints in the filter (maxSkew against
//! the global minimum over eligible domains, minDomains, the node inclusion policies) and
//! `ScheduleAnyway` ones in the score; the default constraints for pods that set none.

use std::collections::BTreeMap;

use super::{
    FxMap,
    index::{ConstraintIndex, Entry},
};
use crate::{
    fit,
    node::NodeBasics,
    pod_facts::{PodFacts, SpreadConstraint, SpreadSelector},
};

/// kube-scheduler's reason text.
pub const CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
/// kube-scheduler's reason text for a node without a constraint's topology key.
pub const NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const HOSTNAME: &str = "kubernetes.io/hostname";

/// The pod's `DoNotSchedule` constraints (what [`Filter::new`] takes).
pub fn hard_constraints(ix: &ConstraintIndex, pod: &PodFacts) -> Vec<SpreadConstraint> {
    constraints(ix, pod, true)
}

/// The constraints of `pod` for one action (`hard`: filter), explicit ones if the pod has any,
/// else the defaults with its controller's pods as the selector (none without a controller).
fn constraints(ix: &ConstraintIndex, pod: &PodFacts, hard: bool) -> Vec<SpreadConstraint> {
    if !pod.spread.is_empty() {
        return pod.spread.iter().filter(|c| c.hard == hard).cloned().collect();
    }
    let Some(owner) = &pod.owner else {
        return Vec::new();
    };
    ix.defaults
        .constraints
        .iter()
        .filter(|c| c.hard == hard)
        .map(|c| SpreadConstraint {
            selector: SpreadSelector::Owner(owner.id.clone()),
            ..c.clone()
        })
        .collect()
}

/// Whether `pod` has any spread constraint to apply (explicit or default).
pub fn applies(ix: &ConstraintIndex, pod: &PodFacts) -> bool {
    !pod.spread.is_empty() || (pod.owner.is_some() && !ix.defaults.constraints.is_empty())
}

/// `countPodsMatchSelector` per node name: pods of the pod's namespace, not terminating, that
/// the selector selects (an empty label selector counts none, as upstream).
fn counts_per_node<'a>(
    ix: &'a ConstraintIndex,
    c: &'a SpreadConstraint,
    namespace: &str,
) -> FxMap<&'a str, i64> {
    let mut out: FxMap<&str, i64> = FxMap::default();
    let mut add = |e: &'a Entry| {
        if e.facts.namespace == namespace && !e.facts.terminating {
            *out.entry(e.node.as_str()).or_default() += 1;
        }
    };
    match &c.selector {
        SpreadSelector::Labels(s) if s.is_everything() => {}
        SpreadSelector::Labels(s) => ix
            .candidates(s, Some(namespace))
            .filter(|e| s.matches(&e.facts.labels))
            .for_each(&mut add),
        SpreadSelector::Owner(o) => ix.owned(o).for_each(&mut add),
    }
    out
}

fn self_match(c: &SpreadConstraint, pod: &PodFacts) -> bool {
    match &c.selector {
        SpreadSelector::Labels(s) => s.matches(&pod.labels),
        SpreadSelector::Owner(_) => true,
    }
}

fn has_all_keys(labels: &BTreeMap<String, String>, cs: &[SpreadConstraint]) -> bool {
    cs.iter().all(|c| labels.contains_key(&c.topology_key))
}

/// `matchNodeInclusionPolicies`.
fn included(c: &SpreadConstraint, pod: &PodFacts, node: &NodeBasics) -> bool {
    (!c.honor_node_affinity || pod.node_affinity.matches(&node.name, &node.labels))
        && (!c.honor_node_taints || fit::untolerated_taint(&node.taints, &pod.tolerations).is_none())
}

/// One filter constraint with its domain counts.
#[derive(Debug)]
struct Domains {
    c: SpreadConstraint,
    /// Matching pods per eligible domain (domains without pods are absent).
    counts: FxMap<String, i64>,
    /// The global minimum the skew is measured against.
    min: i64,
    self_match: i64,
}

/// The filter's pre-computed state (upstream's PreFilter domain counts).
#[derive(Debug)]
pub struct Filter {
    domains: Vec<Domains>,
}

impl Filter {
    /// PreFilter for `cs`, the pod's `DoNotSchedule` constraints ([`hard_constraints`]);
    /// `None` when there are none. `nodes` (every indexed node) is listed only when a node
    /// inclusion policy or several topology keys make eligibility a per-node question;
    /// otherwise every node with the key is eligible and the index knows the domains.
    pub fn new<'n>(
        ix: &ConstraintIndex,
        pod: &PodFacts,
        cs: Vec<SpreadConstraint>,
        nodes: impl FnOnce() -> Vec<&'n NodeBasics>,
    ) -> Option<Self> {
        if cs.is_empty() {
            return None;
        }
        let per_node: Vec<FxMap<&str, i64>> = cs
            .iter()
            .map(|c| counts_per_node(ix, c, &pod.namespace))
            .collect();
        let one_key = cs.iter().all(|c| c.topology_key == cs[0].topology_key);
        let trivial = one_key
            && cs
                .iter()
                .all(|c| !c.honor_node_taints && (!c.honor_node_affinity || pod.node_affinity.is_empty()));
        let mut counts: Vec<FxMap<String, i64>> = vec![FxMap::default(); cs.len()];
        let mut domains: Vec<usize> = vec![0; cs.len()];
        if trivial {
            for (i, c) in cs.iter().enumerate() {
                domains[i] = ix.label_values(&c.topology_key).map_or(0, |v| v.len());
                for (node, n) in &per_node[i] {
                    if let Some(v) = ix.node_labels(node).and_then(|l| l.get(&c.topology_key)) {
                        add(&mut counts[i], v, *n);
                    }
                }
            }
        } else {
            let mut seen: Vec<FxMap<&str, ()>> = vec![FxMap::default(); cs.len()];
            for n in nodes().into_iter().filter(|n| has_all_keys(&n.labels, &cs)) {
                for (i, c) in cs.iter().enumerate() {
                    if !included(c, pod, n) {
                        continue;
                    }
                    let Some(value) = n.labels.get(&c.topology_key) else {
                        continue;
                    };
                    seen[i].insert(value.as_str(), ());
                    if let Some(here) = per_node[i].get(n.name.as_str()) {
                        add(&mut counts[i], value, *here);
                    }
                }
            }
            for (d, s) in domains.iter_mut().zip(&seen) {
                *d = s.len();
            }
        }
        let domains = cs
            .into_iter()
            .zip(counts)
            .zip(domains)
            .map(|((c, counts), total)| {
                let few = i64::try_from(total).unwrap_or(i64::MAX) < i64::from(c.min_domains);
                let min = if few || (total > 0 && counts.len() < total) {
                    0
                } else {
                    counts.values().min().copied().unwrap_or(i64::from(i32::MAX))
                };
                Domains {
                    self_match: i64::from(self_match(&c, pod)),
                    min,
                    counts,
                    c,
                }
            })
            .collect();
        Some(Filter { domains })
    }

    /// Filter: the reason the node fails, if it does.
    pub fn check(&self, node: &NodeBasics) -> Option<&'static str> {
        for d in &self.domains {
            let Some(value) = node.labels.get(&d.c.topology_key) else {
                return Some(NODE_LABEL_NOT_MATCH);
            };
            let here = d.counts.get(value.as_str()).copied().unwrap_or(0);
            let skew = here.saturating_add(d.self_match).saturating_sub(d.min);
            if skew > i64::from(d.c.max_skew) {
                return Some(CONSTRAINTS_NOT_MATCH);
            }
        }
        None
    }
}

/// Adds `n` pods to domain `value`, allocating the key only for a new domain.
fn add(counts: &mut FxMap<String, i64>, value: &str, n: i64) {
    match counts.get_mut(value) {
        Some(c) => *c = c.saturating_add(n),
        None => {
            counts.insert(value.to_owned(), n);
        }
    }
}

/// Whether the pod has a `ScheduleAnyway` constraint (explicit, or a default one).
pub fn has_soft(ix: &ConstraintIndex, pod: &PodFacts) -> bool {
    !constraints(ix, pod, false).is_empty()
}

/// The score over the feasible nodes, normalised to 0..=100 as upstream's NormalizeScore
/// (nodes ignored for lacking a topology key get 0); `None` when the pod has no
/// `ScheduleAnyway` constraint.
pub fn score(
    ix: &ConstraintIndex,
    pod: &PodFacts,
    feasible: &[&NodeBasics],
    all: &[&NodeBasics],
) -> Option<Vec<i64>> {
    if feasible.is_empty() || all.is_empty() {
        return None;
    }
    let cs = constraints(ix, pod, false);
    if cs.is_empty() {
        return None;
    }
    // Only the system defaults spare nodes without every key (hostname spreading then
    // still applies to nodes without a zone).
    let require_all = !pod.spread.is_empty() || !ix.defaults.system;
    let ignored: Vec<bool> = feasible
        .iter()
        .map(|n| require_all && !has_all_keys(&n.labels, &cs))
        .collect();
    let mut domains: Vec<FxMap<&str, i64>> = vec![FxMap::default(); cs.len()];
    for (n, _) in feasible.iter().zip(&ignored).filter(|(_, i)| !**i) {
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key != HOSTNAME {
                domains[i]
                    .entry(n.labels.get(&c.topology_key).map_or("", String::as_str))
                    .or_insert(0);
            }
        }
    }
    let kept = ignored.iter().filter(|i| !**i).count();
    let weights: Vec<f64> = cs
        .iter()
        .zip(&domains)
        .map(|(c, d)| {
            let size = if c.topology_key == HOSTNAME { kept } else { d.len() };
            (size as f64 + 2.0).ln()
        })
        .collect();
    let per_node: Vec<FxMap<&str, i64>> = cs
        .iter()
        .map(|c| counts_per_node(ix, c, &pod.namespace))
        .collect();
    for n in all
        .iter()
        .filter(|n| !require_all || has_all_keys(&n.labels, &cs))
    {
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key == HOSTNAME || !included(c, pod, n) {
                continue;
            }
            let value = n.labels.get(&c.topology_key).map_or("", String::as_str);
            if let Some(slot) = domains[i].get_mut(value) {
                *slot = slot.saturating_add(per_node[i].get(n.name.as_str()).copied().unwrap_or(0));
            }
        }
    }
    let raw: Vec<Option<i64>> = feasible
        .iter()
        .zip(&ignored)
        .map(|(n, ignored)| {
            if *ignored {
                return None;
            }
            let mut s = 0.0f64;
            for (i, c) in cs.iter().enumerate() {
                let Some(value) = n.labels.get(&c.topology_key) else {
                    continue;
                };
                let cnt = if c.topology_key == HOSTNAME {
                    per_node[i].get(n.name.as_str()).copied().unwrap_or(0)
                } else {
                    domains[i].get(value.as_str()).copied().unwrap_or(0)
                };
                s += cnt as f64 * weights[i] + f64::from(c.max_skew.saturating_sub(1));
            }
            Some(s.round() as i64)
        })
        .collect();
    let valid = raw.iter().flatten();
    let min = valid.clone().min().copied().unwrap_or(i64::MAX);
    let max = valid.max().copied().unwrap_or(0).max(0);
    Some(
        raw.iter()
            .map(|s| match s {
                None => 0,
                Some(_) if max == 0 => 100,
                Some(s) => 100i64
                    .saturating_mul(max.saturating_add(min).saturating_sub(*s))
                    .checked_div(max)
                    .unwrap_or(0),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn facts(v: serde_json::Value) -> Arc<PodFacts> {
        let pod: Pod = serde_json::from_value(v).expect("pod");
        Arc::new(PodFacts::from_pod(&pod, "default"))
    }

    fn node(name: &str, zone: Option<&str>) -> NodeBasics {
        let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]);
        if let Some(z) = zone {
            labels.insert("zone".to_owned(), z.to_owned());
        }
        NodeBasics {
            name: name.to_owned(),
            labels,
            ..NodeBasics::default()
        }
    }

    /// The domains the index knows give the verdicts a scan of every node gives, whenever
    /// every node with the key is eligible (here `nodeTaintsPolicy: Honor` without taints
    /// forces the scan).
    #[test]
    fn index_domains_and_node_scan_agree() {
        let nodes: Vec<NodeBasics> = (0..12)
            .map(|i| node(&format!("n{i:02}"), (i % 5 != 4).then(|| ["a", "b", "c"][i % 3])))
            .collect();
        let mut ix = ConstraintIndex::default();
        for n in &nodes {
            ix.set_node(&n.name, &n.labels);
        }
        for (i, n) in [0, 0, 1, 3, 4, 6, 7, 9].iter().enumerate() {
            let p = facts(
                serde_json::json!({"metadata": {"name": format!("p{i}"), "labels": {"app": "s"}},
                "spec": {"containers": []}}),
            );
            ix.set_pod(&format!("default/p{i}"), &nodes[*n].name, &p);
        }
        let refs: Vec<&NodeBasics> = nodes.iter().collect();
        for (skew, min_domains) in [(1, 1), (2, 1), (1, 4), (3, 2)] {
            let pod_with = |taints: &str| {
                facts(
                    serde_json::json!({"metadata": {"name": "new", "labels": {"app": "s"}}, "spec": {"containers": [],
                    "topologySpreadConstraints": [{"maxSkew": skew, "topologyKey": "zone", "minDomains": min_domains,
                    "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": taints,
                    "labelSelector": {"matchLabels": {"app": "s"}}}]}}),
                )
            };
            let (quick, scan) = (pod_with("Ignore"), pod_with("Honor"));
            let verdicts = |p: &PodFacts| -> Vec<Option<&'static str>> {
                let f = Filter::new(&ix, p, hard_constraints(&ix, p), || refs.clone()).expect("a constraint");
                nodes.iter().map(|n| f.check(n)).collect()
            };
            let v = verdicts(&quick);
            assert_eq!(v, verdicts(&scan), "maxSkew {skew} minDomains {min_domains}");
            assert!(v.iter().any(Option::is_some) || skew > 1, "{v:?}");
            assert_eq!(v[4], Some(NODE_LABEL_NOT_MATCH), "n04 has no zone");
        }
    }
}
