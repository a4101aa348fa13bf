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

pub use crate::dra::numa::DraNumaAlignment;

/// Where DRA devices sit, and how much that matters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraNuma {
    /// The alignment mode.
    pub alignment: DraNumaAlignment,
    /// Driver-specific attributes naming a device's NUMA node, per driver, after the standard
    /// `resource.kubernetes.io/numaNode` and before `pciBusID`/`pcieRoot`.
    pub driver_attributes: numaplane::device_numa::DriverNumaAttributes,
}

impl Default for DraNuma {
    fn default() -> Self {
        DraNuma {
            alignment: DraNumaAlignment::default(),
            driver_attributes: default_driver_numa_attributes(),
        }
    }
}

pub use numaplane::device_numa::default_driver_numa_attributes;

/// Scheduler configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Scoring.
    pub scorer: Scorer,
    /// Nodes without NRT.
    pub no_topology: NoTopology,
    /// NUMA alignment of DRA devices.
    pub dra_numa: DraNuma,
}
