//! The daemon's configuration, for the serving commands (`run`, `extender`): the config file
//! ([`crate::config_file`]) plus flags and environment variables. A flag (or its variable) wins over the file, the file over the
//! default. Flag names follow kube-scheduler where one exists.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::{
    cluster::{Config, NoTopology},
    config_file::{FileConfig, ScoringStrategyFile},
    queue::Backoff,
    resources::Resources,
    score::Scorer,
};

/// Default port of `/metrics`, `/healthz`, `/readyz` (and the extender verbs): our own, next to
/// kube-scheduler's 10259 but not on it.
pub const DEFAULT_PORT: u16 = 10269;

/// Flags shared by `run` and `extender`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Configuration file (YAML); flags override it. Schema in docs/scheduler.md.
    #[arg(long, env = "NUMAPLANE_SCHEDULER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig file; default: in-cluster configuration, then $KUBECONFIG.
    #[arg(long, env = "NUMAPLANE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Scheduler names served: pods whose spec.schedulerName is one of these [default: numaplane-scheduler].
    #[arg(
        long = "scheduler-name",
        env = "NUMAPLANE_SCHEDULER_NAMES",
        value_delimiter = ','
    )]
    pub scheduler_names: Vec<String>,
    /// Client-side limit of API requests per second [default: 50].
    #[arg(long, env = "NUMAPLANE_KUBE_API_QPS")]
    pub kube_api_qps: Option<f64>,
    /// Client-side burst of API requests [default: 100].
    #[arg(long, env = "NUMAPLANE_KUBE_API_BURST")]
    pub kube_api_burst: Option<u32>,
    /// Client-side limit of Events and `PodScheduled` status writes per second: a budget apart
    /// from --kube-api-qps, as kube-scheduler's event client has [default: the --kube-api-qps value].
    #[arg(long, env = "NUMAPLANE_EVENT_QPS")]
    pub event_qps: Option<f64>,
    /// Client-side burst of Events and status writes [default: the --kube-api-burst value].
    #[arg(long, env = "NUMAPLANE_EVENT_BURST")]
    pub event_burst: Option<u32>,
    /// Address of /metrics, /healthz, /readyz (and the extender verbs) [default: 0.0.0.0:10269].
    /// Not kube-scheduler's 10259, so both can run on one hostNetwork control-plane node.
    #[arg(long, env = "NUMAPLANE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// A second address serving only /metrics, /healthz and /readyz: lets the extender keep its
    /// verbs on loopback next to kube-scheduler while Prometheus and the kubelet's probes reach
    /// the node address. Off unless set.
    #[arg(long, env = "NUMAPLANE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Elect a leader through a coordination.k8s.io Lease; only the leader schedules [default: true].
    /// As kube-scheduler's flag: `--leader-elect` alone means true, `--leader-elect=false` turns it off.
    #[arg(
        long,
        env = "NUMAPLANE_LEADER_ELECT",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub leader_elect: Option<bool>,
    /// Name of the Lease [default: numaplane-scheduler].
    #[arg(long, env = "NUMAPLANE_LEADER_ELECT_RESOURCE_NAME")]
    pub leader_elect_resource_name: Option<String>,
    /// Namespace of the Lease [default: the pod's namespace ($POD_NAMESPACE), else kube-system].
    #[arg(long, env = "NUMAPLANE_LEADER_ELECT_RESOURCE_NAMESPACE")]
    pub leader_elect_resource_namespace: Option<String>,
    /// Identity in the Lease [default: $POD_NAME, else the host name].
    #[arg(long, env = "NUMAPLANE_LEADER_ELECT_IDENTITY")]
    pub leader_elect_identity: Option<String>,
    /// How long a leader holds the Lease without renewing it [default: 15s].
    #[arg(long, env = "NUMAPLANE_LEADER_ELECT_LEASE_DURATION", value_parser = humantime::parse_duration)]
    pub leader_elect_lease_duration: Option<Duration>,
    /// The leader renews this long before the Lease expires [default: 5s].
    #[arg(long, env = "NUMAPLANE_LEADER_ELECT_RENEW_BEFORE", value_parser = humantime::parse_duration)]
    pub leader_elect_renew_before: Option<Duration>,
    /// First backoff of a pod that did not fit [default: 1s].
    #[arg(long, env = "NUMAPLANE_POD_INITIAL_BACKOFF", value_parser = humantime::parse_duration)]
    pub pod_initial_backoff: Option<Duration>,
    /// Longest backoff [default: 60s].
    #[arg(long, env = "NUMAPLANE_POD_MAX_BACKOFF", value_parser = humantime::parse_duration)]
    pub pod_max_backoff: Option<Duration>,
    /// How long a placement is held on a node whose NRT does not show the pod yet [default: 2m].
    #[arg(long, env = "NUMAPLANE_ASSUME_TIMEOUT", value_parser = humantime::parse_duration)]
    pub assume_timeout: Option<Duration>,
    /// Bindings in flight at once [default: 32].
    #[arg(long, env = "NUMAPLANE_BIND_CONCURRENCY")]
    pub bind_concurrency: Option<usize>,
    /// NUMA alignment of DRA devices with the CPUs the kubelet pins: Required, Preferred or
    /// Ignore [default: Required].
    #[arg(long, env = "NUMAPLANE_DRA_NUMA_ALIGNMENT", value_parser = dra_numa_alignment())]
    pub dra_numa_alignment: Option<crate::model_config::DraNumaAlignment>,
    /// Nodes whose kubelet options the model cannot predict (docs/scheduler.md "Kubelet
    /// options"): Warn schedules there on the model's prediction, reported as approximate;
    /// Avoid keeps pods the Topology Manager aligns off them [default: Warn].
    #[arg(long, env = "NUMAPLANE_UNKNOWN_KUBELET_OPTIONS", value_parser = unknown_kubelet_options())]
    pub unknown_kubelet_options: Option<crate::model_config::UnknownKubeletOptions>,
    /// How long a binding waits for the binding conditions of its claimed devices, as
    /// kube-scheduler's DynamicResources `bindingTimeout` [default: 10m].
    #[arg(long, env = "NUMAPLANE_DRA_BINDING_TIMEOUT", value_parser = humantime::parse_duration)]
    pub dra_binding_timeout: Option<Duration>,
}

/// Leader election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// Holder identity.
    pub identity: String,
    /// Lease duration.
    pub duration: Duration,
    /// Renew this long before expiry.
    pub renew_before: Duration,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Kubeconfig file, if given.
    pub kubeconfig: Option<PathBuf>,
    /// Scheduler names served.
    pub scheduler_names: Vec<String>,
    /// Scoring strategy and weights.
    pub scoring: ScoringStrategyFile,
    /// Nodes without NRT.
    pub no_topology: NoTopology,
    /// Client QPS.
    pub qps: f64,
    /// Client burst.
    pub burst: u32,
    /// Events and status writes: their own budget.
    pub events: super::api::Budget,
    /// Listen address.
    pub listen: SocketAddr,
    /// Metrics and probes only, when set.
    pub metrics_listen: Option<SocketAddr>,
    /// `None` when leader election is off.
    pub leader_election: Option<LeaderElection>,
    /// Pod backoff.
    pub backoff: Backoff,
    /// Assumption timeout.
    pub assume_timeout: Duration,
    /// Bindings in flight.
    pub bind_concurrency: usize,
    /// Longest wait for the binding conditions of a pod's claimed devices.
    pub dra_binding_timeout: Duration,
    /// Extender mode: serve kube-scheduler's extender verbs instead of watching pending pods.
    pub extender: bool,
    /// Default spread constraints.
    pub spread_defaults: crate::constraints::SpreadDefaults,
    /// NUMA alignment of DRA devices.
    pub dra_numa: crate::model_config::DraNuma,
    /// Nodes whose kubelet options the model cannot predict.
    pub unknown_kubelet_options: crate::model_config::UnknownKubeletOptions,
}

impl ServeConfig {
    /// The model configuration, with resource names interned in `res` (the cluster's table).
    pub fn model(&self, res: &mut Resources) -> Config {
        let weights: Vec<(String, i64)> = self
            .scoring
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.weight))
            .collect();
        Config {
            scorer: Scorer {
                strategy: self.scoring.strategy,
                weights: crate::score::weights_from_names(res, &weights),
            },
            no_topology: self.no_topology,
            dra_numa: self.dra_numa.clone(),
            unknown_kubelet_options: self.unknown_kubelet_options,
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("reading config {path}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("config {path}: {message}")]
    Parse {
        /// Path.
        path: String,
        /// Parser message.
        message: String,
    },
    /// A value is out of range.
    #[error("{field}: {message}")]
    Invalid {
        /// Flag or field name.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Default scheduler name.
pub const DEFAULT_SCHEDULER_NAME: &str = "numaplane-scheduler";

fn duration_field(field: &'static str, v: Option<&String>) -> Result<Option<Duration>, ConfigError> {
    v.map(|s| {
        humantime::parse_duration(s).map_err(|e| ConfigError::Invalid {
            field,
            message: format!("{s:?}: {e}"),
        })
    })
    .transpose()
}

impl ServeArgs {
    /// Reads the file (if any) and merges it with the flags.
    pub fn resolve(&self) -> Result<ServeConfig, ConfigError> {
        let file = match &self.config {
            Some(p) => {
                let path = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                serde_saphyr::from_str::<FileConfig>(&text).map_err(|e| ConfigError::Parse {
                    path,
                    message: e.to_string(),
                })?
            }
            None => FileConfig::default(),
        };
        self.merge(file)
    }

    /// Flags over `file` over defaults, validated.
    pub fn merge(&self, file: FileConfig) -> Result<ServeConfig, ConfigError> {
        let invalid = |field, message: String| Err(ConfigError::Invalid { field, message });
        let mut names = if self.scheduler_names.is_empty() {
            file.scheduler_names.clone()
        } else {
            self.scheduler_names.clone()
        };
        if names.is_empty() {
            names.push(DEFAULT_SCHEDULER_NAME.to_owned());
        }
        if let Some(bad) = names.iter().find(|n| n.is_empty() || n.contains([',', '='])) {
            return invalid(
                "--scheduler-name",
                format!("{bad:?} is not a valid scheduler name"),
            );
        }
        let qps = self.kube_api_qps.or(file.kube_api_qps).unwrap_or(50.0);
        if !(qps.is_finite() && qps > 0.0) {
            return invalid("--kube-api-qps", format!("{qps} must be a positive number"));
        }
        let burst = self.kube_api_burst.or(file.kube_api_burst).unwrap_or(100);
        if burst == 0 {
            return invalid("--kube-api-burst", "must be at least 1".to_owned());
        }
        let event_qps = self.event_qps.or(file.event_qps).unwrap_or(qps);
        if !(event_qps.is_finite() && event_qps > 0.0) {
            return invalid("--event-qps", format!("{event_qps} must be a positive number"));
        }
        let event_burst = self.event_burst.or(file.event_burst).unwrap_or(burst);
        if event_burst == 0 {
            return invalid("--event-burst", "must be at least 1".to_owned());
        }
        let initial = self
            .pod_initial_backoff
            .or(file.pod_initial_backoff_seconds.map(Duration::from_secs))
            .unwrap_or(Duration::from_secs(1));
        let max = self
            .pod_max_backoff
            .or(file.pod_max_backoff_seconds.map(Duration::from_secs))
            .unwrap_or(Duration::from_secs(60));
        if initial.is_zero() || max < initial {
            return invalid(
                "--pod-initial-backoff/--pod-max-backoff",
                format!("need 0 < initial ({initial:?}) <= max ({max:?})"),
            );
        }
        let assume_timeout = self
            .assume_timeout
            .or(file.assume_timeout_seconds.map(Duration::from_secs))
            .unwrap_or(Duration::from_secs(120));
        if assume_timeout.is_zero() {
            return invalid("--assume-timeout", "must be positive".to_owned());
        }
        let bind_concurrency = self.bind_concurrency.or(file.bind_concurrency).unwrap_or(32);
        if bind_concurrency == 0 {
            return invalid("--bind-concurrency", "must be at least 1".to_owned());
        }
        let dra_binding_timeout = self.dra_binding_timeout.unwrap_or(Duration::from_secs(600));
        if dra_binding_timeout.is_zero() {
            return invalid("--dra-binding-timeout", "must be positive".to_owned());
        }
        let le = &file.leader_election;
        let leader_elect = self.leader_elect.or(le.leader_elect).unwrap_or(true);
        let leader_election = if leader_elect {
            let duration = self
                .leader_elect_lease_duration
                .or(duration_field(
                    "leaderElection.leaseDuration",
                    le.lease_duration.as_ref(),
                )?)
                .unwrap_or(Duration::from_secs(15));
            let renew_before = self
                .leader_elect_renew_before
                .or(duration_field(
                    "leaderElection.renewBefore",
                    le.renew_before.as_ref(),
                )?)
                .unwrap_or(Duration::from_secs(5));
            // The lease crate counts whole seconds and requires 0 < renew-before < duration.
            if renew_before.as_secs() == 0 || duration.as_secs() <= renew_before.as_secs() {
                return invalid(
                    "--leader-elect-lease-duration/--leader-elect-renew-before",
                    format!(
                        "need whole seconds with 0 < renew-before ({}s) < lease duration ({}s)",
                        renew_before.as_secs(),
                        duration.as_secs()
                    ),
                );
            }
            let identity = self
                .leader_elect_identity
                .clone()
                .or_else(|| std::env::var("POD_NAME").ok())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| format!("numaplane-scheduler-{}", std::process::id()));
            Some(LeaderElection {
                name: self
                    .leader_elect_resource_name
                    .clone()
                    .or(le.resource_name.clone())
                    .unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_owned()),
                namespace: self
                    .leader_elect_resource_namespace
                    .clone()
                    .or(le.resource_namespace.clone())
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "kube-system".to_owned()),
                identity,
                duration,
                renew_before,
            })
        } else {
            None
        };
        let spread_defaults = match file.pod_topology_spread.unwrap_or_default().defaults() {
            Ok(d) => d,
            Err(e) => return invalid("podTopologySpread", e.to_string()),
        };
        let dra_numa = file.dra_numa.unwrap_or_default().resolve(self.dra_numa_alignment);
        let scoring = file.scoring_strategy.unwrap_or_default();
        if let Some(bad) = scoring.resources.iter().find(|r| r.weight < 0) {
            return invalid(
                "scoringStrategy.resources",
                format!("weight of {} is negative", bad.name),
            );
        }
        Ok(ServeConfig {
            kubeconfig: self.kubeconfig.clone(),
            scheduler_names: names,
            scoring,
            no_topology: file.no_topology.unwrap_or_default(),
            qps,
            burst,
            events: super::api::Budget {
                qps: event_qps,
                burst: event_burst,
            },
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            leader_election,
            backoff: Backoff { initial, max },
            assume_timeout,
            bind_concurrency,
            dra_binding_timeout,
            extender: false,
            spread_defaults,
            dra_numa,
            unknown_kubelet_options: self
                .unknown_kubelet_options
                .or(file.unknown_kubelet_options)
                .unwrap_or_default(),
        })
    }
}

/// The parser of a `--unknown-kubelet-options` flag, as [`dra_numa_alignment`].
pub fn unknown_kubelet_options()
-> impl clap::builder::TypedValueParser<Value = crate::model_config::UnknownKubeletOptions> {
    use crate::model_config::UnknownKubeletOptions;
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(
        UnknownKubeletOptions::ALL.map(|m| PossibleValue::new(m.name()).help(m.summary())),
    )
    // The parser above admits only the names of ALL.
    .map(|name| UnknownKubeletOptions::from_name(&name).unwrap_or_default())
}

/// The parser of a `--dra-numa-alignment` flag: the model's modes by name, each with its
/// summary in `--help` (the model stays free of clap, so the modes are listed here).
pub fn dra_numa_alignment()
-> impl clap::builder::TypedValueParser<Value = crate::model_config::DraNumaAlignment> {
    use crate::model_config::DraNumaAlignment;
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(DraNumaAlignment::ALL.map(|m| PossibleValue::new(m.name()).help(m.summary())))
        // The parser above admits only the names of ALL.
        .map(|name| DraNumaAlignment::from_name(&name).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::api::Budget;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn resolve(args: &[&str], file: &str) -> Result<ServeConfig, ConfigError> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).expect("flags");
        cli.serve
            .merge(serde_saphyr::from_str::<FileConfig>(file).expect("file"))
    }

    #[test]
    fn events_have_a_budget_of_their_own_that_defaults_to_the_main_one() {
        let c = resolve(&["--kube-api-qps", "300", "--kube-api-burst", "600"], "{}").expect("valid");
        assert_eq!((c.qps, c.burst), (300.0, 600));
        assert_eq!(
            c.events,
            Budget {
                qps: 300.0,
                burst: 600
            }
        );

        let c = resolve(&["--event-qps", "20"], "kubeApiQps: 500\neventBurst: 40\n").expect("valid");
        assert_eq!((c.qps, c.burst), (500.0, 100));
        assert_eq!(c.events, Budget { qps: 20.0, burst: 40 });

        // The flag wins over the file.
        let c = resolve(&["--event-burst", "7"], "eventBurst: 40\neventQps: 3.5\n").expect("valid");
        assert_eq!(c.events, Budget { qps: 3.5, burst: 7 });

        for (args, file) in [
            (&["--event-qps", "0"][..], "{}"),
            (&[][..], "eventQps: -2\n"),
            (&["--event-burst", "0"][..], "{}"),
        ] {
            let e = resolve(args, file).expect_err("invalid");
            assert!(e.to_string().contains("--event-"), "{e}");
        }
    }
}
