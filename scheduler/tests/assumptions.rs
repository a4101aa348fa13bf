//! Assumptions in the cluster index: a placement stays taken from the node's zones through
//! newer NRTs until the NRT's pod-set fingerprint shows the kubelet counted the pod; then the
//! NRT alone counts it (never twice). Also expiry, failed bindings, deleted pods, restarts,
//! and the cached aggregate message of a pod that fits nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config, TopologyState},
    pod::PodSpec,
    resources::ResId,
};
use serde_json::{Value, json};

const NODE: &str = "n1";

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": NODE},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "example.com/gpu": "4"}}
    }))
    .unwrap()
}

/// Two zones with 8 CPUs and 2 GPUs each; `free` lists the GPUs still free per zone, `cpu`
/// the free CPUs per zone; `pods` the pods the kubelet reports (for the fingerprint).
fn nrt(cpu: [i64; 2], free: [&[&str]; 2], pods: &[&str]) -> NodeResourceTopology {
    let zone = |i: usize| {
        json!({
            "name": format!("node-{i}"), "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": cpu[i].to_string()},
                {"name": "example.com/gpu", "capacity": "2", "allocatable": "2", "available": free[i].len().to_string()}
            ],
            "attributes": [{"name": "numaplane.io/free-devices.example.com/gpu", "value": free[i].join(",")}]
        })
    };
    common::single_numa_node_nrt(NODE, vec![zone(0), zone(1)], pods)
}

fn pod_json(name: &str, cpu: &str, gpus: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": cpu, "memory": "1Gi", "example.com/gpu": gpus},
            "limits": {"cpu": cpu, "memory": "1Gi", "example.com/gpu": gpus}}}]},
        "status": {"phase": "Pending"}
    })
}

fn spec(cluster: &mut Cluster, v: &Value) -> PodSpec {
    let pod: Pod = serde_json::from_value(v.clone()).unwrap();
    PodSpec::from_pod(&mut cluster.res, &pod).unwrap()
}

fn bound(v: &Value, phase: &str) -> Pod {
    let mut v = v.clone();
    v["spec"]["nodeName"] = json!(NODE);
    v["status"]["phase"] = json!(phase);
    serde_json::from_value(v).unwrap()
}

/// Free CPUs (whole cores; amounts are millicores) and free GPU IDs per zone, as the
/// scheduler sees them now.
fn zones(cluster: &Cluster) -> Vec<(i64, Vec<String>)> {
    let TopologyState::Valid(t) = cluster.topology(NODE) else {
        panic!("no valid topology")
    };
    let cpu = cluster.res.get("cpu").unwrap();
    let gpu: ResId = cluster.res.get("example.com/gpu").unwrap();
    t.zones
        .iter()
        .map(|z| {
            (
                z.available.get_or_zero(cpu) / 1000,
                z.free_devices.get(&gpu).cloned().unwrap_or_default(),
            )
        })
        .collect()
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn setup() -> (Cluster, Config) {
    let mut c = Cluster::new();
    c.apply_node(&node()).unwrap();
    c.apply_nrt(&nrt([8, 8], [&["g0", "g1"], &["g2", "g3"]], &[]))
        .unwrap();
    (c, Config::default())
}

/// Schedules and assumes `pod` at `now_ms`; returns the chosen devices.
fn place(c: &mut Cluster, cfg: &Config, v: &Value, now_ms: u64) -> Vec<String> {
    let p = spec(c, v);
    let d = c.decide(cfg, &p);
    assert_eq!(d.node.as_deref(), Some(NODE), "{}", d.message);
    c.assume_at(&p, &d, now_ms);
    d.allocation.unwrap().containers[0].devices["example.com/gpu"].clone()
}

#[test]
fn assumption_survives_an_nrt_that_does_not_show_the_pod() {
    let (mut c, cfg) = setup();
    let a = pod_json("a", "4", "2");
    assert_eq!(place(&mut c, &cfg, &a, 0), ids(&["g0", "g1"]));
    assert_eq!(zones(&c), [(4, vec![]), (8, ids(&["g2", "g3"]))]);
    // The exporter publishes again before the kubelet admitted the pod: same numbers, pod
    // not in the fingerprint. The assumption must still hold.
    c.apply_nrt(&nrt([8, 8], [&["g0", "g1"], &["g2", "g3"]], &[]))
        .unwrap();
    assert!(c.is_assumed("ns/a"));
    assert_eq!(zones(&c), [(4, vec![]), (8, ids(&["g2", "g3"]))]);
}

#[test]
fn nrt_that_shows_the_pod_confirms_it_without_counting_twice() {
    let (mut c, cfg) = setup();
    let a = pod_json("a", "4", "2");
    place(&mut c, &cfg, &a, 0);
    c.apply_pod(&bound(&a, "Pending")).unwrap();
    // The kubelet admitted it: the NRT shows it and its fingerprint names it.
    c.apply_nrt(&nrt([4, 8], [&[], &["g2", "g3"]], &["ns/a"]))
        .unwrap();
    assert!(!c.is_assumed("ns/a"));
    assert_eq!(c.assumption_stats.confirmed, 1);
    assert_eq!(
        zones(&c),
        [(4, vec![]), (8, ids(&["g2", "g3"]))],
        "not 0 CPUs: counted once"
    );
}

#[test]
fn only_the_pods_the_fingerprint_shows_are_confirmed() {
    let (mut c, cfg) = setup();
    let a = pod_json("a", "2", "1");
    let b = pod_json("b", "2", "1");
    assert_eq!(place(&mut c, &cfg, &a, 0), ids(&["g0"]));
    assert_eq!(place(&mut c, &cfg, &b, 1), ids(&["g1"]));
    assert_eq!(zones(&c), [(4, vec![]), (8, ids(&["g2", "g3"]))]);
    // The kubelet admitted a but not b yet.
    c.apply_nrt(&nrt([6, 8], [&["g1"], &["g2", "g3"]], &["ns/a"]))
        .unwrap();
    assert!(!c.is_assumed("ns/a"));
    assert!(c.is_assumed("ns/b"));
    assert_eq!(zones(&c), [(4, vec![]), (8, ids(&["g2", "g3"]))]);
}

#[test]
fn nrt_with_unknown_pods_keeps_every_assumption() {
    let (mut c, cfg) = setup();
    place(&mut c, &cfg, &pod_json("a", "4", "2"), 0);
    // A fingerprint of pods this scheduler does not know: nothing can be confirmed.
    c.apply_nrt(&nrt([4, 8], [&[], &["g2", "g3"]], &["other/x", "ns/a"]))
        .unwrap();
    assert!(c.is_assumed("ns/a"));
    assert_eq!(
        zones(&c),
        [(0, vec![]), (8, ids(&["g2", "g3"]))],
        "pessimistic: counted twice"
    );
}

#[test]
fn expiry_failed_binding_and_deletion_release_the_zones() {
    let (mut c, cfg) = setup();
    place(&mut c, &cfg, &pod_json("a", "4", "2"), 1_000);
    place(&mut c, &cfg, &pod_json("b", "4", "2"), 2_000);
    assert_eq!(zones(&c), [(4, vec![]), (4, vec![])]);
    assert!(c.expire_assumptions(30_999, 30_000).is_empty());
    assert_eq!(c.expire_assumptions(31_000, 30_000), ["ns/a"]);
    assert_eq!(c.assumption_stats.expired, 1);
    assert_eq!(zones(&c)[0], (8, ids(&["g0", "g1"])));
    c.forget("ns/b", Some("uid-b"));
    assert_eq!(c.assumption_stats.forgotten, 1);
    assert_eq!(zones(&c)[1], (8, ids(&["g2", "g3"])));
    // Node-level accounting is undone too: a pod needing the whole node fits again.
    place(&mut c, &cfg, &pod_json("c", "4", "2"), 3_000);
    c.delete_pod("ns/c");
    assert_eq!(c.assumption_stats.gone, 1);
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (8, ids(&["g2", "g3"]))]);
}

#[test]
fn assumed_devices_are_not_chosen_twice_across_nrt_updates() {
    let (mut c, cfg) = setup();
    let mut seen = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        seen.extend(place(&mut c, &cfg, &pod_json(name, "1", "1"), i as u64));
        // An unchanged NRT arrives between decisions.
        c.apply_nrt(&nrt([8, 8], [&["g0", "g1"], &["g2", "g3"]], &[]))
            .unwrap();
    }
    seen.sort();
    assert_eq!(seen, ids(&["g0", "g1", "g2", "g3"]));
    let p = spec(&mut c, &pod_json("e", "1", "1"));
    assert!(c.decide(&cfg, &p).node.is_none(), "every GPU is taken");
}

#[test]
fn restart_restores_unreflected_placements_only() {
    let (mut c, _) = setup();
    let a = pod_json("a", "4", "2");
    let b = pod_json("b", "4", "2");
    // After a restart: both pods are bound; the NRT shows a (Running) but not b (Pending).
    c.apply_pod(&bound(&a, "Running")).unwrap();
    c.apply_pod(&bound(&b, "Pending")).unwrap();
    c.apply_nrt(&nrt([4, 8], [&[], &["g2", "g3"]], &["ns/a"]))
        .unwrap();
    for v in [&a, &b] {
        let p = PodSpec::from_pod(&mut c.res, &bound(v, "x")).unwrap();
        c.restore_assumption(&p, None, 0);
    }
    assert!(
        !c.is_assumed("ns/a"),
        "running pods are already counted by the NRT"
    );
    assert!(c.is_assumed("ns/b"));
    assert_eq!(zones(&c), [(4, vec![]), (4, vec![])]);
}

#[test]
fn unschedulable_message_is_cached_and_equals_the_explained_one() {
    let (mut c, cfg) = setup();
    let mut n2 = serde_json::to_value(node()).unwrap();
    n2["metadata"]["name"] = json!("n2");
    n2["spec"] = json!({"unschedulable": true});
    c.apply_node(&serde_json::from_value(n2).unwrap()).unwrap();
    let big = spec(&mut c, &pod_json("big", "12", "1"));
    let explained = c.schedule(&cfg, &big, true).message;
    let first = c.decide(&cfg, &big);
    let again = c.decide(&cfg, &big);
    assert!(first.node.is_none());
    assert_eq!(first.message, explained);
    assert_eq!(again.message, explained);
    assert!(explained.starts_with("0/2 nodes are available: "), "{explained}");
    // After the node changes, the message follows it.
    c.apply_nrt(&nrt([8, 8], [&[], &[]], &[])).unwrap();
    assert_eq!(c.decide(&cfg, &big).message, c.schedule(&cfg, &big, true).message);
}

/// Two zones of `5E` memory are each a valid quantity, but their sum wraps an `i64`: the node
/// is "topology unknown or invalid", never a wrong verdict and never a panic.
#[test]
fn zone_amounts_that_overflow_when_summed_make_the_topology_invalid() {
    let mut c = Cluster::new();
    c.apply_node(&node()).unwrap();
    let mut v = serde_json::to_value(nrt([8, 8], [&[], &[]], &[])).unwrap();
    for z in v["zones"].as_array_mut().unwrap() {
        z["resources"].as_array_mut().unwrap().push(json!(
            {"name": "memory", "capacity": "5E", "allocatable": "5E", "available": "5E"}));
    }
    let err = c.apply_nrt(&serde_json::from_value(v).unwrap()).unwrap_err();
    assert_eq!(err.metric_label(), "amount_overflow");
    let p = spec(&mut c, &pod_json("a", "1", "0"));
    let d = c.schedule(&Config::default(), &p, true);
    assert!(d.node.is_none());
    assert!(d.message.contains("topology unknown or invalid"), "{}", d.message);
    assert_eq!(c.decide(&Config::default(), &p).message, d.message);
}

/// A relist of the bound pods (410 Gone, watch restart) does not list a pod whose Binding is
/// still in flight, nor one whose Binding was accepted after the list began: their assumptions
/// must survive, or the next pod gets the same zone. A placement whose Binding was accepted
/// before the list began and that the list does not show is gone (deleted since).
#[test]
fn a_relist_keeps_the_assumptions_of_bindings_in_flight() {
    let (mut c, cfg) = setup();
    let a = pod_json("a", "8", "2");
    assert_eq!(place(&mut c, &cfg, &a, 0), ids(&["g0", "g1"]));
    c.reset_pods(&[], 10);
    assert!(c.is_assumed("ns/a"), "the Binding of a is in flight");
    assert_eq!(zones(&c), [(0, vec![]), (8, ids(&["g2", "g3"]))]);
    // Accepted after the list began: still not reflected, still held.
    c.binding_succeeded("ns/a", Some("uid-a"), 20);
    c.reset_pods(&[], 15);
    assert!(c.is_assumed("ns/a"), "accepted after the list began");
    let b = pod_json("b", "8", "2");
    assert_eq!(place(&mut c, &cfg, &b, 30), ids(&["g2", "g3"]), "not a's zone");
    // Accepted before the list began and not listed: deleted since; b is still in flight.
    c.reset_pods(&[], 25);
    assert!(!c.is_assumed("ns/a"));
    assert!(c.is_assumed("ns/b"));
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (0, vec![])]);
}

/// [`setup`], then pod `a` placed (zone 0), deleted and recreated under its name (UID
/// `uid-a-2`) while that placement is still assumed, and placed again (zone 1).
fn a_recreated_while_assumed() -> (Cluster, Config) {
    let (mut c, cfg) = setup();
    let old = pod_json("a", "8", "2");
    assert_eq!(place(&mut c, &cfg, &old, 0), ids(&["g0", "g1"]));
    let mut new = old.clone();
    new["metadata"]["uid"] = json!("uid-a-2");
    assert_eq!(place(&mut c, &cfg, &new, 1), ids(&["g2", "g3"]));
    (c, cfg)
}

/// A pod deleted and recreated under its name while its first placement is still assumed:
/// the new pod is decided against zones that still hold the old placement, and its own
/// placement must be assumed where it was decided (where its record says), not re-predicted
/// after the old one is dropped.
#[test]
fn a_recreated_pod_is_assumed_where_it_was_decided() {
    let (c, _) = a_recreated_while_assumed();
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (0, vec![])]);
}

/// A pod deleted and recreated under its name while its Binding was in flight: the new pod
/// is placed, then the stale Binding fails (UID precondition). That failure ends the old
/// pod's placement only; the new pod's zones stay taken.
#[test]
fn a_late_failure_of_a_stale_binding_keeps_the_new_pods_placement() {
    let (mut c, cfg) = a_recreated_while_assumed();
    c.forget("ns/a", Some("uid-a"));
    assert!(c.is_assumed("ns/a"), "the new pod's placement stays");
    assert_eq!(c.assumption_stats.forgotten, 0);
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (0, vec![])]);
    let b = pod_json("b", "8", "2");
    assert_eq!(place(&mut c, &cfg, &b, 2), ids(&["g0", "g1"]));
    let late = spec(&mut c, &pod_json("c", "8", "2"));
    assert!(c.decide(&cfg, &late).node.is_none(), "both zones are taken");
    // The new pod's own failure ends it.
    c.forget("ns/a", Some("uid-a-2"));
    assert!(!c.is_assumed("ns/a"));
    assert_eq!(zones(&c)[1], (8, ids(&["g2", "g3"])));
}

/// After a restart, a Running pod the NRT does not show yet (the exporter lags) still holds
/// its zone and devices: the placement is rebuilt from its record, in the zone and with the
/// device IDs the record names, not wherever a new prediction would put it.
#[test]
fn restart_restores_running_pods_from_their_records() {
    let (mut c, cfg) = setup();
    let a = pod_json("a", "2", "1");
    // Recorded on zone 1 with g3 (a prediction on free zones would choose zone 0 and g0).
    let record = numaplane::allocation::Allocation {
        version: "v1".into(),
        node: NODE.into(),
        policy: "single-numa-node".into(),
        scope: "container".into(),
        pod_numa_nodes: None,
        containers: vec![numaplane::allocation::ContainerAllocation {
            name: "c".into(),
            kind: numaplane::allocation::ContainerKind::App,
            numa_nodes: Some(vec![1]),
            devices: [("example.com/gpu".to_owned(), ids(&["g3"]))].into(),
            device_counts: Default::default(),
        }],
        nrt_fingerprint: None,
    };
    let mut v = a.clone();
    v["metadata"]["annotations"] = json!({"numaplane.io/allocation": record.to_annotation().unwrap()});
    c.apply_pod(&bound(&v, "Running")).unwrap();
    let p = PodSpec::from_pod(&mut c.res, &bound(&v, "Running")).unwrap();
    c.restore_assumption(&p, Some(&record), 0);
    assert!(c.is_assumed("ns/a"), "Running, and the NRT does not show it");
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (6, ids(&["g2"]))]);
    // Restoring twice changes nothing; new pods go around it.
    c.restore_assumption(&p, Some(&record), 1);
    assert_eq!(zones(&c), [(8, ids(&["g0", "g1"])), (6, ids(&["g2"]))]);
    assert_eq!(
        place(&mut c, &cfg, &pod_json("b", "8", "2"), 2),
        ids(&["g0", "g1"])
    );
    let late = spec(&mut c, &pod_json("c", "8", "1"));
    assert!(c.decide(&cfg, &late).node.is_none(), "zone 1 holds a");
    // Once the NRT shows a, the record is what the NRT says: confirmed, counted once.
    c.apply_nrt(&nrt([8, 6], [&["g0", "g1"], &["g2"]], &["ns/a"]))
        .unwrap();
    assert!(!c.is_assumed("ns/a"));
    assert_eq!(zones(&c)[1], (6, ids(&["g2"])));
}
