//! What init containers still hold (from [`crate::init_held`]) merged into their pod: known
//! identities as one more container, counted ones charged to the best-fitting zones.

use std::collections::{BTreeMap, BTreeSet};

use numaplane::proto::podresources::{
    ContainerDevices, ContainerMemory, ContainerResources, NumaNode, PodResources, TopologyInfo,
};

use super::tally::ZoneTally;
use super::*;
use crate::init_held::Held;

impl Accumulator<'_, '_> {
    /// Charges what a pod's init containers hold in number only (pod-spec source): free CPUs
    /// and devices next to the pod's own first (the kubelet aligned them with the same hint),
    /// then in the zones with the most free, lowest IDs first.
    pub(super) fn add_counted(&mut self, pod: &PodResources, held: &Held) {
        let owner = format!("pod {}/{}", pod.namespace, pod.name);
        if held.cpu_count > 0 && !self.excluded.contains(RESOURCE_CPU) {
            let own: BTreeSet<u32> = pod
                .containers
                .iter()
                .flat_map(|c| &c.cpu_ids)
                .filter_map(|&c| self.index.cpu(c).map(|(_, node)| node))
                .collect();
            let order = self.zone_order(&own, |t| t.alloc_cpus.difference(&t.used_cpus).count());
            let mut left = held.cpu_count;
            for node in order {
                let tally = self.zone(node);
                let free: Vec<u32> = tally.alloc_cpus.difference(&tally.used_cpus).copied().collect();
                for cpu in free.into_iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
                    tally.used_cpus.insert(cpu);
                    left -= 1;
                }
            }
            if left > 0 {
                self.note(
                    AnomalyKind::UsedExceedsAllocatable,
                    format!("{owner}: init containers hold {left} more CPUs than are free"),
                );
            }
        }
        for (resource, &count) in &held.device_counts {
            if count == 0 || self.excluded.contains(resource.as_str()) {
                continue;
            }
            let own: BTreeSet<u32> = pod
                .containers
                .iter()
                .flat_map(|c| &c.devices)
                .filter(|d| &d.resource_name == resource)
                .flat_map(|d| &d.device_ids)
                .filter_map(|id| self.alloc_nodes.get(resource).and_then(|ids| ids.get(id)))
                .flatten()
                .copied()
                .collect();
            let used_anywhere = self.used_device_ids.get(resource).cloned().unwrap_or_default();
            let free_in = |t: &ZoneTally| -> Vec<String> {
                t.alloc_devices
                    .get(resource)
                    .into_iter()
                    .flatten()
                    .filter(|id| !used_anywhere.contains(*id))
                    .cloned()
                    .collect()
            };
            let order = self.zone_order(&own, |t| free_in(t).len());
            let mut left = count;
            for node in order {
                let free = free_in(self.zone(node));
                for id in free.into_iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
                    if !self
                        .used_device_ids
                        .entry(resource.clone())
                        .or_default()
                        .insert(id.clone())
                    {
                        continue;
                    }
                    self.zone(node)
                        .used_devices
                        .entry(resource.clone())
                        .or_default()
                        .insert(id);
                    left -= 1;
                }
            }
            if left > 0 {
                self.note(
                    AnomalyKind::UsedExceedsAllocatable,
                    format!("{owner}: init containers hold {left} more {resource} than are free"),
                );
            }
        }
    }

    /// The pod's own zones ascending, then the others by most free (`free`), then by id.
    pub(super) fn zone_order(&self, own: &BTreeSet<u32>, free: impl Fn(&ZoneTally) -> usize) -> Vec<u32> {
        let mut others: Vec<(usize, u32)> = self
            .zones
            .iter()
            .filter(|(id, _)| !own.contains(id))
            .map(|(&id, t)| (free(t), id))
            .collect();
        others.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        own.iter()
            .copied()
            .filter(|id| self.zones.contains_key(id))
            .chain(others.into_iter().map(|(_, id)| id))
            .collect()
    }
}

/// Name of the pseudo-container that carries what a pod's init containers still hold.
pub(super) const HELD_BY_INIT: &str = "(held by init containers)";

pub(super) fn topology(nodes: &[i64]) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: nodes.iter().map(|&id| NumaNode { id }).collect(),
    })
}

/// `pod` with the identified part of `held` added as one more container (memory at pod level
/// when the kubelet reports pod-level memory, since that replaces the containers' blocks).
pub(super) fn with_held(pod: &PodResources, held: &Held) -> PodResources {
    let mut pod = pod.clone();
    let mut extra = ContainerResources {
        name: HELD_BY_INIT.to_owned(),
        cpu_ids: held.cpu_ids.iter().map(|&c| i64::from(c)).collect(),
        ..Default::default()
    };
    for (resource, ids) in &held.device_ids {
        // One entry per NUMA placement, as the kubelet groups them.
        let mut by_nodes: BTreeMap<&[i64], Vec<String>> = BTreeMap::new();
        for (id, nodes) in ids {
            by_nodes.entry(nodes.as_slice()).or_default().push(id.clone());
        }
        for (nodes, device_ids) in by_nodes {
            extra.devices.push(ContainerDevices {
                resource_name: resource.clone(),
                device_ids,
                topology: topology(nodes),
            });
        }
    }
    let memory = held.memory.iter().map(|b| ContainerMemory {
        memory_type: b.memory_type.clone(),
        size: b.size,
        topology: topology(&b.numa_affinity),
    });
    if pod.memory.is_empty() {
        extra.memory.extend(memory);
    } else {
        pod.memory.extend(memory);
    }
    pod.containers.push(extra);
    pod
}
