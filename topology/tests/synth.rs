//! The generator: spec parsing, synth → XML → Machine round trips, spec validation.

// Helpers outside #[test] fns are test code too; clippy's allow-unwrap-in-tests misses them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use numaplane_topology::synth::{MachineSpec, NumaNodeSpec, PciDeviceSpec, to_hwloc_xml};
use numaplane_topology::{Distance, HugepagePool, Machine, TopologyError};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn round_trip(spec: &MachineSpec) -> Machine {
    let xml = to_hwloc_xml(spec).unwrap();
    let machine = Machine::from_xml_str(&xml).unwrap();
    assert_eq!(machine, spec.expected_machine().unwrap());
    machine
}

#[test]
fn conformance_style_json_description() {
    // Field spellings used by the exporter conformance descriptions, plus an unknown field.
    let machine = round_trip(&parse(
        r#"{
          "name": "ignored by the spec",
          "numa_nodes": [
            {"id": 0, "cpus": [0, 2, 4, 12, 14, 16], "smt_siblings": [[0, 12], [2, 14], [4, 16]],
             "distances": [{"node": 0, "value": 10}, {"node": 1, "value": 20}],
             "memory_total_bytes": 17179869184,
             "hugepages_total_bytes": {"hugepages-2Mi": 1073741824}},
            {"id": 1, "cpus": [1, 3, 5, 13, 15, 17], "smt_siblings": [[1, 13], [3, 15], [5, 17]],
             "distances": [{"node": 0, "value": 20}, {"node": 1, "value": 10}],
             "memory_total_bytes": 17179869184,
             "hugepages_total_bytes": {"hugepages-2Mi": 0, "hugepages-1Gi": 2147483648}}
          ],
          "pci_devices": [
            {"bus_id": "0000:3b:00.0", "vendor_id": "0x10de", "device_id": "20b5", "class_id": "0302", "numa_nodes": [1]},
            {"bus_id": "0000:18:00.0", "vendor_id": 32902, "device_id": 5531, "class_id": 512, "numa_nodes": [0]}
          ]
        }"#,
    ));

    assert_eq!(machine.numa_ids(), vec![0, 1]);
    let node0 = machine.node(0).unwrap();
    assert_eq!(node0.cpus, vec![0, 2, 4, 12, 14, 16]);
    assert_eq!(node0.cores, vec![vec![0, 12], vec![2, 14], vec![4, 16]]);
    assert_eq!(node0.memory_bytes, 16 * GIB);
    assert_eq!(
        node0.hugepages,
        vec![HugepagePool {
            page_size_bytes: 2 * MIB,
            count: 512
        }]
    );
    // The zero-page 2Mi pool of node 1 is not part of the model.
    assert_eq!(
        machine.node(1).unwrap().hugepages,
        vec![HugepagePool {
            page_size_bytes: GIB,
            count: 2
        }]
    );
    assert_eq!(machine.distance(1, 0), Some(20));
    assert_eq!(machine.cpu_to_numa()[&13], 1);

    let gpu = &machine.pci_devices[1];
    assert_eq!(
        (gpu.bus_id.as_str(), gpu.vendor_id, gpu.class_name.as_str()),
        ("0000:3b:00.0", 0x10de, "gpu")
    );
    assert_eq!(gpu.numa_nodes, vec![1]);
    let nic = &machine.pci_devices[0];
    assert_eq!(
        (nic.vendor_id, nic.device_id, nic.class_id),
        (0x8086, 0x159b, 0x0200)
    );
    assert_eq!(nic.numa_nodes, vec![0]);
}

#[test]
fn cpus_without_smt_information_are_single_thread_cores() {
    let machine = round_trip(&parse(
        r#"{"numa_nodes": [{"id": 0, "cpus": [0, 2, 4, 6]}, {"id": 1, "cpus": [7, 5, 3, 1]}]}"#,
    ));
    assert_eq!(
        machine.node(0).unwrap().cores,
        vec![vec![0], vec![2], vec![4], vec![6]]
    );
    assert_eq!(machine.node(1).unwrap().cpus, vec![1, 3, 5, 7]);
    assert_eq!(
        machine.node(1).unwrap().cores,
        vec![vec![1], vec![3], vec![5], vec![7]]
    );
    assert_eq!(machine.node(1).unwrap().memory_bytes, 0);
}

#[test]
fn partial_smt_information_and_odd_core_shapes() {
    let spec = MachineSpec {
        numa_nodes: vec![NumaNodeSpec {
            id: 0,
            cpus: vec![0, 1, 2, 3, 4, 5, 6],
            smt_siblings: Some(vec![vec![4, 0, 2, 6], vec![3, 1]]),
            ..NumaNodeSpec::default()
        }],
        pci_devices: Vec::new(),
    };
    let machine = round_trip(&spec);
    assert_eq!(
        machine.numa_nodes[0].cores,
        vec![vec![0, 2, 4, 6], vec![1, 3], vec![5]]
    );
}

#[test]
fn holes_and_cpu_less_nodes() {
    let machine = round_trip(&parse(
        r#"{"numa_nodes": [
            {"id": 6, "memory_bytes": 1073741824},
            {"id": 0, "cpus": [0, 1], "memory_bytes": 2147483648},
            {"id": 3, "cpus": [2, 3], "memory_bytes": 2147483648},
            {"id": 9}
        ]}"#,
    ));
    assert_eq!(machine.numa_ids(), vec![0, 3, 6, 9]);
    assert!(machine.node(6).unwrap().cpus.is_empty());
    assert!(machine.node(6).unwrap().cores.is_empty());
    assert_eq!(machine.node(6).unwrap().memory_bytes, GIB);
    assert!(machine.node(9).unwrap().cpus.is_empty());
    assert_eq!(
        machine.cpu_to_numa(),
        BTreeMap::from([(0, 0), (1, 0), (2, 3), (3, 3)])
    );
}

#[test]
fn memory_only_node_next_to_a_single_cpu_node() {
    // The memory-only node (lower id) and the CPU node cover the same CPUs in hwloc: the CPU
    // node is attached deeper, so it owns them.
    let machine = round_trip(&parse(
        r#"{"numa_nodes": [{"id": 0, "memory_bytes": 4096}, {"id": 1, "cpus": [0, 1]}]}"#,
    ));
    assert!(machine.node(0).unwrap().cpus.is_empty());
    assert_eq!(machine.node(1).unwrap().cpus, vec![0, 1]);
}

#[test]
fn single_node_devices_are_local_to_that_node() {
    let mut spec = MachineSpec::symmetric(1, 2, 1, GIB);
    spec.pci_devices = vec![
        PciDeviceSpec {
            bus_id: "0000:01:00.0".into(),
            vendor_id: 0x10de,
            device_id: 0x2330,
            class_id: 0x0302,
            numa_nodes: vec![],
        },
        PciDeviceSpec {
            bus_id: "0000:02:00.0".into(),
            vendor_id: 0x15b3,
            device_id: 0x1021,
            class_id: 0x0207,
            numa_nodes: vec![0],
        },
    ];
    let machine = round_trip(&spec);
    assert_eq!(machine.pci_devices[0].numa_nodes, vec![0]);
    assert_eq!(machine.pci_devices[1].numa_nodes, vec![0]);
    assert_eq!(machine.pci_devices[1].class_name, "infiniband");
}

#[test]
fn symmetric_machine_numbering() {
    let machine = round_trip(&MachineSpec::symmetric(2, 3, 2, 8 * GIB));
    assert_eq!(
        machine.node(0).unwrap().cores,
        vec![vec![0, 6], vec![1, 7], vec![2, 8]]
    );
    assert_eq!(machine.node(1).unwrap().cpus, vec![3, 4, 5, 9, 10, 11]);
    assert_eq!(machine.distance(0, 1), Some(20));
    assert_eq!(machine.distance(1, 1), Some(10));

    let single = round_trip(&MachineSpec::symmetric(1, 4, 1, GIB));
    assert_eq!(
        single.numa_nodes[0].cores,
        vec![vec![0], vec![1], vec![2], vec![3]]
    );
    assert!(single.numa_nodes[0].distances.is_empty());
}

#[test]
fn every_fixture_round_trips_through_a_spec() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "xml") {
            continue;
        }
        let machine = Machine::from_xml_file(&path).unwrap();
        let spec = MachineSpec::from(&machine);
        assert_eq!(spec.build_machine().unwrap(), machine, "{}", path.display());
        // A serialized Machine is also a valid spec (cores → smt_siblings, class_name ignored).
        let json = serde_json::to_string(&machine).unwrap();
        let from_json: MachineSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(from_json.build_machine().unwrap(), machine, "{}", path.display());
    }
}

#[test]
fn machine_serializes_to_json_and_yaml() {
    let mut spec = MachineSpec::symmetric(2, 1, 2, GIB);
    spec.numa_nodes[1].hugepages = vec![HugepagePool {
        page_size_bytes: 2 * MIB,
        count: 4,
    }];
    spec.pci_devices = vec![PciDeviceSpec {
        bus_id: "0000:af:00.0".into(),
        vendor_id: 0x1e10, // looks like a float if left unquoted in YAML
        device_id: 0x0302,
        class_id: 0x1200,
        numa_nodes: vec![1],
    }];
    let machine = round_trip(&spec);

    let json: serde_json::Value = serde_json::to_value(&machine).unwrap();
    assert_eq!(
        json["pci_devices"][0],
        serde_json::json!({
            "bus_id": "0000:af:00.0", "vendor_id": "1e10", "device_id": "0302", "class_id": "1200",
            "class_name": "accelerator", "numa_nodes": [1]
        })
    );
    assert_eq!(
        json["numa_nodes"][1]["hugepages"],
        serde_json::json!([{"page_size_bytes": 2097152, "count": 4}])
    );
    assert_eq!(json["numa_nodes"][0]["cores"], serde_json::json!([[0, 2]]));
    let back: Machine = serde_json::from_value(json).unwrap();
    assert_eq!(back, machine);

    let yaml = serde_saphyr::to_string(&machine).unwrap();
    let back: Machine = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(back, machine, "{yaml}");
}

fn spec_error(spec: &MachineSpec) -> String {
    match to_hwloc_xml(spec) {
        Err(error @ TopologyError::ValidateSpec { .. }) => error.to_string(),
        other => panic!("expected ValidateSpec, got {other:?}"),
    }
}

fn parse(json: &str) -> MachineSpec {
    serde_json::from_str(json).unwrap()
}

#[test]
fn invalid_specs_are_rejected_with_a_reason() {
    let cases = [
        (r#"{"numa_nodes": []}"#, "at least one NUMA node"),
        (r#"{"numa_nodes": [{"id": 0}]}"#, "at least one CPU"),
        (r#"{"numa_nodes": [{"id": 0, "cpus": [70000]}]}"#, "not below"),
        (
            r#"{"numa_nodes": [{"id": 4000000000, "cpus": [0]}]}"#,
            "not below",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}, {"id": 0, "cpus": [1]}]}"#,
            "listed twice",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0, 1]}, {"id": 1, "cpus": [1]}]}"#,
            "CPU 1 is listed in nodes 0 and 1",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "smt_siblings": [[0, 12]]}]}"#,
            "CPU 12",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0, 1], "smt_siblings": [[0, 1], [1]]}]}"#,
            "two SMT sibling groups",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "smt_siblings": [[]]}]}"#,
            "empty SMT sibling group",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "distances": [{"node": 0, "value": 10}, {"node": 1, "value": 20}]}, {"id": 1, "cpus": [1]}]}"#,
            "every NUMA node or none",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "distances": [{"node": 0, "value": 10}]}, {"id": 1, "cpus": [1], "distances": [{"node": 1, "value": 10}]}]}"#,
            "every node once",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "hugepages_total_bytes": {"hugepages-2MB": 2097152}}]}"#,
            "not a hugepage resource name",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "hugepages_total_bytes": {"hugepages-2Mi": 1000}}]}"#,
            "whole number of pages",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "hugepages": [{"page_size_bytes": 2097152, "count": 1}], "hugepages_total_bytes": {"hugepages-2Mi": 2097152}}]}"#,
            "twice",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0], "hugepages": [{"page_size_bytes": 4096, "count": 1}]}]}"#,
            "base page",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}], "pci_devices": [{"bus_id": "3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302"}]}"#,
            "dddd:bb:dd.f",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}], "pci_devices": [{"bus_id": "0000:00:14.0", "vendor_id": "8086", "device_id": "1", "class_id": "0c03"}]}"#,
            "important",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}], "pci_devices": [{"bus_id": "0000:3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302", "numa_nodes": [7]}]}"#,
            "unknown node 7",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}, {"id": 1}], "pci_devices": [{"bus_id": "0000:3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302", "numa_nodes": [1]}]}"#,
            "no CPUs",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}, {"id": 1, "cpus": [1]}], "pci_devices": [{"bus_id": "0000:3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302", "numa_nodes": [0, 1]}]}"#,
            "at most one node",
        ),
        (
            r#"{"numa_nodes": [{"id": 0, "cpus": [0]}], "pci_devices": [{"bus_id": "0000:3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302"}, {"bus_id": "0000:3b:00.0", "vendor_id": "10de", "device_id": "1", "class_id": "0302"}]}"#,
            "listed twice",
        ),
    ];
    for (json, expected) in cases {
        let message = spec_error(&parse(json));
        assert!(
            message.contains(expected),
            "{json}: {message:?} lacks {expected:?}"
        );
        assert!(parse(json).expected_machine().is_err());
    }
}

#[test]
fn bad_pci_id_in_spec_is_a_deserialization_error() {
    let result: Result<MachineSpec, _> = serde_json::from_str(
        r#"{"numa_nodes": [{"id": 0, "cpus": [0]}], "pci_devices": [{"bus_id": "0000:3b:00.0", "vendor_id": "xyz", "device_id": "1", "class_id": 70000}]}"#,
    );
    assert!(result.is_err());
}

/// Collects formatted log output of the current thread.

#[test]
fn distances_are_sorted_rows() {
    let mut spec = MachineSpec::symmetric(3, 1, 1, GIB);
    spec.numa_nodes[2].distances.reverse();
    let machine = round_trip(&spec);
    assert_eq!(
        machine.node(2).unwrap().distances,
        vec![
            Distance { node: 0, value: 20 },
            Distance { node: 1, value: 20 },
            Distance { node: 2, value: 10 }
        ]
    );
}
