//! numaplane per-node exporter: reads the kubelet pod-resources API and the machine (hwloc),
//! publishes one NodeResourceTopology per node and serves Prometheus metrics.

pub mod accounting;
pub mod allocatable_follow;
pub mod allocator;
pub mod backoff;
pub mod checkpoint;
pub mod cli;
pub mod configz;
pub mod init_held;
pub mod kubelet_config;
pub mod kubelet_source;
mod kubelet_watch;
pub mod metrics;
pub mod node_watch;
pub mod output;
mod own_object;
pub mod plumbing;
pub mod pod_watch;
pub mod podresources;
pub mod publish;
pub mod run;
pub mod scan;
pub mod server;
pub mod triggers;
