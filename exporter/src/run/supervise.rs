//! Starting the agent: every background task (triggers, watches, the metrics server, the
//! allocator) is spawned under supervision, so that one that ends takes the agent down.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;

use crate::accounting::AccountingConfig;
use crate::kubelet_source::{Refresh, Refresher, Sources};
use crate::metrics::Metrics;
use crate::pod_watch::{self, SharedPodView};
use crate::publish::{NodeEvents, Publisher};
use crate::run::args::RunArgs;
use crate::run::config::{apply_kubelet_settings, info_labels};
use crate::run::error::RunError;
use crate::run::main_loop::{ADMISSION_POLL_INTERVAL, Agent};
use crate::scan::Scanner;
use crate::server::{self, Health};
use crate::triggers::{self};

impl Agent {
    pub(super) async fn start(
        args: RunArgs,
        mut cfg: AccountingConfig,
        scanner: Scanner,
        metrics: Arc<Metrics>,
        pools: Vec<crate::allocator::pools::Pool>,
        kube: Option<Client>,
        sources: Sources,
    ) -> Result<Self, RunError> {
        let health = Arc::new(Health::default());
        // Probes must tolerate the longest silent wait of the main loop: a resync period plus
        // the slowest retry.
        let max_silence =
            args.resync_interval.max(Duration::from_secs(10)) * 3 + args.api_backoff_max + args.call_timeout;
        let (addr, server_task) = server::serve(
            args.listen_address(),
            metrics.clone(),
            health.clone(),
            max_silence,
        )
        .await
        .map_err(RunError::Server)?;
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        let (triggers, coalescer) = triggers::channel(args.debounce, args.max_debounce);
        let notify = match &args.notify_file {
            Some(path) => {
                Some(triggers::watch_notify_file(path, triggers.clone()).map_err(RunError::NotifyFile)?)
            }
            None => None,
        };
        let (refresh, refresh_requests) = tokio::sync::mpsc::unbounded_channel();
        let kubelet_config_watch = if args.kubelet_config.is_some() || args.kubelet_config_dir.is_some() {
            let tx = refresh.clone();
            let on_change = move || {
                let _ = tx.send(Refresh::Now);
            };
            match triggers::watch_kubelet_config(
                args.kubelet_config.as_deref(),
                args.kubelet_config_dir.as_deref(),
                on_change,
            ) {
                Ok(w) => Some(w),
                Err(e) => {
                    // Not fatal: the file may appear later, and it is read again at the resync.
                    tracing::warn!(error = %numaplane::error_chain(&e), "cannot watch the kubelet config; reading it at the resync only");
                    None
                }
            }
        } else {
            None
        };
        let mut tasks = tokio::task::JoinSet::new();
        supervise(&mut tasks, "metrics server", server_task);
        if let Some(timer) = triggers::spawn_resync_timer(triggers.clone(), args.resync_interval) {
            supervise(&mut tasks, "resync timer", timer);
        }
        let (c, t, m) = (scanner.client().clone(), triggers.clone(), metrics.clone());
        tasks.spawn(async move {
            crate::kubelet_watch::kubelet_watch(c, t, m).await;
            "kubelet watch"
        });
        let pod_view = SharedPodView::default();
        let node_view = crate::node_watch::SharedNodeView::default();
        let slice_view = crate::slice_watch::SharedSliceView::default();
        let listed = Arc::new(Mutex::new(BTreeSet::new()));
        let (mut publisher, mut events) = (None, None);
        if let Some(client) = &kube {
            let admissions = Arc::new(tokio::sync::Notify::new());
            let watch = pod_watch::run(
                client.clone(),
                args.node_name.clone(),
                pod_view.clone(),
                triggers.clone(),
                metrics.clone(),
                admissions.clone(),
            );
            tasks.spawn(async move {
                watch.await;
                "pod watch"
            });
            let node_watch = crate::node_watch::run(
                client.clone(),
                args.node_name.clone(),
                node_view.clone(),
                triggers.clone(),
                metrics.clone(),
            );
            tasks.spawn(async move {
                node_watch.await;
                "node watch"
            });
            if args.dra_devices {
                let slice_watch = crate::slice_watch::run(
                    client.clone(),
                    args.node_name.clone(),
                    slice_view.clone(),
                    triggers.clone(),
                    metrics.clone(),
                );
                tasks.spawn(async move {
                    slice_watch.await;
                    "resource slice watch"
                });
            }
            let poller = pod_watch::poll_admissions(
                scanner.client().clone(),
                pod_view.clone(),
                listed.clone(),
                triggers.clone(),
                ADMISSION_POLL_INTERVAL,
                Duration::from_secs(5),
                admissions,
            );
            tasks.spawn(async move {
                poller.await;
                "admission poller"
            });
            if !args.dry_run {
                let p = Publisher::new(
                    client.clone(),
                    &args.node_name,
                    args.force_write_interval,
                    metrics.clone(),
                );
                let own = crate::own_object::watch_own_object(
                    client.clone(),
                    args.node_name.clone(),
                    p.applied(),
                    triggers.clone(),
                    metrics.clone(),
                );
                tasks.spawn(async move {
                    own.await;
                    "own-object watch"
                });
                publisher = Some(p);
                // events.k8s.io requires a reporting instance (422 without one): outside a
                // pod, the node name identifies this agent just as well.
                let instance = args
                    .pod_name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("numaplane-exporter-{}", args.node_name));
                events = Some(NodeEvents::new(client.clone(), &args.node_name, Some(instance)));
            }
        }
        let delivered =
            (!pools.is_empty()).then(|| crate::allocatable_follow::Delivered::new(triggers.clone()));
        if !pools.is_empty() {
            // The same client: one request budget for the agent and the allocator.
            let kubelet = scanner.client().clone();
            let instance = args
                .pod_name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("numaplane-exporter-{}", args.node_name));
            let allocator = crate::allocator::AllocatorConfig {
                pools,
                dir: args.device_plugin_dir.clone(),
                node: args.node_name.clone(),
                instance,
                resync: args.resync_interval.min(Duration::from_secs(2)),
                rescan: crate::allocator::DEFAULT_RESCAN_INTERVAL,
                topology_xml: args.topology_xml.clone(),
                delivered: delivered.clone(),
            };
            crate::allocator::start(&mut tasks, allocator, kube.clone(), kubelet, metrics.clone());
        }
        tracing::info!(node = %args.node_name, sources = %sources.describe(), "kubelet configuration sources");
        let no_sources = sources.is_empty();
        let (mut refresher, known) = Refresher::new(
            sources,
            args.kubelet_config_interval,
            triggers.clone(),
            metrics.clone(),
            events.clone(),
            args.node_name.clone(),
        );
        // The first object carries the kubelet's settings when a source answers within its
        // timeout; after that, reads run beside the scans and never delay one.
        refresher.refresh().await;
        apply_kubelet_settings(&mut cfg, &args, &known.borrow());
        let (policy, scope) = info_labels(&cfg);
        metrics.set_info(&args.node_name, policy, scope);
        if !no_sources {
            tasks.spawn(async move {
                refresher.run(refresh_requests).await;
                "kubelet config"
            });
        }
        let dra_driver_attributes = args.dra_driver_attributes();
        Ok(Self {
            args,
            cfg,
            scanner,
            metrics,
            health,
            triggers,
            coalescer,
            kube,
            publisher,
            events,
            pod_view,
            node_view,
            slice_view,
            dra_driver_attributes,
            delivered,
            waits: crate::allocatable_follow::Waits::default(),
            device_resources_seen: BTreeSet::new(),
            listed,
            tasks,
            known,
            refresh,
            _notify: notify,
            _kubelet_config_watch: kubelet_config_watch,
        })
    }
}

/// Aborts the task when dropped (a [`tokio::task::JoinSet`] aborts its own tasks, not the
/// handles they await).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Puts an already spawned task under the agent's supervision as `name`.
fn supervise(
    tasks: &mut tokio::task::JoinSet<&'static str>,
    name: &'static str,
    handle: tokio::task::JoinHandle<()>,
) {
    tasks.spawn(async move {
        let mut guard = AbortOnDrop(handle);
        let _ = (&mut guard.0).await;
        name
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_supervised_task_that_ends_is_reported_by_name_and_aborting_stops_the_rest() {
        let mut tasks = tokio::task::JoinSet::new();
        supervise(&mut tasks, "short", tokio::spawn(async {}));
        let ran_on = Arc::new(AtomicBool::new(false));
        let flag = ran_on.clone();
        supervise(
            &mut tasks,
            "long",
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                flag.store(true, Ordering::SeqCst);
            }),
        );
        assert_eq!(tasks.join_next().await.unwrap().unwrap(), "short");
        // What the agent does next: abort everything; the inner task must stop too.
        tasks.abort_all();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !ran_on.load(Ordering::SeqCst),
            "an aborted supervised task kept running"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_seen_as_ended() {
        let mut tasks = tokio::task::JoinSet::new();
        #[allow(clippy::panic)]
        supervise(&mut tasks, "boom", tokio::spawn(async { panic!("boom") }));
        // The wrapper reports the name: the inner panic ends the wrapped handle.
        assert_eq!(tasks.join_next().await.unwrap().unwrap(), "boom");
    }
}
