//! Every XML fixture under `tests/fixtures/`: the exact model it loads to, that the generated
//! ones are reproducible from their specs, and that hwloc's own `lstopo` accepts them.

// Helpers outside #[test] fns are test code too; clippy's allow-unwrap-in-tests misses them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use numaplane_topology::synth::{MachineSpec, NumaNodeSpec, PciDeviceSpec};
use numaplane_topology::{Distance, HugepagePool, Machine, NumaNode, PciBusRange, PciDevice};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load(name: &str) -> Machine {
    Machine::from_xml_file(&fixtures_dir().join(name)).unwrap()
}

fn bus_range(domain: u32, first_bus: u8, last_bus: u8, numa_node: u32) -> PciBusRange {
    PciBusRange {
        domain,
        first_bus,
        last_bus,
        numa_node,
    }
}

// ---------------------------------------------------------------------------------------------
// Specs of the generated fixtures. `1numa.xml` is a real `lstopo --of xml --whole-io` capture.
// ---------------------------------------------------------------------------------------------

/// Node spec from its cores (SMT sibling groups).
fn node_spec(id: u32, cores: Vec<Vec<u32>>, memory_bytes: u64) -> NumaNodeSpec {
    let mut cpus: Vec<u32> = cores.iter().flatten().copied().collect();
    cpus.sort_unstable();
    NumaNodeSpec {
        id,
        cpus,
        smt_siblings: Some(cores),
        memory_bytes: Some(memory_bytes),
        ..NumaNodeSpec::default()
    }
}

/// Linux x86 numbering: core `c` of the machine has threads `c` and `c + total_cores`.
fn linux_cores(node_index: u32, cores_per_node: u32, total_cores: u32) -> Vec<Vec<u32>> {
    (0..cores_per_node)
        .map(|core| {
            let first = node_index * cores_per_node + core;
            vec![first, first + total_cores]
        })
        .collect()
}

/// A machine of `numa_nodes` and `pci_devices` whose node distances are the rows of `matrix`
/// (in the nodes' order).
fn machine_spec(
    mut numa_nodes: Vec<NumaNodeSpec>,
    pci_devices: Vec<PciDeviceSpec>,
    matrix: Vec<Vec<u64>>,
) -> MachineSpec {
    let ids: Vec<u32> = numa_nodes.iter().map(|node| node.id).collect();
    for (node, row) in numa_nodes.iter_mut().zip(&matrix) {
        node.distances = ids
            .iter()
            .zip(row.iter())
            .map(|(to, value)| Distance {
                node: *to,
                value: *value,
            })
            .collect();
    }
    MachineSpec {
        numa_nodes,
        pci_devices,
    }
}

/// `count` nodes numbered as Linux does, `cores_per_node` cores of two threads and `memory`
/// bytes each.
fn linux_nodes(count: u32, cores_per_node: u32, memory: u64) -> Vec<NumaNodeSpec> {
    (0..count)
        .map(|n| node_spec(n, linux_cores(n, cores_per_node, count * cores_per_node), memory))
        .collect()
}

/// Huge pages of 2 MiB and 1 GiB, `two_mib` and `one_gib` of them.
fn hugepage_pools(two_mib: u64, one_gib: u64) -> Vec<HugepagePool> {
    vec![
        HugepagePool {
            page_size_bytes: 2 * MIB,
            count: two_mib,
        },
        HugepagePool {
            page_size_bytes: GIB,
            count: one_gib,
        },
    ]
}

fn device(bus_id: &str, vendor_id: u16, device_id: u16, class_id: u16, numa_nodes: &[u32]) -> PciDeviceSpec {
    PciDeviceSpec {
        bus_id: bus_id.to_owned(),
        vendor_id,
        device_id,
        class_id,
        numa_nodes: numa_nodes.to_vec(),
    }
}

fn spec_2numa() -> MachineSpec {
    let nodes = linux_nodes(2, 8, 64 * GIB);
    machine_spec(nodes, Vec::new(), slit(2, 1, 0, 21))
}

/// Round-robin BIOS numbering: CPU `c` is on node `c % 4`.
fn spec_4numa() -> MachineSpec {
    machine_spec(
        (0..4)
            .map(|n| {
                let cores = (0..4).map(|k| vec![4 * k + n, 16 + 4 * k + n]).collect();
                node_spec(n, cores, 32 * GIB)
            })
            .collect(),
        Vec::new(),
        slit(4, 2, 12, 32),
    )
}

/// Two sockets × 4 NUMA nodes (NPS4-like) × 32 cores × 2 threads = 512 CPUs.
fn spec_8numa_512cpu() -> MachineSpec {
    let nodes = linux_nodes(8, 32, 96 * GIB);
    machine_spec(nodes, Vec::new(), slit(8, 4, 12, 32))
}

/// The SLIT of `nodes` nodes in groups of `group` (a socket, a pair): 10 to itself, `near`
/// within its group, `far` across.
fn slit(nodes: u32, group: u32, near: u64, far: u64) -> Vec<Vec<u64>> {
    let distance = |from: u32, to: u32| match (from == to, from / group == to / group) {
        (true, _) => 10,
        (false, true) => near,
        (false, false) => far,
    };
    (0..nodes)
        .map(|from| (0..nodes).map(|to| distance(from, to)).collect())
        .collect()
}

fn spec_holes() -> MachineSpec {
    machine_spec(
        [0, 1, 4, 5]
            .into_iter()
            .zip(0..)
            .map(|(id, index)| node_spec(id, linux_cores(index, 4, 16), 16 * GIB))
            .collect(),
        Vec::new(),
        slit(4, 2, 11, 21),
    )
}

fn spec_hugepages() -> MachineSpec {
    let nodes = linux_nodes(2, 4, 32 * GIB);
    let mut spec = machine_spec(nodes, Vec::new(), slit(2, 1, 0, 20));
    // Node 0 uses the resource-name map, node 1 the page-count list: both spec spellings.
    spec.numa_nodes[0].hugepages_total_bytes = BTreeMap::from([
        ("hugepages-2Mi".to_owned(), 2 * GIB),
        ("hugepages-1Gi".to_owned(), 4 * GIB),
    ]);
    spec.numa_nodes[1].hugepages = hugepage_pools(512, 8);
    spec
}

fn spec_gpu_nic() -> MachineSpec {
    let nodes = linux_nodes(2, 8, 128 * GIB);
    machine_spec(
        nodes,
        vec![
            device("0000:17:00.0", 0x15b3, 0x101b, 0x0200, &[0]),
            device("0000:17:00.1", 0x15b3, 0x101b, 0x0200, &[0]),
            device("0000:4b:00.0", 0x8086, 0x159b, 0x0200, &[0]),
            device("0000:b1:00.0", 0x10de, 0x20b5, 0x0302, &[1]),
            device("0000:ca:00.0", 0x10de, 0x20b5, 0x0302, &[1]),
            device("0000:c3:00.0", 0x144d, 0xa80a, 0x0108, &[]),
        ],
        slit(2, 1, 0, 21),
    )
}

/// Two CPU nodes plus a CPU-less CXL memory expander (node 2).
fn spec_memory_only() -> MachineSpec {
    machine_spec(
        vec![
            node_spec(0, linux_cores(0, 4, 8), 64 * GIB),
            node_spec(1, linux_cores(1, 4, 8), 64 * GIB),
            NumaNodeSpec {
                id: 2,
                memory_bytes: Some(256 * GIB),
                ..NumaNodeSpec::default()
            },
        ],
        Vec::new(),
        vec![vec![10, 21, 14], vec![21, 10, 24], vec![14, 24, 10]],
    )
}

fn generated_fixtures() -> Vec<(&'static str, MachineSpec)> {
    vec![
        ("2numa.xml", spec_2numa()),
        ("4numa.xml", spec_4numa()),
        ("8numa-512cpu.xml", spec_8numa_512cpu()),
        ("holes-0-1-4-5.xml", spec_holes()),
        ("hugepages-2sizes.xml", spec_hugepages()),
        ("gpu-nic.xml", spec_gpu_nic()),
        ("memory-only-node.xml", spec_memory_only()),
    ]
}

#[test]
#[ignore = "rewrites tests/fixtures/*.xml; run explicitly after changing a fixture spec"]
fn regenerate_fixtures() {
    for (name, spec) in generated_fixtures() {
        std::fs::write(fixtures_dir().join(name), spec.to_hwloc_xml().unwrap()).unwrap();
    }
}

#[test]
fn generated_fixtures_are_reproducible() {
    for (name, spec) in generated_fixtures() {
        let on_disk = std::fs::read_to_string(fixtures_dir().join(name)).unwrap();
        assert_eq!(
            on_disk,
            spec.to_hwloc_xml().unwrap(),
            "{name} differs from its spec; run the ignored regenerate_fixtures test"
        );
        assert_eq!(load(name), spec.expected_machine().unwrap(), "{name}");
    }
}

#[test]
fn lstopo_accepts_every_fixture() {
    let Ok(version) = Command::new("lstopo-no-graphics").arg("--version").output() else {
        eprintln!("lstopo-no-graphics not installed; skipping");
        return;
    };
    assert!(version.status.success());
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "xml") {
            continue;
        }
        let output = Command::new("lstopo-no-graphics")
            .args(["--if", "xml", "-i"])
            .arg(&path)
            .args(["--of", "console", "--whole-io"])
            .output()
            .unwrap();
        assert!(
            output.status.success() && output.stderr.is_empty(),
            "lstopo rejected {}: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        checked += 1;
    }
    assert_eq!(checked, 8);
}

#[test]
fn every_fixture_is_documented() {
    let readme = std::fs::read_to_string(fixtures_dir().join("README.md")).unwrap();
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".xml") {
            assert!(
                readme.contains(&format!("`{name}`")),
                "{name} missing from README.md"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Expected models, written out independently of the specs above.
// ---------------------------------------------------------------------------------------------

fn numa_node(id: u32, cores: Vec<Vec<u32>>, memory_bytes: u64, distances: &[(u32, u64)]) -> NumaNode {
    let mut cpus: Vec<u32> = cores.iter().flatten().copied().collect();
    cpus.sort_unstable();
    NumaNode {
        id,
        cpus,
        cores,
        memory_bytes,
        hugepages: Vec::new(),
        distances: distances
            .iter()
            .map(|(node, value)| Distance {
                node: *node,
                value: *value,
            })
            .collect(),
    }
}

fn pci(
    bus_id: &str,
    vendor_id: u16,
    device_id: u16,
    class_id: u16,
    class_name: &str,
    numa: &[u32],
) -> PciDevice {
    PciDevice {
        bus_id: bus_id.to_owned(),
        vendor_id,
        device_id,
        class_id,
        class_name: class_name.to_owned(),
        numa_nodes: numa.to_vec(),
    }
}

fn range(start: u32, len: u32) -> Vec<u32> {
    (start..start + len).collect()
}

#[test]
fn fixture_1numa_real_capture() {
    let machine = load("1numa.xml");
    let expected = Machine {
        numa_nodes: vec![numa_node(0, vec![vec![0], vec![1]], 7_342_346_240, &[])],
        // The capture also has a host bridge (class 0600) and three class-ffff virtio functions:
        // hwloc's "important" filter and the bridge exclusion drop them.
        pci_devices: vec![
            pci("0000:00:02.0", 0x1af4, 0x1042, 0x0180, "storage", &[0]),
            pci("0000:00:03.0", 0x1af4, 0x1041, 0x0200, "network", &[0]),
        ],
        // The one host bridge, `0000:[00-00]`, under the machine root of a one-node machine.
        pci_locality: vec![bus_range(0, 0x00, 0x00, 0)],
    };
    assert_eq!(machine, expected);
    assert_eq!(machine.numa_ids(), vec![0]);
    assert_eq!(machine.cpu_to_numa(), BTreeMap::from([(0, 0), (1, 0)]));
    assert_eq!(machine.distance(0, 0), None);
}

/// The two nodes of a 2-NUMA fixture as they must be read: `per_node` cores each of threads `c`
/// and `c + 2 × per_node`, `memory` bytes each, at distance `far` from each other.
fn two_nodes(per_node: u32, memory: u64, far: u64) -> Vec<NumaNode> {
    let cores = |first: u32| {
        (first..first + per_node)
            .map(|c| vec![c, c + 2 * per_node])
            .collect::<Vec<_>>()
    };
    vec![
        numa_node(0, cores(0), memory, &[(0, 10), (1, far)]),
        numa_node(1, cores(per_node), memory, &[(0, far), (1, 10)]),
    ]
}

#[test]
fn fixture_2numa() {
    let machine = load("2numa.xml");
    let expected = Machine {
        numa_nodes: two_nodes(8, 64 * GIB, 21),
        pci_devices: Vec::new(),
        pci_locality: Vec::new(),
    };
    assert_eq!(machine, expected);
    assert_eq!(
        machine.node(0).unwrap().cpus,
        [range(0, 8), range(16, 8)].concat()
    );
    assert_eq!(
        machine.node(1).unwrap().cpus,
        [range(8, 8), range(24, 8)].concat()
    );
    assert_eq!(machine.distance(0, 1), Some(21));
    assert_eq!(machine.cpu_to_numa().len(), 32);
}

#[test]
fn fixture_4numa_interleaved_cpu_ids() {
    let machine = load("4numa.xml");
    assert_eq!(machine.numa_ids(), vec![0, 1, 2, 3]);
    // Round-robin numbering: node n owns n, n+4, n+8, ...
    assert_eq!(machine.node(0).unwrap().cpus, vec![0, 4, 8, 12, 16, 20, 24, 28]);
    assert_eq!(machine.node(1).unwrap().cpus, vec![1, 5, 9, 13, 17, 21, 25, 29]);
    assert_eq!(machine.node(2).unwrap().cpus, vec![2, 6, 10, 14, 18, 22, 26, 30]);
    assert_eq!(machine.node(3).unwrap().cpus, vec![3, 7, 11, 15, 19, 23, 27, 31]);
    assert_eq!(
        machine.node(2).unwrap().cores,
        vec![vec![2, 18], vec![6, 22], vec![10, 26], vec![14, 30]]
    );
    let matrix = [
        [10, 12, 32, 32],
        [12, 10, 32, 32],
        [32, 32, 10, 12],
        [32, 32, 12, 10],
    ];
    let expected = Machine {
        numa_nodes: (0..4u32)
            .map(|n| {
                let cores = (0..4).map(|k| vec![4 * k + n, 16 + 4 * k + n]).collect();
                let row: Vec<(u32, u64)> = (0..4u32).zip(matrix[n as usize]).collect();
                numa_node(n, cores, 32 * GIB, &row)
            })
            .collect(),
        pci_devices: Vec::new(),
        pci_locality: Vec::new(),
    };
    assert_eq!(machine, expected);
    let cpu_to_numa = machine.cpu_to_numa();
    assert!((0..32).all(|cpu| cpu_to_numa[&cpu] == cpu % 4));
}

#[test]
fn fixture_8numa_512cpu() {
    let machine = load("8numa-512cpu.xml");
    assert_eq!(machine.numa_ids(), range(0, 8));
    assert_eq!(machine.cpus(), range(0, 512));
    for node in &machine.numa_nodes {
        let n = node.id;
        assert_eq!(node.cpus.len(), 64);
        assert_eq!(node.cpus, [range(n * 32, 32), range(256 + n * 32, 32)].concat());
        let cores: Vec<Vec<u32>> = range(n * 32, 32).into_iter().map(|c| vec![c, c + 256]).collect();
        assert_eq!(node.cores, cores);
        assert_eq!(node.memory_bytes, 96 * GIB);
        assert!(node.hugepages.is_empty());
        let row: Vec<Distance> = (0..8)
            .map(|to| Distance {
                node: to,
                value: if to == n {
                    10
                } else if to / 4 == n / 4 {
                    12
                } else {
                    32
                },
            })
            .collect();
        assert_eq!(node.distances, row);
    }
    assert_eq!(machine.distance(3, 4), Some(32));
    assert_eq!(machine.distance(4, 7), Some(12));
    assert!(machine.pci_devices.is_empty());
}

#[test]
fn fixture_numa_id_holes() {
    let machine = load("holes-0-1-4-5.xml");
    let cores = |index: u32| {
        (0..4)
            .map(|c| vec![index * 4 + c, 16 + index * 4 + c])
            .collect::<Vec<_>>()
    };
    let expected = Machine {
        numa_nodes: vec![
            numa_node(0, cores(0), 16 * GIB, &[(0, 10), (1, 11), (4, 21), (5, 21)]),
            numa_node(1, cores(1), 16 * GIB, &[(0, 11), (1, 10), (4, 21), (5, 21)]),
            numa_node(4, cores(2), 16 * GIB, &[(0, 21), (1, 21), (4, 10), (5, 11)]),
            numa_node(5, cores(3), 16 * GIB, &[(0, 21), (1, 21), (4, 11), (5, 10)]),
        ],
        pci_devices: Vec::new(),
        pci_locality: Vec::new(),
    };
    assert_eq!(machine, expected);
    assert_eq!(machine.numa_ids(), vec![0, 1, 4, 5]);
    assert_eq!(machine.node(4).unwrap().cpus, vec![8, 9, 10, 11, 24, 25, 26, 27]);
    assert!(machine.node(2).is_none());
    assert_eq!(machine.distance(4, 5), Some(11));
    assert_eq!(machine.distance(0, 2), None);
    assert_eq!(machine.cpu_to_numa()[&24], 4);
}

#[test]
fn fixture_hugepages_two_sizes() {
    let machine = load("hugepages-2sizes.xml");
    let mut numa_nodes = two_nodes(4, 32 * GIB, 20);
    numa_nodes[0].hugepages = hugepage_pools(1024, 4);
    numa_nodes[1].hugepages = hugepage_pools(512, 8);
    let expected = Machine {
        numa_nodes,
        pci_devices: Vec::new(),
        pci_locality: Vec::new(),
    };
    assert_eq!(machine, expected);
    let names: Vec<String> = machine.numa_nodes[0]
        .hugepages
        .iter()
        .map(HugepagePool::resource_name)
        .collect();
    assert_eq!(names, ["hugepages-2Mi", "hugepages-1Gi"]);
    assert_eq!(machine.numa_nodes[1].hugepages[1].total_bytes(), 8 * GIB);
}

#[test]
fn fixture_gpu_nic() {
    let machine = load("gpu-nic.xml");
    let expected = Machine {
        numa_nodes: two_nodes(8, 128 * GIB, 21),
        pci_devices: vec![
            pci("0000:17:00.0", 0x15b3, 0x101b, 0x0200, "network", &[0]),
            pci("0000:17:00.1", 0x15b3, 0x101b, 0x0200, "network", &[0]),
            pci("0000:4b:00.0", 0x8086, 0x159b, 0x0200, "network", &[0]),
            pci("0000:b1:00.0", 0x10de, 0x20b5, 0x0302, "gpu", &[1]),
            pci("0000:c3:00.0", 0x144d, 0xa80a, 0x0108, "nvme", &[]),
            pci("0000:ca:00.0", 0x10de, 0x20b5, 0x0302, "gpu", &[1]),
        ],
        // Host bridges under each package; the NVMe's bridge hangs off the root (no locality).
        pci_locality: vec![
            bus_range(0, 0x17, 0x17, 0),
            bus_range(0, 0x4b, 0x4b, 0),
            bus_range(0, 0xb1, 0xb1, 1),
            bus_range(0, 0xca, 0xca, 1),
        ],
    };
    assert_eq!(machine, expected);
}

#[test]
fn fixture_memory_only_node() {
    let machine = load("memory-only-node.xml");
    let cores = |first: u32| (first..first + 4).map(|c| vec![c, c + 8]).collect::<Vec<_>>();
    let expected = Machine {
        numa_nodes: vec![
            numa_node(0, cores(0), 64 * GIB, &[(0, 10), (1, 21), (2, 14)]),
            numa_node(1, cores(4), 64 * GIB, &[(0, 21), (1, 10), (2, 24)]),
            numa_node(2, Vec::new(), 256 * GIB, &[(0, 14), (1, 24), (2, 10)]),
        ],
        pci_devices: Vec::new(),
        pci_locality: Vec::new(),
    };
    assert_eq!(machine, expected);
    // The CXL node's hwloc cpuset covers every CPU; none of them may be assigned to it.
    assert!(machine.cpu_to_numa().values().all(|node| *node != 2));
    assert_eq!(machine.cpu_to_numa().len(), 16);
}

#[test]
fn disallowed_cpus_and_nodes_are_kept() {
    // An export taken inside a restricted cgroup marks CPUs/nodes as not allowed; the model
    // still describes the whole machine.
    let xml = std::fs::read_to_string(fixtures_dir().join("2numa.xml")).unwrap();
    let restricted = xml
        .replacen(
            "allowed_cpuset=\"0xffffffff\"",
            "allowed_cpuset=\"0x000000ff\"",
            1,
        )
        .replacen(
            "allowed_nodeset=\"0x00000003\"",
            "allowed_nodeset=\"0x00000001\"",
            1,
        );
    assert_ne!(restricted, xml);
    assert_eq!(Machine::from_xml_str(&restricted).unwrap(), load("2numa.xml"));
}

#[test]
fn pci_locality_takes_host_bridge_ranges_not_the_bridges_below_them() {
    // gpu-nic.xml with wider host bridges, as servers have them: node 1's first host bridge
    // covers buses 80-bf and reaches its GPU through a PCI-PCI bridge (bus b1), and a host
    // bridge with no device hwloc keeps as important still counts.
    let xml = std::fs::read_to_string(fixtures_dir().join("gpu-nic.xml")).unwrap();
    let gpu = r#"<object type="PCIDev" gp_index="60" pci_busid="0000:b1:00.0" pci_type="0302 [10de:20b5] [0000:0000] 00" pci_link_speed="0.000000"/>"#;
    assert!(xml.contains(gpu));
    let wide = xml
        .replace(r#"bridge_pci="0000:[17-17]""#, r#"bridge_pci="0000:[00-3f]""#)
        .replace(r#"bridge_pci="0000:[4b-4b]""#, r#"bridge_pci="0000:[40-7f]""#)
        .replace(r#"bridge_pci="0000:[b1-b1]""#, r#"bridge_pci="0000:[80-bf]""#)
        .replace(r#"bridge_pci="0000:[ca-ca]""#, r#"bridge_pci="0000:[c0-df]""#)
        .replace(
            gpu,
            &format!(
                r#"<object type="Bridge" gp_index="900" bridge_type="1-1" depth="1" bridge_pci="0000:[b1-b1]" pci_busid="0000:80:01.0" pci_type="0604 [8086:2030] [0000:0000] 00" pci_link_speed="0.000000">{gpu}</object>
        <object type="Bridge" gp_index="901" bridge_type="0-1" depth="0" bridge_pci="0001:[00-0f]">
          <object type="PCIDev" gp_index="902" pci_busid="0001:00:00.0" pci_type="0c03 [8086:1234] [0000:0000] 00" pci_link_speed="0.000000"/>
        </object>"#
            ),
        );
    let machine = Machine::from_xml_str(&wide).unwrap();
    assert_eq!(
        machine.pci_locality,
        vec![
            // Adjacent ranges of one node merge, as the published value has them.
            bus_range(0, 0x00, 0x7f, 0),
            bus_range(0, 0x80, 0xdf, 1),
            bus_range(1, 0x00, 0x0f, 1),
        ]
    );
    assert_eq!(
        numaplane::pci_locality::join_pci_locality(&machine.pci_locality),
        "0000:00-7f=0,0000:80-df=1,0001:00-0f=1"
    );
    // The model's JSON carries the same ranges in their wire form.
    let json = serde_json::to_value(&machine).unwrap();
    assert_eq!(json["pci_locality"], "0000:00-7f=0,0000:80-df=1,0001:00-0f=1");
    let back: Machine = serde_json::from_value(json).unwrap();
    assert_eq!(back, machine);
}
