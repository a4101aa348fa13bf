//! Label selectors as apimachinery parses and matches them (`labels.NewRequirement`,
//! `metav1.LabelSelectorAsSelector`): the same validation, so a selector kube-scheduler refuses is
//! refused here too, and the same `Nothing` / `Everything` distinction, which several plugins
//! read (a nil selector matches no pod, an empty one every pod).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector that apimachinery would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A requirement failed `labels.NewRequirement`'s validation.
    #[error("parsing requirement {key:?} {operator}: {reason}")]
    ParseRequirement {
        /// Label key as written.
        key: String,
        /// Operator as written.
        operator: String,
        /// What is wrong.
        reason: String,
    },
}

/// A requirement operator (`Equals` is `In` with one value: they match alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// The label exists with one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label exists.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer above the value.
    Gt,
    /// The label is an integer below the value.
    Lt,
}

/// One parsed requirement.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub op: Op,
    /// Values (sorted, deduplicated: a set, as in apimachinery).
    pub values: Vec<String>,
}

impl Requirement {
    /// Validates and builds a requirement, as `labels.NewRequirement`.
    pub fn new(key: &str, op: Op, values: &[String], op_name: &str) -> Result<Self, SelectorError> {
        let bad = |reason: String| SelectorError::ParseRequirement {
            key: key.to_owned(),
            operator: op_name.to_owned(),
            reason,
        };
        if let Err(r) = validate_key(key) {
            return Err(bad(r));
        }
        match op {
            Op::In | Op::NotIn if values.is_empty() => {
                return Err(bad(
                    "for 'in', 'notin' operators, values set can't be empty".into()
                ));
            }
            Op::Exists | Op::DoesNotExist if !values.is_empty() => {
                return Err(bad(
                    "values set must be empty for exists and does not exist".into()
                ));
            }
            Op::Gt | Op::Lt => {
                if values.len() != 1 {
                    return Err(bad(
                        "for 'Gt', 'Lt' operators, exactly one value is required".into()
                    ));
                }
                if values.iter().any(|v| v.parse::<i64>().is_err()) {
                    return Err(bad(
                        "for 'Gt', 'Lt' operators, the value must be an integer".into()
                    ));
                }
            }
            _ => {}
        }
        for v in values {
            if let Err(r) = validate_value(v) {
                return Err(bad(r));
            }
        }
        let mut values = values.to_vec();
        values.sort_unstable();
        values.dedup();
        Ok(Requirement {
            key: key.to_owned(),
            op,
            values,
        })
    }

    /// `Requirement.Matches`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.op {
            Op::In => value.is_some_and(|v| self.values.binary_search(v).is_ok()),
            Op::NotIn => value.is_none_or(|v| self.values.binary_search(v).is_err()),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::Gt | Op::Lt => {
                let (Some(v), [bound]) = (value.and_then(|v| parse_go_int(v)), self.values.as_slice()) else {
                    return false;
                };
                let Some(bound) = parse_go_int(bound) else {
                    return false;
                };
                if self.op == Op::Gt { v > bound } else { v < bound }
            }
        }
    }
}

/// Go's `strconv.ParseInt(s, 10, 64)`: an optional sign and decimal digits only.
fn parse_go_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A parsed selector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Selector {
    /// Matches nothing (a nil `LabelSelector`).
    #[default]
    Nothing,
    /// Matches labels satisfying every requirement; no requirement is `Everything`.
    All(Vec<Requirement>),
}

impl Selector {
    /// The selector matching every label set.
    pub fn everything() -> Self {
        Selector::All(Vec::new())
    }

    /// `labels.Selector.Empty()`: the selector matches everything.
    pub fn is_everything(&self) -> bool {
        matches!(self, Selector::All(r) if r.is_empty())
    }

    /// `labels.Selector.Matches`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Nothing => false,
            Selector::All(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }

    /// Adds requirements (`Selector.Add`; `Nothing` stays `Nothing`, as its `Requirements()`
    /// reports none to add to).
    pub fn add(&mut self, reqs: impl IntoIterator<Item = Requirement>) {
        if let Selector::All(own) = self {
            own.extend(reqs);
            own.sort();
            own.dedup();
        }
    }

    /// The requirements, if any (`Nothing` has none).
    pub fn requirements(&self) -> &[Requirement] {
        match self {
            Selector::Nothing => &[],
            Selector::All(r) => r,
        }
    }

    /// `metav1.LabelSelectorAsSelector`.
    pub fn from_label_selector(sel: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(sel) = sel else {
            return Ok(Selector::Nothing);
        };
        let mut reqs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            reqs.push(Requirement::new(k, Op::In, std::slice::from_ref(v), "=")?);
        }
        for e in sel.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Op::In,
                "NotIn" => Op::NotIn,
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(SelectorError::ParseRequirement {
                        key: e.key.clone(),
                        operator: other.to_owned(),
                        reason: format!("{other:?} is not a valid label selector operator"),
                    });
                }
            };
            reqs.push(Requirement::new(
                &e.key,
                op,
                e.values.as_deref().unwrap_or(&[]),
                &e.operator,
            )?);
        }
        reqs.sort();
        reqs.dedup();
        Ok(Selector::All(reqs))
    }
}

/// `validation.IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain.
pub fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(format!("key {key:?}: prefix part must be non-empty"));
        }
        if !is_dns_subdomain(p) {
            return Err(format!(
                "key {key:?}: prefix part must be a lowercase RFC 1123 subdomain"
            ));
        }
    }
    if name.is_empty() || name.len() > 63 || !is_label_name(name) {
        return Err(format!(
            "key {key:?}: name part must consist of at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ));
    }
    Ok(())
}

/// `validation.IsValidLabelValue`: empty, or a name of at most 63 characters.
pub fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_label_name(value)) {
        Ok(())
    } else {
        Err(format!(
            "value {value:?}: a valid label must be an empty string or consist of at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ))
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain: dot-separated lowercase labels, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(v: serde_json::Value) -> Result<Selector, SelectorError> {
        let s: LabelSelector = serde_json::from_value(v).expect("selector json");
        Selector::from_label_selector(Some(&s))
    }

    #[test]
    fn nil_matches_nothing_and_empty_matches_everything() {
        let l = labels(&[("a", "b")]);
        assert!(!Selector::from_label_selector(None).expect("nil").matches(&l));
        let empty = sel(serde_json::json!({})).expect("empty");
        assert!(empty.is_everything());
        assert!(empty.matches(&l));
        assert!(empty.matches(&BTreeMap::new()));
    }

    #[test]
    fn operators_match_as_apimachinery() {
        let s = sel(serde_json::json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]},
                                 {"key": "team", "operator": "Exists"}]}))
        .expect("valid");
        assert!(s.matches(&labels(&[("app", "web"), ("team", "x")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("team", "x"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        let gt = Requirement::new("n", Op::Gt, &["5".to_owned()], "Gt").expect("gt");
        assert!(gt.matches(&labels(&[("n", "6")])));
        assert!(!gt.matches(&labels(&[("n", "5")])));
        assert!(!gt.matches(&labels(&[("n", "six")])));
        assert!(!gt.matches(&labels(&[("n", "0x7")])));
    }

    #[test]
    fn invalid_selectors_are_refused() {
        assert!(sel(serde_json::json!({"matchLabels": {"service": "a b"}})).is_err());
        assert!(
            sel(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}))
                .is_err()
        );
        assert!(
            sel(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}))
                .is_err()
        );
        assert!(
            sel(
                serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]})
            )
            .is_err()
        );
        assert!(
            sel(serde_json::json!({"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]})).is_err()
        );
        assert!(Requirement::new("n", Op::Gt, &["x".to_owned()], "Gt").is_err());
        assert!(
            Requirement::new("n", Op::Lt, &["-5".to_owned()], "Lt").is_err(),
            "-5 is not a label value"
        );
        assert!(
            Requirement::new("foo", Op::NotIn, &["invalid value: ___@#$%^".to_owned()], "NotIn").is_err()
        );
        assert!(Requirement::new("example.com/Key_1", Op::Exists, &[], "Exists").is_ok());
        assert!(Requirement::new("Example.com/k", Op::Exists, &[], "Exists").is_err());
    }
}
