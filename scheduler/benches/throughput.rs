//! Scheduling throughput: N nodes × Z NUMA zones (cpu, memory, hugepages-1Gi, two device types)
//! and a stream of mixed pods, every pod evaluated on every node (no sampling), each placement
//! assumed before the next pod.
//!
//! `cargo bench -p numaplane-scheduler --bench throughput -- [NODES] [ZONES] [PODS] [constrained|dra]`
//! (defaults 5000 8 10000). Prints pods/s, p50/p99/max decision latency and peak RSS. The
//! maximum is the first pod of each shape, which evaluates every node (nothing cached yet).
//! Nodes carry hostname and `topology.kubernetes.io/zone` labels (10 zones). With
//! `constrained`, a quarter of the pods (50 workloads of 50) carry a required pod anti-affinity
//! (hostname) and a `DoNotSchedule` zone spread constraint (maxSkew 1) against their workload;
//! every pod is then also checked against those pods' anti-affinity (symmetry). With `dra`,
//! every node also publishes a ResourceSlice of 8 devices (with attributes), and a quarter of
//! the pods claim one device through a DeviceClass whose CEL selector picks them, each its own
//! ResourceClaim, allocated as the live loop does (the allocation held in flight).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
    score::{Scorer, Strategy},
};
use serde_json::json;

fn node(index: usize, zones: usize) -> (Node, NodeResourceTopology) {
    let name = &format!("node-{index:05}");
    let cpus = 16 * zones;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": format!("zone-{}", index % 10)}},
        "status": {"allocatable": {
            "cpu": cpus.to_string(), "memory": format!("{}Gi", 64 * zones),
            "hugepages-1Gi": format!("{}Gi", 8 * zones), "pods": "250",
            "nvidia.com/gpu": (zones).to_string(), "example.com/nic": (2 * zones).to_string()}}
    }))
    .unwrap();
    let zone_list: Vec<_> = (0..zones).map(|z| common::zone(z, zones, "16", "64Gi")).collect();
    // By node index (names all have the same length): half single-numa-node, a quarter
    // restricted, a quarter best-effort.
    let policy = common::policy(index);
    let nrt: NodeResourceTopology = serde_json::from_value(json!({
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": zone_list}))
    .unwrap();
    (node, nrt)
}

/// The node's ResourceSlice: 8 devices of driver `gpu.example.com`, two models.
fn slice(index: usize) -> numaplane_scheduler::dra::slice::ResourceSlice {
    let name = format!("node-{index:05}");
    let devices: Vec<_> = (0..8)
        .map(|d| {
            json!({"name": format!("dev-{d}"), "attributes": {
                "model": {"string": if d % 2 == 0 { "a100" } else { "h100" }},
                "index": {"int": d}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": format!("{name}-gpus")},
        "spec": {"driver": "gpu.example.com", "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
    .unwrap()
}

/// The claim of DRA pod `i`: one device of the class.
fn claim(i: usize) -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(
        json!({"metadata": {"namespace": "bench", "name": format!("c-{i}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}),
    )
    .unwrap()
}

fn pod(i: usize, constrained: bool) -> Pod {
    let g = |cpu: &str, mem: &str, extra: serde_json::Value| {
        let mut r = json!({"cpu": cpu, "memory": mem});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        json!({"requests": r, "limits": r})
    };
    let containers = match i % 5 {
        0 => json!([{"name": "a", "resources": g("2", "4Gi", json!({}))}]),
        1 => {
            json!([{"name": "a", "resources": g("4", "8Gi", json!({"hugepages-1Gi": "2Gi", "example.com/nic": "1"}))}])
        }
        2 => json!([{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                     {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]),
        3 => json!([{"name": "a", "resources": g("8", "16Gi", json!({"nvidia.com/gpu": "1"}))},
                     {"name": "b", "resources": g("1", "1Gi", json!({}))}]),
        _ => json!([{"name": "a", "resources": g("1", "2Gi", json!({"example.com/nic": "1"}))}]),
    };
    let mut spec = json!({"containers": containers});
    let mut labels = json!({"app": "plain"});
    if constrained && i.is_multiple_of(4) {
        let app = format!("w{}", (i / 4) % 50);
        let selector = json!({"matchLabels": {"app": app}});
        labels = json!({"app": app});
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}]}});
        spec["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector}]);
    }
    serde_json::from_value(
        json!({"metadata": {"namespace": "bench", "name": format!("p-{i}"), "labels": labels},
        "spec": spec}),
    )
    .unwrap()
}

/// Pod `i` of the DRA case: every fourth claims one device.
fn dra_pod(i: usize) -> Pod {
    let mut p = pod(i, false);
    if i.is_multiple_of(4)
        && let Some(spec) = p.spec.as_mut()
    {
        spec.resource_claims = Some(vec![
            serde_json::from_value(json!({"name": "gpu", "resourceClaimName": format!("c-{i}")})).unwrap(),
        ]);
    }
    p
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let constrained = std::env::args().any(|a| a == "constrained");
    let dra = std::env::args().any(|a| a == "dra");
    let nodes = args.first().copied().unwrap_or(5000);
    let zones = args.get(1).copied().unwrap_or(8);
    let pods = args.get(2).copied().unwrap_or(10000);
    let mut cluster = Cluster::new();
    for n in 0..nodes {
        let (node, nrt) = node(n, zones);
        cluster.apply_node(&node).unwrap();
        cluster.apply_nrt(&nrt).unwrap();
    }
    if dra {
        cluster.dra.enable();
        cluster.dra.apply_class(
            serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].model == 'a100' && device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]}}))
            .unwrap(),
        );
        cluster.dra.set_slices((0..nodes).map(slice).collect());
        for i in (0..pods).step_by(4) {
            cluster.dra.apply_claim(claim(i));
        }
    }
    let cfg = Config {
        scorer: Scorer {
            strategy: Strategy::LeastAllocated,
            ..Scorer::default()
        },
        ..Config::default()
    };
    let specs: Vec<PodSpec> = (0..pods)
        .map(|i| {
            let p = if dra { dra_pod(i) } else { pod(i, constrained) };
            PodSpec::from_pod(&mut cluster.res, &p).unwrap()
        })
        .collect();
    let mut latencies = Vec::with_capacity(pods);
    let mut scheduled = 0;
    let mut allocated = 0;
    let start = Instant::now();
    for spec in &specs {
        let t = Instant::now();
        let d = if spec.resource_claims.is_empty() {
            cluster.schedule(&cfg, spec, false)
        } else {
            let (d, outcome) = cluster.schedule_with_claims(&cfg, spec, false);
            assert!(d.node.is_none() || outcome.claims.len() == 1, "{outcome:?}");
            cluster.dra.assume(&spec.namespace, &spec.key(), &outcome.claims);
            allocated += outcome.claims.len();
            d
        };
        cluster.assume(spec, &d);
        latencies.push(t.elapsed());
        scheduled += usize::from(d.node.is_some());
    }
    let total = start.elapsed();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "nodes={nodes} zones={zones} pods={pods} constrained={constrained} dra={dra} scheduled={scheduled} claims_allocated={allocated} pods/s={:.0} p50={:?} p99={:?} max={:?} peak_rss={:.0}MiB",
        pods as f64 / total.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        latencies.last().copied().unwrap_or_default(),
        peak_rss_mib()
    );
    unschedulable_retries(&mut cluster, &cfg, pods);
}

/// The live loop's case: a pod that fits nowhere is retried while other pods are placed (each
/// placement changes one node). Compares one retry of it (`Cluster::decide`, cached failure
/// categories) with one decision of a pod that fits.
fn unschedulable_retries(cluster: &mut Cluster, cfg: &Config, offset: usize) {
    let big: Pod = serde_json::from_value(json!({"metadata": {"namespace": "bench", "name": "too-big"},
        "spec": {"containers": [{"name": "a", "resources": {
            "requests": {"cpu": "1000", "memory": "1Gi"}, "limits": {"cpu": "1000", "memory": "1Gi"}}}]}}))
    .unwrap();
    let big = PodSpec::from_pod(&mut cluster.res, &big).unwrap();
    let t = Instant::now();
    let first = cluster.decide(cfg, &big);
    let first_cost = t.elapsed();
    assert!(first.node.is_none(), "the big pod must fit nowhere");
    let rounds = 1000;
    let (mut fit, mut retry) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for r in 0..rounds {
        // Burstable pods of the bench mix (i % 5 == 2): they fit while the NUMA pods may not.
        let spec = PodSpec::from_pod(&mut cluster.res, &pod((offset + r) * 5 + 2, false)).unwrap();
        let t = Instant::now();
        let d = cluster.decide(cfg, &spec);
        cluster.assume(&spec, &d);
        fit.push(t.elapsed());
        let t = Instant::now();
        let again = cluster.decide(cfg, &big);
        retry.push(t.elapsed());
        assert_eq!(again.message, first.message);
    }
    fit.sort_unstable();
    retry.sort_unstable();
    let mean = |v: &[std::time::Duration]| v.iter().sum::<std::time::Duration>() / v.len().max(1) as u32;
    let pct = |v: &[std::time::Duration], p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    println!(
        "unschedulable retry: first attempt {first_cost:?}; retries mean={:?} p50={:?} p99={:?}; schedulable decision mean={:?} p50={:?} p99={:?}; retry/decision (mean) = {:.2}",
        mean(&retry),
        pct(&retry, 0.5),
        pct(&retry, 0.99),
        mean(&fit),
        pct(&fit, 0.5),
        pct(&fit, 0.99),
        mean(&retry).as_secs_f64() / mean(&fit).as_secs_f64().max(1e-12)
    );
}
