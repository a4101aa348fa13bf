//! Discovery of the host running the tests (a small VM in CI).

// Helpers outside #[test] fns are test code too; clippy's allow-unwrap-in-tests misses them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use numaplane_topology::Machine;

#[test]
fn from_system_describes_this_host() {
    let machine = Machine::from_system().unwrap();
    assert!(!machine.numa_nodes.is_empty());
    let cpus = machine.cpus();
    assert!(!cpus.is_empty());

    let online = std::thread::available_parallelism().map_or(1, usize::from);
    // available_parallelism honours the cgroup/affinity limits; the model must not.
    assert!(
        cpus.len() >= online,
        "{} CPUs in model, {online} usable",
        cpus.len()
    );

    for node in &machine.numa_nodes {
        let mut from_cores: Vec<u32> = node.cores.iter().flatten().copied().collect();
        from_cores.sort_unstable();
        assert_eq!(from_cores, node.cpus, "node {}", node.id);
    }
    let ids = machine.numa_ids();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(
        machine
            .pci_devices
            .windows(2)
            .all(|pair| pair[0].bus_id < pair[1].bus_id)
    );
    for device in &machine.pci_devices {
        assert!(
            device.numa_nodes.iter().all(|node| ids.contains(node)),
            "{device:?}"
        );
    }
    // What the CLI prints must serialize.
    serde_json::to_string_pretty(&machine).unwrap();
}

#[test]
fn from_system_matches_sysfs_when_available() {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/node") else {
        return;
    };
    let mut sysfs_nodes: Vec<u32> = entries
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()?
                .strip_prefix("node")?
                .parse()
                .ok()
        })
        .collect();
    sysfs_nodes.sort_unstable();
    if sysfs_nodes.is_empty() {
        return;
    }
    let machine = Machine::from_system().unwrap();
    assert_eq!(machine.numa_ids(), sysfs_nodes);
    for id in sysfs_nodes {
        let Ok(list) = std::fs::read_to_string(format!("/sys/devices/system/node/node{id}/cpulist")) else {
            continue;
        };
        assert_eq!(
            machine.node(id).unwrap().cpus,
            parse_cpulist(list.trim()),
            "node {id}"
        );
    }
}

/// Parse a Linux cpulist such as `0-3,8,10-11`.
fn parse_cpulist(list: &str) -> Vec<u32> {
    list.split(',')
        .filter(|part| !part.is_empty())
        .flat_map(|part| match part.split_once('-') {
            Some((start, end)) => (start.parse::<u32>().unwrap()..=end.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}
