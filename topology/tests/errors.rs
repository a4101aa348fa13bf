//! Bad input gives a typed error, never a panic.

// Helpers outside #[test] fns are test code too; clippy's allow-unwrap-in-tests misses them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::error::Error;
use std::path::Path;

use numaplane_topology::{Machine, TopologyError, XmlOrigin};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

/// The top-level message must add context, not repeat what its source says.
fn assert_message_does_not_repeat_source(error: &TopologyError) {
    let message = error.to_string();
    let source = error.source().expect("every load error has a source").to_string();
    assert!(!message.contains(&source), "{message:?} repeats {source:?}");
}

#[test]
fn malformed_xml_is_a_parse_or_load_error() {
    let good = fixture("2numa.xml");
    let cases = [
        ("empty", String::new()),
        ("not xml", "this is not a topology".to_owned()),
        ("truncated", good[..good.len() / 2].to_owned()),
        ("other document", "<?xml version=\"1.0\"?><inventory/>".to_owned()),
        ("nul byte", "<topology>\0</topology>".to_owned()),
        (
            "no numa node",
            good.replace("type=\"NUMANode\"", "type=\"Group\""),
        ),
        ("short distance matrix", good.replace("10 21 21 10 ", "10 21 ")),
    ];
    for (name, xml) in cases {
        match Machine::from_xml_str(&xml) {
            Err(error @ (TopologyError::ParseXml { .. } | TopologyError::LoadXml { .. })) => {
                assert_message_does_not_repeat_source(&error);
                assert!(
                    error.to_string().contains("in-memory document"),
                    "{name}: {error}"
                );
            }
            other => panic!("{name}: expected a parse/load error, got {other:?}"),
        }
    }
}

#[test]
fn malformed_xml_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.xml");
    std::fs::write(&path, "<topology version=\"2.0\"><object type=\"Machine\"").unwrap();
    match Machine::from_xml_file(&path) {
        Err(error @ (TopologyError::ParseXml { .. } | TopologyError::LoadXml { .. })) => {
            assert!(error.to_string().contains("broken.xml"), "{error}");
            assert_message_does_not_repeat_source(&error);
        }
        other => panic!("expected a parse/load error, got {other:?}"),
    }
}

#[test]
fn missing_file_is_a_read_error() {
    let path = Path::new("/nonexistent/numaplane/topology.xml");
    match Machine::from_xml_file(path) {
        Err(error @ TopologyError::ReadXml { .. }) => {
            let TopologyError::ReadXml {
                path: reported,
                source,
            } = &error
            else {
                unreachable!()
            };
            assert_eq!(reported, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            assert!(error.to_string().contains("/nonexistent/numaplane/topology.xml"));
            assert_message_does_not_repeat_source(&error);
        }
        other => panic!("expected ReadXml, got {other:?}"),
    }
}

#[test]
fn directory_and_non_utf8_files_are_read_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Machine::from_xml_file(dir.path()),
        Err(TopologyError::ReadXml { .. })
    ));

    let path = dir.path().join("latin1.xml");
    std::fs::write(&path, b"<topology \xff\xfe>").unwrap();
    match Machine::from_xml_file(&path) {
        Err(TopologyError::ReadXml { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData)
        }
        other => panic!("expected ReadXml, got {other:?}"),
    }
}

#[test]
fn origin_is_reported() {
    let Err(TopologyError::ParseXml { origin, .. }) = Machine::from_xml_str("nope") else {
        panic!("expected ParseXml");
    };
    assert_eq!(origin, XmlOrigin::Memory);
}
