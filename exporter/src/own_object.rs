//! The watch of the agent's own NodeResourceTopology, one trigger of the agent's scans: a
//! delete or a foreign edit is repaired at once.

use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use kube::Client;
use numaplane::nrt::NodeResourceTopology;

use crate::metrics::Metrics;
use crate::publish;
use crate::triggers::{Trigger, Triggers};

/// Watches our own object: a delete or a foreign edit of the fields we own triggers a forced
/// write, so the object is recreated or repaired at once rather than at the next forced resync.
pub(crate) async fn watch_own_object(
    client: Client,
    node_name: String,
    last_applied: Arc<Mutex<Option<NodeResourceTopology>>>,
    triggers: Triggers,
    metrics: Arc<Metrics>,
) {
    use kube::runtime::{WatchStreamExt as _, watcher};
    let api: kube::Api<NodeResourceTopology> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(node = %node_name, "NodeResourceTopology deleted by someone else; recreating");
                triggers.send(Trigger::ObjectChanged);
            }
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                let differs = publish::lock_applied(&last_applied).as_ref().is_some_and(|mine| {
                    mine.zones != obj.zones
                        || mine.attributes != obj.attributes
                        || mine.topology_policies != obj.topology_policies
                });
                if differs {
                    tracing::warn!(node = %node_name, "NodeResourceTopology changed by someone else; rewriting");
                    triggers.send(Trigger::ObjectChanged);
                }
            }
            Ok(_) => {}
            Err(e) => {
                // Before the CRD exists this fails continuously; the main loop reports that.
                metrics.error("object_watch");
                tracing::debug!(error = %numaplane::error_chain(&e), "watch of own object failed");
            }
        }
    }
}
