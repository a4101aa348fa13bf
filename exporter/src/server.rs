//! `/metrics`, `/healthz` and `/readyz` on a warp server. It starts before anything else so
//! that probes and metrics work while the agent waits for the kubelet or the CRD.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use warp::Filter as _;
use warp::http::StatusCode;

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

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Binds `addr` and serves until the returned task is aborted. `max_silence` is how long the
/// main loop may stay silent before `/healthz` fails (it beats at least every resync).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_silence: Duration,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;

    let metrics_route = warp::path("metrics")
        .and(warp::path::end())
        .and(warp::header::optional::<String>("accept"))
        .map(move |accept: Option<String>| match metrics.encode() {
            Ok(body) => {
                let content_type = numaplane::exposition::negotiate(accept.as_deref());
                warp::http::Response::builder()
                    .header("content-type", content_type)
                    .body(numaplane::exposition::render(body, content_type))
            }
            Err(_) => warp::http::Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body("cannot encode metrics\n".to_owned()),
        });
    let h = health.clone();
    let healthz = warp::path("healthz").and(warp::path::end()).map(move || {
        if h.alive(max_silence) {
            warp::reply::with_status("ok\n".to_owned(), StatusCode::OK)
        } else {
            warp::reply::with_status("main loop stalled\n".to_owned(), StatusCode::SERVICE_UNAVAILABLE)
        }
    });
    let readyz = warp::path("readyz")
        .and(warp::path::end())
        .map(move || match health.readiness() {
            Ok(()) => warp::reply::with_status("ok\n".to_owned(), StatusCode::OK),
            Err(reason) => warp::reply::with_status(format!("{reason}\n"), StatusCode::SERVICE_UNAVAILABLE),
        });
    let routes = warp::get().and(metrics_route.or(healthz).or(readyz));
    let server = warp::serve(routes).incoming(listener);
    Ok((local, tokio::spawn(server.run())))
}
