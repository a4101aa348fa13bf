//! The decision path of pods with `spec.resourceClaims`: kube-scheduler's DynamicResources
//! filter. The pod's claims are resolved once (a missing claim rejects every node), then the
//! allocator runs per node on the nodes that pass node fit, the NUMA prediction and the
//! constraint plugins. Pods without claims never come here.

mod attempt;
mod search;

use super::{
    Cluster, Config, Decision, Explain, NodeVerdict, TopologyState, aggregate_message,
    claims_cache::{ClaimShapeKey, Known, ShapeView},
};
use crate::{
    dra::{
        DraError,
        numa::NotHere,
        state::{ClaimAllocation, ResolvedClaims},
    },
    fit::Filter,
    node::NodeBasics,
    pod::PodSpec,
    prepared::PreparedPod,
};

/// What the DynamicResources filter adds to a decision.
#[derive(Debug, Default)]
pub struct ClaimsOutcome {
    /// For a placed pod: each claim and the allocation it gets (or has).
    pub claims: Vec<ClaimAllocation>,
    /// A claim error that fails the whole scheduling attempt (kube-scheduler's status Error):
    /// an unknown DeviceClass, a selector that does not compile or evaluate, an incomplete pool
    /// for `allocationMode: All`, …
    pub error: Option<DraError>,
}

const CATEGORY: &str = "cannot allocate all claims";

/// A node as the allocation sees it.
#[derive(Clone, Copy)]
struct OnNode<'n> {
    node: &'n NodeBasics,
    /// Its valid NodeResourceTopology (the zones the prediction reads).
    topology: Option<&'n crate::node::NumaTopology>,
    /// The devices in use, when not the cluster's.
    in_use: Option<&'n crate::dra::AllocatedState>,
}

/// The two halves of the allocation on a node.
#[derive(Clone, Copy)]
enum Step {
    /// Find devices; a failure may be left unexplained.
    Search,
    /// [`Step::Search`] short of a misaligned allocation: where only one of those may be left,
    /// the attempt is deferred (the ranked pass tries the node again at the score it gets
    /// there, when that can still win).
    Ranked,
    /// Say why a search found nothing.
    Explain,
}

/// The allocations on a node and the score their alignment adds, or why not (`None`: not
/// said yet).
type Attempt = Result<(Vec<ClaimAllocation>, i64), Option<NotHere>>;

/// An attempt whose failure is said; one left unsaid gets the generic category (explaining
/// always says why, so only a bug would leave one).
fn told_why(a: Attempt) -> Result<(Vec<ClaimAllocation>, i64), NotHere> {
    a.map_err(|not_here| {
        not_here.unwrap_or_else(|| NotHere {
            reason: CATEGORY.to_owned(),
            alignment: false,
        })
    })
}

/// What the search found on the nodes it tried, by position in name order: a decision where
/// no node fits explains each node without searching it again.
type Tried = std::collections::BTreeMap<usize, Attempt>;
const NUMA_CATEGORY: &str =
    "cannot allocate all claims on the NUMA nodes where the kubelet pins the containers";

/// A shareID: a UID-shaped name for one shared allocation, derived from the pod, the claim and
/// the result (the same inputs give the same report).
fn share_id(pod: &str, claim: usize, result: usize) -> String {
    // FNV-1a over the inputs, twice with different seeds for 128 bits.
    let mut out = [0u64; 2];
    for (i, seed) in [0xcbf2_9ce4_8422_2325u64, 0x6c62_272e_07bb_0142]
        .into_iter()
        .enumerate()
    {
        let mut h = seed;
        for b in pod.bytes().chain(claim.to_le_bytes()).chain(result.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        out[i] = h;
    }
    uuid::Uuid::from_u64_pair(out[0], out[1]).hyphenated().to_string()
}

impl Cluster {
    /// [`Self::schedule`], and for a pod with claims the allocations it would get on the
    /// chosen node (or the claim error that failed the attempt).
    pub fn schedule_with_claims(
        &self,
        cfg: &Config,
        pod: &PodSpec,
        explain: bool,
    ) -> (Decision, ClaimsOutcome) {
        if !self.dra.enabled() || pod.resource_claims.is_empty() {
            return (self.schedule(cfg, pod, explain), ClaimsOutcome::default());
        }
        let prepared = self.prepare(pod);
        let explain = if explain {
            Explain::Every
        } else {
            Explain::Failures
        };
        self.schedule_claims(cfg, &prepared, explain)
    }

    /// [`Self::decide`] for any pod: for a pod with claims, the allocations it would get on
    /// the chosen node; when no node fits, only the aggregate message, from what earlier
    /// attempts found on the nodes that have not changed since.
    pub fn decide_with_claims(&self, cfg: &Config, pod: &PodSpec) -> (Decision, ClaimsOutcome) {
        if !self.dra.enabled() || pod.resource_claims.is_empty() {
            return (self.decide(cfg, pod), ClaimsOutcome::default());
        }
        let prepared = self.prepare(pod);
        let (mut decision, outcome) = self.schedule_claims(cfg, &prepared, Explain::Message);
        if decision.node.is_none() {
            decision.nodes.clear();
        }
        (decision, outcome)
    }

    /// Records the allocations of a placed pod's claims (what PreBind would write), so later
    /// pods see the devices in use.
    pub fn commit_claims(&mut self, pod: &PodSpec, claims: &[ClaimAllocation]) {
        for c in claims {
            self.dra.commit(&pod.namespace, &c.name, c.allocation.clone());
        }
    }

    /// Whether `pod`'s claims can be allocated on `node` once the bound pods `removed`
    /// (keys) are gone: the claims reserved only for them give their devices back
    /// (kube-scheduler's DynamicResources filter during preemption), and the devices follow
    /// the NUMA nodes predicted on `topology` (the node's zones without those pods), as a
    /// decision's do. True for a pod without claims.
    pub(super) fn claims_fit_without(
        &self,
        cfg: &Config,
        pod: &PreparedPod<'_>,
        node: &NodeBasics,
        removed: &std::collections::BTreeSet<&str>,
        topology: Option<&crate::node::NumaTopology>,
    ) -> bool {
        let spec = pod.spec;
        if !self.dra.enabled() || spec.resource_claims.is_empty() {
            return true;
        }
        let Ok(resolved) = self.dra.resolve(&spec.namespace, &spec.resource_claims) else {
            return false;
        };
        let mut by_namespace: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for key in removed {
            if let Some((ns, name)) = key.split_once('/') {
                by_namespace.entry(ns).or_default().push(name);
            }
        }
        let freed: Vec<String> = by_namespace
            .iter()
            .flat_map(|(ns, names)| self.dra.freed_by(ns, names))
            .collect();
        let in_use = self.dra.in_use_freeing(&freed);
        let key = spec.key();
        let share = |c: usize, r: usize| share_id(&key, c, r);
        let on = OnNode {
            node,
            topology,
            in_use: in_use.as_ref(),
        };
        matches!(
            self.try_claims(cfg, pod, &resolved, on, &share, Step::Search),
            Ok(Ok(_))
        )
    }

    pub(super) fn schedule_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        explain: Explain,
    ) -> (Decision, ClaimsOutcome) {
        let pod = prepared.spec;
        if let Some(reason) = prepared.volumes.blocked() {
            return (
                crate::decision::blocked_decision(pod, reason, self.node_names()),
                ClaimsOutcome::default(),
            );
        }
        let resolved = match self.dra.resolve(&pod.namespace, &pod.resource_claims) {
            Ok(r) => r,
            Err(e) => {
                let verdicts: Vec<NodeVerdict> = self
                    .nodes()
                    .map(|n| NodeVerdict {
                        node: n.name.clone(),
                        kubelet_reason: None,
                        approximate: Box::default(),
                        feasible: false,
                        score: None,
                        reasons: vec![e.to_string()],
                        categories: vec!["pod has unresolved resource claims".to_owned()],
                        filter: Some(Filter::DynamicResources),
                    })
                    .collect();
                return (self.no_node(pod, verdicts), ClaimsOutcome::default());
            }
        };
        let key = pod.key();
        let share = |c: usize, r: usize| share_id(&key, c, r);
        let cons = self.constraints.prepare(&pod.facts, || self.nodes().collect());
        let tried = Tried::new();
        if explain == Explain::Every || cons.is_some() {
            return self.claims_explained(cfg, prepared, &resolved, cons.as_ref(), tried, &share, None);
        }
        let shape = ClaimShapeKey::of(cfg, prepared, &resolved);
        let mut resolved = resolved;
        resolved.digest = Some(shape.digest());
        resolved.pod_digest = Some(
            shape.pod_digest(
                pod.init_containers
                    .iter()
                    .chain(&pod.containers)
                    .map(|c| c.name.as_str()),
            ),
        );
        self.with_claim_cache(shape, |cache| {
            self.search_claims(cfg, prepared, &resolved, tried, &share, explain, cache)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn claims_explained(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        cons: Option<&crate::constraints::PodConstraints<'_>>,
        mut tried: Tried,
        share: &dyn Fn(usize, usize) -> String,
        mut cache: Option<&mut ShapeView<'_>>,
    ) -> (Decision, ClaimsOutcome) {
        let pod = prepared.spec;
        let nodes: Vec<&NodeBasics> = self.nodes().collect();
        let mut verdicts: Vec<NodeVerdict> = nodes
            .iter()
            .map(|n| self.evaluate(cfg, prepared, n, true))
            .collect();
        if let Some(cons) = cons {
            for (v, n) in verdicts.iter_mut().zip(&nodes) {
                if v.feasible
                    && let Some(f) = cons.check(n)
                {
                    v.feasible = false;
                    v.score = None;
                    v.filter = Some(f.filter);
                    v.categories.push(f.category);
                    v.reasons.push(f.message);
                }
            }
        }
        let mut allocations: Vec<Option<Vec<ClaimAllocation>>> = vec![None; nodes.len()];
        for (i, (v, n)) in verdicts.iter_mut().zip(&nodes).enumerate() {
            if !v.feasible {
                continue;
            }
            let slot = self.order.get(i).copied();
            let known = match (cache.as_ref(), slot) {
                (Some(c), Some(slot)) => c.known(slot),
                _ => Known::Nothing,
            };
            let attempt = self.explain_attempt(cfg, prepared, resolved, n, share, tried.remove(&i), known);
            match attempt {
                Ok(Ok((claims, bonus))) => {
                    allocations[i] = Some(claims);
                    v.score = v.score.map(|s| s.saturating_add(bonus));
                }
                Ok(Err(not_here)) => {
                    if let (Some(c), Some(slot)) = (cache.as_mut(), slot) {
                        c.failed(slot, Some(&not_here));
                    }
                    v.feasible = false;
                    v.score = None;
                    v.filter = Some(Filter::DynamicResources);
                    v.categories.push(
                        if not_here.alignment {
                            NUMA_CATEGORY
                        } else {
                            CATEGORY
                        }
                        .to_owned(),
                    );
                    v.reasons.push(not_here.reason);
                }
                Err(e) if e.is_node_error() => {
                    v.feasible = false;
                    v.score = None;
                    v.filter = Some(Filter::DynamicResources);
                    v.categories.push(CATEGORY.to_owned());
                    v.reasons.push(e.to_string());
                }
                Err(e) => return self.claims_failed(pod, n, e),
            }
        }
        if let Some(cons) = cons {
            let feasible: Vec<usize> = (0..verdicts.len()).filter(|&i| verdicts[i].feasible).collect();
            let feasible_nodes: Vec<&NodeBasics> = feasible.iter().map(|&i| nodes[i]).collect();
            for (&i, extra) in feasible.iter().zip(cons.scores(&feasible_nodes, &nodes)) {
                verdicts[i].score = verdicts[i].score.map(|s| s.saturating_add(extra));
            }
        }
        let best = verdicts
            .iter()
            .enumerate()
            .filter(|(_, v)| v.feasible)
            .max_by(|(_, a), (_, b)| a.score.cmp(&b.score).then_with(|| b.node.cmp(&a.node)))
            .map(|(i, v)| (i, v.node.clone()));
        let Some((i, node)) = best else {
            return (self.no_node(pod, verdicts), ClaimsOutcome::default());
        };
        let (placement, allocation) = self.placement_on(prepared, &node);
        let claims = allocations[i].take().unwrap_or_default();
        (
            Decision {
                pod: pod.key(),
                message: format!("Successfully assigned {} to {node}", pod.key()),
                node: Some(node),
                placement,
                allocation,
                nodes: verdicts,
            },
            ClaimsOutcome { claims, error: None },
        )
    }

    /// The node at position `i` of the name order, and its slot.
    fn at_position(&self, i: usize) -> Option<(usize, &NodeBasics)> {
        let slot = *self.order.get(i)?;
        Some((slot, self.slots.get(slot)?.as_ref()?))
    }

    /// The allocation on `n`, or why there is none, from what was found there (`tried`, or
    /// what the cache knows) and, for what is not said yet, a search.
    #[allow(clippy::too_many_arguments)]
    fn explain_attempt(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        n: &NodeBasics,
        share: &dyn Fn(usize, usize) -> String,
        tried: Option<Attempt>,
        known: Known<'_>,
    ) -> Result<Result<(Vec<ClaimAllocation>, i64), NotHere>, DraError> {
        match (tried, known) {
            (Some(Ok(found)), _) => Ok(Ok(found)),
            (Some(Err(Some(not_here))), _) => Ok(Err(not_here)),
            (None, Known::Explained(not_here)) => Ok(Err(not_here.clone())),
            (Some(Err(None)), _) | (None, Known::Failed) => {
                self.why_no_claims(cfg, prepared, resolved, n, share)
            }
            (None, Known::Nothing | Known::Fits(_)) => {
                self.allocate_claims(cfg, prepared, resolved, n, share)
            }
        }
    }

    /// Allocates the pod's claims on node `n`, NUMA-aligned as `cfg.dra_numa` says, with each
    /// allocation annotated with its devices' and containers' NUMA nodes when the node has a
    /// valid NRT. The `i64` is the score the alignment adds.
    fn allocate_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        n: &NodeBasics,
        share: &dyn Fn(usize, usize) -> String,
    ) -> Result<Result<(Vec<ClaimAllocation>, i64), NotHere>, DraError> {
        match self.try_claims(cfg, prepared, resolved, self.on(n), share, Step::Search)? {
            Err(None) => self.why_no_claims(cfg, prepared, resolved, n, share),
            told => Ok(told_why(told)),
        }
    }

    /// Why [`Self::try_claims`] found nothing on `n` (or, where nothing is required, the
    /// unaligned allocation it gets after all).
    fn why_no_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        n: &NodeBasics,
        share: &dyn Fn(usize, usize) -> String,
    ) -> Result<Result<(Vec<ClaimAllocation>, i64), NotHere>, DraError> {
        Ok(told_why(self.try_claims(
            cfg,
            prepared,
            resolved,
            self.on(n),
            share,
            Step::Explain,
        )?))
    }

    /// Node `n` as it is now.
    fn on<'n>(&'n self, n: &'n NodeBasics) -> OnNode<'n> {
        OnNode {
            node: n,
            topology: match self.topology(&n.name) {
                TopologyState::Valid(t) => Some(t),
                _ => None,
            },
            in_use: None,
        }
    }

    fn no_node(&self, pod: &PodSpec, verdicts: Vec<NodeVerdict>) -> Decision {
        Decision {
            pod: pod.key(),
            node: None,
            message: aggregate_message(&verdicts),
            placement: None,
            allocation: None,
            nodes: verdicts,
        }
    }

    /// The attempt fails with an error (no node is chosen; kube-scheduler retries the pod
    /// later): the node where it surfaced carries the reason.
    fn claims_failed(&self, pod: &PodSpec, node: &NodeBasics, e: DraError) -> (Decision, ClaimsOutcome) {
        let message = format!(
            "running DynamicResources filter plugin on node {}: {e}",
            node.name
        );
        (
            Decision {
                pod: pod.key(),
                node: None,
                message: message.clone(),
                placement: None,
                allocation: None,
                nodes: vec![NodeVerdict {
                    node: node.name.clone(),
                    kubelet_reason: None,
                    approximate: Box::default(),
                    feasible: false,
                    score: None,
                    reasons: vec![message],
                    categories: vec!["scheduling attempt failed with an error".to_owned()],
                    filter: Some(Filter::DynamicResources),
                }],
            },
            ClaimsOutcome {
                claims: Vec::new(),
                error: Some(e),
            },
        )
    }
}
