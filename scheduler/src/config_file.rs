//! The scheduler's config file: one schema for `simulate --config`, the daemon (`run`,
//! `extender`) and `kubectl numa --config`. [`FileConfig`] is the whole file; [`ConfigFile`] the
//! part the model uses (scoring and nodes without NRT), which `simulate --config` reads alone.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{
    model_config::{DraNuma, DraNumaAlignment, NoTopology, UnknownKubeletOptions},
    score::Strategy,
};

/// The model's part of the file, as `simulate --config` reads it (no other field allowed).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// Scoring strategy and weights.
    #[serde(default)]
    pub scoring_strategy: ScoringStrategyFile,
    /// Nodes without NRT: `AssumeNone` (default) or `Reject`.
    #[serde(default)]
    pub no_topology: NoTopology,
    /// kube-scheduler's `PodTopologySpreadArgs` (default constraints).
    #[serde(default)]
    pub pod_topology_spread: crate::constraints::config::PodTopologySpreadFile,
    /// NUMA alignment of DRA devices.
    #[serde(default)]
    pub dra_numa: DraNumaFile,
    /// Nodes whose kubelet options the model cannot predict: `Warn` (default) or `Avoid`.
    #[serde(default)]
    pub unknown_kubelet_options: UnknownKubeletOptions,
}

/// `draNuma` section.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraNumaFile {
    /// `Required` (default), `Preferred` or `Ignore`.
    #[serde(default)]
    pub alignment: Option<DraNumaAlignment>,
    /// Driver-specific NUMA attributes per driver name; a driver listed here replaces the
    /// built-in default for that driver (an empty list turns it off).
    #[serde(default)]
    pub driver_attributes: std::collections::BTreeMap<String, Vec<String>>,
}

impl DraNumaFile {
    /// The model's settings: built-in driver defaults, overridden per driver by the file, and
    /// `alignment` when the caller (a flag) gives none.
    pub fn resolve(&self, alignment: Option<DraNumaAlignment>) -> DraNuma {
        let mut driver_attributes = crate::model_config::default_driver_numa_attributes();
        for (driver, attrs) in &self.driver_attributes {
            driver_attributes.insert(driver.clone(), attrs.clone());
        }
        DraNuma {
            alignment: alignment.or(self.alignment).unwrap_or_default(),
            driver_attributes,
        }
    }
}

/// `scoringStrategy` section.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScoringStrategyFile {
    /// Strategy name.
    #[serde(default, rename = "type")]
    pub strategy: Strategy,
    /// Resource weights.
    #[serde(default)]
    pub resources: Vec<ResourceWeight>,
}

/// A weighted resource.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceWeight {
    /// Resource name.
    pub name: String,
    /// Weight (values below 1 count as 1).
    pub weight: i64,
}

/// The YAML file. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    /// Scheduler names served.
    #[serde(default)]
    pub scheduler_names: Vec<String>,
    /// Scoring strategy and weights (as in `simulate --config`).
    #[serde(default)]
    pub scoring_strategy: Option<ScoringStrategyFile>,
    /// Nodes without NRT: `AssumeNone` or `Reject`.
    #[serde(default)]
    pub no_topology: Option<NoTopology>,
    /// Client QPS.
    pub kube_api_qps: Option<f64>,
    /// Client burst.
    pub kube_api_burst: Option<u32>,
    /// Events and status writes per second (their own budget).
    pub event_qps: Option<f64>,
    /// Their burst.
    pub event_burst: Option<u32>,
    /// Listen address.
    pub listen: Option<SocketAddr>,
    /// Metrics and probes only.
    pub metrics_listen: Option<SocketAddr>,
    /// Backoff bounds, as kube-scheduler's `podInitialBackoffSeconds`.
    pub pod_initial_backoff_seconds: Option<u64>,
    /// As kube-scheduler's `podMaxBackoffSeconds`.
    pub pod_max_backoff_seconds: Option<u64>,
    /// Assumption timeout in seconds.
    pub assume_timeout_seconds: Option<u64>,
    /// Bindings in flight.
    pub bind_concurrency: Option<usize>,
    /// Leader election, as kube-scheduler's `leaderElection`.
    #[serde(default)]
    pub leader_election: FileLeaderElection,
    /// kube-scheduler's `PodTopologySpreadArgs` (default constraints).
    #[serde(default)]
    pub pod_topology_spread: Option<crate::constraints::config::PodTopologySpreadFile>,
    /// NUMA alignment of DRA devices.
    #[serde(default)]
    pub dra_numa: Option<DraNumaFile>,
    /// Nodes whose kubelet options the model cannot predict: `Warn` or `Avoid`.
    #[serde(default)]
    pub unknown_kubelet_options: Option<UnknownKubeletOptions>,
}

/// `leaderElection` in the file; durations as `15s`, `1m`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileLeaderElection {
    /// On or off.
    pub leader_elect: Option<bool>,
    /// Lease name.
    pub resource_name: Option<String>,
    /// Lease namespace.
    pub resource_namespace: Option<String>,
    /// Lease duration.
    pub lease_duration: Option<String>,
    /// Renew this long before expiry.
    pub renew_before: Option<String>,
}

impl FileConfig {
    /// The model's part of the file (defaults for what it leaves out).
    pub fn into_model_settings(self) -> ConfigFile {
        ConfigFile {
            scoring_strategy: self.scoring_strategy.unwrap_or_default(),
            no_topology: self.no_topology.unwrap_or_default(),
            pod_topology_spread: self.pod_topology_spread.unwrap_or_default(),
            dra_numa: self.dra_numa.unwrap_or_default(),
            unknown_kubelet_options: self.unknown_kubelet_options.unwrap_or_default(),
        }
    }
}
