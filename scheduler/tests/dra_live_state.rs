//! The live loop's DRA state in the index: an allocation in flight holds its devices (and a
//! shared claim reads as allocated) through claim events that do not show it yet and through
//! relists, until the watch shows it written or the binding fails; a preemption counts the
//! devices a victim's claims give back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::{DeviceClass, ResourceClaim},
};
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    dra::slice::ResourceSlice,
    pod::PodSpec,
};
use serde_json::{Value, json};

fn node(name: &str) -> Node {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}}),
    )
    .unwrap()
}

fn slice(node: &str, devices: &[&str]) -> ResourceSlice {
    serde_json::from_value(json!({"metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": "gpu.example.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>()}}))
    .unwrap()
}

fn class() -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {}})).unwrap()
}

fn claim(name: &str) -> ResourceClaim {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu"}}]}}}),
    )
    .unwrap()
}

fn pod_json(name: &str, claim: &str, extra: Value) -> Value {
    let mut p = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}});
    if let (Some(p), Some(e)) = (p["spec"].as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            p.insert(k.clone(), v.clone());
        }
    }
    p
}

fn spec(c: &mut Cluster, p: Value) -> PodSpec {
    let pod: Pod = serde_json::from_value(p).unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

/// One node with one GPU, claims `a` and `b` (one device each).
fn cluster() -> Cluster {
    let mut c = Cluster::new();
    c.apply_node(&node("n1")).unwrap();
    c.dra.enable();
    c.dra.apply_class(class());
    c.dra.set_slices(vec![slice("n1", &["gpu-0"])]);
    c.dra.apply_claim(claim("a"));
    c.dra.apply_claim(claim("b"));
    c
}

/// A running pod `low` of priority 0 on n1, claiming `a`.
fn bind_low_on_n1(c: &mut Cluster) {
    let mut v = pod_json("low", "a", json!({"nodeName": "n1", "priority": 0}));
    v["status"] = json!({"phase": "Running"});
    let victim: Pod = serde_json::from_value(v).unwrap();
    c.apply_pod(&victim).unwrap();
}

fn placed(c: &Cluster, s: &PodSpec) -> Option<String> {
    let (d, outcome) = c.schedule_with_claims(&Config::default(), s, false);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    d.node
}

#[test]
fn an_allocation_in_flight_holds_its_device_until_written_or_released() {
    let mut c = cluster();
    let p1 = spec(&mut c, pod_json("p1", "a", json!({})));
    let p2 = spec(&mut c, pod_json("p2", "b", json!({})));
    let (d, outcome) = c.schedule_with_claims(&Config::default(), &p1, false);
    assert_eq!(d.node.as_deref(), Some("n1"));
    c.dra.assume("ns", "ns/p1", &outcome.claims);
    assert!(c.dra.in_flight("ns", "a"));
    assert_eq!(placed(&c, &p2), None, "the only GPU is in flight for p1");
    // A claim event that does not show the allocation yet (the finalizer Update) keeps it.
    let mut finalized = claim("a");
    finalized.metadata.finalizers = Some(vec!["resource.kubernetes.io/delete-protection".into()]);
    c.dra.apply_claim(finalized.clone());
    assert_eq!(placed(&c, &p2), None);
    // So does a relist.
    c.dra.reset_claims(vec![finalized.clone(), claim("b")]);
    assert!(c.dra.in_flight("ns", "a"));
    assert_eq!(placed(&c, &p2), None);
    // The binding failed: the device is free again.
    c.dra.release("ns", "ns/p1", &["a".to_owned()]);
    assert!(!c.dra.in_flight("ns", "a"));
    assert_eq!(placed(&c, &p2).as_deref(), Some("n1"));
    // Decided again, written and bound: held until the watch shows the version written.
    c.dra.assume("ns", "ns/p1", &outcome.claims);
    c.dra.written("ns", "ns/p1", &[("a".to_owned(), 5)]);
    assert!(c.dra.in_flight("ns", "a"));
    let mut older = finalized.clone();
    older.metadata.resource_version = Some("3".to_owned());
    c.dra.apply_claim(older);
    assert!(c.dra.in_flight("ns", "a"), "an older version does not end it");
    assert_eq!(placed(&c, &p2), None);
    let mut written = finalized;
    written.metadata.resource_version = Some("5".to_owned());
    written.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(outcome.claims[0].allocation.clone()),
        ..Default::default()
    });
    c.dra.apply_claim(written.clone());
    assert!(!c.dra.in_flight("ns", "a"));
    // A late failure report of that binding frees nothing the API holds.
    c.dra.release("ns", "ns/p1", &["a".to_owned()]);
    assert_eq!(placed(&c, &p2), None);
    // The resourceclaim controller deallocates it (its pod is gone): free again.
    let mut cleared = written;
    cleared.metadata.resource_version = Some("6".to_owned());
    cleared.status = None;
    c.dra.apply_claim(cleared);
    assert_eq!(placed(&c, &p2).as_deref(), Some("n1"));
}

#[test]
fn a_shared_claim_in_flight_is_allocated_once_and_held_until_its_last_binding_fails() {
    let mut c = cluster();
    let p1 = spec(&mut c, pod_json("p1", "a", json!({})));
    let p1b = spec(&mut c, pod_json("p1b", "a", json!({})));
    let p2 = spec(&mut c, pod_json("p2", "b", json!({})));
    let (_, first) = c.schedule_with_claims(&Config::default(), &p1, false);
    c.dra.assume("ns", "ns/p1", &first.claims);
    let (d, second) = c.schedule_with_claims(&Config::default(), &p1b, false);
    assert_eq!(
        d.node.as_deref(),
        Some("n1"),
        "the shared claim reads as allocated"
    );
    assert_eq!(second.claims[0].allocation, first.claims[0].allocation);
    c.dra.assume("ns", "ns/p1b", &second.claims);
    c.dra.release("ns", "ns/p1", &["a".to_owned()]);
    assert_eq!(placed(&c, &p2), None, "p1b's binding still holds the device");
    // Even when a claim event shows it written and then cleared meanwhile.
    let mut shown = claim("a");
    shown.metadata.resource_version = Some("7".to_owned());
    shown.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(first.claims[0].allocation.clone()),
        ..Default::default()
    });
    c.dra.apply_claim(shown);
    let mut cleared = claim("a");
    cleared.metadata.resource_version = Some("8".to_owned());
    c.dra.apply_claim(cleared);
    assert_eq!(placed(&c, &p2), None, "p1b's binding may still write it");
    c.dra.release("ns", "ns/p1b", &["a".to_owned()]);
    assert_eq!(placed(&c, &p2).as_deref(), Some("n1"));
}

#[test]
fn preemption_counts_the_devices_a_victims_claims_give_back() {
    let mut c = cluster();
    // A low-priority pod bound to n1 holds the GPU through claim a, reserved only for it.
    bind_low_on_n1(&mut c);
    let mut a = claim("a");
    let holder = spec(&mut c, pod_json("holder", "a", json!({})));
    let (_, outcome) = c.schedule_with_claims(&Config::default(), &holder, false);
    a.status = Some(
        serde_json::from_value(json!({
            "allocation": outcome.claims[0].allocation,
            "reservedFor": [{"resource": "pods", "name": "low", "uid": "uid-low"}]
        }))
        .unwrap(),
    );
    c.dra.apply_claim(a.clone());
    let high = spec(&mut c, pod_json("high", "b", json!({"priority": 100})));
    assert_eq!(placed(&c, &high), None);
    let p = c
        .preempt(&Config::default(), &high, 100)
        .expect("evicting low frees the GPU");
    assert_eq!(p.node, "n1");
    assert_eq!(
        p.victims.iter().map(|v| v.key.as_str()).collect::<Vec<_>>(),
        ["ns/low"]
    );
    // Shared with a pod that stays: evicting the victim frees nothing.
    a.status.as_mut().unwrap().reserved_for.as_mut().unwrap().push(
        serde_json::from_value(json!({"resource": "pods", "name": "other", "uid": "uid-other"})).unwrap(),
    );
    c.dra.apply_claim(a);
    assert!(c.preempt(&Config::default(), &high, 100).is_none());
}

#[test]
fn preemption_frees_the_gpu_on_the_numa_node_where_the_kubelet_will_pin_the_cpus() {
    // n1: NUMA node 0 with 2 free CPUs and gpu-0, NUMA node 1 with 4 free CPUs and gpu-1, under
    // single-numa-node. The kubelet pins a 2-CPU container on NUMA node 0 (the lowest with
    // room), so with alignment required the pod needs gpu-0, which the low-priority pod holds;
    // gpu-1 is free, but on the other NUMA node.
    let mut c = Cluster::new();
    c.apply_node(&node("n1")).unwrap();
    let zones: Vec<Value> = [("0", "2"), ("1", "4")]
        .iter()
        .map(|(i, free)| {
            json!({"name": format!("node-{i}"), "type": "Node",
                "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": free}]})
        })
        .collect();
    let nrt: numaplane::nrt::NodeResourceTopology = serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": zones
    }))
    .unwrap();
    c.apply_nrt(&nrt).unwrap();
    c.dra.enable();
    c.dra.apply_class(class());
    let mut s = slice("n1", &["gpu-0", "gpu-1"]);
    for (d, numa) in s.spec.devices.iter_mut().flatten().zip([0, 1]) {
        d.attributes = Some(
            [(
                "resource.kubernetes.io/numaNode".to_owned(),
                serde_json::from_value(json!({"int": numa})).unwrap(),
            )]
            .into_iter()
            .collect(),
        );
    }
    c.dra.set_slices(vec![s]);
    c.dra.apply_claim(claim("a"));
    c.dra.apply_claim(claim("b"));
    bind_low_on_n1(&mut c);
    let mut a = claim("a");
    a.status = Some(
        serde_json::from_value(json!({
            "allocation": {"devices": {"results": [
                {"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "low", "uid": "uid-low"}]
        }))
        .unwrap(),
    );
    c.dra.apply_claim(a);
    let guaranteed = json!({"priority": 100, "containers": [{"name": "c", "resources": {
        "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"},
        "claims": [{"name": "gpu"}]}}]});
    let high = spec(&mut c, pod_json("high", "b", guaranteed));
    let cfg = Config::default();
    let (d, _) = c.schedule_with_claims(&cfg, &high, true);
    assert_eq!(d.node, None, "gpu-1 is free but not beside the CPUs");
    assert!(
        d.nodes[0].reasons.iter().any(|r| r.contains("NUMA node 0")),
        "{:?}",
        d.nodes[0].reasons
    );
    let p = c
        .preempt(&cfg, &high, 100)
        .expect("evicting low frees gpu-0 beside the CPUs");
    assert_eq!(
        p.victims.iter().map(|v| v.key.as_str()).collect::<Vec<_>>(),
        ["ns/low"]
    );
}
