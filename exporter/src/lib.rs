//! numaplane per-node exporter: reads the kubelet pod-resources API and the machine (hwloc),
//! publishes one NodeResourceTopology per node and serves Prometheus metrics.

pub mod accounting;
pub mod allocator;
pub mod backoff;
pub mod cli;
pub mod kubelet_config;
pub mod metrics;
pub mod output;
pub mod pod_watch;
pub mod podresources;
pub mod publish;
pub mod run;
pub mod scan;
pub mod server;
pub mod triggers;
