//! What the scheduler's benches share: the zones of their synthetic nodes and the `--keep DIR`
//! argument. Each bench uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::{Value, json};

/// Zone `node-<z>` of a node of `zones` zones, as the benches' synthetic NRTs have it: costs
/// 10 to itself, 12 to its pair, 21 further; 16 CPUs (`cpu` free), 64Gi (`memory` free), 8Gi of
/// 1Gi huge pages, one free GPU `gpu-<z>` and two free NICs `nic-<z>a`, `nic-<z>b`.
pub fn zone(z: usize, zones: usize, cpu: &str, memory: &str) -> Value {
    let costs: Vec<Value> = (0..zones)
        .map(|t| json!({"name": format!("node-{t}"), "value": if t == z { 10 } else if t / 2 == z / 2 { 12 } else { 21 }}))
        .collect();
    json!({"name": format!("node-{z}"), "type": "Node", "costs": costs,
        "attributes": [
            {"name": "numaplane.io/free-devices.nvidia.com/gpu", "value": format!("gpu-{z}")},
            {"name": "numaplane.io/free-devices.example.com/nic", "value": format!("nic-{z}a,nic-{z}b")}],
        "resources": [
            {"name": "cpu", "capacity": "16", "allocatable": "16", "available": cpu},
            {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": memory},
            {"name": "hugepages-1Gi", "capacity": "8Gi", "allocatable": "8Gi", "available": "8Gi"},
            {"name": "nvidia.com/gpu", "capacity": "1", "allocatable": "1", "available": "1"},
            {"name": "example.com/nic", "capacity": "2", "allocatable": "2", "available": "2"}]})
}

/// The Topology Manager policy of node `index`: half single-numa-node, a quarter restricted,
/// a quarter best-effort.
pub fn policy(index: usize) -> &'static str {
    [
        "single-numa-node",
        "restricted",
        "best-effort",
        "single-numa-node",
    ][index % 4]
}

/// The directory after `--keep` among the arguments, if any.
pub fn keep_dir(args: &[String]) -> Option<PathBuf> {
    args.iter()
        .position(|a| a == "--keep")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
}
