//! Prometheus metrics of the live scheduler (prometheus-client). Labels reuse kube-scheduler's
//! vocabulary (`result`, `profile`, `queue`) under our own prefix, so PromQL written for
//! kube-scheduler carries over; pod names never become labels.

use numaplane::metrics::Registrar;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;

/// `result` (scheduled, unschedulable, error) and `profile` (scheduler name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// Outcome.
    pub result: &'static str,
    /// Scheduler name.
    pub profile: String,
}

/// One bounded label named `queue`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// active, backoff, unschedulable, in_flight.
    pub queue: &'static str,
}

/// How a bound claim's devices sit relative to its containers' NUMA nodes
/// ([`crate::dra::numa::AlignmentStatus::metric_label`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlignmentLabels {
    /// A bounded verdict.
    pub alignment: &'static str,
}

/// One bounded label named `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A bounded reason.
    pub reason: &'static str,
}

/// One bounded label named `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// A bounded outcome.
    pub result: &'static str,
}

/// One bounded label named `kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// A bounded kind.
    pub kind: String,
}

/// `state` of a node's topology data.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopologyLabels {
    /// valid, stale, missing, invalid.
    pub state: &'static str,
}

/// `verb` (filter, prioritize, bind) and `result` (ok, error) of an extender call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExtenderLabels {
    /// The verb.
    pub verb: &'static str,
    /// ok or error.
    pub result: &'static str,
}

/// A node and a kubelet option the model cannot predict there.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApproximateLabels {
    /// Node name.
    pub node: String,
    /// `name=value` of the kubelet option.
    pub option: String,
}

/// `verb` of an extender call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// The verb.
    pub verb: &'static str,
}

/// One bounded label named `field` (a pod field path).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabels {
    /// One of [`crate::unsupported::ALL`]'s fields.
    pub field: &'static str,
}

/// `version` of the build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Every metric of the live scheduler, with the registry that serves them.
pub type Metrics = numaplane::metrics::Registered<Families>;

/// The live scheduler's metric families.
#[derive(Debug)]
pub struct Families {
    /// Attempts by result and profile.
    pub attempts: Family<AttemptLabels, Counter>,
    /// Queue add to successful bind.
    pub e2e_latency: Histogram,
    /// One decision (filter, score, device choice) of one pod.
    pub decision_latency: Histogram,
    /// Pods per queue state.
    pub pending: Family<QueueLabels, Gauge>,
    /// Pending assumptions.
    pub assumed: Gauge,
    /// Assumptions ended, by how.
    pub assumptions_ended: Family<ReasonLabels, Counter>,
    /// Failed bindings by reason.
    pub binding_errors: Family<ReasonLabels, Counter>,
    /// ResourceClaim reservations a failed or unschedulable pod could not give back, by reason.
    pub claim_release_errors: Family<ReasonLabels, Counter>,
    /// Events (`Scheduled`, `FailedScheduling`) the API server did not take.
    pub event_write_errors: Counter,
    /// `PodScheduled` condition patches the API server did not take.
    pub status_patch_errors: Counter,
    /// Nodes by topology state.
    pub nodes: Family<TopologyLabels, Gauge>,
    /// Malformed objects seen, by kind (NRT error labels, pod, node).
    pub invalid_objects: Family<KindLabels, Counter>,
    /// DRA devices whose NUMA attribute is malformed, now.
    pub dra_devices_numa_invalid: Gauge,
    /// Nodes whose NRT's PCI locality attribute does not decode.
    pub nrt_pci_locality_invalid: Gauge,
    /// 1 per node and kubelet option the model cannot predict there.
    pub node_prediction_approximate: Family<ApproximateLabels, Gauge>,
    /// Claims of the pods this scheduler bound, by alignment.
    pub dra_claims_bound: Family<AlignmentLabels, Counter>,
    /// API writes by kind (binding, event, status).
    pub api_writes: Family<ReasonLabels, Counter>,
    /// Low-priority writes dropped to keep the API budget for bindings, by kind.
    pub writes_dropped: Family<ReasonLabels, Counter>,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
    /// 1 while the NodeResourceTopology CRD is served, 0 while it is missing.
    pub nrt_crd_installed: Gauge,
    /// Watch stream errors by resource.
    pub watch_errors: Family<ReasonLabels, Counter>,
    /// Extender calls by verb and result.
    pub extender_requests: Family<ExtenderLabels, Counter>,
    /// Extender call latency by verb.
    pub extender_latency: Family<VerbLabels, Histogram>,
    /// Extender calls answered without the model (the pod has nothing the Topology Manager
    /// aligns), by verb.
    pub extender_unaligned: Family<VerbLabels, Counter>,
    /// Pods warned of a field the model does not enforce, by field.
    pub unsupported_constraints: Family<FieldLabels, Counter>,
    /// Preemption attempts by result.
    pub preemption_attempts: Family<ResultLabels, Counter>,
    /// Pods chosen as preemption victims.
    pub preemption_victims: Counter,
    /// Victims whose deletion failed.
    pub eviction_errors: Counter,
}

impl numaplane::metrics::Families for Families {
    const PREFIX: &'static str = "numaplane_scheduler";

    fn register(r: &mut Registrar<'_>) -> Self {
        let m = Families {
            preemption_attempts: r.family("preemption_attempts", "Preemption attempts for pods that fit nowhere, by result (victims_chosen, no_victims, waiting_for_victims)"),
            preemption_victims: r.family("preemption_victims", "Pods chosen as preemption victims"),
            eviction_errors: r.family("eviction_errors", "Preemption victims whose deletion failed"),
            attempts: r.family("schedule_attempts", "Scheduling attempts by result (scheduled, unschedulable, error) and profile"),
            e2e_latency: r.with_unit("e2e_scheduling_duration", "Time from a pod entering the queue to its successful binding", Unit::Seconds, Histogram::new(exponential_buckets(0.000_5, 2.0, 18))),
            decision_latency: r.with_unit("decision_duration", "Time to decide one pod: filter, score and device choice over every node", Unit::Seconds, Histogram::new(exponential_buckets(0.000_01, 2.0, 20))),
            pending: r.family("pending_pods", "Pods in the scheduling queue by state"),
            assumed: r.family("assumed_pods", "Placements held on nodes whose NRT does not show the pod yet"),
            assumptions_ended: r.family("assumptions_ended", "Assumptions ended, by reason (confirmed by the NRT fingerprint, expired, pod gone, forgotten after a failed binding)"),
            binding_errors: r.family("binding_errors", "Failed Binding requests by reason"),
            claim_release_errors: r.family("claim_release_errors", "ResourceClaim reservations or allocations of a failed or unschedulable pod that could not be given back, by reason (the claim watch shows what stayed)"),
            event_write_errors: r.family("event_write_errors", "Events (Scheduled, FailedScheduling) that could not be written"),
            status_patch_errors: r.family("status_patch_errors", "PodScheduled condition patches that could not be written"),
            nodes: r.family("nodes", "Nodes by topology data state (valid; stale: pods bound there or gone more than half the assume timeout ago, and the NRT unchanged since; missing; invalid)"),
            invalid_objects: r.family("invalid_objects", "Malformed objects seen by the index, by kind"),
            node_prediction_approximate: r.family("node_prediction_approximate", "1 for each node and kubelet option (name=value) whose effect the model cannot predict there: the scheduler's predictions for that node are approximate (--unknown-kubelet-options; docs/scheduler.md, Kubelet options)"),
            nrt_pci_locality_invalid: r.family("nrt_pci_locality_invalid", "Nodes whose NodeResourceTopology carries a numaplane.io/pci-locality attribute that does not decode; their DRA devices placed only by PCI address count as without NUMA node"),
            dra_claims_bound: r.family("dra_claims_bound", "ResourceClaims of the pods this scheduler bound on a node with a NodeResourceTopology, by how their devices sit relative to the NUMA nodes predicted for the containers that use them (aligned, misaligned, no-numa-node, split, not-predicted)"),
            dra_devices_numa_invalid: r.family("dra_devices_numa_invalid", "DRA devices in the ResourceSlices whose NUMA attribute (standard or driver-specific) is not a NUMA node id, or whose pciBusID or pcieRoot is malformed; they are allocated as devices without NUMA node"),
            api_writes: r.family("api_writes", "API writes by kind (binding, event, status, volume, resourceclaim, resourceclaim_status, resourceclaim_read)"),
            writes_dropped: r.family("api_writes_dropped", "Low-priority writes (events, status) dropped to keep the request budget for bindings"),
            leader: r.family("leader", "1 while this replica holds the leader Lease"),
            nrt_crd_installed: r.family("nrt_crd_installed", "1 while the NodeResourceTopology CRD (noderesourcetopologies.topology.node.k8s.io) is served, 0 while it is not installed"),
            watch_errors: r.family("watch_errors", "Watch stream errors by resource"),
            extender_unaligned: r.family("extender_unaligned_pods", "Extender calls answered at once, without the model, because the pod has nothing the Topology Manager aligns (every node passes, equal scores, a plain Binding), by verb"),
            extender_requests: r.family("extender_requests", "Extender calls by verb (filter, prioritize, bind) and result (ok, error)"),
            extender_latency: r.with_unit("extender_request_duration", "Time to answer one extender call, by verb", Unit::Seconds, Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
            })),
            unsupported_constraints: r.family("unsupported_constraints", "Pods given an UnsupportedConstraint warning, by the pod field the model does not enforce"),
        };
        let build: Family<BuildLabels, Gauge> = r.family("build_info", "Build information");
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        m
    }
}

impl Families {
    /// Zero series for every result of each profile, so `increase()` sees the first attempt
    /// (a series born at 1 shows no increase).
    pub fn prepare_attempts<'a>(&self, profiles: impl IntoIterator<Item = &'a str>) {
        for profile in profiles {
            for result in ["scheduled", "unschedulable", "error"] {
                let _ = self.attempts.get_or_create(&AttemptLabels {
                    result,
                    profile: profile.to_owned(),
                });
            }
        }
    }

    /// Counts one attempt.
    pub fn attempt(&self, result: &'static str, profile: &str) {
        self.attempts
            .get_or_create(&AttemptLabels {
                result,
                profile: profile.to_owned(),
            })
            .inc();
    }

    /// Records one extender call.
    pub fn extender_call(&self, verb: &'static str, ok: bool, seconds: f64) {
        let result = if ok { "ok" } else { "error" };
        self.extender_requests
            .get_or_create(&ExtenderLabels { verb, result })
            .inc();
        self.extender_latency
            .get_or_create(&VerbLabels { verb })
            .observe(seconds);
    }

    /// Records one extender call answered without the model.
    pub fn extender_unaligned_call(&self, verb: &'static str, ok: bool, seconds: f64) {
        self.extender_call(verb, ok, seconds);
        self.extender_unaligned.get_or_create(&VerbLabels { verb }).inc();
    }

    /// Counts one bounded reason in `family`.
    pub fn count(family: &Family<ReasonLabels, Counter>, reason: &'static str) {
        family.get_or_create(&ReasonLabels { reason }).inc();
    }
}
