//! Preemption as kube-scheduler's DefaultPreemption decides it (v1.36
//! `framework/preemption` and `plugins/defaultpreemption`), with one difference: what a victim
//! gives back is counted where it sits, per NUMA zone and device ([`Release`]), and the
//! preemptor must then pass the same predicted kubelet admission as any placement. Victims whose
//! resources sit on zones the preemptor cannot use are never needed, so the reprieve passes keep
//! them (the upstream NUMA plugin re-adds victims' requests without knowing their zones).
//!
//! Pure: the cluster index supplies, per node, the candidate victims and a `fits` check over
//! "these candidates removed"; this module orders, reprieves, counts disruption budgets and
//! picks the node.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
};

use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use numaplane::allocation::{Allocation, ContainerKind};

use crate::{
    node::NumaTopology,
    pod::{PodSpec, Qos},
    resources::{CPU, ResId, ResKind, ResList, Resources},
    selector::Selector,
};

/// The condition kube-scheduler puts on a victim before deleting it.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason.
pub const PREEMPTION_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// What preemption reads of a pod that may be evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VictimInfo {
    /// `namespace/name`.
    pub key: String,
    /// UID (the deletion is pinned to it).
    pub uid: Option<String>,
    /// Namespace.
    pub namespace: String,
    /// Name (PodDisruptionBudgets list disrupted pods by name).
    pub name: String,
    /// Labels (PodDisruptionBudget selectors).
    pub labels: BTreeMap<String, String>,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `status.startTime`, else the creation time, in ms since the epoch (0 when unknown).
    pub start_ms: i64,
    /// Being deleted already: it leaves anyway, and deleting it again frees nothing sooner.
    pub terminating: bool,
    /// Deleted by a scheduler's preemption (`DisruptionTarget` with reason
    /// `PreemptionByScheduler`, and a deletion timestamp).
    pub terminating_by_preemption: bool,
}

/// Milliseconds since the epoch of an API timestamp.
fn epoch_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_millisecond()
}

impl VictimInfo {
    /// The preemption view of `pod`.
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let name = meta.name.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let start_ms = status
            .and_then(|s| s.start_time.as_ref())
            .or(meta.creation_timestamp.as_ref())
            .map_or(0, epoch_ms);
        let terminating = meta.deletion_timestamp.is_some();
        let by_preemption = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == DISRUPTION_TARGET && c.reason.as_deref() == Some(PREEMPTION_BY_SCHEDULER));
        VictimInfo {
            key: format!("{namespace}/{name}"),
            uid: meta.uid.clone(),
            namespace,
            name,
            labels: meta.labels.clone().unwrap_or_default(),
            priority: priority_of(pod),
            start_ms,
            terminating,
            terminating_by_preemption: terminating && by_preemption,
        }
    }
}

/// `spec.priority`, 0 when unset (the API server fills it from the PriorityClass).
pub fn priority_of(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Whether `pod` may preempt at all: not with `preemptionPolicy: Never`.
pub fn may_preempt(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.preemption_policy.as_deref()) != Some("Never")
}

/// kube-scheduler's `MoreImportantPod`: higher priority first, then the one that started
/// earlier.
fn more_important(a: &VictimInfo, b: &VictimInfo) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.start_ms.cmp(&b.start_ms))
        .then_with(|| a.key.cmp(&b.key))
}

/// A PodDisruptionBudget as preemption reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Namespace.
    pub namespace: String,
    /// `spec.selector`, parsed once; absent or invalid matches nothing, as upstream.
    pub selector: Selector,
    /// `status.disruptionsAllowed`.
    pub allowed: i32,
    /// `status.disruptedPods`: names the API server has already processed.
    pub disrupted: BTreeSet<String>,
}

impl Budget {
    /// The preemption view of a PodDisruptionBudget.
    pub fn from_pdb(pdb: &PodDisruptionBudget) -> Self {
        let status = pdb.status.as_ref();
        Budget {
            namespace: pdb
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            selector: Selector::from_label_selector(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()))
                .unwrap_or_default(),
            allowed: status.and_then(|s| s.disruptions_allowed).unwrap_or(0),
            disrupted: status
                .and_then(|s| s.disrupted_pods.as_ref())
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// Whether the budget covers `pod`: same namespace and a non-empty selector that matches
    /// (an absent, empty or invalid selector matches nothing here, as upstream).
    fn covers(&self, pod: &VictimInfo) -> bool {
        if self.namespace != pod.namespace || pod.labels.is_empty() {
            return false;
        }
        // An empty selector matches everything in general, but nothing for a budget.
        !self.selector.is_everything() && self.selector.matches(&pod.labels)
    }
}

/// kube-scheduler's `filterPodsWithPDBViolation`: splits `pods` (indexes, in the order given)
/// into those whose eviction would exceed a budget and the others. Each eviction spends one
/// disruption of every budget covering it, in order.
pub fn split_by_budgets(pods: &[&VictimInfo], budgets: &[Budget]) -> (Vec<usize>, Vec<usize>) {
    let mut allowed: Vec<i32> = budgets.iter().map(|b| b.allowed).collect();
    let (mut violating, mut fine) = (Vec::new(), Vec::new());
    for (i, pod) in pods.iter().enumerate() {
        let mut violated = false;
        for (b, left) in budgets.iter().zip(allowed.iter_mut()) {
            if !b.covers(pod) || b.disrupted.contains(&pod.name) {
                continue;
            }
            *left = left.saturating_sub(1);
            if *left < 0 {
                violated = true;
            }
        }
        if violated {
            violating.push(i);
        } else {
            fine.push(i);
        }
    }
    (violating, fine)
}

/// The victims chosen on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVictims {
    /// Node name.
    pub node: String,
    /// Indexes into the node's candidate list, most important first.
    pub victims: Vec<usize>,
    /// Victims whose eviction exceeds a disruption budget.
    pub budget_violations: usize,
    /// Highest victim priority (`i32::MIN` when there is no victim).
    pub highest_priority: i32,
    /// Sum of the victims' priorities, each shifted by 2^31 as upstream (so negatives count).
    pub priority_sum: i64,
    /// Earliest start among the highest-priority victims (`i64::MIN` when none is known).
    pub earliest_start_ms: i64,
}

/// kube-scheduler's `SelectVictimsOnNode`: every candidate of lower priority than `priority`
/// is removed; if the pod then fits, candidates are given back (reprieved) one by one, most
/// important first, those whose eviction would exceed a budget before the others, and every
/// one whose return keeps the pod fitting stays. Then, since giving one back can make an
/// earlier victim unnecessary (another zone chosen by the prediction), the remaining victims
/// are offered back once more in the same order until none can return: every victim left is
/// needed. `fits(removed)` says whether the pod fits with exactly the candidates `removed`
/// (indexes) gone. `None`: no candidate, or the pod does not fit even with all gone.
pub fn select_victims<C: std::borrow::Borrow<VictimInfo>>(
    node: &str,
    candidates: &[C],
    priority: i32,
    budgets: &[Budget],
    mut fits: impl FnMut(&BTreeSet<usize>) -> bool,
) -> Option<NodeVictims> {
    let candidates: Vec<&VictimInfo> = candidates.iter().map(std::borrow::Borrow::borrow).collect();
    let mut potential: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].priority < priority && !candidates[i].terminating)
        .collect();
    if potential.is_empty() {
        return None;
    }
    potential.sort_by(|&a, &b| more_important(candidates[a], candidates[b]));
    let mut removed: BTreeSet<usize> = potential.iter().copied().collect();
    if !fits(&removed) {
        return None;
    }
    let views: Vec<&VictimInfo> = potential.iter().map(|&i| candidates[i]).collect();
    let (violating, fine) = split_by_budgets(&views, budgets);
    let violating: BTreeSet<usize> = violating.into_iter().map(|i| potential[i]).collect();
    let order: Vec<usize> = potential
        .iter()
        .copied()
        .filter(|i| violating.contains(i))
        .chain(fine.into_iter().map(|i| potential[i]))
        .collect();
    let mut reprieve = |i: usize, removed: &mut BTreeSet<usize>| {
        removed.remove(&i);
        if fits(removed) {
            true
        } else {
            removed.insert(i);
            false
        }
    };
    for &i in &order {
        reprieve(i, &mut removed);
    }
    // Bounded: each round either gives one victim back or ends.
    loop {
        let left: Vec<usize> = order.iter().copied().filter(|i| removed.contains(i)).collect();
        if !left.into_iter().any(|i| reprieve(i, &mut removed)) {
            break;
        }
    }
    let mut victims: Vec<usize> = removed.into_iter().collect();
    victims.sort_by(|&a, &b| more_important(candidates[a], candidates[b]));
    let highest_priority = victims.first().map_or(i32::MIN, |&i| candidates[i].priority);
    let earliest_start_ms = victims
        .iter()
        .filter(|&&i| candidates[i].priority == highest_priority)
        .map(|&i| candidates[i].start_ms)
        .filter(|&s| s > 0)
        .min()
        .unwrap_or(i64::MIN);
    Some(NodeVictims {
        node: node.to_owned(),
        budget_violations: victims.iter().filter(|i| violating.contains(i)).count(),
        highest_priority,
        priority_sum: victims.iter().fold(0i64, |sum, &i| {
            sum.saturating_add(i64::from(candidates[i].priority) + (1i64 << 31))
        }),
        earliest_start_ms,
        victims,
    })
}

/// kube-scheduler's `pickOneNodeForPreemption`: a node needing no victim; else fewest budget
/// violations, then the lowest highest-victim priority, the lowest priority sum, the fewest
/// victims, the latest start of the highest-priority victims, then the first in `options`'
/// order (node-name order).
pub fn pick_node(options: &[NodeVictims]) -> Option<usize> {
    if let Some(i) = options.iter().position(|o| o.victims.is_empty()) {
        return Some(i);
    }
    let key = |o: &NodeVictims| {
        (
            o.budget_violations,
            o.highest_priority,
            o.priority_sum,
            o.victims.len(),
            std::cmp::Reverse(o.earliest_start_ms),
        )
    };
    options
        .iter()
        .enumerate()
        .min_by(|(ia, a), (ib, b)| key(a).cmp(&key(b)).then(ia.cmp(ib)))
        .map(|(i, _)| i)
}

/// Whether a pod that already holds a nomination should wait rather than preempt again:
/// lower-priority pods on its nominated node are still terminating because of a preemption.
pub fn waits_for_victims<'a>(
    priority: i32,
    nominated_node_pods: impl IntoIterator<Item = &'a VictimInfo>,
) -> bool {
    nominated_node_pods
        .into_iter()
        .any(|p| p.priority < priority && p.terminating_by_preemption)
}

/// What evicting a pod gives back to its node's zones, as far as its allocation record tells:
/// exclusive CPUs and memory of containers placed on one zone, and the devices they hold. A
/// container spread over several zones gives back its devices' count nowhere and its amounts
/// nowhere (the split is the kubelet's): preemption may then find no room where there is
/// some, never room where there is none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Amounts per zone id.
    pub zones: Vec<(u32, ResList)>,
    /// Device IDs per zone id and resource.
    pub devices: Vec<(u32, ResId, Vec<String>)>,
}

impl Release {
    /// Whether the release gives nothing back to any zone.
    pub fn is_empty(&self) -> bool {
        self.zones.is_empty() && self.devices.is_empty()
    }
}

/// The [`Release`] of a pod with allocation `record` and model `spec`. Ordinary init
/// containers are left out: they finished, and the app containers reuse what they held.
pub fn release_of(res: &mut Resources, spec: &PodSpec, record: &Allocation) -> Release {
    let pod_zone = match record.pod_numa_nodes.as_deref() {
        Some([z]) => Some(*z),
        _ => None,
    };
    let mut zones: BTreeMap<u32, ResList> = BTreeMap::new();
    let mut devices: BTreeMap<(u32, ResId), Vec<String>> = BTreeMap::new();
    for c in record.containers.iter().filter(|c| c.kind != ContainerKind::Init) {
        let zone = match c.numa_nodes.as_deref() {
            Some([z]) => Some(*z),
            Some(_) => None,
            None => pod_zone,
        };
        let Some(zone) = zone else { continue };
        let model = match c.kind {
            ContainerKind::App => spec.containers.iter().find(|m| m.name == c.name),
            _ => spec
                .init_containers
                .iter()
                .find(|m| m.name == c.name && m.sidecar),
        };
        let Some(model) = model else { continue };
        if spec.qos == Qos::Guaranteed && !spec.pod_level {
            let amounts = zones.entry(zone).or_default();
            for (id, v) in model.requests.positive() {
                let exclusive = match res.kind(id) {
                    ResKind::Cpu => model.integer_cpu,
                    k => k.is_memory_like(),
                };
                if exclusive {
                    amounts.add(id, v);
                }
            }
        }
        for (name, ids) in &c.devices {
            let rid = res.intern(name);
            zones
                .entry(zone)
                .or_default()
                .add(rid, i64::try_from(ids.len()).unwrap_or(i64::MAX));
            devices
                .entry((zone, rid))
                .or_default()
                .extend(ids.iter().cloned());
        }
        for (name, &n) in &c.device_counts {
            let rid = res.intern(name);
            zones.entry(zone).or_default().add(rid, n.max(0));
        }
    }
    Release {
        zones: zones.into_iter().filter(|(_, l)| !l.is_empty()).collect(),
        devices: devices
            .into_iter()
            .map(|((z, r), mut ids)| {
                ids.sort();
                ids.dedup();
                (z, r, ids)
            })
            .collect(),
    }
}

/// Gives a [`Release`] back to `topo`'s zones, never above a zone's allocatable (the NRT may
/// show part of it free already).
pub fn give_back(topo: &mut NumaTopology, r: &Release) {
    let threads = topo.full_pcpus_threads;
    for (zone, amounts) in &r.zones {
        let Some(z) = topo.zones.iter_mut().find(|z| z.id == *zone) else {
            continue;
        };
        for (id, v) in amounts.positive() {
            let (Some(now), Some(cap)) = (z.available.get(id), z.allocatable.get(id)) else {
                continue;
            };
            let next = now.saturating_add(v).min(cap);
            // Whole cores come back with exclusive CPUs under full-pcpus-only.
            if id == CPU
                && let (Some(t), Some(free)) = (threads.filter(|&t| t > 0), z.free_cores.as_mut())
            {
                let cores = next.saturating_sub(now) / 1000 / t;
                *free = free.saturating_add(cores).min(cap / 1000 / t);
            }
            z.available.set(id, next);
        }
    }
    for (zone, rid, ids) in &r.devices {
        if let Some(free) = topo
            .zones
            .iter_mut()
            .find(|z| z.id == *zone)
            .and_then(|z| z.free_devices.get_mut(rid))
        {
            for id in ids {
                if !free.contains(id) {
                    free.push(id.clone());
                }
            }
            free.sort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn victim(name: &str, priority: i32, start_ms: i64) -> VictimInfo {
        VictimInfo {
            key: format!("ns/{name}"),
            uid: Some(format!("uid-{name}")),
            namespace: "ns".into(),
            name: name.into(),
            labels: BTreeMap::from([("app".to_owned(), name.to_owned())]),
            priority,
            start_ms,
            ..VictimInfo::default()
        }
    }

    fn budget(app: &str, allowed: i32) -> Budget {
        Budget {
            namespace: "ns".into(),
            selector: Selector::from_label_selector(Some(&LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                ..LabelSelector::default()
            }))
            .expect("valid"),
            allowed,
            disrupted: BTreeSet::new(),
        }
    }

    #[test]
    fn reprieves_the_most_important_first_and_keeps_only_what_is_needed() {
        // The pod needs two candidates gone. a (priority 5) is offered back first and
        // returns; then neither b nor c can return, so both go, b (older) listed first.
        let cands = vec![victim("a", 5, 10), victim("b", 1, 20), victim("c", 1, 30)];
        let free_with = |removed: &BTreeSet<usize>| removed.len() >= 2;
        let v = select_victims("n", &cands, 10, &[], free_with).expect("fits with all gone");
        assert_eq!(v.victims, vec![1, 2], "a is reprieved, b and c are needed");
        assert_eq!(v.highest_priority, 1);
        assert_eq!(v.priority_sum, 2 + 2 * (1i64 << 31));
        assert_eq!(v.earliest_start_ms, 20);
    }

    #[test]
    fn higher_or_equal_priority_and_terminating_pods_are_never_victims() {
        let mut t = victim("t", 1, 1);
        t.terminating = true;
        let cands = vec![victim("same", 10, 1), victim("higher", 11, 1), t];
        assert_eq!(select_victims("n", &cands, 10, &[], |_| true), None);
    }

    #[test]
    fn no_victims_when_even_all_removed_does_not_fit() {
        let cands = vec![victim("a", 1, 1)];
        assert_eq!(select_victims("n", &cands, 10, &[], |_| false), None);
    }

    #[test]
    fn budget_violators_are_reprieved_before_the_others() {
        // One of a, b must go. a is more important (priority 3 vs 2) but covered by a budget
        // with no disruption left: it is offered back first and stays; b goes.
        let cands = vec![victim("a", 3, 1), victim("b", 2, 1)];
        let budgets = [budget("a", 0)];
        let v = select_victims("n", &cands, 10, &budgets, |r| !r.is_empty()).expect("fits");
        assert_eq!(v.victims, vec![1]);
        assert_eq!(v.budget_violations, 0);
        // If only a's removal makes room, it goes and counts as a violation.
        let v = select_victims("n", &cands, 10, &budgets, |r| r.contains(&0)).expect("fits");
        assert_eq!(v.victims, vec![0]);
        assert_eq!(v.budget_violations, 1);
    }

    #[test]
    fn a_second_pass_returns_victims_a_later_reprieve_made_unnecessary() {
        // The pod fits if a or b is gone: a returns (b still gone), b cannot, c returns.
        let cands = vec![victim("a", 5, 1), victim("b", 4, 1), victim("c", 3, 1)];
        let v = select_victims("n", &cands, 10, &[], |r| r.contains(&0) || r.contains(&1)).expect("fits");
        assert_eq!(v.victims, vec![1]);
        // Every victim left is needed: giving any one back breaks the fit.
        let fits = |r: &BTreeSet<usize>| r.contains(&0) || (r.contains(&1) && r.contains(&2));
        let v = select_victims("n", &cands, 10, &[], fits).expect("fits");
        for &i in &v.victims {
            let mut back: BTreeSet<usize> = v.victims.iter().copied().collect();
            back.remove(&i);
            assert!(!fits(&back), "victim {i} was not needed");
        }
    }

    #[test]
    fn budgets_count_down_in_order_and_skip_disrupted_pods() {
        let a = victim("a", 1, 1);
        let mut a2 = victim("a2", 1, 2);
        a2.labels = a.labels.clone();
        let mut a3 = victim("a3", 1, 3);
        a3.labels = a.labels.clone();
        let mut b = budget("a", 1);
        b.disrupted.insert("a2".into());
        let (violating, fine) = split_by_budgets(&[&a, &a2, &a3], &[b]);
        assert_eq!(
            fine,
            vec![0, 1],
            "a spends the one disruption; a2 was processed already"
        );
        assert_eq!(violating, vec![2]);
        // Another namespace, an empty selector or an unlabelled pod: not covered.
        let mut other = budget("a", 0);
        other.namespace = "elsewhere".into();
        let mut empty = budget("a", 0);
        empty.selector = Selector::everything();
        let mut bare = victim("bare", 1, 1);
        bare.labels.clear();
        assert_eq!(
            split_by_budgets(&[&a, &bare], &[other, empty]).0,
            Vec::<usize>::new()
        );
    }

    #[test]
    fn pick_node_follows_upstream_order() {
        let nv = |node: &str, viol, high, sum, n, start| NodeVictims {
            node: node.into(),
            victims: (0..n).collect(),
            budget_violations: viol,
            highest_priority: high,
            priority_sum: sum,
            earliest_start_ms: start,
        };
        let opts = vec![
            nv("a", 1, 0, 0, 1, 0),
            nv("b", 0, 5, 5, 1, 0),
            nv("c", 0, 3, 9, 3, 0),
        ];
        assert_eq!(
            pick_node(&opts),
            Some(2),
            "no violation, then lowest highest priority"
        );
        let opts = vec![nv("a", 0, 3, 9, 2, 0), nv("b", 0, 3, 8, 3, 0)];
        assert_eq!(pick_node(&opts), Some(1), "lowest priority sum");
        let opts = vec![nv("a", 0, 3, 8, 3, 0), nv("b", 0, 3, 8, 2, 0)];
        assert_eq!(pick_node(&opts), Some(1), "fewest victims");
        let opts = vec![nv("a", 0, 3, 8, 2, 100), nv("b", 0, 3, 8, 2, 200)];
        assert_eq!(
            pick_node(&opts),
            Some(1),
            "latest start of the highest-priority victims"
        );
        let opts = vec![nv("a", 0, 3, 8, 2, 100), nv("b", 0, 3, 8, 2, 100)];
        assert_eq!(pick_node(&opts), Some(0), "then the first");
        let opts = vec![nv("a", 0, 3, 8, 2, 100), nv("b", 9, 9, 9, 0, 0)];
        assert_eq!(
            pick_node(&opts),
            Some(1),
            "a node needing no victim wins outright"
        );
        assert_eq!(pick_node(&[]), None);
    }

    #[test]
    fn budget_selectors_follow_label_semantics_and_invalid_ones_cover_nothing() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement as Req;
        let pod = victim("x", 1, 1);
        let covers = |op: &str, values: Option<Vec<&str>>| {
            let pdb = PodDisruptionBudget {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    namespace: Some("ns".into()),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec {
                    selector: Some(LabelSelector {
                        match_expressions: Some(vec![Req {
                            key: "app".into(),
                            operator: op.into(),
                            values: values.map(|v| v.into_iter().map(str::to_owned).collect()),
                        }]),
                        ..LabelSelector::default()
                    }),
                    ..Default::default()
                }),
                status: None,
            };
            Budget::from_pdb(&pdb).covers(&pod)
        };
        assert!(covers("In", Some(vec!["x", "y"])));
        assert!(!covers("NotIn", Some(vec!["x"])));
        assert!(covers("Exists", None));
        assert!(!covers("DoesNotExist", None));
        assert!(!covers("In", Some(vec![])), "invalid: covers nothing");
        assert!(!covers("Gt", Some(vec!["1"])), "invalid: covers nothing");
    }
}
