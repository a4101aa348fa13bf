//! Memo of per-node verdicts for the scheduling hot path.
//!
//! A node's verdict for a pod (feasible, and the score) depends only on the node's state and on
//! the pod's *shape*: what filter and score read from the pod and the config. Pods of one shape
//! repeat (replicas of a workload), and an assume changes one node, so nearly every node's
//! verdict can be reused. Entries are validated by the node's generation, a value the index
//! renews on every change of the node, its topology or its pods; a stale entry is recomputed.

use std::{
    collections::{BTreeMap, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    sync::Mutex,
};

use crate::{
    model_config::{Config, NoTopology},
    pod::{PodSpec, Qos},
    resources::{ResId, ResList},
    score::Strategy,
};

/// Shapes remembered at once; the least recently used is dropped beyond this. Each costs one
/// entry per node (24 bytes), so 32 shapes over 20,000 nodes take about 15 MiB.
pub const MAX_SHAPES: usize = 32;

/// Everything of a pod and the config that a node's verdict reads. Pod and container names
/// only appear in messages and placements, which the cache does not hold, so they are left out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    qos: Qos,
    /// Init containers in order: sidecar flag and requests.
    init: Vec<(bool, ResList)>,
    containers: Vec<ResList>,
    overhead: ResList,
    /// Pod-level resources: set, and the requests.
    pod_level: (bool, ResList),
    node_name: Option<String>,
    node_selector: BTreeMap<String, String>,
    /// Required affinity and tolerations as JSON: the k8s types implement neither `Eq` nor
    /// `Hash`. Empty when the pod has neither.
    affinity_tolerations: String,
    strategy: Strategy,
    weights: Vec<(ResId, i64)>,
    no_topology: NoTopology,
    /// The rules the pod's volumes impose ([`crate::volume_binding::VolumeFilter::shape`]).
    volumes: String,
}

impl ShapeKey {
    /// The shape of `pod` under `cfg`.
    pub fn of(cfg: &Config, pod: &PodSpec) -> Self {
        let affinity_tolerations = if pod.required_affinity.is_none() && pod.tolerations.is_empty() {
            String::new()
        } else {
            // Serialising plain API structs cannot fail; were it to, the fallback still
            // distinguishes shapes by their debug form.
            serde_json::to_string(&(&pod.required_affinity, &pod.tolerations))
                .unwrap_or_else(|_| format!("{:?}{:?}", pod.required_affinity, pod.tolerations))
        };
        let mut weights: Vec<(ResId, i64)> = cfg.scorer.weights.iter().map(|(k, v)| (*k, *v)).collect();
        weights.sort_unstable();
        ShapeKey {
            qos: pod.qos,
            init: pod
                .init_containers
                .iter()
                .map(|c| (c.sidecar, c.requests.clone()))
                .collect(),
            containers: pod.containers.iter().map(|c| c.requests.clone()).collect(),
            overhead: pod.overhead.clone(),
            pod_level: (pod.pod_level, pod.pod_requests.clone()),
            node_name: pod.node_name.clone(),
            node_selector: pod.node_selector.clone(),
            affinity_tolerations,
            strategy: cfg.scorer.strategy,
            weights,
            no_topology: cfg.no_topology,
            volumes: String::new(),
        }
    }

    /// The shape of a prepared pod, its volume rules included.
    pub fn of_prepared(cfg: &Config, pod: &crate::prepared::PreparedPod<'_>) -> Self {
        let mut key = Self::of(cfg, pod.spec);
        key.volumes = pod.volumes.shape();
        key
    }

    fn hash_value(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// One node's cached verdict: the score when feasible, `None` when not; valid while the
/// node's generation equals `generation` (0 never matches: generations start at 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Node generation the verdict was computed at.
    pub generation: u64,
    /// Score if feasible.
    pub score: Option<i64>,
    /// When infeasible: the interned set of aggregate categories ([`Shapes::categories`]),
    /// or [`UNKNOWN_FAILURE`] until a pod that fits nowhere needs them. Kept so a retry of an
    /// unschedulable pod rebuilds its "0/N nodes are available" line without re-explaining
    /// unchanged nodes.
    pub failure: u32,
}

/// [`Entry::failure`] before the categories were computed.
pub const UNKNOWN_FAILURE: u32 = 0;

#[derive(Debug)]
struct Shape {
    key: ShapeKey,
    hash: u64,
    /// Indexed by node slot.
    entries: Vec<Entry>,
    last_used: u64,
}

/// The cached verdicts of recent shapes.
#[derive(Debug, Default)]
pub struct Shapes {
    shapes: Vec<Shape>,
    clock: u64,
    /// Interned category sets; id = index + 1 (0 is [`UNKNOWN_FAILURE`]). Few distinct sets
    /// exist (they name reasons, not nodes), so this stays small.
    category_sets: Vec<Vec<String>>,
    category_ids: std::collections::HashMap<Vec<String>, u32>,
}

impl Shapes {
    /// The id of a category set (sorted and deduplicated first).
    pub fn intern_categories(&mut self, mut categories: Vec<String>) -> u32 {
        categories.sort_unstable();
        categories.dedup();
        if let Some(&id) = self.category_ids.get(&categories) {
            return id;
        }
        self.category_sets.push(categories.clone());
        let id = u32::try_from(self.category_sets.len()).unwrap_or(u32::MAX);
        self.category_ids.insert(categories, id);
        id
    }

    /// How many category sets are interned (the highest id).
    pub fn category_set_count(&self) -> usize {
        self.category_sets.len()
    }

    /// The categories of an interned id; empty for [`UNKNOWN_FAILURE`].
    pub fn categories(&self, id: u32) -> &[String] {
        id.checked_sub(1)
            .and_then(|i| self.category_sets.get(i as usize))
            .map_or(&[], Vec::as_slice)
    }

    /// The slot-indexed entries of `key`, at least `slots` long; a new shape takes a free place
    /// or the least recently used one's.
    pub fn entries(&mut self, key: ShapeKey, slots: usize) -> &mut [Entry] {
        self.clock += 1;
        let hash = key.hash_value();
        let found = self.shapes.iter().position(|s| s.hash == hash && s.key == key);
        let i = match found {
            Some(i) => i,
            None if self.shapes.len() < MAX_SHAPES => {
                self.shapes.push(Shape {
                    key,
                    hash,
                    entries: Vec::new(),
                    last_used: 0,
                });
                self.shapes.len() - 1
            }
            None => {
                let i = self
                    .shapes
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| s.last_used)
                    .map_or(0, |(i, _)| i);
                let s = &mut self.shapes[i];
                s.key = key;
                s.hash = hash;
                s.entries.fill(Entry::default());
                i
            }
        };
        let s = &mut self.shapes[i];
        s.last_used = self.clock;
        if s.entries.len() < slots {
            s.entries.resize(slots, Entry::default());
        }
        &mut s.entries
    }
}

/// The cache as a field of the (cloneable, shareable) cluster: behind a mutex because
/// scheduling reads the cluster through `&self`. A clone starts empty, which is always valid.
#[derive(Default)]
pub struct VerdictCache(pub Mutex<Shapes>);

impl Clone for VerdictCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// A summary: the entries (one per node and shape) would swamp a debug print of the cluster.
impl std::fmt::Debug for VerdictCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shapes = self.0.try_lock().map(|s| s.shapes.len()).ok();
        f.debug_struct("VerdictCache").field("shapes", &shapes).finish()
    }
}
