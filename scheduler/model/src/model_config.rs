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

/// What to do on a node whose kubelet options the model cannot predict
/// ([`crate::kubelet_options`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, Serialize)]
pub enum UnknownKubeletOptions {
    /// Schedule there on the model's prediction, reported as approximate (warnings, the
    /// node's verdict, the live scheduler's gauge).
    #[default]
    Warn,
    /// Keep pods the Topology Manager aligns (exclusive CPUs, pinned memory, NUMA-affine
    /// devices) off such nodes; other pods are placed as usual.
    Avoid,
}

impl UnknownKubeletOptions {
    /// Every mode, in the order the command lines list them.
    pub const ALL: [UnknownKubeletOptions; 2] = [Self::Warn, Self::Avoid];

    /// The name flags and the config file use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Warn => "Warn",
            Self::Avoid => "Avoid",
        }
    }

    /// One line on what the mode does, for `--help`.
    pub fn summary(self) -> &'static str {
        match self {
            Self::Warn => "Schedule on the model's prediction and report it as approximate",
            Self::Avoid => "Keep pods the Topology Manager aligns off nodes whose prediction is approximate",
        }
    }

    /// The mode named `name`, exactly as [`Self::name`] spells it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Scheduler configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Scoring.
    pub scorer: Scorer,
    /// Nodes without NRT.
    pub no_topology: NoTopology,
    /// NUMA alignment of DRA devices.
    pub dra_numa: DraNuma,
    /// Nodes whose kubelet options the model cannot predict.
    pub unknown_kubelet_options: UnknownKubeletOptions,
}
