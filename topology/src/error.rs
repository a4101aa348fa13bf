//! The crate's single error type.

use std::fmt;
use std::path::PathBuf;

use hwlocality::errors::RawHwlocError;
use hwlocality::topology::builder::StringInputError;

/// Where a topology XML document came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XmlOrigin {
    /// Read from this file.
    File(PathBuf),
    /// Passed in memory (e.g. [`crate::Machine::from_xml_str`]).
    Memory,
}

impl fmt::Display for XmlOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Memory => f.write_str("in-memory document"),
        }
    }
}

/// Everything that can go wrong while discovering, loading or generating a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Configuring hwloc (object type filters or build flags) failed.
    #[error("cannot configure hwloc topology discovery ({setting})")]
    ConfigureDiscovery {
        /// The setting being applied.
        setting: &'static str,
        /// Underlying hwloc or hwlocality error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// hwloc could not discover the topology of the running host.
    #[error("cannot discover the topology of this host")]
    DiscoverSystem {
        /// Underlying hwloc error.
        source: RawHwlocError,
    },

    /// A topology XML file could not be read from disk.
    #[error("cannot read topology XML {path}")]
    ReadXml {
        /// The file that was requested.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },

    /// hwloc refused the XML document as a topology source.
    #[error("cannot use topology XML from {origin} as hwloc input")]
    ParseXml {
        /// Where the document came from.
        origin: XmlOrigin,
        /// Underlying hwlocality error.
        source: StringInputError,
    },

    /// hwloc accepted the XML source but failed to build a topology from it.
    #[error("cannot load topology from XML {origin}")]
    LoadXml {
        /// Where the document came from.
        origin: XmlOrigin,
        /// Underlying hwloc error.
        source: RawHwlocError,
    },

    /// hwloc failed to report the NUMA distance matrices.
    #[error("cannot read NUMA distances from hwloc")]
    ReadDistances {
        /// Underlying hwloc error.
        source: RawHwlocError,
    },

    /// The hwloc topology lacks something the machine model needs.
    #[error("cannot build the machine model: {reason}")]
    BuildModel {
        /// What is missing or inconsistent.
        reason: String,
    },

    /// A [`crate::synth::MachineSpec`] is not a consistent machine description.
    #[error("invalid machine spec: {reason}")]
    ValidateSpec {
        /// What is wrong with the spec.
        reason: String,
    },
}
