//! `numaplane-scheduler run` end to end against an API server: the HTTP-level fake, or a real
//! cluster when `NUMAPLANE_E2E_KUBECONFIG` is set (the NRT CRD from deploy/crd.yaml must be
//! installed there; the tests create their own labelled namespace and fake Nodes, whose pods
//! tolerate the not-ready taint, and delete them afterwards).
//!
//! Checked: every pod that can fit is bound where the model predicts, with the allocation record
//! on the pod from the moment it is bound; no NUMA zone or device is ever oversubscribed; pods
//! that fit nowhere get `FailedScheduling` and `PodScheduled=False`; and the same holds through
//! API 500s, dropped watches, a scheduler killed mid-run, and two replicas competing for the
//! Lease. Also: an NRT whose fingerprint shows the pods releases the assumptions without
//! double counting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::nrt::NodeResourceTopology;
use numaplane_e2e::{
    fake_api::{FakeApiServer, StoreChange},
    harness::{
        Agent, ApiTarget, eventually, guaranteed_spec, http_post, kubelet::key_of as key, metric_value, nrt,
        scheduler_run_args, unique_name,
    },
};
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
/// The `schedulerName` numaplane serves.
const SCHEDULER: &str = "numaplane-scheduler";
const GPU: &str = "example.com/gpu";
/// CPUs per zone; two zones per node; two GPUs per zone.
const ZONE_CPUS: i64 = 4;

struct Env {
    target: ApiTarget,
    ns: String,
    nodes: Vec<String>,
}

impl Env {
    /// A namespace and `n` nodes, each with two zones of 4 CPUs and 2 GPUs (single-numa-node).
    async fn new(n: usize) -> Env {
        Self::on(ApiTarget::start().await.unwrap(), n).await
    }

    /// [`Self::new`] on the HTTP-level fake, for the faults only it can inject.
    async fn new_fake(n: usize) -> Env {
        Self::on(ApiTarget::start_fake(true).await.unwrap(), n).await
    }

    /// The fake API server of a [`Self::new_fake`] environment.
    fn fake(&self) -> &FakeApiServer {
        self.target.fake().expect("started on the HTTP-level fake")
    }

    async fn on(target: ApiTarget, n: usize) -> Env {
        let ns = unique_name("np-sched");
        let prefix = unique_name("np-node");
        target.create_namespace(&ns).await.unwrap();
        let env = Env {
            target,
            ns,
            nodes: (0..n).map(|i| format!("{prefix}-{i}")).collect(),
        };
        for name in &env.nodes {
            env.create_node(name).await;
            env.publish_nrt(name, &[ZONE_CPUS; 2], &[&[], &[]], &[]).await;
        }
        env
    }

    async fn create_node(&self, name: &str) {
        let allocatable = json!({"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4"});
        self.target
            .create_labelled_node(name, &[], Some(allocatable))
            .await
            .unwrap();
    }

    /// Publishes the node's NRT: free CPUs per zone, GPUs taken per zone (of `g<zone><0|1>`),
    /// and the pods the kubelet reports (for the fingerprint).
    async fn publish_nrt(&self, node: &str, cpus: &[i64; 2], taken: &[&[&str]; 2], pods: &[String]) {
        let zone = |z: usize| {
            let free: Vec<String> = (0..2)
                .map(|d| format!("g{z}{d}"))
                .filter(|id| !taken[z].contains(&id.as_str()))
                .collect();
            let mut zone = nrt::zone(
                z,
                vec![
                    nrt::resource("cpu", "4", &cpus[z].to_string()),
                    nrt::resource("memory", "16Gi", "16Gi"),
                    nrt::resource(GPU, "2", &free.len().to_string()),
                ],
            );
            zone["attributes"] =
                json!([{"name": format!("numaplane.io/free-devices.{GPU}"), "value": free.join(",")}]);
            zone
        };
        nrt::publish(self.target.client(), node, pods, vec![zone(0), zone(1)])
            .await
            .unwrap();
    }

    /// Creates pending pods `name-<i>` (Guaranteed: `cpu` CPUs, 1Gi, `gpus` GPUs).
    async fn create_pods(&self, name: &str, count: usize, cpu: u32, gpus: u32) {
        self.create_pods_for(name, count, cpu, gpus, SCHEDULER).await;
    }

    /// [`Self::create_pods`] with another `schedulerName`.
    async fn create_pods_for(&self, name: &str, count: usize, cpu: u32, gpus: u32, scheduler: &str) {
        let limits = json!({"cpu": cpu.to_string(), "memory": "1Gi", GPU: gpus.to_string()});
        for i in 0..count {
            self.create_pod(&format!("{name}-{i}"), scheduler, &limits, json!({}))
                .await;
        }
    }

    /// Creates the pending pod `name` for `scheduler` (a test object tolerating every taint)
    /// whose one container `app` is Guaranteed with `limits`; `spec` is merged into its spec.
    async fn create_pod(
        &self,
        name: &str,
        scheduler: &str,
        limits: &serde_json::Value,
        spec: serde_json::Value,
    ) {
        let mut pod = json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
            "spec": guaranteed_spec(scheduler, limits),
        });
        for (k, v) in spec.as_object().into_iter().flatten() {
            pod["spec"][k] = v.clone();
        }
        let pod: Pod = serde_json::from_value(pod).unwrap();
        Api::<Pod>::namespaced(self.target.client(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// Creates the pod `gated` ([`Self::create_pod`]) held by the scheduling gate `gate`;
    /// returns the namespace's pods.
    async fn create_gated(&self, gate: &str, limits: serde_json::Value) -> Api<Pod> {
        let spec = json!({"schedulingGates": [{"name": gate}]});
        self.create_pod("gated", SCHEDULER, &limits, spec).await;
        Api::namespaced(self.target.client(), &self.ns)
    }

    /// Removes the scheduling gates of the pod `gated`.
    async fn ungate(&self) {
        Api::<Pod>::namespaced(self.target.client(), &self.ns)
            .patch(
                "gated",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
            )
            .await
            .unwrap();
    }

    async fn pods(&self) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.target.client(), &self.ns);
        pods.list(&ListParams::default()).await.unwrap().items
    }

    async fn bound(&self) -> Vec<Pod> {
        self.pods()
            .await
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .collect()
    }

    async fn wait_bound(&self, n: usize, sched: &Agent) -> Vec<Pod> {
        sched
            .eventually(Duration::from_millis(50), || async move {
                let bound = self.bound().await;
                match bound.len() {
                    b if b >= n => Ok(bound),
                    b => Err(format!("{b} of {n} pods bound")),
                }
            })
            .await
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a = scheduler_run_args(self.target.kubeconfig());
        if extra.iter().any(|e| e.starts_with("--leader-elect")) {
            a.retain(|x| x != "--leader-elect=false");
        }
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a
    }

    async fn start(&self, extra: &[&str]) -> Agent {
        self.start_as("run", extra).await
    }

    /// Starts `numaplane-scheduler <subcommand>` with [`Self::args`]; waits until it serves.
    async fn start_as(&self, subcommand: &str, extra: &[&str]) -> Agent {
        let mut s = Agent::spawn_scheduler(subcommand, &self.args(extra)).unwrap();
        s.set_wait(WAIT);
        s.wait_serving(WAIT).await.unwrap();
        s
    }

    /// Deletes what the test created (a real cluster keeps it otherwise).
    async fn cleanup(&self) {
        self.target.delete_test_objects(&self.ns, &self.nodes).await;
    }
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn record(p: &Pod) -> Allocation {
    let a = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .unwrap_or_else(|| panic!("{} is bound without {ANNOTATION}", key(p)));
    Allocation::parse(a).unwrap()
}

/// Asserts no zone holds more CPUs than it has and no GPU is given twice or outside its zone,
/// from the records of every bound pod. Bindings only add, so the final state bounds every
/// earlier one.
fn assert_not_oversubscribed(bound: &[Pod]) {
    let mut cpu: BTreeMap<(String, u32), i64> = BTreeMap::new();
    let mut gpus: BTreeSet<(String, String)> = BTreeSet::new();
    for p in bound {
        let a = record(p);
        assert_eq!(a.node, node_of(p), "record names the bound node");
        for c in &a.containers {
            let zones = c.numa_nodes.clone().expect("single-numa-node gives an affinity");
            assert_eq!(zones.len(), 1, "{}: {zones:?}", key(p));
            let spec = p.spec.as_ref().unwrap();
            let req = spec.containers[0]
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap();
            let n: i64 = req["cpu"].0.parse().unwrap();
            *cpu.entry((node_of(p), zones[0])).or_default() += n;
            for id in c.devices.get(GPU).into_iter().flatten() {
                assert!(
                    id.starts_with(&format!("g{}", zones[0])),
                    "{id} outside zone {}",
                    zones[0]
                );
                assert!(
                    gpus.insert((node_of(p), id.clone())),
                    "{id} on {} given twice",
                    node_of(p)
                );
            }
        }
    }
    for ((node, zone), n) in cpu {
        assert!(n <= ZONE_CPUS, "{node} zone {zone}: {n} CPUs > {ZONE_CPUS}");
    }
}

/// The placements the model predicts, deciding the pods in the queue's order (priority, then
/// creation time, then name) against the nodes and NRTs as the API serves them.
async fn predicted(env: &Env) -> BTreeMap<String, Option<String>> {
    let client = env.target.client();
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let nrts: Vec<NodeResourceTopology> = Api::<NodeResourceTopology>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut cluster = Cluster::new();
    for n in nodes
        .iter()
        .filter(|n| env.nodes.contains(n.metadata.name.as_ref().unwrap()))
    {
        cluster.apply_node(n).unwrap();
    }
    for t in nrts
        .iter()
        .filter(|t| env.nodes.contains(t.metadata.name.as_ref().unwrap()))
    {
        cluster.apply_nrt(t).unwrap();
    }
    let mut pods = env.pods().await;
    pods.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)),
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond()),
            key(p),
        )
    });
    let cfg = Config::default();
    let mut out = BTreeMap::new();
    for p in pods {
        let mut unbound = p.clone();
        if let Some(s) = unbound.spec.as_mut() {
            s.node_name = None;
        }
        let spec = PodSpec::from_pod(&mut cluster.res, &unbound).unwrap();
        let d = cluster.decide(&cfg, &spec);
        cluster.assume(&spec, &d);
        out.insert(key(&p), d.node);
    }
    out
}

/// Records every pod event in the namespace; returns the pods seen bound without the record.
fn watch_for_unrecorded_bindings(env: &Env) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let bad = Arc::new(Mutex::new(Vec::new()));
    let api: Api<Pod> = Api::namespaced(env.target.client(), &env.ns);
    let sink = bad.clone();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        while let Some(ev) = s.next().await {
            if let Ok(p) = ev
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                && !p
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(ANNOTATION))
            {
                sink.lock().unwrap().push(key(&p));
            }
        }
    });
    (bad, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_every_pod_that_fits_where_the_model_predicts() {
    let env = Env::new(5).await;
    // 5 nodes hold 20 such pods (4 GPUs each); 4 more cannot fit.
    env.create_pods("gpu", 24, 2, 1).await;
    let expected = predicted(&env).await;
    assert_eq!(expected.values().filter(|n| n.is_some()).count(), 20);
    let (unrecorded, watch) = watch_for_unrecorded_bindings(&env);
    let sched = env.start(&[]).await;
    let bound = env.wait_bound(20, &sched).await;
    for p in &bound {
        assert_eq!(
            Some(node_of(p)),
            expected[&key(p)],
            "{} placed off the model",
            key(p)
        );
    }
    assert_not_oversubscribed(&bound);
    // The 4 that fit nowhere are reported as kube-scheduler does.
    let unschedulable = sched
        .until("numaplane_scheduler_schedule_attempts_total{result=unschedulable} >= 4")
        .await;
    assert!(unschedulable >= 4.0);
    let env = &env;
    let conditions = sched
        .eventually(Duration::from_millis(100), || async move {
            let conditions: Vec<String> = env
                .pods()
                .await
                .iter()
                .filter(|p| node_of(p).is_empty())
                .filter_map(|p| {
                    p.status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                        .and_then(|c| {
                            (c.reason.as_deref() == Some("Unschedulable"))
                                .then(|| c.message.clone().unwrap_or_default())
                        })
                })
                .collect();
            match conditions.len() {
                4 => Ok(conditions),
                _ => Err(format!("conditions: {conditions:?}")),
            }
        })
        .await;
    assert!(
        conditions
            .iter()
            .all(|m| m.starts_with("0/5 nodes are available: ")),
        "{conditions:?}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.target.client(), &env.ns);
    let events = &events;
    let e = eventually(WAIT, Duration::from_millis(100), || async move {
        let evs = events.list(&ListParams::default()).await.unwrap().items;
        let of = |reason: &str| evs.iter().filter(|e| e.reason.as_deref() == Some(reason)).count();
        let (failed, scheduled) = (of("FailedScheduling"), of("Scheduled"));
        if failed >= 4 && scheduled >= 20 {
            Ok(evs
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
                .unwrap())
        } else {
            Err(format!("events: {failed} failed, {scheduled} scheduled"))
        }
    })
    .await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_controller.as_deref(), Some("numaplane-scheduler"));
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .contains("nodes are available")
    );
    assert!(
        unrecorded.lock().unwrap().is_empty(),
        "bound without record: {:?}",
        unrecorded.lock().unwrap()
    );
    watch.abort();
    if let Some(fake) = env.target.fake() {
        // One write per bound pod on the binding path; no PATCH of the pod itself.
        let reqs = fake.requests();
        let bindings = reqs
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/binding"))
            .count();
        assert_eq!(bindings, 20);
        let pod_patches = reqs
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/pods/") && !r.path.ends_with("/status"))
            .count();
        assert_eq!(pod_patches, 0, "the record rides on the Binding");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nrt_showing_the_pods_releases_assumptions_without_double_counting() {
    let env = Env::new(1).await;
    env.create_pods("a", 2, 2, 1).await;
    let sched = env.start(&[]).await;
    let bound = env.wait_bound(2, &sched).await;
    sched.until("numaplane_scheduler_assumed_pods == 2").await;
    // The kubelet admitted both: the exporter publishes what they hold and their names.
    let mut cpus = [ZONE_CPUS; 2];
    let mut taken: [Vec<String>; 2] = Default::default();
    for p in &bound {
        for c in record(p).containers {
            let z = c.numa_nodes.unwrap()[0] as usize;
            cpus[z] -= 2;
            taken[z].extend(c.devices[GPU].clone());
        }
    }
    let t0: Vec<&str> = taken[0].iter().map(String::as_str).collect();
    let t1: Vec<&str> = taken[1].iter().map(String::as_str).collect();
    let names: Vec<String> = bound.iter().map(key).collect();
    env.publish_nrt(&env.nodes[0], &cpus, &[&t0, &t1], &names).await;
    sched.until("numaplane_scheduler_assumed_pods == 0").await;
    sched
        .until("numaplane_scheduler_assumptions_ended_total{reason=confirmed} == 2")
        .await;
    // Counted once: exactly two more such pods fit on the node.
    env.create_pods("b", 3, 2, 1).await;
    let bound = env.wait_bound(4, &sched).await;
    assert_not_oversubscribed(&bound);
    sched
        .until("numaplane_scheduler_schedule_attempts_total{result=unschedulable} >= 1")
        .await;
    assert_eq!(env.bound().await.len(), 4);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_and_dropped_watches_lose_nothing_and_double_book_nothing() {
    let env = Env::new_fake(4).await;
    env.create_pods("gpu", 20, 2, 1).await;
    // The first bindings fail with 500s and the watches drop while the scheduler works.
    env.fake()
        .fail_next("POST", &format!("/api/v1/namespaces/{}/pods/", env.ns), 500, 6);
    let sched = env.start(&[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.fake().close_watches();
    let bound = env.wait_bound(16, &sched).await;
    assert_eq!(bound.len(), 16);
    assert_not_oversubscribed(&bound);
    sched
        .until("numaplane_scheduler_binding_errors_total{reason=server_error} >= 1")
        .await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_mid_run_restarts_without_double_booking() {
    let env = Env::new(4).await;
    env.create_pods("gpu", 8, 2, 1).await;
    let mut first = env.start(&[]).await;
    env.wait_bound(8, &first).await;
    first.kill();
    // The kubelets started the bound pods, but the NRTs never show them (no exporter here):
    // only the records on the pods tell the new process what the zones and GPUs hold,
    // Running or not.
    for p in env.bound().await {
        env.target
            .set_pod_phase(&env.ns, p.metadata.name.as_deref().unwrap(), "Running")
            .await
            .unwrap();
    }
    // More pods than the nodes have room for are waiting when the new process starts.
    env.create_pods("more", 12, 2, 1).await;
    let second = env.start(&[]).await;
    env.wait_bound(16, &second).await;
    second
        .until("numaplane_scheduler_schedule_attempts_total{result=unschedulable} >= 4")
        .await;
    let bound = env.bound().await;
    assert_eq!(bound.len(), 16);
    assert_not_oversubscribed(&bound);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_and_a_takeover() {
    let env = Env::new(4).await;
    let lease = unique_name("np-lease");
    let le = [
        "--leader-elect=true",
        "--leader-elect-resource-name",
        lease.as_str(),
        "--leader-elect-resource-namespace",
        env.ns.as_str(),
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-before",
        "2s",
    ];
    let mut a_args = le.to_vec();
    a_args.extend(["--leader-elect-identity", "replica-a"]);
    let mut b_args = le.to_vec();
    b_args.extend(["--leader-elect-identity", "replica-b"]);
    let mut a = env.start(&a_args).await;
    let mut b = env.start(&b_args).await;
    env.create_pods("first", 8, 2, 1).await;
    let bound = env.wait_bound(8, &a).await;
    assert_not_oversubscribed(&bound);
    let leader_of = |s: &Agent| {
        metric_value(
            &s.metrics().unwrap_or_default(),
            "numaplane_scheduler_leader",
            &[],
        )
    };
    let (la, lb) = (leader_of(&a), leader_of(&b));
    assert_eq!(
        [la, lb].iter().filter(|v| **v == Some(1.0)).count(),
        1,
        "exactly one leader: a={la:?} b={lb:?}"
    );
    // Kill the leader: the other takes over within the lease duration and schedules the rest.
    let (leader, follower) = if la == Some(1.0) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    leader.kill();
    let killed = Instant::now();
    env.create_pods("second", 8, 2, 1).await;
    follower.until("numaplane_scheduler_leader == 1").await;
    assert!(
        killed.elapsed() < Duration::from_secs(4 + 2 + 5),
        "takeover took {:?}",
        killed.elapsed()
    );
    let bound = env.wait_bound(16, follower).await;
    assert_not_oversubscribed(&bound);
    env.cleanup().await;
}

/// The Binding requests of pod `name` the fake answered, with the UID each was pinned to.
fn bindings_of(fake: &FakeApiServer, ns: &str, name: &str) -> Vec<(u16, String)> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}/binding");
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == path)
        .map(|r| {
            let uid = r
                .body_json()
                .and_then(|b| b["metadata"]["uid"].as_str().map(str::to_owned));
            (r.status, uid.unwrap_or_default())
        })
        .collect()
}

/// The two 409s a Binding meets when another client writes first, as the real API server
/// answers them (the fake makes the write just before the Binding arrives): the pod bound by
/// someone else ("already assigned": the pod is dropped, and the zones its record names are
/// held) and the pod deleted and recreated under its name (UID precondition: the stale
/// decision is dropped and the new pod is placed as a new pod). Nothing is lost, nothing is
/// double-booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_conflicts_drop_the_stale_placement_and_lose_no_pod() {
    let env = Env::new_fake(1).await;
    // The races are made by the fake.
    let fake = env.fake();
    let node = env.nodes[0].clone();
    // Room for more at node level than the zones hold: only the zones' accounting keeps the
    // fifth pod off.
    Api::<Node>::all(env.target.client())
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "8"}}}),
            ),
        )
        .await
        .unwrap();
    // Decided first (same creation second: by name).
    env.create_pods("a-taken", 1, 2, 1).await;
    env.create_pods("b-recreated", 1, 2, 1).await;
    env.create_pods("c-gpu", 4, 2, 1).await;
    let stored = |name: &str| fake.get("v1", "Pod", Some(&env.ns), name).unwrap();
    // a-taken-0 gets bound first by someone else, with a record: zone 0 and g00, where we
    // would put it too (as an earlier Binding of ours that timed out but landed would).
    let mut taken = stored("a-taken-0");
    let theirs = Allocation {
        version: "v1".into(),
        node: node.clone(),
        policy: "single-numa-node".into(),
        scope: "container".into(),
        pod_numa_nodes: None,
        containers: vec![numaplane::allocation::ContainerAllocation {
            name: "app".into(),
            kind: numaplane::allocation::ContainerKind::App,
            numa_nodes: Some(vec![0]),
            devices: [(GPU.to_owned(), vec!["g00".to_owned()])].into(),
            device_counts: Default::default(),
        }],
        nrt_fingerprint: None,
    };
    taken["spec"]["nodeName"] = json!(node);
    taken["metadata"]["annotations"] = json!({ANNOTATION: theirs.to_annotation().unwrap()});
    let pods_path = format!("/api/v1/namespaces/{}/pods", env.ns);
    // Its 409 comes after the pod watch has shown it bound (the order that used to free
    // its zone).
    fake.change_then_answer_after(
        "POST",
        &format!("{pods_path}/a-taken-0/binding"),
        vec![StoreChange::Put(taken)],
        Duration::from_millis(500),
    );
    // b-recreated-0 is deleted and created again under its name.
    let old = stored("b-recreated-0");
    let old_uid = old["metadata"]["uid"].as_str().unwrap().to_owned();
    let mut again = old.clone();
    again["metadata"].as_object_mut().unwrap().remove("uid");
    fake.change_before_next(
        "POST",
        &format!("{pods_path}/b-recreated-0/binding"),
        vec![
            StoreChange::Delete {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some(env.ns.clone()),
                name: "b-recreated-0".into(),
            },
            StoreChange::Put(again),
        ],
    );
    let sched = env.start(&[]).await;
    for reason in ["already_bound", "pod_replaced"] {
        sched
            .until(&format!(
                "numaplane_scheduler_binding_errors_total{{reason={reason}}} == 1"
            ))
            .await;
    }
    // The zones hold four such pods: a-taken-0 (theirs) and three of the five others. The
    // others are retried after their backoff (1 s, then 2 s): give them the time.
    env.wait_bound(4, &sched).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let bound = env.bound().await;
    assert_eq!(
        bound.len(),
        4,
        "{:?}\n{}",
        bound.iter().map(key).collect::<Vec<_>>(),
        sched.stderr()
    );
    assert_not_oversubscribed(&bound);
    let taken = bound
        .iter()
        .find(|p| key(p).ends_with("/a-taken-0"))
        .expect("a-taken-0 bound");
    assert_eq!(record(taken), theirs, "their Binding stands");
    // a-taken-0: one Binding, refused; never tried again.
    let tries = bindings_of(fake, &env.ns, "a-taken-0");
    assert_eq!(tries.iter().map(|t| t.0).collect::<Vec<_>>(), [409], "{tries:?}");
    // b-recreated-0: the stale decision was refused once and never sent again; the new pod is
    // a pod like any other (bound, or waiting if it did not fit).
    let tries = bindings_of(fake, &env.ns, "b-recreated-0");
    assert_eq!(tries.first(), Some(&(409, old_uid.clone())), "{tries:?}");
    assert!(
        tries[1..].iter().all(|(_, uid)| *uid != old_uid),
        "the stale decision was sent again: {tries:?}"
    );
    let now = stored("b-recreated-0");
    assert_ne!(now["metadata"]["uid"].as_str(), Some(old_uid.as_str()));
    env.cleanup().await;
}

/// Two pods decided for one node whose kubelet pins them on different NUMA nodes only because
/// of which it admits first reach the server in the order they were decided: the second
/// Binding is sent once the first is answered, even when that answer is slow. (Sent side by
/// side, the second would land first, and the kubelet would pin it where the first was
/// predicted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_of_pinned_pods_to_one_node_keep_the_decided_order() {
    let env = Env::new_fake(1).await;
    let fake = env.fake();
    // 3 of a zone's 4 CPUs each: the first admitted takes NUMA node 0, the second NUMA node 1.
    env.create_pods("a-first", 1, 3, 0).await;
    env.create_pods("b-second", 1, 3, 0).await;
    let pods_path = format!("/api/v1/namespaces/{}/pods", env.ns);
    fake.change_then_answer_after(
        "POST",
        &format!("{pods_path}/a-first-0/binding"),
        Vec::new(),
        Duration::from_millis(800),
    );
    let sched = env.start(&[]).await;
    let bound = env.wait_bound(2, &sched).await;
    let numa = |name: &str| {
        let p = bound.iter().find(|p| key(p).ends_with(name)).expect("bound");
        record(p).containers[0].numa_nodes.clone()
    };
    assert_eq!(numa("/a-first-0"), Some(vec![0]));
    assert_eq!(numa("/b-second-0"), Some(vec![1]));
    let order: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/binding"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        order,
        [
            format!("{pods_path}/a-first-0/binding"),
            format!("{pods_path}/b-second-0/binding")
        ],
        "{}",
        sched.stderr()
    );
    env.cleanup().await;
}

/// Pods with scheduling gates are not decided: no Binding is sent for them (the API server
/// would answer 409) until the gates are removed; then they are placed as any pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_pods_wait_for_their_gates_to_be_removed() {
    let env = Env::new(1).await;
    env.create_gated("example.com/wait", json!({"cpu": "2", "memory": "1Gi", GPU: "1"}))
        .await;
    env.create_pods("free", 1, 2, 1).await;
    let sched = env.start(&[]).await;
    env.wait_bound(1, &sched).await;
    // Long enough for a few attempts and their backoff, were it tried.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.bound().await.len(), 1);
    if let Some(fake) = env.target.fake() {
        assert_eq!(bindings_of(fake, &env.ns, "gated"), [], "a gated pod was bound");
    }
    env.ungate().await;
    let bound = env.wait_bound(2, &sched).await;
    assert_not_oversubscribed(&bound);
    env.cleanup().await;
}

/// A pod that fits nowhere waits out its backoff: its own `PodScheduled` condition (and the
/// `FailedScheduling` event) coming back as a pod update is not a change that may let it fit,
/// so it does not make the pod active again (as kube-scheduler's queueing hints skip it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_status_writes_do_not_cut_an_unschedulable_pods_backoff() {
    let env = Env::new(1).await;
    // 5 CPUs: more than a zone holds under single-numa-node.
    env.create_pods("big", 1, 5, 0).await;
    let sched = env
        .start(&["--pod-initial-backoff", "4s", "--pod-max-backoff", "60s"])
        .await;
    let attempts = || {
        metric_value(
            &sched.metrics().unwrap_or_default(),
            "numaplane_scheduler_schedule_attempts_total",
            &[("result", "unschedulable")],
        )
        .unwrap_or(0.0)
    };
    sched
        .until("numaplane_scheduler_schedule_attempts_total{result=unschedulable} >= 1")
        .await;
    let first = Instant::now();
    // The condition the scheduler wrote is on the pod (so its update has been watched).
    let env = &env;
    sched
        .eventually(Duration::from_millis(50), || async move {
            match pod_scheduled(&env.pods().await[0]) {
                Some(c) if c.status == "False" => Ok(()),
                _ => Err("no PodScheduled condition".to_owned()),
            }
        })
        .await;
    // Well inside the 4 s backoff, the pod was tried once.
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(first.elapsed())).await;
    assert_eq!(attempts(), 1.0, "retried before its backoff\n{}", sched.stderr());
    // After the backoff it is tried again.
    sched
        .until("numaplane_scheduler_schedule_attempts_total{result=unschedulable} >= 2")
        .await;
    assert!(
        first.elapsed() >= Duration::from_millis(3500),
        "{:?}",
        first.elapsed()
    );
    env.cleanup().await;
}

/// A failed event and a failed status patch are counted each under its own name, not as a
/// failed Binding (and not at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_event_and_status_writes_are_counted_as_what_they_are() {
    let env = Env::new_fake(1).await;
    env.create_pods("big", 1, 5, 0).await;
    env.fake().fail_next(
        "POST",
        &format!("/apis/events.k8s.io/v1/namespaces/{}/events", env.ns),
        500,
        1,
    );
    env.fake().fail_next(
        "PATCH",
        &format!("/api/v1/namespaces/{}/pods/big-0/status", env.ns),
        500,
        1,
    );
    let sched = env.start(&[]).await;
    for name in [
        "numaplane_scheduler_event_write_errors_total",
        "numaplane_scheduler_status_patch_errors_total",
    ] {
        sched.wait_metric(name, &[], WAIT, |v| v == 1.0).await.unwrap();
    }
    let text = sched.metrics().unwrap();
    assert!(
        !text.contains("numaplane_scheduler_binding_errors_total{"),
        "no Binding failed:\n{text}"
    );
    env.cleanup().await;
}

/// `nodes{state="stale"}` counts the nodes whose NRT has not changed for half the assume
/// timeout since a pod was bound there (or left): a pod bound by another scheduler, which
/// numaplane holds no assumption for, makes its node stale until the NRT changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nrt_lags_its_pods_is_stale_until_the_nrt_changes() {
    let env = Env::new(2).await;
    // Threshold: half of 4 s.
    let sched = env.start(&["--assume-timeout", "4s"]).await;
    let nodes = |state: &'static str| {
        metric_value(
            &sched.metrics().unwrap_or_default(),
            "numaplane_scheduler_nodes",
            &[("state", state)],
        )
    };
    sched.until("numaplane_scheduler_nodes{state=valid} == 2").await;
    let bound_at = Instant::now();
    env.target
        .create_pod(&env.ns, "elsewhere", &env.nodes[0], "Running")
        .await
        .unwrap();
    sched.until("numaplane_scheduler_nodes{state=stale} == 1").await;
    assert!(
        bound_at.elapsed() >= Duration::from_secs(2),
        "{:?}",
        bound_at.elapsed()
    );
    assert_eq!(nodes("valid"), Some(1.0));
    // The exporter publishes what the pod changed: fresh again.
    env.publish_nrt(&env.nodes[0], &[ZONE_CPUS - 1, ZONE_CPUS], &[&[], &[]], &[])
        .await;
    sched.until("numaplane_scheduler_nodes{state=valid} == 2").await;
    assert_eq!(nodes("stale"), Some(0.0));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_exits_64_with_one_line() {
    for args in [
        vec!["run", "--kube-api-qps", "-1"],
        vec!["run", "--pod-initial-backoff", "10s", "--pod-max-backoff", "1s"],
        vec!["run", "--bind-concurrency", "0"],
        vec!["run", "--event-qps", "0"],
        vec!["run", "--event-burst", "0"],
        vec!["run", "--no-such-flag"],
    ] {
        let out = std::process::Command::new(numaplane_e2e::binaries::scheduler())
            .args(&args)
            .env_remove("NUMAPLANE_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cfg.yaml");
    std::fs::write(&file, "kubeApiQps: 10\nnoSuchField: 1\n").unwrap();
    let out = std::process::Command::new(numaplane_e2e::binaries::scheduler())
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("noSuchField"), "{stderr}");
}

/// POSTs `body` to the extender as kube-scheduler does: (status, body as JSON or as a string).
async fn post(ext: &Agent, path: &'static str, body: String) -> (u16, serde_json::Value) {
    let addr = ext.addr();
    let (status, text) = tokio::task::spawn_blocking(move || http_post(addr, path, &body))
        .await
        .unwrap()
        .unwrap();
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}

/// POSTs the extender arguments `pod` and `nodes` (`nodeCacheCapable: true`) to `path`.
async fn post_pod(
    ext: &Agent,
    path: &'static str,
    pod: &serde_json::Value,
    nodes: &[&str],
) -> (u16, serde_json::Value) {
    post(ext, path, json!({"Pod": pod, "NodeNames": nodes}).to_string()).await
}

async fn pod_json(env: &Env, name: &str) -> serde_json::Value {
    let pods: Api<Pod> = Api::namespaced(env.target.client(), &env.ns);
    serde_json::to_value(pods.get(name).await.unwrap()).unwrap()
}

fn bind_args(env: &Env, pod: &serde_json::Value, node: &str) -> String {
    json!({
        "PodName": pod["metadata"]["name"], "PodNamespace": env.ns,
        "PodUID": pod["metadata"]["uid"], "Node": node
    })
    .to_string()
}

/// kube-scheduler's side of the extender protocol, played by the test: `filter` in both request
/// shapes, `prioritize`, then `bind`. A bind's placement is seen by the next filter before any
/// NRT shows it; a bind onto a node that can no longer admit the pod is refused; a pod no filter
/// brought is fetched; bad requests get the protocol's error replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_filters_prioritizes_and_binds_with_the_record() {
    // A scheduler name nobody serves: on a real cluster the pods stay pending for the test.
    const UNSERVED: &str = "numaplane-e2e-unserved";
    let env = Env::new(2).await;
    let (n0, n1) = (env.nodes[0].clone(), env.nodes[1].clone());
    env.create_pods_for("ext", 5, 3, 1, UNSERVED).await;
    let ext = env.start_as("extender", &[]).await;
    ext.wait_ready().await;

    // filter, NodeNames shape (nodeCacheCapable: true).
    let pod0 = pod_json(&env, "ext-0").await;
    let (status, reply) = post_pod(&ext, "/filter", &pod0, &[&n0, &n1]).await;
    assert_eq!(status, 200);
    assert_eq!(reply["NodeNames"], json!([n0, n1]), "{reply}");
    assert_eq!(reply["FailedNodes"], json!({}));
    assert_eq!(reply["Error"], "");
    assert!(reply["Nodes"].is_null());

    // filter, Nodes shape: the passing Node objects come back as sent.
    let nodes: Vec<serde_json::Value> = futures::future::join_all(env.nodes.iter().map(|n| async {
        let api: Api<Node> = Api::all(env.target.client());
        serde_json::to_value(api.get(n).await.unwrap()).unwrap()
    }))
    .await;
    let (_, reply) = post(
        &ext,
        "/filter",
        json!({"Pod": pod0, "Nodes": {"metadata": {}, "items": nodes}}).to_string(),
    )
    .await;
    assert_eq!(reply["Nodes"]["items"], json!(nodes), "{reply}");
    assert!(reply["NodeNames"].is_null());

    // prioritize: one 0..=10 score per candidate, in order.
    let (status, reply) = post_pod(&ext, "/prioritize", &pod0, &[&n0, &n1]).await;
    assert_eq!(status, 200);
    let hosts: Vec<&str> = reply
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["Host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, [n0.as_str(), n1.as_str()]);
    assert!(
        reply
            .as_array()
            .unwrap()
            .iter()
            .all(|h| (0..=10).contains(&h["Score"].as_i64().unwrap()))
    );

    // bind ext-0 and ext-1 to n0: one 3-CPU pod per 4-CPU zone.
    for name in ["ext-0", "ext-1"] {
        let pod = pod_json(&env, name).await;
        let (_, reply) = post_pod(&ext, "/filter", &pod, &[&n0]).await;
        assert_eq!(reply["NodeNames"], json!([n0]), "{name}: {reply}");
        let (status, reply) = post(&ext, "/bind", bind_args(&env, &pod, &n0)).await;
        assert_eq!((status, &reply), (200, &json!({"Error": ""})), "{name}");
        let bound = pod_json(&env, name).await;
        assert_eq!(bound["spec"]["nodeName"], n0.as_str());
        let p: Pod = serde_json::from_value(bound).unwrap();
        assert_eq!(record(&p).node, n0);
    }

    // ext-2: n0 is full by the assumptions alone (its NRT still shows every zone free).
    let pod2 = pod_json(&env, "ext-2").await;
    let (_, reply) = post_pod(&ext, "/filter", &pod2, &[&n0, &n1]).await;
    assert_eq!(reply["NodeNames"], json!([n1]), "{reply}");
    let why = reply["FailedNodes"][&n0].as_str().unwrap();
    assert!(why.contains("cpu"), "{why}");
    // A racing kube-scheduler binds it to n0 anyway: refused, not bound.
    let (_, reply) = post(&ext, "/bind", bind_args(&env, &pod2, &n0)).await;
    let err = reply["Error"].as_str().unwrap();
    assert!(err.contains("can no longer admit"), "{err}");
    assert!(pod_json(&env, "ext-2").await["spec"]["nodeName"].is_null());

    // ext-3 was never filtered here (another replica answered): fetched, bound with the record.
    let pod3 = pod_json(&env, "ext-3").await;
    let (_, reply) = post(&ext, "/bind", bind_args(&env, &pod3, &n1)).await;
    assert_eq!(reply, json!({"Error": ""}));
    let p3: Pod = serde_json::from_value(pod_json(&env, "ext-3").await).unwrap();
    assert_eq!(record(&p3).node, n1);

    // A bind for a recreated pod (other UID) is refused.
    let mut pod4 = pod_json(&env, "ext-4").await;
    pod4["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000000");
    let (_, reply) = post(&ext, "/bind", bind_args(&env, &pod4, &n1)).await;
    let err = reply["Error"].as_str().unwrap();
    assert!(err.contains("UID"), "{err}");
    assert!(pod_json(&env, "ext-4").await["spec"]["nodeName"].is_null());

    // Bad requests: the protocol's error replies, never a dropped connection.
    let (status, reply) = post(&ext, "/filter", "{".to_owned()).await;
    assert_eq!(status, 200);
    assert!(!reply["Error"].as_str().unwrap().is_empty());
    let (status, _) = post(&ext, "/prioritize", "{".to_owned()).await;
    assert_eq!(status, 400);
    let (status, reply) = post(&ext, "/bind", json!({"PodName": "", "Node": n0}).to_string()).await;
    assert_eq!(status, 200);
    assert!(reply["Error"].as_str().unwrap().contains("PodName"), "{reply}");
    let (status, reply) = post(&ext, "/filter", json!({"NodeNames": [n0]}).to_string()).await;
    assert_eq!(status, 200);
    assert!(reply["Error"].as_str().unwrap().contains("no Pod"), "{reply}");
    // A preemption request without a Pod cannot be answered (kube-scheduler then keeps its
    // own candidates for an ignorable extender); an unknown verb is not served.
    let (status, _) = post(&ext, "/preempt", "{}".to_owned()).await;
    assert_eq!(status, 500);
    let (status, _) = post(&ext, "/preempt", "{".to_owned()).await;
    assert_eq!(status, 400);
    let (status, _) = post(&ext, "/unknown-verb", "{}".to_owned()).await;
    assert_eq!(status, 404);

    let text = ext.metrics().unwrap();
    let calls = |verb, result| {
        metric_value(
            &text,
            "numaplane_scheduler_extender_requests_total",
            &[("verb", verb), ("result", result)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(calls("bind", "ok"), 3.0, "{text}");
    assert!(calls("bind", "error") >= 3.0, "{text}");
    assert!(calls("filter", "ok") >= 5.0, "{text}");
    assert!(calls("filter", "error") >= 2.0, "{text}");
    assert_not_oversubscribed(&env.bound().await);
    env.cleanup().await;
}

/// The pod's `PodScheduled` condition, if it has one.
fn pod_scheduled(p: &Pod) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled").cloned())
}

/// Events of `reason` about the pod `name` (events.k8s.io/v1).
async fn events_about(env: &Env, name: &str, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    env.target.events_about(&env.ns, name, reason).await.unwrap()
}

/// A gated pod is never decided: no Binding, no `FailedScheduling`, and its
/// `PodScheduled=False, SchedulingGated` condition is written once although the pod is updated
/// while gated (a real API server sets it at creation, and then nothing is written). Once an
/// update removes its gates it is placed in one decision, at once (no backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pod_gets_its_condition_once_no_event_and_one_decision_once_ungated() {
    let env = Env::new(1).await;
    let pods = env
        .create_gated("example.com/quota", json!({"cpu": "2", "memory": "1Gi"}))
        .await;
    // A long backoff: were the ungated pod put in backoff, it would not be bound in time.
    let sched = env
        .start(&["--pod-initial-backoff", "20s", "--pod-max-backoff", "60s"])
        .await;
    let pods = &pods;
    let c = sched
        .eventually(Duration::from_millis(50), || async move {
            pod_scheduled(&pods.get("gated").await.unwrap())
                .ok_or_else(|| "no SchedulingGated condition".to_owned())
        })
        .await;
    assert_eq!(c.status, "False");
    assert_eq!(c.reason.as_deref(), Some("SchedulingGated"));
    assert_eq!(
        c.message.as_deref(),
        Some("Scheduling is blocked due to non-empty scheduling gates")
    );
    // Updates while gated: nothing is written again, nothing decided.
    for i in 0..3 {
        pods.patch(
            "gated",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touch": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let attempts = |result: &str| {
        metric_value(
            &sched.metrics().unwrap_or_default(),
            "numaplane_scheduler_schedule_attempts_total",
            &[("result", result)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        attempts("unschedulable") + attempts("scheduled") + attempts("error"),
        0.0
    );
    assert!(events_about(&env, "gated", "FailedScheduling").await.is_empty());
    if let Some(fake) = env.target.fake() {
        assert_eq!(bindings_of(fake, &env.ns, "gated"), [], "a gated pod was bound");
        let status_path = format!("/api/v1/namespaces/{}/pods/gated/status", env.ns);
        let writes = fake
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == status_path)
            .count();
        assert_eq!(writes, 1, "the SchedulingGated condition is written once");
    }
    let ungated = Instant::now();
    env.ungate().await;
    env.wait_bound(1, &sched).await;
    assert!(
        ungated.elapsed() < Duration::from_secs(10),
        "{:?}",
        ungated.elapsed()
    );
    // The counter moves once the Binding's answer is in, which may be after the watch shows
    // the pod bound.
    sched
        .until("numaplane_scheduler_schedule_attempts_total{result=scheduled} >= 1")
        .await;
    assert_eq!(attempts("scheduled"), 1.0, "one decision");
    assert_eq!(attempts("unschedulable") + attempts("error"), 0.0);
    if let Some(fake) = env.target.fake() {
        let tries = bindings_of(fake, &env.ns, "gated");
        assert_eq!(tries.iter().map(|t| t.0).collect::<Vec<_>>(), [201], "{tries:?}");
    }
    assert!(events_about(&env, "gated", "FailedScheduling").await.is_empty());
    env.cleanup().await;
}

/// A StorageClass (cluster-scoped: a unique name per test) and a claim in `env`'s namespace.
async fn storage(env: &Env, class: &str, mode: &str, claim: Option<&str>) {
    let client = env.target.client();
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    if classes.get_opt(class).await.unwrap().is_none() {
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": class, "labels": {"numaplane.io/e2e": "true"}},
                    "provisioner": "csi.example.com", "volumeBindingMode": mode}),
                )
                .unwrap(),
            )
            .await
            .unwrap();
    }
    if let Some(claim) = claim {
        let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(client, &env.ns);
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": claim},
                    "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
}

/// Creates the pod `name` (1 CPU) whose volume uses `claim`.
async fn create_pod_with_claim(env: &Env, name: &str, claim: &str) {
    env.create_pod(
        name,
        SCHEDULER,
        &json!({"cpu": "1", "memory": "1Gi"}),
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
    )
    .await;
}

async fn delete_class(env: &Env, class: &str) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(env.target.client());
    let _ = classes.delete(class, &DeleteParams::default()).await;
}

/// kube-scheduler's VolumeBinding PreBind: the unbound WaitForFirstConsumer claim gets
/// `volume.kubernetes.io/selected-node` before the Binding is sent (the order of the requests
/// the API server received), and a failed write is a failed Binding: no Binding is sent for
/// that decision, the pod is retried and bound once the write succeeds. The pod gets no
/// `UnsupportedConstraint` warning: claims are modelled, attach limits included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_first_consumer_claim_is_given_its_node_before_the_binding() {
    let env = Env::new(2).await;
    let class = format!("{}-wffc", env.ns);
    storage(&env, &class, "WaitForFirstConsumer", Some("data")).await;
    create_pod_with_claim(&env, "with-claim", "data").await;
    let claim_path = format!("/api/v1/namespaces/{}/persistentvolumeclaims/data", env.ns);
    if let Some(fake) = env.target.fake() {
        fake.fail_next("PATCH", &claim_path, 500, 1);
    }
    let sched = env.start(&[]).await;
    let bound = env.wait_bound(1, &sched).await;
    let node = node_of(&bound[0]);
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.target.client(), &env.ns);
    let claim = claims.get("data").await.unwrap();
    assert_eq!(
        claim.metadata.annotations.unwrap()["volume.kubernetes.io/selected-node"],
        node
    );
    if let Some(fake) = env.target.fake() {
        let binding_path = format!("/api/v1/namespaces/{}/pods/with-claim/binding", env.ns);
        let order: Vec<(String, u16)> = fake
            .requests()
            .iter()
            .filter(|r| {
                (r.method == "PATCH" && r.path == claim_path)
                    || (r.method == "POST" && r.path == binding_path)
            })
            .map(|r| (r.method.clone(), r.status))
            .collect();
        assert_eq!(
            order,
            [
                ("PATCH".to_owned(), 500),
                ("PATCH".to_owned(), 200),
                ("POST".to_owned(), 201)
            ],
            "the failed write sent no Binding; the next decision wrote, then bound"
        );
        sched
            .until("numaplane_scheduler_binding_errors_total{reason=volume_binding} == 1")
            .await;
    }
    // A claim is fully modelled, attach limits included: no UnsupportedConstraint warning.
    assert!(
        events_about(&env, "with-claim", "UnsupportedConstraint")
            .await
            .is_empty()
    );
    delete_class(&env, &class).await;
    env.cleanup().await;
}

/// Sets `node`'s CSINode: `csi.example.com` may attach `count` volumes there.
async fn csi_node(env: &Env, node: &str, count: i32) {
    let api: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(env.target.client());
    let obj = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": node, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"drivers": [{"name": "csi.example.com", "nodeID": node, "allocatable": {"count": count}}]}});
    match api.get_opt(node).await.unwrap() {
        None => {
            api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap())
                .await
                .unwrap();
        }
        Some(_) => {
            api.patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": obj["spec"].clone()})),
            )
            .await
            .unwrap();
        }
    }
}

/// NodeVolumeLimits from watched CSINodes: a node whose CSI driver may attach no more volumes
/// is not chosen; a pod whose new volume fits no node's limit stays pending with
/// kube-scheduler's reason; raising a node's limit (a CSINode update) lets it bind there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_attach_limits_from_csinodes_decide_where_claims_go() {
    let env = Env::new(2).await;
    let class = format!("{}-wffc", env.ns);
    storage(&env, &class, "WaitForFirstConsumer", Some("first")).await;
    storage(&env, &class, "WaitForFirstConsumer", Some("second")).await;
    csi_node(&env, &env.nodes[0], 0).await;
    csi_node(&env, &env.nodes[1], 1).await;
    create_pod_with_claim(&env, "first", "first").await;
    let sched = env.start(&[]).await;
    let bound = env.wait_bound(1, &sched).await;
    assert_eq!(
        node_of(&bound[0]),
        env.nodes[1],
        "the only node with room for a volume"
    );
    create_pod_with_claim(&env, "second", "second").await;
    let e = sched
        .eventually(Duration::from_millis(100), || async {
            let failed = events_about(&env, "second", "FailedScheduling").await;
            failed
                .into_iter()
                .next()
                .ok_or_else(|| "no FailedScheduling for the second pod".to_owned())
        })
        .await;
    let note = e.note.as_deref().unwrap_or_default();
    assert!(note.contains("2 node(s) exceed max volume count"), "{note}");
    csi_node(&env, &env.nodes[0], 1).await;
    let bound = env.wait_bound(2, &sched).await;
    let second = bound
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("second"))
        .unwrap();
    assert_eq!(node_of(second), env.nodes[0]);
    let api: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(env.target.client());
    for n in &env.nodes {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
    delete_class(&env, &class).await;
    env.cleanup().await;
}

/// A pod whose claim does not exist stays pending with kube-scheduler's reason in its
/// `FailedScheduling` event and `PodScheduled` condition; creating the claim (a watch event) lets
/// it bind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_claim_is_missing_waits_and_binds_once_the_claim_exists() {
    let env = Env::new(1).await;
    let class = format!("{}-wffc", env.ns);
    storage(&env, &class, "WaitForFirstConsumer", None).await;
    create_pod_with_claim(&env, "needs-claim", "later").await;
    let sched = env.start(&[]).await;
    let reason = "0/1 nodes are available: persistentvolumeclaim \"later\" not found.";
    let pods: Api<Pod> = Api::namespaced(env.target.client(), &env.ns);
    let (pods, env) = (&pods, &env);
    let (c, events) = sched
        .eventually(Duration::from_millis(100), || async move {
            let condition = pod_scheduled(&pods.get("needs-claim").await.unwrap());
            let events = events_about(env, "needs-claim", "FailedScheduling").await;
            match condition {
                Some(c) if !events.is_empty() => Ok((c, events)),
                _ => Err("no FailedScheduling".to_owned()),
            }
        })
        .await;
    assert_eq!(c.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(c.message.as_deref(), Some(reason));
    assert_eq!(events[0].note.as_deref(), Some(reason));
    assert!(env.bound().await.is_empty());
    storage(env, &class, "WaitForFirstConsumer", Some("later")).await;
    let bound = env.wait_bound(1, &sched).await;
    assert_eq!(key(&bound[0]), format!("{}/needs-claim", env.ns));
    delete_class(env, &class).await;
    env.cleanup().await;
}
