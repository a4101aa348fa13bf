//! Why a claim write failed: the vocabulary that the DRA writes of the engine raise and a
//! Binding reports ([`super::api::BindError::Claim`]), below both.

use std::time::Duration;

/// The finalizer that keeps an allocated claim from being deleted while in use.
pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// UpdateStatus attempts on conflict (kube-scheduler uses client-go's default retry, 5).
pub const CONFLICT_RETRIES: usize = 5;

/// Why a claim could not be reserved for a pod, or its devices were not ready in time.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Reading the claim after a conflict failed.
    #[error("reading ResourceClaim {claim}")]
    Get {
        /// `namespace/name`.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The finalizer Update failed.
    #[error("adding the {FINALIZER} finalizer to ResourceClaim {claim}")]
    Finalizer {
        /// `namespace/name`.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The status update (allocation and reservedFor) failed.
    #[error("writing the allocation and reservedFor of ResourceClaim {claim}")]
    Status {
        /// `namespace/name`.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Still conflicting after the retries.
    #[error("ResourceClaim {claim}: still conflicting after {CONFLICT_RETRIES} attempts")]
    Conflicts {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim is gone.
    #[error("ResourceClaim {claim} was deleted")]
    Gone {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim was allocated when the pod was decided and is not any more.
    #[error("ResourceClaim {claim} was deallocated meanwhile")]
    Deallocated {
        /// `namespace/name`.
        claim: String,
    },
    /// Someone else allocated other devices to the claim meanwhile.
    #[error("ResourceClaim {claim} was allocated other devices meanwhile")]
    AllocatedElsewhere {
        /// `namespace/name`.
        claim: String,
    },
    /// A device's binding failure condition is true.
    #[error("ResourceClaim {claim}: device {device}: binding failure condition {condition} is true")]
    BindingFailed {
        /// `namespace/name`.
        claim: String,
        /// `driver/pool/device`.
        device: String,
        /// The condition type.
        condition: String,
    },
    /// The binding conditions did not all hold within the timeout.
    #[error("ResourceClaim {claim}: binding conditions of device {device} not met within {timeout:?}")]
    BindingTimeout {
        /// `namespace/name`.
        claim: String,
        /// `driver/pool/device`.
        device: String,
        /// The configured bound.
        timeout: Duration,
    },
}

impl ClaimError {
    /// Bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ClaimError::Get { .. } => "claim_read",
            ClaimError::Finalizer { .. } => "claim_finalizer",
            ClaimError::Status { .. } | ClaimError::Conflicts { .. } => "claim_status",
            ClaimError::Gone { .. } => "claim_gone",
            ClaimError::AllocatedElsewhere { .. } => "claim_allocated_elsewhere",
            ClaimError::Deallocated { .. } => "claim_deallocated",
            ClaimError::BindingFailed { .. } => "binding_conditions_failed",
            ClaimError::BindingTimeout { .. } => "binding_conditions_timeout",
        }
    }
}
