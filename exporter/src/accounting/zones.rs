//! The NRT zones built from the tallies: capacity, allocatable and available per resource.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use numaplane::nrt::{self, AttributeInfo, CostInfo, ResourceInfo, Zone, attr};
use numaplane::quantity::{Format, Quantity};
use numaplane_topology::parse_hugepage_resource_name;

use super::tally::{ZoneTally, overflow, publishable_device_id};
use super::*;

/// The distance of a NUMA node to itself (ACPI SLIT `LOCAL_DISTANCE`).
const LOCAL_DISTANCE: i64 = 10;

impl Accumulator<'_, '_> {
    pub(super) fn build_zones(&mut self) -> Result<Vec<Zone>, AccountingError> {
        let index = self.index;
        let tallies = std::mem::take(&mut self.zones);
        let mut zones = Vec::with_capacity(tallies.len());
        for (&id, node) in &index.nodes {
            let empty = ZoneTally::default();
            let tally = tallies.get(&id).unwrap_or(&empty);
            zones.push(self.build_zone(id, node, tally)?);
        }
        zones.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(zones)
    }

    pub(super) fn build_zone(
        &mut self,
        id: u32,
        node: &NodeView,
        tally: &ZoneTally,
    ) -> Result<Zone, AccountingError> {
        let zone = nrt::zone_name(id);
        let mut rows = Vec::new();
        let cpu_published = !self.excluded.contains(RESOURCE_CPU);
        let logical_cpus = self.index.logical_cpus(id);

        if cpu_published && !tally.alloc_cpus.is_empty() {
            let (alloc, used) = (tally.alloc_cpus.len() as u64, tally.used_cpus.len() as u64);
            rows.push(self.row(&zone, RESOURCE_CPU, Some(logical_cpus), alloc, used)?);
        }
        for (memory_type, &alloc) in &tally.alloc_memory {
            let used = tally.used_memory.get(memory_type).copied().unwrap_or(0);
            rows.push(self.row(
                &zone,
                memory_type,
                memory_capacity(node, memory_type),
                alloc,
                used,
            )?);
        }
        for (resource, ids) in &tally.alloc_devices {
            let used = tally.used_devices.get(resource).map_or(0, BTreeSet::len) as u64;
            rows.push(self.row(&zone, resource, None, ids.len() as u64, used)?);
        }
        // Every NUMA node stays visible, even one with nothing allocatable (memory-only nodes,
        // CPU manager policy `none` without devices or memory).
        if rows.is_empty() && cpu_published {
            rows.push(self.row(
                &zone,
                RESOURCE_CPU,
                Some(logical_cpus),
                0,
                tally.used_cpus.len() as u64,
            )?);
        }

        // Used where nothing is allocatable: no row to subtract from, but worth counting.
        let has_row = |name: &str| rows.iter().any(|r: &ResourceInfo| r.name == name);
        let mut orphans = Vec::new();
        if !tally.used_cpus.is_empty() && !has_row(RESOURCE_CPU) {
            orphans.push((RESOURCE_CPU.to_owned(), tally.used_cpus.len() as u64));
        }
        for (memory_type, &used) in &tally.used_memory {
            if used > 0 && !has_row(memory_type) {
                orphans.push((memory_type.clone(), used));
            }
        }
        for (resource, ids) in &tally.used_devices {
            if !ids.is_empty() && !has_row(resource) {
                orphans.push((resource.clone(), ids.len() as u64));
            }
        }
        for (resource, used) in orphans {
            self.note(
                AnomalyKind::UsedExceedsAllocatable,
                format!("{zone}: {used} of {resource} used but none allocatable"),
            );
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));

        let mut attributes = Vec::new();
        for resource in &self.device_resources {
            let used = self.used_device_ids.get(resource);
            let free = tally
                .alloc_devices
                .get(resource)
                .into_iter()
                .flatten()
                .filter(|id| publishable_device_id(id) && !used.is_some_and(|u| u.contains(*id)));
            attributes.push(AttributeInfo {
                name: format!("{}{resource}", attr::FREE_DEVICES_PREFIX),
                value: nrt::join_device_ids(free),
            });
        }
        if !node.cores.is_empty() && !self.excluded.contains(RESOURCE_CPU) {
            let free_cores = node
                .cores
                .iter()
                .filter(|core| {
                    !core.is_empty()
                        && core
                            .iter()
                            .all(|c| tally.alloc_cpus.contains(c) && !tally.used_cpus.contains(c))
                })
                .count();
            attributes.push(AttributeInfo {
                name: attr::FREE_CORES.to_owned(),
                value: free_cores.to_string(),
            });
        }
        attributes.sort_by(|a, b| a.name.cmp(&b.name));

        let mut costs = Vec::new();
        let mut seen = BTreeSet::new();
        for &(to, distance) in &node.distances {
            if !seen.insert(to) {
                continue;
            }
            let name = nrt::zone_name(to);
            let value = i64::try_from(distance).map_err(|_| overflow("publishing distance", id, &name))?;
            costs.push(CostInfo { name, value });
        }
        // hwloc has no matrix on a one-node machine (and the kernel row may be missing): a zone
        // is always at the local distance from itself, as RTE and NFD publish it.
        if seen.insert(id) {
            costs.push(CostInfo {
                name: nrt::zone_name(id),
                value: LOCAL_DISTANCE,
            });
        }
        costs.sort_by(|a, b| a.name.cmp(&b.name));

        Ok(Zone {
            name: zone,
            zone_type: nrt::ZONE_TYPE_NODE.to_owned(),
            parent: None,
            costs: (!costs.is_empty()).then_some(costs),
            attributes: (!attributes.is_empty()).then_some(attributes),
            resources: Some(rows),
        })
    }

    pub(super) fn row(
        &mut self,
        zone: &str,
        name: &str,
        capacity: Option<u64>,
        allocatable: u64,
        used: u64,
    ) -> Result<ResourceInfo, AccountingError> {
        let capacity = match capacity {
            Some(c) if c >= allocatable => c,
            Some(c) if c > 0 => {
                self.note(
                    AnomalyKind::AllocatableExceedsCapacity,
                    format!("{zone}: {name} allocatable {allocatable} exceeds machine capacity {c}"),
                );
                allocatable
            }
            _ => allocatable,
        };
        if used > allocatable {
            self.note(
                AnomalyKind::UsedExceedsAllocatable,
                format!(
                    "{zone}: {name} used {used} exceeds allocatable {allocatable}; available clamped to 0"
                ),
            );
        }
        let available = allocatable.saturating_sub(used);
        let quantity = |value: u64, field: &'static str| {
            i64::try_from(value)
                .map(|v| K8sQuantity::from(Quantity::from_int(v, Format::DecimalSI)))
                .map_err(|_| AccountingError::Overflow {
                    operation: field,
                    zone: zone.to_owned(),
                    what: name.to_owned(),
                })
        };
        Ok(ResourceInfo {
            name: name.to_owned(),
            capacity: quantity(capacity, "publishing capacity")?,
            allocatable: quantity(allocatable, "publishing allocatable")?,
            available: quantity(available, "publishing available")?,
        })
    }
}

/// Machine capacity of a memory type on a node (`None` when unknown or zero).
pub(super) fn memory_capacity(node: &NodeView, memory_type: &str) -> Option<u64> {
    if memory_type == RESOURCE_MEMORY {
        return node.memory_bytes.filter(|&b| b > 0);
    }
    if let Some(&bytes) = node.hugepages_bytes.get(memory_type) {
        return Some(bytes).filter(|&b| b > 0);
    }
    // Same page size spelled differently (`hugepages-2048Ki` vs `hugepages-2Mi`).
    let size = parse_hugepage_resource_name(memory_type)?;
    node.hugepages_bytes
        .iter()
        .find(|(name, _)| parse_hugepage_resource_name(name) == Some(size))
        .map(|(_, &bytes)| bytes)
        .filter(|&b| b > 0)
}
