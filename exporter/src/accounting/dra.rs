//! DRA devices per NUMA zone: the devices of the node's ResourceSlices, each placed on its NUMA
//! node by [`numaplane::device_numa::device_numa`] (the function the scheduler places them with),
//! and which of them the pods' claims hold (pod-resources `dynamic_resources`). Counted for
//! reading only (metrics, a zone attribute, `kubectl numa top`): never charged to the zones'
//! resources, which stay what the kubelet's Topology Manager aligns.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use numaplane::device_numa::{DriverNumaAttributes, device_numa};
use numaplane::nrt::DraDeviceCount;
use numaplane::pci_locality::PciBusRange;
use numaplane::proto::podresources::PodResources;

use super::{Anomaly, AnomalyKind};

/// What the exporter knows of the node's DRA devices besides pod-resources.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraInputs {
    /// The ResourceSlices of this node (`spec.nodeName`), every generation as listed.
    pub slices: Vec<ResourceSlice>,
    /// Driver-specific attributes naming a device's NUMA node, per driver.
    pub driver_attributes: DriverNumaAttributes,
}

/// DRA devices per NUMA node and driver, and those no source places.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraZones {
    /// By NUMA node id, then driver. A device on several NUMA nodes (a list attribute) counts
    /// in each, as the kubelet counts a device-plugin device per (ID, NUMA node).
    pub by_numa: BTreeMap<u32, BTreeMap<String, DraDeviceCount>>,
    /// Devices without a NUMA node of the machine, by driver; also the devices the pods' claims
    /// hold that no slice of this node lists (from a slice shared by several nodes, or gone).
    pub without_numa: BTreeMap<String, DraDeviceCount>,
}

/// A device as DRA names it.
type DeviceKey = (String, String, String);

/// The devices the pods' claims hold, each once however many containers and claims share it.
/// A claim device without driver, pool or device name (kubelets before 1.31 send only CDI
/// names) cannot be matched: it is an anomaly and left out.
fn claimed_devices(pods: &[&PodResources], anomalies: &mut Vec<Anomaly>) -> BTreeSet<DeviceKey> {
    let mut out = BTreeSet::new();
    for pod in pods {
        for c in &pod.containers {
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    if r.driver_name.is_empty() || r.pool_name.is_empty() || r.device_name.is_empty() {
                        anomalies.push(Anomaly {
                            kind: AnomalyKind::DraClaimUnidentified,
                            detail: format!(
                                "pod {}/{} container {} claim {}/{}: a device without driver, pool or device name (CDI {:?}); not counted",
                                pod.namespace,
                                pod.name,
                                c.name,
                                claim.claim_namespace,
                                claim.claim_name,
                                r.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>()
                            ),
                        });
                        continue;
                    }
                    out.insert((r.driver_name.clone(), r.pool_name.clone(), r.device_name.clone()));
                }
            }
        }
    }
    out
}

/// The devices of the current generation of every pool (kube-scheduler ignores older
/// generations while a driver republishes), by key; the first listing of a device wins.
fn current_devices(slices: &[ResourceSlice]) -> BTreeMap<DeviceKey, &Device> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in slices {
        let g = newest
            .entry((&s.spec.driver, &s.spec.pool.name))
            .or_insert(i64::MIN);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut out = BTreeMap::new();
    for s in slices {
        if newest.get(&(s.spec.driver.as_str(), s.spec.pool.name.as_str())) != Some(&s.spec.pool.generation) {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            out.entry((s.spec.driver.clone(), s.spec.pool.name.clone(), d.name.clone()))
                .or_insert(d);
        }
    }
    out
}

/// Places every device of `dra`'s slices and of the pods' claims. `numa_ids`: the machine's NUMA
/// nodes; a device placed on another id is an anomaly and counted without NUMA node.
pub(super) fn dra_zones(
    pods: &[&PodResources],
    dra: &DraInputs,
    pci_locality: &[PciBusRange],
    numa_ids: &BTreeSet<u32>,
    anomalies: &mut Vec<Anomaly>,
) -> DraZones {
    let claimed = claimed_devices(pods, anomalies);
    let devices = current_devices(&dra.slices);
    let mut zones = DraZones::default();
    let mut count = |place: Option<u32>, driver: &str, held: bool| {
        let c = match place {
            Some(id) => zones
                .by_numa
                .entry(id)
                .or_default()
                .entry(driver.to_owned())
                .or_default(),
            None => zones.without_numa.entry(driver.to_owned()).or_default(),
        };
        c.total = c.total.saturating_add(1);
        if !held {
            c.free = c.free.saturating_add(1);
        }
    };
    for (key, device) in &devices {
        let (driver, pool, name) = key;
        let held = claimed.contains(key);
        let nodes = match device_numa(driver, device, &dra.driver_attributes, pci_locality) {
            Ok(Some(n)) => n.nodes,
            Ok(None) => Vec::new(),
            Err(e) => {
                anomalies.push(Anomaly {
                    kind: AnomalyKind::DraDeviceNuma,
                    detail: format!("driver {driver} pool {pool}: {e}; counted without NUMA node"),
                });
                Vec::new()
            }
        };
        let (known, unknown): (Vec<u32>, Vec<u32>) = nodes.into_iter().partition(|n| numa_ids.contains(n));
        if !unknown.is_empty() {
            anomalies.push(Anomaly {
                kind: AnomalyKind::UnknownNuma,
                detail: format!(
                    "DRA device {name} of driver {driver} pool {pool} is on NUMA node(s) {unknown:?}, which this machine does not have"
                ),
            });
        }
        if known.is_empty() {
            count(None, driver, held);
        }
        for id in known {
            count(Some(id), driver, held);
        }
    }
    for key in claimed.iter().filter(|k| !devices.contains_key(*k)) {
        tracing::debug!(
            driver = %key.0,
            pool = %key.1,
            device = %key.2,
            "a claimed DRA device is in no ResourceSlice of this node; counted without NUMA node"
        );
        count(None, &key.0, true);
    }
    zones
}
