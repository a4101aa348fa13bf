//! What the scheduler's integration tests share: a deterministic random source, the NRT of a
//! kubelet under single-numa-node with its pod-set fingerprint, and `numaplane-scheduler
//! simulate` run on files. Each test binary uses a part of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use numaplane::{fingerprint, nrt::NodeResourceTopology};
use serde_json::{Value, json};

/// xorshift64: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// In `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// True once in `n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// One of `items`.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The NRT of node `name` under the single-numa-node policy at container scope with `zones`,
/// and the pod-set fingerprint of `pods` (`namespace/name`) the kubelet reports.
pub fn single_numa_node_nrt(name: &str, zones: Vec<Value>, pods: &[&str]) -> NodeResourceTopology {
    let fp = fingerprint::compute(pods.iter().map(|k| k.split_once('/').unwrap()));
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
            {"name": "nodeTopologyPodsFingerprint", "value": fp},
            {"name": "nodeTopologyPodsFingerprintMethod", "value": "all"}
        ],
        "zones": zones
    }))
    .unwrap()
}

/// `numaplane-scheduler simulate --explain <explain> -o json` of `pods` on `cluster` (both
/// YAML); the report.
pub fn simulate_json(cluster: &str, pods: &str, explain: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let cluster_path = dir.path().join("cluster.yaml");
    let pods_path = dir.path().join("pods.yaml");
    std::fs::write(&cluster_path, cluster).unwrap();
    std::fs::write(&pods_path, pods).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"))
        .args(["simulate", "--cluster"])
        .arg(&cluster_path)
        .arg("--pods")
        .arg(&pods_path)
        .args(["--explain", explain, "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
