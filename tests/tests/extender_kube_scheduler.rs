//! The extender behind the real kube-scheduler v1.36.2, started with the KubeSchedulerConfiguration
//! deploy/extender ships (only its `urlPrefix` pointed at the extender this test starts, and its
//! `clientConnection` left to the control-plane script). A real kube-apiserver from
//! ../shared/k8s; the Nodes are API objects (no kubelet), with NodeResourceTopologies the test
//! publishes as the exporter would.
//!
//! - A Guaranteed CPU-only pod (no device, nothing kube-scheduler's `managedResources` could
//!   name) is filtered by the extender: the node kube-scheduler's own scores prefer has no NUMA
//!   zone with room, the extender rejects it, and the pod is bound to the other node by the
//!   extender's `bind`, with the allocation record on the Binding.
//! - `prioritize` is called when two nodes pass.
//! - A Burstable pod is answered without the model (every node passes, a plain Binding).
//! - `preempt` on real pods: kube-scheduler's candidate and victim are kept where evicting the
//!   victim frees a NUMA zone, the victim is deleted, and the preemptor lands in its zone.
//!
//! Without ../shared/k8s (a fresh clone) the test prints what it skipped and how to run it;
//! with `CI=true`, a missing kit or a control plane that does not start fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane_e2e::control_plane::{self, ControlPlane};
use numaplane_e2e::harness::{Agent, free_port, metric_value, nrt};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const NS: &str = "numaplane-extender-e2e";

fn repo() -> PathBuf {
    control_plane::repo_root()
}

/// The address the extender serves its verbs on, chosen before kube-scheduler starts: its
/// configuration names it, and this binary's control plane starts with that configuration.
fn verbs_addr() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| ([127, 0, 0, 1], free_port().unwrap()).into())
}

/// kube-scheduler's configuration for this binary's control plane: the shipped one, pointed at
/// [`verbs_addr`].
fn options() -> control_plane::Options {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "extender-kube-scheduler-config-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, config_for(&shipped_scheduler_config(), verbs_addr())).unwrap();
    control_plane::Options {
        scheduler_config: Some(path),
        ..Default::default()
    }
}

/// The KubeSchedulerConfiguration deploy/extender ships, as its ConfigMap holds it.
fn shipped_scheduler_config() -> String {
    let text = std::fs::read_to_string(repo().join("deploy/extender/extender.yaml")).unwrap();
    let docs = serde_saphyr::from_multiple::<Value>(&text).unwrap();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "numaplane-kube-scheduler-config")
        .unwrap();
    cm["data"]["kube-scheduler-config.yaml"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The shipped config for this cluster: the extender at `addr` instead of 127.0.0.1:10270, and
/// no `clientConnection` (the control-plane script gives kube-scheduler its own kubeconfig).
fn config_for(shipped: &str, addr: SocketAddr) -> String {
    const SHIPPED_URL: &str = "urlPrefix: http://127.0.0.1:10270";
    assert_eq!(shipped.matches(SHIPPED_URL).count(), 1, "{shipped}");
    let client_connection = regex::Regex::new(r"(?m)^clientConnection:\n(?:[ \t]+.*\n)*").unwrap();
    let out = client_connection
        .replace(shipped, "")
        .replace(SHIPPED_URL, &format!("urlPrefix: http://{addr}"));
    assert!(!out.contains("clientConnection"), "{out}");
    out
}

fn nrt_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// An NRT of two single-numa-node zones of `capacity` CPUs with `free` CPUs available.
fn nrt(node: &str, capacity: u32, free: [u32; 2]) -> DynamicObject {
    let cap = capacity.to_string();
    let zone = |i: usize| nrt::zone(i, vec![nrt::resource("cpu", &cap, &free[i].to_string())]);
    serde_json::from_value(nrt::single_numa_node(
        json!({"name": node}),
        &[],
        vec![zone(0), zone(1)],
    ))
    .unwrap()
}

async fn create_node(client: &kube::Client, name: &str, group: &str, cpus: u32) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true", "numaplane.io/e2e-group": group,
                                              "kubernetes.io/hostname": name}},
        // Nodes may carry their status on create (no kubelet will write it).
        "status": {"allocatable": {"cpu": cpus.to_string(), "memory": "256Gi", "pods": "110"},
                   "capacity": {"cpu": cpus.to_string(), "memory": "256Gi", "pods": "110"}}}))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

/// A pod of `cpu` CPUs and 1Gi in one container (`guaranteed`: limits = requests), for the
/// nodes of `group`, tolerating the taints of nodes without a kubelet.
fn pod(name: &str, group: &str, cpu: &str, guaranteed: bool, priority_class: Option<&str>) -> Pod {
    let r = json!({"cpu": cpu, "memory": "1Gi"});
    let resources = if guaranteed {
        json!({"requests": r, "limits": r})
    } else {
        json!({"requests": r})
    };
    let mut spec = json!({
        "nodeSelector": {"numaplane.io/e2e-group": group},
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}]});
    if let Some(class) = priority_class {
        spec["priorityClassName"] = json!(class);
    }
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": NS}, "spec": spec})).unwrap()
}

/// Waits until `name` is bound; returns the pod.
async fn bound(pods: &Api<Pod>, name: &str, cp: &ControlPlane, ext: &Agent) -> Pod {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = pods.get(name).await.unwrap();
        if p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some() {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "{name} not bound: {:?}\nkube-scheduler:\n{}\nextender:\n{}",
            p.status,
            tail(&cp.log("kube-scheduler.log"), 40),
            tail(&ext.stderr(), 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The pods `victim-*`, those being deleted or those not.
async fn victims(pods: &Api<Pod>, deleted: bool) -> Vec<Pod> {
    let mut all = pods.list(&ListParams::default()).await.unwrap().items;
    all.retain(|p| {
        let victim = p
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("victim-"));
        victim && p.metadata.deletion_timestamp.is_some() == deleted
    });
    all
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap()
}

fn record(p: &Pod) -> Option<Allocation> {
    let a = p.metadata.annotations.as_ref()?.get(ANNOTATION)?;
    Some(Allocation::parse(a).unwrap())
}

fn calls(ext: &Agent, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&ext.metrics().unwrap(), name, labels).unwrap_or(0.0)
}

fn requests(ext: &Agent, verb: &str) -> f64 {
    calls(
        ext,
        "numaplane_scheduler_extender_requests_total",
        &[("verb", verb), ("result", "ok")],
    )
}

fn unaligned(ext: &Agent, verb: &str) -> f64 {
    calls(
        ext,
        "numaplane_scheduler_extender_unaligned_pods_total",
        &[("verb", verb)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_with_the_shipped_config_filters_prioritizes_binds_and_preempts_through_the_extender()
{
    let Some(cluster) = control_plane::require(
        "the extender behind the real kube-scheduler started with the shipped config",
        &options(),
    ) else {
        return;
    };
    let Some(cp) = cluster.control_plane() else {
        println!(
            "{}",
            control_plane::skip_line(
                "the extender behind the real kube-scheduler (NUMAPLANE_E2E_KUBECONFIG names a cluster whose kube-scheduler this test cannot configure)"
            )
        );
        return;
    };
    let _turn = control_plane::exclusive(&cluster).await.unwrap();
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.kubeconfig().display().to_string();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": NS, "labels": {"numaplane.io/e2e": "true"}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    // No serviceaccount controller runs: the pods' ServiceAccount is created here.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .unwrap();
    let classes: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [("numaplane-e2e-low", 10), ("numaplane-e2e-high", 1000)] {
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).unwrap(),
            )
            .await
            .unwrap();
    }

    // `wide`: 64 CPUs, so kube-scheduler's own scores (least allocated) prefer it, but no zone
    // has more than 2 CPUs free. `numa`: 16 CPUs, zones of 8 free. `full`: 8 CPUs, both zones
    // held by low-priority pods.
    create_node(&client, "wide", "fit", 64).await;
    create_node(&client, "numa", "fit", 16).await;
    create_node(&client, "full", "preempt", 8).await;
    let nrts = nrt_api(&client);
    for obj in [
        nrt("wide", 8, [2, 2]),
        nrt("numa", 8, [8, 8]),
        nrt("full", 4, [0, 0]),
    ] {
        nrts.create(&PostParams::default(), &obj).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (name, zone) in [("victim-0", 0u32), ("victim-1", 1)] {
        let mut p = pod(name, "preempt", "4", true, Some("numaplane-e2e-low"));
        let spec = p.spec.as_mut().unwrap();
        spec.node_name = Some("full".to_owned());
        let held = json!({"version": "v1", "node": "full", "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "c", "kind": "app", "numaNodes": [zone]}]});
        p.metadata.annotations = Some([(ANNOTATION.to_owned(), held.to_string())].into());
        pods.create(&PostParams::default(), &p).await.unwrap();
    }

    // The extender, synced, before kube-scheduler asks it anything.
    let mut ext = Agent::spawn_binary(
        numaplane_e2e::binaries::scheduler(),
        "extender",
        &[
            "--kubeconfig".to_owned(),
            kubeconfig.clone(),
            "--leader-elect=false".to_owned(),
            "--listen".to_owned(),
            verbs_addr().to_string(),
        ],
        "--metrics-listen",
        "info,numaplane_scheduler=debug",
    )
    .unwrap();
    ext.set_wait(WAIT);
    ext.wait_serving(WAIT).await.unwrap();
    ext.wait_ready().await;
    // kube-scheduler runs with the shipped config since the control plane started (it refused
    // native managedResources once and exited); the extender was down until now, which
    // `ignorable: true` allows.

    // 1. A Guaranteed CPU-only pod: `wide` is rejected by the extender (no zone holds 4 CPUs).
    pods.create(&PostParams::default(), &pod("pinned-4", "fit", "4", true, None))
        .await
        .unwrap();
    let p = bound(&pods, "pinned-4", cp, &ext).await;
    assert_eq!(node_of(&p), "numa");
    let r = record(&p).expect("the extender's bind writes the record with the Binding");
    assert_eq!(r.node, "numa");
    assert_eq!(r.containers[0].numa_nodes.as_ref().map(Vec::len), Some(1));
    let log = ext.stderr();
    assert!(
        log.lines().any(|l| l.contains("extender filter rejects node")
            && l.contains("wide")
            && l.contains("pinned-4")),
        "{}",
        tail(&log, 40)
    );
    assert!(requests(&ext, "filter") >= 1.0);
    assert!(requests(&ext, "bind") >= 1.0);
    assert_eq!(unaligned(&ext, "filter"), 0.0);

    // 2. A 2-CPU Guaranteed pod fits a zone on both nodes: kube-scheduler asks for scores.
    let before = requests(&ext, "prioritize");
    pods.create(&PostParams::default(), &pod("pinned-2", "fit", "2", true, None))
        .await
        .unwrap();
    let p = bound(&pods, "pinned-2", cp, &ext).await;
    assert!(record(&p).is_some(), "{:?}", p.metadata.annotations);
    assert!(requests(&ext, "prioritize") > before);

    // 3. A Burstable pod: answered without the model, bound with a plain Binding.
    pods.create(
        &PostParams::default(),
        &pod("burstable", "fit", "100m", false, None),
    )
    .await
    .unwrap();
    let p = bound(&pods, "burstable", cp, &ext).await;
    assert!(record(&p).is_none(), "{:?}", p.metadata.annotations);
    for verb in ["filter", "prioritize", "bind"] {
        assert!(unaligned(&ext, verb) >= 1.0, "{verb}: {}", ext.metrics().unwrap());
    }

    // 4. Preemption: `full` has no CPU left at node level, so kube-scheduler picks a victim
    // there and asks the extender, which keeps it (evicting it frees a whole zone).
    pods.create(
        &PostParams::default(),
        &pod("preemptor", "preempt", "4", true, Some("numaplane-e2e-high")),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WAIT;
    let victim = loop {
        let evicted = victims(&pods, true).await;
        if !evicted.is_empty() {
            assert_eq!(evicted.len(), 1, "one zone is enough");
            break evicted.into_iter().next().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no victim evicted\nkube-scheduler:\n{}\nextender:\n{}",
            tail(&cp.log("kube-scheduler.log"), 40),
            tail(&ext.stderr(), 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(requests(&ext, "preempt") >= 1.0, "{}", ext.metrics().unwrap());
    let preemptor = pods.get("preemptor").await.unwrap();
    assert_eq!(
        preemptor
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref()),
        Some("full")
    );
    // No kubelet: the victim goes once forced; the exporter would then publish its zone free.
    let zone = record(&victim).unwrap().containers[0].numa_nodes.clone().unwrap()[0];
    let mut free = [0, 0];
    free[zone as usize] = 4;
    let mut updated = nrt("full", 4, free);
    let current = nrts.get("full").await.unwrap();
    updated.metadata.resource_version = current.metadata.resource_version;
    nrts.replace("full", &PostParams::default(), &updated)
        .await
        .unwrap();
    pods.delete(
        victim.metadata.name.as_deref().unwrap(),
        &DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();
    let p = bound(&pods, "preemptor", cp, &ext).await;
    assert_eq!(node_of(&p), "full");
    assert_eq!(
        record(&p).unwrap().containers[0].numa_nodes,
        Some(vec![zone]),
        "the preemptor takes the zone its victim freed"
    );
    // The other low-priority pod stays.
    let survivors = victims(&pods, false).await.len();
    assert_eq!(survivors, 1);
}

#[test]
fn the_shipped_config_is_rewritten_only_where_this_cluster_differs() {
    let shipped = shipped_scheduler_config();
    let out = config_for(&shipped, "127.0.0.1:1234".parse().unwrap());
    assert!(out.contains("urlPrefix: http://127.0.0.1:1234\n"), "{out}");
    // Everything else is as shipped.
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| {
                !l.contains("urlPrefix") && !l.contains("clientConnection") && !l.contains("kubeconfig:")
            })
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(strip(&out), strip(&shipped));
}
