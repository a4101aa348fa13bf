//! The scheduling loop. One task owns the cluster index and the queue; watches, binding
//! results and the leader flag reach it as [`Input`]s over one channel, so state has a single
//! writer and no lock. Decisions are synchronous calls into the pure model; Bindings run as
//! tasks (at most `bind_concurrency`), and their results come back as inputs.
//!
//! What each watched kind does to the state is in `engine/watched.rs`; the extender verbs,
//! storage watches and volume binding, gated and unsupported pods, and preemption have their
//! own child modules. Size (~1,050 lines of code, over the ~600 aim): every handler left here
//! mutates the one owner's state (index, queue, bindings in flight). Next cut when it grows:
//! the binding side (bind tasks and their results) into `engine/bind.rs`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{events::EventType, watcher};
use numaplane::nrt::NodeResourceTopology;
use tokio::sync::{mpsc, watch};

pub mod dra;
mod extender;
mod pod_checks;
pub mod volumes;
mod watched;

pub use self::watched::{Apply, InitBuffer};

pub use self::extender::{BindReply, ExtenderBindDone, ExtenderCall};
pub(crate) use self::extender::{POD_CAP, POD_TTL, bind_unaligned};

use super::{
    api::{BindError, Writer},
    daemon_config::ServeConfig,
    metrics::{ApproximateLabels, Families, KindLabels, Metrics, QueueLabels, TopologyLabels},
};
use crate::{
    cluster::{AssumptionStats, Cluster, Config, TopologyState},
    pod::PodSpec,
    queue::{SchedulingQueue, State},
};
use numaplane::allocation::Allocation;

/// Which watch an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// Nodes.
    Nodes,
    /// NodeResourceTopologies.
    Nrts,
    /// Pods bound to a node (every scheduler's), the only pod watch of the extender.
    Bound,
    /// Every pod: those bound to a node (every scheduler's) and the unbound ones of the
    /// scheduler names served, in one watch, as kube-scheduler's one pod informer.
    Pods,
    /// PersistentVolumeClaims.
    Claims,
    /// PersistentVolumes.
    Volumes,
    /// StorageClasses.
    Classes,
    /// CSINodes (attach limits).
    CsiNodes,
    /// PodDisruptionBudgets.
    Budgets,
    /// Namespaces (their labels, for `namespaceSelector`).
    Namespaces,
    /// DeviceClasses.
    DeviceClasses,
    /// ResourceSlices.
    ResourceSlices,
    /// ResourceClaims.
    ResourceClaims,
}

/// Something the loop reacts to.
#[derive(Debug)]
pub enum Input {
    /// A Node event.
    Node(watcher::Event<Node>),
    /// An NRT event.
    Nrt(watcher::Event<NodeResourceTopology>),
    /// A bound-pod event.
    BoundPodEvent(watcher::Event<Pod>),
    /// An event of the watch of every pod.
    Pod(watcher::Event<Pod>),
    /// A claim, volume or class event.
    Storage(Box<volumes::StorageEvent>),
    /// A DeviceClass, ResourceSlice or ResourceClaim event.
    Dra(Box<dra::DraEvent>),
    /// A PodDisruptionBudget event.
    Budget(watcher::Event<k8s_openapi::api::policy::v1::PodDisruptionBudget>),
    /// A Namespace event.
    Namespace(watcher::Event<k8s_openapi::api::core::v1::Namespace>),
    /// A watch failed (it retries by itself).
    WatchError(Stream, String),
    /// The NRT list answered 404: the CRD is not installed (the watch retries by itself).
    NrtCrdMissing,
    /// A Binding finished.
    BindingDone(Box<BindDone>),
    /// An extender call (extender mode).
    Extender(ExtenderCall),
    /// A Binding of an extender `bind` finished.
    ExtenderBound(Box<ExtenderBindDone>),
}

/// The outcome of one Binding, with what its report needs: the pod's queue entry may be gone
/// by then (the pending watch reports a bound pod as deleted from its selector).
#[derive(Debug)]
pub struct BindDone {
    /// `namespace/name`.
    pub key: String,
    /// The UID the Binding was pinned to.
    pub uid: Option<String>,
    /// The node.
    pub node: String,
    /// The pod as decided.
    pub pod: Pod,
    /// Scheduler name.
    pub profile: String,
    /// When the pod entered the queue.
    pub enqueued: Instant,
    /// The ResourceClaims whose allocations the binding held in flight.
    pub claims: Vec<String>,
    /// The claims it reserved, with their resourceVersion after its write.
    pub written: Vec<(String, u64)>,
    /// The NUMA report of each claim on a node with a NodeResourceTopology.
    pub claims_numa: Vec<(String, crate::dra::numa::ClaimNuma)>,
    /// Its place in the node's chain of ordered Bindings, if it has one.
    pub chain: Option<u64>,
    /// Outcome.
    pub result: Result<(), BindError>,
}

pub mod preemption;

/// A pod waiting to be scheduled.
#[derive(Debug)]
struct Pending {
    pod: Pod,
    /// `None` when the pod cannot be modelled (reported, not queued).
    spec: Option<PodSpec>,
    profile: String,
    /// Last failure message and when its event was sent.
    last_event: Option<(String, Instant)>,
}

/// Readiness and liveness shared with the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    /// Every watch has listed once.
    pub synced: std::sync::atomic::AtomicBool,
    /// Unix ms of the loop's last turn.
    pub heartbeat_ms: std::sync::atomic::AtomicU64,
    /// This replica leads (or election is off).
    pub leading: std::sync::atomic::AtomicBool,
    /// The NodeResourceTopology CRD is not installed: every node is scheduled with the
    /// `noTopology` behaviour until it is.
    pub nrt_crd_missing: std::sync::atomic::AtomicBool,
}

/// Decisions made per turn before looking at inputs again.
const BATCH: usize = 64;

/// The loop's state.
pub struct Engine {
    cfg: ServeConfig,
    model: Config,
    cluster: Cluster,
    queue: SchedulingQueue,
    pending: HashMap<String, Pending>,
    /// Bound, non-terminal pods that carry an allocation record for their node, Running or
    /// not: restored as assumptions when this replica starts leading (in name order, so the
    /// outcome does not depend on hashing).
    recorded: BTreeMap<String, (PodSpec, Allocation)>,
    init: HashMap<Stream, InitBuffer>,
    /// Pods whose Binding was refused as "already assigned" before the pod watch showed where
    /// they went, with the UID our Binding was pinned to: our placement stands in for theirs
    /// until the watch shows the pod.
    superseded: HashMap<String, Option<String>>,
    /// Per node, when a pod was first bound there or left it since the node's NRT last
    /// changed: the NRT has not caught up with the node's pods since then (the `stale` state).
    nrt_behind: HashMap<String, Instant>,
    /// When each stream's current (re)list began, on [`Self::now_ms`]'s clock.
    list_started: HashMap<Stream, u64>,
    /// Extender mode: pods of recent `filter` calls, by key, for the `bind` that follows.
    extender_pods: HashMap<String, extender::SeenPod>,
    synced: BTreeSet<Stream>,
    streams: usize,
    leader: watch::Receiver<bool>,
    leading: bool,
    in_flight: usize,
    /// Per node, the last Binding in flight of a pod the kubelet pins something for, and the
    /// signal its task gives when done: the next such pod's Binding waits for it (see
    /// [`Self::chain_after`]).
    bind_chains: HashMap<String, (u64, tokio::sync::oneshot::Receiver<()>)>,
    bind_seq: u64,
    writer: Writer,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    tx: mpsc::UnboundedSender<Input>,
    started: Instant,
    reported: AssumptionStats,
    anomalies_reported: (u64, u64, u64, std::collections::BTreeMap<String, u64>),
    last_gauges: Option<Instant>,
    /// Gated pods whose `SchedulingGated` condition we wrote, with their UID.
    gated_written: HashMap<String, Option<String>>,
    /// Pods checked for unenforced fields, with their UID.
    warned: HashMap<String, Option<String>>,
    /// Per ResourceSlice, its devices whose NUMA attribute is malformed (they count as
    /// devices without NUMA node): logged when they change, summed in a gauge.
    slices_numa_invalid: BTreeMap<String, Vec<String>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("queued", &self.queue.len())
            .field("leading", &self.leading)
            .finish_non_exhaustive()
    }
}

fn key_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether `new` differs from `old` in what scheduling reads: anything but what
/// kube-scheduler's `isPodUpdated` strips (status, where our own `PodScheduled` condition
/// lands, resourceVersion, generation, managedFields, finalizers).
fn changed_for_scheduling(old: &Pod, new: &Pod) -> bool {
    // The resourceclaim controller names the claims it created from templates in the
    // status: that lets a pod waiting for them be decided.
    let claims = |p: &Pod| p.status.as_ref().and_then(|s| s.resource_claim_statuses.clone());
    if claims(old) != claims(new) {
        return true;
    }
    let strip = |p: &Pod| {
        let mut p = p.clone();
        p.status = None;
        p.metadata.resource_version = None;
        p.metadata.generation = None;
        p.metadata.managed_fields = None;
        p.metadata.finalizers = None;
        p
    };
    strip(old) != strip(new)
}

fn epoch_ms(pod: &Pod) -> i64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_millisecond())
}

impl Engine {
    /// A loop over `cfg`, writing through `writer`; `tx` is the sender of its own input
    /// channel (binding tasks report through it).
    pub fn new(
        cfg: ServeConfig,
        writer: Writer,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        leader: watch::Receiver<bool>,
        tx: mpsc::UnboundedSender<Input>,
    ) -> Self {
        let mut cluster = Cluster::new();
        let model = cfg.model(&mut cluster.res);
        cluster.set_spread_defaults(cfg.spread_defaults.clone());
        // The Namespace watch of a scheduler (not of an extender).
        // Nodes, NRTs and pods (bound ones only in extender mode).
        let streams = 3 + if cfg.extender {
            0
        } else {
            // The storage watches.
            volumes::STREAMS + preemption::STREAMS + dra::STREAMS + 1 // Namespaces
        };
        // kube-scheduler allocates claims itself in extender mode.
        if !cfg.extender {
            cluster.dra.enable();
        }
        if cfg.extender {
            metrics.prepare_attempts([extender::PROFILE]);
        } else {
            metrics.prepare_attempts(cfg.scheduler_names.iter().map(String::as_str));
        }
        let leading = *leader.borrow();
        metrics.leader.set(i64::from(leading));
        health
            .leading
            .store(leading, std::sync::atomic::Ordering::Relaxed);
        Engine {
            queue: SchedulingQueue::new(cfg.backoff),
            model,
            cluster,
            pending: HashMap::new(),
            recorded: BTreeMap::new(),
            init: HashMap::new(),
            superseded: HashMap::new(),
            nrt_behind: HashMap::new(),
            list_started: HashMap::new(),
            extender_pods: HashMap::new(),
            synced: BTreeSet::new(),
            streams,
            leader,
            leading,
            in_flight: 0,
            bind_chains: HashMap::new(),
            bind_seq: 0,
            writer,
            metrics,
            health,
            tx,
            started: Instant::now(),
            reported: AssumptionStats::default(),
            anomalies_reported: Default::default(),
            last_gauges: None,
            gated_written: HashMap::new(),
            warned: HashMap::new(),
            slices_numa_invalid: BTreeMap::new(),
            cfg,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs until the input channel closes or leadership is lost (an error: the process
    /// exits and restarts as a follower, as kube-scheduler does).
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>) -> Result<(), EngineError> {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.health.heartbeat_ms.store(
                u64::try_from(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                )
                .unwrap_or(0),
                std::sync::atomic::Ordering::Relaxed,
            );
            let room = self.ready_to_schedule() && self.in_flight < self.cfg.bind_concurrency;
            let can_work = room && self.queue.ready(Instant::now());
            let wake = if room { self.queue.next_ready() } else { None };
            tokio::select! {
                biased;
                input = rx.recv() => {
                    let Some(input) = input else { return Ok(()) };
                    self.handle(input);
                    // Drain what is already there before deciding again.
                    while let Ok(more) = rx.try_recv() {
                        self.handle(more);
                    }
                }
                changed = self.leader.changed() => {
                    let now_leader = changed.is_ok() && *self.leader.borrow_and_update();
                    if self.leading && !now_leader {
                        self.metrics.leader.set(0);
                        return Err(EngineError::LostLeadership);
                    }
                    self.leading = now_leader;
                    self.metrics.leader.set(i64::from(now_leader));
                    self.health
                        .leading
                        .store(now_leader, std::sync::atomic::Ordering::Relaxed);
                    if now_leader {
                        tracing::info!("leading: scheduling starts once caches are synced");
                        self.on_leading();
                    }
                }
                _ = tick.tick() => {
                    self.housekeeping();
                }
                _ = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending::<()>().await,
                    }
                }, if wake.is_some() => {}
                _ = std::future::ready(()), if can_work => {
                    self.schedule_batch();
                }
            }
            self.update_gauges(false);
        }
    }

    fn ready_to_schedule(&self) -> bool {
        self.leading && self.synced.len() >= self.streams
    }

    /// Expires old assumptions and refreshes gauges.
    fn housekeeping(&mut self) {
        self.expire_extender_pods();
        let now = self.now_ms();
        let timeout = u64::try_from(self.cfg.assume_timeout.as_millis()).unwrap_or(u64::MAX);
        let expired = self.cluster.expire_assumptions(now, timeout);
        // A preemptor retried meanwhile ends its hold itself; this catches one that is not.
        self.cluster.expire_holds(now, timeout.saturating_mul(2));
        if !expired.is_empty() {
            tracing::warn!(
                pods = ?expired,
                "assumptions expired: the nodes' NRTs never showed these pods (exporter down or lagging?)"
            );
            self.queue.cluster_changed(Instant::now());
        }
        self.update_gauges(true);
    }

    fn update_gauges(&mut self, force: bool) {
        let now = Instant::now();
        if !force
            && self
                .last_gauges
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(200))
        {
            return;
        }
        self.last_gauges = Some(now);
        let depth = self.queue.depth();
        for state in [
            State::Active,
            State::Backoff,
            State::Unschedulable,
            State::InFlight,
        ] {
            let n = depth.get(&state).copied().unwrap_or(0);
            self.metrics
                .pending
                .get_or_create(&QueueLabels { queue: state.label() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.metrics
            .assumed
            .set(i64::try_from(self.cluster.assumptions().count()).unwrap_or(i64::MAX));
        let s = self.cluster.assumption_stats;
        let r = self.reported;
        for (reason, now_v, before) in [
            ("confirmed", s.confirmed, r.confirmed),
            ("expired", s.expired, r.expired),
            ("gone", s.gone, r.gone),
            ("forgotten", s.forgotten, r.forgotten),
        ] {
            if now_v > before {
                self.metrics
                    .assumptions_ended
                    .get_or_create(&super::metrics::ReasonLabels { reason })
                    .inc_by(now_v - before);
            }
        }
        self.reported = s;
        let a = &self.cluster.anomalies;
        let (pods_before, nodes_before, records_before, nrt_before) = &mut self.anomalies_reported;
        for (kind, now_v, before) in [
            ("pod", a.invalid_pods, &mut *pods_before),
            ("node", a.invalid_nodes, &mut *nodes_before),
            ("allocation_record", a.invalid_records, &mut *records_before),
        ] {
            if now_v > *before {
                self.metrics
                    .invalid_objects
                    .get_or_create(&KindLabels {
                        kind: kind.to_owned(),
                    })
                    .inc_by(now_v - *before);
                *before = now_v;
            }
        }
        for (label, &n) in &a.invalid_nrt {
            let before = nrt_before.entry(label.clone()).or_default();
            if n > *before {
                self.metrics
                    .invalid_objects
                    .get_or_create(&KindLabels {
                        kind: format!("nrt_{label}"),
                    })
                    .inc_by(n - *before);
                *before = n;
            }
        }
        if force {
            // Stale: pods were bound to the node (or left it) more than half the assume
            // timeout ago and its NRT has not changed since. By then an exporter that works
            // has published; at the full timeout the placements it does not show expire.
            let stale_after = self.cfg.assume_timeout / 2;
            let mut counts: HashMap<&'static str, i64> = HashMap::new();
            let mut pci_locality_invalid = 0i64;
            self.metrics.node_prediction_approximate.clear();
            for n in self.cluster.node_names() {
                if let TopologyState::Valid(t) = self.cluster.topology(n) {
                    if t.pci_locality_error.is_some() {
                        pci_locality_invalid += 1;
                    }
                    for a in &t.approximate {
                        self.metrics
                            .node_prediction_approximate
                            .get_or_create(&ApproximateLabels {
                                node: n.to_owned(),
                                option: a.option.clone(),
                            })
                            .set(1);
                    }
                }
                let behind = self
                    .nrt_behind
                    .get(n)
                    .is_some_and(|since| now.duration_since(*since) > stale_after);
                let state = match self.cluster.topology(n) {
                    TopologyState::Missing => "missing",
                    TopologyState::Invalid { .. } => "invalid",
                    TopologyState::Valid(_) if behind => "stale",
                    TopologyState::Valid(_) => "valid",
                };
                *counts.entry(state).or_default() += 1;
            }
            for state in ["valid", "stale", "missing", "invalid"] {
                self.metrics
                    .nodes
                    .get_or_create(&TopologyLabels { state })
                    .set(counts.get(state).copied().unwrap_or(0));
            }
            self.metrics.nrt_pci_locality_invalid.set(pci_locality_invalid);
        }
    }

    /// Restores the placements a previous leader (or this process before a restart) bound
    /// but the nodes' NRTs do not show yet.
    fn on_leading(&mut self) {
        if !self.ready_to_schedule() {
            return;
        }
        let now = self.now_ms();
        let mut restored = 0;
        for (key, (spec, record)) in &self.recorded {
            if !self.cluster.is_assumed(key) {
                self.cluster.restore_assumption(spec, Some(record), now);
                restored += usize::from(self.cluster.is_assumed(key));
            }
        }
        tracing::info!(restored, "placements restored from allocation records");
    }

    /// Applies one input.
    pub fn handle(&mut self, input: Input) {
        match input {
            Input::Node(ev) => self.on_event(Stream::Nodes, ev),
            Input::Nrt(ev) => self.on_event(Stream::Nrts, ev),
            Input::BoundPodEvent(ev) => self.on_event(Stream::Bound, ev),
            Input::Pod(ev) => self.on_event(Stream::Pods, ev),
            Input::Storage(ev) => self.on_storage(*ev),
            Input::Dra(ev) => self.on_dra(*ev),
            Input::Budget(ev) => self.on_event(Stream::Budgets, ev),
            Input::Namespace(ev) => self.on_event(Stream::Namespaces, ev),
            Input::WatchError(stream, message) => {
                let reason = match stream {
                    Stream::Nodes => "nodes",
                    Stream::Nrts => "noderesourcetopologies",
                    Stream::Bound => "bound_pods",
                    Stream::Pods => "pods",
                    Stream::Claims | Stream::Volumes | Stream::Classes | Stream::CsiNodes => {
                        volumes::stream_label(stream).unwrap_or_default()
                    }
                    Stream::DeviceClasses | Stream::ResourceSlices | Stream::ResourceClaims => {
                        dra::stream_label(stream).unwrap_or_default()
                    }
                    Stream::Budgets => "poddisruptionbudgets",
                    Stream::Namespaces => "namespaces",
                };
                Families::count(&self.metrics.watch_errors, reason);
                tracing::warn!(watch = reason, error = %message, "watch failed; retrying");
            }
            Input::NrtCrdMissing => self.on_nrt_crd_missing(),
            Input::BindingDone(done) => self.on_bound(*done),
            Input::Extender(call) => self.on_extender(call),
            Input::ExtenderBound(done) => self.on_extender_bound(*done),
        }
    }

    fn on_event<K>(&mut self, stream: Stream, ev: watcher::Event<K>)
    where
        K: Apply,
    {
        match ev {
            watcher::Event::Init => {
                // The watcher yields `Init` before it sends the LIST, and a Binding's result
                // comes through the same channel: a Binding acknowledged before this point in
                // the channel was accepted before the list began.
                self.list_started.insert(stream, self.now_ms());
                self.init.insert(stream, K::empty_buffer());
            }
            watcher::Event::InitApply(obj) => {
                let buffer = self.init.entry(stream).or_insert_with(K::empty_buffer);
                obj.buffer(buffer);
            }
            watcher::Event::InitDone => {
                let objs = self.init.remove(&stream).map(K::take_buffer).unwrap_or_default();
                // When each list of the start (or a relist) completes: the startup's share.
                tracing::info!(
                    ?stream,
                    objects = objs.len(),
                    since_start_ms = self.now_ms(),
                    "listed"
                );
                K::reset(self, stream, objs);
                if stream == Stream::Nrts {
                    self.set_nrt_crd_installed(true);
                }
                self.stream_synced(stream);
                self.queue.cluster_changed(Instant::now());
            }
            watcher::Event::Apply(obj) => obj.apply(self, stream),
            watcher::Event::Delete(obj) => obj.delete(self, stream),
        }
    }

    /// A stream listed once; the first time every stream has, scheduling may start.
    fn stream_synced(&mut self, stream: Stream) {
        let first = self.synced.insert(stream);
        if first && self.synced.len() >= self.streams {
            self.health
                .synced
                .store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!("caches synced");
            self.on_leading();
        }
    }

    /// No NRT can exist without the CRD: the NRT stream counts as listed, with none, so the
    /// pods the `noTopology` behaviour allows are scheduled. The watch keeps retrying and
    /// its first list after the CRD appears brings the NRTs in.
    fn on_nrt_crd_missing(&mut self) {
        if !self.set_nrt_crd_installed(false) {
            return;
        }
        self.init.remove(&Stream::Nrts);
        <NodeResourceTopology as Apply>::reset(self, Stream::Nrts, Vec::new());
        self.stream_synced(Stream::Nrts);
        self.queue.cluster_changed(Instant::now());
    }

    /// Records whether the CRD is served; returns whether that changed. Logged once per change,
    /// not at every retry of the watch.
    fn set_nrt_crd_installed(&mut self, installed: bool) -> bool {
        self.metrics.nrt_crd_installed.set(i64::from(installed));
        let was_missing = self
            .health
            .nrt_crd_missing
            .swap(!installed, std::sync::atomic::Ordering::Relaxed);
        let changed = was_missing == installed;
        if changed && installed {
            tracing::info!(
                crd = numaplane::nrt::CRD_NAME,
                "the NodeResourceTopology CRD is installed: reading NRTs"
            );
        } else if changed {
            tracing::warn!(
                no_topology = ?self.cfg.no_topology,
                "{}: scheduling every node with the noTopology behaviour until it is (kubectl apply -f deploy/crd.yaml)",
                numaplane::nrt::CRD_MISSING
            );
        }
        changed
    }

    /// The index of the scheduler name of `pod` among those served, when it is unbound.
    fn served_unbound(&self, pod: &Pod) -> Option<usize> {
        let spec = pod.spec.as_ref()?;
        if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
            return None;
        }
        let name = spec.scheduler_name.as_deref().unwrap_or("default-scheduler");
        self.cfg.scheduler_names.iter().position(|n| n == name)
    }

    fn apply_pending(&mut self, profile_index: usize, pod: Pod) {
        let key = key_of(&pod);
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let finished = matches!(phase, Some("Succeeded" | "Failed"));
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if bound || finished || deleting {
            self.drop_pending(&key);
            return;
        }
        // A pod with scheduling gates cannot be bound (409): as kube-scheduler, it
        // is not decided until an update removes the gates, which brings it back here.
        if self.gated_pod(&key, &pod) {
            return;
        }
        let profile = self
            .cfg
            .scheduler_names
            .get(profile_index)
            .cloned()
            .unwrap_or_default();
        let spec = match PodSpec::from_pod(&mut self.cluster.res, &pod) {
            Ok(s) => Some(s),
            Err(e) => {
                let message = format!("pod is unschedulable: {}", numaplane::error_chain(&e));
                tracing::warn!(pod = %key, error = %message, "cannot model pending pod");
                self.metrics
                    .invalid_objects
                    .get_or_create(&KindLabels {
                        kind: "pod".to_owned(),
                    })
                    .inc();
                self.writer.event(
                    &profile,
                    &pod,
                    EventType::Warning,
                    "FailedScheduling",
                    "Scheduling",
                    message,
                );
                None
            }
        };
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let created = epoch_ms(&pod);
        // A recreated pod (new UID) is a new pod: its old record and backoff go.
        let replaced = self
            .pending
            .get(&key)
            .is_some_and(|p| p.pod.metadata.uid != pod.metadata.uid);
        if replaced {
            self.queue.remove(&key);
        }
        let last_event = if replaced {
            None
        } else {
            self.pending.get_mut(&key).and_then(|p| p.last_event.take())
        };
        // Our own PodScheduled condition comes back as an update, as does the kubelet's or
        // anyone's status write: nothing that may let the pod fit, so its place in the queue
        // (a backoff included) stays.
        let unchanged = !replaced
            && self
                .pending
                .get(&key)
                .is_some_and(|p| !changed_for_scheduling(&p.pod, &pod));
        let queued = spec.is_some();
        self.pending.insert(
            key.clone(),
            Pending {
                pod,
                spec,
                profile,
                last_event,
            },
        );
        if !queued {
            self.queue.remove(&key);
        } else if !unchanged || !self.queue.contains(&key) {
            self.queue.upsert(&key, priority, created, Instant::now());
        }
    }

    fn drop_pending(&mut self, key: &str) {
        self.cluster.release_hold(key);
        self.pending.remove(key);
        self.queue.remove(key);
        self.forget_pod_checks(key);
    }

    fn reset_pending(&mut self, profile_index: usize, pods: Vec<Pod>) {
        let keep: BTreeSet<String> = pods.iter().map(key_of).collect();
        let profile = self
            .cfg
            .scheduler_names
            .get(profile_index)
            .cloned()
            .unwrap_or_default();
        let gone: Vec<String> = self
            .pending
            .iter()
            .filter(|(k, p)| p.profile == profile && !keep.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.drop_pending(&k);
        }
        for p in pods {
            self.apply_pending(profile_index, p);
        }
    }

    /// Ends our placement of `key` after its Binding (pinned to `uid`) failed with `e`.
    ///
    /// "Already assigned" means the pod is bound, though maybe elsewhere and with another
    /// record: once the pod watch has shown it, the placement its record names replaces ours;
    /// until then ours stands in for it (the node's pod count and the zones stay taken, never
    /// free while the pod runs somewhere), and the watch's event swaps them
    /// ([`Self::apply_bound`]). Any other failure ends the placement at once.
    pub(super) fn binding_refused(&mut self, key: &str, uid: Option<&str>, e: &BindError) {
        if !matches!(e, BindError::AlreadyBound { .. }) {
            self.cluster.forget(key, uid);
        } else if self.cluster.seen_bound(key) {
            self.cluster.forget(key, uid);
            self.restore_recorded(key);
        } else {
            // A Binding exists now: a relist that began later and does not show the pod means
            // it is gone.
            self.cluster.binding_succeeded(key, uid, self.now_ms());
            self.superseded.insert(key.to_owned(), uid.map(str::to_owned));
        }
    }

    /// Rebuilds the placement the record of the bound pod `key` names, if the pod watch has
    /// shown it bound with one (see [`Cluster::restore_assumption`]).
    fn restore_recorded(&mut self, key: &str) {
        if let Some((spec, record)) = self.recorded.get(key) {
            self.cluster.restore_assumption(spec, Some(record), self.now_ms());
        }
    }

    /// Whether the index knows `pod` bound to the node it names.
    fn known_bound(&self, pod: &Pod) -> bool {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        node.is_some() && self.cluster.pod_node(&key_of(pod)) == node
    }

    fn apply_bound(&mut self, pod: &Pod) {
        if let Some(uid) = self.superseded.remove(&key_of(pod)) {
            // Where the pod refused as "already assigned" really went: our stand-in goes, and
            // the pod is new to the index (its record is restored below).
            self.cluster.forget(&key_of(pod), uid.as_deref());
        }
        let known_here = self.known_bound(pod);
        self.apply_bound_known(pod, known_here);
    }

    /// [`Self::apply_bound`], told whether the index knew the pod bound there before.
    fn apply_bound_known(&mut self, pod: &Pod, known_here: bool) {
        let key = key_of(pod);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(n) = node
            && !(self.cluster.seen_bound(&key) && known_here)
        {
            self.pod_changed_on(n);
        }
        let applied = match self.cluster.apply_pod(pod) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(pod = %key, error = %numaplane::error_chain(&e), "bound pod cannot be modelled; not counted");
                None
            }
        };
        // Bound by anyone: no longer ours to schedule.
        if self.pending.contains_key(&key) {
            self.drop_pending(&key);
        }
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        // Whoever bound it, a record for its node says which zones and devices it holds (as
        // the index read them: the pod is parsed once per event).
        let recorded = applied.and_then(|a| {
            let record = a.record.filter(|r| Some(r.node.as_str()) == node && !finished)?;
            Some((a.spec, record))
        });
        match recorded {
            Some((spec, record)) => {
                // Bound by someone else while we lead (another replica, or a Binding of ours
                // reported failed that landed): its zones are taken from now on, unless the
                // NRT shows it already. Those known before are restored when leading starts.
                if !known_here && self.ready_to_schedule() {
                    self.cluster
                        .restore_assumption(&spec, Some(&record), self.now_ms());
                }
                self.recorded.insert(key, (spec, record));
            }
            _ => {
                self.recorded.remove(&key);
            }
        }
        if finished {
            if let Some(n) = node {
                self.pod_changed_on(n);
            }
            self.queue.cluster_changed(Instant::now());
        }
    }

    /// A pod was bound to `node` or left it: its NRT is behind from now until it changes.
    fn pod_changed_on(&mut self, node: &str) {
        if !self.nrt_behind.contains_key(node) {
            self.nrt_behind.insert(node.to_owned(), Instant::now());
        }
    }

    fn delete_bound(&mut self, pod: &Pod) {
        let key = key_of(pod);
        self.superseded.remove(&key);
        if let Some(node) = self.cluster.pod_node(&key).map(str::to_owned) {
            self.pod_changed_on(&node);
        }
        self.cluster.delete_pod(&key);
        self.recorded.remove(&key);
        self.queue.cluster_changed(Instant::now());
    }

    /// Decides up to [`BATCH`] pods.
    fn schedule_batch(&mut self) {
        for _ in 0..BATCH {
            if self.in_flight >= self.cfg.bind_concurrency {
                return;
            }
            let now = Instant::now();
            let Some(q) = self.queue.pop(now) else { return };
            let hold = self.take_hold(&q.key);
            let Some(p) = self.pending.get(&q.key) else {
                self.queue.remove(&q.key);
                continue;
            };
            if p.spec.is_none() {
                self.queue.remove(&q.key);
                continue;
            }
            // Once per pod, when first decided.
            self.warn_unsupported(&q.key);
            let Some(p) = self.pending.get(&q.key) else {
                continue;
            };
            let Some(spec) = p.spec.as_ref() else { continue };
            // Its claims from templates are being created by the resourceclaim controller:
            // not unschedulable, just not ready (a claim event or the pod's update brings it
            // back).
            if let Some(why) = self.claims_missing(spec) {
                tracing::debug!(pod = %q.key, reason = %why, "waiting for resource claims");
                self.queue.unschedulable(&q.key, now);
                continue;
            }
            let t0 = Instant::now();
            let (decision, claims_outcome) = self.cluster.decide_with_claims(&self.model, spec);
            self.metrics.decision_latency.observe(t0.elapsed().as_secs_f64());
            let profile = p.profile.clone();
            if let Some(e) = &claims_outcome.error {
                tracing::warn!(pod = %q.key, error = %numaplane::error_chain(e), "resource claims cannot be allocated");
            }
            match decision.node.clone() {
                Some(node) => {
                    let annotation = self.annotation_of(&q.key, &decision);
                    // Claims whose selected node is written before the Binding.
                    let claims = self.cluster.volumes.claims_to_select(spec, &node);
                    let writes = self.claim_writes(&spec.namespace, &claims_outcome.claims);
                    let spec = spec.clone();
                    self.cluster.assume_at(&spec, &decision, self.now_ms());
                    // The devices are in use for every later decision until the claim watch
                    // shows them written or the binding fails.
                    self.cluster
                        .dra
                        .assume(&spec.namespace, &q.key, &claims_outcome.claims);
                    let claim_names: Vec<String> = writes
                        .iter()
                        .filter_map(|w| w.claim.metadata.name.clone())
                        .collect();
                    let (ns, name) = (spec.namespace.clone(), spec.name.clone());
                    let uid = p.pod.metadata.uid.clone();
                    let pod = p.pod.clone();
                    self.in_flight += 1;
                    let writer = self.writer.clone();
                    let tx = self.tx.clone();
                    let key = q.key.clone();
                    let enqueued = q.enqueued;
                    let binding_timeout = self.cfg.dra_binding_timeout;
                    let held = claim_names.clone();
                    let claims_numa: Vec<_> = claims_outcome
                        .claims
                        .iter()
                        .filter_map(|c| Some((c.name.clone(), c.numa.clone()?)))
                        .collect();
                    let ordered = decision.placement.as_ref().is_some_and(|p| p.holds_exclusive());
                    let (chain, after, done) = if ordered {
                        let (seq, after, done) = self.chain_after(&node);
                        (Some(seq), after, Some(done))
                    } else {
                        (None, None, None)
                    };
                    tokio::spawn(async move {
                        if let Some(after) = after {
                            // Sent or dropped: either way the earlier Binding is over.
                            let _ = after.await;
                        }
                        let mut written = Vec::new();
                        let result = if writes.is_empty() {
                            volumes::bind_with_volumes(
                                &writer,
                                &ns,
                                &name,
                                uid.as_deref(),
                                &node,
                                annotation.as_deref(),
                                &claims,
                            )
                            .await
                        } else {
                            let pod_ref = dra::PodRef {
                                namespace: &ns,
                                name: &name,
                                uid: uid.as_deref().unwrap_or_default(),
                            };
                            dra::bind_with_claims(
                                &writer,
                                pod_ref,
                                &writes,
                                binding_timeout,
                                &node,
                                annotation.as_deref(),
                                &claims,
                                &mut written,
                            )
                            .await
                        };
                        // The loop is gone only at shutdown; nothing to report to then.
                        let _ = tx.send(Input::BindingDone(Box::new(BindDone {
                            key,
                            uid,
                            node,
                            pod,
                            profile,
                            enqueued,
                            claims: held,
                            written,
                            claims_numa,
                            chain,
                            result,
                        })));
                        drop(done);
                    });
                    tracing::debug!(pod = %q.key, node = ?decision.node, "binding");
                }
                None => {
                    self.metrics.attempt("unschedulable", &profile);
                    // Every attempt, unlike the event below: how often a pod is retried shows.
                    tracing::debug!(pod = %q.key, "unschedulable attempt");
                    // The backoff counts from the end of the attempt, as kube-scheduler's
                    // queue stamps a pod when it is put back: a slow decision must not
                    // shorten it.
                    self.queue.unschedulable(&q.key, Instant::now());
                    self.release_unschedulable_claims(&q.key);
                    let message = match self.after_unschedulable(&q.key, hold) {
                        preemption::Outcome::None => decision.message,
                        preemption::Outcome::Started { node, victims } => format!(
                            "{} preemption: evicting {victims} lower-priority pod(s) on node {node}.",
                            decision.message
                        ),
                        preemption::Outcome::Waiting { node } => format!(
                            "{} Waiting for the pods preempted on node {node} to leave.",
                            decision.message
                        ),
                    };
                    self.report_unschedulable(&q.key, message);
                }
            }
        }
    }

    /// Joins `node`'s chain of ordered Bindings: its place, the signal of the Binding before it
    /// (if one is in flight) and its own signal for the next. The kubelet admits pods in the
    /// order it sees them, and the CPUs, memory and devices it gives one depend on those it
    /// gave before; two Bindings in flight to one node may reach the server in either order,
    /// and then the kubelet pins them the other way round from the prediction (and from the
    /// DRA devices chosen to match). Bindings to other nodes, and of pods that hold nothing
    /// exclusive, still run side by side.
    fn chain_after(
        &mut self,
        node: &str,
    ) -> (
        u64,
        Option<tokio::sync::oneshot::Receiver<()>>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        self.bind_seq = self.bind_seq.wrapping_add(1);
        let (done, next) = tokio::sync::oneshot::channel();
        let before = self
            .bind_chains
            .insert(node.to_owned(), (self.bind_seq, next))
            .map(|(_, rx)| rx);
        (self.bind_seq, before, done)
    }

    /// The allocation record of a decision, encoded for the Binding.
    fn annotation_of(&self, key: &str, decision: &crate::decision::Decision) -> Option<String> {
        match decision.allocation.as_ref().map(|a| a.to_annotation()) {
            Some(Ok(a)) => Some(a),
            Some(Err(e)) => {
                tracing::error!(pod = %key, error = %numaplane::error_chain(&e), "cannot encode the allocation record; binding without it");
                None
            }
            None => None,
        }
    }

    /// `FailedScheduling` and `PodScheduled=False`, at most once per message and backoff
    /// period: a pod that stays unschedulable does not spend the write budget.
    fn report_unschedulable(&mut self, key: &str, message: String) {
        let Some(p) = self.pending.get_mut(key) else {
            return;
        };
        let now = Instant::now();
        let repeat = p
            .last_event
            .as_ref()
            .is_some_and(|(m, at)| *m == message && now.duration_since(*at) < self.cfg.backoff.max);
        if repeat {
            return;
        }
        tracing::info!(pod = %key, reason = %message, "unschedulable");
        self.writer.event(
            &p.profile,
            &p.pod,
            EventType::Warning,
            "FailedScheduling",
            "Scheduling",
            message.clone(),
        );
        let condition_same = p
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message.as_str()));
        if !condition_same {
            let ns = p
                .pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned());
            let name = p.pod.metadata.name.clone().unwrap_or_default();
            self.writer.unschedulable(&ns, &name, message.clone());
        }
        p.last_event = Some((message, now));
    }

    /// Counts a bound pod's claims by alignment and logs each. Unless alignment is ignored,
    /// a claim whose devices sit away from its containers' NUMA nodes is a Warning Event on
    /// the pod (under `Preferred` when no aligned device was free, or a claim allocated
    /// before): the workload reaches its devices across NUMA nodes.
    fn report_claims_numa(
        &self,
        profile: &str,
        pod: &Pod,
        key: &str,
        claims: &[(String, crate::dra::numa::ClaimNuma)],
    ) {
        use crate::dra::numa::{AlignmentStatus, DraNumaAlignment};
        for (claim, numa) in claims {
            let alignment = numa.alignment.metric_label();
            self.metrics
                .dra_claims_bound
                .get_or_create(&super::metrics::AlignmentLabels { alignment })
                .inc();
            tracing::info!(pod = %key, claim = %claim, alignment, detail = %numa.describe(), "claim bound");
            if numa.alignment == AlignmentStatus::Misaligned
                && self.model.dra_numa.alignment != DraNumaAlignment::Ignore
            {
                self.writer.event(
                    profile,
                    pod,
                    EventType::Warning,
                    "ClaimNotNUMAAligned",
                    "Scheduling",
                    format!(
                        "claim {claim}: its devices are not on the NUMA nodes of its containers; {}",
                        numa.describe()
                    ),
                );
            }
        }
    }

    fn on_bound(&mut self, done: BindDone) {
        let BindDone {
            key,
            uid,
            node,
            pod,
            profile,
            enqueued,
            claims,
            written,
            claims_numa,
            chain,
            result,
        } = done;
        self.in_flight = self.in_flight.saturating_sub(1);
        if chain.is_some() && self.bind_chains.get(&node).map(|(seq, _)| *seq) == chain {
            self.bind_chains.remove(&node);
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        if result.is_ok() {
            self.cluster.dra.written(ns, &key, &written);
        } else {
            self.cluster.dra.release(ns, &key, &claims);
            if !claims.is_empty() {
                self.queue.cluster_changed(Instant::now());
            }
        }
        match result {
            Ok(()) => {
                self.cluster
                    .binding_succeeded(&key, uid.as_deref(), self.now_ms());
                self.metrics.attempt("scheduled", &profile);
                self.metrics.e2e_latency.observe(enqueued.elapsed().as_secs_f64());
                // A pod recreated under this name meanwhile is another pod, still to place.
                if self.pending.get(&key).is_none_or(|p| p.pod.metadata.uid == uid) {
                    self.queue.done(&key);
                    self.pending.remove(&key);
                }
                self.writer.event(
                    &profile,
                    &pod,
                    EventType::Normal,
                    "Scheduled",
                    "Binding",
                    format!("Successfully assigned {key} to {node}"),
                );
                self.report_claims_numa(&profile, &pod, &key, &claims_numa);
            }
            Err(e) => {
                Families::count(&self.metrics.binding_errors, e.reason());
                self.metrics.attempt("error", &profile);
                tracing::warn!(error = %numaplane::error_chain(&e), "binding failed; placement dropped");
                if let BindError::Claim { source, .. } = &e {
                    self.report_claim_error(&profile, &pod, source);
                }
                self.binding_refused(&key, uid.as_deref(), &e);
                let same_pod = self.pending.get(&key).is_some_and(|p| p.pod.metadata.uid == uid);
                match e {
                    // Only the pod the Binding was for: a replacement is queued as new already.
                    _ if !same_pod => {}
                    // Bound already, by someone else or by an earlier attempt of ours that was
                    // reported failed: not ours to place any more.
                    BindError::AlreadyBound { .. } => self.drop_pending(&key),
                    // The pod of this name is another one (deleted and recreated): the decision
                    // was for a pod that is gone, so the stale entry is not tried again. The new
                    // pod is placed as a new pod when the pending watch delivers it.
                    BindError::Replaced { .. } => self.drop_pending(&key),
                    // Anything else (a 404 included: the pending watch delivers a deletion, so
                    // no pod is lost on a misrouted answer): retry after the backoff.
                    _ => {
                        self.queue.error(&key, Instant::now());
                    }
                }
                if !self.pending.contains_key(&key) {
                    self.queue.remove(&key);
                }
            }
        }
    }
}

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Another replica holds the Lease now.
    #[error("lost the leader Lease; exiting so a restart comes back as a follower")]
    LostLeadership,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a pod")
    }

    #[test]
    fn status_and_bookkeeping_updates_are_not_changes_for_scheduling() {
        let base = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
            "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c"}]},
            "status": {"phase": "Pending"}
        });
        let old = pod(base.clone());
        let mut own = base.clone();
        own["metadata"]["resourceVersion"] = serde_json::json!("2");
        own["metadata"]["managedFields"] = serde_json::json!([{"manager": "numaplane-scheduler"}]);
        own["status"]["conditions"] = serde_json::json!([{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available"}]);
        assert!(!changed_for_scheduling(&old, &pod(own)));
        let mut relabelled = base.clone();
        relabelled["metadata"]["labels"] = serde_json::json!({"a": "b"});
        assert!(changed_for_scheduling(&old, &pod(relabelled)));
        let mut respecced = base;
        respecced["spec"]["nodeSelector"] = serde_json::json!({"zone": "a"});
        assert!(changed_for_scheduling(&old, &pod(respecced)));
    }
}
