//! A bound pod's DRA claims, for `kubectl numa explain`: each claim's allocated devices with
//! their NUMA nodes (read from the node's ResourceSlices by [`numaplane::device_numa`], with
//! the node's PCI locality and the configured driver attributes) next to the NUMA nodes the
//! pod's `numaplane.io/allocation` record gives the containers that use it, and the verdict of
//! [`numa::claim_numa`]: the rule `simulate` applies to a predicted placement. Pure: built from
//! what [`super::fetch`] listed.

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use numaplane::{allocation::Allocation, device_numa::DriverNumaAttributes, nrt::NodeResourceTopology};
use serde::Serialize;

use crate::{
    dra::{
        numa::{
            self, AlignmentStatus, ClaimNuma, ContainerNuma, DeviceNumaEntry, DraNumaAlignment, NodeNuma,
            Pinned,
        },
        state::{ContainerClaim, DraState, pod_claims},
    },
    node::NumaTopology,
    resources::Resources,
};

/// The DRA objects a bound pod's claims are read from.
#[derive(Debug, Default)]
pub struct DraObjects {
    /// Every ResourceSlice.
    pub slices: Vec<ResourceSlice>,
    /// The ResourceClaims of the pod's namespace.
    pub claims: Vec<ResourceClaim>,
    /// Driver-specific NUMA attributes (the scheduler config's `draNuma.driverAttributes` over
    /// the built-in defaults).
    pub driver_attributes: DriverNumaAttributes,
}

/// Where a pod claim stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimState {
    /// The ResourceClaim has an allocation.
    Allocated,
    /// The ResourceClaim exists without an allocation.
    NotAllocated,
    /// The ResourceClaim the pod names does not exist.
    NotFound,
    /// A template's ResourceClaim is not created (the pod status names none).
    NotCreated,
}

/// One of the pod's `spec.resourceClaims`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundClaim {
    /// The pod claim's name.
    pub name: String,
    /// The ResourceClaim's name; absent while a template's claim is not created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claim: Option<String>,
    /// Where it stands.
    pub state: ClaimState,
    /// An allocated claim's devices with their NUMA nodes, its containers with their recorded
    /// ones, and the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<ClaimNuma>,
    /// Allocated devices (`driver/pool/device`) that no ResourceSlice of the node lists: their
    /// NUMA node is unknown.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_in_slices: Vec<String>,
}

/// The claims of `pod` (`namespace/name` `key`), bound to `node`, next to its `record`. The
/// record does not say what the kubelet pins, so every container with recorded NUMA nodes
/// counts as a user whose nodes the devices should follow (as under mode `Preferred`): a claim
/// shared by containers on disjoint NUMA nodes is `split`. Missing objects and malformed NUMA
/// attributes are added to `problems`.
pub fn bound_claims(
    pod: &Pod,
    key: &str,
    node: &str,
    record: Option<&Allocation>,
    nrt: Option<&NodeResourceTopology>,
    dra: &DraObjects,
    problems: &mut Vec<String>,
) -> Vec<BoundClaim> {
    let claims = pod_claims(pod);
    if claims.is_empty() {
        return Vec::new();
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let spec_containers: Vec<(&str, Vec<ContainerClaim>)> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| (c.name.as_str(), crate::pod::container_claims(c)))
        .collect();
    let containers: Vec<ContainerNuma<'_>> = spec_containers
        .iter()
        .map(|(name, claims)| ContainerNuma {
            name,
            numa_nodes: record.and_then(|r| {
                let c = r.containers.iter().find(|c| c.name == *name)?;
                c.numa_nodes.as_deref().or(r.pod_numa_nodes.as_deref())
            }),
            pinned: Pinned::default(),
            claims,
        })
        .collect();
    // The node as the scheduler reads its NRT: its NUMA node ids and PCI locality (a malformed
    // NRT is reported by the caller; its devices then have no NUMA node but by attribute).
    let topo = nrt.and_then(|t| NumaTopology::from_nrt(&mut Resources::default(), t).ok());
    let machine = topo.as_ref().map(|t| t.info.ids().to_vec()).unwrap_or_default();
    let pci_locality = topo.map(|t| t.pci_locality).unwrap_or_default();
    if let Some(Err(e)) = nrt.and_then(NodeResourceTopology::pci_locality) {
        problems.push(format!(
            "NodeResourceTopology {node}: {e}: devices placed by PCI address are shown without NUMA node"
        ));
    }
    let targets = numa::targets(DraNumaAlignment::Preferred, false, &machine, &containers);
    let ctx = NodeNuma {
        targets: &targets,
        machine: &machine,
        driver_attributes: &dra.driver_attributes,
        pci_locality: &pci_locality,
    };
    let mut state = DraState::default();
    state.set_slices(dra.slices.iter().cloned().map(Into::into).collect());
    claims
        .iter()
        .map(|pc| {
            let mut out = BoundClaim {
                name: pc.name.clone(),
                resource_claim: pc.claim.clone(),
                state: ClaimState::NotCreated,
                numa: None,
                not_in_slices: Vec::new(),
            };
            let Some(claim_name) = pc.claim.as_deref() else {
                problems.push(format!(
                    "pod {key} claim {}: no ResourceClaim created from its template (the pod status names none)",
                    pc.name
                ));
                return out;
            };
            let found = dra.claims.iter().find(|c| {
                c.metadata.name.as_deref() == Some(claim_name)
                    && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
            });
            let Some(claim) = found else {
                out.state = ClaimState::NotFound;
                problems.push(format!(
                    "pod {key} claim {}: ResourceClaim {namespace}/{claim_name} not found",
                    pc.name
                ));
                return out;
            };
            let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
                out.state = ClaimState::NotAllocated;
                return out;
            };
            out.state = ClaimState::Allocated;
            let pod_names: Vec<&str> = claims
                .iter()
                .filter(|o| o.claim.as_deref() == Some(claim_name))
                .map(|o| o.name.as_str())
                .collect();
            let mut devices = Vec::new();
            for r in allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                let id = format!("{}/{}/{}", r.driver, r.pool, r.device);
                let numa_nodes = match state.device_on(node, &r.driver, &r.pool, &r.device) {
                    None => {
                        problems.push(format!(
                            "pod {key} claim {}: device {id} is in no ResourceSlice of node {node}: its NUMA node is unknown",
                            pc.name
                        ));
                        out.not_in_slices.push(id.clone());
                        None
                    }
                    Some(d) => {
                        // The driver's bug is named; the device then has no NUMA node, as the
                        // scheduler treats it.
                        if let Err(e) = d.numa(&r.driver, &dra.driver_attributes, &pci_locality) {
                            problems.push(format!("pod {key} claim {}: driver {}: {e}", pc.name, r.driver));
                        }
                        ctx.device_nodes(&r.driver, d)
                    }
                };
                devices.push(DeviceNumaEntry {
                    device: id,
                    request: r.request.clone(),
                    numa_nodes,
                });
            }
            out.numa = Some(numa::claim_numa(&pod_names, devices, &containers, &targets));
            out
        })
        .collect()
}

/// The verdict with what it means, for the table.
pub fn verdict_text(a: AlignmentStatus) -> String {
    let why = match a {
        AlignmentStatus::Aligned => return a.label().to_owned(),
        AlignmentStatus::Misaligned => "a device is on none of the NUMA nodes of its containers",
        AlignmentStatus::NoNumaNode => "a device has no NUMA node, the others are aligned",
        AlignmentStatus::Split => "containers on disjoint NUMA nodes share it",
        AlignmentStatus::NotPredicted => "no container that uses it is recorded on some NUMA nodes only",
    };
    format!("{} ({why})", a.label())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "gpu.example.com";

    fn slice(node: &str) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-gpus")},
            "spec": {"driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}}},
                    {"name": "gpu-1", "attributes": {"resource.kubernetes.io/numaNode": {"int": 1}}},
                    {"name": "bare"},
                    {"name": "by-driver", "attributes": {"numa": {"int": 1}}},
                    {"name": "by-pci", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:81:00.0"}}},
                    {"name": "bad", "attributes": {"resource.kubernetes.io/numaNode": {"string": "zero"}}}
                ]}
        }))
        .unwrap()
    }

    fn claim(name: &str, devices: Option<&[&str]>) -> ResourceClaim {
        let mut c = json!({"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}});
        if let Some(devices) = devices {
            let results: Vec<_> = devices
                .iter()
                .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": d}))
                .collect();
            c["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        serde_json::from_value(c).unwrap()
    }

    /// Containers `app` (claim `gpu`) and `side` (claim `gpu` when `shared`), claims `gpu` and
    /// `nic` from ResourceClaims `p-gpu`, `p-nic`.
    fn pod(shared: bool) -> Pod {
        let side_claims = if shared {
            json!([{"name": "gpu"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1",
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "p-gpu"},
                    {"name": "nic", "resourceClaimName": "p-nic"}],
                "containers": [
                    {"name": "app", "resources": {"claims": [{"name": "gpu"}, {"name": "nic"}]}},
                    {"name": "side", "resources": {"claims": side_claims}}]}
        }))
        .unwrap()
    }

    fn record(app: &[u32], side: &[u32]) -> Allocation {
        serde_json::from_value(
            json!({"version": "v1", "node": "n1", "policy": "single-numa-node",
            "scope": "container", "containers": [
                {"name": "app", "kind": "app", "numaNodes": app},
                {"name": "side", "kind": "app", "numaNodes": side}]}),
        )
        .unwrap()
    }

    fn nrt_with_pci() -> NodeResourceTopology {
        let zone = |z: u32| {
            json!({"name": format!("node-{z}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]})
        };
        serde_json::from_value(json!({"metadata": {"name": "n1"},
            "attributes": [{"name": "numaplane.io/pci-locality", "value": "0000:80-ff=1"}],
            "zones": [zone(0), zone(1)]}))
        .unwrap()
    }

    fn objects(claims: Vec<ResourceClaim>) -> DraObjects {
        DraObjects {
            slices: vec![slice("n1"), slice("other")],
            claims,
            driver_attributes: configured(),
        }
    }

    /// The built-in defaults, and `numa` for the test's driver (as `draNuma.driverAttributes`).
    fn configured() -> DriverNumaAttributes {
        let mut attrs = numaplane::device_numa::default_driver_numa_attributes();
        attrs.insert(DRIVER.to_owned(), vec!["numa".to_owned()]);
        attrs
    }

    fn run(pod: &Pod, record: Option<&Allocation>, dra: &DraObjects) -> (Vec<BoundClaim>, Vec<String>) {
        let mut problems = Vec::new();
        let nrt = nrt_with_pci();
        let out = bound_claims(pod, "ns/p", "n1", record, Some(&nrt), dra, &mut problems);
        (out, problems)
    }

    fn numa_of(c: &BoundClaim) -> &ClaimNuma {
        c.numa.as_ref().unwrap_or_else(|| panic!("no numa: {c:?}"))
    }

    #[test]
    fn devices_next_to_the_recorded_nodes_with_the_verdict() {
        let dra = objects(vec![
            claim("p-gpu", Some(&["gpu-0"])),
            claim("p-nic", Some(&["gpu-1"])),
        ]);
        let rec = record(&[1], &[0]);
        let (out, problems) = run(&pod(false), Some(&rec), &dra);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(out.len(), 2);
        let gpu = numa_of(&out[0]);
        assert_eq!(out[0].state, ClaimState::Allocated);
        assert_eq!(gpu.devices[0].device, "gpu.example.com/n1/gpu-0");
        assert_eq!(gpu.devices[0].numa_nodes, Some(vec![0]));
        assert_eq!(gpu.containers.len(), 1);
        assert_eq!(gpu.containers[0].name, "app");
        assert_eq!(gpu.containers[0].numa_nodes, Some(vec![1]));
        assert_eq!(gpu.containers[0].pinned, None);
        assert_eq!(gpu.alignment, AlignmentStatus::Misaligned);
        assert_eq!(numa_of(&out[1]).alignment, AlignmentStatus::Aligned);
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(v[0]["resourceClaim"], "p-gpu");
        assert_eq!(v[0]["state"], "allocated");
        assert_eq!(v[0]["numa"]["alignment"], "misaligned");
        assert_eq!(v[0]["numa"]["devices"][0]["numaNodes"], json!([0]));
        assert_eq!(v[0]["numa"]["containers"][0]["numaNodes"], json!([1]));
    }

    #[test]
    fn every_numa_source_and_the_same_labels_as_simulate() {
        // Driver attribute, PCI locality, no source: aligned or without NUMA node.
        let dra = objects(vec![
            claim("p-gpu", Some(&["by-driver", "by-pci"])),
            claim("p-nic", Some(&["gpu-1", "bare"])),
        ]);
        let rec = record(&[1], &[0]);
        let (out, problems) = run(&pod(false), Some(&rec), &dra);
        assert!(problems.is_empty(), "{problems:?}");
        let gpu = numa_of(&out[0]);
        assert_eq!(gpu.devices[0].numa_nodes, Some(vec![1]));
        assert_eq!(gpu.devices[1].numa_nodes, Some(vec![1]));
        assert_eq!(gpu.alignment, AlignmentStatus::Aligned);
        let nic = numa_of(&out[1]);
        assert_eq!(nic.devices[1].numa_nodes, None);
        assert_eq!(nic.alignment, AlignmentStatus::NoNumaNode);
        assert_eq!(
            verdict_text(nic.alignment),
            "no NUMA node (a device has no NUMA node, the others are aligned)"
        );
        // Without the driver's attribute configured (the built-in defaults only), the
        // driver's device has no NUMA node.
        let dra = DraObjects {
            driver_attributes: numaplane::device_numa::default_driver_numa_attributes(),
            ..dra
        };
        let (out, _) = run(&pod(false), Some(&rec), &dra);
        assert_eq!(numa_of(&out[0]).devices[0].numa_nodes, None);
    }

    #[test]
    fn shared_across_disjoint_nodes_is_split_and_without_record_not_predicted() {
        let dra = objects(vec![
            claim("p-gpu", Some(&["gpu-0"])),
            claim("p-nic", Some(&["gpu-1"])),
        ]);
        let rec = record(&[1], &[0]);
        let (out, _) = run(&pod(true), Some(&rec), &dra);
        let gpu = numa_of(&out[0]);
        assert_eq!(gpu.alignment, AlignmentStatus::Split);
        assert_eq!(gpu.containers.len(), 2);
        // No record: the devices' NUMA nodes are still shown, the verdict is not predicted.
        let (out, problems) = run(&pod(false), None, &dra);
        assert!(problems.is_empty(), "{problems:?}");
        let gpu = numa_of(&out[0]);
        assert_eq!(gpu.devices[0].numa_nodes, Some(vec![0]));
        assert_eq!(gpu.containers[0].numa_nodes, None);
        assert_eq!(gpu.alignment, AlignmentStatus::NotPredicted);
        // Pod scope: the record's pod NUMA nodes stand for each container's.
        let pod_scope: Allocation = serde_json::from_value(json!({"version": "v1", "node": "n1",
            "policy": "single-numa-node", "scope": "pod", "podNumaNodes": [0],
            "containers": [{"name": "app", "kind": "app"}]}))
        .unwrap();
        let (out, _) = run(&pod(false), Some(&pod_scope), &dra);
        assert_eq!(numa_of(&out[0]).alignment, AlignmentStatus::Aligned);
        assert_eq!(numa_of(&out[1]).alignment, AlignmentStatus::Misaligned);
    }

    #[test]
    fn the_node_as_the_scheduler_reads_it() {
        // A device on a NUMA node the node lacks has none, as the scheduler and the exporter
        // count it; a container recorded on every NUMA node has nothing to align with.
        let mut s = slice("n1");
        if let Some(d) = s.spec.devices.as_mut().and_then(|d| d.first_mut()) {
            d.attributes =
                serde_json::from_value(json!({"resource.kubernetes.io/numaNode": {"int": 3}})).ok();
        }
        let dra = DraObjects {
            slices: vec![s],
            ..objects(vec![
                claim("p-gpu", Some(&["gpu-0"])),
                claim("p-nic", Some(&["gpu-1"])),
            ])
        };
        let (out, _) = run(&pod(false), Some(&record(&[1], &[0])), &dra);
        assert_eq!(numa_of(&out[0]).devices[0].numa_nodes, None);
        assert_eq!(numa_of(&out[0]).alignment, AlignmentStatus::NoNumaNode);
        let (out, _) = run(&pod(false), Some(&record(&[0, 1], &[0])), &dra);
        assert_eq!(numa_of(&out[1]).alignment, AlignmentStatus::NotPredicted);
        // A malformed PCI locality is named; the device it would place has no NUMA node.
        let mut nrt = nrt_with_pci();
        if let Some(a) = nrt.attributes.as_mut().and_then(|a| a.first_mut()) {
            a.value = "0000:80-ff".into();
        }
        let dra = objects(vec![
            claim("p-gpu", Some(&["by-pci"])),
            claim("p-nic", Some(&["gpu-1"])),
        ]);
        let mut problems = Vec::new();
        let out = bound_claims(
            &pod(false),
            "ns/p",
            "n1",
            Some(&record(&[1], &[0])),
            Some(&nrt),
            &dra,
            &mut problems,
        );
        assert_eq!(numa_of(&out[0]).devices[0].numa_nodes, None);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("NodeResourceTopology n1: PCI locality"),
            "{problems:?}"
        );
    }

    #[test]
    fn missing_objects_are_named_not_fatal() {
        // p-nic is missing; p-gpu names a device of no slice of n1 (gpu-9) and one with a
        // malformed NUMA attribute.
        let dra = objects(vec![claim("p-gpu", Some(&["gpu-9", "bad"]))]);
        let rec = record(&[1], &[0]);
        let (out, problems) = run(&pod(false), Some(&rec), &dra);
        assert_eq!(out[0].state, ClaimState::Allocated);
        assert_eq!(out[0].not_in_slices, ["gpu.example.com/n1/gpu-9"]);
        let gpu = numa_of(&out[0]);
        assert_eq!(gpu.devices.len(), 2);
        assert!(gpu.devices.iter().all(|d| d.numa_nodes.is_none()));
        assert_eq!(gpu.alignment, AlignmentStatus::NoNumaNode);
        assert_eq!(out[1].state, ClaimState::NotFound);
        assert!(out[1].numa.is_none());
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(
            problems[0],
            "pod ns/p claim gpu: device gpu.example.com/n1/gpu-9 is in no ResourceSlice of node n1: its NUMA node is unknown"
        );
        assert!(
            problems[1].starts_with(
                "pod ns/p claim gpu: driver gpu.example.com: attribute resource.kubernetes.io/numaNode of device bad is not a NUMA node id"
            ),
            "{problems:?}"
        );
        assert_eq!(
            problems[2],
            "pod ns/p claim nic: ResourceClaim ns/p-nic not found"
        );
        // Not allocated: said, not a problem. A template claim not created: a problem.
        let dra = objects(vec![claim("p-gpu", None), claim("p-nic", Some(&["gpu-1"]))]);
        let mut p = pod(false);
        if let Some(s) = p.spec.as_mut() {
            s.resource_claims = serde_json::from_value(json!([
                {"name": "gpu", "resourceClaimName": "p-gpu"},
                {"name": "nic", "resourceClaimTemplateName": "t"}]))
            .ok();
        }
        let (out, problems) = run(&p, Some(&rec), &dra);
        assert_eq!(out[0].state, ClaimState::NotAllocated);
        assert_eq!(out[1].state, ClaimState::NotCreated);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("pod ns/p claim nic: no ResourceClaim created"),
            "{problems:?}"
        );
        // No claims, nothing read.
        let mut none = pod(false);
        if let Some(s) = none.spec.as_mut() {
            s.resource_claims = None;
        }
        assert!(run(&none, Some(&rec), &dra).0.is_empty());
    }
}
