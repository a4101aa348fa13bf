//! Harness for agent end-to-end tests: an API target (a real kube-apiserver, see
//! [`crate::control_plane`], or the HTTP-level fake where there is none or where a test injects
//! faults) and a running `numaplane-exporter run` process with its metrics endpoint.
//!
//! Tests talk to either target through kube-rs only, so the same assertions run against both.
//! Fake-only checks (request logs, injected API failures) go through [`ApiTarget::fake`].

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use numaplane::nrt::NodeResourceTopology;
use serde_json::json;

pub mod bench;
pub mod dra;
pub mod kubelet;
pub mod node;
pub mod nrt;
pub mod text;

use crate::fake_api::FakeApiServer;

pub use crate::control_plane::{HarnessError, REAL_CLUSTER_ENV};
pub use text::strip_ansi;

/// Where the agent publishes.
pub struct ApiTarget {
    client: kube::Client,
    kubeconfig: PathBuf,
    fake: Option<FakeApiServer>,
    cluster: Option<crate::control_plane::Cluster>,
    _turn: Option<crate::control_plane::Exclusive>,
    _dir: Option<tempfile::TempDir>,
}

impl ApiTarget {
    /// The real API server when there is one (see [`crate::control_plane`]): the cluster of
    /// `NUMAPLANE_E2E_KUBECONFIG`, else this test binary's control plane from the kit, with the
    /// test holding the binary's turn on it. Without either (a fresh clone), the HTTP-level fake
    /// with the NRT CRD installed, after one line saying that the real-server run was skipped.
    /// Panics when the kit is there but its control plane cannot be started.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(&crate::control_plane::Options::default()).await
    }

    /// [`Self::start`] on a control plane started with `options`.
    pub async fn start_with(options: &crate::control_plane::Options) -> Result<Self, HarnessError> {
        match crate::control_plane::cluster_with(options) {
            Ok(Some(cluster)) => Self::on(cluster).await,
            Ok(None) => {
                let test = std::thread::current().name().unwrap_or("this test").to_owned();
                println!(
                    "{}",
                    crate::control_plane::skip_line(&format!(
                        "{test} on a real kube-apiserver (ran on the HTTP-level fake)"
                    ))
                );
                Self::start_fake(true).await
            }
            Err(e) => panic!("no real API server: {e}"),
        }
    }

    /// The real cluster, holding the binary's turn on it.
    pub async fn on(cluster: crate::control_plane::Cluster) -> Result<Self, HarnessError> {
        let turn = crate::control_plane::exclusive(&cluster).await?;
        Ok(Self {
            client: cluster.client().await?,
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            fake: None,
            cluster: Some(cluster),
            _turn: Some(turn),
            _dir: None,
        })
    }

    /// Always the fake (for tests of what a real cluster cannot be made to do, such as a missing
    /// CRD), optionally without the CRD.
    pub async fn start_fake(with_crd: bool) -> Result<Self, HarnessError> {
        let fake = FakeApiServer::start().await?;
        if with_crd {
            fake.install_nrt_crd();
        }
        let dir = tempfile::tempdir()?;
        let kubeconfig = fake.write_kubeconfig(dir.path())?;
        Ok(Self {
            client: fake.client().await?,
            kubeconfig,
            fake: Some(fake),
            cluster: None,
            _turn: None,
            _dir: Some(dir),
        })
    }

    /// The fake server, when the target is the fake.
    pub fn fake(&self) -> Option<&FakeApiServer> {
        self.fake.as_ref()
    }

    /// Whether the target is a real cluster.
    pub fn is_real(&self) -> bool {
        self.fake.is_none()
    }

    /// The real cluster, when the target is one.
    pub fn cluster(&self) -> Option<&crate::control_plane::Cluster> {
        self.cluster.as_ref()
    }

    /// The kit's control plane, when the target is it (not the fake, not
    /// `NUMAPLANE_E2E_KUBECONFIG`'s cluster).
    pub fn control_plane(&self) -> Option<&'static crate::control_plane::ControlPlane> {
        self.cluster.as_ref().and_then(|c| c.control_plane())
    }

    /// The kubeconfig to hand to the agent.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Creates a Node named `name` (a fake node: no kubelet behind it) and returns its uid.
    pub async fn create_node(&self, name: &str) -> Result<String, HarnessError> {
        self.create_labelled_node(name, &[], None).await
    }

    /// Creates a Node labelled `numaplane.io/e2e=true` plus `labels`, and sets its
    /// `status.allocatable` when given (a JSON object of quantities); returns its UID.
    pub async fn create_labelled_node(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        allocatable: Option<serde_json::Value>,
    ) -> Result<String, HarnessError> {
        let nodes: Api<Node> = Api::all(self.client());
        let mut all: serde_json::Map<String, serde_json::Value> =
            labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        all.insert("numaplane.io/e2e".into(), json!("true"));
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": all},
        }))?;
        let created = nodes.create(&PostParams::default(), &node).await?;
        if let Some(allocatable) = allocatable {
            nodes
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"allocatable": allocatable}})),
                )
                .await?;
        }
        Ok(created.metadata.uid.unwrap_or_default())
    }

    /// Creates a namespace labelled `numaplane.io/e2e=true`, with the `default` ServiceAccount
    /// the ServiceAccount admission plugin requires of a pod (on the kit's control plane no
    /// controller manager creates it).
    pub async fn create_namespace(&self, name: &str) -> Result<(), HarnessError> {
        let namespaces: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
        }))?;
        namespaces.create(&PostParams::default(), &ns).await?;
        if self.is_real() {
            let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), name);
            let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
            match accounts.create(&PostParams::default(), &sa).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Creates a pod bound to `node` in `namespace` (bypassing any scheduler) with the given
    /// phase in its status.
    pub async fn create_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        phase: &str,
    ) -> Result<(), HarnessError> {
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"numaplane.io/e2e": "true"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
                     "tolerations": [{"operator": "Exists"}]},
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        self.set_pod_phase(namespace, name, phase).await
    }

    /// Sets a pod's `status.phase`, as the kubelet would.
    pub async fn set_pod_phase(&self, namespace: &str, name: &str, phase: &str) -> Result<(), HarnessError> {
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase}})),
        )
        .await?;
        Ok(())
    }

    /// The node's NRT, if any.
    pub async fn nrt(&self, node: &str) -> Result<Option<NodeResourceTopology>, HarnessError> {
        let api: Api<NodeResourceTopology> = Api::all(self.client());
        Ok(api.get_opt(node).await?)
    }

    /// Deletes the node's NRT.
    pub async fn delete_nrt(&self, node: &str) -> Result<(), HarnessError> {
        let api: Api<NodeResourceTopology> = Api::all(self.client());
        api.delete(node, &DeleteParams::default()).await?;
        Ok(())
    }

    /// Polls the node's NRT until `pred` holds; returns it.
    pub async fn wait_nrt<F: Fn(&NodeResourceTopology) -> bool>(
        &self,
        node: &str,
        timeout: Duration,
        pred: F,
    ) -> Result<NodeResourceTopology, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(nrt) = self.nrt(node).await?
                && pred(&nrt)
            {
                return Ok(nrt);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "NRT {node} did not reach the expected state within {timeout:?}: {:?}",
                    self.nrt(node).await?.map(|n| n.zones)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes a test's objects: every pod of `namespace` (no grace period), the NRTs and
    /// Nodes named `nodes`, then the namespace. Errors are ignored: what is gone is gone.
    pub async fn delete_test_objects(&self, namespace: &str, nodes: &[String]) {
        let client = self.client();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let _ = pods
            .delete_collection(
                &DeleteParams::default().grace_period(0),
                &kube::api::ListParams::default(),
            )
            .await;
        let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
        let node_api: Api<Node> = Api::all(client.clone());
        for n in nodes {
            let _ = nrts.delete(n, &DeleteParams::default()).await;
            let _ = node_api.delete(n, &DeleteParams::default()).await;
        }
        let namespaces: Api<Namespace> = Api::all(client);
        let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
    }

    /// The events.k8s.io Events of `namespace` with `reason`.
    pub async fn events_with_reason(
        &self,
        namespace: &str,
        reason: &str,
    ) -> Result<Vec<k8s_openapi::api::events::v1::Event>, HarnessError> {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client(), namespace);
        Ok(events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect())
    }

    /// The events.k8s.io Events of `namespace` with `reason` about the object named `name`.
    pub async fn events_about(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
    ) -> Result<Vec<k8s_openapi::api::events::v1::Event>, HarnessError> {
        let mut events = self.events_with_reason(namespace, reason).await?;
        events.retain(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name));
        Ok(events)
    }

    /// Removes what a test created on a real cluster (the fake is dropped whole).
    pub async fn cleanup(&self, node: &str, namespace: &str) {
        if !self.is_real() {
            return;
        }
        let nrts: Api<NodeResourceTopology> = Api::all(self.client());
        let _ = nrts.delete(node, &DeleteParams::default()).await;
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        let _ = pods
            .delete_collection(&DeleteParams::default().grace_period(0), &lp)
            .await;
        let nodes: Api<Node> = Api::all(self.client());
        let _ = nodes.delete(node, &DeleteParams::default()).await;
    }
}

/// Does what the kubelet does for a pod whose deletion was asked (the kit's control plane has no
/// kubelet, so a bound pod deleted gracefully would stay `Terminating`): deletes it for good,
/// with a grace period of 0. Keeps each such pod as first seen with its `deletionTimestamp`,
/// for tests of what was written before the deletion. Stops when dropped.
pub struct Terminator {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Pod>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Terminator {
    /// The pods whose deletion it finished, each as it was when the deletion was asked.
    pub fn terminated(&self) -> Vec<Pod> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiTarget {
    /// A [`Terminator`] for the pods of `namespace`.
    pub fn finish_deletions(&self, namespace: &str) -> Terminator {
        use futures::StreamExt as _;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut finished = std::collections::BTreeSet::new();
            // With backoff: a watcher that fails (a stopped or overloaded server) retries at
            // once otherwise, and its errors come back ready, so this task would spin without
            // yielding and starve the test's runtime.
            let mut events = std::pin::pin!(
                watcher(pods.clone(), watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(ev) = events.next().await {
                let Ok(pod) = ev else { continue };
                if pod.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if !finished.insert(uid.clone()) {
                    continue;
                }
                let name = pod.metadata.name.clone().unwrap_or_default();
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(pod);
                let _ = pods
                    .delete(
                        &name,
                        &DeleteParams::default()
                            .grace_period(0)
                            .preconditions(kube::api::Preconditions {
                                uid: Some(uid),
                                resource_version: None,
                            }),
                    )
                    .await;
            }
        });
        Terminator { seen, task }
    }
}

/// The spec of a test pod for `scheduler`, tolerating every taint: one container `app`
/// (pause), Guaranteed with `limits` (its requests).
pub fn guaranteed_spec(scheduler: &str, limits: &serde_json::Value) -> serde_json::Value {
    json!({
        "schedulerName": scheduler,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": limits, "limits": limits}}]
    })
}

/// The NUMA affinity a kubelet admitting a container as its allocation record says (the
/// Topology Manager's hint the scheduler predicted), as the device manager takes it.
#[allow(clippy::expect_used)]
pub fn recorded_hint(c: &numaplane::allocation::ContainerAllocation) -> Vec<i64> {
    c.numa_nodes
        .as_ref()
        .expect("a record with a NUMA affinity")
        .iter()
        .map(|n| i64::from(*n))
        .collect()
}

/// A unique object name for this test run (real clusters are shared between runs).
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// A free local TCP port (bound and released; good enough for tests).
pub fn free_port() -> Result<u16, HarnessError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A running `numaplane-exporter run`. Killed on drop.
pub struct Agent {
    child: Child,
    metrics: SocketAddr,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
    /// How long [`Agent::until`] waits.
    wait: Duration,
}

/// How long [`Agent::until`] waits unless the test sets its own ([`Agent::set_wait`]).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

impl Agent {
    /// Starts the agent with `args` (after `run`); `--listen` is added. The environment
    /// is cleared of `NUMAPLANE_*` and `KUBECONFIG` so only the flags decide.
    pub fn spawn(args: &[String]) -> Result<Self, HarnessError> {
        Self::spawn_binary(
            crate::binaries::exporter(),
            "run",
            args,
            "--listen",
            "info,numaplane_exporter=debug",
        )
    }

    /// Starts `numaplane-exporter <subcommand>` with `args`; `--listen` is added.
    pub fn spawn_exporter(subcommand: &str, args: &[String]) -> Result<Self, HarnessError> {
        Self::spawn_binary(
            crate::binaries::exporter(),
            subcommand,
            args,
            "--listen",
            "info,numaplane_exporter=debug",
        )
    }

    /// Starts `numaplane-scheduler <subcommand>` with `args`; `--listen` is added.
    pub fn spawn_scheduler(subcommand: &str, args: &[String]) -> Result<Self, HarnessError> {
        Self::spawn_binary(
            crate::binaries::scheduler(),
            subcommand,
            args,
            "--listen",
            "info,numaplane_scheduler=debug,kube_lease_manager=info",
        )
    }

    /// Starts `binary subcommand args addr_flag <free port>` with a clean environment, logging
    /// with the `NUMAPLANE_LOG` filter `log`.
    pub fn spawn_binary(
        binary: &Path,
        subcommand: &str,
        args: &[String],
        addr_flag: &str,
        log: &str,
    ) -> Result<Self, HarnessError> {
        let dir = tempfile::tempdir()?;
        let stderr_path = dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path)?;
        let port = free_port()?;
        let metrics: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(binary);
        for (k, _) in std::env::vars_os() {
            let k_str = k.to_string_lossy();
            if k_str.starts_with("NUMAPLANE_")
                || k == "KUBECONFIG"
                || k == "NODE_ADDRESS"
                || k_str.starts_with("POD_")
            {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .arg(subcommand)
            .args(args)
            .arg(addr_flag)
            .arg(metrics.to_string())
            .env("NUMAPLANE_LOG", log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        Ok(Self {
            child,
            metrics,
            stderr_path,
            _dir: dir,
            wait: DEFAULT_WAIT,
        })
    }

    /// Sets how long [`Agent::until`] waits.
    pub fn set_wait(&mut self, wait: Duration) {
        self.wait = wait;
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process at once (SIGKILL: no chance to clean up) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The file the agent logs to (kept until the agent is dropped).
    pub fn stderr_path(&self) -> &Path {
        &self.stderr_path
    }

    /// What the agent logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// GET `path` on the metrics server: (status, body).
    pub fn http_get(&self, path: &str) -> Result<(u16, String), HarnessError> {
        http_get(self.metrics, path)
    }

    /// The address it serves on (`--listen`).
    pub fn addr(&self) -> SocketAddr {
        self.metrics
    }

    /// The current metrics text.
    pub fn metrics(&self) -> Result<String, HarnessError> {
        Ok(self.http_get("/metrics")?.1)
    }

    /// Waits until the metrics server answers.
    pub async fn wait_serving(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("agent exited with {status}: {}", self.stderr()).into());
            }
            if self.http_get("/healthz").is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("agent not serving after {timeout:?}: {}", self.stderr()).into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `condition` holds (see [`MetricCondition`], e.g.
    /// `numaplane_scheduler_nodes{state=valid} == 2`); returns the sample's value.
    pub async fn wait_until(&self, condition: &str, timeout: Duration) -> Result<f64, HarnessError> {
        let c = MetricCondition::parse(condition)?;
        let labels: Vec<(&str, &str)> = c.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.wait_metric(&c.name, &labels, timeout, |v| c.holds(v)).await
    }

    /// [`Agent::wait_until`] with the agent's own wait ([`DEFAULT_WAIT`] or [`Agent::set_wait`]);
    /// returns the sample's value. A test step: it fails the test, with the last scrape and
    /// the agent's log, when the condition does not hold in time.
    #[allow(clippy::panic)]
    pub async fn until(&self, condition: &str) -> f64 {
        match self.wait_until(condition, self.wait).await {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Waits until `/readyz` answers 200, within the agent's own wait.
    pub async fn wait_ready(&self) {
        self.eventually(Duration::from_millis(50), || async {
            match self.http_get("/readyz") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("not ready: {other:?}")),
            }
        })
        .await;
    }

    /// [`eventually`] with the agent's own wait: a failure also shows the agent's log.
    pub async fn eventually<T, F, Fut>(&self, every: Duration, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        match poll(self.wait, every, probe).await {
            Ok(v) => v,
            Err(seen) => panic!("{seen}\n{}", self.stderr()),
        }
    }

    /// Waits until `metric{labels}` satisfies `pred`; returns its value.
    pub async fn wait_metric<F: Fn(f64) -> bool>(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        timeout: Duration,
        pred: F,
    ) -> Result<f64, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics().unwrap_or_default();
            if let Some(v) = metric_value(&text, name, labels)
                && pred(v)
            {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name}{labels:?} = {:?} after {timeout:?}\n{text}\n{}",
                    metric_value(&text, name, labels),
                    self.stderr()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A condition on one metric sample, written `name{label=value,…} OP number` (labels
/// optional, values unquoted; OP one of `==`, `>=`, `>`, `<=`, `<`): a wait reads as the
/// assertion it makes.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricCondition {
    /// The sample's name.
    pub name: String,
    /// Labels the sample must carry (it may carry more).
    pub labels: Vec<(String, String)>,
    /// The comparison.
    pub op: String,
    /// The number compared with.
    pub value: f64,
}

impl MetricCondition {
    /// Parses `name{label=value,…} OP number`.
    pub fn parse(text: &str) -> Result<MetricCondition, HarnessError> {
        let bad = || -> HarnessError {
            format!("metric condition {text:?}: want `name{{k=v,…}} OP number`").into()
        };
        let (selector, rest) = text.trim().split_once(' ').ok_or_else(bad)?;
        let (op, value) = rest.trim().split_once(' ').ok_or_else(bad)?;
        if !["==", ">=", ">", "<=", "<"].contains(&op) {
            return Err(bad());
        }
        let value: f64 = value.trim().parse().map_err(|_| bad())?;
        let (name, labels) = match selector.split_once('{') {
            None => (selector, Vec::new()),
            Some((name, list)) => {
                let list = list.strip_suffix('}').ok_or_else(bad)?;
                let labels = list
                    .split(',')
                    .map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                            .ok_or_else(bad)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (name, labels)
            }
        };
        Ok(MetricCondition {
            name: name.to_owned(),
            labels,
            op: op.to_owned(),
            value,
        })
    }

    /// Whether a sample of value `v` meets the condition.
    pub fn holds(&self, v: f64) -> bool {
        match self.op.as_str() {
            "==" => v == self.value,
            ">=" => v >= self.value,
            ">" => v > self.value,
            "<=" => v <= self.value,
            _ => v < self.value,
        }
    }
}

/// The value of the first sample of `name` whose labels include all of `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.trim_end_matches('}')),
                None => (series, ""),
            };
            (metric == name).then_some((rest, value))
        })
        .find(|(rest, _)| {
            labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
}

/// Calls `probe` every `every` until it answers `Ok`, and returns what it answered; once
/// `timeout` has passed, the last `Err` (what was seen instead).
pub async fn poll<T, F, Fut>(timeout: Duration, every: Duration, mut probe: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match probe().await {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(format!("after {timeout:?}: {seen}"));
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll`] as a test step: fails the test with what was seen when `timeout` has passed.
pub async fn eventually<T, F, Fut>(timeout: Duration, every: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    match poll(timeout, every, probe).await {
        Ok(v) => v,
        Err(seen) => panic!("{seen}"),
    }
}

/// Asserts that `condition` (see [`MetricCondition`], e.g.
/// `numaplane_exporter_nrt_writes_total{result=success} == 1`) holds in the scrape `text`: a
/// sample of that name with those labels exists and its value compares as written. A failure
/// shows the scrape.
#[track_caller]
pub fn assert_metric(text: &str, condition: &str) {
    let c = match MetricCondition::parse(condition) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let labels: Vec<(&str, &str)> = c.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let value = metric_value(text, &c.name, &labels);
    assert!(
        value.is_some_and(|v| c.holds(v)),
        "want {condition}, got {value:?}\n{text}"
    );
}

/// Minimal HTTP/1.1 GET with `Connection: close`: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), HarnessError> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    read_response(stream)
}

/// Minimal HTTP/1.1 GET with an optional `Accept` header: (status, content type, body).
pub fn http_get_accept(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> Result<(u16, String, String), HarnessError> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, _) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let (status, body) = parse_response(&response)?;
    Ok((status, content_type, body))
}

/// Minimal HTTP/1.1 POST of a JSON body, as kube-scheduler calls an extender: (status, body).
/// Blocking: call it from `spawn_blocking` in async tests.
pub fn http_post(addr: SocketAddr, path: &str, body: &str) -> Result<(u16, String), HarnessError> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    read_response(stream)
}

fn read_response(mut stream: TcpStream) -> Result<(u16, String), HarnessError> {
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    parse_response(&response)
}

fn parse_response(response: &str) -> Result<(u16, String), HarnessError> {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("malformed HTTP response")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    // warp answers /metrics with a fixed length, but decode chunks defensively.
    Ok((status, dechunk(&body)))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, tail)) = rest.split_once("\r\n") else {
            return body.to_owned();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_owned();
        };
        if n == 0 {
            return out;
        }
        if tail.len() < n {
            return body.to_owned();
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
}

/// Arguments of `numaplane-exporter run` hosting the allocator, as the allocator tests and
/// benches start it: the 2-NUMA hwloc fixture, policy `single-numa-node`, the given sockets,
/// kubeconfig and pools file, and `extra` (e.g. a resync interval).
pub fn allocator_exporter_args(
    node: &str,
    podresources_socket: &Path,
    kubeconfig: &Path,
    pools: &Path,
    device_plugin_dir: &Path,
    extra: &[&str],
) -> Vec<String> {
    let fixture = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topology/tests/fixtures/2numa.xml"
    ));
    let mut args = device_plugin_args(
        node,
        podresources_socket,
        kubeconfig,
        pools,
        device_plugin_dir,
        fixture,
    );
    args.extend(["--topology-manager-policy".into(), "single-numa-node".into()]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Arguments of `numaplane-exporter device-plugin` (the allocator's own flags, which `run
/// --pools` takes too): the node, its kubelet's sockets, the machine's hwloc XML, the
/// kubeconfig and the pools file.
pub fn device_plugin_args(
    node: &str,
    podresources_socket: &Path,
    kubeconfig: &Path,
    pools: &Path,
    device_plugin_dir: &Path,
    topology_xml: &Path,
) -> Vec<String> {
    let flag = |name: &str, value: &Path| [format!("--{name}"), value.display().to_string()];
    let mut args = vec!["--node-name".to_owned(), node.to_owned()];
    args.extend(flag("podresources-socket", podresources_socket));
    args.extend(flag("topology-xml", topology_xml));
    args.extend(flag("kubeconfig", kubeconfig));
    args.extend(flag("pools", pools));
    args.extend(flag("device-plugin-dir", device_plugin_dir));
    args
}

/// Arguments of `numaplane-scheduler run` for a single unelected scheduler with a client
/// budget that is not the limit.
pub fn scheduler_run_args(kubeconfig: &Path) -> Vec<String> {
    [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--leader-elect=false",
        "--kube-api-qps",
        "1000",
        "--kube-api-burst",
        "1000",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::MetricCondition;

    #[test]
    fn a_metric_condition_reads_name_labels_comparison_and_number() {
        let c = MetricCondition::parse("numaplane_x_total{kind=crd_missing,resource=example.com/gpu} >= 2")
            .unwrap();
        assert_eq!(c.name, "numaplane_x_total");
        assert_eq!(
            c.labels,
            [
                ("kind".into(), "crd_missing".into()),
                ("resource".into(), "example.com/gpu".into())
            ]
        );
        assert!(c.holds(2.0) && c.holds(3.0) && !c.holds(1.0));
        let eq = MetricCondition::parse("numaplane_stale == 0").unwrap();
        assert!(eq.labels.is_empty());
        assert!(eq.holds(0.0) && !eq.holds(1.0));
        assert!(MetricCondition::parse("numaplane_y < 1").unwrap().holds(0.5));
        assert!(!MetricCondition::parse("numaplane_y > 1").unwrap().holds(1.0));
        assert!(MetricCondition::parse("numaplane_y <= 1").unwrap().holds(1.0));
        for bad in [
            "numaplane_y",
            "numaplane_y = 1",
            "numaplane_y == x",
            "n{k} == 1",
            "n{k=v == 1",
        ] {
            assert!(MetricCondition::parse(bad).is_err(), "{bad}");
        }
    }
}
