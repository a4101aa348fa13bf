//! The watch of this node's ResourceSlices (field selector `spec.nodeName=<node>`, so only
//! `list/watch` on resourceslices): the DRA devices the node's drivers publish, which the
//! accounting places on NUMA zones ([`crate::accounting::DraInputs`]). Slices that select nodes
//! with `nodeSelector` or `allNodes` (devices reachable from several nodes, such as network
//! attached ones) are not watched: a device of theirs that a pod here holds is counted without
//! NUMA node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};

use crate::metrics::Metrics;
use crate::triggers::{Trigger, Triggers};

/// What the watch knows, shared with the scan loop.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SliceView {
    /// Whether the first list has completed (before that, the devices are incomplete).
    pub synced: bool,
    /// The node's slices by name.
    pub slices: BTreeMap<String, ResourceSlice>,
}

impl SliceView {
    /// The slices, when the first list has completed.
    pub fn listed(&self) -> Option<Vec<ResourceSlice>> {
        self.synced.then(|| self.slices.values().cloned().collect())
    }
}

/// Shared handle.
pub type SharedSliceView = Arc<Mutex<SliceView>>;

/// Locks the view, recovering from a poisoned lock (each update leaves it consistent).
pub fn lock(view: &SharedSliceView) -> std::sync::MutexGuard<'_, SliceView> {
    view.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Field selector of this node's ResourceSlices.
pub fn node_selector(node_name: &str) -> String {
    format!("spec.nodeName={node_name}")
}

/// Runs the watch forever, reconnecting with the watcher's default backoff; sends
/// [`Trigger::ResourceSlices`] when the node's slices change.
pub async fn run(
    client: Client,
    node_name: String,
    view: SharedSliceView,
    triggers: Triggers,
    metrics: Arc<Metrics>,
) {
    let slices: Api<ResourceSlice> = Api::all(client);
    let config = watcher::Config::default().fields(&node_selector(&node_name));
    let stream = watcher::watcher(slices, config).default_backoff();
    futures::pin_mut!(stream);
    let mut relist: BTreeMap<String, ResourceSlice> = BTreeMap::new();
    while let Some(event) = stream.next().await {
        let changed = {
            let mut v = lock(&view);
            match event {
                Ok(watcher::Event::Init) => {
                    relist.clear();
                    false
                }
                Ok(watcher::Event::InitApply(s)) => {
                    relist.insert(s.name_any(), s);
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    let listed = std::mem::take(&mut relist);
                    let changed = !v.synced || v.slices != listed;
                    v.slices = listed;
                    v.synced = true;
                    changed
                }
                Ok(watcher::Event::Apply(s)) => {
                    let name = s.name_any();
                    let same = v.slices.get(&name) == Some(&s);
                    if !same {
                        v.slices.insert(name, s);
                    }
                    !same
                }
                Ok(watcher::Event::Delete(s)) => v.slices.remove(&s.name_any()).is_some(),
                Err(e) => {
                    metrics.error("resource_slice_watch");
                    tracing::warn!(node = %node_name, error = %numaplane::error_chain(&e), "ResourceSlice watch failed; retrying");
                    false
                }
            }
        };
        if changed && !triggers.send(Trigger::ResourceSlices) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_listed_only_once_synced() {
        let mut v = SliceView::default();
        assert_eq!(v.listed(), None);
        v.slices.insert("s".into(), ResourceSlice::default());
        assert_eq!(v.listed(), None);
        v.synced = true;
        assert_eq!(v.listed().map(|s| s.len()), Some(1));
        assert_eq!(node_selector("n1"), "spec.nodeName=n1");
    }
}
