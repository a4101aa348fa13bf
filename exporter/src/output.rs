//! Rendering of command output as JSON, YAML or a table.

use std::fmt::Write as _;

use numaplane_topology::Machine;
use serde::Serialize;

/// Output format of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
    /// A human-readable table.
    Table,
}

/// Failure to render output.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// JSON serialization failed.
    #[error("rendering JSON")]
    Json(#[source] serde_json::Error),
    /// YAML serialization failed.
    #[error("rendering YAML")]
    Yaml(#[source] serde_saphyr::ser::Error),
}

/// Renders `value` as JSON or YAML.
pub fn render_structured<T: Serialize>(value: &T, format: Format) -> Result<String, OutputError> {
    match format {
        Format::Yaml => serde_saphyr::to_string(value).map_err(OutputError::Yaml),
        Format::Json | Format::Table => {
            let mut s = serde_json::to_string_pretty(value).map_err(OutputError::Json)?;
            s.push('\n');
            Ok(s)
        }
    }
}

/// Linux cpulist notation: `0-3,8,10-11`.
pub fn cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

/// Bytes in the largest binary unit that divides them exactly (`64Gi`, `1536Mi`, `4096`).
pub fn binary_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".to_owned();
    }
    let mut value = bytes;
    let mut unit = None;
    for u in UNITS {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        unit = Some(u);
    }
    format!("{value}{}", unit.unwrap_or(""))
}

/// Pads rows into aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let _ = write!(l, "{c:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// The machine model as a table an operator can read at a glance.
pub fn machine_table(machine: &Machine) -> String {
    let rows: Vec<Vec<String>> = machine
        .numa_nodes
        .iter()
        .map(|n| {
            let hugepages = n
                .hugepages
                .iter()
                .map(|h| format!("{}={}", h.resource_name(), h.count))
                .collect::<Vec<_>>()
                .join(",");
            let distances = n
                .distances
                .iter()
                .map(|d| d.value.to_string())
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                n.id.to_string(),
                cpulist(&n.cpus),
                n.cpus.len().to_string(),
                n.cores.len().to_string(),
                binary_bytes(n.memory_bytes),
                if hugepages.is_empty() {
                    "-".into()
                } else {
                    hugepages
                },
                if distances.is_empty() {
                    "-".into()
                } else {
                    distances
                },
            ]
        })
        .collect();
    let mut out = table(
        &[
            "NUMA",
            "CPUS",
            "#CPU",
            "#CORE",
            "MEMORY",
            "HUGEPAGES",
            "DISTANCES",
        ],
        &rows,
    );
    if !machine.pci_devices.is_empty() {
        let pci: Vec<Vec<String>> = machine
            .pci_devices
            .iter()
            .map(|d| {
                vec![
                    d.bus_id.clone(),
                    format!("{:04x}:{:04x}", d.vendor_id, d.device_id),
                    format!("{:04x} {}", d.class_id, d.class_name),
                    if d.numa_nodes.is_empty() {
                        "-".into()
                    } else {
                        d.numa_nodes
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    },
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["PCI BUS ID", "VENDOR:DEVICE", "CLASS", "NUMA"], &pci));
    }
    if !machine.pci_locality.is_empty() {
        // What the NRT publishes as numaplane.io/pci-locality.
        out.push('\n');
        out.push_str(&format!(
            "PCI LOCALITY  {}\n",
            numaplane::pci_locality::join_pci_locality(&machine.pci_locality)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpulist(&[4, 2, 0]), "0,2,4");
        assert_eq!(cpulist(&[]), "");
    }

    #[test]
    fn byte_units() {
        assert_eq!(binary_bytes(64 << 30), "64Gi");
        assert_eq!(binary_bytes(1536 << 20), "1536Mi");
        assert_eq!(binary_bytes(1000), "1000");
        assert_eq!(binary_bytes(0), "0");
    }

    #[test]
    fn machine_table_ends_with_the_pci_locality() {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/tests/fixtures/gpu-nic.xml");
        let machine = Machine::from_xml_file(&fixture).unwrap_or_else(|e| panic!("{e}"));
        let text = machine_table(&machine);
        assert!(
            text.ends_with("\nPCI LOCALITY  0000:17=0,0000:4b=0,0000:b1=1,0000:ca=1\n"),
            "{text}"
        );
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "LONGER"], &[vec!["xxxx".into(), "y".into()]]);
        assert_eq!(t, "A     LONGER\nxxxx  y\n");
    }
}
