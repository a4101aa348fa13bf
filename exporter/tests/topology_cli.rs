//! `numaplane-exporter topology` end to end: the real binary, real hwloc, every XML fixture.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use numaplane_topology::Machine;

fn fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../topology/tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "fixtures missing in {}", dir.display());
    files
}

fn exporter() -> Command {
    Command::new(env!("CARGO_BIN_EXE_numaplane-exporter"))
}

/// The fixture `name` (one of [`fixtures`]).
fn fixture(name: &str) -> PathBuf {
    fixtures().into_iter().find(|p| p.ends_with(name)).unwrap()
}

/// What `numaplane-exporter topology -o <format>` prints for the fixture `name`; it must succeed.
fn printed(format: &str, name: &str) -> String {
    let out = topology(format, &fixture(name));
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// `numaplane-exporter topology -o <format>` of the machine `xml`.
fn topology(format: &str, xml: &Path) -> Output {
    exporter()
        .args(["topology", "-o", format, "--topology-xml"])
        .arg(xml)
        .output()
        .unwrap()
}

#[test]
fn json_output_reports_exactly_the_fixture_machine() {
    for xml in fixtures() {
        let out = topology("json", &xml);
        assert!(
            out.status.success(),
            "{}: {}",
            xml.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Machine = serde_json::from_slice(&out.stdout).unwrap();
        // The fixture tests in topology/ pin every fixture's content field by field; here the
        // CLI must print that same model, unchanged.
        assert_eq!(
            printed,
            Machine::from_xml_file(&xml).unwrap(),
            "{}",
            xml.display()
        );
    }
}

#[test]
fn gpu_nic_fixture_shows_locality_in_the_table() {
    let table = printed("table", "gpu-nic.xml");
    let gpu_line = table
        .lines()
        .find(|l| l.contains("10de:20b5"))
        .expect("GPU listed");
    assert!(
        gpu_line.trim_end().ends_with('1'),
        "GPU should be local to NUMA 1: {gpu_line}"
    );
    assert!(table.lines().next().unwrap().starts_with("NUMA"));
}

#[test]
fn yaml_output_parses_back() {
    let text = printed("yaml", "hugepages-2sizes.xml");
    assert!(
        text.contains("page_size_bytes") || text.contains("hugepages"),
        "{text}"
    );
}

#[test]
fn bad_or_missing_xml_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.xml");
    std::fs::write(&bad, "<topology><object type=").unwrap();
    for path in [bad, dir.path().join("missing.xml")] {
        let out = exporter()
            .args(["topology", "--topology-xml"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{}", path.display());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("numaplane-exporter:"))
            .collect();
        assert_eq!(ours.len(), 1, "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}
