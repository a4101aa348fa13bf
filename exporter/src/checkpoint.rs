//! The kubelet's own resource-manager checkpoints, read-only: `cpu_manager_state`,
//! `memory_manager_state` and `device-plugins/kubelet_internal_checkpoint`. They are the only
//! place that shows what init containers still hold: pod-resources `List` reports app
//! containers only (kubernetes#126765), while the kubelet keeps the CPUs, devices and memory an
//! init container got and no app container reused for as long as the pod lives.
//!
//! A checkpoint is trusted only when its checksum verifies. The kubelet computes it as FNV-1a
//! (32 bit) over go-spew's `%#v` rendering of the Go struct (`k8s.io/apimachinery/pkg/util/dump`
//! `ForHash`), so a field the kubelet adds in a later version changes the rendering and the file
//! is reported as an unknown format instead of being half-read. The renderings below follow the
//! struct layouts of kubelet 1.20 to 1.36 and were checked against checksums written by real
//! kubelets (see the tests). Written by hand: no crate renders go-spew output, and FNV-1a 32 is
//! five lines (the `fnv` crate only offers the 64-bit variant).
//!
//! Parsing is pure (bytes in, assignments out); [`crate::init_held::read_checkpoints`] reads the three files.
//!
//! Size (~630 lines of code): one module on purpose, the three parsers share the go-spew
//! rendering and the FNV checksum they must reproduce byte for byte; split them only together.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use base64::Engine as _;
use serde_json::{Map, Value};

/// File name of the CPU manager checkpoint in the kubelet's root directory.
pub const CPU_MANAGER_STATE: &str = "cpu_manager_state";
/// File name of the memory manager checkpoint in the kubelet's root directory.
pub const MEMORY_MANAGER_STATE: &str = "memory_manager_state";
/// Path of the device manager checkpoint below the kubelet's root directory.
pub const DEVICE_MANAGER_CHECKPOINT: &str = "device-plugins/kubelet_internal_checkpoint";

/// Why a checkpoint was not used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    /// The file exists but cannot be read (permissions, a directory, I/O).
    #[error("cannot read {file}: {message}")]
    ReadFile { file: &'static str, message: String },
    /// Not JSON.
    #[error("cannot parse {file} as JSON: {message}")]
    ParseJson { file: &'static str, message: String },
    /// JSON, but not a layout this exporter knows (a field missing or of another type).
    #[error("{file} has an unknown layout: {what}")]
    ReadLayout { file: &'static str, what: String },
    /// The checksum does not match the content under any known struct layout: a newer kubelet
    /// format, or a torn write.
    #[error("{file} checksum {found} matches no known layout")]
    VerifyChecksum { file: &'static str, found: u64 },
}

impl CheckpointError {
    /// The checkpoint file, for a metric label and the log line.
    pub fn file(&self) -> &'static str {
        match self {
            Self::ReadFile { file, .. }
            | Self::ParseJson { file, .. }
            | Self::ReadLayout { file, .. }
            | Self::VerifyChecksum { file, .. } => file,
        }
    }

    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ReadFile { .. } => "read",
            Self::ParseJson { .. } => "parse",
            Self::ReadLayout { .. } => "layout",
            Self::VerifyChecksum { .. } => "checksum",
        }
    }
}

/// Exclusive CPUs per pod UID (all containers, init containers included), from
/// `cpu_manager_state`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuAssignments {
    /// The checkpoint's policy (`none`, `static`).
    pub policy: String,
    /// Pod UID → container name → CPU ids.
    pub pods: BTreeMap<String, BTreeMap<String, BTreeSet<u32>>>,
}

/// Resource → device id → NUMA nodes (−1: none).
pub type DevicesByResource = BTreeMap<String, BTreeMap<String, Vec<i64>>>;

/// Container name → memory blocks (`None`: a nil list in the file).
type ContainerBlocks = BTreeMap<String, Option<Vec<MemoryBlock>>>;

/// Devices per pod UID, from the device manager checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceAssignments {
    /// Pod UID → container name → resource → device id → NUMA nodes (−1: none).
    pub pods: BTreeMap<String, BTreeMap<String, DevicesByResource>>,
}

/// One memory block of the memory manager checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemoryBlock {
    /// NUMA nodes of the block.
    pub numa_affinity: Vec<i64>,
    /// `memory` or `hugepages-<size>`.
    pub memory_type: String,
    /// Bytes.
    pub size: u64,
}

/// Memory blocks per pod UID, from `memory_manager_state`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryAssignments {
    /// The checkpoint's policy (`None`, `Static`).
    pub policy: String,
    /// Pod UID → container name → blocks.
    pub pods: BTreeMap<String, BTreeMap<String, Vec<MemoryBlock>>>,
    /// The NUMA groups that hold memory now (`machineState`: the `cells` of every node with
    /// assignments), each sorted; a single-node group is a node with single-NUMA allocations.
    pub groups: Vec<Vec<u32>>,
}

/// Reads and parses one checkpoint: `None` when it does not exist (the manager is off, or the
/// directory is not mounted).
pub(crate) async fn read_one<T>(
    dir: &std::path::Path,
    file: &'static str,
    parse: fn(&[u8]) -> Result<T, CheckpointError>,
) -> Option<Result<T, CheckpointError>> {
    match tokio::fs::read(dir.join(file)).await {
        Ok(bytes) => Some(parse(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(CheckpointError::ReadFile {
            file,
            message: e.to_string(),
        })),
    }
}

/// FNV-1a, 32 bit (Go's `hash/fnv.New32a`).
fn fnv32a(data: &str) -> u64 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in data.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    u64::from(hash)
}

fn parse(file: &'static str, bytes: &[u8]) -> Result<Map<String, Value>, CheckpointError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(layout(file, "the top level is not an object")),
        Err(e) => Err(CheckpointError::ParseJson {
            file,
            message: e.to_string(),
        }),
    }
}

fn layout(file: &'static str, what: impl Into<String>) -> CheckpointError {
    CheckpointError::ReadLayout {
        file,
        what: what.into(),
    }
}

/// A field by its JSON name, matched case-insensitively as Go's `encoding/json` does.
fn field<'v>(obj: &'v Map<String, Value>, name: &str) -> Option<&'v Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn str_field<'v>(
    file: &'static str,
    obj: &'v Map<String, Value>,
    name: &str,
) -> Result<&'v str, CheckpointError> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(layout(file, format!("{name} is not a string"))),
    }
}

fn u64_of(file: &'static str, v: &Value, what: &str) -> Result<u64, CheckpointError> {
    v.as_u64()
        .ok_or_else(|| layout(file, format!("{what} is not an unsigned integer")))
}

fn checksum_field(file: &'static str, obj: &Map<String, Value>, name: &str) -> Result<u64, CheckpointError> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => u64_of(file, v, name),
    }
}

/// Newer kubelets wrap the content as a JSON string in `data` with its own checksum
/// (`dataChecksum` = FNV-1a over `(string)<data>`), keeping the old fields for downgrades. The
/// wrapped content wins when present and valid.
fn unwrap_v3(
    file: &'static str,
    outer: Map<String, Value>,
) -> Result<(Map<String, Value>, bool), CheckpointError> {
    let Some(Value::String(data)) = field(&outer, "data") else {
        return Ok((outer, false));
    };
    let found = checksum_field(file, &outer, "dataChecksum")?;
    if fnv32a(&format!("(string){data}")) != found {
        return Err(CheckpointError::VerifyChecksum { file, found });
    }
    Ok((parse(file, data.as_bytes())?, true))
}

/// What a parser does with the checksum found and the renderings of the layouts it matches:
/// [`verify`] them, or (for [`seal_cpu_manager_state`] and its siblings) keep the current
/// layout's rendering.
type Check<'c> = &'c mut dyn FnMut(&'static str, u64, &[String]) -> Result<(), CheckpointError>;

fn verify(file: &'static str, found: u64, renderings: &[String]) -> Result<(), CheckpointError> {
    // Only the CPU manager accepts a zero checksum (files of its old file backend); the device
    // and memory managers verify every checkpoint.
    if (found == 0 && file == CPU_MANAGER_STATE) || renderings.iter().any(|r| fnv32a(r) == found) {
        Ok(())
    } else {
        Err(CheckpointError::VerifyChecksum { file, found })
    }
}

// --- go-spew `%#v` pieces -----------------------------------------------------------------

/// `map[k:v k:v]` for string keys in Go's byte order, or `<nil>`.
fn spew_string_map<T>(map: Option<&BTreeMap<String, T>>, mut value: impl FnMut(&mut String, &T)) -> String {
    let Some(map) = map else {
        return "<nil>".to_owned();
    };
    let mut out = String::from("map[");
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(k);
        out.push(':');
        value(&mut out, v);
    }
    out.push(']');
    out
}

fn spew_list<T>(list: Option<&[T]>, mut item: impl FnMut(&mut String, &T)) -> String {
    let Some(list) = list else {
        return "<nil>".to_owned();
    };
    let mut out = String::from("[");
    for (i, v) in list.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        item(&mut out, v);
    }
    out.push(']');
    out
}

fn push_display(out: &mut String, v: impl std::fmt::Display) {
    let _ = write!(out, "{v}");
}

// --- CPU manager ----------------------------------------------------------------------------

/// Parses and verifies `cpu_manager_state`.
pub fn parse_cpu_manager_state(bytes: &[u8]) -> Result<CpuAssignments, CheckpointError> {
    cpu_manager_state(bytes, &mut verify)
}

fn cpu_manager_state(bytes: &[u8], check: Check<'_>) -> Result<CpuAssignments, CheckpointError> {
    const FILE: &str = CPU_MANAGER_STATE;
    let (obj, wrapped) = unwrap_v3(FILE, parse(FILE, bytes)?)?;
    let policy = str_field(FILE, &obj, "policyName")?.to_owned();
    let default_set = str_field(FILE, &obj, "defaultCpuSet")?;
    // Absent entries decode into the kubelet's pre-made empty map, `null` into a nil map.
    let entries: Option<BTreeMap<String, BTreeMap<String, String>>> = match field(&obj, "entries") {
        Some(Value::Null) => None,
        None => Some(BTreeMap::new()),
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|_| layout(FILE, "entries is not a map of pods to containers to CPU sets"))?,
        ),
    };
    if !wrapped {
        let rendered_entries = spew_string_map(entries.as_ref(), |out, containers| {
            out.push_str(&spew_string_map(Some(containers), |o, set| o.push_str(set)));
        });
        let rendering = format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} DefaultCPUSet:(string){default_set} \
             Entries:(map[string]map[string]string){rendered_entries} Checksum:(checksum.Checksum)0}}"
        );
        check(FILE, checksum_field(FILE, &obj, "checksum")?, &[rendering])?;
    }
    let mut pods = BTreeMap::new();
    for (uid, containers) in entries.unwrap_or_default() {
        let mut by_container = BTreeMap::new();
        for (container, set) in containers {
            let cpus =
                parse_cpu_set(&set).ok_or_else(|| layout(FILE, format!("CPU set {set:?} of pod {uid}")))?;
            by_container.insert(container, cpus);
        }
        pods.insert(uid, by_container);
    }
    Ok(CpuAssignments { policy, pods })
}

/// A Linux CPU list (`0-3,8,10-11`); `None` when malformed.
pub fn parse_cpu_set(list: &str) -> Option<BTreeSet<u32>> {
    let mut cpus = BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                // A CPU list names at most a few thousand CPUs; a huge range is not a CPU set.
                if a > b || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => {
                cpus.insert(part.parse().ok()?);
            }
        }
    }
    Some(cpus)
}

// --- Memory manager -------------------------------------------------------------------------

fn blocks_of(file: &'static str, v: &Value, what: &str) -> Result<Option<Vec<MemoryBlock>>, CheckpointError> {
    let list = match v {
        Value::Null => return Ok(None),
        Value::Array(list) => list,
        _ => return Err(layout(file, format!("{what} is not a list of blocks"))),
    };
    let mut blocks = Vec::with_capacity(list.len());
    for b in list {
        let Value::Object(b) = b else {
            return Err(layout(file, format!("{what}: a block is not an object")));
        };
        let numa_affinity = match field(b, "numaAffinity") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| {
                    id.as_i64()
                        .ok_or_else(|| layout(file, format!("{what}: a NUMA id is not an integer")))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(layout(file, format!("{what}: numaAffinity is not a list"))),
        };
        blocks.push(MemoryBlock {
            numa_affinity,
            memory_type: str_field(file, b, "type")?.to_owned(),
            size: match field(b, "size") {
                Some(v) => u64_of(file, v, "size")?,
                None => 0,
            },
        });
    }
    Ok(Some(blocks))
}

fn spew_blocks(blocks: Option<&Vec<MemoryBlock>>, affinity_nil: bool) -> String {
    spew_list(blocks.map(Vec::as_slice), |out, b| {
        let affinity = if affinity_nil && b.numa_affinity.is_empty() {
            "<nil>".to_owned()
        } else {
            spew_list(Some(&b.numa_affinity[..]), |o, id| push_display(o, id))
        };
        let _ = write!(
            out,
            "{{NUMAAffinity:([]int){affinity} Type:(v1.ResourceName){} Size:(uint64){}}}",
            b.memory_type, b.size
        );
    })
}

/// Parses and verifies `memory_manager_state`.
pub fn parse_memory_manager_state(bytes: &[u8]) -> Result<MemoryAssignments, CheckpointError> {
    memory_manager_state(bytes, &mut verify)
}

fn memory_manager_state(bytes: &[u8], check: Check<'_>) -> Result<MemoryAssignments, CheckpointError> {
    const FILE: &str = MEMORY_MANAGER_STATE;
    let (obj, wrapped) = unwrap_v3(FILE, parse(FILE, bytes)?)?;
    let policy = str_field(FILE, &obj, "policyName")?.to_owned();

    let mut entries: Option<BTreeMap<String, ContainerBlocks>> = None;
    match field(&obj, "entries") {
        Some(Value::Null) => {}
        None => entries = Some(BTreeMap::new()),
        Some(Value::Object(pods)) => {
            let mut out = BTreeMap::new();
            for (uid, containers) in pods {
                let Value::Object(containers) = containers else {
                    return Err(layout(FILE, format!("entries of pod {uid} are not a map")));
                };
                let mut by_container = BTreeMap::new();
                for (name, blocks) in containers {
                    by_container.insert(name.clone(), blocks_of(FILE, blocks, name)?);
                }
                out.insert(uid.clone(), by_container);
            }
            entries = Some(out);
        }
        Some(_) => return Err(layout(FILE, "entries is not a map")),
    }

    if !wrapped {
        let machine = render_machine_state(field(&obj, "machineState"))?;
        let rendered_entries = spew_string_map(entries.as_ref(), |out, containers| {
            out.push_str(&spew_string_map(Some(containers), |o, blocks| {
                o.push_str(&spew_blocks(blocks.as_ref(), true));
            }));
        });
        let head = format!(
            "(*state.MemoryManagerCheckpoint){{PolicyName:(string){policy} MachineState:(state.NUMANodeMap){machine} \
             Entries:(state.ContainerMemoryAssignments){rendered_entries} "
        );
        let tail = "Checksum:(checksum.Checksum)0}";
        // Kubelets with pod-level resource managers (1.36+) add PodEntries before Checksum.
        let pod_entries = match field(&obj, "podEntries") {
            None | Some(Value::Null) => vec!["<nil>".to_owned(), "map[]".to_owned()],
            Some(Value::Object(pods)) => {
                let mut rendered = BTreeMap::new();
                for (uid, entry) in pods {
                    let Value::Object(entry) = entry else {
                        return Err(layout(FILE, format!("podEntries of pod {uid} is not an object")));
                    };
                    let blocks = match field(entry, "memoryBlocks") {
                        Some(v) => blocks_of(FILE, v, "memoryBlocks")?,
                        None => None,
                    };
                    rendered.insert(
                        uid.clone(),
                        format!(
                            "{{MemoryBlocks:([]state.Block){}}}",
                            spew_blocks(blocks.as_ref(), true)
                        ),
                    );
                }
                vec![spew_string_map(Some(&rendered), |o, s| o.push_str(s))]
            }
            Some(_) => return Err(layout(FILE, "podEntries is not a map")),
        };
        let mut renderings = vec![format!("{head}{tail}")];
        renderings.extend(
            pod_entries
                .iter()
                .map(|p| format!("{head}PodEntries:(state.PodMemoryAssignments){p} {tail}")),
        );
        check(FILE, checksum_field(FILE, &obj, "checksum")?, &renderings)?;
    }

    let groups = groups_in_use(field(&obj, "machineState"))?;
    let pods = entries
        .unwrap_or_default()
        .into_iter()
        .map(|(uid, containers)| {
            let containers = containers
                .into_iter()
                .map(|(name, blocks)| (name, blocks.unwrap_or_default()))
                .collect();
            (uid, containers)
        })
        .collect();
    Ok(MemoryAssignments { policy, pods, groups })
}

/// The distinct `cells` of the nodes that hold assignments: the memory manager's groups in use.
fn groups_in_use(machine_state: Option<&Value>) -> Result<Vec<Vec<u32>>, CheckpointError> {
    const FILE: &str = MEMORY_MANAGER_STATE;
    let Some(Value::Object(nodes)) = machine_state else {
        return Ok(Vec::new());
    };
    let mut groups = BTreeSet::new();
    for (id, node) in nodes {
        let Value::Object(node) = node else { continue };
        let assignments = field(node, "numberOfAssignments")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if assignments <= 0 {
            continue;
        }
        let own: u32 = id
            .parse()
            .map_err(|_| layout(FILE, format!("machineState key {id:?} is not a NUMA id")))?;
        let mut cells: Vec<u32> = match field(node, "cells") {
            Some(Value::Array(cells)) => cells
                .iter()
                .map(|c| {
                    c.as_u64()
                        .and_then(|c| u32::try_from(c).ok())
                        .ok_or_else(|| layout(FILE, "a cell is not a NUMA id"))
                })
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        if !cells.contains(&own) {
            cells.push(own);
        }
        cells.sort_unstable();
        cells.dedup();
        groups.insert(cells);
    }
    Ok(groups.into_iter().collect())
}

/// `map[0:<*>{NumberOfAssignments:(int)0 MemoryMap:(...)map[memory:<*>{...}] Cells:([]int)[0]}]`
fn render_machine_state(v: Option<&Value>) -> Result<String, CheckpointError> {
    const FILE: &str = MEMORY_MANAGER_STATE;
    let nodes = match v {
        None => return Ok("map[]".to_owned()),
        Some(Value::Null) => return Ok("<nil>".to_owned()),
        Some(Value::Object(nodes)) => nodes,
        Some(_) => return Err(layout(FILE, "machineState is not a map")),
    };
    let mut by_id: BTreeMap<i64, &Value> = BTreeMap::new();
    for (id, node) in nodes {
        let id: i64 = id
            .parse()
            .map_err(|_| layout(FILE, format!("machineState key {id:?} is not a NUMA id")))?;
        by_id.insert(id, node);
    }
    let mut out = String::from("map[");
    for (i, (id, node)) in by_id.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{id}:");
        let node = match node {
            Value::Null => {
                out.push_str("<nil>");
                continue;
            }
            Value::Object(node) => node,
            _ => {
                return Err(layout(
                    FILE,
                    format!("machineState of NUMA node {id} is not an object"),
                ));
            }
        };
        let assignments = match field(node, "numberOfAssignments") {
            Some(v) => v
                .as_i64()
                .ok_or_else(|| layout(FILE, "numberOfAssignments is not an integer"))?,
            None => 0,
        };
        let memory_map = match field(node, "memoryMap") {
            None | Some(Value::Null) => "<nil>".to_owned(),
            Some(Value::Object(tables)) => {
                let mut rendered = BTreeMap::new();
                for (name, table) in tables {
                    let text = match table {
                        Value::Null => "<nil>".to_owned(),
                        Value::Object(t) => {
                            let get = |k: &str| field(t, k).map_or(Ok(0), |v| u64_of(FILE, v, k));
                            format!(
                                "<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} \
                                 Reserved:(uint64){} Free:(uint64){}}}",
                                get("total")?,
                                get("systemReserved")?,
                                get("allocatable")?,
                                get("reserved")?,
                                get("free")?
                            )
                        }
                        _ => return Err(layout(FILE, format!("memory table {name} is not an object"))),
                    };
                    rendered.insert(name.clone(), text);
                }
                spew_string_map(Some(&rendered), |o, s| o.push_str(s))
            }
            Some(_) => return Err(layout(FILE, "memoryMap is not a map")),
        };
        let cells = match field(node, "cells") {
            None | Some(Value::Null) => "<nil>".to_owned(),
            Some(Value::Array(cells)) => {
                let ids: Vec<i64> = cells
                    .iter()
                    .map(|c| c.as_i64().ok_or_else(|| layout(FILE, "a cell is not an integer")))
                    .collect::<Result<_, _>>()?;
                spew_list(Some(&ids[..]), |o, id| push_display(o, id))
            }
            Some(_) => return Err(layout(FILE, "cells is not a list")),
        };
        let _ = write!(
            out,
            "<*>{{NumberOfAssignments:(int){assignments} MemoryMap:(map[v1.ResourceName]*state.MemoryTable){memory_map} \
             Cells:([]int){cells}}}"
        );
    }
    out.push(']');
    Ok(out)
}

// --- Device manager -------------------------------------------------------------------------

/// Parses and verifies `device-plugins/kubelet_internal_checkpoint`.
pub fn parse_device_checkpoint(bytes: &[u8]) -> Result<DeviceAssignments, CheckpointError> {
    device_checkpoint(bytes, &mut verify)
}

fn device_checkpoint(bytes: &[u8], check: Check<'_>) -> Result<DeviceAssignments, CheckpointError> {
    const FILE: &str = DEVICE_MANAGER_CHECKPOINT;
    let obj = parse(FILE, bytes)?;
    let data = match field(&obj, "Data") {
        Some(Value::Object(d)) => d,
        _ => return Err(layout(FILE, "Data is missing or not an object")),
    };
    let mut pods: BTreeMap<String, BTreeMap<String, DevicesByResource>> = BTreeMap::new();
    let mut rendered_entries: Option<Vec<String>> = None;
    match field(data, "PodDeviceEntries") {
        None | Some(Value::Null) => {}
        Some(Value::Array(entries)) => {
            let mut rendered = Vec::with_capacity(entries.len());
            for e in entries {
                let Value::Object(e) = e else {
                    return Err(layout(FILE, "a PodDeviceEntries item is not an object"));
                };
                let uid = str_field(FILE, e, "PodUID")?;
                let container = str_field(FILE, e, "ContainerName")?;
                let resource = str_field(FILE, e, "ResourceName")?;
                // Since 1.20 DeviceIDs maps a NUMA node (−1: none) to ids; the older flat list
                // is another layout.
                let per_numa: Option<BTreeMap<i64, Option<Vec<String>>>> = match field(e, "DeviceIDs") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(m)) => {
                        let mut out = BTreeMap::new();
                        for (numa, ids) in m {
                            let numa: i64 = numa.parse().map_err(|_| {
                                layout(FILE, format!("DeviceIDs key {numa:?} is not a NUMA id"))
                            })?;
                            let ids: Option<Vec<String>> = serde_json::from_value(ids.clone())
                                .map_err(|_| layout(FILE, "DeviceIDs values are not lists of ids"))?;
                            out.insert(numa, ids);
                        }
                        Some(out)
                    }
                    Some(_) => return Err(layout(FILE, "DeviceIDs is not a map of NUMA nodes to ids")),
                };
                let alloc_resp: Option<Vec<u8>> = match field(e, "AllocResp") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(b64)) => Some(
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .map_err(|_| layout(FILE, "AllocResp is not base64"))?,
                    ),
                    Some(_) => return Err(layout(FILE, "AllocResp is not a string")),
                };
                let ids_text = match &per_numa {
                    None => "<nil>".to_owned(),
                    Some(m) => {
                        let mut t = String::from("map[");
                        for (i, (numa, ids)) in m.iter().enumerate() {
                            if i > 0 {
                                t.push(' ');
                            }
                            let _ = write!(t, "{numa}:");
                            t.push_str(&spew_list(ids.as_deref(), |o, id| o.push_str(id)));
                        }
                        t.push(']');
                        t
                    }
                };
                let resp_text = spew_list(alloc_resp.as_deref(), |o, b| push_display(o, b));
                rendered.push(format!(
                    "{{PodUID:(string){uid} ContainerName:(string){container} ResourceName:(string){resource} \
                     DeviceIDs:(checkpoint.DevicesPerNUMA){ids_text} AllocResp:([]uint8){resp_text}}}"
                ));
                let held = pods
                    .entry(uid.to_owned())
                    .or_default()
                    .entry(container.to_owned())
                    .or_default()
                    .entry(resource.to_owned())
                    .or_default();
                for (numa, ids) in per_numa.into_iter().flatten() {
                    for id in ids.into_iter().flatten() {
                        held.entry(id).or_default().push(numa);
                    }
                }
            }
            rendered_entries = Some(rendered);
        }
        Some(_) => return Err(layout(FILE, "PodDeviceEntries is not a list")),
    }
    let registered: Option<BTreeMap<String, Option<Vec<String>>>> = match field(data, "RegisteredDevices") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|_| layout(FILE, "RegisteredDevices is not a map of resources to ids"))?,
        ),
    };
    let entries_text = spew_list(rendered_entries.as_deref(), |o, s| o.push_str(s));
    let registered_text = spew_string_map(registered.as_ref(), |o, ids| {
        o.push_str(&spew_list(ids.as_deref(), |o2, id| o2.push_str(id)));
    });
    let rendering = format!(
        "(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries_text} \
         RegisteredDevices:(map[string][]string){registered_text}}}"
    );
    check(FILE, checksum_field(FILE, &obj, "Checksum")?, &[rendering])?;
    Ok(DeviceAssignments { pods })
}

// --- Writing checkpoints (tests and tools) ---------------------------------------------------

/// Sets `content`'s checksum field to what the kubelet writes for it (FNV-1a over the
/// rendering of the current layout) and returns the file text. `parse` reads `content` in
/// that layout; a v3 `data` wrapper is not sealed.
fn seal(
    file: &'static str,
    checksum: &str,
    mut content: Value,
    parse: fn(&[u8], Check<'_>) -> Result<(), CheckpointError>,
) -> Result<String, CheckpointError> {
    let Value::Object(obj) = &mut content else {
        return Err(layout(file, "the top level is not an object"));
    };
    obj.insert(checksum.to_owned(), Value::from(0));
    let mut rendering: Option<String> = None;
    parse(content.to_string().as_bytes(), &mut |_, _, renderings| {
        rendering = renderings.first().cloned();
        Ok(())
    })?;
    let rendering = rendering.ok_or_else(|| layout(file, "a wrapped (data) checkpoint is not sealed"))?;
    if let Value::Object(obj) = &mut content {
        obj.insert(checksum.to_owned(), Value::from(fnv32a(&rendering)));
    }
    Ok(content.to_string())
}

/// `cpu_manager_state` text for `content` (its JSON) with the checksum a kubelet writes.
pub fn seal_cpu_manager_state(content: Value) -> Result<String, CheckpointError> {
    seal(CPU_MANAGER_STATE, "checksum", content, |b, c| {
        cpu_manager_state(b, c).map(|_| ())
    })
}

/// `memory_manager_state` text for `content` (its JSON) with the checksum a kubelet writes.
pub fn seal_memory_manager_state(content: Value) -> Result<String, CheckpointError> {
    seal(MEMORY_MANAGER_STATE, "checksum", content, |b, c| {
        memory_manager_state(b, c).map(|_| ())
    })
}

/// `kubelet_internal_checkpoint` text for `content` (its JSON) with the checksum a kubelet
/// writes.
pub fn seal_device_checkpoint(content: Value) -> Result<String, CheckpointError> {
    seal(DEVICE_MANAGER_CHECKPOINT, "Checksum", content, |b, c| {
        device_checkpoint(b, c).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    //! Checksums below were written by real kubelets (device and CPU manager files captured on
    //! a node, and the kubelet's own state_checkpoint tests); none is computed by this module.
    use super::*;

    #[test]
    fn cpu_manager_state_from_a_real_kubelet_verifies() {
        let a = parse_cpu_manager_state(
            br#"{"policyName":"static","defaultCpuSet":"0,4-27","entries":{"39b37746-7f5e-4064-b8e1-eebd2bfaa003":{"app":"1-3"}},"checksum":3300516549}"#,
        )
        .unwrap();
        assert_eq!(a.policy, "static");
        assert_eq!(
            a.pods["39b37746-7f5e-4064-b8e1-eebd2bfaa003"]["app"],
            BTreeSet::from([1, 2, 3])
        );
        // No entries at all: the kubelet hashes its pre-made empty map.
        let empty = parse_cpu_manager_state(
            br#"{"policyName":"static","defaultCpuSet":"0-27","checksum":273146150}"#,
        )
        .unwrap();
        assert!(empty.pods.is_empty());
        // The kubelet's own test vectors (JSON keys matched case-insensitively, as Go does).
        parse_cpu_manager_state(
            br#"{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":354655845}"#,
        )
        .unwrap();
        let two = parse_cpu_manager_state(
            br#"{"policyName":"none","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},"checksum":3610638499}"#,
        )
        .unwrap();
        assert_eq!(two.pods["pod"].len(), 2);
    }

    #[test]
    fn a_tampered_cpu_manager_state_is_rejected() {
        let e = parse_cpu_manager_state(
            br#"{"policyName":"static","defaultCpuSet":"0,4-27","entries":{"39b37746-7f5e-4064-b8e1-eebd2bfaa003":{"app":"1-4"}},"checksum":3300516549}"#,
        )
        .unwrap_err();
        assert_eq!(e.kind(), "checksum");
        assert_eq!(parse_cpu_manager_state(b"{").unwrap_err().kind(), "parse");
        assert_eq!(
            parse_cpu_manager_state(br#"{"policyName":"static","entries":{"p":{"c":"x-y"}},"checksum":0}"#)
                .unwrap_err()
                .kind(),
            "layout"
        );
    }

    #[test]
    fn device_checkpoints_from_real_kubelets_verify() {
        let a = parse_device_checkpoint(
            br#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#,
        )
        .unwrap();
        assert_eq!(
            a.pods["bf52b2cd-b611-4e79-86b1-280b283185c3"]["check"]["nvidia.com/gpu"]["tegra"],
            vec![-1]
        );
        let none = parse_device_checkpoint(
            br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#,
        )
        .unwrap();
        assert!(none.pods.is_empty());
        let two_pods = parse_device_checkpoint(br#"{"Data":{"PodDeviceEntries":[{"PodUID":"513cb897-0262-4868-826f-aa943ee45a38","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c"]},"AllocResp":"CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS03N2E3MDJkYi1lMzdmLTNhNzQtZDQ2ZC1jNTcxM2Y2NjA1OGMaJAoOL2Rldi9udmlkaWFjdGwSDi9kZXYvbnZpZGlhY3RsGgJydxomCg8vZGV2L252aWRpYS11dm0SDy9kZXYvbnZpZGlhLXV2bRoCcncaMgoVL2Rldi9udmlkaWEtdXZtLXRvb2xzEhUvZGV2L252aWRpYS11dm0tdG9vbHMaAnJ3Gi4KEy9kZXYvbnZpZGlhLW1vZGVzZXQSEy9kZXYvbnZpZGlhLW1vZGVzZXQaAnJ3GiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEwGgJydw=="},{"PodUID":"94283d1b-ce5a-4797-bff8-0cf0c7143b2b","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"1":["GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841","GPU-9b341c59-f96b-ba85-c137-78c3652fea65"]},"AllocResp":"CmsKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSUUdQVS1jMWU5ZjI0OS1iMzdiLTgxYzItYThkOS1iYTVjYTAyOTQ4NDEsR1BVLTliMzQxYzU5LWY5NmItYmE4NS1jMTM3LTc4YzM2NTJmZWE2NRokCg4vZGV2L252aWRpYWN0bBIOL2Rldi9udmlkaWFjdGwaAnJ3GiYKDy9kZXYvbnZpZGlhLXV2bRIPL2Rldi9udmlkaWEtdXZtGgJydxoyChUvZGV2L252aWRpYS11dm0tdG9vbHMSFS9kZXYvbnZpZGlhLXV2bS10b29scxoCcncaLgoTL2Rldi9udmlkaWEtbW9kZXNldBITL2Rldi9udmlkaWEtbW9kZXNldBoCcncaIAoML2Rldi9udmlkaWExEgwvZGV2L252aWRpYTEaAnJ3GiAKDC9kZXYvbnZpZGlhMhIML2Rldi9udmlkaWEyGgJydw=="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c","GPU-9b341c59-f96b-ba85-c137-78c3652fea65","GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"]}},"Checksum":2442330366}"#).unwrap();
        assert_eq!(two_pods.pods.len(), 2);
        assert_eq!(
            two_pods.pods["94283d1b-ce5a-4797-bff8-0cf0c7143b2b"]["app"]["nvidia.com/gpu"].len(),
            2
        );
    }

    #[test]
    fn a_device_checkpoint_of_another_layout_is_not_half_read() {
        // Pre-1.20 flat DeviceIDs list.
        let e = parse_device_checkpoint(
            br#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":["a"]}],"RegisteredDevices":{}},"Checksum":403603645}"#,
        )
        .unwrap_err();
        assert_eq!(e.kind(), "layout");
        // A changed id under the original checksum.
        let e = parse_device_checkpoint(
            br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e1"]}},"Checksum":3952659280}"#,
        )
        .unwrap_err();
        assert_eq!(e.kind(), "checksum");
    }

    #[test]
    fn memory_manager_states_from_the_kubelet_tests_verify() {
        let v2 = parse_memory_manager_state(
            br#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":4215593881}"#,
        )
        .unwrap();
        assert_eq!(
            v2.pods["pod"]["container1"],
            vec![MemoryBlock {
                numa_affinity: vec![0],
                memory_type: "memory".into(),
                size: 512
            }]
        );
        // 1.36+: pod-level entries in the hashed struct.
        parse_memory_manager_state(
            br#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"podEntries":{"pod":{"memoryBlocks":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":1278640530}"#,
        )
        .unwrap();
        // v3: the wrapped data wins over a deliberately wrong outer copy.
        let v3 = parse_memory_manager_state(
            br#"{"policyName":"other","machineState":{},"entries":{"pod":{"containerX":[{"numaAffinity":[0],"type":"memory","size":128}]}},"checksum":1234,"data":"{\"policyName\":\"static\",\"machineState\":{\"0\":{\"numberOfAssignments\":0,\"memoryMap\":{\"memory\":{\"total\":2048,\"systemReserved\":512,\"allocatable\":1536,\"reserved\":512,\"free\":1024}},\"cells\":[]}},\"entries\":{\"pod\":{\"container1\":[{\"numaAffinity\":[0],\"type\":\"memory\",\"size\":512}]}}}","dataChecksum":1849615440}"#,
        )
        .unwrap();
        assert_eq!(v3.policy, "static");
        assert!(v3.groups.is_empty(), "no node holds assignments");
        assert!(v3.pods["pod"].contains_key("container1"));
        let bad = parse_memory_manager_state(
            br#"{"policyName":"static","entries":{},"data":"{}","dataChecksum":1234}"#,
        )
        .unwrap_err();
        assert_eq!(bad.kind(), "checksum");
    }

    #[test]
    fn sealing_writes_the_checksums_real_kubelets_wrote() {
        let resealed = |text: &str, seal: fn(Value) -> Result<String, CheckpointError>, key: &str| {
            let mut v: Value = serde_json::from_str(text).unwrap();
            let want = v[key].clone();
            v[key] = Value::from(1);
            let sealed: Value = serde_json::from_str(&seal(v).unwrap()).unwrap();
            assert_eq!(sealed[key], want, "{text}");
        };
        resealed(
            r#"{"policyName":"static","defaultCpuSet":"0,4-27","entries":{"39b37746-7f5e-4064-b8e1-eebd2bfaa003":{"app":"1-3"}},"checksum":3300516549}"#,
            seal_cpu_manager_state,
            "checksum",
        );
        resealed(
            r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#,
            seal_device_checkpoint,
            "Checksum",
        );
        resealed(
            r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":4215593881}"#,
            seal_memory_manager_state,
            "checksum",
        );
    }

    #[test]
    fn a_zero_checksum_is_accepted_for_the_cpu_manager_state_only() {
        // The CPU manager accepts 0 (files of its old file backend); the device and memory
        // managers verify every checksum.
        parse_cpu_manager_state(
            br#"{"policyName":"static","defaultCpuSet":"0-3","entries":{},"checksum":0}"#,
        )
        .unwrap();
        let e = parse_device_checkpoint(
            br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":0}"#,
        )
        .unwrap_err();
        assert_eq!((e.file(), e.kind()), (DEVICE_MANAGER_CHECKPOINT, "checksum"));
        let e = parse_memory_manager_state(
            br#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":0}"#,
        )
        .unwrap_err();
        assert_eq!((e.file(), e.kind()), (MEMORY_MANAGER_STATE, "checksum"));
    }

    #[test]
    fn cpu_sets_parse_like_linux_cpulists() {
        assert_eq!(parse_cpu_set("0-2,5, 7-7"), Some(BTreeSet::from([0, 1, 2, 5, 7])));
        assert_eq!(parse_cpu_set(""), Some(BTreeSet::new()));
        assert_eq!(parse_cpu_set("3-1"), None);
        assert_eq!(parse_cpu_set("0-4294967295"), None);
        assert_eq!(parse_cpu_set("a"), None);
    }

    #[test]
    fn memory_groups_in_use_come_from_the_machine_state() {
        // Nodes 0 and 1 hold one multi-NUMA allocation, node 2 single-node ones, node 3 none.
        let state = br#"{"policyName":"Static","machineState":{
            "0":{"numberOfAssignments":2,"memoryMap":{},"cells":[0,1]},
            "1":{"numberOfAssignments":2,"memoryMap":{},"cells":[0,1]},
            "2":{"numberOfAssignments":1,"memoryMap":{},"cells":[2]},
            "3":{"numberOfAssignments":0,"memoryMap":{},"cells":[3]}},"entries":{}}"#;
        let state = seal_memory_manager_state(serde_json::from_slice(state).unwrap()).unwrap();
        let m = parse_memory_manager_state(state.as_bytes()).unwrap();
        assert_eq!(m.groups, vec![vec![0, 1], vec![2]]);
    }
}
