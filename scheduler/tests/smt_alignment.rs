//! The static CPU manager's `full-pcpus-only` (kubelet-topology-manager.md, SMTAlignmentError):
//! a Guaranteed container whose exclusive CPU count is not a multiple of the SMT width is
//! rejected even when the Topology Manager admits it, and so is one that needs more whole
//! cores than the node has free. Predicted from the exporter's attributes; without them, as
//! before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::{Value, json};

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}
    }))
    .unwrap()
}

/// Two zones of 8 CPUs (4 two-thread cores each); `smt` adds the CPU manager attributes,
/// `free_cores` the per-zone whole free cores.
fn nrt(smt: bool, free_cores: Option<[i64; 2]>) -> NodeResourceTopology {
    let mut attributes = vec![
        json!({"name": "topologyManagerPolicy", "value": "single-numa-node"}),
        json!({"name": "topologyManagerScope", "value": "container"}),
    ];
    if smt {
        attributes.extend([
            json!({"name": "numaplane.io/cpu-manager-policy", "value": "static"}),
            json!({"name": "numaplane.io/cpu-manager-policy-options", "value": "full-pcpus-only=true"}),
            json!({"name": "numaplane.io/threads-per-core", "value": "2"}),
        ]);
    }
    let zone = |i: usize| {
        let attrs: Vec<Value> = free_cores
            .map(|f| vec![json!({"name": "numaplane.io/free-cores", "value": f[i].to_string()})])
            .unwrap_or_default();
        json!({"name": format!("node-{i}"), "type": "Node", "attributes": attrs,
            "resources": [{"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"}]})
    };
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"}, "attributes": attributes, "zones": [zone(0), zone(1)]
    }))
    .unwrap()
}

/// The node a decision (not assumed) gives `pod`.
fn node_for(c: &mut Cluster, pod: &PodSpec) -> Option<String> {
    c.schedule(&Config::default(), pod, false).node
}

fn guaranteed(c: &mut Cluster, cpus: &str) -> PodSpec {
    let r = json!({"cpu": cpus, "memory": "1Gi"});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("p{cpus}"), "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": r, "limits": r}}]}
    }))
    .unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

fn cluster(smt: bool, free_cores: Option<[i64; 2]>) -> Cluster {
    let mut c = Cluster::new();
    c.apply_node(&node()).unwrap();
    c.apply_nrt(&nrt(smt, free_cores)).unwrap();
    c
}

#[test]
fn an_odd_cpu_count_is_rejected_under_full_pcpus_only_and_an_even_one_fits() {
    let mut c = cluster(true, None);
    let one = guaranteed(&mut c, "1");
    let d = c.schedule(&Config::default(), &one, true);
    assert_eq!(d.node, None, "{}", d.message);
    assert!(d.message.contains("SMT alignment"), "{}", d.message);
    let reason = d.nodes[0].reasons.join("; ");
    assert!(
        reason.contains("SMTAlignmentError") && reason.contains("threads per core"),
        "{reason}"
    );
    let two = guaranteed(&mut c, "2");
    assert_eq!(node_for(&mut c, &two), Some("n1".to_owned()));
}

#[test]
fn whole_cores_must_be_free_on_the_node() {
    // 6 CPUs = 3 cores; the node has 1 + 1 whole cores free (the rest are split by pods).
    let mut c = cluster(true, Some([1, 1]));
    let six = guaranteed(&mut c, "6");
    let d = c.schedule(&Config::default(), &six, true);
    assert_eq!(d.node, None, "{}", d.message);
    let reason = d.nodes[0].reasons.join("; ");
    assert!(reason.contains("whole cores"), "{reason}");
    let two = guaranteed(&mut c, "2");
    assert_eq!(node_for(&mut c, &two), Some("n1".to_owned()));
}

#[test]
fn without_the_attributes_nothing_changes() {
    let mut c = cluster(false, Some([0, 0]));
    let one = guaranteed(&mut c, "1");
    assert_eq!(node_for(&mut c, &one), Some("n1".to_owned()));
}

#[test]
fn an_assumed_placement_takes_its_whole_cores_until_the_nrt_shows_it() {
    // Two free whole cores on the node: a 4-CPU pod takes both.
    let mut c = cluster(true, Some([2, 0]));
    let four = guaranteed(&mut c, "4");
    let d = c.schedule(&Config::default(), &four, false);
    assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
    c.assume(&four, &d);
    let two = guaranteed(&mut c, "2");
    let d = c.schedule(&Config::default(), &two, true);
    assert_eq!(d.node, None, "{}", d.message);
    assert!(
        d.nodes[0].reasons.join("; ").contains("whole cores"),
        "{:?}",
        d.nodes[0].reasons
    );
}

fn guaranteed_containers(c: &mut Cluster, name: &str, init: &[&str], apps: &[&str]) -> PodSpec {
    let container = |i: usize, cpus: &&str| {
        let r = json!({"cpu": cpus, "memory": "1Gi"});
        json!({"name": format!("c{i}"), "resources": {"requests": r, "limits": r}})
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {
            "initContainers": init.iter().enumerate().map(|(i, c)| container(i, c)).collect::<Vec<_>>(),
            "containers": apps.iter().enumerate().map(|(i, c)| container(10 + i, c)).collect::<Vec<_>>()
        }
    }))
    .unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

/// The kubelet checks each container against the free whole cores of the shared pool
/// (`GetAvailablePhysicalCPUs`) at its own Allocate, after the pod's earlier containers took
/// theirs: two 2-CPU containers need two free cores, not one.
#[test]
fn earlier_containers_of_the_pod_take_their_cores_first() {
    let mut c = cluster(true, Some([1, 0]));
    let two_by_two = guaranteed_containers(&mut c, "two", &[], &["2", "2"]);
    let d = c.schedule(&Config::default(), &two_by_two, true);
    assert_eq!(d.node, None, "{}", d.message);
    let reason = d.nodes[0].reasons.join("; ");
    assert!(reason.contains("earlier containers took 1"), "{reason}");
    let mut c = cluster(true, Some([2, 0]));
    let two_by_two = guaranteed_containers(&mut c, "two", &[], &["2", "2"]);
    assert_eq!(node_for(&mut c, &two_by_two), Some("n1".to_owned()));
}

/// An app container that reuses an init container's CPUs is still checked against the pool
/// (the check precedes reuse), while the init container's CPUs never return to the pool: with
/// one free core, a 2-CPU init container then a 2-CPU app container is rejected.
#[test]
fn reused_init_cpus_do_not_count_as_free_whole_cores() {
    let mut c = cluster(true, Some([1, 0]));
    let pod = guaranteed_containers(&mut c, "init", &["2"], &["2"]);
    let d = c.schedule(&Config::default(), &pod, true);
    assert_eq!(d.node, None, "{}", d.message);
    assert!(
        d.nodes[0].reasons.join("; ").contains("SMTAlignmentError"),
        "{:?}",
        d.nodes[0].reasons
    );
    let mut c = cluster(true, Some([2, 0]));
    let pod = guaranteed_containers(&mut c, "init", &["2"], &["2"]);
    assert_eq!(node_for(&mut c, &pod), Some("n1".to_owned()));
}
