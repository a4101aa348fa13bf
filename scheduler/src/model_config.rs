//! The model's scoring configuration (scorer and no-NRT behaviour) shared by the index, the
//! verdict cache and the front ends (its own module so that `cluster` and `cache` do not import
//! each other for it). The daemon's configuration is `live::daemon_config`; the
//! config file's schema is `config_file`.

use serde::Serialize;

use crate::score::Scorer;

/// What to do with nodes that publish no NRT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, Serialize)]
pub enum NoTopology {
    /// Treat as Topology Manager policy `none` (kubelet admits on node-level fit).
    #[default]
    AssumeNone,
    /// Reject such nodes.
    Reject,
}

/// Scheduler configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Scoring.
    pub scorer: Scorer,
    /// Nodes without NRT.
    pub no_topology: NoTopology,
}
