//! Consumable capacity: what a request consumes of a device's capacity under its request
//! policy, and whether it still fits beside what is consumed already.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, DeviceCapacity,
};
use numaplane::quantity::Quantity;

use super::slice::DeviceMap;

/// Capacity consumed per capacity name (fully qualified: `domain/name`).
pub type Consumed = BTreeMap<String, Quantity>;

/// `name` with the driver as domain when it has none.
pub fn qualify(name: &str, driver: &str) -> String {
    if name.contains('/') {
        name.to_owned()
    } else {
        format!("{driver}/{name}")
    }
}

fn q(k: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<Quantity> {
    Quantity::parse(&k.0).ok()
}

/// One published capacity, parsed.
struct Cap<'a> {
    /// The key as the device publishes it (written back in `consumedCapacity`).
    key: &'a str,
    value: Quantity,
    policy: Option<&'a CapacityRequestPolicy>,
}

/// The device's capacities by fully-qualified name; an entry qualified with the driver's
/// domain wins over an unqualified one of the same name. `None` if a value does not parse.
fn resolve<'a>(capacity: &'a DeviceMap<DeviceCapacity>, driver: &str) -> Option<BTreeMap<String, Cap<'a>>> {
    let mut out = BTreeMap::new();
    let prefix = format!("{driver}/");
    for explicit in [true, false] {
        for (name, cap) in capacity {
            if name.starts_with(&prefix) != explicit {
                continue;
            }
            let fq = qualify(name, driver);
            if out.contains_key(&fq) {
                continue;
            }
            out.insert(
                fq,
                Cap {
                    key: name,
                    value: q(&cap.value)?,
                    policy: cap.request_policy.as_ref(),
                },
            );
        }
    }
    Some(out)
}

/// What a request consumes: by fully-qualified name, and by the device's own spelling.
pub type Fit = (Consumed, BTreeMap<String, Quantity>);

/// Why a capacity request cannot be evaluated against a device (the device is skipped).
#[derive(Debug)]
pub struct Unusable;

/// What `requested` consumes of the device, keyed as the device publishes the names, if it fits
/// beside `consumed` (already allocated) and `allocating` (chosen in this attempt).
/// `Ok(None)`: it does not fit; `Err`: the request cannot be evaluated on this device.
pub fn fit(
    requested: Option<&CapacityRequirements>,
    capacity: Option<&DeviceMap<DeviceCapacity>>,
    driver: &str,
    consumed: Option<&Consumed>,
    allocating: Option<&Consumed>,
) -> Result<Option<Fit>, Unusable> {
    let Some(capacity) = capacity.filter(|c| !c.is_empty()) else {
        // Most devices: nothing to consume, so a request that names a capacity does not fit.
        let names_one = requested
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|r| !r.is_empty());
        return Ok((!names_one).then(|| (Consumed::new(), BTreeMap::new())));
    };
    let caps = resolve(capacity, driver).ok_or(Unusable)?;
    let mut requests: BTreeMap<String, Quantity> = BTreeMap::new();
    for (name, value) in requested.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
        let fq = qualify(name, driver);
        if !caps.contains_key(&fq) {
            // The device does not have this capacity.
            return Ok(None);
        }
        let v = q(value).ok_or(Unusable)?;
        if requests.insert(fq, v).is_some() {
            // Named both with and without the driver's domain.
            return Err(Unusable);
        }
    }
    let mut total = Consumed::new();
    let mut by_key = BTreeMap::new();
    for (fq, cap) in &caps {
        let amount = consumed_amount(requests.get(fq), cap.value, cap.policy).ok_or(Unusable)?;
        if amount.is_negative() {
            return Err(Unusable);
        }
        if violates(amount, cap.policy) {
            return Ok(None);
        }
        let mut sum = amount;
        for prior in [consumed, allocating].into_iter().flatten() {
            if let Some(p) = prior.get(fq) {
                sum = sum.checked_add(*p).ok_or(Unusable)?;
            }
        }
        if sum > cap.value {
            return Ok(None);
        }
        total.insert(fq.clone(), amount);
        by_key.insert(cap.key.to_owned(), amount);
    }
    Ok(Some((total, by_key)))
}

/// What a request of `requested` (none: the policy's default, else everything) consumes.
fn consumed_amount(
    requested: Option<&Quantity>,
    total: Quantity,
    policy: Option<&CapacityRequestPolicy>,
) -> Option<Quantity> {
    let Some(req) = requested else {
        return match policy.and_then(|p| p.default.as_ref()) {
            Some(d) => q(d),
            None => Some(total),
        };
    };
    let Some(policy) = policy else { return Some(*req) };
    if let Some(range) = policy.valid_range.as_ref() {
        return round_up_range(*req, q(&range.min)?, range);
    }
    if let Some(values) = policy.valid_values.as_ref() {
        for v in values {
            let v = q(v)?;
            if *req <= v {
                return Some(v);
            }
        }
    }
    Some(*req)
}

fn round_up_range(req: Quantity, min: Quantity, range: &CapacityRequestPolicyRange) -> Option<Quantity> {
    if req < min {
        return Some(min);
    }
    let Some(step) = range.step.as_ref() else {
        return Some(req);
    };
    let step_q = q(step)?;
    let step = i128::from(step_q.value_ceil());
    let min_v = i128::from(min.value_ceil());
    if step <= 0 {
        return Some(req);
    }
    let added = i128::from(req.value_ceil()) - min_v;
    let mut n = added / step;
    if added % step != 0 {
        n += 1;
    }
    let v = min_v.checked_add(step.checked_mul(n)?)?;
    let v = i64::try_from(v).ok()?;
    Some(Quantity::from_int(v, step_q.format()))
}

fn violates(amount: Quantity, policy: Option<&CapacityRequestPolicy>) -> bool {
    let Some(policy) = policy else { return false };
    if policy.default.as_ref().and_then(q) == Some(amount) {
        return false;
    }
    if let Some(range) = policy.valid_range.as_ref() {
        if range.max.as_ref().and_then(q).is_some_and(|max| amount > max) {
            return true;
        }
        if let (Some(step), Some(min)) = (range.step.as_ref().and_then(q), q(&range.min)) {
            let step = i128::from(step.value_ceil());
            if step > 0 && (i128::from(amount.value_ceil()) - i128::from(min.value_ceil())) % step != 0 {
                return true;
            }
        }
        return false;
    }
    if let Some(values) = policy.valid_values.as_ref().filter(|v| !v.is_empty()) {
        return !values.iter().filter_map(q).any(|v| v == amount);
    }
    false
}

/// `a += b` per name.
pub fn add_into(a: &mut Consumed, b: &Consumed) {
    for (k, v) in b {
        let e = a.entry(k.clone()).or_insert_with(Quantity::zero);
        *e = e.checked_add(*v).unwrap_or(*e);
    }
}

/// `a -= b` per name; names that reach zero are dropped.
pub fn sub_from(a: &mut Consumed, b: &Consumed) {
    for (k, v) in b {
        if let Some(e) = a.get_mut(k) {
            *e = e.checked_sub(*v).unwrap_or(*e);
            if e.is_zero() {
                a.remove(k);
            }
        }
    }
}
