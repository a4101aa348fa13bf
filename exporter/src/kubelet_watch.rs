//! The kubelet `Watch` fast path, one trigger of the agent's scans.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::podresources::KubeletClient;
use crate::triggers::{Trigger, Triggers};

/// The kubelet `Watch` fast path: every event triggers a scan. UNIMPLEMENTED (every released
/// kubelet) is logged once at info and re-probed rarely and silently, in case the kubelet is
/// upgraded.
pub(crate) async fn kubelet_watch(client: KubeletClient, triggers: Triggers, metrics: Arc<Metrics>) {
    const REPROBE: Duration = Duration::from_secs(600);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    let mut said_unimplemented = false;
    loop {
        match client.watch().await {
            Ok(mut stream) => {
                backoff.reset();
                metrics.kubelet_watch_active.set(1);
                tracing::info!(socket = %client.socket().display(), "kubelet Watch stream open");
                // Anything may have changed while the stream was down.
                triggers.send(Trigger::KubeletWatch);
                while let Some(msg) = stream.next().await {
                    match msg {
                        Ok(_) => {
                            if !triggers.send(Trigger::KubeletWatch) {
                                return;
                            }
                        }
                        Err(status) => {
                            tracing::debug!(code = ?status.code(), message = status.message(), "kubelet Watch stream broke");
                            break;
                        }
                    }
                }
                metrics.kubelet_watch_active.set(0);
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => {
                if !said_unimplemented {
                    tracing::info!(
                        socket = %client.socket().display(),
                        "kubelet does not offer pod-resources Watch; relying on the pod watch, \
                         the notify file and the periodic resync"
                    );
                    said_unimplemented = true;
                }
                tokio::time::sleep(REPROBE).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot open kubelet Watch; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}
