//! A pod's required node affinity as component-helpers' `LazyErrorNodeSelector` reads it:
//! terms are ORed; a term that does not parse (an unknown operator, a `Gt` whose value is not an
//! integer, an invalid label key or value, `matchFields` with other than one value) matches no
//! node, so a pod whose only term is invalid fits nowhere, while a valid term beside it still
//! matches; an empty term matches nothing. The preferred terms the NodeAffinity score weighs go
//! through the same term parser and matcher ([`PreferredNodeAffinity`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, PreferredSchedulingTerm};

use crate::selector::{Op, Requirement};

/// Required node affinity: component-helpers' `LazyErrorNodeSelector` over a node's name and
/// labels (a DRA device's or a PersistentVolume's node selector, too).
pub fn affinity_matches(sel: &NodeSelector, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    RequiredNodeAffinity::new(&BTreeMap::new(), Some(sel)).matches(node_name, labels)
}

/// One field requirement (`matchFields`): only `metadata.name` exists on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldReq {
    key: String,
    value: String,
    equal: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    /// Parsed: labels and fields, both ANDed (`None` = the part is absent).
    Valid {
        labels: Option<Vec<Requirement>>,
        fields: Option<Vec<FieldReq>>,
    },
    /// Failed to parse: matches nothing (the error is what upstream logs).
    Invalid(String),
}

/// `nodeSelector` plus `requiredDuringSchedulingIgnoredDuringExecution`, parsed once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequiredNodeAffinity {
    /// `spec.nodeSelector` (exact matches).
    node_selector: BTreeMap<String, String>,
    /// Terms when the pod has a required node affinity.
    terms: Option<Vec<Term>>,
}

impl RequiredNodeAffinity {
    /// Parses the pod's node selector and required node affinity.
    pub fn new(node_selector: &BTreeMap<String, String>, required: Option<&NodeSelector>) -> Self {
        let terms = required.map(|ns| {
            ns.node_selector_terms
                .iter()
                .filter_map(|t| {
                    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
                    let fields = t.match_fields.as_deref().unwrap_or(&[]);
                    // Nil or empty terms select nothing and are dropped.
                    if exprs.is_empty() && fields.is_empty() {
                        return None;
                    }
                    Some(parse_term(exprs, fields))
                })
                .collect()
        });
        RequiredNodeAffinity {
            node_selector: node_selector.clone(),
            terms,
        }
    }

    /// Whether the pod has neither a node selector nor a required node affinity.
    pub fn is_empty(&self) -> bool {
        self.node_selector.is_empty() && self.terms.is_none()
    }

    /// `RequiredNodeAffinity.Match` (parse errors count as no match).
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        if !self.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
        let Some(terms) = &self.terms else { return true };
        terms.iter().any(|t| t.matches(node_name, labels))
    }

    /// The parse errors of the terms, if any (for messages).
    pub fn errors(&self) -> Vec<&str> {
        self.terms
            .iter()
            .flatten()
            .filter_map(|t| match t {
                Term::Invalid(e) => Some(e.as_str()),
                Term::Valid { .. } => None,
            })
            .collect()
    }
}

impl Term {
    fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Term::Invalid(_) => false,
            Term::Valid { labels: l, fields } => {
                l.as_ref().is_none_or(|reqs| reqs.iter().all(|r| r.matches(labels)))
                    // As component-helpers: the node's fields are its name alone (empty for a
                    // PersistentVolume's affinity, checked against labels only).
                    && fields.as_ref().is_none_or(|f| {
                        f.iter().all(|r| {
                            let v = if r.key == "metadata.name" { node_name } else { "" };
                            (v == r.value) == r.equal
                        })
                    })
            }
        }
    }
}

/// `preferredDuringSchedulingIgnoredDuringExecution`, parsed once as component-helpers'
/// `NewPreferredSchedulingTerms`: terms of weight 0 and empty terms are dropped; a term that
/// does not parse is an error for the whole list (kube-scheduler's NodeAffinity PreScore then
/// fails the pod's scheduling cycle), unlike required terms, where it only matches nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreferredNodeAffinity {
    /// Weighted, parsed terms.
    terms: Vec<(i64, Term)>,
    /// The parse errors, joined, when a term did not parse.
    error: Option<String>,
}

impl PreferredNodeAffinity {
    /// Parses the pod's preferred terms.
    pub fn new(preferred: &[PreferredSchedulingTerm]) -> Self {
        let mut terms = Vec::new();
        let mut errors = Vec::new();
        for (i, p) in preferred.iter().enumerate() {
            let exprs = p.preference.match_expressions.as_deref().unwrap_or(&[]);
            let fields = p.preference.match_fields.as_deref().unwrap_or(&[]);
            if p.weight == 0 || (exprs.is_empty() && fields.is_empty()) {
                continue;
            }
            match parse_term(exprs, fields) {
                Term::Invalid(e) => errors.push(format!("[{i}].preference: {e}")),
                t => terms.push((i64::from(p.weight), t)),
            }
        }
        if !errors.is_empty() {
            terms.clear();
        }
        PreferredNodeAffinity {
            terms,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }

    /// Whether there is nothing to score (no term survived, no error).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty() && self.error.is_none()
    }

    /// The parse error, if a term did not parse.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// `PreferredSchedulingTerms.Score`: the sum of the weights of the terms the node matches.
    pub fn score(&self, node_name: &str, labels: &BTreeMap<String, String>) -> i64 {
        self.terms
            .iter()
            .filter(|(_, t)| t.matches(node_name, labels))
            .fold(0i64, |acc, (w, _)| acc.saturating_add(*w))
    }
}

fn parse_term(exprs: &[NodeSelectorRequirement], fields: &[NodeSelectorRequirement]) -> Term {
    let mut errors = Vec::new();
    let mut labels = None;
    if !exprs.is_empty() {
        let mut reqs = Vec::new();
        for e in exprs {
            let op = match e.operator.as_str() {
                "In" => Op::In,
                "NotIn" => Op::NotIn,
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                "Gt" => Op::Gt,
                "Lt" => Op::Lt,
                other => {
                    errors.push(format!("matchExpressions: operator {other:?} is not supported"));
                    continue;
                }
            };
            match Requirement::new(&e.key, op, e.values.as_deref().unwrap_or(&[]), &e.operator) {
                Ok(r) => reqs.push(r),
                Err(err) => errors.push(format!("matchExpressions: {err}")),
            }
        }
        labels = Some(reqs);
    }
    let mut parsed_fields = None;
    if !fields.is_empty() {
        let mut reqs = Vec::new();
        for f in fields {
            let values = f.values.as_deref().unwrap_or(&[]);
            let equal = match f.operator.as_str() {
                "In" => true,
                "NotIn" => false,
                other => {
                    errors.push(format!("matchFields: operator {other:?} is not supported"));
                    continue;
                }
            };
            match values {
                [v] => reqs.push(FieldReq {
                    key: f.key.clone(),
                    value: v.clone(),
                    equal,
                }),
                _ => errors.push(format!("matchFields {}: must have one element", f.key)),
            }
        }
        parsed_fields = Some(reqs);
    }
    if errors.is_empty() {
        Term::Valid {
            labels,
            fields: parsed_fields,
        }
    } else {
        Term::Invalid(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity(v: serde_json::Value) -> RequiredNodeAffinity {
        let ns: NodeSelector = serde_json::from_value(v).expect("node selector");
        RequiredNodeAffinity::new(&BTreeMap::new(), Some(&ns))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_invalid_term_matches_no_node_but_a_valid_one_beside_it_does() {
        let only_invalid = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}]}));
        assert!(!only_invalid.matches("n1", &labels(&[("cores", "64")])));
        assert_eq!(only_invalid.errors().len(), 1);
        let bad_value = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "foo", "operator": "NotIn", "values": ["invalid value: ___@#$%^"]}]}]}));
        assert!(!bad_value.matches("n1", &labels(&[("foo", "bar")])));
        let with_valid = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}));
        assert!(with_valid.matches("n1", &labels(&[("zone", "a")])));
    }

    #[test]
    fn fields_and_empty_terms() {
        let by_name = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}));
        assert!(by_name.matches("n2", &BTreeMap::new()));
        assert!(!by_name.matches("n1", &BTreeMap::new()));
        let two_values = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]}));
        assert!(!two_values.matches("n1", &BTreeMap::new()));
        let empty = affinity(serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": []}]}));
        assert!(!empty.matches("n1", &BTreeMap::new()));
        let none = affinity(serde_json::json!({"nodeSelectorTerms": []}));
        assert!(!none.matches("n1", &BTreeMap::new()));
        let other_field = affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.uid", "operator": "NotIn", "values": ["x"]}]}]}));
        assert!(other_field.matches("n1", &BTreeMap::new()));
    }

    fn preferred(v: serde_json::Value) -> PreferredNodeAffinity {
        let terms: Vec<PreferredSchedulingTerm> = serde_json::from_value(v).expect("preferred terms");
        PreferredNodeAffinity::new(&terms)
    }

    #[test]
    fn preferred_terms_sum_the_weights_of_the_matching_ones() {
        let p = preferred(serde_json::json!([
            {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
            {"weight": 3, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}},
            {"weight": 0, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}},
            {"weight": 7, "preference": {}},
            {"weight": 11, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}}
        ]));
        assert!(!p.is_empty() && p.error().is_none());
        assert_eq!(p.score("n1", &labels(&[("disk", "ssd"), ("zone", "a")])), 8);
        assert_eq!(p.score("n1", &labels(&[("disk", "hdd")])), 0);
        assert_eq!(p.score("n2", &labels(&[("zone", "b")])), 14);
        assert!(preferred(serde_json::json!([])).is_empty());
        assert!(
            preferred(serde_json::json!([{"weight": 0, "preference": {
            "matchExpressions": [{"key": "a", "operator": "Bogus"}]}}]))
            .is_empty()
        );
    }

    #[test]
    fn a_preferred_term_that_does_not_parse_is_an_error_for_the_whole_list() {
        let p = preferred(serde_json::json!([
            {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
            {"weight": 3, "preference": {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}}
        ]));
        assert!(!p.is_empty());
        assert!(
            p.error().is_some_and(|e| e.starts_with("[1].preference: ")),
            "{:?}",
            p.error()
        );
        assert_eq!(p.score("n1", &labels(&[("disk", "ssd")])), 0);
    }

    #[test]
    fn node_selector_is_anded() {
        let a = RequiredNodeAffinity::new(&labels(&[("disk", "ssd")]), None);
        assert!(a.matches("n", &labels(&[("disk", "ssd"), ("x", "y")])));
        assert!(!a.matches("n", &labels(&[("disk", "hdd")])));
        assert!(RequiredNodeAffinity::default().is_empty());
    }
}
