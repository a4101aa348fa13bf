//! numaplane scheduling model: exact prediction of kubelet Topology Manager admission, NUMA-aware
//! filter and score, device choice, and the recorded allocation. Pure and synchronous: no
//! Kubernetes I/O lives here.

pub mod admission;
mod cache;
pub mod cli;
pub mod cluster;
pub mod config_file;
pub mod constraints;
pub mod decision;
pub mod dra;
pub mod extender;
pub mod fit;
pub mod gates;
pub mod kubectl;
pub mod live;
pub mod model_config;
pub mod node;
pub mod nodeaffinity;
pub mod pod;
pub mod pod_facts;
pub mod preempt;
pub mod prepared;
pub mod queue;
pub mod resources;
pub mod score;
pub mod selector;
pub mod simulate;
pub mod topology_manager;
pub mod unsupported;
pub mod volume_binding;
