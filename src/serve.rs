//! `/metrics`, `/healthz` and `/readyz` on warp: the one server both binaries start first, so
//! that probes and metrics answer while the exporter waits for the kubelet or the CRD and while
//! the scheduler syncs its caches or waits for the Lease. The scheduler's extender verbs ride
//! on it as extra routes.

use std::{net::SocketAddr, sync::Arc};

use warp::{Filter as _, Reply, http::StatusCode};

use crate::metrics::Registered;

/// What the probes answer: `Ok(body)` is 200, `Err(body)` is 503.
pub trait Probes: Send + Sync + 'static {
    /// `/healthz`: the process is alive (its main loop turns).
    fn healthz(&self) -> Result<String, String>;

    /// `/readyz`: it can serve.
    fn readyz(&self) -> Result<String, String>;
}

/// What `/metrics` serves: OpenMetrics text, rendered in the format the scraper asks for.
pub trait Scrape: Send + Sync + 'static {
    /// The OpenMetrics text.
    fn scrape(&self) -> Result<String, std::fmt::Error>;
}

impl<F: Send + Sync + 'static> Scrape for Registered<F> {
    fn scrape(&self) -> Result<String, std::fmt::Error> {
        self.encode()
    }
}

/// Extra routes (the extender verbs), boxed so that every caller shares one server.
pub type Extra = warp::filters::BoxedFilter<(Box<dyn Reply>,)>;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
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

fn probe(answer: Result<String, String>) -> Box<dyn Reply> {
    match answer {
        Ok(body) => Box::new(warp::reply::with_status(body, StatusCode::OK)),
        Err(body) => Box::new(warp::reply::with_status(body, StatusCode::SERVICE_UNAVAILABLE)),
    }
}

/// Binds `addr` and serves until the returned task is aborted; the bound address (port 0
/// picks one) comes back with the task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Scrape>,
    probes: Arc<dyn Probes>,
    extra: Option<Extra>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let metrics_route = warp::path("metrics")
        .and(warp::path::end())
        .and(warp::header::optional::<String>("accept"))
        .map(move |accept: Option<String>| -> Box<dyn Reply> {
            match metrics.scrape() {
                Ok(body) => {
                    let content_type = crate::exposition::negotiate(accept.as_deref());
                    Box::new(warp::reply::with_header(
                        crate::exposition::render(body, content_type),
                        "content-type",
                        content_type,
                    ))
                }
                Err(_) => Box::new(warp::reply::with_status(
                    "cannot encode metrics\n",
                    StatusCode::INTERNAL_SERVER_ERROR,
                )),
            }
        });
    let p = probes.clone();
    let healthz = warp::path("healthz")
        .and(warp::path::end())
        .map(move || probe(p.healthz()));
    let readyz = warp::path("readyz")
        .and(warp::path::end())
        .map(move || probe(probes.readyz()));
    let base = warp::get().and(metrics_route.or(healthz).unify().or(readyz).unify());
    let server = match extra {
        Some(extra) => tokio::spawn(warp::serve(base.or(extra).unify()).incoming(listener).run()),
        None => tokio::spawn(warp::serve(base).incoming(listener).run()),
    };
    Ok((local, server))
}
