//! The scheduler's `/metrics`, `/healthz` and `/readyz` (and, in extender mode, the extender
//! verbs), on the server both binaries share ([`numaplane::serve`]). It starts first, so probes
//! and metrics answer while the caches sync or the replica waits for the Lease.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use numaplane::serve::{Probes, ServeError};

use super::{engine::Health, metrics::Metrics};

pub use numaplane::serve::Extra;

/// The loop beats every half second; this much silence means it is stuck.
const MAX_SILENCE: Duration = Duration::from_secs(30);

fn unix_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// The scheduler's answers to the probes.
struct SchedulerProbes {
    health: Arc<Health>,
    /// An extender replica that does not lead would answer every call with an error: it is
    /// kept out of the Service instead.
    require_leader: bool,
}

impl Probes for SchedulerProbes {
    fn healthz(&self) -> Result<String, String> {
        let last = self
            .health
            .heartbeat_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        let stalled = last != 0
            && unix_ms().saturating_sub(last) > u64::try_from(MAX_SILENCE.as_millis()).unwrap_or(u64::MAX);
        if stalled {
            Err("scheduling loop stalled\n".to_owned())
        } else {
            Ok("ok\n".to_owned())
        }
    }

    fn readyz(&self) -> Result<String, String> {
        let h = &self.health;
        let synced = h.synced.load(std::sync::atomic::Ordering::Relaxed);
        let leading = h.leading.load(std::sync::atomic::Ordering::Relaxed);
        let crd_missing = h.nrt_crd_missing.load(std::sync::atomic::Ordering::Relaxed);
        if synced && (leading || !self.require_leader) {
            // Ready means "can serve": without the CRD it still schedules (noTopology), and
            // says why no node has NUMA zones.
            Ok(if crd_missing {
                format!(
                    "ok: {}; every node is scheduled with the noTopology behaviour\n",
                    numaplane::nrt::CRD_MISSING
                )
            } else {
                "ok\n".to_owned()
            })
        } else if synced {
            Err("not the leader\n".to_owned())
        } else {
            Err("caches not synced yet\n".to_owned())
        }
    }
}

/// Binds `addr` and serves until the returned task is aborted.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    extra: Option<Extra>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
    let probes = SchedulerProbes {
        health,
        require_leader: extra.is_some(),
    };
    numaplane::serve::serve(addr, metrics, Arc::new(probes), extra).await
}
