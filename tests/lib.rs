//! Shared helpers for numaplane's end-to-end tests: a real control plane from the kit (one per
//! test binary), a fake kubelet (a real tonic server on a
//! Unix socket), an HTTP-level fake API server, and the conversion of the shared conformance
//! vectors into kubelet responses and machines; manifests rendered by `kubectl kustomize`, and a
//! Deployment's rolling update simulated.

pub mod binaries;
pub mod control_plane;
pub mod exporter_vectors;
pub mod fake_api;
pub mod fake_device_kubelet;
pub mod fake_kubelet;
pub mod fake_kubelet_https;
pub mod harness;
pub mod oracle;
pub mod rbac;
pub mod render;
pub mod rollout;
pub mod soak;
pub mod soak_dra;
pub mod whole_system;
