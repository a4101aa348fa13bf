//! Which pods are accounted (namespace and exclusion globs), the pod-set fingerprint, and the
//! DRA devices the pods hold.

use std::collections::{BTreeMap, BTreeSet};

use glob::Pattern;
use numaplane::fingerprint::{self, Method};
use numaplane::proto::podresources::{ContainerMemory, ListPodResourcesResponse, PodResources, TopologyInfo};

use super::*;

pub(super) struct CompiledExclude {
    namespace: Pattern,
    name: Pattern,
}

pub(super) fn compile_excludes(cfg: &AccountingConfig) -> Result<Vec<CompiledExclude>, AccountingError> {
    let compile = |pattern: &str| {
        Pattern::new(pattern).map_err(|source| AccountingError::CompilePodExclude {
            pattern: pattern.to_owned(),
            source,
        })
    };
    cfg.pod_exclude
        .iter()
        .map(|e| {
            Ok(CompiledExclude {
                namespace: compile(&e.namespace_pattern)?,
                name: compile(&e.name_pattern)?,
            })
        })
        .collect()
}

/// The pods of `list` that the accounting and the fingerprint consider: in the watched
/// namespace, not matched by a pod exclusion, and not known to be terminal.
pub fn select_pods<'a>(
    list: &'a ListPodResourcesResponse,
    cfg: &AccountingConfig,
) -> Result<Vec<&'a PodResources>, AccountingError> {
    let excludes = compile_excludes(cfg)?;
    // NFD spells "all namespaces" as `*`, RTE as the empty string: accept both.
    let namespace = cfg
        .watch_namespace
        .as_deref()
        .filter(|ns| !ns.is_empty() && *ns != "*");
    Ok(list
        .pod_resources
        .iter()
        .filter(|pod| namespace.is_none_or(|ns| pod.namespace == ns))
        .filter(|pod| {
            !excludes
                .iter()
                .any(|e| e.namespace.matches(&pod.namespace) && e.name.matches(&pod.name))
        })
        .filter(|pod| {
            !cfg.terminal_pods
                .contains(&(pod.namespace.clone(), pod.name.clone()))
        })
        .collect())
}

pub(super) fn pinned(topology: Option<&TopologyInfo>) -> bool {
    topology.is_some_and(|t| t.nodes.iter().any(|n| n.id >= 0))
}

/// RTE's `with-exclusive-resources` rule: a container holds CPU ids, a memory block with a NUMA
/// id ≥ 0, or a device with a NUMA id ≥ 0. Pod-level CPU ids and memory (fields 4/5) qualify
/// too: RTE predates them, and such a pod does hold exclusive resources, which is what the
/// scheduler's side of the fingerprint counts.
pub fn has_exclusive_resources(pod: &PodResources) -> bool {
    let memory_pinned = |blocks: &[ContainerMemory]| blocks.iter().any(|m| pinned(m.topology.as_ref()));
    !pod.cpu_ids.is_empty()
        || memory_pinned(&pod.memory)
        || pod.containers.iter().any(|c| {
            !c.cpu_ids.is_empty()
                || memory_pinned(&c.memory)
                || c.devices
                    .iter()
                    .any(|d| !d.device_ids.is_empty() && pinned(d.topology.as_ref()))
        })
}

/// The pod-set fingerprint of `pods` under `method`.
pub fn pods_fingerprint(pods: &[&PodResources], method: Method) -> String {
    fingerprint::compute(
        pods.iter()
            .filter(|pod| method == Method::All || has_exclusive_resources(pod))
            .map(|pod| (pod.namespace.as_str(), pod.name.as_str())),
    )
}

/// DRA devices per driver across `pods` (each claim device once per pod, though several
/// containers may share the claim).
pub(super) fn dra_devices(pods: &[&PodResources]) -> BTreeMap<String, usize> {
    let mut seen: BTreeSet<(&str, &str, &str, &str, &str, &str)> = BTreeSet::new();
    for pod in pods {
        for c in &pod.containers {
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    seen.insert((
                        pod.namespace.as_str(),
                        pod.name.as_str(),
                        claim.claim_name.as_str(),
                        r.driver_name.as_str(),
                        r.pool_name.as_str(),
                        r.device_name.as_str(),
                    ));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (_, _, _, driver, _, _) in seen {
        *out.entry(driver.to_owned()).or_insert(0) += 1;
    }
    out
}
