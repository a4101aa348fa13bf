//! PCI class naming and the device filter shared by the loader and the generator.

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

#[cfg(test)]
mod tests {
    use super::*;

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
