//! The node-scoped pod watch: a scan trigger on every add, change or delete of a pod bound to
//! this node, and the set of terminal pods that kubelets before 1.34 still list with their
//! stale assignments.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};

use crate::metrics::Metrics;
use crate::triggers::{Trigger, Triggers};

pub use crate::init_held::PodKey;
use crate::init_held::{self, PodFacts};

/// What the pod watch knows, shared with the scan loop.
#[derive(Debug, Default)]
pub struct PodView {
    /// Pods in phase Succeeded or Failed.
    pub terminal: BTreeSet<PodKey>,
    /// Pods bound to the node and not terminal, with the time they were first seen.
    pub active: BTreeMap<PodKey, tokio::time::Instant>,
    /// Whether the initial list has completed (before that, the terminal set is incomplete).
    pub synced: bool,
    /// UID and spec-derived facts of the non-terminal pods (for init containers' leftovers).
    pub facts: BTreeMap<PodKey, PodFacts>,
}

/// Shared handle.
pub type SharedPodView = Arc<Mutex<PodView>>;

/// Locks the view, recovering from a poisoned lock (the data stays consistent per update).
pub fn lock(view: &SharedPodView) -> std::sync::MutexGuard<'_, PodView> {
    view.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn key(pod: &Pod) -> PodKey {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

fn facts(pod: &Pod) -> PodFacts {
    PodFacts {
        uid: pod.uid().unwrap_or_default(),
        spec: init_held::spec_held(pod),
    }
}

/// Field selector of this node's pods.
pub fn node_selector(node_name: &str) -> String {
    format!("spec.nodeName={node_name}")
}

/// Lists the node's pods once (for `--once`): the terminal ones, and the facts of the others.
pub async fn list_once(
    client: Client,
    node_name: &str,
) -> Result<(BTreeSet<PodKey>, BTreeMap<PodKey, PodFacts>), kube::Error> {
    let pods: Api<Pod> = Api::all(client);
    let list = pods
        .list(&ListParams::default().fields(&node_selector(node_name)))
        .await?;
    let terminal = list.items.iter().filter(|p| is_terminal(p)).map(key).collect();
    let facts = list
        .items
        .iter()
        .filter(|p| !is_terminal(p))
        .map(|p| (key(p), facts(p)))
        .collect();
    Ok((terminal, facts))
}

fn apply(view: &SharedPodView, pod: &Pod) {
    let k = key(pod);
    let mut v = lock(view);
    if is_terminal(pod) {
        v.active.remove(&k);
        v.facts.remove(&k);
        v.terminal.insert(k);
    } else {
        v.terminal.remove(&k);
        v.facts.insert(k.clone(), facts(pod));
        v.active.entry(k).or_insert_with(tokio::time::Instant::now);
    }
}

/// Runs the watch forever, reconnecting with the watcher's default backoff.
pub async fn run(
    client: Client,
    node_name: String,
    view: SharedPodView,
    triggers: Triggers,
    metrics: Arc<Metrics>,
    admissions: Arc<tokio::sync::Notify>,
) {
    let pods: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&node_selector(&node_name));
    let stream = watcher::watcher(pods, config).default_backoff();
    futures::pin_mut!(stream);
    type Snapshot = (
        BTreeSet<PodKey>,
        BTreeMap<PodKey, tokio::time::Instant>,
        BTreeMap<PodKey, PodFacts>,
    );
    let mut init: Option<Snapshot> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => init = Some(Default::default()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some((terminal, active, all_facts)) = init.as_mut() {
                    if is_terminal(&pod) {
                        terminal.insert(key(&pod));
                    } else {
                        active.insert(key(&pod), tokio::time::Instant::now());
                        all_facts.insert(key(&pod), facts(&pod));
                    }
                }
            }
            Ok(watcher::Event::InitDone) => {
                if let Some((terminal, active, all_facts)) = init.take() {
                    let mut v = lock(&view);
                    v.terminal = terminal;
                    v.active = active;
                    v.facts = all_facts;
                    v.synced = true;
                }
                triggers.send(Trigger::PodWatch);
                admissions.notify_one();
            }
            Ok(watcher::Event::Apply(pod)) => {
                apply(&view, &pod);
                triggers.send(Trigger::PodWatch);
                admissions.notify_one();
            }
            Ok(watcher::Event::Delete(pod)) => {
                let k = key(&pod);
                {
                    let mut v = lock(&view);
                    v.terminal.remove(&k);
                    v.active.remove(&k);
                    v.facts.remove(&k);
                }
                triggers.send(Trigger::PodWatch);
            }
            Err(e) => {
                metrics.error("pod_watch");
                tracing::warn!(node = %node_name, error = %numaplane::error_chain(&e), "pod watch failed; retrying");
            }
        }
    }
}

/// How long the admission poller leaves a kubelet alone that does not offer `Get`.
pub const GET_REPROBE_INTERVAL: Duration = Duration::from_secs(600);

/// Polls `Get` for pods the API server says are bound here but the last List did not show,
/// and triggers a scan the moment the kubelet has admitted one (its resources are then
/// assigned). Bounded to one call per `interval`, well under the kubelet's 100 requests/s limit
/// shared by every client on the node. When the kubelet does not offer `Get` (UNIMPLEMENTED, or
/// gated off on 1.27–1.33), it says so once and asks again only every
/// [`GET_REPROBE_INTERVAL`]. Sleeps on `wake` (signalled by the pod watch) while no pod is
/// waiting, so an idle node costs no wakeups.
pub async fn poll_admissions(
    client: crate::podresources::KubeletClient,
    view: SharedPodView,
    listed: Arc<Mutex<BTreeSet<PodKey>>>,
    triggers: Triggers,
    interval: Duration,
    give_up_after: Duration,
    wake: Arc<tokio::sync::Notify>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut cursor: Option<PodKey> = None;
    let mut said_not_offered = false;
    loop {
        ticker.tick().await;
        let candidate = {
            let v = lock(&view);
            let listed = listed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let waiting = v
                .active
                .iter()
                .filter(|(k, since)| !listed.contains(*k) && since.elapsed() < give_up_after);
            // Round-robin over the waiting pods.
            let mut after = waiting
                .clone()
                .filter(|(k, _)| cursor.as_ref().is_none_or(|c| *k > c));
            after
                .next()
                .or_else(|| waiting.clone().next())
                .map(|(k, _)| k.clone())
        };
        let Some(pod) = candidate else {
            cursor = None;
            wake.notified().await;
            continue;
        };
        cursor = Some(pod.clone());
        match client.get(&pod.0, &pod.1).await {
            Ok(Some(_)) => {
                listed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(pod);
                triggers.send(Trigger::KubeletGet);
            }
            Ok(None) => {}
            Err(e) if e.method_not_offered() => {
                // Stop asking this kubelet; look again rarely, in case it was upgraded or its
                // gate turned on (a restart of the kubelet, not of us).
                if !said_not_offered {
                    said_not_offered = true;
                    tracing::info!(
                        error = %numaplane::error_chain(&e),
                        reprobe_after = ?GET_REPROBE_INTERVAL,
                        "kubelet does not offer pod-resources Get; admissions are caught by the \
                         pod watch and the resync instead"
                    );
                } else {
                    tracing::debug!(error = %e, "kubelet still does not offer pod-resources Get");
                }
                tokio::time::sleep(GET_REPROBE_INTERVAL).await;
            }
            Err(e) if e.code() == Some(tonic::Code::ResourceExhausted) => {
                tokio::time::sleep(crate::backoff::jittered(Duration::from_millis(500))).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "Get failed");
            }
        }
    }
}
