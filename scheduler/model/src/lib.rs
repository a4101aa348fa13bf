//! numaplane's scheduling model: exact prediction of kubelet Topology Manager admission,
//! NUMA-aware filter and score, device choice (device plugins and DRA, aligned with the CPUs the
//! kubelet will pin), preemption, and the cluster index that watch events feed.
//!
//! Pure and synchronous: plain functions over plain data. Its manifest names what it may touch
//! (Kubernetes' types, serde, CEL, thiserror); the client, the runtime and every server live in
//! `numaplane-scheduler`, which depends on this crate.

pub mod admission;
mod cache;
pub mod cluster;
pub mod constraints;
pub mod decision;
pub mod dra;
pub mod fit;
pub mod gates;
pub mod kubelet_options;
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
pub mod topology_manager;
pub mod unsupported;
pub mod volume_binding;
