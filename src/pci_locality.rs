//! PCI locality of a node: which NUMA node each PCI bus range hangs off.
//!
//! The exporter reads it from hwloc (one entry per host bridge's bus range) and publishes it on
//! the node's NodeResourceTopology as [`crate::nrt::attr::PCI_LOCALITY`]; the scheduler reads it
//! back to place a DRA device that names only its `resource.kubernetes.io/pciBusID` or
//! `resource.kubernetes.io/pcieRoot`. Bus ranges rather than device addresses keep the
//! attribute small: a two-socket server has a handful of host bridges and hundreds of functions.
//!
//! Wire form: entries `<domain>:<first bus>-<last bus>=<NUMA id>` joined by commas, domain and
//! buses in lower-case hex as Linux writes them (`0000:00-7f=0,0000:80-ff=1`); a range of one
//! bus may be written `<domain>:<bus>=<NUMA id>`. Ranges do not overlap.

/// One PCI bus range and the NUMA node its devices are local to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciBusRange {
    /// PCI domain (segment). Linux domains are 16 bits, VMD domains wider, so 32 bits.
    pub domain: u32,
    /// First bus of the range.
    pub first_bus: u8,
    /// Last bus of the range (inclusive).
    pub last_bus: u8,
    /// Linux NUMA node id (hwloc's NUMANode os_index).
    pub numa_node: u32,
}

impl PciBusRange {
    fn contains(&self, domain: u32, bus: u8) -> bool {
        self.domain == domain && (self.first_bus..=self.last_bus).contains(&bus)
    }
}

/// A [`crate::nrt::attr::PCI_LOCALITY`] value that is not a list of non-overlapping
/// `<domain>:<first>-<last>=<numa>` entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "PCI locality {value:?} is not <domain>:<first bus>-<last bus>=<NUMA id> entries without overlap: {reason}"
)]
pub struct PciLocalityError {
    /// The value as published.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Encodes ranges in the wire form, sorted; adjacent ranges of one domain and NUMA node are
/// merged so that the attribute stays small.
pub fn join_pci_locality(ranges: &[PciBusRange]) -> String {
    merge_pci_ranges(ranges.to_vec())
        .iter()
        .map(|r| {
            if r.first_bus == r.last_bus {
                format!("{:04x}:{:02x}={}", r.domain, r.first_bus, r.numa_node)
            } else {
                format!(
                    "{:04x}:{:02x}-{:02x}={}",
                    r.domain, r.first_bus, r.last_bus, r.numa_node
                )
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Sorts ranges and merges those of one domain and NUMA node that overlap or touch, as the
/// wire form carries them.
pub fn merge_pci_ranges(mut ranges: Vec<PciBusRange>) -> Vec<PciBusRange> {
    ranges.sort();
    let mut merged: Vec<PciBusRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        if let Some(last) = merged.last_mut()
            && last.domain == r.domain
            && last.numa_node == r.numa_node
            && u16::from(r.first_bus) <= u16::from(last.last_bus) + 1
        {
            last.last_bus = last.last_bus.max(r.last_bus);
            continue;
        }
        merged.push(r);
    }
    merged
}

/// Decodes [`join_pci_locality`]. Empty: no entries (a node without PCI locality).
pub fn split_pci_locality(value: &str) -> Result<Vec<PciBusRange>, PciLocalityError> {
    let err = |reason| PciLocalityError {
        value: value.to_owned(),
        reason,
    };
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (bus_part, numa) = entry.split_once('=').ok_or_else(|| err("an entry has no ="))?;
        let numa_node: u32 = numa
            .trim()
            .parse()
            .map_err(|_| err("a NUMA id is not a decimal number"))?;
        let (domain, buses) = bus_part
            .split_once(':')
            .ok_or_else(|| err("an entry has no domain"))?;
        let domain = parse_hex_u32(domain).ok_or_else(|| err("a domain is not hex"))?;
        let (first, last) = buses.split_once('-').unwrap_or((buses, buses));
        let first_bus = parse_hex_u8(first).ok_or_else(|| err("a bus is not a hex byte"))?;
        let last_bus = parse_hex_u8(last).ok_or_else(|| err("a bus is not a hex byte"))?;
        if first_bus > last_bus {
            return Err(err("a range ends before it starts"));
        }
        out.push(PciBusRange {
            domain,
            first_bus,
            last_bus,
            numa_node,
        });
    }
    out.sort();
    if out
        .windows(2)
        .any(|w| w[0].domain == w[1].domain && w[1].first_bus <= w[0].last_bus)
    {
        return Err(err("two ranges overlap"));
    }
    Ok(out)
}

/// The NUMA node of the range holding `(domain, bus)`, if any.
pub fn numa_node_of_bus(ranges: &[PciBusRange], domain: u32, bus: u8) -> Option<u32> {
    ranges
        .iter()
        .find(|r| r.contains(domain, bus))
        .map(|r| r.numa_node)
}

/// Domain and bus of a `resource.kubernetes.io/pciBusID` value, the extended BDF form
/// `<domain>:<bus>:<device>.<function>` (`0000:3b:00.0`). `None` for anything else.
pub fn parse_pci_bus_id(value: &str) -> Option<(u32, u8)> {
    let mut parts = value.split(':');
    let domain = parse_hex_u32(parts.next()?)?;
    let bus = parse_hex_u8(parts.next()?)?;
    let (device, function) = parts.next()?.split_once('.')?;
    let device = parse_hex_u8(device)?;
    let function = parse_hex_u8(function)?;
    if parts.next().is_some() || device > 0x1f || function > 7 {
        return None;
    }
    Some((domain, bus))
}

/// Domain and root bus of a `resource.kubernetes.io/pcieRoot` value, `pci<domain>:<bus>`
/// (`pci0000:3a`), the name of the root complex in sysfs. `None` for anything else.
pub fn parse_pcie_root(value: &str) -> Option<(u32, u8)> {
    let (domain, bus) = value.strip_prefix("pci")?.split_once(':')?;
    Some((parse_hex_u32(domain)?, parse_hex_u8(bus)?))
}

fn parse_hex_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

fn parse_hex_u8(s: &str) -> Option<u8> {
    let s = s.trim();
    if s.is_empty() || s.len() > 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(domain: u32, first_bus: u8, last_bus: u8, numa_node: u32) -> PciBusRange {
        PciBusRange {
            domain,
            first_bus,
            last_bus,
            numa_node,
        }
    }

    #[test]
    fn join_merges_adjacent_ranges_of_one_node_and_round_trips() {
        let ranges = [
            range(0, 0x40, 0x7f, 0),
            range(0, 0x00, 0x3f, 0),
            range(0, 0x80, 0xff, 1),
            range(0x10000, 0x01, 0x01, 1),
        ];
        let value = join_pci_locality(&ranges);
        assert_eq!(value, "0000:00-7f=0,0000:80-ff=1,10000:01=1");
        assert_eq!(
            split_pci_locality(&value).unwrap(),
            vec![
                range(0, 0, 0x7f, 0),
                range(0, 0x80, 0xff, 1),
                range(0x10000, 1, 1, 1)
            ]
        );
        assert_eq!(join_pci_locality(&[]), "");
        assert_eq!(split_pci_locality("").unwrap(), vec![]);
    }

    #[test]
    fn ranges_of_different_nodes_stay_apart() {
        let ranges = [range(0, 0x00, 0x3f, 0), range(0, 0x40, 0x7f, 1)];
        assert_eq!(join_pci_locality(&ranges), "0000:00-3f=0,0000:40-7f=1");
    }

    #[test]
    fn malformed_values_are_errors_naming_the_fault() {
        for (value, reason) in [
            ("0000:00-3f", "an entry has no ="),
            ("0000:00-3f=x", "a NUMA id is not a decimal number"),
            ("00-3f=0", "an entry has no domain"),
            ("zz:00-3f=0", "a domain is not hex"),
            ("0000:100=0", "a bus is not a hex byte"),
            ("0000:40-3f=0", "a range ends before it starts"),
            ("0000:00-40=0,0000:40-7f=1", "two ranges overlap"),
        ] {
            let e = split_pci_locality(value).unwrap_err();
            assert_eq!(e.reason, reason, "{value}");
            assert!(e.to_string().contains(value), "{e}");
        }
    }

    #[test]
    fn bus_ids_and_roots_resolve_through_the_ranges() {
        let ranges = split_pci_locality("0000:00-7f=0,0000:80-ff=1").unwrap();
        let (d, b) = parse_pci_bus_id("0000:3b:00.0").unwrap();
        assert_eq!(numa_node_of_bus(&ranges, d, b), Some(0));
        let (d, b) = parse_pci_bus_id("0000:af:1f.7").unwrap();
        assert_eq!(numa_node_of_bus(&ranges, d, b), Some(1));
        let (d, b) = parse_pcie_root("pci0000:80").unwrap();
        assert_eq!(numa_node_of_bus(&ranges, d, b), Some(1));
        let (d, b) = parse_pcie_root("pci0001:00").unwrap();
        assert_eq!(numa_node_of_bus(&ranges, d, b), None, "other domain");
    }

    #[test]
    fn malformed_addresses_resolve_to_nothing() {
        for bad in [
            "",
            "0000:3b",
            "0000:3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "3b:00.0",
            "0000:3b:00.0:1",
        ] {
            assert_eq!(parse_pci_bus_id(bad), None, "{bad}");
        }
        for bad in ["", "pci", "0000:3a", "pci0000", "pci0000:100", "pcix:00"] {
            assert_eq!(parse_pcie_root(bad), None, "{bad}");
        }
    }
}
