//! The decision path of pods with `spec.resourceClaims`: kube-scheduler's DynamicResources
//! filter. The pod's claims are resolved once (a missing claim rejects every node), then the
//! allocator runs per node on the nodes that pass node fit, the NUMA prediction and the
//! constraint plugins. Pods without claims never come here.

use std::collections::BinaryHeap;

use super::{Cluster, Config, Decision, NodeVerdict, TopologyState, aggregate_message};
use crate::{
    admission::Placement,
    dra::{
        DraError,
        allocator::DeviceFilter,
        numa::{self, ContainerNuma, DraNumaAlignment, MAX_BONUS, NodeNuma, NotHere, Pinned},
        state::{ClaimAllocation, ResolvedClaims},
    },
    fit::Filter,
    node::NodeBasics,
    pod::PodSpec,
    prepared::PreparedPod,
    topology_manager::Policy,
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

/// Every node with what the search found there, if it was tried: a decision where no node
/// fits explains each node without searching it again.
type Tried<'n> = Vec<(&'n NodeBasics, Option<Attempt>)>;
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
        self.schedule_claims(cfg, &prepared, explain)
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
        explain: bool,
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
        let mut tried: Tried<'_> = self.nodes().map(|n| (n, None)).collect();
        if !explain && cons.is_none() {
            // Best node first by the cached NUMA verdicts; the allocator runs on the nodes
            // tried, down to the first where the claims fit.
            // Alignment adds up to MAX_BONUS to the score of a node with a Topology Manager
            // policy: nodes are tried by their best possible total until none left can beat
            // the best found. Without alignment (Ignore, no container naming a claim) the
            // order is the score's and the first node that fits wins.
            let aligns = cfg.dra_numa.alignment != DraNumaAlignment::Ignore
                && pod
                    .init_containers
                    .iter()
                    .chain(&pod.containers)
                    .any(|c| !c.claims.is_empty());
            if !aligns {
                // Without alignment the allocation adds nothing to the score, so the order
                // below would try the plain path's best node first: try it directly, and
                // build the order only when the claims do not fit there.
                let best = self.best_node(cfg, prepared);
                if let Some((slot, score)) = best
                    && let Some(Some(n)) = self.slots.get(slot)
                {
                    match self.try_claims(cfg, prepared, &resolved, self.on(n), &share, Step::Search) {
                        Ok(Ok((claims, bonus))) => {
                            return (
                                self.decision_on(prepared, n.name.clone(), score.saturating_add(bonus)),
                                ClaimsOutcome { claims, error: None },
                            );
                        }
                        Ok(Err(_)) => {}
                        Err(e) if e.is_node_error() => {}
                        Err(e) => return self.claims_failed(pod, n, e),
                    }
                }
            }
            let scores = self.cached_scores(cfg, prepared);
            // Looked up only when alignment can add to the score: a topology lookup per node
            // per pod was most of a DRA pod's decision time.
            let potential = |n: &NodeBasics| {
                if !aligns {
                    return 0;
                }
                match self.topology(&n.name) {
                    TopologyState::Valid(t) if t.policy != Policy::None => MAX_BONUS,
                    _ => 0,
                }
            };
            let mut heap: BinaryHeap<(i64, std::cmp::Reverse<usize>, i64)> = scores
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let s = (*s)?;
                    let bound = s.saturating_add(tried.get(i).map_or(0, |(n, _)| potential(n)));
                    Some((bound, std::cmp::Reverse(i), s))
                })
                .collect();
            let mut best: Option<(i64, usize, Vec<ClaimAllocation>)> = None;
            while let Some((bound, std::cmp::Reverse(i), score)) = heap.pop() {
                if let Some((total, at, _)) = &best
                    && (bound < *total || (bound == *total && i > *at))
                {
                    break;
                }
                let Some(&(n, _)) = tried.get(i) else { continue };
                match self.try_claims(cfg, prepared, &resolved, self.on(n), &share, Step::Search) {
                    Ok(Ok((claims, bonus))) => {
                        let total = score.saturating_add(bonus);
                        if best
                            .as_ref()
                            .is_none_or(|(t, at, _)| total > *t || (total == *t && i < *at))
                        {
                            best = Some((total, i, claims));
                        }
                    }
                    Ok(Err(not_here)) => {
                        if let Some((_, slot)) = tried.get_mut(i) {
                            *slot = Some(Err(not_here));
                        }
                    }
                    Err(e) if e.is_node_error() => {}
                    Err(e) => return self.claims_failed(pod, n, e),
                }
            }
            if let Some((total, i, claims)) = best
                && let Some(&(n, _)) = tried.get(i)
            {
                return (
                    self.decision_on(prepared, n.name.clone(), total),
                    ClaimsOutcome { claims, error: None },
                );
            }
            // No node fits: the explained decision says why.
        }
        self.claims_explained(cfg, prepared, &resolved, cons.as_ref(), tried, &share)
    }

    fn claims_explained(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        cons: Option<&crate::constraints::PodConstraints<'_>>,
        mut tried: Tried<'_>,
        share: &dyn Fn(usize, usize) -> String,
    ) -> (Decision, ClaimsOutcome) {
        let pod = prepared.spec;
        let nodes: Vec<&NodeBasics> = tried.iter().map(|(n, _)| *n).collect();
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
            let attempt = match tried.get_mut(i).and_then(|(_, a)| a.take()) {
                Some(Ok(found)) => Ok(Ok(found)),
                Some(Err(Some(not_here))) => Ok(Err(not_here)),
                Some(Err(None)) => self.why_no_claims(cfg, prepared, resolved, n, share),
                None => self.allocate_claims(cfg, prepared, resolved, n, share),
            };
            match attempt {
                Ok(Ok((claims, bonus))) => {
                    allocations[i] = Some(claims);
                    v.score = v.score.map(|s| s.saturating_add(bonus));
                }
                Ok(Err(not_here)) => {
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

    /// One step of the allocation on a node: the search (`Err(None)` when it fails and saying
    /// why would take more searches), or the explanation after a failed search.
    fn try_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        on: OnNode<'_>,
        share: &dyn Fn(usize, usize) -> String,
        step: Step,
    ) -> Result<Attempt, DraError> {
        let pod = prepared.spec;
        let n = on.node;
        let search = |filter: Option<&DeviceFilter<'_>>| {
            self.dra
                .allocate_in_use(resolved, &n.name, &n.labels, share, on.in_use, filter)
        };
        let names_claims = pod
            .init_containers
            .iter()
            .chain(&pod.containers)
            .any(|c| !c.claims.is_empty());
        let unaligned = || {
            Ok(search(None)?.map(|c| (c, 0)).map_err(|reason| {
                Some(NotHere {
                    reason,
                    alignment: false,
                })
            }))
        };
        let topo = match on.topology {
            Some(t) if names_claims => t,
            _ => return unaligned(),
        };
        let (placement, _) = self.placement_in(prepared, &n.name, topo);
        let Some(placement) = placement else {
            // The NUMA filter rejects the node before; nothing to align with.
            return unaligned();
        };
        let containers = containers_numa(pod, &placement);
        let strict = matches!(topo.policy, Policy::SingleNumaNode | Policy::Restricted);
        let mode = cfg.dra_numa.alignment;
        let machine = topo.info.ids();
        let targets = numa::targets(mode, strict, machine, &containers);
        let attrs = &cfg.dra_numa.driver_attributes;
        let ctx = NodeNuma {
            targets: &targets,
            machine,
            driver_attributes: attrs,
            pci_locality: &topo.pci_locality,
        };
        let found = match step {
            Step::Search => numa::search_aligned(resolved, &search, &ctx)?.ok_or(None),
            Step::Explain => numa::explain_not_aligned(resolved, &search, &ctx)?.map_err(Some),
        };
        let (mut claims, quality) = match found {
            Ok(found) => found,
            Err(not_here) => return Ok(Err(not_here)),
        };
        // Under Ignore the report still shows where the devices landed.
        let shown = if mode == DraNumaAlignment::Ignore {
            numa::targets(DraNumaAlignment::Preferred, strict, machine, &containers)
        } else {
            targets.clone()
        };
        let report = NodeNuma {
            targets: &shown,
            machine,
            driver_attributes: attrs,
            pci_locality: &topo.pci_locality,
        };
        numa::annotate(&self.dra, &n.name, resolved, &mut claims, &containers, &report);
        Ok(Ok((claims, quality.bonus())))
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

/// The containers of `pod` as the alignment sees them in `placement` (init containers first).
fn containers_numa<'a>(pod: &'a PodSpec, placement: &'a Placement) -> Vec<ContainerNuma<'a>> {
    placement
        .containers
        .iter()
        .filter_map(|c| {
            let spec = pod
                .init_containers
                .iter()
                .chain(&pod.containers)
                .find(|s| s.name == c.name)?;
            Some(ContainerNuma {
                name: &c.name,
                numa_nodes: c.numa_nodes.as_deref().or(placement.pod_numa_nodes.as_deref()),
                pinned: Pinned {
                    cpu: c.exclusive_cpus > 0,
                    memory: c.memory_mask.is_some(),
                },
                claims: &spec.claims,
            })
        })
        .collect()
}
