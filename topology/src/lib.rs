//! hwloc-backed machine model: NUMA nodes, their CPUs (grouped by physical core), memory,
//! hugepage pools, the SLIT distance matrix, and PCI devices with their NUMA locality.
//!
//! Build a [`Machine`] from the running host ([`Machine::from_system`]), from an hwloc XML
//! export (`lstopo --of xml`, [`Machine::from_xml_file`] / [`Machine::from_xml_str`]), or
//! generate hwloc XML for a made-up machine with [`synth`].
//!
//! Model conventions (the same whatever the source):
//! - NUMA node ids are hwloc `os_index` values, i.e. Linux node numbers, which kubelet also
//!   uses; they may have holes.
//! - Each online CPU belongs to exactly one node. When several nodes cover a CPU (memory-only
//!   nodes such as HBM/CXL attached next to DRAM), the node attached closest to the CPU wins,
//!   then the lowest id; this matches Linux, where memory-only nodes have empty cpulists.
//! - Hugepage pools list only sizes above the base page, and only pools with pages (count > 0).
//! - PCI devices are the "important" hwloc I/O classes (storage, network, display, processors,
//!   accelerators, ...), excluding bridges.
//! - PCI locality is every host bridge's downstream bus range with the one NUMA node its
//!   parent is local to (bridges under the machine root of a multi-node machine, or under an
//!   object spanning several nodes, have none and are left out).

#![warn(missing_docs)]

mod error;
mod hexid;
mod load;
mod pci;
pub mod synth;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use error::{TopologyError, XmlOrigin};
pub use numaplane::pci_locality::PciBusRange;
pub use pci::class_name;

/// The NUMA-relevant view of one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// NUMA nodes, sorted by id.
    pub numa_nodes: Vec<NumaNode>,
    /// PCI devices, sorted by bus id.
    pub pci_devices: Vec<PciDevice>,
    /// PCI bus ranges and the NUMA node each is local to, sorted, without overlap, adjacent
    /// ranges of one node merged; serialized in the `numaplane.io/pci-locality` wire form.
    #[serde(default, with = "locality_wire")]
    pub pci_locality: Vec<PciBusRange>,
}

/// [`Machine::pci_locality`] as its one wire form ([`numaplane::pci_locality`]).
mod locality_wire {
    use numaplane::pci_locality::{PciBusRange, join_pci_locality, split_pci_locality};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(ranges: &[PciBusRange], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&join_pci_locality(ranges))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PciBusRange>, D::Error> {
        let value = String::deserialize(d)?;
        split_pci_locality(&value).map_err(serde::de::Error::custom)
    }
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Linux node number (hwloc `os_index`, kubelet `NUMANode.ID`).
    pub id: u32,
    /// Linux logical CPU ids local to this node, sorted; empty for a memory-only node.
    pub cpus: Vec<u32>,
    /// Physical cores of this node, each listing its hardware threads (SMT siblings),
    /// sorted; cores are ordered by their first CPU.
    pub cores: Vec<Vec<u32>>,
    /// Node-local memory (MemTotal of the node, hugepages included), in bytes.
    pub memory_bytes: u64,
    /// Hugepage pools with at least one page, sorted by page size.
    pub hugepages: Vec<HugepagePool>,
    /// SLIT row from this node to every node (itself included, usually 10), sorted by
    /// destination; empty when the host reports no distances.
    pub distances: Vec<Distance>,
}

/// A pool of hugepages of one size on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HugepagePool {
    /// Size of one page, in bytes (e.g. 2097152).
    pub page_size_bytes: u64,
    /// Number of pages in the pool.
    pub count: u64,
}

/// Distance from a node to the destination `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Distance {
    /// Destination NUMA node id.
    pub node: u32,
    /// Relative distance (ACPI SLIT: 10 means local).
    pub value: u64,
}

/// A PCI device and where it is attached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    /// PCI address, `domain:bus:device.function`, e.g. `0000:3b:00.0`.
    pub bus_id: String,
    /// PCI vendor id; serialized as 4 hex digits (`"10de"`).
    #[serde(with = "hexid")]
    pub vendor_id: u16,
    /// PCI device id; serialized as 4 hex digits.
    #[serde(with = "hexid")]
    pub device_id: u16,
    /// PCI class and subclass (e.g. 0x0302); serialized as 4 hex digits (`"0302"`).
    #[serde(with = "hexid")]
    pub class_id: u16,
    /// Short name derived from `class_id` (see [`class_name`]), e.g. `gpu`, `network`.
    pub class_name: String,
    /// NUMA nodes the device is local to; empty when the host gives no locality.
    pub numa_nodes: Vec<u32>,
}

impl HugepagePool {
    /// Kubernetes resource name of this page size, e.g. `hugepages-2Mi`, `hugepages-1Gi`.
    pub fn resource_name(&self) -> String {
        hugepage_resource_name(self.page_size_bytes)
    }

    /// Total bytes held by the pool.
    pub fn total_bytes(&self) -> u64 {
        self.page_size_bytes.saturating_mul(self.count)
    }
}

/// Kubernetes resource name for a hugepage size: `hugepages-` plus the size in the largest
/// binary-SI unit that divides it exactly (`2097152` → `hugepages-2Mi`).
pub fn hugepage_resource_name(page_size_bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (suffix, unit) in UNITS {
        if page_size_bytes >= unit && page_size_bytes.is_multiple_of(unit) {
            return format!("hugepages-{}{suffix}", page_size_bytes / unit);
        }
    }
    format!("hugepages-{page_size_bytes}")
}

/// Inverse of [`hugepage_resource_name`]: `hugepages-2Mi` → 2097152. `None` if the name is
/// not of that form.
pub fn parse_hugepage_resource_name(name: &str) -> Option<u64> {
    let size = name.strip_prefix("hugepages-")?;
    let digits_end = size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len());
    let (number, suffix) = size.split_at(digits_end);
    let number: u64 = number.parse().ok()?;
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(unit).filter(|bytes| *bytes > 0)
}

impl Machine {
    /// Discover the running host through hwloc, with all CPUs and NUMA nodes of the machine
    /// (not only those the current cgroup may use) and the important PCI devices.
    pub fn from_system() -> Result<Machine, TopologyError> {
        load::from_system()
    }

    /// Load an hwloc XML topology file (as written by `lstopo --of xml` or [`synth`]).
    pub fn from_xml_file(path: &Path) -> Result<Machine, TopologyError> {
        let xml = std::fs::read_to_string(path).map_err(|source| TopologyError::ReadXml {
            path: path.to_path_buf(),
            source,
        })?;
        load::from_xml(&xml, XmlOrigin::File(path.to_path_buf()))
    }

    /// Load an hwloc XML topology held in memory.
    pub fn from_xml_str(xml: &str) -> Result<Machine, TopologyError> {
        load::from_xml(xml, XmlOrigin::Memory)
    }

    /// Ids of all NUMA nodes, ascending.
    pub fn numa_ids(&self) -> Vec<u32> {
        self.numa_nodes.iter().map(|node| node.id).collect()
    }

    /// Map from every CPU id to the id of its NUMA node.
    pub fn cpu_to_numa(&self) -> BTreeMap<u32, u32> {
        self.numa_nodes
            .iter()
            .flat_map(|node| node.cpus.iter().map(move |cpu| (*cpu, node.id)))
            .collect()
    }

    /// SLIT distance from node `from` to node `to`, if known.
    pub fn distance(&self, from: u32, to: u32) -> Option<u64> {
        self.node(from)?
            .distances
            .iter()
            .find(|distance| distance.node == to)
            .map(|distance| distance.value)
    }

    /// The node with this id.
    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|node| node.id == id)
    }

    /// All CPU ids of the machine, ascending.
    pub fn cpus(&self) -> Vec<u32> {
        self.cpu_to_numa().into_keys().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_use_binary_si() {
        assert_eq!(hugepage_resource_name(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepage_resource_name(64 << 10), "hugepages-64Ki");
        assert_eq!(hugepage_resource_name(512 << 20), "hugepages-512Mi");
        assert_eq!(hugepage_resource_name(16 << 30), "hugepages-16Gi");
        assert_eq!(hugepage_resource_name(1000), "hugepages-1000");
        for size in [2u64 << 20, 1 << 30, 64 << 10, 512 << 20, 16 << 30, 1000] {
            assert_eq!(
                parse_hugepage_resource_name(&hugepage_resource_name(size)),
                Some(size)
            );
        }
        assert_eq!(parse_hugepage_resource_name("hugepages-2Mb"), None);
        assert_eq!(parse_hugepage_resource_name("memory"), None);
        assert_eq!(parse_hugepage_resource_name("hugepages-0Mi"), None);
        assert_eq!(parse_hugepage_resource_name("hugepages-Mi"), None);
    }

    #[test]
    fn pool_resource_name() {
        let pool = HugepagePool {
            page_size_bytes: 2 << 20,
            count: 3,
        };
        assert_eq!(pool.resource_name(), "hugepages-2Mi");
        assert_eq!(pool.total_bytes(), 6 << 20);
    }
}
