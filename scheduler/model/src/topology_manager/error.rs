//! The one error type of the Topology Manager model.

/// Everything that can fail in the Topology Manager model.
///
/// Configuration errors mirror the cases in which the kubelet refuses to start, so a node
/// whose published configuration produces one of them cannot run a kubelet with that
/// configuration either.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyManagerError {
    /// A NUMA node id does not fit into a 64-bit mask.
    #[error("NUMA node id {id} is out of range: masks hold node ids 0..=63")]
    NumaNodeIdOutOfRange {
        /// The offending id.
        id: u64,
    },
    /// `topologyManagerPolicy` is not one of the kubelet's policy names.
    #[error(
        "unknown topology manager policy {value:?} (expected none, best-effort, restricted or single-numa-node)"
    )]
    UnknownPolicy {
        /// The rejected text.
        value: String,
    },
    /// `topologyManagerScope` is not one of the kubelet's scope names.
    #[error("unknown topology manager scope {value:?} (expected container or pod)")]
    UnknownScope {
        /// The rejected text.
        value: String,
    },
    /// `topologyManagerPolicyOptions` names an option the kubelet does not know.
    #[error("unknown topology manager policy option {name:?} (value {value:?})")]
    UnknownPolicyOption {
        /// Option name.
        name: String,
        /// Option value.
        value: String,
    },
    /// A known policy option carries a value of the wrong type.
    #[error("bad value {value:?} for topology manager policy option {name:?}: expected {expected}")]
    InvalidPolicyOptionValue {
        /// Option name.
        name: String,
        /// The rejected value.
        value: String,
        /// What the kubelet would have accepted.
        expected: &'static str,
    },
    /// `max-allowable-numa-nodes` is set below the kubelet's minimum.
    #[error("max-allowable-numa-nodes is {value}, but it may not be less than {minimum}")]
    MaxAllowableNumaNodesTooLow {
        /// Configured value.
        value: i64,
        /// The kubelet's minimum (and default).
        minimum: usize,
    },
    /// The machine has more NUMA nodes than the policy may handle (policy ≠ `none`).
    #[error(
        "topology manager is unsupported on machines with more than {max_allowable} NUMA nodes (this one has {nodes})"
    )]
    TooManyNumaNodes {
        /// NUMA nodes of the machine.
        nodes: usize,
        /// The configured (or default) limit.
        max_allowable: usize,
    },
    /// The machine reports no NUMA node at all.
    #[error("no NUMA node ids given: a machine has at least one NUMA node")]
    NoNumaNodes,
    /// A NUMA node id appears twice in the machine's node list.
    #[error("NUMA node id {id} is listed more than once")]
    DuplicateNumaNode {
        /// The repeated id.
        id: u32,
    },
    /// `prefer-closest-numa-nodes` is on but the node distances are unknown.
    #[error("prefer-closest-numa-nodes needs the NUMA distance matrix, but none was given")]
    MissingNumaDistances,
    /// A distance matrix row has a different length than the number of rows.
    #[error("NUMA distance matrix is not square: row {row} has {len} entries, expected {expected}")]
    DistanceMatrixNotSquare {
        /// Index (= node id) of the bad row.
        row: usize,
        /// Its length.
        len: usize,
        /// The number of rows.
        expected: usize,
    },
    /// A node id has no row/column in the distance matrix.
    #[error("NUMA distance matrix of size {size} has no entry for node {id}")]
    DistanceMissing {
        /// The node without distances.
        id: u32,
        /// Rows (and columns) of the matrix.
        size: usize,
    },
}
