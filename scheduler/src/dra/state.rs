//! The DRA objects the scheduler knows (DeviceClasses, ResourceSlices, ResourceClaims) and
//! what allocated claims hold; resolves a pod's claims and allocates them for one node.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice},
};

use super::{AllocatedState, DraError, SelectorCache, World, allocator};

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
}

/// A pod claim and the allocation it has or would get.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClaimAllocation {
    /// The ResourceClaim's name.
    pub name: String,
    /// The AllocationResult (the existing one for a claim allocated before).
    pub allocation: AllocationResult,
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
}

impl DraState {
    /// Turns the DynamicResources filter on: pods with claims get them allocated (or are
    /// rejected when they cannot be).
    pub fn enable(&mut self) {
        self.enabled = true;
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
        }
    }

    /// Replaces every ResourceSlice.
    pub fn set_slices(&mut self, slices: Vec<ResourceSlice>) {
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

    /// Adds or replaces a ResourceClaim; an allocated one holds its devices.
    pub fn apply_claim(&mut self, mut claim: ResourceClaim) {
        let ns = claim
            .metadata
            .namespace
            .get_or_insert_with(|| "default".to_owned())
            .clone();
        let key = format!("{ns}/{}", claim.metadata.name.as_deref().unwrap_or(""));
        if let Some(old) = self.claims.remove(&key)
            && let Some(a) = old.status.as_ref().and_then(|s| s.allocation.as_ref())
        {
            self.allocated.remove(a);
        }
        if let Some(a) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
            self.allocated.add(a);
        }
        self.claims.insert(key, claim);
    }

    /// Records `allocation` on the claim `namespace/name` (what the scheduler would write).
    pub fn commit(&mut self, namespace: &str, name: &str, allocation: AllocationResult) {
        let Some(mut claim) = self.claims.get(&format!("{namespace}/{name}")).cloned() else {
            return;
        };
        claim.status.get_or_insert_with(Default::default).allocation = Some(allocation);
        self.apply_claim(claim);
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

    /// Allocates the pending claims on the node `name` with `labels`. Claims allocated before
    /// must be usable there (their node selector). `Ok(None)`: not on this node, with why.
    pub fn allocate_on(
        &self,
        claims: &ResolvedClaims<'_>,
        name: &str,
        labels: &BTreeMap<String, String>,
        share_ids: &dyn Fn(usize, usize) -> String,
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
            allocated: &self.allocated,
            selectors: &self.selectors,
        };
        let Some(results) = allocator::allocate(&world, &candidates, &node, &pending, share_ids)? else {
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
            out.push(ClaimAllocation { name, allocation });
        }
        Ok(Ok(out))
    }
}
