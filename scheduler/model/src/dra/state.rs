//! The DRA objects the scheduler knows (DeviceClasses, ResourceSlices, ResourceClaims) and
//! what allocated claims hold; resolves a pod's claims and allocates them for one node.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{AllocationResult, DeviceClass, ResourceClaim},
};

use super::{
    AllocatedState, DraError, SelectorCache, World, allocator,
    slice::{Device, ResourceSlice},
};

/// One entry of a pod's `spec.resourceClaims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The name in the pod (`spec.resourceClaims[].name`).
    pub name: String,
    /// The ResourceClaim's name: `resourceClaimName`, or for a template the claim named in
    /// `status.resourceClaimStatuses`; `None` while that claim is not created yet.
    pub claim: Option<String>,
    /// Whether it comes from a ResourceClaimTemplate.
    pub from_template: bool,
}

/// The pod's `spec.resourceClaims`, resolved to claim names.
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim> {
    let statuses: HashMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| match c.resource_claim_name.as_deref() {
            Some(n) if !n.is_empty() => PodClaim {
                name: c.name.clone(),
                claim: Some(n.to_owned()),
                from_template: false,
            },
            _ => PodClaim {
                name: c.name.clone(),
                claim: statuses
                    .get(c.name.as_str())
                    .copied()
                    .flatten()
                    .map(str::to_owned),
                from_template: true,
            },
        })
        .collect()
}

/// One entry of a container's `resources.claims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerClaim {
    /// The pod claim's name (`spec.resourceClaims[].name`).
    pub name: String,
    /// One request of the claim; `None`: every request.
    pub request: Option<String>,
}

/// Why a pod's claims cannot be considered on any node (kube-scheduler's PreFilter verdicts).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PodClaimError {
    /// A template claim whose ResourceClaim is not created yet.
    #[error("pod claim {name}: waiting for its ResourceClaim to be created from the template")]
    NotCreated {
        /// Pod claim name.
        name: String,
    },
    /// A ResourceClaim that does not exist.
    #[error("pod claim {name}: resourceclaim \"{claim}\" not found")]
    NotFound {
        /// Pod claim name.
        name: String,
        /// `namespace/name`.
        claim: String,
    },
}

/// A pod's claims as one node decision sees them.
#[derive(Debug)]
pub struct ResolvedClaims<'a> {
    /// Every claim, in pod order: pod claim name and the object.
    pub all: Vec<(&'a str, &'a ResourceClaim)>,
    /// Indexes into `all` of the claims still to allocate (each once).
    pub pending: Vec<usize>,
    /// A digest of what the allocation reads of the pod, its claims and the config, set by a
    /// decision that caches what searches find; `None`: nothing is cached.
    pub digest: Option<u64>,
    /// A digest of what the pod's CPU prediction on a node reads of it (its shape and its
    /// container names), set with `digest`: the key of the predictions kept per node.
    pub pod_digest: Option<u64>,
}

/// A pod claim and the allocation it has or would get.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClaimAllocation {
    /// The ResourceClaim's name.
    pub name: String,
    /// The AllocationResult (the existing one for a claim allocated before).
    pub allocation: AllocationResult,
    /// Its devices' NUMA nodes next to its containers' predicted ones, on a node with a
    /// NodeResourceTopology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<super::verdict::ClaimNuma>,
}

/// The DRA part of the cluster.
#[derive(Clone, Debug, Default)]
pub struct DraState {
    classes: HashMap<String, DeviceClass>,
    slices: Vec<ResourceSlice>,
    /// Slice indexes by `spec.nodeName`.
    by_node: HashMap<String, Vec<usize>>,
    /// Slices without a node name (node selector, all nodes, per device).
    shared: Vec<usize>,
    /// Claims by `namespace/name`.
    claims: BTreeMap<String, ResourceClaim>,
    allocated: AllocatedState,
    selectors: SelectorCache,
    enabled: bool,
    /// Allocations the live scheduler decided and is writing (kube-scheduler's in-flight
    /// allocations), by claim key: their devices are in use, and the claim reads as
    /// allocated, until the claim watch shows an allocation or every pod using it failed.
    in_flight: HashMap<String, InFlight>,
    /// Which nodes' devices changed: cached verdicts of the others stay valid.
    changes: super::changes::Changes,
}

/// An allocation decided and not yet seen written.
#[derive(Clone, Debug)]
struct InFlight {
    allocation: AllocationResult,
    /// Keys of the pods whose bindings use it and have not ended.
    pods: std::collections::BTreeSet<String>,
    /// Whether the claim as last seen from the API has an allocation.
    api_allocated: bool,
    /// The resourceVersion of the claim as last seen from the API.
    seen_rv: u64,
    /// The highest resourceVersion a successful binding wrote: the entry ends once the watch
    /// has shown that version (numeric comparison, as kube-scheduler's assume cache makes).
    written_rv: Option<u64>,
}

/// A claim's `metadata.resourceVersion` as a number (0 when absent or not a number), the
/// comparison kube-scheduler's assume cache makes.
pub fn resource_version(claim: &ResourceClaim) -> u64 {
    claim
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl DraState {
    /// Turns the DynamicResources filter on: pods with claims get them allocated (or are
    /// rejected when they cannot be).
    pub fn enable(&mut self) {
        self.enabled = true;
        self.changes.note(None);
    }

    /// Notes that what an allocation reads of node `name` (its labels) changed.
    pub fn node_changed(&mut self, name: &str) {
        self.changes.note(Some(name));
    }

    /// What changed, by node.
    pub fn changes(&self) -> &super::changes::Changes {
        &self.changes
    }

    /// Whether the filter is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether nothing DRA is known (then no pod's decision consults it).
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty() && self.slices.is_empty() && self.claims.is_empty()
    }

    /// Adds or replaces a DeviceClass.
    pub fn apply_class(&mut self, class: DeviceClass) {
        if let Some(name) = class.metadata.name.clone() {
            self.classes.insert(name, class);
            self.changes.note(None);
        }
    }

    /// Replaces every ResourceSlice.
    pub fn set_slices(&mut self, slices: Vec<ResourceSlice>) {
        self.changes.note(None);
        self.index_slices(slices);
    }

    fn index_slices(&mut self, slices: Vec<ResourceSlice>) {
        self.by_node.clear();
        self.shared.clear();
        for (i, s) in slices.iter().enumerate() {
            match s.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
                Some(n) => self.by_node.entry(n.to_owned()).or_default().push(i),
                None => self.shared.push(i),
            }
        }
        self.slices = slices;
        self.selectors.devices_changed();
    }

    /// Adds or replaces a ResourceClaim (as the API shows it); an allocated one holds its
    /// devices. An allocation in flight for it stays on it until the API shows one.
    pub fn apply_claim(&mut self, mut claim: ResourceClaim) {
        let key = allocator::claim_key(&claim);
        let written = claim.status.as_ref().is_some_and(|s| s.allocation.is_some());
        let rv = resource_version(&claim);
        if let Some(f) = self.in_flight.get_mut(&key) {
            f.api_allocated = written;
            f.seen_rv = rv;
            if f.pods.is_empty() && f.written_rv.is_some_and(|w| rv >= w) {
                // Every binding ended and the watch shows what they wrote: the API's state
                // is the whole truth again.
                self.in_flight.remove(&key);
            } else if !written {
                claim.status.get_or_insert_with(Default::default).allocation = Some(f.allocation.clone());
            }
        }
        self.put_claim(claim);
    }

    /// Stores a claim, counting what its allocation holds instead of the old one's.
    fn put_claim(&mut self, mut claim: ResourceClaim) {
        let ns = claim
            .metadata
            .namespace
            .get_or_insert_with(|| "default".to_owned())
            .clone();
        let key = format!("{ns}/{}", claim.metadata.name.as_deref().unwrap_or(""));
        let old = self.claims.remove(&key);
        let old_allocation = old.as_ref().and_then(|c| c.status.as_ref()?.allocation.as_ref());
        let new_allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref());
        if old_allocation != new_allocation {
            if let Some(a) = old_allocation {
                self.allocated.remove(a);
                self.changes.note_allocation(a);
            }
            if let Some(a) = new_allocation {
                self.allocated.add(a);
                if old_allocation.is_none() {
                    self.changes.note_taken(a);
                } else {
                    self.changes.note_allocation(a);
                }
            }
        }
        self.claims.insert(key, claim);
    }

    /// Records `allocation` on the claim `namespace/name` (what the scheduler would write).
    pub fn commit(&mut self, namespace: &str, name: &str, allocation: AllocationResult) {
        let Some(mut claim) = self.claims.get(&format!("{namespace}/{name}")).cloned() else {
            return;
        };
        claim.status.get_or_insert_with(Default::default).allocation = Some(allocation);
        self.put_claim(claim);
    }

    /// The pod's claims in `namespace`; an error when one cannot be found.
    pub fn resolve<'a>(
        &'a self,
        namespace: &str,
        claims: &'a [PodClaim],
    ) -> Result<ResolvedClaims<'a>, PodClaimError> {
        let mut out = ResolvedClaims {
            all: Vec::new(),
            pending: Vec::new(),
            digest: None,
            pod_digest: None,
        };
        let mut seen: Vec<&str> = Vec::new();
        for c in claims {
            let Some(name) = c.claim.as_deref() else {
                return Err(PodClaimError::NotCreated { name: c.name.clone() });
            };
            let key = format!("{namespace}/{name}");
            let Some(claim) = self.claims.get(&key) else {
                return Err(PodClaimError::NotFound {
                    name: c.name.clone(),
                    claim: key,
                });
            };
            let allocated = claim.status.as_ref().is_some_and(|s| s.allocation.is_some());
            if !allocated && !seen.contains(&name) {
                seen.push(name);
                out.pending.push(out.all.len());
            }
            out.all.push((c.name.as_str(), claim));
        }
        Ok(out)
    }

    /// Whether an allocated claim holds device `id`.
    pub fn holds(&self, id: &super::DeviceId) -> bool {
        self.allocated.holds(id)
    }

    /// The device `driver/pool/device` of the slices node `name` reaches.
    pub fn device_on(&self, name: &str, driver: &str, pool: &str, device: &str) -> Option<&Device> {
        self.by_node
            .get(name)
            .into_iter()
            .flatten()
            .chain(&self.shared)
            .filter_map(|&i| self.slices.get(i))
            .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)
    }

    /// The devices in use once the claims `freed` (keys) no longer hold theirs: a preemption's
    /// victims give back the claims reserved only for them. `None`: nothing is freed.
    pub fn in_use_freeing(&self, freed: &[String]) -> Option<AllocatedState> {
        if freed.is_empty() {
            return None;
        }
        let mut allocated = self.allocated.clone();
        for key in freed {
            if let Some(a) = self
                .claims
                .get(key)
                .and_then(|c| c.status.as_ref()?.allocation.as_ref())
            {
                allocated.remove(a);
            }
        }
        Some(allocated)
    }

    /// Allocates the pending claims on the node `name` with `labels`. Claims allocated before
    /// must be usable there (their node selector). `Ok(Err(_))`: not on this node, with why.
    /// `in_use`: the devices in use (`None`: the cluster's; [`Self::in_use_freeing`] for
    /// another); `filter`: devices the search may take (`None`: upstream's search).
    pub fn allocate_in_use(
        &self,
        claims: &ResolvedClaims<'_>,
        name: &str,
        labels: &BTreeMap<String, String>,
        share_ids: &dyn Fn(usize, usize) -> String,
        in_use: Option<&AllocatedState>,
        filter: Option<&allocator::DeviceFilter<'_>>,
    ) -> Result<Result<Vec<ClaimAllocation>, String>, DraError> {
        self.allocate_with(
            claims,
            name,
            labels,
            share_ids,
            in_use.unwrap_or(&self.allocated),
            filter,
        )
    }

    /// The claims a bound pod's eviction would free: those (in `namespace`) reserved for it
    /// and for no pod outside `leaving` (names of pods of that namespace).
    pub fn freed_by(&self, namespace: &str, leaving: &[&str]) -> Vec<String> {
        let prefix = format!("{namespace}/");
        self.claims
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(_, c)| {
                let reserved = c.status.as_ref().and_then(|s| s.reserved_for.as_ref());
                reserved.is_some_and(|r| {
                    !r.is_empty()
                        && r.iter()
                            .all(|e| e.resource == "pods" && leaving.contains(&e.name.as_str()))
                })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn allocate_with(
        &self,
        claims: &ResolvedClaims<'_>,
        name: &str,
        labels: &BTreeMap<String, String>,
        share_ids: &dyn Fn(usize, usize) -> String,
        allocated: &AllocatedState,
        filter: Option<&allocator::DeviceFilter<'_>>,
    ) -> Result<Result<Vec<ClaimAllocation>, String>, DraError> {
        let node = super::pools::NodeRef { name, labels };
        for (_, claim) in &claims.all {
            if let Some(sel) = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.node_selector.as_ref())
                && !crate::nodeaffinity::affinity_matches(sel, name, labels)
            {
                return Ok(Err(format!(
                    "claim {}: allocated to devices that this node cannot reach",
                    allocator::claim_key(claim)
                )));
            }
        }
        let pending: Vec<&ResourceClaim> = claims.pending.iter().map(|&i| claims.all[i].1).collect();
        let candidates: Vec<&ResourceSlice> = self
            .by_node
            .get(name)
            .into_iter()
            .flatten()
            .chain(&self.shared)
            .filter_map(|&i| self.slices.get(i))
            .collect();
        let world = World {
            classes: &self.classes,
            all_slices: &self.slices,
            allocated,
            selectors: &self.selectors,
        };
        let Some(results) =
            allocator::allocate_filtered(&world, &candidates, &node, &pending, share_ids, filter)?
        else {
            return Ok(Err("cannot allocate all claims".to_owned()));
        };
        let mut fresh = results.into_iter();
        let mut out = Vec::with_capacity(claims.all.len());
        for (i, (_, claim)) in claims.all.iter().enumerate() {
            let name = claim.metadata.name.clone().unwrap_or_default();
            let existing = claim.status.as_ref().and_then(|s| s.allocation.clone());
            let allocation = match existing {
                Some(a) => a,
                None if claims.pending.contains(&i) => fresh.next().unwrap_or_default(),
                // A claim named twice by the pod: allocated once, with its first entry.
                None => match out.iter().find(|c: &&ClaimAllocation| c.name == name) {
                    Some(c) => c.allocation.clone(),
                    None => AllocationResult::default(),
                },
            };
            out.push(ClaimAllocation {
                name,
                allocation,
                numa: None,
            });
        }
        Ok(Ok(out))
    }
}

/// The live scheduler's side: objects from watches (apply, delete, reset after a relist) and
/// the allocations in flight.
impl DraState {
    /// Removes a DeviceClass.
    pub fn delete_class(&mut self, name: &str) {
        self.classes.remove(name);
        self.changes.note(None);
    }

    /// Replaces every DeviceClass.
    pub fn reset_classes(&mut self, all: Vec<DeviceClass>) {
        self.classes.clear();
        self.changes.note(None);
        for c in all {
            self.apply_class(c);
        }
    }

    /// Adds or replaces a ResourceSlice.
    pub fn apply_slice(&mut self, slice: ResourceSlice) {
        let mut slices = std::mem::take(&mut self.slices);
        self.changes.note_slice(&slice);
        match slices.iter_mut().find(|s| s.metadata.name == slice.metadata.name) {
            Some(s) => {
                self.changes.note_slice(s);
                *s = slice;
            }
            None => slices.push(slice),
        }
        self.index_slices(slices);
    }

    /// Removes a ResourceSlice.
    pub fn delete_slice(&mut self, name: &str) {
        let mut slices = std::mem::take(&mut self.slices);
        for s in slices.iter().filter(|s| s.metadata.name.as_deref() == Some(name)) {
            self.changes.note_slice(s);
        }
        slices.retain(|s| s.metadata.name.as_deref() != Some(name));
        self.index_slices(slices);
    }

    /// Removes a ResourceClaim and any allocation in flight for it.
    pub fn delete_claim(&mut self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.in_flight.remove(&key);
        if let Some(old) = self.claims.remove(&key)
            && let Some(a) = old.status.as_ref().and_then(|s| s.allocation.as_ref())
        {
            self.allocated.remove(a);
            self.changes.note_allocation(a);
        }
    }

    /// Replaces every ResourceClaim after a relist: allocations in flight stay on the claims
    /// still listed without one.
    pub fn reset_claims(&mut self, all: Vec<ResourceClaim>) {
        self.claims.clear();
        self.allocated = AllocatedState::default();
        self.changes.note(None);
        let listed: std::collections::HashSet<String> = all.iter().map(allocator::claim_key).collect();
        self.in_flight.retain(|k, _| listed.contains(k));
        for c in all {
            self.apply_claim(c);
        }
    }

    /// A ResourceClaim by namespace and name, as the scheduler sees it (with an allocation
    /// in flight).
    pub fn claim(&self, namespace: &str, name: &str) -> Option<&ResourceClaim> {
        self.claims.get(&format!("{namespace}/{name}"))
    }

    /// Whether the claim's allocation is in flight (decided, not yet seen written).
    pub fn in_flight(&self, namespace: &str, name: &str) -> bool {
        self.in_flight.contains_key(&format!("{namespace}/{name}"))
    }

    /// Holds the allocations the binding of pod `pod` (in `namespace`) will write: their
    /// devices are in use for every later decision, and a claim shared with a later pod reads
    /// as allocated, until the claim watch shows the allocation written or [`Self::release`].
    pub fn assume(&mut self, namespace: &str, pod: &str, claims: &[ClaimAllocation]) {
        for c in claims {
            let key = format!("{namespace}/{}", c.name);
            if let Some(f) = self.in_flight.get_mut(&key) {
                f.pods.insert(pod.to_owned());
                continue;
            }
            let Some(claim) = self.claims.get(&key) else {
                continue;
            };
            if claim.status.as_ref().is_some_and(|s| s.allocation.is_some()) {
                continue;
            }
            let mut claim = claim.clone();
            let seen_rv = resource_version(&claim);
            claim.status.get_or_insert_with(Default::default).allocation = Some(c.allocation.clone());
            self.put_claim(claim);
            self.in_flight.insert(
                key,
                InFlight {
                    allocation: c.allocation.clone(),
                    pods: [pod.to_owned()].into(),
                    api_allocated: false,
                    seen_rv,
                    written_rv: None,
                },
            );
        }
    }

    /// The binding of pod `pod` failed: its allocations in flight that no other binding uses
    /// and that no successful binding wrote are dropped, and their devices are free again
    /// (unless the claim watch shows them written).
    pub fn release(&mut self, namespace: &str, pod: &str, claims: &[String]) {
        for name in claims {
            self.end_binding(&format!("{namespace}/{name}"), pod, None);
        }
    }

    /// The binding of pod `pod` succeeded, having written the claims `(name, resourceVersion)`:
    /// their allocations stay in flight until the claim watch shows those versions.
    pub fn written(&mut self, namespace: &str, pod: &str, claims: &[(String, u64)]) {
        for (name, rv) in claims {
            self.end_binding(&format!("{namespace}/{name}"), pod, Some(*rv));
        }
    }

    fn end_binding(&mut self, key: &str, pod: &str, written_rv: Option<u64>) {
        let Some(f) = self.in_flight.get_mut(key) else {
            return;
        };
        f.pods.remove(pod);
        if let Some(rv) = written_rv {
            f.written_rv = Some(f.written_rv.map_or(rv, |w| w.max(rv)));
        }
        let done = f.pods.is_empty() && f.written_rv.is_none_or(|w| f.seen_rv >= w);
        if !done {
            return;
        }
        let api_allocated = f.api_allocated;
        self.in_flight.remove(key);
        if !api_allocated && let Some(mut claim) = self.claims.get(key).cloned() {
            if let Some(s) = claim.status.as_mut() {
                s.allocation = None;
            }
            self.put_claim(claim);
        }
    }
}
