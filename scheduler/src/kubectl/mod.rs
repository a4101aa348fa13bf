//! `kubectl numa`: the terminal view of numaplane, a kubectl plugin (binary `kubectl-numa`).
//!
//! - `top`: per node and NUMA zone, available vs allocatable resources from the
//!   NodeResourceTopologies, with the Topology Manager policy and scope and each object's age.
//! - `explain NAMESPACE/POD`: for a pending pod, every node's verdict from the scheduler's own
//!   model (the same cluster index and verdict text as `numaplane-scheduler simulate --explain
//!   all`, fed from the live Nodes, NRTs and bound Pods); for a bound pod, its recorded
//!   allocation next to what the node's NRT shows, and each DRA claim's devices with their NUMA
//!   nodes next to its containers' recorded ones.
//!
//! API access is in [`fetch`]; [`top`], [`explain`] and [`claims`] are pure functions over what
//! it read.
//!
//! Exit codes: [`EXIT_OK`], [`EXIT_API`], [`EXIT_DATA`], [`EXIT_USAGE`] (see docs/kubectl-numa.md).

pub mod claims;
pub mod explain;
pub mod fetch;
pub mod top;

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Success: the output is complete.
pub const EXIT_OK: u8 = 0;
/// The API server could not answer what was asked: unreachable, CRD not installed, access
/// denied, pod not found.
pub const EXIT_API: u8 = 1;
/// The output was printed, but the cluster data is incomplete: no NRTs, an NRT missing for a
/// node asked about, malformed NRTs, a malformed allocation record.
pub const EXIT_DATA: u8 = 2;
/// Bad command line, kubeconfig or scheduler config file.
pub const EXIT_USAGE: u8 = numaplane::EXIT_CONFIG;

/// numaplane for the terminal: per-NUMA availability and why a pod is (not) placed.
#[derive(Debug, Parser)]
#[command(name = "kubectl-numa", bin_name = "kubectl numa", version)]
pub struct Cli {
    /// Kubeconfig file [default: $KUBECONFIG, then ~/.kube/config, then in-cluster].
    #[arg(long, env = "NUMAPLANE_KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use [default: the current context].
    #[arg(long, env = "NUMAPLANE_CONTEXT", global = true)]
    pub context: Option<String>,
    /// Give up on an API request after this long.
    #[arg(long, env = "NUMAPLANE_REQUEST_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    pub request_timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per node and NUMA zone: available vs allocatable, Topology Manager policy and scope, and
    /// how fresh each NodeResourceTopology is.
    Top(TopArgs),
    /// Why a pod is pending (every node's verdict from the scheduler's model), or where a bound
    /// pod's recorded allocation sits in its node's NodeResourceTopology and where its DRA
    /// claims' devices sit relative to its containers' NUMA nodes.
    Explain(ExplainArgs),
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people.
    Table,
    /// JSON (schemas in docs/kubectl-numa.md).
    Json,
}

/// Arguments of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Only this node.
    #[arg(long, env = "NUMAPLANE_TOP_NODE")]
    pub node: Option<String>,
    /// Only this resource (e.g. cpu, memory, hugepages-1Gi, nvidia.com/gpu).
    #[arg(long, env = "NUMAPLANE_TOP_RESOURCE")]
    pub resource: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, env = "NUMAPLANE_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Arguments of `explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The pod, as NAMESPACE/POD (or POD in the context's namespace).
    pub pod: String,
    /// The scheduler's configuration file (as given to `numaplane-scheduler run --config`):
    /// its scoringStrategy, noTopology and draNuma apply to the verdicts, and
    /// draNuma.driverAttributes to the NUMA nodes of a bound pod's claim devices.
    #[arg(long, env = "NUMAPLANE_SCHEDULER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, env = "NUMAPLANE_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Why a command could not produce its output.
#[derive(Debug, thiserror::Error)]
pub enum KubectlError {
    /// The kubeconfig file cannot be used.
    #[error("loading kubeconfig {path}")]
    LoadKubeconfig {
        /// File.
        path: String,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig (or context) could be found or used.
    #[error("loading the kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")]
    InferConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The client cannot be built from the configuration.
    #[error("building the API client")]
    BuildClient(#[source] kube::Error),
    /// The scheduler config file cannot be read or parsed.
    #[error("scheduler config {path}: {message}")]
    ReadConfig {
        /// File.
        path: String,
        /// Why.
        message: String,
    },
    /// The NRT API is not served.
    #[error(
        "the NodeResourceTopology API ({api_version}) is not served by this cluster: install the CRD (kubectl apply -f deploy/crd.yaml, or the whole of numaplane with kubectl apply -k deploy/)"
    )]
    CrdMissing {
        /// Group/version asked for.
        api_version: &'static str,
    },
    /// The API server refused access.
    #[error("access denied: cannot {what}: {message} (ask for read access to it, see docs/kubectl-numa.md)")]
    Forbidden {
        /// Verb and resource.
        what: String,
        /// The server's message.
        message: String,
    },
    /// A request failed otherwise (unreachable server, timeout, server error).
    #[error("cannot {what}")]
    Request {
        /// Verb and resource.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The pod does not exist.
    #[error("pod {pod} not found")]
    PodNotFound {
        /// `namespace/name`.
        pod: String,
    },
    /// The pod argument is not `NAMESPACE/POD` or `POD`.
    #[error("{given:?} is not NAMESPACE/POD or POD")]
    ParsePodRef {
        /// As given.
        given: String,
    },
    /// The output cannot be written.
    #[error("writing the output")]
    WriteOutput(#[source] std::io::Error),
    /// The async runtime cannot start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
}

impl KubectlError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::LoadKubeconfig { .. }
            | Self::InferConfig(_)
            | Self::ReadConfig { .. }
            | Self::ParsePodRef { .. } => EXIT_USAGE,
            Self::BuildClient(_)
            | Self::CrdMissing { .. }
            | Self::Forbidden { .. }
            | Self::Request { .. }
            | Self::PodNotFound { .. }
            | Self::WriteOutput(_)
            | Self::Runtime(_) => EXIT_API,
        }
    }
}

/// What a command produced: its output, and problems with the cluster data that did not stop
/// it (each printed as one line on stderr; any makes the exit code [`EXIT_DATA`]).
#[derive(Debug, Default)]
pub struct Outcome {
    /// Standard output.
    pub stdout: String,
    /// One line per problem.
    pub problems: Vec<String>,
}

/// Runs the parsed command line: the output on stdout, problems and errors one line each on
/// stderr, and the documented exit code.
pub fn run(cli: Cli) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubectlError::Runtime)
        .and_then(|rt| rt.block_on(execute(&cli)));
    match outcome {
        Ok(outcome) => {
            let mut stdout = std::io::stdout().lock();
            if let Err(e) = stdout
                .write_all(outcome.stdout.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // A closed pipe (`| head`) is the reader's choice, not a failure worth a message.
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("kubectl-numa: {}", chain(&KubectlError::WriteOutput(e)));
                    return ExitCode::from(EXIT_API);
                }
            }
            for p in &outcome.problems {
                eprintln!("kubectl-numa: {p}");
            }
            ExitCode::from(if outcome.problems.is_empty() {
                EXIT_OK
            } else {
                EXIT_DATA
            })
        }
        Err(e) => {
            eprintln!("kubectl-numa: {}", chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Connects and runs one subcommand.
pub async fn execute(cli: &Cli) -> Result<Outcome, KubectlError> {
    // Read the config file before touching the cluster: a typo is a usage error either way.
    let sched_config = match &cli.command {
        Command::Explain(a) => Some(match &a.config {
            Some(p) => read_scheduler_config(p)?,
            None => crate::config_file::ConfigFile::default(),
        }),
        Command::Top(_) => None,
    };
    let (client, default_ns) = fetch::connect(
        cli.kubeconfig.as_deref(),
        cli.context.as_deref(),
        cli.request_timeout,
    )
    .await?;
    match &cli.command {
        Command::Top(a) => {
            let listed = fetch::list_nrts(&client).await?;
            let now = k8s_openapi::jiff::Timestamp::now();
            let report = top::build(&listed, a.node.as_deref(), a.resource.as_deref(), now);
            let stdout = match a.output {
                Output::Table => top::render_table(&report),
                Output::Json => to_json(&report),
            };
            Ok(Outcome {
                stdout,
                problems: report.problems,
            })
        }
        Command::Explain(a) => {
            let (ns, name) = parse_pod_ref(&a.pod, &default_ns)?;
            let pod = fetch::get_pod(&client, &ns, &name).await?;
            let listed = fetch::list_nrts(&client).await?;
            let bound_to = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty());
            let now = k8s_openapi::jiff::Timestamp::now();
            let report = match bound_to {
                Some(node) => {
                    let dra = if has_resource_claims(&pod) {
                        let (slices, claims) = fetch::list_slices_and_claims(&client, &ns).await?;
                        let cfg = sched_config.unwrap_or_default();
                        claims::DraObjects {
                            slices,
                            claims,
                            driver_attributes: cfg.dra_numa.resolve(None).driver_attributes,
                        }
                    } else {
                        claims::DraObjects::default()
                    };
                    explain::bound(&pod, &node, &listed, &dra, now)
                }
                None => {
                    let nodes = fetch::list_nodes(&client).await?;
                    let pods = fetch::list_bound_pods(&client).await?;
                    let namespaces = fetch::list_namespaces(&client).await?;
                    let cfg = sched_config.unwrap_or_default();
                    // Only a pod with claims needs the storage objects.
                    let claims = crate::pod::claims_of(&name, pod.spec.as_ref());
                    let storage = if claims.is_empty() {
                        Default::default()
                    } else {
                        fetch::list_storage(&client, &ns).await?
                    };
                    // Only a pod that may preempt needs the disruption budgets.
                    let budgets =
                        if crate::preempt::may_preempt(&pod) && crate::preempt::priority_of(&pod) > 0 {
                            fetch::list_budgets(&client).await?
                        } else {
                            Vec::new()
                        };
                    // Only a pod with resource claims needs the DRA objects.
                    let (device_classes, resource_slices, resource_claims) = if has_resource_claims(&pod) {
                        fetch::list_dra(&client, &ns).await?
                    } else {
                        Default::default()
                    };
                    let objects = crate::simulate::Inputs {
                        nodes,
                        pods,
                        namespaces,
                        storage,
                        budgets,
                        device_classes,
                        resource_slices: resource_slices.into_iter().map(Into::into).collect(),
                        resource_claims,
                        ..crate::simulate::Inputs::default()
                    };
                    explain::pending_in(pod, &listed, objects, &cfg)
                }
            };
            let stdout = match a.output {
                Output::Table => explain::render_table(&report),
                Output::Json => to_json(&report),
            };
            Ok(Outcome {
                stdout,
                problems: report.problems().to_vec(),
            })
        }
    }
}

fn has_resource_claims(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The error and its causes on one line, leaving out a cause whose text an outer message
/// already quotes (kube's errors repeat their source in their own message).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}

fn to_json(value: &impl serde::Serialize) -> String {
    // Serialising plain data with string keys cannot fail; an empty object is still valid JSON.
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".to_owned());
    s.push('\n');
    s
}

/// `NAMESPACE/POD`, or `POD` in `default_ns`.
pub fn parse_pod_ref(given: &str, default_ns: &str) -> Result<(String, String), KubectlError> {
    let bad = || KubectlError::ParsePodRef {
        given: given.to_owned(),
    };
    let (ns, name) = match given.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_ns, given),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return Err(bad());
    }
    Ok((ns.to_owned(), name.to_owned()))
}

/// Reads the scoring and no-topology settings from the scheduler's own config file.
pub fn read_scheduler_config(path: &std::path::Path) -> Result<crate::config_file::ConfigFile, KubectlError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| KubectlError::ReadConfig {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    let file: crate::config_file::FileConfig =
        serde_saphyr::from_str(&text).map_err(|e| KubectlError::ReadConfig {
            path: shown,
            message: e.to_string().lines().next().unwrap_or_default().to_owned(),
        })?;
    Ok(file.into_model_settings())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_leaves_out_causes_already_quoted() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Quoting(#[source] std::io::Error);
        let e = Quoting(std::io::Error::other("disk on fire"));
        assert_eq!(chain(&e), "outer: disk on fire");
        let e = KubectlError::ReadConfig {
            path: "f".into(),
            message: "m".into(),
        };
        assert_eq!(chain(&e), "scheduler config f: m");
        let e = KubectlError::WriteOutput(std::io::Error::other("pipe"));
        assert_eq!(chain(&e), "writing the output: pipe");
    }

    #[test]
    fn pod_refs() {
        assert_eq!(
            parse_pod_ref("ns/p", "default").unwrap_or_default(),
            ("ns".to_owned(), "p".to_owned())
        );
        assert_eq!(
            parse_pod_ref("p", "team").unwrap_or_default(),
            ("team".to_owned(), "p".to_owned())
        );
        for bad in ["", "/p", "ns/", "a/b/c"] {
            let err = parse_pod_ref(bad, "default").err();
            assert!(
                matches!(err, Some(KubectlError::ParsePodRef { .. })),
                "{bad:?}: {err:?}"
            );
        }
    }

    #[test]
    fn scheduler_config_file_is_read_and_typos_are_usage_errors() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let good = dir.path().join("good.yaml");
        std::fs::write(
            &good,
            "noTopology: Reject\nscoringStrategy:\n  type: MostAllocated\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let cfg = read_scheduler_config(&good).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg.no_topology, crate::cluster::NoTopology::Reject);
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "noTopolgy: Reject\n").unwrap_or_else(|e| panic!("{e}"));
        let err = read_scheduler_config(&bad).err();
        assert!(
            matches!(&err, Some(e @ KubectlError::ReadConfig { .. }) if e.exit_code() == EXIT_USAGE),
            "{err:?}"
        );
    }
}
