//! Logging of missing machine parts, in its own test binary: tracing's callsite interest cache
//! is process-wide, so capturing logs while other tests run in parallel threads is racy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use numaplane_topology::synth::MachineSpec;
use numaplane_topology::{HugepagePool, Machine};

const GIB: u64 = 1 << 30;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn load_capturing_logs(xml: &str) -> (Machine, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let machine = tracing::subscriber::with_default(subscriber, || Machine::from_xml_str(xml).unwrap());
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (machine, logs)
}

#[test]
fn machine_without_distances_or_hugepages_loads_with_empty_parts() {
    let mut spec = MachineSpec::symmetric(2, 2, 2, 4 * GIB);
    for node in &mut spec.numa_nodes {
        node.distances.clear();
    }
    let (machine, logs) = load_capturing_logs(&spec.to_hwloc_xml().unwrap());
    assert_eq!(machine.numa_ids(), vec![0, 1]);
    assert!(
        machine
            .numa_nodes
            .iter()
            .all(|node| node.distances.is_empty() && node.hugepages.is_empty())
    );
    assert_eq!(machine.distance(0, 1), None);
    assert_eq!(logs.matches("no NUMA distances reported").count(), 1, "{logs}");
    assert_eq!(logs.matches("no hugepage pool").count(), 1, "{logs}");
    assert!(logs.contains("INFO"), "{logs}");

    let mut spec = MachineSpec::symmetric(2, 1, 1, 4 * GIB);
    spec.numa_nodes[0].hugepages = vec![HugepagePool {
        page_size_bytes: GIB,
        count: 1,
    }];
    let (machine, logs) = load_capturing_logs(&spec.to_hwloc_xml().unwrap());
    assert_eq!(machine.distance(0, 1), Some(20));
    assert!(logs.is_empty(), "{logs}");
}
