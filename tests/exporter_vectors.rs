//! The shared exporter conformance vectors (`data/exporter_cases.json`, a verbatim copy of
//! `conformance/exporter_cases.json`) turned into what the exporter consumes: kubelet
//! responses, machines (as [`MachineView`], synth spec or hwloc XML) and accounting
//! configuration; plus the semantic comparison of published zones against a case's `expect`.
//!
//! One module serves the pure accounting test and the dry run of the real binary, so both
//! judge the same vectors by the same rules and the same list of intentional [`DIFFERENCES`].
//! Errors are messages naming the case or field, because a malformed vector is a test failure
//! to read, not something to recover from.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use numaplane::fingerprint::Method;
use numaplane::nrt::{NodeResourceTopology, Zone, attr};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerMemory, ContainerResources,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};
use numaplane::quantity::{Format, Quantity};
use numaplane_exporter::accounting::{AccountingConfig, AnomalyKind, MachineView, NodeView, PodExclude};
use numaplane_topology::synth::MachineSpec;
use serde_json::Value;

/// The vectors, embedded so the tests need nothing outside the repository.
pub const CASES_JSON: &str = include_str!("data/exporter_cases.json");

/// Number of accounting cases in the vectors; a changed file must be looked at, not skipped.
pub const CASE_COUNT: usize = 11;

/// Result of a vector conversion or check: the error is a message for the test failure.
pub type VectorResult<T> = Result<T, String>;

/// A case whose `expect` our recommended behaviour intentionally does not reproduce. For these
/// the tests assert the case's own `alternative_behaviours.recommended` values instead, and
/// check that the unpatched `expect` really differs (so a stale entry is noticed).
#[derive(Debug, Clone, Copy)]
pub struct Difference {
    /// Case name.
    pub case: &'static str,
    /// Why we differ, for the reader of a failure.
    pub why: &'static str,
}

/// The intentional differences, shared by every consumer of the vectors.
pub const DIFFERENCES: &[Difference] = &[Difference {
    case: "nfd-scanner-fractional-cpu-pod-with-cpu-ids",
    why: "The case follows NFD, which looks the pod up in the API server and drops the CPUs of \
          a pod without an integral-CPU container. We trust the kubelet (research §3.1, chosen \
          column): since 1.23 List reports exclusive CPUs only, so cpu_ids present means CPUs \
          held exclusively, and the accounting needs no API-server lookup. The reported CPUs 0 \
          and 1 are therefore subtracted (node-0 and node-1 cpu available 11), which is also \
          what RTE does.",
}];

/// Anomalies each case is expected to raise (kind, count); every other case raises none.
pub const EXPECTED_ANOMALIES: &[(&str, &[(AnomalyKind, usize)])] = &[(
    "used-exceeds-allocatable-unhealthy-device",
    &[(AnomalyKind::UsedExceedsAllocatable, 1)],
)];

/// Config keys of the vectors that a kubelet-trusting exporter does not use, with the reason.
pub const IGNORED_CONFIG: &[(&str, &str)] = &[
    (
        "pod_info",
        "NFD-style QoS filtering needs the API server; we trust the kubelet",
    ),
    (
        "refresh_node_resources",
        "only changes when GetAllocatableResources is re-read, not the accounting",
    ),
];

/// Config keys the exporter honours.
pub const KNOWN_CONFIG: &[&str] = &[
    "node_name",
    "resource_exclude",
    "watch_namespace",
    "pod_exclude",
    "terminal_pods",
    "pods_fingerprint",
    "pods_fingerprint_method",
];

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// The embedded vectors.
pub fn embedded() -> VectorResult<Value> {
    parse(CASES_JSON)
}

/// Vectors from a JSON string.
pub fn parse(json: &str) -> VectorResult<Value> {
    serde_json::from_str(json).map_err(|e| format!("exporter vectors do not parse: {e}"))
}

/// Vectors from a file (for checking a newer upstream copy against this code).
pub fn load(path: &Path) -> VectorResult<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text)
}

/// The accounting cases of the vectors.
pub fn cases(root: &Value) -> &[Value] {
    array(root, "cases")
}

/// The case named `name`.
pub fn find_case<'a>(root: &'a Value, name: &str) -> VectorResult<&'a Value> {
    cases(root)
        .iter()
        .find(|c| case_name(c) == name)
        .ok_or_else(|| format!("no case named {name}"))
}

/// The name of a case.
pub fn case_name(case: &Value) -> &str {
    str_of(case, "name")
}

/// The vectors of `fingerprint_cases`.
pub fn fingerprint_vectors(root: &Value) -> &[Value] {
    root.get("fingerprint_cases")
        .map(|f| array(f, "vectors"))
        .unwrap_or_default()
}

/// String field, empty when absent.
pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Array field, empty when absent.
pub fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn field<'a>(v: &'a Value, key: &str) -> VectorResult<&'a Value> {
    v.get(key).ok_or_else(|| format!("missing field {key:?} in {v}"))
}

fn int(v: &Value, what: &str) -> VectorResult<i64> {
    v.as_i64().ok_or_else(|| format!("{what}: {v} is not an integer"))
}

fn uint(v: &Value, what: &str) -> VectorResult<u64> {
    v.as_u64()
        .ok_or_else(|| format!("{what}: {v} is not an unsigned integer"))
}

fn u32_of(v: &Value, what: &str) -> VectorResult<u32> {
    u32::try_from(uint(v, what)?).map_err(|e| format!("{what}: {v}: {e}"))
}

fn string(v: &Value, what: &str) -> VectorResult<String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what}: {v} is not a string"))
}

fn ints(v: &Value, key: &str) -> VectorResult<Vec<i64>> {
    array(v, key).iter().map(|x| int(x, key)).collect()
}

// ---------------------------------------------------------------------------------------------
// JSON → kubelet responses
// ---------------------------------------------------------------------------------------------

fn topology(v: &Value) -> VectorResult<Option<TopologyInfo>> {
    let Some(t) = v.get("topology") else {
        return Ok(None);
    };
    let nodes = array(t, "nodes")
        .iter()
        .map(|n| {
            let id = n.get("ID").or_else(|| n.get("id")).unwrap_or(&Value::Null);
            Ok(NumaNode {
                id: int(id, "NUMA ID")?,
            })
        })
        .collect::<VectorResult<_>>()?;
    Ok(Some(TopologyInfo { nodes }))
}

fn devices(v: &Value) -> VectorResult<Vec<ContainerDevices>> {
    array(v, "devices")
        .iter()
        .map(|d| {
            Ok(ContainerDevices {
                resource_name: str_of(d, "resource_name").to_owned(),
                device_ids: array(d, "device_ids")
                    .iter()
                    .map(|id| string(id, "device id"))
                    .collect::<VectorResult<_>>()?,
                topology: topology(d)?,
            })
        })
        .collect()
}

fn memory(v: &Value) -> VectorResult<Vec<ContainerMemory>> {
    array(v, "memory")
        .iter()
        .map(|m| {
            Ok(ContainerMemory {
                memory_type: str_of(m, "memory_type").to_owned(),
                size: uint(field(m, "size")?, "memory size")?,
                topology: topology(m)?,
            })
        })
        .collect()
}

/// The `GetAllocatableResources` answer of a case's `allocatable` object.
pub fn allocatable(v: &Value) -> VectorResult<AllocatableResourcesResponse> {
    Ok(AllocatableResourcesResponse {
        devices: devices(v)?,
        cpu_ids: ints(v, "cpu_ids")?,
        memory: memory(v)?,
    })
}

/// The pods of a case's `list` object.
pub fn pods(v: &Value) -> VectorResult<Vec<PodResources>> {
    array(v, "pod_resources")
        .iter()
        .map(|p| {
            Ok(PodResources {
                name: str_of(p, "name").to_owned(),
                namespace: str_of(p, "namespace").to_owned(),
                containers: array(p, "containers")
                    .iter()
                    .map(|c| {
                        Ok(ContainerResources {
                            name: str_of(c, "name").to_owned(),
                            devices: devices(c)?,
                            cpu_ids: ints(c, "cpu_ids")?,
                            memory: memory(c)?,
                            dynamic_resources: Vec::new(),
                        })
                    })
                    .collect::<VectorResult<_>>()?,
                cpu_ids: ints(p, "cpu_ids")?,
                memory: memory(p)?,
            })
        })
        .collect()
}

/// The `List` answer of a case's `list` object.
pub fn list(v: &Value) -> VectorResult<ListPodResourcesResponse> {
    Ok(ListPodResourcesResponse {
        pod_resources: pods(v)?,
    })
}

// ---------------------------------------------------------------------------------------------
// JSON → machine
// ---------------------------------------------------------------------------------------------

/// A case's `machine` object as the accounting sees it, built directly (no hwloc), with the
/// capacities exactly as the vector states them.
pub fn machine_view(v: &Value) -> VectorResult<MachineView> {
    let nodes = array(v, "numa_nodes")
        .iter()
        .map(|n| {
            Ok(NodeView {
                id: u32_of(field(n, "id")?, "node id")?,
                cpus: array(n, "cpus")
                    .iter()
                    .map(|c| u32_of(c, "cpu"))
                    .collect::<VectorResult<_>>()?,
                memory_bytes: n.get("memory_total_bytes").and_then(Value::as_u64),
                hugepages_bytes: n
                    .get("hugepages_total_bytes")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(k, b)| Ok((k.clone(), uint(b, "hugepage bytes")?)))
                    .collect::<VectorResult<_>>()?,
                distances: array(n, "distances")
                    .iter()
                    .map(|d| {
                        Ok((
                            u32_of(field(d, "node")?, "distance node")?,
                            uint(field(d, "value")?, "distance")?,
                        ))
                    })
                    .collect::<VectorResult<_>>()?,
                // The vectors do not describe cores (the SMT attributes are not theirs).
                cores: Vec::new(),
            })
        })
        .collect::<VectorResult<_>>()?;
    // The vectors describe no PCI bus ranges.
    Ok(MachineView {
        nodes,
        pci_locality: Vec::new(),
    })
}

/// A case's `machine` object as a synth spec (the synth accepts the vectors' spellings).
pub fn machine_spec(v: &Value) -> VectorResult<MachineSpec> {
    serde_json::from_value(v.clone()).map_err(|e| format!("machine does not fit MachineSpec: {e}"))
}

/// A hugepage capacity the vectors state in bytes that hwloc cannot express, because hwloc
/// counts whole pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundedHugepages {
    /// Zone of the node.
    pub zone: String,
    /// Resource name, `hugepages-<size>`.
    pub resource: String,
    /// Bytes in the vector.
    pub stated: u64,
    /// Bytes in the XML: rounded up to whole pages.
    pub written: u64,
}

/// The spec with every hugepage pool rounded up to whole pages, and what was rounded: some
/// vectors use toy sizes (2048 bytes of `hugepages-2Mi`) that only the direct
/// [`MachineView`] can carry.
pub fn representable_spec(v: &Value) -> VectorResult<(MachineSpec, Vec<RoundedHugepages>)> {
    let mut spec = machine_spec(v)?;
    let mut rounded = Vec::new();
    for node in &mut spec.numa_nodes {
        for (name, bytes) in &mut node.hugepages_total_bytes {
            let page = numaplane_topology::parse_hugepage_resource_name(name)
                .ok_or_else(|| format!("node {}: {name} is not a hugepage resource", node.id))?;
            if page == 0 || bytes.is_multiple_of(page) {
                continue;
            }
            let written = bytes
                .div_ceil(page)
                .checked_mul(page)
                .ok_or_else(|| format!("node {}: {name} overflows", node.id))?;
            rounded.push(RoundedHugepages {
                zone: numaplane::nrt::zone_name(node.id),
                resource: name.clone(),
                stated: *bytes,
                written,
            });
            *bytes = written;
        }
    }
    Ok((spec, rounded))
}

/// hwloc XML for a case's `machine` object, with [`representable_spec`]'s rounding.
pub fn machine_xml(v: &Value) -> VectorResult<(String, Vec<RoundedHugepages>)> {
    let (spec, rounded) = representable_spec(v)?;
    let xml = spec
        .to_hwloc_xml()
        .map_err(|e| format!("machine cannot be written as hwloc XML: {e}"))?;
    Ok((xml, rounded))
}

// ---------------------------------------------------------------------------------------------
// JSON → configuration
// ---------------------------------------------------------------------------------------------

/// Rejects config keys that are neither honoured nor knowingly ignored: the vectors changed.
pub fn check_config_keys(v: &Value) -> VectorResult<()> {
    let object = v
        .as_object()
        .ok_or_else(|| format!("config {v} is not an object"))?;
    for key in object.keys() {
        if !KNOWN_CONFIG.contains(&key.as_str()) && !IGNORED_CONFIG.iter().any(|(k, _)| k == key) {
            return Err(format!("unknown config key {key}: the vectors changed"));
        }
    }
    Ok(())
}

/// The fingerprint method a case's config enables, `None` when the fingerprint is off (the
/// vectors default to off, unlike the exporter).
pub fn fingerprint_method(v: &Value) -> VectorResult<Option<Method>> {
    if !v
        .get("pods_fingerprint")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        return Ok(None);
    }
    match v.get("pods_fingerprint_method").and_then(Value::as_str) {
        None => Ok(Some(Method::WithExclusiveResources)),
        Some(m) => m.parse().map(Some).map_err(|e| format!("{e}")),
    }
}

/// Resource exclusions by node name (or `*`).
pub fn resource_exclude(v: &Value) -> VectorResult<BTreeMap<String, Vec<String>>> {
    v.get("resource_exclude")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(node, names)| {
            let names = names
                .as_array()
                .ok_or_else(|| format!("resource_exclude.{node} is not an array"))?
                .iter()
                .map(|n| string(n, "excluded resource"))
                .collect::<VectorResult<_>>()?;
            Ok((node.clone(), names))
        })
        .collect()
}

/// Pod exclusion globs.
pub fn pod_exclude(v: &Value) -> Vec<PodExclude> {
    array(v, "pod_exclude")
        .iter()
        .map(|e| PodExclude {
            namespace_pattern: str_of(e, "namespace_pattern").to_owned(),
            name_pattern: str_of(e, "name_pattern").to_owned(),
        })
        .collect()
}

/// Pods the API server reports as Succeeded or Failed, as (namespace, name).
pub fn terminal_pods(v: &Value) -> BTreeSet<(String, String)> {
    array(v, "terminal_pods")
        .iter()
        .map(|p| (str_of(p, "namespace").to_owned(), str_of(p, "name").to_owned()))
        .collect()
}

/// A case's `config` object as an [`AccountingConfig`].
pub fn config(v: &Value) -> VectorResult<AccountingConfig> {
    check_config_keys(v)?;
    Ok(AccountingConfig {
        node_name: str_of(v, "node_name").to_owned(),
        resource_exclude: resource_exclude(v)?,
        watch_namespace: v
            .get("watch_namespace")
            .and_then(Value::as_str)
            .map(str::to_owned),
        pod_exclude: pod_exclude(v),
        terminal_pods: terminal_pods(v),
        fingerprint_method: fingerprint_method(v)?,
        ..AccountingConfig::default()
    })
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// A zone reduced to what the vectors pin: name, type, costs, and per resource
/// `[capacity, allocatable, available]` compared by value.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneValues {
    /// Zone name.
    pub name: String,
    /// Zone type.
    pub zone_type: String,
    /// Costs in published order.
    pub costs: Vec<(String, i64)>,
    /// Resources by name.
    pub resources: BTreeMap<String, [Quantity; 3]>,
}

/// The fields of a resource row, in [`ZoneValues::resources`] order.
pub const FIELDS: [&str; 3] = ["capacity", "allocatable", "available"];

fn qty(s: &str, context: &str) -> VectorResult<Quantity> {
    s.parse()
        .map_err(|e| format!("{context}: {s:?} is not a quantity: {e}"))
}

/// The zones a case's `expect` object pins.
pub fn expected_zones(expect: &Value) -> VectorResult<Vec<ZoneValues>> {
    array(expect, "zones")
        .iter()
        .map(|z| {
            let name = str_of(z, "name").to_owned();
            let costs = array(z, "costs")
                .iter()
                .map(|c| Ok((str_of(c, "name").to_owned(), int(field(c, "value")?, "cost")?)))
                .collect::<VectorResult<_>>()?;
            let resources = array(z, "resources")
                .iter()
                .map(|r| {
                    let resource = str_of(r, "name");
                    let context = format!("expect {name}/{resource}");
                    let [c, a, v] = FIELDS.map(|f| qty(str_of(r, f), &context));
                    Ok((resource.to_owned(), [c?, a?, v?]))
                })
                .collect::<VectorResult<_>>()?;
            Ok(ZoneValues {
                name,
                zone_type: str_of(z, "type").to_owned(),
                costs,
                resources,
            })
        })
        .collect()
}

/// Published zones as [`ZoneValues`], checking on the way the shape the vectors describe:
/// zones, costs and resources sorted by name, quantities canonical DecimalSI strings.
pub fn actual_zones(zones: &[Zone]) -> VectorResult<Vec<ZoneValues>> {
    let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
    if !names.is_sorted() {
        return Err(format!("zones not sorted: {names:?}"));
    }
    zones
        .iter()
        .map(|z| {
            let costs: Vec<(String, i64)> = z
                .costs
                .iter()
                .flatten()
                .map(|c| (c.name.clone(), c.value))
                .collect();
            if !costs.is_sorted_by(|a, b| a.0 <= b.0) {
                return Err(format!("{}: costs not sorted: {costs:?}", z.name));
            }
            let rows = z.resources.as_deref().unwrap_or_default();
            if !rows.is_sorted_by(|a, b| a.name < b.name) {
                return Err(format!("{}: resources not sorted or repeated", z.name));
            }
            let mut resources = BTreeMap::new();
            for r in rows {
                let context = format!("{}/{}", z.name, r.name);
                let mut values = Vec::with_capacity(3);
                for q in [&r.capacity, &r.allocatable, &r.available] {
                    let parsed = qty(&q.0, &context)?;
                    if parsed.format() != Format::DecimalSI {
                        return Err(format!("{context}: {} is not DecimalSI", q.0));
                    }
                    if parsed.to_string() != q.0 {
                        return Err(format!("{context}: {} is not canonical", q.0));
                    }
                    values.push(parsed);
                }
                let values: [Quantity; 3] = values
                    .try_into()
                    .map_err(|_| format!("{context}: not three quantities"))?;
                resources.insert(r.name.clone(), values);
            }
            Ok(ZoneValues {
                name: z.name.clone(),
                zone_type: z.zone_type.clone(),
                costs,
                resources,
            })
        })
        .collect()
}

/// `Ok` when equal, else a line per differing zone, cost or resource value.
pub fn compare_zones(ours: &[ZoneValues], want: &[ZoneValues]) -> VectorResult<()> {
    if ours == want {
        return Ok(());
    }
    let mut diff = String::new();
    let by_name = |zones: &[ZoneValues]| -> BTreeMap<String, ZoneValues> {
        zones.iter().map(|z| (z.name.clone(), z.clone())).collect()
    };
    let (ours_by, want_by) = (by_name(ours), by_name(want));
    let names: BTreeSet<&String> = ours_by.keys().chain(want_by.keys()).collect();
    for name in names {
        let (o, w) = match (ours_by.get(name), want_by.get(name)) {
            (Some(o), Some(w)) => (o, w),
            (o, _) => {
                let side = if o.is_some() { "unexpected" } else { "missing" };
                let _ = writeln!(diff, "zone {name}: {side}");
                continue;
            }
        };
        if o.zone_type != w.zone_type {
            let _ = writeln!(diff, "{name}: type {:?}, want {:?}", o.zone_type, w.zone_type);
        }
        if o.costs != w.costs {
            let _ = writeln!(diff, "{name}: costs {:?}, want {:?}", o.costs, w.costs);
        }
        let resources: BTreeSet<&String> = o.resources.keys().chain(w.resources.keys()).collect();
        for r in resources {
            match (o.resources.get(r), w.resources.get(r)) {
                (Some(ov), Some(wv)) => {
                    for ((f, a), b) in FIELDS.iter().zip(ov).zip(wv) {
                        if a != b {
                            let _ = writeln!(diff, "{name}/{r}: {f} {a}, want {b}");
                        }
                    }
                }
                (Some(_), None) => {
                    let _ = writeln!(diff, "{name}/{r}: unexpected row");
                }
                (None, _) => {
                    let _ = writeln!(diff, "{name}/{r}: missing row");
                }
            }
        }
    }
    if ours.iter().map(|z| &z.name).ne(want.iter().map(|z| &z.name)) {
        let _ = writeln!(diff, "zone order differs");
    }
    Err(diff)
}

/// Applies `alternative_behaviours.<flavour>` overrides (`zone`, `resource`, `field`,
/// `value`) to the expected zones.
pub fn patch(zones: &mut [ZoneValues], overrides: &[Value]) -> VectorResult<()> {
    for o in overrides {
        let (zone, resource) = (str_of(o, "zone"), str_of(o, "resource"));
        let values = zones
            .iter_mut()
            .find(|z| z.name == zone)
            .and_then(|z| z.resources.get_mut(resource))
            .ok_or_else(|| format!("override names unknown {zone}/{resource}"))?;
        let f = str_of(o, "field");
        let slot = FIELDS
            .iter()
            .position(|x| *x == f)
            .ok_or_else(|| format!("unknown override field {f}"))?;
        if let Some(v) = values.get_mut(slot) {
            *v = qty(str_of(o, "value"), "override")?;
        }
    }
    Ok(())
}

/// Outcome of [`check_case_zones`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The case's `expect` is met.
    Pass,
    /// A [`DIFFERENCES`] case: `expect` is not met, its recommended alternative is.
    IntentionalDifference,
}

/// Checks published zones against a case: its `expect`, or for a [`DIFFERENCES`] case its
/// recommended alternative (and that `expect` really is not met). `adjust` patches the
/// expectation for what the caller's input path cannot carry (see [`RoundedHugepages`]).
pub fn check_case_zones(
    case: &Value,
    zones: &[Zone],
    adjust: &dyn Fn(&mut Vec<ZoneValues>) -> VectorResult<()>,
) -> VectorResult<Verdict> {
    let name = case_name(case);
    let expect = field(case, "expect")?;
    let ours = actual_zones(zones).map_err(|e| format!("{name}: {e}"))?;
    let mut want = expected_zones(expect).map_err(|e| format!("{name}: {e}"))?;
    adjust(&mut want)?;
    let semantics = str_of(case, "expect_semantics");
    match DIFFERENCES.iter().find(|d| d.case == name) {
        None => {
            if semantics != "recommended" {
                return Err(format!("{name}: {semantics} semantics need a DIFFERENCES entry"));
            }
            compare_zones(&ours, &want).map_err(|d| format!("{name}:\n{d}"))?;
            Ok(Verdict::Pass)
        }
        Some(d) => {
            if d.why.is_empty() {
                return Err(format!("{name}: DIFFERENCES entry without a reason"));
            }
            let overrides = case
                .pointer("/alternative_behaviours/recommended")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("{name}: no recommended alternative to assert"))?;
            if ours == want {
                return Err(format!(
                    "{name}: listed in DIFFERENCES but matches the case's expect"
                ));
            }
            patch(&mut want, overrides).map_err(|e| format!("{name}: {e}"))?;
            compare_zones(&ours, &want).map_err(|d| format!("{name} (recommended alternative):\n{d}"))?;
            Ok(Verdict::IntentionalDifference)
        }
    }
}

/// Overrides the expected capacity of every rounded hugepage pool with what was written.
pub fn apply_rounding(zones: &mut [ZoneValues], rounded: &[RoundedHugepages]) -> VectorResult<()> {
    for r in rounded {
        let values = zones
            .iter_mut()
            .find(|z| z.name == r.zone)
            .and_then(|z| z.resources.get_mut(&r.resource));
        // A pool the case does not publish (excluded, not allocatable) needs no patch.
        if let Some([capacity, ..]) = values {
            let written = i64::try_from(r.written).map_err(|e| format!("{}: {e}", r.resource))?;
            *capacity = Quantity::from_int(written, Format::DecimalSI);
        }
    }
    Ok(())
}

fn is_extended(resource: &str) -> bool {
    resource != "cpu" && resource != "memory" && !resource.starts_with("hugepages-")
}

/// Every zone publishes a free-devices attribute for every extended resource of the node,
/// with sorted ids, at most as many as the zone has allocatable.
pub fn check_free_devices(zones: &[Zone]) -> VectorResult<()> {
    let extended: BTreeSet<&str> = zones
        .iter()
        .flat_map(|z| z.resources.iter().flatten())
        .map(|r| r.name.as_str())
        .filter(|r| is_extended(r))
        .collect();
    let want: BTreeSet<String> = extended.iter().map(|r| (*r).to_owned()).collect();
    for z in zones {
        let names: BTreeSet<String> = z
            .attributes
            .iter()
            .flatten()
            .filter_map(|a| a.name.strip_prefix(attr::FREE_DEVICES_PREFIX).map(str::to_owned))
            .collect();
        if names != want {
            return Err(format!(
                "{}: free-devices attributes for {names:?}, want {want:?}",
                z.name
            ));
        }
        for r in &want {
            let value = z
                .attribute(&format!("{}{r}", attr::FREE_DEVICES_PREFIX))
                .unwrap_or_default();
            let ids: Vec<&str> = value.split(',').filter(|s| !s.is_empty()).collect();
            if !ids.is_sorted() {
                return Err(format!("{}: {r} ids not sorted: {value}", z.name));
            }
            let row = z.resources.iter().flatten().find(|row| &row.name == r);
            let allocatable = match row {
                Some(row) => qty(&row.allocatable.0, &z.name)?.value_ceil(),
                None => 0,
            };
            if i64::try_from(ids.len()).unwrap_or(i64::MAX) > allocatable {
                return Err(format!("{}: more free {r} than allocatable", z.name));
            }
        }
    }
    Ok(())
}

/// Node attributes the case expects, in order.
pub fn expected_attributes(expect: &Value) -> Vec<(String, String)> {
    array(expect, "attributes")
        .iter()
        .map(|a| (str_of(a, "name").to_owned(), str_of(a, "value").to_owned()))
        .collect()
}

/// Annotations the case expects.
pub fn expected_annotations(expect: &Value) -> BTreeMap<String, String> {
    expect
        .get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Expected attributes appear with their values in the same relative order (the vectors
/// leave out the Topology Manager attributes the updater appends), expected annotations are
/// present, and our attributes follow RTE's order.
pub fn check_attributes(nrt: &NodeResourceTopology, expect: &Value) -> VectorResult<()> {
    let ours: Vec<(&str, &str)> = nrt
        .attributes
        .iter()
        .flatten()
        .map(|a| (a.name.as_str(), a.value.as_str()))
        .collect();
    let mut position = 0;
    for (name, value) in expected_attributes(expect) {
        let want = (name.as_str(), value.as_str());
        let found = ours
            .iter()
            .skip(position)
            .position(|got| *got == want)
            .ok_or_else(|| format!("attribute {want:?} missing or out of order in {ours:?}"))?;
        position += found + 1;
    }
    let annotations = nrt.metadata.annotations.clone().unwrap_or_default();
    for (key, value) in expected_annotations(expect) {
        if annotations.get(&key) != Some(&value) {
            return Err(format!(
                "annotation {key}: {:?}, want {value:?}",
                annotations.get(&key)
            ));
        }
    }
    let rte_order = [
        attr::PODS_FINGERPRINT,
        attr::PODS_FINGERPRINT_METHOD,
        attr::TOPOLOGY_MANAGER_SCOPE,
        attr::TOPOLOGY_MANAGER_POLICY,
        attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES,
    ];
    // RTE's attributes first, in its order; then our extensions (Topology Manager options in
    // upstream's naming, `numaplane.io/…`), which upstream consumers ignore.
    let is_extension = |n: &str| n.starts_with("numaplane.io/") || n.starts_with("topologyManagerOption");
    let known = ours.iter().take_while(|(n, _)| !is_extension(n)).count();
    if let Some((n, _)) = ours[known..].iter().find(|(n, _)| !is_extension(n)) {
        return Err(format!("attribute {n} after the extensions: {ours:?}"));
    }
    let ranks = ours[..known]
        .iter()
        .map(|(n, _)| {
            rte_order
                .iter()
                .position(|o| o == n)
                .ok_or_else(|| format!("unknown node attribute {n}"))
        })
        .collect::<VectorResult<Vec<usize>>>()?;
    if !ranks.is_sorted() {
        return Err(format!("attributes not in RTE order: {ours:?}"));
    }
    Ok(())
}
