//! numaplane's scheduler front ends: the live scheduler (`run`), the scheduler extender, the
//! offline `simulate`, `kubectl numa` and their command line. Everything that decides lives in
//! `numaplane-model`; this crate reads the cluster (kube's client, watches), writes Bindings,
//! Events and claims, serves HTTP, and reads files.
//!
//! The model's modules are re-exported under their old paths, so `numaplane_scheduler::cluster`
//! and `numaplane_model::cluster` are one module.

pub use numaplane_model::{
    admission, cluster, constraints, decision, dra, fit, gates, model_config, node, nodeaffinity, pod,
    pod_facts, preempt, prepared, queue, resources, score, selector, topology_manager, unsupported,
    volume_binding,
};

pub mod cli;
pub mod config_file;
pub mod extender;
pub mod kubectl;
pub mod live;
pub mod simulate;
