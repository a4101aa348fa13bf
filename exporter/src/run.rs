//! `numaplane-exporter run`: the agent loop, and its `--once`/`--dry-run` offline view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use kube::Client;
use numaplane::fingerprint::Method;
use numaplane::nrt::NodeResourceTopology;
use tokio::time::Instant;

use crate::accounting::{AccountingConfig, AnomalyKind, EXCLUDE_ALL_NODES, MachineView, PodExclude};
use crate::backoff::{Backoff, jittered};
use crate::configz::{ConfigzClient, ConfigzError, ConfigzVia, DEFAULT_KUBELET_PORT, KubeletTls};
use crate::kubelet_config::{self, TopologyManagerSettings};
use crate::kubelet_source::{Known, Refresh, Refresher, Sources};
use crate::metrics::Metrics;
use crate::output;
use crate::pod_watch::{self, PodKey, SharedPodView};
use crate::podresources::{DEFAULT_SOCKET, KubeletClient, PodResourcesError};
use crate::publish::{self, NodeEvents, Outcome, PublishError, Publisher};
use crate::scan::{Scan, ScanError, Scanner};
use crate::server::{self, Health, ServerError};
use crate::triggers::{self, NotifyFileError, Trigger, Triggers};

/// Arguments of `run`. Every flag also reads an environment variable, for DaemonSet manifests.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// This node's name (the object's name and the pod watch's field selector).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The kubelet pod-resources socket. Mount its directory, not the file, so that kubelet
    /// restarts (which recreate the socket) are survived.
    #[arg(long, env = "NUMAPLANE_PODRESOURCES_SOCKET", default_value = DEFAULT_SOCKET)]
    pub podresources_socket: PathBuf,
    /// Read the machine from this hwloc XML file instead of the live system.
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_XML")]
    pub topology_xml: Option<PathBuf>,
    /// Where the kubelet's effective configuration (its `/configz`: Topology Manager policy,
    /// scope and options, CPU and memory manager settings, with the kubelet's flags and drop-ins
    /// merged in) is read. It is tried first; `--kubelet-config` is the fallback.
    #[arg(long, env = "NUMAPLANE_KUBELET_CONFIGZ", value_enum, default_value_t = ConfigzVia::Kubelet)]
    pub kubelet_configz: ConfigzVia,
    /// This node's address, where `--kubelet-configz kubelet` reaches the kubelet (in a pod: the
    /// downward API's `status.hostIP`). Without it, /configz is not read from the kubelet.
    #[arg(long, env = "NODE_ADDRESS")]
    pub node_address: Option<String>,
    /// The kubelet's HTTPS port.
    #[arg(long, env = "NUMAPLANE_KUBELET_PORT", default_value_t = DEFAULT_KUBELET_PORT)]
    pub kubelet_port: u16,
    /// CA bundle (PEM) that signed the kubelet's serving certificate, re-read as it rotates.
    /// Default: the CA the agent trusts for the API server (in a pod, the ServiceAccount's
    /// `ca.crt`), which signs kubelet certificates issued through `serverTLSBootstrap` (EKS, GKE,
    /// AKS, k3s).
    #[arg(long, env = "NUMAPLANE_KUBELET_CA_FILE")]
    pub kubelet_ca_file: Option<PathBuf>,
    /// Accept any kubelet serving certificate (kubeadm's and kind's default, self-signed). The
    /// agent's token then goes to whatever answers at the node address and port, as with
    /// node-feature-discovery and metrics-server's `--kubelet-insecure-tls`.
    #[arg(long, env = "NUMAPLANE_KUBELET_INSECURE_SKIP_TLS_VERIFY")]
    pub kubelet_insecure_skip_tls_verify: bool,
    /// Timeout of one /configz read; a read never delays a scan.
    #[arg(long, env = "NUMAPLANE_KUBELET_CONFIG_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub kubelet_config_timeout: Duration,
    /// How long a kubelet configuration that was read is used before it is read again (the
    /// kubelet applies a new one only when it restarts; it is also read again when the kubelet's
    /// socket comes back and when the file changes). A failed read is retried at every resync.
    #[arg(long, env = "NUMAPLANE_KUBELET_CONFIG_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub kubelet_config_interval: Duration,
    /// The kubelet's KubeletConfiguration file, read when /configz does not answer (or is off):
    /// it misses settings the kubelet takes as command-line flags. Watched: a change is read at
    /// once. Flags below override either source.
    #[arg(long, env = "NUMAPLANE_KUBELET_CONFIG")]
    pub kubelet_config: Option<PathBuf>,
    /// The kubelet's drop-in directory (its `--config-dir`): every `*.conf` file, in lexical
    /// order, merged over `--kubelet-config` as the kubelet merges them.
    #[arg(long, env = "NUMAPLANE_KUBELET_CONFIG_DIR")]
    pub kubelet_config_dir: Option<PathBuf>,
    /// The kubelet's root directory (`/var/lib/kubelet` on the host, mounted read-only), whose
    /// checkpoints (`cpu_manager_state`, `memory_manager_state`,
    /// `device-plugins/kubelet_internal_checkpoint`) show what init containers still hold.
    /// Without it, or when a checkpoint is unusable, that is derived from the pod specs.
    #[arg(long, env = "NUMAPLANE_KUBELET_STATE_DIR")]
    pub kubelet_state_dir: Option<PathBuf>,
    /// Topology Manager policy (default: the kubelet configuration's; `none` when no source is
    /// configured; left out when no configured source answers).
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_MANAGER_POLICY", value_parser = kubelet_config::POLICIES)]
    pub topology_manager_policy: Option<String>,
    /// Topology Manager scope (default: the kubelet configuration's; `container` when no source
    /// is configured; left out when no configured source answers).
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_MANAGER_SCOPE", value_parser = kubelet_config::SCOPES)]
    pub topology_manager_scope: Option<String>,
    /// The kubelet's max-allowable-numa-nodes option, published as topologyManagerMaxNUMANodes.
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_MANAGER_MAX_NUMA_NODES", value_parser = clap::value_parser!(u32).range(1..))]
    pub topology_manager_max_numa_nodes: Option<u32>,
    /// The kubelet's prefer-closest-numa-nodes option, published as
    /// topologyManagerOptionPreferClosestNumaNodes.
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_MANAGER_PREFER_CLOSEST_NUMA_NODES")]
    pub topology_manager_prefer_closest_numa_nodes: Option<bool>,
    /// Leave a resource out of the zones: `NODE=RESOURCE`, or `*=RESOURCE` for every node.
    /// Repeatable (comma-separated in the environment variable).
    #[arg(long = "exclude-resource", env = "NUMAPLANE_EXCLUDE_RESOURCES", value_delimiter = ',', value_parser = parse_exclude_resource)]
    pub exclude_resources: Vec<(String, String)>,
    /// Account only pods of this namespace (`*` or empty: all).
    #[arg(long, env = "NUMAPLANE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Ignore pods matching `NAMESPACE_GLOB/NAME_GLOB`. Repeatable (comma-separated in the
    /// environment variable).
    #[arg(long = "exclude-pods", env = "NUMAPLANE_EXCLUDE_PODS", value_delimiter = ',', value_parser = parse_exclude_pods)]
    pub exclude_pods: Vec<PodExclude>,
    /// Which pods enter the pod-set fingerprint (`none` disables it).
    #[arg(long, env = "NUMAPLANE_PODS_FINGERPRINT_METHOD", value_enum, default_value_t = FingerprintArg::WithExclusiveResources)]
    pub pods_fingerprint_method: FingerprintArg,
    /// Scan once and exit.
    #[arg(long, env = "NUMAPLANE_ONCE")]
    pub once: bool,
    /// Print the object instead of publishing it (with --once: print and exit, no API server
    /// needed).
    #[arg(long, env = "NUMAPLANE_DRY_RUN")]
    pub dry_run: bool,
    /// Format of the printed object.
    #[arg(short = 'o', long, env = "NUMAPLANE_OUTPUT", value_enum, default_value_t = ObjectFormat::Yaml)]
    pub output: ObjectFormat,
    /// Kubeconfig file; default: in-cluster configuration. With --dry-run it is used only to
    /// drop terminal pods.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Period of the resync scan, which also re-reads allocatable resources (0: off).
    #[arg(long, env = "NUMAPLANE_RESYNC_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// An unchanged object is still written at least this often.
    #[arg(long, env = "NUMAPLANE_FORCE_WRITE_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub force_write_interval: Duration,
    /// A file whose writes trigger a scan (for OCI/runtime hooks). Created if missing.
    #[arg(long, env = "NUMAPLANE_NOTIFY_FILE")]
    pub notify_file: Option<PathBuf>,
    /// Quiet period that ends a burst of events.
    #[arg(long, env = "NUMAPLANE_DEBOUNCE", default_value = "5ms", value_parser = parse_duration)]
    pub debounce: Duration,
    /// Longest wait after the first event of a burst.
    #[arg(long, env = "NUMAPLANE_MAX_DEBOUNCE", default_value = "50ms", value_parser = parse_duration)]
    pub max_debounce: Duration,
    /// Pod-resources requests per second this agent allows itself (scans, admission polling
    /// and the allocator together); the kubelet serves 100/s to every client on the node.
    #[arg(long, env = "NUMAPLANE_KUBELET_REQUESTS_PER_SECOND", default_value_t = crate::podresources::DEFAULT_REQUESTS_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub kubelet_requests_per_second: u32,
    /// Minimum time between two scans, to stay far below the kubelet's shared 100 requests/s.
    #[arg(long, env = "NUMAPLANE_MIN_SCAN_INTERVAL", default_value = "20ms", value_parser = parse_duration)]
    pub min_scan_interval: Duration,
    /// Timeout of each pod-resources call (with --once: also how long to wait for the socket).
    #[arg(long, env = "NUMAPLANE_CALL_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub call_timeout: Duration,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "NUMAPLANE_METRICS_ADDRESS", default_value = "0.0.0.0:2112")]
    pub metrics_address: SocketAddr,
    /// First retry delay for the API server (CRD wait, failed writes).
    #[arg(long, env = "NUMAPLANE_API_BACKOFF_MIN", default_value = "5s", value_parser = parse_duration)]
    pub api_backoff_min: Duration,
    /// Longest retry delay for the API server.
    #[arg(long, env = "NUMAPLANE_API_BACKOFF_MAX", default_value = "60s", value_parser = parse_duration)]
    pub api_backoff_max: Duration,
    /// First retry delay for the kubelet (restarts, rate limiting).
    #[arg(long, env = "NUMAPLANE_KUBELET_BACKOFF_MIN", default_value = "200ms", value_parser = parse_duration)]
    pub kubelet_backoff_min: Duration,
    /// Longest retry delay for the kubelet.
    #[arg(long, env = "NUMAPLANE_KUBELET_BACKOFF_MAX", default_value = "10s", value_parser = parse_duration)]
    pub kubelet_backoff_max: Duration,
    /// This agent's pod name, reported in Events.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Pools file: host the node-side allocator (one device plugin per pool) in this agent;
    /// see docs/allocator.md.
    #[arg(long, env = "NUMAPLANE_POOLS")]
    pub pools: Option<PathBuf>,
    /// The kubelet's device-plugin directory (with `--pools`).
    #[arg(long, env = "NUMAPLANE_DEVICE_PLUGIN_DIR", default_value = crate::allocator::DEFAULT_DIR)]
    pub device_plugin_dir: PathBuf,
}

/// Fingerprint method flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FingerprintArg {
    /// Every listed pod.
    All,
    /// Pods holding exclusive resources (RTE's default).
    WithExclusiveResources,
    /// No fingerprint attribute.
    None,
}

/// Printed object format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectFormat {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn parse_exclude_resource(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((node, res)) if !node.is_empty() && !res.is_empty() => Ok((node.to_owned(), res.to_owned())),
        _ => Err(format!(
            "expected NODE=RESOURCE or {EXCLUDE_ALL_NODES}=RESOURCE, got {s:?}"
        )),
    }
}

fn parse_exclude_pods(s: &str) -> Result<PodExclude, String> {
    let (ns, name) = s
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| format!("expected NAMESPACE_GLOB/NAME_GLOB, got {s:?}"))?;
    for pattern in [ns, name] {
        glob::Pattern::new(pattern).map_err(|e| format!("invalid glob {pattern:?}: {e}"))?;
    }
    Ok(PodExclude {
        namespace_pattern: ns.to_owned(),
        name_pattern: name.to_owned(),
    })
}

/// Errors of `run`, split into bad configuration (exit 64) and runtime failures (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The machine cannot be read.
    #[error("cannot load the machine topology")]
    LoadMachine(#[source] numaplane_topology::TopologyError),
    /// `--node-address` does not form a URL.
    #[error("bad --node-address")]
    NodeAddress(#[source] ConfigzError),
    /// The kubeconfig cannot be loaded.
    #[error(transparent)]
    KubeConfig(#[from] crate::plumbing::PlumbingError),
    /// The socket path is unusable.
    #[error("bad --podresources-socket")]
    Socket(#[source] PodResourcesError),
    /// The metrics server cannot start.
    #[error("cannot start the metrics server")]
    Server(#[source] ServerError),
    /// The notify file cannot be used.
    #[error("bad --notify-file")]
    NotifyFile(#[source] NotifyFileError),
    /// A scan failed in `--once` mode.
    #[error("scan failed")]
    Scan(#[source] ScanError),
    /// Listing the node's pods failed in `--once` mode.
    #[error("cannot list the pods of node {node}")]
    ListPods {
        /// Node name.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Publishing failed in `--once` mode.
    #[error("publish failed")]
    Publish(#[source] PublishError),
    /// Printing failed.
    #[error("cannot print the object")]
    Render(#[source] output::OutputError),
    /// A supervised task (a trigger, a watch, the metrics server, the allocator) stopped: the
    /// agent exits so that the pod restarts, rather than run on without it.
    #[error("task {0} stopped")]
    TaskEnded(&'static str),
}

impl RunError {
    /// Whether the error is bad configuration (exit 64) rather than a runtime failure.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::LoadMachine(_)
                | Self::NodeAddress(_)
                | Self::KubeConfig(_)
                | Self::Socket(_)
                | Self::Server(_)
                | Self::NotifyFile(_)
        )
    }
}

/// The effective Topology Manager settings: the flags over what is known of the kubelet's
/// configuration.
pub fn effective_settings(args: &RunArgs, known: &Known) -> TopologyManagerSettings {
    let mut s = known.settings.clone().unwrap_or_default();
    if let Some(p) = &args.topology_manager_policy {
        s.policy = Some(p.clone());
    }
    if let Some(sc) = &args.topology_manager_scope {
        s.scope = Some(sc.clone());
    }
    if let Some(n) = args.topology_manager_max_numa_nodes {
        s.max_numa_nodes = Some(n);
    }
    if let Some(c) = args.topology_manager_prefer_closest_numa_nodes {
        s.prefer_closest_numa_nodes = Some(c);
    }
    s
}

/// Puts the effective kubelet settings for `known` into `cfg`; returns whether they changed.
pub fn apply_kubelet_settings(cfg: &mut AccountingConfig, args: &RunArgs, known: &Known) -> bool {
    let tm = effective_settings(args, known);
    let fresh = (
        tm.policy.unwrap_or_default(),
        tm.scope.unwrap_or_default(),
        tm.max_numa_nodes,
        tm.prefer_closest_numa_nodes,
        tm.resource_managers,
        known.unknown(),
    );
    let before = (
        std::mem::take(&mut cfg.topology_manager_policy),
        std::mem::take(&mut cfg.topology_manager_scope),
        cfg.max_numa_nodes,
        cfg.prefer_closest_numa_nodes,
        cfg.resource_managers.take(),
        cfg.kubelet_config_unknown,
    );
    let changed = before != fresh;
    (
        cfg.topology_manager_policy,
        cfg.topology_manager_scope,
        cfg.max_numa_nodes,
        cfg.prefer_closest_numa_nodes,
        cfg.resource_managers,
        cfg.kubelet_config_unknown,
    ) = fresh;
    changed
}

/// The info series' policy and scope labels for `cfg`: the kubelet defaults for empty values,
/// `unknown` when no configured source answered.
fn info_labels(cfg: &AccountingConfig) -> (&str, &str) {
    fn or<'a>(value: &'a str, unknown: bool, default: &'static str) -> &'a str {
        match (value, unknown) {
            ("", true) => "unknown",
            ("", false) => default,
            (v, _) => v,
        }
    }
    let unknown = cfg.kubelet_config_unknown;
    (
        or(
            &cfg.topology_manager_policy,
            unknown,
            crate::accounting::DEFAULT_TOPOLOGY_MANAGER_POLICY,
        ),
        or(
            &cfg.topology_manager_scope,
            unknown,
            crate::accounting::DEFAULT_TOPOLOGY_MANAGER_SCOPE,
        ),
    )
}

/// The kubelet configuration sources the flags configure. `kube` is the API client and its
/// configuration (none with `--dry-run` and no `--kubeconfig`): /configz needs credentials.
pub fn kubelet_sources(args: &RunArgs, kube: Option<&(Client, kube::Config)>) -> Result<Sources, RunError> {
    let configz = match (args.kubelet_configz, kube) {
        (ConfigzVia::Off, _) | (_, None) => None,
        (ConfigzVia::ApiServer, Some((client, _))) => {
            Some(ConfigzClient::api_server(client.clone(), &args.node_name))
        }
        (ConfigzVia::Kubelet, Some((_, config))) => {
            match args.node_address.as_deref().filter(|a| !a.is_empty()) {
                Some(address) => Some(
                    ConfigzClient::kubelet(
                        config,
                        "https",
                        address,
                        args.kubelet_port,
                        &KubeletTls {
                            ca_file: args.kubelet_ca_file.clone(),
                            insecure_skip_verify: args.kubelet_insecure_skip_tls_verify,
                        },
                        args.kubelet_config_timeout,
                    )
                    .map_err(RunError::NodeAddress)?,
                ),
                None => None,
            }
        }
    };
    Ok(Sources {
        configz,
        file: args.kubelet_config.clone(),
        dir: args.kubelet_config_dir.clone(),
        timeout: args.kubelet_config_timeout,
    })
}

/// The accounting configuration from the flags.
pub fn accounting_config(args: &RunArgs, tm: &TopologyManagerSettings) -> AccountingConfig {
    let mut resource_exclude: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, res) in &args.exclude_resources {
        resource_exclude
            .entry(node.clone())
            .or_default()
            .push(res.clone());
    }
    AccountingConfig {
        node_name: args.node_name.clone(),
        resource_exclude,
        watch_namespace: args.watch_namespace.clone(),
        pod_exclude: args.exclude_pods.clone(),
        terminal_pods: BTreeSet::new(),
        fingerprint_method: match args.pods_fingerprint_method {
            FingerprintArg::All => Some(Method::All),
            FingerprintArg::WithExclusiveResources => Some(Method::WithExclusiveResources),
            FingerprintArg::None => None,
        },
        topology_manager_policy: tm.policy.clone().unwrap_or_default(),
        topology_manager_scope: tm.scope.clone().unwrap_or_default(),
        max_numa_nodes: tm.max_numa_nodes,
        prefer_closest_numa_nodes: tm.prefer_closest_numa_nodes,
        resource_managers: tm.resource_managers.clone(),
        kubelet_config_unknown: false,
        cluster_shared: BTreeSet::new(),
        held_beyond_list: BTreeMap::new(),
        held_sources: None,
        memory_groups: None,
    }
}

/// Logs each anomaly once per distinct detail and scan streak, with context.
pub(crate) fn log_anomalies(node: &str, scan: &Scan, seen: &mut BTreeSet<String>) {
    let mut now = BTreeSet::new();
    for a in &scan.accounting.anomalies {
        if seen.contains(&a.detail) {
            tracing::debug!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly (repeated)");
        } else if a.kind == AnomalyKind::UnalignedDevice {
            tracing::info!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly");
        } else {
            tracing::warn!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly");
        }
        now.insert(a.detail.clone());
    }
    *seen = now;
}

/// Records where init containers' leftovers came from, and logs each unusable checkpoint once
/// per distinct problem (a metric counts every scan that met it).
pub(crate) fn note_init_held(node: &str, scan: &Scan, metrics: &Metrics, seen: &mut BTreeSet<String>) {
    metrics.record_held_sources(scan.held_sources);
    let mut now = BTreeSet::new();
    for e in &scan.checkpoint_errors {
        metrics.checkpoint_error(e);
        let text = e.to_string();
        if !seen.contains(&text) {
            tracing::warn!(
                node,
                file = e.file(),
                reason = e.kind(),
                error = %text,
                "kubelet checkpoint unusable; what init containers hold is derived from pod specs"
            );
        }
        now.insert(text);
    }
    *seen = now;
}

/// One `Get` per this interval at most: half of the default request budget, the rest is for
/// scans.
const ADMISSION_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How often the idle main loop reports itself alive.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// Runs `run`. Returns after `--once`, on SIGTERM/SIGINT, or on a configuration error.
pub async fn run(
    args: RunArgs,
    machine_view: MachineView,
    pools: Vec<crate::allocator::pools::Pool>,
) -> Result<(), RunError> {
    let mut cfg = accounting_config(&args, &TopologyManagerSettings::default());
    cfg.cluster_shared = pools
        .iter()
        .filter(|p| p.shared == crate::allocator::pools::Sharing::Cluster)
        .map(|p| p.resource.clone())
        .collect();
    let metrics = Arc::new(Metrics::new());
    let client = KubeletClient::new(&args.podresources_socket, args.call_timeout, metrics.clone())
        .map_err(RunError::Socket)?
        .with_budget(
            args.kubelet_requests_per_second,
            crate::podresources::DEFAULT_BURST,
        );
    let scanner = Scanner::new(client, machine_view, args.kubelet_state_dir.clone());
    // Without --kubeconfig a dry run needs no API server.
    let kube = if args.dry_run && args.kubeconfig.is_none() {
        None
    } else {
        Some(crate::plumbing::kube_client(args.kubeconfig.as_ref()).await?)
    };
    let sources = kubelet_sources(&args, kube.as_ref())?;
    if args.once {
        // A one-shot run keeps to one stderr line on failure; the sources are a detail here.
        tracing::debug!(node = %args.node_name, sources = %sources.describe(), "kubelet configuration sources");
        return crate::once::once(&args, cfg, scanner, metrics, kube.map(|(c, _)| c), sources).await;
    }
    Agent::start(args, cfg, scanner, metrics, pools, kube.map(|(c, _)| c), sources)
        .await?
        .run()
        .await
}

/// The long-running agent.
struct Agent {
    args: RunArgs,
    cfg: AccountingConfig,
    scanner: Scanner,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    triggers: Triggers,
    coalescer: triggers::Coalescer,
    kube: Option<Client>,
    publisher: Option<Publisher>,
    events: Option<NodeEvents>,
    pod_view: SharedPodView,
    listed: Arc<Mutex<BTreeSet<PodKey>>>,
    /// Every background task, named; one that ends takes the agent down (supervision).
    tasks: tokio::task::JoinSet<&'static str>,
    /// What is known of the kubelet's configuration, from the [`Refresher`].
    known: tokio::sync::watch::Receiver<Known>,
    /// Asks the [`Refresher`] to read the kubelet configuration.
    refresh: tokio::sync::mpsc::UnboundedSender<Refresh>,
    _notify: Option<notify::RecommendedWatcher>,
    _kubelet_config_watch: Option<notify::RecommendedWatcher>,
}

impl Agent {
    async fn start(
        args: RunArgs,
        mut cfg: AccountingConfig,
        scanner: Scanner,
        metrics: Arc<Metrics>,
        pools: Vec<crate::allocator::pools::Pool>,
        kube: Option<Client>,
        sources: Sources,
    ) -> Result<Self, RunError> {
        let health = Arc::new(Health::default());
        // Probes must tolerate the longest silent wait of the main loop: a resync period plus
        // the slowest retry.
        let max_silence =
            args.resync_interval.max(Duration::from_secs(10)) * 3 + args.api_backoff_max + args.call_timeout;
        let (addr, server_task) =
            server::serve(args.metrics_address, metrics.clone(), health.clone(), max_silence)
                .await
                .map_err(RunError::Server)?;
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        let (triggers, coalescer) = triggers::channel(args.debounce, args.max_debounce);
        let notify = match &args.notify_file {
            Some(path) => {
                Some(triggers::watch_notify_file(path, triggers.clone()).map_err(RunError::NotifyFile)?)
            }
            None => None,
        };
        let (refresh, refresh_requests) = tokio::sync::mpsc::unbounded_channel();
        let kubelet_config_watch = if args.kubelet_config.is_some() || args.kubelet_config_dir.is_some() {
            let tx = refresh.clone();
            let on_change = move || {
                let _ = tx.send(Refresh::Now);
            };
            match triggers::watch_kubelet_config(
                args.kubelet_config.as_deref(),
                args.kubelet_config_dir.as_deref(),
                on_change,
            ) {
                Ok(w) => Some(w),
                Err(e) => {
                    // Not fatal: the file may appear later, and it is read again at the resync.
                    tracing::warn!(error = %numaplane::error_chain(&e), "cannot watch the kubelet config; reading it at the resync only");
                    None
                }
            }
        } else {
            None
        };
        let mut tasks = tokio::task::JoinSet::new();
        supervise(&mut tasks, "metrics server", server_task);
        if let Some(timer) = triggers::spawn_resync_timer(triggers.clone(), args.resync_interval) {
            supervise(&mut tasks, "resync timer", timer);
        }
        let (c, t, m) = (scanner.client().clone(), triggers.clone(), metrics.clone());
        tasks.spawn(async move {
            crate::kubelet_watch::kubelet_watch(c, t, m).await;
            "kubelet watch"
        });
        let pod_view = SharedPodView::default();
        let listed = Arc::new(Mutex::new(BTreeSet::new()));
        let (mut publisher, mut events) = (None, None);
        if let Some(client) = &kube {
            let admissions = Arc::new(tokio::sync::Notify::new());
            let watch = pod_watch::run(
                client.clone(),
                args.node_name.clone(),
                pod_view.clone(),
                triggers.clone(),
                metrics.clone(),
                admissions.clone(),
            );
            tasks.spawn(async move {
                watch.await;
                "pod watch"
            });
            let poller = pod_watch::poll_admissions(
                scanner.client().clone(),
                pod_view.clone(),
                listed.clone(),
                triggers.clone(),
                ADMISSION_POLL_INTERVAL,
                Duration::from_secs(5),
                admissions,
            );
            tasks.spawn(async move {
                poller.await;
                "admission poller"
            });
            if !args.dry_run {
                let p = Publisher::new(
                    client.clone(),
                    &args.node_name,
                    args.force_write_interval,
                    metrics.clone(),
                );
                let own = crate::own_object::watch_own_object(
                    client.clone(),
                    args.node_name.clone(),
                    p.applied(),
                    triggers.clone(),
                    metrics.clone(),
                );
                tasks.spawn(async move {
                    own.await;
                    "own-object watch"
                });
                publisher = Some(p);
                // events.k8s.io requires a reporting instance (422 without one): outside a
                // pod, the node name identifies this agent just as well.
                let instance = args
                    .pod_name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("numaplane-exporter-{}", args.node_name));
                events = Some(NodeEvents::new(client.clone(), &args.node_name, Some(instance)));
            }
        }
        if !pools.is_empty() {
            // The same client: one request budget for the agent and the allocator.
            let kubelet = scanner.client().clone();
            let instance = args
                .pod_name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("numaplane-exporter-{}", args.node_name));
            let allocator = crate::allocator::AllocatorConfig {
                pools,
                dir: args.device_plugin_dir.clone(),
                node: args.node_name.clone(),
                instance,
                resync: args.resync_interval.min(Duration::from_secs(2)),
                rescan: crate::allocator::DEFAULT_RESCAN_INTERVAL,
                topology_xml: args.topology_xml.clone(),
            };
            crate::allocator::start(&mut tasks, allocator, kube.clone(), kubelet, metrics.clone());
        }
        tracing::info!(node = %args.node_name, sources = %sources.describe(), "kubelet configuration sources");
        let no_sources = sources.is_empty();
        let (mut refresher, known) = Refresher::new(
            sources,
            args.kubelet_config_interval,
            triggers.clone(),
            metrics.clone(),
            events.clone(),
            args.node_name.clone(),
        );
        // The first object carries the kubelet's settings when a source answers within its
        // timeout; after that, reads run beside the scans and never delay one.
        refresher.refresh().await;
        apply_kubelet_settings(&mut cfg, &args, &known.borrow());
        let (policy, scope) = info_labels(&cfg);
        metrics.set_info(&args.node_name, policy, scope);
        if !no_sources {
            tasks.spawn(async move {
                refresher.run(refresh_requests).await;
                "kubelet config"
            });
        }
        Ok(Self {
            args,
            cfg,
            scanner,
            metrics,
            health,
            triggers,
            coalescer,
            kube,
            publisher,
            events,
            pod_view,
            listed,
            tasks,
            known,
            refresh,
            _notify: notify,
            _kubelet_config_watch: kubelet_config_watch,
        })
    }

    /// Applies what the [`Refresher`] knows of the kubelet's configuration (flags still win), so
    /// a changed policy, scope, option or resource-manager setting reaches the next object.
    fn apply_kubelet_settings(&mut self) {
        let known = self.known.borrow_and_update().clone();
        if !apply_kubelet_settings(&mut self.cfg, &self.args, &known) {
            return;
        }
        let (policy, scope) = info_labels(&self.cfg);
        tracing::info!(
            policy,
            scope,
            source = known.source.as_str(),
            "kubelet settings changed"
        );
        self.metrics.set_info(&self.args.node_name, policy, scope);
    }

    /// Asks for a read of the kubelet configuration (the refresher decides whether a periodic
    /// one is due).
    fn request_refresh(&self, r: Refresh) {
        // Gone only while shutting down (the refresher is a supervised task).
        let _ = self.refresh.send(r);
    }

    async fn run(mut self) -> Result<(), RunError> {
        self.triggers.send(Trigger::Startup);
        let mut kubelet_backoff = Backoff::new(self.args.kubelet_backoff_min, self.args.kubelet_backoff_max);
        let mut api_backoff = Backoff::new(self.args.api_backoff_min, self.args.api_backoff_max);
        let mut retry: Option<tokio::task::JoinHandle<()>> = None;
        let mut crd_ready = false;
        let mut kubelet_down = false;
        let mut seen_anomalies = BTreeSet::new();
        let mut seen_checkpoint_errors = BTreeSet::new();
        let mut anomaly_kinds: BTreeSet<AnomalyKind> = BTreeSet::new();
        let mut last_scan_at: Option<Instant> = None;
        let mut last_printed: Option<NodeResourceTopology> = None;
        let shutdown = crate::plumbing::shutdown_signal();
        tokio::pin!(shutdown);
        // Liveness tells whether this loop responds, not whether triggers arrive: on an idle
        // node with `--resync-interval 0` nothing may come for hours.
        let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let batch = tokio::select! {
                b = self.coalescer.next() => match b { Some(b) => b, None => break },
                _ = heartbeat.tick() => {
                    self.health.beat();
                    continue;
                }
                Some(ended) = self.tasks.join_next() => {
                    let name = match ended {
                        Ok(name) => name,
                        Err(e) if e.is_panic() => "(panicked)",
                        Err(_) => "(cancelled)",
                    };
                    self.metrics.error("task_ended");
                    self.health.set_not_ready(format!("task {name} stopped"));
                    tracing::error!(task = name, "a supervised task stopped; exiting so the pod restarts");
                    self.tasks.abort_all();
                    if let Some(r) = retry.take() {
                        r.abort();
                    }
                    return Err(RunError::TaskEnded(name));
                }
                () = &mut shutdown => {
                    tracing::info!("shutting down");
                    break;
                }
            };
            self.health.beat();
            if let Some(at) = last_scan_at {
                let next = at + self.args.min_scan_interval;
                if next > Instant::now() {
                    tokio::time::sleep_until(next).await;
                }
            }
            let label = batch.label();
            let periodic = batch
                .triggers
                .iter()
                .any(|t| matches!(t, Trigger::Startup | Trigger::Resync));
            if periodic || kubelet_down {
                self.scanner.refresh_allocatable();
            }
            if batch.triggers.contains(&Trigger::Resync) {
                // A failed read is retried at every resync; a good one after its interval.
                self.request_refresh(Refresh::Periodic);
            }
            self.apply_kubelet_settings();
            let force = batch.triggers.contains(&Trigger::ObjectChanged);
            if force && let Some(p) = self.publisher.as_mut() {
                p.invalidate();
            }
            let (synced, facts) = {
                let view = pod_watch::lock(&self.pod_view);
                self.cfg.terminal_pods = view.terminal.clone();
                // With a pod watch, facts are passed even before its first list completes
                // (empty then): the published sources stay the same from the first scan on,
                // and pods are matched as soon as the watch knows them.
                let facts = self.kube.is_some().then(|| view.facts.clone());
                (view.synced, facts)
            };

            let started = Instant::now();
            last_scan_at = Some(started);
            let result = self.scanner.scan(&self.cfg, facts.as_ref()).await;
            self.metrics
                .scan_duration
                .observe(started.elapsed().as_secs_f64());
            let scan = match result {
                Ok(scan) => scan,
                Err(e) => {
                    self.metrics.scan(label, e.kind());
                    // Readiness first: the Event below is an API call, and until it returns
                    // the probe must already say what the metric says.
                    self.health
                        .set_not_ready(format!("scan failed: {}", numaplane::error_chain(&e)));
                    self.metrics.stale.set(1);
                    let delay = match &e {
                        ScanError::ReadKubelet(pe) if pe.code() == Some(tonic::Code::ResourceExhausted) => {
                            jittered(kubelet_backoff.next_delay())
                        }
                        _ => kubelet_backoff.next_delay(),
                    };
                    if !kubelet_down {
                        kubelet_down = true;
                        if e.kind() == "kubelet_unavailable" {
                            self.metrics.kubelet_reconnects.inc();
                        }
                        tracing::warn!(
                            node = %self.args.node_name,
                            error = %numaplane::error_chain(&e),
                            retry_in = ?delay,
                            "scan failed; keeping the last published object"
                        );
                        if let Some(ev) = &self.events {
                            ev.warn(
                                &self.metrics,
                                "ScanFailed",
                                "Scan",
                                format!(
                                    "numaplane-exporter cannot read the kubelet; the published \
                                     topology may be stale: {}",
                                    numaplane::error_chain(&e)
                                ),
                            )
                            .await;
                        }
                    } else {
                        tracing::debug!(error = %numaplane::error_chain(&e), retry_in = ?delay, "scan failed again");
                    }
                    schedule_retry(&mut retry, &self.triggers, delay);
                    continue;
                }
            };
            if kubelet_down {
                tracing::info!(node = %self.args.node_name, "kubelet readable again");
                kubelet_down = false;
                // The kubelet may have restarted to apply a new configuration.
                self.request_refresh(Refresh::Now);
            }
            kubelet_backoff.reset();
            self.metrics.scan(label, "success");
            self.metrics
                .record_accounting(&self.args.node_name, &scan.accounting);
            log_anomalies(&self.args.node_name, &scan, &mut seen_anomalies);
            note_init_held(
                &self.args.node_name,
                &scan,
                &self.metrics,
                &mut seen_checkpoint_errors,
            );
            let kinds: BTreeSet<_> = scan
                .accounting
                .anomalies
                .iter()
                .map(|a| a.kind)
                .filter(|k| *k != AnomalyKind::UnalignedDevice)
                .collect();
            if !kinds.is_subset(&anomaly_kinds)
                && let Some(ev) = &self.events
            {
                let details: Vec<_> = scan
                    .accounting
                    .anomalies
                    .iter()
                    .filter(|a| kinds.contains(&a.kind) && !anomaly_kinds.contains(&a.kind))
                    .map(|a| format!("{}: {}", a.kind, a.detail))
                    .take(5)
                    .collect();
                ev.warn(
                    &self.metrics,
                    "AccountingAnomaly",
                    "Scan",
                    format!("suspicious kubelet data worked around: {}", details.join("; ")),
                )
                .await;
            }
            anomaly_kinds = kinds;
            *self
                .listed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = scan.listed_pods.clone();

            let Some(publisher) = self.publisher.as_mut() else {
                // Dry run: print each new object.
                if last_printed.as_ref() != Some(&scan.nrt) {
                    match crate::once::render(&scan.nrt, self.args.output) {
                        Ok(text) => println!("---\n{}", text.trim_end()),
                        Err(e) => tracing::error!(error = %numaplane::error_chain(&e), "cannot print"),
                    }
                    last_printed = Some(scan.nrt.clone());
                }
                self.metrics.stale.set(0);
                self.health.set_ready();
                continue;
            };
            if self.kube.is_some() && !synced {
                // Terminal pods would be counted as using their old resources.
                self.health
                    .set_not_ready("waiting for the pod watch to list this node's pods".to_owned());
                continue;
            }
            if !crd_ready {
                let Some(client) = &self.kube else { continue };
                match publish::crd_served(client).await {
                    Ok(()) => {
                        tracing::info!("NodeResourceTopology API is served");
                        crd_ready = true;
                        self.metrics.nrt_crd_installed.set(1);
                        api_backoff.reset();
                    }
                    Err(e) => {
                        self.metrics.error(e.kind());
                        if matches!(e, PublishError::CrdMissing { .. }) {
                            self.metrics.nrt_crd_installed.set(0);
                        }
                        let delay = api_backoff.next_delay();
                        tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?delay, "waiting for the CRD");
                        self.health.set_not_ready(numaplane::error_chain(&e));
                        schedule_retry(&mut retry, &self.triggers, delay);
                        continue;
                    }
                }
            }
            match publisher.publish(scan.nrt, force).await {
                Ok(outcome) => {
                    api_backoff.reset();
                    self.metrics.stale.set(0);
                    self.health.set_ready();
                    if outcome == Outcome::Written {
                        tracing::debug!(trigger = label, latency = ?batch.first_at.elapsed(), "object written");
                    }
                }
                Err(e) => {
                    self.metrics.error(e.kind());
                    self.metrics.stale.set(1);
                    if matches!(&e, PublishError::Apply { source: kube::Error::Api(s), .. } if s.code == 404)
                    {
                        // The CRD may have been deleted: discovery says so before the next write.
                        crd_ready = false;
                    }
                    let delay = api_backoff.next_delay();
                    tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?delay, "publish failed");
                    self.health
                        .set_not_ready(format!("publish failed: {}", numaplane::error_chain(&e)));
                    schedule_retry(&mut retry, &self.triggers, delay);
                }
            }
        }
        self.tasks.abort_all();
        if let Some(r) = retry {
            r.abort();
        }
        Ok(())
    }
}

/// Aborts the task when dropped (a [`tokio::task::JoinSet`] aborts its own tasks, not the
/// handles they await).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Puts an already spawned task under the agent's supervision as `name`.
fn supervise(
    tasks: &mut tokio::task::JoinSet<&'static str>,
    name: &'static str,
    handle: tokio::task::JoinHandle<()>,
) {
    tasks.spawn(async move {
        let mut guard = AbortOnDrop(handle);
        let _ = (&mut guard.0).await;
        name
    });
}

/// Sends [`Trigger::Retry`] after `delay`, unless a retry is already pending.
fn schedule_retry(pending: &mut Option<tokio::task::JoinHandle<()>>, triggers: &Triggers, delay: Duration) {
    if pending.as_ref().is_some_and(|h| !h.is_finished()) {
        return;
    }
    let triggers = triggers.clone();
    *pending = Some(tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        triggers.send(Trigger::Retry);
    }));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_supervised_task_that_ends_is_reported_by_name_and_aborting_stops_the_rest() {
        let mut tasks = tokio::task::JoinSet::new();
        supervise(&mut tasks, "short", tokio::spawn(async {}));
        let ran_on = Arc::new(AtomicBool::new(false));
        let flag = ran_on.clone();
        supervise(
            &mut tasks,
            "long",
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                flag.store(true, Ordering::SeqCst);
            }),
        );
        assert_eq!(tasks.join_next().await.unwrap().unwrap(), "short");
        // What the agent does next: abort everything; the inner task must stop too.
        tasks.abort_all();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !ran_on.load(Ordering::SeqCst),
            "an aborted supervised task kept running"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_seen_as_ended() {
        let mut tasks = tokio::task::JoinSet::new();
        #[allow(clippy::panic)]
        supervise(&mut tasks, "boom", tokio::spawn(async { panic!("boom") }));
        // The wrapper reports the name: the inner panic ends the wrapped handle.
        assert_eq!(tasks.join_next().await.unwrap().unwrap(), "boom");
    }
}
