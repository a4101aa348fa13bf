//! Conformance of the accounting core against the shared exporter vectors.
//!
//! Every case of the vectors' `cases` array goes through [`account`] and
//! [`Accounting::to_nrt`]; zones are compared semantically (quantities by value, and checked to
//! be canonical DecimalSI strings), attributes and annotations when the case gives them. The
//! `fingerprint_cases` vectors are driven through the accounting too, so the pod selection is
//! covered end to end. The conversion and comparison live in `numaplane_e2e::exporter_vectors`,
//! shared with the dry run of the real binary (`exporter_dry_run.rs`).
//!
//! Machines are built directly as [`MachineView`]s, with the vectors' exact capacities; the
//! hwloc XML path is covered by the dry run.

// Malformed vectors should fail loudly, with the case named in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use numaplane::fingerprint::Method;
use numaplane::nrt::{self, NodeResourceTopology, attr};
use numaplane::proto::podresources::{AllocatableResourcesResponse, ListPodResourcesResponse, PodResources};
use numaplane_e2e::exporter_vectors::{
    self as vectors, CASE_COUNT, DIFFERENCES, EXPECTED_ANOMALIES, Verdict, case_name, str_of,
};
use numaplane_exporter::accounting::{Accounting, AccountingConfig, MachineView, NodeView, account};
use serde_json::Value;

fn check_anomalies(acc: &Accounting, case: &str) {
    let want: BTreeMap<_, usize> = EXPECTED_ANOMALIES
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
    let name = case_name(case).to_owned();
    let cfg = vectors::config(&case["config"]).unwrap_or_else(|e| panic!("{name}: {e}"));
    let acc = account(
        &vectors::machine_view(&case["machine"]).unwrap_or_else(|e| panic!("{name}: {e}")),
        &vectors::allocatable(&case["allocatable"]).unwrap_or_else(|e| panic!("{name}: {e}")),
        &vectors::list(&case["list"]).unwrap_or_else(|e| panic!("{name}: {e}")),
        &cfg,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    (name, acc)
}

fn root() -> Value {
    vectors::embedded().unwrap()
}

#[test]
fn accounting_cases() {
    let root = root();
    let cases = vectors::cases(&root);
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

        let nrt = acc.to_nrt("TEST");
        assert_eq!(nrt.zones, acc.zones);
        let back: NodeResourceTopology = serde_json::from_value(serde_json::to_value(&nrt).unwrap()).unwrap();
        assert_eq!(back, nrt, "{name}: NRT JSON round trip");

        let verdict =
            vectors::check_case_zones(case, &acc.zones, &|_| Ok(())).unwrap_or_else(|e| panic!("{e}"));
        let verdict = match verdict {
            Verdict::Pass => "pass",
            Verdict::IntentionalDifference => "pass (intentional difference)",
        };
        vectors::check_attributes(&nrt, &case["expect"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        vectors::check_free_devices(&acc.zones).unwrap_or_else(|e| panic!("{name}: {e}"));
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
    let root = root();
    for d in DIFFERENCES {
        let case = vectors::find_case(&root, d.case)
            .unwrap_or_else(|_| panic!("DIFFERENCES names unknown case {}", d.case));
        assert!(
            str_of(case, "expect_semantics") != "recommended" || case["uncertain"].as_bool() == Some(true),
            "{}: a recommended, certain case must be met, not listed as a difference",
            d.case
        );
    }
    for (case, _) in EXPECTED_ANOMALIES {
        assert!(
            vectors::find_case(&root, case).is_ok(),
            "EXPECTED_ANOMALIES names unknown case {case}"
        );
    }
}

#[test]
fn rte_fingerprint_case_publishes_rte_attributes() {
    let root = root();
    let case = vectors::find_case(&root, "rte-pod-fingerprint").unwrap();
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
    let root = root();
    let fp_vectors = vectors::fingerprint_vectors(&root);
    assert_eq!(fp_vectors.len(), 10, "the fingerprint vectors changed");
    let shared_list = fp_vectors
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
        pci_locality: Vec::new(),
    };
    let alloc = AllocatableResourcesResponse::default();
    let mut skipped = Vec::new();
    for v in fp_vectors {
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
            (vectors::list(shared_list).unwrap(), method)
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

/// The accounting agrees with itself whether the machine is built directly from the vector or
/// through synth XML and hwloc, once the toy hugepage sizes are rounded to whole pages: the
/// two input paths the tests use describe the same machine.
#[test]
fn hwloc_machine_matches_direct_machine() {
    let root = root();
    for case in vectors::cases(&root) {
        let name = case_name(case);
        let (spec, rounded) = vectors::representable_spec(&case["machine"]).unwrap();
        let machine = spec.build_machine().unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut direct = vectors::machine_view(&case["machine"]).unwrap();
        for r in &rounded {
            let node = direct
                .nodes
                .iter_mut()
                .find(|n| nrt::zone_name(n.id) == r.zone)
                .unwrap();
            node.hugepages_bytes.insert(r.resource.clone(), r.written);
        }
        let mut via_hwloc = MachineView::from(&machine);
        // A pool of zero pages is no pool to hwloc; the direct view keeps it as 0 bytes.
        for node in &mut direct.nodes {
            node.hugepages_bytes.retain(|_, b| *b > 0);
            node.cpus.sort_unstable();
        }
        for node in &mut via_hwloc.nodes {
            node.cpus.sort_unstable();
            // The vectors do not describe cores; hwloc does. Every core's CPUs are the node's.
            let mut core_cpus: Vec<u32> = node.cores.iter().flatten().copied().collect();
            core_cpus.sort_unstable();
            assert_eq!(core_cpus, node.cpus, "{name}: cores of node {}", node.id);
            node.cores.clear();
        }
        assert_eq!(via_hwloc, direct, "{name}");
    }
}

#[test]
fn config_keys_are_all_known() {
    let root = root();
    for case in vectors::cases(&root) {
        vectors::check_config_keys(&case["config"]).unwrap_or_else(|e| panic!("{}: {e}", case_name(case)));
    }
    assert!(vectors::check_config_keys(&serde_json::json!({"surprise": 1})).is_err());
}
