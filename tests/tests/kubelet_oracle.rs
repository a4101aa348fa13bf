//! The model against the real kubelet v1.36.2: every scenario of `tests/oracle/` and of the
//! kit's `../shared/conformance/kubelet-oracle/` runs on the kit's real kubelet (a fake NUMA
//! machine, the policies, scopes and options it names, a fake device plugin), and the same pods
//! go through `simulate` on the NodeResourceTopology numaplane-exporter publishes for that
//! kubelet. For every pod, admission and the reject reason, the NUMA nodes of its exclusive
//! CPUs, memory and devices, and the device IDs must be the kubelet's. A mismatch names the
//! scenario, the policy and scope, the pod and both answers.
//!
//! Needs the kit's `node` (root, cgroup v1, containerd, runc; CI has them). Without the kit the
//! test prints one line saying how to run it; `NUMAPLANE_ORACLE_NIGHTLY=1` adds the
//! nightly-sized scenarios, `NUMAPLANE_ORACLE_ONLY=<part of a name>` picks scenarios and
//! `NUMAPLANE_ORACLE_VERBOSE=1` prints both answers for every pod (docs/testing.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use numaplane_e2e::control_plane::{self, Options, repo_root};
use numaplane_e2e::oracle::{self, NIGHTLY_ENV, Scenario};

/// Runs only the scenarios whose name contains this.
const ONLY_ENV: &str = "NUMAPLANE_ORACLE_ONLY";
/// Prints both answers for every pod.
const VERBOSE_ENV: &str = "NUMAPLANE_ORACLE_VERBOSE";

fn scenario_dirs() -> Vec<PathBuf> {
    vec![
        repo_root().join("tests/oracle"),
        repo_root().join("../shared/conformance/kubelet-oracle"),
    ]
}

fn all_scenarios() -> Vec<Scenario> {
    let nightly = std::env::var_os(NIGHTLY_ENV).is_some();
    let only = std::env::var(ONLY_ENV).unwrap_or_default();
    scenario_dirs()
        .into_iter()
        .filter(|d| d.is_dir())
        .flat_map(|d| oracle::scenarios(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())))
        .filter(|s| nightly || !s.nightly)
        .filter(|s| s.name.contains(&only))
        .collect()
}

#[test]
fn every_scenario_file_parses_and_names_its_pods_once() {
    let dir = repo_root().join("tests/oracle");
    let scenarios = oracle::scenarios(&dir).unwrap();
    assert!(
        scenarios.len() >= 5,
        "{} scenarios in {}",
        scenarios.len(),
        dir.display()
    );
    for s in &scenarios {
        let mut names: Vec<&str> = s.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), s.pods.len(), "{}: duplicate pod names", s.name);
        oracle::machine_spec(&s.machine)
            .and_then(|m| Ok(m.to_hwloc_xml()?))
            .unwrap_or_else(|e| panic!("{}: machine: {e}", s.name));
        assert!(!s.policy.is_empty(), "{}: no policy", s.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_predicts_what_the_real_kubelet_does() {
    let Some(cluster) = control_plane::require("the kubelet oracle", &Options::default()) else {
        return;
    };
    let Some(cp) = cluster.control_plane() else {
        println!(
            "SKIPPED: the kubelet oracle needs the kit's node (../shared/k8s/node) on a control plane of the kit, not {}",
            control_plane::REAL_CLUSTER_ENV
        );
        return;
    };
    if !oracle::node_script().is_file() {
        println!(
            "SKIPPED: the kubelet oracle: no {} (run it with the kit of ../shared/k8s)",
            oracle::node_script().display()
        );
        return;
    }
    let client = cp.client().await.unwrap();
    let scenarios = all_scenarios();
    let mut mismatches = Vec::new();
    let (mut runs, mut pods) = (0, 0);
    for s in &scenarios {
        let result = oracle::run_scenario(&client, cp.dir(), s).await;
        let result = result.unwrap_or_else(|e| panic!("scenario {}: {e}", s.name));
        for r in result {
            runs += 1;
            pods += r.pods.len();
            if let Some(err) = &r.refused {
                assert!(
                    err.contains(&s.kubelet_error),
                    "{}: the kubelet refused, but not with {:?}:\n{err}",
                    r.label,
                    s.kubelet_error
                );
                continue;
            }
            if std::env::var_os(VERBOSE_ENV).is_some() {
                for (pod, k, m) in &r.pods {
                    println!("{}: {pod}: kubelet {k}; model {m}", r.label);
                }
            }
            mismatches.extend(r.mismatches());
            let flagged: Vec<&String> = r
                .warnings
                .iter()
                .filter(|w| w.contains("predictions are approximate"))
                .collect();
            for option in &s.approximate {
                if !flagged
                    .iter()
                    .any(|w| w.contains(&format!("kubelet option {option}:")))
                {
                    mismatches.push(format!(
                        "{}: simulate did not report {option} as making its predictions approximate: {flagged:?}",
                        r.label
                    ));
                }
            }
            if s.approximate.is_empty() && !flagged.is_empty() {
                mismatches.push(format!("{}: approximate without a reason: {flagged:?}", r.label));
            }
        }
    }
    println!(
        "kubelet oracle: {} scenarios, {runs} runs, {pods} pod verdicts, {} mismatches",
        scenarios.len(),
        mismatches.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
