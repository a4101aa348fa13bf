//! Conformance of the accounting core against the shared exporter vectors.
//!
//! `tests/data/exporter_cases.json` is a verbatim copy of `conformance/exporter_cases.json`.
//! Every case of its `cases` array goes through [`account`] and [`Accounting::to_nrt`]; zones
//! are compared semantically (quantities by value, and checked to be canonical DecimalSI
//! strings), attributes and annotations when the case gives them. The `fingerprint_cases`
//! vectors are driven through the accounting too, so the pod selection is covered end to end.
//!
//! Machines are built directly as [`MachineView`]s; the hwloc XML path is covered elsewhere.

// Malformed vectors should fail loudly, with the case named in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use numaplane::fingerprint::Method;
use numaplane::nrt::{self, NodeResourceTopology, Zone, attr};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use numaplane::quantity::{Format, Quantity};
use numaplane_exporter::accounting::{
    Accounting, AccountingConfig, AnomalyKind, MachineView, NodeView, PodExclude, account,
};
use serde_json::Value;

const CASES: &str = include_str!("data/exporter_cases.json");

/// Number of accounting cases in the vectors; a changed file must be looked at, not skipped.
const CASE_COUNT: usize = 11;

/// A case whose `expect` our recommended behaviour intentionally does not reproduce. For these
/// the test asserts the case's own `alternative_behaviours.recommended` values instead, and
/// checks that the unpatched `expect` really differs (so a stale entry is noticed).
struct Difference {
    case: &'static str,
    why: &'static str,
}

const DIFFERENCES: &[Difference] = &[Difference {
    case: "nfd-scanner-fractional-cpu-pod-with-cpu-ids",
    why: "The case follows NFD, which looks the pod up in the API server and drops the CPUs of \
          a pod without an integral-CPU container. We trust the kubelet (research §3.1, chosen \
          column): since 1.23 List reports exclusive CPUs only, so cpu_ids present means CPUs \
          held exclusively, and the accounting needs no API-server lookup. The reported CPUs 0 \
          and 1 are therefore subtracted (node-0 and node-1 cpu available 11), which is also \
          what RTE does.",
}];

/// Anomalies each case is expected to raise (kind, count); every other case raises none.
const EXPECTED_ANOMALIES: &[(&str, &[(AnomalyKind, usize)])] = &[(
    "used-exceeds-allocatable-unhealthy-device",
    &[(AnomalyKind::UsedExceedsAllocatable, 1)],
)];

/// Config keys of the vectors that a kubelet-trusting, pure accounting does not use.
const IGNORED_CONFIG: &[(&str, &str)] = &[
    (
        "pod_info",
        "NFD-style QoS filtering needs the API server; we trust the kubelet",
    ),
    (
        "refresh_node_resources",
        "only changes when GetAllocatableResources is re-read, not the accounting",
    ),
];

// ---------------------------------------------------------------------------------------------
// JSON → inputs
// ---------------------------------------------------------------------------------------------

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn ints(v: &Value, key: &str) -> Vec<i64> {
    array(v, key)
        .iter()
        .map(|x| x.as_i64().expect("integer"))
        .collect()
}

fn topology(v: &Value) -> Option<TopologyInfo> {
    let t = v.get("topology")?;
    Some(TopologyInfo {
        nodes: array(t, "nodes")
            .iter()
            .map(|n| NumaNode {
                id: n
                    .get("ID")
                    .or_else(|| n.get("id"))
                    .and_then(Value::as_i64)
                    .expect("NUMA ID"),
            })
            .collect(),
    })
}

fn devices(v: &Value) -> Vec<ContainerDevices> {
    array(v, "devices")
        .iter()
        .map(|d| ContainerDevices {
            resource_name: str_of(d, "resource_name").to_owned(),
            device_ids: array(d, "device_ids")
                .iter()
                .map(|id| id.as_str().expect("id").to_owned())
                .collect(),
            topology: topology(d),
        })
        .collect()
}

fn memory(v: &Value) -> Vec<ContainerMemory> {
    array(v, "memory")
        .iter()
        .map(|m| ContainerMemory {
            memory_type: str_of(m, "memory_type").to_owned(),
            size: m["size"].as_u64().expect("size"),
            topology: topology(m),
        })
        .collect()
}

fn allocatable(v: &Value) -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        devices: devices(v),
        cpu_ids: ints(v, "cpu_ids"),
        memory: memory(v),
    }
}

fn list(v: &Value) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: array(v, "pod_resources")
            .iter()
            .map(|p| PodResources {
                name: str_of(p, "name").to_owned(),
                namespace: str_of(p, "namespace").to_owned(),
                containers: array(p, "containers")
                    .iter()
                    .map(|c| ContainerResources {
                        name: str_of(c, "name").to_owned(),
                        devices: devices(c),
                        cpu_ids: ints(c, "cpu_ids"),
                        memory: memory(c),
                        dynamic_resources: Vec::new(),
                    })
                    .collect(),
                cpu_ids: ints(p, "cpu_ids"),
                memory: memory(p),
            })
            .collect(),
    }
}

fn machine(v: &Value) -> MachineView {
    MachineView {
        nodes: array(v, "numa_nodes")
            .iter()
            .map(|n| NodeView {
                id: u32::try_from(n["id"].as_u64().expect("id")).expect("u32 id"),
                cpus: array(n, "cpus")
                    .iter()
                    .map(|c| u32::try_from(c.as_u64().expect("cpu")).expect("u32"))
                    .collect(),
                memory_bytes: n.get("memory_total_bytes").and_then(Value::as_u64),
                hugepages_bytes: n
                    .get("hugepages_total_bytes")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(k, b)| (k.clone(), b.as_u64().expect("bytes")))
                    .collect(),
                distances: array(n, "distances")
                    .iter()
                    .map(|d| {
                        (
                            u32::try_from(d["node"].as_u64().expect("node")).expect("u32"),
                            d["value"].as_u64().expect("value"),
                        )
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn config(v: &Value) -> AccountingConfig {
    const KNOWN: &[&str] = &[
        "node_name",
        "resource_exclude",
        "watch_namespace",
        "pod_exclude",
        "terminal_pods",
        "pods_fingerprint",
        "pods_fingerprint_method",
    ];
    for key in v.as_object().expect("config object").keys() {
        assert!(
            KNOWN.contains(&key.as_str()) || IGNORED_CONFIG.iter().any(|(k, _)| k == key),
            "unknown config key {key}: the vectors changed"
        );
    }
    let fingerprint_method = v
        .get("pods_fingerprint")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        .then(|| {
            v.get("pods_fingerprint_method")
                .and_then(Value::as_str)
                .map_or(Method::WithExclusiveResources, |m| m.parse().expect("method"))
        });
    AccountingConfig {
        node_name: str_of(v, "node_name").to_owned(),
        resource_exclude: v
            .get("resource_exclude")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(node, names)| {
                let names = names
                    .as_array()
                    .expect("names")
                    .iter()
                    .map(|n| n.as_str().expect("name").to_owned());
                (node.clone(), names.collect())
            })
            .collect(),
        watch_namespace: v
            .get("watch_namespace")
            .and_then(Value::as_str)
            .map(str::to_owned),
        pod_exclude: array(v, "pod_exclude")
            .iter()
            .map(|e| PodExclude {
                namespace_pattern: str_of(e, "namespace_pattern").to_owned(),
                name_pattern: str_of(e, "name_pattern").to_owned(),
            })
            .collect(),
        terminal_pods: array(v, "terminal_pods")
            .iter()
            .map(|p| (str_of(p, "namespace").to_owned(), str_of(p, "name").to_owned()))
            .collect(),
        fingerprint_method,
        ..AccountingConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// A zone reduced to what the vectors pin: (name, type, costs, resources by name → values).
#[derive(Debug, PartialEq)]
struct ZoneValues {
    name: String,
    zone_type: String,
    costs: Vec<(String, i64)>,
    resources: BTreeMap<String, [Quantity; 3]>,
}

fn qty(s: &str, context: &str) -> Quantity {
    s.parse()
        .unwrap_or_else(|e| panic!("{context}: {s:?} is not a quantity: {e}"))
}

fn expected_zones(expect: &Value, case: &str) -> Vec<ZoneValues> {
    array(expect, "zones")
        .iter()
        .map(|z| ZoneValues {
            name: str_of(z, "name").to_owned(),
            zone_type: str_of(z, "type").to_owned(),
            costs: array(z, "costs")
                .iter()
                .map(|c| (str_of(c, "name").to_owned(), c["value"].as_i64().expect("cost")))
                .collect(),
            resources: array(z, "resources")
                .iter()
                .map(|r| {
                    let field = |f: &str| qty(str_of(r, f), case);
                    (
                        str_of(r, "name").to_owned(),
                        [field("capacity"), field("allocatable"), field("available")],
                    )
                })
                .collect(),
        })
        .collect()
}

/// Our zones as [`ZoneValues`], checking on the way the shape the vectors' `expect` describes:
/// zones, costs and resources sorted by name, canonical DecimalSI quantity strings.
fn actual_zones(zones: &[Zone], case: &str) -> Vec<ZoneValues> {
    let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
    assert!(names.is_sorted(), "{case}: zones not sorted: {names:?}");
    zones
        .iter()
        .map(|z| {
            let costs: Vec<(String, i64)> = z
                .costs
                .iter()
                .flatten()
                .map(|c| (c.name.clone(), c.value))
                .collect();
            assert!(
                costs.is_sorted_by(|a, b| a.0 <= b.0),
                "{case}/{}: costs not sorted",
                z.name
            );
            let rows = z.resources.as_deref().unwrap_or_default();
            assert!(
                rows.is_sorted_by(|a, b| a.name < b.name),
                "{case}/{}: resources not sorted or repeated",
                z.name
            );
            let resources = rows
                .iter()
                .map(|r| {
                    let values = [&r.capacity, &r.allocatable, &r.available].map(|q| {
                        let parsed = qty(&q.0, case);
                        assert_eq!(
                            parsed.format(),
                            Format::DecimalSI,
                            "{case}/{}/{}: {}",
                            z.name,
                            r.name,
                            q.0
                        );
                        assert_eq!(
                            parsed.to_string(),
                            q.0,
                            "{case}/{}/{}: not canonical",
                            z.name,
                            r.name
                        );
                        parsed
                    });
                    (r.name.clone(), values)
                })
                .collect();
            ZoneValues {
                name: z.name.clone(),
                zone_type: z.zone_type.clone(),
                costs,
                resources,
            }
        })
        .collect()
}

/// Applies `alternative_behaviours.<flavour>` overrides to the expected zones.
fn patch(zones: &mut [ZoneValues], overrides: &[Value], case: &str) {
    for o in overrides {
        let zone = zones
            .iter_mut()
            .find(|z| z.name == str_of(o, "zone"))
            .expect("override zone");
        let values = zone
            .resources
            .get_mut(str_of(o, "resource"))
            .expect("override resource");
        let slot = match str_of(o, "field") {
            "capacity" => 0,
            "allocatable" => 1,
            "available" => 2,
            other => panic!("{case}: unknown override field {other}"),
        };
        values[slot] = qty(str_of(o, "value"), case);
    }
}

fn is_extended(resource: &str) -> bool {
    resource != "cpu" && resource != "memory" && !resource.starts_with("hugepages-")
}

/// Every zone publishes a free-devices attribute for every extended resource of the node, with
/// sorted ids that are allocatable in that zone, at most `available` of them when none is
/// unknown to allocatable.
fn check_free_devices(zones: &[Zone], case: &str) {
    let extended: BTreeSet<&str> = zones
        .iter()
        .flat_map(|z| z.resources.iter().flatten())
        .map(|r| r.name.as_str())
        .filter(|r| is_extended(r))
        .collect();
    for z in zones {
        let names: BTreeSet<String> = z
            .attributes
            .iter()
            .flatten()
            .filter_map(|a| a.name.strip_prefix(attr::FREE_DEVICES_PREFIX).map(str::to_owned))
            .collect();
        let want: BTreeSet<String> = extended.iter().map(|r| (*r).to_owned()).collect();
        assert_eq!(names, want, "{case}/{}: free-devices attributes", z.name);
        for r in &want {
            let value = z
                .attribute(&format!("{}{r}", attr::FREE_DEVICES_PREFIX))
                .unwrap_or_default();
            let ids: Vec<&str> = value.split(',').filter(|s| !s.is_empty()).collect();
            assert!(ids.is_sorted(), "{case}/{}: {r} ids not sorted", z.name);
            let row = z.resources.iter().flatten().find(|row| &row.name == r);
            let allocatable = row.map_or(0, |row| qty(&row.allocatable.0, case).value_ceil());
            assert!(
                ids.len() as i64 <= allocatable,
                "{case}/{}: more free {r} than allocatable",
                z.name
            );
        }
    }
}

fn check_attributes(nrt: &NodeResourceTopology, expect: &Value, case: &str) {
    let ours: Vec<(&str, &str)> = nrt
        .attributes
        .iter()
        .flatten()
        .map(|a| (a.name.as_str(), a.value.as_str()))
        .collect();
    // Expected attributes must appear with their values, in the same relative order; the
    // vectors leave out the Topology Manager attributes the updater appends.
    let mut position = 0;
    for a in array(expect, "attributes") {
        let want = (str_of(a, "name"), str_of(a, "value"));
        let found = ours.iter().skip(position).position(|got| *got == want);
        let found =
            found.unwrap_or_else(|| panic!("{case}: attribute {want:?} missing or out of order in {ours:?}"));
        position += found + 1;
    }
    let annotations = nrt.metadata.annotations.clone().unwrap_or_default();
    for (key, value) in expect
        .get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        assert_eq!(
            annotations.get(key).map(String::as_str),
            value.as_str(),
            "{case}: annotation {key}"
        );
    }
    // RTE order regardless of what the case shows.
    let names: Vec<&str> = ours.iter().map(|(n, _)| *n).collect();
    let rte_order = [
        attr::PODS_FINGERPRINT,
        attr::PODS_FINGERPRINT_METHOD,
        attr::TOPOLOGY_MANAGER_SCOPE,
        attr::TOPOLOGY_MANAGER_POLICY,
        attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES,
    ];
    let ranks: Vec<usize> = names
        .iter()
        .map(|n| rte_order.iter().position(|o| o == n).expect("known attribute"))
        .collect();
    assert!(
        ranks.is_sorted(),
        "{case}: attributes not in RTE order: {names:?}"
    );
}

fn check_anomalies(acc: &Accounting, case: &str) {
    let want: BTreeMap<AnomalyKind, usize> = EXPECTED_ANOMALIES
        .iter()
        .find(|(c, _)| *c == case)
        .map(|(_, kinds)| kinds.iter().copied().collect())
        .unwrap_or_default();
    assert_eq!(
        acc.anomaly_counts(),
        want,
        "{case}: anomalies {:?}",
        acc.anomalies
    );
}

fn run_case(case: &Value) -> (String, Accounting) {
    let name = str_of(case, "name").to_owned();
    let cfg = config(&case["config"]);
    let acc = account(
        &machine(&case["machine"]),
        &allocatable(&case["allocatable"]),
        &list(&case["list"]),
        &cfg,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    (name, acc)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

fn vectors() -> Value {
    serde_json::from_str(CASES).expect("exporter_cases.json parses")
}

#[test]
fn accounting_cases() {
    let root = vectors();
    let cases = array(&root, "cases");
    assert_eq!(
        cases.len(),
        CASE_COUNT,
        "the vectors changed: review the new cases"
    );
    let mut report = Vec::new();
    for case in cases {
        let (name, acc) = run_case(case);
        let semantics = str_of(case, "expect_semantics");
        let uncertain = case.get("uncertain").and_then(Value::as_bool).unwrap_or(false);
        let difference = DIFFERENCES.iter().find(|d| d.case == name);

        let nrt = acc.to_nrt("TEST");
        assert_eq!(nrt.zones, acc.zones);
        let back: NodeResourceTopology =
            serde_json::from_value(serde_json::to_value(&nrt).expect("serialize")).expect("deserialize");
        assert_eq!(back, nrt, "{name}: NRT JSON round trip");

        let ours = actual_zones(&acc.zones, &name);
        let mut want = expected_zones(&case["expect"], &name);
        let verdict = match difference {
            None => {
                assert_eq!(
                    semantics, "recommended",
                    "{name}: {semantics} semantics need a DIFFERENCES entry"
                );
                assert_eq!(ours, want, "{name}");
                "pass"
            }
            Some(d) => {
                assert!(!d.why.is_empty());
                let overrides = case
                    .pointer("/alternative_behaviours/recommended")
                    .and_then(Value::as_array)
                    .unwrap_or_else(|| panic!("{name}: no recommended alternative to assert"));
                assert_ne!(
                    ours, want,
                    "{name}: listed in DIFFERENCES but matches the case's expect"
                );
                patch(&mut want, overrides, &name);
                assert_eq!(ours, want, "{name} (recommended alternative)");
                "pass (intentional difference)"
            }
        };
        check_attributes(&nrt, &case["expect"], &name);
        check_free_devices(&acc.zones, &name);
        check_anomalies(&acc, &name);
        report.push(format!(
            "{name}: {verdict} [semantics {semantics}{}; anomalies {:?}]",
            if uncertain { ", uncertain" } else { "" },
            acc.anomaly_counts()
        ));
    }
    println!("{}", report.join("\n"));
}

#[test]
fn differences_are_current() {
    let root = vectors();
    let cases = array(&root, "cases");
    for d in DIFFERENCES {
        let case = cases.iter().find(|c| str_of(c, "name") == d.case);
        let case = case.unwrap_or_else(|| panic!("DIFFERENCES names unknown case {}", d.case));
        assert!(
            str_of(case, "expect_semantics") != "recommended" || case["uncertain"].as_bool() == Some(true),
            "{}: a recommended, certain case must be met, not listed as a difference",
            d.case
        );
    }
    for (case, _) in EXPECTED_ANOMALIES {
        assert!(
            cases.iter().any(|c| str_of(c, "name") == *case),
            "EXPECTED_ANOMALIES names unknown case {case}"
        );
    }
}

#[test]
fn rte_fingerprint_case_publishes_rte_attributes() {
    let root = vectors();
    let case = array(&root, "cases")
        .iter()
        .find(|c| str_of(c, "name") == "rte-pod-fingerprint")
        .expect("case");
    let (_, acc) = run_case(case);
    let nrt = acc.to_nrt("TEST");
    let attrs: Vec<(&str, &str)> = nrt
        .attributes
        .iter()
        .flatten()
        .map(|a| (a.name.as_str(), a.value.as_str()))
        .collect();
    assert_eq!(
        attrs,
        [
            ("nodeTopologyPodsFingerprint", "pfp0v001fe53c4dbd2c5f4a0"),
            ("nodeTopologyPodsFingerprintMethod", "with-exclusive-resources"),
            ("topologyManagerScope", "container"),
            ("topologyManagerPolicy", "none"),
        ]
    );
    assert_eq!(nrt.topology_policies, Some(vec!["None".to_owned()]));
    assert_eq!(acc.pods_with_exclusive, 1);
    // netBBB is held but not allocatable: counted by its reported NUMA node, and both
    // allocatable netBBB-* ids are still offered by name.
    let node1 = acc
        .zones
        .iter()
        .find(|z| z.name == nrt::zone_name(1))
        .expect("node-1");
    assert_eq!(
        node1.attribute("numaplane.io/free-devices.fake.io/net"),
        Some("netBBB-0,netBBB-1")
    );
    assert_eq!(
        node1.attribute("numaplane.io/free-devices.fake.io/gpu"),
        Some("gpuAAA")
    );
    let node0 = acc
        .zones
        .iter()
        .find(|z| z.name == nrt::zone_name(0))
        .expect("node-0");
    assert_eq!(node0.attribute("numaplane.io/free-devices.fake.io/gpu"), Some(""));
}

#[test]
fn fingerprint_cases() {
    let root = vectors();
    let vectors = array(&root["fingerprint_cases"], "vectors");
    assert_eq!(vectors.len(), 10, "the fingerprint vectors changed");
    let shared_list = vectors
        .iter()
        .find_map(|v| v.get("list"))
        .expect("a vector with a list");
    // A machine and allocatable the pods do not matter for: the fingerprint only sees the list.
    let machine = MachineView {
        nodes: vec![NodeView {
            id: 0,
            cpus: vec![0, 1, 2, 3, 4],
            ..NodeView::default()
        }],
    };
    let alloc = AllocatableResourcesResponse::default();
    let mut skipped = Vec::new();
    for v in vectors {
        let name = str_of(v, "name");
        let (pods, method) = if let Some(pods) = v.get("pods") {
            let pods = pods
                .as_array()
                .expect("pods")
                .iter()
                .map(|p| PodResources {
                    namespace: p[0].as_str().expect("namespace").to_owned(),
                    name: p[1].as_str().expect("name").to_owned(),
                    ..PodResources::default()
                })
                .collect();
            (ListPodResourcesResponse { pod_resources: pods }, Method::All)
        } else if v.get("pods_ref").is_some() {
            // The 259 pods live in the podfingerprint repository; src/fingerprint.rs checks
            // that vector against its own copy.
            skipped.push(name);
            continue;
        } else {
            let method: Method = str_of(v, "method").parse().expect("method");
            (list(shared_list), method)
        };
        let cfg = AccountingConfig {
            fingerprint_method: Some(method),
            ..AccountingConfig::default()
        };
        let acc = account(&machine, &alloc, &pods, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expect = str_of(v, "expect");
        assert_eq!(acc.fingerprint.as_deref(), Some(expect), "{name}");
        let nrt = acc.to_nrt("n");
        assert_eq!(nrt.attribute(attr::PODS_FINGERPRINT), Some(expect), "{name}");
        assert_eq!(
            nrt.attribute(attr::PODS_FINGERPRINT_METHOD),
            Some(method.as_str()),
            "{name}"
        );
        let annotation = nrt
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(nrt::ANNOTATION_FINGERPRINT));
        assert_eq!(annotation.map(String::as_str), Some(expect), "{name}");
    }
    assert_eq!(skipped, ["openshift-node-259-pods"]);
}
