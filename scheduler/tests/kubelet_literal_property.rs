//! Property: for random pods (init containers, sidecars, devices) on random 2-, 4- and 8-zone
//! nodes, the model's predicted admission and NUMA affinity equal those of a second, literal
//! implementation of the kubelet's per-container sequence written here from
//! kubelet-topology-manager.md (§2.3–§2.7, §3.1, §3.3) and the v1.36 rules of verified-facts.md
//! (device hints only over the NUMA nodes hosting the resource): explicit CPU and device IDs, the CPU
//! manager's `cpusToReuse` and the device manager's `devicesToReuse` carried from container to
//! container, hints generated mask by mask, the Topology Manager's permutation merge and its
//! pairwise `compareHints` fold. Nothing here calls the model's hint or merge code.
//!
//! Where the kubelet's choice is random (Go map order) or the plugin's (devices), both sides
//! use the model's documented tie rule: reusable items first, then the lowest NUMA node and the
//! lowest ID, aligned nodes before the others. CPUs are taken by the CPU manager's
//! `takeByTopology` (NUMA-packed) on a machine with a socket per NUMA node and one thread per
//! core, after the reusable ones (the model's rule for those). The Static memory manager (group rules, default hint, extension, greedy fill) is on
//! for half the 2- and 4-zone nodes, starting empty, for pods without init containers; no
//! device spans two nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Rng;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use numaplane::nrt::NodeResourceTopology;
use numaplane_scheduler::{
    admission::{self, WorkingZones},
    node::NumaTopology,
    pod::PodSpec,
    resources::Resources,
};
use serde_json::{Value, json};

const RESOURCES: [&str; 2] = ["example.com/gpu", "example.com/nic"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

/// A machine as the kubelet sees it.
#[derive(Clone, Debug)]
struct Machine {
    zones: u32,
    /// NUMA node of each CPU id.
    cpu_node: Vec<u32>,
    free_cpus: BTreeSet<usize>,
    /// Per resource: every device with a NUMA node (ID, NUMA node).
    devices: BTreeMap<&'static str, Vec<(String, u32)>>,
    /// Per resource: the devices the plugin gives no NUMA node (no topology).
    unaligned: BTreeMap<&'static str, Vec<String>>,
    /// Per resource: the free devices, with or without a NUMA node.
    free_devices: BTreeMap<&'static str, BTreeSet<String>>,
    policy: Policy,
    pod_scope: bool,
    publish_ids: bool,
    /// Memory (GiB) per NUMA node under the Static memory manager, all free; empty: manager off.
    memory: Vec<u32>,
}

impl Machine {
    /// Some device plugin registered devices of `resource` (with a NUMA node or not).
    fn registered(&self, resource: &str) -> bool {
        !self.devices[resource].is_empty() || !self.unaligned[resource].is_empty()
    }

    /// The NUMA node of a device; `None` for a device without topology.
    fn node_of(&self, resource: &str, d: &str) -> Option<u32> {
        self.devices[resource]
            .iter()
            .find(|(id, _)| id == d)
            .map(|(_, n)| *n)
    }
}

#[derive(Clone, Debug)]
struct Ctr {
    name: String,
    sidecar: bool,
    cpus: u32,
    /// Half a CPU more: no exclusive CPUs for this container (§3.1 eligibility).
    half: bool,
    /// Memory in GiB.
    mem: u32,
    devices: BTreeMap<&'static str, u32>,
}

#[derive(Clone, Debug)]
struct PodDef {
    guaranteed: bool,
    init: Vec<Ctr>,
    app: Vec<Ctr>,
}

type Mask = u64;

/// A literal admission: the pod's mask (pod scope) and each container's, or the reject reason.
type Admission = Result<(Option<Vec<u32>>, Vec<Option<Vec<u32>>>), &'static str>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hint {
    mask: Option<Mask>,
    preferred: bool,
}

impl Hint {
    /// A hint for `mask`, not (yet) preferred.
    fn not_preferred(mask: Mask) -> Hint {
        Hint {
            mask: Some(mask),
            preferred: false,
        }
    }
}

/// Marks preferred the hints as narrow as `min_affinity` nodes, as every hint provider does.
fn prefer_narrowest(hints: &mut [Hint], min_affinity: u32) {
    for h in hints {
        h.preferred = h.mask.map(count) == Some(min_affinity);
    }
}

fn count(m: Mask) -> u32 {
    m.count_ones()
}

/// `IsNarrowerThan`: fewer nodes, then the lower value.
fn narrower(a: Mask, b: Mask) -> bool {
    count(a) < count(b) || (count(a) == count(b) && a < b)
}

/// Every NUMA mask by increasing size, each size in lexicographic order (§2.2).
fn masks(zones: u32) -> Vec<Mask> {
    let mut all: Vec<Mask> = (1..(1u64 << zones)).collect();
    all.sort_by_key(|m| {
        let ids: Vec<u32> = (0..zones).filter(|i| m & (1 << i) != 0).collect();
        (ids.len(), ids)
    });
    all
}

/// What one provider answers for one resource: `None` = no preference (nil list).
type ProviderHints = Vec<(String, Option<Vec<Hint>>)>;

struct Kubelet<'a> {
    m: &'a mut Machine,
    cpus_to_reuse: BTreeSet<usize>,
    devices_to_reuse: BTreeMap<&'static str, BTreeSet<String>>,
    /// Memory manager state per NUMA node: free GiB, `NumberOfAssignments`, `Cells` (group).
    mem_free: Vec<u32>,
    mem_assignments: Vec<u32>,
    mem_cells: Vec<Mask>,
    /// Device hint lists that came out empty although enough devices were free: only devices
    /// without a NUMA node could serve the request.
    empty_with_devices: std::cell::Cell<u32>,
    /// Containers handed a device without a NUMA node because no device with one was free.
    unaligned_for_lack: u32,
    /// The devices each container was handed, in admission order (init containers first).
    handed: Vec<BTreeMap<&'static str, Vec<String>>>,
}

impl<'a> Kubelet<'a> {
    /// The kubelet of machine `m`, nothing allocated by it yet.
    fn new(m: &'a mut Machine) -> Self {
        let memory = m.memory.clone();
        Kubelet {
            m,
            cpus_to_reuse: BTreeSet::new(),
            devices_to_reuse: BTreeMap::new(),
            mem_assignments: vec![0; memory.len()],
            mem_cells: (0..memory.len()).map(|i| 1 << i).collect(),
            mem_free: memory,
            empty_with_devices: std::cell::Cell::new(0),
            unaligned_for_lack: 0,
            handed: Vec::new(),
        }
    }

    fn guaranteed_cpus(pod: &PodDef, c: &Ctr) -> u32 {
        if pod.guaranteed && !c.half { c.cpus } else { 0 }
    }

    /// CPU manager static policy, hint generation (§3.1 steps 2–5).
    fn cpu_hints(&self, request: u32) -> Option<Vec<Hint>> {
        if request == 0 {
            return None;
        }
        let mut min_affinity = self.m.zones;
        let mut hints = Vec::new();
        for mask in masks(self.m.zones) {
            let in_mask = |cpu: &usize| mask & (1 << self.m.cpu_node[*cpu]) != 0;
            let total = (0..self.m.cpu_node.len()).filter(in_mask).count();
            if total >= request as usize && count(mask) < min_affinity {
                min_affinity = count(mask);
            }
            if self.cpus_to_reuse.iter().any(|c| !in_mask(c)) {
                continue;
            }
            let matching = self.cpus_to_reuse.len() + self.m.free_cpus.iter().filter(|c| in_mask(c)).count();
            if matching >= request as usize {
                hints.push(Hint::not_preferred(mask));
            }
        }
        prefer_narrowest(&mut hints, min_affinity);
        Some(hints)
    }

    /// Device manager, hint generation (§3.3 steps 3–4).
    fn device_hints(
        &self,
        resource: &'static str,
        request: u32,
        reusable: &BTreeSet<String>,
    ) -> Option<Vec<Hint>> {
        let all = &self.m.devices[resource];
        if all.is_empty() {
            // No registered device has topology: no preference.
            return None;
        }
        // Devices without topology are available too, but in no mask.
        let available = &self.m.free_devices[resource];
        if available.union(reusable).count() < request as usize {
            return Some(Vec::new());
        }
        let node_of = |d: &String| self.m.node_of(resource, d);
        // v1.36: the masks are built over the NUMA nodes hosting devices of the resource only.
        let hosting: Mask = all.iter().fold(0, |m, (_, n)| m | 1 << n);
        let mut min_affinity = self.m.zones;
        let mut hints = Vec::new();
        for mask in masks(self.m.zones).into_iter().filter(|m| m & !hosting == 0) {
            let in_mask = all.iter().filter(|(_, n)| mask & (1 << n) != 0).count();
            if in_mask >= request as usize && count(mask) < min_affinity {
                min_affinity = count(mask);
            }
            // Reusable devices without topology are skipped: they neither exclude nor count.
            if reusable.iter().filter_map(node_of).any(|n| mask & (1 << n) == 0) {
                continue;
            }
            let matching = reusable.iter().filter_map(node_of).count()
                + available
                    .iter()
                    .filter(|d| node_of(d).is_some_and(|n| mask & (1 << n) != 0))
                    .count();
            if matching >= request as usize {
                hints.push(Hint::not_preferred(mask));
            }
        }
        prefer_narrowest(&mut hints, min_affinity);
        if hints.is_empty() {
            self.empty_with_devices.set(self.empty_with_devices.get() + 1);
        }
        Some(hints)
    }

    /// Topology Manager merge (§2.3–§2.6) with the literal `compareHints` fold.
    fn merge(&self, providers: Vec<ProviderHints>) -> (Hint, bool) {
        let default = (1u64 << self.m.zones) - 1;
        let mut lists: Vec<Vec<Hint>> = Vec::new();
        for p in providers {
            if p.is_empty() {
                lists.push(vec![Hint {
                    mask: None,
                    preferred: true,
                }]);
                continue;
            }
            for (_, h) in p {
                lists.push(match h {
                    None => vec![Hint {
                        mask: None,
                        preferred: true,
                    }],
                    Some(v) if v.is_empty() => vec![Hint {
                        mask: None,
                        preferred: false,
                    }],
                    Some(v) => v,
                });
            }
        }
        if self.m.policy == Policy::SingleNumaNode {
            for l in &mut lists {
                l.retain(|h| h.preferred && h.mask.is_none_or(|m| count(m) == 1));
            }
        }
        let b = lists
            .iter()
            .filter_map(|l| {
                l.iter()
                    .filter_map(|h| h.mask)
                    .reduce(|a, m| if narrower(m, a) { m } else { a })
            })
            .map(count)
            .max()
            .unwrap_or(0);
        let mut best: Option<Hint> = None;
        let mut perm = vec![0usize; lists.len()];
        // A list emptied by the single-numa-node filter leaves no permutation at all.
        let mut done = lists.iter().any(Vec::is_empty);
        while !done {
            let hints: Vec<Hint> = perm.iter().zip(&lists).map(|(&i, l)| l[i]).collect();
            let mut preferred = true;
            let mut first: Option<Mask> = None;
            let mut merged = default;
            for h in &hints {
                if let Some(m) = h.mask {
                    if first.is_some_and(|f| f != m) {
                        preferred = false;
                    }
                    first.get_or_insert(m);
                    merged &= m;
                }
                preferred &= h.preferred;
            }
            if merged != 0 {
                best = Some(compare_hints(
                    b,
                    best,
                    Hint {
                        mask: Some(merged),
                        preferred,
                    },
                ));
            }
            // Next permutation (odometer).
            let mut k = 0;
            loop {
                if k == lists.len() {
                    break;
                }
                perm[k] += 1;
                if perm[k] < lists[k].len() {
                    break;
                }
                perm[k] = 0;
                k += 1;
            }
            done = k == lists.len();
        }
        let mut best = best.unwrap_or(Hint {
            mask: Some(default),
            preferred: false,
        });
        if self.m.policy == Policy::SingleNumaNode && best.mask == Some(default) {
            best.mask = None;
        }
        let admit = match self.m.policy {
            Policy::None | Policy::BestEffort => true,
            Policy::Restricted | Policy::SingleNumaNode => best.preferred,
        };
        (best, admit)
    }

    /// `takeByTopology`, NUMA-packed, on this machine (a socket per NUMA node, one thread per
    /// core), taking `n` CPUs of `set`: whole NUMA nodes all of whose CPUs are in `set` while
    /// `n` covers one (`takeFullNUMANodes`: fewest free CPUs first, then the lowest node); then
    /// cores, i.e. CPUs, node by node with the fewest free CPUs in `set` first (`takeFullCores`
    /// over `sortAvailableCores`), lowest node and CPU id on ties.
    fn take_by_topology(&self, set: &BTreeSet<usize>, n: usize) -> Vec<usize> {
        let cpu_node = &self.m.cpu_node;
        let in_node = |z: u32| (0..cpu_node.len()).filter(move |c| cpu_node[*c] == z);
        let mut details = set.clone();
        let mut result = Vec::new();
        let free_in =
            |details: &BTreeSet<usize>, z: u32| details.iter().filter(|c| cpu_node[**c] == z).count();
        let mut nodes: Vec<u32> = (0..self.m.zones)
            .filter(|&z| in_node(z).count() > 0 && in_node(z).all(|c| details.contains(&c)))
            .collect();
        nodes.sort_by_key(|&z| (free_in(&details, z), z));
        for z in nodes {
            let size = in_node(z).count();
            if n - result.len() >= size {
                for c in in_node(z) {
                    details.remove(&c);
                    result.push(c);
                }
            }
        }
        let mut order: Vec<u32> = (0..self.m.zones).filter(|&z| free_in(&details, z) > 0).collect();
        order.sort_by_key(|&z| (free_in(&details, z), z));
        for z in order {
            for c in in_node(z).filter(|c| details.contains(c)) {
                if result.len() < n {
                    result.push(c);
                }
            }
        }
        result
    }

    /// CPU manager Allocate (§3.1): aligned CPUs of available ∪ reusable first, then the rest,
    /// each by `takeByTopology` (tie rule shared with the model: reusable ones first, lowest
    /// node then id); `cpusToReuse` updated.
    fn allocate_cpus(&mut self, n: u32, mask: Option<Mask>, init: bool) -> Result<(), &'static str> {
        if n == 0 {
            return Ok(());
        }
        let n = n as usize;
        let in_mask = |c: &usize| mask.is_some_and(|m| m & (1 << self.m.cpu_node[*c]) != 0);
        let key = |c: &usize| (self.m.cpu_node[*c], *c);
        let mut result: Vec<usize> = Vec::new();
        for aligned in [true, false] {
            let mut reusable: Vec<usize> = self
                .cpus_to_reuse
                .iter()
                .copied()
                .filter(|c| in_mask(c) == aligned && !result.contains(c))
                .collect();
            reusable.sort_by_key(key);
            let take = reusable.len().min(n - result.len());
            result.extend(reusable.into_iter().take(take));
            let available: BTreeSet<usize> = self
                .m
                .free_cpus
                .iter()
                .copied()
                .filter(|c| in_mask(c) == aligned)
                .collect();
            let want = (n - result.len()).min(available.len());
            result.extend(self.take_by_topology(&available, want));
        }
        if result.len() < n {
            return Err("UnexpectedAdmissionError");
        }
        for c in &result {
            self.m.free_cpus.remove(c);
        }
        if init {
            self.cpus_to_reuse.extend(result);
        } else {
            for c in &result {
                self.cpus_to_reuse.remove(c);
            }
        }
        Ok(())
    }

    /// Device manager Allocate (§3.3 allocation): reusable first, then aligned, then unaligned
    /// (tie rule: lowest node, then lowest ID); `devicesToReuse` updated.
    fn allocate_devices(&mut self, c: &Ctr, mask: Option<Mask>, init: bool) -> Result<(), &'static str> {
        let mut handed = BTreeMap::new();
        for (&r, &n) in &c.devices {
            if n == 0 || !self.m.registered(r) {
                continue;
            }
            // Aligned (a node in the mask), then unaligned, then without topology.
            let m = self.m.clone();
            let key = |d: &&String| match m.node_of(r, d) {
                Some(z) if mask.is_some_and(|m| m & (1 << z) != 0) => (0, z, (*d).clone()),
                Some(z) => (1, z, (*d).clone()),
                None => (2, 0, (*d).clone()),
            };
            let reusable = self.devices_to_reuse.entry(r).or_default().clone();
            let mut by_rank: Vec<&String> = reusable.iter().collect();
            by_rank.sort_by_key(key);
            let mut chosen: Vec<String> = by_rank.into_iter().take(n as usize).cloned().collect();
            let needed = n as usize - chosen.len();
            if needed > 0 {
                let available = &self.m.free_devices[r];
                if available.len() < needed {
                    return Err("UnexpectedAdmissionError");
                }
                if available.iter().filter(|d| m.node_of(r, d).is_some()).count() < needed {
                    self.unaligned_for_lack += 1;
                }
                let mut order: Vec<&String> = available.iter().collect();
                order.sort_by_key(key);
                chosen.extend(order.into_iter().take(needed).cloned());
            }
            let free = self.m.free_devices.get_mut(r).unwrap();
            for d in &chosen {
                free.remove(d);
            }
            let mut ids = chosen.clone();
            ids.sort();
            handed.insert(r, ids);
            let reuse = self.devices_to_reuse.entry(r).or_default();
            if init {
                reuse.extend(chosen);
            } else {
                for d in &chosen {
                    reuse.remove(d);
                }
            }
        }
        self.handed.push(handed);
        Ok(())
    }

    fn memory_request(&self, pod: &PodDef, c: &Ctr) -> u32 {
        if pod.guaranteed && !self.m.memory.is_empty() {
            c.mem
        } else {
            0
        }
    }

    /// Memory manager Static policy, hint generation (§3.2 steps 1–5); empty: no hint at all.
    fn memory_hints(&self, request: u32) -> Vec<Hint> {
        let nodes = |mask: Mask| (0..self.m.zones as usize).filter(move |i| mask & (1 << i) != 0);
        let mut min_affinity = self.m.zones;
        let mut hints = Vec::new();
        for mask in masks(self.m.zones) {
            if nodes(mask).map(|i| self.m.memory[i]).sum::<u32>() < request {
                continue;
            }
            min_affinity = min_affinity.min(count(mask));
            if count(mask) == 1 {
                let i = nodes(mask).next().unwrap();
                if count(self.mem_cells[i]) > 1 {
                    continue;
                }
            } else if nodes(mask).any(|i| self.mem_assignments[i] > 0 && self.mem_cells[i] != mask) {
                continue;
            }
            if nodes(mask).map(|i| self.mem_free[i]).sum::<u32>() < request {
                continue;
            }
            hints.push(Hint::not_preferred(mask));
        }
        prefer_narrowest(&mut hints, min_affinity);
        hints
    }

    /// `findBestHint`: preferred first, then the narrowest.
    fn find_best(hints: &[Hint]) -> Option<Hint> {
        let mut best: Option<Hint> = None;
        for h in hints {
            best = match best {
                None => Some(*h),
                Some(b) if h.preferred && !b.preferred => Some(*h),
                Some(b)
                    if h.preferred == b.preferred && narrower(h.mask.unwrap_or(0), b.mask.unwrap_or(0)) =>
                {
                    Some(*h)
                }
                keep => keep,
            };
        }
        best
    }

    /// Memory manager Allocate (§3.2): the default hint without a mask, the extension when the
    /// mask does not fit, then the greedy fill in ascending node order.
    fn allocate_memory(&mut self, request: u32, hint: Hint) -> Result<(), &'static str> {
        if request == 0 {
            return Ok(());
        }
        let fail = Err("UnexpectedAdmissionError");
        let mut best = hint;
        if best.mask.is_none() {
            let Some(d) = Self::find_best(&self.memory_hints(request)) else {
                return fail;
            };
            if !d.preferred && best.preferred {
                return fail;
            }
            best = d;
        }
        let free = |s: &Self, mask: Mask| {
            (0..s.m.zones as usize)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| s.mem_free[i])
                .sum::<u32>()
        };
        let mask = best.mask.unwrap();
        if free(self, mask) < request {
            let within: Vec<Hint> = self
                .memory_hints(request)
                .into_iter()
                .filter(|h| h.mask.is_some_and(|m| m & mask == mask))
                .collect();
            let Some(e) = Self::find_best(&within) else {
                return fail;
            };
            if !e.preferred && best.preferred {
                return fail;
            }
            best = e;
        }
        let mask = best.mask.unwrap();
        let mut left = request;
        for i in (0..self.m.zones as usize).filter(|i| mask & (1 << i) != 0) {
            let take = self.mem_free[i].min(left);
            self.mem_free[i] -= take;
            left -= take;
            self.mem_assignments[i] += 1;
            self.mem_cells[i] = mask;
        }
        Ok(())
    }

    fn memory_provider(&self, request: u32) -> ProviderHints {
        if request == 0 {
            return Vec::new();
        }
        let h = self.memory_hints(request);
        // No mask at all: the provider's map has no key, "no preference" (§3.2 quirk).
        if h.is_empty() {
            Vec::new()
        } else {
            vec![("memory".to_owned(), Some(h))]
        }
    }

    fn container_hints(&self, pod: &PodDef, c: &Ctr) -> Vec<ProviderHints> {
        // Only resources some device plugin registered are the device manager's.
        let devices: ProviderHints = c
            .devices
            .iter()
            .filter(|(r, n)| **n > 0 && self.m.registered(r))
            .map(|(&r, &n)| {
                let reusable = self.devices_to_reuse.get(r).cloned().unwrap_or_default();
                (r.to_owned(), self.device_hints(r, n, &reusable))
            })
            .collect();
        let cpu: ProviderHints = self
            .cpu_hints(Self::guaranteed_cpus(pod, c))
            .map(|h| vec![("cpu".to_owned(), Some(h))])
            .unwrap_or_default();
        vec![devices, cpu, self.memory_provider(self.memory_request(pod, c))]
    }

    /// The pod's admission: per-container NUMA masks (`None` = no mask), or the reject reason.
    fn admit(&mut self, pod: &PodDef) -> Admission {
        let ids = |m: Option<Mask>| m.map(|m| (0..64).filter(|i| m & (1 << i) != 0).collect::<Vec<u32>>());
        let containers: Vec<(Ctr, bool)> = pod
            .init
            .iter()
            .map(|c| (c.clone(), !c.sidecar))
            .chain(pod.app.iter().map(|c| (c.clone(), false)))
            .collect();
        let mut pod_mask = None;
        let scoped = self.m.pod_scope && self.m.policy != Policy::None;
        if scoped {
            // Pod-level requests (§2.7): max(largest init + sidecars before it, apps + sidecars).
            let level = |f: &dyn Fn(&Ctr) -> u32| {
                let (mut sidecars, mut init_max) = (0u32, 0u32);
                for c in &pod.init {
                    if c.sidecar {
                        sidecars += f(c);
                    } else {
                        init_max = init_max.max(sidecars + f(c));
                    }
                }
                init_max.max(sidecars + pod.app.iter().map(f).sum::<u32>())
            };
            let mut devices: ProviderHints = Vec::new();
            for r in RESOURCES {
                let n = level(&|c: &Ctr| c.devices.get(r).copied().unwrap_or(0));
                if n > 0 && self.m.registered(r) {
                    devices.push((r.to_owned(), self.device_hints(r, n, &BTreeSet::new())));
                }
            }
            let cpu: ProviderHints = self
                .cpu_hints(level(&|c: &Ctr| Self::guaranteed_cpus(pod, c)))
                .map(|h| vec![("cpu".to_owned(), Some(h))])
                .unwrap_or_default();
            let memory = self.memory_provider(level(&|c: &Ctr| self.memory_request(pod, c)));
            let (hint, admit) = self.merge(vec![devices, cpu, memory]);
            if !admit {
                return Err("TopologyAffinityError");
            }
            pod_mask = Some(hint);
        }
        let mut out = Vec::new();
        for (c, init) in containers {
            let hint = match pod_mask {
                Some(h) => h,
                None if self.m.policy == Policy::None => Hint {
                    mask: None,
                    preferred: false,
                },
                None => {
                    let (hint, admit) = self.merge(self.container_hints(pod, &c));
                    if !admit {
                        return Err("TopologyAffinityError");
                    }
                    hint
                }
            };
            let mask = hint.mask;
            self.allocate_cpus(Self::guaranteed_cpus(pod, &c), mask, init)?;
            self.allocate_memory(self.memory_request(pod, &c), hint)?;
            self.allocate_devices(&c, mask, init)?;
            out.push(ids(mask));
        }
        Ok((pod_mask.and_then(|h| ids(h.mask)), out))
    }
}

/// `compareHints` (§2.5 pairwise rule), as the kubelet folds merged hints.
fn compare_hints(b: u32, current: Option<Hint>, candidate: Hint) -> Hint {
    let Some(cur) = current else { return candidate };
    let (cm, km) = (cur.mask.unwrap_or(0), candidate.mask.unwrap_or(0));
    if !cur.preferred && candidate.preferred {
        return candidate;
    }
    if cur.preferred && !candidate.preferred {
        return cur;
    }
    if cur.preferred && candidate.preferred {
        return if narrower(km, cm) { candidate } else { cur };
    }
    if count(cm) > b {
        return if narrower(km, cm) { candidate } else { cur };
    }
    if count(cm) == b {
        return if count(km) == b && narrower(km, cm) {
            candidate
        } else {
            cur
        };
    }
    if count(km) > b {
        return cur;
    }
    if count(km) == b {
        return candidate;
    }
    if count(km) > count(cm) {
        return candidate;
    }
    if count(km) < count(cm) {
        return cur;
    }
    if narrower(km, cm) { candidate } else { cur }
}

fn random_machine(rng: &mut Rng, zones: u32) -> Machine {
    let mut cpu_node = Vec::new();
    let mut free_cpus = BTreeSet::new();
    let mut devices: BTreeMap<&'static str, Vec<(String, u32)>> = BTreeMap::new();
    let mut free_devices: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    for z in 0..zones {
        for _ in 0..(2 + rng.below(5)) {
            if !rng.one_in(3) {
                free_cpus.insert(cpu_node.len());
            }
            cpu_node.push(z);
        }
        for (k, r) in RESOURCES.iter().enumerate() {
            // NICs only on small machines: the literal merge is a full cartesian product.
            let most = if k == 1 && zones == 8 { 0 } else { 3 };
            for d in 0..rng.below(most + 1) {
                let id = format!("{}-{z}-{d}", &r[12..]);
                if !rng.one_in(3) {
                    free_devices.entry(r).or_default().insert(id.clone());
                }
                devices.entry(r).or_default().push((id, z));
            }
        }
    }
    // Sometimes devices without a NUMA node: next to aligned ones, or (where a resource got
    // none on any node) as all the resource has.
    let mut unaligned: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for r in RESOURCES {
        devices.entry(r).or_default();
        free_devices.entry(r).or_default();
        let list = unaligned.entry(r).or_default();
        if rng.one_in(2) {
            for d in 0..1 + rng.below(2) {
                let id = format!("{}-x-{d}", &r[12..]);
                if !rng.one_in(3) {
                    free_devices.entry(r).or_default().insert(id.clone());
                }
                list.push(id);
            }
        }
    }
    let policy = [
        Policy::None,
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ][rng.below(4) as usize];
    Machine {
        zones,
        cpu_node,
        free_cpus,
        devices,
        unaligned,
        free_devices,
        policy,
        pod_scope: rng.one_in(3),
        publish_ids: !rng.one_in(3),
        // Memory only below 8 zones: a third provider makes the literal product 255³ there.
        memory: if zones < 8 && rng.one_in(2) {
            (0..zones).map(|_| 2 + rng.below(7) as u32).collect()
        } else {
            Vec::new()
        },
    }
}

fn random_pod(rng: &mut Rng, zones: u32) -> PodDef {
    let guaranteed = !rng.one_in(4);
    let ctr = |name: String, sidecar: bool, rng: &mut Rng| {
        let mut devices = BTreeMap::new();
        if rng.one_in(2) {
            devices.insert(RESOURCES[0], 1 + rng.below(2) as u32);
        }
        if zones < 8 && rng.one_in(4) {
            devices.insert(RESOURCES[1], 1);
        }
        Ctr {
            name,
            sidecar,
            cpus: 1 + rng.below(5) as u32,
            half: rng.one_in(8),
            mem: 1 + rng.below(6) as u32,
            devices,
        }
    };
    let init = (0..rng.below(3))
        .map(|i| {
            let sidecar = rng.one_in(3);
            ctr(format!("init{i}"), sidecar, rng)
        })
        .collect();
    let app = (0..1 + rng.below(2))
        .map(|i| ctr(format!("app{i}"), false, rng))
        .collect();
    PodDef {
        guaranteed,
        init,
        app,
    }
}

fn nrt_of(m: &Machine) -> NodeResourceTopology {
    let policy = match m.policy {
        Policy::None => "none",
        Policy::BestEffort => "best-effort",
        Policy::Restricted => "restricted",
        Policy::SingleNumaNode => "single-numa-node",
    };
    let zones: Vec<Value> = (0..m.zones)
        .map(|z| {
            let cap = m.cpu_node.iter().filter(|n| **n == z).count();
            let free = m.free_cpus.iter().filter(|c| m.cpu_node[**c] == z).count();
            let mut resources = vec![json!({"name": "cpu", "capacity": cap.to_string(), "allocatable": cap.to_string(), "available": free.to_string()})];
            if let Some(gi) = m.memory.get(z as usize) {
                let q = format!("{gi}Gi");
                resources.push(json!({"name": "memory", "capacity": q, "allocatable": q, "available": q}));
            }
            let mut attributes = Vec::new();
            for r in RESOURCES {
                let all = m.devices[r].iter().filter(|(_, n)| *n == z).count();
                let free: Vec<&String> = m.devices[r]
                    .iter()
                    .filter(|(id, n)| *n == z && m.free_devices[r].contains(id))
                    .map(|(id, _)| id)
                    .collect();
                if all > 0 {
                    resources.push(json!({"name": r, "capacity": all.to_string(), "allocatable": all.to_string(), "available": free.len().to_string()}));
                    if m.publish_ids {
                        let list: Vec<&str> = free.iter().map(|s| s.as_str()).collect();
                        attributes.push(json!({"name": format!("numaplane.io/free-devices.{r}"), "value": list.join(",")}));
                    }
                }
            }
            json!({"name": format!("node-{z}"), "type": "Node", "resources": resources, "attributes": attributes})
        })
        .collect();
    let mut attributes = vec![
        json!({"name": "topologyManagerPolicy", "value": policy}),
        json!({"name": "topologyManagerScope", "value": if m.pod_scope { "pod" } else { "container" }}),
    ];
    for r in RESOURCES.iter().filter(|r| !m.unaligned[**r].is_empty()) {
        let free: Vec<&String> = m.unaligned[*r]
            .iter()
            .filter(|d| m.free_devices[*r].contains(*d))
            .collect();
        let ids = if m.publish_ids { free.clone() } else { Vec::new() };
        attributes.push(json!({
            "name": format!("numaplane.io/devices-without-numa.{r}"),
            "value": numaplane::nrt::join_devices_without_numa(free.len() as u64, ids),
        }));
    }
    serde_json::from_value(json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n"},
        "attributes": attributes,
        "zones": zones
    }))
    .unwrap()
}

fn pod_of(res: &mut Resources, p: &PodDef) -> PodSpec {
    let json_of = |c: &Ctr| {
        let cpu = if c.half {
            format!("{}500m", c.cpus)
        } else {
            c.cpus.to_string()
        };
        let mut req = json!({"cpu": cpu, "memory": format!("{}Gi", c.mem)});
        let mut lim = if p.guaranteed { req.clone() } else { json!({}) };
        for (r, n) in &c.devices {
            req[*r] = json!(n.to_string());
            lim[*r] = json!(n.to_string());
        }
        let mut v = json!({"name": c.name, "resources": {"requests": req, "limits": lim}});
        if c.sidecar {
            v["restartPolicy"] = json!("Always");
        }
        v
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "initContainers": p.init.iter().map(json_of).collect::<Vec<_>>(),
            "containers": p.app.iter().map(json_of).collect::<Vec<_>>()
        }
    }))
    .unwrap();
    PodSpec::from_pod(res, &pod).unwrap()
}

/// Both implementations agree on admission, the reject reason, and the NUMA affinity of every
/// container (container scope) or of the pod (pod scope); the filter's fast path agrees too.
#[test]
fn model_matches_a_literal_kubelet_on_random_pods_with_init_containers_sidecars_and_devices() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut admitted, mut rejected, mut reuse_decided, mut unaligned_used) = (0, 0, 0, 0);
    for round in 0..900 {
        let zones = [2, 4, 8][round % 3];
        let mut machine = random_machine(&mut rng, zones);
        let def = random_pod(&mut rng, zones);
        // The model does not follow init containers' memory (reuse by later containers is not
        // modelled): the memory manager is on only for pods without them.
        if def.init.iter().any(|c| !c.sidecar) {
            machine.memory.clear();
        }
        let mut res = Resources::default();
        let topo = NumaTopology::from_nrt(&mut res, &nrt_of(&machine)).unwrap();
        let pod = pod_of(&mut res, &def);
        let model = admission::predict(&res, &topo, &mut WorkingZones::with_device_ids(&topo), &pod);
        let fast = admission::admits(&res, &topo, &mut WorkingZones::from_topology(&topo), &pod);
        let mut m = machine.clone();
        let literal = Kubelet::new(&mut m).admit(&def);
        // Did the admitted pod get a device without a NUMA node?
        let gone_unaligned = RESOURCES.iter().any(|r| {
            machine.unaligned[*r]
                .iter()
                .any(|d| machine.free_devices[*r].contains(d) && !m.free_devices[*r].contains(d))
        });
        unaligned_used += usize::from(literal.is_ok() && gone_unaligned);
        // The same pod without its non-restartable init containers: does reuse decide anything?
        let without_init = PodDef {
            init: def.init.iter().filter(|c| c.sidecar).cloned().collect(),
            ..def.clone()
        };
        let mut m2 = machine.clone();
        let literal_without = Kubelet::new(&mut m2).admit(&without_init);
        let ctx = || format!("round {round}: {machine:?}\n{def:?}\nmodel {model:?}\nliteral {literal:?}");
        assert_eq!(fast, model.is_ok(), "admits vs predict: {}", ctx());
        match (&model, &literal) {
            (Ok(p), Ok((pod_mask, masks))) => {
                assert_same_affinity(&machine, p, (pod_mask, masks), &ctx());
                admitted += 1;
            }
            (Err(r), Err(reason)) => {
                assert_eq!(r.kubelet_reason, *reason, "{}", ctx());
                rejected += 1;
            }
            _ => panic!("verdicts differ: {}", ctx()),
        }
        if literal.is_ok() != literal_without.is_ok()
            || literal.as_ref().ok().map(|l| &l.1[l.1.len() - def.app.len()..])
                != literal_without
                    .as_ref()
                    .ok()
                    .map(|l| &l.1[l.1.len() - def.app.len()..])
        {
            reuse_decided += 1;
        }
    }
    assert!(
        admitted > 300 && rejected > 200 && reuse_decided > 50 && unaligned_used > 10,
        "admitted {admitted}, rejected {rejected}, decided by reuse {reuse_decided}, \
         given a device without NUMA node {unaligned_used}"
    );
}

/// Asserts that the model places as the literal kubelet admitted (`literal`: the pod's mask,
/// each container's): the pod's affinity under pod scope with a policy, else each container's.
fn assert_same_affinity(
    machine: &Machine,
    p: &numaplane_scheduler::admission::Placement,
    literal: (&Option<Vec<u32>>, &Vec<Option<Vec<u32>>>),
    ctx: &str,
) {
    let (pod_mask, masks) = literal;
    if machine.pod_scope && machine.policy != Policy::None {
        assert_eq!(&p.pod_numa_nodes, pod_mask, "{ctx}");
    } else {
        let got: Vec<Option<Vec<u32>>> = p.containers.iter().map(|c| c.numa_nodes.clone()).collect();
        assert_eq!(&got, masks, "{ctx}");
    }
}

/// A cluster index of one node `n` with room for anything at node level and `machine`'s NRT.
fn cluster_of(machine: &Machine) -> numaplane_scheduler::cluster::Cluster {
    let mut c = numaplane_scheduler::cluster::Cluster::new();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": "1000", "memory": "1000Gi", "pods": "110",
            "example.com/gpu": "1000", "example.com/nic": "1000"}}
    }))
    .unwrap();
    c.apply_node(&node).unwrap();
    c.apply_nrt(&nrt_of(machine)).unwrap();
    c
}

/// The next pod after an assumed one: on random 2- and 4-zone machines under the Static memory
/// manager, a first pod is scheduled through the cluster index and its placement assumed (no
/// NRT shows it yet); the second pod's prediction on the node as the index then sees it must
/// equal the literal kubelet admitting both in a row. The memory manager's groups the first
/// pod forms (and its single-node allocations on nodes that held no memory) are known to the
/// second decision only through the assumption.
#[test]
fn the_pod_after_an_assumed_one_matches_a_literal_kubelet() {
    use numaplane_scheduler::cluster::{Config, TopologyState};
    let mut rng = Rng(0x9e6c_63d0_676a_9a99);
    let (mut compared, mut grouped) = (0, 0);
    for round in 0..1500 {
        let zones = [2, 4][round % 2];
        let mut machine = random_machine(&mut rng, zones);
        if machine.memory.is_empty() {
            machine.memory = (0..zones).map(|_| 2 + rng.below(7) as u32).collect();
        }
        let no_init = |mut d: PodDef| {
            d.init.retain(|c| c.sidecar);
            d
        };
        let first = no_init(random_pod(&mut rng, zones));
        let second = no_init(random_pod(&mut rng, zones));
        let mut c = cluster_of(&machine);
        let cfg = Config::default();
        let p1 = pod_of(&mut c.res, &first);
        let d1 = c.schedule(&cfg, &p1, false);
        let mut m = machine.clone();
        let mut kubelet = Kubelet::new(&mut m);
        let literal1 = kubelet.admit(&first);
        assert_eq!(d1.node.is_some(), literal1.is_ok(), "round {round}: first pod");
        if literal1.is_err() {
            continue;
        }
        c.assume(&p1, &d1);
        grouped += usize::from(kubelet.mem_cells.iter().any(|cells| cells.count_ones() > 1));
        kubelet.cpus_to_reuse.clear();
        kubelet.devices_to_reuse.clear();
        let literal2 = kubelet.admit(&second);
        let p2 = pod_of(&mut c.res, &second);
        let TopologyState::Valid(topo) = c.topology("n") else {
            panic!("round {round}: no topology")
        };
        let model = admission::predict(&c.res, topo, &mut WorkingZones::with_device_ids(topo), &p2);
        let ctx = || {
            format!(
                "round {round}: {machine:?}\nfirst {first:?} -> {literal1:?}\nsecond {second:?}\n\
                 model {model:?}\nliteral {literal2:?}\ngroups {:?}",
                topo.memory_groups
            )
        };
        match (&model, &literal2) {
            (Ok(p), Ok((pod_mask, masks))) => {
                assert_same_affinity(&machine, p, (pod_mask, masks), &ctx());
            }
            (Err(r), Err(reason)) => assert_eq!(r.kubelet_reason, *reason, "{}", ctx()),
            _ => panic!("verdicts differ: {}", ctx()),
        }
        compared += 1;
    }
    assert!(
        compared > 400 && grouped > 50,
        "compared {compared}, first pod formed a group {grouped}"
    );
}

/// A machine whose device resources have NUMA-affine devices, most of them held, next to free
/// devices without a NUMA node: the class where a container's device hint list comes out empty
/// although the kubelet still has a device to hand out.
fn machine_with_devices_without_numa(rng: &mut Rng, zones: u32, policy: Policy, pod_scope: bool) -> Machine {
    let mut m = random_machine(rng, zones);
    m.policy = policy;
    m.pod_scope = pod_scope;
    // The Static memory manager on half the 2-zone machines (a third provider on 4 zones makes
    // the literal product too large).
    m.memory = if zones == 2 && rng.one_in(2) {
        (0..zones).map(|_| 2 + rng.below(7) as u32).collect()
    } else {
        Vec::new()
    };
    for r in RESOURCES {
        if r == RESOURCES[1] && zones > 2 {
            continue;
        }
        let devices: Vec<(String, u32)> = (0..zones)
            .flat_map(|z| (0..1 + rng.below(2)).map(move |d| (format!("{}-{z}-{d}", &r[12..]), z)))
            .collect();
        let unaligned: Vec<String> = (0..1 + rng.below(2))
            .map(|d| format!("{}-x-{d}", &r[12..]))
            .collect();
        let mut free = BTreeSet::new();
        for (id, _) in &devices {
            if rng.one_in(4) {
                free.insert(id.clone());
            }
        }
        for id in &unaligned {
            if !rng.one_in(4) {
                free.insert(id.clone());
            }
        }
        m.devices.insert(r, devices);
        m.unaligned.insert(r, unaligned);
        m.free_devices.insert(r, free);
    }
    m
}

/// Devices without a NUMA node, under every policy and in both scopes: three pods in a row on
/// one node, each scheduled through the cluster index (placed and assumed, so the next one
/// sees what the kubelet handed out before any NRT shows it) and admitted by the literal
/// kubelet. Admission, reject reason, NUMA affinity and the device IDs handed out must agree;
/// every policy and scope must meet the empty-hint-list case (only devices without a NUMA node
/// could serve a container) often enough to count as covered.
#[test]
fn devices_without_numa_node_match_a_literal_kubelet_under_every_policy_and_scope() {
    use numaplane_scheduler::cluster::{Config, TopologyState};
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    for policy in [
        Policy::None,
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ] {
        for pod_scope in [false, true] {
            let (mut met, mut admitted_met, mut rejected_met, mut admitted, mut rejected) = (0, 0, 0, 0, 0);
            for round in 0..150 {
                let zones = [2, 4][round % 2];
                let machine = machine_with_devices_without_numa(&mut rng, zones, policy, pod_scope);
                let mut c = cluster_of(&machine);
                let cfg = Config::default();
                let mut m = machine.clone();
                let mut kubelet = Kubelet::new(&mut m);
                let mut history = String::new();
                for step in 0..3 {
                    let mut def = random_pod(&mut rng, zones);
                    def.app[0].devices.entry(RESOURCES[0]).or_insert(1);
                    if !machine.memory.is_empty() {
                        // The model does not follow init containers' memory.
                        def.init.retain(|c| c.sidecar);
                    }
                    let spec = pod_of(&mut c.res, &def);
                    let mut spec = spec;
                    spec.name = format!("p{step}");
                    spec.uid = Some(format!("uid-{step}"));
                    let TopologyState::Valid(topo) = c.topology("n") else {
                        panic!("no topology")
                    };
                    let model =
                        admission::predict(&c.res, topo, &mut WorkingZones::with_device_ids(topo), &spec);
                    let before = (kubelet.empty_with_devices.get(), kubelet.unaligned_for_lack);
                    kubelet.handed.clear();
                    kubelet.cpus_to_reuse.clear();
                    kubelet.devices_to_reuse.clear();
                    let snapshot = (
                        kubelet.m.clone(),
                        kubelet.mem_free.clone(),
                        kubelet.mem_assignments.clone(),
                        kubelet.mem_cells.clone(),
                    );
                    let literal = kubelet.admit(&def);
                    if literal.is_err() {
                        // A rejected pod is not active: the managers drop what its earlier
                        // containers got (stale state removed at the next admission).
                        *kubelet.m = snapshot.0;
                        kubelet.mem_free = snapshot.1;
                        kubelet.mem_assignments = snapshot.2;
                        kubelet.mem_cells = snapshot.3;
                    }
                    // The class: a container (or the pod) whose device hint list came out empty
                    // although devices were free, or (policy none, no hints) that was handed a
                    // device without a NUMA node for lack of others.
                    let hit =
                        kubelet.empty_with_devices.get() > before.0 || kubelet.unaligned_for_lack > before.1;
                    met += usize::from(hit);
                    let ctx = || {
                        format!(
                            "{policy:?} pod scope {pod_scope}, round {round} step {step}: {machine:?}\n\
                             {def:?}\nmodel {model:?}\nliteral {literal:?}, handed {:?}\nbefore: {history}",
                            kubelet.handed
                        )
                    };
                    let decision = c.schedule(&cfg, &spec, false);
                    assert_eq!(decision.node.is_some(), literal.is_ok(), "scheduled: {}", ctx());
                    match (&model, &literal) {
                        (Ok(p), Ok((pod_mask, masks))) => {
                            if pod_scope && policy != Policy::None {
                                assert_eq!(&p.pod_numa_nodes, pod_mask, "{}", ctx());
                            } else {
                                let got: Vec<Option<Vec<u32>>> =
                                    p.containers.iter().map(|c| c.numa_nodes.clone()).collect();
                                assert_eq!(&got, masks, "{}", ctx());
                            }
                            if machine.publish_ids {
                                for (i, handed) in kubelet.handed.iter().enumerate() {
                                    for (r, ids) in handed.iter().filter(|(_, ids)| !ids.is_empty()) {
                                        let mut got =
                                            p.containers[i].devices.get(*r).cloned().unwrap_or_default();
                                        got.sort();
                                        assert_eq!(&got, ids, "container {i} {r}: {}", ctx());
                                    }
                                }
                            }
                            admitted += 1;
                            admitted_met += usize::from(hit);
                            c.assume(&spec, &decision);
                        }
                        (Err(r), Err(reason)) => {
                            assert_eq!(r.kubelet_reason, *reason, "{}", ctx());
                            rejected += 1;
                            rejected_met += usize::from(hit && *reason == "TopologyAffinityError");
                        }
                        _ => panic!("verdicts differ: {}", ctx()),
                    }
                    use std::fmt::Write as _;
                    let _ = write!(
                        history,
                        "\n  step {step}: {def:?}\n    literal {literal:?} handed {:?}\n    model {:?}",
                        kubelet.handed, decision.placement
                    );
                }
            }
            // The class is met under every policy and scope: best-effort and none admit it
            // (and hand out the device without a NUMA node), restricted and single-numa-node
            // reject it with TopologyAffinityError.
            let ctx = format!(
                "{policy:?} pod scope {pod_scope}: class met {met} (admitted {admitted_met}, \
                 rejected {rejected_met}), admitted {admitted}, rejected {rejected}"
            );
            assert!(met > 20 && admitted > 30 && rejected > 30, "{ctx}");
            if matches!(policy, Policy::None | Policy::BestEffort) {
                assert!(admitted_met > 10, "{ctx}");
            } else {
                assert!(rejected_met > 10, "{ctx}");
            }
            eprintln!("{ctx}");
        }
    }
}
