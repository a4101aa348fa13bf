//! A real Kubernetes control plane for the end-to-end tests: etcd, kube-apiserver and, on
//! request, kube-scheduler and kube-controller-manager from the kit at `../shared/k8s` (next to
//! the repository), started once per test binary and shared by its tests.
//!
//! Where the tests run:
//! - `NUMAPLANE_E2E_KUBECONFIG` set: that cluster (which must have deploy/crd.yaml installed);
//! - else the kit present (`../shared/k8s`, or `NUMAPLANE_E2E_K8S_KIT`): one control plane for the whole test binary, started by the first test
//!   that asks, with the NRT CRD installed. A start that fails fails the test: the kit is always
//!   there in CI, so a broken start must not pass as a skip;
//! - else (a fresh clone without the kit): a test that needs a real server prints one line saying
//!   what was not run and how to run it, and returns.
//!
//! Statics are never dropped, so the control plane is stopped by a watchdog: a `bash` process
//! that blocks reading a pipe whose only writer is this test process. When the process ends, by
//! any means, the kernel closes the pipe, and the watchdog runs `control-plane stop DIR` and
//! removes DIR.
//!
//! Tests of one binary run in parallel but share the cluster: [`exclusive`] serialises the ones
//! whose components read cluster-wide state (a scheduler sees every Node), and clears what an
//! earlier, possibly failed, test left behind.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use numaplane::nrt::NodeResourceTopology;

/// Environment variable naming a kubeconfig of a real cluster to run the tests against.
pub const REAL_CLUSTER_ENV: &str = "NUMAPLANE_E2E_KUBECONFIG";

/// Errors of the harness and of the control plane.
pub type HarnessError = Box<dyn std::error::Error + Send + Sync>;

/// What a test binary's control plane runs besides etcd and kube-apiserver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Run kube-scheduler with this KubeSchedulerConfiguration (block YAML, no
    /// `clientConnection`); `Some` with an empty path runs it with its defaults.
    pub scheduler_config: Option<PathBuf>,
    /// Run kube-controller-manager with these controllers (`*` for its defaults).
    pub controllers: Option<String>,
    /// Leave deploy/crd.yaml out (see [`ControlPlane::install_nrt_crd`]), for the tests of
    /// what the components do before it is installed.
    pub without_nrt_crd: bool,
    /// Flags added to kube-apiserver's command line (the kit's
    /// `CONTROL_PLANE_APISERVER_FLAGS`, after any already set there).
    pub apiserver_flags: Option<String>,
}

impl Options {
    /// A control plane whose kube-controller-manager runs `controllers` only (e.g.
    /// `resourceclaim-controller` for the DRA tests).
    pub fn with_controllers(controllers: &str) -> Options {
        Options {
            controllers: Some(controllers.to_owned()),
            ..Options::default()
        }
    }
}

/// A running control plane started from the kit.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    options: Options,
    // Held until the process exits: closing it is what tells the watchdog to stop the cluster.
    _watchdog: Mutex<ChildStdin>,
}

impl ControlPlane {
    /// The admin kubeconfig (`O=system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory of this cluster (certificates, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The component logs, e.g. `kube-apiserver.log`.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(name)).unwrap_or_default()
    }

    /// What it was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// A kube client for the admin kubeconfig (one per test: a client is tied to the tokio
    /// runtime that built it, and every `#[tokio::test]` has its own).
    pub async fn client(&self) -> Result<kube::Client, HarnessError> {
        client_for(&self.kubeconfig).await
    }

    /// Installs deploy/crd.yaml (when started [`Options::without_nrt_crd`]) and waits until it
    /// is established.
    pub fn install_nrt_crd(&self) -> Result<(), HarnessError> {
        Ok(install_nrt_crd(&self.kubeconfig)?)
    }

    /// Runs `kubectl --kubeconfig <admin> args`; returns stdout, or an error with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, HarnessError> {
        kubectl(&self.kubeconfig, args)
    }
}

/// A kube client for a kubeconfig file.
pub async fn client_for(path: &Path) -> Result<kube::Client, HarnessError> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Runs `kubectl --kubeconfig <kubeconfig> args`; returns stdout, or an error with stderr.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, HarnessError> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null());
    Ok(crate::render::run_kubectl(cmd, &format!("kubectl {args:?}"))?)
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// Environment variable naming the kit's directory when it is not `../shared/k8s` next to the
/// repository.
pub const KIT_ENV: &str = "NUMAPLANE_E2E_K8S_KIT";

/// The kit's directory: `$NUMAPLANE_E2E_K8S_KIT`, else `../shared/k8s` from the repository's
/// root.
pub fn kit_dir() -> PathBuf {
    std::env::var_os(KIT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/k8s"))
}

/// The kit's `control-plane` script, if it is there.
pub fn kit() -> Option<PathBuf> {
    let script = kit_dir().join("control-plane");
    script.is_file().then_some(script)
}

/// Where a test that needs a real API server runs.
#[derive(Debug)]
pub enum Cluster {
    /// The cluster of `NUMAPLANE_E2E_KUBECONFIG`.
    External(PathBuf),
    /// This binary's control plane from the kit.
    Kit(&'static ControlPlane),
}

impl Cluster {
    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        match self {
            Cluster::External(p) => p,
            Cluster::Kit(cp) => cp.kubeconfig(),
        }
    }

    /// The kit's control plane, when that is where the test runs.
    pub fn control_plane(&self) -> Option<&'static ControlPlane> {
        match self {
            Cluster::External(_) => None,
            Cluster::Kit(cp) => Some(cp),
        }
    }

    /// A kube client.
    pub async fn client(&self) -> Result<kube::Client, HarnessError> {
        client_for(self.kubeconfig()).await
    }
}

/// The real cluster for this test binary with default [`Options`]: see [`cluster_with`].
pub fn cluster() -> Result<Option<Cluster>, HarnessError> {
    cluster_with(&Options::default())
}

/// The real cluster: `NUMAPLANE_E2E_KUBECONFIG`'s, else this binary's control plane from the
/// kit (started on the first call, with `options`; every later call must ask for the same), else
/// `None` (no kit: a fresh clone). An error when the kit is there but the control plane did not
/// start, or when there is no kit in CI (`CI=true`), where it always is.
pub fn cluster_with(options: &Options) -> Result<Option<Cluster>, HarnessError> {
    if let Some(path) = std::env::var_os(REAL_CLUSTER_ENV) {
        return Ok(Some(Cluster::External(PathBuf::from(path))));
    }
    let Some(script) = kit() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(format!(
                "CI=true but the control-plane kit is missing at {}: CI always has it",
                kit_dir().display()
            )
            .into());
        }
        return Ok(None);
    };
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let cp = SHARED
        .get_or_init(|| start(&script, options))
        .as_ref()
        .map_err(|e| -> HarnessError { e.clone().into() })?;
    if &cp.options != options {
        return Err(format!(
            "this test binary's control plane runs with {:?}; a test asked for {options:?} (one control plane per binary: give all its tests the same options)",
            cp.options
        )
        .into());
    }
    Ok(Some(Cluster::Kit(cp)))
}

/// For a test that needs a real API server: the cluster, or `None` after printing the one line
/// that says `what` was not run and how to run it. Panics when the kit is there and the control
/// plane cannot be started (see [`cluster_with`]).
pub fn require(what: &str, options: &Options) -> Option<Cluster> {
    match cluster_with(options) {
        Ok(Some(c)) => Some(c),
        Ok(None) => {
            println!("{}", skip_line(what));
            None
        }
        Err(e) => panic!("{what}: no real API server: {e}"),
    }
}

/// The line a test prints when it does not run for want of a real API server.
pub fn skip_line(what: &str) -> String {
    format!(
        "SKIPPED (no real API server): {what}; run it with NUMAPLANE_E2E_KUBECONFIG=<kubeconfig of a cluster with deploy/crd.yaml>, or with the control-plane kit at {} (or {KIT_ENV}=<its directory>)",
        kit_dir().display()
    )
}

fn start(script: &Path, options: &Options) -> Result<ControlPlane, String> {
    let dir = tempfile::Builder::new()
        .prefix("numaplane-e2e-cp-")
        .tempdir()
        .map_err(|e| format!("cannot create the control plane's directory: {e}"))?
        .keep();
    // The watchdog first, so that even a start that dies half-way is cleaned up.
    let watchdog = spawn_watchdog(script, &dir)?;
    let mut cmd = Command::new("bash");
    cmd.arg(script).arg("start").arg(&dir);
    if let Some(config) = &options.scheduler_config {
        if config.as_os_str().is_empty() {
            cmd.arg("--scheduler");
        } else {
            cmd.arg("--scheduler-config").arg(config);
        }
    }
    if let Some(controllers) = &options.controllers {
        cmd.arg("--controllers").arg(controllers);
    }
    if let Some(flags) = &options.apiserver_flags {
        let before = std::env::var("CONTROL_PLANE_APISERVER_FLAGS").unwrap_or_default();
        cmd.env(
            "CONTROL_PLANE_APISERVER_FLAGS",
            format!("{before} {flags}").trim(),
        );
    }
    if std::env::var_os("CONTROL_PLANE_CACHE").is_none() {
        // The binaries are unpacked once for every test binary and every run.
        cmd.env(
            "CONTROL_PLANE_CACHE",
            repo_root().join("target/control-plane-cache"),
        );
    }
    let started = std::time::Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("bash {} start: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "`bash {} start {}` exited with {}:\n{stderr}",
            script.display(),
            dir.display(),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let kubeconfig = stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("control-plane start printed no kubeconfig path: {stdout:?}\n{stderr}"))?;
    if !options.without_nrt_crd {
        install_nrt_crd(&kubeconfig)?;
    }
    // The ServiceAccount admission plugin refuses a pod whose ServiceAccount does not exist, and
    // no controller manager creates `default/default` here.
    kubectl(
        &kubeconfig,
        &["create", "serviceaccount", "default", "--namespace", "default"],
    )
    .or_else(|e| {
        if e.to_string().contains("already exists") {
            Ok(String::new())
        } else {
            Err(e)
        }
    })
    .map_err(|e| format!("creating default/default: {e}"))?;
    eprintln!(
        "control plane from the kit up in {:.1}s at {} ({options:?})",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(ControlPlane {
        dir,
        kubeconfig,
        options: options.clone(),
        _watchdog: Mutex::new(watchdog),
    })
}

/// `kubectl apply` of deploy/crd.yaml, then waits until it is established.
fn install_nrt_crd(kubeconfig: &Path) -> Result<(), String> {
    let crd = repo_root().join("deploy/crd.yaml");
    let crd = crd.display().to_string();
    kubectl(kubeconfig, &["apply", "--server-side", "-f", &crd])
        .and_then(|_| {
            kubectl(
                kubeconfig,
                &[
                    "wait",
                    "--for=condition=established",
                    "--timeout=60s",
                    "crd/noderesourcetopologies.topology.node.k8s.io",
                ],
            )
        })
        .map(drop)
        .map_err(|e| format!("installing deploy/crd.yaml: {e}"))
}

/// A process that stops the control plane in `dir` and removes `dir` once its stdin closes,
/// i.e. when this process exits, whether it returns, panics or is killed.
fn spawn_watchdog(script: &Path, dir: &Path) -> Result<ChildStdin, String> {
    // Ctrl-C reaches the whole process group: ignore it here, so that the stop still runs.
    const WATCHDOG: &str = r#"trap '' INT HUP PIPE
read -r _ || true
bash "$1" stop "$2" >/dev/null 2>&1 || true
[ -n "${NUMAPLANE_E2E_KEEP_CONTROL_PLANE:-}" ] || rm -rf "$2""#;
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("numaplane-e2e-watchdog")
        .arg(script)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the control plane's watchdog: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("the watchdog has no stdin pipe")?;
    // Nothing is read before EOF; a write only proves the pipe is there.
    stdin.write_all(b"").map_err(|e| format!("watchdog pipe: {e}"))?;
    // Not waited for: it outlives this process, and init reaps it.
    drop(child);
    Ok(stdin)
}

/// Held by a test for its whole run against the kit's control plane: the tests of one binary
/// that hold it run one at a time, each on a cluster cleared of the labelled Nodes, NRTs and
/// pods an earlier test left (on `NUMAPLANE_E2E_KUBECONFIG`'s cluster nothing is deleted here:
/// each test removes its own objects).
pub struct Exclusive {
    _guard: tokio::sync::MutexGuard<'static, ()>,
}

/// Takes the binary-wide turn on the shared cluster and clears what earlier tests left.
pub async fn exclusive(cluster: &Cluster) -> Result<Exclusive, HarnessError> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = TURN.lock().await;
    if let Cluster::Kit(cp) = cluster {
        clear(&cp.client().await?).await?;
    }
    Ok(Exclusive { _guard: guard })
}

/// Deletes the Nodes labelled `numaplane.io/e2e=true`, every NRT, and the pods of namespaces
/// labelled `numaplane.io/e2e=true`, and waits until they are gone. Only on the kit's own
/// cluster, which nothing else uses.
async fn clear(client: &kube::Client) -> Result<(), HarnessError> {
    let e2e = ListParams::default().labels("numaplane.io/e2e=true");
    let now = DeleteParams::default().grace_period(0);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces.list(&e2e).await?.items {
        let Some(name) = ns.metadata.name else { continue };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &name);
        if !pods.list_metadata(&ListParams::default()).await?.items.is_empty() {
            pods.delete_collection(&now, &ListParams::default()).await?;
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    if !nodes.list_metadata(&e2e).await?.items.is_empty() {
        nodes.delete_collection(&now, &e2e).await?;
    }
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    // No NRTs to clear when the CRD is not installed (yet).
    let nrt_count = async || match nrts.list_metadata(&ListParams::default()).await {
        Ok(list) => Ok(list.items.len()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(0),
        Err(e) => Err(e),
    };
    if nrt_count().await? > 0 {
        nrts.delete_collection(&now, &ListParams::default()).await?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = nodes.list_metadata(&e2e).await?.items.len() + nrt_count().await?;
        for ns in namespaces.list(&e2e).await?.items {
            let Some(name) = ns.metadata.name else { continue };
            let pods: Api<Pod> = Api::namespaced(client.clone(), &name);
            left += pods.list_metadata(&ListParams::default()).await?.items.len();
        }
        if left == 0 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{left} objects of earlier tests still there after 30s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
