//! What the simulated kubelets of the whole-system run and the soak share: the pod key, the
//! kubelet's admission order, marking admitted pods Running, and the NRT watch that checks
//! every published NRT against its node.

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use numaplane::nrt::NodeResourceTopology;
use serde_json::json;
use tokio::sync::mpsc;

/// `namespace/name` of a pod.
pub fn key_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether the pod's phase is terminal (Succeeded or Failed): the kubelet releases what it held.
pub fn is_terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Sorts one batch of pod additions as the kubelet's HandlePodAdditions does: by creation
/// time, then by `namespace/name` (as the plugin breaks ties).
pub fn admission_order(pods: &mut [Pod]) {
    pods.sort_by(|a, b| {
        let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b)).then_with(|| key_of(a).cmp(&key_of(b)))
    });
}

/// Sets an admitted pod's phase to Running in the background, as its kubelet reports it.
pub fn mark_running(client: &kube::Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let name = pod.metadata.name.clone().unwrap_or_default();
    tokio::spawn(async move {
        // The pod may already be gone; its status does not matter then.
        let _ = api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running"}})),
            )
            .await;
    });
}

/// Watches every NRT and hands each applied one to `seen` until it answers `false` (its
/// receiver is gone). Watch errors are retried by the backoff.
pub async fn watch_nrts(client: kube::Client, mut seen: impl FnMut(NodeResourceTopology) -> bool) {
    let api: Api<NodeResourceTopology> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(nrt) = event else { continue };
        if !seen(nrt) {
            return;
        }
    }
}

/// `first` and whatever else is already queued on `rx`: one batch, as the kubelet's config
/// source merges what arrived together.
pub fn with_queued<T>(first: T, rx: &mut mpsc::UnboundedReceiver<T>) -> Vec<T> {
    let mut batch = vec![first];
    while let Ok(next) = rx.try_recv() {
        batch.push(next);
    }
    batch
}
