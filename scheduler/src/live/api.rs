//! API writes of the live scheduler under two client-side budgets, as kube-scheduler keeps its
//! event client apart from its main one: Bindings (with the claim, volume and eviction writes
//! that are part of them) under `--kube-api-qps` / `--kube-api-burst`; events and
//! `PodScheduled` conditions under `--event-qps` / `--event-burst`, from a bounded queue whose
//! overflow is dropped and counted, so an event storm never slows a Binding. Those writes also
//! wait, up to [`AUX_YIELD`], while Bindings are at the API server: on a server that is the
//! limit, each would take the place of a Binding.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream::FuturesUnordered};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::{mpsc, watch};

use super::metrics::{Families, Metrics};
use numaplane::allocation::ANNOTATION;

/// The event note limit of the API server; kube-scheduler cuts there too, with " ...".
const NOTE_LIMIT: usize = 1024;
/// Low-priority writes waiting at most; beyond, new ones are dropped (counted): the events of
/// a batch of 10,000 pods fit while its Bindings run. One entry is a few hundred bytes.
pub const AUX_QUEUE: usize = 16_384;
/// How long a low-priority write waits at most for the Bindings at the server to finish before
/// it is sent anyway: longer than the Bindings of a batch of 10,000 pods take at 1,000 QPS
/// (about 15 s on two cores), whose Events would otherwise take a Binding's place at the
/// server for the last third of the batch. With the queue drained at the event budget's rate,
/// one is late by at most this plus [`AUX_QUEUE`] / `--event-qps` seconds.
pub const AUX_YIELD: Duration = Duration::from_secs(30);
/// Low-priority writes in flight at once: one at a time would cap them at one per round trip,
/// below the rate of Bindings, and the queue would overflow on a large batch.
const AUX_IN_FLIGHT: usize = 8;

/// A client-side token bucket: `qps` requests per second with bursts of `burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Sustained requests per second.
    pub qps: f64,
    /// Requests at once after a quiet spell.
    pub burst: u32,
}

/// A failed Binding.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// 409: the pod is bound already (by us earlier, or by someone else).
    #[error("binding {pod}: already bound: {message}")]
    AlreadyBound {
        /// `namespace/name`.
        pod: String,
        /// Server message.
        message: String,
    },
    /// 409: the pod with this name has another UID now (deleted and recreated).
    #[error("binding {pod}: pod was replaced: {message}")]
    Replaced {
        /// `namespace/name`.
        pod: String,
        /// Server message.
        message: String,
    },
    /// 409: the pod has scheduling gates; it must not be bound until they are removed.
    #[error("binding {pod}: pod has scheduling gates: {message}")]
    Gated {
        /// `namespace/name`.
        pod: String,
        /// Server message.
        message: String,
    },
    /// The claim's `volume.kubernetes.io/selected-node` could not be written,
    /// so the Binding was not sent.
    #[error("binding {pod}: writing the selected node on PersistentVolumeClaim {claim}")]
    SelectNode {
        /// `namespace/name`.
        pod: String,
        /// Claim name.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A ResourceClaim of the pod could not be reserved for it, or its devices' binding
    /// conditions did not hold in time, so the Binding was not sent.
    #[error("binding {pod}: DynamicResources")]
    Claim {
        /// `namespace/name`.
        pod: String,
        /// Cause.
        #[source]
        source: super::claim_error::ClaimError,
    },
    /// 404: the pod is gone.
    #[error("binding {pod}: pod not found")]
    NotFound {
        /// `namespace/name`.
        pod: String,
    },
    /// Any other API answer or a transport failure.
    #[error("binding {pod}")]
    Api {
        /// `namespace/name`.
        pod: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl BindError {
    /// Bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            BindError::AlreadyBound { .. } => "already_bound",
            BindError::Replaced { .. } => "pod_replaced",
            BindError::Gated { .. } => "scheduling_gated",
            BindError::NotFound { .. } => "not_found",
            BindError::SelectNode { .. } => "volume_binding",
            BindError::Claim { source, .. } => source.reason(),
            BindError::Api { source, .. } => match source {
                kube::Error::Api(s) if s.code >= 500 => "server_error",
                kube::Error::Api(s) if s.code == 429 => "throttled",
                kube::Error::Api(_) => "rejected",
                _ => "transport",
            },
        }
    }
}

/// A low-priority write.
#[derive(Debug)]
enum Aux {
    Event {
        profile: String,
        reference: ObjectReference,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    },
    Unschedulable {
        namespace: String,
        name: String,
        /// `Unschedulable` or `SchedulingGated`.
        reason: &'static str,
        message: String,
    },
}

/// The writer.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    limiter: Arc<DefaultDirectRateLimiter>,
    event_limiter: Arc<DefaultDirectRateLimiter>,
    /// Bindings holding a token and not yet answered.
    at_server: Arc<watch::Sender<usize>>,
    aux: mpsc::Sender<(Instant, Aux)>,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// `qps` requests per second with bursts of `burst` (the ceiling bench uses it too).
pub fn quota(qps: f64, burst: u32) -> Quota {
    let period = Duration::from_secs_f64(1.0 / qps.max(1e-3));
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Quota::with_period(period)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst)
}

impl Writer {
    /// A writer and the task that sends low-priority writes (run it supervised).
    pub fn new(
        client: Client,
        writes: Budget,
        events: Budget,
        identity: String,
        metrics: Arc<Metrics>,
    ) -> (Self, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(AUX_QUEUE);
        let w = Writer {
            client,
            limiter: Arc::new(RateLimiter::direct(quota(writes.qps, writes.burst))),
            event_limiter: Arc::new(RateLimiter::direct(quota(events.qps, events.burst))),
            at_server: Arc::new(watch::channel(0).0),
            aux: tx,
            metrics,
            timeout: Duration::from_secs(30),
        };
        let task = w.clone().run_aux(rx, identity);
        (w, task)
    }

    /// POSTs the Binding of `pod` (pinned to its UID) to `node`, with the allocation record
    /// in its annotations: the API server copies them onto the pod in the same write.
    pub async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        node: &str,
        allocation: Option<&str>,
    ) -> Result<(), BindError> {
        let key = format!("{namespace}/{name}");
        self.limiter.until_ready().await;
        let _at_server = AtServer::new(&self.at_server);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: uid.map(str::to_owned),
                annotations: allocation.map(|a| [(ANNOTATION.to_owned(), a.to_owned())].into()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        Families::count(&self.metrics.api_writes, "binding");
        let pp = PostParams::default();
        let call = api.create_subresource::<_, serde_json::Value>("binding", name, &pp, &binding);
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer within 30s",
            )))),
        };
        match result {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(conflict(key, &s)),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(BindError::NotFound { pod: key }),
            Err(source) => Err(BindError::Api { pod: key, source }),
        }
    }

    /// The API client (for writes made outside this module under the same budget).
    pub(super) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The metrics the writes count in.
    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Waits for one request of the Bindings' budget (for a write that is part of one).
    pub(super) async fn priority_budget(&self) {
        self.limiter.until_ready().await;
    }

    fn enqueue(&self, aux: Aux, kind: &'static str) {
        if self.aux.try_send((Instant::now(), aux)).is_err() {
            Families::count(&self.metrics.writes_dropped, kind);
        }
    }

    /// Queues an event on `pod` (events.k8s.io/v1 through kube-runtime's recorder, which
    /// folds repeats into a series), reported as `profile`.
    pub fn event(
        &self,
        profile: &str,
        pod: &Pod,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        self.enqueue(
            Aux::Event {
                profile: profile.to_owned(),
                reference,
                type_,
                reason,
                action,
                note: truncate_note(note),
            },
            "event",
        );
    }

    /// Queues the `PodScheduled=False, Unschedulable` condition with `message`.
    pub fn unschedulable(&self, namespace: &str, name: &str, message: String) {
        self.enqueue(
            Aux::Unschedulable {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: "Unschedulable",
                message,
            },
            "status",
        );
    }

    /// Queues `PodScheduled=False, reason SchedulingGated`.
    pub fn scheduling_gated(&self, namespace: &str, name: &str) {
        self.enqueue(
            Aux::Unschedulable {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: crate::gates::REASON,
                message: crate::gates::MESSAGE.to_owned(),
            },
            "status",
        );
    }

    /// Writes `volume.kubernetes.io/selected-node: node` on the claim (a merge
    /// patch, under the Bindings' budget: it is part of the Binding), as kube-scheduler's
    /// VolumeBinding PreBind does before the pod is bound.
    pub async fn select_node(&self, namespace: &str, claim: &str, node: &str) -> Result<(), kube::Error> {
        self.limiter.until_ready().await;
        let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {
            crate::volume_binding::SELECTED_NODE: node}}});
        Families::count(&self.metrics.api_writes, "volume");
        match tokio::time::timeout(
            self.timeout,
            api.patch(claim, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer within 30s",
            )))),
        }
    }

    async fn run_aux(self, mut rx: mpsc::Receiver<(Instant, Aux)>, identity: String) {
        let mut recorders: HashMap<String, Recorder> = HashMap::new();
        let mut in_flight = FuturesUnordered::new();
        loop {
            tokio::select! {
                aux = rx.recv(), if in_flight.len() < AUX_IN_FLIGHT => {
                    let Some((queued, aux)) = aux else { break };
                    let recorder = match &aux {
                        Aux::Event { profile, .. } => Some(
                            recorders
                                .entry(profile.clone())
                                .or_insert_with(|| {
                                    Recorder::new(
                                        self.client.clone(),
                                        Reporter {
                                            controller: profile.clone(),
                                            instance: Some(identity.clone()),
                                        },
                                    )
                                })
                                .clone(),
                        ),
                        Aux::Unschedulable { .. } => None,
                    };
                    in_flight.push(self.send_aux(queued, aux, recorder));
                }
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            }
        }
        while in_flight.next().await.is_some() {}
    }

    /// Sends one low-priority write once no Binding is at the server (or it has waited
    /// [`AUX_YIELD`] since it was queued) and the event budget allows it.
    async fn send_aux(&self, queued: Instant, aux: Aux, recorder: Option<Recorder>) {
        let mut at_server = self.at_server.subscribe();
        // Timed out: sent anyway. The sender lives as long as `self`.
        let _ = tokio::time::timeout_at((queued + AUX_YIELD).into(), at_server.wait_for(|n| *n == 0)).await;
        self.event_limiter.until_ready().await;
        match aux {
            Aux::Event {
                profile: _,
                reference,
                type_,
                reason,
                action,
                note,
            } => {
                let Some(recorder) = recorder else { return };
                let ev = Event {
                    type_,
                    reason: reason.to_owned(),
                    note: Some(note),
                    action: action.to_owned(),
                    secondary: None,
                };
                Families::count(&self.metrics.api_writes, "event");
                if let Err(e) = recorder.publish(&ev, &reference).await {
                    self.metrics.event_write_errors.inc();
                    tracing::warn!(reason, pod = ?reference.name, error = %numaplane::error_chain(&e), "cannot publish event");
                }
            }
            Aux::Unschedulable {
                namespace,
                name,
                reason,
                message,
            } => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
                let patch = serde_json::json!({"status": {"conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": reason,
                    "message": message,
                    "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
                }]}});
                Families::count(&self.metrics.api_writes, "status");
                if let Err(e) = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    self.metrics.status_patch_errors.inc();
                    tracing::warn!(pod = %format!("{namespace}/{name}"), error = %numaplane::error_chain(&e), "cannot set PodScheduled condition");
                }
            }
        }
    }
}

/// Counts one Binding at the server while it lives (dropped on every way out, a timeout too).
struct AtServer<'a>(&'a watch::Sender<usize>);

impl<'a> AtServer<'a> {
    fn new(count: &'a watch::Sender<usize>) -> Self {
        count.send_modify(|n| *n = n.saturating_add(1));
        AtServer(count)
    }
}

impl Drop for AtServer<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// What a 409 to a Binding means, from the `Status` the API server gives (the three bodies
/// are in the shared verified facts):
/// - `details.kind` `pods`: the storage precondition on the pod's UID failed, so the pod of
///   this name is another one (deleted and recreated);
/// - `details.kind` `pods/binding`: the Binding itself was refused: the pod is already
///   assigned to a node, or, with the message naming `.spec.schedulingGates`, it is gated (the
///   one case only the message tells apart; the server gives both the same reason and kind).
///
/// A 409 without details (an older or a proxying server) is read as "already assigned",
/// the answer that drops the decision and lets the pod watch tell where the pod went.
fn conflict(pod: String, status: &kube::core::Status) -> BindError {
    let message = status.message.clone();
    let kind = status.details.as_ref().map(|d| d.kind.as_str());
    match kind {
        Some("pods") => BindError::Replaced { pod, message },
        _ if message.contains(".spec.schedulingGates") => BindError::Gated { pod, message },
        _ => BindError::AlreadyBound { pod, message },
    }
}

/// Cuts a note to the API server's 1 kB, as kube-scheduler does (" ..." suffix).
fn truncate_note(mut note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT - 4;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(" ...");
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_1k_on_a_char_boundary() {
        assert_eq!(truncate_note("short".into()), "short");
        let long = "é".repeat(600);
        let cut = truncate_note(long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with(" ..."));
    }

    /// The three 409 bodies of `pods/binding` a real API server (v1.36.2) gives, from the
    /// shared verified facts.
    fn status(message: &str, kind: &str) -> kube::core::Status {
        serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Conflict", "code": 409,
            "details": {"name": "p", "kind": kind}
        }))
        .expect("a Status")
    }

    #[test]
    fn binding_conflicts_are_told_apart_by_reason_and_details() {
        let assigned = status(
            "Operation cannot be fulfilled on pods/binding \"p\": pod p is already assigned to node \"n1\"",
            "pods/binding",
        );
        let replaced = status(
            "Operation cannot be fulfilled on pods \"p\": StorageError: invalid object, Code: 4, \
             Key: /registry/pods/ns/p, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: \
             UID in precondition: u1, UID in object meta: u2",
            "pods",
        );
        let gated = status(
            "Operation cannot be fulfilled on pods/binding \"p\": pod p has non-empty .spec.schedulingGates",
            "pods/binding",
        );
        let reason = |s: &kube::core::Status| conflict("ns/p".to_owned(), s).reason();
        assert_eq!(reason(&assigned), "already_bound");
        assert_eq!(reason(&replaced), "pod_replaced");
        assert_eq!(reason(&gated), "scheduling_gated");
    }

    #[test]
    fn quota_allows_the_burst_then_the_rate() {
        let l = RateLimiter::direct(quota(10.0, 3));
        assert!((0..3).all(|_| l.check().is_ok()));
        assert!(l.check().is_err());
    }
}
