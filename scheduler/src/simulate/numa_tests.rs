//! NUMA alignment of DRA claims through `simulate`, on the example cluster
//! (`examples/dra-numa/`): one node, CPUs free mostly on NUMA node 1, gpu-0 on NUMA node 0 (by
//! the standard attribute) and gpu-1 on NUMA node 1 (by its PCIe root and the NRT's PCI
//! locality).

use std::path::PathBuf;

use super::*;
use crate::dra::numa::{AlignmentStatus, DraNumaAlignment};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/dra-numa")
        .join(name)
}

fn run_texts(cluster: &str, pods: &str, mode: DraNumaAlignment) -> Report {
    run_texts_explained(cluster, pods, mode, Explain::Failed)
}

fn run_texts_explained(cluster: &str, pods: &str, mode: DraNumaAlignment, explain: Explain) -> Report {
    let dir = std::env::temp_dir().join(format!(
        "numaplane-dra-numa-{}-{:?}-{}",
        std::process::id(),
        mode,
        cluster.len() ^ pods.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, p) = (dir.join("cluster.yaml"), dir.join("pods.yaml"));
    std::fs::write(&c, cluster).unwrap();
    std::fs::write(&p, pods).unwrap();
    let report = run_files_explained(&c, &p, mode, explain);
    std::fs::remove_dir_all(&dir).unwrap();
    report
}

fn run_files(cluster: &std::path::Path, pods: &std::path::Path, mode: DraNumaAlignment) -> Report {
    run_files_explained(cluster, pods, mode, Explain::Failed)
}

fn run_files_explained(
    cluster: &std::path::Path,
    pods: &std::path::Path,
    mode: DraNumaAlignment,
    explain: Explain,
) -> Report {
    let mut cfg = ConfigFile::default();
    cfg.dra_numa.alignment = Some(mode);
    let inputs = read_inputs(&[cluster]).unwrap();
    let pods = read_inputs(&[pods]).unwrap().pods;
    simulate(inputs, pods, &cfg, explain)
}

fn run(mode: DraNumaAlignment) -> Report {
    run_files(&example("cluster.yaml"), &example("pods.yaml"), mode)
}

fn devices(r: &PodResult) -> Vec<String> {
    r.claims
        .iter()
        .flat_map(|c| {
            c.allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
        })
        .map(|d| d.device.clone())
        .collect()
}

fn status(r: &PodResult) -> AlignmentStatus {
    r.claims[0].numa.as_ref().unwrap().alignment
}

/// A ResourceClaim of one GPU of the example's class, in namespace `default`.
fn claim(name: &str) -> String {
    format!(
        "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  devices:\n    requests:\n      - name: gpu\n        exactly: {{deviceClassName: gpu.example.com}}\n"
    )
}

/// A Guaranteed pod of `cpus` CPUs whose one container names each of `claims` (pod claim
/// name, ResourceClaim name).
fn pod(name: &str, cpus: &str, claims: &[(&str, String)]) -> String {
    let mut p = format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  schedulerName: numaplane-scheduler\n"
    );
    if !claims.is_empty() {
        p.push_str("  resourceClaims:\n");
        for (n, c) in claims {
            p.push_str(&format!("    - name: {n}\n      resourceClaimName: {c}\n"));
        }
    }
    p.push_str(&format!(
        "  containers:\n    - name: main\n      image: registry.k8s.io/pause:3.10\n      resources:\n        \
         requests: {{cpu: \"{cpus}\", memory: 1Gi}}\n        limits: {{cpu: \"{cpus}\", memory: 1Gi}}\n"
    ));
    if !claims.is_empty() {
        p.push_str("        claims:\n");
        for (n, _) in claims {
            p.push_str(&format!("          - name: {n}\n"));
        }
    }
    p
}

#[test]
fn required_takes_the_gpu_beside_the_pinned_cpus_and_rejects_a_node_without_one() {
    let report = run(DraNumaAlignment::Required);
    let train = &report.results[0];
    assert_eq!(train.decision.node.as_deref(), Some("gpu-a"));
    assert_eq!(devices(train), vec!["gpu-1"]);
    assert_eq!(status(train), AlignmentStatus::Aligned);
    let numa = train.claims[0].numa.as_ref().unwrap();
    assert_eq!(numa.devices[0].numa_nodes, Some(vec![1]));
    assert_eq!(numa.containers[0].numa_nodes, Some(vec![1]));
    assert_eq!(numa.containers[0].pinned, Some("cpu"));
    // The record the kubelet side reads says NUMA node 1 too.
    let record = train.decision.allocation.as_ref().unwrap();
    assert_eq!(record.containers[0].numa_nodes, Some(vec![1]));

    let infer = &report.results[1];
    assert_eq!(infer.decision.node, None);
    assert_eq!(
        infer.decision.nodes[0].reasons,
        vec![
            "claim gpu: no free device of class gpu.example.com on NUMA node 1, where the kubelet will pin cpu"
        ]
    );
    assert!(infer.claims.is_empty());
}

#[test]
fn ignore_is_the_upstream_choice_and_is_reported_misaligned() {
    let report = run(DraNumaAlignment::Ignore);
    assert_eq!(devices(&report.results[0]), vec!["gpu-0"]);
    assert_eq!(status(&report.results[0]), AlignmentStatus::Misaligned);
    assert_eq!(devices(&report.results[1]), vec!["gpu-1"]);
    assert_eq!(status(&report.results[1]), AlignmentStatus::Aligned);

    // The same pods with no container naming a claim take the plain path: same devices, same
    // scores, under every mode.
    let cluster = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    let pods = std::fs::read_to_string(example("pods.yaml"))
        .unwrap()
        .replace("        claims:\n          - name: gpu\n", "");
    for mode in [DraNumaAlignment::Ignore, DraNumaAlignment::Required] {
        let plain = run_texts(&cluster, &pods, mode);
        for (a, b) in plain.results.iter().zip(&report.results) {
            assert_eq!(devices(a), devices(b));
            assert_eq!(a.decision.nodes[0].score, b.decision.nodes[0].score);
            assert!(a.claims.iter().all(|c| c.numa.is_none()));
        }
    }
}

#[test]
fn preferred_places_both_and_scores_alignment() {
    let report = run(DraNumaAlignment::Preferred);
    let (train, infer) = (&report.results[0], &report.results[1]);
    assert_eq!(devices(train), vec!["gpu-1"]);
    assert_eq!(devices(infer), vec!["gpu-0"]);
    assert_eq!(status(infer), AlignmentStatus::Misaligned);
    let ignore = run(DraNumaAlignment::Ignore);
    let score = |r: &Report, i: usize| r.results[i].decision.nodes[0].score.unwrap();
    // The aligned choice gains the bonus over the same node under Ignore; the misaligned one
    // gains nothing.
    assert_eq!(score(&report, 0), score(&ignore, 0) + crate::dra::numa::MAX_BONUS);
    assert_eq!(score(&report, 1), score(&ignore, 1));
}

#[test]
fn a_container_on_every_numa_node_prefers_none() {
    // best-effort and 16 CPUs: the container is pinned on both NUMA nodes, so every device is
    // as local as another. No target: upstream's device choice, no bonus, not predicted.
    let cluster = std::fs::read_to_string(example("cluster.yaml")).unwrap().replace(
        "{name: topologyManagerPolicy, value: single-numa-node}",
        "{name: topologyManagerPolicy, value: best-effort}",
    );
    let pods = std::fs::read_to_string(example("pods.yaml"))
        .unwrap()
        .replace("cpu: \"4\"", "cpu: \"16\"");
    let ignore = run_texts(&cluster, &pods, DraNumaAlignment::Ignore);
    for mode in [DraNumaAlignment::Required, DraNumaAlignment::Preferred] {
        let report = run_texts(&cluster, &pods, mode);
        let (r, i) = (&report.results[0], &ignore.results[0]);
        assert!(r.decision.node.is_some(), "{mode:?}: {}", r.decision.message);
        assert_eq!(devices(r), devices(i), "{mode:?}");
        let numa = r.claims[0].numa.as_ref().unwrap();
        assert_eq!(numa.containers[0].numa_nodes, Some(vec![0, 1]), "{mode:?}");
        assert_eq!(numa.alignment, AlignmentStatus::NotPredicted, "{mode:?}");
        assert_eq!(r.decision.nodes[0].score, i.decision.nodes[0].score, "{mode:?}");
    }
}

#[test]
fn device_plugin_resources_steer_the_hint_and_the_claim_follows() {
    // A device-plugin NIC on NUMA node 0 only, CPUs free on both nodes: the Topology Manager
    // puts the container on NUMA node 0 for the NIC, and the GPU claim follows it there.
    let cluster = std::fs::read_to_string(example("cluster.yaml"))
        .unwrap()
        .replace(
            "allocatable: {cpu: \"32\", memory: 64Gi, pods: \"110\"}",
            "allocatable: {cpu: \"32\", memory: 64Gi, pods: \"110\", example.com/nic: \"1\"}",
        )
        .replace(
            "      - {name: cpu, capacity: \"16\", allocatable: \"16\", available: \"2\"}",
            "      - {name: cpu, capacity: \"16\", allocatable: \"16\", available: \"14\"}\n      - {name: example.com/nic, capacity: \"1\", allocatable: \"1\", available: \"1\"}",
        );
    assert!(cluster.contains("example.com/nic, capacity"));
    let pods = std::fs::read_to_string(example("pods.yaml"))
        .unwrap()
        .replacen(
            "requests: {cpu: \"4\", memory: 4Gi}\n        limits: {cpu: \"4\", memory: 4Gi}",
            "requests: {cpu: \"4\", memory: 4Gi, example.com/nic: \"1\"}\n        limits: {cpu: \"4\", memory: 4Gi, example.com/nic: \"1\"}",
            1,
        );
    for mode in [DraNumaAlignment::Required, DraNumaAlignment::Preferred] {
        let report = run_texts(&cluster, &pods, mode);
        let train = &report.results[0];
        let record = train.decision.allocation.as_ref().unwrap();
        assert_eq!(record.containers[0].numa_nodes, Some(vec![0]), "{mode:?}");
        assert_eq!(devices(train), vec!["gpu-0"], "{mode:?}");
        let numa = train.claims[0].numa.as_ref().unwrap();
        assert_eq!(numa.devices[0].numa_nodes, record.containers[0].numa_nodes);
        assert_eq!(numa.alignment, AlignmentStatus::Aligned);
    }
}

#[test]
fn the_table_shows_devices_and_containers_numa_and_marks_misalignment() {
    let text = render_table(&run(DraNumaAlignment::Ignore));
    assert!(
        text.contains(
            "claim train-gpu            devices gpu.example.com/gpu-a/gpu-0 (NUMA 0)  containers train (NUMA 1, pins cpu)  MISALIGNED"
        ),
        "{text}"
    );
    let json = serde_json::to_value(run(DraNumaAlignment::Ignore)).unwrap();
    let numa = &json["results"][0]["claims"][0]["numa"];
    assert_eq!(numa["alignment"], "misaligned");
    assert_eq!(numa["devices"][0]["numaNodes"], serde_json::json!([0]));
    assert_eq!(numa["containers"][0]["numaNodes"], serde_json::json!([1]));
}

#[test]
fn a_malformed_pci_locality_is_a_warning_and_leaves_pci_placed_devices_unplaced() {
    let cluster = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    let broken = cluster.replace(
        "{name: numaplane.io/pci-locality, value: \"0000:00-7f=0,0000:80-ff=1\"}",
        "{name: numaplane.io/pci-locality, value: \"0000:zz=1\"}",
    );
    assert_ne!(broken, cluster);
    let report = run_texts(
        &broken,
        &std::fs::read_to_string(example("pods.yaml")).unwrap(),
        DraNumaAlignment::Required,
    );
    let warned: Vec<&String> = report
        .warnings
        .iter()
        .filter(|w| w.contains("PCI locality ignored"))
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", report.warnings);
    assert!(warned[0].contains("gpu-a"), "{}", warned[0]);
    // gpu-1 is placed only by its PCIe root: without the locality it has no NUMA node, and the
    // first pod takes it as a device without NUMA affinity.
    let train = &report.results[0];
    assert_eq!(devices(train), vec!["gpu-1"]);
    assert_eq!(status(train), AlignmentStatus::NoNumaNode);
}

#[test]
fn the_worked_example_in_the_docs_is_the_real_output() {
    let doc = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/scheduler.md"))
        .unwrap();
    let command = "simulate --cluster examples/dra-numa/cluster.yaml --pods examples/dra-numa/pods.yaml\n```\n\n```text\n";
    let start = doc.find(command).expect("the example's command and output block") + command.len();
    let shown = &doc[start..];
    let shown = &shown[..shown.find("```").unwrap()];
    let real = render_table(&run(DraNumaAlignment::Required));
    let lines = |t: &str| {
        t.lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        lines(shown),
        lines(&real),
        "docs/scheduler.md shows:\n{shown}\nsimulate prints:\n{real}"
    );
}

#[test]
fn alignment_chooses_the_node_and_the_fast_path_agrees_with_the_explained_one() {
    // gpu-a keeps only gpu-0 (NUMA node 0, away from the CPUs); gpu-b is the example node.
    let one = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    let gpu1 = "    - name: gpu-1\n      attributes:\n        resource.kubernetes.io/pcieRoot: {string: \"pci0000:80\"}\n";
    assert!(one.contains(gpu1));
    let cluster = format!(
        "{}\n---\n{}",
        one.replace(gpu1, ""),
        one.replace("gpu-a", "gpu-b")
    );
    let pods = std::fs::read_to_string(example("pods.yaml")).unwrap();
    for (mode, node) in [
        (DraNumaAlignment::Required, "gpu-b"),
        (DraNumaAlignment::Preferred, "gpu-b"),
        (DraNumaAlignment::Ignore, "gpu-a"),
    ] {
        let fast = run_texts_explained(&cluster, &pods, mode, Explain::Failed);
        let full = run_texts_explained(&cluster, &pods, mode, Explain::All);
        assert_eq!(fast.results[0].decision.node.as_deref(), Some(node), "{mode:?}");
        for (f, e) in fast.results.iter().zip(&full.results) {
            assert_eq!(f.decision.node, e.decision.node, "{mode:?}");
            assert_eq!(devices(f), devices(e), "{mode:?}");
            let score = |r: &PodResult| {
                r.decision
                    .nodes
                    .iter()
                    .find(|v| Some(&v.node) == r.decision.node.as_ref())
                    .and_then(|v| v.score)
            };
            assert_eq!(score(f), score(e), "{mode:?}");
        }
        if mode == DraNumaAlignment::Required {
            let a = full.results[0]
                .decision
                .nodes
                .iter()
                .find(|v| v.node == "gpu-a")
                .unwrap();
            assert!(!a.feasible);
            assert_eq!(
                a.reasons,
                vec![
                    "claim gpu: no free device of class gpu.example.com on NUMA node 1, where the kubelet will pin cpu"
                ]
            );
        }
    }
}

#[test]
fn a_malformed_numa_attribute_is_a_warning_and_the_device_counts_as_unplaced() {
    let cluster = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    let pods = std::fs::read_to_string(example("pods.yaml")).unwrap();
    let broken = cluster.replace(
        "resource.kubernetes.io/numaNode: {int: 0}",
        "resource.kubernetes.io/numaNode: {int: -3}",
    );
    assert_ne!(broken, cluster);
    let report = run_texts(&broken, &pods, DraNumaAlignment::Required);
    let warned: Vec<&String> = report
        .warnings
        .iter()
        .filter(|w| w.contains("gpu-0") && w.contains("resource.kubernetes.io/numaNode"))
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", report.warnings);
    assert!(warned[0].contains("without NUMA node"), "{}", warned[0]);
    // gpu-0 has no NUMA node now: the first pod still takes the aligned gpu-1, and the second,
    // rejected on the intact cluster, takes gpu-0 as a device without NUMA affinity.
    assert_eq!(devices(&report.results[0]), vec!["gpu-1"]);
    assert_eq!(devices(&report.results[1]), vec!["gpu-0"]);
    let numa = report.results[1].claims[0].numa.as_ref().unwrap();
    assert_eq!(numa.devices[0].numa_nodes, None);
    let intact = run(DraNumaAlignment::Required);
    assert!(
        intact.warnings.iter().all(|w| !w.contains("NUMA")),
        "{:?}",
        intact.warnings
    );
}

#[test]
fn a_pair_of_required_claims_is_explained_together_until_a_device_is_taken() {
    // Three GPUs on the example node: gpu-0 and gpu-2 on NUMA node 0, gpu-1 on NUMA node 1,
    // where the CPUs of a 4-CPU pod go. Each of a pair's claims alone can take gpu-1; both
    // cannot. Once `train` holds gpu-1, neither can.
    let one = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    let gpu1 = "    - name: gpu-1\n      attributes:\n        resource.kubernetes.io/pcieRoot: {string: \"pci0000:80\"}\n";
    assert!(one.contains(gpu1));
    let mut cluster = one.replace(
        gpu1,
        &format!("{gpu1}    - name: gpu-2\n      attributes:\n        resource.kubernetes.io/numaNode: {{int: 0}}\n"),
    );
    for name in ["first-a", "first-b", "again-a", "again-b", "last-a", "last-b"] {
        cluster.push_str(&claim(name));
    }
    let pair = |prefix: &str| [("a", format!("{prefix}-a")), ("b", format!("{prefix}-b"))];
    let pods = [
        pod("first", "4", &pair("first")),
        // CPUs only: the node changes, its devices do not.
        pod("cpus", "2", &[]),
        pod("again", "4", &pair("again")),
        pod("train", "4", &[("gpu", "train-gpu".to_owned())]),
        pod("last", "4", &pair("last")),
    ]
    .concat();
    let report = run_texts(&cluster, &pods, DraNumaAlignment::Required);
    let reasons = |i: usize| {
        let r = &report.results[i];
        assert_eq!(r.decision.node, None, "{}", r.decision.pod);
        r.decision.nodes[0].reasons.clone()
    };
    let together = "claims a, b: no free devices for all of them together on NUMA node 1, where the kubelet will pin cpu";
    assert_eq!(reasons(0), vec![together]);
    assert_eq!(report.results[1].decision.node.as_deref(), Some("gpu-a"));
    assert_eq!(reasons(2), vec![together]);
    assert_eq!(report.results[3].decision.node.as_deref(), Some("gpu-a"));
    assert_eq!(devices(&report.results[3]), vec!["gpu-1"]);
    assert_eq!(
        reasons(4),
        vec![
            "claim a: no free device of class gpu.example.com on NUMA node 1, where the kubelet will pin cpu"
        ]
    );
}

#[test]
fn under_ignore_a_node_without_free_devices_keeps_upstreams_reason_after_a_cpu_only_change() {
    // The example's two pods take both GPUs (Ignore places both); the later claims find none.
    // The search remembers upstream's failure, and what is said of a pod that fits nowhere is
    // built from it: the message, and the node's reason where nodes are explained.
    let mut cluster = std::fs::read_to_string(example("cluster.yaml")).unwrap();
    for name in ["late-gpu", "later-gpu"] {
        cluster.push_str(&claim(name));
    }
    let mut pods = std::fs::read_to_string(example("pods.yaml")).unwrap();
    pods.push_str(
        &[
            pod("late", "1", &[("gpu", "late-gpu".to_owned())]),
            // CPUs only: the node changes, its devices do not.
            pod("cpus", "1", &[]),
            pod("later", "1", &[("gpu", "later-gpu".to_owned())]),
        ]
        .concat(),
    );
    let quick = run_texts_explained(&cluster, &pods, DraNumaAlignment::Ignore, Explain::None);
    let full = run_texts_explained(&cluster, &pods, DraNumaAlignment::Ignore, Explain::Failed);
    let placed: Vec<Option<&str>> = quick.results.iter().map(|r| r.decision.node.as_deref()).collect();
    assert_eq!(placed, [Some("gpu-a"), Some("gpu-a"), None, Some("gpu-a"), None]);
    for i in [2, 4] {
        let message = &quick.results[i].decision.message;
        assert!(message.contains("cannot allocate all claims"), "{message}");
        assert_eq!(message, &full.results[i].decision.message);
        // The node's reason is upstream's own, as the search that found nothing left it.
        assert_eq!(
            full.results[i].decision.nodes[0].reasons,
            ["cannot allocate all claims"]
        );
    }
}

/// A cluster of `nodes` nodes of 2 NUMA nodes (16 CPUs, some pinned already, and 4 GPUs
/// each, split over the NUMA nodes), single-numa-node, with one claim per name in `claims`.
fn generated_cluster(nodes: usize, claims: &[String]) -> serde_json::Value {
    use serde_json::json;
    let mut items = Vec::new();
    for i in 0..nodes {
        let name = format!("node-{i:02}");
        let amounts = json!({"cpu": "16", "memory": "64Gi", "pods": "110"});
        items.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": amounts, "allocatable": amounts,
                "conditions": [{"type": "Ready", "status": "True"}]}}));
        let zones: Vec<_> = (0..2)
            .map(|z| {
                // Pinned CPUs differ per node and zone, so scores differ and change as pods bind.
                let available = 8 - (i * 3 + z * 5) % 7;
                json!({"name": format!("node-{z}"), "type": "Node",
                    "costs": [{"name": "node-0", "value": if z == 0 { 10 } else { 21 }},
                              {"name": "node-1", "value": if z == 1 { 10 } else { 21 }}],
                    "resources": [{"name": "cpu", "capacity": "8", "allocatable": "8",
                        "available": available.to_string()}]})
            })
            .collect();
        items.push(
            json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                           {"name": "topologyManagerScope", "value": "container"}],
            "zones": zones}),
        );
        let devices: Vec<_> = (0..4)
            .map(|d| {
                json!({"name": format!("gpu-{d}"),
                "attributes": {"resource.kubernetes.io/numaNode": {"int": d / 2}}})
            })
            .collect();
        items.push(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{name}-gpu")},
            "spec": {"driver": "gpu.example.com", "nodeName": name,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
        );
    }
    items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}}));
    for c in claims {
        items.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": c, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

#[test]
fn many_decisions_on_remembered_rankings_match_every_node_explained() {
    // A stream of pods of few shapes on 60 nodes: each decision on the remembered verdicts and
    // rankings (only the nodes changed since the last pod of its shape are looked at again)
    // must place and allocate as a decision that explains every node from scratch.
    // (CPUs, claims): every third pod has no claim, so some nodes change without a device
    // taken.
    let stream: Vec<(usize, usize)> = (0..240).map(|p| (1 + (p / 3) % 2 * 2, p % 3)).collect();
    let mut claims = Vec::new();
    let mut pods = String::new();
    for (p, &(cpus, n)) in stream.iter().enumerate() {
        let uses: Vec<(&str, String)> = ["a", "b"][..n]
            .iter()
            .map(|k| (*k, format!("p{p}-{k}")))
            .collect();
        claims.extend(uses.iter().map(|(_, c)| c.clone()));
        pods.push_str(&pod(&format!("p{p}"), &cpus.to_string(), &uses));
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.json");
    std::fs::write(&cluster, generated_cluster(60, &claims).to_string()).unwrap();
    let pods_path = dir.path().join("pods.yaml");
    std::fs::write(&pods_path, pods).unwrap();
    for mode in [
        DraNumaAlignment::Required,
        DraNumaAlignment::Preferred,
        DraNumaAlignment::Ignore,
    ] {
        let quick = run_files_explained(&cluster, &pods_path, mode, Explain::None);
        let full = run_files_explained(&cluster, &pods_path, mode, Explain::All);
        let placed = quick.results.iter().filter(|r| r.decision.node.is_some()).count();
        // Both placed and unplaced pods, on many nodes.
        assert!(placed > 120 && placed < stream.len(), "{mode:?}: {placed} placed");
        for (q, f) in quick.results.iter().zip(&full.results) {
            assert_eq!(q.decision.node, f.decision.node, "{mode:?} {}", q.decision.pod);
            assert_eq!(devices(q), devices(f), "{mode:?} {}", q.decision.pod);
            assert_eq!(
                q.decision.message, f.decision.message,
                "{mode:?} {}",
                q.decision.pod
            );
        }
    }
}
