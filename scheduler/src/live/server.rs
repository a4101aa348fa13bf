//! `/metrics`, `/healthz` and `/readyz` (and, in extender mode, the extender verbs) on warp.
//! It starts first, so probes and metrics answer while the caches sync or the replica waits
//! for the Lease.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use warp::{Filter as _, http::StatusCode};

use super::{engine::Health, metrics::Metrics};

/// The loop beats every half second; this much silence means it is stuck.
const MAX_SILENCE: Duration = Duration::from_secs(30);

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

/// Extra routes (the extender verbs), boxed so both modes share one server.
pub type Extra = warp::filters::BoxedFilter<(Box<dyn warp::Reply>,)>;

fn unix_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// Binds `addr` and serves until the returned task is aborted.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    extra: Option<Extra>,
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
        .map(move |accept: Option<String>| {
            let reply: Box<dyn warp::Reply> = match metrics.encode() {
                Ok(body) => {
                    let content_type = numaplane::exposition::negotiate(accept.as_deref());
                    Box::new(warp::reply::with_header(
                        numaplane::exposition::render(body, content_type),
                        "content-type",
                        content_type,
                    ))
                }
                Err(_) => Box::new(warp::reply::with_status(
                    "cannot encode metrics\n",
                    StatusCode::INTERNAL_SERVER_ERROR,
                )),
            };
            reply
        });
    let h = health.clone();
    let healthz = warp::path("healthz").and(warp::path::end()).map(move || {
        let last = h.heartbeat_ms.load(std::sync::atomic::Ordering::Relaxed);
        let stalled = last != 0
            && unix_ms().saturating_sub(last) > u64::try_from(MAX_SILENCE.as_millis()).unwrap_or(u64::MAX);
        let reply: Box<dyn warp::Reply> = if stalled {
            Box::new(warp::reply::with_status(
                "scheduling loop stalled\n",
                StatusCode::SERVICE_UNAVAILABLE,
            ))
        } else {
            Box::new(warp::reply::with_status("ok\n", StatusCode::OK))
        };
        reply
    });
    // An extender replica that does not lead would answer every call with an error: it is
    // kept out of the Service instead.
    let require_leader = extra.is_some();
    let readyz = warp::path("readyz").and(warp::path::end()).map(move || {
        let synced = health.synced.load(std::sync::atomic::Ordering::Relaxed);
        let leading = health.leading.load(std::sync::atomic::Ordering::Relaxed);
        let crd_missing = health.nrt_crd_missing.load(std::sync::atomic::Ordering::Relaxed);
        let reply: Box<dyn warp::Reply> = if synced && (leading || !require_leader) {
            // Ready means "can serve": without the CRD it still schedules (noTopology), and
            // says why no node has NUMA zones.
            let body = if crd_missing {
                format!(
                    "ok: {}; every node is scheduled with the noTopology behaviour\n",
                    numaplane::nrt::CRD_MISSING
                )
            } else {
                "ok\n".to_owned()
            };
            Box::new(warp::reply::with_status(body, StatusCode::OK))
        } else if synced {
            Box::new(warp::reply::with_status(
                "not the leader\n",
                StatusCode::SERVICE_UNAVAILABLE,
            ))
        } else {
            Box::new(warp::reply::with_status(
                "caches not synced yet\n",
                StatusCode::SERVICE_UNAVAILABLE,
            ))
        };
        reply
    });
    let base = warp::get().and(metrics_route.or(healthz).unify().or(readyz).unify());
    let server = match extra {
        Some(extra) => tokio::spawn(warp::serve(base.or(extra).unify()).incoming(listener).run()),
        None => tokio::spawn(warp::serve(base).incoming(listener).run()),
    };
    Ok((local, server))
}
