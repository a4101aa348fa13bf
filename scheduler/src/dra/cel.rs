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
    Evaluate { expression: String, device: String, reason: String },
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


// TEMPORARY local shim (never committed): a few expression shapes for testing the allocator.
impl Selector {
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        for t in expression.split(" && ") {
            let t = t.trim();
            let ok = t.starts_with("device.driver == ")
                || t.starts_with("device.allowMultipleAllocations == ")
                || t.starts_with("device.attributes[")
                || t.starts_with("device.capacity[");
            if !ok {
                return Err(CelError::Compile { expression: expression.into(), reason: format!("ERROR: <input>:1:1: undeclared reference to '{t}'") });
            }
        }
        Ok(Selector { expression: expression.to_owned() })
    }
    pub fn expression(&self) -> &str { &self.expression }
    pub fn matches(&self, device: &DeviceView<'_>) -> Result<bool, CelError> {
        let err = |r: String| CelError::Evaluate { expression: self.expression.clone(), device: device.id.to_owned(), reason: r };
        for (k, a) in device.attributes.into_iter().flatten() {
            if a.bool.is_none() && a.int.is_none() && a.string.is_none() && a.version.is_none() {
                return Err(err(format!("attribute {k}: unsupported attribute value")));
            }
        }
        let lookup_attr = |dom: &str, name: &str| -> Option<&DeviceAttribute> {
            let attrs = device.attributes?;
            if let Some(a) = attrs.get(&format!("{dom}/{name}")) { return Some(a); }
            if dom == device.driver { return attrs.get(name); }
            None
        };
        for t in self.expression.split(" && ") {
            let t = t.trim();
            if let Some(v) = t.strip_prefix("device.driver == ") {
                if device.driver != v.trim_matches('"') { return Ok(false); }
            } else if let Some(v) = t.strip_prefix("device.allowMultipleAllocations == ") {
                if device.allow_multiple_allocations.unwrap_or(false) != (v == "true") { return Ok(false); }
            } else if let Some(rest) = t.strip_prefix("device.attributes[\"") {
                let (dom, rest) = rest.split_once("\"].").unwrap();
                let (name, cmp) = match rest.split_once(" == ") { Some((n, v)) => (n, Some(v.trim_matches('"'))), None => (rest, None) };
                let Some(a) = lookup_attr(dom, name) else { return Err(err(format!("no such key: {name}"))); };
                match cmp {
                    Some(v) => if a.string.as_deref().or(a.version.as_deref()) != Some(v) { return Ok(false); },
                    None => match a.bool { Some(b) => if !b { return Ok(false); }, None => return Err(err("no matching overload".into())) },
                }
            } else if let Some(rest) = t.strip_prefix("device.capacity[\"") {
                let (dom, rest) = rest.split_once("\"].").unwrap();
                let (name, rest) = rest.split_once(".compareTo(quantity(\"").unwrap();
                let (q, _) = rest.split_once('"').unwrap();
                let caps = device.capacity.ok_or_else(|| err("no such key".into()))?;
                let c = caps.get(&format!("{dom}/{name}")).or_else(|| if dom == device.driver { caps.get(name) } else { None }).ok_or_else(|| err(format!("no such key: {name}")))?;
                let have = numaplane::quantity::Quantity::parse(&c.value.0).unwrap();
                let want = numaplane::quantity::Quantity::parse(q).unwrap();
                if have < want { return Ok(false); }
            }
        }
        Ok(true)
    }
}
