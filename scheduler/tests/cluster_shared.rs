//! Cluster-shared device slots (allocator pools with `shared: cluster`): every node offers the
//! same slot IDs, so a slot that one node's pod holds, or that a record plans for it, is not
//! free on any other node. Held slots come from the nodes' NRTs
//! (`numaplane.io/cluster-held.<resource>`), planned ones from the allocation records on bound
//! pods and from our own assumptions; a restart rebuilds both from the same objects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::{allocation::ANNOTATION, nrt::NodeResourceTopology};
use numaplane_scheduler::{
    cluster::{Cluster, Config, TopologyState},
    pod::PodSpec,
};
use serde_json::{Value, json};

const LIC: &str = "example.com/lic";
const NODES: [&str; 2] = ["n1", "n2"];

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", LIC: "2"}}
    }))
    .unwrap()
}

/// One zone offering the two slots of device `lic` minus those held here (`held`), with the
/// cluster-held attribute naming them; `shared` false leaves the attribute out (a node-local
/// pool).
fn nrt(name: &str, held: &[&str], shared: bool) -> NodeResourceTopology {
    let free: Vec<&str> = ["lic-0", "lic-1"]
        .into_iter()
        .filter(|s| !held.contains(s))
        .collect();
    let mut attributes = vec![
        json!({"name": "topologyManagerPolicy", "value": "single-numa-node"}),
        json!({"name": "topologyManagerScope", "value": "container"}),
    ];
    if shared {
        attributes.push(json!({"name": format!("numaplane.io/cluster-held.{LIC}"), "value": held.join(",")}));
    }
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": attributes,
        "zones": [{
            "name": "node-0", "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": "16", "allocatable": "16", "available": "16"},
                {"name": LIC, "capacity": "2", "allocatable": "2", "available": free.len().to_string()}
            ],
            "attributes": [{"name": format!("numaplane.io/free-devices.{LIC}"), "value": free.join(",")}]
        }]
    }))
    .unwrap()
}

fn pod_json(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "creationTimestamp": "2026-11-25T10:00:00Z"},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "1", LIC: "1"}, "limits": {"cpu": "1", LIC: "1"}}}]},
        "status": {"phase": "Pending"}
    })
}

fn spec(c: &mut Cluster, v: &Value) -> PodSpec {
    let pod: Pod = serde_json::from_value(v.clone()).unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

/// The pod as the watch shows it after the Binding: on `node`, with `record` annotated.
fn bound(v: &Value, node: &str, record: Option<&str>) -> Pod {
    let mut v = v.clone();
    v["spec"]["nodeName"] = json!(node);
    if let Some(r) = record {
        v["metadata"]["annotations"] = json!({ANNOTATION: r});
    }
    serde_json::from_value(v).unwrap()
}

fn setup(shared: bool) -> Cluster {
    let mut c = Cluster::new();
    for n in NODES {
        c.apply_node(&node(n)).unwrap();
        c.apply_nrt(&nrt(n, &[], shared)).unwrap();
    }
    c
}

fn free_on(c: &Cluster, node: &str) -> Vec<String> {
    let TopologyState::Valid(t) = c.topology(node) else {
        panic!("no topology for {node}")
    };
    let lic = c.res.get(LIC).unwrap();
    t.zones[0].free_devices.get(&lic).cloned().unwrap_or_default()
}

/// Decides and assumes `v`; returns (node, slot, record) or None when it fits nowhere.
fn place(c: &mut Cluster, v: &Value) -> Option<(String, String, String)> {
    let p = spec(c, v);
    let d = c.decide(&Config::default(), &p);
    let node = d.node.clone()?;
    c.assume_at(&p, &d, 0);
    let alloc = d.allocation.unwrap();
    let slot = alloc.containers[0].devices[LIC][0].clone();
    Some((node, slot, alloc.to_annotation().unwrap()))
}

#[test]
fn slots_are_handed_out_once_across_nodes_up_to_capacity() {
    let mut c = setup(true);
    let mut slots = BTreeSet::new();
    let mut placed = Vec::new();
    for name in ["a", "b"] {
        let (node, slot, record) = place(&mut c, &pod_json(name)).expect("a slot is free");
        assert!(slots.insert(slot.clone()), "slot {slot} handed out twice");
        c.apply_pod(&bound(&pod_json(name), &node, Some(&record)))
            .unwrap();
        placed.push((name, node, slot, record));
    }
    // Every node still offers both slots in its own NRT, but both are taken cluster-wide.
    for n in NODES {
        assert!(free_on(&c, n).is_empty(), "{n} still offers {:?}", free_on(&c, n));
    }
    let p = spec(&mut c, &pod_json("c"));
    let d = c.decide(&Config::default(), &p);
    assert_eq!(
        d.node, None,
        "a third user of a 2-slot device was placed: {}",
        d.message
    );

    // A restart: the index is rebuilt from the same objects (NRTs that do not show the pods
    // yet, pods bound with their records); the capacity still holds.
    let mut r = setup(true);
    for (name, node, _, record) in &placed {
        r.apply_pod(&bound(&pod_json(name), node, Some(record))).unwrap();
    }
    let p = spec(&mut r, &pod_json("c"));
    assert_eq!(r.decide(&Config::default(), &p).node, None);

    // The kubelet of a's node admits it (its NRT shows the slot held), then a is deleted: the
    // slot stays taken until that NRT stops showing it.
    let (_, a_node, a_slot, _) = &placed[0];
    r.apply_nrt(&nrt(a_node, &[a_slot.as_str()], true)).unwrap();
    r.delete_pod("ns/a");
    assert_eq!(r.decide(&Config::default(), &p).node, None);
    r.apply_nrt(&nrt(a_node, &[], true)).unwrap();
    let (_, slot, _) = place(&mut r, &pod_json("c")).expect("the freed slot is reused");
    assert_eq!(&slot, a_slot);
}

#[test]
fn a_slot_held_on_one_node_is_not_free_on_the_other() {
    let mut c = setup(true);
    // A pod that bypassed the scheduler holds lic-0 on n1 (only its NRT tells).
    c.apply_nrt(&nrt("n1", &["lic-0"], true)).unwrap();
    assert_eq!(free_on(&c, "n2"), ["lic-1"]);
    assert_eq!(free_on(&c, "n1"), ["lic-1"]);
    let (_, slot, _) = place(&mut c, &pod_json("a")).unwrap();
    assert_eq!(slot, "lic-1");
    // n1's NRT goes away (exporter removed): its held slots no longer count; a's does.
    c.delete_nrt("n1");
    assert_eq!(free_on(&c, "n2"), ["lic-0"]);
}

#[test]
fn node_local_pools_and_stale_or_bad_records_claim_nothing_elsewhere() {
    // Without the cluster-held attribute the same IDs on two nodes are two devices.
    let mut c = setup(false);
    for name in ["a", "b", "c", "d"] {
        assert!(place(&mut c, &pod_json(name)).is_some(), "{name}");
    }

    let mut c = setup(true);
    // A record for another node (a failed Binding's leftover) claims nothing.
    let stale = json!({"version": "v1", "node": "elsewhere", "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "c", "kind": "app", "devices": {LIC: ["lic-0"]}}]});
    c.apply_pod(&bound(&pod_json("x"), "n1", Some(&stale.to_string())))
        .unwrap();
    assert_eq!(free_on(&c, "n2"), ["lic-0", "lic-1"]);
    // A malformed one is counted.
    c.apply_pod(&bound(&pod_json("y"), "n1", Some("{nope"))).unwrap();
    assert_eq!(c.anomalies.invalid_records, 1);
    assert_eq!(free_on(&c, "n2"), ["lic-0", "lic-1"]);
    // A valid record for n1 claims its slot on n2 until the pod goes.
    let good = json!({"version": "v1", "node": "n1", "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "c", "kind": "app", "devices": {LIC: ["lic-1"]}}]});
    c.apply_pod(&bound(&pod_json("z"), "n1", Some(&good.to_string())))
        .unwrap();
    assert_eq!(free_on(&c, "n2"), ["lic-0"]);
    c.delete_pod("ns/z");
    assert_eq!(free_on(&c, "n2"), ["lic-0", "lic-1"]);
}
