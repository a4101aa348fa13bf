//! The node-side allocator: one kubelet device plugin per configured pool, steering the
//! kubelet to the devices the scheduler recorded on the pod (`numaplane.io/allocation`), with
//! pod-resources as the truth for what is held. Hosted by `numaplane-exporter run --pools` or
//! run alone as `numaplane-exporter device-plugin`. See docs/allocator.md.
//!
//! Size (~780 lines of code, over the ~600 aim): the allocator's tasks (registration, the pod
//! watch, resync and rescan) share one `Shared` state; the pure parts are already in `plugin`,
//! `pools`, `records` and `steer`. Next cut when it grows: the resync/rescan loops.

pub use crate::metrics::allocator as metrics;
pub mod plugin;
pub mod pools;
pub mod records;
pub mod steer;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource as _};
use tokio::sync::watch;
use tokio::task::JoinSet;

use self::plugin::{Holders, PluginState};
use self::pools::Pool;
use self::records::SharedRecords;
use crate::metrics::Metrics;
use crate::podresources::KubeletClient;

/// Default kubelet device-plugin directory.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The device manager's checkpoint in that directory: the only record of the devices regular
/// init containers got (pod-resources `List` never reports those containers).
pub const DEVICE_CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// How often the PCI inventory is read again for device health by default (`run` uses it
/// as is).
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(30);
/// Where `device-plugin` serves /metrics and the probes by default (`run` serves on 2112).
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 2113);

/// Flags of `device-plugin` (and the pool flags `run` shares).
#[derive(Debug, Clone, clap::Args)]
pub struct DevicePluginArgs {
    /// Pools file (YAML); see docs/allocator.md.
    #[arg(long, env = "NUMAPLANE_POOLS")]
    pub pools: PathBuf,
    /// The kubelet's device-plugin directory (its `kubelet.sock` and our sockets).
    #[arg(long, env = "NUMAPLANE_DEVICE_PLUGIN_DIR", default_value = DEFAULT_DIR)]
    pub device_plugin_dir: PathBuf,
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Kubeconfig file; default: $KUBECONFIG, then in-cluster configuration.
    #[arg(long, env = "NUMAPLANE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Read the machine (PCI inventory) from this hwloc XML file instead of the live system.
    #[arg(long, env = "NUMAPLANE_TOPOLOGY_XML")]
    pub topology_xml: Option<PathBuf>,
    /// The kubelet pod-resources socket.
    #[arg(long, env = "NUMAPLANE_PODRESOURCES_SOCKET", default_value = crate::podresources::DEFAULT_SOCKET)]
    pub podresources_socket: PathBuf,
    /// Address of /metrics, /healthz and /readyz [default: 0.0.0.0:2113]; the scheduler's flag
    /// of the same name.
    #[arg(long, env = "NUMAPLANE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Deprecated spelling of --listen, still read (with a warning in the log).
    #[arg(long, env = "NUMAPLANE_METRICS_ADDRESS", hide = true)]
    pub metrics_address: Option<SocketAddr>,
    /// How often pod-resources is read to reconcile holders, slots and records (0: off).
    #[arg(long, env = "NUMAPLANE_RESYNC_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub resync_interval: Duration,
    /// How often the machine's PCI inventory (hwloc, or `--topology-xml`) is read again: a
    /// PCI-matched device it no longer shows is listed Unhealthy to the kubelet until it is
    /// back (0: off).
    #[arg(long, env = "NUMAPLANE_DEVICE_RESCAN_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub device_rescan_interval: Duration,
    /// Timeout of one kubelet call.
    #[arg(long, env = "NUMAPLANE_CALL_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub call_timeout: Duration,
    /// This agent's pod name, reported in Events.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

/// Why the allocator cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    /// Bad pools file.
    #[error("bad --pools")]
    Pools(#[from] pools::PoolsError),
    /// The machine cannot be read.
    #[error("cannot load the machine topology")]
    LoadMachine(#[source] numaplane_topology::TopologyError),
    /// Bad kubeconfig.
    #[error("cannot build the API client")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Bad pod-resources socket.
    #[error("bad --podresources-socket")]
    Socket(#[source] crate::podresources::PodResourcesError),
    /// The metrics server cannot start.
    #[error("cannot start the metrics server")]
    Server(#[source] numaplane::serve::ServeError),
    /// A `shared: cluster` pool outside `run`: only `run` publishes the slots its node holds.
    #[error(
        "pool {resource} has shared: cluster, which needs `numaplane-exporter run --pools` (the node's NRT publishes the slots held here)"
    )]
    ClusterPoolNeedsRun {
        /// The pool's resource.
        resource: String,
    },
    /// A supervised task ended.
    #[error("task {0} ended unexpectedly")]
    TaskEnded(&'static str),
}

impl AllocatorError {
    /// Bad configuration (exit 64) rather than a runtime failure.
    pub fn is_config(&self) -> bool {
        !matches!(self, Self::TaskEnded(_))
    }
}

/// Per pool resource, whether its plugin is registered with the kubelet now: what readiness
/// means for the allocator.
#[derive(Clone, Debug, Default)]
pub struct Registrations(Arc<std::sync::Mutex<BTreeMap<String, bool>>>);

impl Registrations {
    fn set(&self, metrics: &Metrics, resource: &str, registered: bool) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(resource.to_owned(), registered);
        metrics
            .allocator
            .registered
            .get_or_create(&metrics::ResourceLabels {
                resource: resource.to_owned(),
            })
            .set(i64::from(registered));
    }

    /// The resources whose plugin is not registered now.
    pub fn missing(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(_, on)| !**on)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

/// Sends a pool's device list (with health) to its ListAndWatch streams.
type DeviceList = watch::Sender<Vec<numaplane::proto::deviceplugin::Device>>;

/// What the allocator's tasks share.
#[derive(Clone)]
pub struct Shared {
    node: String,
    records: SharedRecords,
    holders: Holders,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
    /// Per `shared: cluster` resource, the slots other nodes' pods hold (from their NRTs).
    elsewhere: Arc<std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>>,
    /// Per PCI-matched resource, the slots of devices missing from the last inventory rescan.
    unhealthy: Arc<std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>>,
}

/// What the allocator runs with.
#[derive(Debug, Clone)]
pub struct AllocatorConfig {
    /// Resolved pools.
    pub pools: Vec<Pool>,
    /// The kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// This node.
    pub node: String,
    /// Reporting instance of Events (the pod name).
    pub instance: String,
    /// Reconciliation interval.
    pub resync: Duration,
    /// PCI inventory rescan interval (zero: off).
    pub rescan: Duration,
    /// Where the inventory is read from: this hwloc XML file, or the live system.
    pub topology_xml: Option<PathBuf>,
    /// The hosting agent's note of device lists sent to the kubelet (`None` when run alone).
    pub delivered: Option<crate::allocatable_follow::Delivered>,
}

/// Starts the allocator into `tasks`: the record watch (when there is an API client), one
/// plugin per pool (served and kept registered) and the reconciliation loop. Returns which
/// pools are registered with the kubelet, for readiness.
pub fn start(
    tasks: &mut JoinSet<&'static str>,
    cfg: AllocatorConfig,
    client: Option<Client>,
    kubelet: KubeletClient,
    metrics: Arc<Metrics>,
) -> Registrations {
    let AllocatorConfig {
        pools,
        dir,
        node,
        instance,
        resync,
        rescan,
        topology_xml,
        delivered,
    } = cfg;
    let recorder = client.as_ref().map(|c| {
        Recorder::new(
            c.clone(),
            Reporter {
                controller: "numaplane-exporter".to_owned(),
                instance: Some(instance),
            },
        )
    });
    let known = pools
        .iter()
        .map(|p| {
            (
                p.resource.clone(),
                p.slot_ids().into_iter().map(|(id, _)| id).collect(),
            )
        })
        .collect();
    let shared = Shared {
        node: node.clone(),
        records: SharedRecords::new(known),
        holders: Holders::default(),
        metrics: metrics.clone(),
        recorder,
        elsewhere: Arc::default(),
        unhealthy: Arc::default(),
    };
    if let Some(client) = client.clone() {
        let s = shared.clone();
        tasks.spawn(async move {
            watch_records(client, s).await;
            "allocation record watch"
        });
    }
    let registrations = Registrations::default();
    let mut health = Vec::new();
    let mut cluster = Vec::new();
    let resources: Arc<BTreeSet<String>> = Arc::new(pools.iter().map(|p| p.resource.clone()).collect());
    for pool in pools {
        let pool = Arc::new(pool);
        // A zero series up front, so `increase()` sees the first mismatch.
        let _ = metrics
            .allocator
            .mismatches
            .get_or_create(&metrics::ResourceLabels {
                resource: pool.resource.clone(),
            });
        let (tx, rx) = watch::channel(plugin::device_list(&pool, &BTreeSet::new()));
        if pool.shared == pools::Sharing::Cluster {
            cluster.push((pool.clone(), tx));
        } else {
            health.push((pool.clone(), tx));
        }
        let state = PluginState {
            pool,
            node: node.clone(),
            records: shared.records.clone(),
            holders: shared.holders.clone(),
            kubelet: kubelet.clone(),
            watched: client.is_some(),
            client: client.clone(),
            resources: resources.clone(),
            allocations: Arc::default(),
            listed_after: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            devices: rx,
            metrics: metrics.clone(),
            delivered: delivered.clone(),
        };
        let dir = dir.clone();
        registrations.set(&metrics, &state.pool.resource, false);
        let r = registrations.clone();
        tasks.spawn(async move {
            keep_registered(dir, state, r).await;
            "device plugin"
        });
    }
    let pool_list: Vec<Arc<Pool>> = health.iter().chain(&cluster).map(|(p, _)| p.clone()).collect();
    let (pci, mut health): (Vec<_>, Vec<_>) = health
        .into_iter()
        .partition(|(p, _)| p.devices.iter().any(|d| d.pci));
    if pci.is_empty() || rescan.is_zero() {
        health.extend(pci);
    } else {
        let s = shared.clone();
        tasks.spawn(async move {
            rescan_loop(s, pci, rescan, topology_xml).await;
            "PCI inventory rescan"
        });
    }
    if !cluster.is_empty() {
        match client {
            Some(client) => {
                let s = shared.clone();
                tasks.spawn(async move {
                    watch_cluster_slots(client, s, cluster).await;
                    "cluster slot watch"
                });
            }
            None => {
                // Without an API the other nodes cannot be seen; the senders are kept so the
                // ListAndWatch streams stay open.
                tracing::warn!("no API client: shared: cluster slots held on other nodes cannot be kept off");
                health.extend(cluster);
            }
        }
    }
    let s = shared;
    tasks.spawn(async move {
        reconcile_loop(kubelet, s, pool_list, health, resync, dir.join(DEVICE_CHECKPOINT)).await;
        "allocator reconciliation"
    });
    registrations
}

/// Keeps the slots of `shared: cluster` pools that other nodes' pods hold off this node: they
/// are listed Unhealthy to the kubelet, which then never hands them out here. Other nodes
/// publish what they hold in their NRTs ([`numaplane::nrt::attr::CLUSTER_HELD_PREFIX`]); the
/// scheduler adds the records of pods not admitted yet, so this closes the window for pods that
/// bypass it.
async fn watch_cluster_slots(client: Client, shared: Shared, pools: Vec<(Arc<Pool>, DeviceList)>) {
    use numaplane::nrt::NodeResourceTopology;
    let api: Api<NodeResourceTopology> = Api::all(client);
    let mut events =
        std::pin::pin!(watcher(api, watcher::Config::default().any_semantic()).default_backoff());
    // node → resource → held IDs, for every node but this one.
    let mut held: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, BTreeMap<String, Vec<String>>>> = None;
    let mut last: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let known: Vec<BTreeSet<String>> = pools
        .iter()
        .map(|(p, _)| p.slot_ids().into_iter().map(|(id, _)| id).collect())
        .collect();
    let entry = |nrt: &NodeResourceTopology| {
        let name = nrt.metadata.name.clone().unwrap_or_default();
        (name != shared.node && !name.is_empty()).then(|| (name, nrt.cluster_held()))
    };
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Apply(nrt)) => {
                if let Some((name, h)) = entry(&nrt) {
                    held.insert(name, h);
                }
            }
            Ok(watcher::Event::Delete(nrt)) => {
                held.remove(nrt.metadata.name.as_deref().unwrap_or_default());
            }
            Ok(watcher::Event::Init) => {
                listing = Some(BTreeMap::new());
                continue;
            }
            Ok(watcher::Event::InitApply(nrt)) => {
                if let (Some(l), Some((name, h))) = (listing.as_mut(), entry(&nrt)) {
                    l.insert(name, h);
                }
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(l) = listing.take() {
                    held = l;
                }
            }
            Err(e) => {
                shared.metrics.error("allocator_nrt_watch");
                tracing::warn!(error = %numaplane::error_chain(&e), "NRT watch of the allocator failed; retrying");
                continue;
            }
        }
        for ((pool, tx), known) in pools.iter().zip(&known) {
            let elsewhere: BTreeSet<String> = held
                .values()
                .filter_map(|r| r.get(&pool.resource))
                .flatten()
                .filter(|id| known.contains(*id))
                .cloned()
                .collect();
            if last.get(&pool.resource) == Some(&elsewhere) {
                continue;
            }
            tracing::info!(
                resource = %pool.resource,
                held_elsewhere = %elsewhere.iter().cloned().collect::<Vec<_>>().join(","),
                "cluster-shared slots held on other nodes changed"
            );
            tx.send_replace(plugin::device_list(pool, &elsewhere));
            shared
                .elsewhere
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(pool.resource.clone(), elsewhere.clone());
            last.insert(pool.resource.clone(), elsewhere);
        }
    }
}

/// Every `period`: reads the machine's PCI inventory again and lists the PCI-matched devices
/// it lacks as Unhealthy (and those back in it as Healthy), so the kubelet stops handing out a
/// device that left the bus. A failed read keeps the last health.
async fn rescan_loop(
    shared: Shared,
    pools: Vec<(Arc<Pool>, DeviceList)>,
    period: Duration,
    xml: Option<PathBuf>,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tick.tick().await;
        let path = xml.clone();
        // hwloc's topology load blocks (it walks sysfs); keep it off the runtime thread.
        let machine = match tokio::task::spawn_blocking(move || {
            crate::plumbing::load_machine(path.as_deref())
        })
        .await
        {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                let msg = numaplane::error_chain(&e);
                shared.metrics.error("allocator_rescan");
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(error = %msg, "cannot read the PCI inventory again; device health unchanged");
                    last_error = Some(msg);
                }
                continue;
            }
            Err(e) => {
                shared.metrics.error("allocator_rescan");
                tracing::warn!(error = %e, "PCI inventory rescan task failed; device health unchanged");
                continue;
            }
        };
        last_error = None;
        for (pool, tx) in &pools {
            let missing = pool.missing_from(&machine);
            let before = shared
                .unhealthy
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&pool.resource)
                .cloned()
                .unwrap_or_default();
            if before == missing {
                continue;
            }
            tracing::warn!(
                resource = %pool.resource,
                unhealthy = %missing.iter().cloned().collect::<Vec<_>>().join(","),
                "PCI devices of the pool changed: those missing from the inventory are listed Unhealthy"
            );
            tx.send_replace(plugin::device_list(pool, &missing));
            shared
                .unhealthy
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(pool.resource.clone(), missing);
        }
    }
}

/// Feeds the record view from the node's pods; reports records it ignores.
async fn watch_records(client: Client, shared: Shared) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default()
        .fields(&crate::pod_watch::node_selector(&shared.node))
        .any_semantic();
    let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
    let mut listed: Vec<Pod> = Vec::new();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Apply(p)) => {
                if let Some(why) = shared.records.apply(&p, &shared.node) {
                    report_ignored(&shared, &p, &why).await;
                }
            }
            Ok(watcher::Event::Delete(p)) => shared.records.delete(&p),
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(p)) => listed.push(p),
            Ok(watcher::Event::InitDone) => {
                let pods = std::mem::take(&mut listed);
                for (key, why) in shared.records.reset(&pods, &shared.node) {
                    if let Some(p) = pods.iter().find(|p| records::key(p) == key) {
                        report_ignored(&shared, p, &why).await;
                    }
                }
            }
            Err(e) => {
                shared.metrics.error("allocator_pod_watch");
                tracing::warn!(error = %numaplane::error_chain(&e), "pod watch of the allocator failed; retrying");
            }
        }
    }
}

async fn report_ignored(shared: &Shared, pod: &Pod, why: &records::Ignored) {
    shared
        .metrics
        .allocator
        .records_ignored
        .get_or_create(&metrics::ReasonLabels { reason: why.reason() })
        .inc();
    tracing::warn!(pod = %records::key(pod), reason = why.reason(), "{}", why.message());
    pod_event(
        shared,
        pod,
        EventType::Warning,
        "AllocationRecordIgnored",
        why.message(),
    )
    .await;
}

async fn pod_event(shared: &Shared, pod: &Pod, type_: EventType, reason: &str, note: String) {
    let Some(recorder) = &shared.recorder else {
        return;
    };
    let ev = KubeEvent {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Allocate".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &pod.object_ref(&())).await {
        shared.metrics.error("event");
        tracing::warn!(error = %numaplane::error_chain(&e), "cannot publish an Event");
    }
}

/// Serves the pool's plugin and keeps it registered: re-serves and re-registers when our
/// socket disappears (the kubelet cleans the directory when it restarts), when the kubelet's
/// socket is recreated, or when the server stops; failures back off from 1 s to 30 s.
async fn keep_registered(dir: PathBuf, state: PluginState, registrations: Registrations) {
    let resource = state.pool.resource.clone();
    let metrics = state.metrics.clone();
    let mut backoff = Duration::from_secs(1);
    loop {
        let served = match plugin::serve(&dir, state.clone()) {
            Ok(s) => s,
            Err(e) => {
                metrics.error("device_plugin_serve");
                tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?backoff, "cannot serve the device plugin");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        let kubelet_id = socket_identity(&dir.join(plugin::KUBELET_SOCKET));
        match plugin::register(&dir, &state.pool, Duration::from_secs(10)).await {
            Ok(()) => {
                metrics::AllocatorMetrics::count(&metrics.allocator.registrations, &resource, "ok");
                registrations.set(&metrics, &resource, true);
                tracing::info!(resource = %resource, socket = %served.socket.display(), "registered with the kubelet");
                backoff = Duration::from_secs(1);
            }
            Err(e) => {
                metrics::AllocatorMetrics::count(&metrics.allocator.registrations, &resource, "error");
                tracing::warn!(error = %numaplane::error_chain(&e), retry_in = ?backoff, "registration failed; retrying");
                served.stop();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        }
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let ours = served.socket.exists();
            let kubelet_same = socket_identity(&dir.join(plugin::KUBELET_SOCKET)) == kubelet_id;
            if !ours || !kubelet_same || served.finished() {
                registrations.set(&metrics, &resource, false);
                tracing::info!(resource = %resource, socket_present = ours, kubelet_same, "kubelet restarted or our socket is gone: registering again");
                break;
            }
        }
        served.stop();
    }
}

/// A file's identity (device, inode): a recreated socket has a new one.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Every `resync` (zero: never): reads pod-resources, updates who holds what, republishes slot health for
/// cluster-shared pools, counts slots, and reports pods whose devices differ from their record.
async fn reconcile_loop(
    kubelet: KubeletClient,
    shared: Shared,
    pools: Vec<Arc<Pool>>,
    // Held so the pools' ListAndWatch streams stay open.
    _device_lists: Vec<(Arc<Pool>, DeviceList)>,
    resync: Duration,
    checkpoint: PathBuf,
) {
    if resync.is_zero() {
        // `--resync-interval 0` means off, as for the exporter's own resync; a zero period
        // would also make `tokio::time::interval` panic. The device lists stay held.
        tracing::info!("resync interval 0: the allocator does not reconcile with pod-resources periodically");
        std::future::pending::<()>().await;
    }
    let mut reported: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut checkpoint_error: Option<String> = None;
    let mut tick = tokio::time::interval(resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ticket = shared
            .holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ticket();
        let list = match kubelet.list().await {
            Ok(l) => l,
            Err(e) => {
                for pool in &pools {
                    metrics::AllocatorMetrics::count(
                        &shared.metrics.allocator.resyncs,
                        &pool.resource,
                        "error",
                    );
                }
                tracing::warn!(error = %numaplane::error_chain(&e), "allocator cannot read pod-resources; retrying");
                continue;
            }
        };
        let resources: BTreeSet<&str> = pools.iter().map(|p| p.resource.as_str()).collect();
        shared
            .holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .update(ticket, &list, &resources);
        // resource → pod key → container → IDs.
        let mut held: BTreeMap<String, BTreeMap<String, BTreeMap<String, BTreeSet<String>>>> =
            BTreeMap::new();
        for p in &list.pod_resources {
            let key = format!("{}/{}", p.namespace, p.name);
            for c in &p.containers {
                for d in &c.devices {
                    if resources.contains(d.resource_name.as_str()) && !d.device_ids.is_empty() {
                        held.entry(d.resource_name.clone())
                            .or_default()
                            .entry(key.clone())
                            .or_default()
                            .entry(c.name.clone())
                            .or_default()
                            .extend(d.device_ids.iter().cloned());
                    }
                }
            }
        }
        for pool in &pools {
            metrics::AllocatorMetrics::count(&shared.metrics.allocator.resyncs, &pool.resource, "ok");
            let total = pool.slot_ids().len();
            let used: BTreeSet<&String> = held
                .get(&pool.resource)
                .into_iter()
                .flat_map(|pods| pods.values())
                .flat_map(|cs| cs.values())
                .flatten()
                .collect();
            let used_n = used.len().min(total);
            let elsewhere_n = shared
                .elsewhere
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&pool.resource)
                .map_or(0, |e| e.iter().filter(|id| !used.contains(id)).count());
            let unhealthy_n = shared
                .unhealthy
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&pool.resource)
                .map_or(0, |u| u.iter().filter(|id| !used.contains(id)).count());
            let free_n = total
                .saturating_sub(used_n)
                .saturating_sub(elsewhere_n)
                .saturating_sub(unhealthy_n);
            let mut states = vec![("used", used_n), ("free", free_n)];
            if pool.shared == pools::Sharing::Cluster {
                states.push(("held_elsewhere", elsewhere_n));
            }
            if pool.devices.iter().any(|d| d.pci) {
                states.push(("unhealthy", unhealthy_n));
            }
            for (state, n) in states {
                shared
                    .metrics
                    .allocator
                    .slots
                    .get_or_create(&metrics::SlotLabels {
                        resource: pool.resource.clone(),
                        state,
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        // Mismatches: a container whose devices differ from its record. `List` shows app
        // containers and (kubelets with sidecar support) restartable init containers; the
        // device checkpoint also shows regular init containers, for as long as the pod is
        // active, so a container `List` lacks is compared with it.
        let planned: Vec<(String, records::Recorded)> = shared
            .records
            .read(|v| v.pods.iter().map(|(k, r)| (k.clone(), r.clone())).collect());
        let checkpointed = if planned.iter().any(|(k, r)| {
            r.record
                .containers
                .iter()
                .any(|c| !c.devices.is_empty() && !held_by(&held, k, &c.name))
        }) {
            read_device_checkpoint(&checkpoint, &mut checkpoint_error).await
        } else {
            None
        };
        let live: BTreeSet<&String> = held.values().flat_map(|pods| pods.keys()).collect();
        reported.retain(|(k, _, _)| live.contains(k) || planned.iter().any(|(p, _)| p == k));
        for (key, rec) in &planned {
            for c in &rec.record.containers {
                for (res, ids) in &c.devices {
                    let from_checkpoint: Option<BTreeSet<String>> = checkpointed
                        .as_ref()
                        .and_then(|d| d.pods.get(&rec.uid))
                        .and_then(|cs| cs.get(&c.name))
                        .and_then(|rs| rs.get(res))
                        .map(|ids| ids.keys().cloned().collect());
                    let Some(actual) = held
                        .get(res)
                        .and_then(|pods| pods.get(key))
                        .and_then(|cs| cs.get(&c.name))
                        .or(from_checkpoint.as_ref())
                    else {
                        continue;
                    };
                    let want: BTreeSet<String> = ids.iter().cloned().collect();
                    if &want == actual || !reported.insert((key.clone(), c.name.clone(), res.clone())) {
                        continue;
                    }
                    shared
                        .metrics
                        .allocator
                        .mismatches
                        .get_or_create(&metrics::ResourceLabels {
                            resource: res.clone(),
                        })
                        .inc();
                    let note = format!(
                        "{} {} got {res} {} but the scheduler planned {}",
                        c.kind.noun(),
                        c.name,
                        actual.iter().cloned().collect::<Vec<_>>().join(","),
                        ids.join(",")
                    );
                    tracing::warn!(pod = %key, "{note}");
                    if let Some((ns, name)) = key.split_once('/') {
                        let pod: Pod = Pod {
                            metadata: kube::api::ObjectMeta {
                                namespace: Some(ns.to_owned()),
                                name: Some(name.to_owned()),
                                uid: Some(rec.uid.clone()).filter(|u| !u.is_empty()),
                                ..Default::default()
                            },
                            ..Default::default()
                        };
                        pod_event(&shared, &pod, EventType::Warning, "AllocationMismatch", note).await;
                    }
                }
            }
        }
    }
}

/// Whether `List` showed container `name` of pod `key` holding any pool resource.
fn held_by(
    held: &BTreeMap<String, BTreeMap<String, BTreeMap<String, BTreeSet<String>>>>,
    key: &str,
    name: &str,
) -> bool {
    held.values()
        .any(|pods| pods.get(key).is_some_and(|cs| cs.contains_key(name)))
}

/// The kubelet's device checkpoint, when it exists and verifies. A failure is logged once
/// per distinct error (a torn read during a kubelet write passes at the next resync).
async fn read_device_checkpoint(
    path: &Path,
    last_error: &mut Option<String>,
) -> Option<crate::checkpoint::DeviceAssignments> {
    let result = match tokio::fs::read(path).await {
        Ok(bytes) => crate::checkpoint::parse_device_checkpoint(&bytes).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(d) => {
            *last_error = None;
            Some(d)
        }
        Err(msg) => {
            if last_error.as_deref() != Some(msg.as_str()) {
                tracing::warn!(file = %path.display(), error = %msg, "cannot use the kubelet's device checkpoint; init containers' devices are not compared");
                *last_error = Some(msg);
            }
            None
        }
    }
}

/// `numaplane-exporter device-plugin`: the allocator alone, with its own metrics server.
pub async fn run(args: DevicePluginArgs) -> Result<(), AllocatorError> {
    let machine =
        crate::plumbing::load_machine(args.topology_xml.as_deref()).map_err(AllocatorError::LoadMachine)?;
    let pools = pools::load(&args.pools, &machine)?;
    if let Some(p) = pools.iter().find(|p| p.shared == pools::Sharing::Cluster) {
        return Err(AllocatorError::ClusterPoolNeedsRun {
            resource: p.resource.clone(),
        });
    }
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(crate::server::Health::default());
    let listen = crate::server::listen_address(args.listen, args.metrics_address, DEFAULT_LISTEN);
    let (addr, server) = crate::server::serve(
        listen,
        metrics.clone(),
        health.clone(),
        args.resync_interval
            .saturating_mul(10)
            .max(Duration::from_secs(30)),
    )
    .await
    .map_err(AllocatorError::Server)?;
    tracing::info!(%addr, pools = pools.len(), "serving /metrics, /healthz and /readyz");
    let (client, _) = crate::plumbing::kube_client(args.kubeconfig.as_ref())
        .await
        .map_err(|e| AllocatorError::Client(Box::new(e)))?;
    let kubelet = KubeletClient::new(&args.podresources_socket, args.call_timeout, metrics.clone())
        .map_err(AllocatorError::Socket)?
        .with_budget(
            crate::podresources::DEFAULT_REQUESTS_PER_SECOND,
            crate::podresources::DEFAULT_BURST,
        );
    let instance = args
        .pod_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("numaplane-exporter-{}", args.node_name));
    let mut tasks = JoinSet::new();
    let cfg = AllocatorConfig {
        pools,
        dir: args.device_plugin_dir.clone(),
        node: args.node_name.clone(),
        instance,
        resync: args.resync_interval,
        rescan: args.device_rescan_interval,
        topology_xml: args.topology_xml.clone(),
        delivered: None,
    };
    let registrations = start(&mut tasks, cfg, Some(client), kubelet, metrics);
    let h = health.clone();
    tasks.spawn(async move {
        loop {
            h.beat();
            // Ready means registered: a plugin the kubelet does not know steers nothing.
            let missing = registrations.missing();
            if missing.is_empty() {
                h.set_ready();
            } else {
                h.set_not_ready(format!("not registered with the kubelet: {}", missing.join(", ")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let ended = tokio::select! {
        ended = tasks.join_next() => ended,
        () = crate::plumbing::shutdown_signal() => {
            tracing::info!("signal received: stopping");
            tasks.abort_all();
            server.abort();
            return Ok(());
        }
    };
    server.abort();
    tasks.abort_all();
    Err(AllocatorError::TaskEnded(match ended {
        Some(Ok(name)) => name,
        _ => "panicked task",
    }))
}
