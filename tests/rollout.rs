//! A rolling update of a rendered Deployment, step by step, on `n` interchangeable nodes, as
//! the Deployment controller does it (kubernetes `pkg/controller/deployment/rolling.go`,
//! `rolloutRolling`). Each step is one sync of every controller, each reading the state the
//! previous step left:
//!
//! 1. the Deployment controller scales the new ReplicaSet up, or else the old one down:
//!    - up (`reconcileNewReplicaSet`, `NewRSNewReplicas` in `util/deployment_util.go`): to at
//!      most `replicas + maxSurge` pods in both ReplicaSets, never past `replicas`; a sync that
//!      scaled up does nothing else;
//!    - down (`reconcileOldReplicaSets`): at most `all - minAvailable - new unavailable` old
//!      pods, where `minAvailable = replicas - maxUnavailable`: first the old ones that are not
//!      available (`cleanupUnhealthyReplicas`), then, while more pods of both ReplicaSets are
//!      available than `minAvailable`, available ones (`scaleDownOldReplicaSetsForRollingUpdate`);
//!
//!    maxSurge is rounded up from a percentage, maxUnavailable down (at most `replicas`), 25%
//!    when unset, and maxUnavailable is 1 when both come to 0 (`ResolveFenceposts`);
//! 2. the ReplicaSet controller creates missing pods and deletes extra ones: unscheduled first,
//!    then not Ready, then the newest (`controller.ActivePodsWithRanks`);
//! 3. the scheduler puts each pending pod on the node with fewest of the Deployment's pods;
//!    required pod anti-affinity on `kubernetes.io/hostname` that selects them leaves only
//!    nodes with none (preferred anti-affinity, or the default spreading, is the "fewest");
//! 4. a scheduled pod runs at once; the Lease goes to the oldest running pod when its holder is
//!    gone; the [`Readiness`] model says which running pods are Ready, and Ready is Available
//!    (`minReadySeconds` 0).
//!
//! Deleted pods are gone within the step (no termination grace period). A PodDisruptionBudget
//! does not hold a rollout back (it guards evictions, which the Deployment controller does not
//! use): the outcome says when fewer pods were Ready than it requires.

use std::collections::BTreeSet;

use serde_json::Value;

/// Which running pods are Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Every running pod, leader or follower.
    Running,
    /// The Lease holder only.
    LeaderOnly,
}

/// What the rollout depends on, from a Deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategy {
    pub replicas: i64,
    /// Resolved: pods over `replicas` the rollout may create.
    pub max_surge: i64,
    /// Resolved: pods under `replicas` that may be unavailable.
    pub max_unavailable: i64,
    /// Required pod anti-affinity on the hostname keeps the pods one per node.
    pub one_per_node: bool,
    /// The pod template's labels.
    labels: Value,
}

impl Strategy {
    /// The strategy of a Deployment (as rendered, before the API server's defaults).
    pub fn of(deployment: &Value) -> Result<Self, String> {
        let spec = &deployment["spec"];
        let replicas = match &spec["replicas"] {
            Value::Null => 1,
            v => v.as_i64().filter(|r| *r >= 0).ok_or(format!("replicas {v}"))?,
        };
        match spec["strategy"]["type"].as_str() {
            None | Some("RollingUpdate") => {}
            Some(other) => return Err(format!("strategy {other} is not simulated")),
        }
        let rolling = &spec["strategy"]["rollingUpdate"];
        let or_default = |v: &Value| {
            if v.is_null() {
                Value::from("25%")
            } else {
                v.clone()
            }
        };
        let max_surge = scaled(&or_default(&rolling["maxSurge"]), replicas, true)?;
        let mut max_unavailable = scaled(&or_default(&rolling["maxUnavailable"]), replicas, false)?;
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        let template = &spec["template"];
        let labels = template["metadata"]["labels"].clone();
        Ok(Strategy {
            replicas,
            max_surge,
            max_unavailable: max_unavailable.min(replicas),
            one_per_node: one_per_node(&template["spec"]["affinity"]["podAntiAffinity"], &labels)?,
            labels,
        })
    }
}

/// `intstr.GetScaledValueFromIntOrPercent`: an integer, or a percentage of `total`.
fn scaled(v: &Value, total: i64, round_up: bool) -> Result<i64, String> {
    let bad = || format!("{v} is neither a count nor a percentage");
    if let Some(n) = v.as_i64() {
        return if n >= 0 { Ok(n) } else { Err(bad()) };
    }
    let percent: i64 = v
        .as_str()
        .and_then(|s| s.strip_suffix('%'))
        .and_then(|p| p.parse().ok())
        .filter(|p| *p >= 0)
        .ok_or_else(bad)?;
    let x = percent * total;
    Ok(if round_up { (x + 99) / 100 } else { x / 100 })
}

/// Whether `selector` (`matchLabels` only) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> Result<bool, String> {
    let Some(sel) = selector.as_object() else {
        return Ok(false); // No selector selects no pod.
    };
    if let Some(other) = sel.keys().find(|k| *k != "matchLabels") {
        return Err(format!("selector field {other} is not simulated"));
    }
    Ok(sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_some_and(|m| m.iter().all(|(k, v)| &labels[k] == v)))
}

/// Whether a required term of `anti` keeps pods labelled `labels` apart per hostname.
fn one_per_node(anti: &Value, labels: &Value) -> Result<bool, String> {
    let mut apart = false;
    for term in anti["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(other) = term
            .as_object()
            .into_iter()
            .flat_map(|t| t.keys())
            .find(|k| !matches!(k.as_str(), "topologyKey" | "labelSelector"))
        {
            return Err(format!("anti-affinity field {other} is not simulated"));
        }
        if term["topologyKey"] != "kubernetes.io/hostname" {
            return Err(format!(
                "anti-affinity topology {} is not simulated",
                term["topologyKey"]
            ));
        }
        apart |= selects(&term["labelSelector"], labels)?;
    }
    Ok(apart)
}

/// The Ready pods a PodDisruptionBudget requires of a Deployment's `replicas` (the disruption
/// controller's `desiredHealthy`; percentages rounded up), or `None` if it selects other pods.
fn pdb_requires(pdb: &Value, strategy: &Strategy) -> Result<Option<i64>, String> {
    if !selects(&pdb["spec"]["selector"], &strategy.labels)? {
        return Ok(None);
    }
    let spec = &pdb["spec"];
    let n = strategy.replicas;
    match (&spec["minAvailable"], &spec["maxUnavailable"]) {
        (Value::Null, Value::Null) => {
            Err("a PodDisruptionBudget sets neither minAvailable nor maxUnavailable".to_owned())
        }
        (min, Value::Null) => Ok(Some(scaled(min, n, true)?)),
        (Value::Null, max) => Ok(Some(n - scaled(max, n, true)?)),
        _ => Err("a PodDisruptionBudget sets minAvailable and maxUnavailable".to_owned()),
    }
}

/// Counts after a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub old_pods: usize,
    pub old_ready: usize,
    pub new_pods: usize,
    pub new_ready: usize,
    /// Pods no node takes.
    pub pending: usize,
    /// Whether the Lease holder is a new pod (`None`: no holder).
    pub leader_is_new: Option<bool>,
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let leader = match self.leader_is_new {
            None => "none",
            Some(true) => "new",
            Some(false) => "old",
        };
        write!(
            f,
            "old {} ({} Ready), new {} ({} Ready), {} pending, leader {leader}",
            self.old_pods, self.old_ready, self.new_pods, self.new_ready, self.pending
        )
    }
}

/// How a rollout went.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The step after which every pod was new and running, if one was within the limit.
    pub completed_after: Option<usize>,
    /// The first step after which fewer pods were Ready than the PodDisruptionBudget requires
    /// (0: before the rollout).
    pub pdb_breached_after: Option<usize>,
    /// The state after the last step simulated.
    pub last: Snapshot,
    /// One line per step, the state before the rollout first.
    pub trace: Vec<String>,
}

#[derive(Debug)]
struct Pod {
    id: usize,
    new: bool,
    node: Option<usize>,
}

struct Cluster {
    strategy: Strategy,
    nodes: usize,
    readiness: Readiness,
    /// `spec.replicas` of the old and the new ReplicaSet.
    old_replicas: i64,
    new_replicas: i64,
    pods: Vec<Pod>,
    ready: BTreeSet<usize>,
    leader: Option<usize>,
    next_id: usize,
}

/// Rolls `deployment` (with every pod of its old template in place, as far as the nodes take
/// them) over to a new template on `nodes` nodes, for at most `max_steps` steps.
pub fn simulate(
    deployment: &Value,
    pdb: Option<&Value>,
    nodes: usize,
    readiness: Readiness,
    max_steps: usize,
) -> Result<Outcome, String> {
    let strategy = Strategy::of(deployment)?;
    let pdb_requires = match pdb {
        Some(p) => pdb_requires(p, &strategy)?,
        None => None,
    };
    let mut c = Cluster {
        old_replicas: strategy.replicas,
        new_replicas: 0,
        strategy,
        nodes,
        readiness,
        pods: Vec::new(),
        ready: BTreeSet::new(),
        leader: None,
        next_id: 0,
    };
    let mut outcome = Outcome {
        completed_after: None,
        pdb_breached_after: None,
        last: Snapshot::default(),
        trace: Vec::new(),
    };
    for step in 0..=max_steps {
        if step > 0 {
            c.sync_deployment();
        }
        c.sync_replica_sets();
        c.schedule();
        c.run();
        let s = c.snapshot();
        outcome.trace.push(format!("after step {step}: {s}"));
        outcome.last = s;
        let ready = (s.old_ready + s.new_ready) as i64;
        if outcome.pdb_breached_after.is_none() && pdb_requires.is_some_and(|r| ready < r) {
            outcome.pdb_breached_after = Some(step);
        }
        if step > 0 && s.old_pods == 0 && s.pending == 0 && s.new_pods as i64 == c.strategy.replicas {
            outcome.completed_after = Some(step);
            break;
        }
    }
    Ok(outcome)
}

impl Cluster {
    fn available(&self, new: bool) -> i64 {
        self.pods
            .iter()
            .filter(|p| p.new == new && self.ready.contains(&p.id))
            .count() as i64
    }

    /// `rolloutRolling`: scale the new ReplicaSet up, or else the old one down.
    fn sync_deployment(&mut self) {
        let s = &self.strategy;
        let all = self.old_replicas + self.new_replicas;
        // NewRSNewReplicas
        if self.new_replicas < s.replicas && all < s.replicas + s.max_surge {
            self.new_replicas += (s.replicas + s.max_surge - all).min(s.replicas - self.new_replicas);
            return;
        }
        // reconcileOldReplicaSets
        if self.old_replicas == 0 {
            return;
        }
        let min_available = s.replicas - s.max_unavailable;
        let new_unavailable = self.new_replicas - self.available(true);
        let max_scaled_down = all - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return;
        }
        // cleanupUnhealthyReplicas
        let old_available = self.available(false);
        self.old_replicas -= (self.old_replicas - old_available).clamp(0, max_scaled_down);
        // scaleDownOldReplicaSetsForRollingUpdate, on the ReplicaSets' statuses as they were
        let available = old_available + self.available(true);
        if available > min_available {
            self.old_replicas -= (available - min_available).min(self.old_replicas);
        }
    }

    /// Each ReplicaSet creates or deletes pods to match its `spec.replicas`.
    fn sync_replica_sets(&mut self) {
        for (new, want) in [(false, self.old_replicas), (true, self.new_replicas)] {
            let mut mine: Vec<&Pod> = self.pods.iter().filter(|p| p.new == new).collect();
            let have = mine.len();
            let want = usize::try_from(want).unwrap_or(0);
            if have > want {
                // ActivePodsWithRanks: unscheduled, then not Ready, then newest go first.
                mine.sort_by_key(|p| {
                    (
                        p.node.is_some(),
                        self.ready.contains(&p.id),
                        std::cmp::Reverse(p.id),
                    )
                });
                let gone: BTreeSet<usize> = mine[..have - want].iter().map(|p| p.id).collect();
                self.pods.retain(|p| !gone.contains(&p.id));
            }
            for _ in have..want {
                self.pods.push(Pod {
                    id: self.next_id,
                    new,
                    node: None,
                });
                self.next_id += 1;
            }
        }
    }

    /// Pending pods, oldest first, onto the node with fewest pods (and none if one per node).
    fn schedule(&mut self) {
        for i in 0..self.pods.len() {
            if self.pods[i].node.is_some() {
                continue;
            }
            let load = |n: usize| self.pods.iter().filter(|p| p.node == Some(n)).count();
            self.pods[i].node = (0..self.nodes)
                .filter(|n| !self.strategy.one_per_node || load(*n) == 0)
                .min_by_key(|n| (load(*n), *n));
        }
    }

    /// Leader election and readiness.
    fn run(&mut self) {
        let running = |id: usize| self.pods.iter().any(|p| p.id == id && p.node.is_some());
        if !self.leader.is_some_and(running) {
            self.leader = self.pods.iter().filter(|p| p.node.is_some()).map(|p| p.id).min();
        }
        self.ready = self
            .pods
            .iter()
            .filter(|p| {
                p.node.is_some()
                    && match self.readiness {
                        Readiness::Running => true,
                        Readiness::LeaderOnly => self.leader == Some(p.id),
                    }
            })
            .map(|p| p.id)
            .collect();
    }

    fn snapshot(&self) -> Snapshot {
        let count = |new: bool, ready: bool| {
            self.pods
                .iter()
                .filter(|p| p.new == new && (!ready || self.ready.contains(&p.id)))
                .count()
        };
        Snapshot {
            old_pods: count(false, false),
            old_ready: count(false, true),
            new_pods: count(true, false),
            new_ready: count(true, true),
            pending: self.pods.iter().filter(|p| p.node.is_none()).count(),
            leader_is_new: self
                .leader
                .and_then(|l| self.pods.iter().find(|p| p.id == l))
                .map(|p| p.new),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn deployment(replicas: i64, surge: Value, unavailable: Value, required: bool) -> Value {
        let labels = json!({"app": "x"});
        let term = json!({"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": labels}});
        let anti = if required {
            json!({"requiredDuringSchedulingIgnoredDuringExecution": [term]})
        } else {
            json!({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]})
        };
        json!({"spec": {
            "replicas": replicas,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
            "template": {"metadata": {"labels": labels}, "spec": {"affinity": {"podAntiAffinity": anti}}},
        }})
    }

    #[test]
    fn surge_rounds_up_and_unavailable_down() {
        let s = Strategy::of(&deployment(3, json!("25%"), json!("25%"), false)).unwrap();
        assert_eq!((s.max_surge, s.max_unavailable, s.one_per_node), (1, 0, false));
        let s = Strategy::of(&deployment(10, json!("0%"), json!("5%"), true)).unwrap();
        assert_eq!((s.max_surge, s.max_unavailable, s.one_per_node), (0, 1, true));
        let s = Strategy::of(&json!({"spec": {"replicas": 4}})).unwrap();
        assert_eq!((s.max_surge, s.max_unavailable), (1, 1));
        let s = Strategy::of(&deployment(2, json!(1), json!(5), false)).unwrap();
        assert_eq!((s.max_surge, s.max_unavailable), (1, 2));
        assert!(Strategy::of(&deployment(2, json!("1"), json!(0), false)).is_err());
    }

    #[test]
    fn surge_without_unavailability_keeps_every_pod_ready() {
        let d = deployment(3, json!(1), json!(0), false);
        let pdb = json!({"spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "x"}}}});
        let o = simulate(&d, Some(&pdb), 1, Readiness::Running, 20).unwrap();
        // One new pod at a time, each replacing an old one: 3 × (up, down).
        assert_eq!(o.completed_after, Some(6), "{:#?}", o.trace);
        assert_eq!(o.pdb_breached_after, None, "{:#?}", o.trace);
    }

    #[test]
    fn one_pod_per_node_on_one_node_leaves_the_new_pod_pending() {
        let d = deployment(2, json!(0), json!(1), true);
        let o = simulate(&d, None, 1, Readiness::Running, 20).unwrap();
        assert_eq!(o.completed_after, None, "{:#?}", o.trace);
        let stuck = Snapshot {
            old_pods: 1,
            old_ready: 1,
            new_pods: 1,
            new_ready: 0,
            pending: 1,
            leader_is_new: Some(false),
        };
        assert_eq!(o.last, stuck, "{:#?}", o.trace);
        // Two nodes are enough.
        assert!(
            simulate(&d, None, 2, Readiness::Running, 20)
                .unwrap()
                .completed_after
                .is_some()
        );
    }

    #[test]
    fn a_budget_above_what_the_strategy_keeps_is_breached() {
        let d = deployment(2, json!(0), json!(1), false);
        let pdb = json!({"spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "x"}}}});
        let o = simulate(&d, Some(&pdb), 2, Readiness::Running, 20).unwrap();
        assert!(o.completed_after.is_some(), "{:#?}", o.trace);
        assert_eq!(o.pdb_breached_after, Some(1), "{:#?}", o.trace);
        let other = json!({"spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "y"}}}});
        let o = simulate(&d, Some(&other), 2, Readiness::Running, 20).unwrap();
        assert_eq!(o.pdb_breached_after, None);
    }
}
