//! The `podTopologySpread` section of numaplane's scheduler configuration files, as
//! KubeSchedulerConfiguration's `PodTopologySpreadArgs`: `defaultingType` `System` (the default:
//! hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) or `List` with `defaultConstraints`.

use serde::{Deserialize, Serialize};

use super::index::SpreadDefaults;
use crate::{
    pod_facts::{SpreadConstraint, SpreadSelector},
    selector::{Selector, validate_key},
};

/// An invalid `podTopologySpread` section (upstream's `ValidatePodTopologySpreadArgs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpreadConfigError {
    /// A default constraint is invalid.
    #[error("podTopologySpread.defaultConstraints[{index}]: {reason}")]
    ValidateConstraint {
        /// Position in the list.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// `System` with constraints.
    #[error("podTopologySpread.defaultConstraints: must be empty when defaultingType is System")]
    ValidateDefaulting,
}

/// `defaultingType`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum DefaultingType {
    /// kube-scheduler's built-in defaults.
    #[default]
    System,
    /// `defaultConstraints` as given (none when empty).
    List,
}

/// One default constraint (no selector: the pod's controller decides which pods count).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultConstraintFile {
    /// `maxSkew` (> 0).
    pub max_skew: i32,
    /// `topologyKey`.
    pub topology_key: String,
    /// `DoNotSchedule` or `ScheduleAnyway`.
    pub when_unsatisfiable: String,
    /// `minDomains` (only with `DoNotSchedule`).
    #[serde(default)]
    pub min_domains: Option<i32>,
    /// `Honor` (default) or `Ignore`.
    #[serde(default)]
    pub node_affinity_policy: Option<String>,
    /// `Ignore` (default) or `Honor`.
    #[serde(default)]
    pub node_taints_policy: Option<String>,
}

/// The `podTopologySpread` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTopologySpreadFile {
    /// `System` or `List`.
    #[serde(default)]
    pub defaulting_type: DefaultingType,
    /// Constraints for `List`.
    #[serde(default)]
    pub default_constraints: Vec<DefaultConstraintFile>,
}

impl PodTopologySpreadFile {
    /// The defaults this section configures.
    pub fn defaults(&self) -> Result<SpreadDefaults, SpreadConfigError> {
        if self.defaulting_type == DefaultingType::System {
            if !self.default_constraints.is_empty() {
                return Err(SpreadConfigError::ValidateDefaulting);
            }
            return Ok(SpreadDefaults::default());
        }
        let mut constraints = Vec::new();
        for (index, c) in self.default_constraints.iter().enumerate() {
            let bad = |reason: &str| SpreadConfigError::ValidateConstraint {
                index,
                reason: reason.to_owned(),
            };
            if c.max_skew <= 0 {
                return Err(bad("maxSkew must be greater than zero"));
            }
            validate_key(&c.topology_key).map_err(|r| bad(&format!("topologyKey: {r}")))?;
            let hard = match c.when_unsatisfiable.as_str() {
                "DoNotSchedule" => true,
                "ScheduleAnyway" => false,
                _ => return Err(bad("whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway")),
            };
            if c.min_domains.is_some_and(|m| m <= 0 || !hard) {
                return Err(bad("minDomains must be positive and needs DoNotSchedule"));
            }
            let policy = |p: &Option<String>, default_honor: bool| match p.as_deref() {
                None => Ok(default_honor),
                Some("Honor") => Ok(true),
                Some("Ignore") => Ok(false),
                Some(_) => Err(bad("node inclusion policies must be Honor or Ignore")),
            };
            if constraints
                .iter()
                .any(|o: &SpreadConstraint| o.topology_key == c.topology_key && o.hard == hard)
            {
                return Err(bad("duplicate topologyKey and whenUnsatisfiable"));
            }
            constraints.push(SpreadConstraint {
                max_skew: c.max_skew,
                topology_key: c.topology_key.clone(),
                hard,
                selector: SpreadSelector::Labels(Selector::Nothing),
                min_domains: c.min_domains.unwrap_or(1),
                honor_node_affinity: policy(&c.node_affinity_policy, true)?,
                honor_node_taints: policy(&c.node_taints_policy, false)?,
            });
        }
        Ok(SpreadDefaults {
            constraints,
            system: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_list_and_validation() {
        let system = PodTopologySpreadFile::default().defaults().expect("system");
        assert!(system.system);
        assert_eq!(system.constraints.len(), 2);
        let list: PodTopologySpreadFile = serde_json::from_value(serde_json::json!({
            "defaultingType": "List",
            "defaultConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                    "whenUnsatisfiable": "DoNotSchedule"}]}))
        .expect("list");
        let d = list.defaults().expect("valid");
        assert!(!d.system && d.constraints[0].hard);
        let none: PodTopologySpreadFile =
            serde_json::from_value(serde_json::json!({"defaultingType": "List"})).expect("empty list");
        assert!(none.defaults().expect("valid").constraints.is_empty());
        let bad: PodTopologySpreadFile = serde_json::from_value(serde_json::json!({
            "defaultingType": "List",
            "defaultConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}))
        .expect("parses");
        assert!(bad.defaults().is_err());
        let mixed: PodTopologySpreadFile = serde_json::from_value(serde_json::json!({
            "defaultConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}))
        .expect("parses");
        assert_eq!(mixed.defaults(), Err(SpreadConfigError::ValidateDefaulting));
    }
}
