//! A numaplane NRT that lacks a resource its Node allocates lags the node: the node is not
//! chosen for a pod requesting that resource until the NRT catches up, with a reason saying so.
//! An NRT from another exporter (no `numaplane.io/node-level-resources`) keeps today's reading:
//! a resource in no zone has no NUMA affinity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::{NodeResourceTopology, attr};
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::{Value, json};

const NODE: &str = "n1";
const LAG: &str =
    "NRT lags the node: example.com/gpu allocatable on the node, not in its NodeResourceTopology";

fn node(gpus: Option<&str>) -> Node {
    let mut alloc = json!({"cpu": "16", "memory": "64Gi", "pods": "110"});
    if let Some(g) = gpus {
        alloc["example.com/gpu"] = json!(g);
    }
    serde_json::from_value(json!({"metadata": {"name": NODE}, "status": {"allocatable": alloc}})).unwrap()
}

/// Two zones of 8 CPUs; `gpus` per zone when the NRT shows the devices; `extra` node attributes.
fn nrt(gpus: Option<[i64; 2]>, extra: &[(&str, &str)]) -> NodeResourceTopology {
    let zone = |i: usize| {
        let mut resources =
            vec![json!({"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"})];
        if let Some(g) = gpus {
            let n = g[i].to_string();
            resources
                .push(json!({"name": "example.com/gpu", "capacity": n, "allocatable": n, "available": n}));
        }
        json!({"name": format!("node-{i}"), "type": "Node", "resources": resources})
    };
    let mut attributes = vec![
        json!({"name": "topologyManagerPolicy", "value": "single-numa-node"}),
        json!({"name": "topologyManagerScope", "value": "container"}),
    ];
    for (k, v) in extra {
        attributes.push(json!({"name": k, "value": v}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": NODE}, "zones": [zone(0), zone(1)], "attributes": attributes
    }))
    .unwrap()
}

fn pod(cluster: &mut Cluster, name: &str, gpus: Option<&str>) -> PodSpec {
    let mut r = json!({"cpu": "1", "memory": "1Gi"});
    if let Some(g) = gpus {
        r["example.com/gpu"] = json!(g);
    }
    let v: Value = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "resources": {
            "requests": r, "limits": r}}]},
        "status": {"phase": "Pending"}
    });
    let p: Pod = serde_json::from_value(v).unwrap();
    PodSpec::from_pod(&mut cluster.res, &p).unwrap()
}

fn cluster(node_gpus: Option<&str>, topo: &NodeResourceTopology) -> Cluster {
    let mut c = Cluster::new();
    c.apply_node(&node(node_gpus)).unwrap();
    c.apply_nrt(topo).unwrap();
    c
}

const MARK: (&str, &str) = (attr::NODE_LEVEL_RESOURCES, "");

#[test]
fn a_numaplane_nrt_without_the_nodes_devices_lags_and_the_reason_says_so() {
    let mut c = cluster(Some("4"), &nrt(None, &[MARK]));
    let gpu_pod = pod(&mut c, "gpu", Some("1"));
    for explain in [false, true] {
        let d = c.schedule(&Config::default(), &gpu_pod, explain);
        assert_eq!(d.node, None, "explain {explain}: {d:?}");
        assert_eq!(d.nodes.len(), 1);
        assert_eq!(d.nodes[0].reasons, vec![LAG.to_owned()], "{d:?}");
        assert!(
            d.message.contains("NodeResourceTopology lagging the node"),
            "{}",
            d.message
        );
    }
    // The NUMA part alone says the same (kubectl numa explain's per-node view).
    let v = c.topology_verdict(&Config::default(), &gpu_pod, NODE);
    assert!(!v.feasible);
    assert_eq!(v.reasons, vec![LAG.to_owned()]);
    // A pod without GPUs is not held up by it.
    let cpu_pod = pod(&mut c, "cpu", None);
    assert_eq!(
        c.schedule(&Config::default(), &cpu_pod, false).node.as_deref(),
        Some(NODE)
    );
}

#[test]
fn the_node_is_chosen_again_once_the_nrt_catches_up() {
    let mut c = cluster(Some("4"), &nrt(None, &[MARK]));
    let p = pod(&mut c, "gpu", Some("1"));
    assert_eq!(c.schedule(&Config::default(), &p, false).node, None);
    c.apply_nrt(&nrt(Some([2, 2]), &[MARK])).unwrap();
    let d = c.schedule(&Config::default(), &p, false);
    assert_eq!(d.node.as_deref(), Some(NODE), "{d:?}");
    // The record names the device's zone: the devices are where the NRT says.
    let placement = d.placement.expect("placement");
    assert_eq!(placement.containers[0].numa_nodes, Some(vec![0]));
}

#[test]
fn the_lag_follows_the_node_too() {
    // The NRT arrives first; the Node has no GPUs yet: nothing to lag on.
    let mut c = cluster(None, &nrt(None, &[MARK]));
    let p = pod(&mut c, "gpu", Some("1"));
    let d = c.schedule(&Config::default(), &p, true);
    assert_eq!(d.node, None);
    assert!(
        d.nodes[0].reasons[0].contains("Insufficient")
            || d.nodes[0].reasons[0].contains("example.com/gpu requested"),
        "{d:?}"
    );
    // Then the Node shows the devices before the NRT does.
    c.apply_node(&node(Some("4"))).unwrap();
    let d = c.schedule(&Config::default(), &p, true);
    assert_eq!(d.nodes[0].reasons, vec![LAG.to_owned()], "{d:?}");
    // The plugin goes away again: the Node no longer allocates any, the lag is gone with it.
    c.apply_node(&node(Some("0"))).unwrap();
    let d = c.schedule(&Config::default(), &p, true);
    assert!(!d.nodes[0].reasons.contains(&LAG.to_owned()), "{d:?}");
}

#[test]
fn devices_listed_without_numa_or_as_node_level_are_described() {
    let without = (
        "numaplane.io/devices-without-numa.example.com/gpu",
        "4:g0,g1,g2,g3",
    );
    let mut c = cluster(Some("4"), &nrt(None, &[MARK, without]));
    let p = pod(&mut c, "gpu", Some("1"));
    // single-numa-node rejects devices without NUMA affinity, as the kubelet does: not a lag.
    let d = c.schedule(&Config::default(), &p, true);
    assert!(!d.nodes[0].reasons.contains(&LAG.to_owned()), "{d:?}");
    // A resource the exporter names node-level (no device behind it) fits at node level.
    let mut c = cluster(
        Some("4"),
        &nrt(None, &[(attr::NODE_LEVEL_RESOURCES, "example.com/gpu")]),
    );
    let p = pod(&mut c, "gpu", Some("1"));
    assert_eq!(
        c.schedule(&Config::default(), &p, false).node.as_deref(),
        Some(NODE)
    );
}

#[test]
fn nrts_of_other_exporters_keep_todays_reading() {
    // No numaplane.io/node-level-resources: a resource in no zone has no NUMA affinity.
    let mut c = cluster(Some("4"), &nrt(None, &[]));
    let p = pod(&mut c, "gpu", Some("1"));
    let d = c.schedule(&Config::default(), &p, false);
    assert_eq!(d.node.as_deref(), Some(NODE), "{d:?}");
}
