//! Admission rules observed on the real kubelet v1.36.2 (verified-facts.md, "Kubelet v1.36.2
//! admission rules seen on the real kubelet"), one scenario each, with the kubelet's verdict
//! and placement. The filter's fast path (`admits`) must agree with the full prediction.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    admission::{self, Placement, Rejection, WorkingZones},
    cluster::{Cluster, Config, TopologyState},
    node::NumaTopology,
    pod::PodSpec,
    resources::Resources,
};
use serde_json::{Value, json};

/// One zone of a test node: free CPUs of `cpus` (capacity = allocatable = `cpus`), and per
/// device resource (allocatable, free IDs).
struct Z {
    cpus: u32,
    free_cpus: u32,
    devices: Vec<(&'static str, u32, Vec<&'static str>)>,
}

fn zone(cpus: u32, free_cpus: u32) -> Z {
    Z {
        cpus,
        free_cpus,
        devices: Vec::new(),
    }
}

impl Z {
    fn with(mut self, resource: &'static str, allocatable: u32, free: &[&'static str]) -> Self {
        self.devices.push((resource, allocatable, free.to_vec()));
        self
    }
}

/// An NRT over `zones` (zone i is NUMA node i) with the policy, `prefer-closest-numa-nodes`
/// when `distances` are given (row i = costs from node i), and extra node attributes.
fn nrt(
    policy: &str,
    zones: &[Z],
    distances: Option<&[&[i64]]>,
    extra: &[(&str, &str)],
) -> NodeResourceTopology {
    let zones: Vec<Value> = zones
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let mut resources = vec![json!({"name": "cpu", "capacity": z.cpus.to_string(),
                "allocatable": z.cpus.to_string(), "available": z.free_cpus.to_string()})];
            let mut attributes = Vec::new();
            for (r, alloc, free) in &z.devices {
                resources.push(json!({"name": r, "capacity": alloc.to_string(),
                    "allocatable": alloc.to_string(), "available": free.len().to_string()}));
                attributes
                    .push(json!({"name": format!("numaplane.io/free-devices.{r}"), "value": free.join(",")}));
            }
            let mut obj = json!({"name": format!("node-{i}"), "type": "Node",
                "resources": resources, "attributes": attributes});
            if let Some(d) = distances {
                obj["costs"] = d[i]
                    .iter()
                    .enumerate()
                    .map(|(j, v)| json!({"name": format!("node-{j}"), "value": v}))
                    .collect();
            }
            obj
        })
        .collect();
    let mut attributes = vec![json!({"name": "topologyManagerPolicy", "value": policy})];
    // Container scope unless `extra` names one.
    if !extra.iter().any(|(k, _)| *k == SCOPE) {
        attributes.push(json!({"name": SCOPE, "value": "container"}));
    }
    if distances.is_some() {
        attributes.push(json!({"name": "topologyManagerOptionPreferClosestNumaNodes", "value": "true"}));
    }
    for (k, v) in extra {
        attributes.push(json!({"name": k, "value": v}));
    }
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"}, "attributes": attributes, "zones": zones
    }))
    .unwrap()
}

/// A Guaranteed one-container pod (1Gi of memory is added: Guaranteed needs it).
fn pod(res: &mut Resources, mut requests: Value) -> PodSpec {
    requests["memory"] = json!("1Gi");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]}
    }))
    .unwrap();
    PodSpec::from_pod(res, &pod).unwrap()
}

/// The full prediction, checked against the filter's fast path.
fn predict(obj: &NodeResourceTopology, requests: Value) -> Result<Placement, Rejection> {
    let mut res = Resources::default();
    let p = pod(&mut res, requests);
    let topo = NumaTopology::from_nrt(&mut res, obj).unwrap();
    let out = admission::predict(&res, &topo, &mut WorkingZones::with_device_ids(&topo), &p);
    let fast = admission::admits(&res, &topo, &mut WorkingZones::from_topology(&topo), &p);
    assert_eq!(fast, out.is_ok(), "admits vs predict: {out:?}");
    out
}

fn numa(p: &Placement) -> Option<Vec<u32>> {
    p.containers[0].numa_nodes.clone()
}

/// Distances where {1,2} and {0,3} are the closest pairs, at the same distance.
const TIED: [&[i64]; 4] = [
    &[10, 21, 21, 11],
    &[21, 10, 11, 21],
    &[21, 11, 10, 21],
    &[11, 21, 21, 10],
];

/// Ties between merged masks of equal width and equal average distance go to the lower mask
/// as an integer: {1,2} = 6 before {0,3} = 9. Three CPUs with two per node need two nodes.
#[test]
fn equal_masks_tie_to_the_lower_integer_1_2_before_0_3() {
    let zones = || (0..4).map(|_| zone(2, 2)).collect::<Vec<_>>();
    for policy in ["restricted", "best-effort"] {
        let p = predict(&nrt(policy, &zones(), Some(&TIED), &[]), json!({"cpu": "3"})).unwrap();
        assert_eq!(numa(&p), Some(vec![1, 2]), "{policy}");
    }
    // Without prefer-closest-numa-nodes the lowest two-node mask wins: {0,1} = 3.
    let p = predict(&nrt("restricted", &zones(), None, &[]), json!({"cpu": "3"})).unwrap();
    assert_eq!(numa(&p), Some(vec![0, 1]));
}

/// v1.36 builds a device resource's hints only over the NUMA nodes hosting its devices. GPUs on
/// NUMA 0 and 2 give the hints {0}, {2} and {0,2}: a two-node merge can only be {0,2}, however
/// close {0,3} is. 1 GPU + 3 CPUs (two per node) under best-effort: every merge is
/// non-preferred, the best one has two nodes. v1.26 also listed {0,3} for the GPU and merged
/// there (this test failed with {0,3} before the rule).
#[test]
fn device_hints_cover_only_the_nodes_hosting_the_devices() {
    let closest_0_3: [&[i64]; 4] = [
        &[10, 21, 21, 11],
        &[21, 10, 21, 21],
        &[21, 21, 10, 21],
        &[11, 21, 21, 10],
    ];
    let zones = vec![
        zone(2, 2).with("example.com/gpu", 1, &["gpu-0"]),
        zone(2, 2),
        zone(2, 2).with("example.com/gpu", 1, &["gpu-2"]),
        zone(2, 2),
    ];
    let obj = nrt("best-effort", &zones, Some(&closest_0_3), &[]);
    let p = predict(&obj, json!({"cpu": "3", "example.com/gpu": "1"})).unwrap();
    assert_eq!(numa(&p), Some(vec![0, 2]));
    assert_eq!(p.containers[0].devices["example.com/gpu"], ["gpu-0"]);
    // restricted: the GPU's preferred hints are single nodes and the CPUs' are pairs, so no
    // merge is preferred (TopologyAffinityError), as before.
    let obj = nrt("restricted", &zones, Some(&closest_0_3), &[]);
    let r = predict(&obj, json!({"cpu": "3", "example.com/gpu": "1"})).unwrap_err();
    assert_eq!(r.kubelet_reason, "TopologyAffinityError");
    // Two GPUs need both hosting nodes: {0,2} is then preferred for them and for the CPUs.
    let p = predict(&obj, json!({"cpu": "3", "example.com/gpu": "2"})).unwrap();
    assert_eq!(numa(&p), Some(vec![0, 2]));
}

const SCOPE: &str = "topologyManagerScope";
const GPU_WITHOUT_NUMA: &str = "numaplane.io/devices-without-numa.example.com/gpu";
const FPGA_WITHOUT_NUMA: &str = "numaplane.io/devices-without-numa.example.com/fpga";

/// In a resource where some devices have a NUMA node, a device without one is in no hint mask.
/// The GPU on NUMA 0 is held; gpu-x (no NUMA node) is free. `single-numa-node` and `restricted`
/// reject with TopologyAffinityError although it is free; `best-effort` and `none` admit the
/// pod and hand it out. (Before the model knew such devices, best-effort predicted
/// UnexpectedAdmissionError: no zone had a free GPU.)
#[test]
fn a_device_without_numa_node_in_a_mixed_resource_is_in_no_hint_mask() {
    let zones = vec![zone(2, 2).with("example.com/gpu", 1, &[]), zone(2, 2)];
    let obj = |policy: &str| nrt(policy, &zones, None, &[(GPU_WITHOUT_NUMA, "1:gpu-x")]);
    let one = || json!({"cpu": "1", "example.com/gpu": "1"});
    for policy in ["single-numa-node", "restricted"] {
        let r = predict(&obj(policy), one()).unwrap_err();
        assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{policy}: {r:?}");
    }
    for policy in ["best-effort", "none"] {
        let p = predict(&obj(policy), one()).unwrap();
        assert_eq!(p.containers[0].devices["example.com/gpu"], ["gpu-x"], "{policy}");
    }
    // With the NUMA-0 GPU free as well, the aligned one goes first; two GPUs need gpu-x too,
    // which no mask holds: single-numa-node rejects, best-effort hands out both.
    let zones = vec![zone(2, 2).with("example.com/gpu", 1, &["gpu-0"]), zone(2, 2)];
    let obj = |policy: &str| nrt(policy, &zones, None, &[(GPU_WITHOUT_NUMA, "1:gpu-x")]);
    let p = predict(&obj("single-numa-node"), one()).unwrap();
    assert_eq!(p.containers[0].devices["example.com/gpu"], ["gpu-0"]);
    assert_eq!(numa(&p), Some(vec![0]));
    let two = || json!({"cpu": "1", "example.com/gpu": "2"});
    let r = predict(&obj("single-numa-node"), two()).unwrap_err();
    assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{r:?}");
    let p = predict(&obj("best-effort"), two()).unwrap();
    assert_eq!(p.containers[0].devices["example.com/gpu"], ["gpu-0", "gpu-x"]);
    // Three are more than exist: "cannot satisfy", and best-effort fails in Allocate.
    let r = predict(&obj("best-effort"), json!({"cpu": "1", "example.com/gpu": "3"})).unwrap_err();
    assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{r:?}");
}

/// A resource whose devices have no NUMA node at all gets no-preference hints: the Topology
/// Manager admits the pod under every policy, single-numa-node included, and Allocate fails
/// with UnexpectedAdmissionError once the devices are used up. (Before, the model admitted
/// whatever was left.)
#[test]
fn a_resource_without_any_numa_node_fails_in_allocate_once_used_up() {
    let zones = || vec![zone(2, 2), zone(2, 2)];
    for policy in ["none", "best-effort", "restricted", "single-numa-node"] {
        let obj = nrt(policy, &zones(), None, &[(FPGA_WITHOUT_NUMA, "1:fpga-0")]);
        let p = predict(&obj, json!({"cpu": "1", "example.com/fpga": "1"})).unwrap();
        assert_eq!(
            p.containers[0].devices["example.com/fpga"],
            ["fpga-0"],
            "{policy}"
        );
        let r = predict(&obj, json!({"cpu": "1", "example.com/fpga": "2"})).unwrap_err();
        assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{policy}: {r:?}");
        let used_up = nrt(policy, &zones(), None, &[(FPGA_WITHOUT_NUMA, "0")]);
        let r = predict(&used_up, json!({"cpu": "1", "example.com/fpga": "1"})).unwrap_err();
        assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{policy}: {r:?}");
        // Free but not listable: counted.
        let unnamed = nrt(policy, &zones(), None, &[(FPGA_WITHOUT_NUMA, "2")]);
        let p = predict(&unnamed, json!({"cpu": "1", "example.com/fpga": "2"})).unwrap();
        assert_eq!(p.containers[0].device_counts["example.com/fpga"], 2, "{policy}");
    }
}

/// The three GPUs of a 2-NUMA node as the real kubelet v1.36.2 was checked with them: gpu-0 on
/// NUMA 0, gpu-1 on NUMA 1 (both held here) and gpu-x without a NUMA node, free. A container
/// that needs one GPU can only get gpu-x: its device hint list is empty. Under `best-effort`
/// (and `none`, which asks for no hints) the kubelet admits it (best-effort admits every merged
/// hint) and hands out gpu-x, in both scopes; `restricted` and `single-numa-node` reject it
/// with TopologyAffinityError. The next such pod finds no GPU at all and fails in Allocate
/// (UnexpectedAdmissionError) under best-effort: the scheduler must know gpu-x is gone.
#[test]
fn a_gpu_only_available_without_numa_node_is_handed_out_under_best_effort_in_both_scopes() {
    let zones = || {
        vec![
            zone(4, 4).with("example.com/gpu", 1, &[]),
            zone(4, 4).with("example.com/gpu", 1, &[]),
        ]
    };
    let cfg = Config::default();
    for scope in ["container", "pod"] {
        for policy in ["none", "best-effort", "restricted", "single-numa-node"] {
            let ctx = format!("{policy}/{scope}");
            let obj = nrt(
                policy,
                &zones(),
                None,
                &[(GPU_WITHOUT_NUMA, "1:gpu-x"), (SCOPE, scope)],
            );
            let one = || json!({"cpu": "1", "example.com/gpu": "1"});
            let verdict = predict(&obj, one());
            if matches!(policy, "restricted" | "single-numa-node") {
                let r = verdict.unwrap_err();
                assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{ctx}: {r:?}");
                continue;
            }
            let p = verdict.unwrap_or_else(|r| panic!("{ctx}: {r:?}"));
            assert_eq!(p.containers[0].devices["example.com/gpu"], ["gpu-x"], "{ctx}");
            // Through the cluster index: placed, assumed, and the next GPU pod fits nowhere.
            let mut c = cluster(&obj);
            let first = named_pod(&mut c, "first", one());
            let d = c.schedule(&cfg, &first, false);
            assert_eq!(d.node.as_deref(), Some("n1"), "{ctx}: {}", d.message);
            c.assume(&first, &d);
            let next = named_pod(&mut c, "next", one());
            let d = c.schedule(&cfg, &next, true);
            assert_eq!(d.node, None, "{ctx}: {d:?}");
            // Once the NRT shows gpu-x taken, the same.
            let used = nrt(policy, &zones(), None, &[(GPU_WITHOUT_NUMA, "0"), (SCOPE, scope)]);
            let r = predict(&used, one()).unwrap_err();
            assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{ctx}: {r:?}");
        }
    }
}

/// A cluster of one node `n1` with the given NRT; its Node object allocates plenty of
/// everything, so only the NRT decides.
fn cluster(obj: &NodeResourceTopology) -> Cluster {
    let mut c = Cluster::new();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
            "example.com/gpu": "8", "example.com/fpga": "8"}}
    }))
    .unwrap();
    c.apply_node(&node).unwrap();
    c.apply_nrt(obj).unwrap();
    c
}

fn named_pod(c: &mut Cluster, name: &str, requests: Value) -> PodSpec {
    let mut requests = requests;
    requests["memory"] = json!("1Gi");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]}
    }))
    .unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

/// An assumed placement takes the devices without a NUMA node it got, so the next decision
/// sees them gone before the NRT does, and gives them back when it is forgotten.
#[test]
fn an_assumption_takes_devices_without_numa_node_until_it_ends() {
    let zones = vec![zone(2, 2), zone(2, 2)];
    let mut c = cluster(&nrt(
        "single-numa-node",
        &zones,
        None,
        &[(FPGA_WITHOUT_NUMA, "2:fpga-0,fpga-1")],
    ));
    let cfg = Config::default();
    let free = |c: &Cluster| {
        let TopologyState::Valid(t) = c.topology("n1") else {
            panic!("no topology")
        };
        let u = t.unaligned_devices.values().next().unwrap();
        (u.free, u.ids.clone())
    };
    let mut keys = Vec::new();
    for (name, want) in [("a", "fpga-0"), ("b", "fpga-1")] {
        let p = named_pod(&mut c, name, json!({"cpu": "1", "example.com/fpga": "1"}));
        let d = c.schedule(&cfg, &p, false);
        assert_eq!(d.node.as_deref(), Some("n1"), "{name}: {}", d.message);
        let placement = d.placement.clone().unwrap();
        assert_eq!(placement.containers[0].devices["example.com/fpga"], [want]);
        c.assume(&p, &d);
        keys.push(p.key());
    }
    assert_eq!(free(&c), (0, vec![]));
    let p = named_pod(&mut c, "c", json!({"cpu": "1", "example.com/fpga": "1"}));
    let d = c.schedule(&cfg, &p, true);
    assert_eq!(d.node, None, "{d:?}");
    assert!(d.message.contains("example.com/fpga"), "{}", d.message);
    c.forget(&keys[0], None);
    assert_eq!(free(&c), (1, vec!["fpga-0".to_owned()]));
    let d = c.schedule(&cfg, &p, false);
    assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
}

/// Free exclusive CPUs per zone in `w` (whole CPUs).
fn free_cpus(w: &WorkingZones) -> Vec<i64> {
    w.available
        .iter()
        .map(|a| a.get_or_zero(numaplane_scheduler::resources::CPU) / 1000)
        .collect()
}

/// best-effort with a non-preferred merged hint: each provider allocates by its own rules. The
/// GPU is only on NUMA 0, where no CPU is free; the best merged hint is {0} (not preferred),
/// the device manager gives gpu-0 there, and the CPU manager, finding no CPU in the mask,
/// packs the two CPUs onto the node with the fewest free CPUs: NUMA 3, not the lowest (as the
/// real kubelet did: "best hint {0}, CPUs on NUMA 3"). Before, the model took them from NUMA 1.
#[test]
fn best_effort_cpus_outside_the_mask_go_where_the_cpu_manager_packs_them() {
    let zones = vec![
        zone(4, 0).with("example.com/gpu", 1, &["gpu-0"]),
        zone(4, 4),
        zone(4, 4),
        zone(4, 2),
    ];
    let obj = nrt("best-effort", &zones, None, &[]);
    let mut res = Resources::default();
    let p = pod(&mut res, json!({"cpu": "2", "example.com/gpu": "1"}));
    let topo = NumaTopology::from_nrt(&mut res, &obj).unwrap();
    let mut w = WorkingZones::with_device_ids(&topo);
    let placed = admission::predict(&res, &topo, &mut w, &p).unwrap();
    assert_eq!(numa(&placed), Some(vec![0]));
    assert_eq!(placed.containers[0].devices["example.com/gpu"], ["gpu-0"]);
    assert_eq!(free_cpus(&w), [0, 4, 4, 0]);
    // Whole free NUMA nodes go first when the request covers one: 5 CPUs take NUMA 1 whole
    // (the lowest of the two free nodes), then one from NUMA 3 (fewest free).
    let mut w = WorkingZones::with_device_ids(&topo);
    let p5 = pod(&mut res, json!({"cpu": "5", "example.com/gpu": "1"}));
    admission::predict(&res, &topo, &mut w, &p5).unwrap();
    assert_eq!(free_cpus(&w), [0, 0, 4, 1]);
}

/// Inside a multi-node mask the CPU manager packs too, and the next pod's verdict depends on
/// it. restricted, NUMA 0 and 1 with 5 CPUs each, 4 and 3 free; the GPU is on NUMA 0. Six
/// CPUs need {0,1}: the kubelet takes NUMA 1's three first (fewest free), then three of NUMA
/// 0, leaving one free there; the next pod (1 CPU + the GPU) is then admitted on {0}. Before,
/// the model filled NUMA 0 first and refused the second pod (TopologyAffinityError).
#[test]
fn cpus_in_a_multi_node_mask_are_packed_and_decide_the_next_pod() {
    let zones = vec![zone(5, 4).with("example.com/gpu", 1, &["gpu-0"]), zone(5, 3)];
    let mut c = cluster(&nrt("restricted", &zones, None, &[]));
    let cfg = Config::default();
    let a = named_pod(&mut c, "a", json!({"cpu": "6"}));
    let d = c.schedule(&cfg, &a, false);
    assert_eq!(
        numa(d.placement.as_ref().unwrap()),
        Some(vec![0, 1]),
        "{}",
        d.message
    );
    c.assume(&a, &d);
    let b = named_pod(&mut c, "b", json!({"cpu": "1", "example.com/gpu": "1"}));
    let d = c.schedule(&cfg, &b, true);
    assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
    assert_eq!(numa(d.placement.as_ref().unwrap()), Some(vec![0]));
}
