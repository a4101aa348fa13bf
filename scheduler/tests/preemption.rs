//! Preemption on random clusters (seeded): nodes with NUMA zones under `single-numa-node`,
//! pods of several priorities placed by the model and published in NRTs that show exactly
//! what each holds, then a high-priority pod that fits nowhere. The ground truth is recomputed
//! from the placements, independently of the model's what-if:
//! - after the victims are gone, the preemptor's predicted admission succeeds on the
//!   nominated node;
//! - every victim is needed (giving any one back makes the pod fit no more), so no victim sits
//!   on a zone the preemptor does not use unless it frees node-level room;
//! - every victim has a lower priority;
//! - whenever evicting lower-priority pods could make room somewhere, a preemption is found.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    cluster::{Cluster, Config},
    pod::PodSpec,
};
use serde_json::{Value, json};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Debug)]
struct Zone {
    cpus: i64,
    gpus: Vec<String>,
}

#[derive(Clone, Debug)]
struct NodeDef {
    name: String,
    zones: Vec<Zone>,
}

/// A placed pod: where it sits in truth.
#[derive(Clone, Debug)]
struct Placed {
    name: String,
    node: String,
    zone: u32,
    cpus: i64,
    gpus: Vec<String>,
    priority: i32,
    record: String,
}

fn node_obj(n: &NodeDef) -> Node {
    let cpus: i64 = n.zones.iter().map(|z| z.cpus).sum();
    let gpus: usize = n.zones.iter().map(|z| z.gpus.len()).sum();
    serde_json::from_value(json!({
        "metadata": {"name": n.name},
        "status": {"allocatable": {"cpu": cpus.to_string(), "memory": "256Gi", "pods": "110",
                                    "example.com/gpu": gpus.to_string()}}
    }))
    .unwrap()
}

/// The NRT of `n` with `placed` (those on it) holding what they hold.
fn nrt_obj(n: &NodeDef, placed: &[&Placed]) -> NodeResourceTopology {
    let zones: Vec<Value> = n
        .zones
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let here: Vec<&&Placed> = placed
                .iter()
                .filter(|p| p.node == n.name && p.zone as usize == i)
                .collect();
            let used: i64 = here.iter().map(|p| p.cpus).sum();
            let taken: BTreeSet<&String> = here.iter().flat_map(|p| &p.gpus).collect();
            let free: Vec<&String> = z.gpus.iter().filter(|g| !taken.contains(g)).collect();
            json!({
                "name": format!("node-{i}"), "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": z.cpus.to_string(), "allocatable": z.cpus.to_string(),
                     "available": (z.cpus - used).to_string()},
                    {"name": "example.com/gpu", "capacity": z.gpus.len().to_string(),
                     "allocatable": z.gpus.len().to_string(), "available": free.len().to_string()}
                ],
                "attributes": [{"name": "numaplane.io/free-devices.example.com/gpu",
                                "value": free.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")}]
            })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": n.name},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"}
        ],
        "zones": zones
    }))
    .unwrap()
}

fn pod_json(name: &str, cpus: i64, gpus: i64, priority: i32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "labels": {"app": name}, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"schedulerName": "numaplane-scheduler", "priority": priority, "containers": [{"name": "c", "resources": {
            "requests": {"cpu": cpus.to_string(), "memory": "1Gi", "example.com/gpu": gpus.to_string()},
            "limits": {"cpu": cpus.to_string(), "memory": "1Gi", "example.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Pending"}
    })
}

fn bound_pod(p: &Placed, gpus: i64) -> Pod {
    let mut v = pod_json(&p.name, p.cpus, gpus, p.priority);
    v["spec"]["nodeName"] = json!(p.node);
    v["status"]["phase"] = json!("Running");
    v["metadata"]["annotations"] = json!({numaplane::allocation::ANNOTATION: p.record});
    serde_json::from_value(v).unwrap()
}

/// The index as the scheduler would see the truth: nodes, NRTs showing `placed`, and the
/// placed pods bound with their records.
fn index(nodes: &[NodeDef], placed: &[&Placed]) -> Cluster {
    let mut c = Cluster::new();
    for n in nodes {
        c.apply_node(&node_obj(n)).unwrap();
        c.apply_nrt(&nrt_obj(n, placed)).unwrap();
    }
    for p in placed {
        c.apply_pod(&bound_pod(p, i64::try_from(p.gpus.len()).unwrap())).unwrap();
    }
    c
}

fn spec_of(c: &mut Cluster, v: &Value) -> PodSpec {
    let pod: Pod = serde_json::from_value(v.clone()).unwrap();
    PodSpec::from_pod(&mut c.res, &pod).unwrap()
}

/// Whether the preemptor fits `node` in the truth where `placed` hold what they hold.
fn fits_on(nodes: &[NodeDef], placed: &[&Placed], pod: &Value, node: &str) -> bool {
    let mut c = index(nodes, placed);
    let spec = spec_of(&mut c, pod);
    let d = c.schedule(&Config::default(), &spec, true);
    d.nodes.iter().any(|v| v.node == node && v.feasible)
}

fn random_case(seed: u64) -> (Vec<NodeDef>, Vec<Placed>, Value, i32) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut gpu_id = 0;
    let nodes: Vec<NodeDef> = (0..1 + rng.below(3))
        .map(|i| NodeDef {
            name: format!("n{i}"),
            zones: (0..2 + 2 * rng.below(2))
                .map(|_| Zone {
                    cpus: 2 + i64::try_from(rng.below(5)).unwrap(),
                    gpus: (0..rng.below(3))
                        .map(|_| {
                            gpu_id += 1;
                            format!("g{gpu_id}")
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect();
    // Fill the cluster with the model's own placements, published as truth one by one.
    let mut placed: Vec<Placed> = Vec::new();
    for i in 0..12 {
        let cpus = 1 + i64::try_from(rng.below(3)).unwrap();
        let gpus = i64::try_from(rng.below(3)).unwrap().saturating_sub(1).max(0);
        let priority = [0, 10, 100, 2000][usize::try_from(rng.below(4)).unwrap()];
        let name = format!("p{i}");
        let v = pod_json(&name, cpus, gpus, priority);
        let refs: Vec<&Placed> = placed.iter().collect();
        let mut c = index(&nodes, &refs);
        let spec = spec_of(&mut c, &v);
        let d = c.decide(&Config::default(), &spec);
        let (Some(node), Some(alloc)) = (d.node.clone(), d.allocation.clone()) else {
            continue;
        };
        let ctr = &alloc.containers[0];
        let zone = ctr.numa_nodes.as_ref().and_then(|z| z.first().copied()).unwrap();
        placed.push(Placed {
            name,
            node,
            zone,
            cpus,
            gpus: ctr.devices.get("example.com/gpu").cloned().unwrap_or_default(),
            priority,
            record: alloc.to_annotation().unwrap(),
        });
    }
    let cpus = 1 + i64::try_from(rng.below(6)).unwrap();
    let gpus = i64::try_from(rng.below(3)).unwrap();
    let priority = [50, 1000][usize::try_from(rng.below(2)).unwrap()];
    (nodes, placed, pod_json("preemptor", cpus, gpus, priority), priority)
}

#[test]
fn preemption_frees_the_right_zone_with_a_minimal_set_of_lower_priority_victims() {
    let (mut preempted, mut none_possible) = (0, 0);
    for seed in 1..=400u64 {
        let (nodes, placed, pod, priority) = random_case(seed);
        let refs: Vec<&Placed> = placed.iter().collect();
        let mut c = index(&nodes, &refs);
        let spec = spec_of(&mut c, &pod);
        if c.decide(&Config::default(), &spec).node.is_some() {
            continue;
        }
        let got = c.preempt(&Config::default(), &spec, priority);
        // Could evicting every lower-priority pod of some node make room there?
        let possible = nodes.iter().any(|n| {
            let kept: Vec<&Placed> = placed
                .iter()
                .filter(|p| p.node != n.name || p.priority >= priority)
                .collect();
            fits_on(&nodes, &kept, &pod, &n.name)
        });
        let Some(p) = got else {
            assert!(!possible, "seed {seed}: room could be made but no preemption was found");
            none_possible += 1;
            continue;
        };
        preempted += 1;
        let victims: BTreeSet<&str> = p.victims.iter().map(|v| v.name.as_str()).collect();
        for v in &p.victims {
            let pod = placed.iter().find(|x| x.name == v.name).unwrap();
            assert!(pod.priority < priority, "seed {seed}: victim {} has priority {}", v.name, pod.priority);
            assert_eq!(pod.node, p.node, "seed {seed}: victim {} is on another node", v.name);
        }
        let kept = |without: &BTreeSet<&str>| -> Vec<&Placed> {
            placed.iter().filter(|x| !without.contains(x.name.as_str())).collect()
        };
        assert!(
            fits_on(&nodes, &kept(&victims), &pod, &p.node),
            "seed {seed}: with {victims:?} gone the pod is still not admitted on {}",
            p.node
        );
        let zones: BTreeSet<u32> = p
            .decision
            .allocation
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .flat_map(|c| c.numa_nodes.clone().unwrap_or_default())
            .collect();
        for v in &victims {
            let mut back = victims.clone();
            back.remove(v);
            assert!(
                !fits_on(&nodes, &kept(&back), &pod, &p.node),
                "seed {seed}: victim {v} was not needed (victims {victims:?})"
            );
            let x = placed.iter().find(|x| x.name == *v).unwrap();
            if !zones.contains(&x.zone) {
                // Only node-level room can make a victim on another zone needed.
                let mut only_zones = index(&nodes, &kept(&back));
                let s = spec_of(&mut only_zones, &pod);
                let verdict = only_zones.topology_verdict(&Config::default(), &s, &p.node);
                assert!(
                    verdict.feasible,
                    "seed {seed}: victim {v} on zone {} (pod uses {zones:?}) was needed for the zones",
                    x.zone
                );
            }
        }
        // The record of the decision names the zone the truth admits the pod on.
        let record_devices: BTreeMap<String, Vec<String>> =
            p.decision.allocation.as_ref().unwrap().containers[0].devices.clone();
        for ids in record_devices.values() {
            for id in ids {
                let holder = kept(&victims).into_iter().find(|x| x.gpus.contains(id));
                assert!(holder.is_none(), "seed {seed}: recorded device {id} is held by {holder:?}");
            }
        }
    }
    eprintln!("preempted {preempted}, impossible {none_possible}");
    assert!(preempted > 20, "too few preemptions exercised: {preempted}");
    assert!(none_possible > 5, "too few impossible cases exercised: {none_possible}");
}
