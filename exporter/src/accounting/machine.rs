//! The machine the accounting maps onto: the index of CPUs, NUMA zones and their distances
//! (devices are placed on zones by the kubelet's topology hints).

use std::collections::{BTreeMap, BTreeSet};

use numaplane_topology::Machine;

use super::*;

/// The part of the machine model the accounting needs, independent of hwloc so that tests and
/// other sources (sysfs, vectors) can build it directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineView {
    /// NUMA nodes, in any order; ids must be unique.
    pub nodes: Vec<NodeView>,
    /// PCI bus ranges and their NUMA node (published as `numaplane.io/pci-locality`); empty
    /// when unknown.
    pub pci_locality: Vec<numaplane::pci_locality::PciBusRange>,
}

/// One NUMA node of a [`MachineView`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Linux node number (kubelet `NUMANode.ID`).
    pub id: u32,
    /// Online logical CPU ids local to the node (empty for memory-only nodes).
    pub cpus: Vec<u32>,
    /// MemTotal of the node in bytes, hugepages included; `None` when unknown.
    pub memory_bytes: Option<u64>,
    /// Hugepage pool sizes in bytes, keyed by resource name (`hugepages-2Mi`).
    pub hugepages_bytes: BTreeMap<String, u64>,
    /// SLIT row: (destination node id, distance), itself included.
    pub distances: Vec<(u32, u64)>,
    /// Physical cores, each with its logical CPUs; empty when unknown.
    pub cores: Vec<Vec<u32>>,
}

impl From<&Machine> for MachineView {
    fn from(machine: &Machine) -> Self {
        let nodes = machine
            .numa_nodes
            .iter()
            .map(|node| {
                let mut hugepages_bytes = BTreeMap::new();
                for pool in &node.hugepages {
                    let total: &mut u64 = hugepages_bytes.entry(pool.resource_name()).or_default();
                    // Capacity only: saturating keeps an absurd pool visible without wrapping.
                    *total = total.saturating_add(pool.total_bytes());
                }
                NodeView {
                    id: node.id,
                    cpus: node.cpus.clone(),
                    // hwloc reports 0 when it does not know the local memory.
                    memory_bytes: (node.memory_bytes > 0).then_some(node.memory_bytes),
                    hugepages_bytes,
                    distances: node.distances.iter().map(|d| (d.node, d.value)).collect(),
                    cores: node.cores.clone(),
                }
            })
            .collect();
        MachineView {
            nodes,
            pci_locality: machine.pci_locality.clone(),
        }
    }
}

pub(super) struct MachineIndex<'m> {
    pub(super) nodes: BTreeMap<u32, &'m NodeView>,
    pub(super) cpu_node: BTreeMap<u32, u32>,
}

/// Where a kubelet NUMA id points.
pub(super) enum Numa {
    Known(u32),
    /// Negative: the kubelet's "no affinity".
    Unaligned,
    Unknown(i64),
}

impl<'m> MachineIndex<'m> {
    pub(super) fn build(machine: &'m MachineView) -> Result<Self, AccountingError> {
        let mut nodes = BTreeMap::new();
        let mut cpu_node = BTreeMap::new();
        for node in &machine.nodes {
            if nodes.insert(node.id, node).is_some() {
                return Err(AccountingError::IndexNumaNode { id: node.id });
            }
            for &cpu in &node.cpus {
                match cpu_node.insert(cpu, node.id) {
                    Some(first) if first != node.id => {
                        return Err(AccountingError::IndexCpu {
                            cpu,
                            first,
                            second: node.id,
                        });
                    }
                    _ => {}
                }
            }
        }
        Ok(Self { nodes, cpu_node })
    }

    pub(super) fn numa(&self, id: i64) -> Numa {
        if id < 0 {
            return Numa::Unaligned;
        }
        match u32::try_from(id) {
            Ok(n) if self.nodes.contains_key(&n) => Numa::Known(n),
            _ => Numa::Unknown(id),
        }
    }

    /// (CPU, its NUMA node) for a kubelet CPU id, if the machine has it online.
    pub(super) fn cpu(&self, id: i64) -> Option<(u32, u32)> {
        let cpu = u32::try_from(id).ok()?;
        self.cpu_node.get(&cpu).map(|&node| (cpu, node))
    }

    pub(super) fn logical_cpus(&self, node: u32) -> u64 {
        self.nodes
            .get(&node)
            .map_or(0, |n| n.cpus.iter().collect::<BTreeSet<_>>().len() as u64)
    }
}
