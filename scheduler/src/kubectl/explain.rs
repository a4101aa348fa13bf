//! `kubectl numa explain`: why a pending pod is not placed, or where a bound pod's recorded
//! allocation sits in its node's NodeResourceTopology, and where its DRA claims' devices sit
//! relative to the NUMA nodes recorded for its containers ([`super::claims`]). Pure: built from
//! what [`super::fetch`] listed.
//!
//! A pending pod goes through [`crate::simulate::simulate`] with every node explained: the
//! same cluster index, verdicts and text as `numaplane-scheduler simulate --explain all`,
//! fed with the live objects instead of a dump.

use std::{collections::BTreeMap, fmt::Write as _};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use numaplane::{
    fingerprint::ATTRIBUTE_FINGERPRINT,
    nrt::{self, NodeResourceTopology},
};
use serde::Serialize;

use super::{
    claims::{self, BoundClaim, ClaimState, DraObjects},
    fetch::ListedNrts,
    top::{self, Freshness, ZoneTop},
};
use crate::{
    node::TmConfig,
    simulate::{self, ConfigFile, Explain, Inputs, Report},
};
use numaplane::allocation::{ANNOTATION, Allocation};

/// Schema of the JSON output.
pub const SCHEMA: &str = "numaplane.io/kubectl-numa/explain/v1";

/// The `explain` output.
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum ExplainReport {
    /// The pod is not bound: every node's verdict.
    Pending(PendingExplain),
    /// The pod is bound: its record next to the node's NRT.
    Bound(Box<BoundExplain>),
}

impl ExplainReport {
    /// Problems with the cluster data (also printed on stderr).
    pub fn problems(&self) -> &[String] {
        match self {
            Self::Pending(p) => &p.problems,
            Self::Bound(b) => &b.problems,
        }
    }
}

/// A pending pod's verdicts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingExplain {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// `namespace/name`.
    pub pod: String,
    /// The pod's `spec.schedulerName`.
    pub scheduler_name: String,
    /// The simulation report for this one pod (schema in docs/simulate-output.md).
    pub report: Report,
    /// Malformed or missing NRTs.
    pub problems: Vec<String>,
}

/// A bound pod's record and its node's NRT.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundExplain {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// `namespace/name`.
    pub pod: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.phase`.
    pub phase: Option<String>,
    /// The decoded `numaplane.io/allocation` record, if the pod has a valid one.
    pub record: Option<Allocation>,
    /// The node's NRT now, if it has one.
    pub nrt: Option<NrtView>,
    /// Each recorded device ID, and the zones whose free list still names it.
    pub devices: Vec<DeviceCheck>,
    /// Each of the pod's `spec.resourceClaims`: its devices' NUMA nodes next to the recorded
    /// NUMA nodes of the containers that use it, and the alignment verdict.
    pub claims: Vec<BoundClaim>,
    /// Malformed record, missing or malformed NRT, missing claim or device.
    pub problems: Vec<String>,
}

/// What a node's NRT shows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NrtView {
    /// Last change (RFC 3339).
    pub updated: Option<String>,
    /// Seconds since then.
    pub age_seconds: Option<i64>,
    /// Field manager of the last change.
    pub updated_by: Option<String>,
    /// Topology Manager policy.
    pub policy: Option<String>,
    /// Topology Manager scope.
    pub scope: Option<String>,
    /// The pod-set fingerprint attribute.
    pub fingerprint: Option<String>,
    /// NUMA zones with their resources and free device IDs.
    pub zones: Vec<ZoneView>,
}

/// One zone with its free device IDs.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneView {
    /// Resources as `top` shows them.
    #[serde(flatten)]
    pub zone: ZoneTop,
    /// Free device IDs per resource (`numaplane.io/free-devices.<resource>`).
    pub free_devices: BTreeMap<String, Vec<String>>,
}

/// A recorded device ID checked against the NRT.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCheck {
    /// Container name.
    pub container: String,
    /// Resource name.
    pub resource: String,
    /// Device ID.
    pub id: String,
    /// The container's recorded NUMA nodes.
    pub numa_nodes: Option<Vec<u32>>,
    /// Zones whose free list names the ID (empty: held, as expected once the kubelet
    /// allocated it).
    pub listed_free_in: Vec<String>,
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Every node's verdict for the pending `pod`, from the scheduler's model over the live
/// `nodes`, NRTs and bound `pods`, with the scheduler's `cfg`.
pub fn pending(
    pod: Pod,
    nodes: Vec<Node>,
    listed: &ListedNrts,
    pods: Vec<Pod>,
    namespaces: Vec<k8s_openapi::api::core::v1::Namespace>,
    cfg: &ConfigFile,
) -> ExplainReport {
    let objects = Inputs {
        nodes,
        pods,
        namespaces,
        ..Inputs::default()
    };
    pending_in(pod, listed, objects, cfg)
}

/// [`pending`] over every object the model reads: `objects` holds the nodes, bound pods,
/// Namespaces, the claims, volumes and classes the pod's volumes read, and the disruption
/// budgets a preemption weighs (its NRTs come from `listed`).
pub fn pending_in(pod: Pod, listed: &ListedNrts, objects: Inputs, cfg: &ConfigFile) -> ExplainReport {
    let Inputs {
        nodes,
        pods,
        namespaces,
        storage,
        budgets,
        device_classes,
        resource_slices,
        resource_claims,
        ..
    } = objects;
    let mut problems = listed.undecodable.clone();
    problems.extend(listed.nrts.iter().filter_map(|t| top::check_nrt(t).err()));
    if listed.nrts.is_empty() && listed.undecodable.is_empty() {
        problems.push(format!(
            "no NodeResourceTopology objects in the cluster: every node is judged without NUMA topology (noTopology: {:?})",
            cfg.no_topology
        ));
    }
    let key = pod_key(&pod);
    let scheduler_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.clone())
        .unwrap_or_else(|| "default-scheduler".to_owned());
    let inputs = Inputs {
        nodes,
        nrts: listed.nrts.clone(),
        pods: pods.into_iter().filter(|p| pod_key(p) != key).collect(),
        namespaces,
        skipped: Vec::new(),
        storage,
        budgets,
        device_classes,
        resource_slices,
        resource_claims,
    };
    let report = simulate::simulate(inputs, vec![pod], cfg, Explain::All);
    if let Some(e) = report.results.first().and_then(|r| r.error.as_ref()) {
        problems.push(format!("pod {key} cannot be modelled: {e}"));
    }
    ExplainReport::Pending(PendingExplain {
        schema: SCHEMA,
        pod: key,
        scheduler_name,
        report,
        problems,
    })
}

/// The free device IDs a zone publishes, per resource.
fn free_devices(z: &nrt::Zone) -> BTreeMap<String, Vec<String>> {
    z.attributes
        .iter()
        .flatten()
        .filter_map(|a| {
            let res = a.name.strip_prefix(nrt::attr::FREE_DEVICES_PREFIX)?;
            (!res.is_empty()).then(|| (res.to_owned(), nrt::split_device_ids(&a.value)))
        })
        .collect()
}

fn nrt_view(t: &NodeResourceTopology, now: Timestamp) -> NrtView {
    let fresh = Freshness::of(t);
    let tm = TmConfig::from_nrt(t);
    // A malformed DRA counts attribute is `kubectl numa top`'s to report: no decision reads it.
    let zones = top::zones(t, None, &mut Vec::new())
        .into_iter()
        .map(|zone| {
            let free = t
                .zones
                .iter()
                .find(|z| z.name == zone.zone)
                .map(free_devices)
                .unwrap_or_default();
            ZoneView {
                zone,
                free_devices: free,
            }
        })
        .collect();
    NrtView {
        updated: fresh.updated.map(|t| t.to_string()),
        age_seconds: fresh.age_seconds(now),
        updated_by: fresh.by,
        policy: tm.policy.map(|p| p.to_string()),
        scope: tm.scope.map(|s| s.to_string()),
        fingerprint: t.attribute(ATTRIBUTE_FINGERPRINT).map(str::to_owned),
        zones,
    }
}

/// The bound `pod`'s record next to what `node`'s NRT shows, and its DRA claims read from
/// `dra` (empty for a pod without claims).
pub fn bound(pod: &Pod, node: &str, listed: &ListedNrts, dra: &DraObjects, now: Timestamp) -> ExplainReport {
    let key = pod_key(pod);
    let mut problems = Vec::new();
    let record = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .and_then(|v| match Allocation::parse(v) {
            Ok(r) => Some(r),
            Err(e) => {
                problems.push(format!("pod {key}: {}", numaplane::error_chain(&e)));
                None
            }
        });
    if let Some(r) = &record
        && r.node != node
    {
        problems.push(format!(
            "pod {key}: the {ANNOTATION} record names node {} but the pod is bound to {node}",
            r.node
        ));
    }
    let nrt = listed
        .nrts
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some(node));
    match nrt {
        Some(t) => problems.extend(top::check_nrt(t).err()),
        None => {
            let prefix = format!("NodeResourceTopology {node} ");
            match listed.undecodable.iter().find(|p| p.starts_with(&prefix)) {
                Some(p) => problems.push(p.clone()),
                None => problems.push(format!(
                    "no NodeResourceTopology for node {node}: is an exporter (numaplane-exporter) running there?"
                )),
            }
        }
    }
    let view = nrt.map(|t| nrt_view(t, now));
    let mut devices = Vec::new();
    for c in record.iter().flat_map(|r| &r.containers) {
        for (res, ids) in &c.devices {
            for id in ids {
                let listed_free_in = view
                    .iter()
                    .flat_map(|v| &v.zones)
                    .filter(|z| z.free_devices.get(res).is_some_and(|f| f.contains(id)))
                    .map(|z| z.zone.zone.clone())
                    .collect();
                devices.push(DeviceCheck {
                    container: c.name.clone(),
                    resource: res.clone(),
                    id: id.clone(),
                    numa_nodes: c.numa_nodes.clone(),
                    listed_free_in,
                });
            }
        }
    }
    let claims = claims::bound_claims(pod, &key, node, record.as_ref(), nrt, dra, &mut problems);
    ExplainReport::Bound(Box::new(BoundExplain {
        schema: SCHEMA,
        pod: key,
        node: node.to_owned(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        record,
        nrt: view,
        devices,
        claims,
        problems,
    }))
}

fn numa_list(n: Option<&Vec<u32>>) -> String {
    n.map_or("any".to_owned(), |n| {
        n.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    })
}

/// The report for a person.
pub fn render_table(report: &ExplainReport) -> String {
    match report {
        ExplainReport::Pending(p) => {
            let mut out = format!(
                "Pod {} is pending (schedulerName {}). Verdicts of numaplane's scheduling model on the live Nodes, NodeResourceTopologies and bound Pods:\n\n",
                p.pod, p.scheduler_name
            );
            out.push_str(&simulate::render_table(&p.report));
            if let Some(node) = p.report.results.first().and_then(|r| r.decision.node.as_ref()) {
                let _ = writeln!(
                    out,
                    "\nThe model places the pod on {node} now: if it stays pending, check that numaplane-scheduler runs and serves schedulerName {} (kubectl get events -n {}).",
                    p.scheduler_name,
                    p.pod.split_once('/').map_or("default", |(ns, _)| ns)
                );
            }
            out
        }
        ExplainReport::Bound(b) => render_bound(b),
    }
}

fn render_bound(b: &BoundExplain) -> String {
    let mut out = String::new();
    let phase = b.phase.as_deref().unwrap_or("unknown");
    let _ = writeln!(
        out,
        "Pod {} is bound to node {} (phase {phase}).\n",
        b.pod, b.node
    );
    match &b.record {
        Some(r) => {
            let pod_numa = r
                .pod_numa_nodes
                .as_ref()
                .map(|n| format!(", pod NUMA {}", numa_list(Some(n))))
                .unwrap_or_default();
            let fp = r
                .nrt_fingerprint
                .as_deref()
                .map(|f| format!(", decided on NRT fingerprint {f}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "Recorded allocation ({ANNOTATION}): policy {}, scope {}{pod_numa}{fp}",
                r.policy, r.scope
            );
            for c in &r.containers {
                let devs = c
                    .devices
                    .iter()
                    .map(|(res, ids)| format!("{res}={}", ids.join(",")))
                    .chain(c.device_counts.iter().map(|(res, n)| format!("{res}x{n}")))
                    .collect::<Vec<_>>()
                    .join(" ");
                let _ = writeln!(
                    out,
                    "  {} {:<20} NUMA {:<6} {devs}",
                    c.kind.noun(),
                    c.name,
                    numa_list(c.numa_nodes.as_ref())
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "No valid {ANNOTATION} record on the pod: numaplane-scheduler did not bind it, or its node had no usable NodeResourceTopology then."
            );
        }
    }
    out.push('\n');
    if let Some(v) = &b.nrt {
        let age = v
            .age_seconds
            .map(|a| {
                let by = v
                    .updated_by
                    .as_deref()
                    .map(|m| format!(" by {m}"))
                    .unwrap_or_default();
                format!("{} ago{by}", top::human_age(a))
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let _ = writeln!(
            out,
            "NodeResourceTopology {} now: policy={} scope={} updated={age} fingerprint={}",
            b.node,
            v.policy.as_deref().unwrap_or("unset"),
            v.scope.as_deref().unwrap_or("unset"),
            v.fingerprint.as_deref().unwrap_or("none")
        );
        let rows: Vec<(&ZoneView, &top::ResourceTop)> = v
            .zones
            .iter()
            .flat_map(|z| z.zone.resources.iter().map(move |r| (z, r)))
            .collect();
        let rw = rows.iter().map(|(_, r)| r.name.len()).max().unwrap_or(0).max(8);
        let _ = writeln!(
            out,
            "  {:<6}  {:<rw$}  {:>9}  {:>11}  FREE DEVICE IDS",
            "ZONE", "RESOURCE", "AVAILABLE", "ALLOCATABLE"
        );
        for (z, r) in rows {
            let free = z
                .free_devices
                .get(&r.name)
                .map(|ids| {
                    if ids.is_empty() {
                        "-".to_owned()
                    } else {
                        ids.join(",")
                    }
                })
                .unwrap_or_default();
            let row = format!(
                "  {:<6}  {:<rw$}  {:>9}  {:>11}  {free}",
                z.zone.zone, r.name, r.available, r.allocatable
            );
            let _ = writeln!(out, "{}", row.trim_end());
        }
        out.push('\n');
    }
    if !b.devices.is_empty() {
        let _ = writeln!(out, "Recorded devices in the NodeResourceTopology:");
        for d in &b.devices {
            let state = if d.listed_free_in.is_empty() {
                "held (not listed free in any zone)".to_owned()
            } else {
                format!(
                    "still listed free in {}: the exporter has not seen the kubelet allocate it yet, or the kubelet gave the container other devices",
                    d.listed_free_in.join(",")
                )
            };
            let _ = writeln!(
                out,
                "  {} {} (container {}, NUMA {}): {state}",
                d.resource,
                d.id,
                d.container,
                numa_list(d.numa_nodes.as_ref())
            );
        }
    }
    render_claims(&mut out, b);
    out
}

/// Each claim's devices with their NUMA nodes next to its containers' recorded ones.
fn render_claims(out: &mut String, b: &BoundExplain) {
    if b.claims.is_empty() {
        return;
    }
    if !out.ends_with("\n\n") {
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "DRA claims: each device's NUMA nodes (from the ResourceSlices of {}) next to the recorded NUMA nodes of the containers that use it:",
        b.node
    );
    let ns = b.pod.split_once('/').map_or("default", |(ns, _)| ns);
    for c in &b.claims {
        let rc = c
            .resource_claim
            .as_deref()
            .map(|n| format!(" (ResourceClaim {n})"))
            .unwrap_or_default();
        let numa = match (c.state, &c.numa) {
            (ClaimState::Allocated, Some(numa)) => numa,
            (ClaimState::NotCreated, _) => {
                let _ = writeln!(
                    out,
                    "  claim {}: no ResourceClaim created from its template yet",
                    c.name
                );
                continue;
            }
            (ClaimState::NotFound, _) => {
                let _ = writeln!(out, "  claim {}{rc}: not found in namespace {ns}", c.name);
                continue;
            }
            _ => {
                let _ = writeln!(out, "  claim {}{rc}: not allocated yet", c.name);
                continue;
            }
        };
        let _ = writeln!(
            out,
            "  claim {}{rc}: {}",
            c.name,
            claims::verdict_text(numa.alignment)
        );
        for d in &numa.devices {
            let at = match &d.numa_nodes {
                Some(n) => format!("NUMA {}", numa_list(Some(n))),
                None if c.not_in_slices.contains(&d.device) => {
                    format!("NUMA unknown (in no ResourceSlice of {})", b.node)
                }
                None => "no NUMA node (no source places it)".to_owned(),
            };
            let _ = writeln!(out, "    device {} (request {}): {at}", d.device, d.request);
        }
        if numa.containers.is_empty() {
            let _ = writeln!(out, "    no container names it in resources.claims");
        }
        for k in &numa.containers {
            let at = match (&k.numa_nodes, &b.record) {
                (Some(n), _) => format!("NUMA {}", numa_list(Some(n))),
                (None, Some(_)) => "NUMA any (none recorded)".to_owned(),
                (None, None) => format!("NUMA not predicted (no {ANNOTATION} record)"),
            };
            let pinned = k.pinned.map(|p| format!(", pins {p}")).unwrap_or_default();
            let _ = writeln!(out, "    container {}: {at}{pinned}", k.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_100).unwrap_or_else(|e| panic!("{e}"))
    }

    fn nrt(name: &str, gpu_free: &[&str], cpus_free: &str) -> NodeResourceTopology {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "attributes": [
                {"name": "topologyManagerPolicy", "value": "single-numa-node"},
                {"name": "topologyManagerScope", "value": "container"}
            ],
            "zones": [{"name": "node-0", "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "4", "allocatable": "4", "available": cpus_free},
                    {"name": "example.com/gpu", "capacity": "2", "allocatable": "2", "available": gpu_free.len().to_string()}],
                "attributes": [{"name": "numaplane.io/free-devices.example.com/gpu", "value": gpu_free.join(",")}]}]
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "example.com/gpu": "2"}}}))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn pod(node: Option<&str>, annotation: Option<String>) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "app", "resources": {
                "requests": {"cpu": "2", "memory": "1Gi", "example.com/gpu": "1"},
                "limits": {"cpu": "2", "memory": "1Gi", "example.com/gpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = node.map(str::to_owned);
        }
        if let Some(a) = annotation {
            p.metadata.annotations = Some([(ANNOTATION.to_owned(), a)].into());
        }
        p
    }

    #[test]
    fn pending_pod_gets_the_model_verdict_of_every_node() {
        let listed = ListedNrts {
            nrts: vec![nrt("full", &[], "4"), nrt("roomy", &["g0", "g1"], "4")],
            undecodable: vec![],
        };
        let r = pending(
            pod(None, None),
            vec![node("full"), node("roomy")],
            &listed,
            vec![],
            vec![],
            &ConfigFile::default(),
        );
        let ExplainReport::Pending(p) = &r else {
            panic!("not pending: {r:?}")
        };
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let d = &p.report.results[0].decision;
        assert_eq!(d.nodes.len(), 2);
        assert_eq!(d.node.as_deref(), Some("roomy"));
        let full = &d.nodes[0];
        assert!(!full.feasible);
        assert!(
            full.reasons.iter().any(|r| r.contains("example.com/gpu")),
            "{:?}",
            full.reasons
        );
        let text = render_table(&r);
        assert!(
            text.starts_with("Pod ns/p is pending (schedulerName numaplane-scheduler)"),
            "{text}"
        );
        assert!(text.contains(&simulate::render_table(&p.report)), "{text}");
    }

    #[test]
    fn a_numaplane_nrt_that_lags_its_node_is_the_reason_shown() {
        // The exporter's NRT promises to describe every extended resource of the Node, and has
        // no GPUs yet: the Node already allocates them.
        let mut lagging = nrt("late", &[], "4");
        lagging.zones[0]
            .resources
            .as_mut()
            .unwrap_or_else(|| panic!("resources"))
            .retain(|r| r.name == "cpu");
        lagging.zones[0].attributes = None;
        lagging
            .attributes
            .get_or_insert_with(Vec::new)
            .push(numaplane::nrt::AttributeInfo {
                name: numaplane::nrt::attr::NODE_LEVEL_RESOURCES.to_owned(),
                value: String::new(),
            });
        let listed = ListedNrts {
            nrts: vec![lagging],
            undecodable: vec![],
        };
        let r = pending(
            pod(None, None),
            vec![node("late")],
            &listed,
            vec![],
            vec![],
            &ConfigFile::default(),
        );
        let ExplainReport::Pending(p) = &r else {
            panic!("not pending: {r:?}")
        };
        let d = &p.report.results[0].decision;
        assert_eq!(d.node, None);
        assert_eq!(
            d.nodes[0].reasons,
            vec![
                "NRT lags the node: example.com/gpu allocatable on the node, not in its NodeResourceTopology"
                    .to_owned()
            ]
        );
        let text = render_table(&r);
        assert!(text.contains("NRT lags the node: example.com/gpu"), "{text}");
    }

    #[test]
    fn a_pod_the_model_cannot_read_is_a_problem() {
        let mut p = pod(None, None);
        if let Some(c) = p.spec.as_mut().map(|s| &mut s.containers[0]) {
            c.resources = serde_json::from_value(json!({"requests": {"cpu": "lots"}})).ok();
        }
        let r = pending(
            p,
            vec![node("n1")],
            &ListedNrts::default(),
            vec![],
            vec![],
            &ConfigFile::default(),
        );
        let problems = r.problems();
        assert!(
            problems
                .iter()
                .any(|m| m.starts_with("pod ns/p cannot be modelled: ") && m.contains("lots")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|m| m.contains("no NodeResourceTopology objects")),
            "{problems:?}"
        );
    }

    #[test]
    fn bound_pod_record_next_to_the_nrt() {
        let record = json!({"version": "v1", "node": "n1", "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "app", "kind": "app", "numaNodes": [0],
                "devices": {"example.com/gpu": ["g0", "g1"]}}]});
        let listed = ListedNrts {
            nrts: vec![nrt("n1", &["g1"], "2")],
            undecodable: vec![],
        };
        let r = bound(
            &pod(Some("n1"), Some(record.to_string())),
            "n1",
            &listed,
            &DraObjects::default(),
            now(),
        );
        let ExplainReport::Bound(b) = &r else {
            panic!("not bound: {r:?}")
        };
        assert!(b.problems.is_empty(), "{:?}", b.problems);
        assert_eq!(b.devices.len(), 2);
        assert!(b.devices[0].listed_free_in.is_empty());
        assert_eq!(b.devices[1].listed_free_in, ["node-0"]);
        let text = render_table(&r);
        assert!(
            text.contains("example.com/gpu g0 (container app, NUMA 0): held"),
            "{text}"
        );
        assert!(
            text.contains("example.com/gpu g1 (container app, NUMA 0): still listed free in node-0"),
            "{text}"
        );

        let bad = bound(
            &pod(Some("n1"), Some("{".into())),
            "n1",
            &ListedNrts::default(),
            &DraObjects::default(),
            now(),
        );
        let problems = bad.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("parsing the numaplane.io/allocation annotation"),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("no NodeResourceTopology for node n1"),
            "{problems:?}"
        );
    }

    /// The example of docs/kubectl-numa.md: pod ml/train-0 on gpu-b, its container's CPUs
    /// recorded on NUMA node 1.
    #[test]
    fn bound_pod_claims_show_device_and_container_numa_nodes() {
        let record = json!({"version": "v1", "node": "gpu-b", "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "app", "kind": "app", "numaNodes": [1]}]});
        let mut p = pod(Some("gpu-b"), Some(record.to_string()));
        p.metadata.name = Some("train-0".into());
        p.metadata.namespace = Some("ml".into());
        if let Some(s) = p.spec.as_mut() {
            s.resource_claims = serde_json::from_value(json!([
                {"name": "gpu", "resourceClaimName": "train-0-gpu"},
                {"name": "gpu2", "resourceClaimName": "train-0-gpu2"},
                {"name": "scratch", "resourceClaimName": "train-0-scratch"},
                {"name": "cache", "resourceClaimName": "train-0-cache"}]))
            .ok();
            s.containers[0].resources.get_or_insert_default().claims = serde_json::from_value(json!(
                [{"name": "gpu"}, {"name": "gpu2"}, {"name": "scratch"}, {"name": "cache"}]
            ))
            .ok();
        }
        let claim = |name: &str, device: Option<&str>| -> k8s_openapi::api::resource::v1::ResourceClaim {
            let mut c = json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {}});
            if let Some(d) = device {
                c["status"] = json!({"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.example.com", "pool": "gpu-b", "device": d}]}}});
            }
            serde_json::from_value(c).unwrap_or_else(|e| panic!("{e}"))
        };
        let slice = serde_json::from_value(json!({"metadata": {"name": "gpu-b-gpus"},
            "spec": {"driver": "gpu.example.com", "nodeName": "gpu-b",
                "pool": {"name": "gpu-b", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}}},
                    {"name": "gpu-1", "attributes": {"resource.kubernetes.io/numaNode": {"int": 1}}}]}}))
        .unwrap_or_else(|e| panic!("{e}"));
        let dra = DraObjects {
            slices: vec![slice],
            claims: vec![
                claim("train-0-gpu", Some("gpu-0")),
                claim("train-0-gpu2", Some("gpu-1")),
                claim("train-0-scratch", None),
            ],
            driver_attributes: numaplane::device_numa::default_driver_numa_attributes(),
        };
        // Two NUMA nodes: a device on one the node lacks would have none.
        let mut two = nrt("gpu-b", &[], "2");
        let mut zone1 = two.zones[0].clone();
        zone1.name = "node-1".into();
        two.zones.push(zone1);
        let listed = ListedNrts {
            nrts: vec![two],
            undecodable: vec![],
        };
        let r = bound(&p, "gpu-b", &listed, &dra, now());
        assert_eq!(
            r.problems(),
            ["pod ml/train-0 claim cache: ResourceClaim ml/train-0-cache not found"]
        );
        let text = render_table(&r);
        let expected = "\
DRA claims: each device's NUMA nodes (from the ResourceSlices of gpu-b) next to the recorded NUMA nodes of the containers that use it:
  claim gpu (ResourceClaim train-0-gpu): MISALIGNED (a device is on none of the NUMA nodes of its containers)
    device gpu.example.com/gpu-b/gpu-0 (request gpu): NUMA 0
    container app: NUMA 1
  claim gpu2 (ResourceClaim train-0-gpu2): aligned
    device gpu.example.com/gpu-b/gpu-1 (request gpu): NUMA 1
    container app: NUMA 1
  claim scratch (ResourceClaim train-0-scratch): not allocated yet
  claim cache (ResourceClaim train-0-cache): not found in namespace ml
";
        assert!(text.ends_with(expected), "{text}");
        // The documented example is this output.
        let doc = include_str!("../../../docs/kubectl-numa.md");
        assert!(
            doc.contains(expected),
            "docs/kubectl-numa.md does not show:\n{expected}"
        );
        let v = serde_json::to_value(&r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["claims"][0]["numa"]["alignment"], "misaligned");
        assert_eq!(v["claims"][1]["numa"]["alignment"], "aligned");
        assert_eq!(v["claims"][2]["state"], "notAllocated");
        assert_eq!(v["claims"][3]["state"], "notFound");
    }
}
