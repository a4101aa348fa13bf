//! The allocation records of the pods bound to this node, from a node-scoped pod watch: what
//! `GetPreferredAllocation` steers by and what reconciliation compares with the kubelet.
//! A record that is malformed or names another node is ignored for steering (metric, log,
//! and one Event on the pod).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use numaplane::allocation::{ANNOTATION, Allocation};
use tokio::sync::watch;

/// One pod that carries a usable record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Pod UID.
    pub uid: String,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// When the pod was bound, ms since the epoch: the `PodScheduled` condition's last
    /// transition to True (the API server sets it with the Binding), else the creation time (a
    /// pod created with `spec.nodeName` is bound from the start). Second resolution.
    pub bound_ms: i64,
    /// When this view first saw the pod bound with its record (1, 2, …): the kubelet admits
    /// pods in the order its own watch delivers them bound, which is this order, not creation
    /// order (a pod that waited for capacity is bound after newer ones).
    pub arrival: u64,
    /// The record.
    pub record: Allocation,
}

/// What the pod watch knows.
#[derive(Debug, Default)]
pub struct RecordView {
    /// Non-terminal pods of this node with a valid record for this node, by `namespace/name`.
    pub pods: BTreeMap<String, Recorded>,
    /// Keys of pods whose record was found unusable, with why (reported once per version).
    pub rejected: BTreeMap<String, String>,
    /// Every pod of this node the watch knows, with a record or not (`namespace/name`): a pod
    /// the kubelet lists that is not here has not reached the watch yet.
    pub node_pods: BTreeSet<String>,
    /// The first list completed.
    pub synced: bool,
    /// The last arrival number given out.
    last_arrival: u64,
}

/// Shared handle, with a wake-up for waiters (a lagging watch is waited for, briefly).
#[derive(Debug, Clone)]
pub struct SharedRecords {
    view: Arc<Mutex<RecordView>>,
    /// The view's version, bumped on every write.
    changed: Arc<watch::Sender<u64>>,
    /// The IDs each pool offers: a record planning others for a pool resource is unusable.
    known: Arc<BTreeMap<String, BTreeSet<String>>>,
}

/// A point in the view's history (see [`SharedRecords::seen`]).
#[derive(Debug)]
pub struct Seen(watch::Receiver<u64>);

/// Why a pod's record is not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// The annotation does not parse.
    Malformed(String),
    /// The record names another node (a failed Binding can leave a stale one).
    OtherNode(String),
    /// The record plans a device this node's pool does not offer: (resource, ID).
    UnknownDevice(String, String),
}

impl Ignored {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Ignored::Malformed(_) => "malformed",
            Ignored::OtherNode(_) => "other_node",
            Ignored::UnknownDevice(..) => "unknown_device",
        }
    }

    /// For logs and Events.
    pub fn message(&self) -> String {
        match self {
            Ignored::Malformed(e) => format!("allocation record ignored: {e}"),
            Ignored::OtherNode(n) => {
                format!("allocation record ignored: it names node {n}, not the node the pod is bound to")
            }
            Ignored::UnknownDevice(r, id) => {
                format!("allocation record ignored: it plans {r} {id}, which this node does not offer")
            }
        }
    }
}

/// `namespace/name`.
pub fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The usable record of `pod` on `node`: `Ok(None)` when it has none or is terminal. `known`
/// holds the IDs of each pool resource; planned IDs of those resources must be among them.
pub fn record_of(
    pod: &Pod,
    node: &str,
    known: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Option<Recorded>, Ignored> {
    let terminal = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let Some(raw) = pod.annotations().get(ANNOTATION) else {
        return Ok(None);
    };
    if terminal || pod.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let record = Allocation::parse(raw).map_err(|e| Ignored::Malformed(numaplane::error_chain(&e)))?;
    if record.node != node {
        return Err(Ignored::OtherNode(record.node));
    }
    for c in &record.containers {
        for (res, ids) in &c.devices {
            if let Some(offered) = known.get(res)
                && let Some(bad) = ids.iter().find(|id| !offered.contains(*id))
            {
                return Err(Ignored::UnknownDevice(res.clone(), bad.clone()));
            }
        }
    }
    let created_ms = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_millisecond());
    let bound_ms = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or(created_ms, |t| t.0.as_millisecond());
    Ok(Some(Recorded {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        created_ms,
        bound_ms,
        arrival: 0,
        record,
    }))
}

impl Default for SharedRecords {
    fn default() -> Self {
        SharedRecords {
            view: Arc::default(),
            changed: Arc::new(watch::Sender::new(0)),
            known: Arc::default(),
        }
    }
}

impl SharedRecords {
    /// An empty view that checks planned IDs against `known` (resource → offered IDs).
    pub fn new(known: BTreeMap<String, BTreeSet<String>>) -> Self {
        SharedRecords {
            known: Arc::new(known),
            ..SharedRecords::default()
        }
    }

    /// Reads the view.
    pub fn read<R>(&self, f: impl FnOnce(&RecordView) -> R) -> R {
        f(&self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn write<R>(&self, f: impl FnOnce(&mut RecordView) -> R) -> R {
        let r = f(&mut self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
        r
    }

    /// Marks now: take it before reading the view, so [`Self::changed_since`] sees every
    /// later change.
    pub fn seen(&self) -> Seen {
        Seen(self.changed.subscribe())
    }

    /// Waits until the view changed after `seen` was taken, or `timeout` passes; whether it
    /// changed.
    pub async fn changed_since(&self, seen: &mut Seen, timeout: std::time::Duration) -> bool {
        // A change made since `seen` is remembered by the channel (unlike a `Notify` waiter
        // registered after the fact), so it returns at once.
        matches!(tokio::time::timeout(timeout, seen.0.changed()).await, Ok(Ok(())))
    }

    /// Applies an added or modified pod. Returns why its record is ignored, the first time
    /// that reason is seen for this pod.
    pub fn apply(&self, pod: &Pod, node: &str) -> Option<Ignored> {
        let k = key(pod);
        let outcome = record_of(pod, node, &self.known);
        self.write(|v| {
            v.node_pods.insert(k.clone());
            match outcome {
                Ok(Some(mut r)) => {
                    v.rejected.remove(&k);
                    r.arrival = match v.pods.get(&k) {
                        Some(known) => known.arrival,
                        None => {
                            v.last_arrival += 1;
                            v.last_arrival
                        }
                    };
                    v.pods.insert(k, r);
                    None
                }
                Ok(None) => {
                    v.pods.remove(&k);
                    v.rejected.remove(&k);
                    None
                }
                Err(why) => {
                    v.pods.remove(&k);
                    let text = why.message();
                    let first = v.rejected.get(&k) != Some(&text);
                    v.rejected.insert(k, text);
                    first.then_some(why)
                }
            }
        })
    }

    /// Forgets a deleted pod.
    pub fn delete(&self, pod: &Pod) {
        let k = key(pod);
        self.write(|v| {
            v.node_pods.remove(&k);
            v.pods.remove(&k);
            v.rejected.remove(&k);
        });
    }

    /// Replaces everything after a (re)list; returns the newly ignored records.
    pub fn reset(&self, pods: &[Pod], node: &str) -> Vec<(String, Ignored)> {
        let mut fresh = RecordView {
            synced: true,
            ..RecordView::default()
        };
        let mut ignored = Vec::new();
        let (before, arrivals, mut last_arrival) = self.read(|v| {
            let arrivals: BTreeMap<String, u64> =
                v.pods.iter().map(|(k, r)| (k.clone(), r.arrival)).collect();
            (v.rejected.clone(), arrivals, v.last_arrival)
        });
        let mut new_arrivals = Vec::new();
        for p in pods {
            let k = key(p);
            fresh.node_pods.insert(k.clone());
            match record_of(p, node, &self.known) {
                Ok(Some(mut r)) => {
                    match arrivals.get(&k) {
                        Some(&a) => r.arrival = a,
                        None => new_arrivals.push((r.bound_ms, r.created_ms, k.clone())),
                    }
                    fresh.pods.insert(k, r);
                }
                Ok(None) => {}
                Err(why) => {
                    let text = why.message();
                    if before.get(&k) != Some(&text) {
                        ignored.push((k.clone(), why));
                    }
                    fresh.rejected.insert(k, text);
                }
            }
        }
        // A list is in name order, not binding order: pods first seen in it (all of them after
        // a restart) arrive in the order they were bound, as the kubelet saw them, then by
        // creation (the bind time has second resolution).
        new_arrivals.sort();
        for (_, _, k) in new_arrivals {
            if let Some(r) = fresh.pods.get_mut(&k) {
                last_arrival += 1;
                r.arrival = last_arrival;
            }
        }
        fresh.last_arrival = last_arrival;
        self.write(|v| *v = fresh);
        ignored
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(name: &str, annotation: Option<&str>, phase: &str) -> Pod {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("u-{name}"),
            "creationTimestamp": "2026-11-25T10:00:00Z"});
        if let Some(a) = annotation {
            meta["annotations"] = json!({ANNOTATION: a});
        }
        serde_json::from_value(
            json!({"metadata": meta, "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": phase}}),
        )
        .unwrap()
    }

    fn record(node: &str) -> String {
        json!({"version": "v1", "node": node, "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "a", "kind": "app", "numaNodes": [0],
                "devices": {"example.com/gpu": ["g1"]}}]})
        .to_string()
    }

    #[test]
    fn records_planning_devices_the_pool_lacks_are_ignored() {
        let known = BTreeMap::from([(
            "example.com/gpu".to_owned(),
            std::collections::BTreeSet::from(["g0".to_owned()]),
        )]);
        let s = SharedRecords::new(known);
        let why = s.apply(&pod("a", Some(&record("n1")), "Pending"), "n1").unwrap();
        assert_eq!(why.reason(), "unknown_device");
        assert!(why.message().contains("g1"), "{}", why.message());
        assert!(s.read(|v| v.pods.is_empty()));
    }

    #[test]
    fn records_are_kept_ignored_or_dropped() {
        let s = SharedRecords::default();
        assert_eq!(s.apply(&pod("a", Some(&record("n1")), "Pending"), "n1"), None);
        assert!(s.read(|v| v.pods.contains_key("ns/a")));
        let why = s.apply(&pod("b", Some(&record("n2")), "Pending"), "n1").unwrap();
        assert_eq!(why.reason(), "other_node");
        // Reported once per pod and reason.
        assert_eq!(s.apply(&pod("b", Some(&record("n2")), "Pending"), "n1"), None);
        let why = s.apply(&pod("c", Some("{"), "Pending"), "n1").unwrap();
        assert_eq!(why.reason(), "malformed");
        assert_eq!(s.apply(&pod("d", None, "Pending"), "n1"), None);
        // Terminal pods hold nothing to steer.
        s.apply(&pod("a", Some(&record("n1")), "Succeeded"), "n1");
        assert!(s.read(|v| v.pods.is_empty()));
        let ignored = s.reset(
            &[
                pod("a", Some(&record("n1")), "Running"),
                pod("b", Some(&record("n2")), "Pending"),
            ],
            "n1",
        );
        assert!(ignored.is_empty(), "b was reported already");
        assert!(s.read(|v| v.synced && v.pods.contains_key("ns/a")));
    }

    #[tokio::test]
    async fn a_change_made_between_reading_and_waiting_is_not_missed() {
        let s = SharedRecords::default();
        let mut seen = s.seen();
        assert!(s.read(|v| v.pods.is_empty()));
        // The pod arrives after the waiter read the view but before it starts waiting.
        s.apply(&pod("a", Some(&record("n1")), "Pending"), "n1");
        let t0 = std::time::Instant::now();
        assert!(
            s.changed_since(&mut seen, std::time::Duration::from_secs(3))
                .await
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        // Nothing changed since: the wait runs out.
        assert!(
            !s.changed_since(&mut seen, std::time::Duration::from_millis(50))
                .await
        );
    }

    fn created(name: &str, at: &str) -> Pod {
        let mut p = pod(name, Some(&record("n1")), "Pending");
        p.metadata.creation_timestamp = Some(serde_json::from_value(json!(at)).unwrap());
        p
    }

    fn bound(name: &str, created_at: &str, bound_at: Option<&str>) -> Pod {
        let mut p = created(name, created_at);
        if let Some(at) = bound_at {
            p.status = Some(
                serde_json::from_value(json!({"phase": "Pending", "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": at}]}))
                .unwrap(),
            );
        }
        p
    }

    #[test]
    fn after_a_restart_pods_arrive_in_binding_order() {
        // A fresh view (the exporter restarted) lists pods in name order; the older pod waited
        // for capacity and was bound after the newer one, which the kubelet admits first.
        let s = SharedRecords::default();
        s.reset(
            &[
                bound("a-older", "2026-11-25T10:00:00Z", Some("2026-11-25T10:00:07Z")),
                bound("b-newer", "2026-11-25T10:00:05Z", Some("2026-11-25T10:00:06Z")),
                // Bound without the condition (created with spec.nodeName): its creation time.
                bound("c-direct", "2026-11-25T10:00:06Z", None),
                // Bound in the same second as b: creation time breaks the tie.
                bound(
                    "d-same-second",
                    "2026-11-25T10:00:01Z",
                    Some("2026-11-25T10:00:06Z"),
                ),
            ],
            "n1",
        );
        let arrival = |k: &str| s.read(|v| v.pods[k].arrival);
        assert!(arrival("ns/d-same-second") < arrival("ns/b-newer"));
        assert!(arrival("ns/b-newer") < arrival("ns/c-direct"));
        assert!(arrival("ns/c-direct") < arrival("ns/a-older"));
    }

    #[test]
    fn pods_arrive_in_the_order_they_are_seen_bound_not_created() {
        let s = SharedRecords::default();
        // The older pod waited for capacity and was bound after the newer one.
        s.apply(&created("newer", "2026-11-25T10:00:05Z"), "n1");
        s.apply(&created("older", "2026-11-25T10:00:00Z"), "n1");
        // An update keeps the arrival.
        s.apply(&created("newer", "2026-11-25T10:00:05Z"), "n1");
        let arrival = |k: &str| s.read(|v| v.pods[k].arrival);
        assert!(arrival("ns/newer") < arrival("ns/older"));
        // A relist keeps known arrivals; pods first seen in it arrive after them, in binding
        // order (here the creation order: no PodScheduled condition).
        s.reset(
            &[
                created("older", "2026-11-25T10:00:00Z"),
                created("newer", "2026-11-25T10:00:05Z"),
                created("late-b", "2026-11-25T10:00:09Z"),
                created("late-a", "2026-11-25T10:00:08Z"),
            ],
            "n1",
        );
        assert!(arrival("ns/newer") < arrival("ns/older"));
        assert!(arrival("ns/older") < arrival("ns/late-a"));
        assert!(arrival("ns/late-a") < arrival("ns/late-b"));
    }
}
