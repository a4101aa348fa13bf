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

/// The driver attributes known to hold a NUMA node id, each checked in the driver's source:
/// - `dra.net` (kubernetes-sigs/dranet, `pkg/apis/attributes.go`: `AttrNUMANode =
///   "dra.net/numaNode"`);
/// - `sriovnetwork.k8snetworkplumbingwg.io` (k8snetworkplumbingwg/dra-driver-sriov,
///   `pkg/consts/consts.go`: `AttributeNUMANode = "dra.net/numaNode"`, dranet's name);
/// - `gpu.nvidia.com` (NVIDIA/k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`: VFIO
///   GPUs publish the int `numa`; full GPUs and MIG devices publish only the standard
///   `resource.kubernetes.io/pcieRoot`, which the node's PCI locality resolves).
pub fn default_driver_numa_attributes() -> numaplane::device_numa::DriverNumaAttributes {
    [
        ("dra.net", "dra.net/numaNode"),
        ("sriovnetwork.k8snetworkplumbingwg.io", "dra.net/numaNode"),
        ("gpu.nvidia.com", "numa"),
    ]
    .into_iter()
    .map(|(driver, attr)| (driver.to_owned(), vec![attr.to_owned()]))
    .collect()
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
}
