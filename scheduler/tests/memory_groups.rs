//! The Static memory manager's NUMA groups (kubelet-topology-manager.md §3.2 steps 2–3 and its
//! quirk): a single-NUMA mask is skipped when its node belongs to a multi-node group; a
//! multi-NUMA mask is skipped when one of its nodes holds memory of a single-node allocation or
//! of another group; with no mask left the memory manager gives no hint, the Topology Manager
//! decides on the other resources, and the pod fails in Allocate (`UnexpectedAdmissionError`).
//! The NRT shows per-zone memory only, so the model's rule for memory already in use is stated
//! in `admission/memory.rs` (`Groups`) and docs/scheduler.md; each case below was worked out by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    admission::{self, Placement, Rejection, WorkingZones},
    node::NumaTopology,
    pod::PodSpec,
    resources::Resources,
};
use serde_json::{Value, json};

/// Two zones of 8 CPUs (all free) and 8Gi of memory; `free_gi` the free memory per zone.
fn nrt(policy: &str, free_mi: [i64; 2]) -> NodeResourceTopology {
    let zone = |i: usize| {
        json!({"name": format!("node-{i}"), "type": "Node", "resources": [
            {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"},
            {"name": "memory", "capacity": "8Gi", "allocatable": "8Gi", "available": format!("{}Mi", free_mi[i])}
        ]})
    };
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": policy},
            {"name": "topologyManagerScope", "value": "container"}
        ],
        "zones": [zone(0), zone(1)]
    }))
    .unwrap()
}

/// A Guaranteed pod, one container per memory size (1 CPU each).
fn pod(res: &mut Resources, memory: &[&str]) -> PodSpec {
    let containers: Vec<Value> = memory
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let r = json!({"cpu": "1", "memory": m});
            json!({"name": format!("c{i}"), "resources": {"requests": r, "limits": r}})
        })
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": containers}
    }))
    .unwrap();
    PodSpec::from_pod(res, &pod).unwrap()
}

fn predict(policy: &str, free_mi: [i64; 2], memory: &[&str]) -> Result<Placement, Rejection> {
    predict_on(nrt(policy, free_mi), memory)
}

/// [`predict`] on a node whose exporter read the groups from the kubelet's checkpoint.
fn predict_known(
    policy: &str,
    free_mi: [i64; 2],
    groups: &str,
    memory: &[&str],
) -> Result<Placement, Rejection> {
    let mut obj = nrt(policy, free_mi);
    obj.attributes
        .get_or_insert_with(Vec::new)
        .push(numaplane::nrt::AttributeInfo {
            name: numaplane::nrt::attr::MEMORY_GROUPS.to_owned(),
            value: groups.to_owned(),
        });
    predict_on(obj, memory)
}

fn predict_on(obj: NodeResourceTopology, memory: &[&str]) -> Result<Placement, Rejection> {
    let policy = obj
        .attributes
        .iter()
        .flatten()
        .find(|a| a.name == "topologyManagerPolicy")
        .map(|a| a.value.clone())
        .unwrap_or_default();
    let mut res = Resources::default();
    let p = pod(&mut res, memory);
    let topo = NumaTopology::from_nrt(&mut res, &obj).unwrap();
    let out = admission::predict(&res, &topo, &mut WorkingZones::from_topology(&topo), &p);
    // The filter's fast path must agree.
    let fast = admission::admits(&res, &topo, &mut WorkingZones::from_topology(&topo), &p);
    assert_eq!(fast, out.is_ok(), "{policy} {memory:?}: {out:?}");
    out
}

fn numa(p: &Placement, i: usize) -> Option<Vec<u32>> {
    p.containers[i].numa_nodes.clone()
}

/// Step 3: 10Gi needs both nodes ({0,1} is the only mask whose allocatable covers it), but
/// node 0 already holds 2Gi of a single-node allocation (no zone is used up, so no group can
/// exist): the memory manager skips {0,1} and has no hint. The CPU hint alone admits at the
/// Topology Manager under every policy, and Allocate fails: UnexpectedAdmissionError.
#[test]
fn a_multi_numa_mask_over_a_node_in_use_is_skipped_rule_3_2_step_3() {
    for policy in ["best-effort", "restricted", "single-numa-node"] {
        let r = predict(policy, [6144, 8192], &["10Gi"]).expect_err(policy);
        assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{policy}: {r:?}");
        assert!(
            r.message.contains("memory manager cannot place memory"),
            "{}",
            r.message
        );
    }
    // Control: on an empty node the group {0,1} forms (best-effort admits it).
    let p = predict("best-effort", [8192, 8192], &["10Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![0, 1]));
}

/// Step 2, the model's conservative side: node 0's memory is used up, which the greedy fill of
/// a multi-node allocation leaves behind, so node 1's used memory may belong to a group {0,1}.
/// Without a group the kubelet admits on {1}. In the world where node 1 is a group member, {1}
/// is skipped (step 2), {0,1} is not known to be that group (step 3), so the memory manager has
/// no hint, the CPU hint {0} goes through and 2Gi cannot be allocated on node 0
/// (UnexpectedAdmissionError). The model admits only what both worlds admit, so the node is
/// refused rather than risk a failed pod.
#[test]
fn single_numa_masks_over_possible_group_members_are_not_predicted_rule_3_2_step_2() {
    let r = predict("single-numa-node", [0, 4096], &["2Gi"]).expect_err("group may exist");
    assert_eq!(r.kubelet_reason, "UnexpectedAdmissionError", "{r:?}");
    assert!(r.message.contains("memory group the NRT"), "{}", r.message);
    // Control: with 1Gi left on node 0 no group can exist; node 1 holds the pod alone.
    let p = predict("single-numa-node", [1024, 4096], &["2Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![1]));
}

/// Steps 2 and 3 inside the pod, tracked exactly: the first container's 10Gi forms the group
/// {0,1} (greedy: 8Gi from node 0, 2Gi from node 1). The second container's 1Gi may then not
/// use {0} or {1} alone (both in the group), only exactly {0,1}: its memory hint is {0,1}, not
/// preferred; the CPU hints {0} and {1} are preferred, so every merge is non-preferred and
/// best-effort takes the one of the widest minimum size (2): {0,1}. Without the group rule it
/// would have been {1}, where 6Gi are free.
#[test]
fn a_group_formed_by_an_earlier_container_binds_later_ones_rule_3_2_steps_2_3() {
    let p = predict("best-effort", [8192, 8192], &["10Gi", "1Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![0, 1]));
    assert_eq!(numa(&p, 1), Some(vec![0, 1]));
    // Under restricted the first container is already refused: CPU {0} and memory {0,1} are
    // both preferred but differ (verified on a real kubelet, verified-facts.md).
    let r = predict("restricted", [8192, 8192], &["10Gi", "1Gi"]).expect_err("restricted");
    assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{r:?}");
    // A single-node first container marks its node: the second may share node 0 alone (step
    // 2 only skips group members), but not span {0,1} (step 3).
    let p = predict("single-numa-node", [8192, 8192], &["1Gi", "1Gi"]).unwrap();
    assert_eq!((numa(&p, 0), numa(&p, 1)), (Some(vec![0]), Some(vec![0])));
}

/// With the groups read from the kubelet's checkpoint nothing is guessed. Node 0 used up by a
/// single-node allocation (`0`: no group): node 1 takes the pod alone, which the guessing model
/// refused above. Node 0 used up as the first node of the group {0,1} (`0+1`): {0} and {1} are
/// skipped (step 2), the memory manager's only hint is the group {0,1} (4Gi free, not preferred:
/// one node's allocatable holds 2Gi), so under single-numa-node every merge is non-preferred:
/// TopologyAffinityError, known rather than guessed.
#[test]
fn groups_read_from_the_checkpoint_replace_the_guess_rule_3_2_steps_2_3() {
    let p = predict_known("single-numa-node", [0, 4096], "0", &["2Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![1]));
    let r = predict_known("single-numa-node", [0, 4096], "0+1", &["2Gi"]).expect_err("group {0,1}");
    assert_eq!(r.kubelet_reason, "TopologyAffinityError", "{r:?}");
    assert!(
        !r.message.contains("memory group the NRT"),
        "known, not guessed: {}",
        r.message
    );
    // Under best-effort the group's own mask {0,1} is used (not preferred, but admitted).
    let p = predict_known("best-effort", [0, 4096], "0+1", &["2Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![0, 1]));
    // No memory assigned at all: node 0 can only be exhausted by something else, no guessing.
    let p = predict_known("single-numa-node", [8192, 8192], "", &["2Gi"]).unwrap();
    assert_eq!(numa(&p, 0), Some(vec![0]));
}

/// A malformed groups attribute, or one naming a node without a zone, makes the topology
/// invalid (a typed error the scheduler reports), never a silent guess.
#[test]
fn a_malformed_groups_attribute_is_a_typed_error() {
    for bad in ["0+x", "0;0", "7"] {
        let mut obj = nrt("single-numa-node", [8192, 8192]);
        obj.attributes
            .get_or_insert_with(Vec::new)
            .push(numaplane::nrt::AttributeInfo {
                name: numaplane::nrt::attr::MEMORY_GROUPS.to_owned(),
                value: bad.to_owned(),
            });
        let mut res = Resources::default();
        let e = NumaTopology::from_nrt(&mut res, &obj).expect_err(bad);
        assert_eq!(e.metric_label(), "memory_groups", "{bad}: {e}");
    }
}

/// Three zones of 4 CPUs and 8Gi, all free, under `policy`; `groups`: the published
/// `numaplane.io/memory-groups`, if any.
fn three_zones(policy: &str, groups: Option<&str>) -> NodeResourceTopology {
    let zone = |i: usize| {
        json!({"name": format!("node-{i}"), "type": "Node", "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
            {"name": "memory", "capacity": "8Gi", "allocatable": "8Gi", "available": "8Gi"}
        ]})
    };
    let mut attributes = vec![
        json!({"name": "topologyManagerPolicy", "value": policy}),
        json!({"name": "topologyManagerScope", "value": "container"}),
    ];
    if let Some(g) = groups {
        attributes.push(json!({"name": numaplane::nrt::attr::MEMORY_GROUPS, "value": g}));
    }
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"}, "attributes": attributes, "zones": [zone(0), zone(1), zone(2)]
    }))
    .unwrap()
}

fn node_n1() -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "12", "memory": "24Gi", "pods": "110"}}
    }))
    .unwrap()
}

fn guaranteed(name: &str, cpu: &str, memory: &str) -> Pod {
    let r = json!({"cpu": cpu, "memory": memory});
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"requests": r, "limits": r}}]}
    }))
    .unwrap()
}

/// Memory groups formed by an assumed placement, as the real kubelet v1.36.2 forms them: pod `a`'s 12Gi span NUMA 0 and 1
/// (best-effort: the widest minimum, {0,1}; greedy fill 8Gi + 4Gi), which makes {0,1} a group.
/// The next 1-CPU, 1Gi pod may then not use {0} or {1} alone (step 2): its memory hints are
/// {2} (preferred) and the group {0,1}, so the kubelet puts it on NUMA 2. `simulate` places
/// both in one run, before any NRT shows the group: the assumption of `a` must carry it.
/// (Before, the model guessed {1} from the zones: node 1 had 4Gi free.)
#[test]
fn simulate_sees_the_memory_group_its_own_placement_forms() {
    use numaplane_scheduler::simulate::{ConfigFile, Explain, Inputs, simulate};
    let inputs = Inputs {
        nodes: vec![node_n1()],
        nrts: vec![three_zones("best-effort", None)],
        ..Inputs::default()
    };
    let pods = vec![guaranteed("a", "1", "12Gi"), guaranteed("b", "1", "1Gi")];
    let report = simulate(inputs, pods, &ConfigFile::default(), Explain::None);
    let numa = |i: usize| {
        let d = &report.results[i].decision;
        assert_eq!(d.node.as_deref(), Some("n1"), "{}", d.message);
        d.placement.as_ref().unwrap().containers[0].numa_nodes.clone()
    };
    assert_eq!(numa(0), Some(vec![0, 1]));
    assert_eq!(numa(1), Some(vec![2]));
}

/// The same under restricted, with no CPU free on NUMA 2: `a` (6 CPUs, 12Gi) takes {0,1},
/// preferred for both; `b`'s CPU hint {1} and memory hint {0,1} (the group; {2} has no CPU)
/// differ, so the kubelet rejects it (TopologyAffinityError). Known from the assumption now;
/// before, the model rejected it only in its guessed world where the used-up NUMA 0 may be a
/// group's (and said so).
#[test]
fn simulate_rejects_under_restricted_for_the_memory_group_its_own_placement_forms() {
    use numaplane_scheduler::simulate::{ConfigFile, Explain, Inputs, simulate};
    let mut obj = three_zones("restricted", None);
    obj.zones[2].resources.as_mut().unwrap()[0].available =
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".to_owned());
    let inputs = Inputs {
        nodes: vec![node_n1()],
        nrts: vec![obj],
        ..Inputs::default()
    };
    let pods = vec![guaranteed("a", "6", "12Gi"), guaranteed("b", "1", "1Gi")];
    let report = simulate(inputs, pods, &ConfigFile::default(), Explain::Failed);
    let a = &report.results[0].decision;
    assert_eq!(
        a.placement.as_ref().unwrap().containers[0].numa_nodes,
        Some(vec![0, 1]),
        "{}",
        a.message
    );
    let b = &report.results[1].decision;
    assert_eq!(b.node, None, "{b:?}");
    let reasons = b.nodes[0].reasons.join("; ");
    assert!(reasons.contains("cannot align"), "{reasons}");
    assert!(
        !reasons.contains("memory group the NRT"),
        "known, not guessed: {reasons}"
    );
}

/// The cluster index: an assumed placement adds the multi-node memory group it forms to the
/// node's known groups (the next decision applies the group rules to it), a newer NRT that
/// publishes the same group does not count it twice, and the group goes with the assumption.
#[test]
fn an_assumption_carries_its_memory_group_until_it_ends() {
    use numaplane_scheduler::cluster::{Cluster, Config, TopologyState};
    let mut c = Cluster::new();
    c.apply_node(&node_n1()).unwrap();
    c.apply_nrt(&three_zones("best-effort", None)).unwrap();
    let groups = |c: &Cluster| {
        let TopologyState::Valid(t) = c.topology("n1") else {
            panic!("no topology")
        };
        t.memory_groups.clone()
    };
    let cfg = Config::default();
    let a = PodSpec::from_pod(&mut c.res, &guaranteed("a", "1", "12Gi")).unwrap();
    let d = c.schedule(&cfg, &a, false);
    c.assume(&a, &d);
    assert_eq!(groups(&c), Some(vec![vec![0, 1]]));
    let b = PodSpec::from_pod(&mut c.res, &guaranteed("b", "1", "1Gi")).unwrap();
    let placed = |c: &Cluster| {
        let d = c.schedule(&cfg, &b, false);
        d.placement.unwrap().containers[0].numa_nodes.clone()
    };
    assert_eq!(placed(&c), Some(vec![2]));
    // The exporter publishes the group (the kubelet admitted `a`); the assumption is still
    // pending (no fingerprint): the group is known once.
    let mut published = three_zones("best-effort", Some("0+1"));
    for (z, free) in published.zones.iter_mut().zip(["0", "4Gi", "8Gi"]) {
        z.resources.as_mut().unwrap()[1].available =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(free.to_owned());
    }
    c.apply_nrt(&published).unwrap();
    assert_eq!(groups(&c), Some(vec![vec![0, 1]]));
    // Back to the NRT without groups: the assumption alone carries it; forgotten, it is gone
    // and `b` may use NUMA 0 again.
    c.apply_nrt(&three_zones("best-effort", None)).unwrap();
    assert_eq!(groups(&c), Some(vec![vec![0, 1]]));
    c.forget(&a.key(), None);
    assert_eq!(groups(&c), None);
    assert_eq!(placed(&c), Some(vec![0]));
}

/// A single-node allocation is known too when its node held no memory before (it cannot be a
/// group's then); on a node already in use by an unknown allocation it is not, so the guess
/// about that node stays.
#[test]
fn an_assumption_knows_its_single_node_allocation_only_on_a_node_unused_before() {
    use numaplane_scheduler::cluster::{Cluster, Config, TopologyState};
    let groups = |c: &Cluster| {
        let TopologyState::Valid(t) = c.topology("n1") else {
            panic!("no topology")
        };
        t.memory_groups.clone()
    };
    let cfg = Config::default();
    let mut c = Cluster::new();
    c.apply_node(&node_n1()).unwrap();
    c.apply_nrt(&three_zones("single-numa-node", None)).unwrap();
    let a = PodSpec::from_pod(&mut c.res, &guaranteed("a", "1", "1Gi")).unwrap();
    let d = c.schedule(&cfg, &a, false);
    c.assume(&a, &d);
    assert_eq!(groups(&c), Some(vec![vec![0]]));
    // Node 0 already holds 2Gi of something the NRT does not attribute.
    let mut used = three_zones("single-numa-node", None);
    used.zones[0].resources.as_mut().unwrap()[1].available =
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("6Gi".to_owned());
    let mut c = Cluster::new();
    c.apply_node(&node_n1()).unwrap();
    c.apply_nrt(&used).unwrap();
    let d = c.schedule(&cfg, &a, false);
    assert_eq!(
        d.placement.as_ref().unwrap().containers[0].numa_nodes,
        Some(vec![0])
    );
    c.assume(&a, &d);
    assert_eq!(groups(&c), None);
}

/// best-effort: the Static memory manager extends a non-preferred single-node hint to the
/// narrowest group containing it, and that group then constrains later pods (verified on the
/// real kubelet v1.36.2). NUMA 0 has the only free CPUs but 1Gi of memory allocatable; NUMA 1
/// and 2 have 8Gi and no free CPU. A 1-CPU, 2Gi pod merges to {0} (not preferred: memory
/// prefers {1} or {2}); 1Gi does not fit there, so the memory manager extends {0} to its
/// narrowest hint containing it, {0,1}, which becomes a group. The next such pod is again
/// merged to {0}, and its memory may only go to exactly {0,1} (step 3); it fits there.
#[test]
fn best_effort_extends_a_single_node_hint_to_the_narrowest_group_which_binds_the_next_pod() {
    use numaplane_scheduler::cluster::{Cluster, Config};
    let zone = |i: usize, cpus: &str, memory: &str| {
        json!({"name": format!("node-{i}"), "type": "Node", "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": cpus},
            {"name": "memory", "capacity": "8Gi", "allocatable": memory, "available": memory}
        ]})
    };
    let obj: NodeResourceTopology = serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"},
        "attributes": [{"name": "topologyManagerPolicy", "value": "best-effort"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": [zone(0, "4", "1Gi"), zone(1, "0", "8Gi"), zone(2, "0", "8Gi")]
    }))
    .unwrap();
    let mut c = Cluster::new();
    c.apply_node(&node_n1()).unwrap();
    c.apply_nrt(&obj).unwrap();
    let cfg = Config::default();
    let memory_nodes = |d: &numaplane_scheduler::decision::Decision| {
        let p = d.placement.as_ref().unwrap();
        (
            p.containers[0].numa_nodes.clone(),
            p.containers[0]
                .memory_mask
                .map(|m| m.iter().collect::<Vec<u32>>()),
        )
    };
    for name in ["a", "b"] {
        let p = PodSpec::from_pod(&mut c.res, &guaranteed(name, "1", "2Gi")).unwrap();
        let d = c.schedule(&cfg, &p, false);
        assert_eq!(d.node.as_deref(), Some("n1"), "{name}: {}", d.message);
        assert_eq!(memory_nodes(&d), (Some(vec![0]), Some(vec![0, 1])), "{name}");
        c.assume(&p, &d);
    }
}
