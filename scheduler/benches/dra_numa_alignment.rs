//! DRA devices aligned with the CPUs the kubelet pins: one pod stream, run through the release
//! `numaplane-scheduler simulate --cluster DUMP --pods PODS -o json` binary twice per cluster,
//! with `--dra-numa-alignment Required` and with `Ignore` (kube-scheduler's own device choice),
//! on clusters of 2-, 4- and 8-NUMA nodes.
//!
//! Every node: 128 CPUs and 8 GPUs split evenly over its NUMA nodes, Topology Manager
//! `single-numa-node` (container scope), static CPU manager (the NRT zones publish `cpu`); some
//! CPUs of each NUMA node are already pinned (the NRT's `available`, 0 to 3/4 of the zone, drawn
//! per node and zone). A DRA driver `gpu.example.com` publishes one ResourceSlice per node whose
//! devices carry `resource.kubernetes.io/numaNode`, in NUMA order as a PCI scan lists them; one
//! DeviceClass selects them. Pods are Guaranteed with 1–8 integer CPUs and one or two
//! ResourceClaims (one GPU each), created beforehand by name; the stream asks for ~70% of the
//! cluster's GPUs. The same stream (same seed) runs on every cluster and in both modes.
//!
//! Aligned fraction: claims of placed pods whose devices sit on the NUMA nodes the container's
//! CPUs are predicted on. It is counted twice and the two must agree: from the JSON verdict
//! (`claims[].numa.alignment == "aligned"`) and recomputed from the devices the claim got (the
//! bench knows each generated device's NUMA node) against `placement.containers[].numaNodes`.
//! Decision rate: pods per second of the simulate process's wall time (reading the dump
//! included), and net of reading: the wall time of a run with only the stream's first pod
//! (Ignore) is subtracted.
//!
//! `cargo bench -p numaplane-scheduler --bench dra_numa_alignment -- [NODES] [--keep DIR]`
//! (default 200 nodes per cluster). `--keep DIR` leaves each cluster's `cluster-<N>numa.json`,
//! `pods.json` and the JSON reports there.
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
        for c in r["claims"].as_array().unwrap() {
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

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let keep = common::keep_dir(&raw);
    let nodes = raw
        .iter()
        .filter_map(|a| a.parse::<usize>().ok())
        .next()
        .unwrap_or(200);
    let tmp = tempfile::tempdir().unwrap();
    let dir = keep.unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).unwrap();
    let bin = env!("CARGO_BIN_EXE_numaplane-scheduler");

    // ~70% of the GPUs: a pod asks for 1.5 GPUs on average.
    let pods = nodes * GPUS_PER_NODE * 7 / 10 * 2 / 3;
    let stream = stream(pods);
    let asked_cpus: usize = stream.iter().map(|s| s.0).sum();
    let asked_gpus: usize = stream.iter().map(|s| s.1).sum();
    let pods_path = dir.join("pods.json");
    write_list(
        &pods_path,
        stream
            .iter()
            .enumerate()
            .map(|(p, &(c, k))| pod(p, c, k))
            .collect(),
    );
    let first_path = dir.join("first-pod.json");
    write_list(&first_path, vec![pod(0, stream[0].0, stream[0].1)]);
    println!(
        "{nodes} nodes per cluster ({CPUS_PER_NODE} CPUs, {GPUS_PER_NODE} GPUs each, single-numa-node); \
         {pods} pods asking {asked_cpus} CPUs and {asked_gpus} GPUs ({:.0}% of the GPUs)",
        pct(asked_gpus, nodes * GPUS_PER_NODE)
    );
    println!(
        "{:>4} {:>8} {:>9} {:>16} {:>16} {:>7} {:>7} {:>7} {:>9}  verdicts",
        "NUMA",
        "mode",
        "placed",
        "claims aligned",
        "pods aligned",
        "wall s",
        "read s",
        "pods/s",
        "net pods/s"
    );
    let mut failures = Vec::new();
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
        for mode in ["Required", "Ignore"] {
            let out = dir.join(format!("report-{zones}numa-{mode}.json"));
            let wall = run(bin, &cluster, &pods_path, mode, &out);
            let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
            let mut t = tally(&report, zones);
            t.wall = wall;
            assert_eq!(t.pods, pods);
            if t.aligned_verdict != t.aligned_recomputed {
                failures.push(format!(
                    "{zones} NUMA {mode}: verdict says {} aligned claims, recomputed {}",
                    t.aligned_verdict, t.aligned_recomputed
                ));
            }
            if mode == "Required" && t.aligned_recomputed != t.claims {
                failures.push(format!(
                    "{zones} NUMA Required: {} of {} claims aligned",
                    t.aligned_recomputed, t.claims
                ));
            }
            println!(
                "{zones:>4} {mode:>8} {:>9} {:>16} {:>16} {:>7.2} {:>7.2} {:>7.0} {:>9}  {:?}",
                format!("{}/{}", t.scheduled, t.pods),
                format!("{:.1}% of {}", pct(t.aligned_recomputed, t.claims), t.claims),
                format!("{:.1}% of {}", pct(t.pods_aligned, t.scheduled), t.scheduled),
                t.wall,
                read,
                t.pods as f64 / t.wall,
                if t.wall > read {
                    format!("{:.0}", t.pods as f64 / (t.wall - read))
                } else {
                    "-".to_owned()
                },
                t.verdicts
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
