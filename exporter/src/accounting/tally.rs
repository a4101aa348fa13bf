//! What pods hold, tallied per zone: allocatable resources in, exclusive CPUs, memory blocks
//! and devices charged to the zones the kubelet reports.

use std::collections::{BTreeMap, BTreeSet};

use numaplane::nrt::{self};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, PodResources, TopologyInfo,
};

use super::machine::Numa;
use super::*;

#[derive(Default)]
pub(super) struct ZoneTally {
    pub(super) alloc_cpus: BTreeSet<u32>,
    pub(super) used_cpus: BTreeSet<u32>,
    /// Memory type → bytes.
    pub(super) alloc_memory: BTreeMap<String, u64>,
    pub(super) used_memory: BTreeMap<String, u64>,
    /// Resource → device ids.
    pub(super) alloc_devices: BTreeMap<String, BTreeSet<String>>,
    pub(super) used_devices: BTreeMap<String, BTreeSet<String>>,
}

/// A multi-NUMA memory block from List, spread after all exact single-node blocks are known.
pub(super) struct SpreadBlock {
    pub(super) memory_type: String,
    pub(super) size: u64,
    pub(super) nodes: Vec<u32>,
}

pub(super) struct Accumulator<'a, 'm> {
    pub(super) index: &'a MachineIndex<'m>,
    pub(super) excluded: BTreeSet<&'a str>,
    pub(super) zones: BTreeMap<u32, ZoneTally>,
    /// Device resources with at least one NUMA-aligned allocatable device (free-devices
    /// attributes are published for these in every zone).
    pub(super) device_resources: BTreeSet<String>,
    /// Resource → device ids held by some accounted pod, whatever the node.
    pub(super) used_device_ids: BTreeMap<String, BTreeSet<String>>,
    /// Resource → allocatable device ids without any NUMA node: in no zone, published as the
    /// node attribute [`attr::DEVICES_WITHOUT_NUMA_PREFIX`] so the scheduler can count them.
    pub(super) unaligned_devices: BTreeMap<String, BTreeSet<String>>,
    /// (resource, device id) → the NUMA nodes GetAllocatableResources gives it: where a used
    /// device is charged, before the List entry's own topology.
    pub(super) alloc_nodes: BTreeMap<String, BTreeMap<String, Vec<u32>>>,
    pub(super) anomalies: Vec<Anomaly>,
}

pub(super) fn overflow(operation: &'static str, node: u32, what: &str) -> AccountingError {
    AccountingError::Overflow {
        operation,
        zone: nrt::zone_name(node),
        what: what.to_owned(),
    }
}

pub(super) fn add_bytes(
    map: &mut BTreeMap<String, u64>,
    memory_type: &str,
    bytes: u64,
    node: u32,
    operation: &'static str,
) -> Result<(), AccountingError> {
    let total = map.entry(memory_type.to_owned()).or_default();
    *total = total
        .checked_add(bytes)
        .ok_or_else(|| overflow(operation, node, memory_type))?;
    Ok(())
}

pub(super) fn valid_memory_type(name: &str) -> bool {
    numaplane::resource_name::is_memory_type(name)
}

pub(super) fn valid_device_resource(name: &str) -> bool {
    use numaplane::resource_name::{Class, classify};
    !name.is_empty() && !matches!(classify(name), Class::Cpu | Class::Memory | Class::Hugepages)
}

/// Whether the scheduler can read the id back from a device-ID list attribute.
pub(super) fn publishable_device_id(id: &str) -> bool {
    nrt::is_listable_device_id(id)
}

impl<'a, 'm> Accumulator<'a, 'm> {
    pub(super) fn new(index: &'a MachineIndex<'m>, excluded: BTreeSet<&'a str>) -> Self {
        let zones = index.nodes.keys().map(|&id| (id, ZoneTally::default())).collect();
        Self {
            index,
            excluded,
            zones,
            device_resources: BTreeSet::new(),
            used_device_ids: BTreeMap::new(),
            unaligned_devices: BTreeMap::new(),
            alloc_nodes: BTreeMap::new(),
            anomalies: Vec::new(),
        }
    }

    pub(super) fn note(&mut self, kind: AnomalyKind, detail: String) {
        self.anomalies.push(Anomaly { kind, detail });
    }

    pub(super) fn zone(&mut self, node: u32) -> &mut ZoneTally {
        // Every known node got a tally in `new`; callers only pass known nodes.
        self.zones.entry(node).or_default()
    }

    /// Known NUMA nodes of a topology, ascending and deduplicated; unknown ids are noted.
    pub(super) fn known_nodes(&mut self, topology: Option<&TopologyInfo>, what: &str) -> Vec<u32> {
        let mut known = BTreeSet::new();
        for n in topology.map(|t| t.nodes.as_slice()).unwrap_or_default() {
            match self.index.numa(n.id) {
                Numa::Known(id) => {
                    known.insert(id);
                }
                Numa::Unaligned => {}
                Numa::Unknown(id) => self.note(
                    AnomalyKind::UnknownNuma,
                    format!("{what}: NUMA node {id} is not on this machine"),
                ),
            }
        }
        known.into_iter().collect()
    }

    /// NUMA nodes of a memory block, or `None` when the block is to be skipped (noted).
    pub(super) fn memory_placement(&mut self, block: &ContainerMemory, what: &str) -> Option<Vec<u32>> {
        if block.size == 0 {
            // The kubelet omits empty blocks; a zero size carries no information.
            return None;
        }
        if !valid_memory_type(&block.memory_type) {
            self.note(
                AnomalyKind::InvalidResourceName,
                format!(
                    "{what}: memory type {:?} is neither memory nor hugepages-<size>",
                    block.memory_type
                ),
            );
            return None;
        }
        if self.excluded.contains(block.memory_type.as_str()) {
            return None;
        }
        let nodes = self.known_nodes(block.topology.as_ref(), what);
        let any_unknown = block
            .topology
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
        if nodes.is_empty() {
            if !any_unknown {
                self.note(
                    AnomalyKind::UnalignedMemory,
                    format!(
                        "{what}: {} block of {} bytes has no NUMA node",
                        block.memory_type, block.size
                    ),
                );
            }
            return None;
        }
        Some(nodes)
    }

    /// NUMA nodes of a device entry, or `None` when the entry is to be skipped (noted).
    pub(super) fn device_placement(&mut self, dev: &ContainerDevices, what: &str) -> Option<Vec<u32>> {
        self.device_resource_usable(dev, what)
            .then(|| self.entry_nodes(dev, what))
    }

    /// Whether a device entry's resource is accounted: a valid device resource name (noted
    /// otherwise) that is not excluded.
    pub(super) fn device_resource_usable(&mut self, dev: &ContainerDevices, what: &str) -> bool {
        if !valid_device_resource(&dev.resource_name) {
            self.note(
                AnomalyKind::InvalidResourceName,
                format!(
                    "{what}: device resource name {:?} is empty or reserved",
                    dev.resource_name
                ),
            );
            return false;
        }
        !self.excluded.contains(dev.resource_name.as_str())
    }

    /// The NUMA nodes of a device entry's own topology (a device without any is noted).
    pub(super) fn entry_nodes(&mut self, dev: &ContainerDevices, what: &str) -> Vec<u32> {
        let nodes = self.known_nodes(dev.topology.as_ref(), what);
        let any_unknown = dev
            .topology
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
        if nodes.is_empty() && !any_unknown && !dev.device_ids.is_empty() {
            self.note(
                AnomalyKind::UnalignedDevice,
                format!(
                    "{what}: {} devices {:?} have no NUMA affinity",
                    dev.resource_name, dev.device_ids
                ),
            );
        }
        nodes
    }

    pub(super) fn add_allocatable(
        &mut self,
        alloc: &AllocatableResourcesResponse,
    ) -> Result<(), AccountingError> {
        if !self.excluded.contains(RESOURCE_CPU) {
            let mut seen = BTreeSet::new();
            for &raw in &alloc.cpu_ids {
                if !seen.insert(raw) {
                    self.note(
                        AnomalyKind::DuplicateCpu,
                        format!("allocatable: CPU {raw} is listed twice"),
                    );
                    continue;
                }
                match self.index.cpu(raw) {
                    Some((cpu, node)) => {
                        self.zone(node).alloc_cpus.insert(cpu);
                    }
                    None => self.note(
                        AnomalyKind::UnknownCpu,
                        format!("allocatable: CPU {raw} is not an online CPU of this machine"),
                    ),
                }
            }
        }

        for block in &alloc.memory {
            let Some(nodes) = self.memory_placement(block, "allocatable memory") else {
                continue;
            };
            if let [node] = nodes[..] {
                add_bytes(
                    &mut self.zone(node).alloc_memory,
                    &block.memory_type,
                    block.size,
                    node,
                    "summing allocatable",
                )?;
                continue;
            }
            self.note(
                AnomalyKind::MultiNumaAllocatable,
                format!(
                    "allocatable: {} block of {} bytes spans NUMA nodes {nodes:?}; split evenly",
                    block.memory_type, block.size
                ),
            );
            // The kubelet sends one block per node; should that change, an even split keeps the
            // node total right without inventing a per-node breakdown. The remainder goes to the
            // lowest nodes, a byte each.
            let count = nodes.len() as u64;
            let (share, remainder) = (block.size / count, block.size % count);
            for (i, &node) in nodes.iter().enumerate() {
                let bytes = share + u64::from((i as u64) < remainder);
                add_bytes(
                    &mut self.zone(node).alloc_memory,
                    &block.memory_type,
                    bytes,
                    node,
                    "summing allocatable",
                )?;
            }
        }

        for dev in &alloc.devices {
            let Some(nodes) = self.device_placement(dev, "allocatable") else {
                continue;
            };
            // No NUMA node at all (no topology, or only the kubelet's negative "none"), as
            // opposed to a node this machine lacks (an anomaly, left out).
            let unaligned = nodes.is_empty()
                && !dev
                    .topology
                    .as_ref()
                    .is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0));
            for id in &dev.device_ids {
                if id.is_empty() {
                    self.note(
                        AnomalyKind::InvalidDeviceId,
                        format!("allocatable: empty {} device id", dev.resource_name),
                    );
                    continue;
                }
                if !nodes.is_empty() && !publishable_device_id(id) {
                    self.note(
                        AnomalyKind::InvalidDeviceId,
                        format!(
                            "allocatable: {} device id {id:?} cannot be listed in the free-devices attribute",
                            dev.resource_name
                        ),
                    );
                }
                if unaligned {
                    self.unaligned_devices
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .insert(id.clone());
                }
                if !nodes.is_empty() {
                    self.alloc_nodes
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .entry(id.clone())
                        .or_default()
                        .extend(nodes.iter().copied());
                }
                for &node in &nodes {
                    self.device_resources.insert(dev.resource_name.clone());
                    let ids = self
                        .zone(node)
                        .alloc_devices
                        .entry(dev.resource_name.clone())
                        .or_default();
                    if !ids.insert(id.clone()) {
                        self.note(
                            AnomalyKind::DuplicateDevice,
                            format!(
                                "allocatable: {} device {id} on NUMA node {node} is listed twice",
                                dev.resource_name
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn add_used(&mut self, pods: &[&PodResources]) -> Result<(), AccountingError> {
        // Exclusive resources belong to one pod; a second claimant is stale data (e.g. a
        // terminal pod on an old kubelet) and must not be subtracted twice.
        let mut cpu_owner: BTreeMap<u32, usize> = BTreeMap::new();
        let mut device_owner: BTreeMap<(String, String, u32), usize> = BTreeMap::new();
        let mut spread = Vec::new();

        for (pi, pod) in pods.iter().enumerate() {
            let owner = format!("pod {}/{}", pod.namespace, pod.name);

            if !self.excluded.contains(RESOURCE_CPU) {
                // Pod-level CPUs overlap the containers' by design: count each CPU once.
                let cpus: BTreeSet<i64> = pod
                    .cpu_ids
                    .iter()
                    .chain(pod.containers.iter().flat_map(|c| &c.cpu_ids))
                    .copied()
                    .collect();
                for raw in cpus {
                    let Some((cpu, node)) = self.index.cpu(raw) else {
                        self.note(
                            AnomalyKind::UnknownCpu,
                            format!("{owner}: CPU {raw} is not an online CPU of this machine"),
                        );
                        continue;
                    };
                    if let Some(&first) = cpu_owner.get(&cpu) {
                        let first = pods.get(first).map(|p| format!("{}/{}", p.namespace, p.name));
                        self.note(
                            AnomalyKind::DoubleAssignment,
                            format!(
                                "{owner}: CPU {cpu} is also held by pod {}",
                                first.unwrap_or_default()
                            ),
                        );
                        continue;
                    }
                    cpu_owner.insert(cpu, pi);
                    self.zone(node).used_cpus.insert(cpu);
                }
            }

            // Pod-level memory is the pod's whole exclusive memory, container blocks are a view
            // of the same bytes: prefer the pod-level blocks when present.
            let blocks: Vec<&ContainerMemory> = if pod.memory.is_empty() {
                pod.containers.iter().flat_map(|c| &c.memory).collect()
            } else {
                pod.memory.iter().collect()
            };
            for block in blocks {
                let Some(nodes) = self.memory_placement(block, &owner) else {
                    continue;
                };
                if let [node] = nodes[..] {
                    add_bytes(
                        &mut self.zone(node).used_memory,
                        &block.memory_type,
                        block.size,
                        node,
                        "summing used",
                    )?;
                } else {
                    spread.push(SpreadBlock {
                        memory_type: block.memory_type.clone(),
                        size: block.size,
                        nodes,
                    });
                }
            }

            for dev in pod.containers.iter().flat_map(|c| &c.devices) {
                if !self.device_resource_usable(dev, &owner) {
                    continue;
                }
                // The entry's own topology is only the fallback for ids allocatable does not
                // place (a List entry may come without topology).
                let mut entry_nodes: Option<Vec<u32>> = None;
                for id in &dev.device_ids {
                    if id.is_empty() {
                        self.note(
                            AnomalyKind::InvalidDeviceId,
                            format!("{owner}: empty {} device id", dev.resource_name),
                        );
                        continue;
                    }
                    // Marked used whatever its placement, so it is never offered as free.
                    self.used_device_ids
                        .entry(dev.resource_name.clone())
                        .or_default()
                        .insert(id.clone());
                    let placed = self
                        .alloc_nodes
                        .get(dev.resource_name.as_str())
                        .and_then(|ids| ids.get(id.as_str()));
                    let nodes = match placed {
                        Some(n) => n.clone(),
                        None => {
                            if entry_nodes.is_none() {
                                entry_nodes = Some(self.entry_nodes(dev, &owner));
                            }
                            entry_nodes.clone().unwrap_or_default()
                        }
                    };
                    for &node in &nodes {
                        let key = (dev.resource_name.clone(), id.clone(), node);
                        if let Some(&first) = device_owner.get(&key) {
                            if first != pi {
                                let first = pods.get(first).map(|p| format!("{}/{}", p.namespace, p.name));
                                self.note(
                                    AnomalyKind::DoubleAssignment,
                                    format!(
                                        "{owner}: {} device {id} is also held by pod {}",
                                        dev.resource_name,
                                        first.unwrap_or_default()
                                    ),
                                );
                            }
                            continue;
                        }
                        device_owner.insert(key, pi);
                        self.zone(node)
                            .used_devices
                            .entry(dev.resource_name.clone())
                            .or_default()
                            .insert(id.clone());
                    }
                }
            }
        }

        for block in spread {
            self.spread_memory(&block)?;
        }
        Ok(())
    }

    /// Spreads a multi-NUMA block the way the memory manager filled it: ascending node order,
    /// each node up to what it has left; whatever does not fit stays on the last node, where it
    /// shows up as used beyond allocatable instead of vanishing.
    pub(super) fn spread_memory(&mut self, block: &SpreadBlock) -> Result<(), AccountingError> {
        let mut remaining = block.size;
        let last = block.nodes.len().saturating_sub(1);
        for (i, &node) in block.nodes.iter().enumerate() {
            let tally = self.zone(node);
            let alloc = tally.alloc_memory.get(&block.memory_type).copied().unwrap_or(0);
            let used = tally.used_memory.get(&block.memory_type).copied().unwrap_or(0);
            let take = if i == last {
                remaining
            } else {
                remaining.min(alloc.saturating_sub(used))
            };
            if take == 0 {
                continue;
            }
            add_bytes(
                &mut tally.used_memory,
                &block.memory_type,
                take,
                node,
                "spreading multi-NUMA memory",
            )?;
            remaining -= take;
        }
        Ok(())
    }
}
