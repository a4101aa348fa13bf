//! The whole path in one test: the scheduler decides and binds with the record, the node-side
//! allocator (hosted by `numaplane-exporter run --pools`) steers the fake kubelet's device
//! allocation, pod-resources reports it, and the exporter's NRT shows it. The devices each pod
//! ends up with are the scheduler's choice, while the fake kubelet left alone would pick others
//! (it fills in descending order here).
//!
//! Runs against the HTTP-level fake API, or a real cluster with `NUMAPLANE_E2E_KUBECONFIG`
//! (NRT CRD installed; the test creates a labelled namespace and a fake Node, and cleans up).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::nrt::NodeResourceTopology;
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::harness::node::{NodeFiles, podres_devices, pool};
use numaplane_e2e::harness::{
    Agent, ApiTarget, metric_value, recorded_hint, scheduler_run_args, unique_name,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const GPU: &str = "example.com/gpu";

fn topo(numa: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: numa }],
    })
}

fn numa_of(id: &str) -> i64 {
    // g0..g3 on NUMA 0, g4..g7 on NUMA 1.
    i64::from(id.trim_start_matches('g').parse::<u8>().unwrap() / 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_choice_is_what_the_pod_gets_and_what_the_nrt_shows() {
    let api = ApiTarget::start().await.unwrap();
    let ns = unique_name("np-e2e-alloc");
    let node = unique_name("np-e2e-alloc-node");
    let client = api.client();
    api.create_namespace(&ns).await.unwrap();
    let allocatable = json!({"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "8"});
    api.create_labelled_node(&node, &[], Some(allocatable))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());

    // The kubelet: pod-resources (allocatable GPUs with topology, CPUs of 2numa.xml) and the
    // device-plugin side.
    let ids: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
    let files = NodeFiles::new(&json!({"pools": [pool(GPU, &ids, numa_of)]})).unwrap();
    let dp = files.device_kubelet().await.unwrap();
    dp.set_fill_descending(true);
    let allocatable = AllocatableResourcesResponse {
        cpu_ids: (0..32).collect(),
        devices: podres_devices(GPU, &ids, numa_of),
        memory: vec![],
    };
    let podres = files.podres(allocatable).await.unwrap();
    let exporter = files
        .exporter(&node, api.kubeconfig(), &["--resync-interval", "200ms"], WAIT)
        .await
        .unwrap();
    dp.wait_registered(GPU, 1, WAIT).await.unwrap();
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + WAIT;
    while nrts.get_opt(&node).await.unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NRT: {}",
            exporter.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Bindings one at a time, so they land in queue (creation) order: the order in which this
    // test's kubelet admits below, as a real kubelet admits in binding order.
    let mut sched_args = scheduler_run_args(api.kubeconfig());
    sched_args.extend(["--bind-concurrency".to_owned(), "1".to_owned()]);
    let mut scheduler = Agent::spawn_scheduler("run", &sched_args).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();

    // Three Guaranteed pods of one GPU each, created in order.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let names = ["p0", "p1", "p2"];
    for name in names {
        let r = json!({"cpu": "1", "memory": "1Gi", GPU: "1"});
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
            "spec": {"schedulerName": "numaplane-scheduler", "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": r, "limits": r}}]}}))
        .unwrap();
        pods_api.create(&PostParams::default(), &pod).await.unwrap();
    }
    let mut records: BTreeMap<String, Allocation> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while records.len() < names.len() {
        for p in pods_api.list(&ListParams::default()).await.unwrap().items {
            if let Some(a) = p.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) {
                assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()));
                records.insert(p.metadata.name.clone().unwrap(), Allocation::parse(a).unwrap());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods not bound: {}",
            scheduler.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The kubelet admits them in binding (here creation) order, aligning to the recorded NUMA node (the
    // Topology Manager's hint; the scheduler predicted it).
    let mut pod_resources = Vec::new();
    for name in names {
        let record = &records[name];
        let c = &record.containers[0];
        let planned = c.devices[GPU].clone();
        let hint = recorded_hint(c);
        let key = format!("{ns}/{name}");
        // The kubelet lists the pod it is admitting (devices come after Allocate).
        let mut listed = pod_resources.clone();
        listed.push(PodResources {
            name: name.to_owned(),
            namespace: ns.clone(),
            ..Default::default()
        });
        podres.set_pods(listed);
        let (got, _) = dp.admit(&key, "app", GPU, 1, Some(&hint)).await.unwrap();
        assert_eq!(
            got, planned,
            "{name}: the kubelet used other devices than the scheduler chose"
        );
        pod_resources.push(PodResources {
            name: name.to_owned(),
            namespace: ns.clone(),
            containers: vec![ContainerResources {
                name: "app".into(),
                devices: vec![ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: got.clone(),
                    topology: topo(numa_of(&got[0])),
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        podres.set_pods(pod_resources.clone());
    }

    // The NRT shows the same devices taken.
    let taken: Vec<String> = records
        .values()
        .flat_map(|r| r.containers[0].devices[GPU].clone())
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let nrt = nrts.get(&node).await.unwrap();
        let free: Vec<String> = nrt
            .zones
            .iter()
            .flat_map(|z| z.attributes.iter().flatten())
            .filter(|a| a.name == format!("numaplane.io/free-devices.{GPU}"))
            .flat_map(|a| a.value.split(',').map(str::to_owned).collect::<Vec<_>>())
            .filter(|s| !s.is_empty())
            .collect();
        if free.len() == 8 - taken.len() && taken.iter().all(|t| !free.contains(t)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "NRT free GPUs {free:?}, taken {taken:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = exporter.metrics().unwrap();
    let honoured = metric_value(
        &text,
        "numaplane_exporter_allocator_preferred_allocations_total",
        &[("resource", GPU), ("outcome", "honoured")],
    )
    .unwrap_or(0.0);
    assert!(honoured >= 1.0, "{text}");
    assert_eq!(
        metric_value(
            &text,
            "numaplane_exporter_allocator_mismatches_total",
            &[("resource", GPU)]
        )
        .unwrap_or(0.0),
        0.0
    );

    let _ = pods_api
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await;
    let _ = nrts.delete(&node, &DeleteParams::default()).await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}
