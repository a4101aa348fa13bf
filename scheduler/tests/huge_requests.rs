//! Amounts from input that reach a sum never overflow: pods bound by other schedulers may
//! request anything the API server accepts, and an NRT may publish any valid quantity. A
//! debug build panicked on these ("attempt to add with overflow"); a release build wrapped
//! around and saw a full node as empty.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::{Value, json};

fn node(cpu: &str, memory: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}
    }))
    .unwrap()
}

fn pod_value(name: &str, cpu: &str, memory: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": cpu, "memory": memory}}}]},
        "status": {"phase": "Running"}
    })
}

fn bound(name: &str, cpu: &str, memory: &str) -> Pod {
    let mut v = pod_value(name, cpu, memory);
    v["spec"]["nodeName"] = json!("n1");
    serde_json::from_value(v).unwrap()
}

fn decide(c: &mut Cluster, cpu: &str, memory: &str) -> Option<String> {
    let p: Pod = serde_json::from_value(pod_value("new", cpu, memory)).unwrap();
    let spec = PodSpec::from_pod(&mut c.res, &p).unwrap();
    c.decide(&Config::default(), &spec).node
}

#[test]
fn huge_requests_of_pods_bound_elsewhere_saturate_the_node_sum_and_come_back_exact() {
    let mut c = Cluster::new();
    c.apply_node(&node("64", "8E")).unwrap();
    // 5E + 5E bytes is more than an i64 holds.
    c.apply_pod(&bound("a", "1", "5E")).unwrap();
    c.apply_pod(&bound("b", "1", "5E")).unwrap();
    let memory = c.res.get("memory").unwrap();
    assert_eq!(c.node_basics("n1").unwrap().requested.get(memory), Some(i64::MAX));
    assert_eq!(decide(&mut c, "1", "1Gi"), None, "the node is full");
    // One leaves: the sum is exact again, and 3E are free.
    c.delete_pod("ns/b");
    assert_eq!(
        c.node_basics("n1").unwrap().requested.get(memory),
        Some(5_000_000_000_000_000_000)
    );
    assert_eq!(decide(&mut c, "1", "1Gi").as_deref(), Some("n1"));
    assert_eq!(decide(&mut c, "1", "4E"), None);
    c.delete_pod("ns/a");
    assert_eq!(c.node_basics("n1").unwrap().requested.get(memory), Some(0));
    assert_eq!(c.node_basics("n1").unwrap().pod_count, 0);
}

/// A pod requesting nearly `i64::MAX` millicores of CPU, scored on a node without filtering
/// first (the extender's `prioritize`, as upstream Score): rounding the request up to whole
/// CPUs must not overflow.
#[test]
fn a_huge_cpu_request_is_scored_without_overflow() {
    let huge = "9223372036854775"; // CPUs: just under i64::MAX millicores
    let mut c = Cluster::new();
    c.apply_node(&node("8", "16Gi")).unwrap();
    let nrt: NodeResourceTopology = serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"}
        ],
        "zones": [{"name": "node-0", "type": "Node", "resources": [
            {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"},
            {"name": "memory", "capacity": "16Gi", "allocatable": "16Gi", "available": "16Gi"}
        ]}]
    }))
    .unwrap();
    c.apply_nrt(&nrt).unwrap();
    let p: Pod = serde_json::from_value(pod_value("new", huge, "1Gi")).unwrap();
    let spec = PodSpec::from_pod(&mut c.res, &p).unwrap();
    // Upstream scores a resource the zone cannot hold as 0 and averages: memory still counts.
    let score = c.score_node(&Config::default(), &spec, "n1");
    assert!((0..=100).contains(&score), "{score}");
    assert_eq!(decide(&mut c, huge, "1Gi"), None);
    assert_eq!(decide(&mut c, "1", "1Gi").as_deref(), Some("n1"));
}
