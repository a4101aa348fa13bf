//! The kubelet's effective configuration from its `/configz` endpoint: what the kubelet runs
//! with after its config file, its drop-in directory and its command-line flags are merged, on
//! every distribution (EKS, GKE, AKS, k3s and OpenShift keep the file elsewhere or have none).
//!
//! Two ways to reach it, both authenticated with the agent's own credentials (in a pod, its
//! ServiceAccount token, re-read as it rotates):
//! - **the node's kubelet** (`https://NODE_ADDRESS:10250/configz`), authorized by the kubelet
//!   through a SubjectAccessReview as `get` on `nodes/configz` (kubelets 1.33 and later; older
//!   ones, or the `KubeletFineGrainedAuthz` gate off, check `nodes/proxy`). Its serving
//!   certificate is verified against the cluster CA (or `--kubelet-ca-file`), as metrics-server
//!   does; kubeadm's default self-signed kubelet certificates need
//!   `--kubelet-insecure-skip-tls-verify` or `serverTLSBootstrap`.
//! - **the API server's node proxy** (`/api/v1/nodes/NODE/proxy/configz`), ordinary API server
//!   TLS, but authorized as `get` on `nodes/proxy`, which also lets a websocket `exec` into any
//!   container of any node through the kubelet: hence not the default.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::kubelet_config::{self, KubeletConfigError, ResourceManagerSettings};

/// The kubelet's default port for its authenticated HTTPS API.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;

/// Where `/configz` is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigzVia {
    /// The node's kubelet, https://NODE_ADDRESS:PORT/configz (RBAC `nodes/configz` get; kubelets
    /// before 1.33 check `nodes/proxy` get).
    Kubelet,
    /// The API server's node proxy, /api/v1/nodes/NODE_NAME/proxy/configz (RBAC `nodes/proxy`
    /// get, which also allows exec into the node's containers).
    ApiServer,
    /// Not read: only the kubelet config file, if any.
    Off,
}

/// How the agent checks the kubelet's serving certificate.
#[derive(Clone, Debug, Default)]
pub struct KubeletTls {
    /// CA bundle (PEM) that signed the kubelet serving certificates; default: the CA the agent
    /// trusts for the API server (in a pod, the ServiceAccount's `ca.crt`).
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate.
    pub insecure_skip_verify: bool,
}

/// Errors reading `/configz`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigzError {
    /// The kubelet's URL cannot be formed from the node address.
    #[error("bad kubelet URL {url:?}")]
    ParseUrl {
        /// The URL.
        url: String,
        /// Cause.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The HTTP client for the kubelet cannot be set up (e.g. an unreadable CA file).
    #[error("cannot set up the client for {url}")]
    BuildClient {
        /// The URL.
        url: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// No answer within the timeout.
    #[error("{url} did not answer within {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The request failed (connection, TLS, or an error status).
    #[error("cannot get {url}")]
    Get {
        /// The URL.
        url: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The answer is not a usable kubelet configuration.
    #[error("unusable answer from {url}")]
    Parse {
        /// The URL.
        url: String,
        /// Cause.
        #[source]
        source: KubeletConfigError,
    },
}

impl ConfigzError {
    /// A bounded label for metrics: what an operator has to fix.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ParseUrl { .. } | Self::BuildClient { .. } => "client",
            Self::Timeout { .. } => "timeout",
            Self::Get {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                401 | 403 => "forbidden",
                404 => "not_found",
                500..=599 => "unavailable",
                _ => "http",
            },
            Self::Get { source, .. } => {
                // kube wraps the TLS failure in hyper's connection error; its text is the only
                // stable thing to tell it from a refused connection.
                let chain = numaplane::error_chain(source).to_ascii_lowercase();
                if chain.contains("certificate") || chain.contains("tls") {
                    "tls"
                } else {
                    "unreachable"
                }
            }
            Self::Parse {
                source: KubeletConfigError::InvalidValue { .. },
                ..
            } => "invalid",
            Self::Parse { .. } => "parse",
        }
    }
}

/// Reads one node's `/configz`.
pub struct ConfigzClient {
    /// What to build the client from (the kubelet), or the API server client itself.
    target: Target,
    /// Request path.
    path: String,
    /// The full URL, for messages.
    url: String,
}

enum Target {
    /// The API server's client (already built).
    ApiServer(kube::Client),
    /// The kubelet: built on first use and again after a failure to build, so a CA file that
    /// appears later (a Secret mounted late) is picked up without a restart.
    Kubelet {
        config: Box<kube::Config>,
        client: Mutex<Option<kube::Client>>,
    },
}

impl ConfigzClient {
    /// Through the API server's node proxy.
    pub fn api_server(client: kube::Client, node: &str) -> Self {
        let path = format!("/api/v1/nodes/{node}/proxy/configz");
        Self {
            url: format!("the API server's {path}"),
            target: Target::ApiServer(client),
            path,
        }
    }

    /// Straight to the kubelet at `address:port` (an IP address or host name, as the downward
    /// API's `status.hostIP` gives it), with the API server config's credentials; `timeout`
    /// bounds the connection and the answer.
    pub fn kubelet(
        api: &kube::Config,
        scheme: &str,
        address: &str,
        port: u16,
        tls: &KubeletTls,
        timeout: Duration,
    ) -> Result<Self, ConfigzError> {
        let host = if address.contains(':') && !address.starts_with('[') {
            format!("[{address}]")
        } else {
            address.to_owned()
        };
        let base = format!("{scheme}://{host}:{port}");
        let mut config = api.clone();
        config.cluster_url = base.parse().map_err(|source| ConfigzError::ParseUrl {
            url: base.clone(),
            source,
        })?;
        if let Some(ca) = &tls.ca_file {
            // Verification goes to a verifier that re-reads this file (CA rotation); the API
            // server's CA bytes stay only to complete kube's TLS builder.
            config.root_cert_file = Some(ca.clone());
        }
        config.accept_invalid_certs = tls.insecure_skip_verify;
        // Settings meant for the API server do not apply to the node's own kubelet.
        config.tls_server_name = None;
        config.proxy_url = None;
        // One attempt per refresh: the caller retries at the next resync.
        config.default_retry = false;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        Ok(Self {
            url: format!("{base}/configz"),
            target: Target::Kubelet {
                config: Box::new(config),
                client: Mutex::new(None),
            },
            path: "/configz".to_owned(),
        })
    }

    /// The URL read, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn client(&self) -> Result<kube::Client, ConfigzError> {
        match &self.target {
            Target::ApiServer(c) => Ok(c.clone()),
            Target::Kubelet { config, client } => {
                let mut slot = client.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(c) = slot.as_ref() {
                    return Ok(c.clone());
                }
                let built = kube::Client::try_from((**config).clone()).map_err(|source| {
                    ConfigzError::BuildClient {
                        url: self.url.clone(),
                        source,
                    }
                })?;
                *slot = Some(built.clone());
                Ok(built)
            }
        }
    }

    /// Reads and checks the kubelet's configuration, giving up after `timeout`.
    pub async fn fetch(&self, timeout: Duration) -> Result<ResourceManagerSettings, ConfigzError> {
        let client = self.client()?;
        let request = http::Request::get(self.path.as_str())
            .body(Vec::new())
            .map_err(|e| ConfigzError::Get {
                url: self.url.clone(),
                source: kube::Error::HttpError(e),
            })?;
        let body = match tokio::time::timeout(timeout, client.request_text(request)).await {
            Ok(Ok(body)) => body,
            Ok(Err(source)) => {
                return Err(ConfigzError::Get {
                    url: self.url.clone(),
                    source,
                });
            }
            Err(_) => {
                return Err(ConfigzError::Timeout {
                    url: self.url.clone(),
                    timeout,
                });
            }
        };
        kubelet_config::parse_configz(&body, &self.url).map_err(|source| ConfigzError::Parse {
            url: self.url.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_what_to_fix() {
        let status = |code| {
            ConfigzError::Get {
                url: "u".into(),
                source: kube::Error::Api(
                    kube::core::Status::failure("denied", "Forbidden")
                        .with_code(code)
                        .boxed(),
                ),
            }
            .reason()
        };
        assert_eq!(status(403), "forbidden");
        assert_eq!(status(401), "forbidden");
        assert_eq!(status(404), "not_found");
        assert_eq!(status(503), "unavailable");
        assert_eq!(status(400), "http");
        let timeout = ConfigzError::Timeout {
            url: "u".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.reason(), "timeout");
    }

    #[test]
    fn ipv6_node_addresses_are_bracketed() {
        let api = kube::Config::new("https://api.example:6443".parse().unwrap());
        let c = ConfigzClient::kubelet(
            &api,
            "https",
            "fd00::5",
            10250,
            &KubeletTls::default(),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(c.url(), "https://[fd00::5]:10250/configz");
        let c = ConfigzClient::kubelet(
            &api,
            "https",
            "10.0.0.5",
            10250,
            &KubeletTls::default(),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(c.url(), "https://10.0.0.5:10250/configz");
        let err = ConfigzClient::kubelet(
            &api,
            "https",
            "bad host",
            10250,
            &KubeletTls::default(),
            Duration::from_secs(1),
        );
        assert!(matches!(err, Err(ConfigzError::ParseUrl { .. })));
    }
}
