//! What the live benches share: their positional arguments, the runtime they drive the
//! processes from, and the nodes they put into the HTTP-level fake's store.

use std::str::FromStr;

use serde_json::{Value, json};

use super::nrt;
use crate::fake_api::FakeApiServer;

/// The positional arguments of a bench binary (cargo adds flags such as `--bench`; they are
/// not the bench's).
pub struct Args(Vec<String>);

impl Args {
    /// This process's arguments.
    pub fn from_env() -> Args {
        Args(
            std::env::args()
                .skip(1)
                .filter(|a| !a.starts_with("--"))
                .collect(),
        )
    }

    /// Argument `index` (from 0), or `default` when it is absent or not a `T`.
    pub fn get<T: FromStr>(&self, index: usize, default: T) -> T {
        self.0.get(index).and_then(|a| a.parse().ok()).unwrap_or(default)
    }
}

/// A multi-thread runtime of `workers` threads with I/O and timers.
#[allow(clippy::expect_used)]
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Puts `count` Nodes `node-0000`, `node-0001`, … into the fake's store, each with 64 CPUs,
/// 256Gi and 110 pods allocatable and an NRT of two free zones of 32 CPUs and 128Gi, under
/// `topology_policy` (the NRT's `topologyPolicies`) with `attributes`; returns their names.
pub fn put_nodes(
    api: &FakeApiServer,
    count: usize,
    topology_policy: &str,
    attributes: Vec<Value>,
) -> Vec<String> {
    let zone = |i| {
        nrt::zone(
            i,
            vec![
                nrt::resource("cpu", "32", "32"),
                nrt::resource("memory", "128Gi", "128Gi"),
            ],
        )
    };
    (0..count)
        .map(|n| {
            let name = format!("node-{n:04}");
            api.put(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}),
            );
            api.put(
                json!({"apiVersion": nrt::API_VERSION, "kind": "NodeResourceTopology",
                "metadata": {"name": name}, "topologyPolicies": [topology_policy],
                "attributes": attributes, "zones": [zone(0), zone(1)]}),
            );
            name
        })
        .collect()
}
