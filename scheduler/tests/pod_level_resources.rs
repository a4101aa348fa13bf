//! Pod-level `spec.resources` in the kubelet admission prediction, as v1.36's kubelet with
//! default gates handles it (`PodLevelResourceManagers` alpha and off): the static CPU manager
//! (`pkg/kubelet/cm/cpumanager/policy_static.go`) allocates such a pod no exclusive CPUs and gives
//! no hint, the static memory manager (`pkg/kubelet/cm/memorymanager/policy_static.go`) skips it,
//! and the device manager still aligns its devices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    admission::{self, Placement, Rejection, WorkingZones},
    node::NumaTopology,
    pod::{PodSpec, Qos},
    resources::Resources,
};
use serde_json::{Value, json};

/// Two NUMA zones of 4 free CPUs each, a GPU free on zone 1 only; `single-numa-node`, container
/// scope, static CPU manager.
fn node() -> NodeResourceTopology {
    let zone = |i: usize, gpus: &str| {
        let free = if gpus.is_empty() { 0 } else { 1 };
        json!({"name": format!("node-{i}"), "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
                {"name": "example.com/gpu", "capacity": "1", "allocatable": "1", "available": free.to_string()}],
            "attributes": [{"name": "numaplane.io/free-devices.example.com/gpu", "value": gpus}]})
    };
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": [zone(0, ""), zone(1, "gpu-1")]
    }))
    .unwrap()
}

fn predict(spec: Value) -> (PodSpec, Result<Placement, Rejection>) {
    let mut res = Resources::default();
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})).unwrap();
    let p = PodSpec::from_pod(&mut res, &pod).unwrap();
    let topo = NumaTopology::from_nrt(&mut res, &node()).unwrap();
    let out = admission::predict(&res, &topo, &mut WorkingZones::with_device_ids(&topo), &p);
    let fast = admission::admits(&res, &topo, &mut WorkingZones::from_topology(&topo), &p);
    assert_eq!(fast, out.is_ok(), "admits vs predict: {out:?}");
    (p, out)
}

#[test]
fn six_exclusive_cpus_do_not_fit_one_zone_of_four() {
    let r = json!({"cpu": "6", "memory": "1Gi"});
    let (p, out) = predict(json!({"containers": [{"name": "c", "resources": {"requests": r, "limits": r}}]}));
    assert_eq!(p.qos, Qos::Guaranteed);
    let rejection = out.expect_err("the CPU manager's hint needs both zones");
    assert!(!rejection.category.is_empty(), "{rejection:?}");
}

#[test]
fn a_guaranteed_pod_with_pod_level_resources_gets_no_cpu_hint_and_is_admitted_unaligned() {
    let r = json!({"cpu": "6", "memory": "1Gi"});
    let (p, out) = predict(json!({"containers": [{"name": "c"}], "resources": {"requests": r, "limits": r}}));
    assert_eq!(p.qos, Qos::Guaranteed);
    let placement = out.expect("no CPU or memory hint: nothing to align");
    assert_eq!(placement.containers[0].numa_nodes, None, "{placement:?}");
    assert!(placement.containers[0].devices.is_empty());
}

#[test]
fn its_devices_are_still_aligned() {
    let r = json!({"cpu": "6", "memory": "1Gi"});
    let (_, out) = predict(json!({
        "containers": [{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}}}],
        "resources": {"requests": r, "limits": r}}));
    let placement = out.expect("the GPU's zone");
    assert_eq!(placement.containers[0].numa_nodes, Some(vec![1]), "{placement:?}");
    assert_eq!(
        placement.containers[0].devices.get("example.com/gpu"),
        Some(&vec!["gpu-1".to_owned()])
    );
}
