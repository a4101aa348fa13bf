//! kube-scheduler v1.36.2's own filter tests (InterPodAffinity, PodTopologySpread, NodePorts,
//! NodeUnschedulable, NodeAffinity, TaintToleration, VolumeRestrictions), translated into cluster
//! objects (`data/kube_scheduler_filter_cases.json`, the public half), each run through
//! `numaplane-scheduler simulate --explain all -o json` as a user runs it: the feasible node set
//! must be exactly upstream's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, path::Path, process::Command};

use serde_json::{Value, json};

const VECTORS: &str = include_str!("data/kube_scheduler_filter_cases.json");

/// Runs `simulate` on a cluster of `objects` for the pods `pods` (in order); returns the report.
pub fn simulate(dir: &Path, objects: &[Value], pods: &[Value], config: Option<&str>) -> Value {
    let cluster = dir.join("cluster.json");
    let pending = dir.join("pods.json");
    std::fs::write(
        &cluster,
        json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string(),
    )
    .unwrap();
    std::fs::write(
        &pending,
        json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string(),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"));
    cmd.arg("simulate")
        .arg("--cluster")
        .arg(&cluster)
        .arg("--pods")
        .arg(&pending)
        .args(["--explain", "all", "-o", "json"]);
    if let Some(c) = config {
        let path = dir.join("config.yaml");
        std::fs::write(&path, c).unwrap();
        cmd.arg("--config").arg(path);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn feasible(result: &Value) -> BTreeSet<String> {
    result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["feasible"] == json!(true))
        .map(|v| v["node"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_public_upstream_filter_case_gives_upstreams_feasible_nodes() {
    let vectors: Value = serde_json::from_str(VECTORS).unwrap();
    assert_eq!(vectors["schema"], "numaplane kube-scheduler filter parity v1");
    let cases = vectors["cases"].as_array().unwrap();
    assert!(cases.len() >= 81, "{} cases", cases.len());
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let mut objects: Vec<Value> = case["nodes"].as_array().unwrap().clone();
        objects.extend(case["existingPods"].as_array().unwrap().iter().cloned());
        objects.extend(case["namespaces"].as_array().into_iter().flatten().cloned());
        let mut pod = case["pod"].clone();
        pod["spec"]["schedulerName"] = json!("numaplane-scheduler");
        let report = simulate(dir.path(), &objects, &[pod], None);
        let result = &report["results"][0];
        let got = feasible(result);
        let want: BTreeSet<String> = case["feasible"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect();
        let listed: BTreeSet<String> = result["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["node"].as_str().unwrap().to_owned())
            .collect();
        let all: BTreeSet<String> = want
            .iter()
            .cloned()
            .chain(case["infeasible"].as_object().unwrap().keys().cloned())
            .collect();
        if got != want || listed != all {
            failures.push(format!(
                "{} / {}: feasible {got:?}, upstream {want:?}; verdicts {}",
                case["plugin"], case["name"], result["nodes"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
