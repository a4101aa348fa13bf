//! The cached fast path of `Cluster::schedule` (`explain = false`) decides exactly as the
//! uncached evaluation (`explain = true`): same node, placement and allocation, and the same
//! per-node verdict kind and score, across random clusters and a stream of pods of repeating
//! shapes with assumes and index events (pods, node updates, NRT refreshes, deletions) between
//! them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Rng;

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config, NoTopology},
    pod::PodSpec,
    score::{Scorer, Strategy, weights_from_names},
};
use serde_json::{Value, json};

const POLICIES: &[&str] = &["none", "best-effort", "restricted", "single-numa-node"];

fn node_name(i: usize) -> String {
    format!("n{:02}", i)
}

/// A Node: labels, maybe a taint or cordon, allocatable near the zones' total.
fn node(rng: &mut Rng, name: &str, zones: u64) -> Node {
    let mut spec = json!({});
    if rng.chance(15) {
        spec["taints"] = json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]);
    }
    if rng.chance(5) {
        spec["unschedulable"] = json!(true);
    }
    let tier = rng.pick(&["a", "b"]);
    let pods = if rng.chance(10) { "2" } else { "110" };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"tier": tier}},
        "spec": spec,
        "status": {"allocatable": {
            "cpu": (8 * zones - rng.below(3)).to_string(), "memory": format!("{}Gi", 16 * zones),
            "hugepages-1Gi": format!("{}Gi", 2 * zones), "pods": pods,
            "vendor.com/gpu": (2 * zones).to_string(), "vendor.com/nic": (2 * zones).to_string()}}
    }))
    .unwrap()
}

/// An NRT with 1–4 zones (ids not always contiguous), random free amounts, device IDs (a NIC
/// sometimes attached to two zones), random policy, scope and options; rarely invalid.
fn nrt(rng: &mut Rng, name: &str, zones: u64) -> NodeResourceTopology {
    let ids: Vec<u64> = if rng.chance(20) {
        (0..zones).map(|z| 2 * z).collect()
    } else {
        (0..zones).collect()
    };
    let shared_nic = zones > 1 && rng.chance(20);
    let zone_list: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(p, &z)| {
            let costs: Vec<Value> = ids
                .iter()
                .map(|&t| json!({"name": format!("node-{t}"), "value": if t == z { 10 } else { 11 + (t + z) % 3 * 5 }}))
                .collect();
            let cpu = 8;
            let gpus = rng.below(3);
            let free_gpus: Vec<String> = (0..rng.below(gpus + 1)).map(|g| format!("gpu-{z}-{g}")).collect();
            let mut nics = vec![format!("nic-{z}")];
            if shared_nic && p == 0 {
                nics.push(format!("nic-{}", ids[1]));
            }
            let nic_count = nics.len();
            let avail = |cap: u64, rng: &mut Rng| if rng.chance(50) { cap } else { rng.below(cap + 1) };
            let mut z_json = json!({"name": format!("node-{z}"), "type": "Node", "costs": costs,
                "attributes": [
                    {"name": "numaplane.io/free-devices.vendor.com/gpu", "value": free_gpus.join(",")},
                    {"name": "numaplane.io/free-devices.vendor.com/nic", "value": nics.join(",")}],
                "resources": [
                    {"name": "cpu", "capacity": cpu.to_string(), "allocatable": cpu.to_string(), "available": avail(cpu, rng).to_string()},
                    {"name": "memory", "capacity": "16Gi", "allocatable": "16Gi", "available": format!("{}Gi", avail(16, rng))},
                    {"name": "hugepages-1Gi", "capacity": "2Gi", "allocatable": "2Gi", "available": format!("{}Gi", avail(2, rng))},
                    {"name": "vendor.com/gpu", "capacity": gpus.to_string(), "allocatable": gpus.to_string(), "available": free_gpus.len().to_string()},
                    {"name": "vendor.com/nic", "capacity": nic_count.to_string(), "allocatable": nic_count.to_string(), "available": nic_count.to_string()}]});
            if rng.chance(3) {
                z_json["name"] = json!("numa-bad");
            }
            z_json
        })
        .collect();
    let policy = rng.pick(POLICIES);
    let scope = rng.pick(&["container", "pod"]);
    let closest = rng.pick(&["true", "false"]);
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                       {"name": "topologyManagerScope", "value": scope},
                       {"name": "topologyManagerOptionPreferClosestNumaNodes", "value": closest}],
        "zones": zone_list}))
    .unwrap()
}

/// A random pod shape: 1–2 containers, Guaranteed or Burstable, maybe devices, hugepages, an
/// init container or sidecar, overhead, a node selector, a toleration or a node name.
fn shape(rng: &mut Rng, nodes: usize) -> Value {
    let guaranteed = rng.chance(70);
    let container = |name: &str, rng: &mut Rng| {
        let cpu = rng.pick(&["1", "2", "3", "500m", "1500m"]);
        let mut r = json!({"cpu": cpu, "memory": rng.pick(&["1Gi", "2Gi", "6Gi"])});
        if rng.chance(30) {
            r["vendor.com/gpu"] = json!(rng.pick(&["1", "2"]));
        }
        if rng.chance(25) {
            r["vendor.com/nic"] = json!("1");
        }
        if rng.chance(20) {
            r["hugepages-1Gi"] = json!("1Gi");
        }
        let resources = if guaranteed {
            json!({"requests": r, "limits": r})
        } else {
            json!({"requests": r})
        };
        json!({"name": name, "resources": resources})
    };
    let mut containers = vec![container("a", rng)];
    if rng.chance(35) {
        containers.push(container("b", rng));
    }
    let mut spec = json!({"containers": containers});
    if rng.chance(20) {
        let mut init = container("init", rng);
        if rng.chance(50) {
            init["restartPolicy"] = json!("Always");
        }
        spec["initContainers"] = json!([init]);
    }
    if rng.chance(10) {
        spec["overhead"] = json!({"cpu": "100m"});
    }
    if rng.chance(20) {
        spec["nodeSelector"] = json!({"tier": rng.pick(&["a", "b"])});
    }
    if rng.chance(25) {
        spec["tolerations"] = json!([{"key": "dedicated", "operator": "Exists"}]);
    }
    if rng.chance(5) {
        spec["nodeName"] = json!(node_name(rng.below(nodes as u64) as usize));
    }
    spec
}

/// Shapes that differ from `base` in one field the verdict reads, so shapes that differ only
/// there meet in the cache.
fn variants(rng: &mut Rng, base: &Value, nodes: usize) -> Vec<Value> {
    let mut v = base.clone();
    let spec = v.as_object_mut().unwrap();
    match rng.below(7) {
        0 => toggle(
            spec,
            "tolerations",
            json!([{"key": "dedicated", "operator": "Exists"}]),
        ),
        1 => toggle(spec, "nodeSelector", json!({"tier": rng.pick(&["a", "b"])})),
        2 => toggle(
            spec,
            "nodeName",
            json!(node_name(rng.below(nodes as u64) as usize)),
        ),
        3 => toggle(spec, "overhead", json!({"cpu": "3", "memory": "6Gi"})),
        4 => toggle(
            spec,
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["b"]}]}]}}}),
        ),
        5 => {
            // Burstable instead of Guaranteed (or the reverse): same requests, limits dropped.
            let c = &mut spec["containers"][0]["resources"];
            match c.as_object_mut().unwrap().remove("limits") {
                Some(_) => {}
                None => c["limits"] = c["requests"].clone(),
            }
        }
        _ => {
            // The same init container as sidecar and as a regular one.
            let init = |sidecar: bool| {
                let r = json!({"cpu": "2", "memory": "2Gi"});
                let mut c = json!({"name": "init", "resources": {"requests": r, "limits": r}});
                if sidecar {
                    c["restartPolicy"] = json!("Always");
                }
                json!([c])
            };
            spec.insert("initContainers".to_owned(), init(true));
            let mut other = v.clone();
            other["initContainers"] = init(false);
            return vec![v, other];
        }
    }
    vec![v]
}

/// Removes `key` if present, else sets it.
fn toggle(spec: &mut serde_json::Map<String, Value>, key: &str, value: Value) {
    if spec.remove(key).is_none() {
        spec.insert(key.to_owned(), value);
    }
}

fn pod(i: usize, spec: &Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"namespace": "eq", "name": format!("p{i}")}, "spec": spec}))
        .unwrap()
}

/// Index events between pods: a bound pod arrives or leaves, a node is relabelled or
/// recreated, an NRT is refreshed or removed.
fn churn(rng: &mut Rng, cluster: &mut Cluster, nodes: usize, step: usize) {
    let name = node_name(rng.below(nodes as u64) as usize);
    let zones = 1 + rng.below(4);
    match rng.below(8) {
        0 => {
            let p: Pod = serde_json::from_value(json!({"metadata": {"namespace": "bound", "name": format!("b{step}")},
                "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}))
            .unwrap();
            cluster.apply_pod(&p).unwrap();
        }
        1 => cluster.delete_pod(&format!("bound/b{}", rng.below(step as u64 + 1))),
        2 => cluster.apply_node(&node(rng, &name, zones)).unwrap(),
        3 => {
            let _ = cluster.apply_nrt(&nrt(rng, &name, zones));
        }
        4 if rng.chance(30) => cluster.delete_nrt(&name),
        5 if rng.chance(30) => cluster.delete_node(&name),
        _ => {}
    }
}

const STRATEGIES: [Strategy; 4] = [
    Strategy::LeastAllocated,
    Strategy::MostAllocated,
    Strategy::BalancedAllocation,
    Strategy::LeastNumaNodes,
];

fn config(rng: &mut Rng) -> Config {
    Config {
        scorer: Scorer {
            strategy: STRATEGIES[rng.below(4) as usize],
            weights: Default::default(),
        },
        no_topology: NoTopology::AssumeNone,
        ..Config::default()
    }
}

/// Changes one thing of `cfg`: cached verdicts must not leak across config changes.
fn tweak(rng: &mut Rng, cfg: &mut Config, cluster: &mut Cluster) {
    match rng.below(3) {
        0 => cfg.scorer.strategy = STRATEGIES[rng.below(4) as usize],
        1 => {
            cfg.scorer.weights = if cfg.scorer.weights.is_empty() {
                let names = [
                    ("cpu".to_owned(), 5),
                    ("memory".to_owned(), 1),
                    ("vendor.com/gpu".to_owned(), 3),
                ];
                weights_from_names(&mut cluster.res, &names)
            } else {
                Default::default()
            }
        }
        _ => {
            cfg.no_topology = match cfg.no_topology {
                NoTopology::AssumeNone => NoTopology::Reject,
                NoTopology::Reject => NoTopology::AssumeNone,
            }
        }
    }
}

#[test]
fn cached_fast_path_decides_like_the_uncached_evaluation() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut scheduled, mut pending, mut compared) = (0, 0, 0);
    for round in 0..40 {
        let nodes = 6 + rng.below(30) as usize;
        let mut cluster = Cluster::new();
        for i in 0..nodes {
            let zones = 1 + rng.below(4);
            let name = node_name(i);
            cluster.apply_node(&node(&mut rng, &name, zones)).unwrap();
            if rng.chance(90) {
                let _ = cluster.apply_nrt(&nrt(&mut rng, &name, zones));
            }
        }
        let mut cfg = config(&mut rng);
        let mut shapes: Vec<Value> = (0..1 + rng.below(4)).map(|_| shape(&mut rng, nodes)).collect();
        for _ in 0..1 + rng.below(4) {
            let v = variants(&mut rng, &shapes[0], nodes);
            shapes.extend(v);
        }
        for step in 0..120 {
            // Now and then the config changes too: cached verdicts must not leak across it.
            if rng.chance(4) {
                tweak(&mut rng, &mut cfg, &mut cluster);
            }
            let spec = &shapes[rng.below(shapes.len() as u64) as usize];
            let spec = PodSpec::from_pod(&mut cluster.res, &pod(step, spec)).unwrap();
            let reference = cluster.schedule(&cfg, &spec, true);
            let quick = cluster.quick_verdicts(&cfg, &spec);
            let fast = cluster.schedule(&cfg, &spec, false);
            let ctx = format!("round {round} step {step} pod {spec:?}");
            assert_eq!(quick.len(), reference.nodes.len(), "{ctx}");
            for (q, r) in quick.iter().zip(&reference.nodes) {
                assert_eq!(
                    (&q.node, q.feasible, q.score),
                    (&r.node, r.feasible, r.score),
                    "{ctx}: reasons {:?}",
                    r.reasons
                );
                compared += 1;
            }
            assert_eq!(fast.node, reference.node, "{ctx}");
            assert_eq!(fast.placement, reference.placement, "{ctx}");
            assert_eq!(fast.allocation, reference.allocation, "{ctx}");
            assert_eq!(fast.message, reference.message, "{ctx}");
            match &fast.node {
                Some(n) => {
                    let chosen = reference.nodes.iter().find(|v| &v.node == n).unwrap();
                    assert_eq!(fast.nodes.len(), 1, "{ctx}");
                    assert_eq!(fast.nodes[0].score, chosen.score, "{ctx}");
                    scheduled += 1;
                }
                None => {
                    // Nothing fits: the explained decision, every node with its reasons.
                    assert_eq!(fast.nodes.len(), reference.nodes.len(), "{ctx}");
                    pending += 1;
                }
            }
            cluster.assume(&spec, &fast);
            if rng.chance(30) {
                churn(&mut rng, &mut cluster, nodes, step);
            }
        }
    }
    // The stream exercises both outcomes and many node verdicts.
    assert!(
        scheduled > 1000 && pending > 100,
        "scheduled {scheduled}, pending {pending}"
    );
    assert!(compared > 30_000, "{compared}");
}
