//! Turning an hwloc topology into the [`Machine`] model.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes};
use hwlocality::object::distance::DistancesKind;
use hwlocality::object::types::{BridgeType, ObjectType};
use hwlocality::topology::builder::{BuildFlags, TopologyBuilder, TypeFilter};

use crate::pci::{class_name, is_modelled_class, normalize_locality};
use crate::{Distance, HugepagePool, Machine, NumaNode, PciBusRange, PciDevice, TopologyError, XmlOrigin};

/// Largest page size still treated as a base page rather than a hugepage (arm64 64K kernels).
const MAX_BASE_PAGE_BYTES: u64 = 64 << 10;

/// Name hwloc's Linux backend gives the SLIT matrix.
const SLIT_MATRIX_NAME: &str = "NUMALatency";

pub(crate) fn from_system() -> Result<Machine, TopologyError> {
    let topology = configured_builder()?
        .build()
        .map_err(|source| TopologyError::DiscoverSystem { source })?;
    machine_from_topology(&topology, "this host", Some(Path::new(SYSFS_NODE_DIR)))
}

pub(crate) fn from_xml(xml: &str, origin: XmlOrigin) -> Result<Machine, TopologyError> {
    let builder = configured_builder()?
        .from_xml(xml)
        .map_err(|source| TopologyError::ParseXml {
            origin: origin.clone(),
            source,
        })?;
    let topology = builder.build().map_err(|source| TopologyError::LoadXml {
        origin: origin.clone(),
        source,
    })?;
    machine_from_topology(&topology, &origin.to_string(), None)
}

/// Builder settings shared by every source, so a host and its XML export give the same model.
fn configured_builder() -> Result<TopologyBuilder, TopologyError> {
    // The exporter runs in a pod whose cgroup may exclude CPUs and nodes (e.g. CPUs pinned to
    // Guaranteed pods by the static CPU manager); the model must describe the whole machine.
    let builder = Topology::builder()
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|source| TopologyError::ConfigureDiscovery {
            setting: "include disallowed CPUs and nodes",
            source: Box::new(source),
        })?;
    // hwloc drops every I/O object by default; "important" keeps GPUs, NICs, storage and
    // accelerators with their locality but not the hundreds of chipset functions.
    let builder = builder
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|source| TopologyError::ConfigureDiscovery {
            setting: "keep important I/O objects",
            source: Box::new(source),
        })?;
    // Every bridge, also those without an important device below: the PCI locality must cover
    // each host bridge's buses, whatever class the devices there have.
    builder
        .with_type_filter(ObjectType::Bridge, TypeFilter::KeepAll)
        .map_err(|source| TopologyError::ConfigureDiscovery {
            setting: "keep all PCI bridges",
            source: Box::new(source),
        })
}

/// What the model needs to know about one hwloc NUMA node.
struct NodeFacts {
    id: u32,
    cpuset: BTreeSet<u32>,
    /// Number of ancestors: a deeper attachment means closer to its CPUs.
    attach_depth: usize,
    memory_bytes: u64,
    hugepages: Vec<HugepagePool>,
}

/// Where Linux describes NUMA nodes (`node<N>/distance`).
const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";

/// Gives every node without distances (hwloc reports no matrix on one-node machines) its
/// kernel row from `sysfs_node_dir` when that can be read and matches the node list, as RTE and
/// NFD read it. `nodes` sorted by id. Without a row the distances stay unknown (empty).
fn fill_missing_distances(nodes: &mut [NumaNode], sysfs_node_dir: Option<&Path>) {
    let Some(dir) = sysfs_node_dir else { return };
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    for node in nodes.iter_mut().filter(|n| n.distances.is_empty()) {
        if let Some(row) = read_sysfs_distances(dir, node.id, &ids) {
            node.distances = row;
        }
    }
}

/// `node<id>/distance`: one value per online node, in ascending id order.
fn read_sysfs_distances(dir: &Path, id: u32, ids: &[u32]) -> Option<Vec<Distance>> {
    let path = dir.join(format!("node{id}/distance"));
    let text = std::fs::read_to_string(&path).ok()?;
    let values: Option<Vec<u64>> = text.split_whitespace().map(|v| v.parse().ok()).collect();
    match values {
        Some(values) if values.len() == ids.len() => Some(
            ids.iter()
                .zip(values)
                .map(|(&node, value)| Distance { node, value })
                .collect(),
        ),
        _ => {
            tracing::debug!(path = %path.display(), "kernel distance row unusable; distances unknown");
            None
        }
    }
}

fn machine_from_topology(
    topology: &Topology,
    source: &str,
    sysfs_node_dir: Option<&Path>,
) -> Result<Machine, TopologyError> {
    let facts = topology
        .objects_with_type(ObjectType::NUMANode)
        .map(node_facts)
        .collect::<Result<Vec<_>, _>>()?;

    let cpu_node = assign_cpus(topology, &facts)?;
    let mut cores = group_cores(topology, &cpu_node)?;
    let mut distances = read_distances(topology)?;

    let mut numa_nodes: Vec<NumaNode> = facts
        .into_iter()
        .map(|node| {
            let cpus: Vec<u32> = cpu_node
                .iter()
                .filter(|(_, owner)| **owner == node.id)
                .map(|(cpu, _)| *cpu)
                .collect();
            NumaNode {
                id: node.id,
                cpus,
                cores: cores.remove(&node.id).unwrap_or_default(),
                memory_bytes: node.memory_bytes,
                hugepages: node.hugepages,
                distances: distances.remove(&node.id).unwrap_or_default(),
            }
        })
        .collect();
    numa_nodes.sort_by_key(|node| node.id);
    fill_missing_distances(&mut numa_nodes, sysfs_node_dir);

    let pci_devices = read_pci_devices(topology)?;
    let pci_locality = read_pci_locality(topology)?;

    if numa_nodes.iter().all(|node| node.distances.is_empty()) {
        tracing::info!(source, "no NUMA distances reported; node distances left empty");
    }
    if numa_nodes.iter().all(|node| node.hugepages.is_empty()) {
        tracing::debug!(
            source,
            "no hugepage pool with pages on any NUMA node; hugepages left empty"
        );
    }

    Ok(Machine {
        numa_nodes,
        pci_devices,
        pci_locality,
    })
}

fn node_facts(object: &TopologyObject) -> Result<NodeFacts, TopologyError> {
    let id = os_index(object, "NUMA node")?;
    let cpuset = match object.cpuset() {
        Some(set) => set
            .iter_set()
            .map(|cpu| to_u32(usize::from(cpu), "CPU index"))
            .collect::<Result<_, _>>()?,
        None => BTreeSet::new(),
    };
    let (memory_bytes, hugepages) = match object.attributes() {
        Some(ObjectAttributes::NUMANode(attributes)) => {
            let page_types: Vec<(u64, u64)> = attributes
                .page_types()
                .iter()
                .map(|page| (page.size().get(), page.count()))
                .collect();
            (
                attributes.local_memory().map_or(0, |bytes| bytes.get()),
                hugepage_pools(&page_types),
            )
        }
        _ => (0, Vec::new()),
    };
    Ok(NodeFacts {
        id,
        cpuset,
        attach_depth: object.ancestors().count(),
        memory_bytes,
        hugepages,
    })
}

/// Hugepage pools among a node's page types: sizes above the base page, with pages.
///
/// The base page is the smallest listed size when it is a plausible base page (hwloc lists it
/// first on Linux); hand-written XML that lists only hugepages has no base to skip.
fn hugepage_pools(page_types: &[(u64, u64)]) -> Vec<HugepagePool> {
    let base = page_types
        .iter()
        .map(|(size, _)| *size)
        .min()
        .filter(|size| *size <= MAX_BASE_PAGE_BYTES)
        .unwrap_or(0);
    let mut pools: Vec<HugepagePool> = page_types
        .iter()
        .filter(|(size, count)| *size > base && *count > 0)
        .map(|(size, count)| HugepagePool {
            page_size_bytes: *size,
            count: *count,
        })
        .collect();
    pools.sort();
    pools
}

/// Give each PU to exactly one NUMA node: among the nodes whose cpuset covers it, the one
/// with the smallest cpuset, then the deepest attachment, then the lowest id. Looking at
/// cpusets rather than tree parents handles SNC and memory-only nodes (HBM, CXL) that share
/// a parent with DRAM nodes.
fn assign_cpus(topology: &Topology, nodes: &[NodeFacts]) -> Result<BTreeMap<u32, u32>, TopologyError> {
    let mut cpu_node = BTreeMap::new();
    for pu in topology.objects_with_type(ObjectType::PU) {
        let cpu = os_index(pu, "PU")?;
        let owner = nodes
            .iter()
            .filter(|node| node.cpuset.contains(&cpu))
            .min_by_key(|node| (node.cpuset.len(), Reverse(node.attach_depth), node.id))
            .ok_or_else(|| TopologyError::BuildModel {
                reason: format!("CPU {cpu} is not covered by any NUMA node"),
            })?;
        cpu_node.insert(cpu, owner.id);
    }
    Ok(cpu_node)
}

/// Group each node's CPUs by physical core. PUs without a Core ancestor (XML without core
/// information) are cores of their own.
fn group_cores(
    topology: &Topology,
    cpu_node: &BTreeMap<u32, u32>,
) -> Result<BTreeMap<u32, Vec<Vec<u32>>>, TopologyError> {
    /// A core is identified by its hwloc object, or by its only PU when hwloc has no Core.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum CoreKey {
        Core(u64),
        LonePu(u32),
    }

    let mut groups: BTreeMap<(u32, CoreKey), Vec<u32>> = BTreeMap::new();
    for pu in topology.objects_with_type(ObjectType::PU) {
        let cpu = os_index(pu, "PU")?;
        let Some(node) = cpu_node.get(&cpu) else {
            continue;
        };
        let key = match pu.first_ancestor_with_type(ObjectType::Core) {
            Some(core) => CoreKey::Core(core.global_persistent_index()),
            None => CoreKey::LonePu(cpu),
        };
        groups.entry((*node, key)).or_default().push(cpu);
    }

    let mut cores: BTreeMap<u32, Vec<Vec<u32>>> = BTreeMap::new();
    for ((node, _), mut cpus) in groups {
        cpus.sort_unstable();
        cores.entry(node).or_default().push(cpus);
    }
    for node_cores in cores.values_mut() {
        node_cores.sort();
    }
    Ok(cores)
}

/// SLIT rows keyed by source node. Prefers the matrix Linux reports (`NUMALatency`), then any
/// latency matrix, then whatever NUMA matrix exists.
fn read_distances(topology: &Topology) -> Result<BTreeMap<u32, Vec<Distance>>, TopologyError> {
    let matrices = topology
        .distances_with_type(None, ObjectType::NUMANode)
        .map_err(|source| TopologyError::ReadDistances { source })?;
    let is_slit = |matrix: &&hwlocality::object::distance::Distances<'_>| {
        matrix
            .name()
            .is_some_and(|name| name.to_bytes() == SLIT_MATRIX_NAME.as_bytes())
    };
    let chosen = matrices
        .iter()
        .find(is_slit)
        .or_else(|| {
            matrices
                .iter()
                .find(|matrix| matrix.kind().contains(DistancesKind::MEANS_LATENCY))
        })
        .or_else(|| matrices.first());

    let mut rows: BTreeMap<u32, Vec<Distance>> = BTreeMap::new();
    let Some(matrix) = chosen else {
        return Ok(rows);
    };
    for ((from, to), value) in matrix.object_distances() {
        let (Some(from), Some(to)) = (from, to) else {
            continue;
        };
        let from = os_index(from, "NUMA node")?;
        let node = os_index(to, "NUMA node")?;
        rows.entry(from).or_default().push(Distance { node, value });
    }
    for row in rows.values_mut() {
        row.sort();
    }
    Ok(rows)
}

fn read_pci_devices(topology: &Topology) -> Result<Vec<PciDevice>, TopologyError> {
    let multi_node = topology.objects_with_type(ObjectType::NUMANode).len() > 1;
    let mut devices = Vec::new();
    for object in topology.objects_with_type(ObjectType::PCIDevice) {
        let Some(ObjectAttributes::PCIDevice(pci)) = object.attributes() else {
            continue;
        };
        if !is_modelled_class(pci.class_id()) {
            continue;
        }
        devices.push(PciDevice {
            bus_id: format!(
                "{:04x}:{:02x}:{:02x}.{:x}",
                pci.domain(),
                pci.bus_id(),
                pci.bus_device(),
                pci.function()
            ),
            vendor_id: pci.vendor_id(),
            device_id: pci.device_id(),
            class_id: pci.class_id(),
            class_name: class_name(pci.class_id()).to_owned(),
            numa_nodes: device_locality(object, multi_node)?,
        });
    }
    devices.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(devices)
}

/// Every host bridge's downstream bus range with the NUMA node of its parent, the same rule
/// as a device's locality: a bridge local to several nodes, or to none, gives no range.
fn read_pci_locality(topology: &Topology) -> Result<Vec<PciBusRange>, TopologyError> {
    let multi_node = topology.objects_with_type(ObjectType::NUMANode).len() > 1;
    let mut ranges = Vec::new();
    for object in topology.objects_with_type(ObjectType::Bridge) {
        let Some(ObjectAttributes::Bridge(bridge)) = object.attributes() else {
            continue;
        };
        if bridge.upstream_type() != BridgeType::Host {
            continue;
        }
        let Some(DownstreamAttributes::PCI(down)) = bridge.downstream_attributes() else {
            continue;
        };
        let (domain, first_bus, last_bus) = (
            u32::from(down.domain()),
            down.secondary_bus(),
            down.subordinate_bus(),
        );
        match device_locality(object, multi_node)?.as_slice() {
            [numa_node] if first_bus <= last_bus => ranges.push(PciBusRange {
                domain,
                first_bus,
                last_bus,
                numa_node: *numa_node,
            }),
            nodes => tracing::debug!(
                bridge = format_args!("{domain:04x}:[{first_bus:02x}-{last_bus:02x}]"),
                ?nodes,
                "host bridge is not local to exactly one NUMA node (or has no bus range); its buses have no locality"
            ),
        }
    }
    Ok(normalize_locality(ranges))
}

/// NUMA nodes of the first CPU-side ancestor. hwloc hangs devices without locality (Linux
/// `numa_node` = -1) off the machine root; on a multi-node machine that means "no locality",
/// on a single-node machine the only node is trivially local.
fn device_locality(device: &TopologyObject, multi_node: bool) -> Result<Vec<u32>, TopologyError> {
    let Some(ancestor) = device.first_non_io_ancestor() else {
        return Ok(Vec::new());
    };
    if multi_node && ancestor.parent().is_none() {
        return Ok(Vec::new());
    }
    match ancestor.nodeset() {
        Some(nodeset) => nodeset
            .iter_set()
            .map(|node| to_u32(usize::from(node), "NUMA node index"))
            .collect(),
        None => Ok(Vec::new()),
    }
}

fn os_index(object: &TopologyObject, what: &str) -> Result<u32, TopologyError> {
    let index = object.os_index().ok_or_else(|| TopologyError::BuildModel {
        reason: format!("a {what} has no OS index"),
    })?;
    to_u32(index, what)
}

fn to_u32(value: usize, what: &str) -> Result<u32, TopologyError> {
    u32::try_from(value).map_err(|_| TopologyError::BuildModel {
        reason: format!("{what} {value} does not fit in 32 bits"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_page_is_skipped_and_empty_pools_dropped() {
        let pools = hugepage_pools(&[(4096, 1000), (1 << 30, 2), (2 << 20, 0)]);
        assert_eq!(
            pools,
            vec![HugepagePool {
                page_size_bytes: 1 << 30,
                count: 2
            }]
        );
    }

    #[test]
    fn hugepages_without_base_page_are_kept() {
        let pools = hugepage_pools(&[(2 << 20, 4)]);
        assert_eq!(
            pools,
            vec![HugepagePool {
                page_size_bytes: 2 << 20,
                count: 4
            }]
        );
    }

    fn node(id: u32, distances: Vec<Distance>) -> NumaNode {
        NumaNode {
            id,
            cpus: vec![],
            cores: vec![],
            memory_bytes: 0,
            hugepages: vec![],
            distances,
        }
    }

    #[test]
    fn missing_distances_come_from_the_kernel_rows() {
        let dir = tempfile::tempdir().unwrap();
        for (id, row) in [(0, "10 21\n"), (1, "21 10\n"), (2, "garbage\n")] {
            std::fs::create_dir(dir.path().join(format!("node{id}"))).unwrap();
            std::fs::write(dir.path().join(format!("node{id}/distance")), row).unwrap();
        }
        let mut nodes = vec![node(0, vec![]), node(1, vec![])];
        fill_missing_distances(&mut nodes, Some(dir.path()));
        assert_eq!(
            nodes[1].distances,
            [Distance { node: 0, value: 21 }, Distance { node: 1, value: 10 }]
        );
        // A row that does not match the node list, or no sysfs (XML): unknown.
        let mut one = vec![node(2, vec![])];
        fill_missing_distances(&mut one, Some(dir.path()));
        assert!(one[0].distances.is_empty());
        let mut one = vec![node(0, vec![])];
        fill_missing_distances(&mut one, None);
        assert!(one[0].distances.is_empty());
        // hwloc's matrix is kept.
        let hw = vec![Distance { node: 0, value: 11 }];
        let mut kept = vec![node(0, hw.clone())];
        fill_missing_distances(&mut kept, Some(dir.path()));
        assert_eq!(kept[0].distances, hw);
    }
}
