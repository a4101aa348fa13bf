//! The structured allocator: one call allocates all claims of a pod on one node, or says why
//! not. It searches as kube-scheduler v1.36's ("incubating") allocator does with default
//! features: claims in order, requests in order, devices in pool order (driver, pool name,
//! pools with binding conditions last), slices by name, devices in slice order; the first
//! complete solution wins, found by backtracking.
//!
//! Size (~1,280 lines of code): one module on purpose. The search (`Alloc` and its methods) is
//! one backtracking state (chosen devices, consumed counters and capacity, the undo log) that
//! every step reads and writes, and it is kept in the order of upstream's
//! `allocator_incubating.go` so the two can be read side by side. What stands apart is already
//! apart: capacity arithmetic (`capacity`), pool assembly (`pools`), selectors (`selectors`, `cel`).

use std::collections::{BTreeMap, BTreeSet};

// The search hashes device IDs and request keys in its innermost loop: foldhash, not SipHash
// (nothing here is keyed by input an attacker picks to collide).
use foldhash::{HashMap, HashMapExt as _, HashSet};

use k8s_openapi::api::{
    core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm},
    resource::v1::{
        AllocationResult, CapacityRequirements, DeviceAllocationConfiguration, DeviceAllocationResult,
        DeviceAttribute, DeviceClass, DeviceRequestAllocationResult, DeviceSelector, DeviceTaint,
        DeviceToleration, ResourceClaim,
    },
};
use numaplane::quantity::Quantity;

use super::{
    DraError,
    capacity::{self, Consumed},
    cel::DeviceView,
    pools::{self, NodeRef, Pool},
    selectors::{SelectorCache, VerdictError},
    slice::{Device, DeviceMap, ResourceSlice},
};

/// Most devices one claim's allocation may hold (`AllocationResultsMaxSize`).
pub const MAX_RESULTS: usize = 32;

/// A device: `driver/pool/device`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// What other claims hold already.
#[derive(Clone, Debug, Default)]
pub struct AllocatedState {
    /// Devices allocated exclusively, by driver, then pool: a search looks its pools up once
    /// and each device by name.
    devices: HashMap<String, HashMap<String, HashSet<String>>>,
    /// Devices with at least one shared allocation (`shareID`).
    pub shared: HashSet<DeviceId>,
    /// Capacity consumed on shareable devices, by fully-qualified capacity name.
    pub capacity: HashMap<DeviceId, Consumed>,
}

impl AllocatedState {
    /// Counts what `allocation` holds (admin access holds nothing).
    pub fn add(&mut self, allocation: &AllocationResult) {
        self.apply(allocation, true);
    }

    /// Stops counting what `allocation` holds.
    pub fn remove(&mut self, allocation: &AllocationResult) {
        self.apply(allocation, false);
    }

    fn apply(&mut self, allocation: &AllocationResult, add: bool) {
        for r in allocation.devices.iter().flat_map(|d| d.results.iter().flatten()) {
            if r.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            };
            if r.share_id.is_none() {
                if add {
                    self.devices
                        .entry(id.driver)
                        .or_default()
                        .entry(id.pool)
                        .or_default()
                        .insert(id.device);
                } else if let Some(pools) = self.devices.get_mut(&id.driver)
                    && let Some(held) = pools.get_mut(&id.pool)
                {
                    held.remove(&id.device);
                    if held.is_empty() {
                        pools.remove(&id.pool);
                    }
                }
                continue;
            }
            let consumed: Consumed = r
                .consumed_capacity
                .iter()
                .flatten()
                .filter_map(|(k, v)| Some((capacity::qualify(k, &r.driver), Quantity::parse(&v.0).ok()?)))
                .collect();
            if add {
                self.shared.insert(id.clone());
                if !consumed.is_empty() {
                    capacity::add_into(self.capacity.entry(id).or_default(), &consumed);
                }
            } else if let Some(c) = self.capacity.get_mut(&id) {
                capacity::sub_from(c, &consumed);
                if c.is_empty() {
                    self.capacity.remove(&id);
                    self.shared.remove(&id);
                }
            }
        }
    }

    /// The devices of a pool allocated exclusively.
    fn exclusive(&self, driver: &str, pool: &str) -> Option<&HashSet<String>> {
        self.devices.get(driver)?.get(pool)
    }

    /// Whether a claim holds `id` (alone or shared).
    pub fn holds(&self, id: &DeviceId) -> bool {
        self.exclusive(&id.driver, &id.pool)
            .is_some_and(|d| d.contains(&id.device))
            || self.shared.contains(id)
            || self.capacity.contains_key(id)
    }
}

/// Everything an allocation reads besides the node and the claims.
pub struct World<'a> {
    /// DeviceClasses by name.
    pub classes: &'a std::collections::HashMap<String, DeviceClass>,
    /// Every ResourceSlice in the cluster (pool completeness is judged over all of them).
    pub all_slices: &'a [ResourceSlice],
    /// What other claims hold.
    pub allocated: &'a AllocatedState,
    /// Compiled selectors and their verdicts.
    pub selectors: &'a SelectorCache,
}

/// Allocates `claims` together for `node`, from `candidates` (the slices of the node and the
/// cluster-wide ones). `Ok(None)`: no solution on this node (kube-scheduler's "cannot
/// allocate all claims"). `share_ids` names a new shared allocation (claim index, result
/// index).
pub fn allocate(
    world: &World<'_>,
    candidates: &[&ResourceSlice],
    node: &NodeRef<'_>,
    claims: &[&ResourceClaim],
    share_ids: &dyn Fn(usize, usize) -> String,
) -> Result<Option<Vec<AllocationResult>>, DraError> {
    allocate_filtered(world, candidates, node, claims, share_ids, None)
}

/// Which devices an `ExactCount` request may take besides upstream's rules: called with the
/// claim index, the request's name (the parent's for a subrequest), the driver and the device.
/// The search order stays upstream's; a device the filter refuses is skipped as a device in
/// use would be. `allocationMode: All` requests are not filtered (they take every device).
pub type DeviceFilter<'f> = dyn Fn(usize, &str, &str, &Device) -> bool + 'f;

/// [`allocate`] with a [`DeviceFilter`] (`None`: exactly [`allocate`]).
pub fn allocate_filtered(
    world: &World<'_>,
    candidates: &[&ResourceSlice],
    node: &NodeRef<'_>,
    claims: &[&ResourceClaim],
    share_ids: &dyn Fn(usize, usize) -> String,
    filter: Option<&DeviceFilter<'_>>,
) -> Result<Option<Vec<AllocationResult>>, DraError> {
    let pools = pools::gather(candidates.iter().copied(), node, world.all_slices);
    let node_name = node.name.to_owned();
    let mut a = Alloc {
        world,
        node,
        claims,
        filter,
        pools: &pools,
        requests: HashMap::new(),
        constraints: Vec::new(),
        matches: HashMap::new(),
        held: pools
            .iter()
            .map(|p| world.allocated.exclusive(&p.id.driver, &p.id.pool))
            .collect(),
        allocating: HashMap::new(),
        allocating_capacity: HashMap::new(),
        consumed_counters: HashMap::new(),
        available_counters: HashMap::new(),
        results: vec![Vec::new(); claims.len()],
    };
    a.prepare()?;
    match a.allocate_one(Idx::default(), false, Loc::default()) {
        Ok(true) => {}
        Ok(false) | Err(Stop::MaxSize) => {
            if let Some(p) = pools.iter().find(|p| p.invalid.is_some()) {
                return Err(DraError::InvalidPools {
                    pool: p.id.to_string(),
                    reason: p.invalid.clone().unwrap_or_default(),
                });
            }
            return Ok(None);
        }
        Err(Stop::Error(e)) => return Err(e),
    }
    let mut out = Vec::with_capacity(claims.len());
    for (ci, claim) in claims.iter().enumerate() {
        out.push(a.result_for(ci, claim, &node_name, share_ids)?);
    }
    Ok(Some(out))
}

/// `namespace/name` as klog prints an object (`name` without a namespace).
pub fn claim_key(claim: &ResourceClaim) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or("");
    match claim.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// One request or subrequest, resolved.
struct Request<'a> {
    name: &'a str,
    parent: Option<&'a str>,
    class: &'a DeviceClass,
    all: bool,
    count: usize,
    admin: bool,
    selectors: &'a [DeviceSelector],
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
    all_devices: Vec<Loc>,
    selected_sub: usize,
}

impl Request<'_> {
    fn full_name(&self) -> String {
        match self.parent {
            Some(p) => format!("{p}/{}", self.name),
            None => self.name.to_owned(),
        }
    }
}

/// (claim, request, subrequest).
type ReqKey = (usize, usize, usize);

#[derive(Clone, Copy, Debug, Default)]
struct Idx {
    claim: usize,
    request: usize,
    sub: usize,
    device: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Loc {
    pool: usize,
    slice: usize,
    device: usize,
}

enum Stop {
    /// The claim's results would pass [`MAX_RESULTS`].
    MaxSize,
    Error(DraError),
}

impl From<DraError> for Stop {
    fn from(e: DraError) -> Self {
        Stop::Error(e)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Version(String),
    Other,
}

fn value_of(a: &DeviceAttribute) -> Value {
    if let Some(s) = &a.string {
        Value::Str(s.clone())
    } else if let Some(i) = a.int {
        Value::Int(i)
    } else if let Some(b) = a.bool {
        Value::Bool(b)
    } else if let Some(v) = &a.version {
        Value::Version(v.clone())
    } else {
        Value::Other
    }
}

/// The attribute `name` (`domain/id`) of a device of `driver`: by its full name, or by its id
/// when the domain is the driver's.
fn lookup_attribute<'d>(device: &'d Device, driver: &str, name: &str) -> Option<&'d DeviceAttribute> {
    let attrs = device.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(a);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id)
}

enum Constraint {
    Match {
        requests: HashSet<String>,
        attribute: String,
        value: Option<Value>,
        count: usize,
    },
    Distinct {
        requests: HashSet<String>,
        attribute: String,
        values: Vec<Value>,
    },
}

fn applies(requests: &HashSet<String>, base: &str, sub: Option<&str>) -> bool {
    if requests.is_empty() {
        return true;
    }
    match sub {
        None => requests.contains(base),
        Some(s) => requests.contains(base) || requests.contains(&format!("{base}/{s}")),
    }
}

impl Constraint {
    fn add(&mut self, base: &str, sub: Option<&str>, device: &Device, driver: &str) -> bool {
        match self {
            Constraint::Match {
                requests,
                attribute,
                value,
                count,
            } => {
                if !applies(requests, base, sub) {
                    return true;
                }
                let Some(attr) = lookup_attribute(device, driver, attribute) else {
                    return false;
                };
                let v = value_of(attr);
                if *count == 0 {
                    *value = Some(v);
                    *count = 1;
                    return true;
                }
                if v == Value::Other || value.as_ref() != Some(&v) {
                    return false;
                }
                *count += 1;
                true
            }
            Constraint::Distinct {
                requests,
                attribute,
                values,
            } => {
                if !applies(requests, base, sub) {
                    return true;
                }
                let Some(attr) = lookup_attribute(device, driver, attribute) else {
                    return false;
                };
                let v = value_of(attr);
                for existing in values.iter() {
                    let same_type = std::mem::discriminant(existing) == std::mem::discriminant(&v);
                    if *existing == Value::Other {
                        return false;
                    }
                    if !same_type {
                        // Values of different types never collide.
                        break;
                    }
                    if *existing == v {
                        return false;
                    }
                }
                values.push(v);
                true
            }
        }
    }

    fn remove(&mut self, base: &str, sub: Option<&str>) {
        match self {
            Constraint::Match { requests, count, .. } => {
                if applies(requests, base, sub) {
                    *count = count.saturating_sub(1);
                }
            }
            Constraint::Distinct { requests, values, .. } => {
                if applies(requests, base, sub) {
                    values.pop();
                }
            }
        }
    }
}

/// One device chosen for a request.
#[derive(Clone)]
struct Chosen {
    request: String,
    parent: Option<String>,
    loc: Loc,
    id: DeviceId,
    consumed: Option<BTreeMap<String, Quantity>>,
    shared: bool,
    admin: bool,
}

/// What undoes one tentative allocation.
struct Undo {
    claim: usize,
    base: String,
    sub: Option<String>,
    id: DeviceId,
    loc: Loc,
    multi: bool,
    consumed: Option<Consumed>,
    results_before: usize,
}

type Counters = HashMap<String, HashMap<String, Quantity>>;

struct Alloc<'w, 'a> {
    world: &'w World<'a>,
    node: &'w NodeRef<'w>,
    claims: &'w [&'w ResourceClaim],
    filter: Option<&'w DeviceFilter<'w>>,
    pools: &'w [Pool<'a>],
    requests: HashMap<ReqKey, Request<'w>>,
    constraints: Vec<Vec<Constraint>>,
    matches: HashMap<(Loc, ReqKey), bool>,
    /// Per pool (as `pools`), its devices other claims hold exclusively.
    held: Vec<Option<&'w HashSet<String>>>,
    /// The claims this search gave each device to.
    allocating: HashMap<Loc, BTreeSet<usize>>,
    allocating_capacity: HashMap<DeviceId, Consumed>,
    consumed_counters: HashMap<usize, Counters>,
    available_counters: HashMap<usize, Counters>,
    results: Vec<Vec<Chosen>>,
}

fn taint_blocks(taint: &DeviceTaint, tolerations: &[DeviceToleration]) -> bool {
    if taint.effect != "NoSchedule" && taint.effect != "NoExecute" {
        return false;
    }
    !tolerations.iter().any(|t| {
        if t.effect
            .as_deref()
            .is_some_and(|e| !e.is_empty() && e != taint.effect)
        {
            return false;
        }
        if t.key.as_deref().is_some_and(|k| !k.is_empty() && k != taint.key) {
            return false;
        }
        match t.operator.as_deref().unwrap_or("") {
            "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
            "Exists" => true,
            _ => false,
        }
    })
}

impl<'w, 'a> Alloc<'w, 'a>
where
    'a: 'w,
{
    fn device(&self, loc: Loc) -> Option<(&'w ResourceSlice, &'w Device)> {
        let pools: &'w [Pool<'a>] = self.pools;
        let slice: &'w ResourceSlice = pools.get(loc.pool)?.slices.get(loc.slice)?;
        let device = slice.spec.devices.as_ref()?.get(loc.device)?;
        Some((slice, device))
    }

    fn id_of(&self, loc: Loc) -> Option<DeviceId> {
        let (slice, device) = self.device(loc)?;
        Some(DeviceId {
            driver: slice.spec.driver.clone(),
            pool: slice.spec.pool.name.clone(),
            device: device.name.clone(),
        })
    }

    /// Resolves every request, checks the claims' limits and sets up the constraints.
    fn prepare(&mut self) -> Result<(), DraError> {
        let claims: &'w [&'w ResourceClaim] = self.claims;
        for (ci, claim) in claims.iter().enumerate() {
            let key = claim_key(claim);
            let mut min_devices = 0usize;
            for (ri, request) in claim
                .spec
                .iter()
                .flat_map(|s| s.devices.iter())
                .flat_map(|d| d.requests.iter().flatten())
                .enumerate()
            {
                let subs = request.first_available.as_deref().unwrap_or_default();
                if !subs.is_empty() {
                    let mut min = usize::MAX;
                    for (si, sub) in subs.iter().enumerate() {
                        if let Some(i) = sub.selectors.iter().flatten().position(|s| s.cel.is_none()) {
                            return Err(DraError::EmptySelector {
                                claim: key,
                                request: sub.name.clone(),
                                index: i,
                            });
                        }
                        let r = Request {
                            name: &sub.name,
                            parent: Some(&request.name),
                            class: self.class(&key, &request.name, &sub.device_class_name)?,
                            all: false,
                            count: 0,
                            admin: false,
                            selectors: sub.selectors.as_deref().unwrap_or_default(),
                            tolerations: sub.tolerations.as_deref().unwrap_or_default(),
                            capacity: sub.capacity.as_ref(),
                            all_devices: Vec::new(),
                            selected_sub: 0,
                        };
                        let r =
                            self.validate(&key, (ci, ri, si), r, sub.allocation_mode.as_deref(), sub.count)?;
                        min = min.min(r.count);
                        self.requests.insert((ci, ri, si), r);
                    }
                    min_devices = min_devices.saturating_add(min);
                    continue;
                }
                let Some(exactly) = request.exactly.as_ref() else {
                    return Err(DraError::MissingClass {
                        claim: key,
                        request: request.name.clone(),
                    });
                };
                let selectors = exactly.selectors.as_deref().unwrap_or_default();
                if let Some(i) = selectors.iter().position(|s| s.cel.is_none()) {
                    return Err(DraError::EmptySelector {
                        claim: key,
                        request: request.name.clone(),
                        index: i,
                    });
                }
                let r = Request {
                    name: &request.name,
                    parent: None,
                    class: self.class(&key, &request.name, &exactly.device_class_name)?,
                    all: false,
                    count: 0,
                    admin: exactly.admin_access == Some(true),
                    selectors,
                    tolerations: exactly.tolerations.as_deref().unwrap_or_default(),
                    capacity: exactly.capacity.as_ref(),
                    all_devices: Vec::new(),
                    selected_sub: 0,
                };
                let r = self.validate(
                    &key,
                    (ci, ri, 0),
                    r,
                    exactly.allocation_mode.as_deref(),
                    exactly.count,
                )?;
                min_devices = min_devices.saturating_add(r.count);
                self.requests.insert((ci, ri, 0), r);
            }
            if min_devices > MAX_RESULTS {
                return Err(DraError::TooManyDevices {
                    claim: key,
                    count: min_devices,
                });
            }
            let mut constraints = Vec::new();
            for (i, c) in claim
                .spec
                .iter()
                .flat_map(|s| s.devices.iter())
                .flat_map(|d| d.constraints.iter().flatten())
                .enumerate()
            {
                let requests: HashSet<String> = c.requests.iter().flatten().cloned().collect();
                if let Some(attribute) = c.match_attribute.clone() {
                    constraints.push(Constraint::Match {
                        requests,
                        attribute,
                        value: None,
                        count: 0,
                    });
                } else if let Some(attribute) = c.distinct_attribute.clone() {
                    constraints.push(Constraint::Distinct {
                        requests,
                        attribute,
                        values: Vec::new(),
                    });
                } else {
                    return Err(DraError::EmptyConstraint { claim: key, index: i });
                }
            }
            self.constraints.push(constraints);
        }
        Ok(())
    }

    fn class(&self, claim: &str, request: &str, name: &str) -> Result<&'a DeviceClass, DraError> {
        if name.is_empty() {
            return Err(DraError::MissingClass {
                claim: claim.to_owned(),
                request: request.to_owned(),
            });
        }
        self.world
            .classes
            .get(name)
            .ok_or_else(|| DraError::UnknownClass {
                claim: claim.to_owned(),
                request: request.to_owned(),
                class: name.to_owned(),
            })
    }

    fn validate(
        &mut self,
        claim: &str,
        key: ReqKey,
        mut r: Request<'w>,
        mode: Option<&str>,
        count: Option<i64>,
    ) -> Result<Request<'w>, DraError> {
        if let Some(i) = r.selectors.iter().position(|s| s.cel.is_none()) {
            return Err(DraError::EmptySelector {
                claim: claim.to_owned(),
                request: r.name.to_owned(),
                index: i,
            });
        }
        match mode.unwrap_or("") {
            "" | "ExactCount" => {
                let n = count.unwrap_or(1);
                r.count = usize::try_from(n).map_err(|_| DraError::BadCount {
                    claim: claim.to_owned(),
                    request: r.name.to_owned(),
                    count: n,
                })?;
            }
            "All" => {
                r.all = true;
                let pools: &'w [Pool<'a>] = self.pools;
                for (pi, pool) in pools.iter().enumerate() {
                    if pool.incomplete {
                        return Err(DraError::AllDevicesIncompletePool {
                            claim: claim.to_owned(),
                            request: r.name.to_owned(),
                            pool: pool.id.to_string(),
                        });
                    }
                    if pool.invalid.is_some() {
                        return Err(DraError::AllDevicesInvalidPool {
                            claim: claim.to_owned(),
                            request: r.name.to_owned(),
                            pool: pool.id.to_string(),
                        });
                    }
                    for (si, slice) in pool.slices.iter().enumerate() {
                        for di in 0..slice.spec.devices.as_ref().map_or(0, Vec::len) {
                            let loc = Loc {
                                pool: pi,
                                slice: si,
                                device: di,
                            };
                            if !self.selectable(key, &r, loc)? {
                                continue;
                            }
                            if self.capacity_fits(&r, loc).is_some() {
                                r.all_devices.push(loc);
                            }
                        }
                    }
                }
                r.count = r.all_devices.len();
            }
            other => {
                return Err(DraError::CountMode {
                    claim: claim.to_owned(),
                    request: r.name.to_owned(),
                    mode: other.to_owned(),
                });
            }
        }
        Ok(r)
    }

    /// Whether the device at `loc` passes the class's and the request's selectors and, for
    /// per-device node selection, reaches the node.
    fn selectable(&mut self, key: ReqKey, r: &Request<'_>, loc: Loc) -> Result<bool, DraError> {
        if let Some(&m) = self.matches.get(&(loc, key)) {
            return Ok(m);
        }
        let Some((slice, device)) = self.device(loc) else {
            return Ok(false);
        };
        let id = format!("{}/{}/{}", slice.spec.driver, slice.spec.pool.name, device.name);
        let view = DeviceView {
            driver: &slice.spec.driver,
            id: &id,
            attributes: device.attributes.as_ref(),
            capacity: device.capacity.as_ref(),
            allow_multiple_allocations: device.allow_multiple_allocations,
        };
        let class_owner = || format!("class {}", r.class.metadata.name.as_deref().unwrap_or(""));
        let claim_owner = || format!("claim {}", claim_key(self.claims[key.0]));
        let mut ok = self.selectors_match(
            r.class
                .spec
                .as_ref()
                .and_then(|s| s.selectors.as_deref())
                .unwrap_or_default(),
            &view,
            &class_owner,
        )?;
        if ok {
            ok = self.selectors_match(r.selectors, &view, &claim_owner)?;
        }
        if ok && slice.spec.per_device_node_selection == Some(true) {
            ok = pools::node_matches(
                self.node,
                device.node_name.as_deref(),
                device.all_nodes == Some(true),
                device.node_selector.as_ref(),
            );
        }
        self.matches.insert((loc, key), ok);
        Ok(ok)
    }

    fn selectors_match(
        &self,
        selectors: &[DeviceSelector],
        view: &DeviceView<'_>,
        owner: &dyn Fn() -> String,
    ) -> Result<bool, DraError> {
        for (i, s) in selectors.iter().enumerate() {
            let Some(cel) = s.cel.as_ref() else {
                return Err(DraError::EmptyClassSelector {
                    owner: owner(),
                    index: i,
                });
            };
            match self.world.selectors.verdict(&cel.expression, view) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(VerdictError::Compile(source)) => {
                    return Err(DraError::SelectorCompile {
                        owner: owner(),
                        index: i,
                        source: Box::new(source),
                    });
                }
                Err(VerdictError::Evaluate(source)) => {
                    return Err(DraError::SelectorEvaluate {
                        owner: owner(),
                        index: i,
                        device: view.id.to_owned(),
                        source: Box::new(source),
                    });
                }
            }
        }
        Ok(true)
    }

    /// What the request consumes of the device at `loc` if it fits (`None`: skip the device).
    fn capacity_fits(&self, r: &Request<'_>, loc: Loc) -> Option<capacity::Fit> {
        let (slice, device) = self.device(loc)?;
        if device.capacity.as_ref().is_none_or(DeviceMap::is_empty) {
            // Nothing consumed on it: no need for its ID.
            return capacity::fit(r.capacity, None, &slice.spec.driver, None, None)
                .ok()
                .flatten();
        }
        let id = self.id_of(loc)?;
        capacity::fit(
            r.capacity,
            device.capacity.as_ref(),
            &slice.spec.driver,
            self.world.allocated.capacity.get(&id),
            self.allocating_capacity.get(&id),
        )
        .ok()
        .flatten()
    }

    fn in_use(&self, loc: Loc) -> bool {
        let held = || {
            let held = self.held.get(loc.pool).copied().flatten();
            held.is_some_and(|h| self.device(loc).is_some_and(|(_, d)| h.contains(&d.name)))
        };
        self.allocating.get(&loc).is_some_and(|s| !s.is_empty()) || held()
    }

    fn in_use_by(&self, loc: Loc, claim: usize) -> bool {
        self.allocating.get(&loc).is_some_and(|s| s.contains(&claim))
    }

    fn allocate_one(&mut self, r: Idx, in_sub: bool, start: Loc) -> Result<bool, Stop> {
        if r.claim >= self.claims.len() {
            return Ok(true);
        }
        let claim = self.claims[r.claim];
        let num_requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref())
            .map_or(0, Vec::len);
        if r.request >= num_requests {
            return match self.allocate_one(
                Idx {
                    claim: r.claim + 1,
                    ..Idx::default()
                },
                false,
                Loc::default(),
            ) {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        }
        let key = (r.claim, r.request, r.sub);
        let Some(req) = self.requests.get(&key) else {
            return Ok(false);
        };
        if !in_sub && req.parent.is_some() {
            let mut all_exceeded = true;
            let mut sub = 0;
            loop {
                if !self.requests.contains_key(&(r.claim, r.request, sub)) {
                    return if all_exceeded {
                        Err(Stop::MaxSize)
                    } else {
                        Ok(false)
                    };
                }
                let attempt = self.allocate_one(Idx { sub, ..r }, true, Loc::default());
                match attempt {
                    Err(Stop::MaxSize) => {
                        sub += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                    Ok(true) => {
                        if let Some(first) = self.requests.get_mut(&(r.claim, r.request, 0)) {
                            first.selected_sub = sub;
                        }
                        return Ok(true);
                    }
                    Ok(false) => {
                        all_exceeded = false;
                        sub += 1;
                    }
                }
            }
        }
        let all = req.all;
        let count = req.count;
        let admin = req.admin;
        if all && req.all_devices.is_empty() {
            return Ok(false);
        }
        if r.device >= count {
            return self.allocate_one(
                Idx {
                    claim: r.claim,
                    request: r.request + 1,
                    ..Idx::default()
                },
                false,
                Loc::default(),
            );
        }
        if self.results[r.claim].len() + count - r.device > MAX_RESULTS {
            return Err(Stop::MaxSize);
        }
        if all {
            let loc = req.all_devices[r.device];
            let Some(undo) = self.allocate_device(r, loc, true)? else {
                return Ok(false);
            };
            let done = self.allocate_one(
                Idx {
                    device: r.device + 1,
                    ..r
                },
                in_sub,
                Loc::default(),
            );
            if !matches!(done, Ok(true)) {
                self.undo(undo);
            }
            return done;
        }
        let pools: &'w [Pool<'a>] = self.pools;
        for (pi, pool) in pools.iter().enumerate().skip(start.pool) {
            if pool.incomplete || pool.invalid.is_some() {
                continue;
            }
            let slice_start = if pi == start.pool { start.slice } else { 0 };
            for (si, slice) in pool.slices.iter().enumerate().skip(slice_start) {
                let device_start = if pi == start.pool && si == start.slice {
                    start.device
                } else {
                    0
                };
                let n = slice.spec.devices.as_ref().map_or(0, Vec::len);
                for di in device_start..n {
                    let loc = Loc {
                        pool: pi,
                        slice: si,
                        device: di,
                    };
                    if admin && self.in_use_by(loc, r.claim) {
                        continue;
                    }
                    if !admin && self.in_use(loc) {
                        continue;
                    }
                    // The filter first: it is cheap, and a device it refuses is skipped
                    // whatever its selectors say (an error in a filtered search is not the
                    // pod's anyway).
                    if let (Some(filter), Some((slice, device)), Some(req)) =
                        (self.filter, self.device(loc), self.requests.get(&key))
                        && !filter(
                            r.claim,
                            req.parent.unwrap_or(req.name),
                            &slice.spec.driver,
                            device,
                        )
                    {
                        continue;
                    }
                    let selectable = {
                        let req = self.requests.get(&key).ok_or(Stop::MaxSize)?;
                        // The request is borrowed from `self.requests` while `selectable`
                        // writes only `self.matches`; a cheap shallow copy keeps them apart.
                        let shadow = Request {
                            all_devices: Vec::new(),
                            ..*req
                        };
                        self.selectable(key, &shadow, loc)?
                    };
                    if !selectable {
                        continue;
                    }
                    {
                        let req = self.requests.get(&key).ok_or(Stop::MaxSize)?;
                        if self.capacity_fits(req, loc).is_none() {
                            continue;
                        }
                    }
                    let Some(undo) = self.allocate_device(r, loc, false)? else {
                        continue;
                    };
                    let done = self.allocate_one(
                        Idx {
                            device: r.device + 1,
                            ..r
                        },
                        in_sub,
                        Loc {
                            pool: pi,
                            slice: si,
                            device: di + 1,
                        },
                    );
                    if let Ok(true) = done {
                        return Ok(true);
                    }
                    self.undo(undo);
                    done?;
                }
            }
        }
        Ok(false)
    }

    /// Takes the device at `loc` for the request at `r` if it is free, its counters suffice,
    /// its taints are tolerated and the claim's constraints hold.
    fn allocate_device(&mut self, r: Idx, loc: Loc, must: bool) -> Result<Option<Undo>, Stop> {
        let key = (r.claim, r.request, r.sub);
        let Some((_, device)) = self.device(loc) else {
            return Ok(None);
        };
        let Some(id) = self.id_of(loc) else {
            return Ok(None);
        };
        let Some(req) = self.requests.get(&key) else {
            return Ok(None);
        };
        let (admin, tolerations, request_name, parent): (
            bool,
            &'w [DeviceToleration],
            &'w str,
            Option<&'w str>,
        ) = (req.admin, req.tolerations, req.name, req.parent);
        let multi = device.allow_multiple_allocations == Some(true);
        if !multi && admin && self.in_use_by(loc, r.claim) {
            return Ok(None);
        }
        if !admin && self.in_use(loc) {
            return Ok(None);
        }
        let consumes = device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty());
        let capacity_in_use =
            self.world.allocated.capacity.contains_key(&id) || self.allocating_capacity.contains_key(&id);
        let skip_counters = multi && capacity_in_use;
        if !skip_counters && consumes && !self.take_counters(loc, device) {
            return Ok(None);
        }
        let (base, sub) = match parent {
            Some(p) => (p.to_owned(), Some(request_name.to_owned())),
            None => (request_name.to_owned(), None),
        };
        if device
            .taints
            .iter()
            .flatten()
            .any(|t| taint_blocks(t, tolerations))
        {
            return Ok(None);
        }
        let request_name = request_name.to_owned();
        let parent = parent.map(str::to_owned);
        let driver = id.driver.clone();
        let constraints = &mut self.constraints[r.claim];
        for i in 0..constraints.len() {
            if !constraints[i].add(&base, sub.as_deref(), device, &driver) {
                if must {
                    return Err(Stop::Error(DraError::ConstraintForAll {
                        claim: claim_key(self.claims[r.claim]),
                        request: request_name,
                        device: id.to_string(),
                    }));
                }
                for c in constraints.iter_mut().take(i) {
                    c.remove(&base, sub.as_deref());
                }
                return Ok(None);
            }
        }
        let entry = self.allocating.entry(loc).or_default();
        if !multi {
            entry.insert(r.claim);
        }
        let req = self.requests.get(&key).ok_or(Stop::MaxSize)?;
        let Some((consumed, by_key)) = self.capacity_fits(req, loc) else {
            return Ok(None);
        };
        let (consumed, by_key) = if multi {
            (Some(consumed), Some(by_key))
        } else {
            (None, None)
        };
        if let Some(c) = &consumed {
            capacity::add_into(self.allocating_capacity.entry(id.clone()).or_default(), c);
        }
        let results_before = self.results[r.claim].len();
        self.results[r.claim].push(Chosen {
            request: request_name,
            parent,
            loc,
            id: id.clone(),
            consumed: by_key.filter(|c| !c.is_empty()),
            shared: multi,
            admin,
        });
        Ok(Some(Undo {
            claim: r.claim,
            base,
            sub,
            id,
            loc,
            multi,
            consumed,
            results_before,
        }))
    }

    fn undo(&mut self, u: Undo) {
        for c in &mut self.constraints[u.claim] {
            c.remove(&u.base, u.sub.as_deref());
        }
        if let Some(s) = self.allocating.get_mut(&u.loc) {
            s.remove(&u.claim);
        }
        if u.multi {
            if let (Some(c), Some(a)) = (&u.consumed, self.allocating_capacity.get_mut(&u.id)) {
                capacity::sub_from(a, c);
                if a.is_empty() {
                    self.allocating_capacity.remove(&u.id);
                }
            }
        } else if let Some((_, device)) = self.device(u.loc)
            && device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
        {
            self.release_counters(u.loc.pool, device);
        }
        self.results[u.claim].truncate(u.results_before);
    }

    /// The pool's counters minus what devices allocated before this call consume.
    fn available(&mut self, pool_index: usize) -> &Counters {
        let pools: &'w [Pool<'a>] = self.pools;
        let allocated = self.world.allocated;
        self.available_counters.entry(pool_index).or_insert_with(|| {
            let mut out: Counters = HashMap::new();
            let Some(pool) = pools.get(pool_index) else {
                return out;
            };
            for (name, set) in &pool.counter_sets {
                let counters = set
                    .counters
                    .iter()
                    .map(|(k, c)| (k.clone(), Quantity::parse(&c.value.0).unwrap_or_default()))
                    .collect();
                out.insert((*name).to_owned(), counters);
            }
            for slice in pool.slices.iter().chain(&pool.other_slices) {
                for d in slice.spec.devices.iter().flatten() {
                    let id = DeviceId {
                        driver: slice.spec.driver.clone(),
                        pool: slice.spec.pool.name.clone(),
                        device: d.name.clone(),
                    };
                    if !allocated.holds(&id) {
                        continue;
                    }
                    for c in d.consumes_counters.iter().flatten() {
                        let Some(set) = out.get_mut(&c.counter_set) else {
                            continue;
                        };
                        for (name, v) in &c.counters {
                            if let Some(e) = set.get_mut(name) {
                                let v = Quantity::parse(&v.value.0).unwrap_or_default();
                                *e = e.checked_sub(v).unwrap_or(*e);
                            }
                        }
                    }
                }
            }
            out
        })
    }

    /// Adds the device's counter consumption to this attempt's; false (and nothing added) if
    /// some counter would be overdrawn.
    fn take_counters(&mut self, loc: Loc, device: &Device) -> bool {
        let available = self.available(loc.pool).clone();
        let consumed = self.consumed_counters.entry(loc.pool).or_default();
        for c in device.consumes_counters.iter().flatten() {
            let set = consumed.entry(c.counter_set.clone()).or_default();
            for (name, v) in &c.counters {
                let v = Quantity::parse(&v.value.0).unwrap_or_default();
                let e = set.entry(name.clone()).or_insert_with(Quantity::zero);
                *e = e.checked_add(v).unwrap_or(*e);
            }
        }
        for (set_name, counters) in &available {
            for (name, avail) in counters {
                let used = consumed
                    .get(set_name)
                    .and_then(|s| s.get(name))
                    .copied()
                    .unwrap_or_else(Quantity::zero);
                if *avail < used {
                    self.release_counters(loc.pool, device);
                    return false;
                }
            }
        }
        true
    }

    fn release_counters(&mut self, pool: usize, device: &Device) {
        let Some(consumed) = self.consumed_counters.get_mut(&pool) else {
            return;
        };
        for c in device.consumes_counters.iter().flatten() {
            let Some(set) = consumed.get_mut(&c.counter_set) else {
                continue;
            };
            for (name, v) in &c.counters {
                if let Some(e) = set.get_mut(name) {
                    let v = Quantity::parse(&v.value.0).unwrap_or_default();
                    *e = e.checked_sub(v).unwrap_or(*e);
                }
            }
        }
    }

    /// The AllocationResult of claim `ci`: its devices, its config and its node selector.
    fn result_for(
        &self,
        ci: usize,
        claim: &ResourceClaim,
        node_name: &str,
        share_ids: &dyn Fn(usize, usize) -> String,
    ) -> Result<AllocationResult, DraError> {
        let requests: Vec<_> = claim
            .spec
            .iter()
            .flat_map(|s| s.devices.iter())
            .flat_map(|d| d.requests.iter().flatten())
            .collect();
        let mut results = Vec::new();
        for (i, c) in self.results[ci].iter().enumerate() {
            let Some((_, device)) = self.device(c.loc) else {
                continue;
            };
            let tolerations = requests
                .iter()
                .find(|r| r.name == *c.parent.as_ref().unwrap_or(&c.request))
                .and_then(|r| match &c.parent {
                    None => r.exactly.as_ref().and_then(|e| e.tolerations.clone()),
                    Some(_) => r
                        .first_available
                        .iter()
                        .flatten()
                        .find(|s| s.name == c.request)
                        .and_then(|s| s.tolerations.clone()),
                })
                .filter(|t| !t.is_empty());
            results.push(DeviceRequestAllocationResult {
                request: match &c.parent {
                    Some(p) => format!("{p}/{}", c.request),
                    None => c.request.clone(),
                },
                driver: c.id.driver.clone(),
                pool: c.id.pool.clone(),
                device: c.id.device.clone(),
                admin_access: c.admin.then_some(true),
                tolerations,
                share_id: c.shared.then(|| share_ids(ci, i)),
                consumed_capacity: c.consumed.as_ref().map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_string()),
                            )
                        })
                        .collect()
                }),
                binding_conditions: device.binding_conditions.clone().filter(|c| !c.is_empty()),
                binding_failure_conditions: device
                    .binding_failure_conditions
                    .clone()
                    .filter(|c| !c.is_empty()),
                skip_node_operations: None,
            });
        }
        let config = self.config_for(ci, claim, &requests);
        Ok(AllocationResult {
            allocation_timestamp: None,
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: (!config.is_empty()).then_some(config),
            }),
            node_selector: self.node_selector(ci, node_name)?,
        })
    }

    fn config_for(
        &self,
        ci: usize,
        claim: &ResourceClaim,
        requests: &[&k8s_openapi::api::resource::v1::DeviceRequest],
    ) -> Vec<DeviceAllocationConfiguration> {
        let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut class_ranges: HashMap<&str, (usize, usize)> = HashMap::new();
        for ri in 0..requests.len() {
            let Some(mut req) = self.requests.get(&(ci, ri, 0)) else {
                continue;
            };
            if req.parent.is_some() {
                let Some(sel) = self.requests.get(&(ci, ri, req.selected_sub)) else {
                    continue;
                };
                req = sel;
            }
            let class_name = req.class.metadata.name.as_deref().unwrap_or("");
            if let Some(&(start, end)) = class_ranges.get(class_name) {
                for c in &mut out[start..end] {
                    c.requests.get_or_insert_with(Vec::new).push(req.full_name());
                }
                continue;
            }
            let start = out.len();
            for c in req.class.spec.iter().flat_map(|s| s.config.iter().flatten()) {
                out.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_owned(),
                    requests: Some(vec![req.full_name()]),
                    opaque: c.opaque.clone(),
                });
            }
            class_ranges.insert(class_name, (start, out.len()));
        }
        for config in claim
            .spec
            .iter()
            .flat_map(|s| s.devices.iter())
            .flat_map(|d| d.config.iter().flatten())
        {
            let names = config.requests.as_deref().unwrap_or_default();
            let entry = || DeviceAllocationConfiguration {
                source: "FromClaim".to_owned(),
                requests: config.requests.clone(),
                opaque: config.opaque.clone(),
            };
            if names.is_empty() {
                out.push(entry());
                continue;
            }
            for (ri, request) in requests.iter().enumerate() {
                if names.contains(&request.name) {
                    out.push(entry());
                    continue;
                }
                let Some(first) = self.requests.get(&(ci, ri, 0)) else {
                    continue;
                };
                if first.parent.is_none() {
                    continue;
                }
                let Some(sub) = request.first_available.iter().flatten().nth(first.selected_sub) else {
                    continue;
                };
                if names.contains(&format!("{}/{}", request.name, sub.name)) {
                    out.push(entry());
                }
            }
        }
        out
    }

    fn node_selector(&self, ci: usize, node_name: &str) -> Result<Option<NodeSelector>, DraError> {
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
        for c in &self.results[ci] {
            let Some((slice, device)) = self.device(c.loc) else {
                continue;
            };
            let (name, selector) = if slice.spec.per_device_node_selection == Some(true) {
                (device.node_name.as_deref(), device.node_selector.as_ref())
            } else {
                (slice.spec.node_name.as_deref(), slice.spec.node_selector.as_ref())
            };
            if name.is_some() || device.binds_to_node == Some(true) {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![node_name.to_owned()]),
                        }]),
                        match_expressions: None,
                    }],
                }));
            }
            if let Some(sel) = selector {
                match sel.node_selector_terms.as_slice() {
                    [] => {}
                    [term] => {
                        add_new(term.match_fields.iter().flatten(), &mut fields);
                        add_new(term.match_expressions.iter().flatten(), &mut expressions);
                    }
                    terms => {
                        return Err(DraError::NodeSelectorTerms {
                            claim: self.claims[ci].metadata.name.clone().unwrap_or_default(),
                            terms: terms.len(),
                        });
                    }
                }
            }
        }
        if fields.is_empty() && expressions.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: (!fields.is_empty()).then_some(fields),
                match_expressions: (!expressions.is_empty()).then_some(expressions),
            }],
        }))
    }
}

fn add_new<'r>(
    from: impl Iterator<Item = &'r NodeSelectorRequirement>,
    to: &mut Vec<NodeSelectorRequirement>,
) {
    for r in from {
        let values: BTreeSet<&String> = r.values.iter().flatten().collect();
        let present = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<BTreeSet<_>>() == values
        });
        if !present {
            to.push(r.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "driver": "d", "nodeName": "n1", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": devices}}))
        .unwrap()
    }

    fn claim(spec: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(
            json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": spec}}),
        )
        .unwrap()
    }

    fn run(
        slices: &[ResourceSlice],
        claims: &[ResourceClaim],
    ) -> Result<Option<Vec<AllocationResult>>, DraError> {
        let classes: std::collections::HashMap<String, DeviceClass> = [(
            "gpu".to_owned(),
            serde_json::from_value(json!({"metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"d\""}}]}}))
            .unwrap(),
        )]
        .into();
        let allocated = AllocatedState::default();
        let selectors = SelectorCache::default();
        let world = World {
            classes: &classes,
            all_slices: slices,
            allocated: &allocated,
            selectors: &selectors,
        };
        let labels = BTreeMap::new();
        let node = NodeRef {
            name: "n1",
            labels: &labels,
        };
        let candidates: Vec<&ResourceSlice> = slices.iter().collect();
        let claims: Vec<&ResourceClaim> = claims.iter().collect();
        allocate(&world, &candidates, &node, &claims, &|c, r| {
            format!("share-{c}-{r}")
        })
    }

    fn devices(r: &AllocationResult) -> Vec<String> {
        r.devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .map(|d| format!("{}={}", d.request, d.device))
            .collect()
    }

    #[test]
    fn backtracks_to_satisfy_match_attribute() {
        let s = slice(
            "s",
            json!([{"name": "a", "attributes": {"numa": {"int": 0}}},
                   {"name": "b", "attributes": {"numa": {"int": 1}}},
                   {"name": "c", "attributes": {"numa": {"int": 1}}}]),
        );
        let c = claim(json!({
            "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 2}}],
            "constraints": [{"matchAttribute": "d/numa"}]}));
        let got = run(&[s], &[c]).unwrap().unwrap();
        assert_eq!(devices(&got[0]), ["r=b", "r=c"]);
    }

    #[test]
    fn first_available_falls_back_and_names_the_subrequest() {
        let s = slice("s", json!([{"name": "a"}]));
        let c = claim(json!({"requests": [{"name": "r", "firstAvailable": [
            {"name": "two", "deviceClassName": "gpu", "count": 2},
            {"name": "one", "deviceClassName": "gpu", "count": 1}]}]}));
        let got = run(&[s], &[c]).unwrap().unwrap();
        assert_eq!(devices(&got[0]), ["r/one=a"]);
    }

    #[test]
    fn errors_are_fatal_except_invalid_pools() {
        let dup = slice("s", json!([{"name": "a"}, {"name": "a"}]));
        let c = claim(json!({"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}));
        let e = run(&[dup], std::slice::from_ref(&c)).unwrap_err();
        assert!(e.is_node_error(), "{e}");
        assert!(e.to_string().contains("duplicate device name a"), "{e}");

        let s = slice("s", json!([{"name": "a"}]));
        let unknown = claim(json!({"requests": [{"name": "r", "exactly": {"deviceClassName": "nope"}}]}));
        let e = run(std::slice::from_ref(&s), &[unknown]).unwrap_err();
        assert!(!e.is_node_error());
        assert!(
            e.to_string().contains("could not retrieve device class nope"),
            "{e}"
        );

        let bad = claim(
            json!({"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": "noSuchVar"}}]}}]}),
        );
        let e = run(&[s], &[bad]).unwrap_err();
        assert!(matches!(e, DraError::SelectorCompile { .. }), "{e}");
    }

    #[test]
    fn shared_counters_limit_partitions() {
        let parts = slice(
            "s",
            json!([{"name": "half-0", "consumesCounters": [{"counterSet": "mem", "counters": {"gi": {"value": "4"}}}]},
                   {"name": "half-1", "consumesCounters": [{"counterSet": "mem", "counters": {"gi": {"value": "4"}}}]},
                   {"name": "whole", "consumesCounters": [{"counterSet": "mem", "counters": {"gi": {"value": "8"}}}]}]),
        );
        let mut counters = slice("t", json!(null));
        counters.spec.devices = None;
        counters.spec.shared_counters = Some(vec![
            serde_json::from_value(json!({"name": "mem", "counters": {"gi": {"value": "8"}}})).unwrap(),
        ]);
        counters.spec.pool.resource_slice_count = 2;
        let mut parts = parts;
        parts.spec.pool.resource_slice_count = 2;
        let c =
            claim(json!({"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 3}}]}));
        assert!(run(&[parts.clone(), counters.clone()], &[c]).unwrap().is_none());
        let c =
            claim(json!({"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 2}}]}));
        let got = run(&[parts, counters], &[c]).unwrap().unwrap();
        assert_eq!(devices(&got[0]), ["r=half-0", "r=half-1"]);
    }
}
