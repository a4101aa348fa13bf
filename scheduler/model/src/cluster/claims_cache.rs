//! Memo of the nodes where a pod's claims cannot be allocated, as [`crate::cache`] is for the
//! plain path: kept by claim shape (what the allocation and its NUMA alignment read of the pod,
//! its claims and the config), per node, valid while neither the node (its generation: labels,
//! NRT, bound pods, assumptions) nor its devices ([`crate::dra::changes`]) changed.
//!
//! A failure is kept with its explanation once a pod that fits nowhere needed one, so a
//! retried pod, or the next replica of a workload, is neither searched nor explained again on an
//! unchanged node. A node where the claims fit keeps the score its alignment adds, so the best
//! node is found without searching every node whose devices are only misaligned; the allocation
//! itself is searched again on the node chosen (it names the pod's claims).

use std::{
    collections::{HashMap, hash_map::DefaultHasher},
    hash::{BuildHasher as _, Hash, Hasher},
    sync::{Mutex, TryLockError},
};

use super::{Cluster, Config, ranking::Ranking};
use crate::{
    cache::ShapeKey,
    dra::{
        DeviceId,
        changes::{Kind, Since},
        numa::NotHere,
        state::ResolvedClaims,
    },
    prepared::PreparedPod,
};

/// Claim shapes remembered at once; the least recently used is dropped beyond this. Each
/// costs 16 bytes per node.
const MAX_SHAPES: usize = 32;

/// Everything a node's claim verdict reads of the pod, its claims and the config.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ClaimShapeKey {
    plain: ShapeKey,
    /// The claims (pod claim names, specs, allocations of those allocated before), which
    /// containers name them, and the alignment config, as JSON.
    claims: String,
}

impl ClaimShapeKey {
    pub(super) fn of(cfg: &Config, pod: &PreparedPod<'_>, resolved: &ResolvedClaims<'_>) -> Self {
        let spec = pod.spec;
        let claims: Vec<_> = resolved
            .all
            .iter()
            .enumerate()
            .map(|(i, (name, c))| {
                let allocation = c.status.as_ref().and_then(|s| s.allocation.as_ref());
                // A reason names an allocated claim by its key.
                let key = allocation.map(|_| crate::dra::claim_key(c));
                (name, resolved.pending.contains(&i), &c.spec, allocation, key)
            })
            .collect();
        let uses: Vec<Vec<(&str, Option<&str>)>> = spec
            .init_containers
            .iter()
            .chain(&spec.containers)
            .map(|c| {
                c.claims
                    .iter()
                    .map(|cc| (cc.name.as_str(), cc.request.as_deref()))
                    .collect()
            })
            .collect();
        let config = (cfg.dra_numa.alignment, &cfg.dra_numa.driver_attributes);
        ClaimShapeKey {
            plain: ShapeKey::of_prepared(cfg, pod),
            // Serialising plain API structs cannot fail; were it to, the debug form still
            // tells shapes apart.
            claims: serde_json::to_string(&(&claims, &uses, &config))
                .unwrap_or_else(|_| format!("{claims:?}{uses:?}{config:?}")),
        }
    }

    fn hash_value(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    /// A digest of the claims part alone: what a search of the node's devices reads of the
    /// pod (not its CPUs).
    pub(super) fn digest(&self) -> u64 {
        outcome_key(&self.claims)
    }

    /// A digest of what a CPU prediction on a node reads of a pod of this shape whose
    /// containers are `names` (a prediction names its containers; the shape leaves names out):
    /// shared by pods of one workload whatever their claims.
    pub(super) fn pod_digest<'n>(&self, names: impl Iterator<Item = &'n str>) -> u64 {
        outcome_key(&(names.collect::<Vec<_>>(), &self.plain))
    }
}

/// One node's entry: valid while the node's generation is `generation` (0 never is).
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    generation: u64,
    /// [`NOT_KNOWN`], [`FAILED`], [`FITS`], or a failure with a reason: its id +
    /// [`FIRST_REASON`].
    verdict: u32,
    /// [`FITS`]: the score the alignment adds; [`NOT_KNOWN`]: the most it can add.
    bonus: i32,
}

/// In [`Shape::bounds`]: known to fail.
pub(super) const BOUND_FAILED: i32 = i32::MIN;
/// In [`Shape::bounds`]: nothing known, the most alignment can add applies.
pub(super) const BOUND_UNKNOWN: i32 = i32::MAX;

const NOT_KNOWN: u32 = 0;
const FAILED: u32 = 1;
const FITS: u32 = 2;
const FIRST_REASON: u32 = 3;

/// What is known of a node for a claim shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known<'r> {
    /// Nothing: search it.
    Nothing,
    /// The claims cannot be allocated there; why was not said yet.
    Failed,
    /// The claims cannot be allocated there, for this reason.
    Explained(&'r NotHere),
    /// The claims fit there, and their alignment adds this to the node's score.
    Fits(i64),
}

#[derive(Debug)]
struct Shape {
    key: ClaimShapeKey,
    hash: u64,
    /// By node slot.
    entries: Vec<Entry>,
    /// By node slot: [`BOUND_FAILED`] where the entry is valid and a failure, the bonus where
    /// it is valid and says one (the most the alignment can add, or what it adds), and
    /// [`BOUND_UNKNOWN`] otherwise. The ranking pass reads these beside the scores instead of
    /// the entries, so a node that cannot make the kept candidates costs one comparison; they
    /// are reset to unknown wherever an entry stops being valid (the node changed, its
    /// devices changed), so a bound is never below what the node can reach.
    bounds: Vec<i32>,
    /// The DRA change generation the entries were checked against.
    seen: u64,
    last_used: u64,
    /// The nodes ranked for the search, kept between decisions ([`super::ranking`]); out
    /// while a decision uses it.
    ranking: Option<Ranking>,
    /// Slots whose score or bound changed since the ranking was taken out.
    changed: Vec<usize>,
    /// The ranking is to be rebuilt: too much changed to follow, or the nodes themselves did.
    rebuild: bool,
}

impl Shape {
    /// The node in `slot` changed (its score, its bound): the ranking re-ranks it, or, past
    /// a quarter of the nodes' worth of changes, is rebuilt (re-ranking that many costs about
    /// what a rebuild does).
    fn changed(&mut self, slot: usize) {
        if self.rebuild || self.changed.last() == Some(&slot) {
            return;
        }
        self.changed.push(slot);
        if self.changed.len() > self.bounds.len() / 4 + 64 {
            self.forget_ranking();
        }
    }

    fn forget_ranking(&mut self) {
        self.rebuild = true;
        self.ranking = None;
        self.changed.clear();
    }
}

/// The cached claim verdicts of recent shapes.
#[derive(Debug, Default)]
pub(super) struct ClaimShapes {
    shapes: Vec<Shape>,
    clock: u64,
    /// Interned reasons; few distinct ones exist (they name claims, classes and NUMA nodes,
    /// not nodes).
    reasons: Vec<NotHere>,
    /// By `alignment`, then reason.
    reason_ids: [HashMap<String, u32>; 2],
}

/// The entries of one shape, as the cluster is now.
pub(super) struct ShapeView<'c> {
    shapes: &'c mut ClaimShapes,
    at: usize,
    generations: &'c [u64],
}

impl ShapeView<'_> {
    /// Whether the claims are known not to fit on the node in `slot`.
    #[cfg(test)]
    fn known_to_fail(&self, slot: usize) -> bool {
        self.bounds().get(slot) == Some(&BOUND_FAILED)
    }

    /// By node slot: [`BOUND_FAILED`] (the claims are known not to fit there), the most their
    /// alignment adds there, or [`BOUND_UNKNOWN`].
    pub(super) fn bounds(&self) -> &[i32] {
        &self.shapes.shapes[self.at].bounds
    }

    /// The shape's ranking (`None`: to be built) and the slots changed since it was last
    /// given back; until [`Self::put_ranking`], changes are recorded for the next decision.
    pub(super) fn take_ranking(&mut self) -> (Option<Ranking>, Vec<usize>) {
        let shape = &mut self.shapes.shapes[self.at];
        let ranking = if shape.rebuild { None } else { shape.ranking.take() };
        shape.rebuild = false;
        (ranking, std::mem::take(&mut shape.changed))
    }

    /// The slots changed since the ranking was taken out (in this decision).
    pub(super) fn changed_now(&self) -> &[usize] {
        &self.shapes.shapes[self.at].changed
    }

    /// Gives back the ranking taken out, unless what changed meanwhile calls for a rebuild.
    pub(super) fn put_ranking(&mut self, ranking: Ranking) {
        let shape = &mut self.shapes.shapes[self.at];
        if !shape.rebuild {
            shape.ranking = Some(ranking);
        }
    }

    /// The entry of `slot`, if valid.
    fn entry(&self, slot: usize) -> Option<Entry> {
        let e = self.shapes.shapes[self.at].entries.get(slot).copied()?;
        (e.generation != 0 && self.generations.get(slot) == Some(&e.generation)).then_some(e)
    }

    /// What is known of the node in `slot`.
    pub(super) fn known(&self, slot: usize) -> Known<'_> {
        let Some(e) = self.entry(slot) else {
            return Known::Nothing;
        };
        match e.verdict {
            NOT_KNOWN => Known::Nothing,
            FAILED => Known::Failed,
            FITS => Known::Fits(i64::from(e.bonus)),
            id => self
                .shapes
                .reasons
                .get((id - FIRST_REASON) as usize)
                .map_or(Known::Failed, Known::Explained),
        }
    }

    /// The most the alignment can add to the score of the node in `slot`: the score it adds
    /// where the claims are known to fit, `potential()` (remembered) where nothing is known,
    /// `None` where they are known not to fit.
    pub(super) fn bonus_bound(&mut self, slot: usize, potential: impl FnOnce() -> i64) -> Option<i64> {
        match self.entry(slot) {
            Some(e) if e.verdict == NOT_KNOWN || e.verdict == FITS => Some(i64::from(e.bonus)),
            Some(_) => None,
            None => {
                let bonus = potential();
                self.set(slot, NOT_KNOWN, bonus);
                Some(bonus)
            }
        }
    }

    /// Remembers that on `slot` the claims can at best be allocated misaligned (their
    /// alignment adds nothing), whether they can be at all not known yet.
    pub(super) fn only_misaligned(&mut self, slot: usize) {
        self.set(slot, NOT_KNOWN, 0);
    }

    /// Remembers that the claims fit on `slot`, their alignment adding `bonus`.
    pub(super) fn fits(&mut self, slot: usize, bonus: i64) {
        self.set(slot, FITS, bonus);
    }

    fn set(&mut self, slot: usize, verdict: u32, bonus: i64) {
        let generation = self.generations.get(slot).copied().unwrap_or(0);
        let shape = &mut self.shapes.shapes[self.at];
        shape.changed(slot);
        // Bonuses are 0..=MAX_BONUS; the clamp keeps them off the failure marker.
        let bonus = i32::try_from(bonus.clamp(i64::from(BOUND_FAILED) + 1, i64::from(BOUND_UNKNOWN)))
            .unwrap_or(BOUND_UNKNOWN);
        set_bound(
            &mut shape.bounds,
            slot,
            if generation != 0 { bonus } else { BOUND_UNKNOWN },
        );
        if let Some(e) = shape.entries.get_mut(slot) {
            *e = Entry {
                generation,
                verdict,
                bonus,
            };
        }
    }

    /// Remembers that the claims cannot be allocated on `slot` (`why`: the reason, if said).
    pub(super) fn failed(&mut self, slot: usize, why: Option<&NotHere>) {
        let verdict = match why {
            None => FAILED,
            Some(n) => self.shapes.intern(n).saturating_add(FIRST_REASON),
        };
        let generation = self.generations.get(slot).copied().unwrap_or(0);
        let shape = &mut self.shapes.shapes[self.at];
        shape.changed(slot);
        set_bound(
            &mut shape.bounds,
            slot,
            if generation != 0 {
                BOUND_FAILED
            } else {
                BOUND_UNKNOWN
            },
        );
        if let Some(e) = shape.entries.get_mut(slot) {
            // An explanation is never replaced by a bare failure.
            if !(why.is_none() && e.generation == generation && e.verdict >= FIRST_REASON) {
                *e = Entry {
                    generation,
                    verdict,
                    bonus: 0,
                };
            }
        }
    }
}

impl ClaimShapes {
    fn intern(&mut self, n: &NotHere) -> u32 {
        let ids = &mut self.reason_ids[usize::from(n.alignment)];
        if let Some(&id) = ids.get(n.reason.as_str()) {
            return id;
        }
        let id = u32::try_from(self.reasons.len()).unwrap_or(u32::MAX - FIRST_REASON);
        self.reasons.push(n.clone());
        ids.insert(n.reason.clone(), id);
        id
    }

    /// The shape of `key`, its entries of nodes whose devices changed since its last use
    /// forgotten; a new shape takes a free place or the least recently used one's.
    fn shape(&mut self, key: ClaimShapeKey, cluster: &Cluster) -> usize {
        self.clock += 1;
        let hash = key.hash_value();
        let slots = cluster.slots.len();
        let at = match self.shapes.iter().position(|s| s.hash == hash && s.key == key) {
            Some(i) => i,
            None => {
                let fresh = Shape {
                    key,
                    hash,
                    entries: Vec::new(),
                    bounds: Vec::new(),
                    seen: cluster.dra.changes().generation(),
                    last_used: 0,
                    ranking: None,
                    changed: Vec::new(),
                    rebuild: true,
                };
                if self.shapes.len() < MAX_SHAPES {
                    self.shapes.push(fresh);
                    self.shapes.len() - 1
                } else {
                    let i = self
                        .shapes
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| s.last_used)
                        .map_or(0, |(i, _)| i);
                    self.shapes[i] = fresh;
                    i
                }
            }
        };
        let s = &mut self.shapes[at];
        s.last_used = self.clock;
        if s.entries.len() < slots {
            s.entries.resize(slots, Entry::default());
        }
        if s.bounds.len() < slots {
            s.bounds.resize(slots, BOUND_UNKNOWN);
        }
        let changes = cluster.dra.changes();
        match changes.since(s.seen) {
            Since::Nothing => {}
            Since::Everything => {
                s.entries.fill(Entry::default());
                s.bounds.fill(BOUND_UNKNOWN);
                s.forget_ranking();
            }
            Since::Nodes(nodes) => {
                // Its verdicts include fits, which devices taken may undo: any change drops them.
                for (n, _) in nodes {
                    if let Some(&slot) = cluster.index.get(n) {
                        if let Some(e) = s.entries.get_mut(slot) {
                            *e = Entry::default();
                        }
                        set_bound(&mut s.bounds, slot, BOUND_UNKNOWN);
                        s.changed(slot);
                    }
                }
            }
        }
        s.seen = changes.generation();
        at
    }
}

/// The cache as a field of the (cloneable, shareable) cluster: behind a mutex because
/// scheduling reads the cluster through `&self`. A clone starts empty, which is always valid.
#[derive(Default)]
pub(super) struct ClaimVerdictCache(Mutex<ClaimShapes>);

impl ClaimVerdictCache {
    /// The node in `slot` changed: nothing of it is known any more.
    pub(super) fn forget_slot(&mut self, slot: usize) {
        let shapes = match self.0.get_mut() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for s in &mut shapes.shapes {
            set_bound(&mut s.bounds, slot, BOUND_UNKNOWN);
            s.changed(slot);
        }
    }

    /// A node was added or removed: positions moved, every ranking is rebuilt.
    pub(super) fn forget_order(&mut self) {
        let shapes = match self.0.get_mut() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for s in &mut shapes.shapes {
            s.forget_ranking();
        }
    }
}

fn set_bound(bounds: &mut [i32], slot: usize, bound: i32) {
    if let Some(b) = bounds.get_mut(slot) {
        *b = bound;
    }
}

impl Clone for ClaimVerdictCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for ClaimVerdictCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimVerdictCache")
    }
}

impl Cluster {
    /// Runs `f` with the cached claim verdicts of `key`, or with `None` when another thread
    /// is using them.
    pub(super) fn with_claim_cache<T>(
        &self,
        key: ClaimShapeKey,
        f: impl FnOnce(Option<&mut ShapeView<'_>>) -> T,
    ) -> T {
        let mut guard = match self.claim_verdicts.0.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => {
                // A panic mid-update may have left entries half written: start over.
                let mut g = p.into_inner();
                *g = ClaimShapes::default();
                self.claim_verdicts.0.clear_poison();
                g
            }
            Err(TryLockError::WouldBlock) => return f(None),
        };
        let at = guard.shape(key, self);
        let mut view = ShapeView {
            shapes: &mut guard,
            at,
            generations: &self.generations,
        };
        f(Some(&mut view))
    }
}

/// What a search that reads a node's devices and not its CPUs found there: shared by every
/// claim shape whose claims are the same (pods of one template that differ in CPUs), valid
/// until the node's devices or labels change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum DeviceOutcome {
    /// Upstream's search (no NUMA filter) finds no allocation, for this reason.
    UpstreamFails(String),
    /// Upstream's search (or, under a requirement's key, the search that meets that
    /// requirement alone) finds one. With the devices of the allocation it found, when those
    /// alone make it (they consume no shared counters and none is shareable): then it holds
    /// while every one of them stays free, whatever else is taken.
    UpstreamFits(Option<Vec<DeviceId>>),
    /// The aligned search (for the targets in the key) finds none at any level; or, under a
    /// requirement's key, the search that meets that requirement alone finds none.
    AlignedFails,
    /// The aligned search's levels that earn the bonus find none; the misaligned level was
    /// not searched.
    BonusLevelsFail,
}

/// Outcomes by node slot: (key, outcome), few per node.
#[derive(Debug, Default)]
pub(super) struct DeviceOutcomes {
    /// The DRA change generation the entries were checked against.
    seen: u64,
    slots: Vec<Vec<(u64, DeviceOutcome)>>,
}

/// Outcomes kept per node; the oldest goes beyond. A pod with two claims pinned on one of
/// eight NUMA nodes can leave 8 aligned and 16 requirement outcomes on a node.
const OUTCOMES_PER_NODE: usize = 32;

impl DeviceOutcomes {
    /// Forgets the nodes whose devices changed since the last look.
    fn refresh(&mut self, cluster: &Cluster) {
        let changes = cluster.dra.changes();
        match changes.since(self.seen) {
            Since::Nothing => {}
            Since::Everything => self.slots.iter_mut().for_each(Vec::clear),
            Since::Nodes(nodes) => {
                for (n, kind) in nodes {
                    let Some(v) = cluster.index.get(n).and_then(|&slot| self.slots.get_mut(slot)) else {
                        continue;
                    };
                    match kind {
                        // Fewer free devices: what failed still fails, with the same reason
                        // (the reasons name the claims, not the devices).
                        Kind::Taken => v.retain(|(_, o)| !matches!(o, DeviceOutcome::UpstreamFits(None))),
                        Kind::Changed => v.clear(),
                    }
                }
            }
        }
        self.seen = changes.generation();
    }
}

/// The cache as a field of the cluster, as [`ClaimVerdictCache`].
#[derive(Default)]
pub(super) struct DeviceOutcomeCache(Mutex<DeviceOutcomes>);

impl Clone for DeviceOutcomeCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for DeviceOutcomeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceOutcomeCache")
    }
}

/// A key for [`DeviceOutcomes`]: the claims' digest ([`ClaimShapeKey::digest`]) and what else
/// the search reads (its targets, the node's PCI locality), hashed.
pub(super) fn outcome_key(parts: &impl Hash) -> u64 {
    foldhash::quality::FixedState::default().hash_one(parts)
}

impl Cluster {
    /// The outcome remembered for `key` on the node in `slot`.
    pub(super) fn device_outcome(&self, slot: usize, key: u64) -> Option<DeviceOutcome> {
        let mut g = self.device_outcomes.0.try_lock().ok()?;
        g.refresh(self);
        let kept = g.slots.get_mut(slot)?;
        let at = kept.iter().position(|(k, _)| *k == key)?;
        if let (_, DeviceOutcome::UpstreamFits(Some(devices))) = &kept[at]
            && devices.iter().any(|d| self.dra.holds(d))
        {
            // Another claim took one of them since: unknown again.
            kept.remove(at);
            return None;
        }
        kept.get(at).map(|(_, o)| o.clone())
    }

    /// Remembers `outcome` for `key` on the node in `slot`.
    pub(super) fn remember_device_outcome(&self, slot: usize, key: u64, outcome: DeviceOutcome) {
        let Ok(mut g) = self.device_outcomes.0.try_lock() else {
            return;
        };
        g.refresh(self);
        if g.slots.len() < self.slots.len() {
            g.slots.resize_with(self.slots.len(), Vec::new);
        }
        if let Some(v) = g.slots.get_mut(slot) {
            v.retain(|(k, _)| *k != key);
            if v.len() >= OUTCOMES_PER_NODE {
                v.remove(0);
            }
            v.push((key, outcome));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_here(reason: &str) -> NotHere {
        NotHere {
            reason: reason.to_owned(),
            alignment: true,
        }
    }

    #[test]
    fn a_failure_holds_until_the_node_changes_and_keeps_its_reason() {
        let mut shapes = ClaimShapes::default();
        shapes.shapes.push(Shape {
            key: ClaimShapeKey {
                plain: ShapeKey::of(
                    &Config::default(),
                    &crate::pod::PodSpec::from_pod(
                        &mut crate::resources::Resources::default(),
                        &serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap(),
                    )
                    .unwrap(),
                ),
                claims: String::new(),
            },
            hash: 0,
            entries: vec![Entry::default(); 2],
            bounds: vec![BOUND_UNKNOWN; 2],
            seen: 0,
            last_used: 0,
            ranking: None,
            changed: Vec::new(),
            rebuild: true,
        });
        let generations = vec![5, 7];
        let mut view = ShapeView {
            shapes: &mut shapes,
            at: 0,
            generations: &generations,
        };
        assert_eq!(view.known(0), Known::Nothing);
        view.failed(0, None);
        assert_eq!(view.known(0), Known::Failed);
        let why = not_here("claim gpu: no free device");
        view.failed(0, Some(&why));
        assert_eq!(view.known(0), Known::Explained(&why));
        // A later bare failure keeps the explanation.
        view.failed(0, None);
        assert_eq!(view.known(0), Known::Explained(&why));
        assert_eq!(view.known(1), Known::Nothing);
        // The node changed: nothing is known.
        let generations = vec![6, 7];
        let view = ShapeView {
            shapes: &mut shapes,
            at: 0,
            generations: &generations,
        };
        assert_eq!(view.known(0), Known::Nothing);
        // A node where the claims fit keeps its bonus; one with nothing known, its potential.
        let generations = vec![6, 7];
        let mut view = ShapeView {
            shapes: &mut shapes,
            at: 0,
            generations: &generations,
        };
        assert_eq!(view.bonus_bound(1, || 100), Some(100));
        assert_eq!(view.bonus_bound(1, || unreachable!()), Some(100));
        assert_eq!(view.bounds()[1], 100);
        view.fits(1, 0);
        assert_eq!(view.known(1), Known::Fits(0));
        assert_eq!(view.bonus_bound(1, || unreachable!()), Some(0));
        view.failed(0, None);
        assert!(view.known_to_fail(0) && !view.known_to_fail(1));
        assert_eq!(view.bounds(), [BOUND_FAILED, 0]);
        assert_eq!(view.bonus_bound(0, || unreachable!()), None);
        // Same reasons are interned once.
        assert_eq!(
            shapes.intern(&why),
            shapes.intern(&not_here("claim gpu: no free device"))
        );
    }

    #[test]
    fn device_failures_outlive_devices_taken_and_nothing_outlives_devices_given_back() {
        let mut c = Cluster::default();
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
        c.apply_node(&node).unwrap();
        c.dra.enable();
        let claim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c1", "namespace": "ns"}, "spec": {}}))
        .unwrap();
        c.dra.apply_claim(claim);
        let on_n1 = serde_json::from_value(serde_json::json!({
            "devices": {"results": [{"request": "r", "driver": "d", "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}))
        .unwrap();
        let slot = c.index["n1"];
        let id = |device: &str| crate::dra::DeviceId {
            driver: "d".to_owned(),
            pool: "n1".to_owned(),
            device: device.to_owned(),
        };
        let fails = DeviceOutcome::UpstreamFails("cannot allocate all claims".to_owned());
        let remember_all = |c: &Cluster| {
            c.remember_device_outcome(slot, 1, fails.clone());
            c.remember_device_outcome(slot, 2, DeviceOutcome::AlignedFails);
            c.remember_device_outcome(slot, 3, DeviceOutcome::UpstreamFits(None));
            c.remember_device_outcome(slot, 4, DeviceOutcome::UpstreamFits(Some(vec![id("gpu-1")])));
            c.remember_device_outcome(slot, 5, DeviceOutcome::UpstreamFits(Some(vec![id("gpu-0")])));
            c.remember_device_outcome(slot, 6, DeviceOutcome::BonusLevelsFail);
        };
        remember_all(&c);
        c.dra.commit("ns", "c1", on_n1);
        assert_eq!(c.device_outcome(slot, 1), Some(fails.clone()));
        assert_eq!(c.device_outcome(slot, 2), Some(DeviceOutcome::AlignedFails));
        assert_eq!(c.device_outcome(slot, 3), None, "a fit may be gone");
        assert_eq!(
            c.device_outcome(slot, 4),
            Some(DeviceOutcome::UpstreamFits(Some(vec![id("gpu-1")]))),
            "its devices are still free"
        );
        assert_eq!(c.device_outcome(slot, 5), None, "one of its devices was taken");
        assert_eq!(c.device_outcome(slot, 6), Some(DeviceOutcome::BonusLevelsFail));
        remember_all(&c);
        c.dra.delete_claim("ns", "c1");
        for key in 1..=6 {
            assert_eq!(c.device_outcome(slot, key), None, "key {key}: devices came back");
        }
    }
}
