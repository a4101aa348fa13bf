//! Shared helpers for numaplane's end-to-end tests.
