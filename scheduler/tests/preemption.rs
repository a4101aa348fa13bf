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
        c.apply_pod(&bound_pod(p, i64::try_from(p.gpus.len()).unwrap()))
            .unwrap();
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
    use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut gpu_id = 0;
    let nodes: Vec<NodeDef> = (0..1 + rng.random_range(0..3_u64))
        .map(|i| NodeDef {
            name: format!("n{i}"),
            zones: (0..2 + 2 * rng.random_range(0..2_u64))
                .map(|_| Zone {
                    cpus: 2 + i64::try_from(rng.random_range(0..5_u64)).unwrap(),
                    gpus: (0..rng.random_range(0..3_u64))
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
        let cpus = 1 + i64::try_from(rng.random_range(0..3_u64)).unwrap();
        let gpus = i64::try_from(rng.random_range(0..3_u64))
            .unwrap()
            .saturating_sub(1)
            .max(0);
        let priority = [0, 10, 100, 2000][usize::try_from(rng.random_range(0..4_u64)).unwrap()];
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
    let cpus = 1 + i64::try_from(rng.random_range(0..6_u64)).unwrap();
    let gpus = i64::try_from(rng.random_range(0..3_u64)).unwrap();
    let priority = [50, 1000][usize::try_from(rng.random_range(0..2_u64)).unwrap()];
    (
        nodes,
        placed,
        pod_json("preemptor", cpus, gpus, priority),
        priority,
    )
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
            assert!(
                !possible,
                "seed {seed}: room could be made but no preemption was found"
            );
            none_possible += 1;
            continue;
        };
        preempted += 1;
        let victims: BTreeSet<&str> = p.victims.iter().map(|v| v.name.as_str()).collect();
        for v in &p.victims {
            let pod = placed.iter().find(|x| x.name == v.name).unwrap();
            assert!(
                pod.priority < priority,
                "seed {seed}: victim {} has priority {}",
                v.name,
                pod.priority
            );
            assert_eq!(
                pod.node, p.node,
                "seed {seed}: victim {} is on another node",
                v.name
            );
        }
        let kept = |without: &BTreeSet<&str>| -> Vec<&Placed> {
            placed
                .iter()
                .filter(|x| !without.contains(x.name.as_str()))
                .collect()
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
            p.decision.allocation.as_ref().unwrap().containers[0]
                .devices
                .clone();
        for ids in record_devices.values() {
            for id in ids {
                let holder = kept(&victims).into_iter().find(|x| x.gpus.contains(id));
                assert!(
                    holder.is_none(),
                    "seed {seed}: recorded device {id} is held by {holder:?}"
                );
            }
        }
    }
    eprintln!("preempted {preempted}, impossible {none_possible}");
    assert!(preempted > 20, "too few preemptions exercised: {preempted}");
    assert!(
        none_possible > 5,
        "too few impossible cases exercised: {none_possible}"
    );
}

/// One node, zones of 4 CPUs: zone 0 holds `a` (3 CPUs, priority 0) and `c` (1 CPU, priority
/// 500); zone 1 holds `b` and `d` (2 CPUs each, priority 0).
fn two_zone_case() -> (Vec<NodeDef>, Vec<Placed>) {
    let nodes = vec![NodeDef {
        name: "n0".into(),
        zones: vec![
            Zone {
                cpus: 4,
                gpus: vec![],
            },
            Zone {
                cpus: 4,
                gpus: vec![],
            },
        ],
    }];
    let mut placed = Vec::new();
    for (name, zone, cpus, priority) in [("a", 0, 3, 0), ("c", 0, 1, 500), ("b", 1, 2, 0), ("d", 1, 2, 0)] {
        let record = json!({"version": "v1", "node": "n0", "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "c", "kind": "app", "numaNodes": [zone]}]});
        placed.push(Placed {
            name: name.into(),
            node: "n0".into(),
            zone,
            cpus,
            gpus: vec![],
            priority,
            record: record.to_string(),
        });
    }
    (nodes, placed)
}

#[test]
fn the_victims_free_one_whole_zone_not_the_cheapest_cpus_anywhere() {
    let (nodes, placed) = two_zone_case();
    let refs: Vec<&Placed> = placed.iter().collect();
    let mut c = index(&nodes, &refs);
    let pod = pod_json("high", 4, 0, 1000);
    let spec = spec_of(&mut c, &pod);
    assert!(c.decide(&Config::default(), &spec).node.is_none());
    let p = c.preempt(&Config::default(), &spec, 1000).expect("a preemption");
    let victims: Vec<&str> = p.victims.iter().map(|v| v.name.as_str()).collect();
    // Node-level, evicting a (3 CPUs) and b would free 5 CPUs but no whole zone; c has the
    // highest priority, so zone 1 (b and d) is emptied.
    assert_eq!(victims, vec!["b", "d"]);
    let record = p.decision.allocation.expect("a record");
    assert_eq!(record.containers[0].numa_nodes, Some(vec![1]));
}

#[test]
fn a_hold_keeps_the_freed_zone_for_the_preemptor_until_it_is_placed() {
    let (nodes, placed) = two_zone_case();
    let refs: Vec<&Placed> = placed.iter().collect();
    let mut c = index(&nodes, &refs);
    let cfg = Config::default();
    let high = pod_json("high", 4, 0, 1000);
    let high_spec = spec_of(&mut c, &high);
    let p = c.preempt(&cfg, &high_spec, 1000).expect("a preemption");
    c.hold_for(&high_spec, &p, 1_000);
    // The victims are deleted; the NRT shows them gone a little later.
    for v in ["b", "d"] {
        c.delete_pod(&format!("ns/{v}"));
    }
    let kept: Vec<&Placed> = placed.iter().filter(|x| x.zone == 0).collect();
    c.apply_nrt(&nrt_obj(&nodes[0], &kept)).unwrap();
    // A low-priority pod that would fit the freed zone does not get it.
    let low = pod_json("low", 2, 0, 0);
    let low_spec = spec_of(&mut c, &low);
    let d = c.decide(&cfg, &low_spec);
    assert_eq!(d.node, None, "the held zone went to another pod: {d:?}");
    // The preemptor, its hold taken off for its own decision, fits there.
    let hold = c.release_hold("ns/high").expect("the hold");
    assert_eq!(hold.node, "n0");
    let d = c.decide(&cfg, &high_spec);
    assert_eq!(d.node.as_deref(), Some("n0"), "{}", d.message);
    c.assume_at(&high_spec, &d, 2_000);
    assert_eq!(
        c.decide(&cfg, &low_spec).node,
        None,
        "zone 1 is the preemptor's now"
    );
    // Without a hold the low pod would have taken the zone (the test can fail).
    let mut bare = index(&nodes, &kept);
    let s = spec_of(&mut bare, &low);
    assert_eq!(bare.decide(&cfg, &s).node.as_deref(), Some("n0"));
}

#[test]
fn budgets_steer_the_choice_and_never_policy_is_read_from_the_pod() {
    let (nodes, placed) = two_zone_case();
    let refs: Vec<&Placed> = placed.iter().collect();
    let budget = |app: &str| -> k8s_openapi::api::policy::v1::PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": app, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        }))
        .unwrap()
    };
    // b is protected: rather than break its budget, zone 0 is emptied, although that evicts
    // c, of higher priority (budget violators are reprieved first, as upstream).
    let mut c = index(&nodes, &refs);
    c.apply_pdb(&budget("b"));
    let spec = spec_of(&mut c, &pod_json("high", 4, 0, 1000));
    let p = c.preempt(&Config::default(), &spec, 1000).expect("a preemption");
    let mut victims: Vec<&str> = p.victims.iter().map(|v| v.name.as_str()).collect();
    victims.sort_unstable();
    assert_eq!(victims, vec!["a", "c"]);
    assert_eq!(p.budget_violations, 0);
    // b and c both protected: one budget breaks either way; the lower priorities go (zone 1)
    // and the violation is counted.
    let mut c = index(&nodes, &refs);
    c.apply_pdb(&budget("b"));
    c.apply_pdb(&budget("c"));
    let p = c.preempt(&Config::default(), &spec, 1000).expect("a preemption");
    let mut victims: Vec<&str> = p.victims.iter().map(|v| v.name.as_str()).collect();
    victims.sort_unstable();
    assert_eq!(victims, vec!["b", "d"]);
    assert_eq!(p.budget_violations, 1);
    // Deleting the budget of b makes zone 1 free to take again without violation.
    c.delete_pdb("ns/b");
    let p = c.preempt(&Config::default(), &spec, 1000).expect("a preemption");
    assert_eq!(p.budget_violations, 0);
    let never: Pod = serde_json::from_value({
        let mut v = pod_json("never", 4, 0, 1000);
        v["spec"]["preemptionPolicy"] = json!("Never");
        v
    })
    .unwrap();
    assert!(!numaplane_scheduler::preempt::may_preempt(&never));
}

/// `simulate` (the binary, as a user runs it) shows the preemption `run` would start for a pod
/// that fits nowhere, without applying it, and reads PodDisruptionBudgets from the cluster.
#[test]
fn simulate_shows_the_preemption_run_would_start() {
    let (nodes, placed) = two_zone_case();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster: Vec<Value> = vec![
        serde_json::to_value(node_obj(&nodes[0])).unwrap(),
        serde_json::to_value(nrt_obj(&nodes[0], &placed.iter().collect::<Vec<_>>())).unwrap(),
    ];
    cluster[0]["kind"] = json!("Node");
    cluster[0]["apiVersion"] = json!("v1");
    for p in &placed {
        let mut v = serde_json::to_value(bound_pod(p, 0)).unwrap();
        v["kind"] = json!("Pod");
        v["apiVersion"] = json!("v1");
        cluster.push(v);
    }
    let write = |name: &str, docs: &[Value]| {
        let path = dir.path().join(name);
        let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
        std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
        path
    };
    let mut high = pod_json("high", 4, 0, 1000);
    high["kind"] = json!("Pod");
    high["apiVersion"] = json!("v1");
    let mut never = pod_json("never", 4, 0, 1000);
    never["kind"] = json!("Pod");
    never["apiVersion"] = json!("v1");
    never["spec"]["preemptionPolicy"] = json!("Never");
    let run = |cluster: &[Value]| -> Value {
        let cluster_file = write("cluster.yaml", cluster);
        let pods_file = write("pods.yaml", &[high.clone(), never.clone()]);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"))
            .args(["simulate", "--cluster"])
            .arg(&cluster_file)
            .arg("--pods")
            .arg(&pods_file)
            .args(["-o", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let report = run(&cluster);
    let high_r = &report["results"][0];
    assert!(high_r["node"].is_null(), "not applied: {high_r}");
    assert_eq!(
        high_r["preemption"],
        json!({"node": "n0", "victims": ["ns/b", "ns/d"], "budgetViolations": 0, "numaNodes": [1]})
    );
    assert!(
        report["results"][1]["preemption"].is_null(),
        "preemptionPolicy: Never"
    );
    // A budget protecting b and c from the cluster file: one is broken either way, counted.
    for app in ["b", "c"] {
        cluster.push(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": app, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}));
    }
    let report = run(&cluster);
    assert_eq!(report["results"][0]["preemption"]["budgetViolations"], 1);
}

/// A preemptor nominated earlier waits while its victims are still terminating because of a
/// preemption (kube-scheduler's PodEligibleToPreemptOthers), across restarts too: the index
/// reads it from the victims themselves, not from a hold.
#[test]
fn a_nominated_pod_waits_while_preempted_pods_terminate() {
    let (nodes, placed) = two_zone_case();
    let with = |deleting: bool, reason: &str| -> Cluster {
        let refs: Vec<&Placed> = placed.iter().collect();
        let mut c = index(&nodes, &refs);
        let mut b = serde_json::to_value(bound_pod(&placed[2], 0)).unwrap();
        if deleting {
            b["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:10Z");
        }
        b["status"]["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": reason}]);
        c.apply_pod(&serde_json::from_value(b).unwrap()).unwrap();
        c
    };
    let c = with(true, "PreemptionByScheduler");
    assert!(c.victims_leaving("n0", 1000));
    assert!(!c.victims_leaving("n0", 0), "only lower-priority pods count");
    assert!(!c.victims_leaving("n1", 1000), "another node");
    assert!(
        !with(false, "PreemptionByScheduler").victims_leaving("n0", 1000),
        "not deleted yet"
    );
    assert!(
        !with(true, "EvictionByEvictionAPI").victims_leaving("n0", 1000),
        "evicted by someone else"
    );
}
