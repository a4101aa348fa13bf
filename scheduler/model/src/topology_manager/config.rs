//! Kubelet Topology Manager configuration: policy, scope and policy options.

use std::fmt;
use std::str::FromStr;

use numaplane::parse_go_bool;

use super::TopologyManagerError;

/// `topologyManagerPolicy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Policy {
    /// `none`: hints are not collected, every pod is admitted (kubelet default).
    #[default]
    None,
    /// `best-effort`: hints are merged, every pod is admitted.
    BestEffort,
    /// `restricted`: admitted iff the merged hint is preferred.
    Restricted,
    /// `single-numa-node`: only single-node (or maskless) preferred hints are merged,
    /// admitted iff the merged hint is preferred.
    SingleNumaNode,
}

impl Policy {
    /// All policies.
    pub const ALL: [Self; 4] = [
        Self::None,
        Self::BestEffort,
        Self::Restricted,
        Self::SingleNumaNode,
    ];

    /// The kubelet spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::BestEffort => "best-effort",
            Self::Restricted => "restricted",
            Self::SingleNumaNode => "single-numa-node",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses the kubelet spelling exactly (the kubelet is case-sensitive).
impl FromStr for Policy {
    type Err = TopologyManagerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| TopologyManagerError::UnknownPolicy { value: s.to_owned() })
    }
}

/// `topologyManagerScope`. The merge itself is scope-independent: container scope merges
/// one container's hints, pod scope merges the pod-level hints once.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Scope {
    /// `container` (kubelet default).
    #[default]
    Container,
    /// `pod`.
    Pod,
}

impl Scope {
    /// All scopes.
    pub const ALL: [Self; 2] = [Self::Container, Self::Pod];

    /// The kubelet spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Pod => "pod",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = TopologyManagerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| TopologyManagerError::UnknownScope { value: s.to_owned() })
    }
}

pub use numaplane::nrt::kubelet_option::{MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES};
/// Default (and minimum) of `max-allowable-numa-nodes`.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// `topologyManagerPolicyOptions`.
///
/// Feature gates (`TopologyManagerPolicyBetaOptions`/`AlphaOptions`) are not modelled: a
/// node that publishes an option is assumed to run with the gate that allows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PolicyOptions {
    /// Break ties between equally wide masks by average NUMA distance (not used by
    /// `single-numa-node`). Requires the distance matrix.
    pub prefer_closest_numa_nodes: bool,
    /// Policies other than `none` refuse machines with more NUMA nodes than this.
    /// The kubelet rejects values below [`DEFAULT_MAX_ALLOWABLE_NUMA_NODES`].
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            prefer_closest_numa_nodes: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

impl PolicyOptions {
    /// Parses the kubelet's string map, e.g.
    /// `{"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "16"}`.
    ///
    /// Booleans accept Go's `strconv.ParseBool` spellings, integers Go's `strconv.Atoi`
    /// (optional sign, decimal digits). Options are checked in iteration order; the first
    /// problem is reported.
    ///
    /// # Errors
    /// [`TopologyManagerError::UnknownPolicyOption`], [`TopologyManagerError::InvalidPolicyOptionValue`]
    /// or [`TopologyManagerError::MaxAllowableNumaNodesTooLow`], the cases in which the kubelet
    /// refuses to start.
    pub fn from_kubelet_options<I, K, V>(options: I) -> Result<Self, TopologyManagerError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut opts = Self::default();
        for (name, value) in options {
            let (name, value) = (name.as_ref(), value.as_ref());
            let invalid = |expected| TopologyManagerError::InvalidPolicyOptionValue {
                name: name.to_owned(),
                value: value.to_owned(),
                expected,
            };
            match name {
                PREFER_CLOSEST_NUMA_NODES => {
                    opts.prefer_closest_numa_nodes =
                        parse_go_bool(value).ok_or_else(|| invalid("a boolean"))?;
                }
                MAX_ALLOWABLE_NUMA_NODES => {
                    let n: i64 = value.parse().map_err(|_| invalid("an integer"))?;
                    opts.max_allowable_numa_nodes = usize::try_from(n)
                        .ok()
                        .filter(|&n| n >= DEFAULT_MAX_ALLOWABLE_NUMA_NODES)
                        .ok_or(TopologyManagerError::MaxAllowableNumaNodesTooLow {
                            value: n,
                            minimum: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
                        })?;
                }
                _ => {
                    return Err(TopologyManagerError::UnknownPolicyOption {
                        name: name.to_owned(),
                        value: value.to_owned(),
                    });
                }
            }
        }
        Ok(opts)
    }
}
