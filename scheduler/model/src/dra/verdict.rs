//! The vocabulary of a claim's NUMA alignment verdict: what the allocation state records for a
//! claim, what simulate, explain and the live loop report. The rules that reach a verdict are
//! in [`super::numa`]; this module is below both it and [`super::state`], which records it.

use std::collections::BTreeSet;

use serde::Serialize;

/// How a claim's devices sit relative to the containers that use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlignmentStatus {
    /// Every device on the containers' NUMA nodes.
    Aligned,
    /// A device on other NUMA nodes only.
    Misaligned,
    /// Devices aligned or without NUMA node, at least one without.
    NoNumaNode,
    /// Used by containers pinned to disjoint NUMA nodes.
    Split,
    /// No container that uses it has a predicted NUMA affinity narrower than the whole
    /// machine (no prediction, or nothing the kubelet aligns).
    NotPredicted,
}

impl AlignmentStatus {
    /// As metrics label it (the JSON name).
    pub fn metric_label(self) -> &'static str {
        match self {
            AlignmentStatus::Aligned => "aligned",
            AlignmentStatus::Misaligned => "misaligned",
            AlignmentStatus::NoNumaNode => "no-numa-node",
            AlignmentStatus::Split => "split",
            AlignmentStatus::NotPredicted => "not-predicted",
        }
    }

    /// As the table prints it.
    pub fn label(self) -> &'static str {
        match self {
            AlignmentStatus::Aligned => "aligned",
            AlignmentStatus::Misaligned => "MISALIGNED",
            AlignmentStatus::NoNumaNode => "no NUMA node",
            AlignmentStatus::Split => "split",
            AlignmentStatus::NotPredicted => "not predicted",
        }
    }
}

/// One device of a claim and its NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNumaEntry {
    /// `driver/pool/device`.
    pub device: String,
    /// The request it serves.
    pub request: String,
    /// Its NUMA nodes; absent when no source places it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<Vec<u32>>,
}

/// A container that uses a claim and its predicted NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerNumaEntry {
    /// Container name.
    pub name: String,
    /// Predicted NUMA affinity; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<Vec<u32>>,
    /// What the kubelet pins there (`cpu`, `memory`, `cpu and memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<&'static str>,
}

/// A claim's devices next to its containers' predicted NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimNuma {
    /// The devices, in allocation order.
    pub devices: Vec<DeviceNumaEntry>,
    /// The containers that name the claim.
    pub containers: Vec<ContainerNumaEntry>,
    /// The verdict.
    pub alignment: AlignmentStatus,
}

impl ClaimNuma {
    /// `devices on NUMA node 0; containers app (cpu) on NUMA node 1`, for a log line or an
    /// Event.
    pub fn describe(&self) -> String {
        let devices: BTreeSet<u32> = self
            .devices
            .iter()
            .flat_map(|d| d.numa_nodes.iter().flatten().copied())
            .collect();
        let containers: Vec<String> = self
            .containers
            .iter()
            .map(|c| {
                let pinned = c.pinned.map(|p| format!(" ({p})")).unwrap_or_default();
                let nodes = c
                    .numa_nodes
                    .as_deref()
                    .map_or_else(|| "no predicted NUMA node".to_owned(), nodes_text);
                format!("{}{pinned} on {nodes}", c.name)
            })
            .collect();
        let devices = if devices.is_empty() {
            "no NUMA node".to_owned()
        } else {
            nodes_text(&devices.into_iter().collect::<Vec<_>>())
        };
        format!("devices on {devices}; containers {}", containers.join(", "))
    }
}

pub(super) fn nodes_text(nodes: &[u32]) -> String {
    let ids = nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    if nodes.len() == 1 {
        format!("NUMA node {ids}")
    } else {
        format!("NUMA nodes {ids}")
    }
}
