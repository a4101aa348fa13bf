//! The watch of the exporter's own Node (field selector `metadata.name=<node>`, so only
//! `get/list/watch` on nodes): a device plugin registering or going away changes the Node's
//! `status.allocatable` for its extended resource, and then allocatable is read again
//! ([`crate::allocatable_follow`]). The Node's extended resources also tell which ones the
//! object must describe (`numaplane.io/node-level-resources`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use numaplane::quantity::Quantity;
use numaplane::resource_name::{Class, classify};

use crate::metrics::Metrics;
use crate::triggers::{Trigger, Triggers};

/// What the Node watch knows, shared with the scan loop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Whether the Node has been seen (the watch listed it).
    pub synced: bool,
    /// The Node's positive allocatable extended resources, by name: how many.
    pub extended: BTreeMap<String, u64>,
    /// Resources whose allocatable changed since the scan loop last took them.
    pub changed: BTreeSet<String>,
}

/// Shared handle.
pub type SharedNodeView = Arc<Mutex<NodeView>>;

/// Field selector of this node's Node object.
pub fn name_selector(node_name: &str) -> String {
    format!("metadata.name={node_name}")
}

/// The positive allocatable extended resources of `node`, as whole counts. A quantity that
/// does not parse, or is not a whole count, is left out (the kubelet writes integers) and
/// logged.
pub fn extended_allocatable(node: &Node) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (name, q) in alloc.into_iter().flatten() {
        if classify(name) != Class::Extended {
            continue;
        }
        match Quantity::parse(&q.0).ok().and_then(|v| v.as_i64_exact()) {
            Some(n) if n > 0 => {
                out.insert(name.clone(), u64::try_from(n).unwrap_or(0));
            }
            Some(_) => {}
            None => {
                tracing::warn!(resource = %name, value = %q.0, "Node allocatable is not a whole count; ignored")
            }
        }
    }
    out
}

impl NodeView {
    /// Takes in the Node's extended resources; whether any count changed (or the Node is seen
    /// for the first time, when every resource counts as changed).
    pub fn update(&mut self, extended: BTreeMap<String, u64>) -> bool {
        let mut changed: BTreeSet<String> = extended
            .iter()
            .filter(|(r, n)| !self.synced || self.extended.get(*r) != Some(n))
            .map(|(r, _)| r.clone())
            .collect();
        changed.extend(
            self.extended
                .keys()
                .filter(|r| !extended.contains_key(*r))
                .cloned(),
        );
        self.synced = true;
        self.extended = extended;
        let any = !changed.is_empty();
        self.changed.extend(changed);
        any
    }

    /// The changed resources with the Node's count for each (0: gone), emptying the set.
    pub fn take_changed(&mut self) -> BTreeMap<String, u64> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|r| {
                let n = self.extended.get(&r).copied().unwrap_or(0);
                (r, n)
            })
            .collect()
    }
}

/// Locks the view, recovering from a poisoned lock (each update leaves it consistent).
pub fn lock(view: &SharedNodeView) -> std::sync::MutexGuard<'_, NodeView> {
    view.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the watch forever, reconnecting with the watcher's default backoff; sends
/// [`Trigger::NodeAllocatable`] when an extended resource's allocatable changes.
pub async fn run(
    client: Client,
    node_name: String,
    view: SharedNodeView,
    triggers: Triggers,
    metrics: Arc<Metrics>,
) {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&name_selector(&node_name));
    let stream = watcher::watcher(nodes, config).default_backoff();
    futures::pin_mut!(stream);
    let mut listed: Option<BTreeMap<String, u64>> = None;
    while let Some(event) = stream.next().await {
        let seen = match event {
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(node)) => {
                listed = Some(extended_allocatable(&node));
                continue;
            }
            // A relist without the Node (deleted): nothing allocatable.
            Ok(watcher::Event::InitDone) => listed.take().unwrap_or_default(),
            Ok(watcher::Event::Apply(node)) => extended_allocatable(&node),
            Ok(watcher::Event::Delete(_)) => BTreeMap::new(),
            Err(e) => {
                metrics.error("node_watch");
                tracing::warn!(node = %node_name, error = %numaplane::error_chain(&e), "Node watch failed; retrying");
                continue;
            }
        };
        let changed = {
            let mut v = lock(&view);
            v.update(seen)
        };
        if changed && !triggers.send(Trigger::NodeAllocatable) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(alloc: serde_json::Value) -> Node {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n1"}, "status": {"allocatable": alloc}}),
        )
        .unwrap()
    }

    #[test]
    fn only_positive_whole_extended_resources_count() {
        let n = node(serde_json::json!({
            "cpu": "4", "memory": "8Gi", "hugepages-1Gi": "2Gi", "example.kubernetes.io/x": "1",
            "example.com/gpu": "4", "example.com/none": "0", "example.com/odd": "lots"
        }));
        assert_eq!(
            extended_allocatable(&n),
            BTreeMap::from([("example.com/gpu".to_owned(), 4)])
        );
    }

    #[test]
    fn changes_are_collected_until_taken() {
        let mut v = NodeView::default();
        // First sight: every resource counts as changed, even unchanged from the default.
        assert!(v.update(BTreeMap::from([("a.com/gpu".to_owned(), 4)])));
        assert!(!v.update(BTreeMap::from([("a.com/gpu".to_owned(), 4)])));
        assert!(v.update(BTreeMap::from([
            ("a.com/gpu".to_owned(), 3),
            ("b.com/nic".to_owned(), 2)
        ])));
        assert!(v.update(BTreeMap::from([("b.com/nic".to_owned(), 2)])));
        assert_eq!(
            v.take_changed(),
            BTreeMap::from([("a.com/gpu".to_owned(), 0), ("b.com/nic".to_owned(), 2)])
        );
        assert!(v.take_changed().is_empty());
        assert!(v.synced);
    }
}
