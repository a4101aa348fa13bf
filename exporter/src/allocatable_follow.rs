//! Allocatable follows the kubelet's devices.
//!
//! `GetAllocatableResources` is read at start, at every resync and after a kubelet reconnect;
//! a device plugin that registers in between would stay out of the object until the next
//! resync, and the scheduler would place pods needing its devices without knowing where they
//! are. So the read is repeated when a device list may have reached the kubelet: our own
//! allocator sent one on `ListAndWatch` (its first send, every health change), or the Node's
//! `status.allocatable` changed for an extended resource (another vendor's plugin registered or
//! went away). The kubelet applies a device list shortly after it arrives, so the first read
//! may be too early: it is retried with a short backoff until the devices appear or
//! [`WAIT_BOUND`] passes ([`Waits`]).
//!
//! And the object says what it describes: [`node_level`] is what it names as node-level
//! resources (`numaplane.io/node-level-resources`), so that a resource the Node allocates and
//! the object does not show reads as "not published yet" rather than "no NUMA affinity".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use numaplane::proto::podresources::AllocatableResourcesResponse;
use tokio::time::Instant;

use crate::triggers::{Trigger, Triggers};

/// How long a wait for devices to appear in `GetAllocatableResources` lasts at most.
pub const WAIT_BOUND: Duration = Duration::from_secs(2);
/// The first retry's delay; each next one doubles, up to [`MAX_RETRY_DELAY`].
pub const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
/// The longest delay between two reads while waiting.
pub const MAX_RETRY_DELAY: Duration = Duration::from_millis(250);

/// What `GetAllocatableResources` is expected to show for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly these healthy device IDs (the list our allocator sent).
    Ids(BTreeSet<String>),
    /// This many devices (the Node's allocatable).
    Count(u64),
}

impl Expect {
    fn met_by(&self, seen: &BTreeSet<String>) -> bool {
        match self {
            Expect::Ids(ids) => ids == seen,
            Expect::Count(n) => u64::try_from(seen.len()).is_ok_and(|s| s == *n),
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Ids(ids) => write!(
                f,
                "devices [{}]",
                ids.iter().cloned().collect::<Vec<_>>().join(",")
            ),
            Expect::Count(n) => write!(f, "{n} devices"),
        }
    }
}

/// Why a wait started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// Our allocator sent a device list to the kubelet.
    DevicePlugin,
    /// The Node's allocatable changed for the resource.
    NodeAllocatable,
}

impl Cause {
    /// Metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::DevicePlugin => "device_plugin",
            Cause::NodeAllocatable => "node_allocatable",
        }
    }
}

/// One resource being waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// What is expected.
    pub expect: Expect,
    /// Why.
    pub cause: Cause,
    /// When the wait started.
    pub since: Instant,
    /// Reads made since.
    pub reads: u32,
}

/// How a wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The resource.
    pub resource: String,
    /// The wait.
    pub wait: Wait,
    /// The device IDs the last read showed for it.
    pub seen: BTreeSet<String>,
}

/// What one check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The expected devices appeared.
    pub appeared: Vec<Ended>,
    /// [`WAIT_BOUND`] passed first; the object goes with what the kubelet shows.
    pub gave_up: Vec<Ended>,
    /// Read again after this long (some wait goes on).
    pub retry_in: Option<Duration>,
}

/// The resources being waited for.
#[derive(Debug, Default, Clone)]
pub struct Waits {
    pending: BTreeMap<String, Wait>,
    /// Retries so far of the current round (for the backoff); reset when nothing is pending.
    retries: u32,
}

/// Device IDs per resource in an allocatable response.
pub fn device_ids(a: &AllocatableResourcesResponse) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in &a.devices {
        out.entry(d.resource_name.clone())
            .or_default()
            .extend(d.device_ids.iter().cloned());
    }
    out
}

impl Waits {
    /// Waits for `resource` to show `expect` (replacing an earlier wait for it).
    pub fn expect(&mut self, resource: &str, expect: Expect, cause: Cause, now: Instant) {
        self.pending.insert(
            resource.to_owned(),
            Wait {
                expect,
                cause,
                since: now,
                reads: 0,
            },
        );
    }

    /// The resources being waited for.
    pub fn pending(&self) -> impl Iterator<Item = &String> {
        self.pending.keys()
    }

    /// Whether `resource` is awaited with exact IDs (from our allocator).
    pub fn expects_ids(&self, resource: &str) -> bool {
        self.pending
            .get(resource)
            .is_some_and(|w| matches!(w.expect, Expect::Ids(_)))
    }

    /// Whether any wait goes on.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Compares a fresh read with what is expected: ends the waits it satisfies and those past
    /// [`WAIT_BOUND`], and says when to read again for the others.
    pub fn check(&mut self, allocatable: &AllocatableResourcesResponse, now: Instant) -> Checked {
        let mut out = Checked::default();
        if self.pending.is_empty() {
            return out;
        }
        let seen = device_ids(allocatable);
        let none = BTreeSet::new();
        let pending = std::mem::take(&mut self.pending);
        for (resource, mut wait) in pending {
            wait.reads = wait.reads.saturating_add(1);
            let ids = seen.get(&resource).unwrap_or(&none);
            if wait.expect.met_by(ids) {
                out.appeared.push(Ended {
                    resource,
                    wait,
                    seen: ids.clone(),
                });
            } else if now.saturating_duration_since(wait.since) >= WAIT_BOUND {
                out.gave_up.push(Ended {
                    resource,
                    wait,
                    seen: ids.clone(),
                });
            } else {
                self.pending.insert(resource, wait);
            }
        }
        if self.pending.is_empty() {
            self.retries = 0;
        } else {
            let delay = FIRST_RETRY_DELAY
                .saturating_mul(1u32.checked_shl(self.retries.min(16)).unwrap_or(u32::MAX))
                .min(MAX_RETRY_DELAY);
            self.retries = self.retries.saturating_add(1);
            out.retry_in = Some(delay);
        }
        out
    }
}

/// Device lists our allocator sent to the kubelet, waiting for the agent's next scan. The
/// allocator's `ListAndWatch` streams [`Self::note`] each list they send.
#[derive(Debug, Clone)]
pub struct Delivered {
    lists: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    triggers: Triggers,
}

impl Delivered {
    /// Deliveries that wake the agent through `triggers`.
    pub fn new(triggers: Triggers) -> Self {
        Self {
            lists: Arc::default(),
            triggers,
        }
    }

    /// A list with the healthy IDs `healthy` of `resource` was sent to the kubelet.
    pub fn note(&self, resource: &str, healthy: BTreeSet<String>) {
        self.lists
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(resource.to_owned(), healthy);
        self.triggers.send(Trigger::DevicesDelivered);
    }

    /// The lists noted since the last call, the newest per resource.
    pub fn take(&self) -> BTreeMap<String, BTreeSet<String>> {
        std::mem::take(&mut *self.lists.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What the exporter knows of its Node's extended resources, for [`node_level`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLevelInput {
    /// Extended resources the Node allocates (positive `status.allocatable`).
    pub node_extended: BTreeSet<String>,
    /// Resources not to name node-level although the kubelet shows no device of them now: the
    /// ones being waited for, and every one the kubelet has served devices of since the agent
    /// started (a plugin that went away leaves the Node's count behind for a while; its
    /// devices are not node-level, they are gone).
    pub withhold: BTreeSet<String>,
}

/// The extended resources the object names node-level: the Node allocates them, and the object
/// does not describe them in zones or as devices without NUMA, because the kubelet's device
/// manager serves none of them (`kubelet_devices`) and none is awaited, or because they are
/// excluded from the object (`excluded`).
pub fn node_level(
    input: &NodeLevelInput,
    kubelet_devices: &BTreeSet<&str>,
    excluded: &BTreeSet<&str>,
) -> BTreeSet<String> {
    input
        .node_extended
        .iter()
        .filter(|r| {
            excluded.contains(r.as_str())
                || (!kubelet_devices.contains(r.as_str()) && !input.withhold.contains(*r))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use numaplane::proto::podresources::ContainerDevices;

    fn alloc(devices: &[(&str, &[&str])]) -> AllocatableResourcesResponse {
        AllocatableResourcesResponse {
            devices: devices
                .iter()
                .map(|(r, ids)| ContainerDevices {
                    resource_name: (*r).to_owned(),
                    device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                    topology: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ids(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_wait_ends_when_the_devices_appear_with_backoff_in_between() {
        let t0 = Instant::now();
        let mut w = Waits::default();
        w.expect(
            "example.com/gpu",
            Expect::Ids(ids(&["g0", "g1"])),
            Cause::DevicePlugin,
            t0,
        );
        let c = w.check(&alloc(&[]), t0);
        assert_eq!(c.retry_in, Some(FIRST_RETRY_DELAY));
        assert!(c.appeared.is_empty() && c.gave_up.is_empty());
        // One of two is not the list that was sent.
        let c = w.check(
            &alloc(&[("example.com/gpu", &["g0"])]),
            t0 + Duration::from_millis(20),
        );
        assert_eq!(c.retry_in, Some(FIRST_RETRY_DELAY * 2));
        let c = w.check(
            &alloc(&[("example.com/gpu", &["g0"]), ("example.com/gpu", &["g1"])]),
            t0 + Duration::from_millis(60),
        );
        assert_eq!(c.retry_in, None);
        assert_eq!(c.appeared.len(), 1);
        assert_eq!(c.appeared[0].wait.reads, 3);
        assert!(w.is_empty());
        // The next round's backoff starts over.
        w.expect("example.com/gpu", Expect::Count(1), Cause::NodeAllocatable, t0);
        assert_eq!(w.check(&alloc(&[]), t0).retry_in, Some(FIRST_RETRY_DELAY));
    }

    #[test]
    fn a_wait_gives_up_after_the_bound_and_the_backoff_is_capped() {
        let t0 = Instant::now();
        let mut w = Waits::default();
        w.expect("example.com/gpu", Expect::Count(4), Cause::NodeAllocatable, t0);
        let mut delays = Vec::new();
        let mut now = t0;
        loop {
            let c = w.check(&alloc(&[("example.com/gpu", &["g0"])]), now);
            if let Some(d) = c.retry_in {
                delays.push(d);
                now += d;
                continue;
            }
            assert_eq!(c.gave_up.len(), 1);
            assert_eq!(c.gave_up[0].seen, ids(&["g0"]));
            break;
        }
        assert!(delays.iter().all(|d| *d <= MAX_RETRY_DELAY));
        assert!(delays.contains(&MAX_RETRY_DELAY), "{delays:?}");
        let total: Duration = delays.iter().sum();
        assert!(
            total >= WAIT_BOUND && total < WAIT_BOUND + MAX_RETRY_DELAY,
            "{total:?}"
        );
    }

    #[test]
    fn a_count_of_zero_is_met_when_the_devices_are_gone() {
        let t0 = Instant::now();
        let mut w = Waits::default();
        w.expect("example.com/gpu", Expect::Count(0), Cause::NodeAllocatable, t0);
        assert_eq!(w.check(&alloc(&[]), t0).appeared.len(), 1);
    }

    #[test]
    fn node_level_resources_are_those_without_devices_not_awaited_or_excluded() {
        let input = NodeLevelInput {
            node_extended: ids(&[
                "a.com/gpu",
                "b.com/dongle",
                "c.com/late",
                "d.com/gone",
                "e.com/hidden",
            ]),
            withhold: ids(&["c.com/late", "d.com/gone", "e.com/hidden"]),
        };
        let kubelet = BTreeSet::from(["a.com/gpu", "e.com/hidden"]);
        let excluded = BTreeSet::from(["e.com/hidden"]);
        assert_eq!(
            node_level(&input, &kubelet, &excluded),
            ids(&["b.com/dongle", "e.com/hidden"])
        );
    }

    #[tokio::test]
    async fn a_delivery_wakes_the_agent_and_is_taken_once() {
        let (tx, mut rx) = crate::triggers::channel(Duration::from_millis(1), Duration::from_millis(5));
        let d = Delivered::new(tx);
        d.note("example.com/gpu", ids(&["g0"]));
        d.note("example.com/gpu", ids(&["g0", "g1"]));
        let b = rx.next().await.unwrap();
        assert!(b.triggers.contains(&Trigger::DevicesDelivered));
        assert_eq!(
            d.take(),
            BTreeMap::from([("example.com/gpu".to_owned(), ids(&["g0", "g1"]))])
        );
        assert!(d.take().is_empty());
    }
}
