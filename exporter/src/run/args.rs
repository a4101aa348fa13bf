//! The command-line arguments of `run` and their parsers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::accounting::{EXCLUDE_ALL_NODES, PodExclude};
use crate::configz::{ConfigzVia, DEFAULT_KUBELET_PORT};
use crate::kubelet_config::{self};
use crate::podresources::DEFAULT_SOCKET;

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
    /// Count DRA devices per NUMA zone (metrics, the zone attribute `numaplane.io/dra-devices`):
    /// watches this node's ResourceSlices (`spec.nodeName`), so it needs list and watch on
    /// `resourceslices.resource.k8s.io`. Needs the API server (not with `--once`).
    #[arg(long, env = "NUMAPLANE_DRA_DEVICES", default_value_t = true, action = clap::ArgAction::Set)]
    pub dra_devices: bool,
    /// A driver-specific DRA device attribute holding the device's NUMA node:
    /// `DRIVER=ATTRIBUTE`, tried after `resource.kubernetes.io/numaNode` and before
    /// `pciBusID`/`pcieRoot`. Repeatable, in order (comma-separated in the environment
    /// variable); naming a driver replaces its built-in default, `DRIVER=` removes it. The same
    /// meaning as numaplane-scheduler's `draNuma.driverAttributes`.
    #[arg(long = "dra-numa-attribute", env = "NUMAPLANE_DRA_NUMA_ATTRIBUTES", value_delimiter = ',', value_parser = parse_dra_numa_attribute)]
    pub dra_numa_attributes: Vec<(String, String)>,
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
    /// Kubeconfig file; default: $KUBECONFIG, then in-cluster configuration. With --dry-run it
    /// is used only to drop terminal pods.
    #[arg(long, env = "NUMAPLANE_KUBECONFIG")]
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
    /// Address of /metrics, /healthz and /readyz [default: 0.0.0.0:2112]; the scheduler's flag
    /// of the same name.
    #[arg(long, env = "NUMAPLANE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Deprecated spelling of --listen, still read (with a warning in the log).
    #[arg(long, env = "NUMAPLANE_METRICS_ADDRESS", hide = true)]
    pub metrics_address: Option<SocketAddr>,
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

fn parse_dra_numa_attribute(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((driver, attr)) if !driver.trim().is_empty() => {
            Ok((driver.trim().to_owned(), attr.trim().to_owned()))
        }
        _ => Err(format!(
            "expected DRIVER=ATTRIBUTE (or DRIVER= to drop the driver's default), got {s:?}"
        )),
    }
}

impl RunArgs {
    /// Where /metrics and the probes are served (`--listen`, or the deprecated
    /// `--metrics-address`).
    pub fn listen_address(&self) -> SocketAddr {
        crate::server::listen_address(
            self.listen,
            self.metrics_address,
            SocketAddr::from(([0, 0, 0, 0], 2112)),
        )
    }

    /// The driver NUMA attributes: the built-in defaults, each driver named by
    /// `--dra-numa-attribute` replaced by its flags in order (`DRIVER=` leaves it none).
    pub fn dra_driver_attributes(&self) -> numaplane::device_numa::DriverNumaAttributes {
        let mut out = numaplane::device_numa::default_driver_numa_attributes();
        for driver in self.dra_numa_attributes.iter().map(|(d, _)| d) {
            out.insert(driver.clone(), Vec::new());
        }
        for (driver, attr) in &self.dra_numa_attributes {
            if let Some(list) = out.get_mut(driver)
                && !attr.is_empty()
            {
                list.push(attr.clone());
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_numa_attributes_follow_the_flags() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let args = Cli::try_parse_from([
            "x",
            "--node-name",
            "n1",
            "--dra-numa-attribute",
            "gpu.example.com=numa",
            "--dra-numa-attribute",
            "gpu.example.com=example.com/socketNuma",
            "--dra-numa-attribute",
            "dra.net=",
        ])
        .unwrap();
        let attrs = args.run.dra_driver_attributes();
        assert_eq!(
            attrs.get("gpu.example.com"),
            Some(&vec!["numa".to_owned(), "example.com/socketNuma".to_owned()])
        );
        assert_eq!(attrs.get("dra.net"), Some(&vec![]));
        assert_eq!(attrs.get("gpu.nvidia.com"), Some(&vec!["numa".to_owned()]));
        assert!(Cli::try_parse_from(["x", "--node-name", "n1", "--dra-numa-attribute", "=numa"]).is_err());
        assert!(Cli::try_parse_from(["x", "--node-name", "n1", "--dra-numa-attribute", "numa"]).is_err());
    }
}
