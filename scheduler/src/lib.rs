//! numaplane scheduling model: exact prediction of kubelet Topology Manager admission, NUMA-aware
//! filter and score, device choice, and the recorded allocation. Pure and synchronous: no
//! Kubernetes I/O lives here.

pub mod admission;
pub mod allocation;
mod cache;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod constraints;
pub mod extender;
pub mod fit;
pub mod kubectl;
pub mod live;
pub mod node;
pub mod pod;
pub mod prepared;
pub mod queue;
pub mod resources;
pub mod score;
pub mod simulate;
pub mod topology_manager;
