//! CEL device selectors (`DeviceClass.spec.selectors[].cel`, `requests[].exactly.selectors[].cel`,
//! firstAvailable subrequests): compiled once per expression, evaluated per device, in the
//! environment kube-scheduler v1.36 gives them.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

/// Why a selector could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression does not compile (syntax, unknown function, wrong result type).
    #[error("compile CEL selector `{expression}`: {reason}")]
    Compile { expression: String, reason: String },
    /// The expression compiled but failed on this device (no such key, type mismatch, ...).
    #[error("evaluate CEL selector `{expression}` on device {device}: {reason}")]
    Evaluate {
        expression: String,
        device: String,
        reason: String,
    },
    /// The evaluation exceeded the cost limit (1,000,000, as the API server's).
    #[error("evaluate CEL selector `{expression}`: cost limit exceeded")]
    CostLimit { expression: String },
}

/// One device as a selector sees it (`device.driver`, `device.attributes`, `device.capacity`,
/// `device.allowMultipleAllocations`). Names are as written in the ResourceSlice: a name
/// without a domain belongs to the driver's domain.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    pub driver: &'a str,
    /// `driver/pool/device`, for error messages.
    pub id: &'a str,
    pub attributes: Option<&'a BTreeMap<String, DeviceAttribute>>,
    pub capacity: Option<&'a BTreeMap<String, DeviceCapacity>>,
    pub allow_multiple_allocations: Option<bool>,
}

/// A compiled selector.
#[derive(Debug, Clone)]
pub struct Selector {
    expression: String,
}

impl Selector {
    /// Compiles `expression`.
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        Err(CelError::Compile {
            expression: expression.to_owned(),
            reason: "CEL evaluation is not available in this build".into(),
        })
    }

    /// The source text.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Whether `device` matches.
    pub fn matches(&self, device: &DeviceView<'_>) -> Result<bool, CelError> {
        Err(CelError::Evaluate {
            expression: self.expression.clone(),
            device: device.id.to_owned(),
            reason: "CEL evaluation is not available in this build".into(),
        })
    }
}
