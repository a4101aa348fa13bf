//! `numaplane-scheduler run` and `extender`: the live scheduler. Watches feed one loop
//! ([`engine`]) that owns the cluster index and the queue; Bindings carry the allocation
//! record; one Lease elects the replica that schedules; `/metrics`, `/healthz`, `/readyz` are
//! always served. In extender mode there is no pending-pod watch: kube-scheduler's calls
//! ([`extender_http`]) reach the same loop.
//!
//! Everything here is I/O around the pure model: the decisions themselves are plain calls into
//! [`crate::cluster::Cluster`].

pub mod api;
pub mod claim_error;
pub mod daemon_config;
pub mod engine;
pub mod eviction;
pub mod extender_http;
pub mod metrics;
pub mod server;

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use numaplane::nrt::NodeResourceTopology;
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};

use self::{
    daemon_config::{LeaderElection, ServeConfig},
    engine::{Engine, Health, Input, Stream},
    metrics::Metrics,
};

/// Why the live scheduler stopped.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The kubeconfig or in-cluster configuration cannot be used.
    #[error("building the Kubernetes client")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The HTTP server cannot start.
    #[error("serving HTTP")]
    Server(#[from] numaplane::serve::ServeError),
    /// Leader election cannot start.
    #[error("starting leader election on Lease {namespace}/{name}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Cause.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The loop stopped.
    #[error("scheduling loop")]
    Engine(#[from] engine::EngineError),
    /// A supervised task ended on its own.
    #[error("task {0} ended unexpectedly")]
    TaskEnded(&'static str),
}

/// Builds the client from `--kubeconfig`, or in-cluster / `$KUBECONFIG`.
pub async fn client(cfg: &ServeConfig) -> Result<Client, LiveError> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| LiveError::Client(e);
    let config = match &cfg.kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| boxed(Box::new(e)))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(Box::new(e)))?
        }
        None => kube::Config::infer().await.map_err(|e| boxed(Box::new(e)))?,
    };
    Client::try_from(config).map_err(|e| boxed(Box::new(e)))
}

/// Forwards one watch into the loop's channel, with kube-runtime's default backoff on errors
/// (each error is also reported, for the metric and the log).
fn forward<K, F>(
    tasks: &mut JoinSet<&'static str>,
    name: &'static str,
    api: Api<K>,
    wc: watcher::Config,
    stream: Stream,
    tx: mpsc::UnboundedSender<Input>,
    wrap: F,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(watcher::Event<K>) -> Input + Send + 'static,
{
    // client-go's backoff (0.8 s doubling to 30 s), except for NRTs: while their CRD is
    // missing the list fails every time, and the CRD should be picked up within seconds of
    // `kubectl apply`, not half a minute.
    let max_delay = if stream == Stream::Nrts {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(30)
    };
    let backoff = watcher::ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(800))
            .with_max_delay(max_delay)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    );
    tasks.spawn(async move {
        let events = watcher(api, wc).backoff(backoff);
        let mut events = std::pin::pin!(events);
        while let Some(ev) = events.next().await {
            let input = match ev {
                Ok(ev) => wrap(ev),
                Err(e) if stream == Stream::Nrts && resource_not_served(&e) => Input::NrtCrdMissing,
                Err(e) => Input::WatchError(stream, numaplane::error_chain(&e)),
            };
            if tx.send(input).is_err() {
                break;
            }
        }
        name
    });
}

/// A cluster-wide list or watch answered 404: the resource is not served, i.e. its CRD is not
/// installed (a real API server answers with a plain-text "404 page not found").
fn resource_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// Starts every watch of the live scheduler.
pub fn spawn_watches(
    tasks: &mut JoinSet<&'static str>,
    client: &Client,
    names: &[String],
    tx: &mpsc::UnboundedSender<Input>,
) {
    let bookmarks = || watcher::Config::default().any_semantic();
    forward(
        tasks,
        "node watch",
        Api::<Node>::all(client.clone()),
        bookmarks(),
        Stream::Nodes,
        tx.clone(),
        Input::Node,
    );
    forward(
        tasks,
        "NodeResourceTopology watch",
        Api::<NodeResourceTopology>::all(client.clone()),
        bookmarks(),
        Stream::Nrts,
        tx.clone(),
        Input::Nrt,
    );
    if names.is_empty() {
        // The extender sees pending pods through kube-scheduler: only the bound ones here.
        forward(
            tasks,
            "bound pod watch",
            Api::<Pod>::all(client.clone()),
            bookmarks().fields("spec.nodeName!="),
            Stream::Bound,
            tx.clone(),
            Input::BoundPodEvent,
        );
    } else {
        // One watch of every pod, as kube-scheduler's pod informer: the pods bound anywhere
        // and the unbound ones of the names served. Two watches split by field selectors
        // would have the API server send every Binding twice (the pod leaving one selector
        // and entering the other); another scheduler's unbound pods are read and passed over.
        forward(
            tasks,
            "pod watch",
            Api::<Pod>::all(client.clone()),
            bookmarks(),
            Stream::Pods,
            tx.clone(),
            Input::Pod,
        );
    }
    // Namespace labels for `namespaceSelector` (schedulers only: in extender
    // mode kube-scheduler applies inter-pod affinity itself).
    if !names.is_empty() {
        forward(
            tasks,
            "namespace watch",
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()),
            bookmarks(),
            Stream::Namespaces,
            tx.clone(),
            Input::Namespace,
        );
    }
}

/// Leader flag: a Lease through kube-lease-manager, or always true when election is off.
/// The returned guard keeps the election alive; dropping it releases the Lease.
async fn elect(
    client: &Client,
    le: Option<&LeaderElection>,
) -> Result<(watch::Receiver<bool>, LeaderGuard), LiveError> {
    let Some(le) = le else {
        let (tx, rx) = watch::channel(true);
        return Ok((rx, LeaderGuard::Always(tx)));
    };
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &le.name)
        .with_namespace(&le.namespace)
        .with_identity(&le.identity)
        .with_duration(le.duration.as_secs())
        .with_grace(le.renew_before.as_secs())
        .build()
        .await
        .map_err(|source| LiveError::Lease {
            namespace: le.namespace.clone(),
            name: le.name.clone(),
            source,
        })?;
    let (rx, task) = manager.watch().await;
    tracing::info!(lease = %format!("{}/{}", le.namespace, le.name), identity = %le.identity, "waiting for the leader Lease");
    Ok((rx, LeaderGuard::Lease(task)))
}

/// Keeps leader election running.
#[derive(Debug)]
pub enum LeaderGuard {
    /// Election off.
    Always(watch::Sender<bool>),
    /// The lease task (it releases the Lease once every receiver is dropped).
    Lease(tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>),
}

impl LeaderGuard {
    /// Waits (briefly) for the Lease to be released.
    async fn release(self) {
        if let LeaderGuard::Lease(task) = self {
            let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
        }
    }
}

/// Waits for SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs the live scheduler until a signal, a lost Lease or a failed task.
pub async fn run(cfg: ServeConfig) -> Result<(), LiveError> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let client = client(&cfg).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let identity = cfg
        .leader_election
        .as_ref()
        .map_or_else(|| "numaplane-scheduler".to_owned(), |l| l.identity.clone());
    let (writer, aux_task) = api::Writer::new(
        client.clone(),
        api::Budget {
            qps: cfg.qps,
            burst: cfg.burst,
        },
        cfg.events,
        identity,
        metrics.clone(),
    );
    let extra = cfg
        .extender
        .then(|| extender_http::routes(tx.clone(), client.clone(), writer.clone(), metrics.clone()));
    let (addr, server_task) = server::serve(cfg.listen, metrics.clone(), health.clone(), extra).await?;
    let metrics_server = match cfg.metrics_listen {
        Some(at) => {
            let (addr, task) = server::serve(at, metrics.clone(), health.clone(), None).await?;
            tracing::info!(%addr, "serving /metrics /healthz /readyz");
            Some(task)
        }
        None => None,
    };
    if cfg.extender {
        tracing::info!(%addr, "serving the extender verbs (filter, prioritize, bind) and /metrics /healthz /readyz");
    } else {
        tracing::info!(%addr, "serving /metrics /healthz /readyz");
    }
    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    let pending_names: &[String] = if cfg.extender { &[] } else { &cfg.scheduler_names };
    spawn_watches(&mut tasks, &client, pending_names, &tx);
    // kube-scheduler binds volumes itself in extender mode.
    if !cfg.extender {
        engine::volumes::spawn_watches(&mut tasks, &client, &tx);
        // In extender mode kube-scheduler preempts.
        engine::preemption::spawn_watches(&mut tasks, &client, &tx);
        // In extender mode kube-scheduler allocates resource claims.
        engine::dra::spawn_watches(&mut tasks, &client, &tx);
    }
    tasks.spawn(async move {
        aux_task.await;
        "event writer"
    });
    tasks.spawn(async move {
        let _ = server_task.await;
        "HTTP server"
    });
    if let Some(task) = metrics_server {
        tasks.spawn(async move {
            let _ = task.await;
            "metrics server"
        });
    }
    let (leader, guard) = elect(&client, cfg.leader_election.as_ref()).await?;
    let engine = Engine::new(cfg, writer, metrics, health, leader, tx);
    let result = tokio::select! {
        r = engine.run(rx) => r.map_err(LiveError::from),
        ended = tasks.join_next() => {
            let name = match ended {
                Some(Ok(name)) => name,
                Some(Err(e)) => {
                    tracing::error!(error = %e, "a task panicked");
                    "panicked task"
                }
                None => "none",
            };
            Err(LiveError::TaskEnded(name))
        }
        () = shutdown_signal() => {
            tracing::info!("signal received: stepping down");
            Ok(())
        }
    };
    tasks.abort_all();
    guard.release().await;
    result
}
