//! One kubelet device plugin (v1beta1) per pool: served on a Unix socket in the kubelet's
//! device-plugin directory and registered on its `kubelet.sock`.
//!
//! `GetPreferredAllocation` returns the scheduler's recorded plan ([`super::steer`]) or no
//! preference. `Allocate` is pod-agnostic: it hands out the IDs the kubelet chose (environment
//! variable, device nodes, CDI names) and never fails because of our own state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use numaplane::proto::deviceplugin::{
    self as dp, device_plugin_server::DevicePlugin, registration_client::RegistrationClient,
};
use numaplane::proto::podresources::ListPodResourcesResponse;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::metrics::AllocatorMetrics;
use super::pools::Pool;
use super::records::SharedRecords;
use super::steer::{self, Candidate, Miss};
use crate::podresources::KubeletClient;

/// Device plugin API version we speak.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// How long `GetPreferredAllocation` waits for a lagging pod watch before answering "no
/// preference" (the kubelet's own call is bounded by its RPC timeout).
pub const WATCH_LAG_WAIT: Duration = Duration::from_secs(1);
/// How long `GetPreferredAllocation` waits for room in the agent's pod-resources budget before
/// it answers from the last `List` instead (at the default 20/s a request frees every 50 ms).
pub const BUDGET_WAIT: Duration = Duration::from_millis(100);
/// Bound of that `List` itself: the kubelet is waiting for our answer.
pub const REFRESH_TIMEOUT: Duration = Duration::from_millis(500);

/// What the last pod-resources `List` said, shared by the plugins and the reconciliation.
#[derive(Debug, Default)]
pub struct KubeletView {
    /// Per resource and pod, the containers that hold some of it: they have been admitted,
    /// so their plans are no longer candidates (the pod's other containers' plans still are:
    /// the kubelet allocates container after container).
    pub holders: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Every pod the kubelet lists (`namespace/name`). The kubelet adds a pod to its pod
    /// manager before admitting it, so the pod being admitted is among them.
    pub pods: BTreeSet<String>,
    /// Pods the kubelet lists that the pod watch still did not know after a full
    /// [`WATCH_LAG_WAIT`] (a static pod without a mirror, a pod deleted from the API while the
    /// kubelet still lists it): not waited for again.
    pub waited: BTreeSet<String>,
    /// Tickets of `List` calls: the last one handed out, and the one the view shows.
    issued: u64,
    shown: u64,
}

impl KubeletView {
    /// A ticket for a `List` about to be sent (see [`Self::update`]).
    pub fn ticket(&mut self) -> u64 {
        self.issued = self.issued.saturating_add(1);
        self.issued
    }

    /// Replaces the view with the answer of the `List` sent with `ticket`, unless the view
    /// already shows a `List` sent later (the reconciliation and the plugins read
    /// concurrently, and an older answer arriving last must not hide a newer allocation).
    pub fn update(&mut self, ticket: u64, list: &ListPodResourcesResponse, resources: &BTreeSet<&str>) {
        if ticket <= self.shown {
            return;
        }
        self.shown = ticket;
        self.holders.clear();
        self.pods.clear();
        for p in &list.pod_resources {
            let key = format!("{}/{}", p.namespace, p.name);
            for c in &p.containers {
                for d in &c.devices {
                    if resources.contains(d.resource_name.as_str()) && !d.device_ids.is_empty() {
                        self.holders
                            .entry(d.resource_name.clone())
                            .or_default()
                            .entry(key.clone())
                            .or_default()
                            .insert(c.name.clone());
                    }
                }
            }
            self.pods.insert(key);
        }
        let pods = &self.pods;
        self.waited.retain(|k| pods.contains(k));
    }
}

/// Shared [`KubeletView`].
pub type Holders = Arc<Mutex<KubeletView>>;

/// What one pool's plugin serves from.
#[derive(Clone)]
pub struct PluginState {
    /// The pool.
    pub pool: Arc<Pool>,
    /// This node.
    pub node: String,
    /// The records of this node's pods.
    pub records: SharedRecords,
    /// Who holds what, from pod-resources.
    pub holders: Holders,
    /// Pod-resources, for a fresh `List` when no plan fits (the agent's shared budget).
    pub kubelet: KubeletClient,
    /// Whether a pod watch feeds `records` (there is an API client): without one no record can
    /// ever arrive, so there is nothing to wait for.
    pub watched: bool,
    /// The API client of the pod watch: a pod the kubelet lists that the watch does not know
    /// yet (the watch relisting after a 410 or a dropped stream, or just lagging) is fetched
    /// directly, so its record steers its admission instead of arriving after it.
    pub client: Option<kube::Client>,
    /// Every pool's resource (a `List` updates the holders of all of them).
    pub resources: Arc<BTreeSet<String>>,
    /// `Allocate` calls this pool has served; each one makes a holder the last `List` lacks.
    pub allocations: Arc<AtomicU64>,
    /// [`Self::allocations`] when the last `List` made while answering the kubelet started
    /// (`u64::MAX`: none yet).
    pub listed_after: Arc<AtomicU64>,
    /// The device list sent on `ListAndWatch` (health changes republish it).
    pub devices: watch::Receiver<Vec<dp::Device>>,
    /// Metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where each device list sent to the kubelet is noted, when an agent hosts the allocator:
    /// it reads allocatable again so that its object shows the devices at once.
    pub delivered: Option<crate::allocatable_follow::Delivered>,
}

impl std::fmt::Debug for PluginState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginState")
            .field("resource", &self.pool.resource)
            .finish_non_exhaustive()
    }
}

/// The device list of `pool`, every slot healthy except `unhealthy`.
pub fn device_list(pool: &Pool, unhealthy: &BTreeSet<String>) -> Vec<dp::Device> {
    pool.slot_ids()
        .into_iter()
        .map(|(id, dev)| dp::Device {
            health: if unhealthy.contains(&id) {
                "Unhealthy"
            } else {
                "Healthy"
            }
            .to_owned(),
            topology: dev.numa_node.map(|n| dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: i64::from(n) }],
            }),
            id,
        })
        .collect()
}

fn metrics(state: &PluginState) -> &AllocatorMetrics {
    &state.metrics.allocator
}

impl PluginState {
    /// Candidates for `resource`: the plans for it of containers that hold none of it yet;
    /// with `listed_only`, of pods the last `List` names.
    fn candidates(&self, listed_only: bool) -> Vec<Candidate> {
        let resource = &self.pool.resource;
        // Read under the holders' lock rather than cloning them (hundreds of pods per call);
        // nothing takes the two locks the other way round.
        let view = self
            .holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let holding = view.holders.get(resource);
        let none = BTreeSet::new();
        self.records.read(|v| {
            v.pods
                .iter()
                .filter(|(k, _)| !listed_only || view.pods.contains(*k))
                .map(|(k, r)| {
                    let held = holding.and_then(|h| h.get(k)).unwrap_or(&none);
                    Candidate {
                        key: k.clone(),
                        arrival: r.arrival,
                        plans: r
                            .record
                            .containers
                            .iter()
                            .filter(|c| !held.contains(&c.name))
                            .filter_map(|c| c.devices.get(resource).cloned())
                            .filter(|ids| !ids.is_empty())
                            .collect(),
                    }
                })
                .filter(|c| !c.plans.is_empty())
                .collect()
        })
    }

    /// Reads pod-resources now (within the shared budget, briefly) into the shared view;
    /// on failure the last `List` stands. Whether it did.
    async fn refresh(&self) -> bool {
        // The kubelet admits one container at a time and records an allocation before it asks
        // about the next one, so a `List` started now shows every `Allocate` counted so far.
        let allocations = self.allocations.load(Ordering::Acquire);
        let ticket = self
            .holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ticket();
        let outcome = match tokio::time::timeout(REFRESH_TIMEOUT, self.kubelet.list_within(BUDGET_WAIT)).await
        {
            Ok(Ok(list)) => {
                self.listed_after.store(allocations, Ordering::Release);
                let resources: BTreeSet<&str> = self.resources.iter().map(String::as_str).collect();
                self.holders
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .update(ticket, &list, &resources);
                "ok"
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %numaplane::error_chain(&e), "no fresh pod-resources List; using the last one");
                if matches!(e, crate::podresources::PodResourcesError::OverBudget { .. }) {
                    "over_budget"
                } else {
                    "error"
                }
            }
            Err(_) => {
                tracing::debug!(timeout = ?REFRESH_TIMEOUT, "pod-resources List too slow; using the last one");
                "error"
            }
        };
        AllocatorMetrics::count(&metrics(self).refreshes, &self.pool.resource, outcome);
        outcome == "ok"
    }

    /// Pods that may still bring a record: every pod the kubelet lists that the pod watch does
    /// not know yet (and was not waited for in vain), or `None` meaning "the watch has not
    /// listed yet, anything may come". Empty: nothing is on its way.
    fn awaited(&self) -> Option<BTreeSet<String>> {
        if !self.watched {
            return Some(BTreeSet::new());
        }
        let (listed, waited) = {
            let v = self
                .holders
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (v.pods.clone(), v.waited.clone())
        };
        self.records.read(|v| {
            v.synced.then(|| {
                listed
                    .into_iter()
                    .filter(|k| !v.node_pods.contains(k) && !waited.contains(k))
                    .collect()
            })
        })
    }

    /// The answer for one container. When no plan fits, it waits (at most
    /// [`WATCH_LAG_WAIT`]) only while a pod that may carry a record has not reached the pod
    /// watch yet; a pod the watch knows without a fitting plan (no record, no device of this
    /// pool, or a plan the kubelet cannot honour) is answered at once, since the kubelet
    /// admits pods one at a time and every wait here holds up the node's admissions.
    async fn prefer(&self, req: &steer::Request) -> Vec<String> {
        let resource = &self.pool.resource;
        let deadline = Instant::now() + WATCH_LAG_WAIT;
        // The kubelet adds the pods of a batch to its pod manager one at a time, each just
        // before admitting it, and admits one container at a time. So of the pods a `List`
        // names that hold none of this resource, only the one being admitted can be asking,
        // until an `Allocate` ends its admission: then a fresh `List` is needed, as it is when
        // no listed pod's plan fits (the asking pod may have come after the last `List`).
        // Without a fresh `List` (over budget, an error) every recorded pod is a candidate,
        // first bound first.
        let mut fresh = None;
        if self.allocations.load(Ordering::Acquire) != self.listed_after.load(Ordering::Acquire) {
            fresh = Some(self.refresh().await);
        }
        let mut fetched = false;
        loop {
            let mut seen = self.records.seen();
            let listed_only = fresh != Some(false);
            let miss = match steer::choose(&self.candidates(listed_only), req) {
                Ok(choice) => {
                    AllocatorMetrics::count(&metrics(self).preferred, resource, "honoured");
                    tracing::debug!(resource = %resource, pod = %choice.key, devices = ?choice.devices, "preferred allocation from the record");
                    return choice.devices;
                }
                Err(miss) => miss,
            };
            if fresh.is_none() {
                fresh = Some(self.refresh().await);
                continue;
            }
            let awaited = self.awaited();
            if !fetched && let Some(a) = awaited.as_ref().filter(|a| !a.is_empty()) {
                fetched = true;
                if self.fetch_unknown(a, deadline).await {
                    // Their records are in the view now: choose again.
                    continue;
                }
            }
            let now = Instant::now();
            let waiting = awaited.as_ref().is_none_or(|a| !a.is_empty());
            if !waiting || now >= deadline {
                if let Some(a) = awaited.filter(|a| !a.is_empty()) {
                    tracing::info!(resource = %resource, pods = ?a, "pods the kubelet lists never reached the pod watch; not waiting for them again");
                    self.holders
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .waited
                        .extend(a);
                }
                let outcome = match miss {
                    Miss::NoCandidate => "no_candidate",
                    Miss::NotHonourable => "not_honourable",
                };
                AllocatorMetrics::count(&metrics(self).preferred, resource, outcome);
                tracing::info!(resource = %resource, outcome, available = ?req.available, size = req.size, "no recorded plan fits; the kubelet keeps its own choice");
                return Vec::new();
            }
            // The pod being admitted may not have reached our watch yet.
            self.records.changed_since(&mut seen, deadline - now).await;
        }
    }

    /// Fetches the pods `keys` (the kubelet lists them, the pod watch does not know them) from
    /// the API server, within `deadline`, into the record view; whether any was found. A list
    /// with field selectors, so the grant the watch already has (pods `list`) covers it.
    async fn fetch_unknown(&self, keys: &BTreeSet<String>, deadline: Instant) -> bool {
        let Some(client) = &self.client else {
            return false;
        };
        let mut found = false;
        for key in keys {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), ns);
            let lp = kube::api::ListParams::default().fields(&format!(
                "metadata.name={name},{}",
                crate::pod_watch::node_selector(&self.node)
            ));
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, api.list(&lp)).await {
                Ok(Ok(list)) => {
                    for p in &list.items {
                        found = true;
                        // An unusable record is reported by the watch when it lists the pod.
                        let _ = self.records.apply(p, &self.node);
                    }
                    AllocatorMetrics::count(&metrics(self).pod_fetches, &self.pool.resource, "ok");
                }
                Ok(Err(e)) => {
                    AllocatorMetrics::count(&metrics(self).pod_fetches, &self.pool.resource, "error");
                    tracing::debug!(pod = %key, error = %numaplane::error_chain(&e), "cannot fetch a pod the pod watch does not know yet");
                }
                Err(_) => {
                    AllocatorMetrics::count(&metrics(self).pod_fetches, &self.pool.resource, "timeout");
                    return found;
                }
            }
        }
        found
    }

    fn allocate_one(&self, ids: &[String]) -> dp::ContainerAllocateResponse {
        let pool = &self.pool;
        let mut envs = std::collections::HashMap::new();
        envs.insert(pool.env.clone(), ids.join(","));
        let mut devices = Vec::new();
        let mut cdi_devices = Vec::new();
        let mut seen = BTreeSet::new();
        for id in ids {
            // Unknown IDs (not ours) still get their env entry: bookkeeping never fails Allocate.
            let Some(dev) = pool.device_of(id) else {
                tracing::warn!(resource = %pool.resource, id = %id, "Allocate names an ID this pool does not offer");
                continue;
            };
            if !seen.insert(dev.id.clone()) {
                continue;
            }
            for t in &pool.device_specs {
                devices.push(dp::DeviceSpec {
                    container_path: t.container_path.replace("{device}", &dev.id),
                    host_path: t.host_path.replace("{device}", &dev.id),
                    permissions: t.permissions.clone().unwrap_or_else(|| "rw".to_owned()),
                });
            }
            for c in &pool.cdi_devices {
                cdi_devices.push(dp::CdiDevice {
                    name: c.replace("{device}", &dev.id),
                });
            }
        }
        dp::ContainerAllocateResponse {
            envs,
            mounts: Vec::new(),
            devices,
            annotations: std::collections::HashMap::new(),
            cdi_devices,
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginState {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        let note = self.delivered.clone().map(|d| (d, self.pool.resource.clone()));
        let stream = futures::stream::unfold((rx, true, note), |(mut rx, first, note)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            if let Some((delivered, resource)) = &note {
                let healthy = devices
                    .iter()
                    .filter(|d| d.health == "Healthy")
                    .map(|d| d.id.clone())
                    .collect();
                delivered.note(resource, healthy);
            }
            Some((Ok(dp::ListAndWatchResponse { devices }), (rx, false, note)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let t0 = Instant::now();
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            let req = steer::Request {
                available: c.available_device_i_ds,
                must_include: c.must_include_device_i_ds,
                size: usize::try_from(c.allocation_size).unwrap_or(0),
            };
            container_responses.push(dp::ContainerPreferredAllocationResponse {
                device_i_ds: self.prefer(&req).await,
            });
        }
        metrics(self)
            .preferred_latency
            .observe(t0.elapsed().as_secs_f64());
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| self.allocate_one(&c.devices_ids))
            .collect();
        self.allocations.fetch_add(1, Ordering::AcqRel);
        AllocatorMetrics::count(&metrics(self).allocate, &self.pool.resource, "ok");
        Ok(Response::new(dp::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// Why a plugin could not be served or registered (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Our socket cannot be created.
    #[error("serving the {resource} plugin on {socket}")]
    Listen {
        /// Resource.
        resource: String,
        /// Socket path.
        socket: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The kubelet's registration socket cannot be reached.
    #[error("connecting to the kubelet at {socket}")]
    Connect {
        /// Socket path.
        socket: PathBuf,
        /// Cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet refused the registration.
    #[error("registering {resource} with the kubelet")]
    Register {
        /// Resource.
        resource: String,
        /// Cause.
        #[source]
        source: Status,
    },
}

/// A served plugin: the server task and the socket it owns.
#[derive(Debug)]
pub struct Served {
    /// Our socket.
    pub socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    /// Stops serving and removes the socket.
    pub fn stop(self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Whether the server task ended.
    pub fn finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// Serves `state` on `<dir>/<pool socket>` (a stale file there is replaced).
pub fn serve(dir: &Path, state: PluginState) -> Result<Served, PluginError> {
    let socket = dir.join(state.pool.socket_name());
    let listen_err = |source| PluginError::Listen {
        resource: state.pool.resource.clone(),
        socket: socket.clone(),
        source,
    };
    match std::fs::remove_file(&socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(listen_err(e)),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(&socket).map_err(listen_err)?;
    let service = dp::device_plugin_server::DevicePluginServer::new(state);
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::warn!(error = %e, "device plugin server stopped");
        }
    });
    Ok(Served { socket, task })
}

/// Registers the pool's plugin with the kubelet at `<dir>/kubelet.sock`.
pub async fn register(dir: &Path, pool: &Pool, timeout: Duration) -> Result<(), PluginError> {
    let kubelet = dir.join(KUBELET_SOCKET);
    let endpoint = tonic::transport::Endpoint::try_from(format!("unix://{}", kubelet.display()))
        .map_err(|source| PluginError::Connect {
            socket: kubelet.clone(),
            source,
        })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint.connect().await.map_err(|source| PluginError::Connect {
        socket: kubelet.clone(),
        source,
    })?;
    RegistrationClient::new(channel)
        .register(dp::RegisterRequest {
            version: API_VERSION.to_owned(),
            endpoint: pool.socket_name(),
            resource_name: pool.resource.clone(),
            options: Some(dp::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|source| PluginError::Register {
            resource: pool.resource.clone(),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use numaplane::proto::podresources::{ContainerDevices, ContainerResources, PodResources};

    fn list(holder: Option<&str>) -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "a".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "app".into(),
                    devices: holder
                        .map(|id| ContainerDevices {
                            resource_name: "example.com/gpu".into(),
                            device_ids: vec![id.into()],
                            topology: None,
                        })
                        .into_iter()
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn an_older_list_answered_last_does_not_hide_a_newer_allocation() {
        let resources = BTreeSet::from(["example.com/gpu"]);
        let mut v = KubeletView::default();
        // The reconciliation sends a List, then the plugin sends one after an Allocate; the
        // plugin's answer (with the allocation) arrives first.
        let older = v.ticket();
        let newer = v.ticket();
        v.update(newer, &list(Some("g1")), &resources);
        v.update(older, &list(None), &resources);
        assert_eq!(
            v.holders["example.com/gpu"]["ns/a"],
            BTreeSet::from(["app".to_owned()])
        );
        assert!(v.pods.contains("ns/a"));
        let latest = v.ticket();
        v.update(latest, &list(None), &resources);
        assert!(v.holders.is_empty());
    }
}
