//! Unit tests: one per bad-input kind (typed error or counted anomaly, never a panic), plus the
//! accounting rules the shared vectors do not exercise.

use numaplane_topology::{Distance, HugepagePool, NumaNode as MachineNode};

use std::collections::{BTreeMap, BTreeSet};

use numaplane::fingerprint::{self, Method};
use numaplane::nrt::{self, CostInfo, NodeResourceTopology, attr};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use numaplane_topology::Machine;

use crate::init_held::{Held, Sources};

use super::*;

const GI: u64 = 1 << 30;

fn topo(ids: &[i64]) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: ids.iter().map(|&id| NumaNode { id }).collect(),
    })
}

fn dev(resource: &str, id: &str, nodes: &[i64]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: vec![id.into()],
        topology: topo(nodes),
    }
}

fn mem(memory_type: &str, size: u64, nodes: &[i64]) -> ContainerMemory {
    ContainerMemory {
        memory_type: memory_type.into(),
        size,
        topology: topo(nodes),
    }
}

/// Two nodes, 4 CPUs each (0-3, 4-7), 8 GiB MemTotal and 2 GiB of 2 MiB pages each.
fn machine() -> MachineView {
    let node = |id: u32, cpus: std::ops::Range<u32>| NodeView {
        id,
        cpus: cpus.collect(),
        memory_bytes: Some(8 * GI),
        hugepages_bytes: BTreeMap::from([("hugepages-2Mi".to_owned(), 2 * GI)]),
        distances: vec![
            (0, if id == 0 { 10 } else { 20 }),
            (1, if id == 1 { 10 } else { 20 }),
        ],
        cores: vec![],
    };
    MachineView {
        nodes: vec![node(0, 0..4), node(1, 4..8)],
        pci_locality: Vec::new(),
    }
}

fn all_cpus() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: (0..8).collect(),
        ..Default::default()
    }
}

fn pod(ns: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers,
        ..Default::default()
    }
}

fn container(
    cpus: &[i64],
    memory: Vec<ContainerMemory>,
    devices: Vec<ContainerDevices>,
) -> ContainerResources {
    ContainerResources {
        name: "c".into(),
        cpu_ids: cpus.to_vec(),
        memory,
        devices,
        ..Default::default()
    }
}

fn list(pods: Vec<PodResources>) -> ListPodResourcesResponse {
    ListPodResourcesResponse { pod_resources: pods }
}

/// A device entry without topology (the kubelet omits it for some plugins).
fn bare(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|&i| i.to_owned()).collect(),
        topology: None,
    }
}

/// List with one pod `ns/name` holding one container.
fn one_pod(name: &str, c: ContainerResources) -> ListPodResourcesResponse {
    list(vec![pod("ns", name, vec![c])])
}

/// All CPUs allocatable, plus `memory`.
fn with_memory(memory: Vec<ContainerMemory>) -> AllocatableResourcesResponse {
    AllocatableResourcesResponse { memory, ..all_cpus() }
}

/// All CPUs allocatable, plus `devices`.
fn with_devices(devices: Vec<ContainerDevices>) -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        devices,
        ..all_cpus()
    }
}

fn cfg() -> AccountingConfig {
    AccountingConfig {
        node_name: "n1".into(),
        ..AccountingConfig::default()
    }
}

fn run(alloc: &AllocatableResourcesResponse, l: &ListPodResourcesResponse) -> Accounting {
    account(&machine(), alloc, l, &cfg()).expect("accounting succeeds")
}

/// (capacity, allocatable, available) of `resource` in `zone`, as plain strings.
fn get(acc: &Accounting, zone: &str, resource: &str) -> Option<(String, String, String)> {
    let z = acc.zones.iter().find(|z| z.name == zone)?;
    let r = z.resources.as_ref()?.iter().find(|r| r.name == resource)?;
    Some((
        r.capacity.0.clone(),
        r.allocatable.0.clone(),
        r.available.0.clone(),
    ))
}

fn triple(c: &str, a: &str, v: &str) -> Option<(String, String, String)> {
    Some((c.into(), a.into(), v.into()))
}

fn assert_overflow(err: &AccountingError, operation: &str) {
    assert!(
        matches!(err, AccountingError::Overflow { operation: op, .. } if *op == operation),
        "{err}"
    );
}

/// The node-level attributes of `nrt` as (name, value), in published order.
fn attr_pairs(nrt: &NodeResourceTopology) -> Vec<(&str, &str)> {
    nrt.attributes
        .iter()
        .flatten()
        .map(|a| (a.name.as_str(), a.value.as_str()))
        .collect()
}

/// The names of a zone's resource rows, in published order.
fn row_names(zone: &nrt::Zone) -> Vec<&str> {
    zone.resources.iter().flatten().map(|r| r.name.as_str()).collect()
}

fn attr_names(attributes: Option<&[nrt::AttributeInfo]>) -> Vec<&str> {
    attributes
        .into_iter()
        .flatten()
        .map(|a| a.name.as_str())
        .collect()
}

/// Asserts the (capacity, allocatable, available) row of device `resource` in `zone` and the
/// ids offered there as free.
fn assert_devices(
    acc: &Accounting,
    zone: &str,
    resource: &str,
    (c, a, v): (&str, &str, &str),
    free_ids: &str,
) {
    assert_eq!(get(acc, zone, resource), triple(c, a, v), "{zone} {resource}");
    assert_eq!(
        free(acc, zone, resource).as_deref(),
        Some(free_ids),
        "{zone} {resource}"
    );
}

/// The error of accounting `used` memory blocks (one container of ns/p) against `allocatable`.
fn used_memory_overflow(allocatable: Vec<ContainerMemory>, used: Vec<ContainerMemory>) -> AccountingError {
    let l = one_pod("p", container(&[], used, vec![]));
    account(&machine(), &with_memory(allocatable), &l, &cfg()).expect_err("overflow")
}

fn count(acc: &Accounting, kind: AnomalyKind) -> usize {
    acc.anomalies.iter().filter(|a| a.kind == kind).count()
}

fn free(acc: &Accounting, zone: &str, resource: &str) -> Option<String> {
    let z = acc.zones.iter().find(|z| z.name == zone)?;
    z.attribute(&format!("{}{resource}", attr::FREE_DEVICES_PREFIX))
        .map(str::to_owned)
}

#[test]
fn empty_responses_give_one_cpu_row_per_zone() {
    let acc = run(
        &AllocatableResourcesResponse::default(),
        &ListPodResourcesResponse::default(),
    );
    assert_eq!(acc.zones.len(), 2);
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "0", "0"));
    assert_eq!(get(&acc, "node-1", "cpu"), triple("4", "0", "0"));
    for z in &acc.zones {
        assert_eq!(z.resources.as_ref().map(Vec::len), Some(1));
        assert_eq!(z.zone_type, "Node");
        assert_eq!(z.attributes, None);
    }
    assert!(acc.anomalies.is_empty());
    assert_eq!(acc.fingerprint.as_deref(), Some(fingerprint::EMPTY_SIGNATURE));
    assert_eq!((acc.pods_accounted, acc.pods_with_exclusive), (0, 0));
}

#[test]
fn holey_numa_ids_and_memory_only_node() {
    let mut m = machine();
    m.nodes[1].id = 2;
    m.nodes[1].distances = vec![(0, 20), (2, 10), (3, 31)];
    m.nodes.push(NodeView {
        id: 3,
        distances: vec![(3, 10)],
        ..NodeView::default()
    });
    let alloc = AllocatableResourcesResponse {
        cpu_ids: (0..8).collect(),
        memory: vec![mem("memory", GI, &[3]), mem("memory", GI, &[2])],
        ..Default::default()
    };
    let acc = account(&m, &alloc, &ListPodResourcesResponse::default(), &cfg()).expect("ok");
    let names: Vec<&str> = acc.zones.iter().map(|z| z.name.as_str()).collect();
    assert_eq!(names, ["node-0", "node-2", "node-3"]);
    assert_eq!(get(&acc, "node-2", "cpu"), triple("4", "4", "4"));
    // Memory-only node: memory capacity unknown there, so it falls back to allocatable; no CPU row.
    assert_eq!(
        get(&acc, "node-3", "memory"),
        triple("1073741824", "1073741824", "1073741824")
    );
    assert_eq!(get(&acc, "node-3", "cpu"), None);
    let costs = acc.zones[1].costs.clone().expect("costs");
    assert_eq!(
        costs,
        [("node-0", 20), ("node-2", 10), ("node-3", 31)]
            .map(|(n, v)| CostInfo {
                name: n.into(),
                value: v
            })
            .to_vec()
    );
    assert!(acc.anomalies.is_empty(), "{:?}", acc.anomalies);
}

#[test]
fn unknown_cpu_is_skipped_and_counted() {
    let mut alloc = all_cpus();
    alloc.cpu_ids.extend([99, -1, i64::MAX]);
    let l = one_pod("p", container(&[1, 77, -5], vec![], vec![]));
    let acc = run(&alloc, &l);
    assert_eq!(count(&acc, AnomalyKind::UnknownCpu), 5);
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "3"));
    assert_eq!(get(&acc, "node-1", "cpu"), triple("4", "4", "4"));
}

#[test]
fn duplicate_allocatable_cpu_counted_once() {
    let mut alloc = all_cpus();
    alloc.cpu_ids.push(3);
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(count(&acc, AnomalyKind::DuplicateCpu), 1);
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "4"));
}

#[test]
fn unknown_numa_is_skipped_and_counted() {
    let mut alloc = with_devices(vec![
        dev("x.io/nic", "a", &[7]),
        dev("x.io/nic", "b", &[0]),
        dev("x.io/nic", "c", &[1, 1 << 40]),
    ]);
    alloc.memory = vec![mem("memory", GI, &[5]), mem("memory", GI, &[0])];
    let l = one_pod(
        "p",
        container(
            &[],
            vec![mem("memory", 10, &[9])],
            vec![dev("x.io/nic", "a", &[7])],
        ),
    );
    let acc = run(&alloc, &l);
    assert_eq!(count(&acc, AnomalyKind::UnknownNuma), 5);
    assert_eq!(
        count(&acc, AnomalyKind::UnalignedDevice),
        0,
        "unknown ids are not 'no affinity'"
    );
    assert_eq!(count(&acc, AnomalyKind::UnalignedMemory), 0);
    assert_eq!(get(&acc, "node-0", "x.io/nic"), triple("1", "1", "1"));
    assert_eq!(get(&acc, "node-1", "x.io/nic"), triple("1", "1", "1"));
    assert_eq!(
        get(&acc, "node-0", "memory"),
        triple("8589934592", "1073741824", "1073741824")
    );
    assert_eq!(get(&acc, "node-1", "memory"), None);
}

#[test]
fn duplicate_allocatable_device_counted_once() {
    let alloc = with_devices(vec![
        dev("x.io/gpu", "g0", &[0]),
        dev("x.io/gpu", "g0", &[0]),
        dev("x.io/gpu", "g1", &[0]),
    ]);
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(count(&acc, AnomalyKind::DuplicateDevice), 1);
    assert_devices(&acc, "node-0", "x.io/gpu", ("2", "2", "2"), "g0,g1");
    assert_eq!(free(&acc, "node-1", "x.io/gpu").as_deref(), Some(""));
}

#[test]
fn multi_numa_device_counted_per_node() {
    let alloc = with_devices(vec![
        dev("x.io/gpu", "g0", &[0]),
        dev("x.io/gpu", "g0", &[1]),
        dev("x.io/gpu", "g1", &[1]),
    ]);
    let l = one_pod(
        "p",
        container(
            &[],
            vec![],
            vec![dev("x.io/gpu", "g0", &[0]), dev("x.io/gpu", "g0", &[1])],
        ),
    );
    let acc = run(&alloc, &l);
    assert!(acc.anomalies.is_empty(), "{:?}", acc.anomalies);
    assert_eq!(get(&acc, "node-0", "x.io/gpu"), triple("1", "1", "0"));
    assert_eq!(get(&acc, "node-1", "x.io/gpu"), triple("2", "2", "1"));
    assert_eq!(free(&acc, "node-0", "x.io/gpu").as_deref(), Some(""));
    assert_eq!(free(&acc, "node-1", "x.io/gpu").as_deref(), Some("g1"));
}

#[test]
fn unaligned_devices_stay_out_of_zones() {
    let alloc = with_devices(vec![
        bare("x.io/fpga", &["f0"]),
        dev("x.io/fpga", "f1", &[-1]),
        dev("x.io/fpga", "f2", &[]),
    ]);
    let l = one_pod("p", container(&[], vec![], vec![dev("x.io/fpga", "f1", &[-1])]));
    let acc = run(&alloc, &l);
    assert_eq!(count(&acc, AnomalyKind::UnalignedDevice), 4);
    for z in &acc.zones {
        assert_eq!(
            z.resources.as_ref().map(Vec::len),
            Some(1),
            "only cpu in {}",
            z.name
        );
        assert_eq!(
            z.attributes, None,
            "no free-devices attribute for an unaligned-only resource"
        );
    }
    // A device with no NUMA affinity does not make its pod exclusive.
    assert_eq!(acc.pods_with_exclusive, 0);
}

#[test]
fn zero_sizes_are_ignored() {
    let alloc = with_memory(vec![
        mem("memory", 0, &[0]),
        mem("hugepages-1Gi", 0, &[1]),
        mem("memory", GI, &[1]),
    ]);
    let l = one_pod("p", container(&[], vec![mem("memory", 0, &[1])], vec![]));
    let acc = run(&alloc, &l);
    assert!(acc.anomalies.is_empty(), "{:?}", acc.anomalies);
    assert_eq!(get(&acc, "node-0", "memory"), None);
    assert_eq!(get(&acc, "node-1", "hugepages-1Gi"), None);
    assert_eq!(
        get(&acc, "node-1", "memory"),
        triple("8589934592", "1073741824", "1073741824")
    );
}

#[test]
fn overflowing_allocatable_sum_is_a_typed_error() {
    let alloc = with_memory(vec![mem("memory", u64::MAX, &[0]), mem("memory", 1, &[0])]);
    let err =
        account(&machine(), &alloc, &ListPodResourcesResponse::default(), &cfg()).expect_err("overflow");
    match err {
        AccountingError::Overflow { zone, what, .. } => {
            assert_eq!((zone.as_str(), what.as_str()), ("node-0", "memory"))
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn overflowing_used_sum_is_a_typed_error() {
    let err = used_memory_overflow(
        vec![mem("memory", GI, &[0])],
        vec![mem("memory", u64::MAX, &[0]), mem("memory", u64::MAX, &[0])],
    );
    assert_overflow(&err, "summing used");
}

#[test]
fn overflowing_spread_is_a_typed_error() {
    let err = used_memory_overflow(
        vec![mem("memory", GI, &[0]), mem("memory", GI, &[1])],
        vec![mem("memory", u64::MAX, &[1]), mem("memory", u64::MAX, &[0, 1])],
    );
    assert_overflow(&err, "spreading multi-NUMA memory");
}

#[test]
fn values_beyond_i64_are_a_typed_error() {
    // The sum fits u64 but not the signed 64-bit integers every NRT consumer parses into.
    let alloc = with_memory(vec![mem("memory", u64::MAX / 2 + 1, &[0])]);
    let err =
        account(&machine(), &alloc, &ListPodResourcesResponse::default(), &cfg()).expect_err("overflow");
    // Capacity (raised to allocatable, since MemTotal is smaller) is the first value published.
    assert_overflow(&err, "publishing capacity");

    let mut m = machine();
    m.nodes[0].distances.push((5, u64::MAX));
    let err = account(&m, &all_cpus(), &ListPodResourcesResponse::default(), &cfg()).expect_err("overflow");
    assert_overflow(&err, "publishing distance");
    assert!(err.to_string().contains("node-5"), "{err}");
}

#[test]
fn used_beyond_allocatable_is_clamped_and_counted() {
    let mut alloc = AllocatableResourcesResponse {
        cpu_ids: vec![1, 2, 3],
        ..Default::default()
    };
    alloc.memory = vec![mem("memory", 100, &[0])];
    alloc.devices = vec![dev("x.io/nic", "n0", &[0])];
    let l = one_pod(
        "p",
        container(
            &[0, 1, 2, 3, 4],
            vec![mem("memory", 150, &[0]), mem("hugepages-2Mi", 4, &[1])],
            vec![
                dev("x.io/nic", "n0", &[0]),
                dev("x.io/nic", "n1", &[0]),
                dev("x.io/nic", "n2", &[1]),
            ],
        ),
    );
    let acc = run(&alloc, &l);
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "3", "0"));
    assert_eq!(get(&acc, "node-0", "memory"), triple("8589934592", "100", "0"));
    assert_eq!(get(&acc, "node-0", "x.io/nic"), triple("1", "1", "0"));
    // node-1: nothing allocatable at all → the single cpu row; CPU 4, 2Mi pages and n2 are
    // used where none is allocatable.
    assert_eq!(get(&acc, "node-1", "cpu"), triple("4", "0", "0"));
    assert_eq!(count(&acc, AnomalyKind::UsedExceedsAllocatable), 3 + 3);
    for a in &acc.anomalies {
        assert_eq!(a.kind, AnomalyKind::UsedExceedsAllocatable, "{a:?}");
        assert!(!a.detail.is_empty());
    }
}

#[test]
fn capacity_falls_back_to_allocatable() {
    let mut m = machine();
    m.nodes[0].memory_bytes = None;
    m.nodes[1].memory_bytes = Some(10);
    m.nodes[0].hugepages_bytes.clear();
    let alloc = with_memory(vec![
        mem("memory", 100, &[0]),
        mem("memory", 100, &[1]),
        mem("hugepages-2Mi", 4 << 20, &[0]),
        mem("hugepages-2048Ki", 2 << 20, &[1]),
    ]);
    let acc = account(&m, &alloc, &ListPodResourcesResponse::default(), &cfg()).expect("ok");
    assert_eq!(get(&acc, "node-0", "memory"), triple("100", "100", "100"));
    assert_eq!(get(&acc, "node-1", "memory"), triple("100", "100", "100"));
    assert_eq!(
        get(&acc, "node-0", "hugepages-2Mi"),
        triple("4194304", "4194304", "4194304")
    );
    // Same page size spelled differently still finds the machine's pool.
    assert_eq!(
        get(&acc, "node-1", "hugepages-2048Ki"),
        triple("2147483648", "2097152", "2097152")
    );
    assert_eq!(count(&acc, AnomalyKind::AllocatableExceedsCapacity), 1);
    assert_eq!(acc.anomalies.len(), 1);
}

#[test]
fn multi_numa_memory_is_filled_greedily_ascending() {
    let alloc = with_memory(vec![mem("memory", 1000, &[0]), mem("memory", 1000, &[1])]);
    let l = list(vec![
        // Listed first but spread last: exact single-node blocks are known before the split.
        pod(
            "ns",
            "big",
            vec![container(&[], vec![mem("memory", 1500, &[1, 0])], vec![])],
        ),
        pod(
            "ns",
            "small",
            vec![container(&[], vec![mem("memory", 300, &[0])], vec![])],
        ),
    ]);
    let acc = run(&alloc, &l);
    assert_eq!(get(&acc, "node-0", "memory").map(|t| t.2), Some("0".into()));
    assert_eq!(get(&acc, "node-1", "memory").map(|t| t.2), Some("200".into()));
    assert!(acc.anomalies.is_empty(), "{:?}", acc.anomalies);

    // What does not fit anywhere stays on the last node of the group, visible as overcommit.
    let l = one_pod("huge", container(&[], vec![mem("memory", 2500, &[0, 1])], vec![]));
    let acc = run(&alloc, &l);
    assert_eq!(get(&acc, "node-0", "memory").map(|t| t.2), Some("0".into()));
    assert_eq!(get(&acc, "node-1", "memory").map(|t| t.2), Some("0".into()));
    assert_eq!(count(&acc, AnomalyKind::UsedExceedsAllocatable), 1);
}

#[test]
fn multi_numa_allocatable_block_is_split_evenly() {
    let alloc = with_memory(vec![mem("memory", 1001, &[0, 1])]);
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(count(&acc, AnomalyKind::MultiNumaAllocatable), 1);
    assert_eq!(get(&acc, "node-0", "memory").map(|t| t.1), Some("501".into()));
    assert_eq!(get(&acc, "node-1", "memory").map(|t| t.1), Some("500".into()));
}

#[test]
fn unaligned_memory_is_skipped_and_counted() {
    let alloc = with_memory(vec![ContainerMemory {
        memory_type: "memory".into(),
        size: 5,
        topology: None,
    }]);
    let l = one_pod("p", container(&[], vec![mem("memory", 5, &[-1])], vec![]));
    let acc = run(&alloc, &l);
    assert_eq!(count(&acc, AnomalyKind::UnalignedMemory), 2);
    assert_eq!(get(&acc, "node-0", "memory"), None);
}

#[test]
fn pod_level_cpus_are_united_and_pod_memory_preferred() {
    let alloc = with_memory(vec![mem("memory", 1000, &[0])]);
    let mut p = pod(
        "ns",
        "p",
        vec![
            container(&[0, 1], vec![mem("memory", 100, &[0])], vec![]),
            // Shares the pod's pool: empty container-level values.
            container(&[], vec![], vec![]),
        ],
    );
    p.cpu_ids = vec![0, 1, 2, 4];
    p.memory = vec![mem("memory", 400, &[0])];
    let acc = run(&alloc, &list(vec![p]));
    assert_eq!(get(&acc, "node-0", "cpu").map(|t| t.2), Some("1".into()));
    assert_eq!(get(&acc, "node-1", "cpu").map(|t| t.2), Some("3".into()));
    assert_eq!(get(&acc, "node-0", "memory").map(|t| t.2), Some("600".into()));
    assert!(
        acc.anomalies.is_empty(),
        "overlap is by design: {:?}",
        acc.anomalies
    );

    // Pod-level resources alone make the pod exclusive.
    let mut p = pod("ns", "q", vec![container(&[], vec![], vec![])]);
    p.cpu_ids = vec![5];
    let acc = run(&alloc, &list(vec![p]));
    assert_eq!(acc.pods_with_exclusive, 1);
    assert_eq!(acc.fingerprint, Some(fingerprint::compute([("ns", "q")])));
}

#[test]
fn double_assignment_across_pods_counted_once() {
    let alloc = with_devices(vec![dev("x.io/gpu", "g0", &[1]), dev("x.io/gpu", "g1", &[1])]);
    let l = list(vec![
        pod(
            "ns",
            "old",
            vec![container(&[1, 2], vec![], vec![dev("x.io/gpu", "g0", &[1])])],
        ),
        pod(
            "ns",
            "new",
            vec![container(&[2, 3], vec![], vec![dev("x.io/gpu", "g0", &[1])])],
        ),
    ]);
    let acc = run(&alloc, &l);
    assert_eq!(count(&acc, AnomalyKind::DoubleAssignment), 2);
    assert_eq!(get(&acc, "node-0", "cpu").map(|t| t.2), Some("1".into()));
    assert_eq!(get(&acc, "node-1", "x.io/gpu").map(|t| t.2), Some("1".into()));
    assert_eq!(free(&acc, "node-1", "x.io/gpu").as_deref(), Some("g1"));
}

#[test]
fn invalid_resource_names_are_skipped() {
    let mut alloc = with_devices(vec![
        dev("cpu", "x", &[0]),
        dev("", "y", &[0]),
        dev("hugepages-2Mi", "z", &[0]),
    ]);
    alloc.memory = vec![mem("cpu", 5, &[0]), mem("hugepages-", 5, &[0]), mem("", 5, &[0])];
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(count(&acc, AnomalyKind::InvalidResourceName), 6);
    for z in &acc.zones {
        assert_eq!(row_names(z), ["cpu"], "{}", z.name);
    }
}

#[test]
fn invalid_device_ids() {
    let alloc = with_devices(vec![
        dev("x.io/nic", "", &[0]),
        dev("x.io/nic", "a,b", &[0]),
        dev("x.io/nic", " c", &[0]),
        dev("x.io/nic", "d", &[0]),
    ]);
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(count(&acc, AnomalyKind::InvalidDeviceId), 3);
    // Counted, but only readable ids are offered by name.
    assert_eq!(get(&acc, "node-0", "x.io/nic").map(|t| t.1), Some("3".into()));
    assert_eq!(free(&acc, "node-0", "x.io/nic").as_deref(), Some("d"));
}

#[test]
fn machine_inconsistencies_are_typed_errors() {
    let empty = (
        AllocatableResourcesResponse::default(),
        ListPodResourcesResponse::default(),
    );
    let mut m = machine();
    m.nodes[1].id = 0;
    let err = account(&m, &empty.0, &empty.1, &cfg()).expect_err("duplicate node");
    assert!(matches!(err, AccountingError::IndexNumaNode { id: 0 }), "{err}");

    let mut m = machine();
    m.nodes[1].cpus.push(2);
    let err = account(&m, &empty.0, &empty.1, &cfg()).expect_err("cpu on two nodes");
    assert!(
        matches!(
            err,
            AccountingError::IndexCpu {
                cpu: 2,
                first: 0,
                second: 1
            }
        ),
        "{err}"
    );

    // A CPU repeated within one node is harmless.
    let mut m = machine();
    m.nodes[0].cpus.push(0);
    let acc = account(&m, &all_cpus(), &empty.1, &cfg()).expect("ok");
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "4"));
}

#[test]
fn invalid_pod_exclude_glob_is_a_typed_error() {
    let mut c = cfg();
    c.pod_exclude.push(PodExclude {
        namespace_pattern: "[".into(),
        name_pattern: "*".into(),
    });
    let err = account(&machine(), &all_cpus(), &ListPodResourcesResponse::default(), &c).expect_err("glob");
    assert!(
        matches!(&err, AccountingError::CompilePodExclude { pattern, .. } if pattern == "["),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn pod_filters() {
    let l = list(vec![
        pod("keep", "a", vec![container(&[0], vec![], vec![])]),
        pod("other", "b", vec![container(&[1], vec![], vec![])]),
        pod("keep", "dead", vec![container(&[2], vec![], vec![])]),
        pod("keep", "skip-me", vec![container(&[3], vec![], vec![])]),
    ]);
    let mut c = cfg();
    c.watch_namespace = Some("keep".into());
    c.terminal_pods.insert(("keep".into(), "dead".into()));
    c.pod_exclude.push(PodExclude {
        namespace_pattern: "k?ep".into(),
        name_pattern: "skip-*".into(),
    });
    let acc = account(&machine(), &all_cpus(), &l, &c).expect("ok");
    assert_eq!(acc.pods_accounted, 1);
    assert_eq!(get(&acc, "node-0", "cpu").map(|t| t.2), Some("3".into()));
    assert_eq!(acc.fingerprint, Some(fingerprint::compute([("keep", "a")])));

    for all in ["", "*"] {
        c.watch_namespace = Some(all.into());
        let acc = account(&machine(), &all_cpus(), &l, &c).expect("ok");
        assert_eq!(acc.pods_accounted, 2, "{all:?}");
    }
}

#[test]
fn excluded_resources_per_node_and_everywhere() {
    let mut alloc = with_devices(vec![
        dev("x.io/a", "a0", &[0]),
        dev("x.io/b", "b0", &[0]),
        dev("x.io/c", "c0", &[1]),
    ]);
    alloc.memory = vec![mem("hugepages-2Mi", 2 << 20, &[0])];
    let mut c = cfg();
    c.resource_exclude.insert("*".into(), vec!["x.io/a".into()]);
    c.resource_exclude
        .insert("n1".into(), vec!["x.io/b".into(), "hugepages-2Mi".into()]);
    c.resource_exclude
        .insert("other-node".into(), vec!["x.io/c".into()]);
    let acc = account(&machine(), &alloc, &ListPodResourcesResponse::default(), &c).expect("ok");
    let names = |z: usize| -> Vec<String> {
        acc.zones[z]
            .resources
            .iter()
            .flatten()
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(names(0), ["cpu"]);
    assert_eq!(names(1), ["cpu", "x.io/c"]);
    assert_eq!(
        attr_names(acc.zones[0].attributes.as_deref()),
        ["numaplane.io/free-devices.x.io/c"]
    );

    // Excluding cpu removes it everywhere, including the empty-zone row.
    c.resource_exclude.insert("*".into(), vec!["cpu".into()]);
    let acc = account(&machine(), &all_cpus(), &ListPodResourcesResponse::default(), &c).expect("ok");
    assert!(
        acc.zones
            .iter()
            .all(|z| z.resources.as_ref().is_some_and(Vec::is_empty))
    );
}

#[test]
fn rows_and_zones_sorted_by_name() {
    let mut m = machine();
    m.nodes.reverse();
    m.nodes.push(NodeView {
        id: 10,
        distances: vec![(10, 10)],
        ..NodeView::default()
    });
    let mut alloc = with_devices(vec![dev("z.io/last", "z", &[0]), dev("a.io/first", "a", &[0])]);
    alloc.memory = vec![mem("memory", 1, &[0]), mem("hugepages-1Gi", GI, &[0])];
    let acc = account(&m, &alloc, &ListPodResourcesResponse::default(), &cfg()).expect("ok");
    let zones: Vec<&str> = acc.zones.iter().map(|z| z.name.as_str()).collect();
    assert_eq!(zones, ["node-0", "node-1", "node-10"]);
    assert_eq!(
        row_names(&acc.zones[0]),
        ["a.io/first", "cpu", "hugepages-1Gi", "memory", "z.io/last"]
    );
}

#[test]
fn quantities_are_canonical_decimal_si() {
    let alloc = with_memory(vec![mem("memory", 3000, &[0]), mem("memory", 1 << 20, &[1])]);
    let acc = run(&alloc, &ListPodResourcesResponse::default());
    assert_eq!(get(&acc, "node-0", "memory").map(|t| t.1), Some("3k".into()));
    assert_eq!(get(&acc, "node-1", "memory").map(|t| t.1), Some("1048576".into()));
    assert_eq!(
        get(&acc, "node-0", "memory").map(|t| t.0),
        Some("8589934592".into())
    );
}

#[test]
fn nrt_attributes_and_annotations() {
    let mut c = cfg();
    c.topology_manager_policy = "single-numa-node".into();
    c.topology_manager_scope = "pod".into();
    c.max_numa_nodes = Some(16);
    let l = list(vec![pod(
        "default",
        "test-pod-0",
        vec![container(&[5, 7], vec![], vec![])],
    )]);
    let acc = account(&machine(), &all_cpus(), &l, &c).expect("ok");
    let nrt = acc.to_nrt("worker-0");
    assert_eq!(nrt.metadata.name.as_deref(), Some("worker-0"));
    let attrs: Vec<(&str, &str)> = attr_pairs(&nrt);
    assert_eq!(
        attrs,
        [
            ("nodeTopologyPodsFingerprint", "pfp0v001fe53c4dbd2c5f4a0"),
            ("nodeTopologyPodsFingerprintMethod", "with-exclusive-resources"),
            ("topologyManagerScope", "pod"),
            ("topologyManagerPolicy", "single-numa-node"),
            ("topologyManagerMaxNUMANodes", "16"),
        ]
    );
    assert_eq!(
        nrt.topology_policies,
        Some(vec!["SingleNUMANodePodLevel".to_owned()])
    );
    let annotations = nrt.metadata.annotations.clone().expect("annotations");
    assert_eq!(
        annotations.get(nrt::ANNOTATION_FINGERPRINT).map(String::as_str),
        Some("pfp0v001fe53c4dbd2c5f4a0")
    );
    assert_eq!(nrt.zones, acc.zones);

    // Fingerprint disabled; empty TM settings publish the kubelet defaults.
    c.fingerprint_method = None;
    c.topology_manager_policy.clear();
    c.topology_manager_scope.clear();
    c.max_numa_nodes = None;
    let nrt = account(&machine(), &all_cpus(), &l, &c)
        .expect("ok")
        .to_nrt("worker-0");
    let attrs: Vec<(&str, &str)> = attr_pairs(&nrt);
    assert_eq!(
        attrs,
        [
            ("topologyManagerScope", "container"),
            ("topologyManagerPolicy", "none")
        ]
    );
    assert_eq!(nrt.topology_policies, Some(vec!["None".to_owned()]));
    assert_eq!(nrt.metadata.annotations, None);

    // No kubelet configuration source answered: what is not known is left out, what a flag
    // says (the scope here) is still published; the required legacy field says "None".
    c.kubelet_config_unknown = true;
    c.topology_manager_scope = "pod".into();
    let nrt = account(&machine(), &all_cpus(), &l, &c)
        .expect("ok")
        .to_nrt("worker-0");
    assert_eq!(attr_names(nrt.attributes.as_deref()), ["topologyManagerScope"]);
    assert_eq!(nrt.topology_policies, Some(vec!["None".to_owned()]));
}

#[test]
fn fingerprint_methods() {
    let l = list(vec![
        pod("prod", "dpdk-app", vec![container(&[2, 4], vec![], vec![])]),
        pod("prod", "web", vec![container(&[], vec![], vec![])]),
        pod(
            "prod",
            "fpga-user",
            vec![container(&[], vec![], vec![bare("example.com/fpga", &["f0"])])],
        ),
        pod(
            "prod",
            "pinned-mem",
            vec![container(&[], vec![mem("memory", 1, &[1])], vec![])],
        ),
    ]);
    let mut c = cfg();
    let acc = account(&machine(), &all_cpus(), &l, &c).expect("ok");
    assert_eq!(
        acc.fingerprint,
        Some(fingerprint::compute([
            ("prod", "dpdk-app"),
            ("prod", "pinned-mem")
        ]))
    );
    assert_eq!(acc.pods_with_exclusive, 2);
    c.fingerprint_method = Some(Method::All);
    let acc = account(&machine(), &all_cpus(), &l, &c).expect("ok");
    assert_eq!(
        acc.fingerprint,
        Some(fingerprint::compute([
            ("prod", "dpdk-app"),
            ("prod", "web"),
            ("prod", "fpga-user"),
            ("prod", "pinned-mem")
        ]))
    );
    assert_eq!(acc.pods_with_exclusive, 2);
}

#[test]
fn anomaly_kinds_are_distinct_bounded_labels() {
    let labels: BTreeSet<&str> = AnomalyKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(labels.len(), AnomalyKind::ALL.len());
    assert!(
        labels
            .iter()
            .all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
    );
    let acc = run(
        &AllocatableResourcesResponse {
            cpu_ids: vec![0, 0, 99],
            ..Default::default()
        },
        &ListPodResourcesResponse::default(),
    );
    let counts = acc.anomaly_counts();
    assert_eq!(counts.get(&AnomalyKind::DuplicateCpu), Some(&1));
    assert_eq!(counts.get(&AnomalyKind::UnknownCpu), Some(&1));
    assert_eq!(AnomalyKind::UnknownCpu.to_string(), "unknown_cpu");
}

#[test]
fn machine_view_from_topology_machine() {
    let machine = Machine {
        numa_nodes: vec![
            MachineNode {
                id: 0,
                cpus: vec![0, 1],
                cores: vec![vec![0, 1]],
                memory_bytes: 8 * GI,
                hugepages: vec![
                    HugepagePool {
                        page_size_bytes: 2 << 20,
                        count: 512,
                    },
                    HugepagePool {
                        page_size_bytes: GI,
                        count: 2,
                    },
                ],
                distances: vec![Distance { node: 0, value: 10 }, Distance { node: 2, value: 21 }],
            },
            MachineNode {
                id: 2,
                cpus: vec![],
                cores: vec![],
                memory_bytes: 0,
                hugepages: vec![],
                distances: vec![],
            },
        ],
        pci_devices: vec![],
        pci_locality: vec![numaplane::pci_locality::PciBusRange {
            domain: 0,
            first_bus: 0,
            last_bus: 0xff,
            numa_node: 2,
        }],
    };
    let view = MachineView::from(&machine);
    assert_eq!(view.pci_locality, machine.pci_locality);
    assert_eq!(
        view.nodes[0],
        NodeView {
            id: 0,
            cpus: vec![0, 1],
            memory_bytes: Some(8 * GI),
            hugepages_bytes: BTreeMap::from([("hugepages-1Gi".into(), 2 * GI), ("hugepages-2Mi".into(), GI)]),
            distances: vec![(0, 10), (2, 21)],
            cores: vec![vec![0, 1]],
        }
    );
    assert_eq!(
        view.nodes[1],
        NodeView {
            id: 2,
            ..NodeView::default()
        }
    );
}

#[test]
fn hostile_input_never_panics() {
    // A grab bag of everything at once, including extreme values, must still produce zones.
    let mut alloc = AllocatableResourcesResponse {
        cpu_ids: vec![i64::MIN, -1, 0, i64::MAX, 0],
        memory: vec![mem("memory", 1, &[i64::MIN, i64::MAX, -1, 0, 0])],
        devices: vec![dev("x.io/d", "d", &[i64::MIN, i64::MAX, 0, 0])],
    };
    alloc.devices.push(ContainerDevices {
        resource_name: "x.io/d".into(),
        device_ids: vec![],
        topology: topo(&[0]),
    });
    let mut p = pod(
        "",
        "",
        vec![container(
            &[i64::MIN, i64::MAX, 0],
            vec![mem("memory", u64::MAX / 4, &[0, 1])],
            vec![],
        )],
    );
    p.cpu_ids = vec![0, 0, -3];
    let acc = account(&machine(), &alloc, &list(vec![p.clone(), p]), &cfg()).expect("no overflow here");
    assert_eq!(acc.zones.len(), 2);
    assert!(!acc.anomalies.is_empty());
}

#[test]
fn cluster_shared_resources_publish_the_ids_held_here() {
    let lic = "example.com/lic";
    let alloc = AllocatableResourcesResponse {
        devices: vec![
            dev(lic, "lic-0", &[0]),
            dev(lic, "lic-1", &[0]),
            dev(lic, "lic-2", &[1]),
        ],
        ..all_cpus()
    };
    let l = list(vec![
        pod(
            "ns",
            "a",
            vec![container(&[], vec![], vec![dev(lic, "lic-2", &[1])])],
        ),
        pod(
            "ns",
            "b",
            vec![container(&[], vec![], vec![dev(lic, "lic-0", &[0])])],
        ),
    ]);
    let mut c = cfg();
    c.cluster_shared = [lic.to_owned(), "example.com/none".to_owned()].into();
    let acc = account(&machine(), &alloc, &l, &c).expect("accounting succeeds");
    let nrt = acc.to_nrt("n1");
    let held = nrt.cluster_held();
    assert_eq!(held[lic], ["lic-0", "lic-2"]);
    // Declared but held nowhere: present and empty, so readers know it is cluster-shared.
    assert!(held["example.com/none"].is_empty());
    // Without the setting nothing is published.
    assert!(run(&alloc, &l).to_nrt("n1").cluster_held().is_empty());
    assert_eq!(free(&acc, "node-0", lic).as_deref(), Some("lic-1"));
}

#[test]
fn a_used_device_without_topology_in_list_is_charged_where_allocatable_places_it() {
    let gpu = "example.com/gpu";
    let alloc = AllocatableResourcesResponse {
        devices: vec![dev(gpu, "g0", &[1]), dev(gpu, "g1", &[1])],
        ..all_cpus()
    };
    // The List entry carries no topology (the kubelet omits it for some plugins).
    let untopologized = bare(gpu, &["g0"]);
    let acc = run(&alloc, &one_pod("a", container(&[], vec![], vec![untopologized])));
    assert_devices(&acc, "node-1", gpu, ("2", "2", "1"), "g1");
    assert_eq!(
        count(&acc, AnomalyKind::UnalignedDevice),
        0,
        "{:?}",
        acc.anomalies
    );
    // A device allocatable does not know falls back to the entry's topology (none: no zone).
    let unknown = bare(gpu, &["g9"]);
    let acc = run(&alloc, &one_pod("b", container(&[], vec![], vec![unknown])));
    assert_eq!(get(&acc, "node-1", gpu), triple("2", "2", "2"));
    assert_eq!(count(&acc, AnomalyKind::UnalignedDevice), 1);
}

#[test]
fn smt_width_free_cores_and_resource_manager_settings_are_published() {
    let mut m = machine();
    m.nodes[0].cores = vec![vec![0, 1], vec![2, 3]];
    m.nodes[1].cores = vec![vec![4, 5], vec![6, 7]];
    // CPU 7 is reserved (not allocatable); a pod holds CPU 0.
    let alloc = AllocatableResourcesResponse {
        cpu_ids: (0..7).collect(),
        ..Default::default()
    };
    let l = one_pod("a", container(&[0], vec![], vec![]));
    let mut c = cfg();
    c.resource_managers = Some(ResourceManagers {
        cpu_manager_policy: "static".into(),
        cpu_manager_policy_options: [
            ("full-pcpus-only".to_owned(), "true".to_owned()),
            ("align-by-socket".to_owned(), "false".to_owned()),
        ]
        .into(),
        reserved_cpus: Some("7".into()),
        memory_manager_policy: "Static".into(),
        topology_manager_policy_options: [("spread-evenly".to_owned(), "true".to_owned())].into(),
    });
    let nrt = account(&m, &alloc, &l, &c).unwrap().to_nrt("n1");
    for (name, value) in [
        (attr::CPU_MANAGER_POLICY, "static"),
        (
            attr::CPU_MANAGER_POLICY_OPTIONS,
            "align-by-socket=false,full-pcpus-only=true",
        ),
        (attr::RESERVED_CPUS, "7"),
        (attr::MEMORY_MANAGER_POLICY, "Static"),
        (attr::THREADS_PER_CORE, "2"),
        (attr::TOPOLOGY_MANAGER_POLICY_OPTIONS, "spread-evenly=true"),
    ] {
        assert_eq!(nrt.attribute(name), Some(value), "{name}");
    }
    let free_cores = |zone: &str| zone_attribute(&nrt, zone, attr::FREE_CORES);
    // node-0: core {0,1} has a held CPU; node-1: core {6,7} has a reserved one.
    assert_eq!(free_cores("node-0").as_deref(), Some("1"));
    assert_eq!(free_cores("node-1").as_deref(), Some("1"));
    // Without the kubelet config and the core layout, nothing is claimed.
    let plain = run(&alloc, &l).to_nrt("n1");
    assert_eq!(plain.attribute(attr::CPU_MANAGER_POLICY), None);
    assert_eq!(plain.attribute(attr::THREADS_PER_CORE), None);
    assert_eq!(plain.attribute(attr::PCI_LOCALITY), None);
}

#[test]
fn pci_locality_is_published_in_its_wire_form_and_reads_back() {
    use numaplane::pci_locality::PciBusRange;
    let mut m = machine();
    m.pci_locality = vec![
        PciBusRange {
            domain: 0,
            first_bus: 0x00,
            last_bus: 0x7f,
            numa_node: 0,
        },
        PciBusRange {
            domain: 0,
            first_bus: 0x80,
            last_bus: 0xff,
            numa_node: 1,
        },
    ];
    let nrt = account(&m, &all_cpus(), &list(vec![]), &cfg())
        .unwrap()
        .to_nrt("n1");
    assert_eq!(
        nrt.attribute(attr::PCI_LOCALITY),
        Some("0000:00-7f=0,0000:80-ff=1")
    );
    assert_eq!(nrt.pci_locality(), Some(Ok(m.pci_locality.clone())));
    // The zones, what an NRT consumer that knows nothing of it reads, are unchanged.
    let plain = account(&machine(), &all_cpus(), &list(vec![]), &cfg())
        .unwrap()
        .to_nrt("n1");
    assert_eq!(nrt.zones, plain.zones);
}

#[test]
fn dra_claims_are_kept_per_driver_and_charged_to_no_zone() {
    use numaplane::proto::podresources::{ClaimResource, DynamicResource};
    let claim = |name: &str, devices: &[&str]| DynamicResource {
        claim_name: name.into(),
        claim_namespace: "ns".into(),
        claim_resources: devices
            .iter()
            .map(|d| ClaimResource {
                driver_name: "gpu.example.com".into(),
                pool_name: "node-a".into(),
                device_name: (*d).into(),
                ..Default::default()
            })
            .collect(),
    };
    let mut app = container(&[], vec![], vec![]);
    app.dynamic_resources = vec![claim("gpus", &["gpu-0", "gpu-1"])];
    // A second container sharing the same claim: the devices count once.
    let mut sidecar = container(&[], vec![], vec![]);
    sidecar.name = "sidecar".into();
    sidecar.dynamic_resources = vec![claim("gpus", &["gpu-0", "gpu-1"])];
    let with = run(&all_cpus(), &list(vec![pod("ns", "a", vec![app, sidecar])]));
    assert_eq!(with.dra_devices.get("gpu.example.com"), Some(&2));
    // The zones are exactly those of the same pod without claims.
    let without = run(&all_cpus(), &one_pod("a", container(&[], vec![], vec![])));
    assert_eq!(with.zones, without.zones);
    assert!(with.anomalies.is_empty(), "{:?}", with.anomalies);
}

/// Allocatable: all CPUs, and GPUs g0, g1 on node 0 and g2, g3 on node 1.
fn gpus() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: (0..8).collect(),
        devices: vec![
            ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["g0".into(), "g1".into()],
                topology: topo(&[0]),
            },
            ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["g2".into(), "g3".into()],
                topology: topo(&[1]),
            },
        ],
        ..Default::default()
    }
}

fn pod_key() -> (String, String) {
    ("ns".to_owned(), "p".to_owned())
}

/// Pod ns/p whose one container has CPU `cpu` and GPU `gpu` on NUMA node `node`.
fn gpu_pod(cpu: i64, gpu: &str, node: i64) -> ListPodResourcesResponse {
    one_pod(
        "p",
        container(&[cpu], vec![], vec![dev("nvidia.com/gpu", gpu, &[node])]),
    )
}

/// The default config, with `held` kept by ns/p's init containers beyond what List shows.
fn holding(held: Held) -> AccountingConfig {
    let mut c = cfg();
    c.held_beyond_list.insert(pod_key(), held);
    c
}

#[test]
fn what_init_containers_hold_by_checkpoint_is_used_and_not_free() {
    // kubernetes#126765: List shows the app container (CPU 1, g0); the checkpoint shows the
    // init container also kept CPU 2 and g1.
    let l = gpu_pod(1, "g0", 0);
    let mut c = holding(Held {
        cpu_ids: BTreeSet::from([2]),
        device_ids: BTreeMap::from([(
            "nvidia.com/gpu".to_owned(),
            BTreeMap::from([("g1".to_owned(), vec![0])]),
        )]),
        ..Held::default()
    });
    c.held_sources = Some(Sources {
        cpu: crate::init_held::Source::Checkpoint,
        devices: crate::init_held::Source::Checkpoint,
        memory: crate::init_held::Source::Unknown,
    });
    let acc = account(&machine(), &gpus(), &l, &c).unwrap();
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "2"));
    assert_devices(&acc, "node-0", "nvidia.com/gpu", ("2", "2", "0"), "");
    assert_eq!(count(&acc, AnomalyKind::DoubleAssignment), 0);
    let source = acc
        .attributes
        .iter()
        .find(|a| a.name == attr::INIT_HELD_SOURCE)
        .unwrap();
    assert_eq!(source.value, "cpu=checkpoint,devices=checkpoint,memory=none");
    // The fingerprint is List's, as the scheduler computes it.
    assert_eq!(
        acc.fingerprint,
        account(&machine(), &gpus(), &l, &cfg()).unwrap().fingerprint
    );
}

#[test]
fn what_init_containers_hold_by_count_is_charged_next_to_the_pod() {
    // App container on node 1 (CPU 5, g2); the spec says init containers keep 2 CPUs and 1 GPU.
    let l = gpu_pod(5, "g2", 1);
    let mut c = holding(Held {
        cpu_count: 2,
        device_counts: BTreeMap::from([("nvidia.com/gpu".to_owned(), 1)]),
        ..Held::default()
    });
    let acc = account(&machine(), &gpus(), &l, &c).unwrap();
    assert_eq!(get(&acc, "node-1", "cpu"), triple("4", "4", "1"));
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "4"));
    assert_devices(&acc, "node-1", "nvidia.com/gpu", ("2", "2", "0"), "");
    assert_eq!(free(&acc, "node-0", "nvidia.com/gpu").as_deref(), Some("g0,g1"));

    // More than is free: everything free is charged and the shortfall is an anomaly.
    c = holding(Held {
        cpu_count: 10,
        ..Held::default()
    });
    let acc = account(&machine(), &gpus(), &l, &c).unwrap();
    assert_eq!(get(&acc, "node-0", "cpu"), triple("4", "4", "0"));
    assert_eq!(get(&acc, "node-1", "cpu"), triple("4", "4", "0"));
    assert_eq!(count(&acc, AnomalyKind::UsedExceedsAllocatable), 1);
}

#[test]
fn memory_groups_read_from_the_checkpoint_are_published_in_the_shared_format() {
    let mut c = cfg();
    let without = account(&machine(), &all_cpus(), &list(vec![]), &c).unwrap();
    assert!(
        without.attributes.iter().all(|a| a.name != attr::MEMORY_GROUPS),
        "unknown: absent"
    );
    c.memory_groups = Some(vec![vec![1, 0], vec![3]]);
    let acc = account(&machine(), &all_cpus(), &list(vec![]), &c).unwrap();
    let value = &acc
        .attributes
        .iter()
        .find(|a| a.name == attr::MEMORY_GROUPS)
        .unwrap()
        .value;
    assert_eq!(
        numaplane::nrt::split_memory_groups(value),
        Ok(vec![vec![0, 1], vec![3]])
    );
}

#[test]
fn devices_without_numa_are_published_as_a_node_attribute_with_the_free_count_and_ids() {
    let (gpu, fpga) = ("example.com/gpu", "example.com/fpga");
    let alloc = AllocatableResourcesResponse {
        devices: vec![
            // A mixed resource: one GPU on node 0, two without NUMA node (one reported with
            // the kubelet's negative "none").
            dev(gpu, "g0", &[0]),
            bare(gpu, &["g8"]),
            dev(gpu, "g9", &[-1]),
            // A resource whose devices have no NUMA node at all.
            bare(fpga, &["f0", "f1", "0000:3b:00.0"]),
            // A NUMA node the machine lacks is an anomaly, not "without NUMA node".
            dev(gpu, "g7", &[5]),
        ],
        ..all_cpus()
    };
    let l = one_pod(
        "a",
        container(&[], vec![], vec![bare(gpu, &["g9"]), bare(fpga, &["f1"])]),
    );
    let nrt = run(&alloc, &l).to_nrt("n1");
    let got = nrt.devices_without_numa();
    let expect = |free: u64, ids: &[&str]| {
        Ok(nrt::DevicesWithoutNuma {
            free,
            ids: ids.iter().map(|&i| i.to_owned()).collect(),
        })
    };
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[gpu], expect(1, &["g8"]));
    assert_eq!(got[fpga], expect(2, &["0000:3b:00.0", "f0"]));
    // The aligned GPU stays in its zone; the others are in none.
    assert_eq!(get_nrt_zone_count(&nrt, "node-0", gpu), Some("1".to_owned()));
    assert_eq!(get_nrt_zone_count(&nrt, "node-1", gpu), None);
    // All used: still published, with 0, so the scheduler knows they are used up.
    let l = one_pod(
        "a",
        container(&[], vec![], vec![bare(fpga, &["f0", "f1", "0000:3b:00.0"])]),
    );
    let got = run(&alloc, &l).to_nrt("n1").devices_without_numa();
    assert_eq!(got[fpga], expect(0, &[]));
    // Without such devices nothing is published.
    let alloc = AllocatableResourcesResponse {
        devices: vec![dev(gpu, "g0", &[0])],
        ..all_cpus()
    };
    assert!(
        run(&alloc, &list(vec![]))
            .to_nrt("n1")
            .devices_without_numa()
            .is_empty()
    );
}

/// Allocatable count of `resource` in `zone` of a built NRT.
/// Attribute `name` of `zone` in a published NRT.
fn zone_attribute(nrt: &NodeResourceTopology, zone: &str, name: &str) -> Option<String> {
    nrt.zones
        .iter()
        .find(|z| z.name == zone)
        .and_then(|z| z.attribute(name))
        .map(str::to_owned)
}

fn get_nrt_zone_count(nrt: &NodeResourceTopology, zone: &str, resource: &str) -> Option<String> {
    let z = nrt.zones.iter().find(|z| z.name == zone)?;
    let r = z.resources.as_ref()?.iter().find(|r| r.name == resource)?;
    Some(r.allocatable.0.clone())
}

#[test]
fn node_level_resources_are_published_only_when_the_node_is_known() {
    let gpu = "example.com/gpu";
    let alloc = AllocatableResourcesResponse {
        devices: vec![dev(gpu, "g0", &[0])],
        ..all_cpus()
    };
    // No Node view: no promise.
    assert_eq!(
        run(&alloc, &list(vec![])).to_nrt("n1").node_level_resources(),
        None
    );
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
    let mut c = cfg();
    c.node_level = Some(crate::allocatable_follow::NodeLevelInput {
        // The GPU has devices (in a zone); the dongle has none; the NIC is awaited; the FPGA
        // is excluded from the object, so it is named too.
        node_extended: names(&[gpu, "example.com/dongle", "example.com/nic", "example.com/fpga"]),
        withhold: names(&["example.com/nic"]),
    });
    c.resource_exclude = BTreeMap::from([(
        crate::accounting::EXCLUDE_ALL_NODES.to_owned(),
        vec!["example.com/fpga".to_owned()],
    )]);
    let nrt = account(&machine(), &alloc, &list(vec![]), &c)
        .unwrap()
        .to_nrt("n1");
    assert_eq!(
        nrt.node_level_resources(),
        Some(vec![
            "example.com/dongle".to_owned(),
            "example.com/fpga".to_owned()
        ])
    );
    // After every other attribute: the extensions' order stays RTE's, then ours.
    assert_eq!(
        nrt.attributes.as_ref().unwrap().last().unwrap().name,
        nrt::attr::NODE_LEVEL_RESOURCES
    );
}

/// A ResourceSlice of `driver`, pool `pool` at `generation`, with `devices` (name, attributes
/// as JSON).
fn slice(
    driver: &str,
    pool: &str,
    generation: i64,
    devices: serde_json::Value,
) -> k8s_openapi::api::resource::v1::ResourceSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{pool}-{driver}-{generation}")},
        "spec": {
            "driver": driver,
            "nodeName": "n1",
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }
    }))
    .expect("a valid slice")
}

fn claim(
    name: &str,
    driver: &str,
    pool: &str,
    devices: &[&str],
) -> numaplane::proto::podresources::DynamicResource {
    numaplane::proto::podresources::DynamicResource {
        claim_name: name.into(),
        claim_namespace: "ns".into(),
        claim_resources: devices
            .iter()
            .map(|d| numaplane::proto::podresources::ClaimResource {
                driver_name: driver.into(),
                pool_name: pool.into(),
                device_name: (*d).into(),
                ..Default::default()
            })
            .collect(),
    }
}

#[test]
fn dra_devices_are_counted_per_zone_from_every_numa_source_and_the_claims() {
    let gpu = "gpu.example.com";
    let numa = |n: i64| serde_json::json!({"resource.kubernetes.io/numaNode": {"int": n}});
    let slices = vec![
        slice(
            gpu,
            "n1",
            2,
            serde_json::json!([
                {"name": "gpu-0", "attributes": numa(0)},
                {"name": "gpu-1", "attributes": numa(0)},
                {"name": "gpu-2", "attributes": numa(1)},
                // Through the node's PCI locality.
                {"name": "gpu-3", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:af:00.0"}}},
                // No source places it.
                {"name": "gpu-4"},
                // A NUMA attribute that holds no id: an anomaly, counted without NUMA node.
                {"name": "gpu-5", "attributes": {"resource.kubernetes.io/numaNode": {"string": "one"}}},
                // A NUMA node this machine does not have.
                {"name": "gpu-6", "attributes": numa(7)},
            ]),
        ),
        // An older generation of the pool: ignored, as kube-scheduler ignores it.
        slice(
            gpu,
            "n1",
            1,
            serde_json::json!([{"name": "gpu-9", "attributes": numa(0)}]),
        ),
        // dranet's own attribute, a built-in default.
        slice(
            "dra.net",
            "n1",
            1,
            serde_json::json!([{"name": "eth1", "attributes": {"dra.net/numaNode": {"int": 1}}}]),
        ),
    ];
    let mut m = machine();
    m.pci_locality = numaplane::pci_locality::split_pci_locality("0000:00-7f=0,0000:80-ff=1").unwrap();
    let mut app = container(&[], vec![], vec![]);
    app.dynamic_resources = vec![
        claim("gpus", gpu, "n1", &["gpu-0", "gpu-2", "gpu-4"]),
        // Not in this node's slices (a slice shared by several nodes): held, no NUMA node.
        claim("remote", gpu, "shared-pool", &["gpu-x"]),
        // An old kubelet's entry without names: an anomaly, not counted.
        claim("old", "", "", &[""]),
    ];
    let mut sidecar = container(&[], vec![], vec![]);
    sidecar.name = "sidecar".into();
    sidecar.dynamic_resources = vec![claim("gpus", gpu, "n1", &["gpu-0", "gpu-2", "gpu-4"])];
    let mut c = cfg();
    c.dra = Some(DraInputs {
        slices,
        driver_attributes: numaplane::device_numa::default_driver_numa_attributes(),
    });
    let l = list(vec![pod("ns", "a", vec![app, sidecar])]);
    let acc = account(&m, &all_cpus(), &l, &c).unwrap();

    let count = |free, total| nrt::DraDeviceCount { free, total };
    let dz = acc.dra_zones.clone().unwrap();
    assert_eq!(
        dz.by_numa,
        BTreeMap::from([
            (0, BTreeMap::from([(gpu.to_owned(), count(1, 2))])),
            (
                1,
                BTreeMap::from([(gpu.to_owned(), count(1, 2)), ("dra.net".to_owned(), count(1, 1))])
            ),
        ])
    );
    // gpu-4 (held), gpu-5, gpu-6 and the remote gpu-x (held).
    assert_eq!(dz.without_numa, BTreeMap::from([(gpu.to_owned(), count(2, 4))]));
    let counts = acc.anomaly_counts();
    assert_eq!(counts.get(&AnomalyKind::DraDeviceNuma), Some(&1));
    assert_eq!(counts.get(&AnomalyKind::DraClaimUnidentified), Some(&1));
    assert_eq!(counts.get(&AnomalyKind::UnknownNuma), Some(&1));
    let detail = |kind| {
        acc.anomalies
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| a.detail.clone())
            .unwrap()
    };
    assert!(detail(AnomalyKind::DraDeviceNuma).contains("gpu-5"));
    assert!(detail(AnomalyKind::DraClaimUnidentified).contains("ns/a"));

    // Published as zone attributes and one node attribute; the resources are untouched.
    let nrt = acc.to_nrt("n1");
    let zone_attr = |zone: &str| zone_attribute(&nrt, zone, attr::DRA_DEVICES);
    assert_eq!(zone_attr("node-0").as_deref(), Some("gpu.example.com=1/2"));
    assert_eq!(
        zone_attr("node-1").as_deref(),
        Some("dra.net=1/1,gpu.example.com=1/2")
    );
    assert_eq!(
        nrt.attribute(attr::DRA_DEVICES_WITHOUT_NUMA),
        Some("gpu.example.com=2/4")
    );
    let without = account(&m, &all_cpus(), &l, &cfg()).unwrap();
    assert_eq!(without.dra_zones, None);
    let strip = |zones: &[nrt::Zone]| {
        zones
            .iter()
            .map(|z| (z.name.clone(), z.resources.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&acc.zones), strip(&without.zones));
    assert!(
        without
            .to_nrt("n1")
            .zones
            .iter()
            .all(|z| z.attribute(attr::DRA_DEVICES).is_none())
    );
}
