//! The live agent end to end: `numaplane-exporter run` against a fake kubelet (a real tonic
//! server on a Unix socket) and an API server — the HTTP-level fake, or a real cluster when
//! `NUMAPLANE_E2E_KUBECONFIG` is set (the CRD from deploy/crd.yaml must be installed there).
//!
//! Covered: server-side apply with owner reference and skip-unchanged, recreate after delete,
//! the kubelet Watch fast path against the fallback (pod watch, notify file), a kubelet restart
//! mid-run, RESOURCE_EXHAUSTED backoff, terminal pods, the CRD wait with health up, API errors
//! retried, and the kubelet's configuration from its /configz (a fake kubelet HTTPS API: TLS
//! verified or not, slow, unreachable then back), through the API server's node proxy, from the
//! file and its drop-ins, and from no source at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use numaplane::nrt::NodeResourceTopology;
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, GetMode, Method};
use numaplane_e2e::fake_kubelet_https::{Answer, FakeKubeletHttps};
use numaplane_e2e::harness::{Agent, ApiTarget, assert_metric, metric_value, unique_name};
use numaplane_topology::Machine;

const WAIT: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "default";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/tests/fixtures/2numa.xml")
}

fn machine() -> Machine {
    Machine::from_xml_file(&fixture()).unwrap()
}

fn topo(node: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: node }],
    })
}

/// Every CPU allocatable, one device per NUMA node.
fn allocatable(m: &Machine) -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: m
            .numa_nodes
            .iter()
            .flat_map(|n| n.cpus.iter().map(|&c| i64::from(c)))
            .collect(),
        devices: m
            .numa_nodes
            .iter()
            .map(|n| ContainerDevices {
                resource_name: "example.com/nic".into(),
                device_ids: vec![format!("nic-{}", n.id)],
                topology: topo(i64::from(n.id)),
            })
            .collect(),
        memory: vec![],
    }
}

/// A pod holding `cpus` CPUs of NUMA node 0 (and the node-0 NIC when `nic`).
fn pod(m: &Machine, name: &str, cpus: usize, nic: bool) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: NAMESPACE.into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            cpu_ids: m.numa_nodes[0].cpus[..cpus]
                .iter()
                .map(|&c| i64::from(c))
                .collect(),
            devices: if nic {
                vec![ContainerDevices {
                    resource_name: "example.com/nic".into(),
                    device_ids: vec!["nic-0".into()],
                    topology: topo(0),
                }]
            } else {
                vec![]
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn available(nrt: &NodeResourceTopology, zone: &str, resource: &str) -> Option<String> {
    nrt.zones
        .iter()
        .find(|z| z.name == zone)?
        .resources
        .as_ref()?
        .iter()
        .find(|r| r.name == resource)
        .map(|r| r.available.0.clone())
}

struct Setup {
    api: ApiTarget,
    kubelet: FakeKubelet,
    node: String,
    node_uid: String,
    dir: tempfile::TempDir,
    machine: Machine,
}

impl Setup {
    async fn new(api: ApiTarget, opts: FakeKubeletOptions, pods: usize) -> Self {
        let machine = machine();
        let dir = tempfile::tempdir().unwrap();
        let pods: Vec<_> = (0..pods)
            .map(|i| pod(&machine, &format!("p{i}"), 2, false))
            .collect();
        let kubelet = FakeKubelet::start(
            &dir.path().join("kubelet.sock"),
            allocatable(&machine),
            pods,
            opts,
        )
        .await
        .unwrap();
        let node = unique_name("e2e-node");
        let node_uid = api.create_node(&node).await.unwrap();
        Self {
            api,
            kubelet,
            node,
            node_uid,
            dir,
            machine,
        }
    }

    /// The HTTP-level fake API (with the NRT CRD installed or not), a kubelet like today's,
    /// no pods: for what a real cluster cannot be made to do.
    async fn fake(with_crd: bool) -> Self {
        Self::new(
            ApiTarget::start_fake(with_crd).await.unwrap(),
            FakeKubeletOptions::default(),
            0,
        )
        .await
    }

    /// The default target, a kubelet like today's (Get, no Watch), no pods.
    async fn plain() -> Self {
        Self::with_kubelet(FakeKubeletOptions::default(), 0).await
    }

    /// The default target, a kubelet answering as `opts` says and listing `pods` pods of 2 CPUs.
    async fn with_kubelet(opts: FakeKubeletOptions, pods: usize) -> Self {
        Self::new(ApiTarget::start().await.unwrap(), opts, pods).await
    }

    fn notify_file(&self) -> PathBuf {
        self.dir.path().join("notify")
    }

    /// Flags of a fast-reacting agent; `resync` "0s" leaves only event triggers.
    fn args(&self, resync: &str, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "--node-name",
            &self.node,
            "--podresources-socket",
            &self.kubelet.socket().display().to_string(),
            "--topology-xml",
            &fixture().display().to_string(),
            "--kubeconfig",
            &self.api.kubeconfig().display().to_string(),
            "--resync-interval",
            resync,
            "--notify-file",
            &self.notify_file().display().to_string(),
            "--api-backoff-min",
            "100ms",
            "--api-backoff-max",
            "1s",
            "--kubelet-backoff-min",
            "50ms",
            "--kubelet-backoff-max",
            "500ms",
            "--call-timeout",
            "5s",
            "--pods-fingerprint-method",
            "all",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    async fn agent(&self, resync: &str, extra: &[&str]) -> Agent {
        let mut agent = Agent::spawn(&self.args(resync, extra)).unwrap();
        agent.set_wait(WAIT);
        agent.wait_serving(WAIT).await.unwrap();
        agent
    }

    /// Waits until the published `resource` available in `zone` is `value`.
    async fn wait_available(&self, zone: &str, resource: &str, value: &str) -> NodeResourceTopology {
        self.api
            .wait_nrt(&self.node, WAIT, |n| {
                available(n, zone, resource).as_deref() == Some(value)
            })
            .await
            .unwrap()
    }

    /// Polls the node's NRT until `pred` holds; returns it.
    async fn nrt_where(&self, pred: impl Fn(&NodeResourceTopology) -> bool) -> NodeResourceTopology {
        self.api.wait_nrt(&self.node, WAIT, pred).await.unwrap()
    }

    /// Waits until the NRT carries the kubelet's Topology Manager policy; a failure shows the
    /// agent's log.
    async fn kubelet_config_published(&self, agent: &Agent) -> NodeResourceTopology {
        self.api
            .wait_nrt(&self.node, WAIT, |n| {
                n.attribute(numaplane::nrt::attr::TOPOLOGY_MANAGER_POLICY)
                    .is_some()
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()))
    }

    /// An agent ([`Self::agent`], no extra flags) once it has published the node with every
    /// CPU of NUMA node 0 free.
    async fn published(&self, resync: &str) -> Agent {
        let agent = self.agent(resync, &[]).await;
        self.wait_available("node-0", "cpu", "16").await;
        agent
    }

    /// Waits until the NRT says where what init containers still hold was read from
    /// (`cpu=…,devices=…,memory=…`); returns it.
    async fn init_held_from(&self, sources: &str) -> NodeResourceTopology {
        self.nrt_where(|n| {
            node_attribute(n, numaplane::nrt::attr::INIT_HELD_SOURCE).as_deref() == Some(sources)
        })
        .await
    }

    /// [`Self::plain`] and [`Self::published`].
    async fn running(resync: &str) -> (Self, Agent) {
        let s = Self::plain().await;
        let agent = s.published(resync).await;
        (s, agent)
    }

    fn touch_notify(&self) {
        std::fs::write(self.notify_file(), "").unwrap();
    }

    async fn cleanup(&self) {
        self.api.cleanup(&self.node, NAMESPACE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_with_owner_reference_and_skips_unchanged_writes() {
    let s = Setup::with_kubelet(FakeKubeletOptions::default(), 1).await;
    let agent = s.agent("200ms", &["--force-write-interval", "1h"]).await;

    let nrt = s.nrt_where(|_| true).await;
    let owners = nrt.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str()
        ),
        ("Node", s.node.as_str(), s.node_uid.as_str())
    );
    assert_eq!(owners[0].api_version, "v1");
    let managers: Vec<_> = nrt
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "numaplane-exporter"), "{managers:?}");
    // Server-side apply: the agent owns what it publishes, as an Apply (a real server tracks
    // every field; the fake at a coarser grain).
    let owned = nrt
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|m| m.manager.as_deref() == Some("numaplane-exporter"))
        .unwrap();
    assert_eq!(owned.operation.as_deref(), Some("Apply"), "{owned:?}");
    let fields = serde_json::to_string(&owned.fields_v1).unwrap();
    for field in [
        "f:zones",
        "f:attributes",
        "f:topologyPolicies",
        "f:ownerReferences",
    ] {
        assert!(fields.contains(field), "{field} not owned: {fields}");
    }
    // One pod holds 2 CPUs of node 0 (16 CPUs per node in the fixture).
    assert_eq!(available(&nrt, "node-0", "cpu").as_deref(), Some("14"));
    assert_eq!(available(&nrt, "node-1", "cpu").as_deref(), Some("16"));
    let rv = nrt.metadata.resource_version.clone();

    // Several resyncs later, nothing changed: still exactly one write, the rest skipped.
    agent.until("numaplane_exporter_nrt_write_skips_total >= 4").await;
    let text = agent.metrics().unwrap();
    assert_metric(&text, "numaplane_exporter_nrt_writes_total{result=success} == 1");
    let again = s.api.nrt(&s.node).await.unwrap().unwrap();
    assert_eq!(again.metadata.resource_version, rv);
    if let Some(fake) = s.api.fake() {
        let patches: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| {
                r.method == "PATCH" && r.path.ends_with(&format!("/noderesourcetopologies/{}", s.node))
            })
            .collect();
        assert_eq!(patches.len(), 1, "{patches:?}");
        assert_eq!(
            patches[0].query_param("fieldManager").as_deref(),
            Some("numaplane-exporter")
        );
        assert_eq!(
            patches[0].header("content-type"),
            Some("application/apply-patch+yaml")
        );
    }
    // Metrics carry the zones, labelled numa_node as the kubelet does.
    assert_metric(
        &text,
        &format!(
            "numaplane_exporter_zone_resource_available{{numa_node=0,resource=cpu,node={}}} == 14",
            s.node
        ),
    );
    assert_eq!(agent.http_get("/readyz").unwrap().0, 200);
    s.cleanup().await;
}

/// `--metrics-address` is the deprecated spelling of `--listen`: the agent still serves its
/// probes and metrics there, and says in its log what to write instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deprecated_metrics_address_still_serves_and_says_so() {
    let s = Setup::plain().await;
    let mut agent = Agent::spawn_binary(
        numaplane_e2e::binaries::exporter(),
        "run",
        &s.args("10s", &[]),
        "--metrics-address",
        "info",
    )
    .unwrap();
    agent.set_wait(WAIT);
    agent.wait_serving(WAIT).await.unwrap();
    assert_eq!(agent.http_get("/healthz").unwrap().0, 200);
    assert!(
        agent
            .metrics()
            .unwrap()
            .contains("numaplane_exporter_kubelet_reconnects_total")
    );
    let log = agent.stderr();
    assert!(
        log.contains(
            "--metrics-address (NUMAPLANE_METRICS_ADDRESS) is deprecated: use --listen (NUMAPLANE_LISTEN)"
        ),
        "{log}"
    );
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreates_the_object_after_someone_deletes_it() {
    let s = Setup::plain().await;
    let _agent = s.agent("1h", &[]).await;
    let first = s.nrt_where(|_| true).await;
    s.api.delete_nrt(&s.node).await.unwrap();
    // No timer will fire within the test: only the watch on our own object can bring it back.
    let back = s.nrt_where(|n| n.metadata.uid != first.metadata.uid).await;
    assert_eq!(back.zones, first.zones);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_watch_is_the_fast_path() {
    let s = Setup::with_kubelet(
        FakeKubeletOptions {
            watch: true,
            get: GetMode::Offered,
        },
        0,
    )
    .await;
    let agent = s.published("1h").await;
    agent.until("numaplane_exporter_kubelet_watch_active == 1").await;
    // Only the kubelet knows: no pod event, no timer, no notify file.
    s.kubelet.set_pods(vec![pod(&s.machine, "fast", 4, true)]);
    let nrt = s.wait_available("node-0", "cpu", "12").await;
    assert_eq!(available(&nrt, "node-0", "example.com/nic").as_deref(), Some("0"));
    assert!(!agent.stderr().contains("does not offer pod-resources Watch"));
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_the_agent_falls_back_to_events_and_says_so_once() {
    let (s, agent) = Setup::running("1h").await;
    s.kubelet.set_pods(vec![pod(&s.machine, "slow", 4, false)]);
    // Without Watch nothing tells the agent yet.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let unchanged = s.api.nrt(&s.node).await.unwrap().unwrap();
    assert_eq!(available(&unchanged, "node-0", "cpu").as_deref(), Some("16"));
    // The pod watch does.
    s.api
        .create_pod(NAMESPACE, &unique_name("slow"), &s.node, "Running")
        .await
        .unwrap();
    s.wait_available("node-0", "cpu", "12").await;
    // And so does the notify file.
    s.kubelet.set_pods(vec![]);
    s.touch_notify();
    s.wait_available("node-0", "cpu", "16").await;

    let logs = agent.stderr();
    assert_eq!(
        logs.matches("does not offer pod-resources Watch").count(),
        1,
        "{logs}"
    );
    assert!(!logs.contains("ERROR"), "{logs}");
    let text = agent.metrics().unwrap();
    assert_metric(
        &text,
        "numaplane_exporter_podresources_requests_total{method=Watch,code=UNIMPLEMENTED} == 1",
    );
    assert_metric(&text, "numaplane_exporter_kubelet_watch_active == 0");
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_kubelet_restart_and_rereads_allocatable() {
    let (s, agent) = Setup::running("300ms").await;

    s.kubelet.stop().await;
    agent.until("numaplane_exporter_stale == 1").await;
    assert_eq!(agent.http_get("/readyz").unwrap().0, 503);
    assert_eq!(agent.http_get("/healthz").unwrap().0, 200);
    // The object stays while the kubelet is away.
    assert!(s.api.nrt(&s.node).await.unwrap().is_some());

    // The kubelet comes back with a new device plugin registration and a new pod.
    let mut alloc = allocatable(&s.machine);
    alloc.devices.push(ContainerDevices {
        resource_name: "example.com/gpu".into(),
        device_ids: vec!["gpu-1".into()],
        topology: topo(1),
    });
    s.kubelet.set_allocatable(alloc);
    s.kubelet.set_pods(vec![pod(&s.machine, "after", 2, false)]);
    let allocatable_calls = s.kubelet.calls(Method::GetAllocatableResources);
    s.kubelet.restart().await.unwrap();

    let nrt = s.wait_available("node-1", "example.com/gpu", "1").await;
    assert_eq!(available(&nrt, "node-0", "cpu").as_deref(), Some("14"));
    assert!(s.kubelet.calls(Method::GetAllocatableResources) > allocatable_calls);
    agent.until("numaplane_exporter_stale == 0").await;
    assert_eq!(agent.http_get("/readyz").unwrap().0, 200);
    assert_metric(
        &agent.metrics().unwrap(),
        "numaplane_exporter_kubelet_reconnects_total >= 1",
    );
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_exhausted_backs_off_and_never_publishes_a_partial_scan() {
    let (s, agent) = Setup::running("1h").await;
    // The write counter moves once the API server has answered, which may be after the NRT
    // is readable: wait for it rather than read it.
    let mut writes_before = agent
        .until("numaplane_exporter_nrt_writes_total{result=success} >= 1")
        .await;
    // A start-up write may still be on its way (the first scan's, then one for what the
    // Node watch adds): take the count once it has held for a second.
    let successes = |text: &str| {
        metric_value(
            text,
            "numaplane_exporter_nrt_writes_total",
            &[("result", "success")],
        )
        .unwrap_or(0.0)
    };
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = successes(&agent.metrics().unwrap());
        if now == writes_before {
            break;
        }
        writes_before = now;
    }
    s.kubelet.fail_next(
        Method::List,
        3,
        tonic::Code::ResourceExhausted,
        "rejected by rate limit",
    );
    s.kubelet.set_pods(vec![pod(&s.machine, "limited", 6, false)]);
    s.touch_notify();
    s.wait_available("node-0", "cpu", "10").await;
    agent
        .until(&format!(
            "numaplane_exporter_nrt_writes_total{{result=success}} >= {}",
            writes_before + 1.0
        ))
        .await;
    let text = agent.metrics().unwrap();
    assert_metric(
        &text,
        "numaplane_exporter_podresources_requests_total{method=List,code=RESOURCE_EXHAUSTED} == 3",
    );
    assert_metric(&text, "numaplane_exporter_scans_total{result=rate_limited} >= 1");
    // Failed scans wrote nothing: exactly one more write, with the final state.
    assert_metric(
        &text,
        &format!(
            "numaplane_exporter_nrt_writes_total{{result=success}} == {}",
            writes_before + 1.0
        ),
    );
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_pods_do_not_hold_resources() {
    let s = Setup::plain().await;
    let done = unique_name("done");
    let running = unique_name("running");
    // A kubelet before 1.34 still lists the finished pod with its old CPUs.
    s.kubelet.set_pods(vec![
        pod(&s.machine, &done, 4, false),
        PodResources {
            name: running.clone(),
            ..pod(&s.machine, &running, 0, true)
        },
    ]);
    s.api
        .create_pod(NAMESPACE, &done, &s.node, "Succeeded")
        .await
        .unwrap();
    s.api
        .create_pod(NAMESPACE, &running, &s.node, "Running")
        .await
        .unwrap();
    let _agent = s.agent("1h", &[]).await;
    let nrt = s.wait_available("node-0", "example.com/nic", "0").await;
    assert_eq!(available(&nrt, "node-0", "cpu").as_deref(), Some("16"));
    // The running pod turns terminal too: its NIC comes back.
    s.api.set_pod_phase(NAMESPACE, &running, "Failed").await.unwrap();
    s.wait_available("node-0", "example.com/nic", "1").await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_the_crd_with_metrics_and_health_up() {
    // A real cluster cannot be made to lack the CRD safely: this one always uses the fake.
    let s = Setup::fake(false).await;
    let agent = s.agent("1h", &[]).await;
    agent
        .until("numaplane_exporter_errors_total{kind=crd_missing} >= 2")
        .await;
    // Said the same way in /readyz, the log and a metric.
    const MISSING: &str =
        "the NodeResourceTopology CRD (noderesourcetopologies.topology.node.k8s.io) is not installed";
    let (code, body) = agent.http_get("/readyz").unwrap();
    assert_eq!(code, 503);
    assert_eq!(body.trim(), MISSING);
    assert!(agent.stderr().contains(MISSING), "{}", agent.stderr());
    assert_metric(
        &agent.metrics().unwrap(),
        "numaplane_exporter_nrt_crd_installed == 0",
    );
    assert_eq!(agent.http_get("/healthz").unwrap().0, 200);
    assert!(
        agent
            .metrics()
            .unwrap()
            .contains("numaplane_exporter_zone_resource_capacity")
    );
    let fake = s.api.fake().unwrap();
    fake.install_nrt_crd();
    s.nrt_where(|_| true).await;
    agent.until("numaplane_exporter_stale == 0").await;
    assert_eq!(agent.http_get("/readyz").unwrap().0, 200);
    assert_metric(
        &agent.metrics().unwrap(),
        "numaplane_exporter_nrt_crd_installed == 1",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_and_counted() {
    // Injected failures need the fake.
    let s = Setup::fake(true).await;
    let fake = s.api.fake().unwrap();
    fake.fail_next("PATCH", "/apis/topology.node.k8s.io/", 500, 2);
    let agent = s.agent("1h", &[]).await;
    s.nrt_where(|_| true).await;
    let text = agent.metrics().unwrap();
    assert_metric(&text, "numaplane_exporter_nrt_writes_total{result=error} == 2");
    assert!(agent.stderr().contains("publish failed"));
}

/// Get calls per second while 4 pods the kubelet has not admitted wait for 3 s, and the logs,
/// for a kubelet answering `Get` in `mode`.
async fn get_rate(mode: GetMode) -> (usize, f64, String) {
    let s = Setup::with_kubelet(
        FakeKubeletOptions {
            watch: false,
            get: mode,
        },
        0,
    )
    .await;
    let agent = s.published("1h").await;
    let before = s.kubelet.calls(Method::Get);
    let t0 = std::time::Instant::now();
    for i in 0..4 {
        s.api
            .create_pod(
                NAMESPACE,
                &unique_name(&format!("waiting-{i}")),
                &s.node,
                "Pending",
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = s.kubelet.calls(Method::Get) - before;
    let rate = calls as f64 / t0.elapsed().as_secs_f64();
    let logs = agent.stderr();
    s.cleanup().await;
    (calls, rate, logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_dropped_for_good_where_the_kubelet_does_not_offer_it() {
    // 1.26 and older (UNIMPLEMENTED) and 1.27–1.33 with the gate off (Unknown, "disabled"):
    // one probe, said once, then silence for this kubelet.
    for mode in [GetMode::Unimplemented, GetMode::Disabled] {
        let (calls, rate, logs) = get_rate(mode).await;
        assert!(calls <= 2, "{mode:?}: {calls} Get calls ({rate:.1}/s)\n{logs}");
        assert_eq!(
            logs.matches("does not offer pod-resources Get").count(),
            1,
            "{mode:?}\n{logs}"
        );
    }
    // A kubelet that offers Get answers "not found" for a pod it has not admitted (also code
    // Unknown): the poller keeps asking, within its share of the budget (one call per 100 ms).
    let (calls, rate, logs) = get_rate(GetMode::Offered).await;
    assert!(calls >= 10, "{calls} Get calls\n{logs}");
    assert!(rate <= 12.0, "{rate:.1} Get calls/s\n{logs}");
    assert!(!logs.contains("does not offer pod-resources Get"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_events_are_found_the_way_kubectl_describe_node_looks_them_up() {
    let s = Setup::plain().await;
    // The kubelet is down at start: a ScanFailed Warning on the Node.
    s.kubelet
        .fail_next(Method::List, 1, tonic::Code::Unavailable, "kubelet restarting");
    let _agent = s.published("1h").await;
    // kubectl describe node (v1.36.2, -v=6) lists core/v1 events twice, by
    // involvedObject.uid = the Node's UID and = its name, each with name and kind.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(s.api.client(), "default");
    let selector = format!(
        "involvedObject.uid={},involvedObject.name={},involvedObject.kind=Node",
        s.node_uid, s.node
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    let found = loop {
        let list = events
            .list(&kube::api::ListParams::default().fields(&selector))
            .await
            .unwrap();
        if let Some(e) = list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ScanFailed"))
        {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ScanFailed event found by {selector}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(found.type_.as_deref(), Some("Warning"));
    assert!(
        found.message.as_deref().unwrap_or_default().contains("kubelet"),
        "{found:?}"
    );
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_without_resync_stays_live() {
    // `--resync-interval 0` ("off"): on an idle node no trigger arrives. Liveness must outlast
    // the longest silence the probe tolerates (3 × 10 s + API backoff 1 s + call timeout 5 s).
    let (s, agent) = Setup::running("0s").await;
    tokio::time::sleep(Duration::from_secs(40)).await;
    let (status, body) = agent.http_get("/healthz").unwrap();
    assert_eq!(status, 200, "{body}\n{}", agent.stderr());
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_kubelet_config_reaches_the_object_without_a_restart() {
    use numaplane::nrt::attr;
    let s = Setup::plain().await;
    let config = s.dir.path().join("kubelet").join("config.yaml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    let write = |text: &str| {
        // As config management does it: a new file renamed over the old one.
        let tmp = config.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &config).unwrap();
    };
    write("kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n");
    let dropins = s.dir.path().join("kubelet").join("conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    // Resync 1 h: the change must come through the file watch.
    let agent = s
        .agent(
            "1h",
            &[
                "--kubelet-config",
                config.to_str().unwrap(),
                "--kubelet-config-dir",
                dropins.to_str().unwrap(),
            ],
        )
        .await;
    let has = |name: &'static str, value: &'static str| {
        move |n: &NodeResourceTopology| n.attribute(name) == Some(value)
    };
    s.nrt_where(has(attr::TOPOLOGY_MANAGER_POLICY, "single-numa-node"))
        .await;
    write("kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\ncpuManagerPolicy: static\n");
    let nrt = s
        .nrt_where(has(attr::TOPOLOGY_MANAGER_POLICY, "restricted"))
        .await;
    assert_eq!(nrt.attribute(attr::CPU_MANAGER_POLICY), Some("static"));
    // A broken file keeps the last good settings, said once, counted.
    write("topologyManagerPolicy: [broken\n");
    s.touch_notify();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nrt = s.api.nrt(&s.node).await.unwrap().unwrap();
    assert_eq!(nrt.attribute(attr::TOPOLOGY_MANAGER_POLICY), Some("restricted"));
    let text = agent.metrics().unwrap();
    assert_metric(&text, "numaplane_exporter_errors_total{kind=kubelet_config} == 1");
    assert_eq!(
        agent
            .stderr()
            .matches("cannot read the kubelet configuration; keeping the last settings")
            .count(),
        1
    );
    // A drop-in of the kubelet's --config-dir is merged over the (fixed) file.
    write("kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\ncpuManagerPolicy: static\n");
    let drop_in = dropins.join("50-policy.conf");
    std::fs::write(
        &drop_in,
        "kind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n",
    )
    .unwrap();
    let nrt = s
        .nrt_where(has(attr::TOPOLOGY_MANAGER_POLICY, "best-effort"))
        .await;
    assert_eq!(nrt.attribute(attr::CPU_MANAGER_POLICY), Some("static"));
    std::fs::remove_file(&drop_in).unwrap();
    s.nrt_where(has(attr::TOPOLOGY_MANAGER_POLICY, "restricted"))
        .await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_request_budget_binds_every_clone_of_the_client() {
    use numaplane_exporter::podresources::KubeletClient;
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(
        &dir.path().join("kubelet.sock"),
        allocatable(&machine()),
        vec![],
        FakeKubeletOptions::default(),
    )
    .await
    .unwrap();
    let metrics = std::sync::Arc::new(numaplane_exporter::metrics::Metrics::new());
    // 10/s with a burst of 2: 22 calls from two clones need at least 2 s.
    let a = KubeletClient::new(kubelet.socket(), Duration::from_secs(5), metrics)
        .unwrap()
        .with_budget(10, 2);
    let b = a.clone();
    let t0 = std::time::Instant::now();
    let (ra, rb) = tokio::join!(
        async {
            for _ in 0..11 {
                a.list().await.unwrap();
            }
        },
        async {
            for _ in 0..11 {
                b.get("default", "nope").await.unwrap();
            }
        }
    );
    let _ = (ra, rb);
    let elapsed = t0.elapsed();
    assert!(elapsed >= Duration::from_millis(1900), "{elapsed:?}");
    assert_eq!(kubelet.calls(Method::List) + kubelet.calls(Method::Get), 22);
}

fn zone_attribute(nrt: &NodeResourceTopology, zone: &str, name: &str) -> Option<String> {
    nrt.zones
        .iter()
        .find(|z| z.name == zone)?
        .attribute(name)
        .map(str::to_owned)
}

fn node_attribute(nrt: &NodeResourceTopology, name: &str) -> Option<String> {
    nrt.attributes
        .as_ref()?
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.value.clone())
}

/// kubernetes#126765: List shows app containers only. The init container took 3 CPUs and the
/// node-0 NIC; the app container reused 2 CPUs. The kubelet's checkpoints show the third CPU
/// and the NIC still held, and the NRT must too; with the checkpoints unusable, the pod spec
/// gives the same amounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_init_containers_still_hold_is_published_as_used() {
    use k8s_openapi::api::core::v1::Pod;
    use numaplane::nrt::attr;
    use numaplane_exporter::checkpoint;

    let s = Setup::plain().await;
    let name = unique_name("init-held");
    let limits = |cpu: &str, nics: Option<&str>| {
        let mut l = serde_json::json!({"cpu": cpu, "memory": "64Mi"});
        if let Some(n) = nics {
            l["example.com/nic"] = n.into();
        }
        serde_json::json!({"limits": l.clone(), "requests": l})
    };
    let pods: Api<Pod> = Api::namespaced(s.api.client(), NAMESPACE);
    let spec: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {
            "nodeName": s.node,
            "initContainers": [{"name": "init", "image": "registry.k8s.io/pause:3.10", "resources": limits("3", Some("1"))}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": limits("2", None)}],
            "tolerations": [{"operator": "Exists"}]
        }
    }))
    .unwrap();
    let uid = pods
        .create(&Default::default(), &spec)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({"status": {"phase": "Running", "qosClass": "Guaranteed"}}),
        ),
    )
    .await
    .unwrap();
    s.kubelet.set_pods(vec![pod(&s.machine, &name, 2, false)]);

    let cpus = &s.machine.numa_nodes[0].cpus;
    let state = s.dir.path().join("kubelet-state");
    std::fs::create_dir_all(state.join("device-plugins")).unwrap();
    // Real checksums, as a kubelet writes them (the rules are checked against files written by
    // real kubelets in the exporter's unit tests).
    let cpu_state = serde_json::json!({
        "policyName": "static", "defaultCpuSet": "",
        "entries": {uid.clone(): {
            "init": format!("{},{},{}", cpus[0], cpus[1], cpus[2]),
            "app": format!("{},{}", cpus[0], cpus[1]),
        }},
    });
    let device_state = serde_json::json!({"Data": {
        "PodDeviceEntries": [{"PodUID": uid, "ContainerName": "init", "ResourceName": "example.com/nic",
                              "DeviceIDs": {"0": ["nic-0"]}, "AllocResp": null}],
        "RegisteredDevices": {"example.com/nic": ["nic-0", "nic-1"]}
    }});
    std::fs::write(
        state.join("cpu_manager_state"),
        checkpoint::seal_cpu_manager_state(cpu_state.clone()).unwrap(),
    )
    .unwrap();
    std::fs::write(
        state.join("device-plugins/kubelet_internal_checkpoint"),
        checkpoint::seal_device_checkpoint(device_state.clone()).unwrap(),
    )
    .unwrap();

    let state_dir = state.display().to_string();
    let agent = s.agent("200ms", &["--kubelet-state-dir", &state_dir]).await;
    let nrt = s
        .init_held_from("cpu=checkpoint,devices=checkpoint,memory=none")
        .await;
    let used_cpus = cpus.len() - 3;
    assert_eq!(available(&nrt, "node-0", "cpu"), Some(used_cpus.to_string()));
    assert_eq!(available(&nrt, "node-0", "example.com/nic").as_deref(), Some("0"));
    let free_nics = format!("{}example.com/nic", attr::FREE_DEVICES_PREFIX);
    assert_eq!(zone_attribute(&nrt, "node-0", &free_nics).as_deref(), Some(""));
    assert_eq!(
        zone_attribute(&nrt, "node-1", &free_nics).as_deref(),
        Some("nic-1")
    );

    // A checkpoint whose checksum matches nothing is not trusted: the spec gives the amounts.
    let mut torn = cpu_state;
    torn["checksum"] = 12345.into();
    std::fs::write(state.join("cpu_manager_state"), torn.to_string()).unwrap();
    let nrt = s
        .init_held_from("cpu=pod-spec,devices=checkpoint,memory=none")
        .await;
    assert_eq!(available(&nrt, "node-0", "cpu"), Some(used_cpus.to_string()));
    agent
        .until(
            "numaplane_exporter_kubelet_checkpoint_errors_total{file=cpu_manager_state,reason=checksum} >= 1",
        )
        .await;
    let metrics = agent.metrics().unwrap();
    assert_metric(
        &metrics,
        "numaplane_exporter_init_held_source{resource=cpu,source=pod-spec} == 1",
    );

    // The kubelet accepts a zero checksum for cpu_manager_state only: a device or memory
    // checkpoint with one is not trusted either.
    let mut zero = device_state;
    zero["Checksum"] = 0.into();
    std::fs::write(
        state.join("device-plugins/kubelet_internal_checkpoint"),
        zero.to_string(),
    )
    .unwrap();
    s.init_held_from("cpu=pod-spec,devices=pod-spec,memory=none")
        .await;
    agent
        .until("numaplane_exporter_kubelet_checkpoint_errors_total{file=device-plugins/kubelet_internal_checkpoint,reason=checksum} >= 1").await;
    let memory_state = serde_json::json!({"policyName": "Static", "entries": {}, "machineState": {
        "0": {"numberOfAssignments": 0, "cells": [0], "memoryMap": {"memory":
            {"total": 1024, "systemReserved": 0, "allocatable": 1024, "reserved": 0, "free": 1024}}}}});
    std::fs::write(
        state.join("memory_manager_state"),
        checkpoint::seal_memory_manager_state(memory_state.clone()).unwrap(),
    )
    .unwrap();
    s.init_held_from("cpu=pod-spec,devices=pod-spec,memory=checkpoint")
        .await;
    let mut zero = memory_state;
    zero["checksum"] = 0.into();
    std::fs::write(state.join("memory_manager_state"), zero.to_string()).unwrap();
    s.init_held_from("cpu=pod-spec,devices=pod-spec,memory=none")
        .await;
    agent
        .until("numaplane_exporter_kubelet_checkpoint_errors_total{file=memory_manager_state,reason=checksum} >= 1").await;
    s.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// The kubelet's configuration: /configz, the file, or nothing
// ---------------------------------------------------------------------------------------------

/// What a kubelet with the static CPU and memory managers answers on /configz (the fields the
/// agent reads, among others it ignores).
fn kubelet_configz() -> serde_json::Value {
    serde_json::json!({
        "enableServer": true,
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
        "memoryManagerPolicy": "Static",
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "12"},
        "reservedSystemCPUs": "0",
        "evictionHard": {"memory.available": "100Mi"},
        "clusterDNS": ["10.96.0.10"],
    })
}

/// A kubelet HTTPS API answering /configz with [`kubelet_configz`].
async fn configz_kubelet() -> FakeKubeletHttps {
    FakeKubeletHttps::start(Answer::Config(kubelet_configz()))
        .await
        .unwrap()
}

/// Flags pointing the agent at a kubelet HTTPS API on 127.0.0.1:`port`.
fn kubelet_api_flags(port: u16) -> Vec<String> {
    ["--node-address", "127.0.0.1", "--kubelet-port", &port.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn with_ca(mut flags: Vec<String>) -> Vec<String> {
    flags.push("--kubelet-ca-file".into());
    flags.push(FakeKubeletHttps::ca_file().display().to_string());
    flags
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The node's Warning Events with `reason`, as `kubectl describe node` would show them.
async fn node_events(s: &Setup, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    s.api.events_about(NAMESPACE, &s.node, reason).await.unwrap()
}

const TM_AND_MANAGER_ATTRIBUTES: [&str; 4] = [
    numaplane::nrt::attr::TOPOLOGY_MANAGER_POLICY,
    numaplane::nrt::attr::TOPOLOGY_MANAGER_SCOPE,
    numaplane::nrt::attr::CPU_MANAGER_POLICY,
    numaplane::nrt::attr::MEMORY_MANAGER_POLICY,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_configz_is_published() {
    use numaplane::nrt::attr;
    let s = Setup::plain().await;
    let kubelet = configz_kubelet().await;
    let agent = s
        .agent("1h", &strs(&with_ca(kubelet_api_flags(kubelet.port()))))
        .await;
    let nrt = s.kubelet_config_published(&agent).await;
    for (name, value) in [
        (attr::TOPOLOGY_MANAGER_POLICY, "single-numa-node"),
        (attr::TOPOLOGY_MANAGER_SCOPE, "pod"),
        (attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES, "12"),
        (attr::CPU_MANAGER_POLICY, "static"),
        (attr::CPU_MANAGER_POLICY_OPTIONS, "full-pcpus-only=true"),
        (attr::RESERVED_CPUS, "0"),
        (attr::MEMORY_MANAGER_POLICY, "Static"),
    ] {
        assert_eq!(nrt.attribute(name), Some(value), "{name}");
    }
    assert_eq!(
        nrt.topology_policies,
        Some(vec!["SingleNUMANodePodLevel".to_owned()])
    );
    let text = agent.metrics().unwrap();
    assert_metric(
        &text,
        "numaplane_exporter_kubelet_config_source{source=configz} == 1",
    );
    // The kubelet authenticates the agent by its own token (in a pod, the ServiceAccount's).
    let requests = kubelet.requests();
    assert!(
        requests.iter().all(|r| r.method == "GET" && r.path == "/configz"),
        "{requests:?}"
    );
    if s.api.fake().is_some() {
        assert!(
            requests
                .iter()
                .all(|r| r.bearer_token.as_deref() == Some(numaplane_e2e::fake_api::FAKE_TOKEN)),
            "{requests:?}"
        );
    }
    assert!(node_events(&s, "KubeletConfigUnavailable").await.is_empty());
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_certificate_is_verified_unless_told_otherwise() {
    let s = Setup::plain().await;
    let kubelet = configz_kubelet().await;
    // The fake's CA is not one the agent trusts (as with kubeadm's self-signed certificates).
    let agent = s.agent("1h", &strs(&kubelet_api_flags(kubelet.port()))).await;
    agent
        .until("numaplane_exporter_kubelet_config_errors_total{source=configz,reason=tls} >= 1")
        .await;
    // The handshake failed before the request: the token never went out.
    assert!(kubelet.requests().is_empty(), "{:?}", kubelet.requests());
    drop(agent);
    let mut flags = kubelet_api_flags(kubelet.port());
    flags.push("--kubelet-insecure-skip-tls-verify".into());
    let agent = s.agent("1h", &strs(&flags)).await;
    agent
        .until("numaplane_exporter_kubelet_config_source{source=configz} == 1")
        .await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_kubelet_config_source_publishes_warns_and_recovers_at_the_resync() {
    use numaplane::nrt::attr;
    let s = Setup::plain().await;
    // Nothing listens on the kubelet's port yet, and the file is not there (as on a
    // distribution that keeps it elsewhere).
    let port = numaplane_e2e::harness::free_port().unwrap();
    let mut flags = with_ca(kubelet_api_flags(port));
    let missing = s.dir.path().join("var/lib/kubelet/config.yaml");
    flags.extend(["--kubelet-config".to_owned(), missing.display().to_string()]);
    let mut agent = s.agent("1s", &strs(&flags)).await;
    // It publishes what it knows: the zones, without the attributes nobody could read.
    let nrt = s.wait_available("node-0", "cpu", "16").await;
    for name in TM_AND_MANAGER_ATTRIBUTES {
        assert_eq!(nrt.attribute(name), None, "{name} published without a source");
    }
    assert_eq!(nrt.topology_policies, Some(vec!["None".to_owned()]));
    assert!(
        nrt.attribute(attr::THREADS_PER_CORE).is_some(),
        "machine attributes stay"
    );
    agent
        .until("numaplane_exporter_kubelet_config_source{source=none} == 1")
        .await;
    let text = agent.metrics().unwrap();
    for (source, reason) in [("configz", "unreachable"), ("file", "read")] {
        assert_metric(
            &text,
            &format!(
                "numaplane_exporter_kubelet_config_errors_total{{source={source},reason={reason}}} >= 1"
            ),
        );
    }
    // One Warning Event on the Node saying what is missing and why.
    let deadline = tokio::time::Instant::now() + WAIT;
    let events = loop {
        let events = node_events(&s, "KubeletConfigUnavailable").await;
        if !events.is_empty() || tokio::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("/configz") && note.contains(&missing.display().to_string()),
        "{note}"
    );
    // Running and ready: the object is published.
    assert!(agent.exited().is_none(), "{}", agent.stderr());
    assert_eq!(agent.http_get("/readyz").unwrap().0, 200);

    // The kubelet answers now: the next resync reads it.
    let _kubelet = FakeKubeletHttps::start_on(port, Answer::Config(kubelet_configz()))
        .await
        .unwrap();
    let nrt = s
        .nrt_where(|n| n.attribute(attr::TOPOLOGY_MANAGER_POLICY) == Some("single-numa-node"))
        .await;
    assert_eq!(nrt.attribute(attr::CPU_MANAGER_POLICY), Some("static"));
    agent
        .until("numaplane_exporter_kubelet_config_source{source=configz} == 1")
        .await;
    // The unavailable stretch was one Event, however many resyncs it lasted.
    assert_eq!(node_events(&s, "KubeletConfigUnavailable").await.len(), 1);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_configz_does_not_hold_up_publishing() {
    use numaplane::nrt::attr;
    let s = Setup::plain().await;
    let kubelet = configz_kubelet().await;
    kubelet.set_delay(Duration::from_secs(120));
    let mut flags = with_ca(kubelet_api_flags(kubelet.port()));
    flags.extend(["--kubelet-config-timeout".to_owned(), "1s".to_owned()]);
    let agent = s.agent("1s", &strs(&flags)).await;
    // From the metrics server up (the binary may have been built just before).
    let started = std::time::Instant::now();
    let nrt = s.wait_available("node-0", "cpu", "16").await;
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "published after {waited:?} with a /configz that takes 120 s\n{}",
        agent.stderr()
    );
    assert_eq!(nrt.attribute(attr::TOPOLOGY_MANAGER_POLICY), None);
    agent
        .until("numaplane_exporter_kubelet_config_errors_total{source=configz,reason=timeout} >= 2")
        .await;
    // Scans go on while reads time out beside them.
    s.touch_notify();
    agent
        .until("numaplane_exporter_scans_total{trigger=notify_file,result=success} >= 1")
        .await;
    kubelet.set_delay(Duration::ZERO);
    s.nrt_where(|n| n.attribute(attr::TOPOLOGY_MANAGER_POLICY) == Some("single-numa-node"))
        .await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configz_through_the_api_servers_node_proxy() {
    use numaplane::nrt::attr;
    // The node proxy needs a kubelet behind the Node: the fake plays both.
    let s = Setup::fake(true).await;
    let fake = s.api.fake().unwrap();
    fake.set_node_configz(&s.node, Some(kubelet_configz()));
    let agent = s.agent("1h", &["--kubelet-configz", "api-server"]).await;
    let nrt = s.kubelet_config_published(&agent).await;
    assert_eq!(
        nrt.attribute(attr::TOPOLOGY_MANAGER_POLICY),
        Some("single-numa-node")
    );
    let path = format!("/api/v1/nodes/{}/proxy/configz", s.node);
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == path),
        "no {path}"
    );
    assert_metric(
        &agent.metrics().unwrap(),
        "numaplane_exporter_kubelet_config_source{source=configz} == 1",
    );
}

/// DRA devices per zone: a ResourceSlice of this node on the API server (GPUs on NUMA nodes 0
/// and 1, one without NUMA node) and a pod whose two containers share a claim on the fake
/// kubelet (pod-resources `dynamic_resources`). The zone attributes and the metrics count
/// exactly the claimed devices as allocated, the rest as free, and follow the claims and the
/// slice as they change; the zones' resources do not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_devices_are_counted_per_zone_from_the_claims_and_the_node_slices() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use numaplane::nrt::attr;
    use numaplane::proto::podresources::{ClaimResource, DynamicResource};
    const GPU: &str = "gpu.example.com";
    let s = Setup::plain().await;
    let slices: Api<ResourceSlice> = Api::all(s.api.client());
    let slice_name = format!("{}-gpus", s.node);
    let slice = |devices: serde_json::Value| -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": GPU,
                "nodeName": s.node,
                "pool": {"name": s.node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            }
        }))
        .unwrap()
    };
    let gpu = |name: &str, numa: Option<i64>| match numa {
        Some(n) => {
            serde_json::json!({"name": name, "attributes": {"resource.kubernetes.io/numaNode": {"int": n}}})
        }
        None => serde_json::json!({"name": name}),
    };
    let four = serde_json::json!([
        gpu("gpu-0", Some(0)),
        gpu("gpu-1", Some(0)),
        gpu("gpu-2", Some(1)),
        gpu("gpu-3", Some(1)),
        gpu("gpu-4", None),
    ]);
    slices.create(&Default::default(), &slice(four)).await.unwrap();
    // Another node's slice: not this node's devices.
    let other_name = format!("{}-other", s.node);
    let mut other = slice(serde_json::json!([gpu("gpu-0", Some(0))]));
    other.metadata.name = Some(other_name.clone());
    other.spec.node_name = Some(format!("{}-elsewhere", s.node));
    other.spec.pool.name = format!("{}-elsewhere", s.node);
    slices.create(&Default::default(), &other).await.unwrap();

    let claim = DynamicResource {
        claim_name: "gpus".into(),
        claim_namespace: NAMESPACE.into(),
        claim_resources: ["gpu-0", "gpu-2", "gpu-4"]
            .iter()
            .map(|d| ClaimResource {
                driver_name: GPU.into(),
                pool_name: s.node.clone(),
                device_name: (*d).into(),
                ..Default::default()
            })
            .collect(),
    };
    let mut with_claim = pod(&s.machine, "dra", 2, false);
    let mut sidecar = with_claim.containers[0].clone();
    sidecar.name = "sidecar".into();
    sidecar.cpu_ids.clear();
    with_claim.containers.push(sidecar);
    for c in &mut with_claim.containers {
        c.dynamic_resources = vec![claim.clone()];
    }
    s.kubelet.set_pods(vec![with_claim]);
    let agent = s.agent("200ms", &[]).await;

    let nrt = s
        .nrt_where(|n| zone_attribute(n, "node-1", attr::DRA_DEVICES).is_some())
        .await;
    assert_eq!(
        zone_attribute(&nrt, "node-0", attr::DRA_DEVICES).as_deref(),
        Some("gpu.example.com=1/2")
    );
    assert_eq!(
        zone_attribute(&nrt, "node-1", attr::DRA_DEVICES).as_deref(),
        Some("gpu.example.com=1/2")
    );
    assert_eq!(
        node_attribute(&nrt, attr::DRA_DEVICES_WITHOUT_NUMA).as_deref(),
        Some("gpu.example.com=0/1")
    );
    // The claims do not touch the resources: the pod's 2 CPUs only.
    assert_eq!(available(&nrt, "node-0", "cpu").as_deref(), Some("14"));
    let gauge = |text: &str, name: &str, numa: &str| {
        metric_value(
            text,
            name,
            &[("node", s.node.as_str()), ("numa_node", numa), ("driver", GPU)],
        )
    };
    let text = agent.metrics().unwrap();
    let allocated: f64 = ["0", "1", "none"]
        .iter()
        .map(|n| gauge(&text, "numaplane_exporter_dra_devices_allocated", n).unwrap())
        .sum();
    assert_eq!(allocated, 3.0, "the three claimed devices\n{text}");
    for (numa, held, free) in [("0", 1.0, 1.0), ("1", 1.0, 1.0), ("none", 1.0, 0.0)] {
        assert_eq!(
            gauge(&text, "numaplane_exporter_dra_devices_allocated", numa),
            Some(held),
            "{numa}\n{text}"
        );
        assert_eq!(
            gauge(&text, "numaplane_exporter_dra_devices_free", numa),
            Some(free),
            "{numa}\n{text}"
        );
    }

    // The pod goes away: every device is free.
    s.kubelet.set_pods(vec![]);
    s.nrt_where(|n| {
        zone_attribute(n, "node-0", attr::DRA_DEVICES).as_deref() == Some("gpu.example.com=2/2")
            && node_attribute(n, attr::DRA_DEVICES_WITHOUT_NUMA).as_deref() == Some("gpu.example.com=1/1")
    })
    .await;
    // The driver republishes its pool with one GPU less on node 1: the watch follows.
    let mut smaller = slice(serde_json::json!([
        gpu("gpu-0", Some(0)),
        gpu("gpu-1", Some(0)),
        gpu("gpu-2", Some(1))
    ]));
    smaller.spec.pool.generation = 2;
    let current = slices.get(&slice_name).await.unwrap();
    smaller.metadata.resource_version = current.metadata.resource_version;
    slices
        .replace(&slice_name, &Default::default(), &smaller)
        .await
        .unwrap();
    let nrt = s
        .nrt_where(|n| {
            zone_attribute(n, "node-1", attr::DRA_DEVICES).as_deref() == Some("gpu.example.com=1/1")
        })
        .await;
    assert_eq!(node_attribute(&nrt, attr::DRA_DEVICES_WITHOUT_NUMA), None);
    agent
        .wait_metric(
            "numaplane_exporter_dra_devices_free",
            &[("numa_node", "1"), ("driver", GPU)],
            WAIT,
            |v| v == 1.0,
        )
        .await
        .unwrap();

    for name in [slice_name, other_name] {
        let _ = slices.delete(&name, &Default::default()).await;
    }
    s.cleanup().await;
}
