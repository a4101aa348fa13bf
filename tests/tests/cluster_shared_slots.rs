//! A cluster-shared device (`shared: cluster`: one license with 2 slots that both nodes reach)
//! used from two nodes up to its capacity and never beyond: the scheduler hands each slot out
//! once across nodes and keeps a third pod pending; each node's plugin lists the slots the other
//! node holds as Unhealthy, so a pod that bypasses the scheduler cannot take them either; a
//! deleted pod's slot is free again for the pending pod.
//!
//! Runs against the HTTP-level fake API, or a real cluster with `NUMAPLANE_E2E_KUBECONFIG`
//! (NRT CRD installed; the test creates a labelled namespace and fake Nodes, and cleans up).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::nrt::NodeResourceTopology;
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::fake_device_kubelet::FakeDeviceKubelet;
use numaplane_e2e::fake_kubelet::FakeKubelet;
use numaplane_e2e::harness::node::NodeFiles;
use numaplane_e2e::harness::{Agent, ApiTarget, metric_value, scheduler_run_args, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const LIC: &str = "example.com/lic";
const SLOTS: [&str; 2] = ["lic-0", "lic-1"];

fn topo0() -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: 0 }],
    })
}

/// One node's kubelet (pod-resources and device-plugin sides) and its exporter hosting the
/// allocator with the cluster-shared pool.
struct NodeSide {
    name: String,
    _files: NodeFiles,
    dp: FakeDeviceKubelet,
    podres: FakeKubelet,
    exporter: Agent,
    /// What pod-resources reports: pod name → slot.
    held: BTreeMap<String, String>,
}

impl NodeSide {
    async fn start(name: &str, kubeconfig: &Path) -> NodeSide {
        let files = NodeFiles::new(
            &json!({"pools": [{"resource": LIC, "capacity": 2, "shared": "cluster",
            "devices": [{"id": "lic", "numaNode": 0}]}]}),
        )
        .unwrap();
        let dp = files.device_kubelet().await.unwrap();
        let allocatable = AllocatableResourcesResponse {
            cpu_ids: (0..32).collect(),
            devices: SLOTS
                .iter()
                .map(|id| ContainerDevices {
                    resource_name: LIC.into(),
                    device_ids: vec![(*id).to_owned()],
                    topology: topo0(),
                })
                .collect(),
            memory: vec![],
        };
        let podres = files.podres(allocatable).await.unwrap();
        let exporter = files
            .exporter(name, kubeconfig, &["--resync-interval", "200ms"], WAIT)
            .await
            .unwrap();
        dp.wait_registered(LIC, 1, WAIT).await.unwrap();
        NodeSide {
            name: name.to_owned(),
            _files: files,
            dp,
            podres,
            exporter,
            held: BTreeMap::new(),
        }
    }

    fn report(&self, ns: &str) {
        self.report_admitting(ns, None);
    }

    /// Pod-resources as the kubelet lists it: the pods holding slots, and `admitting`, which
    /// it lists without devices from just before it admits it.
    fn report_admitting(&self, ns: &str, admitting: Option<&str>) {
        let holding = self.held.iter().map(|(pod, slot)| PodResources {
            name: pod.clone(),
            namespace: ns.to_owned(),
            containers: vec![ContainerResources {
                name: "app".into(),
                devices: vec![ContainerDevices {
                    resource_name: LIC.into(),
                    device_ids: vec![slot.clone()],
                    topology: topo0(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        let admitting = admitting.map(|pod| PodResources {
            name: pod.to_owned(),
            namespace: ns.to_owned(),
            ..Default::default()
        });
        self.podres.set_pods(holding.chain(admitting).collect());
    }

    fn unhealthy(&self) -> Vec<String> {
        self.dp
            .devices(LIC)
            .into_iter()
            .filter(|d| d.health != "Healthy")
            .map(|d| d.id)
            .collect()
    }
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bound pods with their records: name → (node, slot).
async fn bound(pods: &Api<Pod>) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let record = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
            .unwrap();
        let record = Allocation::parse(record).unwrap();
        assert_eq!(record.node, node);
        let slot = record.containers[0].devices[LIC][0].clone();
        out.insert(p.metadata.name.clone().unwrap(), (node, slot));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shared_device_is_used_from_two_nodes_up_to_its_capacity_and_never_beyond() {
    let api = ApiTarget::start().await.unwrap();
    let client = api.client();
    let ns = unique_name("np-e2e-shared");
    api.create_namespace(&ns).await.unwrap();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let names = [unique_name("np-e2e-shared-a"), unique_name("np-e2e-shared-b")];
    for (n, side) in names.iter().zip(["a", "b"]) {
        let allocatable = json!({"cpu": "32", "memory": "128Gi", "pods": "110", LIC: "2"});
        api.create_labelled_node(n, &[("numaplane.io/e2e-side", side)], Some(allocatable))
            .await
            .unwrap();
    }
    let mut sides = Vec::new();
    for n in &names {
        sides.push(NodeSide::start(n, api.kubeconfig()).await);
    }
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    for n in &names {
        wait_for("both NRTs", async || nrts.get_opt(n).await.unwrap()).await;
    }

    let sched_args = scheduler_run_args(api.kubeconfig());
    let mut scheduler = Agent::spawn_scheduler("run", &sched_args).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();

    // Three users of a 2-slot license: two are placed, on distinct slots, the third waits.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // p0 on node a and p1 on node b (so the slots are used from two nodes); p2 anywhere.
    let create = async |name: &str, side: Option<&str>| {
        let r = json!({"cpu": "1", "memory": "1Gi", LIC: "1"});
        let selector = side.map(|s| json!({"numaplane.io/e2e-side": s}));
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
            "spec": {"schedulerName": "numaplane-scheduler", "tolerations": [{"operator": "Exists"}],
                "nodeSelector": selector,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": r, "limits": r}}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    };
    for (name, side) in [("p0", Some("a")), ("p1", Some("b")), ("p2", None)] {
        create(name, side).await;
    }
    let placed = wait_for("two pods bound", async || {
        Some(bound(&pods).await).filter(|b| b.len() >= 2)
    })
    .await;
    wait_for("the third pod reported unschedulable", async || {
        let p = pods.get("p2").await.unwrap();
        let unschedulable = p.status.as_ref()?.conditions.as_ref()?.iter().any(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
        });
        unschedulable.then_some(())
    })
    .await;
    let placed_now = bound(&pods).await;
    assert_eq!(
        placed_now.len(),
        2,
        "a third user was placed: {placed_now:?}\n{}",
        scheduler.stderr()
    );
    let slots: std::collections::BTreeSet<&String> = placed.values().map(|(_, s)| s).collect();
    assert_eq!(slots.len(), 2, "a slot was handed out twice: {placed:?}");
    assert_eq!(placed["p0"].0, names[0]);
    assert_eq!(placed["p1"].0, names[1]);

    // Each node's kubelet admits its pods; the plugin steers it to the recorded slot.
    for (pod, (node, slot)) in &placed {
        let side = sides.iter_mut().find(|s| &s.name == node).unwrap();
        side.report_admitting(&ns, Some(pod));
        let (got, _) = side
            .dp
            .admit(&format!("{ns}/{pod}"), "app", LIC, 1, Some(&[0]))
            .await
            .unwrap();
        assert_eq!(&got, &vec![slot.clone()], "{pod} on {node}");
        side.held.insert(pod.clone(), slot.clone());
        side.report(&ns);
    }
    // Every slot held on one node is Unhealthy on the other, so a pod that bypasses the
    // scheduler finds no slot on either node.
    for i in 0..2 {
        let other: Vec<String> = sides[1 - i].held.values().cloned().collect();
        wait_for("held slots listed Unhealthy on the other node", async || {
            let mut u = sides[i].unhealthy();
            u.sort();
            let mut want = other.clone();
            want.retain(|s| !sides[i].held.values().any(|h| h == s));
            want.sort();
            (u == want).then_some(())
        })
        .await;
        let err = sides[i]
            .dp
            .admit(&format!("{ns}/bypass-{i}"), "app", LIC, 1, Some(&[0]))
            .await
            .unwrap_err();
        assert!(err.contains("unavailable"), "{err}");
    }
    let elsewhere = sides[1].held.len() as f64;
    wait_for("slots held elsewhere counted", async || {
        let text = sides[0].exporter.metrics().ok()?;
        let v = metric_value(
            &text,
            "numaplane_exporter_allocator_slots",
            &[("resource", LIC), ("state", "held_elsewhere")],
        )?;
        (v == elsewhere).then_some(())
    })
    .await;

    // p0 goes: its kubelet frees the slot, its NRT stops showing it, and the waiting pod gets
    // exactly that slot, on whichever node.
    let (p0_node, p0_slot) = placed["p0"].clone();
    pods.delete("p0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    {
        let side = sides.iter_mut().find(|s| s.name == p0_node).unwrap();
        side.dp.remove_pod(&format!("{ns}/p0"));
        side.held.remove("p0");
        side.report(&ns);
    }
    let after = wait_for("the waiting pod bound", async || {
        Some(bound(&pods).await).filter(|b| b.contains_key("p2"))
    })
    .await;
    let (p2_node, p2_slot) = after["p2"].clone();
    assert_eq!(p2_slot, p0_slot, "{after:?}");
    let side = sides.iter().find(|s| s.name == p2_node).unwrap();
    side.report_admitting(&ns, Some("p2"));
    let got = wait_for("the freed slot healthy on the waiting pod's node", async || {
        side.dp
            .admit(&format!("{ns}/p2"), "app", LIC, 1, Some(&[0]))
            .await
            .ok()
            .map(|(g, _)| g)
    })
    .await;
    assert_eq!(got, std::slice::from_ref(&p0_slot));
    for s in &sides {
        let text = s.exporter.metrics().unwrap();
        assert_eq!(
            metric_value(
                &text,
                "numaplane_exporter_allocator_mismatches_total",
                &[("resource", LIC)]
            )
            .unwrap_or(0.0),
            0.0
        );
        assert_eq!(s.dp.allocate_errors(), 0);
    }

    let _ = pods
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await;
    for n in &names {
        let _ = nrts.delete(n, &DeleteParams::default()).await;
        let _ = nodes_api.delete(n, &DeleteParams::default()).await;
    }
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}
