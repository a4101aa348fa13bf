//! `numaplane-scheduler simulate`: schedules pods offline against Nodes, NodeResourceTopologies
//! and already-bound Pods read from multi-document YAML or JSON files, assuming each placement
//! so later pods see it.

use std::{collections::HashMap, path::Path};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
    resource::v1::{DeviceClass, ResourceClaim},
};
use numaplane::nrt::NodeResourceTopology;
use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    cluster::{Cluster, Config},
    decision::Decision,
    dra::slice::ResourceSlice,
    pod::PodSpec,
    score::Scorer,
};

/// A failure that stops the simulation (bad input files); per-pod problems are results.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A file could not be read.
    #[error("reading {path}")]
    ReadFile {
        /// File path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A document did not parse.
    #[error("{path}: document {index}: {message}")]
    ParseDocument {
        /// File path.
        path: String,
        /// 1-based document index.
        index: usize,
        /// Parser message.
        message: String,
    },
    /// A YAML file did not parse.
    #[error("{path}: {message}")]
    ParseYaml {
        /// File path.
        path: String,
        /// Parser message (its first line) with the place.
        message: String,
    },
    /// A file is larger than [`MAX_INPUT_BYTES`].
    #[error("{path} is {bytes} bytes, more than the {MAX_INPUT_BYTES} bytes simulate reads")]
    TooLarge {
        /// File path.
        path: String,
        /// Its size.
        bytes: u64,
    },
    /// The config file is invalid.
    #[error("config {path}: {message}")]
    ParseConfig {
        /// File path.
        path: String,
        /// What is wrong.
        message: String,
    },
}

pub use crate::config_file::{ConfigFile, ResourceWeight, ScoringStrategyFile};

mod block_yaml;
mod read;
mod table;

pub use table::render_table;

/// Input objects, by kind.
#[derive(Default)]
pub struct Inputs {
    /// Nodes.
    pub nodes: Vec<Node>,
    /// NRTs.
    pub nrts: Vec<NodeResourceTopology>,
    /// Pods.
    pub pods: Vec<Pod>,
    /// Namespaces (their labels, for `namespaceSelector`).
    pub namespaces: Vec<Namespace>,
    /// Documents skipped, with the reason (unknown kinds).
    pub skipped: Vec<String>,
    /// PersistentVolumeClaims, PersistentVolumes, StorageClasses.
    pub storage: crate::volume_binding::StorageObjects,
    /// PodDisruptionBudgets (which preemption victims they protect).
    pub budgets: Vec<PodDisruptionBudget>,
    /// DeviceClasses (`resource.k8s.io/v1`).
    pub device_classes: Vec<DeviceClass>,
    /// ResourceSlices (`resource.k8s.io/v1`).
    pub resource_slices: Vec<ResourceSlice>,
    /// ResourceClaims (`resource.k8s.io/v1`); an allocated one holds its devices.
    pub resource_claims: Vec<ResourceClaim>,
}

/// The one apiVersion of the DRA kinds that is read.
const V1: &str = "resource.k8s.io/v1";

impl Inputs {
    /// Decodes an object of `kind` into its list: the one place that says which kinds the
    /// readers take. `api_version` is the object's, when the reader has already seen it (it
    /// came before `kind`). `Ok(Some(why))` for an object not read (its kind, or its
    /// apiVersion); then `object` may be left partly unread.
    pub fn take<'de, D: Deserializer<'de>>(
        &mut self,
        kind: &str,
        api_version: Option<&str>,
        object: D,
    ) -> Result<Option<String>, D::Error> {
        match kind {
            "Node" => self.nodes.push(read::node(object)?),
            "Pod" => self.pods.push(Pod::deserialize(object)?),
            "Namespace" => self.namespaces.push(Namespace::deserialize(object)?),
            "NodeResourceTopology" => self.nrts.push(NodeResourceTopology::deserialize(object)?),
            "PodDisruptionBudget" => self.budgets.push(PodDisruptionBudget::deserialize(object)?),
            "DeviceClass" | "ResourceSlice" | "ResourceClaim" if api_version.is_some() => {
                // Only v1 is read. Its apiVersion came first (as kubectl writes it): decoded
                // straight into the type, without a tree (a dump has one slice per node).
                if api_version != Some(V1) {
                    return Ok(Some(format!("{kind} ignored: only apiVersion {V1} is read")));
                }
                match kind {
                    "DeviceClass" => self.device_classes.push(DeviceClass::deserialize(object)?),
                    "ResourceSlice" => self.resource_slices.push(ResourceSlice::deserialize(object)?),
                    _ => self.resource_claims.push(ResourceClaim::deserialize(object)?),
                }
            }
            "DeviceClass" | "ResourceSlice" | "ResourceClaim" => {
                // Only v1 is read, and here `apiVersion` may follow the fields: each object is
                // held as a tree until its version is known.
                let tree = serde_json::Value::deserialize(object)?;
                if tree.get("apiVersion").and_then(serde_json::Value::as_str) != Some(V1) {
                    return Ok(Some(format!("{kind} ignored: only apiVersion {V1} is read")));
                }
                let typed = <D::Error as serde::de::Error>::custom;
                match kind {
                    "DeviceClass" => self
                        .device_classes
                        .push(serde_json::from_value(tree).map_err(typed)?),
                    "ResourceSlice" => self
                        .resource_slices
                        .push(serde_json::from_value(tree).map_err(typed)?),
                    _ => self
                        .resource_claims
                        .push(serde_json::from_value(tree).map_err(typed)?),
                }
            }
            _ => {
                if !self.storage.read(kind, object)? {
                    return Ok(Some(format!("kind {kind:?} ignored")));
                }
            }
        }
        Ok(None)
    }

    /// Moves every object of `other` after this one's, kind by kind.
    pub fn append(&mut self, other: Inputs) {
        fn join<T>(into: &mut Vec<T>, more: Vec<T>) {
            if into.is_empty() {
                *into = more;
            } else {
                into.extend(more);
            }
        }
        let Inputs {
            nodes,
            nrts,
            pods,
            namespaces,
            skipped,
            storage,
            budgets,
            device_classes,
            resource_slices,
            resource_claims,
        } = other;
        join(&mut self.nodes, nodes);
        join(&mut self.nrts, nrts);
        join(&mut self.pods, pods);
        join(&mut self.namespaces, namespaces);
        join(&mut self.skipped, skipped);
        let crate::volume_binding::StorageObjects {
            claims,
            volumes,
            classes,
            csi_nodes,
        } = storage;
        join(&mut self.storage.claims, claims);
        join(&mut self.storage.volumes, volumes);
        join(&mut self.storage.classes, classes);
        join(&mut self.storage.csi_nodes, csi_nodes);
        join(&mut self.budgets, budgets);
        join(&mut self.device_classes, device_classes);
        join(&mut self.resource_slices, resource_slices);
        join(&mut self.resource_claims, resource_claims);
    }
}

/// Largest input file. A 5,000-node cluster dump with its pods is a few hundred MiB; the text
/// is held in memory while it is decoded, so a bound keeps a wrong path from exhausting the
/// machine.
pub const MAX_INPUT_BYTES: u64 = 4 << 30;

/// The YAML budget for `len` bytes of text. serde-saphyr's defaults (1,024 documents, 250,000
/// YAML nodes, 64 MiB of scalars) stop at about 400 nodes with NRTs. Here every limit grows
/// with the input: without aliases a document needs at least 4 bytes (`---\n`), a YAML node
/// at least one, and scalars cannot hold more bytes than the text. So a real dump of any size
/// passes, while the defence against expansion attacks (alias counts and the alias/anchor
/// ratio, nesting depth) is kept as serde-saphyr sets it: memory stays linear in the input.
fn yaml_budget(len: usize) -> serde_saphyr::Budget {
    let mut b = serde_saphyr::Budget::default();
    b.max_documents = b.max_documents.max(len / 4 + 1);
    b.max_nodes = b.max_nodes.max(len.saturating_add(1));
    b.max_events = b.max_events.max(len.saturating_mul(3));
    b.max_total_scalar_bytes = b.max_total_scalar_bytes.max(len);
    b
}

/// Decodes the objects of one file's `text`: a stream of JSON values if it starts like JSON,
/// else multi-document YAML.
fn decode(text: &str, path: &str) -> Result<read::Documents, SimulateError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut docs = read::Documents::default();
        for (i, doc) in serde_json::Deserializer::from_str(text)
            .into_iter::<read::JsonDocument>()
            .enumerate()
        {
            let doc = doc.map_err(|e| SimulateError::ParseDocument {
                path: path.to_owned(),
                index: i + 1,
                message: e.to_string(),
            })?;
            docs.extend([doc]);
        }
        return Ok(docs);
    }
    // The block-style subset kubectl and serde-saphyr write is read fast; anything else, and
    // any failure, is read again from the start by serde-saphyr, whose results and errors stand.
    match block_yaml::from_str_multiple::<read::YamlDocument, read::Documents>(text) {
        Ok(docs) => {
            tracing::debug!(path, "read with the block-YAML reader");
            return Ok(docs);
        }
        Err(e) => tracing::debug!(path, "block-YAML reader: {e}; reading with serde-saphyr"),
    }
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(yaml_budget(text.len()));
    serde_saphyr::from_str_multiple_with_options::<read::YamlDocument, read::Documents>(text, options).map_err(
        |e| {
            // The first line names the place; the rest is a source snippet.
            let full = e.to_string();
            let first = full.lines().next().unwrap_or_default();
            let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
            if message.contains("budget breached") {
                message.push_str(
                    " (the YAML expands far beyond its own size, e.g. through aliases; refused as hostile input)",
                );
            }
            SimulateError::ParseYaml {
                path: path.to_owned(),
                message,
            }
        },
    )
}

fn read_text(path: &Path) -> Result<String, SimulateError> {
    let shown = path.display().to_string();
    let len = std::fs::metadata(path)
        .map_err(|source| SimulateError::ReadFile {
            path: shown.clone(),
            source,
        })?
        .len();
    if len > MAX_INPUT_BYTES {
        return Err(SimulateError::TooLarge {
            path: shown,
            bytes: len,
        });
    }
    std::fs::read_to_string(path).map_err(|source| SimulateError::ReadFile { path: shown, source })
}

/// Reads objects from files; `List` kinds (`kubectl get -o yaml|json`) are flattened, nested
/// lists too. Each object is decoded from the text into its type as the parser reads it.
pub fn read_inputs(paths: &[impl AsRef<Path>]) -> Result<Inputs, SimulateError> {
    let mut inputs = Inputs::default();
    for p in paths {
        let path = p.as_ref().display().to_string();
        let text = read_text(p.as_ref())?;
        let docs = decode(&text, &path)?;
        drop(text);
        let read::Objects {
            inputs: mut file,
            ignored,
        } = docs.objects;
        file.skipped.extend(
            ignored
                .into_iter()
                .map(|(index, why)| format!("{path}: document {}: {why}", index + 1)),
        );
        inputs.append(file);
    }
    Ok(inputs)
}

/// Reads and validates the config file.
pub fn read_config(path: &Path) -> Result<ConfigFile, SimulateError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SimulateError::ReadFile {
        path: p.clone(),
        source,
    })?;
    let file: ConfigFile = serde_saphyr::from_str(&text).map_err(|e| SimulateError::ParseConfig {
        path: p.clone(),
        message: e.to_string(),
    })?;
    // A bad podTopologySpread section is a bad config file.
    file.pod_topology_spread
        .defaults()
        .map_err(|e| SimulateError::ParseConfig {
            path: p,
            message: e.to_string(),
        })?;
    Ok(file)
}

/// One pod's simulation result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResult {
    /// The decision (node, placement, allocation, per-node verdicts and scores).
    #[serde(flatten)]
    pub decision: Decision,
    /// Set when the pod itself is malformed (then no node is evaluated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The pod has scheduling gates, so it is not decided (no node is evaluated).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gated: bool,
    /// Fields the pod sets that the model does not enforce.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<crate::unsupported::Unsupported>,
    /// For a pod that fits nowhere: the preemption the live scheduler would start (not applied
    /// here: the victims stay, and the pod stays unschedulable in this report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionPreview>,
    /// For a placed pod with resource claims: each claim and its AllocationResult (the one that
    /// would be written, or the one it has).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<crate::dra::state::ClaimAllocation>,
    /// A claim error that fails the pod's scheduling attempt as a whole (kube-scheduler's status
    /// Error, retried later): unknown DeviceClass, bad CEL selector, incomplete pool, …
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims_error: Option<String>,
}

/// A preemption `run` would start for a pod.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionPreview {
    /// The node that would be nominated.
    pub node: String,
    /// The pods that would be evicted (`namespace/name`), most important first.
    pub victims: Vec<String>,
    /// How many of them a PodDisruptionBudget protects.
    pub budget_violations: usize,
    /// The NUMA nodes the pod would get there once they are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<Vec<u32>>,
}

/// The whole report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Schema version of this report.
    pub schema: &'static str,
    /// Counts.
    pub summary: Summary,
    /// Per pod, in input order.
    pub results: Vec<PodResult>,
    /// Input problems that did not stop the run (invalid NRTs, skipped documents, …).
    pub warnings: Vec<String>,
}

/// Report counts.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Pods given.
    pub pods: usize,
    /// Pods placed.
    pub scheduled: usize,
    /// Pods left pending.
    pub unschedulable: usize,
}

/// Which per-node verdicts the report holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Explain {
    /// Every node's verdict, for pods that fit nowhere only (the chosen node's for the
    /// others). Placed pods take the fast decision path.
    #[default]
    Failed,
    /// Every node's verdict for every pod (each pod is evaluated afresh on every node).
    All,
    /// No per-node verdicts: each pod's result, message and placement only.
    None,
}

/// Runs the simulation.
pub fn simulate(cluster_inputs: Inputs, pods: Vec<Pod>, cfg_file: &ConfigFile, explain: Explain) -> Report {
    simulate_keeping_model(cluster_inputs, pods, cfg_file, explain).0
}

/// [`simulate`], handing back the model it built as well, for a command about to exit to leave
/// to the operating system: freeing a 5,000-node model one allocation at a time was a seventh
/// of such a run.
pub fn simulate_keeping_model(
    cluster_inputs: Inputs,
    pods: Vec<Pod>,
    cfg_file: &ConfigFile,
    explain: Explain,
) -> (Report, Cluster) {
    // Each object is dropped once the model has taken what it reads: on a cluster dump the
    // decoded objects are several times the model's size.
    let Inputs {
        nodes,
        nrts,
        pods: cluster_pods,
        namespaces,
        skipped: mut warnings,
        storage,
        budgets,
        device_classes,
        resource_slices,
        resource_claims,
    } = cluster_inputs;
    let mut cluster = Cluster::new();
    storage.load_into(&mut cluster.volumes);
    cluster.reset_pdbs(&budgets);
    cluster.dra.enable();
    for c in device_classes {
        cluster.dra.apply_class(c);
    }
    let dra_numa = cfg_file.dra_numa.resolve(None);
    for slice in &resource_slices {
        for e in crate::dra::numa::invalid_device_numa(slice, &dra_numa.driver_attributes) {
            warnings.push(format!(
                "ResourceSlice {}: {e}; the device is allocated as one without NUMA node",
                slice.metadata.name.as_deref().unwrap_or("<unnamed>")
            ));
        }
    }
    cluster.dra.set_slices(resource_slices);
    for c in resource_claims {
        cluster.dra.apply_claim(c);
    }
    // Namespaces and the default spread constraints.
    for ns in &namespaces {
        cluster.apply_namespace(ns);
    }
    match cfg_file.pod_topology_spread.defaults() {
        Ok(d) => cluster.set_spread_defaults(d),
        Err(e) => warnings.push(format!(
            "config: {e}; kube-scheduler's system default spread constraints apply"
        )),
    }
    for n in nodes {
        if let Err(e) = cluster.apply_node(&n) {
            warnings.push(format!("node skipped: {}", numaplane::error_chain(&e)));
        }
    }
    for t in nrts {
        let name = t.metadata.name.as_deref().unwrap_or("<unnamed>");
        if let Err(e) = cluster.apply_nrt(&t) {
            warnings.push(format!(
                "NodeResourceTopology {name}: topology unknown or invalid: {}",
                numaplane::error_chain(&e)
            ));
        } else if let crate::cluster::TopologyState::Valid(topo) = cluster.topology(name) {
            if let Some(e) = &topo.pci_locality_error {
                warnings.push(format!(
                    "NodeResourceTopology {name}: PCI locality ignored ({e}); DRA devices placed only by their PCI address count as without NUMA node"
                ));
            }
            for a in &topo.approximate {
                warnings.push(format!(
                    "node {name}: predictions are approximate: {a} (--unknown-kubelet-options {})",
                    cfg_file.unknown_kubelet_options.name()
                ));
            }
        }
    }
    for p in cluster_pods {
        let bound = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if !bound {
            warnings.push(format!(
                "cluster pod {} is not bound (no spec.nodeName); pass pods to schedule with --pods",
                p.metadata.name.as_deref().unwrap_or("<unnamed>")
            ));
            continue;
        }
        if let Err(e) = cluster.apply_pod(&p) {
            warnings.push(format!("bound pod skipped: {}", numaplane::error_chain(&e)));
        }
    }
    let weights: Vec<(String, i64)> = cfg_file
        .scoring_strategy
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.weight))
        .collect();
    let config = Config {
        scorer: Scorer {
            strategy: cfg_file.scoring_strategy.strategy,
            weights: crate::score::weights_from_names(&mut cluster.res, &weights),
        },
        no_topology: cfg_file.no_topology,
        dra_numa,
        unknown_kubelet_options: cfg_file.unknown_kubelet_options,
    };
    let mut results = Vec::with_capacity(pods.len());
    for p in pods {
        let p = &p;
        // Listed in the pod's result (and its table line).
        let unsupported = crate::unsupported::detect(p);
        // Not decided, not assumed.
        if crate::gates::gated(p) {
            results.push(PodResult {
                decision: crate::gates::gated_decision(p),
                error: None,
                gated: true,
                unsupported,
                preemption: None,
                claims: Vec::new(),
                claims_error: None,
            });
            continue;
        }
        match PodSpec::from_pod(&mut cluster.res, p) {
            Ok(spec) => {
                // Without `All`, a pod that fits nowhere is still explained by `schedule`;
                // with `None`, only its message is built, as the live loop builds it.
                let (mut decision, outcome) = match explain {
                    Explain::None => cluster.decide_with_claims(&config, &spec),
                    _ => cluster.schedule_with_claims(&config, &spec, explain == Explain::All),
                };
                cluster.assume(&spec, &decision);
                if decision.node.is_some() {
                    cluster.commit_claims(&spec, &outcome.claims);
                }
                if explain == Explain::None {
                    decision.nodes.clear();
                }
                let preemption = decision
                    .node
                    .is_none()
                    .then_some(())
                    .filter(|()| crate::preempt::may_preempt(p))
                    .and_then(|()| cluster.preempt(&config, &spec, crate::preempt::priority_of(p)))
                    .map(|found| PreemptionPreview {
                        node: found.node,
                        victims: found.victims.into_iter().map(|v| v.key).collect(),
                        budget_violations: found.budget_violations,
                        numa_nodes: found.decision.allocation.map(|a| {
                            let mut zones: Vec<u32> = a
                                .pod_numa_nodes
                                .iter()
                                .flatten()
                                .chain(a.containers.iter().flat_map(|c| c.numa_nodes.iter().flatten()))
                                .copied()
                                .collect();
                            zones.sort_unstable();
                            zones.dedup();
                            zones
                        }),
                    });
                results.push(PodResult {
                    decision,
                    error: None,
                    gated: false,
                    unsupported,
                    preemption,
                    claims: outcome.claims,
                    claims_error: outcome.error.map(|e| e.to_string()),
                });
            }
            Err(e) => {
                let key = format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or("<unnamed>")
                );
                let msg = numaplane::error_chain(&e);
                results.push(PodResult {
                    decision: Decision {
                        pod: key,
                        node: None,
                        message: format!("pod is unschedulable: {msg}"),
                        placement: None,
                        allocation: None,
                        nodes: Vec::new(),
                    },
                    error: Some(msg),
                    gated: false,
                    unsupported,
                    preemption: None,
                    claims: Vec::new(),
                    claims_error: None,
                });
            }
        }
    }
    let scheduled = results.iter().filter(|r| r.decision.node.is_some()).count();
    let report = Report {
        schema: "numaplane.io/simulate/v1",
        summary: Summary {
            pods: results.len(),
            scheduled,
            unschedulable: results.len() - scheduled,
        },
        results,
        warnings,
    };
    (report, cluster)
}

/// Counts of bound pods per node in a report (for tests and summaries).
pub fn placements(report: &Report) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in &report.results {
        if let Some(n) = &r.decision.node {
            *m.entry(n.clone()).or_default() += 1;
        }
    }
    m
}

#[cfg(test)]
mod kubelet_options_tests;
#[cfg(test)]
mod numa_tests;
