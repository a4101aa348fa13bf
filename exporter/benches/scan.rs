//! Scan cost: accounting plus object build for an 8-NUMA, 512-CPU node with 500 pods and 128
//! devices (a large GPU server), on the machine loaded by hwloc from the repository's
//! 8-NUMA fixture.
//!
//! `cargo bench -p numaplane-exporter --bench scan`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use numaplane_exporter::accounting::{AccountingConfig, MachineView};
use numaplane_exporter::scan;
use numaplane_topology::Machine;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../topology/tests/fixtures/8numa-512cpu.xml"
);
const GIB: u64 = 1 << 30;

fn topo(node: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: node }],
    })
}

fn inputs(machine: &Machine) -> (AllocatableResourcesResponse, ListPodResourcesResponse) {
    let mut alloc = AllocatableResourcesResponse::default();
    for node in &machine.numa_nodes {
        let id = i64::from(node.id);
        // First CPU of every node reserved, as with --reserved-cpus.
        alloc
            .cpu_ids
            .extend(node.cpus.iter().skip(1).map(|&c| i64::from(c)));
        alloc.memory.push(ContainerMemory {
            memory_type: "memory".into(),
            size: node.memory_bytes.saturating_sub(2 * GIB),
            topology: topo(id),
        });
        alloc.memory.push(ContainerMemory {
            memory_type: "hugepages-1Gi".into(),
            size: 8 * GIB,
            topology: topo(id),
        });
        for d in 0..16 {
            let resource = if d < 8 {
                "example.com/gpu"
            } else {
                "example.com/nic"
            };
            alloc.devices.push(ContainerDevices {
                resource_name: resource.into(),
                device_ids: vec![format!("dev-{id}-{d}")],
                topology: topo(id),
            });
        }
    }
    assert_eq!(alloc.devices.len(), 128);
    let numa: Vec<_> = machine
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.cpus.clone()))
        .collect();
    let mut pods = Vec::new();
    for p in 0..500usize {
        let (id, cpus) = &numa[p % numa.len()];
        let slot = p / numa.len();
        let mut c = ContainerResources {
            name: "app".into(),
            // 500 pods on 8 nodes of 64 CPUs: most pods hold one exclusive CPU.
            cpu_ids: cpus
                .get(1 + slot)
                .map(|&cpu| vec![i64::from(cpu)])
                .unwrap_or_default(),
            memory: vec![ContainerMemory {
                memory_type: "memory".into(),
                size: GIB,
                topology: topo(i64::from(*id)),
            }],
            ..Default::default()
        };
        if slot < 16 {
            c.devices.push(ContainerDevices {
                resource_name: if slot < 8 {
                    "example.com/gpu"
                } else {
                    "example.com/nic"
                }
                .into(),
                device_ids: vec![format!("dev-{id}-{slot}")],
                topology: topo(i64::from(*id)),
            });
        }
        pods.push(PodResources {
            name: format!("pod-{p}"),
            namespace: format!("ns-{}", p % 20),
            containers: vec![c],
            ..Default::default()
        });
    }
    (alloc, ListPodResourcesResponse { pod_resources: pods })
}

fn bench(c: &mut Criterion) {
    let machine = Machine::from_xml_file(std::path::Path::new(FIXTURE)).unwrap();
    assert_eq!(machine.numa_nodes.len(), 8);
    assert_eq!(
        machine.numa_nodes.iter().map(|n| n.cpus.len()).sum::<usize>(),
        512
    );
    let view = MachineView::from(&machine);
    let (alloc, list) = inputs(&machine);
    let cfg = AccountingConfig {
        node_name: "bench".into(),
        ..Default::default()
    };
    let (acc, nrt) = scan::build(&view, &alloc, &list, &cfg).unwrap();
    assert_eq!(acc.pods_accounted, 500);
    assert!(acc.anomalies.is_empty(), "{:?}", acc.anomalies.first());
    assert_eq!(nrt.zones.len(), 8);
    c.bench_function("scan_8numa_512cpu_500pods_128devices", |b| {
        b.iter(|| scan::build(black_box(&view), black_box(&alloc), black_box(&list), &cfg).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
