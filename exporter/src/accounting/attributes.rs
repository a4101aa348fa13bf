//! Everything the NRT carries as an attribute: the fingerprint, the kubelet's configuration,
//! SMT width, PCI locality, memory groups, where init-held data came from, cluster-shared slots, devices
//! without a NUMA node and the node-level resources.

use std::collections::BTreeMap;

use numaplane::nrt::{self, AttributeInfo, attr};
use numaplane::proto::podresources::PodResources;

use super::tally::publishable_device_id;
use super::*;

/// The attributes and annotations published for `pods` with the tallies `acc`.
pub(super) fn attributes(
    machine: &MachineView,
    cfg: &AccountingConfig,
    _pods: &[&PodResources],
    acc: &Accumulator<'_, '_>,
    fingerprint: Option<&String>,
    node_level: Option<&std::collections::BTreeSet<String>>,
) -> (Vec<AttributeInfo>, BTreeMap<String, String>) {
    let mut attributes = Vec::new();
    let mut annotations = BTreeMap::new();
    if let (Some(fp), Some(method)) = (fingerprint, cfg.fingerprint_method) {
        attributes.push(AttributeInfo {
            name: attr::PODS_FINGERPRINT.to_owned(),
            value: fp.clone(),
        });
        attributes.push(AttributeInfo {
            name: attr::PODS_FINGERPRINT_METHOD.to_owned(),
            value: method.to_string(),
        });
        annotations.insert(nrt::ANNOTATION_FINGERPRINT.to_owned(), fp.clone());
    }
    // Empty values would be ignored by the scheduler anyway; publish what the kubelet runs with,
    // unless it is not known at all.
    let scope = or_default(&cfg.topology_manager_scope, DEFAULT_TOPOLOGY_MANAGER_SCOPE);
    let policy = or_default(&cfg.topology_manager_policy, DEFAULT_TOPOLOGY_MANAGER_POLICY);
    let publish = |value: &str| !value.is_empty() || !cfg.kubelet_config_unknown;
    if publish(&cfg.topology_manager_scope) {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_SCOPE.to_owned(),
            value: scope.to_owned(),
        });
    }
    if publish(&cfg.topology_manager_policy) {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_POLICY.to_owned(),
            value: policy.to_owned(),
        });
    }
    if let Some(max) = cfg.max_numa_nodes {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES.to_owned(),
            value: max.to_string(),
        });
    }
    if let Some(rm) = &cfg.resource_managers {
        attributes.push(AttributeInfo {
            name: attr::CPU_MANAGER_POLICY.to_owned(),
            value: rm.cpu_manager_policy.clone(),
        });
        if !rm.cpu_manager_policy_options.is_empty() {
            attributes.push(AttributeInfo {
                name: attr::CPU_MANAGER_POLICY_OPTIONS.to_owned(),
                value: nrt::join_cpu_manager_options(&rm.cpu_manager_policy_options),
            });
        }
        if !rm.topology_manager_policy_options.is_empty() {
            attributes.push(AttributeInfo {
                name: attr::TOPOLOGY_MANAGER_POLICY_OPTIONS.to_owned(),
                value: nrt::join_cpu_manager_options(&rm.topology_manager_policy_options),
            });
        }
        if let Some(reserved) = &rm.reserved_cpus {
            attributes.push(AttributeInfo {
                name: attr::RESERVED_CPUS.to_owned(),
                value: reserved.clone(),
            });
        }
        attributes.push(AttributeInfo {
            name: attr::MEMORY_MANAGER_POLICY.to_owned(),
            value: rm.memory_manager_policy.clone(),
        });
    }
    if let Some(width) = machine.nodes.iter().flat_map(|n| &n.cores).map(Vec::len).max() {
        attributes.push(AttributeInfo {
            name: attr::THREADS_PER_CORE.to_owned(),
            value: width.to_string(),
        });
    }
    // Only where hwloc knows it: the scheduler reads "absent" as unknown, never as "no
    // locality". A handful of bus ranges, however many PCI functions the machine has.
    if !machine.pci_locality.is_empty() {
        attributes.push(AttributeInfo {
            name: attr::PCI_LOCALITY.to_owned(),
            value: numaplane::pci_locality::join_pci_locality(&machine.pci_locality),
        });
    }
    if let Some(closest) = cfg.prefer_closest_numa_nodes {
        attributes.push(AttributeInfo {
            name: attr::TOPOLOGY_MANAGER_PREFER_CLOSEST.to_owned(),
            value: closest.to_string(),
        });
    }
    if let Some(groups) = &cfg.memory_groups {
        attributes.push(AttributeInfo {
            name: attr::MEMORY_GROUPS.to_owned(),
            value: nrt::join_memory_groups(groups),
        });
    }
    if let Some(sources) = &cfg.held_sources {
        attributes.push(AttributeInfo {
            name: attr::INIT_HELD_SOURCE.to_owned(),
            value: sources.to_string(),
        });
    }
    for resource in &cfg.cluster_shared {
        let held = acc
            .used_device_ids
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|id| publishable_device_id(id));
        attributes.push(AttributeInfo {
            name: format!("{}{resource}", attr::CLUSTER_HELD_PREFIX),
            value: nrt::join_device_ids(held),
        });
    }

    // Devices without a NUMA node are in no zone; the kubelet still hands them out (and its
    // Topology Manager decides differently for them), so the scheduler needs what is free.
    for (resource, ids) in &acc.unaligned_devices {
        let used = acc.used_device_ids.get(resource);
        let free: Vec<&String> = ids
            .iter()
            .filter(|id| !used.is_some_and(|u| u.contains(*id)))
            .collect();
        attributes.push(AttributeInfo {
            name: format!("{}{resource}", attr::DEVICES_WITHOUT_NUMA_PREFIX),
            value: nrt::join_devices_without_numa(u64::try_from(free.len()).unwrap_or(u64::MAX), free),
        });
    }

    // Written only where the Node is known: it promises that every extended resource the Node
    // allocates is in a zone, under devices-without-numa, or named here, so the scheduler
    // reads one it lacks as "not published yet", never as "no NUMA affinity".
    if let Some(names) = node_level {
        attributes.push(AttributeInfo {
            name: attr::NODE_LEVEL_RESOURCES.to_owned(),
            value: nrt::join_resource_names(names),
        });
    }

    (attributes, annotations)
}

pub(super) fn or_default<'s>(value: &'s str, default: &'s str) -> &'s str {
    if value.is_empty() { default } else { value }
}
