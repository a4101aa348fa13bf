//! Generate hwloc XML for a described machine, for tests, fixtures and benchmarks.
//!
//! A [`MachineSpec`] is plain serde data. Besides its own field names it accepts the
//! spellings used by conformance descriptions (`memory_total_bytes`, a
//! `hugepages_total_bytes` map from resource name to bytes) and the JSON of a serialized
//! [`Machine`] (`cores` for `smt_siblings`; `class_name` is ignored), so a captured model can
//! be turned back into XML. Unknown fields are ignored.
//!
//! [`to_hwloc_xml`] writes an hwloc 2.x XML topology (Machine → one Package per node with
//! CPUs → Core → PU; memory-only nodes hang off the Machine) that `lstopo --if xml` accepts
//! and that [`Machine::from_xml_str`] loads back to [`MachineSpec::expected_machine`].
//!
//! Normalisation between spec and model: CPUs missing from `smt_siblings` (or all CPUs when it
//! is absent) are single-thread cores; hugepage pools with zero pages are written to the XML
//! but not part of the model; on a single-node machine a device with no `numa_nodes` is local
//! to that node.
//!
//! Size (~620 lines of code): one module on purpose, the XML writer and the spec it writes from
//! change together (every machine feature is a spec field and an XML element).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::pci::{class_name, is_modelled_class, normalize_locality};
use crate::{
    Distance, HugepagePool, Machine, NumaNode, PciBusRange, PciDevice, TopologyError,
    parse_hugepage_resource_name,
};

/// Base page size the generated XML declares.
const BASE_PAGE_BYTES: u64 = 4096;

/// Upper bound for CPU and node ids: bitmaps are written densely, and Linux's NR_CPUS tops out
/// at 8192 anyway.
const MAX_ID: u32 = 1 << 16;

/// Description of a machine to generate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSpec {
    /// NUMA nodes, in any order.
    pub numa_nodes: Vec<NumaNodeSpec>,
    /// PCI devices, in any order.
    #[serde(default)]
    pub pci_devices: Vec<PciDeviceSpec>,
}

/// Description of one NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNodeSpec {
    /// Linux node number.
    pub id: u32,
    /// CPU ids of the node, any order; empty for a memory-only node.
    #[serde(default)]
    pub cpus: Vec<u32>,
    /// Physical cores as groups of SMT siblings; CPUs not listed are single-thread cores.
    #[serde(default, alias = "cores", skip_serializing_if = "Option::is_none")]
    pub smt_siblings: Option<Vec<Vec<u32>>>,
    /// Node memory in bytes (0 when absent).
    #[serde(
        default,
        alias = "memory_total_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_bytes: Option<u64>,
    /// Hugepage pools by page size and page count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepages: Vec<HugepagePool>,
    /// Hugepage pools by resource name (`hugepages-2Mi`) and total bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages_total_bytes: BTreeMap<String, u64>,
    /// SLIT row to every node (itself included); all nodes or none must have one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distances: Vec<Distance>,
}

/// Description of one PCI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDeviceSpec {
    /// PCI address `dddd:bb:dd.f` (hex).
    pub bus_id: String,
    /// Vendor id: hex string (`"10de"`, `"0x10de"`) or integer (its numeric value, so quote
    /// hex ids in YAML: an unquoted `0302` is the number 302).
    #[serde(with = "crate::hexid")]
    pub vendor_id: u16,
    /// Device id: hex string or integer.
    #[serde(with = "crate::hexid")]
    pub device_id: u16,
    /// Class and subclass (`"0302"`); must be a class hwloc keeps as important, not a bridge.
    #[serde(with = "crate::hexid")]
    pub class_id: u16,
    /// Node the device is local to: empty (no locality) or exactly one node with CPUs.
    #[serde(default)]
    pub numa_nodes: Vec<u32>,
}

/// Write `spec` as an hwloc 2.x XML topology.
pub fn to_hwloc_xml(spec: &MachineSpec) -> Result<String, TopologyError> {
    spec.to_hwloc_xml()
}

impl MachineSpec {
    /// A regular machine numbered like Linux on x86: node `n` owns cores
    /// `n*cores_per_node..`, and thread `t` of core `c` is CPU `t * total_cores + c`.
    /// Distances are 10 locally and 20 between nodes (none for a single node).
    pub fn symmetric(numa_nodes: u32, cores_per_node: u32, threads_per_core: u32, memory_bytes: u64) -> Self {
        // Saturating so absurd sizes end up as an invalid spec rather than an overflow panic.
        let total_cores = numa_nodes.saturating_mul(cores_per_node);
        let nodes = (0..numa_nodes)
            .map(|node| {
                let cores: Vec<Vec<u32>> = (0..cores_per_node)
                    .map(|core| {
                        let first = node.saturating_mul(cores_per_node).saturating_add(core);
                        (0..threads_per_core)
                            .map(|thread| thread.saturating_mul(total_cores).saturating_add(first))
                            .collect()
                    })
                    .collect();
                let mut cpus: Vec<u32> = cores.iter().flatten().copied().collect();
                cpus.sort_unstable();
                let distances = if numa_nodes > 1 {
                    (0..numa_nodes)
                        .map(|to| Distance {
                            node: to,
                            value: if to == node { 10 } else { 20 },
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                NumaNodeSpec {
                    id: node,
                    cpus,
                    smt_siblings: (threads_per_core > 1).then_some(cores),
                    memory_bytes: Some(memory_bytes),
                    distances,
                    ..NumaNodeSpec::default()
                }
            })
            .collect();
        Self {
            numa_nodes: nodes,
            pci_devices: Vec::new(),
        }
    }

    /// Write this spec as an hwloc 2.x XML topology.
    pub fn to_hwloc_xml(&self) -> Result<String, TopologyError> {
        let plan = Plan::new(self)?;
        Ok(plan.write_xml())
    }

    /// The model hwloc should report for this spec, computed without hwloc.
    pub fn expected_machine(&self) -> Result<Machine, TopologyError> {
        let plan = Plan::new(self)?;
        Ok(plan.machine())
    }

    /// Generate the XML and load it back through hwloc.
    pub fn build_machine(&self) -> Result<Machine, TopologyError> {
        Machine::from_xml_str(&self.to_hwloc_xml()?)
    }
}

impl From<&Machine> for MachineSpec {
    fn from(machine: &Machine) -> Self {
        Self {
            numa_nodes: machine
                .numa_nodes
                .iter()
                .map(|node| NumaNodeSpec {
                    id: node.id,
                    cpus: node.cpus.clone(),
                    smt_siblings: Some(node.cores.clone()),
                    memory_bytes: Some(node.memory_bytes),
                    hugepages: node.hugepages.clone(),
                    hugepages_total_bytes: BTreeMap::new(),
                    distances: node.distances.clone(),
                })
                .collect(),
            pci_devices: machine
                .pci_devices
                .iter()
                .map(|device| PciDeviceSpec {
                    bus_id: device.bus_id.clone(),
                    vendor_id: device.vendor_id,
                    device_id: device.device_id,
                    class_id: device.class_id,
                    numa_nodes: device.numa_nodes.clone(),
                })
                .collect(),
        }
    }
}

fn invalid(reason: String) -> TopologyError {
    TopologyError::ValidateSpec { reason }
}

/// A validated, normalised spec, ready to be written or modelled.
struct Plan {
    /// Sorted by id.
    nodes: Vec<PlannedNode>,
    /// Sorted by bus id.
    devices: Vec<PlannedDevice>,
    has_distances: bool,
}

struct PlannedNode {
    id: u32,
    /// Sorted cores of sorted CPUs, ordered by first CPU.
    cores: Vec<Vec<u32>>,
    memory_bytes: u64,
    /// All pools, zero-count ones included, sorted by size.
    hugepages: Vec<HugepagePool>,
    /// Sorted by destination.
    distances: Vec<Distance>,
}

impl PlannedNode {
    fn cpus(&self) -> BTreeSet<u32> {
        self.cores.iter().flatten().copied().collect()
    }
}

struct PlannedDevice {
    domain: u16,
    bus: u8,
    device: u8,
    function: u8,
    vendor_id: u16,
    device_id: u16,
    class_id: u16,
    /// `None` when the device has no locality.
    node: Option<u32>,
}

impl PlannedDevice {
    fn bus_id(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Plan {
    fn new(spec: &MachineSpec) -> Result<Self, TopologyError> {
        if spec.numa_nodes.is_empty() {
            return Err(invalid("a machine needs at least one NUMA node".into()));
        }
        let mut ids = BTreeSet::new();
        let mut owner: BTreeMap<u32, u32> = BTreeMap::new();
        for node in &spec.numa_nodes {
            if let Some(id) = std::iter::once(&node.id)
                .chain(&node.cpus)
                .find(|id| **id >= MAX_ID)
            {
                return Err(invalid(format!(
                    "node {}: id {id} is not below {MAX_ID}",
                    node.id
                )));
            }
            if !ids.insert(node.id) {
                return Err(invalid(format!("NUMA node {} is listed twice", node.id)));
            }
            for cpu in &node.cpus {
                if let Some(other) = owner.insert(*cpu, node.id) {
                    return Err(invalid(format!(
                        "CPU {cpu} is listed in nodes {other} and {}",
                        node.id
                    )));
                }
            }
        }
        if owner.is_empty() {
            return Err(invalid("a machine needs at least one CPU".into()));
        }

        let with_distances = spec
            .numa_nodes
            .iter()
            .filter(|node| !node.distances.is_empty())
            .count();
        if with_distances != 0 && with_distances != spec.numa_nodes.len() {
            return Err(invalid(
                "either every NUMA node or none must have distances (hwloc needs a full matrix)".into(),
            ));
        }

        let mut nodes = spec
            .numa_nodes
            .iter()
            .map(|node| plan_node(node, &ids))
            .collect::<Result<Vec<_>, _>>()?;
        nodes.sort_by_key(|node| node.id);

        let mut devices = spec
            .pci_devices
            .iter()
            .map(|device| plan_device(device, &nodes))
            .collect::<Result<Vec<_>, _>>()?;
        devices.sort_by_key(PlannedDevice::bus_id);
        for pair in devices.windows(2) {
            if let [a, b] = pair
                && a.bus_id() == b.bus_id()
            {
                return Err(invalid(format!("PCI device {} is listed twice", a.bus_id())));
            }
        }

        Ok(Self {
            nodes,
            devices,
            has_distances: with_distances != 0,
        })
    }

    fn machine(&self) -> Machine {
        let single_node = match self.nodes.as_slice() {
            [only] => Some(only.id),
            _ => None,
        };
        Machine {
            numa_nodes: self
                .nodes
                .iter()
                .map(|node| NumaNode {
                    id: node.id,
                    cpus: node.cpus().into_iter().collect(),
                    cores: node.cores.clone(),
                    memory_bytes: node.memory_bytes,
                    hugepages: node
                        .hugepages
                        .iter()
                        .filter(|pool| pool.count > 0)
                        .copied()
                        .collect(),
                    distances: node.distances.clone(),
                })
                .collect(),
            pci_devices: self
                .devices
                .iter()
                .map(|device| PciDevice {
                    bus_id: device.bus_id(),
                    vendor_id: device.vendor_id,
                    device_id: device.device_id,
                    class_id: device.class_id,
                    class_name: class_name(device.class_id).to_owned(),
                    numa_nodes: device.node.or(single_node).into_iter().collect(),
                })
                .collect(),
            // One host bridge per (domain, bus, node), as write_bridges lays them out.
            pci_locality: normalize_locality(
                self.devices
                    .iter()
                    .filter_map(|device| {
                        device.node.or(single_node).map(|numa_node| PciBusRange {
                            domain: u32::from(device.domain),
                            first_bus: device.bus,
                            last_bus: device.bus,
                            numa_node,
                        })
                    })
                    .collect(),
            ),
        }
    }

    fn write_xml(&self) -> String {
        let mut xml = XmlWriter::default();
        let all_cpus: BTreeSet<u32> = self.nodes.iter().flat_map(PlannedNode::cpus).collect();
        let all_nodes: BTreeSet<u32> = self.nodes.iter().map(|node| node.id).collect();
        let cpus_hex = bitmap_hex(&all_cpus);
        let nodes_hex = bitmap_hex(&all_nodes);

        xml.line(0, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
        xml.line(0, "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">");
        xml.line(0, "<topology version=\"2.0\">");
        let gp = xml.next_gp();
        xml.line(
            1,
            &format!(
                "<object type=\"Machine\" os_index=\"0\" cpuset=\"{cpus_hex}\" complete_cpuset=\"{cpus_hex}\" \
                 allowed_cpuset=\"{cpus_hex}\" nodeset=\"{nodes_hex}\" complete_nodeset=\"{nodes_hex}\" \
                 allowed_nodeset=\"{nodes_hex}\" gp_index=\"{gp}\">"
            ),
        );
        xml.line(2, "<info name=\"Backend\" value=\"numaplane-synth\"/>");

        // hwloc lists memory children first, then normal children (ordered by first CPU), then I/O.
        for node in self.nodes.iter().filter(|node| node.cores.is_empty()) {
            xml.numa_node(2, node, &cpus_hex);
        }
        let mut packages: Vec<&PlannedNode> =
            self.nodes.iter().filter(|node| !node.cores.is_empty()).collect();
        packages.sort_by_key(|node| node.cores.first().and_then(|core| core.first()).copied());
        for (package_index, node) in packages.into_iter().enumerate() {
            let cpus_hex = bitmap_hex(&node.cpus());
            let node_hex = bitmap_hex(&BTreeSet::from([node.id]));
            let gp = xml.next_gp();
            xml.line(
                2,
                &format!(
                    "<object type=\"Package\" os_index=\"{package_index}\" cpuset=\"{cpus_hex}\" \
                     complete_cpuset=\"{cpus_hex}\" nodeset=\"{node_hex}\" complete_nodeset=\"{node_hex}\" \
                     gp_index=\"{gp}\">"
                ),
            );
            xml.numa_node(3, node, &cpus_hex);
            for (core_index, core) in node.cores.iter().enumerate() {
                let core_hex = bitmap_hex(&core.iter().copied().collect());
                let gp = xml.next_gp();
                xml.line(
                    3,
                    &format!(
                        "<object type=\"Core\" os_index=\"{core_index}\" cpuset=\"{core_hex}\" \
                         complete_cpuset=\"{core_hex}\" nodeset=\"{node_hex}\" \
                         complete_nodeset=\"{node_hex}\" gp_index=\"{gp}\">"
                    ),
                );
                for cpu in core {
                    let pu_hex = bitmap_hex(&BTreeSet::from([*cpu]));
                    let gp = xml.next_gp();
                    xml.line(
                        4,
                        &format!(
                            "<object type=\"PU\" os_index=\"{cpu}\" cpuset=\"{pu_hex}\" \
                             complete_cpuset=\"{pu_hex}\" nodeset=\"{node_hex}\" \
                             complete_nodeset=\"{node_hex}\" gp_index=\"{gp}\"/>"
                        ),
                    );
                }
                xml.line(3, "</object>");
            }
            self.write_bridges(&mut xml, 3, Some(node.id));
            xml.line(2, "</object>");
        }
        self.write_bridges(&mut xml, 2, None);
        xml.line(1, "</object>");

        if self.has_distances {
            self.write_distances(&mut xml);
        }
        xml.line(0, "</topology>");
        xml.text
    }

    /// One host bridge per PCI bus, holding that bus's devices attached at `node`.
    fn write_bridges(&self, xml: &mut XmlWriter, indent: usize, node: Option<u32>) {
        let mut buses: BTreeMap<(u16, u8), Vec<&PlannedDevice>> = BTreeMap::new();
        for device in self.devices.iter().filter(|device| device.node == node) {
            buses.entry((device.domain, device.bus)).or_default().push(device);
        }
        for ((domain, bus), devices) in buses {
            let gp = xml.next_gp();
            xml.line(
                indent,
                &format!(
                    "<object type=\"Bridge\" gp_index=\"{gp}\" bridge_type=\"0-1\" depth=\"0\" \
                     bridge_pci=\"{domain:04x}:[{bus:02x}-{bus:02x}]\">"
                ),
            );
            for device in devices {
                let gp = xml.next_gp();
                xml.line(
                    indent + 1,
                    &format!(
                        "<object type=\"PCIDev\" gp_index=\"{gp}\" pci_busid=\"{}\" \
                         pci_type=\"{:04x} [{:04x}:{:04x}] [0000:0000] 00\" pci_link_speed=\"0.000000\"/>",
                        device.bus_id(),
                        device.class_id,
                        device.vendor_id,
                        device.device_id
                    ),
                );
            }
            xml.line(indent, "</object>");
        }
    }

    /// The SLIT as hwloc's Linux backend exports it (`NUMALatency`, kind FROM_OS|MEANS_LATENCY).
    fn write_distances(&self, xml: &mut XmlWriter) {
        let mut indexes = String::new();
        let mut values = String::new();
        for node in &self.nodes {
            let _ = write!(indexes, "{} ", node.id);
            for distance in &node.distances {
                let _ = write!(values, "{} ", distance.value);
            }
        }
        xml.line(
            1,
            &format!(
                "<distances2 type=\"NUMANode\" nbobjs=\"{}\" kind=\"5\" name=\"NUMALatency\" indexing=\"os\">",
                self.nodes.len()
            ),
        );
        // hwloc's `length` attribute is the text length in characters.
        xml.line(
            2,
            &format!("<indexes length=\"{}\">{indexes}</indexes>", indexes.len()),
        );
        xml.line(
            2,
            &format!("<u64values length=\"{}\">{values}</u64values>", values.len()),
        );
        xml.line(1, "</distances2>");
    }
}

fn plan_node(node: &NumaNodeSpec, ids: &BTreeSet<u32>) -> Result<PlannedNode, TopologyError> {
    let id = node.id;
    let cpus: BTreeSet<u32> = node.cpus.iter().copied().collect();

    let mut cores: Vec<Vec<u32>> = Vec::new();
    let mut placed = BTreeSet::new();
    for group in node.smt_siblings.iter().flatten() {
        if group.is_empty() {
            return Err(invalid(format!("node {id} has an empty SMT sibling group")));
        }
        let mut core = group.clone();
        core.sort_unstable();
        for cpu in &core {
            if !cpus.contains(cpu) {
                return Err(invalid(format!(
                    "node {id} lists CPU {cpu} as an SMT sibling but not in its cpus"
                )));
            }
            if !placed.insert(*cpu) {
                return Err(invalid(format!(
                    "node {id} lists CPU {cpu} in two SMT sibling groups"
                )));
            }
        }
        cores.push(core);
    }
    cores.extend(cpus.difference(&placed).map(|cpu| vec![*cpu]));
    cores.sort();

    let mut pools: BTreeMap<u64, u64> = BTreeMap::new();
    let mut add_pool = |page_size: u64, count: u64| {
        if page_size <= BASE_PAGE_BYTES {
            return Err(invalid(format!(
                "node {id} hugepage size {page_size} is not larger than the {BASE_PAGE_BYTES}-byte base page"
            )));
        }
        if pools.insert(page_size, count).is_some() {
            return Err(invalid(format!(
                "node {id} lists hugepage size {page_size} twice"
            )));
        }
        Ok(())
    };
    for pool in &node.hugepages {
        add_pool(pool.page_size_bytes, pool.count)?;
    }
    for (name, total) in &node.hugepages_total_bytes {
        let size = parse_hugepage_resource_name(name)
            .ok_or_else(|| invalid(format!("node {id}: {name:?} is not a hugepage resource name")))?;
        if !total.is_multiple_of(size) {
            return Err(invalid(format!(
                "node {id}: {name} total {total} is not a whole number of pages"
            )));
        }
        add_pool(size, total / size)?;
    }
    let hugepages = pools
        .into_iter()
        .map(|(page_size_bytes, count)| HugepagePool {
            page_size_bytes,
            count,
        })
        .collect();

    let mut distances = node.distances.clone();
    distances.sort();
    if !distances.is_empty() {
        let destinations: Vec<u32> = distances.iter().map(|distance| distance.node).collect();
        if destinations != ids.iter().copied().collect::<Vec<_>>() {
            return Err(invalid(format!(
                "node {id} distances must list every node once, got destinations {destinations:?}"
            )));
        }
    }

    Ok(PlannedNode {
        id,
        cores,
        memory_bytes: node.memory_bytes.unwrap_or(0),
        hugepages,
        distances,
    })
}

fn plan_device(device: &PciDeviceSpec, nodes: &[PlannedNode]) -> Result<PlannedDevice, TopologyError> {
    let (domain, bus, slot, function) = parse_bus_id(&device.bus_id).ok_or_else(|| {
        invalid(format!(
            "PCI bus id {:?} is not of the form dddd:bb:dd.f",
            device.bus_id
        ))
    })?;
    if !is_modelled_class(device.class_id) {
        return Err(invalid(format!(
            "PCI device {} has class {:04x}, which hwloc does not keep as important (or is a bridge)",
            device.bus_id, device.class_id
        )));
    }
    let node = match device.numa_nodes.as_slice() {
        [] => None,
        [node] => {
            let planned = nodes
                .iter()
                .find(|planned| planned.id == *node)
                .ok_or_else(|| invalid(format!("PCI device {} is on unknown node {node}", device.bus_id)))?;
            if planned.cores.is_empty() {
                return Err(invalid(format!(
                    "PCI device {} is on node {node}, which has no CPUs to attach it to",
                    device.bus_id
                )));
            }
            Some(*node)
        }
        _ => {
            return Err(invalid(format!(
                "PCI device {} must be local to at most one node",
                device.bus_id
            )));
        }
    };
    Ok(PlannedDevice {
        domain,
        bus,
        device: slot,
        function,
        vendor_id: device.vendor_id,
        device_id: device.device_id,
        class_id: device.class_id,
        node,
    })
}

/// Parse `dddd:bb:dd.f` (hex; device < 0x20, function < 8).
fn parse_bus_id(bus_id: &str) -> Option<(u16, u8, u8, u8)> {
    let (domain, rest) = bus_id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, function) = rest.split_once('.')?;
    fn hex_field(text: &str, width: usize) -> Option<&str> {
        (text.len() == width && text.chars().all(|c| c.is_ascii_hexdigit())).then_some(text)
    }
    let domain = u16::from_str_radix(hex_field(domain, 4)?, 16).ok()?;
    let bus = u8::from_str_radix(hex_field(bus, 2)?, 16).ok()?;
    let slot = u8::from_str_radix(hex_field(slot, 2)?, 16)
        .ok()
        .filter(|slot| *slot < 0x20)?;
    let function = u8::from_str_radix(hex_field(function, 1)?, 16)
        .ok()
        .filter(|f| *f < 8)?;
    Some((domain, bus, slot, function))
}

/// hwloc bitmap text: 32-bit words, most significant first, comma separated.
fn bitmap_hex(bits: &BTreeSet<u32>) -> String {
    let Some(max) = bits.last() else {
        return "0x0".to_owned();
    };
    let mut words = vec![0u32; (*max / 32 + 1) as usize];
    for bit in bits {
        if let Some(word) = words.get_mut((bit / 32) as usize) {
            *word |= 1 << (bit % 32);
        }
    }
    words
        .iter()
        .rev()
        .map(|word| format!("0x{word:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Default)]
struct XmlWriter {
    text: String,
    gp_index: u64,
}

impl XmlWriter {
    fn line(&mut self, indent: usize, line: &str) {
        for _ in 0..indent {
            self.text.push_str("  ");
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    fn next_gp(&mut self) -> u64 {
        self.gp_index += 1;
        self.gp_index
    }

    /// A NUMA node inherits the cpuset of the object it is attached to.
    fn numa_node(&mut self, indent: usize, node: &PlannedNode, parent_cpus_hex: &str) {
        let node_hex = bitmap_hex(&BTreeSet::from([node.id]));
        let gp = self.next_gp();
        let memory = if node.memory_bytes > 0 {
            format!(" local_memory=\"{}\"", node.memory_bytes)
        } else {
            String::new()
        };
        self.line(
            indent,
            &format!(
                "<object type=\"NUMANode\" os_index=\"{}\" cpuset=\"{parent_cpus_hex}\" \
                 complete_cpuset=\"{parent_cpus_hex}\" nodeset=\"{node_hex}\" complete_nodeset=\"{node_hex}\" \
                 gp_index=\"{gp}\"{memory}>",
                node.id
            ),
        );
        let hugepage_bytes: u64 = node.hugepages.iter().map(HugepagePool::total_bytes).sum();
        let base_pages = node.memory_bytes.saturating_sub(hugepage_bytes) / BASE_PAGE_BYTES;
        self.line(
            indent + 1,
            &format!("<page_type size=\"{BASE_PAGE_BYTES}\" count=\"{base_pages}\"/>"),
        );
        for pool in &node.hugepages {
            self.line(
                indent + 1,
                &format!(
                    "<page_type size=\"{}\" count=\"{}\"/>",
                    pool.page_size_bytes, pool.count
                ),
            );
        }
        self.line(indent, "</object>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps() {
        assert_eq!(bitmap_hex(&BTreeSet::new()), "0x0");
        assert_eq!(bitmap_hex(&BTreeSet::from([0, 1])), "0x00000003");
        assert_eq!(bitmap_hex(&BTreeSet::from([0, 33])), "0x00000002,0x00000001");
        assert_eq!(
            bitmap_hex(&BTreeSet::from([64])),
            "0x00000001,0x00000000,0x00000000"
        );
    }

    #[test]
    fn bus_ids() {
        assert_eq!(parse_bus_id("0000:3b:00.0"), Some((0, 0x3b, 0, 0)));
        assert_eq!(parse_bus_id("10000:3b:00.0"), None);
        assert_eq!(parse_bus_id("0000:3b:20.0"), None);
        assert_eq!(parse_bus_id("0000:3b:1f.7"), Some((0, 0x3b, 0x1f, 7)));
        assert_eq!(parse_bus_id("3b:00.0"), None);
    }
}
