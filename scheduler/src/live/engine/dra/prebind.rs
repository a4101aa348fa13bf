//! kube-scheduler's DynamicResources PreBind before the Binding: for each claim not yet
//! reserved for the pod, the `resource.kubernetes.io/delete-protection` finalizer (an Update),
//! then `status.allocation` with its `allocationTimestamp` and the pod appended to
//! `status.reservedFor` (one UpdateStatus, retried on conflict), then a bounded wait for the
//! devices' binding conditions. A binding that fails after that gives back what it wrote, as
//! kube-scheduler's Unreserve and PostFilter do; so does an unschedulable pod whose claim this
//! scheduler allocated and nobody else uses.

use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimConsumerReference};
use kube::{Api, api::PostParams};

use crate::live::{
    api::{BindError, Writer},
    claim_error::{CONFLICT_RETRIES, ClaimError, FINALIZER},
    metrics::Families,
};

/// The field manager of the claim writes: an unschedulable pod's claim is released only if
/// this manager wrote its allocation.
pub const FIELD_MANAGER: &str = "numaplane-scheduler";

/// How often binding conditions are checked while waiting (kube-scheduler: every 5 s).
const CONDITION_POLL: Duration = Duration::from_secs(1);

/// One claim of a pod to reserve before its Binding: the claim as the index knew it at the
/// decision (a starting point; conflicts re-read it) and the allocation it gets or has.
#[derive(Clone, Debug)]
pub struct ClaimWrite {
    /// The claim.
    pub claim: ResourceClaim,
    /// The allocation decided (or the claim's own, when it is allocated already).
    pub allocation: AllocationResult,
    /// Whether this binding allocates the claim (else it was allocated when the pod was
    /// decided, and a claim deallocated meanwhile fails the binding, as in kube-scheduler).
    pub allocate: bool,
}

/// What the binding of one pod wrote on one claim (to give back if the binding fails).
#[derive(Clone, Debug)]
pub struct Reserved {
    /// The claim's name.
    pub name: String,
    /// Whether this binding wrote the allocation (else it only appended the pod).
    pub allocated: bool,
    /// Whether this binding appended the pod to `reservedFor` (else it was there already).
    pub appended: bool,
    /// The claim's resourceVersion after the write (or as read, when nothing was written).
    pub resource_version: u64,
}

/// The pod a binding reserves claims for.
#[derive(Clone, Copy, Debug)]
pub struct PodRef<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// UID.
    pub uid: &'a str,
}

fn key_of(claim: &ResourceClaim) -> String {
    crate::dra::claim_key(claim)
}

fn timed_out() -> kube::Error {
    kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer within 30s",
    )))
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn reserved_for(claim: &ResourceClaim) -> &[ResourceClaimConsumerReference] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_deref())
        .unwrap_or_default()
}

fn is_reserved_for(claim: &ResourceClaim, uid: &str) -> bool {
    reserved_for(claim)
        .iter()
        .any(|r| r.resource == "pods" && r.uid == uid)
}

/// Whether two allocations hand out the same devices (timestamps aside).
fn same_devices(a: &AllocationResult, b: &AllocationResult) -> bool {
    a.devices == b.devices && a.node_selector == b.node_selector
}

impl Writer {
    async fn claim_call<T>(
        &self,
        kind: &'static str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.priority_budget().await;
        Families::count(&self.metrics().api_writes, kind);
        match tokio::time::timeout(Duration::from_secs(30), call).await {
            Ok(r) => r,
            Err(_) => Err(timed_out()),
        }
    }

    async fn get_claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client(), namespace);
        let claim = format!("{namespace}/{name}");
        match self.claim_call("resourceclaim_read", api.get(name)).await {
            Ok(c) => Ok(c),
            Err(e) if not_found(&e) => Err(ClaimError::Gone { claim }),
            Err(source) => Err(ClaimError::Get { claim, source }),
        }
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// Reserves `w`'s claim for `pod` as kube-scheduler's `bindClaim` does: the finalizer first
/// (an Update), then allocation, `allocationTimestamp` and the pod in `reservedFor` in one
/// UpdateStatus; on a conflict the claim is read again and the steps left are redone.
pub async fn reserve_claim(writer: &Writer, pod: PodRef<'_>, w: &ClaimWrite) -> Result<Reserved, ClaimError> {
    let name = w.claim.metadata.name.clone().unwrap_or_default();
    let api: Api<ResourceClaim> = Api::namespaced(writer.client(), pod.namespace);
    let mut claim = w.claim.clone();
    // The index's copy may carry an allocation in flight: the API's own status comes back with
    // every write, and a conflict re-reads it.
    let key = format!("{}/{name}", pod.namespace);
    // The index's copy can say "reserved" after this scheduler gave the reservation back (a
    // failed earlier binding) and before the watch shows that: trusting it would bind the pod
    // with no reservation, so "already reserved" is only believed from the API.
    let mut from_api = false;
    for _ in 0..CONFLICT_RETRIES {
        if is_reserved_for(&claim, pod.uid) {
            if !from_api {
                claim = writer.get_claim(pod.namespace, &name).await?;
                from_api = true;
                continue;
            }
            return Ok(Reserved {
                name,
                allocated: false,
                appended: false,
                resource_version: crate::dra::state::resource_version(&claim),
            });
        }
        // Checked before any write, as kube-scheduler checks a claim it read again: a claim
        // allocated elsewhere meanwhile (or our index's copy was behind) is not ours to touch,
        // not even to add the finalizer.
        match claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
            None if !w.allocate => return Err(ClaimError::Deallocated { claim: key }),
            Some(a) if !same_devices(a, &w.allocation) => {
                return Err(ClaimError::AllocatedElsewhere { claim: key });
            }
            _ => {}
        }
        if !claim.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER) {
            claim
                .metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(FINALIZER.to_owned());
            match writer
                .claim_call("resourceclaim", api.replace(&name, &post_params(), &claim))
                .await
            {
                Ok(c) => claim = c,
                Err(e) if conflict(&e) => {
                    claim = writer.get_claim(pod.namespace, &name).await?;
                    from_api = true;
                    continue;
                }
                Err(e) if not_found(&e) => return Err(ClaimError::Gone { claim: key }),
                Err(source) => return Err(ClaimError::Finalizer { claim: key, source }),
            }
        }
        let status = claim.status.get_or_insert_with(Default::default);
        let allocated = match &status.allocation {
            None if !w.allocate => return Err(ClaimError::Deallocated { claim: key }),
            None => {
                let mut a = w.allocation.clone();
                // kube-scheduler stamps every allocation it writes while the binding-conditions
                // and device-status features are on (v1.36's defaults).
                a.allocation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
                status.allocation = Some(a);
                true
            }
            Some(a) if same_devices(a, &w.allocation) => false,
            Some(_) => return Err(ClaimError::AllocatedElsewhere { claim: key }),
        };
        status
            .reserved_for
            .get_or_insert_with(Vec::new)
            .push(ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".to_owned(),
                name: pod.name.to_owned(),
                uid: pod.uid.to_owned(),
            });
        match writer
            .claim_call(
                "resourceclaim_status",
                api.replace_status(&name, &post_params(), &claim),
            )
            .await
        {
            Ok(c) => {
                return Ok(Reserved {
                    name,
                    allocated,
                    appended: true,
                    resource_version: crate::dra::state::resource_version(&c),
                });
            }
            Err(e) if conflict(&e) => {
                claim = writer.get_claim(pod.namespace, &name).await?;
                from_api = true;
            }
            Err(e) if not_found(&e) => return Err(ClaimError::Gone { claim: key }),
            Err(source) => return Err(ClaimError::Status { claim: key, source }),
        }
    }
    Err(ClaimError::Conflicts { claim: key })
}

/// A device of an allocation with binding conditions.
struct Conditioned {
    /// `driver/pool/device`.
    device: String,
    /// Conditions that must be true.
    needed: Vec<String>,
    /// Conditions that fail the binding when true.
    failures: Vec<String>,
    /// Driver, pool and device, as `status.devices` names them.
    id: (String, String, String),
}

/// Devices of `claim`'s allocation that carry binding conditions, with them.
fn conditioned(claim: &ResourceClaim) -> Vec<Conditioned> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    results
        .into_iter()
        .flatten()
        .filter(|r| r.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()))
        .map(|r| Conditioned {
            device: format!("{}/{}/{}", r.driver, r.pool, r.device),
            needed: r.binding_conditions.clone().unwrap_or_default(),
            failures: r.binding_failure_conditions.clone().unwrap_or_default(),
            id: (r.driver.clone(), r.pool.clone(), r.device.clone()),
        })
        .collect()
}

/// Whether every binding condition of `claim`'s devices holds: `Err` when a failure
/// condition is true, `Ok(Some(device))` for the first device still waiting.
fn binding_state(claim: &ResourceClaim) -> Result<Option<String>, ClaimError> {
    let statuses = claim
        .status
        .as_ref()
        .and_then(|s| s.devices.as_deref())
        .unwrap_or_default();
    let mut waiting = None;
    for Conditioned {
        device,
        needed,
        failures,
        id: (driver, pool, dev),
    } in conditioned(claim)
    {
        let conditions = statuses
            .iter()
            .find(|s| s.driver == driver && s.pool == pool && s.device == dev)
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let is_true = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
        if let Some(f) = failures.iter().find(|f| is_true(f)) {
            return Err(ClaimError::BindingFailed {
                claim: key_of(claim),
                device,
                condition: f.clone(),
            });
        }
        if waiting.is_none() && !needed.iter().all(|n| is_true(n)) {
            waiting = Some(device);
        }
    }
    Ok(waiting)
}

/// Waits, at most `timeout` from `started`, until the binding conditions of the devices of
/// the claims `names` hold (kube-scheduler's PreBind wait).
pub async fn wait_binding_conditions(
    writer: &Writer,
    namespace: &str,
    names: &[String],
    started: Instant,
    timeout: Duration,
) -> Result<(), ClaimError> {
    for name in names {
        loop {
            let claim = writer.get_claim(namespace, name).await?;
            let Some(device) = binding_state(&claim)? else {
                break;
            };
            if started.elapsed() >= timeout {
                return Err(ClaimError::BindingTimeout {
                    claim: format!("{namespace}/{name}"),
                    device,
                    timeout,
                });
            }
            tokio::time::sleep(CONDITION_POLL.min(timeout.saturating_sub(started.elapsed()))).await;
        }
    }
    Ok(())
}

/// kube-scheduler's PreBind and Bind for a pod with claims: each claim in `writes` reserved
/// for the pod, the binding conditions waited for (at most `timeout`), then the volumes' and
/// the pod's Binding. What was written is given back when a later step fails for certain
/// (not when the Binding's outcome is unknown, or the pod turns out bound already: then the
/// reservations are its own).
#[allow(clippy::too_many_arguments)]
pub async fn bind_with_claims(
    writer: &Writer,
    pod: PodRef<'_>,
    writes: &[ClaimWrite],
    timeout: Duration,
    node: &str,
    annotation: Option<&str>,
    volumes: &[String],
    written: &mut Vec<(String, u64)>,
) -> Result<(), BindError> {
    let started = Instant::now();
    let key = format!("{}/{}", pod.namespace, pod.name);
    let mut reserved = Vec::new();
    let mut names = Vec::new();
    for w in writes {
        // Only devices with binding conditions are waited for.
        let conditioned = w
            .allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .any(|r| r.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()));
        if conditioned {
            names.extend(w.claim.metadata.name.clone());
        }
        match reserve_claim(writer, pod, w).await {
            Ok(r) => {
                written.push((r.name.clone(), r.resource_version));
                if r.appended {
                    reserved.push(r);
                }
            }
            Err(source) => {
                unreserve(writer, pod, &reserved).await;
                return Err(BindError::Claim { pod: key, source });
            }
        }
    }
    if let Err(source) = wait_binding_conditions(writer, pod.namespace, &names, started, timeout).await {
        unreserve(writer, pod, &reserved).await;
        return Err(BindError::Claim { pod: key, source });
    }
    let result = crate::live::engine::volumes::bind_with_volumes(
        writer,
        pod.namespace,
        pod.name,
        (!pod.uid.is_empty()).then_some(pod.uid),
        node,
        annotation,
        volumes,
    )
    .await;
    // Only a Binding certainly refused gives the claims back: after a 5xx, a timeout or a
    // lost answer it may have landed, and a bound pod keeps its claims (its next attempt finds
    // them reserved for it; the resourceclaim controller frees them if it goes).
    if let Err(
        BindError::Replaced { .. }
        | BindError::Gated { .. }
        | BindError::NotFound { .. }
        | BindError::SelectNode { .. },
    ) = &result
    {
        unreserve(writer, pod, &reserved).await;
    }
    result
}

/// Gives back what a failed binding of `pod` wrote on its claims: the pod leaves
/// `reservedFor`; an allocation it wrote that no other pod uses now goes too (allocation,
/// `reservedFor` and device status cleared, as kube-scheduler's PostFilter does). The
/// finalizer stays: the resourceclaim controller removes it from an unallocated claim.
/// Failures are logged and counted: the claim watch shows what stayed.
pub async fn unreserve(writer: &Writer, pod: PodRef<'_>, reserved: &[Reserved]) {
    for r in reserved {
        if let Err(e) = unreserve_one(writer, pod, &r.name, r.allocated).await {
            Families::count(&writer.metrics().claim_release_errors, e.reason());
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), claim = %r.name,
                error = %numaplane::error_chain(&e), "cannot give back the claim's reservation");
        }
    }
}

async fn unreserve_one(
    writer: &Writer,
    pod: PodRef<'_>,
    name: &str,
    allocated: bool,
) -> Result<(), ClaimError> {
    let api: Api<ResourceClaim> = Api::namespaced(writer.client(), pod.namespace);
    let key = format!("{}/{name}", pod.namespace);
    for _ in 0..CONFLICT_RETRIES {
        let mut claim = match writer.get_claim(pod.namespace, name).await {
            Ok(c) => c,
            Err(ClaimError::Gone { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(status) = claim.status.as_mut() else {
            return Ok(());
        };
        let before = status.reserved_for.as_ref().map_or(0, Vec::len);
        if let Some(r) = status.reserved_for.as_mut() {
            r.retain(|e| !(e.resource == "pods" && e.uid == pod.uid));
        }
        let left = status.reserved_for.as_ref().map_or(0, Vec::len);
        let release = allocated && left == 0 && status.allocation.is_some();
        if before == left && !release {
            return Ok(());
        }
        if release {
            status.allocation = None;
            status.reserved_for = None;
            status.devices = None;
        }
        match writer
            .claim_call(
                "resourceclaim_status",
                api.replace_status(name, &post_params(), &claim),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if conflict(&e) => continue,
            Err(e) if not_found(&e) => return Ok(()),
            Err(source) => return Err(ClaimError::Status { claim: key, source }),
        }
    }
    Err(ClaimError::Conflicts { claim: key })
}

/// Whether this scheduler wrote `claim`'s allocation (its field manager owns
/// `status.allocation`).
pub fn allocated_by_us(claim: &ResourceClaim) -> bool {
    claim.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.subresource.as_deref() == Some("status")
            && m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status"))
                .is_some_and(|s| s.get("f:allocation").is_some())
    })
}

/// Whether an unschedulable `pod` (UID `uid`) should give back `claim`, as kube-scheduler's
/// PostFilter does, limited to what this scheduler allocated: allocated by us, not in flight,
/// and reserved for nobody or only this pod.
pub fn release_when_unschedulable(claim: &ResourceClaim, uid: &str) -> bool {
    let allocated = claim.status.as_ref().is_some_and(|s| s.allocation.is_some());
    let users = reserved_for(claim);
    allocated && allocated_by_us(claim) && users.iter().all(|r| r.resource == "pods" && r.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(v: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(v).expect("a claim")
    }

    #[test]
    fn binding_conditions_wait_then_hold_or_fail() {
        let base = json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "d", "pool": "p", "device": "g0",
                 "bindingConditions": ["Attached"], "bindingFailureConditions": ["AttachFailed"]}
            ]}}}
        });
        assert_eq!(
            binding_state(&claim(base.clone())).unwrap(),
            Some("d/p/g0".to_owned())
        );
        let mut ready = base.clone();
        ready["status"]["devices"] = json!([{"driver": "d", "pool": "p", "device": "g0", "conditions": [
            {"type": "Attached", "status": "True", "reason": "r", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]);
        assert_eq!(binding_state(&claim(ready)).unwrap(), None);
        let mut failed = base;
        failed["status"]["devices"] = json!([{"driver": "d", "pool": "p", "device": "g0", "conditions": [
            {"type": "AttachFailed", "status": "True", "reason": "r", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]);
        assert!(matches!(
            binding_state(&claim(failed)),
            Err(ClaimError::BindingFailed { condition, .. }) if condition == "AttachFailed"
        ));
    }

    #[test]
    fn only_allocations_this_scheduler_wrote_for_nobody_else_are_released() {
        let ours = json!({"manager": FIELD_MANAGER, "operation": "Update", "subresource": "status",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:allocation": {}, "f:reservedFor": {}}}});
        let theirs = json!({"manager": "kube-scheduler", "operation": "Update", "subresource": "status",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:allocation": {}}}});
        let make = |mf: serde_json::Value, reserved: serde_json::Value| {
            claim(json!({
                "metadata": {"name": "c", "namespace": "ns", "managedFields": [mf]},
                "spec": {},
                "status": {"allocation": {"devices": {"results": []}}, "reservedFor": reserved}
            }))
        };
        let me = json!([{"resource": "pods", "name": "p", "uid": "u1"}]);
        let other = json!([{"resource": "pods", "name": "q", "uid": "u2"}]);
        assert!(release_when_unschedulable(&make(ours.clone(), me.clone()), "u1"));
        assert!(release_when_unschedulable(&make(ours.clone(), json!([])), "u1"));
        assert!(!release_when_unschedulable(&make(ours, other), "u1"));
        assert!(!release_when_unschedulable(&make(theirs, me), "u1"));
    }
}
