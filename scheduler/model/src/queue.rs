//! The scheduling queue: pending pods ordered by priority, then creation time; pods that did
//! not fit back off exponentially and come back early when the cluster changes in a way that
//! may let them fit. Pure: the caller passes the time, so the rules have synchronous tests.
//!
//! States, as in kube-scheduler: *active* (ready to be tried), *backoff* (failed with an error,
//! retried when its backoff ends), *unschedulable* (fit nowhere: retried when its backoff ends
//! or, once at least the initial backoff has passed, on a cluster event), *in flight* (popped:
//! being decided or bound). A deleted pod leaves no trace.

use std::{
    cmp::{Ordering, Reverse},
    collections::{BinaryHeap, HashMap},
    time::{Duration, Instant},
};

/// Backoff bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// After the first failure.
    pub initial: Duration,
    /// Upper bound; each failure doubles the previous backoff up to this.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The backoff after `attempts` failures (1 → initial).
    pub fn after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// What the queue orders by and reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedPod {
    /// `namespace/name`.
    pub key: String,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `metadata.creationTimestamp`, milliseconds since the epoch.
    pub created_ms: i64,
    /// When the pod first entered the queue (end-to-end latency starts here).
    pub enqueued: Instant,
    /// Failed attempts so far.
    pub attempts: u32,
}

/// Where a pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Ready to be tried.
    Active,
    /// Waiting out a backoff after an error.
    Backoff,
    /// Fit nowhere: waiting for its backoff or a cluster event.
    Unschedulable,
    /// Popped, being decided or bound.
    InFlight,
}

impl State {
    /// Metric label, as kube-scheduler's `scheduler_pending_pods{queue}`.
    pub fn label(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Backoff => "backoff",
            State::Unschedulable => "unschedulable",
            State::InFlight => "in_flight",
        }
    }
}

#[derive(Debug)]
struct Slot {
    pod: QueuedPod,
    state: State,
    /// When the backoff ends (backoff and unschedulable pods).
    ready_at: Instant,
    /// When the last attempt failed.
    failed_at: Option<Instant>,
    /// Bumped on every state change; heap entries with an older value are stale.
    seq: u64,
    /// The pod changed while in flight: try again instead of backing off.
    changed_in_flight: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveItem {
    priority: i32,
    created_ms: i64,
    key: String,
    seq: u64,
}

impl Ord for ActiveItem {
    /// Highest priority first, then oldest, then name (a max-heap pops the greatest).
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.created_ms.cmp(&self.created_ms))
            .then_with(|| other.key.cmp(&self.key))
    }
}

impl PartialOrd for ActiveItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The queue.
#[derive(Debug)]
pub struct SchedulingQueue {
    backoff: Backoff,
    slots: HashMap<String, Slot>,
    active: BinaryHeap<ActiveItem>,
    waiting: BinaryHeap<Reverse<(Instant, String, u64)>>,
    next_seq: u64,
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new(backoff: Backoff) -> Self {
        SchedulingQueue {
            backoff,
            slots: HashMap::new(),
            active: BinaryHeap::new(),
            waiting: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    fn set_state(&mut self, key: &str, state: State) {
        self.next_seq += 1;
        let seq = self.next_seq;
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        slot.state = state;
        slot.seq = seq;
        match state {
            State::Active => self.active.push(ActiveItem {
                priority: slot.pod.priority,
                created_ms: slot.pod.created_ms,
                key: key.to_owned(),
                seq,
            }),
            State::Backoff | State::Unschedulable => {
                self.waiting.push(Reverse((slot.ready_at, key.to_owned(), seq)));
            }
            State::InFlight => {}
        }
    }

    /// Adds a pending pod, or updates one already queued. An update of an unschedulable pod
    /// makes it active (its new spec may fit); the time it first entered is kept.
    pub fn upsert(&mut self, key: &str, priority: i32, created_ms: i64, now: Instant) {
        match self.slots.get_mut(key) {
            None => {
                self.slots.insert(
                    key.to_owned(),
                    Slot {
                        pod: QueuedPod {
                            key: key.to_owned(),
                            priority,
                            created_ms,
                            enqueued: now,
                            attempts: 0,
                        },
                        state: State::Active,
                        ready_at: now,
                        failed_at: None,
                        seq: 0,
                        changed_in_flight: false,
                    },
                );
                self.set_state(key, State::Active);
            }
            Some(slot) => {
                slot.pod.priority = priority;
                slot.pod.created_ms = created_ms;
                match slot.state {
                    State::InFlight => slot.changed_in_flight = true,
                    State::Unschedulable => self.set_state(key, State::Active),
                    // Re-push so a changed priority takes effect.
                    State::Active => self.set_state(key, State::Active),
                    State::Backoff => {}
                }
            }
        }
    }

    /// Forgets a pod (deleted, or bound by someone else).
    pub fn remove(&mut self, key: &str) -> Option<QueuedPod> {
        self.slots.remove(key).map(|s| s.pod)
    }

    /// Whether the pod is queued in any state.
    pub fn contains(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }

    /// Moves pods whose backoff ended to active.
    fn promote(&mut self, now: Instant) {
        while let Some(Reverse((at, key, seq))) = self.waiting.peek().cloned() {
            if at > now {
                break;
            }
            self.waiting.pop();
            let current = self.slots.get(&key).is_some_and(|s| s.seq == seq);
            if current {
                self.set_state(&key, State::Active);
            }
        }
    }

    /// The next pod to try, now in flight.
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        self.promote(now);
        while let Some(item) = self.active.pop() {
            let current = self
                .slots
                .get(&item.key)
                .is_some_and(|s| s.seq == item.seq && s.state == State::Active);
            if current {
                self.set_state(&item.key, State::InFlight);
                return self.slots.get(&item.key).map(|s| s.pod.clone());
            }
        }
        None
    }

    /// The pod was bound: it leaves the queue.
    pub fn done(&mut self, key: &str) -> Option<QueuedPod> {
        self.remove(key)
    }

    /// The pod fit nowhere: it waits for its backoff or a cluster event. Returns the backoff.
    pub fn unschedulable(&mut self, key: &str, now: Instant) -> Duration {
        self.failed(key, now, State::Unschedulable)
    }

    /// An error (API failure, conflict) interrupted the attempt: retry after the backoff.
    pub fn error(&mut self, key: &str, now: Instant) -> Duration {
        self.failed(key, now, State::Backoff)
    }

    fn failed(&mut self, key: &str, now: Instant, state: State) -> Duration {
        let Some(slot) = self.slots.get_mut(key) else {
            return Duration::ZERO;
        };
        slot.pod.attempts = slot.pod.attempts.saturating_add(1);
        let wait = self.backoff.after(slot.pod.attempts);
        slot.ready_at = now + wait;
        slot.failed_at = Some(now);
        if std::mem::take(&mut slot.changed_in_flight) {
            // The pod changed while it was tried: the new version deserves an attempt.
            slot.ready_at = now;
            self.set_state(key, State::Active);
            return Duration::ZERO;
        }
        self.set_state(key, state);
        wait
    }

    /// Something changed that may let unschedulable pods fit (an NRT, a node, a pod that
    /// freed resources): those that waited at least the initial backoff become active now,
    /// the others when their initial backoff ends. Returns how many moved.
    pub fn cluster_changed(&mut self, now: Instant) -> usize {
        let initial = self.backoff.initial;
        let moved: Vec<(String, Option<Instant>)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Unschedulable)
            .map(|(k, s)| (k.clone(), s.failed_at))
            .collect();
        let mut count = 0;
        for (key, failed_at) in moved {
            let earliest = failed_at.map_or(now, |t| t + initial);
            if earliest <= now {
                self.set_state(&key, State::Active);
                count += 1;
            } else if let Some(slot) = self.slots.get_mut(&key)
                && slot.ready_at > earliest
            {
                slot.ready_at = earliest;
                self.set_state(&key, State::Unschedulable);
            }
        }
        count
    }

    /// When the next waiting pod becomes ready, if any is waiting.
    pub fn next_ready(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter(|Reverse((_, key, seq))| self.slots.get(key).is_some_and(|s| s.seq == *seq))
            .map(|Reverse((at, _, _))| *at)
            .min()
    }

    /// Whether [`Self::pop`] would return a pod now (amortised O(1): stale heap entries
    /// on top are discarded).
    pub fn ready(&mut self, now: Instant) -> bool {
        self.promote(now);
        while let Some(top) = self.active.peek() {
            if self
                .slots
                .get(&top.key)
                .is_some_and(|s| s.seq == top.seq && s.state == State::Active)
            {
                return true;
            }
            self.active.pop();
        }
        false
    }

    /// Pods per state.
    pub fn depth(&self) -> HashMap<State, usize> {
        let mut out = HashMap::new();
        for s in self.slots.values() {
            *out.entry(s.state).or_default() += 1;
        }
        out
    }

    /// Queued pods in any state.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No pod queued.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The queued pod's bookkeeping.
    pub fn get(&self, key: &str) -> Option<&QueuedPod> {
        self.slots.get(key).map(|s| &s.pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(Backoff::default())
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn pops_by_priority_then_creation_then_name() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/old-low", 0, 100, t);
        q.upsert("ns/new-high", 10, 300, t);
        q.upsert("ns/b-mid", 5, 200, t);
        q.upsert("ns/a-mid", 5, 200, t);
        q.upsert("ns/older-mid", 5, 150, t);
        let order: Vec<String> = std::iter::from_fn(|| q.pop(t).map(|p| p.key)).collect();
        assert_eq!(
            order,
            [
                "ns/new-high",
                "ns/older-mid",
                "ns/a-mid",
                "ns/b-mid",
                "ns/old-low"
            ]
        );
    }

    #[test]
    fn backoff_doubles_from_initial_to_max() {
        let b = Backoff::default();
        let got: Vec<u64> = (1..=9).map(|n| b.after(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.after(u32::MAX), secs(60), "no overflow on huge attempt counts");
    }

    #[test]
    fn unschedulable_pod_waits_for_its_backoff() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/p", 0, 0, t);
        q.pop(t).unwrap();
        assert_eq!(q.unschedulable("ns/p", t), secs(1));
        assert!(!q.ready(t + Duration::from_millis(999)));
        assert!(q.pop(t + Duration::from_millis(999)).is_none());
        assert_eq!(q.next_ready(), Some(t + secs(1)));
        assert_eq!(q.pop(t + secs(1)).unwrap().attempts, 1);
        assert_eq!(q.unschedulable("ns/p", t + secs(1)), secs(2));
        assert!(q.pop(t + secs(2)).is_none());
        assert!(q.pop(t + secs(3)).is_some());
    }

    #[test]
    fn cluster_event_requeues_unschedulable_pods_early_but_not_before_initial_backoff() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/p", 0, 0, t);
        for i in 0..6 {
            q.pop(t + secs(100 * i)).unwrap();
            q.unschedulable("ns/p", t + secs(100 * i));
        }
        let failed = t + secs(500);
        // Backoff is now 32 s; an event half a second after the failure waits for 1 s.
        assert_eq!(q.cluster_changed(failed + Duration::from_millis(500)), 0);
        assert_eq!(q.next_ready(), Some(failed + secs(1)));
        assert!(q.pop(failed + secs(1)).is_some());
        q.unschedulable("ns/p", failed + secs(1));
        // An event after the initial backoff makes it active at once.
        assert_eq!(q.cluster_changed(failed + secs(3)), 1);
        assert!(q.pop(failed + secs(3)).is_some());
    }

    #[test]
    fn error_backoff_ignores_cluster_events() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/p", 0, 0, t);
        q.pop(t).unwrap();
        q.error("ns/p", t);
        assert_eq!(q.cluster_changed(t + secs(5)), 0);
        assert!(q.pop(t + Duration::from_millis(500)).is_none());
        assert!(q.pop(t + secs(1)).is_some());
    }

    #[test]
    fn deleted_pod_leaves_no_trace_in_any_state() {
        let t = Instant::now();
        let mut q = q();
        for (i, key) in ["ns/a", "ns/b", "ns/c", "ns/d"].into_iter().enumerate() {
            q.upsert(key, 0, i as i64, t);
        }
        q.pop(t).unwrap(); // a in flight
        q.pop(t).unwrap(); // b
        q.unschedulable("ns/b", t);
        q.pop(t).unwrap(); // c
        q.error("ns/c", t);
        for key in ["ns/a", "ns/b", "ns/c", "ns/d"] {
            assert!(q.remove(key).is_some(), "{key}");
        }
        assert!(q.is_empty());
        assert!(q.pop(t + secs(120)).is_none());
        assert_eq!(q.next_ready(), None);
        assert_eq!(q.cluster_changed(t + secs(120)), 0);
    }

    #[test]
    fn update_of_unschedulable_pod_makes_it_active_and_keeps_enqueue_time() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/p", 0, 0, t);
        q.pop(t).unwrap();
        q.unschedulable("ns/p", t);
        q.upsert("ns/p", 0, 0, t + Duration::from_millis(10));
        let p = q.pop(t + Duration::from_millis(10)).unwrap();
        assert_eq!(p.enqueued, t);
        assert_eq!(p.attempts, 1);
    }

    #[test]
    fn update_while_in_flight_retries_at_once_instead_of_backing_off() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/p", 0, 0, t);
        q.pop(t).unwrap();
        q.upsert("ns/p", 7, 0, t);
        assert_eq!(q.unschedulable("ns/p", t), Duration::ZERO);
        assert_eq!(q.pop(t).unwrap().priority, 7);
    }

    #[test]
    fn priority_change_reorders_active_pods() {
        let t = Instant::now();
        let mut q = q();
        q.upsert("ns/a", 0, 0, t);
        q.upsert("ns/b", 0, 1, t);
        q.upsert("ns/b", 100, 1, t);
        assert!(q.ready(t));
        assert_eq!(q.pop(t).unwrap().key, "ns/b");
        assert_eq!(q.pop(t).unwrap().key, "ns/a");
        assert!(q.pop(t).is_none(), "the stale heap entry of b is skipped");
    }

    #[test]
    fn depth_counts_every_state() {
        let t = Instant::now();
        let mut q = q();
        for key in ["ns/a", "ns/b", "ns/c", "ns/d"] {
            q.upsert(key, 0, 0, t);
        }
        let a = q.pop(t).unwrap().key;
        let b = q.pop(t).unwrap().key;
        let _c = q.pop(t).unwrap().key;
        q.unschedulable(&a, t);
        q.error(&b, t);
        let d = q.depth();
        assert_eq!(d.get(&State::Unschedulable), Some(&1));
        assert_eq!(d.get(&State::Backoff), Some(&1));
        assert_eq!(d.get(&State::InFlight), Some(&1));
        assert_eq!(d.get(&State::Active), Some(&1));
    }
}
