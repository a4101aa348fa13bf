//! The long-running agent's main loop: wait for a trigger, scan, publish, retry.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use numaplane::nrt::NodeResourceTopology;
use tokio::time::Instant;

use crate::accounting::{AccountingConfig, AnomalyKind};
use crate::allocatable_follow::{Cause, Delivered, Expect, NodeLevelInput, Waits};
use crate::backoff::{Backoff, jittered};
use crate::kubelet_source::{Known, Refresh};
use crate::metrics::Metrics;
use crate::pod_watch::{self, PodKey, SharedPodView};
use crate::publish::{self, NodeEvents, Outcome, PublishError, Publisher};
use crate::run::args::RunArgs;
use crate::run::config::{apply_kubelet_settings, info_labels};
use crate::run::error::RunError;
use crate::run::report::{log_anomalies, note_init_held};
use crate::scan::{ScanError, Scanner};
use crate::server::Health;
use crate::triggers::{self, Batch, Trigger, Triggers};

/// One `Get` per this interval at most: half of the default request budget, the rest is for
/// scans.
pub(super) const ADMISSION_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How often the idle main loop reports itself alive.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// The long-running agent.
pub(super) struct Agent {
    pub(super) args: RunArgs,
    pub(super) cfg: AccountingConfig,
    pub(super) scanner: Scanner,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
    pub(super) triggers: Triggers,
    pub(super) coalescer: triggers::Coalescer,
    pub(super) kube: Option<Client>,
    pub(super) publisher: Option<Publisher>,
    pub(super) events: Option<NodeEvents>,
    pub(super) pod_view: SharedPodView,
    /// What the watch of this Node knows of its extended resources.
    pub(super) node_view: crate::node_watch::SharedNodeView,
    /// What the watch of this node's ResourceSlices knows (empty and never synced without it).
    pub(super) slice_view: crate::slice_watch::SharedSliceView,
    /// Driver attributes naming a DRA device's NUMA node (`--dra-numa-attribute`).
    pub(super) dra_driver_attributes: numaplane::device_numa::DriverNumaAttributes,
    /// Device lists the hosted allocator sent to the kubelet (`None` without `--pools`).
    pub(super) delivered: Option<Delivered>,
    /// Devices expected in allocatable and not shown yet.
    pub(super) waits: Waits,
    /// Every resource the kubelet has listed devices of since start: never named node-level.
    pub(super) device_resources_seen: BTreeSet<String>,
    pub(super) listed: Arc<Mutex<BTreeSet<PodKey>>>,
    /// Every background task, named; one that ends takes the agent down (supervision).
    pub(super) tasks: tokio::task::JoinSet<&'static str>,
    /// What is known of the kubelet's configuration, from the [`Refresher`].
    pub(super) known: tokio::sync::watch::Receiver<Known>,
    /// Asks the [`Refresher`] to read the kubelet configuration.
    pub(super) refresh: tokio::sync::mpsc::UnboundedSender<Refresh>,
    pub(super) _notify: Option<notify::RecommendedWatcher>,
    pub(super) _kubelet_config_watch: Option<notify::RecommendedWatcher>,
}

impl Agent {
    /// Applies what the [`Refresher`] knows of the kubelet's configuration (flags still win), so
    /// a changed policy, scope, option or resource-manager setting reaches the next object.
    fn apply_kubelet_settings(&mut self) {
        let known = self.known.borrow_and_update().clone();
        if !apply_kubelet_settings(&mut self.cfg, &self.args, &known) {
            return;
        }
        let (policy, scope) = info_labels(&self.cfg);
        tracing::info!(
            policy,
            scope,
            source = known.source.as_str(),
            "kubelet settings changed"
        );
        self.metrics.set_info(&self.args.node_name, policy, scope);
    }

    /// Asks for a read of the kubelet configuration (the refresher decides whether a periodic
    /// one is due).
    fn request_refresh(&self, r: Refresh) {
        // Gone only while shutting down (the refresher is a supervised task).
        let _ = self.refresh.send(r);
    }

    /// Starts waits for the devices the batch says may have reached the kubelet; whether
    /// allocatable must be read again for them.
    fn follow_devices(&mut self, batch: &Batch) -> bool {
        let now = Instant::now();
        let mut reread = false;
        if batch.triggers.contains(&Trigger::DevicesDelivered) {
            for (resource, ids) in self.delivered.as_ref().map(Delivered::take).unwrap_or_default() {
                self.waits
                    .expect(&resource, Expect::Ids(ids), Cause::DevicePlugin, now);
            }
            self.metrics.allocatable_reread(Cause::DevicePlugin.as_str());
            reread = true;
        }
        if batch.triggers.contains(&Trigger::NodeAllocatable) {
            let changed = crate::node_watch::lock(&self.node_view).take_changed();
            for (resource, count) in changed {
                // What our allocator sent is exact; the Node's count follows it later.
                if !self.waits.expects_ids(&resource) {
                    self.waits
                        .expect(&resource, Expect::Count(count), Cause::NodeAllocatable, now);
                }
            }
            self.metrics.allocatable_reread(Cause::NodeAllocatable.as_str());
            reread = true;
        }
        if batch.triggers.contains(&Trigger::AllocatableRetry) {
            self.metrics.allocatable_reread("retry");
            reread = true;
        }
        reread
    }

    /// What the object says of the Node's extended resources, when the Node watch saw it.
    fn node_level_input(&self) -> Option<NodeLevelInput> {
        let view = crate::node_watch::lock(&self.node_view);
        view.synced.then(|| NodeLevelInput {
            node_extended: view.extended.keys().cloned().collect(),
            withhold: self
                .waits
                .pending()
                .chain(&self.device_resources_seen)
                .cloned()
                .collect(),
        })
    }

    /// After a scan: ends the waits its allocatable satisfies or that ran out, and schedules
    /// the next read for the others.
    fn check_waits(&mut self, retry: &mut Option<tokio::task::JoinHandle<()>>) {
        let Some(allocatable) = self.scanner.allocatable() else {
            return;
        };
        self.device_resources_seen
            .extend(allocatable.devices.iter().map(|d| d.resource_name.clone()));
        let checked = self.waits.check(allocatable, Instant::now());
        let node = &self.args.node_name;
        for e in &checked.appeared {
            self.metrics.allocatable_wait(&e.resource, "appeared");
            // Shown by the first read: the usual case, not worth an info line each time.
            let level_info = e.wait.reads > 1;
            macro_rules! appeared {
                ($level:ident) => {
                    tracing::$level!(
                        node = %node,
                        resource = %e.resource,
                        cause = e.wait.cause.as_str(),
                        devices = e.seen.len(),
                        reads = e.wait.reads,
                        after = ?e.wait.since.elapsed(),
                        "allocatable shows the kubelet's devices"
                    )
                };
            }
            if level_info {
                appeared!(info);
            } else {
                appeared!(debug);
            }
        }
        for e in &checked.gave_up {
            self.metrics.allocatable_wait(&e.resource, "gave_up");
            if e.seen.is_empty() && matches!(e.wait.expect, Expect::Count(_)) {
                tracing::info!(
                    node = %node,
                    resource = %e.resource,
                    reads = e.wait.reads,
                    "the kubelet serves no device of this Node resource; it is published as node-level"
                );
            } else {
                tracing::warn!(
                    node = %node,
                    resource = %e.resource,
                    cause = e.wait.cause.as_str(),
                    expected = %e.wait.expect,
                    seen = %e.seen.iter().cloned().collect::<Vec<_>>().join(","),
                    reads = e.wait.reads,
                    "the kubelet's allocatable did not show the expected devices in time; publishing what it shows"
                );
            }
        }
        if !checked.gave_up.is_empty() {
            // This scan still withheld them from the node-level resources: publish again.
            self.triggers.send(Trigger::AllocatableRetry);
        }
        if let Some(delay) = checked.retry_in
            && retry.as_ref().is_none_or(tokio::task::JoinHandle::is_finished)
        {
            let triggers = self.triggers.clone();
            *retry = Some(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                triggers.send(Trigger::AllocatableRetry);
            }));
        }
    }

    pub(super) async fn run(mut self) -> Result<(), RunError> {
        self.triggers.send(Trigger::Startup);
        let mut kubelet_backoff = Backoff::new(self.args.kubelet_backoff_min, self.args.kubelet_backoff_max);
        let mut api_backoff = Backoff::new(self.args.api_backoff_min, self.args.api_backoff_max);
        let mut retry: Option<tokio::task::JoinHandle<()>> = None;
        let mut allocatable_retry: Option<tokio::task::JoinHandle<()>> = None;
        let mut crd_ready = false;
        let mut kubelet_down = false;
        let mut seen_anomalies = BTreeSet::new();
        let mut seen_checkpoint_errors = BTreeSet::new();
        let mut anomaly_kinds: BTreeSet<AnomalyKind> = BTreeSet::new();
        let mut last_scan_at: Option<Instant> = None;
        let mut last_printed: Option<NodeResourceTopology> = None;
        let shutdown = crate::plumbing::shutdown_signal();
        tokio::pin!(shutdown);
        // Liveness tells whether this loop responds, not whether triggers arrive: on an idle
        // node with `--resync-interval 0` nothing may come for hours.
        let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let batch = tokio::select! {
                b = self.coalescer.next() => match b { Some(b) => b, None => break },
                _ = heartbeat.tick() => {
                    self.health.beat();
                    continue;
                }
                Some(ended) = self.tasks.join_next() => {
                    let name = match ended {
                        Ok(name) => name,
                        Err(e) if e.is_panic() => "(panicked)",
                        Err(_) => "(cancelled)",
                    };
                    self.metrics.error("task_ended");
                    self.health.set_not_ready(format!("task {name} stopped"));
                    tracing::error!(task = name, "a supervised task stopped; exiting so the pod restarts");
                    self.tasks.abort_all();
                    for r in [retry.take(), allocatable_retry.take()].into_iter().flatten() {
                        r.abort();
                    }
                    return Err(RunError::TaskEnded(name));
                }
                () = &mut shutdown => {
                    tracing::info!("shutting down");
                    break;
                }
            };
            self.health.beat();
            if let Some(at) = last_scan_at {
                let next = at + self.args.min_scan_interval;
                if next > Instant::now() {
                    tokio::time::sleep_until(next).await;
                }
            }
            let label = batch.label();
            let periodic = batch
                .triggers
                .iter()
                .any(|t| matches!(t, Trigger::Startup | Trigger::Resync));
            let reread = self.follow_devices(&batch);
            if periodic || kubelet_down || reread {
                self.scanner.refresh_allocatable();
            }
            if batch.triggers.contains(&Trigger::Resync) {
                // A failed read is retried at every resync; a good one after its interval.
                self.request_refresh(Refresh::Periodic);
            }
            self.apply_kubelet_settings();
            let force = batch.triggers.contains(&Trigger::ObjectChanged);
            if force && let Some(p) = self.publisher.as_mut() {
                p.invalidate();
            }
            let (synced, facts) = {
                let view = pod_watch::lock(&self.pod_view);
                self.cfg.terminal_pods = view.terminal.clone();
                // With a pod watch, facts are passed even before its first list completes
                // (empty then): the published sources stay the same from the first scan on,
                // and pods are matched as soon as the watch knows them.
                let facts = self.kube.is_some().then(|| view.facts.clone());
                (view.synced, facts)
            };
            self.cfg.node_level = self.node_level_input();
            self.cfg.dra = crate::slice_watch::lock(&self.slice_view).listed().map(|slices| {
                crate::accounting::DraInputs {
                    slices,
                    driver_attributes: self.dra_driver_attributes.clone(),
                }
            });

            let started = Instant::now();
            last_scan_at = Some(started);
            let result = self.scanner.scan(&self.cfg, facts.as_ref()).await;
            self.metrics
                .scan_duration
                .observe(started.elapsed().as_secs_f64());
            let scan = match result {
                Ok(scan) => scan,
                Err(e) => {
                    self.metrics.scan(label, e.kind());
                    // Readiness first: the Event below is an API call, and until it returns
                    // the probe must already say what the metric says.
                    self.health
                        .set_not_ready(format!("scan failed: {}", numaplane::error_chain(&e)));
                    self.metrics.stale.set(1);
                    let delay = match &e {
                        ScanError::ReadKubelet(pe) if pe.code() == Some(tonic::Code::ResourceExhausted) => {
                            jittered(kubelet_backoff.next_delay())
                        }
                        _ => kubelet_backoff.next_delay(),
                    };
                    if !kubelet_down {
                        kubelet_down = true;
                        if e.kind() == "kubelet_unavailable" {
                            self.metrics.kubelet_reconnects.inc();
                        }
                        tracing::warn!(
                            node = %self.args.node_name,
                            error = %numaplane::error_chain(&e),
                            retry_in = ?delay,
                            "scan failed; keeping the last published object"
                        );
                        if let Some(ev) = &self.events {
                            ev.warn(
                                &self.metrics,
                                "ScanFailed",
                                "Scan",
                                format!(
                                    "numaplane-exporter cannot read the kubelet; the published \
                                     topology may be stale: {}",
                                    numaplane::error_chain(&e)
                                ),
                            )
                            .await;
                        }
                    } else {
                        tracing::debug!(error = %numaplane::error_chain(&e), retry_in = ?delay, "scan failed again");
                    }
                    schedule_retry(&mut retry, &self.triggers, delay);
                    continue;
                }
            };
            if kubelet_down {
                tracing::info!(node = %self.args.node_name, "kubelet readable again");
                kubelet_down = false;
                // The kubelet may have restarted to apply a new configuration.
                self.request_refresh(Refresh::Now);
            }
            kubelet_backoff.reset();
            self.metrics.scan(label, "success");
            self.check_waits(&mut allocatable_retry);
            self.metrics
                .record_accounting(&self.args.node_name, &scan.accounting);
            log_anomalies(&self.args.node_name, &scan, &mut seen_anomalies);
            note_init_held(
                &self.args.node_name,
                &scan,
                &self.metrics,
                &mut seen_checkpoint_errors,
            );
            let kinds: BTreeSet<_> = scan
                .accounting
                .anomalies
                .iter()
                .map(|a| a.kind)
                .filter(|k| *k != AnomalyKind::UnalignedDevice)
                .collect();
            if !kinds.is_subset(&anomaly_kinds)
                && let Some(ev) = &self.events
            {
                let details: Vec<_> = scan
                    .accounting
                    .anomalies
                    .iter()
                    .filter(|a| kinds.contains(&a.kind) && !anomaly_kinds.contains(&a.kind))
                    .map(|a| format!("{}: {}", a.kind, a.detail))
                    .take(5)
                    .collect();
                ev.warn(
                    &self.metrics,
                    "AccountingAnomaly",
                    "Scan",
                    format!(
                        "suspicious data from the kubelet or the ResourceSlices worked around: {}",
                        details.join("; ")
                    ),
                )
                .await;
            }
            anomaly_kinds = kinds;
            *self
                .listed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = scan.listed_pods.clone();

            let Some(publisher) = self.publisher.as_mut() else {
                // Dry run: print each new object.
                if last_printed.as_ref() != Some(&scan.nrt) {
                    match crate::run::once::render(&scan.nrt, self.args.output) {
                        Ok(text) => println!("---\n{}", text.trim_end()),
                        Err(e) => tracing::error!(error = %numaplane::error_chain(&e), "cannot print"),
                    }
                    last_printed = Some(scan.nrt.clone());
                }
                self.metrics.stale.set(0);
                self.health.set_ready();
                continue;
            };
            if self.kube.is_some() && !synced {
                // Terminal pods would be counted as using their old resources.
                self.health
                    .set_not_ready("waiting for the pod watch to list this node's pods".to_owned());
                continue;
            }
            if !crd_ready {
                let Some(client) = &self.kube else { continue };
                match publish::crd_served(client).await {
                    Ok(()) => {
                        tracing::info!("NodeResourceTopology API is served");
                        crd_ready = true;
                        self.metrics.nrt_crd_installed.set(1);
                        api_backoff.reset();
                    }
                    Err(e) => {
                        self.metrics.error(e.kind());
                        if matches!(e, PublishError::CrdMissing { .. }) {
                            self.metrics.nrt_crd_installed.set(0);
                        }
                        let delay = api_backoff.next_delay();
                        tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?delay, "waiting for the CRD");
                        self.health.set_not_ready(numaplane::error_chain(&e));
                        schedule_retry(&mut retry, &self.triggers, delay);
                        continue;
                    }
                }
            }
            match publisher.publish(scan.nrt, force).await {
                Ok(outcome) => {
                    api_backoff.reset();
                    self.metrics.stale.set(0);
                    self.health.set_ready();
                    if outcome == Outcome::Written {
                        tracing::debug!(trigger = label, latency = ?batch.first_at.elapsed(), "object written");
                    }
                }
                Err(e) => {
                    self.metrics.error(e.kind());
                    self.metrics.stale.set(1);
                    if matches!(&e, PublishError::Apply { source: kube::Error::Api(s), .. } if s.code == 404)
                    {
                        // The CRD may have been deleted: discovery says so before the next write.
                        crd_ready = false;
                    }
                    let delay = api_backoff.next_delay();
                    tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?delay, "publish failed");
                    self.health
                        .set_not_ready(format!("publish failed: {}", numaplane::error_chain(&e)));
                    schedule_retry(&mut retry, &self.triggers, delay);
                }
            }
        }
        self.tasks.abort_all();
        for r in [retry, allocatable_retry].into_iter().flatten() {
            r.abort();
        }
        Ok(())
    }
}

/// Sends [`Trigger::Retry`] after `delay`, unless a retry is already pending.
fn schedule_retry(pending: &mut Option<tokio::task::JoinHandle<()>>, triggers: &Triggers, delay: Duration) {
    if pending.as_ref().is_some_and(|h| !h.is_finished()) {
        return;
    }
    let triggers = triggers.clone();
    *pending = Some(tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        triggers.send(Trigger::Retry);
    }));
}
