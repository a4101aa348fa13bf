//! Shared helpers for numaplane's end-to-end tests: a fake kubelet (a real tonic server on a
//! Unix socket), an HTTP-level fake API server, and the conversion of the shared conformance
//! vectors into kubelet responses and machines.

pub mod binaries;
pub mod exporter_vectors;
pub mod fake_api;
pub mod fake_device_kubelet;
pub mod fake_kubelet;
pub mod fake_kubelet_https;
pub mod harness;
pub mod kustomize;
pub mod rbac;
pub mod whole_system;
