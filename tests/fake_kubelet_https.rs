//! A fake of the kubelet's authenticated HTTPS API (port 10250), as much as the exporter reads
//! of it: `GET /configz`, answering `{"kubeletconfig": …}` like a real kubelet.
//!
//! TLS with a fixed certificate for `127.0.0.1` signed by a test CA (`tests/data/kubelet-tls`;
//! [`FakeKubeletHttps::ca_file`] for `--kubelet-ca-file`). Like kubeadm's self-signed kubelet
//! certificates, it is signed by no CA the agent trusts by default, so the default verification
//! fails against it. Every request is recorded with its bearer token; the real kubelet
//! authorizes `/configz` as `get` on `nodes/configz` (see [`crate::rbac::kubelet_attributes`]).
//! Answers can be made slow ([`FakeKubeletHttps::set_delay`]) or an error status.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject as _};

/// What `/configz` answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// 200 with these `KubeletConfiguration` fields under `kubeletconfig`.
    Config(Value),
    /// This status with this plain-text body, as the kubelet's authorizer answers (e.g. 403
    /// "Forbidden (user=…, verb=get, resource=nodes, subresource(s)=[configz])").
    Status(u16, String),
}

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct KubeletRequest {
    /// `GET`, …
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The bearer token of the `Authorization` header.
    pub bearer_token: Option<String>,
}

struct State {
    answer: Answer,
    delay: Duration,
    requests: Vec<KubeletRequest>,
}

/// The fake kubelet HTTPS API on `127.0.0.1:<port>`; stops when dropped.
pub struct FakeKubeletHttps {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

/// Errors starting the fake.
pub type FakeKubeletHttpsError = Box<dyn std::error::Error + Send + Sync>;

fn tls_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/kubelet-tls")
}

impl FakeKubeletHttps {
    /// Serves `answer` on a random port of 127.0.0.1.
    pub async fn start(answer: Answer) -> Result<Self, FakeKubeletHttpsError> {
        Self::start_on(0, answer).await
    }

    /// Serves `answer` on `port` of 127.0.0.1 (0: a random one): a test can start the kubelet
    /// late, on the port the agent was told.
    pub async fn start_on(port: u16, answer: Answer) -> Result<Self, FakeKubeletHttpsError> {
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(tls_dir().join("kubelet.crt"))?
            .collect::<Result<Vec<_>, _>>()?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(tls_dir().join("kubelet.key"))?;
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(certs, key)?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            answer,
            delay: Duration::ZERO,
            requests: Vec::new(),
        }));
        let task = tokio::spawn(serve(listener, acceptor, Arc::clone(&state)));
        Ok(Self { addr, state, task })
    }

    /// The CA that signed the fake's certificate, for `--kubelet-ca-file`.
    pub fn ca_file() -> PathBuf {
        tls_dir().join("ca.crt")
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its port, for `--kubelet-port`.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers `answer` from now on.
    pub fn set_answer(&self, answer: Answer) {
        self.lock().answer = answer;
    }

    /// Waits `delay` before each answer.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<KubeletRequest> {
        self.lock().requests.clone()
    }
}

impl Drop for FakeKubeletHttps {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection too.
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<Mutex<State>>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (acceptor, state) = (acceptor.clone(), Arc::clone(&state));
        connections.spawn(async move {
            // A client that refuses the certificate ends the handshake: nothing to serve.
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| handle(Arc::clone(&state), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let _ = body.collect().await;
    let bearer_token = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let (answer, delay) = {
        let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
        st.requests.push(KubeletRequest {
            method: parts.method.as_str().to_owned(),
            path: parts.uri.path().to_owned(),
            bearer_token,
        });
        (st.answer.clone(), st.delay)
    };
    tokio::time::sleep(delay).await;
    let (status, content_type, body) = match (parts.uri.path(), answer) {
        ("/configz", Answer::Config(config)) => (
            200,
            "application/json",
            json!({ "kubeletconfig": config }).to_string(),
        ),
        ("/configz", Answer::Status(code, text)) => (code, "text/plain; charset=utf-8", text),
        _ => (
            404,
            "text/plain; charset=utf-8",
            "404 page not found\n".to_owned(),
        ),
    };
    let response = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)));
    Ok(response.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}
