//! A device plugin that registers after the exporter's first scan: the NRT lists its devices
//! within a second (the allocator's `ListAndWatch` send, then the Node's allocatable, make the
//! exporter read allocatable again until they appear), and a GPU pod created while the Node
//! already allocates the devices and the NRT does not show them yet is bound only once the NRT
//! catches up, with a record naming its device. Another vendor's plugin, seen only through the
//! Node's allocatable, is followed the same way.
//!
//! The kubelet here: a real gRPC pod-resources server (`FakeKubelet`) and a real device-plugin
//! `Registration` server (`FakeDeviceKubelet`), linked by this test as the kubelet's device
//! manager links them: a list the plugin sends shows in the Node's allocatable at once and in
//! `GetAllocatableResources` [`KUBELET_LAG`] later, the widest window the scheduler can meet.
//!
//! Runs against the HTTP-level fake API, or a real cluster with `NUMAPLANE_E2E_KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::nrt::{NodeResourceTopology, attr};
use numaplane::proto::podresources::{AllocatableResourcesResponse, ContainerDevices};
use numaplane_e2e::harness::node::{NodeFiles, podres_devices, pool};
use numaplane_e2e::harness::{Agent, ApiTarget, metric_value, scheduler_run_args, unique_name};
use serde_json::json;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);
const GPU: &str = "example.com/gpu";
const NIC: &str = "vendor.example/nic";
/// How long after a device list reaches it the kubelet shows it in `GetAllocatableResources`.
const KUBELET_LAG: Duration = Duration::from_millis(250);

fn numa_of(id: &str) -> i64 {
    // g0, g1 on NUMA 0; g2, g3 on NUMA 1 (n0, n1 likewise).
    i64::from(id[1..].parse::<u8>().unwrap() / 2)
}

fn devices(resource: &str, ids: &[String]) -> Vec<ContainerDevices> {
    podres_devices(resource, ids, numa_of)
}

fn zone_count(nrt: &NodeResourceTopology, resource: &str) -> usize {
    nrt.zones
        .iter()
        .flat_map(|z| z.resources.iter().flatten())
        .filter(|r| r.name == resource)
        .map(|r| r.allocatable.0.parse::<usize>().unwrap_or(0))
        .sum()
}

/// Waits until the node's NRT satisfies `pred`, and asserts that it did within a second of
/// `since` (the instant and what happened then).
async fn shown_within_a_second(
    api: &ApiTarget,
    node: &str,
    since: (Instant, &str),
    exporter: &Agent,
    pred: impl Fn(&NodeResourceTopology) -> bool,
) -> NodeResourceTopology {
    let nrt = api.wait_nrt(node, WAIT, pred).await.unwrap();
    let took = since.0.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the NRT showed it {took:?} after {}\n{}",
        since.1,
        exporter.stderr()
    );
    nrt
}

async fn set_node_allocatable(nodes: &Api<Node>, node: &str, extra: &[(&str, usize)]) {
    let mut alloc = json!({"cpu": "32", "memory": "128Gi", "pods": "110"});
    for (r, n) in extra {
        alloc[*r] = json!(n.to_string());
    }
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": alloc}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_plugins_devices_reach_the_nrt_within_a_second_and_pods_wait_for_them() {
    let t0 = Instant::now();
    let phase = |what: &str| {
        eprintln!(
            "late device plugin: {what} after {:.1} s",
            t0.elapsed().as_secs_f64()
        )
    };
    let api = ApiTarget::start().await.unwrap();
    let ns = unique_name("np-e2e-late");
    let node = unique_name("np-e2e-late-node");
    let client = api.client();
    api.create_namespace(&ns).await.unwrap();
    api.create_labelled_node(
        &node,
        &[("numaplane.io/e2e-node", &node)],
        Some(json!({"cpu": "32", "memory": "128Gi", "pods": "110"})),
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());

    // The kubelet before any device plugin: CPUs only, no registration socket yet.
    let gpus: Vec<String> = (0..4).map(|i| format!("g{i}")).collect();
    let files = NodeFiles::new(&json!({"pools": [pool(GPU, &gpus, numa_of)]})).unwrap();
    let cpus_only = AllocatableResourcesResponse {
        cpu_ids: (0..32).collect(),
        devices: vec![],
        memory: vec![],
    };
    let podres = files.podres(cpus_only.clone()).await.unwrap();
    // A resync far beyond the test: only the new triggers can bring the devices in.
    let mut exporter = files
        .exporter(&node, api.kubeconfig(), &["--resync-interval", "10m"], WAIT)
        .await
        .unwrap();
    // The first scan's object: no GPUs, and the promise to describe the Node's resources.
    let first = api
        .wait_nrt(&node, WAIT, |n| n.node_level_resources().is_some())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", exporter.stderr()));
    phase("first NRT");
    assert_eq!(zone_count(&first, GPU), 0);
    assert_eq!(first.node_level_resources(), Some(vec![]));

    let mut scheduler = Agent::spawn_scheduler("run", &scheduler_run_args(api.kubeconfig())).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();

    // The device plugin side of the kubelet comes up: the allocator registers.
    let dp = files.device_kubelet().await.unwrap();
    let deadline = Instant::now() + WAIT;
    while dp.devices(GPU).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no registration: {}",
            exporter.stderr()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delivered = Instant::now();
    phase("the plugin's first list");
    let healthy: Vec<String> = dp
        .devices(GPU)
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(healthy, gpus);
    // The Node shows the devices at once; pod-resources a little later.
    set_node_allocatable(&nodes, &node, &[(GPU, 4)]).await;
    let kubelet = podres.clone();
    let with_gpus = AllocatableResourcesResponse {
        devices: devices(GPU, &gpus),
        ..cpus_only.clone()
    };
    let lag = tokio::spawn({
        let with_gpus = with_gpus.clone();
        async move {
            tokio::time::sleep_until(delivered + KUBELET_LAG).await;
            kubelet.set_allocatable(with_gpus);
        }
    });

    // A GPU pod created in between: the Node allocates GPUs, the NRT does not show them.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let r = json!({"cpu": "1", "memory": "1Gi", GPU: "1"});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "early", "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": "numaplane-scheduler", "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"numaplane.io/e2e-node": node},
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": r, "limits": r}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let now = api.nrt(&node).await.unwrap().unwrap();
    assert_eq!(
        zone_count(&now, GPU),
        0,
        "the NRT already shows the GPUs: the pod was not created in between"
    );

    // The NRT lists the devices within a second of their delivery to the kubelet.
    let caught_up = shown_within_a_second(
        &api,
        &node,
        (delivered, "the plugin's first list"),
        &exporter,
        |n| zone_count(n, GPU) == 4,
    )
    .await;
    assert_eq!(caught_up.node_level_resources(), Some(vec![]));
    lag.await.unwrap();

    phase("NRT shows the GPUs");
    // The pod is bound with a record naming its device, on the NUMA node the NRT places it.
    let deadline = Instant::now() + WAIT;
    let record = loop {
        let p = pods.get("early").await.unwrap();
        if let Some(a) = p.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) {
            assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()));
            break Allocation::parse(a).unwrap();
        }
        assert!(
            p.spec.as_ref().unwrap().node_name.is_none(),
            "bound without a record: {p:?}"
        );
        assert!(Instant::now() < deadline, "not bound: {}", scheduler.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let c = &record.containers[0];
    let ids = c.devices.get(GPU).cloned().unwrap_or_default();
    assert_eq!(ids.len(), 1, "the record names no GPU: {record:?}");
    assert!(gpus.contains(&ids[0]), "{record:?}");
    assert_eq!(
        c.numa_nodes.as_deref(),
        Some(&[u32::try_from(numa_of(&ids[0])).unwrap()][..]),
        "{record:?}"
    );

    phase("pod bound");
    // Another vendor's plugin, seen only through the Node: read again when the Node changes.
    let nics: Vec<String> = (0..2).map(|i| format!("n{}", i * 2)).collect();
    set_node_allocatable(&nodes, &node, &[(GPU, 4), (NIC, 2)]).await;
    let changed = Instant::now();
    tokio::time::sleep(KUBELET_LAG).await;
    let mut all = with_gpus.clone();
    all.devices.extend(devices(NIC, &nics));
    podres.set_allocatable(all);
    shown_within_a_second(&api, &node, (changed, "the Node changed"), &exporter, |n| {
        zone_count(n, NIC) == 2
    })
    .await;

    // A Node resource no device is behind is named node-level once the wait for it runs out.
    set_node_allocatable(&nodes, &node, &[(GPU, 4), (NIC, 2), ("vendor.example/dongle", 1)]).await;
    let nrt = api
        .wait_nrt(&node, WAIT, |n| {
            n.node_level_resources()
                .is_some_and(|r| r == vec!["vendor.example/dongle".to_owned()])
        })
        .await
        .unwrap();
    assert!(nrt.attribute(attr::NODE_LEVEL_RESOURCES).is_some());

    phase("node-level resource named");
    let text = exporter.metrics().unwrap();
    for (cause, min) in [("device_plugin", 1.0), ("node_allocatable", 2.0), ("retry", 1.0)] {
        let n = metric_value(
            &text,
            "numaplane_exporter_allocatable_rereads_total",
            &[("cause", cause)],
        )
        .unwrap_or(0.0);
        assert!(n >= min, "{cause}: {n}\n{text}");
    }
    for (resource, outcome) in [
        (GPU, "appeared"),
        (NIC, "appeared"),
        ("vendor.example/dongle", "gave_up"),
    ] {
        let n = metric_value(
            &text,
            "numaplane_exporter_allocatable_waits_total",
            &[("resource", resource), ("outcome", outcome)],
        )
        .unwrap_or(0.0);
        assert!(n >= 1.0, "{resource} {outcome}: {n}\n{text}");
    }
    let log = exporter.stderr();
    assert!(log.contains("allocatable shows the kubelet's devices"), "{log}");
    assert!(exporter.exited().is_none(), "{}", exporter.stderr());
    api.cleanup(&node, &ns).await;
}
