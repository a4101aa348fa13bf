//! `simulate` with DRA objects: claims named directly or through a template's status are
//! allocated on the chosen node, allocated claims hold their devices for later pods, and a pod
//! whose claims cannot be allocated says which claim and why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use numaplane_scheduler::simulate::{ConfigFile, Explain, Inputs, Report, render_table, simulate};
use serde_json::{Value, json};

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}})
}

fn slice(node: &str, devices: &[&str]) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-gpu")},
           "spec": {"driver": "gpu.example.com", "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>()}})
}

fn class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
           "spec": {"config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"mode": "exclusive"}}}]}})
}

fn claim(name: &str, count: i64) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ns"},
           "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": count}}]}}})
}

/// [`pod`] `name` whose claim `gpu` is the ResourceClaim `claim`.
fn pod_with_claim(name: &str, claim: &str) -> Value {
    pod(
        name,
        json!([{"name": "gpu", "resourceClaimName": claim}]),
        json!({}),
    )
}

fn pod(name: &str, claims: Value, status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}], "resourceClaims": claims},
           "status": status})
}

fn run(cluster: Vec<Value>, pods: Vec<Value>) -> Report {
    let mut inputs = Inputs::default();
    for o in cluster {
        match o["kind"].as_str() {
            Some("Node") => inputs.nodes.push(serde_json::from_value(o).unwrap()),
            Some("ResourceSlice") => inputs.resource_slices.push(serde_json::from_value(o).unwrap()),
            Some("DeviceClass") => inputs.device_classes.push(serde_json::from_value(o).unwrap()),
            Some("ResourceClaim") => inputs.resource_claims.push(serde_json::from_value(o).unwrap()),
            other => panic!("kind {other:?}"),
        }
    }
    let pods = pods
        .into_iter()
        .map(|p| serde_json::from_value(p).unwrap())
        .collect();
    simulate(inputs, pods, &ConfigFile::default(), Explain::Failed)
}

fn json_of(report: &Report) -> Value {
    serde_json::to_value(report).unwrap()
}

#[test]
fn claims_are_allocated_on_the_chosen_node_and_held_for_later_pods() {
    let report = run(
        vec![
            node("n1"),
            slice("n1", &["gpu-0"]),
            class(),
            claim("a", 1),
            claim("b", 1),
        ],
        vec![pod_with_claim("p1", "a"), pod_with_claim("p2", "b")],
    );
    let r = json_of(&report);
    let first = &r["results"][0];
    assert_eq!(first["node"], "n1", "{first}");
    assert_eq!(first["claims"][0]["name"], "a");
    let alloc = &first["claims"][0]["allocation"];
    assert_eq!(
        alloc["devices"]["results"],
        json!([{"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}])
    );
    assert_eq!(alloc["devices"]["config"][0]["source"], "FromClass");
    assert_eq!(
        alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["n1"])
    );
    // The only device is held by claim a now.
    let second = &r["results"][1];
    assert_eq!(second["node"], Value::Null);
    assert_eq!(
        second["nodes"][0]["reasons"],
        json!(["cannot allocate all claims"])
    );
    assert!(
        second["message"]
            .as_str()
            .unwrap()
            .contains("cannot allocate all claims"),
        "{second}"
    );
    let table = render_table(&report);
    assert!(table.contains("claim a"), "{table}");
    assert!(table.contains("gpu.example.com/n1/gpu-0"), "{table}");
}

#[test]
fn a_template_claim_is_found_through_the_pod_status_and_an_allocated_claim_counts() {
    let mut held = claim("held", 1);
    held["status"] = json!({"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}}});
    let report = run(
        vec![
            node("n1"),
            node("n2"),
            slice("n1", &["gpu-0"]),
            slice("n2", &["gpu-0"]),
            class(),
            held,
            claim("p1-gpu-x7", 1),
        ],
        vec![pod(
            "p1",
            json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]),
            json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p1-gpu-x7"}]}),
        )],
    );
    let r = json_of(&report);
    let first = &r["results"][0];
    // n1's only device is in use, so the pod goes to n2.
    assert_eq!(first["node"], "n2", "{first}");
    assert_eq!(first["claims"][0]["name"], "p1-gpu-x7");
    assert_eq!(
        first["claims"][0]["allocation"]["devices"]["results"][0]["pool"],
        "n2"
    );
    assert!(first.get("unsupported").is_none(), "{first}");
}

#[test]
fn missing_claims_and_bad_classes_name_the_claim_and_the_rule() {
    let report = run(
        vec![node("n1"), slice("n1", &["gpu-0"]), class()],
        vec![
            pod(
                "waiting",
                json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]),
                json!({}),
            ),
            pod_with_claim("missing", "nope"),
        ],
    );
    let r = json_of(&report);
    let reason = |i: usize| {
        r["results"][i]["nodes"][0]["reasons"][0]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        reason(0).contains("pod claim gpu: waiting for its ResourceClaim"),
        "{}",
        reason(0)
    );
    assert!(
        reason(1).contains("resourceclaim \"ns/nope\" not found"),
        "{}",
        reason(1)
    );

    let mut bad = claim("bad", 1);
    bad["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = json!("no-such-class");
    let report = run(
        vec![node("n1"), slice("n1", &["gpu-0"]), class(), bad],
        vec![pod_with_claim("p", "bad")],
    );
    let r = json_of(&report);
    let e = r["results"][0]["claimsError"].as_str().unwrap();
    assert!(
        e.contains("claim ns/bad, request gpus: could not retrieve device class no-such-class"),
        "{e}"
    );
    assert_eq!(r["results"][0]["node"], Value::Null);
}
