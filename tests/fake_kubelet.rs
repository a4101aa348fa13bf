//! A fake kubelet: the real generated tonic `PodResourcesLister` server on a Unix socket, with
//! state the test changes while clients are connected, injected failures, call counters, and
//! a stop/restart pair that mimics a kubelet restart (the socket file disappears, then comes
//! back). Real gRPC framing keeps the exporter's client code honest, which an in-process trait
//! mock would not.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::Stream;
use numaplane::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use numaplane::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use numaplane::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources, WatchPodAction,
    WatchPodResourcesRequest, WatchPodResourcesResponse,
};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

/// gRPC service name the kubelet registers, as it appears in its UNIMPLEMENTED messages.
pub const SERVICE: &str = "v1.PodResourcesLister";

/// Message of the kubelet's pod-resources rate limiter (RESOURCE_EXHAUSTED).
pub const RATE_LIMIT_MESSAGE: &str = "rejected by rate limit";

/// How long [`FakeKubelet::stop`] lets connections drain before abandoning the server task;
/// clients that hold idle HTTP/2 connections must not make a test hang.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Which optional methods the fake serves. A kubelet that predates a method (every released
/// kubelet for `Watch`, kubelets before 1.27 for `Get`) answers UNIMPLEMENTED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeKubeletOptions {
    /// Serve `Watch`; `false` answers UNIMPLEMENTED like the kubelet.
    pub watch: bool,
    /// How `Get` answers, by kubelet version.
    pub get: GetMode,
}

/// How a kubelet answers pod-resources `Get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetMode {
    /// 1.34 and newer (gate on by default, locked on from 1.36): served; an unknown pod is
    /// answered with code `Unknown` and "pod NAME in namespace NS not found" (checked on a
    /// real v1.36.2 kubelet).
    Offered,
    /// 1.27–1.33 with the `KubeletPodResourcesGet` gate off (their default): code `Unknown`,
    /// "PodResources API Get method disabled".
    Disabled,
    /// 1.26 and older: the method does not exist, UNIMPLEMENTED.
    Unimplemented,
}

/// The message of a 1.27–1.33 kubelet whose `Get` is gated off.
pub const GET_DISABLED_MESSAGE: &str = "PodResources API Get method disabled";

impl Default for FakeKubeletOptions {
    /// What a current kubelet offers: `Get` yes, `Watch` no.
    fn default() -> Self {
        Self {
            watch: false,
            get: GetMode::Offered,
        }
    }
}

/// The methods of `PodResourcesLister`, for counters and injected failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `List`.
    List,
    /// `GetAllocatableResources`.
    GetAllocatableResources,
    /// `Get`.
    Get,
    /// `Watch`.
    Watch,
}

impl Method {
    /// The gRPC method name, as the kubelet's error messages spell it.
    pub const fn grpc_name(self) -> &'static str {
        match self {
            Method::List => "List",
            Method::GetAllocatableResources => "GetAllocatableResources",
            Method::Get => "Get",
            Method::Watch => "Watch",
        }
    }
}

/// The status a kubelet without `method` answers.
pub fn unimplemented(method: Method) -> Status {
    Status::unimplemented(format!(
        "unknown method {} for service {SERVICE}",
        method.grpc_name()
    ))
}

/// The uid the fake gives a pod in Watch events; stable so tests can predict it.
pub fn pod_uid(namespace: &str, name: &str) -> String {
    format!("uid-{namespace}-{name}")
}

type WatchSender = mpsc::UnboundedSender<Result<WatchPodResourcesResponse, Status>>;

/// Mutable state shared by the handle and the running service.
struct State {
    allocatable: AllocatableResourcesResponse,
    pods: Vec<PodResources>,
    options: FakeKubeletOptions,
    /// Injected failures, consumed front first.
    failures: BTreeMap<Method, Vec<Status>>,
    /// Calls per method and answered code, in order of first occurrence.
    calls: BTreeMap<Method, Vec<(Code, usize)>>,
    watchers: Vec<WatchSender>,
}

impl State {
    fn record(&mut self, method: Method, code: Code) {
        let counts = self.calls.entry(method).or_default();
        match counts.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => counts.push((code, 1)),
        }
    }

    /// Answers one call of `method`: UNIMPLEMENTED when disabled, else a queued failure, else
    /// `serve`; the call is counted under the code it finally gets.
    fn answer<T>(
        &mut self,
        method: Method,
        serve: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        if method == Method::Get && self.options.get == GetMode::Disabled {
            let status = Status::unknown(GET_DISABLED_MESSAGE);
            self.record(method, status.code());
            return Err(status);
        }
        let disabled = match method {
            Method::Get => self.options.get == GetMode::Unimplemented,
            Method::Watch => !self.options.watch,
            Method::List | Method::GetAllocatableResources => false,
        };
        let outcome = if disabled {
            Err(unimplemented(method))
        } else {
            match self.failures.get_mut(&method) {
                Some(queue) if !queue.is_empty() => Err(queue.remove(0)),
                _ => serve(self),
            }
        };
        let code = outcome.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.record(method, code);
        outcome.map(Response::new)
    }

    fn broadcast(&mut self, event: &WatchPodResourcesResponse) {
        self.watchers.retain(|tx| tx.send(Ok(event.clone())).is_ok());
    }
}

struct Shared {
    state: Mutex<State>,
    socket: PathBuf,
    server: tokio::sync::Mutex<Option<Running>>,
}

impl Shared {
    /// The state, even if a panicking test thread poisoned the lock: counters stay readable.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

struct Running {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// The gRPC service; every call goes through [`State::answer`].
struct Service {
    shared: Arc<Shared>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchPodResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.shared.state().answer(Method::List, |state| {
            Ok(ListPodResourcesResponse {
                pod_resources: state.pods.clone(),
            })
        })
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.shared
            .state()
            .answer(Method::GetAllocatableResources, |state| {
                Ok(state.allocatable.clone())
            })
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let want = request.into_inner();
        self.shared.state().answer(Method::Get, |state| {
            let pod = state
                .pods
                .iter()
                .find(|p| p.namespace == want.pod_namespace && p.name == want.pod_name);
            match pod {
                Some(pod) => Ok(GetPodResourcesResponse {
                    pod_resources: Some(pod.clone()),
                }),
                None => Err(Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    want.pod_name, want.pod_namespace
                ))),
            }
        })
    }

    type WatchStream = WatchStream;

    /// Streams changes only, like a watch after a list: the current pods come from `List`.
    async fn watch(
        &self,
        _request: Request<WatchPodResourcesRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.shared.state().answer(Method::Watch, |state| {
            let (tx, rx) = mpsc::unbounded_channel();
            state.watchers.push(tx);
            let stream: WatchStream = Box::pin(UnboundedReceiverStream::new(rx));
            Ok(stream)
        })
    }
}

/// Handle to a running fake kubelet; clones share the server and its state.
#[derive(Clone)]
pub struct FakeKubelet {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKubelet")
            .field("socket", &self.shared.socket)
            .finish_non_exhaustive()
    }
}

impl FakeKubelet {
    /// Starts serving on `socket` (a stale socket file there is removed first).
    pub async fn start(
        socket: &Path,
        allocatable: AllocatableResourcesResponse,
        pods: Vec<PodResources>,
        opts: FakeKubeletOptions,
    ) -> io::Result<FakeKubelet> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                allocatable,
                pods,
                options: opts,
                failures: BTreeMap::new(),
                calls: BTreeMap::new(),
                watchers: Vec::new(),
            }),
            socket: socket.to_owned(),
            server: tokio::sync::Mutex::new(None),
        });
        let kubelet = FakeKubelet { shared };
        kubelet.restart().await?;
        Ok(kubelet)
    }

    /// The socket path served.
    pub fn socket(&self) -> &Path {
        &self.shared.socket
    }

    /// Replaces the pods and tells every open Watch stream what changed, pod by pod: removed
    /// pods as DELETED, new pods as ADDED, a changed pod as DELETED then ADDED.
    pub fn set_pods(&self, pods: Vec<PodResources>) {
        let mut state = self.shared.state();
        let key = |p: &PodResources| (p.namespace.clone(), p.name.clone());
        let old: BTreeMap<_, _> = state.pods.iter().map(|p| (key(p), p.clone())).collect();
        let new: BTreeMap<_, _> = pods.iter().map(|p| (key(p), p.clone())).collect();
        let mut events = Vec::new();
        let event = |action: WatchPodAction, pod: &PodResources| WatchPodResourcesResponse {
            action: action as i32,
            uid: pod_uid(&pod.namespace, &pod.name),
            pod_resources: vec![pod.clone()],
        };
        for (k, pod) in &old {
            if new.get(k) != Some(pod) {
                events.push(event(WatchPodAction::Deleted, pod));
            }
        }
        for (k, pod) in &new {
            if old.get(k) != Some(pod) {
                events.push(event(WatchPodAction::Added, pod));
            }
        }
        state.pods = pods;
        for e in &events {
            state.broadcast(e);
        }
    }

    /// Replaces what `GetAllocatableResources` answers (device health change, resize).
    pub fn set_allocatable(&self, a: AllocatableResourcesResponse) {
        self.shared.state().allocatable = a;
    }

    /// Makes the next `count` calls of `method` fail with `code` and `message`, after failures
    /// queued earlier.
    pub fn fail_next(&self, method: Method, count: usize, code: Code, message: &str) {
        let mut state = self.shared.state();
        let queue = state.failures.entry(method).or_default();
        queue.extend((0..count).map(|_| Status::new(code, message)));
    }

    /// Calls of `method` received so far, failed ones included.
    pub fn calls(&self, method: Method) -> usize {
        self.calls_by_code(method).iter().map(|(_, n)| n).sum()
    }

    /// Calls of `method` by answered code (`Ok` for successes), in order of first occurrence.
    pub fn calls_by_code(&self, method: Method) -> Vec<(Code, usize)> {
        self.shared
            .state()
            .calls
            .get(&method)
            .cloned()
            .unwrap_or_default()
    }

    /// Watch streams currently open (a client that went away no longer counts).
    pub fn watchers(&self) -> usize {
        let mut state = self.shared.state();
        state.watchers.retain(|tx| !tx.is_closed());
        state.watchers.len()
    }

    /// Shuts the server down the way a kubelet restart begins: Watch streams end, connections
    /// close and the socket file disappears. State and counters are kept for [`Self::restart`].
    pub async fn stop(&self) {
        let mut server = self.shared.server.lock().await;
        // Ending the streams first lets the graceful shutdown finish.
        self.shared.state().watchers.clear();
        if let Some(running) = server.take() {
            let _ = running.shutdown.send(());
            let mut task = running.task;
            if tokio::time::timeout(DRAIN_TIMEOUT, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
        }
        // Already gone is fine: stop is idempotent.
        let _ = std::fs::remove_file(&self.shared.socket);
    }

    /// Serves again on the same path with the current state (the kubelet came back). Stops a
    /// running server first, so calling it on a running fake is a quick restart.
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        let mut server = self.shared.server.lock().await;
        remove_stale(&self.shared.socket)?;
        let listener = UnixListener::bind(&self.shared.socket)?;
        let (shutdown, signal) = oneshot::channel::<()>();
        let service = PodResourcesListerServer::new(Service {
            shared: Arc::clone(&self.shared),
        });
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = signal.await;
                }),
        );
        *server = Some(Running { shutdown, task });
        Ok(())
    }
}

/// Removes whatever file is at `socket`; nothing there is fine.
fn remove_stale(socket: &Path) -> io::Result<()> {
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A generated client connected to the Unix socket at `socket`, as the exporter connects.
pub async fn connect(socket: &Path) -> Result<PodResourcesListerClient<Channel>, tonic::transport::Error> {
    let endpoint = Endpoint::from_shared(format!("unix://{}", socket.display()))?;
    Ok(PodResourcesListerClient::new(endpoint.connect().await?))
}

/// Bytes that no HTTP/2 peer accepts as a connection preface or settings frame.
const GARBAGE: &[u8] = b"SSH-2.0-OpenSSH_9.6 this is not a gRPC server\r\n";

/// Listens on `socket` and answers every connection with non-HTTP/2 bytes, then closes it: a
/// socket that is not a gRPC server. Abort the returned task to stop; the socket file stays.
pub async fn start_not_grpc(socket: &Path) -> io::Result<JoinHandle<()>> {
    remove_stale(socket)?;
    let listener = UnixListener::bind(socket)?;
    Ok(tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The peer may already be gone; nothing to report to anyone.
                let _ = stream.write_all(GARBAGE).await;
                let _ = stream.shutdown().await;
            });
        }
    }))
}
