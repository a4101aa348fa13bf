//! The whole system: pods flow Pending → bound → allocated → reflected in the NRT through the
//! real scheduler and, per node, the real exporter hosting our device plugin, with no
//! oversubscription at any moment and no prediction mismatch.
//!
//! Against a real kube-apiserver (the kit's control plane, see `numaplane_e2e::control_plane`),
//! or the HTTP-level fake API without one: simulated nodes, each a fake kubelet (real gRPC
//! servers on Unix sockets, see `numaplane_e2e::whole_system`) and an exporter process.
//! `NUMAPLANE_E2E_SYSTEM_PODS` pods (default 1,000 on the fake, 150 on a real kube-apiserver)
//! of a mixed shape (1–4 exclusive CPUs,
//! memory, GPUs, NIC slots) are created while fewer than a window are alive, and reflected pods
//! are deleted at random so later pods reuse their CPUs, devices and slots. The main run keeps
//! about half the capacity alive with the scheduler's default parallel bindings; the near-full
//! run makes pods wait for capacity, so pods are bound out of creation order; the step-by-step
//! test pins that case down (the plugin steers by binding order, as the kubelet admits). In both
//! runs one node's device plugins register again mid-stream (their sockets removed while its
//! kubelet runs), and every invariant must still hold.
//!
//! Against a real cluster (`NUMAPLANE_E2E_KUBECONFIG`): the real nodes' kubelets and the
//! exporters installed there (deploy/) take the fake kubelets' place; the test runs its own
//! scheduler under a unique scheduler name. `NUMAPLANE_E2E_SYSTEM_PODS` (default 10)
//! Guaranteed pods of 1 CPU and 64Mi must all be bound with a record, run (the kubelet admitted
//! them: no TopologyAffinityError), be shown used in their node's NRT, and draw no
//! `AllocationMismatch` Event. The nodes need the static CPU manager (exclusive CPUs are what
//! the NRT shows used) and the NRT CRD.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::fingerprint;
use numaplane::nrt::{self, NodeResourceTopology};
use numaplane::quantity::Quantity;
use numaplane_e2e::control_plane::Cluster;
use numaplane_e2e::harness::{Agent, ApiTarget, metric_value, scheduler_run_args, unique_name};
use numaplane_e2e::whole_system::{self as sys, SimNode};
use serde_json::json;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(120);
/// Pods in the run, overriding the default.
const PODS_ENV: &str = "NUMAPLANE_E2E_SYSTEM_PODS";
/// The scheduler's `--bind-concurrency`, overriding the default of this test (1).
const BIND_CONCURRENCY_ENV: &str = "NUMAPLANE_E2E_SYSTEM_BIND_CONCURRENCY";
/// Simulated nodes.
const NODES: usize = 8;
/// Pods alive (pending or running) at once: about half of what the nodes hold, so pods rarely
/// wait for capacity.
const WINDOW: usize = 48;
/// Pods alive at once when the nodes are kept near full: pods wait for capacity and are bound
/// after newer ones.
const FULL_WINDOW: usize = 128;

fn pods_wanted(default: usize) -> usize {
    std::env::var(PODS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `numaplane-scheduler run` arguments: unelected, with the scheduler's default parallel
/// bindings unless `NUMAPLANE_E2E_SYSTEM_BIND_CONCURRENCY` says otherwise. Parallel bindings
/// land out of creation order, which the plugin must follow (it steers by binding order).
fn scheduler_args(kubeconfig: &std::path::Path) -> Vec<String> {
    let mut args = scheduler_run_args(kubeconfig);
    if let Ok(bind_concurrency) = std::env::var(BIND_CONCURRENCY_ENV) {
        args.extend(["--bind-concurrency".to_owned(), bind_concurrency]);
    }
    args
}

/// The sum of every sample of `name`.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the target is `NUMAPLANE_E2E_KUBECONFIG`'s cluster, with real kubelets (the kit's
/// control plane has none: the simulated nodes run against it).
fn external(api: &ApiTarget) -> bool {
    matches!(api.cluster(), Some(Cluster::External(_)))
}

/// Pods of the main simulated run on a real kube-apiserver: every write goes through etcd
/// there, and the suite's time is bounded (`scripts/test` within 15 minutes on 2 cores);
/// `NUMAPLANE_E2E_SYSTEM_PODS` asks for more.
const REAL_PODS: usize = 150;
/// Pods of the near-full run on a real kube-apiserver: more than [`FULL_WINDOW`], so that pods
/// still wait for capacity.
const REAL_FULL_PODS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_flow_to_the_nrt_without_oversubscription_or_mismatch() {
    let api = ApiTarget::start().await.unwrap();
    if external(&api) {
        real_cluster(&api).await;
        return;
    }
    simulated(&api, WINDOW, if api.is_real() { REAL_PODS } else { 1000 }).await;
}

/// The same flow with the nodes kept near full, so that pods wait for capacity and a pod can be
/// bound after a newer one planned in the same zone of the same node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_waiting_for_capacity_get_their_recorded_devices() {
    let api = ApiTarget::start().await.unwrap();
    if external(&api) {
        real_cluster(&api).await;
        return;
    }
    // Fewer pods than the main run: every one of them waits for capacity, which is the point.
    simulated(
        &api,
        FULL_WINDOW,
        if api.is_real() { REAL_FULL_PODS } else { 400 },
    )
    .await;
}

/// The root of the swap above, one step at a time: pods `a` (older) and `b` (newer), one GPU
/// each, planned in zone 0 (`a` g0, `b` g1) of one node. Their Bindings land `b` first, so the
/// kubelet admits `b` first, while the plugin already knows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_bound_before_an_older_one_gets_its_recorded_devices() {
    let api = ApiTarget::start().await.unwrap();
    let client = api.client();
    let ns = unique_name("np-system-order");
    api.create_namespace(&ns).await.unwrap();
    let node_name = unique_name("np-system-order-node");
    api.create_labelled_node(&node_name, &[], Some(sys::node_allocatable()))
        .await
        .unwrap();
    let node = SimNode::start(&node_name, api.kubeconfig(), "200ms")
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let shape = sys::Shape {
        cpus: 1,
        memory_gib: 1,
        devices: BTreeMap::from([(sys::GPU.to_owned(), 1)]),
    };
    // Created in this order (ties in creation time go by name, `a` first, for the plugin too);
    // no scheduler serves their scheduler name.
    for name in ["a", "b"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
            "spec": {"schedulerName": "numaplane-e2e-nobody", "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": sys::CONTAINER, "image": "registry.k8s.io/pause:3.10",
                    "resources": shape.resources()}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for (name, gpu) in [("b", "g1"), ("a", "g0")] {
        let record = json!({"version": "v1", "node": node_name, "policy": "single-numa-node",
            "scope": "container", "containers": [{"name": sys::CONTAINER, "kind": "app",
            "numaNodes": [0], "devices": {sys::GPU: [gpu]}}]});
        let binding = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "annotations": {ANNOTATION: record.to_string()}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}});
        let _: serde_json::Value = pods
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await
            .unwrap();
    }
    // The plugin knows `a` once a question only `a`'s plan fits is answered with it.
    wait_for("the plugin sees a bound", WAIT, async || {
        let answer = node.preferred(sys::GPU, vec!["g0".to_owned()], 1).await.ok()?;
        (answer == ["g0"]).then_some(())
    })
    .await;
    let mut outcomes = Vec::new();
    for name in ["b", "a"] {
        let pod = pods.get(name).await.unwrap();
        outcomes.push(node.admit(&pod).await.unwrap());
    }
    for outcome in &outcomes {
        let sys::Progress::Admitted { mismatch, .. } = outcome else {
            panic!("{outcome:?}");
        };
        assert!(mismatch.is_empty(), "{outcomes:?}");
    }
    api.cleanup(&node_name, &ns).await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}

/// The simulated run (module comment) with `window` pods alive at once and `default_pods` pods
/// in all (unless `NUMAPLANE_E2E_SYSTEM_PODS` says otherwise).
async fn simulated(api: &ApiTarget, window: usize, default_pods: usize) {
    let setup = std::time::Instant::now();
    let pods = pods_wanted(default_pods);
    let client = api.client();
    let ns = unique_name("np-system");
    api.create_namespace(&ns).await.unwrap();
    let prefix = unique_name("np-system-node");
    let names: Vec<String> = (0..NODES).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        api.create_labelled_node(name, &[], Some(sys::node_allocatable()))
            .await
            .unwrap();
    }
    let started = futures::future::try_join_all(
        names
            .iter()
            .map(|name| SimNode::start(name, api.kubeconfig(), "200ms")),
    )
    .await
    .unwrap();
    let nodes: BTreeMap<String, Arc<SimNode>> = started
        .into_iter()
        .map(|n| (n.name.clone(), Arc::new(n)))
        .collect();
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    for name in nodes.keys() {
        wait_for("every NRT", WAIT, async || nrts.get_opt(name).await.unwrap()).await;
    }

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for node in nodes.values() {
        tasks.push(tokio::spawn(node.clone().run_kubelet(client.clone(), tx.clone())));
    }
    tasks.push(tokio::spawn(sys::watch_nrts(
        client.clone(),
        nodes.clone(),
        tx.clone(),
    )));
    let mut scheduler = Agent::spawn_scheduler("run", &scheduler_args(api.kubeconfig())).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();

    eprintln!(
        "whole system: nodes up, scheduler serving after {:.1} s",
        setup.elapsed().as_secs_f64()
    );
    // A fault mid-stream: once the first node admits pods, its device plugins register again.
    let faulty = nodes.values().next().unwrap().clone();
    let fault = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + WAIT;
        while faulty.admitted() == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        faulty.reregister_plugins().await.map(|()| faulty.name.clone())
    });
    let report = sys::drive(
        client.clone(),
        &ns,
        pods,
        window,
        &mut rx,
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    eprintln!(
        "whole system: {} pods, {} nodes: wall {:.1} s, {:.1} pods/s, max pending {}, deleted midway {}, \
         mismatches {}; created→admitted p50 {:.0} ms p99 {:.0} ms; admitted→in NRT p50 {:.0} ms p99 {:.0} ms",
        report.reflected,
        NODES,
        report.wall.as_secs_f64(),
        report.pods_per_second(),
        report.max_pending,
        report.deleted,
        report.mismatches.len(),
        sys::Report::quantile_ms(&report.to_admitted, 0.5),
        sys::Report::quantile_ms(&report.to_admitted, 0.99),
        sys::Report::quantile_ms(&report.to_reflected, 0.5),
        sys::Report::quantile_ms(&report.to_reflected, 0.99),
    );
    assert!(
        report.violations.is_empty(),
        "oversubscription: {:#?}",
        report.violations
    );
    assert!(
        report.bad_nrts.is_empty(),
        "NRT != kubelet: {:#?}",
        report.bad_nrts
    );
    assert!(
        report.mismatches.is_empty(),
        "prediction mismatches: {:#?}",
        report.mismatches
    );
    assert_eq!(
        (report.created, report.admitted, report.reflected),
        (pods, pods, pods),
        "not every pod went the whole way\n{}",
        scheduler.stderr()
    );
    assert!(report.deleted >= pods / 2, "too little churn: {report:?}");
    let reregistered = fault.await.unwrap().unwrap();
    let node = &nodes[&reregistered];
    assert!(node.registrations(sys::GPU) >= 2 && node.registrations(sys::NIC) >= 2);
    // The exporter read allocatable again for the lists the plugins sent after registering.
    let text = node.exporter.metrics().unwrap();
    assert!(
        metric_value(
            &text,
            "numaplane_exporter_allocatable_rereads_total",
            &[("cause", "device_plugin")]
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{text}"
    );

    // Everything goes: every kubelet frees all, and every NRT shows the empty node (checked
    // against the kubelet state by the NRT watcher as before).
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods_api
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await
        .unwrap();
    for (name, node) in &nodes {
        wait_for("every kubelet empty", WAIT, async || {
            (node.admitted() == 0).then_some(())
        })
        .await;
        wait_for("every NRT empty", WAIT, async || {
            let nrt = nrts.get(name).await.unwrap();
            let fp = nrt
                .attributes
                .iter()
                .flatten()
                .find(|a| a.name == nrt::attr::PODS_FINGERPRINT)?;
            (fp.value == fingerprint::EMPTY_SIGNATURE).then_some(())
        })
        .await;
    }
    while let Ok(p) = rx.try_recv() {
        assert!(
            !matches!(p, sys::Progress::Violation(_) | sys::Progress::BadNrt { .. }),
            "{p:?}"
        );
    }
    // Every kubelet question was answered with a plan (small runs may leave a node without a
    // question for a resource, so the answers are summed over the nodes).
    let mut answers: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for node in nodes.values() {
        let text = node.exporter.metrics().unwrap();
        for res in [sys::GPU, sys::NIC] {
            let mismatches = metric_value(
                &text,
                "numaplane_exporter_allocator_mismatches_total",
                &[("resource", res)],
            );
            assert_eq!(mismatches.unwrap_or(0.0), 0.0, "{}: {res}", node.name);
            for outcome in ["honoured", "no_candidate", "not_honourable"] {
                let n = metric_value(
                    &text,
                    "numaplane_exporter_allocator_preferred_allocations_total",
                    &[("resource", res), ("outcome", outcome)],
                );
                *answers.entry((res, outcome)).or_default() += n.unwrap_or(0.0);
            }
        }
    }
    for res in [sys::GPU, sys::NIC] {
        assert!(
            answers[&(res, "honoured")] > 0.0,
            "the plugin never steered {res}: {answers:?}"
        );
        assert_eq!(answers[&(res, "no_candidate")], 0.0, "{answers:?}");
        assert_eq!(answers[&(res, "not_honourable")], 0.0, "{answers:?}");
    }
    let text = scheduler.metrics().unwrap();
    eprintln!(
        "whole system: unschedulable attempts {} (pods waiting for capacity)",
        metric_value(
            &text,
            "numaplane_scheduler_schedule_attempts_total",
            &[("result", "unschedulable")]
        )
        .unwrap_or(0.0)
    );
    let scheduled = metric_value(
        &text,
        "numaplane_scheduler_schedule_attempts_total",
        &[("result", "scheduled")],
    );
    assert_eq!(scheduled, Some(pods as f64), "{text}");
    // One Binding per pod: none failed and was retried.
    let bindings = metric_value(
        &text,
        "numaplane_scheduler_api_writes_total",
        &[("reason", "binding")],
    );
    assert_eq!(bindings, Some(pods as f64), "{text}");
    assert_eq!(
        metric_sum(&text, "numaplane_scheduler_binding_errors_total"),
        0.0,
        "{text}"
    );
    let errors = metric_value(
        &text,
        "numaplane_scheduler_schedule_attempts_total",
        &[("result", "error")],
    );
    assert_eq!(errors.unwrap_or(0.0), 0.0, "{text}");
    for t in tasks {
        t.abort();
    }
}

/// The real-cluster variant (see the module comment).
async fn real_cluster(api: &ApiTarget) {
    let pods = pods_wanted(10);
    let client = api.client();
    let ns = unique_name("np-system");
    api.create_namespace(&ns).await.unwrap();
    let scheduler_name = unique_name("numaplane-e2e");
    let mut args = scheduler_args(api.kubeconfig());
    args.extend(["--scheduler-name".to_owned(), scheduler_name.clone()]);
    let mut scheduler = Agent::spawn_scheduler("run", &args).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let r = json!({"cpu": "1", "memory": "64Mi"});
    for i in 0..pods {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p-{i:05}"), "labels": {"numaplane.io/e2e": "true"}},
            "spec": {"schedulerName": scheduler_name,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": r, "limits": r}}]}}))
        .unwrap();
        pods_api.create(&PostParams::default(), &pod).await.unwrap();
    }
    // Bound with a record, then running (a rejected pod ends Failed).
    let running = wait_for(
        "every pod bound with a record and running",
        WAIT * 2,
        async || {
            let list = pods_api.list(&ListParams::default()).await.unwrap().items;
            let mut out = BTreeMap::new();
            for p in &list {
                let phase = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let name = p.metadata.name.clone().unwrap();
                assert_ne!(phase, "Failed", "{name} rejected by its kubelet: {:?}", p.status);
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone())?;
                let raw = p.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION))?;
                let record = Allocation::parse(raw).unwrap();
                assert_eq!(record.node, node, "{name}");
                if phase == "Running" {
                    out.insert(name, node);
                }
            }
            (out.len() == pods).then_some(out)
        },
    )
    .await;
    // Each node's NRT shows at least our pods' CPUs used.
    let mut per_node: BTreeMap<String, i64> = BTreeMap::new();
    for node in running.values() {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    for (node, ours) in &per_node {
        wait_for("the NRT shows our pods' CPUs used", WAIT, async || {
            let nrt = nrts.get_opt(node).await.unwrap()?;
            let used: i64 = nrt
                .zones
                .iter()
                .flat_map(|z| z.resources.iter().flatten())
                .filter(|r| r.name == "cpu")
                .map(|r| {
                    let q = |s: &str| {
                        Quantity::parse(s)
                            .ok()
                            .and_then(|q| q.as_i64_exact())
                            .unwrap_or(0)
                    };
                    q(&r.allocatable.0) - q(&r.available.0)
                })
                .sum();
            (used >= *ours).then_some(())
        })
        .await;
    }
    let mismatched: BTreeSet<String> = api
        .events_with_reason(&ns, "AllocationMismatch")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    assert!(mismatched.is_empty(), "prediction mismatches: {mismatched:?}");
    let _ = pods_api
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await;
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
    scheduler.kill();
}
