//! One attempt at a pod's claims on one node: the search (aligned with the CPUs the kubelet
//! will pin, through the device outcomes every claim shape shares), or the explanation of a
//! search that found nothing.

use super::{Attempt, OnNode, Step};
use crate::{
    admission::Placement,
    cluster::{
        Cluster, Config,
        claims_cache::{DeviceOutcome, outcome_key},
    },
    dra::{
        DeviceId, DraError,
        allocator::DeviceFilter,
        numa::{self, ContainerNuma, DraNumaAlignment, Levels, NodeNuma, NotHere, Pinned, Searched},
        state::{ClaimAllocation, ResolvedClaims},
    },
    pod::PodSpec,
    prepared::PreparedPod,
    topology_manager::Policy,
};

impl Cluster {
    /// One step of the allocation on a node: the search (`Err(None)` when it fails and saying
    /// why would take more searches), or the explanation after a failed search.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_claims(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        on: OnNode<'_>,
        share: &dyn Fn(usize, usize) -> String,
        step: Step,
    ) -> Result<Attempt, DraError> {
        // Only `Step::Ranked` defers; were another step to, its failure stays unexplained.
        Ok(self
            .try_claims_at(cfg, prepared, resolved, on, share, step)?
            .unwrap_or(Err(None)))
    }

    /// [`Self::try_claims`], or `None` when `Step::Ranked` deferred the attempt: the claims
    /// get no aligned allocation there, and a misaligned one may exist (not searched).
    pub(super) fn try_claims_at(
        &self,
        cfg: &Config,
        prepared: &PreparedPod<'_>,
        resolved: &ResolvedClaims<'_>,
        on: OnNode<'_>,
        share: &dyn Fn(usize, usize) -> String,
        step: Step,
    ) -> Result<Option<Attempt>, DraError> {
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
            Ok(Some(search(None)?.map(|c| (c, 0)).map_err(|reason| {
                Some(NotHere {
                    reason,
                    alignment: false,
                })
            })))
        };
        let topo = match on.topology {
            Some(t) if names_claims => t,
            _ => return unaligned(),
        };
        let mode = cfg.dra_numa.alignment;
        // What a search of the node's devices finds is shared by pods whose claims are the
        // same, whatever their CPUs (not for a what-if with other devices in use).
        let slot = match (resolved.digest, on.in_use) {
            (Some(d), None) => self.index.get(&n.name).map(|&slot| (slot, d)),
            _ => None,
        };
        let upstream_key = slot.map(|(slot, d)| (slot, outcome_key(&(d, &topo.pci_locality))));
        let known = |key: Option<(usize, u64)>| key.and_then(|(slot, k)| self.device_outcome(slot, k));
        let remember = |key: Option<(usize, u64)>, outcome: DeviceOutcome| {
            if let Some((slot, k)) = key {
                self.remember_device_outcome(slot, k, outcome);
            }
        };
        // The CPUs are predicted for the NUMA nodes they land on: all the alignment reads (no
        // device IDs, no allocation record).
        let predict = || {
            let predict = || {
                let mut zones = crate::admission::WorkingZones::from_topology(topo);
                crate::admission::predict_prepared(&self.res, topo, &mut zones, prepared)
            };
            match (slot, resolved.pod_digest) {
                (Some((slot, _)), Some(pod)) => {
                    let generation = self.generations.get(slot).copied().unwrap_or(0);
                    self.predictions.get_or(slot, generation, pod, predict)
                }
                _ => predict().map(std::sync::Arc::new),
            }
        };
        let strict = matches!(topo.policy, Policy::SingleNumaNode | Policy::Restricted);
        let machine = topo.info.ids();
        if mode == DraNumaAlignment::Ignore && !matches!(step, Step::Explain) {
            // Upstream's search whatever the CPUs: they are predicted only to report where
            // the devices found landed. A failure outlives devices taken, as the explanation's.
            if let Some(DeviceOutcome::UpstreamFails(_)) = known(upstream_key) {
                return Ok(Some(Err(None)));
            }
            let mut claims = match search(None)? {
                Ok(claims) => claims,
                Err(reason) => {
                    remember(upstream_key, DeviceOutcome::UpstreamFails(reason));
                    return Ok(Some(Err(None)));
                }
            };
            if let Ok(placement) = predict() {
                let containers = containers_numa(pod, &placement);
                self.annotate_found(cfg, n, resolved, &mut claims, &containers, topo, strict, &[]);
            }
            return Ok(Some(Ok((claims, 0))));
        }
        let Ok(placement) = predict() else {
            // The NUMA filter rejects the node before; nothing to align with.
            return unaligned();
        };
        let containers = containers_numa(pod, &placement);
        let targets = numa::targets(mode, strict, machine, &containers);
        let attrs = &cfg.dra_numa.driver_attributes;
        let ctx = NodeNuma {
            targets: &targets,
            machine,
            driver_attributes: attrs,
            pci_locality: &topo.pci_locality,
        };
        let aligned_key = slot.map(|(slot, d)| (slot, outcome_key(&(d, &topo.pci_locality, &targets))));
        let found = match step {
            Step::Search | Step::Ranked => {
                // Without targets the search is upstream's.
                let key = if targets.is_empty() {
                    upstream_key
                } else {
                    aligned_key
                };
                let levels = match (known(key), step) {
                    (Some(DeviceOutcome::AlignedFails | DeviceOutcome::UpstreamFails(_)), _) => None,
                    (Some(DeviceOutcome::BonusLevelsFail), Step::Ranked) => return Ok(None),
                    (Some(DeviceOutcome::BonusLevelsFail), _) => Some(Levels::Misaligned),
                    (_, Step::Ranked) => Some(Levels::Bonus),
                    _ => Some(Levels::All),
                };
                match levels {
                    None => Err(None),
                    Some(levels) => match numa::search_aligned(resolved, &search, &ctx, levels)? {
                        Searched::Found(c, q) => Ok((c, q)),
                        Searched::NotFound => {
                            if !targets.is_empty() {
                                remember(key, DeviceOutcome::AlignedFails);
                            }
                            Err(None)
                        }
                        Searched::MisalignedLeft => {
                            remember(key, DeviceOutcome::BonusLevelsFail);
                            return Ok(None);
                        }
                    },
                }
            }
            Step::Explain => {
                let upstream = match known(upstream_key) {
                    Some(DeviceOutcome::UpstreamFails(reason)) => Some(Err(reason)),
                    Some(DeviceOutcome::UpstreamFits(_)) => Some(Ok(())),
                    _ => None,
                };
                let learned = upstream.is_none();
                // The devices of what upstream's search finds, kept as the witness of its fit.
                let witness = std::cell::RefCell::new(None);
                let recorded = |filter: Option<&DeviceFilter<'_>>| {
                    let found = search(filter);
                    if filter.is_none()
                        && let Ok(Ok(claims)) = &found
                    {
                        *witness.borrow_mut() = self.witness(&n.name, claims);
                    }
                    found
                };
                // A requirement's own search reads the node's devices, not its CPUs: what it
                // found is kept as upstream's is (a failure outlives devices taken, a fit
                // lasts while its devices stay free).
                let target_fits = |t: &numa::Target, f: &DeviceFilter<'_>| {
                    let key =
                        slot.map(|(slot, d)| (slot, outcome_key(&(d, &topo.pci_locality, "requirement", t))));
                    match known(key) {
                        Some(DeviceOutcome::AlignedFails) => return false,
                        Some(DeviceOutcome::UpstreamFits(_)) => return true,
                        _ => {}
                    }
                    match search(Some(f)) {
                        Ok(Ok(claims)) => {
                            remember(key, DeviceOutcome::UpstreamFits(self.witness(&n.name, &claims)));
                            true
                        }
                        Ok(Err(_)) => {
                            remember(key, DeviceOutcome::AlignedFails);
                            false
                        }
                        // Not the pod's error (only upstream's own search decides those).
                        Err(_) => false,
                    }
                };
                let found = numa::explain_not_aligned(resolved, &recorded, &target_fits, &ctx, upstream)?;
                if learned {
                    match &found {
                        Err(n) if !n.alignment => {
                            remember(upstream_key, DeviceOutcome::UpstreamFails(n.reason.clone()))
                        }
                        _ => remember(upstream_key, DeviceOutcome::UpstreamFits(witness.take())),
                    }
                }
                found.map_err(Some)
            }
        };
        let (mut claims, quality) = match found {
            Ok(found) => found,
            Err(not_here) => return Ok(Some(Err(not_here))),
        };
        self.annotate_found(cfg, n, resolved, &mut claims, &containers, topo, strict, &targets);
        Ok(Some(Ok((claims, quality.bonus()))))
    }

    /// Marks each allocation found on `n` with its devices' and containers' NUMA nodes, against
    /// the search's `targets` (under Ignore, those Preferred would have: the report still shows
    /// where the devices landed).
    #[allow(clippy::too_many_arguments)]
    fn annotate_found(
        &self,
        cfg: &Config,
        n: &crate::node::NodeBasics,
        resolved: &ResolvedClaims<'_>,
        claims: &mut [ClaimAllocation],
        containers: &[ContainerNuma<'_>],
        topo: &crate::node::NumaTopology,
        strict: bool,
        targets: &[numa::Target],
    ) {
        let machine = topo.info.ids();
        let shown = if cfg.dra_numa.alignment == DraNumaAlignment::Ignore {
            std::borrow::Cow::Owned(numa::targets(
                DraNumaAlignment::Preferred,
                strict,
                machine,
                containers,
            ))
        } else {
            std::borrow::Cow::Borrowed(targets)
        };
        let report = NodeNuma {
            targets: &shown,
            machine,
            driver_attributes: &cfg.dra_numa.driver_attributes,
            pci_locality: &topo.pci_locality,
        };
        numa::annotate(&self.dra, &n.name, resolved, claims, containers, &report);
    }

    /// The devices `claims` were given on node `node`, when they alone make the allocation: none
    /// consumes shared counters or may be shared, so other claims taking other devices cannot
    /// undo it. `None` otherwise.
    fn witness(&self, node: &str, claims: &[ClaimAllocation]) -> Option<Vec<DeviceId>> {
        let mut out = Vec::new();
        for r in claims.iter().flat_map(|c| {
            c.allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
        }) {
            let device = self.dra.device_on(node, &r.driver, &r.pool, &r.device)?;
            let alone = r.share_id.is_none()
                && r.admin_access != Some(true)
                && device.consumes_counters.as_ref().is_none_or(Vec::is_empty)
                && device.allow_multiple_allocations != Some(true);
            if !alone {
                return None;
            }
            out.push(DeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            });
        }
        Some(out)
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
