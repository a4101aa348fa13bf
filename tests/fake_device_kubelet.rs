//! The device-plugin side of a fake kubelet: a real tonic `Registration` server on
//! `<dir>/kubelet.sock` that connects back to each registering plugin, follows its
//! `ListAndWatch`, and admits containers with the device manager's rules
//! (`kubelet-topology-manager.md` §3.3, allocation steps 1–6):
//!
//! - available = healthy − allocated; too few → "requested number of devices unavailable";
//! - split available into NUMA-aligned (a node of the hint), unaligned and no-topology (no
//!   hint: all no-topology);
//! - fewer needed than aligned: `GetPreferredAllocation(available = aligned, size)`, take the
//!   answer ∩ aligned, fill from aligned; otherwise take every aligned device, ask over the
//!   rest, then fill unaligned, then no-topology. `GetPreferredAllocation` is therefore not
//!   called when the aligned set has exactly the size needed;
//! - without an answer the fill is in ascending ID order, or descending with
//!   [`FakeDeviceKubelet::set_fill_descending`] (the real kubelet's is Go map order);
//! - one `Allocate` per container and resource.
//!
//! `restart` behaves like a kubelet restart: the directory's sockets are removed and
//! `kubelet.sock` is recreated, so plugins must register again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use numaplane::proto::deviceplugin::{
    self as dp,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// One registered plugin as the fake kubelet sees it.
#[derive(Clone, Debug)]
struct Plugin {
    client: DevicePluginClient<Channel>,
    options: dp::DevicePluginOptions,
    devices: Arc<Mutex<Vec<dp::Device>>>,
}

#[derive(Debug, Default)]
struct State {
    plugins: BTreeMap<String, Plugin>,
    registrations: BTreeMap<String, usize>,
    /// resource → device ID → (pod, container).
    allocated: BTreeMap<String, BTreeMap<String, (String, String)>>,
    preferred_calls: BTreeMap<String, usize>,
    allocate_errors: usize,
    /// Fill in descending ID order (another arbitrary order, like the kubelet's map order).
    descending: bool,
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    server: tokio::sync::Mutex<Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Handle; clones share the server.
#[derive(Clone)]
pub struct FakeDeviceKubelet {
    shared: Arc<Shared>,
}

struct RegistrationService {
    shared: Arc<Shared>,
}

async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::try_from(format!("unix://{}", socket.display()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<dp::RegisterRequest>) -> Result<Response<dp::Empty>, Status> {
        let req = request.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported version {}",
                req.version
            )));
        }
        let socket = self.shared.dir.join(&req.endpoint);
        let channel = connect(&socket)
            .await
            .map_err(|e| Status::unavailable(format!("cannot dial {}: {e}", socket.display())))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client.get_device_plugin_options(dp::Empty {}).await?.into_inner();
        let mut stream = client.list_and_watch(dp::Empty {}).await?.into_inner();
        let devices = Arc::new(Mutex::new(Vec::new()));
        // The first list arrives before Register returns, as with a real plugin's first send.
        if let Some(Ok(first)) = stream.next().await {
            *devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = first.devices;
        }
        let sink = devices.clone();
        tokio::spawn(async move {
            while let Some(Ok(update)) = stream.next().await {
                *sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = update.devices;
            }
        });
        let mut st = self.shared.state();
        *st.registrations.entry(req.resource_name.clone()).or_default() += 1;
        st.plugins.insert(
            req.resource_name,
            Plugin {
                client,
                options,
                devices,
            },
        );
        Ok(Response::new(dp::Empty {}))
    }
}

impl FakeDeviceKubelet {
    /// Serves `Registration` on `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> std::io::Result<FakeDeviceKubelet> {
        let k = FakeDeviceKubelet {
            shared: Arc::new(Shared {
                dir: dir.to_owned(),
                state: Mutex::new(State::default()),
                server: tokio::sync::Mutex::new(None),
            }),
        };
        k.serve().await?;
        Ok(k)
    }

    async fn serve(&self) -> std::io::Result<()> {
        let socket = self.shared.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        let (tx, rx) = oneshot::channel::<()>();
        let service = RegistrationServer::new(RegistrationService {
            shared: self.shared.clone(),
        });
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
        });
        *self.shared.server.lock().await = Some((tx, task));
        Ok(())
    }

    /// A kubelet restart: every socket in the directory goes, registrations are forgotten
    /// (allocations survive, as in the kubelet's checkpoint), and `kubelet.sock` comes back.
    pub async fn restart(&self) -> std::io::Result<()> {
        if let Some((tx, task)) = self.shared.server.lock().await.take() {
            let _ = tx.send(());
            let _ = task.await;
        }
        for entry in std::fs::read_dir(&self.shared.dir)?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "sock") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        self.shared.state().plugins.clear();
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.serve().await
    }

    /// The plugins' sockets disappear while the kubelet keeps running (a plugin restart, a
    /// driver upgrade): each plugin must notice, serve again and register again. What they
    /// registered stays in use until they do, as the kubelet keeps an endpoint until its
    /// replacement registers.
    pub fn drop_plugin_sockets(&self) -> std::io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.shared.dir)?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "sock") && !path.ends_with("kubelet.sock") {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Fills without a preference in descending ID order from now on.
    pub fn set_fill_descending(&self, on: bool) {
        self.shared.state().descending = on;
    }

    /// Registrations of `resource` so far.
    pub fn registrations(&self, resource: &str) -> usize {
        self.shared
            .state()
            .registrations
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `resource` has registered at least `n` times.
    pub async fn wait_registered(&self, resource: &str, n: usize, timeout: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.registrations(resource) < n {
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{resource} registered {} times, wanted {n}",
                    self.registrations(resource)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The plugin's options, as read at registration.
    pub fn options(&self, resource: &str) -> Option<dp::DevicePluginOptions> {
        self.shared.state().plugins.get(resource).map(|p| p.options)
    }

    /// The latest `ListAndWatch` list of `resource`.
    pub fn devices(&self, resource: &str) -> Vec<dp::Device> {
        self.shared
            .state()
            .plugins
            .get(resource)
            .map(|p| {
                p.devices
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            })
            .unwrap_or_default()
    }

    /// `GetPreferredAllocation` calls made for `resource`.
    pub fn preferred_calls(&self, resource: &str) -> usize {
        self.shared
            .state()
            .preferred_calls
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// `Allocate` calls that failed.
    pub fn allocate_errors(&self) -> usize {
        self.shared.state().allocate_errors
    }

    /// IDs of `resource` held by `pod` (`namespace/name`), per container.
    pub fn held(&self, pod: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        let st = self.shared.state();
        let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for (res, ids) in &st.allocated {
            for (id, (p, c)) in ids {
                if p == pod {
                    out.entry(c.clone())
                        .or_default()
                        .entry(res.clone())
                        .or_default()
                        .push(id.clone());
                }
            }
        }
        out
    }

    /// Every holder: pod → container → resource → IDs.
    pub fn all_held(&self) -> BTreeMap<String, BTreeMap<String, BTreeMap<String, Vec<String>>>> {
        let pods: BTreeSet<String> = self
            .shared
            .state()
            .allocated
            .values()
            .flat_map(|ids| ids.values().map(|(p, _)| p.clone()))
            .collect();
        pods.into_iter().map(|p| (p.clone(), self.held(&p))).collect()
    }

    /// The pod is gone: its devices are free (the device manager's cleanup of inactive pods).
    pub fn remove_pod(&self, pod: &str) {
        for ids in self.shared.state().allocated.values_mut() {
            ids.retain(|_, (p, _)| p != pod);
        }
    }

    /// Asks the plugin of `resource` the kubelet's `GetPreferredAllocation` question for one
    /// container directly (benchmarks); returns its answer.
    pub async fn preferred(
        &self,
        resource: &str,
        available: Vec<String>,
        must_include: Vec<String>,
        size: usize,
    ) -> Result<Vec<String>, String> {
        let mut client = {
            let st = self.shared.state();
            st.plugins
                .get(resource)
                .map(|p| p.client.clone())
                .ok_or_else(|| format!("no plugin registered for {resource}"))?
        };
        *self
            .shared
            .state()
            .preferred_calls
            .entry(resource.to_owned())
            .or_default() += 1;
        let reply = client
            .get_preferred_allocation(dp::PreferredAllocationRequest {
                container_requests: vec![dp::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: must_include,
                    allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
                }],
            })
            .await
            .map_err(|e| format!("GetPreferredAllocation: {e}"))?
            .into_inner();
        Ok(reply
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }

    /// Admits one container's request of `count` devices of `resource` under the merged NUMA
    /// `hint` (None: no affinity), as the device manager does; returns the IDs allocated and
    /// the plugin's `Allocate` answer.
    pub async fn admit(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
        count: usize,
        hint: Option<&[i64]>,
    ) -> Result<(Vec<String>, dp::ContainerAllocateResponse), String> {
        let (plugin, available, descending) = {
            let st = self.shared.state();
            let plugin = st
                .plugins
                .get(resource)
                .cloned()
                .ok_or_else(|| format!("no plugin registered for {resource}"))?;
            let taken = st.allocated.get(resource).cloned().unwrap_or_default();
            let devices = plugin
                .devices
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let available: Vec<dp::Device> = devices
                .into_iter()
                .filter(|d| d.health == "Healthy" && !taken.contains_key(&d.id))
                .collect();
            (plugin, available, st.descending)
        };
        if available.len() < count {
            return Err(format!(
                "requested number of devices unavailable for {resource}. Requested: {count}, Available: {}",
                available.len()
            ));
        }
        let numa_of = |d: &dp::Device| -> Vec<i64> {
            d.topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default()
        };
        let mut aligned = BTreeSet::new();
        let mut unaligned = BTreeSet::new();
        let mut no_topology = BTreeSet::new();
        for d in &available {
            match hint {
                None => {
                    no_topology.insert(d.id.clone());
                }
                Some(_) if numa_of(d).is_empty() => {
                    no_topology.insert(d.id.clone());
                }
                Some(h) if numa_of(d).iter().any(|n| h.contains(n)) => {
                    aligned.insert(d.id.clone());
                }
                Some(_) => {
                    unaligned.insert(d.id.clone());
                }
            }
        }
        let mut client = plugin.client.clone();
        let mut chosen: Vec<String> = Vec::new();
        let ask =
            |avail: Vec<String>, must: Vec<String>, size: usize| self.preferred(resource, avail, must, size);
        if count < aligned.len() {
            if plugin.options.get_preferred_allocation_available {
                let answer = ask(aligned.iter().cloned().collect(), Vec::new(), count).await?;
                for id in answer {
                    if aligned.contains(&id) && !chosen.contains(&id) && chosen.len() < count {
                        chosen.push(id);
                    }
                }
            }
            let order: Vec<&String> = if descending {
                aligned.iter().rev().collect()
            } else {
                aligned.iter().collect()
            };
            for id in order {
                if chosen.len() < count && !chosen.contains(id) {
                    chosen.push(id.clone());
                }
            }
        } else {
            chosen.extend(aligned.iter().cloned());
            let rest: Vec<String> = unaligned.iter().chain(&no_topology).cloned().collect();
            if chosen.len() < count && plugin.options.get_preferred_allocation_available {
                let mut avail = rest.clone();
                avail.extend(chosen.iter().cloned());
                let answer = ask(avail, chosen.clone(), count).await?;
                for id in answer {
                    if rest.contains(&id) && !chosen.contains(&id) && chosen.len() < count {
                        chosen.push(id);
                    }
                }
            }
            let mut order: Vec<&String> = unaligned.iter().collect();
            let mut rest_nt: Vec<&String> = no_topology.iter().collect();
            if descending {
                order.reverse();
                rest_nt.reverse();
            }
            order.extend(rest_nt);
            for id in order {
                if chosen.len() < count && !chosen.contains(id) {
                    chosen.push(id.clone());
                }
            }
        }
        let reply = client
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: chosen.clone(),
                }],
            })
            .await;
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(e) => {
                self.shared.state().allocate_errors += 1;
                return Err(format!("Allocate: {e}"));
            }
        };
        let mut st = self.shared.state();
        let held = st.allocated.entry(resource.to_owned()).or_default();
        for id in &chosen {
            held.insert(id.clone(), (pod.to_owned(), container.to_owned()));
        }
        let response = reply.container_responses.into_iter().next().unwrap_or_default();
        Ok((chosen, response))
    }
}
