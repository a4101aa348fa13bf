//! `numaplane-scheduler simulate` end to end on the bundled example (the README's demo).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, process::Command};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn simulate(args: &[&str]) -> std::process::Output {
    let ex = examples();
    Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"))
        .arg("simulate")
        .arg("--cluster")
        .arg(ex.join("cluster.yaml"))
        .arg("--pods")
        .arg(ex.join("pods.yaml"))
        .arg("--config")
        .arg(ex.join("config.yaml"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn example_cluster_places_pods_on_aligned_nodes_with_devices() {
    let out = simulate(&["-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["schema"], "numaplane.io/simulate/v1");
    let result = |pod: &str| {
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["pod"] == pod)
            .unwrap()
            .clone()
    };
    // The training pod needs 4 GPUs and both NICs: only gpu-a (restricted/pod) can align them,
    // on NUMA {0,2} where the NICs sit.
    let train = result("ml/train-0");
    assert_eq!(train["node"], "gpu-a");
    assert_eq!(train["placement"]["podNumaNodes"], serde_json::json!([0, 2]));
    let devices = &train["allocation"]["containers"][0]["devices"];
    assert_eq!(
        devices["mellanox.com/cx7"],
        serde_json::json!(["mlx5_0", "mlx5_1"])
    );
    assert_eq!(devices["nvidia.com/gpu"].as_array().unwrap().len(), 4);
    // The oversized CNF cannot run anywhere; the message is kube-scheduler shaped.
    let big = result("telco/cu-big");
    assert!(big["node"].is_null());
    let msg = big["message"].as_str().unwrap();
    assert!(msg.starts_with("0/6 nodes are available:"), "{msg}");
    assert!(msg.contains("insufficient cpu on any single NUMA node"), "{msg}");
    // A malformed pod is unschedulable with a clear reason, and the run goes on.
    let typo = result("web/typo-0");
    assert!(typo["error"].as_str().unwrap().contains("cpu"));
    assert_eq!(report["summary"]["pods"], 10);
    // Two pods never get the same device.
    let mut seen = std::collections::BTreeSet::new();
    for r in report["results"].as_array().unwrap() {
        for c in r["allocation"]["containers"].as_array().into_iter().flatten() {
            for ids in c["devices"].as_object().into_iter().flatten().map(|(_, v)| v) {
                for id in ids.as_array().unwrap() {
                    assert!(
                        seen.insert(id.as_str().unwrap().to_owned()),
                        "device {id} handed out twice"
                    );
                }
            }
        }
    }
}

#[test]
fn table_output_is_readable() {
    let out = simulate(&[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("POD ml/train-0"));
    assert!(text.contains("UNSCHEDULABLE"));
    assert!(text.lines().last().unwrap().contains("scheduled"));
}

#[test]
fn unreadable_input_exits_64() {
    let out = Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"))
        .args([
            "simulate",
            "--cluster",
            "/nonexistent.yaml",
            "--pods",
            "/nonexistent.yaml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
