//! NUMA alignment of DRA devices with the CPUs and memory the kubelet pins.
//!
//! The Topology Manager aligns CPUs, memory and device-plugin devices, never DRA devices: those
//! are chosen by the scheduler and prepared after admission. Here the scheduler chooses them on
//! the NUMA nodes the model predicts for the containers that use the claim. Pure: the targets
//! come from the predicted placement, the search is the upstream allocator's with a device
//! filter ([`super::allocator::DeviceFilter`]), tried from the strictest level to upstream's.
//!
//! Rules:
//! - a container with exclusive CPUs or pinned memory on a node whose policy is
//!   `single-numa-node` or `restricted` *requires* (mode `Required`) the devices of the claims
//!   it names in `resources.claims` on its predicted NUMA nodes (pod scope: the pod's);
//! - every other container with a predicted NUMA affinity *prefers* them;
//! - a device that no source places (no NUMA attribute, no PCI locality) has no NUMA affinity,
//!   as a device-plugin device without topology: it satisfies a requirement, after the
//!   aligned devices;
//! - a claim (or request) used by several containers: a requirement is the intersection of
//!   their NUMA nodes; when containers pinned to disjoint NUMA nodes share it, no device can
//!   be local to all of them, so nothing is required and the devices are preferred on the
//!   union of their nodes (the claim is reported `split`);
//! - already allocated claims keep their devices (their alignment is reported, not enforced),
//!   and `allocationMode: All` requests take every device as upstream does.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{DeviceRequest, ResourceClaim};

use super::slice::{Device, ResourceSlice};
use numaplane::{
    device_numa::{DeviceNumaError, DriverNumaAttributes},
    pci_locality::PciBusRange,
};
use serde::Serialize;

pub use super::verdict::{AlignmentStatus, ClaimNuma, ContainerNumaEntry, DeviceNumaEntry};
use super::{
    DraError,
    allocator::DeviceFilter,
    state::{ClaimAllocation, ContainerClaim, DraState, ResolvedClaims},
    verdict::nodes_text,
};

/// Whether the devices of a DRA claim follow the NUMA nodes where the kubelet pins the CPUs and
/// memory of the containers that use it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, Serialize)]
pub enum DraNumaAlignment {
    /// Devices must sit on the predicted NUMA nodes of a container with exclusive CPUs or
    /// pinned memory on a node whose Topology Manager policy is `single-numa-node` or
    /// `restricted` (a node without such devices is not feasible); preferred everywhere else.
    #[default]
    Required,
    /// Aligned devices are preferred in the device choice and the node score, never required.
    Preferred,
    /// kube-scheduler's choice: upstream's search order, no NUMA in the score.
    Ignore,
}

impl DraNumaAlignment {
    /// Every mode, in the order the command lines list them.
    pub const ALL: [DraNumaAlignment; 3] = [Self::Required, Self::Preferred, Self::Ignore];

    /// The name flags and the config file use (`draNuma.alignment`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Required => "Required",
            Self::Preferred => "Preferred",
            Self::Ignore => "Ignore",
        }
    }

    /// One line on what the mode does, for `--help`.
    pub fn summary(self) -> &'static str {
        match self {
            Self::Required => {
                "Devices must sit on the predicted NUMA nodes of a container with exclusive CPUs or \
                 pinned memory on a node whose Topology Manager policy is `single-numa-node` or \
                 `restricted` (a node without such devices is not feasible); preferred everywhere else"
            }
            Self::Preferred => {
                "Aligned devices are preferred in the device choice and the node score, never required"
            }
            Self::Ignore => "kube-scheduler's choice: upstream's search order, no NUMA in the score",
        }
    }

    /// The mode named `name`, exactly as [`Self::name`] spells it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// What the kubelet pins for a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pinned {
    /// Exclusive CPUs (static CPU manager).
    pub cpu: bool,
    /// Memory or hugepages (Static memory manager).
    pub memory: bool,
}

impl Pinned {
    fn any(self) -> bool {
        self.cpu || self.memory
    }

    fn union(self, other: Pinned) -> Pinned {
        Pinned {
            cpu: self.cpu || other.cpu,
            memory: self.memory || other.memory,
        }
    }

    /// `cpu`, `memory`, `cpu and memory`; `None` when nothing is pinned.
    pub fn describe(self) -> Option<&'static str> {
        match (self.cpu, self.memory) {
            (true, true) => Some("cpu and memory"),
            (true, false) => Some("cpu"),
            (false, true) => Some("memory"),
            (false, false) => None,
        }
    }
}

/// One container as the alignment sees it.
#[derive(Clone, Debug)]
pub struct ContainerNuma<'a> {
    /// Container name.
    pub name: &'a str,
    /// Predicted NUMA affinity (the pod's in pod scope); `None`: none predicted.
    pub numa_nodes: Option<&'a [u32]>,
    /// What the kubelet pins there.
    pub pinned: Pinned,
    /// Its `resources.claims`.
    pub claims: &'a [ContainerClaim],
}

/// The NUMA nodes one pod claim (or one request of it) should take its devices from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Pod claim name.
    pub claim: String,
    /// One request; `None`: all of them.
    pub request: Option<String>,
    /// NUMA node ids, ascending.
    pub nodes: Vec<u32>,
    /// A node without such devices is not feasible.
    pub required: bool,
    /// What the kubelet pins on `nodes` (for a requirement's reason).
    pub pinned: Pinned,
    /// Containers pinned to disjoint NUMA nodes share it: no device is local to all.
    pub split: bool,
}

/// The targets of a pod's claims on one node. `strict_policy`: the node's Topology Manager
/// policy is `single-numa-node` or `restricted`. `machine`: the node's NUMA node ids; a
/// container whose affinity is all of them (the kubelet narrowed nothing: no hint provider
/// asked for anything) sets no target, as every device is local to it.
pub fn targets(
    mode: DraNumaAlignment,
    strict_policy: bool,
    machine: &[u32],
    containers: &[ContainerNuma<'_>],
) -> Vec<Target> {
    if mode == DraNumaAlignment::Ignore {
        return Vec::new();
    }
    let whole_machine = |n: &[u32]| !machine.is_empty() && machine.iter().all(|m| n.contains(m));
    // Each (claim, request) in first-use order, with its users: (nodes, pinned, strict).
    type Key<'k> = (&'k str, Option<&'k str>);
    type Users<'u> = Vec<(&'u [u32], Pinned, bool)>;
    let mut uses: Vec<(Key<'_>, Users<'_>)> = Vec::new();
    for c in containers {
        let Some(nodes) = c.numa_nodes.filter(|n| !n.is_empty() && !whole_machine(n)) else {
            continue;
        };
        let strict = mode == DraNumaAlignment::Required && strict_policy && c.pinned.any();
        for cc in c.claims {
            let key = (cc.name.as_str(), cc.request.as_deref());
            let user = (nodes, c.pinned, strict);
            match uses.iter_mut().find(|(k, _)| *k == key) {
                Some((_, users)) => users.push(user),
                None => uses.push((key, vec![user])),
            }
        }
    }
    uses.into_iter()
        .map(|((claim, request), users)| {
            let strict: Vec<_> = users.iter().filter(|u| u.2).collect();
            let (group, required_possible) = if strict.is_empty() {
                (users.iter().collect::<Vec<_>>(), false)
            } else {
                (strict, true)
            };
            let pinned = group.iter().fold(Pinned::default(), |p, u| p.union(u.1));
            // One user (most claims): its nodes, without the sets (a search tries many nodes).
            let (nodes, split) = if let [only] = group.as_slice() {
                let mut nodes = only.0.to_vec();
                nodes.sort_unstable();
                nodes.dedup();
                (nodes, false)
            } else {
                let inter = group.iter().skip(1).fold(
                    group
                        .first()
                        .map(|u| u.0.iter().copied().collect::<BTreeSet<u32>>())
                        .unwrap_or_default(),
                    |acc, u| {
                        acc.intersection(&u.0.iter().copied().collect())
                            .copied()
                            .collect()
                    },
                );
                let split = inter.is_empty();
                let nodes: BTreeSet<u32> = if split {
                    group.iter().flat_map(|u| u.0.iter().copied()).collect()
                } else {
                    inter
                };
                (nodes.into_iter().collect(), split)
            };
            Target {
                claim: claim.to_owned(),
                request: request.map(str::to_owned),
                nodes,
                required: required_possible && !split,
                pinned,
                split,
            }
        })
        .collect()
}

impl Target {
    /// Whether it applies to the devices of `request` (a request name, not a subrequest's) of
    /// a ResourceClaim that the pod names as `pod_names`.
    fn applies_to(&self, pod_names: &[&str], request: &str) -> bool {
        pod_names.contains(&self.claim.as_str()) && self.request.as_deref().is_none_or(|r| r == request)
    }
}

/// Where a device sits relative to a target, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fit {
    /// On one of the target's NUMA nodes (for a device on several, on at least one, as the
    /// kubelet's device manager counts a multi-node device in a hint).
    Aligned,
    /// No source places it.
    NoNumaNode,
    /// Only on other NUMA nodes.
    Misaligned,
}

/// How `device_nodes` (`None`: unplaced) sits relative to `target`.
pub fn fit(device_nodes: Option<&[u32]>, target: &[u32]) -> Fit {
    match device_nodes {
        None => Fit::NoNumaNode,
        Some(d) if d.iter().any(|n| target.contains(n)) => Fit::Aligned,
        Some(_) => Fit::Misaligned,
    }
}

/// Search levels, strictest first: aligned devices only, then also unplaced ones, then (for
/// what is not required) any device, which is upstream's search.
const LEVELS: [Fit; 3] = [Fit::Aligned, Fit::NoNumaNode, Fit::Misaligned];

/// Whether a device with `f` may serve a target at `level`: a requirement never takes a
/// misaligned device.
pub fn allowed(f: Fit, required: bool, level: Fit) -> bool {
    let cap = if required {
        level.min(Fit::NoNumaNode)
    } else {
        level
    };
    f <= cap
}

/// How well an allocation follows its targets; it raises the node's score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quality {
    /// No target: nothing to align (mode `Ignore`, no prediction, no container names a claim).
    Unconstrained,
    /// Found at this level.
    Level(Fit),
}

/// Most a node's score gains from alignment.
pub const MAX_BONUS: i64 = 100;

impl Quality {
    /// Score added for it. A device without NUMA node costs nothing, as a device-plugin device
    /// without topology fits any hint; only a misaligned device loses the bonus.
    pub fn bonus(self) -> i64 {
        match self {
            Quality::Level(Fit::Aligned | Fit::NoNumaNode) => MAX_BONUS,
            Quality::Unconstrained | Quality::Level(Fit::Misaligned) => 0,
        }
    }
}

/// What the alignment reads of the node besides the claims.
pub struct NodeNuma<'a> {
    /// The targets ([`targets`]).
    pub targets: &'a [Target],
    /// The node's NUMA node ids: a device published on others only is one without NUMA node,
    /// as the exporter counts it.
    pub machine: &'a [u32],
    /// Configured driver attributes.
    pub driver_attributes: &'a DriverNumaAttributes,
    /// The node's PCI locality.
    pub pci_locality: &'a [PciBusRange],
}

/// The devices of a slice whose NUMA attribute (standard or driver-specific) is present but not
/// a NUMA node id, or whose PCI address attribute is malformed. The allocation treats them as devices without NUMA node; this is how the
/// driver's bug is reported (a log line and a gauge in the live scheduler, a warning in
/// `simulate`). PCI locality is not needed: only attributes can be malformed.
pub fn invalid_device_numa(
    slice: &ResourceSlice,
    driver_attributes: &DriverNumaAttributes,
) -> Vec<DeviceNumaError> {
    let driver = slice.spec.driver.as_str();
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter_map(|d| d.numa(driver, driver_attributes, &[]).err())
        .collect()
}

impl NodeNuma<'_> {
    /// The NUMA nodes of a device (`None`: unplaced; a malformed attribute counts as unplaced,
    /// the driver's bug shows as a device without NUMA node).
    pub fn device_nodes(&self, driver: &str, device: &Device) -> Option<Vec<u32>> {
        let mut nodes = device
            .numa(driver, self.driver_attributes, self.pci_locality)
            .ok()
            .flatten()?
            .nodes;
        if !self.machine.is_empty() {
            nodes.retain(|n| self.machine.contains(n));
        }
        (!nodes.is_empty()).then_some(nodes)
    }
}

/// For each claim the allocator sees (the pending ones, in order), the pod claim names that
/// reference its ResourceClaim.
fn pod_names_of_pending<'a>(claims: &ResolvedClaims<'a>) -> Vec<Vec<&'a str>> {
    claims
        .pending
        .iter()
        .map(|&i| {
            let name = claims.all[i].1.metadata.name.as_deref();
            claims
                .all
                .iter()
                .filter(|(_, c)| c.metadata.name.as_deref() == name)
                .map(|(p, _)| *p)
                .collect()
        })
        .collect()
}

/// Why the claims cannot be allocated on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotHere {
    /// For the user.
    pub reason: String,
    /// Upstream's search finds devices; only the NUMA requirement rules the node out.
    pub alignment: bool,
}

impl NotHere {
    fn upstream(reason: String) -> Self {
        NotHere {
            reason,
            alignment: false,
        }
    }
}

/// One run of the allocator on a node, over the pod's pending claims, with a device filter
/// (`None`: upstream's search).
pub type Search<'s> =
    dyn Fn(Option<&DeviceFilter<'_>>) -> Result<Result<Vec<ClaimAllocation>, String>, DraError> + 's;

/// Whether the pending claims can be allocated with one requirement (`&Target`) met, searched
/// with the filter that meets it.
pub type TargetSearch<'s> = dyn Fn(&Target, &DeviceFilter<'_>) -> bool + 's;

/// Which of the levels a search runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Levels {
    /// Every level, strictest first.
    All,
    /// Those that earn the bonus (aligned devices, then also unplaced ones): where they find
    /// nothing and the misaligned level might, the search says so instead of searching it.
    Bonus,
    /// The misaligned level alone (the others are known to find nothing).
    Misaligned,
}

/// What [`search_aligned`] found.
#[derive(Debug)]
pub enum Searched {
    /// An allocation, and how well it follows the targets.
    Found(Vec<ClaimAllocation>, Quality),
    /// None at any level searched.
    NotFound,
    /// ([`Levels::Bonus`]) None at the bonus levels; the misaligned level, not searched, may
    /// find one.
    MisalignedLeft,
}

/// Allocates the pending claims as `search` does, choosing aligned devices first: the first of
/// the levels (aligned, then also unplaced, then, for what is only preferred, any) whose search
/// finds a complete allocation, among `levels`. [`Searched::NotFound`] when none does; saying
/// why takes more searches ([`explain_not_aligned`]), and a decision needs that only when no
/// node fits.
pub fn search_aligned(
    claims: &ResolvedClaims<'_>,
    search: &Search<'_>,
    numa: &NodeNuma<'_>,
    levels: Levels,
) -> Result<Searched, DraError> {
    if numa.targets.is_empty() {
        return Ok(match search(None)? {
            Ok(c) => Searched::Found(c, Quality::Unconstrained),
            Err(_) => Searched::NotFound,
        });
    }
    let names = pod_names_of_pending(claims);
    // Levels a device the search was refused would be allowed at: when none of the devices a
    // failed search was refused opens up at the next level, the search there makes the same
    // calls with the same answers (it is deterministic), so it fails the same way.
    let opens_at = std::cell::Cell::new([false; LEVELS.len()]);
    // The filter at `LEVELS[here]`.
    let filter = |here: usize| {
        let names = &names;
        let opens_at = &opens_at;
        move |c: usize, request: &str, driver: &str, device: &Device| -> bool {
            let Some(pod_names) = names.get(c) else {
                return true;
            };
            let mut nodes: Option<Option<Vec<u32>>> = None;
            let mut verdicts = [true; LEVELS.len()];
            for t in numa.targets.iter().filter(|t| t.applies_to(pod_names, request)) {
                let d = nodes.get_or_insert_with(|| numa.device_nodes(driver, device));
                let f = fit(d.as_deref(), &t.nodes);
                for (v, l) in verdicts.iter_mut().zip(LEVELS) {
                    *v &= allowed(f, t.required, l);
                }
            }
            let ok = verdicts.get(here).copied().unwrap_or(true);
            if !ok {
                let mut o = opens_at.get();
                for (seen, v) in o.iter_mut().zip(verdicts) {
                    *seen |= v;
                }
                opens_at.set(o);
            }
            ok
        }
    };
    let any_preferred = numa.targets.iter().any(|t| !t.required);
    let mut searched = false;
    for (i, level) in LEVELS.into_iter().enumerate() {
        if level == Fit::Misaligned && !any_preferred {
            // Same filter as the level before.
            break;
        }
        if levels == Levels::Misaligned && level != Fit::Misaligned {
            continue;
        }
        if searched && !opens_at.get().get(i).copied().unwrap_or(true) {
            continue;
        }
        if levels == Levels::Bonus && level == Fit::Misaligned {
            return Ok(Searched::MisalignedLeft);
        }
        opens_at.set([false; LEVELS.len()]);
        searched = true;
        let f = filter(i);
        // An error here (a selector failing on a device upstream's search would not have
        // reached) is not the pod's: only upstream's own search decides errors.
        if let Ok(Ok(c)) = search(Some(&f)) {
            return Ok(Searched::Found(c, Quality::Level(level)));
        }
    }
    Ok(Searched::NotFound)
}

/// Why [`search_aligned`] found nothing on the node: upstream's own search fails there, or
/// (with a reason naming the claim) only a NUMA requirement does. An upstream error is the
/// pod's. A node where upstream's search succeeds and nothing is required gets that
/// allocation, unaligned.
///
/// `upstream`: what upstream's search finds on the node, when known (`Err`: its reason); it is
/// searched only when unknown, or when its allocation is the answer. `target_fits`: whether a
/// search with one requirement's filter finds an allocation (the caller may know it already).
pub fn explain_not_aligned(
    claims: &ResolvedClaims<'_>,
    search: &Search<'_>,
    target_fits: &TargetSearch<'_>,
    numa: &NodeNuma<'_>,
    upstream: Option<Result<(), String>>,
) -> Result<Result<(Vec<ClaimAllocation>, Quality), NotHere>, DraError> {
    let required = numa.targets.iter().any(|t| t.required);
    let found = match upstream {
        Some(Err(reason)) => return Ok(Err(NotHere::upstream(reason))),
        // Its allocation is not needed: only the requirement can fail.
        Some(Ok(())) if required => Vec::new(),
        _ => match search(None)? {
            Err(reason) => return Ok(Err(NotHere::upstream(reason))),
            Ok(c) => c,
        },
    };
    if numa.targets.is_empty() {
        return Ok(Ok((found, Quality::Unconstrained)));
    }
    if !required {
        return Ok(Ok((found, Quality::Level(Fit::Misaligned))));
    }
    // Only the requirement fails: which one alone cannot be met.
    let aligned = |reason| NotHere {
        reason,
        alignment: true,
    };
    if let [only] = numa.targets {
        // The search at the level of devices without NUMA node, which failed, was this one.
        return Ok(Err(aligned(requirement_reason(claims, only))));
    }
    let names = pod_names_of_pending(claims);
    for t in numa.targets.iter().filter(|t| t.required) {
        let f = |c: usize, request: &str, driver: &str, device: &Device| -> bool {
            let Some(pod_names) = names.get(c) else {
                return true;
            };
            if !t.applies_to(pod_names, request) {
                return true;
            }
            let d = numa.device_nodes(driver, device);
            allowed(fit(d.as_deref(), &t.nodes), true, Fit::NoNumaNode)
        };
        if !target_fits(t, &f) {
            return Ok(Err(aligned(requirement_reason(claims, t))));
        }
    }
    Ok(Err(aligned(combined_reason(numa.targets))))
}

/// The classes and the device count a target asks for.
fn asked(claim: &ResourceClaim, request: Option<&str>) -> (Vec<String>, i64) {
    let requests: Vec<&DeviceRequest> = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| request.is_none_or(|n| n == r.name))
        .collect();
    let mut classes: Vec<String> = Vec::new();
    let mut count = 0i64;
    for r in requests {
        let (class, n) = match (&r.exactly, r.first_available.as_deref()) {
            (Some(e), _) => (
                e.device_class_name.clone(),
                match e.allocation_mode.as_deref() {
                    Some("All") => 1,
                    _ => e.count.unwrap_or(1),
                },
            ),
            (None, Some([first, ..])) => (first.device_class_name.clone(), first.count.unwrap_or(1)),
            _ => continue,
        };
        if !classes.contains(&class) {
            classes.push(class);
        }
        count = count.saturating_add(n);
    }
    (classes, count)
}

/// `claim gpu: no free device of class gpu.example.com on NUMA node 1, where the kubelet will
/// pin cpu`.
pub fn requirement_reason(claims: &ResolvedClaims<'_>, t: &Target) -> String {
    let (classes, count) = claims
        .all
        .iter()
        .find(|(p, _)| *p == t.claim)
        .map(|(_, c)| asked(c, t.request.as_deref()))
        .unwrap_or_default();
    let what = match t.request.as_deref() {
        Some(r) => format!("claim {}, request {r}", t.claim),
        None => format!("claim {}", t.claim),
    };
    let class = match classes.len() {
        0 => String::new(),
        1 => format!(" of class {}", classes[0]),
        _ => format!(" of classes {}", classes.join(", ")),
    };
    let devices = if count > 1 {
        format!("fewer than {count} free devices{class}")
    } else {
        format!("no free device{class}")
    };
    format!(
        "{what}: {devices} on {}, where the kubelet will pin {}",
        nodes_text(&t.nodes),
        t.pinned.describe().unwrap_or("the container")
    )
}

/// When each requirement alone can be met but not all together.
fn combined_reason(targets: &[Target]) -> String {
    let required: Vec<&Target> = targets.iter().filter(|t| t.required).collect();
    let names: Vec<&str> = required.iter().map(|t| t.claim.as_str()).collect();
    let nodes: BTreeSet<u32> = required.iter().flat_map(|t| t.nodes.iter().copied()).collect();
    let pinned = required.iter().fold(Pinned::default(), |p, t| p.union(t.pinned));
    format!(
        "claims {}: no free devices for all of them together on {}, where the kubelet will pin {}",
        names.join(", "),
        nodes_text(&nodes.into_iter().collect::<Vec<_>>()),
        pinned.describe().unwrap_or("the containers")
    )
}

/// Annotates each claim allocation on node `node` with its devices' NUMA nodes and its
/// containers' predicted ones.
pub fn annotate(
    state: &DraState,
    node: &str,
    resolved: &ResolvedClaims<'_>,
    allocations: &mut [ClaimAllocation],
    containers: &[ContainerNuma<'_>],
    numa: &NodeNuma<'_>,
) {
    for a in allocations.iter_mut() {
        let pod_names: Vec<&str> = resolved
            .all
            .iter()
            .filter(|(_, c)| c.metadata.name.as_deref() == Some(a.name.as_str()))
            .map(|(p, _)| *p)
            .collect();
        let devices = a
            .allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .map(|r| DeviceNumaEntry {
                device: format!("{}/{}/{}", r.driver, r.pool, r.device),
                request: r.request.clone(),
                numa_nodes: state
                    .device_on(node, &r.driver, &r.pool, &r.device)
                    .and_then(|d| numa.device_nodes(&r.driver, d)),
            })
            .collect();
        a.numa = Some(claim_numa(&pod_names, devices, containers, numa.targets));
    }
}

/// The verdict on a claim whose `devices` (each: the request it serves, as the allocation
/// names it, and its NUMA nodes, `None` when unplaced) serve the pod claims `pod_names`, against
/// the `targets` of the pod's containers. The one rule behind [`annotate`] (a predicted
/// placement) and `kubectl numa explain` (a bound pod's record): the worst [`fit`] of a device
/// to a target of its claim and request decides, a target shared across disjoint NUMA nodes
/// makes the claim `split`, and no target at all leaves it `not predicted`.
fn claim_alignment<'d>(
    pod_names: &[&str],
    devices: impl IntoIterator<Item = (&'d str, Option<&'d [u32]>)>,
    targets: &[Target],
) -> AlignmentStatus {
    let mut worst: Option<Fit> = None;
    let mut split = false;
    for (request, nodes) in devices {
        // A subrequest (`req/sub`) is served for its request.
        let base = request.split('/').next().unwrap_or("");
        for t in targets.iter().filter(|t| t.applies_to(pod_names, base)) {
            split |= t.split;
            let f = fit(nodes, &t.nodes);
            worst = Some(worst.map_or(f, |w| w.max(f)));
        }
    }
    match worst {
        _ if split => AlignmentStatus::Split,
        None => AlignmentStatus::NotPredicted,
        Some(Fit::Aligned) => AlignmentStatus::Aligned,
        Some(Fit::NoNumaNode) => AlignmentStatus::NoNumaNode,
        Some(Fit::Misaligned) => AlignmentStatus::Misaligned,
    }
}

/// A claim's `devices` next to the `containers` that name one of its pod claims `pod_names`,
/// with the [`claim_alignment`] verdict against `targets`.
pub fn claim_numa(
    pod_names: &[&str],
    devices: Vec<DeviceNumaEntry>,
    containers: &[ContainerNuma<'_>],
    targets: &[Target],
) -> ClaimNuma {
    let alignment = claim_alignment(
        pod_names,
        devices
            .iter()
            .map(|d| (d.request.as_str(), d.numa_nodes.as_deref())),
        targets,
    );
    ClaimNuma {
        devices,
        containers: containers
            .iter()
            .filter(|c| c.claims.iter().any(|cc| pod_names.contains(&cc.name.as_str())))
            .map(|c| ContainerNumaEntry {
                name: c.name.to_owned(),
                numa_nodes: c.numa_nodes.map(<[u32]>::to_vec),
                pinned: c.pinned.describe(),
            })
            .collect(),
        alignment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(claims: &[(&str, Option<&str>)]) -> Vec<ContainerClaim> {
        claims
            .iter()
            .map(|(n, r)| ContainerClaim {
                name: (*n).to_owned(),
                request: r.map(str::to_owned),
            })
            .collect()
    }

    const CPU: Pinned = Pinned {
        cpu: true,
        memory: false,
    };

    /// Containers "a" on node 0 and "b" on node 1, both CPU-pinned, using `a` and `b` claims.
    fn cpu_pinned_on_0_and_1<'a>(a: &'a [ContainerClaim], b: &'a [ContainerClaim]) -> [ContainerNuma<'a>; 2] {
        [
            ContainerNuma {
                name: "a",
                numa_nodes: Some(&[0]),
                pinned: CPU,
                claims: a,
            },
            ContainerNuma {
                name: "b",
                numa_nodes: Some(&[1]),
                pinned: CPU,
                claims: b,
            },
        ]
    }

    /// Claim "gpu" (whole claim) required on node 1, where the kubelet pins CPUs.
    fn required_gpu_on_node_1() -> Target {
        Target {
            claim: "gpu".into(),
            request: None,
            nodes: vec![1],
            required: true,
            pinned: CPU,
            split: false,
        }
    }

    #[test]
    fn a_pinned_container_under_a_strict_policy_requires_its_nodes() {
        let gpu = uses(&[("gpu", None)]);
        let c = [ContainerNuma {
            name: "app",
            numa_nodes: Some(&[1]),
            pinned: CPU,
            claims: &gpu,
        }];
        let t = targets(DraNumaAlignment::Required, true, &[], &c);
        assert_eq!(t, vec![required_gpu_on_node_1()]);
        // Preferred mode, a lax policy, or nothing pinned: preferred only.
        for (mode, strict, pinned) in [
            (DraNumaAlignment::Preferred, true, CPU),
            (DraNumaAlignment::Required, false, CPU),
            (DraNumaAlignment::Required, true, Pinned::default()),
        ] {
            let c = [ContainerNuma {
                pinned,
                ..c[0].clone()
            }];
            let t = targets(mode, strict, &[], &c);
            assert_eq!(t.len(), 1);
            assert!(!t[0].required, "{mode:?} {strict} {pinned:?}");
            assert_eq!(t[0].nodes, vec![1]);
        }
        assert!(targets(DraNumaAlignment::Ignore, true, &[], &c).is_empty());
        // No prediction, no target.
        let c = [ContainerNuma {
            numa_nodes: None,
            ..c[0].clone()
        }];
        assert!(targets(DraNumaAlignment::Required, true, &[], &c).is_empty());
    }

    #[test]
    fn a_claim_shared_across_disjoint_pinned_nodes_is_split_and_only_preferred() {
        let gpu = uses(&[("gpu", None)]);
        let c = cpu_pinned_on_0_and_1(&gpu, &gpu);
        let t = targets(DraNumaAlignment::Required, true, &[], &c);
        assert_eq!(t.len(), 1);
        assert!(t[0].split && !t[0].required);
        assert_eq!(t[0].nodes, vec![0, 1]);
        // Overlapping nodes: the intersection is required.
        let c = [
            ContainerNuma {
                numa_nodes: Some(&[0, 1]),
                ..c[0].clone()
            },
            c[1].clone(),
        ];
        let t = targets(DraNumaAlignment::Required, true, &[], &c);
        assert!(t[0].required && !t[0].split);
        assert_eq!(t[0].nodes, vec![1]);
        // An unpinned user does not weaken a pinned user's requirement.
        let c = [
            ContainerNuma {
                numa_nodes: Some(&[0]),
                pinned: Pinned::default(),
                ..c[0].clone()
            },
            c[1].clone(),
        ];
        let t = targets(DraNumaAlignment::Required, true, &[], &c);
        assert!(t[0].required);
        assert_eq!(t[0].nodes, vec![1]);
    }

    #[test]
    fn requests_are_targeted_separately() {
        let a = uses(&[("nic", Some("rx"))]);
        let b = uses(&[("nic", Some("tx"))]);
        let c = cpu_pinned_on_0_and_1(&a, &b);
        let t = targets(DraNumaAlignment::Required, true, &[], &c);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].request.as_deref(), t[0].nodes.as_slice()),
            (Some("rx"), &[0][..])
        );
        assert_eq!(
            (t[1].request.as_deref(), t[1].nodes.as_slice()),
            (Some("tx"), &[1][..])
        );
        assert!(t.iter().all(|t| t.required && !t.split));
    }

    #[test]
    fn fit_and_levels_order_devices() {
        assert_eq!(fit(Some(&[1]), &[1]), Fit::Aligned);
        assert_eq!(fit(Some(&[0, 1]), &[1]), Fit::Aligned);
        assert_eq!(fit(Some(&[0]), &[1]), Fit::Misaligned);
        assert_eq!(fit(None, &[1]), Fit::NoNumaNode);
        // Strictest level: aligned only.
        assert!(allowed(Fit::Aligned, true, Fit::Aligned));
        assert!(!allowed(Fit::NoNumaNode, false, Fit::Aligned));
        // Then devices without NUMA node, as device-plugin devices without topology.
        assert!(allowed(Fit::NoNumaNode, true, Fit::NoNumaNode));
        assert!(!allowed(Fit::Misaligned, false, Fit::NoNumaNode));
        // Last, anything, but never for a requirement.
        assert!(allowed(Fit::Misaligned, false, Fit::Misaligned));
        assert!(!allowed(Fit::Misaligned, true, Fit::Misaligned));
        assert_eq!(Quality::Level(Fit::Aligned).bonus(), MAX_BONUS);
        assert_eq!(Quality::Level(Fit::NoNumaNode).bonus(), MAX_BONUS);
        assert_eq!(Quality::Level(Fit::Misaligned).bonus(), 0);
        assert_eq!(Quality::Unconstrained.bonus(), 0);
    }

    #[test]
    fn the_reason_names_claim_class_nodes_and_what_is_pinned() {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-gpu", "namespace": "default"},
            "spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.example.com"}}
            ]}}
        }))
        .unwrap();
        let resolved = ResolvedClaims {
            all: vec![("gpu", &claim)],
            pending: vec![0],
            digest: None,
            pod_digest: None,
        };
        let mut t = required_gpu_on_node_1();
        assert_eq!(
            requirement_reason(&resolved, &t),
            "claim gpu: no free device of class gpu.example.com on NUMA node 1, where the kubelet will pin cpu"
        );
        t.nodes = vec![0, 1];
        t.pinned = Pinned {
            cpu: true,
            memory: true,
        };
        let two: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-gpu"},
            "spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.example.com", "count": 2}}
            ]}}
        }))
        .unwrap();
        let resolved = ResolvedClaims {
            all: vec![("gpu", &two)],
            pending: vec![0],
            digest: None,
            pod_digest: None,
        };
        assert_eq!(
            requirement_reason(&resolved, &t),
            "claim gpu: fewer than 2 free devices of class gpu.example.com on NUMA nodes 0,1, where the kubelet will pin cpu and memory"
        );
    }

    #[test]
    fn malformed_numa_attributes_of_a_slice_are_reported_per_device() {
        let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-a-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "ok", "attributes": {"resource.kubernetes.io/numaNode": {"int": 1}}},
                    {"name": "negative", "attributes": {"resource.kubernetes.io/numaNode": {"int": -2}}},
                    {"name": "no-affinity", "attributes": {"resource.kubernetes.io/numaNode": {"int": -1}}},
                    {"name": "driver-string", "attributes": {"numa": {"string": "zero"}}},
                    {"name": "bad-pci", "attributes": {"resource.kubernetes.io/pcieRoot": {"string": "0000:3a"}}},
                    {"name": "unplaced"}
                ]}
        }))
        .unwrap();
        let attrs = numaplane::device_numa::default_driver_numa_attributes();
        let errors = invalid_device_numa(&slice, &attrs);
        let named: Vec<(&str, &str)> = errors
            .iter()
            .map(|e| (e.device.as_str(), e.attribute.as_str()))
            .collect();
        assert_eq!(
            named,
            vec![
                ("negative", "resource.kubernetes.io/numaNode"),
                ("driver-string", "numa"),
                ("bad-pci", "resource.kubernetes.io/pcieRoot")
            ]
        );
        // Without the driver's attribute configured, its string is not read at all.
        assert_eq!(invalid_device_numa(&slice, &DriverNumaAttributes::new()).len(), 2);
    }
}
