//! Metrics of the node-side allocator, registered under `numaplane_exporter_allocator_`.
//! Labels are bounded: the resource name and a fixed outcome set; pod names never appear.

use numaplane::metrics::Registrar;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;

/// `resource` and `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Extended resource name.
    pub resource: String,
    /// A bounded outcome.
    pub outcome: &'static str,
}

/// `resource` and `state` (used, free).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotLabels {
    /// Extended resource name.
    pub resource: String,
    /// used, free, held_elsewhere or unhealthy.
    pub state: &'static str,
}

/// `resource`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// Extended resource name.
    pub resource: String,
}

/// `reason` of an ignored record.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// malformed, other_node, unknown_device (see `records::Ignored::reason`).
    pub reason: &'static str,
}

/// Every allocator metric.
#[derive(Debug)]
pub struct AllocatorMetrics {
    /// `GetPreferredAllocation` calls by outcome: honoured, no_candidate, not_honourable.
    pub preferred: Family<OutcomeLabels, Counter>,
    /// Time to answer `GetPreferredAllocation` (the wait for a lagging pod watch included).
    pub preferred_latency: Histogram,
    /// `Allocate` calls by outcome (ok; an `Allocate` is never failed by our state).
    pub allocate: Family<OutcomeLabels, Counter>,
    /// Containers whose devices differ from the recorded plan.
    pub mismatches: Family<ResourceLabels, Counter>,
    /// Slots (or devices) used and free, per pool.
    pub slots: Family<SlotLabels, Gauge>,
    /// Registrations with the kubelet by outcome: ok, error.
    pub registrations: Family<OutcomeLabels, Counter>,
    /// 1 while the pool's plugin is registered with the kubelet, else 0.
    pub registered: Family<ResourceLabels, Gauge>,
    /// Records ignored for steering, by reason.
    pub records_ignored: Family<ReasonLabels, Counter>,
    /// Reconciliations (pod-resources `List` against the records) by outcome: ok, error.
    pub resyncs: Family<OutcomeLabels, Counter>,
    /// Pod-resources `List`s made while the kubelet waits for `GetPreferredAllocation`, by
    /// outcome: ok, over_budget (the agent's budget had no room in time), error.
    pub refreshes: Family<OutcomeLabels, Counter>,
    /// Pods fetched from the API server while the kubelet waits (the pod watch did not know
    /// them yet), by outcome: ok, error, timeout.
    pub pod_fetches: Family<OutcomeLabels, Counter>,
}

impl AllocatorMetrics {
    /// Registers every family with `r` (a sub-registry of the exporter's).
    pub fn register(r: &mut Registrar<'_>) -> Self {
        AllocatorMetrics {
            preferred: r.family("preferred_allocations", "GetPreferredAllocation calls by outcome (honoured: the recorded plan was returned; no_candidate; not_honourable)"),
            preferred_latency: r.with_unit("preferred_allocation_duration", "Time to answer GetPreferredAllocation", Unit::Seconds, Histogram::new(exponential_buckets(0.000_01, 2.0, 20))),
            allocate: r.family("allocations", "Allocate calls by outcome"),
            mismatches: r.family("mismatches", "Containers whose devices (per pod-resources) differ from the scheduler's record"),
            slots: r.family("slots", "Devices or slots per pool: used here, free, (shared: cluster) held on other nodes, and (PCI-matched) unhealthy: gone from the PCI inventory"),
            registrations: r.family("registrations", "Registrations with the kubelet by outcome"),
            registered: r.family("registered", "1 while the pool's device plugin is registered with the kubelet (served, registered, and neither socket gone since), else 0"),
            records_ignored: r.family("records_ignored", "Allocation records ignored for steering, by reason (malformed, other_node, unknown_device)"),
            resyncs: r.family("resyncs", "Reconciliations of pod-resources against the records, by outcome"),
            refreshes: r.family("kubelet_refreshes", "Pod-resources Lists made while answering GetPreferredAllocation, by outcome (ok, over_budget, error)"),
            pod_fetches: r.family("pod_fetches", "Pods the kubelet lists but the pod watch did not know yet (relisting, lagging), fetched from the API server while answering GetPreferredAllocation, by outcome (ok, error, timeout)"),
        }
    }

    /// Counts one outcome for `resource` in `family`.
    pub fn count(family: &Family<OutcomeLabels, Counter>, resource: &str, outcome: &'static str) {
        family
            .get_or_create(&OutcomeLabels {
                resource: resource.to_owned(),
                outcome,
            })
            .inc();
    }
}
