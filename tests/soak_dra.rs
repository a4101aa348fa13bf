//! Dynamic Resource Allocation in the fault soak: GPUs published as ResourceSlices on the
//! static-memory nodes (not on the pod-scope ones), a DeviceClass selecting them by CEL, and
//! pods that claim one: some their own ResourceClaim, some one of a few claims shared by many
//! pods. The fake API has no kube-controller-manager, so [`Controller`] does the resourceclaim
//! controller's part the soak needs: a pod that is gone leaves `reservedFor`, an allocation
//! reserved for nobody is cleared, and a pod's own claim is deleted with it.
//!
//! Invariants ([`check`]), on every claim the API holds:
//! - no device is allocated to two claims;
//! - every allocation satisfies its claim: one device of the soak's driver, in the pool of a
//!   node that publishes it, listed in that node's slice, with a node selector naming the node;
//! - every pod in `reservedFor` that is bound is bound to that node, and every bound pod's
//!   claim is allocated and reserved for it (the allocation is written before the Binding).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use rand::{Rng as _, rngs::StdRng};
use serde_json::{Value, json};

use crate::fake_api::FakeApiServer;

/// The driver of the soak's devices.
pub const DRIVER: &str = "gpu.soak.example.com";
/// The DeviceClass.
pub const CLASS: &str = "soak-gpu";
/// Devices per node that publishes a slice.
pub const DEVICES: usize = 4;
/// Claims shared by many pods.
pub const SHARED: usize = 2;

/// What a soak pod claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraUse {
    /// Nothing.
    None,
    /// Its own claim (`<pod>-gpu`), as a template would give it.
    Own,
    /// Shared claim number N.
    Shared(usize),
}

impl DraUse {
    /// A quarter of the pods claim their own device, one in ten a shared one.
    pub fn random(rng: &mut StdRng) -> Self {
        match rng.random_range(0..20) {
            0..5 => DraUse::Own,
            5..7 => DraUse::Shared(rng.random_range(0..SHARED)),
            _ => DraUse::None,
        }
    }

    /// The claim's name for pod `pod`.
    pub fn claim(self, pod: &str) -> Option<String> {
        match self {
            DraUse::None => None,
            DraUse::Own => Some(format!("{pod}-gpu")),
            DraUse::Shared(i) => Some(format!("shared-gpu-{i}")),
        }
    }
}

fn claim_object(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}})
}

/// The DeviceClass, one ResourceSlice per node of `nodes`, and the shared claims.
pub fn setup(fake: &FakeApiServer, ns: &str, nodes: &[String]) {
    fake.put(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].model == 'soak'")}}]}}));
    for node in nodes {
        let devices: Vec<Value> = (0..DEVICES)
            .map(|d| json!({"name": format!("gpu-{d}"), "attributes": {"model": {"string": "soak"}}}))
            .collect();
        fake.put(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpus")},
            "spec": {"driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
        );
    }
    for i in 0..SHARED {
        fake.put(claim_object(ns, &format!("shared-gpu-{i}")));
    }
}

/// Makes `pod` (JSON) claim what `use_` says, creating its own claim first.
pub fn decorate(fake: &FakeApiServer, ns: &str, pod: &mut Value, use_: DraUse) {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let Some(claim) = use_.claim(&name) else { return };
    if use_ == DraUse::Own {
        fake.put(claim_object(ns, &claim));
    }
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
    if let Some(containers) = pod["spec"]["containers"].as_array_mut() {
        for c in containers {
            c["resources"]["claims"] = json!([{"name": "gpu"}]);
        }
    }
}

/// The resourceclaim controller's part: run [`Controller::sync`] now and then.
#[derive(Debug, Default)]
pub struct Controller {
    /// Reservations removed, allocations cleared, own claims deleted.
    pub counts: (usize, usize, usize),
    /// Pods seen alive: a claim is deleted only once its pod existed and is gone (the soak
    /// creates a pod's claim just before the pod).
    seen: BTreeSet<String>,
}

impl Controller {
    /// One pass over the namespace's claims and pods. Writes are optimistic (a conflict with
    /// the scheduler's write waits for the next pass).
    pub async fn sync(&mut self, client: &kube::Client, ns: &str) -> Result<(), kube::Error> {
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let live: BTreeMap<String, String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                p.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .filter_map(|p| Some((p.metadata.uid?, p.metadata.name?)))
            .collect();
        let names: BTreeSet<&String> = live.values().collect();
        self.seen.extend(live.values().cloned());
        for mut c in claims.list(&ListParams::default()).await?.items {
            let name = c.metadata.name.clone().unwrap_or_default();
            if let Some(pod) = name.strip_suffix("-gpu").filter(|_| !name.starts_with("shared-"))
                && !names.contains(&pod.to_owned())
                && self.seen.contains(pod)
                && c.status
                    .as_ref()
                    .and_then(|s| s.reserved_for.as_ref())
                    .is_none_or(Vec::is_empty)
                && c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none()
            {
                // Its pod is gone and the claim is given back: the claim goes.
                let _ = claims.delete(&name, &Default::default()).await;
                self.counts.2 += 1;
                continue;
            }
            // A pod reserved after the pod list was read is not in it: as the real controller
            // does when its informer does not know a pod, ask the API server before dropping.
            let mut keep: BTreeSet<String> = BTreeSet::new();
            for e in c.status.iter().flat_map(|s| s.reserved_for.iter().flatten()) {
                if live.contains_key(&e.uid) {
                    continue;
                }
                match pods.get_opt(&e.name).await? {
                    Some(p)
                        if p.metadata.uid.as_deref() == Some(e.uid.as_str())
                            && p.metadata.deletion_timestamp.is_none()
                            && !matches!(
                                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                                Some("Succeeded" | "Failed")
                            ) =>
                    {
                        keep.insert(e.uid.clone());
                    }
                    _ => {}
                }
            }
            let Some(status) = c.status.as_mut() else { continue };
            let before = status.reserved_for.as_ref().map_or(0, Vec::len);
            if let Some(r) = status.reserved_for.as_mut() {
                r.retain(|e| live.contains_key(&e.uid) || keep.contains(&e.uid));
            }
            let left = status.reserved_for.as_ref().map_or(0, Vec::len);
            let clear = left == 0 && status.allocation.is_some() && before > 0;
            if before == left && !clear {
                continue;
            }
            if clear {
                status.allocation = None;
                status.reserved_for = None;
            }
            if claims
                .replace_status(&name, &PostParams::default(), &c)
                .await
                .is_ok()
            {
                self.counts.0 += before - left;
                self.counts.1 += usize::from(clear);
            }
        }
        Ok(())
    }
}

/// The DRA invariants over `claims` and `pods` (see the module comment); `slices`: the nodes
/// that publish devices. `Err` names the violation and its subjects.
pub fn check(
    claims: &[ResourceClaim],
    pods: &[Pod],
    slices: &BTreeSet<String>,
) -> Result<usize, (String, Vec<String>)> {
    let mut holder: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut allocated = 0;
    let claim_node: BTreeMap<String, (String, BTreeSet<String>)> = claims
        .iter()
        .filter_map(|c| {
            let name = c.metadata.name.clone()?;
            let s = c.status.as_ref()?;
            let a = s.allocation.as_ref()?;
            let pool = a.devices.as_ref()?.results.as_ref()?.first()?.pool.clone();
            let uids = s.reserved_for.iter().flatten().map(|r| r.uid.clone()).collect();
            Some((name, (pool, uids)))
        })
        .collect();
    for c in claims {
        let name = c.metadata.name.clone().unwrap_or_default();
        let Some(a) = c.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            continue;
        };
        allocated += 1;
        let results = a
            .devices
            .as_ref()
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        let [r] = results.as_slice() else {
            return Err((
                format!(
                    "claim {name}: {} devices allocated, it asks for one",
                    results.len()
                ),
                vec![name],
            ));
        };
        let device = format!("{}/{}/{}", r.driver, r.pool, r.device);
        let known = (0..DEVICES).any(|d| r.device == format!("gpu-{d}"));
        if r.driver != DRIVER || !slices.contains(&r.pool) || !known || r.request != "gpu" {
            return Err((
                format!("claim {name}: allocated {device}, which no slice offers for its request"),
                vec![name],
            ));
        }
        let selects = a
            .node_selector
            .as_ref()
            .is_some_and(|s| serde_json::to_string(s).is_ok_and(|j| j.contains(&format!("\"{}\"", r.pool))));
        if !selects {
            return Err((
                format!(
                    "claim {name}: the allocation's node selector does not name {}",
                    r.pool
                ),
                vec![name],
            ));
        }
        if let Some(other) = holder.insert((r.pool.clone(), r.device.clone()), name.clone()) {
            return Err((
                format!("device {device} allocated to claims {other} and {name}"),
                vec![other, name],
            ));
        }
    }
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let pod = p.metadata.name.clone().unwrap_or_default();
        let claim = p
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.resource_claim_name.clone());
        let Some(claim) = claim else { continue };
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match claim_node.get(&claim) {
            Some((pool, uids)) if uids.contains(&uid) => {
                if *pool != node {
                    return Err((
                        format!("pod {pod} is bound to {node}, its claim {claim}'s device is on {pool}"),
                        vec![pod, claim],
                    ));
                }
            }
            _ => {
                return Err((
                    format!(
                        "pod {pod} is bound to {node} but its claim {claim} is not allocated and reserved for it"
                    ),
                    vec![pod, claim],
                ));
            }
        }
    }
    Ok(allocated)
}

/// What the DRA side of a run did.
#[derive(Debug, Default)]
pub struct Stats {
    /// Pods with a claim seen.
    pub pods: std::sync::atomic::AtomicUsize,
    /// The most claims allocated at once.
    pub most_allocated: std::sync::atomic::AtomicUsize,
    /// Passes of [`check`] that found nothing wrong.
    pub checks: std::sync::atomic::AtomicUsize,
}

/// Runs the controller's part and the checks every 300 ms until aborted; each violation goes
/// to `violate` (what, subjects). A pod named in a violation that is gone or being deleted by
/// the time it is read again is a race of the two lists, not a violation.
pub async fn watch(
    client: kube::Client,
    ns: String,
    slices: BTreeSet<String>,
    stats: std::sync::Arc<Stats>,
    violate: impl Fn(String, Vec<String>) + Send + 'static,
) {
    use std::sync::atomic::Ordering;
    let mut controller = Controller::default();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        // Faults fail requests at random: a failed pass is retried.
        let _ = controller.sync(&client, &ns).await;
        // Pods first: a pod bound in that list had its claim reserved before.
        let Ok(pod_list) = pods.list(&ListParams::default()).await else {
            continue;
        };
        let Ok(claim_list) = claims.list(&ListParams::default()).await else {
            continue;
        };
        seen.extend(
            pod_list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().is_some_and(|s| s.resource_claims.is_some()))
                .filter_map(|p| p.metadata.name.clone()),
        );
        stats.pods.store(seen.len(), Ordering::SeqCst);
        match check(&claim_list.items, &pod_list.items, &slices) {
            Ok(n) => {
                stats.most_allocated.fetch_max(n, Ordering::SeqCst);
                stats.checks.fetch_add(1, Ordering::SeqCst);
            }
            Err((what, subjects)) => {
                let pod = subjects.first().cloned().unwrap_or_default();
                let about_pod = what.starts_with("pod ");
                let still = match pods.get_opt(&pod).await {
                    Ok(Some(p)) => p.metadata.deletion_timestamp.is_none(),
                    Ok(None) => false,
                    Err(_) => true,
                };
                if !about_pod || still {
                    violate(what, subjects.iter().map(|s| format!("{ns}/{s}")).collect());
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, pool: &str, device: &str, uids: &[&str]) -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "soak"}, "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}},
                "reservedFor": uids.iter().map(|u| json!({"resource": "pods", "name": u, "uid": u})).collect::<Vec<_>>()}}))
        .unwrap()
    }

    fn pod(name: &str, node: &str, claim: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": name},
            "spec": {"nodeName": node, "containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}))
        .unwrap()
    }

    #[test]
    fn the_checks_catch_double_bookings_and_misplaced_pods() {
        let slices: BTreeSet<String> = ["n1".to_owned(), "n2".to_owned()].into();
        let ok = [
            claim("a", "n1", "gpu-0", &["p"]),
            claim("b", "n1", "gpu-1", &["q"]),
        ];
        assert_eq!(
            check(&ok, &[pod("p", "n1", "a"), pod("q", "n1", "b")], &slices),
            Ok(2)
        );
        let twice = [
            claim("a", "n1", "gpu-0", &["p"]),
            claim("b", "n1", "gpu-0", &["q"]),
        ];
        assert!(
            check(&twice, &[], &slices)
                .unwrap_err()
                .0
                .contains("allocated to claims a and b")
        );
        assert!(
            check(&ok, &[pod("p", "n2", "a")], &slices)
                .unwrap_err()
                .0
                .contains("is on n1")
        );
        assert!(
            check(&ok, &[pod("r", "n1", "a")], &slices)
                .unwrap_err()
                .0
                .contains("not allocated and reserved")
        );
        let nowhere = [claim("a", "n3", "gpu-0", &[])];
        assert!(
            check(&nowhere, &[], &slices)
                .unwrap_err()
                .0
                .contains("no slice offers")
        );
    }
}
