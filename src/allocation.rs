//! The recorded allocation: the pod annotation `numaplane.io/allocation`, written by the
//! scheduler on the Binding so it lands atomically with `spec.nodeName`, and read by the
//! node-side allocator. This is the format's one home: both sides use these types.
//!
//! Versioned JSON with a strict parser: unknown versions, unknown fields and inconsistent
//! content are typed errors, never guesses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Container role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// Regular init container.
    Init,
    /// Restartable init container.
    Sidecar,
    /// App container.
    App,
}

impl ContainerKind {
    /// How a message names a container of this kind.
    pub fn noun(self) -> &'static str {
        match self {
            ContainerKind::Init => "init container",
            ContainerKind::Sidecar => "sidecar container",
            ContainerKind::App => "container",
        }
    }
}

/// Annotation key.
pub const ANNOTATION: &str = "numaplane.io/allocation";
/// Current schema version.
pub const VERSION: &str = "v1";

/// The decision recorded on the pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocation {
    /// Schema version, `v1`.
    pub version: String,
    /// Node the pod was bound to; the allocator ignores records for other nodes.
    pub node: String,
    /// Topology Manager policy the prediction used.
    pub policy: String,
    /// Topology Manager scope the prediction used.
    pub scope: String,
    /// Pod-scope NUMA affinity (pod scope only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_numa_nodes: Option<Vec<u32>>,
    /// Per container, init containers first.
    pub containers: Vec<ContainerAllocation>,
    /// NRT pod-set fingerprint the decision was based on, if the node published one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nrt_fingerprint: Option<String>,
}

/// One container's recorded allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerAllocation {
    /// Container name.
    pub name: String,
    /// Container role.
    pub kind: ContainerKind,
    /// Predicted NUMA affinity; absent = any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<Vec<u32>>,
    /// Device IDs per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, Vec<String>>,
    /// Device counts per resource where the node published no IDs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_counts: BTreeMap<String, i64>,
}

/// A malformed allocation annotation.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    /// Not JSON of the expected shape.
    #[error("parsing the {ANNOTATION} annotation")]
    Parse(#[source] serde_json::Error),
    /// A version this build does not understand.
    #[error("{ANNOTATION} version {found:?} is not supported (expected {VERSION:?})")]
    UnsupportedVersion {
        /// The version found.
        found: String,
    },
    /// Semantically invalid content.
    #[error("{ANNOTATION} is inconsistent: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
}

impl Allocation {
    /// Serialises to the annotation value.
    pub fn to_annotation(&self) -> Result<String, AllocationError> {
        serde_json::to_string(self).map_err(AllocationError::Parse)
    }

    /// Strictly parses an annotation value.
    pub fn parse(value: &str) -> Result<Self, AllocationError> {
        // Check the version before the full shape, so a future schema reports its version.
        let raw: serde_json::Value = serde_json::from_str(value).map_err(AllocationError::Parse)?;
        match raw.get("version").and_then(serde_json::Value::as_str) {
            Some(VERSION) => {}
            Some(other) => {
                return Err(AllocationError::UnsupportedVersion {
                    found: other.to_owned(),
                });
            }
            None => {
                return Err(AllocationError::Invalid {
                    reason: "missing string field \"version\"".to_owned(),
                });
            }
        }
        let a: Allocation = serde_json::from_value(raw).map_err(AllocationError::Parse)?;
        a.validate()?;
        Ok(a)
    }

    fn validate(&self) -> Result<(), AllocationError> {
        let invalid = |reason: String| Err(AllocationError::Invalid { reason });
        if self.node.is_empty() {
            return invalid("empty node".to_owned());
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &self.containers {
            if !names.insert((&c.name, c.kind == ContainerKind::App)) {
                return invalid(format!("container {:?} listed twice", c.name));
            }
            for (res, ids) in &c.devices {
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() != ids.len() {
                    return invalid(format!("container {:?}: duplicate device IDs for {res}", c.name));
                }
                if ids.iter().any(String::is_empty) {
                    return invalid(format!("container {:?}: empty device ID for {res}", c.name));
                }
            }
            if c.device_counts.values().any(|n| *n <= 0) {
                return invalid(format!("container {:?}: non-positive device count", c.name));
            }
            if c.numa_nodes
                .as_ref()
                .is_some_and(|n| n.is_empty() || n.iter().any(|id| *id > 63))
            {
                return invalid(format!(
                    "container {:?}: NUMA node list empty or id above 63",
                    c.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Allocation {
        Allocation {
            version: VERSION.into(),
            node: "n1".into(),
            policy: "single-numa-node".into(),
            scope: "container".into(),
            pod_numa_nodes: None,
            containers: vec![ContainerAllocation {
                name: "app".into(),
                kind: ContainerKind::App,
                numa_nodes: Some(vec![1]),
                devices: BTreeMap::from([("nvidia.com/gpu".into(), vec!["gpu-2".into()])]),
                device_counts: BTreeMap::new(),
            }],
            nrt_fingerprint: Some("pfp0v001ef46db3751d8e999".into()),
        }
    }

    #[test]
    fn round_trip() {
        let a = sample();
        let s = a.to_annotation().expect("serialize");
        assert_eq!(Allocation::parse(&s).expect("parse"), a);
        assert!(s.contains("\"numaNodes\":[1]"), "{s}");
    }

    #[test]
    fn strict_errors() {
        assert!(matches!(
            Allocation::parse("not json"),
            Err(AllocationError::Parse(_))
        ));
        assert!(matches!(
            Allocation::parse(r#"{"version":"v9","node":"x"}"#),
            Err(AllocationError::UnsupportedVersion { found }) if found == "v9"
        ));
        assert!(matches!(
            Allocation::parse(r#"{"node":"x"}"#),
            Err(AllocationError::Invalid { .. })
        ));
        let mut v = serde_json::to_value(sample()).expect("json");
        v["surprise"] = serde_json::json!(1);
        assert!(matches!(
            Allocation::parse(&v.to_string()),
            Err(AllocationError::Parse(_))
        ));
        let mut dup = sample();
        dup.containers[0]
            .devices
            .insert("r".into(), vec!["a".into(), "a".into()]);
        let s = serde_json::to_string(&dup).expect("json");
        assert!(matches!(
            Allocation::parse(&s),
            Err(AllocationError::Invalid { .. })
        ));
    }
}
