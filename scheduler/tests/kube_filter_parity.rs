//! kube-scheduler v1.36.2's own filter tests (InterPodAffinity, PodTopologySpread, NodePorts,
//! NodeUnschedulable, NodeAffinity, TaintToleration, VolumeRestrictions), translated into cluster
//! objects (`data/kube_scheduler_filter_cases.json`, the public half), each run through
//! `numaplane-scheduler simulate --explain all -o json` as a user runs it: the feasible node set
//! must be exactly upstream's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, path::Path, process::Command};

use serde_json::{Value, json};

const VECTORS: &str = include_str!("data/kube_scheduler_filter_cases.json");

/// Runs `simulate` on a cluster of `objects` for the pods `pods` (in order); returns the report.
pub fn simulate(dir: &Path, objects: &[Value], pods: &[Value], config: Option<&str>) -> Value {
    let cluster = dir.join("cluster.json");
    let pending = dir.join("pods.json");
    std::fs::write(
        &cluster,
        json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string(),
    )
    .unwrap();
    std::fs::write(
        &pending,
        json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string(),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_numaplane-scheduler"));
    cmd.arg("simulate")
        .arg("--cluster")
        .arg(&cluster)
        .arg("--pods")
        .arg(&pending)
        .args(["--explain", "all", "-o", "json"]);
    if let Some(c) = config {
        let path = dir.join("config.yaml");
        std::fs::write(&path, c).unwrap();
        cmd.arg("--config").arg(path);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn feasible(result: &Value) -> BTreeSet<String> {
    result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["feasible"] == json!(true))
        .map(|v| v["node"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_public_upstream_filter_case_gives_upstreams_feasible_nodes() {
    let vectors: Value = serde_json::from_str(VECTORS).unwrap();
    assert_eq!(vectors["schema"], "numaplane kube-scheduler filter parity v1");
    let cases = vectors["cases"].as_array().unwrap();
    assert!(cases.len() >= 81, "{} cases", cases.len());
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let mut objects: Vec<Value> = case["nodes"].as_array().unwrap().clone();
        objects.extend(case["existingPods"].as_array().unwrap().iter().cloned());
        objects.extend(case["namespaces"].as_array().into_iter().flatten().cloned());
        let mut pod = case["pod"].clone();
        pod["spec"]["schedulerName"] = json!("numaplane-scheduler");
        let report = simulate(dir.path(), &objects, &[pod], None);
        let result = &report["results"][0];
        let got = feasible(result);
        let want: BTreeSet<String> = case["feasible"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect();
        let listed: BTreeSet<String> = result["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["node"].as_str().unwrap().to_owned())
            .collect();
        let all: BTreeSet<String> = want
            .iter()
            .cloned()
            .chain(case["infeasible"].as_object().unwrap().keys().cloned())
            .collect();
        if got != want || listed != all {
            failures.push(format!(
                "{} / {}: feasible {got:?}, upstream {want:?}; verdicts {}",
                case["plugin"], case["name"], result["nodes"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Rules the public vectors leave untested, and the scores (upstream's formulas): each through
// the same binary. Nodes have no NRT and pods request nothing, so only the constraints decide
// and every node's own score is the same (100 for a pod that is not Guaranteed).
// ---------------------------------------------------------------------------------------------

fn node(name: &str, labels: Value) -> Value {
    let mut l = labels;
    l["kubernetes.io/hostname"] = json!(name);
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": l},
        "status": {"allocatable": {"cpu": "100", "memory": "100Gi", "pods": "100"}}})
}

fn pod(name: &str, labels: Value, spec: Value) -> Value {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "img"}]);
    spec["schedulerName"] = json!("numaplane-scheduler");
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"), "labels": labels},
        "spec": spec, "status": {"phase": "Pending"}})
}

fn bound(name: &str, labels: Value, node: &str) -> Value {
    let mut p = pod(name, labels, json!({"nodeName": node}));
    p["status"]["phase"] = json!("Running");
    p
}

fn run(objects: &[Value], pods: &[Value]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    simulate(dir.path(), objects, pods, None)
}

fn placed(report: &Value, i: usize) -> Option<String> {
    report["results"][i]["node"].as_str().map(str::to_owned)
}

fn scores(result: &Value) -> Vec<(String, Option<i64>)> {
    result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["node"].as_str().unwrap().to_owned(), v["score"].as_i64()))
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn zones() -> Vec<Value> {
    vec![
        node("n1", json!({"zone": "a"})),
        node("n2", json!({"zone": "a"})),
        node("n3", json!({"zone": "b"})),
    ]
}

#[test]
fn required_anti_affinity_counts_the_placements_made_before_binding() {
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    let pods: Vec<Value> = (0..4)
        .map(|i| pod(&format!("db-{i}"), json!({"app": "db"}), anti.clone()))
        .collect();
    let r = run(&zones(), &pods);
    let nodes: BTreeSet<String> = (0..3).map(|i| placed(&r, i).unwrap()).collect();
    assert_eq!(nodes, set(&["n1", "n2", "n3"]), "one replica per node");
    assert_eq!(placed(&r, 3), None);
    let msg = r["results"][3]["message"].as_str().unwrap();
    assert_eq!(
        msg,
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    );
}

#[test]
fn existing_pods_anti_affinity_is_symmetric_over_its_topology() {
    let guard = {
        let mut p = bound("guard", json!({"app": "guard"}), "n1");
        p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}]}});
        p
    };
    let mut objects = zones();
    objects.push(guard);
    let r = run(
        &objects,
        &[
            pod("web", json!({"app": "web"}), json!({})),
            pod("api", json!({"app": "api"}), json!({})),
        ],
    );
    assert_eq!(feasible(&r["results"][0]), set(&["n3"]));
    let reasons = r["results"][0]["nodes"][0]["reasons"].to_string();
    assert!(
        reasons.contains("didn't satisfy existing pods anti-affinity rules"),
        "{reasons}"
    );
    assert_eq!(
        feasible(&r["results"][1]),
        set(&["n1", "n2", "n3"]),
        "the term selects web only"
    );
}

#[test]
fn the_first_pod_of_a_self_affine_group_goes_where_its_topology_key_exists() {
    let mut objects = zones();
    objects.push(node("bare", json!({})));
    let affine = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}]}}});
    let r = run(
        &objects,
        &[
            pod("c0", json!({"app": "cache"}), affine.clone()),
            pod("c1", json!({"app": "cache"}), affine.clone()),
        ],
    );
    assert_eq!(feasible(&r["results"][0]), set(&["n1", "n2", "n3"]));
    assert_eq!(placed(&r, 0).as_deref(), Some("n1"));
    // The second follows the first into its zone.
    assert_eq!(feasible(&r["results"][1]), set(&["n1", "n2"]));
    // A pod whose affinity does not select itself has no such exception.
    let other = run(&objects, &[pod("x", json!({"app": "other"}), affine)]);
    assert!(feasible(&other["results"][0]).is_empty());
}

#[test]
fn match_and_mismatch_label_keys_narrow_the_terms() {
    let mut objects = zones();
    objects.push(bound(
        "old",
        json!({"app": "a", "hash": "h1", "tenant": "t1"}),
        "n1",
    ));
    objects.push(bound(
        "new",
        json!({"app": "a", "hash": "h2", "tenant": "t2"}),
        "n3",
    ));
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "kubernetes.io/hostname",
         "matchLabelKeys": ["hash"]}]}}});
    let affinity = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "zone",
         "mismatchLabelKeys": ["tenant"]}]}}});
    let r = run(
        &objects,
        &[
            pod("p-anti", json!({"app": "a", "hash": "h2"}), anti),
            pod("p-aff", json!({"app": "b", "tenant": "t1"}), affinity),
        ],
    );
    assert_eq!(
        feasible(&r["results"][0]),
        set(&["n1", "n2"]),
        "only the h2 pod repels"
    );
    // Only the other tenant's pod (zone b) attracts; the assumed p-anti (h2, no tenant) too if
    // it landed in zone a.
    let want = if placed(&r, 0).as_deref() == Some("n3") {
        set(&["n3"])
    } else {
        set(&["n1", "n2", "n3"])
    };
    assert_eq!(feasible(&r["results"][1]), want);
}

fn spread(skew: i32, key: &str, extra: Value) -> Value {
    let mut c = json!({"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "s"}}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    json!({"topologySpreadConstraints": [c]})
}

#[test]
fn min_domains_counts_missing_domains_as_zero() {
    let mut objects = zones();
    objects.push(bound("s1", json!({"app": "s"}), "n1"));
    objects.push(bound("s2", json!({"app": "s"}), "n3"));
    let r = run(
        &objects,
        &[
            pod(
                "two",
                json!({"app": "s"}),
                spread(1, "zone", json!({"minDomains": 2})),
            ),
            pod(
                "three",
                json!({"app": "s"}),
                spread(1, "zone", json!({"minDomains": 3})),
            ),
        ],
    );
    assert_eq!(feasible(&r["results"][0]), set(&["n1", "n2", "n3"]));
    assert!(
        feasible(&r["results"][1]).is_empty(),
        "global minimum 0: skew 2 everywhere"
    );
    let msg = r["results"][1]["message"].as_str().unwrap();
    assert!(
        msg.contains("node(s) didn't match pod topology spread constraints"),
        "{msg}"
    );
}

#[test]
fn node_taints_policy_honor_leaves_tainted_domains_out() {
    let mut objects = vec![
        node("n1", json!({"zone": "a"})),
        node("n2", json!({"zone": "b"})),
        node("n3", json!({"zone": "c"})),
    ];
    objects[0]["spec"] = json!({"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]});
    objects.push(bound("s1", json!({"app": "s"}), "n2"));
    objects.push(bound("s2", json!({"app": "s"}), "n3"));
    let r = run(
        &objects,
        &[
            pod("ignore", json!({"app": "s"}), spread(1, "zone", json!({}))),
            pod(
                "honor",
                json!({"app": "s"}),
                spread(1, "zone", json!({"nodeTaintsPolicy": "Honor"})),
            ),
        ],
    );
    // Ignore: the tainted zone a (0 pods) is the minimum, and its node rejects the pod.
    assert!(feasible(&r["results"][0]).is_empty());
    assert_eq!(feasible(&r["results"][1]), set(&["n2", "n3"]));
}

#[test]
fn node_affinity_policy_ignore_counts_domains_the_pod_cannot_use() {
    let mut objects = zones();
    objects.push(bound("s1", json!({"app": "s"}), "n1"));
    let only_a = json!({"nodeSelector": {"zone": "a"}});
    let mut honor = spread(1, "zone", json!({}));
    honor["nodeSelector"] = only_a["nodeSelector"].clone();
    let mut ignore = spread(1, "zone", json!({"nodeAffinityPolicy": "Ignore"}));
    ignore["nodeSelector"] = only_a["nodeSelector"].clone();
    let r = run(
        &objects,
        &[
            pod("h", json!({"app": "s"}), honor),
            pod("i", json!({"app": "s"}), ignore),
        ],
    );
    // Honor: zone a alone is a domain (min 1): skew 1. Ignore: zone b (0) is the minimum:
    // skew 2 in zone a, where the selector allows nothing else.
    assert_eq!(feasible(&r["results"][0]), set(&["n1", "n2"]));
    assert!(feasible(&r["results"][1]).is_empty());
}

#[test]
fn an_invalid_node_affinity_value_makes_the_pod_fit_nowhere_unless_another_term_matches() {
    let gt = |extra: Value| {
        let mut terms =
            vec![json!({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]})];
        if !extra.is_null() {
            terms.push(extra);
        }
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    };
    let objects = vec![
        node("n1", json!({"cores": "64"})),
        node("n2", json!({"cores": "8", "zone": "b"})),
    ];
    let r = run(
        &objects,
        &[
            pod("bad", json!({}), gt(Value::Null)),
            pod(
                "ok",
                json!({}),
                gt(json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]})),
            ),
        ],
    );
    assert!(feasible(&r["results"][0]).is_empty());
    let msg = r["results"][0]["message"].as_str().unwrap();
    assert_eq!(
        msg,
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    );
    assert_eq!(feasible(&r["results"][1]), set(&["n2"]));
}

#[test]
fn schedule_anyway_spread_scores_as_upstream_normalises() {
    let objects = vec![
        node("a", json!({})),
        node("b", json!({})),
        node("c", json!({})),
        node("d", json!({})),
        bound("s1", json!({"app": "s"}), "a"),
        bound("s2", json!({"app": "s"}), "a"),
        bound("s3", json!({"app": "s"}), "b"),
    ];
    let soft = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "s"}}}]});
    let r = run(&objects, &[pod("p", json!({"app": "s"}), soft)]);
    // Raw: count × ln(4 + 2) + (maxSkew − 1): a 3.58 → 4, b 1.79 → 2, c and d 0. Normalised
    // 100 × (max + min − s) / max: 0, 50, 100, 100; weighted 2, on top of the node's 100.
    assert_eq!(
        scores(&r["results"][0]),
        vec![
            ("a".to_owned(), Some(100)),
            ("b".to_owned(), Some(200)),
            ("c".to_owned(), Some(300)),
            ("d".to_owned(), Some(300)),
        ]
    );
    assert_eq!(placed(&r, 0).as_deref(), Some("c"));
}

#[test]
fn preferred_inter_pod_terms_score_both_ways() {
    let mut objects = zones();
    let mut db = bound("db", json!({"app": "db"}), "n3");
    // An existing pod's preferred anti-affinity against the incoming pod counts against its zone.
    db["spec"]["affinity"] = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": "zone"}}]}});
    objects.push(db);
    let near = json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}}]}}});
    let r = run(
        &objects,
        &[
            pod("web", json!({"app": "web"}), near),
            pod("noisy", json!({"app": "noisy"}), json!({})),
        ],
    );
    // web: zone b scores 5, zone a 0 → normalised 100 and 0, weighted 2.
    assert_eq!(
        scores(&r["results"][0]),
        vec![
            ("n1".to_owned(), Some(100)),
            ("n2".to_owned(), Some(100)),
            ("n3".to_owned(), Some(300))
        ]
    );
    // noisy: zone b scores −10 → 0, zone a 100 after normalisation.
    assert_eq!(
        scores(&r["results"][1]),
        vec![
            ("n1".to_owned(), Some(300)),
            ("n2".to_owned(), Some(300)),
            ("n3".to_owned(), Some(100))
        ]
    );
}

#[test]
fn preferred_node_affinity_weighs_in_the_score_as_kube_schedulers_node_affinity_score() {
    let objects = vec![
        node("n1", json!({"disk": "ssd", "zone": "a"})),
        node("n2", json!({"disk": "hdd", "zone": "a"})),
        node("n3", json!({"disk": "ssd", "zone": "b"})),
        node("n4", json!({})),
    ];
    let prefer = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 20, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
        {"weight": 12, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}},
        {"weight": 7, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}}
    ]}}});
    let r = run(&objects, &[pod("p", json!({}), prefer)]);
    // Raw sums: n1 20, n2 7, n3 32, n4 0; DefaultNormalizeScore: 100 × s / 32 → 62, 21, 100, 0;
    // weighted 2, on top of the node's 100.
    assert_eq!(
        scores(&r["results"][0]),
        vec![
            ("n1".to_owned(), Some(224)),
            ("n2".to_owned(), Some(142)),
            ("n3".to_owned(), Some(300)),
            ("n4".to_owned(), Some(100)),
        ]
    );
    assert_eq!(placed(&r, 0).as_deref(), Some("n3"));
    assert!(
        r["results"][0]["unsupported"]
            .as_array()
            .is_none_or(|u| u.is_empty()),
        "{}",
        r["results"][0]
    );
    // A preferred term that does not parse fails the pod's cycle, as NodeAffinity's PreScore.
    let bad = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}}]}}});
    let r = run(&objects, &[pod("q", json!({}), bad)]);
    assert_eq!(placed(&r, 0), None);
    let message = r["results"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("running PreScore plugin \"NodeAffinity\""),
        "{message}"
    );
}

#[test]
fn default_constraints_spread_a_controllers_pods_unless_configured_away() {
    let objects = vec![node("a", json!({})), node("b", json!({})), node("c", json!({}))];
    let owned = |i: usize| {
        let mut p = pod(&format!("r-{i}"), json!({"app": "r"}), json!({}));
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "r", "uid": "rs-uid", "controller": true}]);
        p
    };
    let pods: Vec<Value> = (0..3).map(owned).collect();
    let r = run(&objects, &pods);
    let nodes: BTreeSet<String> = (0..3).map(|i| placed(&r, i).unwrap()).collect();
    assert_eq!(
        nodes,
        set(&["a", "b", "c"]),
        "hostname maxSkew 3 scores emptier nodes higher"
    );
    let dir = tempfile::tempdir().unwrap();
    let off = simulate(
        dir.path(),
        &objects,
        &pods,
        Some("podTopologySpread: {defaultingType: List}\n"),
    );
    assert!(
        (0..3).all(|i| placed(&off, i).as_deref() == Some("a")),
        "no defaults: the first node by name"
    );
}
