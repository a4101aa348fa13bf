//! The agent's `/metrics`, `/healthz` and `/readyz`, on the server both binaries share
//! ([`numaplane::serve`]). It starts before anything else so that probes and metrics work
//! while the agent waits for the kubelet or the CRD.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use numaplane::serve::{Probes, ServeError};

use crate::metrics::{Metrics, unix_now};

/// Liveness and readiness, written by the main loop.
#[derive(Debug, Default)]
pub struct Health {
    /// Unix time (ms) of the main loop's last turn.
    heartbeat_ms: AtomicU64,
    /// The current object is published (or dry-run printed).
    ready: AtomicBool,
    /// Why the agent is not ready, when known.
    reason: std::sync::Mutex<String>,
}

impl Health {
    /// Marks the main loop alive.
    pub fn beat(&self) {
        self.heartbeat_ms
            .store((unix_now() * 1000.0) as u64, Ordering::Relaxed);
    }

    /// Ready: the API server holds the current object.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Not ready, with the reason shown by `/readyz`.
    pub fn set_not_ready(&self, reason: String) {
        self.ready.store(false, Ordering::Relaxed);
        *self
            .reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    fn alive(&self, max_silence: Duration) -> bool {
        let last = self.heartbeat_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        last == 0.0 || unix_now() - last <= max_silence.as_secs_f64()
    }

    fn readiness(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            let reason = self
                .reason
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            Err(if reason.is_empty() {
                "no object published yet".to_owned()
            } else {
                reason
            })
        }
    }
}

/// The agent's answers to the probes: alive while the main loop beats within `max_silence`,
/// ready while the current object is published.
struct AgentProbes {
    health: Arc<Health>,
    max_silence: Duration,
}

impl Probes for AgentProbes {
    fn healthz(&self) -> Result<String, String> {
        if self.health.alive(self.max_silence) {
            Ok("ok\n".to_owned())
        } else {
            Err("main loop stalled\n".to_owned())
        }
    }

    fn readyz(&self) -> Result<String, String> {
        self.health
            .readiness()
            .map(|()| "ok\n".to_owned())
            .map_err(|reason| format!("{reason}\n"))
    }
}

/// Binds `addr` and serves until the returned task is aborted. `max_silence` is how long the
/// main loop may stay silent before `/healthz` fails (it beats at least every resync).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_silence: Duration,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
    numaplane::serve::serve(addr, metrics, Arc::new(AgentProbes { health, max_silence }), None).await
}

/// The address to serve on: `--listen`, else the deprecated `--metrics-address` (with a
/// warning), else `default`.
pub fn listen_address(
    listen: Option<SocketAddr>,
    deprecated: Option<SocketAddr>,
    default: SocketAddr,
) -> SocketAddr {
    match (listen, deprecated) {
        (Some(addr), Some(old)) => {
            tracing::warn!(
                %addr,
                ignored = %old,
                "--metrics-address (NUMAPLANE_METRICS_ADDRESS) is deprecated and ignored next to --listen (NUMAPLANE_LISTEN)"
            );
            addr
        }
        (Some(addr), None) => addr,
        (None, Some(old)) => {
            tracing::warn!(
                addr = %old,
                "--metrics-address (NUMAPLANE_METRICS_ADDRESS) is deprecated: use --listen (NUMAPLANE_LISTEN)"
            );
            old
        }
        (None, None) => default,
    }
}
