//! The index does not depend on the order in which its watches deliver events. The Nodes,
//! NRT and bound-pod watches are independent streams (their initial lists finish in either
//! order, and a relist of one does not wait for the others), so the same events reach the
//! index in any interleaving. Each test feeds one set of events in every interleaving that
//! keeps the order of each stream (one object's events are ordered by the API server) and
//! checks the resulting index is the same: node charges (`requested`, pod count),
//! assumptions, effective zones and every node's verdict.
//!
//! The NRT fingerprints here are consistent snapshots: the pods an NRT shows are bound at the
//! end. (An NRT naming a pod deleted before it arrives cannot confirm anything, and then the
//! outcome depends on what the index knew when it arrived: always the safe side.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config, TopologyState},
    pod::PodSpec,
};
use serde_json::{Value, json};

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}
    }))
    .unwrap()
}

/// Two zones of 2 CPUs; `free` CPUs per zone; `pods` the pods the kubelet reports.
fn nrt(name: &str, free: [i64; 2], pods: &[&str]) -> NodeResourceTopology {
    let zone = |i: usize| {
        json!({
            "name": format!("node-{i}"), "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": "2", "allocatable": "2", "available": free[i].to_string()},
                {"name": "memory", "capacity": "8Gi", "allocatable": "8Gi", "available": "8Gi"}
            ]
        })
    };
    common::single_numa_node_nrt(name, vec![zone(0), zone(1)], pods)
}

/// A Guaranteed pod of `cpu` CPUs and 1Gi, bound to `node` (if any) in `phase`.
fn pod_value(name: &str, cpu: u32, node: Option<&str>, phase: &str) -> Value {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": cpu.to_string(), "memory": "1Gi"},
            "limits": {"cpu": cpu.to_string(), "memory": "1Gi"}}}]},
        "status": {"phase": phase}
    });
    if let Some(n) = node {
        v["spec"]["nodeName"] = json!(n);
    }
    v
}

fn pod(name: &str, node: &str, phase: &str) -> Pod {
    serde_json::from_value(pod_value(name, 1, Some(node), phase)).unwrap()
}

/// One watch event.
#[derive(Clone)]
enum Ev {
    Node(Box<Node>),
    DeleteNode(&'static str),
    ResetNodes(Vec<Node>),
    Nrt(Box<NodeResourceTopology>),
    ResetNrts(Vec<NodeResourceTopology>),
    Pod(Box<Pod>),
    DeletePod(&'static str),
    ResetPods(Vec<Pod>),
}

fn apply(c: &mut Cluster, ev: &Ev) {
    match ev {
        Ev::Node(n) => c.apply_node(n).unwrap(),
        Ev::DeleteNode(n) => c.delete_node(n),
        Ev::ResetNodes(ns) => c.reset_nodes(ns),
        Ev::Nrt(t) => c.apply_nrt(t).unwrap(),
        Ev::ResetNrts(ts) => c.reset_nrts(ts),
        Ev::Pod(p) => {
            c.apply_pod(p).unwrap();
        }
        Ev::DeletePod(k) => c.delete_pod(k),
        Ev::ResetPods(ps) => c.reset_pods(ps, 0),
    }
}

/// Every interleaving of `streams` that keeps each stream's order.
fn interleavings(streams: &[Vec<Ev>]) -> Vec<Vec<Ev>> {
    fn go(streams: &[Vec<Ev>], pos: &mut Vec<usize>, cur: &mut Vec<Ev>, out: &mut Vec<Vec<Ev>>) {
        let mut done = true;
        for s in 0..streams.len() {
            if pos[s] < streams[s].len() {
                done = false;
                cur.push(streams[s][pos[s]].clone());
                pos[s] += 1;
                go(streams, pos, cur, out);
                pos[s] -= 1;
                cur.pop();
            }
        }
        if done {
            out.push(cur.clone());
        }
    }
    let mut out = Vec::new();
    go(streams, &mut vec![0; streams.len()], &mut Vec::new(), &mut out);
    out
}

/// What the index holds, in comparable form.
fn snapshot(c: &Cluster) -> Value {
    let cfg = Config::default();
    let mut nodes = BTreeMap::new();
    for name in c.node_names() {
        let n = c.node_basics(name).unwrap();
        let requested: BTreeMap<&str, i64> = n
            .requested
            .iter()
            .filter(|(_, v)| *v != 0)
            .map(|(id, v)| (c.res.name(id), v))
            .collect();
        let zones: Vec<Value> = match c.topology(name) {
            TopologyState::Valid(t) => t
                .zones
                .iter()
                .map(|z| {
                    let free: BTreeMap<&str, i64> =
                        z.available.iter().map(|(id, v)| (c.res.name(id), v)).collect();
                    json!({"id": z.id, "available": free})
                })
                .collect(),
            other => vec![json!(format!("{other:?}"))],
        };
        nodes.insert(
            name.to_owned(),
            json!({"requested": requested, "podCount": n.pod_count, "zones": zones}),
        );
    }
    let mut assumed: Vec<(String, String)> = c
        .assumptions()
        .map(|(k, a)| (k.to_owned(), a.node.clone()))
        .collect();
    assumed.sort();
    let mut res = c.res.clone();
    // Every node's verdict, with reasons, for pods of 1 and 2 CPUs (a zone holds 2).
    let probes: Vec<Value> = [1, 2]
        .into_iter()
        .map(|cpu| {
            let p: Pod =
                serde_json::from_value(pod_value(&format!("probe-{cpu}"), cpu, None, "Pending")).unwrap();
            let spec = PodSpec::from_pod(&mut res, &p).unwrap();
            let explained = c.schedule(&cfg, &spec, true);
            json!({"explained": explained.nodes, "decided": c.decide(&cfg, &spec).node})
        })
        .collect();
    json!({"nodes": nodes, "assumed": assumed, "verdicts": probes})
}

/// A cluster where our pod `ns/p` (1 CPU) is assumed on n1 with its Binding in flight.
fn with_assumption() -> Cluster {
    let mut c = Cluster::new();
    c.apply_node(&node("n1")).unwrap();
    c.apply_nrt(&nrt("n1", [2, 2], &[])).unwrap();
    let mut res = c.res.clone();
    let p: Pod = serde_json::from_value(pod_value("p", 1, None, "Pending")).unwrap();
    let spec = PodSpec::from_pod(&mut res, &p).unwrap();
    c.res = res;
    let d = c.decide(&Config::default(), &spec);
    assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
    c.assume_at(&spec, &d, 0);
    c
}

/// Runs every interleaving from `start` and returns the one resulting snapshot.
fn same_in_every_order(start: &Cluster, streams: &[Vec<Ev>]) -> Value {
    let orders = interleavings(streams);
    let mut first: Option<(Value, usize)> = None;
    for (i, order) in orders.iter().enumerate() {
        let mut c = start.clone();
        for ev in order {
            apply(&mut c, ev);
        }
        let s = snapshot(&c);
        match &first {
            None => first = Some((s, i)),
            Some((f, _)) => assert_eq!(
                &s,
                f,
                "interleaving {i} of {} differs from the first",
                orders.len()
            ),
        }
    }
    first.map(|(s, _)| s).unwrap()
}

/// A node deleted and re-added under its name while pods are bound to it (so pods arrive
/// before their node), a pod deleted on the way (maybe while its node is gone), and an NRT
/// that confirms our assumption once the pods the index knows there are the ones it names:
/// every order of these events gives the same index.
#[test]
fn every_order_of_node_nrt_and_pod_events_gives_the_same_index() {
    let mut start = with_assumption();
    start.apply_node(&node("n2")).unwrap();
    let streams = vec![
        vec![Ev::DeleteNode("n1"), Ev::Node(Box::new(node("n1")))],
        // The kubelet admitted a and p on n1, one CPU in each zone.
        vec![Ev::Nrt(Box::new(nrt("n1", [1, 1], &["ns/a", "ns/p"])))],
        vec![Ev::Pod(Box::new(pod("a", "n1", "Running")))],
        // The pod watch shows our Binding.
        vec![Ev::Pod(Box::new(pod("p", "n1", "Pending")))],
        vec![Ev::Pod(Box::new(pod("x", "n2", "Running")))],
        // w ran on n1 and was deleted before the kubelet's NRT was taken.
        vec![
            Ev::Pod(Box::new(pod("w", "n1", "Running"))),
            Ev::DeletePod("ns/w"),
        ],
    ];
    let s = same_in_every_order(&start, &streams);
    assert_eq!(s["nodes"]["n1"]["podCount"], 2, "{s}");
    assert_eq!(s["nodes"]["n1"]["requested"]["cpu"], 2000);
    assert_eq!(s["nodes"]["n2"]["podCount"], 1);
    assert_eq!(s["nodes"]["n2"]["requested"]["cpu"], 1000);
    assert_eq!(s["assumed"], json!([]), "the NRT shows p: confirmed");
}

/// Relists (every stream restarts) mixed with single events, and our placement's Binding
/// in flight while the pod watch relists: every order gives the same index.
#[test]
fn every_order_of_relists_and_events_gives_the_same_index() {
    let streams = vec![
        vec![
            Ev::ResetNodes(vec![node("n1")]),
            Ev::Node(Box::new(node("n2"))),
            Ev::DeleteNode("n1"),
            Ev::Node(Box::new(node("n1"))),
        ],
        vec![
            Ev::ResetNrts(vec![nrt("n1", [2, 1], &["ns/a"])]),
            Ev::Nrt(Box::new(nrt("n1", [1, 1], &["ns/a", "ns/p"]))),
        ],
        vec![
            // p's Binding is in flight: the list does not show it.
            Ev::ResetPods(vec![pod("a", "n1", "Running"), pod("y", "n2", "Running")]),
            Ev::DeletePod("ns/y"),
            Ev::Pod(Box::new(pod("x", "n2", "Running"))),
            Ev::Pod(Box::new(pod("p", "n1", "Pending"))),
        ],
    ];
    let s = same_in_every_order(&with_assumption(), &streams);
    assert_eq!(s["nodes"]["n1"]["podCount"], 2);
    assert_eq!(s["nodes"]["n1"]["requested"]["cpu"], 2000);
    assert_eq!(s["nodes"]["n2"]["podCount"], 1);
    assert_eq!(s["assumed"], json!([]));
}

/// Without an NRT confirming it, the in-flight placement survives every order of the relists.
#[test]
fn every_order_keeps_an_unconfirmed_assumption() {
    let streams = vec![
        vec![
            Ev::ResetNodes(vec![node("n1"), node("n2")]),
            Ev::DeleteNode("n1"),
            Ev::Node(Box::new(node("n1"))),
        ],
        vec![Ev::ResetNrts(vec![nrt("n1", [2, 1], &["ns/a"])])],
        vec![
            Ev::ResetPods(vec![pod("a", "n1", "Running")]),
            Ev::Pod(Box::new(pod("x", "n2", "Pending"))),
        ],
    ];
    let s = same_in_every_order(&with_assumption(), &streams);
    assert_eq!(s["assumed"], json!([["ns/p", "n1"]]));
    assert_eq!(s["nodes"]["n1"]["podCount"], 2, "a, and p being bound");
    assert_eq!(s["nodes"]["n2"]["podCount"], 1);
}
