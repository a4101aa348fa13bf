//! Dynamic Resource Allocation: claims allocated from ResourceSlices the way kube-scheduler's
//! DynamicResources plugin allocates them (the v1.36 "incubating" structured allocator). Pure:
//! plain data in, an allocation or a reason out.

pub mod allocator;
mod capacity;
pub mod cel;
pub mod changes;
pub mod numa;
pub mod pools;
pub mod selectors;
pub mod slice;
pub mod state;
pub mod verdict;

pub use allocator::{AllocatedState, DeviceId, World, allocate, claim_key};
pub use selectors::SelectorCache;

/// Why claims could not be allocated. Only [`DraError::InvalidPools`] is about one node
/// ([`DraError::is_node_error`]); every other error is kube-scheduler's status Error: the
/// scheduling attempt of the pod fails and is retried later, and no other pod is affected.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DraError {
    /// A request names no DeviceClass (or is of a kind this allocator does not know).
    #[error("claim {claim}, request {request}: missing device class name (unsupported request type?)")]
    MissingClass {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error(
        "claim {claim}, request {request}: could not retrieve device class {class}: deviceclass.resource.k8s.io \"{class}\" not found (create the DeviceClass or fix deviceClassName)"
    )]
    UnknownClass {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// Class name.
        class: String,
    },
    /// A request's selector has no CEL expression.
    #[error(
        "claim {claim}, request {request}, selector #{index}: CEL expression empty (unsupported selector type?)"
    )]
    EmptySelector {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// Selector index.
        index: usize,
    },
    /// A DeviceClass's selector has no CEL expression.
    #[error("{owner}: selector #{index}: CEL expression empty (unsupported selector type?)")]
    EmptyClassSelector {
        /// `class <name>`.
        owner: String,
        /// Selector index.
        index: usize,
    },
    /// A count that is negative.
    #[error("claim {claim}, request {request}: exact count {count} is invalid")]
    BadCount {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// As written.
        count: i64,
    },
    /// An allocation mode this allocator does not know.
    #[error("claim {claim}, request {request}: unsupported count mode {mode}")]
    CountMode {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// As written.
        mode: String,
    },
    /// `allocationMode: All` while a pool is being updated.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently being updated"
    )]
    AllDevicesIncompletePool {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool`.
        pool: String,
    },
    /// `allocationMode: All` while a pool is invalid.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently invalid"
    )]
    AllDevicesInvalidPool {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool`.
        pool: String,
    },
    /// A claim asks for more devices than an allocation can hold.
    #[error("claim {claim}: number of requested devices {count} exceeds the claim limit of 32")]
    TooManyDevices {
        /// `namespace/name`.
        claim: String,
        /// At least this many.
        count: usize,
    },
    /// A constraint with neither matchAttribute nor distinctAttribute.
    #[error("claim {claim}, constraint #{index}: empty constraint (unsupported constraint type?)")]
    EmptyConstraint {
        /// `namespace/name`.
        claim: String,
        /// Constraint index.
        index: usize,
    },
    /// A selector does not compile.
    #[error("{owner}: selector #{index}: CEL compile error: {source}")]
    SelectorCompile {
        /// `class <name>` or `claim <namespace/name>`.
        owner: String,
        /// Selector index.
        index: usize,
        /// Why.
        source: Box<cel::CelError>,
    },
    /// A selector failed on a device.
    #[error("{owner}: selector #{index} on device {device}: CEL runtime error: {source}")]
    SelectorEvaluate {
        /// `class <name>` or `claim <namespace/name>`.
        owner: String,
        /// Selector index.
        index: usize,
        /// `driver/pool/device`.
        device: String,
        /// Why.
        source: Box<cel::CelError>,
    },
    /// `allocationMode: All` where a claim constraint rules out one of the devices.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    ConstraintForAll {
        /// `namespace/name`.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool/device`.
        device: String,
    },
    /// No solution, and a pool the node sees is invalid (this node only).
    #[error("invalid resource pools were encountered: pool {pool}: {reason}")]
    InvalidPools {
        /// `driver/pool`.
        pool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A ResourceSlice node selector with several terms.
    #[error(
        "create NodeSelector for claim {claim}: unsupported ResourceSlice.NodeSelector with {terms} terms"
    )]
    NodeSelectorTerms {
        /// Claim name.
        claim: String,
        /// How many.
        terms: usize,
    },
}

impl DraError {
    /// Whether only this node is unschedulable (kube-scheduler's ErrFailedAllocationOnNode);
    /// otherwise the whole scheduling attempt fails.
    pub fn is_node_error(&self) -> bool {
        matches!(self, DraError::InvalidPools { .. })
    }
}
