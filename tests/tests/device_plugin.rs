//! `numaplane-exporter device-plugin` against a fake kubelet (device-plugin registration and
//! admission with the device manager's rules, plus pod-resources) and an API server (the
//! HTTP-level fake, or a real cluster with `NUMAPLANE_E2E_KUBECONFIG`: pods are created bound
//! to a fake node name and never run).
//!
//! Checked: registration, options and topology; the kubelet's choice steered to the recorded
//! devices; a record that cannot be honoured leaves the kubelet's choice, counted as a mismatch
//! with an Event; re-registration after a kubelet restart; a slot pool under 1,000 create and
//! delete cycles with no leak and no failed Allocate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use numaplane::allocation::ANNOTATION;
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::fake_device_kubelet::FakeDeviceKubelet;
use numaplane_e2e::fake_kubelet::FakeKubelet;
use numaplane_e2e::harness::node::NodeFiles;
use numaplane_e2e::harness::{Agent, ApiTarget, assert_metric, eventually, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const GPU: &str = "example.com/gpu";
const CAM: &str = "example.com/cam";

struct Env {
    api: ApiTarget,
    ns: String,
    node: String,
    files: NodeFiles,
    dp: FakeDeviceKubelet,
    podres: FakeKubelet,
    agent: Agent,
    /// `namespace/name` of the pods created bound to the node.
    kubelet_pods: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// How the agent under test runs.
struct Opts {
    /// `--resync-interval`.
    resync: &'static str,
    /// More flags.
    extra: Vec<String>,
    /// Host the allocator in `numaplane-exporter run --pools` instead of `device-plugin`.
    run: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            resync: "100ms",
            extra: Vec::new(),
            run: false,
        }
    }
}

impl Env {
    /// GPUs g0..g3 on NUMA 0 and g4..g7 on NUMA 1; one camera shared by 2 containers.
    async fn new() -> Env {
        Env::with(Opts::default()).await
    }

    /// [`Self::new`] on the HTTP-level fake, for the faults only it can inject.
    async fn new_fake() -> Env {
        Env::on(ApiTarget::start_fake(true).await.unwrap(), Opts::default()).await
    }

    async fn with(opts: Opts) -> Env {
        Env::on(ApiTarget::start().await.unwrap(), opts).await
    }

    async fn on(api: ApiTarget, opts: Opts) -> Env {
        let ns = unique_name("np-dp");
        let node = unique_name("np-dp-node");
        api.create_namespace(&ns).await.unwrap();
        let gpus: Vec<_> = (0..8)
            .map(|i| json!({"id": format!("g{i}"), "numaNode": i / 4}))
            .collect();
        let files = NodeFiles::new(&json!({"pools": [
            {"resource": GPU, "devices": gpus, "deviceSpecs": [{"containerPath": "/dev/{device}", "hostPath": "/dev/fake-{device}"}]},
            {"resource": CAM, "capacity": 2, "devices": [{"id": "cam", "numaNode": 0}], "cdiDevices": ["example.com/cam={device}"]}
        ]}))
        .unwrap();
        let (dp, podres) = kubelet(&files).await;
        let resync = ["--resync-interval", opts.resync];
        let mut agent = if opts.run {
            let mut args = files.exporter_args(&node, api.kubeconfig(), &resync);
            args.extend(opts.extra);
            Agent::spawn_exporter("run", &args).unwrap()
        } else {
            let mut args = files.device_plugin_args(&node, api.kubeconfig(), &fixture("2numa.xml"), &resync);
            args.extend(opts.extra);
            Agent::spawn_exporter("device-plugin", &args).unwrap()
        };
        agent.wait_serving(WAIT).await.unwrap();
        dp.wait_registered(GPU, 1, WAIT).await.unwrap();
        dp.wait_registered(CAM, 1, WAIT).await.unwrap();
        Env {
            api,
            ns,
            node,
            files,
            dp,
            podres,
            agent,
            kubelet_pods: std::sync::Mutex::default(),
        }
    }

    /// A pod bound to the node, with a record planning `plan` GPUs for container `app`.
    async fn pod_with_record(&self, name: &str, plan: &[&str], numa: u32) {
        let record = json!({"version": "v1", "node": self.node, "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "app", "kind": "app", "numaNodes": [numa], "devices": {GPU: plan}}]});
        self.create_pod(name, Some(record.to_string())).await;
    }

    async fn create_pod(&self, name: &str, record: Option<String>) {
        self.create_pod_with(name, record, &["app"]).await;
    }

    /// A pod bound to the node with app containers `containers`.
    async fn create_pod_with(&self, name: &str, record: Option<String>, containers: &[&str]) {
        let mut meta = json!({"name": name, "labels": {"numaplane.io/e2e": "true"}});
        if let Some(r) = record {
            meta["annotations"] = json!({ANNOTATION: r});
        }
        let containers: Vec<_> = containers
            .iter()
            .map(|c| json!({"name": c, "image": "registry.k8s.io/pause:3.10"}))
            .collect();
        let pod: Pod = serde_json::from_value(json!({"metadata": meta, "spec": {
            "nodeName": self.node, "tolerations": [{"operator": "Exists"}],
            "containers": containers}}))
        .unwrap();
        Api::<Pod>::namespaced(self.api.client(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        // The kubelet lists every pod bound to it, devices or not, from the moment it sees it
        // (before admitting it).
        self.kubelet_pods.lock().unwrap().insert(self.key(name));
        self.sync_podresources();
    }

    /// The kubelet admits `container` of pod `name` with `count` of `resource`, aligned to
    /// `numa`: the devices it gave and the plugin's Allocate answer.
    async fn admit(
        &self,
        name: &str,
        container: &str,
        resource: &str,
        count: usize,
        numa: Option<&[i64]>,
    ) -> (
        Vec<String>,
        numaplane::proto::deviceplugin::ContainerAllocateResponse,
    ) {
        self.dp
            .admit(&self.key(name), container, resource, count, numa)
            .await
            .unwrap()
    }

    /// The plugin's preference for one GPU among `available` (nothing must be included), and
    /// how long it took to answer.
    async fn timed_preference(&self, available: Vec<String>) -> (Vec<String>, Duration) {
        let t = std::time::Instant::now();
        let got = self.dp.preferred(GPU, available, vec![], 1).await.unwrap();
        (got, t.elapsed())
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    /// Publishes through pod-resources `List` the pods the kubelet knows, with what the fake
    /// device manager holds.
    fn sync_podresources(&self) {
        let mut pods = Vec::new();
        let held = self.dp.all_held();
        for pod in self.kubelet_pods.lock().unwrap().iter() {
            if !held.contains_key(pod) {
                let (ns, name) = pod.split_once('/').unwrap();
                pods.extend(listed(ns, &[name]));
            }
        }
        for (pod, containers) in held {
            let (ns, name) = pod.split_once('/').unwrap();
            pods.push(PodResources {
                name: name.to_owned(),
                namespace: ns.to_owned(),
                containers: containers
                    .into_iter()
                    .map(|(c, res)| ContainerResources {
                        name: c,
                        devices: res
                            .into_iter()
                            .map(|(r, ids)| ContainerDevices {
                                resource_name: r,
                                device_ids: ids,
                                topology: Some(TopologyInfo {
                                    nodes: vec![NumaNode { id: 0 }],
                                }),
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        self.podres.set_pods(pods);
    }

    /// Waits until the agent's metric `condition` holds (see `harness::MetricCondition`).
    async fn until(&self, condition: &str) -> f64 {
        self.agent.wait_until(condition, WAIT).await.unwrap()
    }

    /// Waits for an `AllocationMismatch` Event of the namespace that `pred` accepts; returns it.
    async fn mismatch_event(
        &self,
        pred: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
    ) -> k8s_openapi::api::events::v1::Event {
        let pred = &pred;
        eventually(WAIT, Duration::from_millis(50), || async move {
            let events = self
                .api
                .events_with_reason(&self.ns, "AllocationMismatch")
                .await
                .unwrap();
            let notes: Vec<_> = events.iter().map(|e| e.note.clone()).collect();
            events
                .into_iter()
                .find(pred)
                .ok_or_else(|| format!("no such AllocationMismatch event: {notes:?}"))
        })
        .await
    }

    async fn cleanup(&self) {
        let pods: Api<Pod> = Api::namespaced(self.api.client(), &self.ns);
        let _ = pods
            .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
            .await;
        let _ = Api::<Namespace>::all(self.api.client())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_topology_and_steers_the_kubelet_to_the_recorded_devices() {
    let env = Env::new().await;
    let opts = env.dp.options(GPU).unwrap();
    assert!(opts.get_preferred_allocation_available);
    let devices = env.dp.devices(GPU);
    assert_eq!(devices.len(), 8);
    let g5 = devices.iter().find(|d| d.id == "g5").unwrap();
    assert_eq!(g5.topology.as_ref().unwrap().nodes[0].id, 1);
    let slots: Vec<String> = env.dp.devices(CAM).into_iter().map(|d| d.id).collect();
    assert_eq!(slots, ["cam-0", "cam-1"]);

    // Pods planned in zone 0 on devices the kubelet would not pick by itself (it fills in
    // ascending order: g0 first), and one whose plan (zone 1) the kubelet cannot honour when
    // it aligns to zone 0.
    env.pod_with_record("a", &["g3"], 0).await;
    env.pod_with_record("b", &["g2"], 0).await;
    let (got_a, resp) = env.admit("a", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got_a, ["g3"]);
    assert_eq!(resp.envs["NUMAPLANE_DEVICES_EXAMPLE_COM_GPU"], "g3");
    assert_eq!(resp.devices[0].host_path, "/dev/fake-g3");
    env.sync_podresources();
    let (got_b, _) = env.admit("b", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got_b, ["g2"], "ascending fill would have given g0");
    env.sync_podresources();
    // c: no plan fits what is offered: no preference, at once.
    env.pod_with_record("c", &["g6"], 1).await;
    let (got_c, _) = env.admit("c", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got_c, ["g0"]);
    env.sync_podresources();
    env.until("numaplane_exporter_allocator_preferred_allocations_total{resource=example.com/gpu,outcome=honoured} == 2")
    .await;
    env.until("numaplane_exporter_allocator_mismatches_total{resource=example.com/gpu} == 1")
        .await;
    assert_metric(
        &env.agent.metrics().unwrap(),
        "numaplane_exporter_allocator_preferred_allocations_total{resource=example.com/gpu,outcome=not_honourable} == 1",
    );
    let e = env.mismatch_event(|_| true).await;
    assert_eq!(e.regarding.as_ref().unwrap().name.as_deref(), Some("c"));
    assert!(e.note.as_deref().unwrap().contains("planned g6"), "{:?}", e.note);

    // The aligned set has exactly the size needed: the kubelet does not ask.
    let before = env.dp.preferred_calls(GPU);
    env.create_pod("d", None).await;
    let (got_d, _) = env.admit("d", "app", GPU, 4, Some(&[1])).await;
    assert_eq!(got_d, ["g4", "g5", "g6", "g7"]);
    assert_eq!(env.dp.preferred_calls(GPU), before);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_again_after_a_kubelet_restart_and_bad_records_are_ignored() {
    let env = Env::new().await;
    env.dp.restart().await.unwrap();
    env.dp.wait_registered(GPU, 2, WAIT).await.unwrap();
    env.dp.wait_registered(CAM, 2, WAIT).await.unwrap();
    assert_eq!(env.dp.devices(GPU).len(), 8);
    env.until("numaplane_exporter_allocator_registrations_total{resource=example.com/gpu,outcome=ok} >= 2")
        .await;

    // A malformed record and one for another node: ignored, with a metric and an Event.
    env.create_pod("bad", Some("{not json".to_owned())).await;
    let other = json!({"version": "v1", "node": "elsewhere", "policy": "none", "scope": "container",
        "containers": [{"name": "app", "kind": "app", "devices": {GPU: ["g1"]}}]});
    env.create_pod("other", Some(other.to_string())).await;
    let node = env.node.clone();
    let unknown = json!({"version": "v1", "node": node, "policy": "none", "scope": "container",
        "containers": [{"name": "app", "kind": "app", "devices": {GPU: ["g99"]}}]});
    env.create_pod("unknown", Some(unknown.to_string())).await;
    env.until("numaplane_exporter_allocator_records_ignored_total{reason=malformed} == 1")
        .await;
    env.until("numaplane_exporter_allocator_records_ignored_total{reason=other_node} == 1")
        .await;
    env.until("numaplane_exporter_allocator_records_ignored_total{reason=unknown_device} == 1")
        .await;
    // Neither steers: the kubelet's own choice stands and Allocate works.
    let (got, _) = env.admit("other", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got, ["g0"]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_pool_survives_1000_cycles_without_leaks_or_failed_allocates() {
    let env = Env::new().await;
    // One long-lived holder keeps a slot; the other slot is reused by pod after pod, each
    // right after the previous one's deletion.
    let (held, resp) = env.admit("long", "app", CAM, 1, Some(&[0])).await;
    assert_eq!(resp.cdi_devices[0].name, "example.com/cam=cam");
    // Which slot the fake kubelet hands out is its own bookkeeping; what is judged here is the
    // plugin's published state (its slot gauges), sampled every 100 cycles: both slots used
    // while the short pod runs, one free again once it is gone, never more and never fewer.
    let slots = |used: u32, free: u32| {
        [
            format!("numaplane_exporter_allocator_slots{{resource={CAM},state=used}} == {used}"),
            format!("numaplane_exporter_allocator_slots{{resource={CAM},state=free}} == {free}"),
        ]
    };
    for i in 0..1000 {
        let key = env.key(&format!("short-{i}"));
        let (got, _) = env.dp.admit(&key, "app", CAM, 1, Some(&[0])).await.unwrap();
        assert_ne!(got, held, "cycle {i}: the held slot was handed out again");
        let sample = i % 100 == 0;
        if sample {
            env.sync_podresources();
            for condition in slots(2, 0) {
                env.until(&condition).await;
            }
        }
        env.dp.remove_pod(&key);
        if sample {
            env.sync_podresources();
            for condition in slots(1, 1) {
                env.until(&condition).await;
            }
        }
    }
    assert_eq!(env.dp.allocate_errors(), 0);
    env.sync_podresources();
    env.until("numaplane_exporter_allocator_slots{resource=example.com/cam,state=used} == 1")
        .await;
    env.dp.remove_pod(&env.key("long"));
    env.sync_podresources();
    env.until("numaplane_exporter_allocator_slots{resource=example.com/cam,state=free} == 2")
        .await;
    assert_metric(
        &env.agent.metrics().unwrap(),
        "numaplane_exporter_allocator_allocations_total{resource=example.com/cam,outcome=ok} == 1001",
    );
    env.cleanup().await;
}

/// `--resync-interval 0` is documented as "off": the plugin serves and steers without a
/// periodic reconciliation instead of panicking on a zero-length interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_interval_zero_turns_reconciliation_off_without_stopping_the_plugin() {
    for run in [false, true] {
        resync_zero(run).await;
    }
}

async fn resync_zero(run: bool) {
    let mut env = Env::with(Opts {
        resync: "0",
        run,
        ..Opts::default()
    })
    .await;
    env.pod_with_record("a", &["g3"], 0).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            env.agent.exited().is_none(),
            "the agent exited: {}",
            env.agent.stderr()
        );
        // Steered as soon as the pod watch has the record.
        let got = env
            .dp
            .preferred(
                GPU,
                vec!["g0".into(), "g1".into(), "g2".into(), "g3".into()],
                vec![],
                1,
            )
            .await
            .unwrap();
        if got == ["g3"] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never steered");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(env.agent.exited().is_none(), "{}", env.agent.stderr());
    env.cleanup().await;
}

fn listed(ns: &str, names: &[&str]) -> Vec<PodResources> {
    names
        .iter()
        .map(|n| PodResources {
            name: (*n).to_owned(),
            namespace: ns.to_owned(),
            ..Default::default()
        })
        .collect()
}

fn zone0() -> Vec<String> {
    ["g0", "g1", "g2", "g3"].map(str::to_owned).to_vec()
}

/// The kubelet admits pods one at a time: a pod that cannot be ours (no record, or a record
/// with no device of this pool) must be answered at once, not after the 1 s wait for a
/// lagging watch. The wait is kept for a pod the kubelet lists that the watch has not seen,
/// and only once per such pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_cannot_be_ours_are_answered_at_once_and_only_a_lagging_pod_is_waited_for() {
    let env = Env::new().await;
    env.create_pod("plain", None).await;
    let cam_only = json!({"version": "v1", "node": env.node, "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "app", "kind": "app", "numaNodes": [0], "devices": {CAM: ["cam-0"]}}]});
    env.create_pod("cam-only", Some(cam_only.to_string())).await;
    // Until the watch has both pods the plugin may wait for them; then never again.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (got, took) = env.timed_preference(zone0()).await;
        assert!(got.is_empty());
        if took < Duration::from_millis(300) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "every answer waited");
    }
    for _ in 0..5 {
        let (got, took) = env.timed_preference(zone0()).await;
        assert!(got.is_empty());
        assert!(
            took < Duration::from_millis(300),
            "a pod that cannot be ours waited {took:?}"
        );
    }

    // A pod the kubelet lists before our watch has it: waited for, and steered.
    env.podres
        .set_pods(listed(&env.ns, &["plain", "cam-only", "late"]));
    let late = {
        let record = json!({"version": "v1", "node": env.node, "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "app", "kind": "app", "numaNodes": [0], "devices": {GPU: ["g2"]}}]});
        let api = env.api.client();
        let (ns, node) = (env.ns.clone(), env.node.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "late",
                "annotations": {ANNOTATION: record.to_string()}},
                "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}))
            .unwrap();
            Api::<Pod>::namespaced(api, &ns)
                .create(&PostParams::default(), &pod)
                .await
                .unwrap();
        })
    };
    assert_eq!(env.dp.preferred(GPU, zone0(), vec![], 1).await.unwrap(), ["g2"]);
    late.await.unwrap();

    // A pod the kubelet lists that never reaches the watch: one wait, then none.
    env.podres
        .set_pods(listed(&env.ns, &["plain", "cam-only", "late", "ghost"]));
    let (got, took) = env.timed_preference(vec!["g0".into()]).await;
    assert!(got.is_empty());
    assert!(took >= Duration::from_millis(900), "{took:?}");
    let (got, took) = env.timed_preference(vec!["g0".into()]).await;
    assert!(got.is_empty());
    assert!(took < Duration::from_millis(300), "waited again: {took:?}");
    env.cleanup().await;
}

/// A pod the kubelet admits while the allocator's pod watch is relisting (a 410 or a dropped
/// stream, and lists failing for seconds) is fetched from the API server and steered by its
/// record, not left to the kubelet's own choice once the 1 s wait runs out (the soak's seed 4:
/// the kubelet asked 14 ms after the pod was created, the watch relisting after a 410).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_admitted_while_the_pod_watch_relists_is_fetched_and_steered() {
    let env = Env::new_fake().await;
    let Some(fake) = env.api.fake() else {
        // Only the fake can cut the watch off.
        env.cleanup().await;
        return;
    };
    // The watch loses its stream and its history, and its relists fail for seconds.
    fake.fail_next("GET", "/api/v1/pods", 500, 6);
    fake.compact_history();
    fake.close_watches();
    tokio::time::sleep(Duration::from_millis(200)).await;
    env.pod_with_record("during", &["g3"], 0).await;
    env.podres.set_pods(listed(&env.ns, &["during"]));
    let t = std::time::Instant::now();
    assert_eq!(env.dp.preferred(GPU, zone0(), vec![], 1).await.unwrap(), ["g3"]);
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "answered only after the wait: {:?}",
        t.elapsed()
    );
    env.until("numaplane_exporter_allocator_pod_fetches_total{resource=example.com/gpu,outcome=ok} >= 1")
        .await;
    env.cleanup().await;
}

/// The holders the plugin steers by must include the containers admitted since the last
/// reconciliation: a pod admitted with other devices than planned still looks like a candidate
/// in an old `List`, and its unused plan would go to the next pod (which then misses its own,
/// and so on). Reconciliation is off here (1 h), so only the plugin's own `List` can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_pods_unused_plan_is_not_handed_to_the_next_pod() {
    let env = Env::with(Opts {
        resync: "1h",
        ..Opts::default()
    })
    .await;
    env.pod_with_record("a", &["g3"], 0).await;
    env.pod_with_record("b", &["g2"], 0).await;
    // A two-container pod: its second container's plan stays a candidate after the first one.
    let two = json!({"version": "v1", "node": env.node, "policy": "single-numa-node", "scope": "container",
        "containers": [
            {"name": "c1", "kind": "app", "numaNodes": [0], "devices": {GPU: ["g1"]}},
            {"name": "c2", "kind": "app", "numaNodes": [0], "devices": {GPU: ["g3"]}}]});
    env.create_pod_with("two", Some(two.to_string()), &["c1", "c2"])
        .await;
    // a is admitted on NUMA 1, against the prediction: the kubelet picks g4 itself.
    let (got_a, _) = env.admit("a", "app", GPU, 1, Some(&[1])).await;
    assert_eq!(got_a, ["g4"]);
    env.sync_podresources();
    // b must get its own plan, not a's.
    let (got_b, _) = env.admit("b", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got_b, ["g2"], "a's unused plan was handed to b");
    env.sync_podresources();
    let (got_c1, _) = env.admit("two", "c1", GPU, 1, Some(&[0])).await;
    env.sync_podresources();
    let (got_c2, _) = env.admit("two", "c2", GPU, 1, Some(&[0])).await;
    assert_eq!((got_c1, got_c2), (vec!["g1".to_owned()], vec!["g3".to_owned()]));
    env.cleanup().await;
}

/// The kubelet takes up the pods of a batch one at a time, in creation order, each just before
/// admitting it, so its watch order is not its admission order: a pod created earlier but
/// bound later is admitted first when both arrive in one batch. Of two pods whose plans fit,
/// the one pod-resources lists is the one asking, not the one the plugin's watch saw first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_fitting_plans_the_pod_the_kubelet_lists_is_steered() {
    let env = Env::with(Opts {
        resync: "1h",
        ..Opts::default()
    })
    .await;
    env.pod_with_record("seen-first", &["g1"], 0).await;
    // The plugin's watch has had it for a while when the other pod arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.pod_with_record("admitted-first", &["g3"], 0).await;
    let seen_first = env.key("seen-first");
    env.kubelet_pods.lock().unwrap().remove(&seen_first);
    env.sync_podresources();
    let (got, _) = env.admit("admitted-first", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(
        got,
        ["g3"],
        "the other pod's plan was handed to the pod being admitted"
    );
    env.kubelet_pods.lock().unwrap().insert(seen_first);
    env.sync_podresources();
    let (got, _) = env.admit("seen-first", "app", GPU, 1, Some(&[0])).await;
    assert_eq!(got, ["g1"]);
    env.until("numaplane_exporter_allocator_preferred_allocations_total{resource=example.com/gpu,outcome=honoured} == 2")
        .await;
    env.cleanup().await;
}

/// `/readyz` of `device-plugin` means "registered with the kubelet": not while registration
/// fails (here: no kubelet yet), and ready once every pool is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_registered_with_the_kubelet() {
    let api = ApiTarget::start().await.unwrap();
    let files =
        NodeFiles::new(&json!({"pools": [{"resource": GPU, "devices": [{"id": "g0", "numaNode": 0}]}]}))
            .unwrap();
    let _podres = files
        .podres(AllocatableResourcesResponse::default())
        .await
        .unwrap();
    let args = files.device_plugin_args(
        &unique_name("np-dp-node"),
        api.kubeconfig(),
        &fixture("2numa.xml"),
        &[],
    );
    let mut agent = Agent::spawn_exporter("device-plugin", &args).unwrap();
    agent.wait_serving(WAIT).await.unwrap();
    // No kubelet.sock: every registration fails. Not ready, for as long as that lasts.
    for _ in 0..15 {
        let (code, body) = agent.http_get("/readyz").unwrap();
        assert_eq!(code, 503, "ready without a registration: {body}");
        assert!(body.contains(GPU), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        agent
            .wait_until(
                "numaplane_exporter_allocator_registrations_total{resource=example.com/gpu,outcome=error} >= 1",
                WAIT
            )
            .await
            .is_ok()
    );
    let dp = files.device_kubelet().await.unwrap();
    dp.wait_registered(GPU, 1, WAIT).await.unwrap();
    agent.wait_ready().await;
    assert_metric(
        &agent.metrics().unwrap(),
        "numaplane_exporter_allocator_registered{resource=example.com/gpu} == 1",
    );
}

/// The kubelet's machine fixture `name`.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures")
        .join(name)
}

/// The node's kubelet on `files`: the device-plugin registry, and pod-resources with nothing
/// allocatable and no pods.
async fn kubelet(files: &NodeFiles) -> (FakeDeviceKubelet, FakeKubelet) {
    let dp = files.device_kubelet().await.unwrap();
    let podres = files
        .podres(AllocatableResourcesResponse::default())
        .await
        .unwrap();
    (dp, podres)
}

/// A PCI-matched device that leaves the machine's inventory (hwloc, re-read at every rescan)
/// is listed Unhealthy to the kubelet, so it stops handing it out; it is Healthy again once
/// it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pci_device_gone_from_the_inventory_turns_unhealthy_and_back() {
    let api = ApiTarget::start().await.unwrap();
    // The two NVIDIA GPUs of gpu-nic.xml, 0000:b1:00.0 and 0000:ca:00.0, both on NUMA 1.
    let files = NodeFiles::new(&json!({"pools": [{"resource": GPU, "match": {"vendor": "10de"}}]})).unwrap();
    let fixture = std::fs::read_to_string(fixture("gpu-nic.xml")).unwrap();
    let xml = files.dir.path().join("machine.xml");
    std::fs::write(&xml, &fixture).unwrap();
    let (dp, _podres) = kubelet(&files).await;
    let args = files.device_plugin_args(
        &unique_name("np-dp-node"),
        api.kubeconfig(),
        &xml,
        &["--device-rescan-interval", "100ms"],
    );
    let mut agent = Agent::spawn_exporter("device-plugin", &args).unwrap();
    agent.wait_serving(WAIT).await.unwrap();
    dp.wait_registered(GPU, 1, WAIT).await.unwrap();
    let health = |dp: &FakeDeviceKubelet| -> Vec<(String, String)> {
        dp.devices(GPU).into_iter().map(|d| (d.id, d.health)).collect()
    };
    let wait_health = |want: Vec<(&'static str, &'static str)>| {
        let dp = dp.clone();
        async move {
            let want: Vec<(String, String)> = want
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect();
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let got = health(&dp);
                if got == want {
                    return;
                }
                assert!(tokio::time::Instant::now() < deadline, "{got:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_health(vec![("0000:b1:00.0", "Healthy"), ("0000:ca:00.0", "Healthy")]).await;
    // The GPU at ca:00.0 falls off the bus.
    let gone: String = fixture
        .lines()
        .filter(|l| !l.contains("pci_busid=\"0000:ca:00.0\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(gone, fixture);
    std::fs::write(&xml, &gone).unwrap();
    wait_health(vec![("0000:b1:00.0", "Healthy"), ("0000:ca:00.0", "Unhealthy")]).await;
    // The kubelet no longer hands it out.
    let (got, _) = dp.admit("ns/p", "app", GPU, 1, Some(&[1])).await.unwrap();
    assert_eq!(got, ["0000:b1:00.0"]);
    assert!(dp.admit("ns/q", "app", GPU, 1, Some(&[1])).await.is_err());
    std::fs::write(&xml, &fixture).unwrap();
    wait_health(vec![("0000:b1:00.0", "Healthy"), ("0000:ca:00.0", "Healthy")]).await;
    assert!(agent.exited().is_none(), "{}", agent.stderr());
}

/// pod-resources `List` reports app and sidecar containers but never regular init containers,
/// so a plan made for an init container is checked against the kubelet's device checkpoint
/// (`kubelet_internal_checkpoint` in the device-plugin directory) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_sidecar_container_plans_are_checked_too() {
    let env = Env::new().await;
    let record = json!({"version": "v1", "node": env.node, "policy": "single-numa-node", "scope": "container",
        "containers": [
            {"name": "init", "kind": "init", "numaNodes": [0], "devices": {GPU: ["g1"]}},
            {"name": "side", "kind": "sidecar", "numaNodes": [0], "devices": {GPU: ["g0"]}},
            {"name": "app", "kind": "app", "numaNodes": [0], "devices": {GPU: ["g2"]}}]});
    env.create_pod_with("p", Some(record.to_string()), &["app"]).await;
    let uid = Api::<Pod>::namespaced(env.api.client(), &env.ns)
        .get("p")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    // What the kubelet did: init got g3 (not g1), the sidecar g5 (not g0), the app its plan.
    env.podres.set_pods(vec![PodResources {
        name: "p".into(),
        namespace: env.ns.clone(),
        containers: [("side", "g5"), ("app", "g2")]
            .into_iter()
            .map(|(c, id)| ContainerResources {
                name: c.into(),
                devices: vec![ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: vec![id.into()],
                    topology: Some(TopologyInfo {
                        nodes: vec![NumaNode { id: 0 }],
                    }),
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }]);
    let entries: Vec<_> = [("init", "g3"), ("side", "g5"), ("app", "g2")]
        .into_iter()
        .map(|(c, id)| {
            json!({"PodUID": uid, "ContainerName": c, "ResourceName": GPU,
                "DeviceIDs": {"0": [id]}, "AllocResp": null})
        })
        .collect();
    let checkpoint = numaplane_exporter::checkpoint::seal_device_checkpoint(json!({"Data": {
        "PodDeviceEntries": entries,
        "RegisteredDevices": {GPU: (0..8).map(|i| format!("g{i}")).collect::<Vec<_>>()}}}))
    .unwrap();
    std::fs::write(env.files.plugins.join("kubelet_internal_checkpoint"), checkpoint).unwrap();
    env.until("numaplane_exporter_allocator_mismatches_total{resource=example.com/gpu} == 2")
        .await;
    // One Event per pod and reason (the recorder counts repeats in its series): the first
    // mismatch, in record order, names it.
    let init = "init container init got example.com/gpu g3 but the scheduler planned g1";
    env.mismatch_event(|e| e.note.as_deref().is_some_and(|n| n.contains(init)))
        .await;
    let log = env.agent.stderr();
    assert!(
        log.contains("sidecar container side got example.com/gpu g5 but the scheduler planned g0"),
        "{log}"
    );
    assert!(!log.contains("container app got"), "{log}");
    // Reported once each.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_metric(
        &env.agent.metrics().unwrap(),
        "numaplane_exporter_allocator_mismatches_total{resource=example.com/gpu} == 2",
    );
    env.cleanup().await;
}
