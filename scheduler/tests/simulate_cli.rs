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

fn run(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"));
    cmd.arg("simulate").args(args).env_remove("NUMAPLANE_SIM_EXPLAIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn json_report(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// pod → (node, number of per-node verdicts).
fn outcomes(report: &serde_json::Value) -> Vec<(String, serde_json::Value, usize)> {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["pod"].as_str().unwrap().to_owned(),
                r["node"].clone(),
                r["nodes"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

#[test]
fn explain_selects_per_node_verdicts_without_changing_decisions() {
    let failed = json_report(&simulate(&["-o", "json"]));
    let all = json_report(&simulate(&["-o", "json", "--explain", "all"]));
    let none = json_report(&simulate(&["-o", "json", "--explain", "none"]));
    let (f, a, n) = (outcomes(&failed), outcomes(&all), outcomes(&none));
    let decisions = |o: &[(String, serde_json::Value, usize)]| {
        o.iter()
            .map(|(p, n, _)| (p.clone(), n.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(decisions(&f), decisions(&a));
    assert_eq!(decisions(&f), decisions(&n));
    let nodes = 6;
    for (pod, node, count) in &f {
        let malformed = pod == "web/typo-0";
        let want = if malformed {
            0
        } else if node.is_null() {
            nodes
        } else {
            1
        };
        assert_eq!(*count, want, "--explain failed: {pod}");
    }
    for (pod, _, count) in &a {
        let want = if pod == "web/typo-0" { 0 } else { nodes };
        assert_eq!(*count, want, "--explain all: {pod}");
    }
    assert!(n.iter().all(|(_, _, count)| *count == 0), "--explain none");
    // Reasons for the pod that fits nowhere, per node, by default.
    let big = failed["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pod"] == "telco/cu-big")
        .unwrap();
    assert!(
        big["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["feasible"] == false && !v["reasons"].as_array().unwrap().is_empty())
    );
    // The environment variable selects it too.
    let ex = examples();
    let cluster = ex.join("cluster.yaml");
    let pods = ex.join("pods.yaml");
    let config = ex.join("config.yaml");
    let args = [
        "--cluster",
        cluster.to_str().unwrap(),
        "--pods",
        pods.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "-o",
        "json",
    ];
    let by_env = json_report(&run(&args, &[("NUMAPLANE_SIM_EXPLAIN", "all")]));
    assert_eq!(outcomes(&by_env), a);
    let bad = run(&args, &[("NUMAPLANE_SIM_EXPLAIN", "some")]);
    assert_eq!(
        bad.status.code(),
        Some(64),
        "an unknown value is bad configuration"
    );
}

/// The example cluster as one `kind: List` document, as `kubectl get ... -o yaml|json` writes.
fn example_as_list(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(examples().join("cluster.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let items: Vec<serde_json::Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    // Nested: a List inside the List, as a concatenation of dumps gives.
    let (first, rest) = items.split_at(2);
    let mut all = vec![serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "items": first})];
    all.extend(rest.iter().cloned());
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": all});
    let yaml = dir.join("dump.yaml");
    std::fs::write(&yaml, serde_saphyr::to_string(&list).unwrap()).unwrap();
    let json = dir.join("dump.json");
    std::fs::write(&json, serde_json::to_string_pretty(&list).unwrap()).unwrap();
    (yaml, json)
}

#[test]
fn kubectl_list_dumps_in_yaml_and_json_give_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, json) = example_as_list(dir.path());
    let ex = examples();
    let reference = json_report(&simulate(&["-o", "json"]));
    for dump in [yaml, json] {
        let out = run(
            &[
                "--cluster",
                dump.to_str().unwrap(),
                "--pods",
                ex.join("pods.yaml").to_str().unwrap(),
                "--config",
                ex.join("config.yaml").to_str().unwrap(),
                "-o",
                "json",
            ],
            &[],
        );
        let report = json_report(&out);
        assert_eq!(outcomes(&report), outcomes(&reference), "{}", dump.display());
        assert_eq!(report["warnings"], reference["warnings"]);
    }
}

/// More than serde-saphyr's default 1,024 documents and 250,000 YAML nodes, as a dump of a
/// few hundred nodes with NRTs already is.
#[test]
fn large_multi_document_yaml_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = 1_500;
    let mut text = String::new();
    for i in 0..nodes {
        let labels: String = (0..60)
            .map(|l| format!("    example.com/label-{l}: \"v{l}\"\n"))
            .collect();
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n{i:04}\n  labels:\n{labels}status:\n  allocatable: {{cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n"
        ));
        text.push_str(&format!(
            "---\napiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\nmetadata: {{name: n{i:04}}}\nattributes:\n- {{name: topologyManagerPolicy, value: single-numa-node}}\n- {{name: topologyManagerScope, value: container}}\nzones:\n- name: node-0\n  type: Node\n  resources:\n  - {{name: cpu, capacity: \"4\", allocatable: \"4\", available: \"{}\"}}\n  - {{name: memory, capacity: 16Gi, allocatable: 16Gi, available: 16Gi}}\n- name: node-1\n  type: Node\n  resources:\n  - {{name: cpu, capacity: \"4\", allocatable: \"4\", available: \"2\"}}\n  - {{name: memory, capacity: 16Gi, allocatable: 16Gi, available: 16Gi}}\n",
            // Only the last node has a zone with 4 free CPUs.
            if i == nodes - 1 { 4 } else { 2 }
        ));
    }
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(&cluster, text).unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(
        &pods,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: four, namespace: t}\nspec:\n  containers:\n  - name: a\n    resources:\n      requests: {cpu: \"4\", memory: 1Gi}\n      limits: {cpu: \"4\", memory: 1Gi}\n",
    )
    .unwrap();
    let out = run(
        &[
            "--cluster",
            cluster.to_str().unwrap(),
            "--pods",
            pods.to_str().unwrap(),
            "-o",
            "json",
        ],
        &[],
    );
    let report = json_report(&out);
    assert_eq!(report["results"][0]["node"], format!("n{:04}", nodes - 1));
    assert_eq!(report["warnings"], serde_json::json!([]));
}

#[test]
fn hostile_yaml_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // "Billion laughs": nine levels of ten aliases each expand to 10^9 scalars.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for l in 1..10 {
        let refs = vec![format!("*a{}", l - 1); 10].join(", ");
        bomb.push_str(&format!("a{l}: &a{l} [{refs}]\n"));
    }
    let path = dir.path().join("bomb.yaml");
    std::fs::write(&path, bomb).unwrap();
    let out = run(
        &[
            "--cluster",
            path.to_str().unwrap(),
            "--pods",
            path.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bomb.yaml") && err.contains("hostile"), "{err}");

    // A file beyond the input bound is refused before it is read (sparse: no disk used).
    let huge = dir.path().join("huge.yaml");
    std::fs::File::create(&huge).unwrap().set_len(5 << 30).unwrap();
    let out = run(
        &[
            "--cluster",
            huge.to_str().unwrap(),
            "--pods",
            huge.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the"));

    let list = dir.path().join("list.yaml");
    std::fs::write(&list, "apiVersion: v1\nkind: List\nitems: {a: b}\n").unwrap();
    let out = run(
        &[
            "--cluster",
            list.to_str().unwrap(),
            "--pods",
            list.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("items is not a list"));
}
