//! Node-side allocator figures, on the user's path: `numaplane-exporter run --pools` (release
//! binary) hosting the device plugin, with 500 pods bound to the node in the HTTP-level fake
//! API server, the fake kubelet's pod-resources on a Unix socket, and the fake kubelet's
//! device-plugin side calling the plugin over its socket as the device manager does.
//!
//! 1. `GetPreferredAllocation` latency (client side, gRPC included) with 500 pods on the node:
//!    480 hold their recorded slot (pod-resources), 20 are candidates.
//!    Then the same for a pod without a record (another scheduler's), whose question no plan
//!    fits: the plugin reads pod-resources `List` (through the agent's request budget) to see
//!    that no pod is on its way and answers no preference. The kubelet admits pods one at a
//!    time, so this is what every such container adds to the node's admissions. Paced at
//!    4 calls/s, inside the agent's budget of 20 pod-resources calls/s.
//! 2. Time from a pod's deletion (the kubelet drops it from pod-resources, then the API server
//!    deletes the object) to the exporter's NRT write that shows its slot free again, with
//!    the default 10 s resync and no kubelet Watch (as upstream kubelets behave). The anchor:
//!    Akri frees a slot after a 5-minute grace period.
//!
//! `cargo bench -p numaplane-e2e --bench allocator_live -- [CALLS] [DELETIONS]` (defaults 5000
//! and 100).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::fake_api::FakeApiServer;
use numaplane_e2e::fake_device_kubelet::FakeDeviceKubelet;
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, GetMode};
use numaplane_e2e::harness::{Agent, allocator_exporter_args, bench};
use serde_json::json;

const NODE: &str = "bench-node";
const CAM: &str = "example.com/cam";
const PODS: usize = 500;
const HOLDERS: usize = 480;
const DEVICES: usize = 8;
const CAPACITY: usize = 64;

fn numa_of_device(d: usize) -> i64 {
    i64::try_from(d / (DEVICES / 2)).unwrap()
}

/// Pod `k` plans slot `k / DEVICES` of device `k % DEVICES`.
fn plan(k: usize) -> (String, i64) {
    let d = k % DEVICES;
    (format!("cam{d}-{}", k / DEVICES), numa_of_device(d))
}

fn all_slots() -> Vec<(String, i64)> {
    (0..DEVICES)
        .flat_map(|d| (0..CAPACITY).map(move |s| (format!("cam{d}-{s}"), numa_of_device(d))))
        .collect()
}

fn topo(numa: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: numa }],
    })
}

fn holder(k: usize) -> PodResources {
    let (slot, numa) = plan(k);
    PodResources {
        name: format!("pod-{k}"),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            devices: vec![ContainerDevices {
                resource_name: CAM.into(),
                device_ids: vec![slot],
                topology: topo(numa),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// What pod-resources `List` shows: the holders with their devices, and the pods waiting for
/// admission with none yet (the kubelet lists a pod from the moment it takes it up).
fn kubelet_list(holders: &BTreeMap<usize, PodResources>) -> Vec<PodResources> {
    let waiting = (HOLDERS..PODS).map(|k| PodResources {
        name: format!("pod-{k}"),
        namespace: "default".into(),
        ..Default::default()
    });
    holders.values().cloned().chain(waiting).collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn free_in(body: &serde_json::Value) -> Vec<String> {
    let name = format!("numaplane.io/free-devices.{CAM}");
    body["zones"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|z| z["attributes"].as_array().into_iter().flatten())
        .filter(|a| a["name"] == name.as_str())
        .flat_map(|a| {
            a["value"]
                .as_str()
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn main() {
    let args = bench::Args::from_env();
    let calls: usize = args.get(0, 5000);
    let deletions: usize = args.get(1, 100).min(HOLDERS);
    let rt = bench::runtime(2);
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let api = FakeApiServer::start().await.unwrap();
        api.install_nrt_crd();
        api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
        for k in 0..PODS {
            let (slot, numa) = plan(k);
            let record = json!({"version": "v1", "node": NODE, "policy": "single-numa-node", "scope": "container",
                "containers": [{"name": "app", "kind": "app", "numaNodes": [numa], "devices": {CAM: [slot]}}]});
            api.put(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("pod-{k}"), "namespace": "default", "uid": format!("uid-{k}"),
                    "creationTimestamp": format!("2026-11-25T10:{:02}:{:02}Z", k / 60, k % 60),
                    "annotations": {"numaplane.io/allocation": record.to_string()}},
                "spec": {"nodeName": NODE, "schedulerName": "numaplane-scheduler",
                    "containers": [{"name": "app", "image": "x"}]},
                "status": {"phase": if k < HOLDERS { "Running" } else { "Pending" }}}));
        }
        let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
        let allocatable = AllocatableResourcesResponse {
            cpu_ids: (0..32).collect(),
            devices: all_slots()
                .into_iter()
                .map(|(id, numa)| ContainerDevices {
                    resource_name: CAM.into(),
                    device_ids: vec![id],
                    topology: topo(numa),
                })
                .collect(),
            memory: vec![],
        };
        let mut holders: BTreeMap<usize, PodResources> = (0..HOLDERS).map(|k| (k, holder(k))).collect();
        let podres = FakeKubelet::start(
            &dir.path().join("podres.sock"),
            allocatable,
            kubelet_list(&holders),
            FakeKubeletOptions { watch: false, get: GetMode::Offered },
        )
        .await
        .unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir(&plugins).unwrap();
        let dp = FakeDeviceKubelet::start(&plugins).await.unwrap();
        let devices: Vec<_> = (0..DEVICES)
            .map(|d| json!({"id": format!("cam{d}"), "numaNode": numa_of_device(d)}))
            .collect();
        let pools = dir.path().join("pools.yaml");
        std::fs::write(
            &pools,
            json!({"pools": [{"resource": CAM, "capacity": CAPACITY, "devices": devices}]}).to_string(),
        )
        .unwrap();
        let args = allocator_exporter_args(NODE, &dir.path().join("podres.sock"), &kubeconfig, &pools, &plugins, &[]);
        let mut agent = Agent::spawn_exporter("run", &args).unwrap();
        agent.wait_serving(Duration::from_secs(60)).await.unwrap();
        dp.wait_registered(CAM, 1, Duration::from_secs(60)).await.unwrap();

        // The kubelet's question for candidate k: one slot out of the free slots of its NUMA
        // node (the kubelet's aligned set).
        let held: std::collections::BTreeSet<String> = (0..HOLDERS).map(|k| plan(k).0).collect();
        let free_on = |numa: i64| -> Vec<String> {
            all_slots()
                .into_iter()
                .filter(|(id, n)| *n == numa && !held.contains(id))
                .map(|(id, _)| id)
                .collect()
        };
        let available = [free_on(0), free_on(1)];
        // Wait until the plugin's pod watch and pod-resources reconciliation are in: the
        // answer for NUMA 0 is the oldest candidate there.
        let want0 = (HOLDERS..PODS).find(|&k| plan(k).1 == 0).map(|k| plan(k).0).unwrap();
        let t0 = Instant::now();
        loop {
            let got = dp.preferred(CAM, available[0].clone(), vec![], 1).await.unwrap();
            if got == [want0.clone()] {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "plugin never honoured: {got:?}\n{}", agent.stderr());
        }
        let mut lat = Vec::with_capacity(calls);
        for i in 0..calls {
            let numa = i % 2;
            let t = Instant::now();
            let got = dp.preferred(CAM, available[numa].clone(), vec![], 1).await.unwrap();
            lat.push(t.elapsed());
            assert_eq!(got.len(), 1, "call {i}: no preference");
        }
        lat.sort();
        println!(
            "GetPreferredAllocation, {PODS} pods on the node ({} candidates, {} slots): n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
            PODS - HOLDERS,
            DEVICES * CAPACITY,
            lat.len(),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(*lat.last().unwrap()),
        );

        // A pod without a record, known to the API server and listed by the kubelet; its
        // question (one unplanned free slot) fits no plan.
        api.put(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "plain", "namespace": "default", "uid": "uid-plain",
                "creationTimestamp": "2026-11-25T11:00:00Z"},
            "spec": {"nodeName": NODE, "schedulerName": "default-scheduler",
                "containers": [{"name": "app", "image": "x"}]},
            "status": {"phase": "Pending"}}));
        let mut listed = kubelet_list(&holders);
        listed.push(PodResources {
            name: "plain".into(),
            namespace: "default".into(),
            ..Default::default()
        });
        podres.set_pods(listed);
        let unplanned = vec![format!("cam0-{}", CAPACITY - 1)];
        // Until the pod watch has the pod, the plugin may wait for it (once).
        let t0 = Instant::now();
        loop {
            let t = Instant::now();
            assert!(dp.preferred(CAM, unplanned.clone(), vec![], 1).await.unwrap().is_empty());
            if t.elapsed() < Duration::from_millis(200) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "every answer waited\n{}", agent.stderr());
        }
        let plain_calls = (calls / 50).max(20);
        let mut plain = Vec::with_capacity(plain_calls);
        for _ in 0..plain_calls {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let t = Instant::now();
            let got = dp.preferred(CAM, unplanned.clone(), vec![], 1).await.unwrap();
            plain.push(t.elapsed());
            assert!(got.is_empty());
        }
        plain.sort();
        let refreshes = |outcome: &str| {
            agent
                .metrics()
                .ok()
                .and_then(|m| {
                    numaplane_e2e::harness::metric_value(
                        &m,
                        "numaplane_exporter_allocator_kubelet_refreshes_total",
                        &[("resource", CAM), ("outcome", outcome)],
                    )
                })
                .unwrap_or(0.0)
        };
        println!(
            "GetPreferredAllocation, pod without a record (no plan fits; one pod-resources List of {} pods each): n={} p50={:.3} ms p99={:.3} ms max={:.3} ms; Lists ok={} over_budget={}",
            PODS + 1,
            plain.len(),
            ms(percentile(&plain, 0.5)),
            ms(percentile(&plain, 0.99)),
            ms(*plain.last().unwrap()),
            refreshes("ok"),
            refreshes("over_budget"),
        );
        podres.set_pods(kubelet_list(&holders));

        // Deletion to slot free in the NRT. Wait for the first NRT write to have happened.
        api.wait_for_request(
            |r| r.method == "PATCH" && r.path.contains("noderesourcetopologies"),
            Duration::from_secs(30),
        )
        .await
        .expect("first NRT write");
        let mut freed = Vec::with_capacity(deletions);
        for k in 0..deletions {
            tokio::time::sleep(Duration::from_millis(100)).await;
            api.clear_requests();
            let slot = plan(k).0;
            // The kubelet drops the pod from pod-resources once its containers are gone, then
            // the API object is deleted.
            holders.remove(&k);
            podres.set_pods(kubelet_list(&holders));
            let t = Instant::now();
            assert!(api.delete("v1", "Pod", Some("default"), &format!("pod-{k}")));
            let write = api
                .wait_for_request(
                    |r| {
                        r.method == "PATCH"
                            && r.path.contains("noderesourcetopologies")
                            && r.body_json().is_some_and(|b| free_in(&b).contains(&slot))
                    },
                    Duration::from_secs(30),
                )
                .await
                .unwrap_or_else(|| panic!("slot {slot} never shown free\n{}", agent.stderr()));
            freed.push(write.at.saturating_duration_since(t));
        }
        freed.sort();
        println!(
            "pod deletion to slot free in the NRT (10 s resync, no kubelet Watch): n={} p50={:.1} ms p99={:.1} ms max={:.1} ms (Akri: 300,000 ms grace)",
            freed.len(),
            ms(percentile(&freed, 0.5)),
            ms(percentile(&freed, 0.99)),
            ms(*freed.last().unwrap()),
        );
        agent.kill();
    });
}
