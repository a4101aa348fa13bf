//! The NUMA node of a DRA device, from the first source that answers: the standard
//! `resource.kubernetes.io/numaNode` attribute, then the driver-specific attributes a user
//! names, then the device's `resource.kubernetes.io/pciBusID` or `pcieRoot` resolved through
//! the node's PCI locality ([`crate::pci_locality`]). The scheduler (which devices to choose)
//! and the exporter (per-zone DRA counts) both read devices through this one function, so that
//! they never disagree on where a device is.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use crate::pci_locality::{PciBusRange, numa_node_of_bus, parse_pci_bus_id, parse_pcie_root};

/// Standard attribute naming a device's NUMA node (an int, or a list of ints when
/// `DRAListTypeAttributes` is on).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// Standard attribute with the device's PCI address in extended BDF form.
pub const PCI_BUS_ID_ATTRIBUTE: &str = "resource.kubernetes.io/pciBusID";
/// Standard attribute with the device's PCIe root complex, `pci<domain>:<bus>`.
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";

/// Driver-specific attributes holding a NUMA node id, per driver name, tried in order. A name
/// without `/` is in the driver's own domain, as in device selectors.
pub type DriverNumaAttributes = BTreeMap<String, Vec<String>>;

/// The driver-specific NUMA attributes known without configuration, each checked in the
/// driver's source:
/// - `dra.net` (kubernetes-sigs/dranet, `pkg/apis/attributes.go`: `AttrNUMANode =
///   "dra.net/numaNode"`);
/// - `sriovnetwork.k8snetworkplumbingwg.io` (k8snetworkplumbingwg/dra-driver-sriov,
///   `pkg/consts/consts.go`: `AttributeNUMANode = "dra.net/numaNode"`, dranet's name);
/// - `gpu.nvidia.com` (NVIDIA/k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`: VFIO
///   GPUs publish the int `numa`; full GPUs and MIG devices publish only the standard
///   `resource.kubernetes.io/pcieRoot`, which the node's PCI locality resolves).
///
/// Configuration (the scheduler's `draNuma.driverAttributes`, the exporter's
/// `--dra-numa-attribute`) replaces the list of a driver it names.
pub fn default_driver_numa_attributes() -> DriverNumaAttributes {
    [
        ("dra.net", "dra.net/numaNode"),
        ("sriovnetwork.k8snetworkplumbingwg.io", "dra.net/numaNode"),
        ("gpu.nvidia.com", "numa"),
    ]
    .into_iter()
    .map(|(driver, attr)| (driver.to_owned(), vec![attr.to_owned()]))
    .collect()
}

/// Where a device's NUMA node came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumaSource {
    /// [`NUMA_NODE_ATTRIBUTE`].
    StandardAttribute,
    /// A driver-specific attribute (its name as configured).
    DriverAttribute(String),
    /// [`PCI_BUS_ID_ATTRIBUTE`] through the node's PCI locality.
    PciBusId,
    /// [`PCIE_ROOT_ATTRIBUTE`] through the node's PCI locality.
    PcieRoot,
}

/// A device's NUMA nodes (sorted, deduplicated, non-empty) and their source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNuma {
    /// NUMA node ids; more than one only from a list attribute.
    pub nodes: Vec<u32>,
    /// Which source answered.
    pub source: NumaSource,
}

/// An attribute that names a NUMA node or a PCI address but does not hold one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attribute {attribute} of device {device} is not {expected}: {value}")]
pub struct DeviceNumaError {
    /// The device name.
    pub device: String,
    /// The attribute name.
    pub attribute: String,
    /// What the attribute should hold.
    pub expected: &'static str,
    /// The value, as the API shows it.
    pub value: String,
}

const EXPECTED_NUMA: &str = "a NUMA node id (a non-negative int, -1 for none, or a non-empty list of them)";
const EXPECTED_BUS_ID: &str = "a PCI address in extended BDF form (0000:3b:00.0)";
const EXPECTED_PCIE_ROOT: &str = "a PCIe root complex (pci0000:3a)";

/// The NUMA node of `device` published by `driver`. `Ok(None)`: no source places it, so it is
/// treated as a device without NUMA affinity. A NUMA attribute of -1 is the kernel's "no NUMA
/// affinity" (sysfs `numa_node`, which drivers copy): that source does not place the device
/// and the next one is asked. An attribute that is present but malformed is an error rather
/// than a silent fall-through, so that a driver bug is seen.
pub fn device_numa(
    driver: &str,
    device: &Device,
    driver_attributes: &DriverNumaAttributes,
    pci_locality: &[PciBusRange],
) -> Result<Option<DeviceNuma>, DeviceNumaError> {
    let attrs = device.attributes.as_ref();
    numa_of(
        driver,
        &device.name,
        |name| attrs?.get(name),
        driver_attributes,
        pci_locality,
    )
}

/// [`device_numa`] of a device held in another shape: its name, and its attributes by key
/// (the scheduler keeps a device's attributes flat).
pub fn numa_of<'a>(
    driver: &str,
    device: &str,
    attribute: impl Fn(&str) -> Option<&'a DeviceAttribute>,
    driver_attributes: &DriverNumaAttributes,
    pci_locality: &[PciBusRange],
) -> Result<Option<DeviceNuma>, DeviceNumaError> {
    let get = |name: &str| lookup(&attribute, driver, name);
    if let Some(a) = get(NUMA_NODE_ATTRIBUTE)
        && let Some(nodes) = numa_ids(device, NUMA_NODE_ATTRIBUTE, a)?
    {
        return Ok(Some(DeviceNuma {
            nodes,
            source: NumaSource::StandardAttribute,
        }));
    }
    for name in driver_attributes.get(driver).into_iter().flatten() {
        if let Some(a) = get(name)
            && let Some(nodes) = numa_ids(device, name, a)?
        {
            return Ok(Some(DeviceNuma {
                nodes,
                source: NumaSource::DriverAttribute(name.clone()),
            }));
        }
    }
    let pci = [
        (PCI_BUS_ID_ATTRIBUTE, NumaSource::PciBusId, EXPECTED_BUS_ID),
        (PCIE_ROOT_ATTRIBUTE, NumaSource::PcieRoot, EXPECTED_PCIE_ROOT),
    ];
    for (name, source, expected) in pci {
        let Some(a) = get(name) else { continue };
        let parsed = a.string.as_deref().and_then(|s| match source {
            NumaSource::PciBusId => parse_pci_bus_id(s),
            _ => parse_pcie_root(s),
        });
        let Some((domain, bus)) = parsed else {
            return Err(malformed(device, name, expected, a));
        };
        if let Some(n) = numa_node_of_bus(pci_locality, domain, bus) {
            return Ok(Some(DeviceNuma {
                nodes: vec![n],
                source,
            }));
        }
    }
    Ok(None)
}

fn malformed(device: &str, attribute: &str, expected: &'static str, a: &DeviceAttribute) -> DeviceNumaError {
    DeviceNumaError {
        device: device.to_owned(),
        attribute: attribute.to_owned(),
        expected,
        value: serde_json::to_string(a).unwrap_or_else(|_| format!("{a:?}")),
    }
}

/// An attribute by name as device selectors resolve it: a qualified name `domain/id` matches
/// the key `domain/id`, and also the unqualified key `id` when `domain` is the driver's.
fn lookup<'a>(
    attribute: impl Fn(&str) -> Option<&'a DeviceAttribute>,
    driver: &str,
    name: &str,
) -> Option<&'a DeviceAttribute> {
    if let Some(a) = attribute(name) {
        return Some(a);
    }
    match name.split_once('/') {
        Some((domain, id)) if domain == driver => attribute(id),
        Some(_) => None,
        None => attribute(&format!("{driver}/{name}")),
    }
}

/// The ids an attribute holds; `None` when it says "no NUMA node" (-1, alone or as every
/// entry of a list).
fn numa_ids(device: &str, attribute: &str, a: &DeviceAttribute) -> Result<Option<Vec<u32>>, DeviceNumaError> {
    let err = || malformed(device, attribute, EXPECTED_NUMA, a);
    let raw: &[i64] = match (a.int.as_ref(), a.ints.as_deref()) {
        (Some(i), None) => std::slice::from_ref(i),
        (None, Some(list)) if !list.is_empty() => list,
        _ => return Err(err()),
    };
    let mut ids = raw
        .iter()
        .filter(|&&i| i != -1)
        .map(|&i| u32::try_from(i).map_err(|_| err()))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort_unstable();
    ids.dedup();
    Ok((!ids.is_empty()).then_some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci_locality::split_pci_locality;

    fn device(attrs: &[(&str, DeviceAttribute)]) -> Device {
        Device {
            name: "gpu-0".into(),
            attributes: Some(attrs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()),
            ..Device::default()
        }
    }
    fn int(i: i64) -> DeviceAttribute {
        DeviceAttribute {
            int: Some(i),
            ..DeviceAttribute::default()
        }
    }
    fn string(s: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(s.into()),
            ..DeviceAttribute::default()
        }
    }
    fn locality() -> Vec<PciBusRange> {
        split_pci_locality("0000:00-7f=0,0000:80-ff=1").unwrap()
    }
    /// Where device `d` of driver "d" is placed with no driver attributes configured.
    fn placed(d: &Device, locality: &[PciBusRange]) -> Option<DeviceNuma> {
        device_numa("d", d, &DriverNumaAttributes::new(), locality).unwrap()
    }
    fn numa(nodes: Vec<u32>, source: NumaSource) -> DeviceNuma {
        DeviceNuma { nodes, source }
    }

    #[test]
    fn the_standard_attribute_wins_over_every_other_source() {
        let d = device(&[
            (NUMA_NODE_ATTRIBUTE, int(1)),
            ("numa", int(0)),
            (PCI_BUS_ID_ATTRIBUTE, string("0000:3b:00.0")),
        ]);
        let cfg = DriverNumaAttributes::from([("gpu.example.com".into(), vec!["numa".into()])]);
        let got = device_numa("gpu.example.com", &d, &cfg, &locality())
            .unwrap()
            .unwrap();
        assert_eq!(got, numa(vec![1], NumaSource::StandardAttribute));
    }

    #[test]
    fn a_list_attribute_gives_every_node_once() {
        let d = device(&[(
            NUMA_NODE_ATTRIBUTE,
            DeviceAttribute {
                ints: Some(vec![3, 1, 3]),
                ..DeviceAttribute::default()
            },
        )]);
        let got = placed(&d, &[]).unwrap();
        assert_eq!(got.nodes, vec![1, 3]);
    }

    #[test]
    fn driver_attributes_resolve_qualified_and_unqualified_names_in_order() {
        let cfg = DriverNumaAttributes::from([(
            "dra.net".into(),
            vec!["missing".into(), "dra.net/numaNode".into()],
        )]);
        for key in ["numaNode", "dra.net/numaNode"] {
            let d = device(&[(key, int(1)), (PCI_BUS_ID_ATTRIBUTE, string("0000:3b:00.0"))]);
            let got = device_numa("dra.net", &d, &cfg, &locality()).unwrap().unwrap();
            assert_eq!(
                got,
                numa(vec![1], NumaSource::DriverAttribute("dra.net/numaNode".into())),
                "{key}"
            );
        }
        // Another driver's configuration is not used.
        let d = device(&[("numaNode", int(1))]);
        assert_eq!(device_numa("other.example.com", &d, &cfg, &[]).unwrap(), None);
    }

    #[test]
    fn pci_addresses_resolve_through_the_node_locality() {
        let d = device(&[(PCI_BUS_ID_ATTRIBUTE, string("0000:af:00.0"))]);
        let got = placed(&d, &locality()).unwrap();
        assert_eq!(got, numa(vec![1], NumaSource::PciBusId));
        let d = device(&[(PCIE_ROOT_ATTRIBUTE, string("pci0000:3a"))]);
        let got = placed(&d, &locality()).unwrap();
        assert_eq!(got, numa(vec![0], NumaSource::PcieRoot));
        // Without the node's locality, or outside it, nothing places the device.
        assert_eq!(placed(&d, &[]), None);
        let d = device(&[(PCI_BUS_ID_ATTRIBUTE, string("0001:00:00.0"))]);
        assert_eq!(placed(&d, &locality()), None);
    }

    #[test]
    fn a_device_without_attributes_has_no_numa_node() {
        let d = Device {
            name: "x".into(),
            ..Device::default()
        };
        assert_eq!(placed(&d, &locality()), None);
    }

    #[test]
    fn malformed_numa_attributes_are_errors() {
        for bad in [
            int(-2),
            string("1"),
            DeviceAttribute {
                ints: Some(vec![]),
                ..DeviceAttribute::default()
            },
            DeviceAttribute {
                int: Some(0),
                ints: Some(vec![1]),
                ..DeviceAttribute::default()
            },
        ] {
            let d = device(&[(NUMA_NODE_ATTRIBUTE, bad)]);
            let e = device_numa("d", &d, &DriverNumaAttributes::new(), &[]).unwrap_err();
            assert_eq!(e.attribute, NUMA_NODE_ATTRIBUTE);
            assert!(e.to_string().contains("gpu-0"), "{e}");
        }
    }

    #[test]
    fn minus_one_is_no_numa_node_and_the_next_source_answers() {
        let none_list = DeviceAttribute {
            ints: Some(vec![-1]),
            ..DeviceAttribute::default()
        };
        let cfg = DriverNumaAttributes::from([("d".into(), vec!["numa".into()])]);
        for standard in [int(-1), none_list] {
            // The driver attribute places it.
            let d = device(&[(NUMA_NODE_ATTRIBUTE, standard.clone()), ("numa", int(1))]);
            let got = device_numa("d", &d, &cfg, &locality()).unwrap().unwrap();
            assert_eq!(got, numa(vec![1], NumaSource::DriverAttribute("numa".into())));
            // The driver attribute says -1 too: the PCI address places it.
            let d = device(&[
                (NUMA_NODE_ATTRIBUTE, standard.clone()),
                ("numa", int(-1)),
                (PCI_BUS_ID_ATTRIBUTE, string("0000:81:00.0")),
            ]);
            let got = device_numa("d", &d, &cfg, &locality()).unwrap().unwrap();
            assert_eq!(got, numa(vec![1], NumaSource::PciBusId));
            // Nothing else: no NUMA node, and no error.
            let d = device(&[(NUMA_NODE_ATTRIBUTE, standard)]);
            assert_eq!(device_numa("d", &d, &cfg, &locality()).unwrap(), None);
        }
        // -1 beside real ids in a list is dropped.
        let mixed = DeviceAttribute {
            ints: Some(vec![-1, 1, 0]),
            ..DeviceAttribute::default()
        };
        let d = device(&[(NUMA_NODE_ATTRIBUTE, mixed)]);
        assert_eq!(
            placed(&d, &[]),
            Some(numa(vec![0, 1], NumaSource::StandardAttribute))
        );
    }

    #[test]
    fn malformed_pci_attributes_are_errors_and_unknown_buses_place_nothing() {
        for (name, bad) in [
            (PCI_BUS_ID_ATTRIBUTE, string("0000:3b")),
            (PCI_BUS_ID_ATTRIBUTE, string("0000:3b:20.0")),
            (PCI_BUS_ID_ATTRIBUTE, int(59)),
            (PCIE_ROOT_ATTRIBUTE, string("0000:3a")),
            (PCIE_ROOT_ATTRIBUTE, string("pci0000:3a:00")),
        ] {
            let d = device(&[(name, bad)]);
            let e = device_numa("d", &d, &DriverNumaAttributes::new(), &locality()).unwrap_err();
            assert_eq!(e.attribute, name);
            assert!(
                e.to_string().contains("gpu-0") && e.to_string().contains("PCI"),
                "{e}"
            );
        }
        // Well-formed, but the node publishes no locality for it.
        let d = device(&[(PCIE_ROOT_ATTRIBUTE, string("pci0000:3a"))]);
        assert_eq!(placed(&d, &[]), None);
    }
}
