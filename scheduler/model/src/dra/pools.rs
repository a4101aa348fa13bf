//! Resource pools as the allocator sees them from one node: the slices that publish devices
//! the node can reach, grouped by `(driver, pool)`, the newest generation only, with the
//! incomplete, obsolete and invalid pools marked, in the search order.

use std::collections::BTreeMap;

// Gathered for every node a pod is tried on: foldhash, not SipHash (keys are names from the
// cluster's own objects, nothing an attacker picks to collide).
use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};

use k8s_openapi::api::{core::v1::NodeSelector, resource::v1::CounterSet};

use super::slice::ResourceSlice;

/// The node an allocation is for: its name and labels.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
}

/// `(driver, pool)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// Driver name.
    pub driver: String,
    /// Pool name.
    pub pool: String,
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.driver, self.pool)
    }
}

/// One pool reachable from the node.
#[derive(Debug)]
pub struct Pool<'a> {
    /// Which pool.
    pub id: PoolId,
    /// Not all slices of its generation are published yet.
    pub incomplete: bool,
    /// Why its devices cannot be trusted (duplicate names, unknown counters), if so.
    pub invalid: Option<String>,
    /// Slices with devices for this node, sorted by name.
    pub slices: Vec<&'a ResourceSlice>,
    /// Slices of the same generation with devices for other nodes (their devices still use
    /// the pool's counters).
    pub other_slices: Vec<&'a ResourceSlice>,
    /// Counter sets by name.
    pub counter_sets: HashMap<&'a str, &'a CounterSet>,
    /// Some device has binding conditions (such pools are searched last).
    pub binding_conditions: bool,
}

/// Whether a node selection (`nodeName`, `allNodes` or `nodeSelector`, the first one set)
/// takes `node`.
pub fn node_matches(
    node: &NodeRef<'_>,
    node_name: Option<&str>,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> bool {
    match (node_name.filter(|n| !n.is_empty()), all_nodes, selector) {
        (Some(n), _, _) => n == node.name,
        (None, true, _) => true,
        (None, false, Some(sel)) => crate::nodeaffinity::affinity_matches(sel, node.name, node.labels),
        (None, false, None) => false,
    }
}

fn has_counters(slice: &ResourceSlice) -> bool {
    slice.spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty())
}

/// Gathers the pools `node` can use from `candidates` (its own slices and the cluster-wide
/// ones), checking completeness against `all` (every slice in the cluster).
pub fn gather<'a>(
    candidates: impl IntoIterator<Item = &'a ResourceSlice>,
    node: &NodeRef<'_>,
    all: &'a [ResourceSlice],
) -> Vec<Pool<'a>> {
    // A node reaches a handful of pools: a list searched in place, keyed by borrowed names.
    let mut by_pool: Vec<((&'a str, &'a str), Vec<&'a ResourceSlice>)> = Vec::new();
    for slice in candidates {
        let spec = &slice.spec;
        let relevant = if has_counters(slice) {
            // Counter sets are needed to use the pool wherever its devices are.
            true
        } else if spec.node_name.as_deref().is_some_and(|n| !n.is_empty())
            || spec.all_nodes == Some(true)
            || spec.node_selector.is_some()
        {
            node_matches(
                node,
                spec.node_name.as_deref(),
                spec.all_nodes == Some(true),
                spec.node_selector.as_ref(),
            )
        } else if spec.per_device_node_selection == Some(true) {
            spec.devices.iter().flatten().any(|d| {
                node_matches(
                    node,
                    d.node_name.as_deref(),
                    d.all_nodes == Some(true),
                    d.node_selector.as_ref(),
                )
            })
        } else {
            // No node selection this allocator knows: some future extension.
            false
        };
        if !relevant {
            continue;
        }
        let key = (spec.driver.as_str(), spec.pool.name.as_str());
        let at = match by_pool.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                by_pool.push((key, Vec::new()));
                by_pool.len() - 1
            }
        };
        let entry = &mut by_pool[at].1;
        match entry.first().map(|s| s.spec.pool.generation) {
            Some(g) if spec.pool.generation < g => {}
            Some(g) if spec.pool.generation > g => *entry = vec![slice],
            _ => entry.push(slice),
        }
    }
    let mut pools = Vec::with_capacity(by_pool.len());
    for ((driver, pool), slices) in by_pool {
        let id = PoolId {
            driver: driver.to_owned(),
            pool: pool.to_owned(),
        };
        let Some(first) = slices.first() else { continue };
        let generation = first.spec.pool.generation;
        let want = first.spec.pool.resource_slice_count;
        let mut all_of_generation: Option<Vec<&'a ResourceSlice>> = None;
        if slices.len() as i64 != want {
            // Slices filtered out as irrelevant for this node may complete the pool, or a newer
            // generation for other nodes may make this one obsolete.
            let mut same = Vec::new();
            let mut obsolete = false;
            for s in all
                .iter()
                .filter(|s| s.spec.driver == id.driver && s.spec.pool.name == id.pool)
            {
                if s.spec.pool.generation == generation {
                    same.push(s);
                } else if s.spec.pool.generation > generation {
                    obsolete = true;
                    break;
                }
            }
            if obsolete {
                continue;
            }
            if same.len() as i64 != want {
                pools.push(Pool {
                    id,
                    incomplete: true,
                    invalid: None,
                    slices: Vec::new(),
                    other_slices: Vec::new(),
                    counter_sets: HashMap::new(),
                    binding_conditions: false,
                });
                continue;
            }
            all_of_generation = Some(same);
        }
        pools.push(build(id, slices, all_of_generation));
    }
    // Search order: driver, then pool name; pools with binding conditions last.
    pools.sort_by(|a, b| {
        a.binding_conditions
            .cmp(&b.binding_conditions)
            .then_with(|| a.id.cmp(&b.id))
    });
    pools
}

fn build<'a>(
    id: PoolId,
    slices: Vec<&'a ResourceSlice>,
    all_of_generation: Option<Vec<&'a ResourceSlice>>,
) -> Pool<'a> {
    let (counter_slices, mut device_slices): (Vec<_>, Vec<_>) =
        slices.iter().copied().partition(|s| has_counters(s));
    device_slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut pool = Pool {
        id,
        incomplete: false,
        invalid: None,
        slices: Vec::new(),
        other_slices: Vec::new(),
        counter_sets: HashMap::new(),
        binding_conditions: false,
    };
    let mut names = HashSet::new();
    for s in &device_slices {
        for d in s.spec.devices.iter().flatten() {
            if !names.insert(d.name.as_str()) {
                pool.invalid = Some(format!("duplicate device name {}", d.name));
                return pool;
            }
        }
    }
    for s in &counter_slices {
        for set in s.spec.shared_counters.iter().flatten() {
            if pool.counter_sets.insert(set.name.as_str(), set).is_some() {
                pool.invalid = Some(format!("duplicate counter set name {}", set.name));
                pool.counter_sets.clear();
                return pool;
            }
        }
    }
    if let Err(reason) = check_consumption(&pool.counter_sets, &slices) {
        pool.invalid = Some(reason);
        return pool;
    }
    if let Some(all) = all_of_generation {
        let seen: HashSet<&str> = slices.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
        let others: Vec<&ResourceSlice> = all
            .into_iter()
            .filter(|s| !s.metadata.name.as_deref().is_some_and(|n| seen.contains(n)))
            .collect();
        if let Err(reason) = check_consumption(&pool.counter_sets, &others) {
            pool.invalid = Some(reason);
            return pool;
        }
        pool.other_slices = others;
    }
    pool.binding_conditions = device_slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| d.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()));
    pool.slices = device_slices;
    pool
}

fn check_consumption(sets: &HashMap<&str, &CounterSet>, slices: &[&ResourceSlice]) -> Result<(), String> {
    for s in slices {
        for d in s.spec.devices.iter().flatten() {
            for c in d.consumes_counters.iter().flatten() {
                let Some(set) = sets.get(c.counter_set.as_str()) else {
                    return Err(format!("counter set {} not found", c.counter_set));
                };
                for name in c.counters.keys() {
                    if !set.counters.contains_key(name) {
                        return Err(format!("counter {name} not found in counter set {}", set.name));
                    }
                }
            }
        }
    }
    Ok(())
}
