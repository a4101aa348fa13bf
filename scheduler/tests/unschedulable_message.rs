//! The "0/N nodes are available" line as kube-scheduler v1.36.2 writes it: each node counted
//! once, under the first plugin that rejects it in the default profile's order (NodeUnschedulable,
//! NodeName, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, the volume plugins,
//! PodTopologySpread, InterPodAffinity; numaplane's NUMA filter last), with every reason of that
//! plugin (NodeResourcesFit names each resource the node lacks), in v1.36 wording, and the
//! "count reason" parts sorted as strings (`FitError.Error`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::{Value, json};

fn node(name: &str, cpu: &str, labels: Value, spec: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}
    }))
    .unwrap()
}

fn pod(c: &mut Cluster, name: &str, spec: Value) -> PodSpec {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]);
    }
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": spec
    }))
    .unwrap();
    PodSpec::from_pod(&mut c.res, &p).unwrap()
}

const NOT_READY: &str = r#"{"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}"#;

/// Both ways a decision is made: explained (every node evaluated afresh) and the live loop's
/// cached `decide`; they must give the same line.
fn message(c: &Cluster, p: &PodSpec) -> String {
    let cfg = Config::default();
    let explained = c.schedule(&cfg, p, true);
    assert_eq!(explained.node, None, "{explained:?}");
    let decided = c.decide(&cfg, p);
    assert_eq!(decided.message, explained.message);
    explained.message
}

/// The example of the report: 500 not-ready nodes that also lack the pod's node selector label,
/// and one node with too little CPU. kube-scheduler stops at TaintToleration for the 500.
#[test]
fn not_ready_nodes_count_once_under_their_taint() {
    let mut c = Cluster::new();
    let not_ready: Value = serde_json::from_str(NOT_READY).unwrap();
    for i in 0..500 {
        c.apply_node(&node(&format!("nr-{i:03}"), "16", json!({}), not_ready.clone()))
            .unwrap();
    }
    c.apply_node(&node("ready", "1", json!({"pool": "gpu"}), json!({})))
        .unwrap();
    let p = pod(&mut c, "p", json!({"nodeSelector": {"pool": "gpu"}}));
    assert_eq!(
        message(&c, &p),
        "0/501 nodes are available: 1 Insufficient cpu, 500 node(s) had untolerated taint(s)."
    );
    // The per-node detail still names the taint.
    let explained = c.schedule(&Config::default(), &p, true);
    let nr = explained.nodes.iter().find(|v| v.node == "nr-000").unwrap();
    assert_eq!(
        nr.reasons,
        ["taint node.kubernetes.io/not-ready:NoSchedule is not tolerated"]
    );
}

/// A cordoned node is NodeUnschedulable's, whatever else it fails; NodeName comes before the
/// taints; NodeResourcesFit names every resource the node lacks; and the parts are sorted as
/// strings, so "10 …" comes before "2 …".
#[test]
fn the_first_failing_plugin_decides_and_counts_sort_as_strings() {
    let mut c = Cluster::new();
    let not_ready: Value = serde_json::from_str(NOT_READY).unwrap();
    let mut cordoned_and_tainted = not_ready.clone();
    cordoned_and_tainted["unschedulable"] = json!(true);
    c.apply_node(&node("a-cordoned", "1", json!({}), cordoned_and_tainted))
        .unwrap();
    for i in 0..10 {
        c.apply_node(&node(
            &format!("b-tainted-{i}"),
            "1",
            json!({}),
            not_ready.clone(),
        ))
        .unwrap();
    }
    for i in 0..2 {
        c.apply_node(&node(&format!("c-small-{i}"), "1", json!({}), json!({})))
            .unwrap();
    }
    let p = pod(&mut c, "p", json!({}));
    assert_eq!(
        message(&c, &p),
        "0/13 nodes are available: 1 node(s) were unschedulable, 10 node(s) had untolerated \
         taint(s), 2 Insufficient cpu."
    );
    // Too little CPU and memory: both reasons of NodeResourcesFit, each counted.
    let big = pod(
        &mut c,
        "big",
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "64Gi"}}}]}),
    );
    assert_eq!(
        message(&c, &big),
        "0/13 nodes are available: 1 node(s) were unschedulable, 10 node(s) had untolerated \
         taint(s), 2 Insufficient cpu, 2 Insufficient memory."
    );
    // A pod bound by name to a cordoned node: NodeUnschedulable still comes first there, the
    // other nodes fail NodeName before their taints.
    let named = pod(&mut c, "named", json!({"nodeName": "a-cordoned"}));
    assert_eq!(
        message(&c, &named),
        "0/13 nodes are available: 1 node(s) were unschedulable, 12 node(s) didn't match the \
         requested node name."
    );
}

/// NodePorts runs before NodeResourcesFit: a node whose host port is taken and whose CPU is
/// short counts under the port; the NUMA filter runs after both.
#[test]
fn node_ports_come_before_resources() {
    let mut c = Cluster::new();
    for n in ["n1", "n2"] {
        c.apply_node(&node(n, "1", json!({"kubernetes.io/hostname": n}), json!({})))
            .unwrap();
    }
    let holder: Pod = serde_json::from_value(json!({
        "metadata": {"name": "holder", "namespace": "ns", "uid": "uid-holder"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c",
            "ports": [{"containerPort": 80, "hostPort": 8080}]}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    c.apply_pod(&holder).unwrap();
    let p = pod(
        &mut c,
        "p",
        json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}],
            "resources": {"requests": {"cpu": "2"}}}]}),
    );
    assert_eq!(
        message(&c, &p),
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the \
         requested pod ports."
    );
}
