//! DRA devices aligned with the CPUs the kubelet pins: one pod stream, run through the release
//! `numaplane-scheduler simulate --cluster DUMP --pods PODS -o json` binary once per mode,
//! with each `--dra-numa-alignment` mode (`Ignore` is kube-scheduler's own device choice), on
//! clusters of 2-, 4- and 8-NUMA nodes.
//!
//! Every node: 128 CPUs and 8 GPUs split evenly over its NUMA nodes, Topology Manager
//! `single-numa-node` (container scope), static CPU manager (the NRT zones publish `cpu`); some
//! CPUs of each NUMA node are already pinned (the NRT's `available`, 0 to 3/4 of the zone, drawn
//! per node and zone). A DRA driver `gpu.example.com` publishes one ResourceSlice per node whose
//! devices carry `resource.kubernetes.io/numaNode`, in NUMA order as a PCI scan lists them; one
//! DeviceClass selects them. Pods are Guaranteed with 1–8 integer CPUs and one or two
//! ResourceClaims (one GPU each), created beforehand by name; the stream asks for ~70% of the
//! cluster's GPUs. The same stream (same seed) runs on every cluster and in every mode.
//!
//! Every stream runs four times per cluster: `Required`, `Preferred`, `Ignore`, and without its
//! claims (`plain`, the path of pods without DRA), then once more under `Required` with only the
//! pods that run placed: the difference is what the pods it leaves unplaced cost.
//!
//! Aligned fraction: claims of placed pods whose devices sit on the NUMA nodes the container's
//! CPUs are predicted on. It is counted twice and the two must agree: from the JSON verdict
//! (`claims[].numa.alignment == "aligned"`) and recomputed from the devices the claim got (the
//! bench knows each generated device's NUMA node) against `placement.containers[].numaNodes`.
//! Decision rate: pods per second of the simulate process's wall time (reading the dump
//! included), and net of reading: the wall time of a run with only the stream's first pod
//! (Ignore) is subtracted.
//!
//! `cargo bench -p numaplane-scheduler --bench dra_numa_alignment -- [NODES...] [--keep DIR]`
//! (default 500 nodes per cluster; several sizes run one after the other). `--keep DIR` leaves
//! `DIR/<NODES>-nodes/` with each cluster's `cluster-<N>numa.json`, the pods files and the JSON
//! reports. Every run prints a fingerprint of its placements and allocations, to compare two
//! builds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use serde_json::{Value, json};

const CPUS_PER_NODE: usize = 128;
const GPUS_PER_NODE: usize = 8;
const DRIVER: &str = "gpu.example.com";
const NAMESPACE: &str = "bench";

/// A small deterministic generator (SplitMix64), so every run and mode sees the same stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// NUMA node of GPU `d` on a node with `zones` NUMA nodes (GPUs listed in NUMA order).
fn gpu_numa(d: usize, zones: usize) -> usize {
    d / (GPUS_PER_NODE / zones)
}

fn node(i: usize) -> Value {
    let name = node_name(i);
    let amounts = json!({"cpu": CPUS_PER_NODE.to_string(), "memory": "512Gi", "pods": "110"});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"),
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true"}},
        "status": {"capacity": amounts, "allocatable": amounts,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    })
}

fn nrt(i: usize, zones: usize, rng: &mut Rng) -> Value {
    let per_zone = CPUS_PER_NODE / zones;
    let zone_list: Vec<Value> = (0..zones)
        .map(|z| {
            let costs: Vec<Value> = (0..zones)
                .map(|t| json!({"name": format!("node-{t}"), "value": if t == z { 10 } else { 21 }}))
                .collect();
            let used = rng.below(per_zone * 3 / 4 + 1);
            json!({"name": format!("node-{z}"), "type": "Node", "costs": costs,
                "resources": [{"name": "cpu", "capacity": per_zone.to_string(),
                    "allocatable": per_zone.to_string(), "available": (per_zone - used).to_string()}]})
        })
        .collect();
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": node_name(i)},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": zone_list
    })
}

fn slice(i: usize, zones: usize) -> Value {
    let devices: Vec<Value> = (0..GPUS_PER_NODE)
        .map(|d| {
            json!({"name": format!("gpu-{d}"),
                "attributes": {"resource.kubernetes.io/numaNode": {"int": gpu_numa(d, zones)}}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{}-{DRIVER}", node_name(i))},
        "spec": {"driver": DRIVER, "nodeName": node_name(i),
            "pool": {"name": node_name(i), "generation": 1, "resourceSliceCount": 1},
            "devices": devices}
    })
}

fn device_class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}})
}

fn claim(name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
}

/// The pod stream: (CPUs, claims) per pod.
fn stream(pods: usize) -> Vec<(usize, usize)> {
    let mut rng = Rng(0x5EED_0001);
    (0..pods).map(|_| (1 + rng.below(8), 1 + rng.below(2))).collect()
}

fn claim_name(p: usize, k: usize) -> String {
    format!("p-{p}-gpu-{k}")
}

fn pod(p: usize, cpus: usize, claims: usize) -> Value {
    let r = json!({"cpu": cpus.to_string(), "memory": "4Gi"});
    let pod_claims: Vec<Value> = (0..claims)
        .map(|k| json!({"name": format!("gpu-{k}"), "resourceClaimName": claim_name(p, k)}))
        .collect();
    let uses: Vec<Value> = (0..claims).map(|k| json!({"name": format!("gpu-{k}")})).collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": NAMESPACE, "name": format!("p-{p}")},
        "spec": {"schedulerName": "numaplane-scheduler", "resourceClaims": pod_claims,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": r, "limits": r, "claims": uses}}]}})
}

fn write_list(path: &Path, items: Vec<Value>) {
    let list =
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    std::fs::write(path, serde_json::to_vec(&list).unwrap()).unwrap();
}

#[derive(Default)]
struct Tally {
    scheduled: usize,
    pods: usize,
    claims: usize,
    aligned_verdict: usize,
    aligned_recomputed: usize,
    pods_aligned: usize,
    verdicts: BTreeMap<String, usize>,
    wall: f64,
}

/// Counts alignment in a `simulate -o json` report; `zones` places the generated devices.
fn tally(report: &Value, zones: usize) -> Tally {
    let mut t = Tally::default();
    for r in report["results"].as_array().unwrap() {
        t.pods += 1;
        if r["node"].is_null() {
            continue;
        }
        t.scheduled += 1;
        let containers = r["placement"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "one container per pod: {r}");
        let cpu_nodes: Vec<u64> = containers[0]["numaNodes"]
            .as_array()
            .unwrap_or_else(|| panic!("no predicted NUMA nodes: {r}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        let mut all = true;
        for c in r["claims"].as_array().into_iter().flatten() {
            t.claims += 1;
            let verdict = c["numa"]["alignment"].as_str().unwrap_or("<none>").to_owned();
            if verdict == "aligned" {
                t.aligned_verdict += 1;
            }
            *t.verdicts.entry(verdict).or_default() += 1;
            let results = c["allocation"]["devices"]["results"].as_array().unwrap();
            let on_cpus = results.iter().all(|d| {
                let dev = d["device"].as_str().unwrap();
                let idx: usize = dev.strip_prefix("gpu-").unwrap().parse().unwrap();
                cpu_nodes.contains(&(gpu_numa(idx, zones) as u64))
            });
            if on_cpus {
                t.aligned_recomputed += 1;
            } else {
                all = false;
            }
        }
        if all {
            t.pods_aligned += 1;
        }
    }
    t
}

fn run(bin: &str, cluster: &Path, pods: &Path, mode: &str, out: &Path) -> f64 {
    let start = Instant::now();
    let status = Command::new(bin)
        .arg("simulate")
        .arg("--cluster")
        .arg(cluster)
        .arg("--pods")
        .arg(pods)
        .args(["-o", "json", "--explain", "none", "--dra-numa-alignment", mode])
        .env_remove("NUMAPLANE_SIM_CONFIG")
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    let wall = start.elapsed().as_secs_f64();
    assert!(status.success(), "simulate failed: {status}");
    wall
}

fn pct(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 }
}

/// The stream's pods with `keep` (by index), their claims left out when `claims` is false.
fn pods_file(path: &Path, stream: &[(usize, usize)], keep: impl Fn(usize) -> bool, claims: bool) {
    write_list(
        path,
        stream
            .iter()
            .enumerate()
            .filter(|(p, _)| keep(*p))
            .map(|(p, &(c, k))| pod(p, c, if claims { k } else { 0 }))
            .collect(),
    );
}

/// Every pod's node and devices, in stream order: two runs with the same fingerprint placed
/// and allocated the same.
fn fingerprint(report: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in report["results"].as_array().unwrap() {
        r["pod"].to_string().hash(&mut h);
        r["node"].to_string().hash(&mut h);
        for c in r["claims"].as_array().into_iter().flatten() {
            c["allocation"]["devices"]["results"].to_string().hash(&mut h);
        }
    }
    h.finish()
}

/// One run of the table: its tally and the net rate.
struct Row {
    t: Tally,
    net: f64,
    fingerprint: u64,
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let keep = common::keep_dir(&raw);
    let mut sizes: Vec<usize> = raw
        .iter()
        .filter(|a| !a.starts_with("--"))
        .filter_map(|a| a.parse::<usize>().ok())
        .collect();
    if sizes.is_empty() {
        sizes.push(500);
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = keep.unwrap_or_else(|| tmp.path().to_owned());
    let bin = env!("CARGO_BIN_EXE_numaplane-scheduler");
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for nodes in sizes {
        let dir = root.join(format!("{nodes}-nodes"));
        std::fs::create_dir_all(&dir).unwrap();
        // ~70% of the GPUs: a pod asks for 1.5 GPUs on average.
        let pods = nodes * GPUS_PER_NODE * 7 / 10 * 2 / 3;
        let stream = stream(pods);
        let asked_cpus: usize = stream.iter().map(|s| s.0).sum();
        let asked_gpus: usize = stream.iter().map(|s| s.1).sum();
        let pods_path = dir.join("pods.json");
        pods_file(&pods_path, &stream, |_| true, true);
        let plain_path = dir.join("pods-without-claims.json");
        pods_file(&plain_path, &stream, |_| true, false);
        let first_path = dir.join("first-pod.json");
        pods_file(&first_path, &stream, |p| p == 0, true);
        println!(
            "\n{nodes} nodes per cluster ({CPUS_PER_NODE} CPUs, {GPUS_PER_NODE} GPUs each, single-numa-node); \
             {pods} pods asking {asked_cpus} CPUs and {asked_gpus} GPUs ({:.0}% of the GPUs)",
            pct(asked_gpus, nodes * GPUS_PER_NODE)
        );
        println!(
            "{:>4} {:>9} {:>11} {:>16} {:>16} {:>7} {:>6} {:>7} {:>9} {:>9}  verdicts",
            "NUMA",
            "mode",
            "placed",
            "claims aligned",
            "pods aligned",
            "wall s",
            "read s",
            "pods/s",
            "net pods/s",
            "/ Ignore"
        );
        for zones in [2, 4, 8] {
            let mut rng = Rng(0xC1A5_0000 + zones as u64);
            let mut items = Vec::new();
            items.extend((0..nodes).map(node));
            items.extend((0..nodes).map(|i| nrt(i, zones, &mut rng)));
            items.push(device_class());
            items.extend((0..nodes).map(|i| slice(i, zones)));
            for (p, &(_, k)) in stream.iter().enumerate() {
                items.extend((0..k).map(|k| claim(&claim_name(p, k))));
            }
            let cluster = dir.join(format!("cluster-{zones}numa.json"));
            write_list(&cluster, items);
            let read = run(
                bin,
                &cluster,
                &first_path,
                "Ignore",
                &dir.join(format!("report-{zones}numa-read.json")),
            );
            let net = |pods: usize, wall: f64| {
                if wall > read {
                    pods as f64 / (wall - read)
                } else {
                    f64::NAN
                }
            };
            let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
            for mode in ["Ignore", "Required", "Preferred", "plain"] {
                let out = dir.join(format!("report-{zones}numa-{mode}.json"));
                let (file, flag) = match mode {
                    "plain" => (&plain_path, "Ignore"),
                    m => (&pods_path, m),
                };
                let wall = run(bin, &cluster, file, flag, &out);
                let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
                let mut t = tally(&report, zones);
                t.wall = wall;
                assert_eq!(t.pods, pods);
                if t.aligned_verdict != t.aligned_recomputed {
                    failures.push(format!(
                        "{nodes} nodes {zones} NUMA {mode}: verdict says {} aligned claims, recomputed {}",
                        t.aligned_verdict, t.aligned_recomputed
                    ));
                }
                if mode == "Required" && t.aligned_recomputed != t.claims {
                    failures.push(format!(
                        "{nodes} nodes {zones} NUMA Required: {} of {} claims aligned",
                        t.aligned_recomputed, t.claims
                    ));
                }
                let row = Row {
                    net: net(pods, wall),
                    fingerprint: fingerprint(&report),
                    t,
                };
                let ignore = rows.get("Ignore").map_or(row.net, |r| r.net);
                let t = &row.t;
                println!(
                    "{zones:>4} {mode:>9} {:>11} {:>16} {:>16} {:>7.2} {:>6.2} {:>7.0} {:>9.0} {:>9.2}  {:?} placements {:016x}",
                    format!("{}/{}", t.scheduled, t.pods),
                    format!("{:.1}% of {}", pct(t.aligned_recomputed, t.claims), t.claims),
                    format!("{:.1}% of {}", pct(t.pods_aligned, t.scheduled), t.scheduled),
                    t.wall,
                    read,
                    t.pods as f64 / t.wall,
                    row.net,
                    row.net / ignore,
                    t.verdicts,
                    row.fingerprint
                );
                rows.insert(mode, row);
            }
            // What an unplaced pod costs next to a placed one: the Required stream again with
            // only the pods it placed (they decide as before: an unplaced pod changes nothing).
            let required_out = dir.join(format!("report-{zones}numa-Required.json"));
            let report: Value = serde_json::from_slice(&std::fs::read(&required_out).unwrap()).unwrap();
            let placed: std::collections::BTreeSet<usize> = report["results"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .filter(|(_, r)| !r["node"].is_null())
                .map(|(p, _)| p)
                .collect();
            let placed_path = dir.join(format!("pods-placed-{zones}numa.json"));
            pods_file(&placed_path, &stream, |p| placed.contains(&p), true);
            let placed_wall = run(
                bin,
                &cluster,
                &placed_path,
                "Required",
                &dir.join(format!("report-{zones}numa-Required-placed.json")),
            );
            let row = |m: &str| rows.get(m).unwrap();
            let full_wall = row("Required").t.wall;
            let unplaced = pods - placed.len();
            let per_placed = (placed_wall - read).max(0.0) / placed.len().max(1) as f64;
            let per_unplaced = if unplaced == 0 {
                f64::NAN
            } else {
                (full_wall - placed_wall).max(0.0) / unplaced as f64
            };
            let ratios = (
                row("Required").net / row("Ignore").net,
                row("Preferred").net / row("Ignore").net,
                row("Ignore").net / row("plain").net,
                per_unplaced / per_placed,
            );
            println!(
                "{zones:>4} Required/Ignore {:.2}, Preferred/Ignore {:.2}, Ignore/plain {:.2}; \
                 Required: {} placed at {:.0} µs each, {unplaced} unplaced at {:.0} µs each ({:.2}×)",
                ratios.0,
                ratios.1,
                ratios.2,
                placed.len(),
                per_placed * 1e6,
                per_unplaced * 1e6,
                ratios.3
            );
            summary.push((nodes, zones, ratios));
        }
    }
    println!("\nnodes NUMA  Required/Ignore  Preferred/Ignore  Ignore/plain  unplaced/placed");
    for (nodes, zones, r) in summary {
        println!(
            "{nodes:>5} {zones:>4} {:>16.2} {:>17.2} {:>13.2} {:>16.2}",
            r.0, r.1, r.2, r.3
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
