//! Init-container reuse (kubelet-topology-manager.md §2.7, §3.1 step 3, §3.3 step 4 and device
//! allocation step 1): the CPUs and devices a finished (non-restartable) init container got are
//! "reusable" by the pod's later containers; the CPU and device hint providers skip every NUMA
//! mask that leaves one of them out; the device manager hands reusable devices out first; and
//! what no later container reuses stays held by the pod. Restartable (sidecar) init containers
//! keep theirs. Each expectation below was worked out by hand from those rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    admission::{self, Placement, Rejection, WorkingZones},
    cluster::{Cluster, Config, TopologyState},
    node::NumaTopology,
    pod::PodSpec,
    resources::{CPU, Resources},
};
use serde_json::{Value, json};

const GPU: &str = "example.com/gpu";

/// Two zones of 8 CPUs; `cpu` free CPUs per zone; `gpus` the free GPU IDs per zone (also the
/// zone's GPU capacity when `capacity` is `None`); `ids` publishes the free IDs.
/// Two nodes of 8 free CPUs under single-numa-node at container scope, nothing else.
fn two_free_nodes() -> NodeResourceTopology {
    nrt("single-numa-node", "container", [8, 8], [&[], &[]], None, false)
}

fn nrt(
    policy: &str,
    scope: &str,
    cpu: [i64; 2],
    gpus: [&[&str]; 2],
    capacity: Option<[i64; 2]>,
    ids: bool,
) -> NodeResourceTopology {
    let zone = |i: usize| {
        let cap = capacity.map_or(gpus[i].len() as i64, |c| c[i]);
        let attributes: Vec<Value> = if ids {
            vec![json!({"name": format!("numaplane.io/free-devices.{GPU}"), "value": gpus[i].join(",")})]
        } else {
            vec![]
        };
        json!({
            "name": format!("node-{i}"), "type": "Node", "attributes": attributes,
            "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": cpu[i].to_string()},
                {"name": GPU, "capacity": cap.to_string(), "allocatable": cap.to_string(), "available": gpus[i].len().to_string()}
            ]
        })
    };
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": policy},
            {"name": "topologyManagerScope", "value": scope}
        ],
        "zones": [zone(0), zone(1)]
    }))
    .unwrap()
}

/// A Guaranteed container (1Gi of memory: the NRT lists none, so the memory manager is off).
fn container(name: &str, cpu: u32, gpus: u32, sidecar: bool) -> Value {
    let mut r = json!({"cpu": cpu.to_string(), "memory": "1Gi"});
    if gpus > 0 {
        r[GPU] = json!(gpus.to_string());
    }
    let mut c = json!({"name": name, "resources": {"requests": r, "limits": r}});
    if sidecar {
        c["restartPolicy"] = json!("Always");
    }
    c
}

fn pod(res: &mut Resources, init: &[Value], app: &[Value]) -> PodSpec {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"initContainers": init, "containers": app}
    }))
    .unwrap();
    PodSpec::from_pod(res, &pod).unwrap()
}

/// The prediction and the zones it leaves (free CPUs per zone, whole CPUs).
fn predict(
    res: &mut Resources,
    nrt: &NodeResourceTopology,
    pod: &PodSpec,
) -> (Result<Placement, Rejection>, Vec<i64>) {
    let topo = NumaTopology::from_nrt(res, nrt).unwrap();
    let mut w = WorkingZones::with_device_ids(&topo);
    let out = admission::predict(res, &topo, &mut w, pod);
    let cpus = w.available.iter().map(|z| z.get_or_zero(CPU) / 1000).collect();
    (out, cpus)
}

fn numa(p: &Placement, container: &str) -> Option<Vec<u32>> {
    p.containers
        .iter()
        .find(|c| c.name == container && c.kind != numaplane_scheduler::admission::ContainerKind::Init)
        .or_else(|| p.containers.iter().find(|c| c.name == container))
        .unwrap()
        .numa_nodes
        .clone()
}

/// The example of the kubelet rules' §3.1 step 3: 4 CPUs free on node 0 and 8 on node 1; the init container
/// takes 4 (hints {0} and {1} are preferred, {0} is the lower), so node 0's 4 CPUs are reusable.
/// The app container needs 6: {0} holds the reusable CPUs but only 4 ≥ 6 fails; {1} leaves the
/// reusable CPUs out and is skipped; {0,1} (4 reusable + 8 free) is the only hint, and not
/// preferred (one node of 8 CPUs could hold 6).
#[test]
fn cpu_masks_leaving_out_reusable_init_cpus_are_skipped_rule_3_1_step_3() {
    let init = [container("init", 4, 0, false)];
    let app = [container("app", 6, 0, false)];
    for policy in ["restricted", "single-numa-node"] {
        let mut res = Resources::default();
        let p = pod(&mut res, &init, &app);
        let (out, _) = predict(
            &mut res,
            &nrt(policy, "container", [4, 8], [&[], &[]], None, false),
            &p,
        );
        let r = out.expect_err(policy);
        assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{policy}: {r:?}");
        assert!(r.message.contains("container `app`"), "{policy}: {}", r.message);
        assert!(
            r.message.contains("init containers hold on NUMA [0]"),
            "{policy}: {}",
            r.message
        );
    }
    // best-effort admits with the non-preferred {0,1}: 4 reused on node 0, 2 more from node 0's
    // order (none left there), then node 1.
    let mut res = Resources::default();
    let p = pod(&mut res, &init, &app);
    let (out, cpus) = predict(
        &mut res,
        &nrt("best-effort", "container", [4, 8], [&[], &[]], None, false),
        &p,
    );
    let placed = out.unwrap();
    assert_eq!(numa(&placed, "init"), Some(vec![0]));
    assert_eq!(numa(&placed, "app"), Some(vec![0, 1]));
    assert_eq!(cpus, vec![0, 6], "the pod holds the init's 4 and 2 new CPUs");
    // Control: the same app container without the init container fits node 1 alone.
    let mut res = Resources::default();
    let p = pod(&mut res, &[], &app);
    let (out, _) = predict(
        &mut res,
        &nrt("single-numa-node", "container", [4, 8], [&[], &[]], None, false),
        &p,
    );
    assert_eq!(numa(&out.unwrap(), "app"), Some(vec![1]));
}

/// §2.7 and the CPU manager's `cpusToReuse`: an app container reuses the init container's CPUs
/// (taken first, §3.1 allocation with the init container's pool and mask); those no app
/// container reuses stay held by the pod (not returned to the node).
#[test]
fn init_cpus_no_app_container_reuses_stay_held_rule_2_7() {
    let mut res = Resources::default();
    let p = pod(
        &mut res,
        &[container("init", 4, 0, false)],
        &[container("app", 2, 0, false)],
    );
    let (out, cpus) = predict(
        &mut res,
        &nrt("restricted", "container", [8, 8], [&[], &[]], None, false),
        &p,
    );
    let placed = out.unwrap();
    assert_eq!(
        numa(&placed, "app"),
        Some(vec![0]),
        "the app must stay with the reusable CPUs"
    );
    assert_eq!(
        cpus,
        vec![4, 8],
        "4 held (2 reused + 2 never reused), not 6 and not 2"
    );
}

/// Restartable init containers (sidecars) keep their CPUs: they are not reusable, and a sidecar
/// that reuses an init container's CPUs takes them out of the reusable set (`updateCPUsToReuse`).
#[test]
fn sidecar_cpus_are_not_reusable_and_a_sidecar_consumes_reusable_ones_rule_2_7() {
    // Sidecar 2, then app 2: nothing reusable, both on node 0 → 4 taken from node 0.
    let mut res = Resources::default();
    let p = pod(
        &mut res,
        &[container("side", 2, 0, true)],
        &[container("app", 2, 0, false)],
    );
    let (out, cpus) = predict(&mut res, &two_free_nodes(), &p);
    out.unwrap();
    assert_eq!(cpus, vec![4, 8]);
    // Init 4 on node 0, sidecar 2 reuses 2 of them, app 4 must keep the other 2 in its mask and
    // needs 4: node 0 has 2 reusable + 4 free = 6 ≥ 4 → {0}. Held on node 0: 4 (init) + 2 (app).
    let mut res = Resources::default();
    let p = pod(
        &mut res,
        &[container("init", 4, 0, false), container("side", 2, 0, true)],
        &[container("app", 4, 0, false)],
    );
    let (out, cpus) = predict(&mut res, &two_free_nodes(), &p);
    let placed = out.unwrap();
    assert_eq!(numa(&placed, "side"), Some(vec![0]));
    assert_eq!(numa(&placed, "app"), Some(vec![0]));
    assert_eq!(cpus, vec![2, 8]);
    // The same with a sidecar taking 4: no reusable CPU is left, so the app may go anywhere;
    // node 0 has 4 free and is the lowest preferred mask.
    let mut res = Resources::default();
    let p = pod(
        &mut res,
        &[container("init", 4, 0, false), container("side", 4, 0, true)],
        &[container("app", 6, 0, false)],
    );
    let (out, cpus) = predict(&mut res, &two_free_nodes(), &p);
    assert_eq!(numa(&out.unwrap(), "app"), Some(vec![1]));
    assert_eq!(cpus, vec![4, 2]);
}

/// §3.3 step 4 and allocation step 1: one GPU free on node 0, two on node 1. The init
/// container's GPU lands on node 0 ({0} and {1} preferred, {0} lower); the app container needs
/// 2 and must keep that reusable GPU inside its mask: only {0,1} (1 reusable + 2 free), not
/// preferred ({1} alone has 2 registered). Rejected under single-numa-node; best-effort admits
/// and the device manager hands the reusable GPU out first.
#[test]
fn device_masks_leaving_out_reusable_init_devices_are_skipped_rule_3_3_step_4() {
    let gpus: [&[&str]; 2] = [&["gpu-0a"], &["gpu-1a", "gpu-1b"]];
    let init = [container("init", 1, 1, false)];
    let app = [container("app", 1, 2, false)];
    for ids in [true, false] {
        let mut res = Resources::default();
        let p = pod(&mut res, &init, &app);
        let (out, _) = predict(
            &mut res,
            &nrt("single-numa-node", "container", [8, 8], gpus, None, ids),
            &p,
        );
        assert_eq!(
            out.expect_err("snn").kubelet_reason,
            "TopologyAffinityError",
            "ids {ids}"
        );
    }
    let mut res = Resources::default();
    let p = pod(&mut res, &init, &app);
    let (out, _) = predict(
        &mut res,
        &nrt("best-effort", "container", [8, 8], gpus, None, true),
        &p,
    );
    let placed = out.unwrap();
    let app_c = placed.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(app_c.numa_nodes, Some(vec![0, 1]));
    assert_eq!(app_c.devices[GPU], vec!["gpu-0a", "gpu-1a"]);
    assert!(
        app_c.explanation.contains("reuses example.com/gpu gpu-0a"),
        "{}",
        app_c.explanation
    );
    // Control: without the init container, node 1 holds both.
    let mut res = Resources::default();
    let p = pod(&mut res, &[], &app);
    let (out, _) = predict(
        &mut res,
        &nrt("single-numa-node", "container", [8, 8], gpus, None, true),
        &p,
    );
    assert_eq!(numa(&out.unwrap(), "app"), Some(vec![1]));
}

/// Which reusable devices an app container gets, when more are reusable than it needs, is Go map
/// order in the device manager: not determined. The explanation says so; the pod holds all of
/// them either way, so what the next pod sees is determined.
#[test]
fn undetermined_device_reuse_is_said_and_the_pod_holds_every_init_device() {
    let nrt = nrt(
        "restricted",
        "container",
        [8, 8],
        [&[], &["gpu-1a", "gpu-1b"]],
        Some([1, 2]),
        true,
    );
    let mut c = Cluster::new();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "3"}}
    }))
    .unwrap();
    c.apply_node(&node).unwrap();
    c.apply_nrt(&nrt).unwrap();
    let p = pod(
        &mut c.res,
        &[container("init", 1, 2, false)],
        &[container("app", 1, 1, false)],
    );
    let d = c.schedule(&Config::default(), &p, true);
    assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
    let placed = d.placement.clone().unwrap();
    let app_c = placed.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(app_c.devices[GPU], vec!["gpu-1a"]);
    assert!(
        app_c.explanation.contains("not determined"),
        "{}",
        app_c.explanation
    );
    // The scheduler's own assumption holds both init GPUs and the init's CPU (item: what init
    // containers hold).
    c.assume(&p, &d);
    let TopologyState::Valid(t) = c.topology("n1") else {
        panic!("topology")
    };
    let gpu = c.res.get(GPU).unwrap();
    assert_eq!(t.zones[1].available.get_or_zero(gpu), 0);
    assert!(t.zones[1].free_devices[&gpu].is_empty());
    let cpus: Vec<i64> = t
        .zones
        .iter()
        .map(|z| z.available.get_or_zero(CPU) / 1000)
        .collect();
    assert_eq!(
        cpus,
        vec![8, 7],
        "init's CPU on node 1 reused by the app: one held"
    );
    // A next pod wanting one GPU finds none.
    let next = pod(&mut c.res, &[], &[container("next", 1, 1, false)]);
    assert_eq!(c.schedule(&Config::default(), &next, true).node, None);
}

/// Pod scope (§2.7): hints come once for the pod-level request (max of init and app), so
/// nothing is reusable then; the allocation that follows still reuses the init container's
/// CPUs and GPU, so the pod holds max(init, app), not their sum.
#[test]
fn pod_scope_allocation_reuses_init_resources_rule_2_7() {
    let mut res = Resources::default();
    let p = pod(
        &mut res,
        &[container("init", 4, 1, false)],
        &[container("app", 2, 1, false)],
    );
    let n = nrt(
        "single-numa-node",
        "pod",
        [8, 8],
        [&["gpu-0a", "gpu-0b"], &["gpu-1a"]],
        None,
        true,
    );
    let topo = NumaTopology::from_nrt(&mut res, &n).unwrap();
    let mut w = WorkingZones::with_device_ids(&topo);
    let placed = admission::predict(&res, &topo, &mut w, &p).unwrap();
    assert_eq!(placed.pod_numa_nodes, Some(vec![0]));
    let gpu = res.get(GPU).unwrap();
    assert_eq!(w.available[0].get_or_zero(CPU), 4000);
    assert_eq!(
        w.available[0].get_or_zero(gpu),
        1,
        "one GPU held, reused by the app"
    );
    let app_c = placed.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(app_c.devices[GPU], vec!["gpu-0a"]);
}
