//! Device pools of the node-side allocator: the `--pools` YAML file, checked and resolved
//! against the machine's PCI inventory (hwloc) into the devices, slots and NUMA nodes each
//! device plugin offers. Pure: no I/O beyond reading the file.

use std::collections::BTreeSet;

use numaplane_topology::{Machine, PciDevice};
use serde::Deserialize;

/// The kubelet's limit on a device ID.
pub const MAX_ID_LEN: usize = 63;

/// The file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolsFile {
    /// One entry per extended resource.
    pub pools: Vec<PoolSpec>,
}

/// One pool as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// Extended resource name, e.g. `example.com/gpu`.
    pub resource: String,
    /// Devices found in the PCI inventory.
    #[serde(default, rename = "match")]
    pub pci: Option<PciMatch>,
    /// Devices listed by hand.
    #[serde(default)]
    pub devices: Vec<StaticDevice>,
    /// Containers that may share one device (slots per device).
    #[serde(default = "one")]
    pub capacity: u32,
    /// `node` (default): slots are this node's; `cluster`: the device is reached from several
    /// nodes and its slots are one cluster-wide set.
    #[serde(default)]
    pub shared: Sharing,
    /// Name of the environment variable `Allocate` sets to the allocated IDs, comma-separated
    /// [default: `NUMAPLANE_DEVICES_<RESOURCE>` in upper case, non-alphanumerics as `_`].
    #[serde(default)]
    pub env: Option<String>,
    /// Device nodes to hand to the container; `{device}` in a path is the device ID.
    #[serde(default)]
    pub device_specs: Vec<DeviceSpecTemplate>,
    /// CDI device names; `{device}` is the device ID (e.g. `vendor.com/gpu={device}`).
    #[serde(default)]
    pub cdi_devices: Vec<String>,
}

fn one() -> u32 {
    1
}

/// Who shares a pool's slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Sharing {
    /// Slots belong to this node.
    #[default]
    Node,
    /// One set of slots for every node that reaches the device.
    Cluster,
}

/// Selects PCI devices of the inventory.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PciMatch {
    /// Vendor id, hex (`"10de"`).
    pub vendor: String,
    /// Device id, hex; any if absent.
    #[serde(default)]
    pub device: Option<String>,
    /// Class and subclass, hex (`"0302"`); any if absent.
    #[serde(default)]
    pub class: Option<String>,
    /// Only these PCI addresses (`0000:3b:00.0`); all matching if absent.
    #[serde(default)]
    pub bus_ids: Option<Vec<String>>,
}

/// A device listed by hand.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticDevice {
    /// Device ID as the kubelet sees it.
    pub id: String,
    /// NUMA node the device is local to; none means no topology.
    #[serde(default)]
    pub numa_node: Option<u32>,
}

/// A device node handed to containers.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceSpecTemplate {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Subset of `rwm` [default: `rw`].
    #[serde(default)]
    pub permissions: Option<String>,
}

/// The pools of a file as this machine offers them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Pools with at least one device here.
    pub pools: Vec<Pool>,
    /// Resources of PCI-matched pools whose match finds no device on this machine: one
    /// DaemonSet serves nodes with and without a kind of device, so those pools are simply not
    /// offered here (the caller logs it).
    pub absent: Vec<String>,
}

/// A resolved pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Extended resource name.
    pub resource: String,
    /// Devices, in ID order.
    pub devices: Vec<PoolDevice>,
    /// Slots per device.
    pub capacity: u32,
    /// Who shares the slots.
    pub shared: Sharing,
    /// Environment variable set by `Allocate`.
    pub env: String,
    /// Device node templates.
    pub device_specs: Vec<DeviceSpecTemplate>,
    /// CDI name templates.
    pub cdi_devices: Vec<String>,
}

/// One device of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDevice {
    /// Device ID.
    pub id: String,
    /// NUMA node, if the device has one.
    pub numa_node: Option<u32>,
    /// Found in the PCI inventory (its ID is the PCI address): it can leave the machine, and
    /// is unhealthy while a rescan does not find it.
    pub pci: bool,
}

impl Pool {
    /// The IDs the kubelet sees: the device IDs when capacity is 1, else `<device>-<slot>`.
    pub fn slot_ids(&self) -> Vec<(String, &PoolDevice)> {
        let mut out = Vec::new();
        for d in &self.devices {
            if self.capacity == 1 {
                out.push((d.id.clone(), d));
            } else {
                for s in 0..self.capacity {
                    out.push((format!("{}-{s}", d.id), d));
                }
            }
        }
        out
    }

    /// The device behind a kubelet ID (a device ID or one of its slots).
    pub fn device_of(&self, id: &str) -> Option<&PoolDevice> {
        if self.capacity == 1 {
            return self.devices.iter().find(|d| d.id == id);
        }
        let (device, slot) = id.rsplit_once('-')?;
        let slot: u32 = slot.parse().ok()?;
        (slot < self.capacity)
            .then(|| self.devices.iter().find(|d| d.id == device))
            .flatten()
    }

    /// The slot IDs of the PCI-matched devices `machine` lacks (they left the bus, or the
    /// driver unbound them).
    pub fn missing_from(&self, machine: &Machine) -> std::collections::BTreeSet<String> {
        self.slot_ids()
            .into_iter()
            .filter(|(_, d)| {
                d.pci
                    && !machine
                        .pci_devices
                        .iter()
                        .any(|p| p.bus_id.eq_ignore_ascii_case(&d.id))
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// The socket file name of this pool's plugin in the device-plugin directory.
    pub fn socket_name(&self) -> String {
        let safe: String = self
            .resource
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("numaplane-{safe}.sock")
    }
}

/// A pools file that cannot be used (exit 64).
#[derive(Debug, thiserror::Error)]
pub enum PoolsError {
    /// The file cannot be read.
    #[error("reading pools file {path}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("pools file {path}: {message}")]
    Parse {
        /// Path.
        path: String,
        /// Parser message (first line).
        message: String,
    },
    /// A pool is not valid.
    #[error("pool {resource}: {problem}")]
    Invalid {
        /// The pool's resource name.
        resource: String,
        /// What is wrong.
        problem: String,
    },
}

fn invalid(resource: &str, problem: impl Into<String>) -> PoolsError {
    PoolsError::Invalid {
        resource: resource.to_owned(),
        problem: problem.into(),
    }
}

/// Reads and resolves `path` against `machine`, logging the pools this machine has no device of.
pub fn load(path: &std::path::Path, machine: &Machine) -> Result<Vec<Pool>, PoolsError> {
    let resolved = load_resolved(path, machine)?;
    for resource in &resolved.absent {
        tracing::info!(
            resource = %resource,
            pools = %path.display(),
            "no device of this pool on this node; the pool is not offered here"
        );
    }
    Ok(resolved.pools)
}

/// Reads and resolves `path` against `machine`.
pub fn load_resolved(path: &std::path::Path, machine: &Machine) -> Result<Resolved, PoolsError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PoolsError::Read {
        path: shown.clone(),
        source,
    })?;
    let file: PoolsFile = serde_saphyr::from_str(&text).map_err(|e| PoolsError::Parse {
        path: shown,
        message: e.to_string().lines().next().unwrap_or_default().to_owned(),
    })?;
    resolve(&file, machine)
}

fn parse_hex(resource: &str, what: &str, s: &str) -> Result<u16, PoolsError> {
    u16::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| invalid(resource, format!("{what} {s:?} is not a 4-digit hex id")))
}

/// Checks every pool and finds its devices.
pub fn resolve(file: &PoolsFile, machine: &Machine) -> Result<Resolved, PoolsError> {
    if file.pools.is_empty() {
        return Err(invalid("-", "the file lists no pool"));
    }
    let mut seen = BTreeSet::new();
    let mut pools = Vec::new();
    let mut absent = Vec::new();
    for spec in &file.pools {
        let r = spec.resource.as_str();
        if !numaplane::resource_name::is_valid_extended(r) {
            return Err(invalid(
                r,
                "not an extended resource name (domain/name, outside kubernetes.io)",
            ));
        }
        if !seen.insert(r) {
            return Err(invalid(r, "the resource is listed twice"));
        }
        if spec.capacity == 0 {
            return Err(invalid(r, "capacity must be at least 1"));
        }
        if spec.shared == Sharing::Cluster && spec.pci.is_some() {
            // A cluster-wide slot must have the same ID on every node; PCI addresses are local.
            return Err(invalid(
                r,
                "shared: cluster needs its devices listed by ID (the same IDs on every node), not matched from PCI",
            ));
        }
        let mut devices: Vec<PoolDevice> = Vec::new();
        if let Some(m) = &spec.pci {
            let vendor = parse_hex(r, "vendor", &m.vendor)?;
            let device = m
                .device
                .as_deref()
                .map(|d| parse_hex(r, "device", d))
                .transpose()?;
            let class = m.class.as_deref().map(|c| parse_hex(r, "class", c)).transpose()?;
            let matches = |p: &PciDevice| {
                p.vendor_id == vendor
                    && device.is_none_or(|d| p.device_id == d)
                    && class.is_none_or(|c| p.class_id == c)
                    && m.bus_ids
                        .as_ref()
                        .is_none_or(|ids| ids.iter().any(|b| b.eq_ignore_ascii_case(&p.bus_id)))
            };
            for p in machine.pci_devices.iter().filter(|p| matches(p)) {
                devices.push(PoolDevice {
                    id: p.bus_id.clone(),
                    // A device local to several nodes is rare; the kubelet would count it for
                    // any mask touching one of them. We report the first, the lowest.
                    numa_node: p.numa_nodes.first().copied(),
                    pci: true,
                });
            }
        }
        for d in &spec.devices {
            if d.id.is_empty() || d.id.contains(',') || d.id.chars().any(char::is_whitespace) {
                return Err(invalid(
                    r,
                    format!("device ID {:?} is empty or has a comma or space", d.id),
                ));
            }
            if let Some(n) = d.numa_node
                && !machine.numa_nodes.is_empty()
                && !machine.numa_nodes.iter().any(|m| m.id == n)
            {
                return Err(invalid(
                    r,
                    format!(
                        "device {} names NUMA node {n}, which this machine does not have",
                        d.id
                    ),
                ));
            }
            devices.push(PoolDevice {
                id: d.id.clone(),
                numa_node: d.numa_node,
                pci: false,
            });
        }
        if devices.is_empty() {
            if spec.pci.is_none() {
                return Err(invalid(r, "no device: neither a match nor devices are listed"));
            }
            absent.push(r.to_owned());
            continue;
        }
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = devices.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(invalid(r, format!("device {} is listed twice", w[0].id)));
        }
        let suffix = if spec.capacity > 1 {
            spec.capacity.saturating_sub(1).to_string().len() + 1
        } else {
            0
        };
        if let Some(d) = devices.iter().find(|d| d.id.len() + suffix > MAX_ID_LEN) {
            return Err(invalid(
                r,
                format!(
                    "device ID {} is too long: slot IDs must stay within {MAX_ID_LEN} characters",
                    d.id
                ),
            ));
        }
        for t in &spec.device_specs {
            if let Some(p) = &t.permissions
                && (p.is_empty() || !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
            {
                return Err(invalid(
                    r,
                    format!("device spec permissions {p:?} are not a subset of rwm"),
                ));
            }
        }
        let env = spec.env.clone().unwrap_or_else(|| default_env(r));
        if env.is_empty()
            || env.starts_with(|c: char| c.is_ascii_digit())
            || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(invalid(r, format!("env {env:?} is not a valid variable name")));
        }
        pools.push(Pool {
            resource: r.to_owned(),
            devices,
            capacity: spec.capacity,
            shared: spec.shared,
            env,
            device_specs: spec.device_specs.clone(),
            cdi_devices: spec.cdi_devices.clone(),
        });
    }
    Ok(Resolved { pools, absent })
}

/// `NUMAPLANE_DEVICES_EXAMPLE_COM_GPU` for `example.com/gpu`.
pub fn default_env(resource: &str) -> String {
    let tail: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("NUMAPLANE_DEVICES_{tail}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn machine() -> Machine {
        let gpu = |bus: &str, numa: u32| PciDevice {
            bus_id: bus.to_owned(),
            vendor_id: 0x10de,
            device_id: 0x20b0,
            class_id: 0x0302,
            class_name: "gpu".to_owned(),
            numa_nodes: vec![numa],
        };
        Machine {
            numa_nodes: vec![],
            pci_devices: vec![gpu("0000:3b:00.0", 0), gpu("0000:af:00.0", 1)],
            pci_locality: vec![],
        }
    }

    fn parse(yaml: &str) -> Result<Vec<Pool>, PoolsError> {
        let file: PoolsFile = serde_saphyr::from_str(yaml).unwrap();
        resolve(&file, &machine()).map(|r| r.pools)
    }

    #[test]
    fn a_pci_pool_without_a_device_here_is_not_offered_but_not_an_error() {
        // One DaemonSet spans GPU and CPU-only nodes: Intel GPUs are absent on this machine.
        let file: PoolsFile = serde_saphyr::from_str(
            "pools:\n- resource: example.com/igpu\n  match: {vendor: \"8086\"}\n- resource: example.com/gpu\n  match: {vendor: \"10de\"}\n",
        )
        .unwrap();
        let r = resolve(&file, &machine()).unwrap();
        assert_eq!(r.absent, vec!["example.com/igpu".to_owned()]);
        assert_eq!(r.pools.len(), 1);
        assert_eq!(r.pools[0].resource, "example.com/gpu");
    }

    #[test]
    fn pci_match_and_static_devices_with_slots() {
        let pools = parse(
            "pools:\n- resource: example.com/gpu\n  match: {vendor: \"10de\", class: \"0302\"}\n- resource: example.com/cam\n  capacity: 3\n  shared: node\n  devices: [{id: cam-a, numaNode: 1}, {id: cam-b}]\n",
        )
        .unwrap();
        assert_eq!(pools[0].devices.len(), 2);
        assert_eq!(pools[0].devices[1].numa_node, Some(1));
        assert_eq!(pools[0].env, "NUMAPLANE_DEVICES_EXAMPLE_COM_GPU");
        let slots: Vec<String> = pools[0].slot_ids().into_iter().map(|(s, _)| s).collect();
        assert_eq!(slots, ["0000:3b:00.0", "0000:af:00.0"]);
        let cam = &pools[1];
        assert_eq!(cam.shared, Sharing::Node);
        let slots: Vec<String> = cam.slot_ids().into_iter().map(|(s, _)| s).collect();
        assert_eq!(
            slots,
            ["cam-a-0", "cam-a-1", "cam-a-2", "cam-b-0", "cam-b-1", "cam-b-2"]
        );
        assert_eq!(cam.device_of("cam-b-2").unwrap().id, "cam-b");
        assert!(cam.device_of("cam-b-3").is_none());
        assert!(cam.device_of("cam-c-0").is_none());
        assert_eq!(cam.socket_name(), "numaplane-example_com_cam.sock");
        let shared = parse(
            "pools:\n- resource: example.com/lic\n  capacity: 2\n  shared: cluster\n  devices: [{id: lic}]\n",
        )
        .unwrap();
        assert_eq!(shared[0].shared, Sharing::Cluster);
        assert_eq!(shared[0].slot_ids().len(), 2);
    }

    #[test]
    fn missing_pci_devices_are_found_by_address_and_listed_devices_never_go_missing() {
        let pools = parse(
            "pools:\n- resource: example.com/gpu\n  capacity: 2\n  match: {vendor: \"10de\"}\n  devices: [{id: extra}]\n",
        )
        .unwrap();
        let mut m = machine();
        assert!(pools[0].missing_from(&m).is_empty());
        m.pci_devices.retain(|p| p.bus_id != "0000:af:00.0");
        let gone: Vec<String> = pools[0].missing_from(&m).into_iter().collect();
        assert_eq!(gone, ["0000:af:00.0-0", "0000:af:00.0-1"]);
        m.pci_devices.clear();
        assert_eq!(pools[0].missing_from(&m).len(), 4, "extra is listed by hand");
    }

    #[test]
    fn bus_id_list_narrows_the_match() {
        let pools = parse(
            "pools:\n- resource: example.com/gpu\n  match: {vendor: \"10de\", busIds: [\"0000:AF:00.0\"]}\n",
        )
        .unwrap();
        assert_eq!(pools[0].devices.len(), 1);
        assert_eq!(pools[0].devices[0].id, "0000:af:00.0");
    }

    #[test]
    fn bad_pools_are_refused_with_the_reason() {
        let cases = [
            ("pools: []\n", "no pool"),
            ("pools:\n- resource: example.com/gpu\n", "no device"),
            (
                "pools:\n- resource: example.com/gpu\n  capacity: 0\n  devices: [{id: a}]\n",
                "capacity must be at least 1",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  devices: [{id: a}]\n- resource: example.com/gpu\n  devices: [{id: b}]\n",
                "listed twice",
            ),
            (
                "pools:\n- resource: gpu\n  devices: [{id: a}]\n",
                "not an extended resource",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  devices: [{id: a}, {id: a}]\n",
                "device a is listed twice",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  devices: [{id: \"a,b\"}]\n",
                "comma",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  match: {vendor: \"xyz\"}\n",
                "not a 4-digit hex id",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  devices: [{id: a}]\n  deviceSpecs: [{containerPath: /dev/a, hostPath: /dev/a, permissions: rx}]\n",
                "subset of rwm",
            ),
            (
                "pools:\n- resource: example.com/gpu\n  shared: cluster\n  match: {vendor: \"10de\"}\n",
                "listed by ID",
            ),
        ];
        for (yaml, want) in cases {
            let err = parse(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        let long = "x".repeat(62);
        let err = parse(&format!(
            "pools:\n- resource: example.com/gpu\n  capacity: 12\n  devices: [{{id: {long}}}]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("too long"), "{err}");
    }
}
