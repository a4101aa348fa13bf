//! PCI class naming, the device filter and the PCI locality rules shared by the loader and the
//! generator.

use numaplane::pci_locality::PciBusRange;

/// Short operator-facing name for a PCI class id (class << 8 | subclass).
///
/// Sub-classes get their own name where it matters for placement (`gpu` is the
/// "3D controller" class most datacenter GPUs use, `nvme`, `infiniband`); otherwise the
/// base class decides (`network`, `storage`, `display`, ...).
pub fn class_name(class_id: u16) -> &'static str {
    match class_id {
        0x0108 => "nvme",
        0x0207 | 0x0c06 => "infiniband",
        0x0302 => "gpu",
        0x0502 => "cxl-memory",
        0x0c04 => "fibre-channel",
        _ => match class_id >> 8 {
            0x00 => "unclassified",
            0x01 => "storage",
            0x02 => "network",
            0x03 => "display",
            0x04 => "multimedia",
            0x05 => "memory",
            0x06 => "bridge",
            0x07 => "communication",
            0x08 => "system",
            0x0b => "processor",
            0x0c => "serial-bus",
            0x12 => "accelerator",
            _ => "other",
        },
    }
}

/// Whether hwloc's "keep important" I/O filter keeps a PCI device of this class
/// (mirror of `hwloc_filter_check_pcidev_subtype_important`, hwloc 2.9), bridges excluded
/// because they are plumbing, not placement targets.
pub(crate) fn is_modelled_class(class_id: u16) -> bool {
    let base = class_id >> 8;
    matches!(base, 0x00 | 0x01 | 0x02 | 0x03 | 0x0b | 0x12) || matches!(class_id, 0x0c04 | 0x0c06 | 0x0502)
}

/// The machine's PCI locality from its host bridges' bus ranges, each with the one NUMA node it
/// is local to: sorted, duplicates dropped. Two ranges of different nodes that overlap (a
/// host that reports one bus under two nodes) say nothing reliable about that bus, so both are
/// dropped, with a warning, rather than published as a value readers would reject.
pub(crate) fn normalize_locality(mut ranges: Vec<PciBusRange>) -> Vec<PciBusRange> {
    ranges.sort();
    ranges.dedup();
    let overlaps = |a: &PciBusRange, b: &PciBusRange| {
        a.domain == b.domain && a.first_bus <= b.last_bus && b.first_bus <= a.last_bus
    };
    let conflicting: Vec<bool> = ranges
        .iter()
        .enumerate()
        .map(|(i, a)| {
            ranges
                .iter()
                .enumerate()
                .any(|(j, b)| i != j && overlaps(a, b) && a.numa_node != b.numa_node)
        })
        .collect();
    let mut kept = Vec::with_capacity(ranges.len());
    for (range, conflict) in ranges.into_iter().zip(conflicting) {
        if conflict {
            tracing::warn!(
                domain = format_args!("{:04x}", range.domain),
                first_bus = format_args!("{:02x}", range.first_bus),
                last_bus = format_args!("{:02x}", range.last_bus),
                numa_node = range.numa_node,
                "PCI bus range overlaps a range of another NUMA node; its locality is left unknown"
            );
        } else {
            kept.push(range);
        }
    }
    // Ranges of one node may still overlap (nested host bridges) or touch: merge them as the
    // wire form does, so that the model and its published value are the same ranges.
    numaplane::pci_locality::merge_pci_ranges(kept)
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
    fn locality_is_sorted_and_drops_buses_claimed_by_two_nodes() {
        let got = normalize_locality(vec![
            range(0, 0x80, 0xff, 1),
            range(0, 0x00, 0x3f, 0),
            range(0, 0x00, 0x3f, 0),
            range(0, 0x40, 0x4f, 0),
            range(0, 0x48, 0x48, 1),
            range(1, 0x00, 0x10, 0),
            range(1, 0x05, 0x20, 0),
            range(1, 0x21, 0x21, 0),
        ]);
        assert_eq!(
            got,
            vec![
                range(0, 0x00, 0x3f, 0),
                range(0, 0x80, 0xff, 1),
                range(1, 0x00, 0x21, 0)
            ]
        );
        let value = numaplane::pci_locality::join_pci_locality(&got);
        assert_eq!(numaplane::pci_locality::split_pci_locality(&value).unwrap(), got);
    }

    #[test]
    fn names() {
        assert_eq!(class_name(0x0302), "gpu");
        assert_eq!(class_name(0x0300), "display");
        assert_eq!(class_name(0x0200), "network");
        assert_eq!(class_name(0x0207), "infiniband");
        assert_eq!(class_name(0x0108), "nvme");
        assert_eq!(class_name(0x0106), "storage");
        assert_eq!(class_name(0x1200), "accelerator");
        assert_eq!(class_name(0x0604), "bridge");
        assert_eq!(class_name(0xff00), "other");
    }

    #[test]
    fn modelled_classes() {
        assert!(is_modelled_class(0x0302));
        assert!(is_modelled_class(0x0200));
        assert!(is_modelled_class(0x1200));
        assert!(!is_modelled_class(0x0604));
        assert!(!is_modelled_class(0x0c03));
    }
}
