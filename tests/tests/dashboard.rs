//! Every query of `deploy/grafana-dashboard.json` against a real Prometheus server scraping a
//! real `numaplane-exporter run` agent with its device plugin (`--pools`) and a real
//! `numaplane-scheduler run`: a fake kubelet (2 NUMA nodes, hugepages, a device, pods holding
//! exclusive resources; and its device-plugin side, which asks the plugin once), the fake API
//! server (so that the agent publishes, the write, Event and error metrics exist, a pod's
//! allocation record disagrees with what the kubelet gave it, and the scheduler binds one pod
//! and fails another while Prometheus watches), Prometheus started by the test on a free port
//! with its own configuration and storage. A panel whose query fails, or answers nothing, is a broken
//! panel: a metric renamed in the exporter, a typo, a label that does not exist.
//!
//! Prometheus is Debian's `prometheus` package (`scripts/setup` installs it); without it the test
//! fails and says so. `NUMAPLANE_PROMETHEUS_BIN` selects another binary. The exporter binary is
//! built as in `exporter_dry_run.rs` (or taken from `NUMAPLANE_EXPORTER_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources, NumaNode,
    PodResources, TopologyInfo,
};
use numaplane_e2e::fake_api::FakeApiServer;
use numaplane_e2e::fake_device_kubelet::FakeDeviceKubelet;
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, Method};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The node the agent runs for.
const NODE: &str = "dash-node";

/// Scrape (and rule evaluation) interval of the test's Prometheus.
const SCRAPE_INTERVAL: &str = "1s";

/// What `$__rate_interval` becomes: several scrape intervals, so that a late scrape on a loaded
/// machine still leaves two samples in the window.
const RATE_INTERVAL: &str = "10s";

/// Longest wait for anything (process start, first samples, a query to return data).
const DEADLINE: Duration = Duration::from_secs(180);

/// How long, all together, the panel queries may take to have data once Prometheus has scraped
/// the agent a few times.
const QUERY_DEADLINE: Duration = Duration::from_secs(90);

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Binaries and child processes
// ---------------------------------------------------------------------------------------------

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn exporter_bin() -> &'static Path {
    numaplane_e2e::binaries::exporter()
}

/// `NUMAPLANE_PROMETHEUS_BIN`, else `prometheus` on `PATH`; a missing Prometheus is a failure.
fn prometheus_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NUMAPLANE_PROMETHEUS_BIN") {
        return PathBuf::from(bin);
    }
    let found = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "the dashboard test needs a Prometheus server, and `prometheus` is not on PATH: run \
             scripts/setup (it installs Debian's `prometheus` package), or set \
             NUMAPLANE_PROMETHEUS_BIN to a prometheus binary"
        )
    })
}

/// A child process killed (and reaped) on drop, with its output in files for diagnostics.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, mut cmd: Command, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).unwrap();
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc { name, child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Panics with the log if the process has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}); its output:\n{}", self.name, self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// `GET path` over HTTP/1.0 (no chunking, the server closes): status and body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read from {addr}: {e}"))?;
        Ok::<_, String>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| format!("GET http://{addr}{path}: no answer within 30s"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET http://{addr}{path}: malformed response {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET http://{addr}{path}: no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query parameter value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus HTTP API call: the `data` of a `success` answer, or why not.
async fn prom_api(prom: SocketAddr, path: &str) -> Result<Value, String> {
    let (status, body) = http_get(prom, path).await?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("{path}: HTTP {status}, not JSON ({e}): {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{path}: HTTP {status}: {body}"));
    }
    Ok(v["data"].clone())
}

/// An instant query: the result vector (`[{metric, value: [t, "v"]}]`).
async fn query(prom: SocketAddr, expr: &str) -> Result<Vec<Value>, String> {
    let data = prom_api(prom, &format!("/api/v1/query?query={}", encode(expr))).await?;
    match data["resultType"].as_str() {
        Some("vector") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
        Some("scalar") => Ok(vec![json!({"metric": {}, "value": data["result"]})]),
        other => Err(format!("{expr}: result type {other:?}, want vector or scalar")),
    }
}

fn sample_value(sample: &Value) -> f64 {
    let v = &sample["value"][1];
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

/// Polls until `f` succeeds, failing with its last error after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if start.elapsed() > DEADLINE => panic!("{what}: still failing after {DEADLINE:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The dashboard
// ---------------------------------------------------------------------------------------------

fn dashboard() -> Value {
    let path = workspace().join("deploy/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Every panel, rows' collapsed panels included, rows themselves excluded.
fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            if p["type"] != "row" {
                out.push(p);
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// One query of one panel.
struct PanelQuery {
    panel: String,
    ref_id: String,
    legend: String,
    expr: String,
}

fn panel_queries(dash: &Value) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(PanelQuery {
                panel: p["title"].as_str().unwrap_or_default().to_owned(),
                ref_id: t["refId"].as_str().unwrap_or_default().to_owned(),
                legend: t["legendFormat"].as_str().unwrap_or_default().to_owned(),
                expr: t["expr"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    out
}

/// Replaces Grafana variables (`$name`, `${name}`, `${name:fmt}`, `[[name]]`); an unknown one
/// is an error, so that a renamed template variable cannot hide in a query.
fn substitute(expr: &str, vars: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find(['$', '[']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let (name, len) = if let Some(braced) = tail.strip_prefix("${") {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
            let name = braced[..end].split(':').next().unwrap_or_default();
            (name, end + 3)
        } else if let Some(bracketed) = tail.strip_prefix("[[") {
            let end = bracketed
                .find("]]")
                .ok_or_else(|| format!("unclosed [[ in {expr}"))?;
            (&bracketed[..end], end + 4)
        } else if let Some(plain) = tail.strip_prefix('$') {
            let end = plain
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(plain.len());
            (&plain[..end], end + 1)
        } else {
            // A plain `[`, e.g. a range selector.
            out.push('[');
            rest = &tail[1..];
            continue;
        };
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable {name:?} in {expr}"))?;
        out.push_str(value);
        rest = &tail[len..];
    }
    out.push_str(rest);
    Ok(out)
}

fn vars(node: &str, numa_node: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("node", node.to_owned()),
        ("numa_node", numa_node.to_owned()),
        ("resource", ".*".to_owned()),
        ("datasource", "prometheus".to_owned()),
        ("__rate_interval", RATE_INTERVAL.to_owned()),
        ("__interval", SCRAPE_INTERVAL.to_owned()),
        ("__range", "5m".to_owned()),
    ])
}

/// `label_values(SELECTOR, LABEL)` of a query variable.
fn label_values_call(query: &str) -> Option<(&str, &str)> {
    let inner = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}

// ---------------------------------------------------------------------------------------------
// The node the agent sees
// ---------------------------------------------------------------------------------------------

fn on(node: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: node }],
    })
}

fn memory(kind: &str, size: u64, node: i64) -> ContainerMemory {
    ContainerMemory {
        memory_type: kind.into(),
        size,
        topology: on(node),
    }
}

fn gpu(id: &str, node: i64) -> ContainerDevices {
    ContainerDevices {
        resource_name: "example.com/gpu".into(),
        device_ids: vec![id.into()],
        topology: on(node),
    }
}

/// `hugepages-2sizes.xml`: node 0 has CPUs 0-3,8-11, node 1 4-7,12-15; the kubelet reserves CPUs
/// 0 and 8, so node 0 offers 6 CPUs and node 1 8. CPU 97 does not exist: one anomaly per scan.
fn allocatable() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: vec![1, 2, 3, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15, 97],
        devices: vec![gpu("gpu0", 0), gpu("gpu1", 1)],
        memory: vec![
            memory("memory", 20 * GIB, 0),
            memory("hugepages-2Mi", 2 * GIB, 0),
            memory("hugepages-1Gi", 4 * GIB, 0),
            memory("memory", 20 * GIB, 1),
            memory("hugepages-2Mi", GIB, 1),
            memory("hugepages-1Gi", 8 * GIB, 1),
        ],
    }
}

/// A Guaranteed pod pinned to node 0 (2 CPUs, 4Gi, 2 × 1Gi hugepages, gpu0) and a shared pod.
fn pods() -> Vec<PodResources> {
    vec![
        PodResources {
            name: "db".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "postgres".into(),
                cpu_ids: vec![2, 3],
                memory: vec![memory("memory", 4 * GIB, 0), memory("hugepages-1Gi", 2 * GIB, 0)],
                devices: vec![gpu("gpu0", 0)],
                // One DRA accelerator of the node's ResourceSlice (dra_slice), on NUMA node 1.
                dynamic_resources: vec![numaplane::proto::podresources::DynamicResource {
                    claim_name: "accel".into(),
                    claim_namespace: "default".into(),
                    claim_resources: vec![numaplane::proto::podresources::ClaimResource {
                        driver_name: DRA_DRIVER.into(),
                        pool_name: NODE.into(),
                        device_name: "accel-1".into(),
                        ..Default::default()
                    }],
                }],
            }],
            ..PodResources::default()
        },
        PodResources {
            name: "web".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "nginx".into(),
                ..ContainerResources::default()
            }],
            ..PodResources::default()
        },
    ]
}

/// The DRA driver of [`dra_slice`].
const DRA_DRIVER: &str = "accel.example.com";

/// The node's ResourceSlice: accelerators accel-0 on NUMA node 0, accel-1 and accel-2 on 1.
fn dra_slice() -> Value {
    let accel = |name: &str, numa: i64| json!({"name": name, "attributes": {"resource.kubernetes.io/numaNode": {"int": numa}}});
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-accel")},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [accel("accel-0", 0), accel("accel-1", 1), accel("accel-2", 1)],
        }
    })
}

fn pod_object(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {"phase": "Running"},
    })
}

/// The agent in publishing mode against `api`, serving metrics on `metrics`.
fn start_exporter(dir: &Path, socket: &Path, kubeconfig: &Path, metrics: SocketAddr, plugins: &Path) -> Proc {
    // The kubelet's GPUs as the allocator's pool, so its metrics exist.
    let pools = dir.join("pools.yaml");
    std::fs::write(
        &pools,
        json!({"pools": [{"resource": "example.com/gpu", "devices": [
            {"id": "gpu0", "numaNode": 0}, {"id": "gpu1", "numaNode": 1}]}]})
        .to_string(),
    )
    .unwrap();
    let xml = workspace().join("topology/tests/fixtures/hugepages-2sizes.xml");
    let mut cmd = Command::new(exporter_bin());
    cmd.arg("run")
        .args(["--node-name", NODE, "--pod-name", "numaplane-exporter-dash"])
        .arg("--podresources-socket")
        .arg(socket)
        .arg("--topology-xml")
        .arg(xml)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--listen", &metrics.to_string()])
        .args(["--resync-interval", "1s", "--force-write-interval", "3s"])
        .args(["--api-backoff-min", "200ms", "--api-backoff-max", "1s"])
        .args(["--log-level", "info,numaplane_exporter=debug"])
        .arg("--pools")
        .arg(&pools)
        .arg("--device-plugin-dir")
        .arg(plugins);
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("NUMAPLANE_") || key_str == "KUBECONFIG" {
            cmd.env_remove(&key);
        }
    }
    Proc::spawn("numaplane-exporter", cmd, dir)
}

/// The secondary scheduler against `kubeconfig`, serving metrics on `listen`; assumptions
/// expire quickly (no kubelet ever reports its pods), so their end is counted.
fn start_scheduler(dir: &Path, kubeconfig: &Path, listen: SocketAddr) -> Proc {
    let mut cmd = Command::new(numaplane_e2e::binaries::scheduler());
    cmd.arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--leader-elect=false", "--listen", &listen.to_string()])
        .args(["--assume-timeout", "2s", "--log-level", "info"]);
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("NUMAPLANE_") || key_str == "KUBECONFIG" || key_str.starts_with("POD_") {
            cmd.env_remove(&key);
        }
    }
    Proc::spawn("numaplane-scheduler", cmd, dir)
}

/// A Guaranteed pod for the scheduler.
fn pending_pod(name: &str, cpu: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "1Gi"}}}]},
    })
}

fn start_prometheus(dir: &Path, target: SocketAddr, scheduler: SocketAddr, listen: SocketAddr) -> Proc {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n  \
             evaluation_interval: {SCRAPE_INTERVAL}\n\
             scrape_configs:\n  - job_name: numaplane-exporter\n    static_configs:\n      \
             - targets: ['{target}']\n  - job_name: numaplane-scheduler\n    static_configs:\n      \
             - targets: ['{scheduler}']\n"
        ),
    )
    .unwrap();
    let data = dir.join("prometheus-data");
    std::fs::create_dir_all(&data).unwrap();
    let mut cmd = Command::new(prometheus_bin());
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={listen}"))
        .arg("--storage.tsdb.retention.time=1h")
        .current_dir(dir);
    Proc::spawn("prometheus", cmd, dir)
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_answers_from_a_real_prometheus() {
    let dash = dashboard();
    let queries = panel_queries(&dash);
    assert!(queries.len() >= 10, "only {} panel queries", queries.len());
    // Fail before starting anything when Prometheus is missing.
    let _ = prometheus_bin();

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket, allocatable(), pods(), FakeKubeletOptions::default())
        .await
        .unwrap();
    // A kubelet restarting at start-up: one failed scan, a ScanFailed Event, a retry.
    kubelet.fail_next(Method::List, 1, tonic::Code::Unavailable, "kubelet restarting");

    let api = FakeApiServer::start().await.unwrap();
    api.install_nrt_crd();
    api.put(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "example.com/gpu": "2"}}}),
    );
    for name in ["db", "web"] {
        api.put(pod_object(name));
    }
    api.put(dra_slice());
    // db's record planned gpu1 (NUMA 1), the kubelet gave it gpu0: a prediction mismatch.
    let mut db = pod_object("db");
    db["metadata"]["annotations"] = json!({numaplane::allocation::ANNOTATION: json!({
        "version": "v1", "node": NODE, "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "postgres", "kind": "app", "numaNodes": [1], "devices": {"example.com/gpu": ["gpu1"]}}]
    }).to_string()});
    api.put(db);
    // The first Node lookup fails: an error for the errors panel; a later publish finds it.
    api.fail_next("GET", &format!("/api/v1/nodes/{NODE}"), 500, 1);
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();

    let metrics_addr: SocketAddr = format!("127.0.0.1:{}", numaplane_e2e::harness::free_port().unwrap())
        .parse()
        .unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir(&plugins).unwrap();
    let device_kubelet = FakeDeviceKubelet::start(&plugins).await.unwrap();
    let mut exporter = start_exporter(dir.path(), &socket, &kubeconfig, metrics_addr, &plugins);
    device_kubelet
        .wait_registered("example.com/gpu", 1, DEADLINE)
        .await
        .unwrap();
    // The kubelet asks the plugin once (no pending record: the kubelet keeps its choice).
    device_kubelet
        .preferred("example.com/gpu", vec!["gpu1".into()], vec![], 1)
        .await
        .unwrap();
    let scheduler_addr: SocketAddr = format!("127.0.0.1:{}", numaplane_e2e::harness::free_port().unwrap())
        .parse()
        .unwrap();
    let mut scheduler = start_scheduler(dir.path(), &kubeconfig, scheduler_addr);

    // The agent has scanned, published, and been asked for its Node a second time.
    let needles = [
        "numaplane_exporter_zone_resource_allocatable{",
        "numaplane_exporter_nrt_writes_total{operation=\"apply\",result=\"success\"}",
        "numaplane_exporter_errors_total{kind=\"node_lookup\"}",
        "numaplane_exporter_allocator_mismatches_total{resource=\"example.com/gpu\"} 1",
        "numaplane_exporter_allocator_preferred_allocations_total{",
    ];
    let exposition = eventually("the exporter's /metrics", || {
        exporter.assert_running();
        async {
            let (status, body) = http_get(metrics_addr, "/metrics").await?;
            match needles.iter().find(|n| !body.contains(*n)) {
                None if status == 200 => Ok(body),
                missing => Err(format!("HTTP {status}, missing {missing:?}:\n{body}")),
            }
        }
    })
    .await;
    // Shown with the failure output.
    println!("the agent's /metrics:\n{exposition}");

    let prom_addr: SocketAddr = format!("127.0.0.1:{}", numaplane_e2e::harness::free_port().unwrap())
        .parse()
        .unwrap();
    let mut prometheus = start_prometheus(dir.path(), metrics_addr, scheduler_addr, prom_addr);
    eventually("Prometheus scraping the exporter and the scheduler", || {
        prometheus.assert_running();
        scheduler.assert_running();
        async {
            let up = query(prom_addr, "count_over_time(up[1m]) >= 5 and up == 1").await?;
            if up.len() < 2 {
                let targets = prom_api(prom_addr, "/api/v1/targets").await.unwrap_or_default();
                return Err(format!("fewer than 5 good scrapes yet; targets: {targets}"));
            }
            Ok(())
        }
    })
    .await;

    // While Prometheus watches: the scheduler binds one pod (its queue-to-bind histogram
    // changes within the range) and fails another; the placement's assumption then expires.
    api.put(pending_pod("sched-fits", "1"));
    api.put(pending_pod("sched-too-big", "64"));
    eventually("the scheduler binding a pod and expiring its assumption", || {
        scheduler.assert_running();
        let bound = api
            .get("v1", "Pod", Some("default"), "sched-fits")
            .is_some_and(|p| p["spec"]["nodeName"] == NODE);
        async move {
            let (_, body) = http_get(scheduler_addr, "/metrics").await?;
            let expired = body.contains("numaplane_scheduler_assumptions_ended_total{reason=\"expired\"}");
            let failed = body.contains("result=\"unschedulable\"");
            if bound && expired && failed {
                Ok(())
            } else {
                Err(format!(
                    "bound {bound}, expired {expired}, unschedulable {failed}:\n{body}"
                ))
            }
        }
    })
    .await;
    // A second pod once the `scheduled` series exists, so that its increase shows in range.
    api.put(pending_pod("sched-fits-2", "1"));
    eventually("the scheduler binding a second pod", || {
        let bound = api
            .get("v1", "Pod", Some("default"), "sched-fits-2")
            .is_some_and(|p| p["spec"]["nodeName"] == NODE);
        async move {
            if bound {
                Ok(())
            } else {
                Err("not bound".to_owned())
            }
        }
    })
    .await;
    check_datasources(&dash);
    check_variables(&dash, prom_addr).await;

    // Every query with one node and every NUMA node, every node and one NUMA node, both as
    // Grafana substitutes them (a single value, or the `.*` all-value).
    // One deadline for all queries: a broken one fails at once when the time is used up.
    let deadline = Instant::now() + QUERY_DEADLINE;
    let mut failures = Vec::new();
    for (node, numa) in [(NODE, ".*"), (".*", "0"), (NODE, "1")] {
        let vars = vars(node, numa);
        for q in &queries {
            let expr = match substitute(&q.expr, &vars) {
                Ok(e) => e,
                Err(e) => {
                    failures.push(format!("{} / {}: {e}", q.panel, q.ref_id));
                    continue;
                }
            };
            if let Err(e) = answers_with_data(prom_addr, &expr, deadline).await {
                failures.push(format!(
                    "{} / {} (node={node}, numa_node={numa}): {e}",
                    q.panel, q.ref_id
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "broken panels:\n{}\nexporter log (last lines):\n{}",
        failures.join("\n"),
        exporter.log_tail(40)
    );

    check_values(&queries, prom_addr).await;
    exporter.assert_running();
    scheduler.assert_running();
    prometheus.assert_running();
    kubelet.stop().await;
}

/// Non-empty, with at least one finite value, by `deadline` (a rate over a window that has no
/// second sample yet is empty for a moment).
async fn answers_with_data(prom: SocketAddr, expr: &str, deadline: Instant) -> Result<(), String> {
    loop {
        let outcome = match query(prom, expr).await {
            Ok(result) if result.iter().any(|s| sample_value(s).is_finite()) => return Ok(()),
            Ok(result) if result.is_empty() => format!("no series: {expr}"),
            Ok(result) => format!("only NaN/Inf values: {expr}: {result:?}"),
            // A query Prometheus rejects does not get better by waiting.
            Err(e) => return Err(e),
        };
        if Instant::now() > deadline {
            return Err(outcome);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every panel and query reads the `${datasource}` variable, which picks a Prometheus.
fn check_datasources(dash: &Value) {
    let ds = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "datasource")
        .expect("a `datasource` template variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let want = json!({"type": "prometheus", "uid": "${datasource}"});
    for p in panels(dash) {
        let title = p["title"].as_str().unwrap_or_default();
        assert_eq!(p["datasource"], want, "panel {title:?}");
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            assert_eq!(t["datasource"], want, "panel {title:?} query {}", t["refId"]);
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title:?} query {} has no expr",
                t["refId"]
            );
        }
    }
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
    }
}

/// The `node` and `numa_node` variables list what the agent exports.
async fn check_variables(dash: &Value, prom: SocketAddr) {
    let list = dash["templating"]["list"].as_array().unwrap();
    let mut seen = BTreeMap::new();
    for v in list.iter().filter(|v| v["type"] == "query") {
        let name = v["name"].as_str().unwrap();
        let raw = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap();
        let text = substitute(raw, &vars(NODE, ".*")).unwrap();
        let (selector, label) = label_values_call(&text)
            .unwrap_or_else(|| panic!("variable {name}: not label_values(SELECTOR, LABEL): {raw}"));
        let selector = selector.to_owned();
        let values: BTreeSet<String> = eventually(&format!("variable {name}"), || {
            let path = format!("/api/v1/series?match[]={}", encode(&selector));
            async move {
                let series = prom_api(prom, &path).await?;
                let values: BTreeSet<String> = series
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s[label].as_str().map(str::to_owned))
                    .collect();
                if values.is_empty() {
                    Err(format!("no values of {label} in {series}"))
                } else {
                    Ok(values)
                }
            }
        })
        .await;
        seen.insert(name.to_owned(), values);
    }
    assert_eq!(
        seen.get("node"),
        Some(&BTreeSet::from([NODE.to_owned()])),
        "{seen:?}"
    );
    assert_eq!(
        seen.get("numa_node"),
        Some(&BTreeSet::from(["0".to_owned(), "1".to_owned()])),
        "{seen:?}"
    );
    assert_eq!(
        seen.get("resource"),
        Some(&BTreeSet::from(
            [
                "cpu",
                "example.com/gpu",
                "hugepages-1Gi",
                "hugepages-2Mi",
                "memory"
            ]
            .map(str::to_owned)
        )),
        "{seen:?}"
    );
}

/// The query of `panel` whose legend contains `legend`.
fn find<'a>(queries: &'a [PanelQuery], panel: &str, legend: &str) -> &'a PanelQuery {
    queries
        .iter()
        .find(|q| q.panel == panel && q.legend.contains(legend))
        .unwrap_or_else(|| panic!("no query with legend {legend:?} in panel {panel:?}"))
}

/// The series of `q` for NUMA node `numa`, keyed by the labels named in `keys`.
async fn values_by(
    prom: SocketAddr,
    q: &PanelQuery,
    numa: &str,
    keys: &[&str],
) -> BTreeMap<Vec<String>, f64> {
    let expr = substitute(&q.expr, &vars(NODE, numa)).unwrap();
    query(prom, &expr)
        .await
        .unwrap()
        .iter()
        .map(|s| {
            let key = keys
                .iter()
                .map(|k| s["metric"][k].as_str().unwrap_or_default().to_owned())
                .collect();
            (key, sample_value(s))
        })
        .collect()
}

/// What the panels show is what the fake kubelet said.
async fn check_values(queries: &[PanelQuery], prom: SocketAddr) {
    let key = |parts: &[&str]| parts.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let cpus = "CPUs: available vs allocatable";
    let alloc = values_by(prom, find(queries, cpus, "allocatable"), ".*", &["numa_node"]).await;
    assert_eq!(alloc, BTreeMap::from([(key(&["0"]), 6.0), (key(&["1"]), 8.0)]));
    let avail = values_by(prom, find(queries, cpus, "available"), ".*", &["numa_node"]).await;
    assert_eq!(avail, BTreeMap::from([(key(&["0"]), 4.0), (key(&["1"]), 8.0)]));

    let memory = "Memory: available vs allocatable";
    let avail = values_by(prom, find(queries, memory, "available"), "0", &["numa_node"]).await;
    assert_eq!(avail, BTreeMap::from([(key(&["0"]), (16 * GIB) as f64)]));

    let huge = "Hugepages: available vs allocatable";
    let alloc = values_by(
        prom,
        find(queries, huge, "allocatable"),
        ".*",
        &["numa_node", "resource"],
    )
    .await;
    assert_eq!(
        alloc,
        BTreeMap::from([
            (key(&["0", "hugepages-1Gi"]), (4 * GIB) as f64),
            (key(&["0", "hugepages-2Mi"]), (2 * GIB) as f64),
            (key(&["1", "hugepages-1Gi"]), (8 * GIB) as f64),
            (key(&["1", "hugepages-2Mi"]), GIB as f64),
        ])
    );

    let devices = "Devices: available vs allocatable";
    let avail = values_by(
        prom,
        find(queries, devices, "available"),
        ".*",
        &["numa_node", "resource"],
    )
    .await;
    assert_eq!(
        avail,
        BTreeMap::from([
            (key(&["0", "example.com/gpu"]), 0.0),
            (key(&["1", "example.com/gpu"]), 1.0),
        ])
    );

    let util = &queries
        .iter()
        .find(|q| q.panel == "Utilisation by zone and resource")
        .unwrap();
    let util = values_by(prom, util, "0", &["resource"]).await;
    let cpu = util[&key(&["cpu"])];
    assert!(
        (cpu - 100.0 / 3.0).abs() < 1e-9,
        "CPU utilisation of node 0: {cpu}"
    );
    assert_eq!(util[&key(&["example.com/gpu"])], 100.0);

    // db's claim holds accel-1 (NUMA 1): one free accelerator on each NUMA node.
    let dra = "DRA devices: free vs allocated";
    let free = values_by(prom, find(queries, dra, "free"), ".*", &["numa_node", "driver"]).await;
    assert_eq!(
        free,
        BTreeMap::from([(key(&["0", DRA_DRIVER]), 1.0), (key(&["1", DRA_DRIVER]), 1.0)])
    );
    let held = values_by(
        prom,
        find(queries, dra, "allocated"),
        ".*",
        &["numa_node", "driver"],
    )
    .await;
    assert_eq!(
        held,
        BTreeMap::from([(key(&["0", DRA_DRIVER]), 0.0), (key(&["1", DRA_DRIVER]), 1.0)])
    );
    let glance = queries
        .iter()
        .find(|q| q.panel == "Free DRA devices by NUMA node")
        .unwrap();
    let glance = values_by(prom, glance, "1", &["numa_node", "driver"]).await;
    assert_eq!(glance, BTreeMap::from([(key(&["1", DRA_DRIVER]), 1.0)]));

    let pods = "Pods with exclusive resources";
    let exclusive = values_by(prom, find(queries, pods, "exclusive"), ".*", &["node"]).await;
    assert_eq!(exclusive, BTreeMap::from([(key(&[NODE]), 1.0)]));
    let accounted = values_by(prom, find(queries, pods, "accounted"), ".*", &["node"]).await;
    assert_eq!(accounted, BTreeMap::from([(key(&[NODE]), 2.0)]));

    let anomalies = values_by(
        prom,
        find(queries, "Accounting anomalies by kind", "kind"),
        ".*",
        &["kind"],
    )
    .await;
    assert!(
        anomalies.get(&key(&["unknown_cpu"])).is_some_and(|r| *r > 0.0),
        "CPU 97 is an unknown_cpu anomaly in the current scan: {anomalies:?}"
    );

    let calls = values_by(
        prom,
        find(queries, "Pod-resources calls by method and code", "code"),
        ".*",
        &["method", "code"],
    )
    .await;
    assert!(calls.contains_key(&key(&["List", "OK"])), "{calls:?}");
    // (The mismatch happened before Prometheus started, so its panel shows 0 over the range;
    // the exporter's count of 1 is checked on /metrics above.)
    let scheduled = queries.iter().find(|q| q.panel == "Scheduled (range)").unwrap();
    let scheduled = values_by(prom, scheduled, ".*", &[]).await;
    assert!(
        !scheduled.is_empty() && scheduled.values().all(|v| *v >= 0.9),
        "one pod bound: {scheduled:?}"
    );
    let stale = values_by(prom, find(queries, "Stale", "node"), ".*", &["node"]).await;
    assert_eq!(stale, BTreeMap::from([(key(&[NODE]), 0.0)]));
}
