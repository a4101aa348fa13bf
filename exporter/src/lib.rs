//! numaplane per-node exporter: reads the kubelet pod-resources API and the machine (hwloc),
//! publishes one NodeResourceTopology per node and serves Prometheus metrics.

pub mod accounting;
pub mod cli;
pub mod output;
