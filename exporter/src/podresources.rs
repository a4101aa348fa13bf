//! Client of the kubelet pod-resources API (v1) over its Unix socket.
//!
//! One lazily connected channel is kept for the agent's lifetime: tonic re-dials the socket path
//! on the next call after the kubelet restarts and recreates it, which is why the directory, not
//! the socket file, is mounted into the pod. Every call is counted by method and gRPC code.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use numaplane::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources, WatchPodResourcesRequest,
    WatchPodResourcesResponse, pod_resources_lister_client::PodResourcesListerClient,
};
use tonic::transport::{Channel, Endpoint};

use crate::metrics::{Metrics, PodResourcesMethod, grpc_code_name};

/// The kubelet's default socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Both upstream exporters allow List responses of up to 16 MiB.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Errors talking to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket path cannot form an endpoint.
    #[error("invalid pod-resources socket path {socket}: {message}")]
    Endpoint {
        /// The path.
        socket: PathBuf,
        /// Why.
        message: String,
    },
    /// A call failed (including connection failures, which tonic reports as UNAVAILABLE).
    #[error("pod-resources {method:?} on {socket} failed with {}: {message}", grpc_code_name(*.code))]
    Call {
        /// The method.
        method: PodResourcesMethod,
        /// The socket.
        socket: PathBuf,
        /// gRPC code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The agent's own request budget had no room in time; nothing was sent.
    #[error("pod-resources {method:?} not sent: the request budget had no room within {waited:?}")]
    OverBudget {
        /// The method.
        method: PodResourcesMethod,
        /// How long it waited for the budget.
        waited: Duration,
    },
}

/// What kubelets 1.27–1.33 answer `Get` with while the `KubeletPodResourcesGet` gate is off
/// (their default), with code `Unknown`, the same code as "pod not found".
pub const GET_DISABLED_MESSAGE: &str = "PodResources API Get method disabled";

impl PodResourcesError {
    /// Whether the kubelet does not offer the method at all: UNIMPLEMENTED (1.26 and older for
    /// `Get`; every kubelet for `Watch`), or `Get` gated off on 1.27–1.33.
    pub fn method_not_offered(&self) -> bool {
        match self {
            Self::Call { code, message, .. } => {
                *code == tonic::Code::Unimplemented
                    || (*code == tonic::Code::Unknown && message.contains(GET_DISABLED_MESSAGE))
            }
            Self::Endpoint { .. } | Self::OverBudget { .. } => false,
        }
    }

    /// The gRPC code, when the error came from a call.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Call { code, .. } => Some(*code),
            Self::Endpoint { .. } | Self::OverBudget { .. } => None,
        }
    }

    /// A bounded label for metrics and scan results.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Endpoint { .. } => "endpoint",
            Self::OverBudget { .. } => "over_budget",
            Self::Call { .. } if self.method_not_offered() => "unimplemented",
            Self::Call { code, .. } => match code {
                tonic::Code::ResourceExhausted => "rate_limited",
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => "kubelet_unavailable",
                tonic::Code::Unimplemented => "unimplemented",
                _ => "kubelet_error",
            },
        }
    }
}

/// Requests per second this agent allows itself on the pod-resources socket by default: the
/// kubelet serves 100/s (burst 10) to every client on the node together (device-metrics
/// agents, Multus, us), so we keep to a fifth of it.
pub const DEFAULT_REQUESTS_PER_SECOND: u32 = 20;
/// Burst on top of [`DEFAULT_REQUESTS_PER_SECOND`], the kubelet's own burst.
pub const DEFAULT_BURST: u32 = 10;

/// The pod-resources client. Clones share the request budget.
#[derive(Clone)]
pub struct KubeletClient {
    client: PodResourcesListerClient<Channel>,
    socket: PathBuf,
    metrics: Arc<Metrics>,
    budget: Option<Arc<governor::DefaultDirectRateLimiter>>,
}

impl KubeletClient {
    /// A client for the socket at `socket` (an optional `unix://` prefix is accepted). Nothing
    /// is dialled until the first call; each call is bounded by `call_timeout`.
    pub fn new(
        socket: &Path,
        call_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, PodResourcesError> {
        let raw = socket.to_string_lossy();
        let path = raw.strip_prefix("unix://").unwrap_or(&raw).to_owned();
        if path.is_empty() {
            return Err(PodResourcesError::Endpoint {
                socket: socket.to_owned(),
                message: "empty path".to_owned(),
            });
        }
        let endpoint = Endpoint::try_from(format!("unix://{path}"))
            .map_err(|e| PodResourcesError::Endpoint {
                socket: socket.to_owned(),
                message: e.to_string(),
            })?
            .connect_timeout(call_timeout)
            .timeout(call_timeout);
        let client = PodResourcesListerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        Ok(Self {
            client,
            socket: PathBuf::from(path),
            metrics,
            budget: None,
        })
    }

    /// Bounds every call of this client and its clones to `per_second` with bursts of `burst`
    /// (the scans, the admission poller and the allocator together); a call over budget waits.
    #[must_use]
    pub fn with_budget(mut self, per_second: u32, burst: u32) -> Self {
        let rate = std::num::NonZeroU32::new(per_second).unwrap_or(std::num::NonZeroU32::MIN);
        let burst = std::num::NonZeroU32::new(burst).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = governor::Quota::per_second(rate).allow_burst(burst);
        self.budget = Some(Arc::new(governor::RateLimiter::direct(quota)));
        self
    }

    /// Waits for the budget, if any.
    async fn spend(&self) {
        if let Some(b) = &self.budget {
            b.until_ready().await;
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn record<T>(
        &self,
        method: PodResourcesMethod,
        result: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, PodResourcesError> {
        match result {
            Ok(resp) => {
                self.metrics.call(method, tonic::Code::Ok);
                Ok(resp.into_inner())
            }
            Err(status) => {
                self.metrics.call(method, status.code());
                Err(PodResourcesError::Call {
                    method,
                    socket: self.socket.clone(),
                    code: status.code(),
                    message: status_message(&status),
                })
            }
        }
    }

    /// `List`: every pod the kubelet holds resources for.
    pub async fn list(&self) -> Result<ListPodResourcesResponse, PodResourcesError> {
        self.spend().await;
        let result = self.client.clone().list(ListPodResourcesRequest {}).await;
        self.record(PodResourcesMethod::List, result)
    }

    /// `List` for a caller that cannot wait long (the device plugin answering the kubelet):
    /// when the shared budget has no room within `max_wait`, nothing is sent and the answer is
    /// [`PodResourcesError::OverBudget`].
    pub async fn list_within(
        &self,
        max_wait: Duration,
    ) -> Result<ListPodResourcesResponse, PodResourcesError> {
        if let Some(b) = &self.budget
            && tokio::time::timeout(max_wait, b.until_ready()).await.is_err()
        {
            return Err(PodResourcesError::OverBudget {
                method: PodResourcesMethod::List,
                waited: max_wait,
            });
        }
        let result = self.client.clone().list(ListPodResourcesRequest {}).await;
        self.record(PodResourcesMethod::List, result)
    }

    /// `GetAllocatableResources`.
    pub async fn allocatable(&self) -> Result<AllocatableResourcesResponse, PodResourcesError> {
        self.spend().await;
        let result = self
            .client
            .clone()
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await;
        self.record(PodResourcesMethod::GetAllocatableResources, result)
    }

    /// `Get` for one pod: `Ok(None)` when the kubelet does not know the pod (yet), or no longer
    /// runs it. A kubelet that does not offer `Get` is an error
    /// ([`PodResourcesError::method_not_offered`]), not an unknown pod.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<PodResources>, PodResourcesError> {
        self.spend().await;
        let result = self
            .client
            .clone()
            .get(GetPodResourcesRequest {
                pod_name: name.to_owned(),
                pod_namespace: namespace.to_owned(),
            })
            .await;
        match self.record(PodResourcesMethod::Get, result) {
            Ok(resp) => Ok(resp.pod_resources),
            Err(e) if e.method_not_offered() => Err(e),
            // The kubelet answers an unknown or terminated pod with a plain error (no NotFound
            // code before KEP-3695's GA), so anything but a transport or method failure means
            // "not there".
            Err(PodResourcesError::Call {
                code: tonic::Code::NotFound | tonic::Code::Unknown | tonic::Code::Internal,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the `Watch` stream (KEP-2043). Kubelets that do not offer it answer UNIMPLEMENTED.
    pub async fn watch(&self) -> Result<tonic::Streaming<WatchPodResourcesResponse>, PodResourcesError> {
        self.spend().await;
        let result = self.client.clone().watch(WatchPodResourcesRequest {}).await;
        self.record(PodResourcesMethod::Watch, result)
    }
}

/// The status message, or a hint when the server sent none (transport failures).
fn status_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut msg = status.message().to_owned();
    let mut source = status.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
        source = e.source();
    }
    if msg.is_empty() {
        msg = "no message".to_owned();
    }
    msg
}
