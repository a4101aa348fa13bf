//! The extender verbs over HTTP: `POST <prefix>/filter`, `<prefix>/prioritize`,
//! `<prefix>/preempt`, `<prefix>/bind`, where `<prefix>` is the path of kube-scheduler's `urlPrefix` (any, the
//! verb is the last segment). Bodies are decoded here; the answers come from the loop.
//!
//! As kube-scheduler expects, a request that cannot be answered still gets HTTP 200 with the
//! reply's `Error` field set (it then fails that attempt and retries the pod), except
//! `prioritize` and `preempt`, whose replies have no error field: they get a 500, which
//! kube-scheduler ignores for `prioritize` (no extender score for that pod) and, for an
//! `ignorable` extender, for `preempt` (its own candidates stand).
//!
//! With no `managedResources`, kube-scheduler asks about every pod. A pod the Topology Manager
//! does not align ([`extender::is_unaligned`]) is answered here at once, without the loop and
//! its index: every node passes, equal scores, its preemption candidates stand, and its
//! `bind` is a plain Binding. This also holds while the caches sync: the answer does not
//! depend on them.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot};
use warp::{Filter as _, http::StatusCode, path::FullPath};

use super::{
    api::Writer,
    engine::{BindReply, ExtenderCall, Input, POD_CAP, POD_TTL, bind_unaligned},
    metrics::Metrics,
    server::Extra,
};
use crate::extender::{self, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult};

/// Largest request body. `nodeCacheCapable: false` sends every candidate Node object (a few
/// KiB each): 5,000 nodes fit.
const MAX_BODY: u64 = 128 * 1024 * 1024;
/// Longest wait for the loop's answer; kube-scheduler's default `httpTimeout` is 30 s.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(25);

#[derive(Clone)]
struct Ctx {
    tx: mpsc::UnboundedSender<Input>,
    client: Client,
    writer: Writer,
    metrics: Arc<Metrics>,
    /// Unaligned pods of recent `filter` calls (`namespace/name` → UID and when), so their
    /// `bind` skips the loop too.
    unaligned: Arc<Mutex<SeenUnaligned>>,
}

/// `namespace/name` → the pod's UID and when its `filter` came.
type SeenUnaligned = HashMap<String, (Option<String>, Instant)>;

type Reply = Box<dyn warp::Reply>;

fn json<T: serde::Serialize>(body: &T, status: StatusCode) -> Reply {
    Box::new(warp::reply::with_status(warp::reply::json(body), status))
}

fn text(body: String, status: StatusCode) -> Reply {
    Box::new(warp::reply::with_status(body, status))
}

/// The extender routes, answered by the loop behind `tx` (or at once for unaligned pods);
/// `client` fetches a pod that `bind` names but no `filter` brought; `writer` binds unaligned
/// pods.
pub fn routes(
    tx: mpsc::UnboundedSender<Input>,
    client: Client,
    writer: Writer,
    metrics: Arc<Metrics>,
) -> Extra {
    let ctx = Ctx {
        tx,
        client,
        writer,
        metrics,
        unaligned: Arc::default(),
    };
    warp::post()
        .and(warp::path::full())
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .and_then(move |path: FullPath, body: Bytes| {
            let ctx = ctx.clone();
            async move { Ok::<Reply, Infallible>(ctx.handle(path.as_str(), &body).await) }
        })
        .boxed()
}

impl Ctx {
    async fn handle(&self, path: &str, body: &[u8]) -> Reply {
        match path.trim_end_matches('/').rsplit('/').next() {
            Some("filter") => self.filter(body).await,
            Some("prioritize") => self.prioritize(body).await,
            Some("bind") => self.bind(body).await,
            Some("preempt") => self.preempt(body).await,
            _ => text(
                format!("no extender verb at {path}: serving filter, prioritize, preempt, bind\n"),
                StatusCode::NOT_FOUND,
            ),
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> ExtenderCall) -> Result<T, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Input::Extender(make(reply)))
            .map_err(|_| "numaplane extender is shutting down".to_owned())?;
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err("numaplane extender is shutting down".to_owned()),
            Err(_) => Err(format!(
                "numaplane extender did not answer within {}s",
                ANSWER_TIMEOUT.as_secs()
            )),
        }
    }

    /// The request's pod when it is one the Topology Manager does not align.
    fn unaligned_pod(pod: Option<&serde_json::Value>) -> Option<Pod> {
        extender::decode_pod_value(pod)
            .ok()
            .filter(extender::is_unaligned)
    }

    /// Remembers an unaligned pod of a `filter` call for its `bind`.
    fn remember_unaligned(&self, pod: &Pod) {
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let now = Instant::now();
        let Ok(mut seen) = self.unaligned.lock() else {
            return;
        };
        if seen.len() >= POD_CAP {
            seen.retain(|_, (_, at)| now.duration_since(*at) < POD_TTL);
            if seen.len() >= POD_CAP {
                // Still full of fresh pods: their binds go through the loop instead.
                seen.clear();
            }
        }
        seen.insert(key, (pod.metadata.uid.clone(), now));
    }

    /// Whether `bind` names an unaligned pod a recent `filter` saw (same UID); forgets it.
    fn take_unaligned(&self, args: &ExtenderBindingArgs) -> bool {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let Ok(mut seen) = self.unaligned.lock() else {
            return false;
        };
        match seen.remove(&key) {
            Some((uid, at)) => at.elapsed() < POD_TTL && uid.as_deref().is_none_or(|u| u == args.pod_uid),
            None => false,
        }
    }

    async fn filter(&self, body: &[u8]) -> Reply {
        let t0 = Instant::now();
        let args = match extender::parse_args(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e.message(), "extender filter request rejected");
                self.metrics.extender_call("filter", false, 0.0);
                return json(&ExtenderFilterResult::failure(&e), StatusCode::OK);
            }
        };
        if let Some(pod) = Self::unaligned_pod(args.pod.as_ref()) {
            let result = extender::filter_unaligned(&args);
            self.remember_unaligned(&pod);
            self.metrics
                .extender_unaligned_call("filter", true, t0.elapsed().as_secs_f64());
            return json(&result, StatusCode::OK);
        }
        let result = self
            .ask(|reply| ExtenderCall::Filter {
                args: Box::new(args),
                reply,
            })
            .await
            .unwrap_or_else(|error| ExtenderFilterResult {
                error,
                ..ExtenderFilterResult::default()
            });
        json(&result, StatusCode::OK)
    }

    async fn prioritize(&self, body: &[u8]) -> Reply {
        let t0 = Instant::now();
        let args = match extender::parse_args(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e.message(), "extender prioritize request rejected");
                self.metrics.extender_call("prioritize", false, 0.0);
                return text(format!("{}\n", e.message()), StatusCode::BAD_REQUEST);
            }
        };
        if Self::unaligned_pod(args.pod.as_ref()).is_some() {
            let list = extender::prioritize_unaligned(&args);
            self.metrics
                .extender_unaligned_call("prioritize", true, t0.elapsed().as_secs_f64());
            return json(&list, StatusCode::OK);
        }
        let answer = self
            .ask(|reply| ExtenderCall::Prioritize {
                args: Box::new(args),
                reply,
            })
            .await;
        match answer {
            Ok(Ok(list)) => json(&list, StatusCode::OK),
            Ok(Err(e)) | Err(e) => text(format!("{e}\n"), StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    async fn preempt(&self, body: &[u8]) -> Reply {
        let t0 = Instant::now();
        let args = match extender::parse_preemption(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e.message(), "extender preempt request rejected");
                self.metrics.extender_call("preempt", false, 0.0);
                return text(format!("{}\n", e.message()), StatusCode::BAD_REQUEST);
            }
        };
        if Self::unaligned_pod(args.pod.as_ref()).is_some() {
            let result = extender::preempt_unaligned(&args);
            self.metrics
                .extender_unaligned_call("preempt", true, t0.elapsed().as_secs_f64());
            return json(&result, StatusCode::OK);
        }
        let answer = self
            .ask(|reply| ExtenderCall::Preempt {
                args: Box::new(args),
                reply,
            })
            .await;
        match answer {
            Ok(Ok(result)) => json(&result, StatusCode::OK),
            Ok(Err(e)) | Err(e) => text(format!("{e}\n"), StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    async fn bind(&self, body: &[u8]) -> Reply {
        let t0 = Instant::now();
        let args = match extender::parse_binding(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e.message(), "extender bind request rejected");
                self.metrics.extender_call("bind", false, 0.0);
                return json(&ExtenderBindingResult::failure(e.message()), StatusCode::OK);
            }
        };
        if self.take_unaligned(&args) {
            let reply = match bind_unaligned(&self.writer, &self.metrics, &args, t0).await {
                Ok(()) => ExtenderBindingResult::ok(),
                Err(e) => ExtenderBindingResult::failure(e),
            };
            return json(&reply, StatusCode::OK);
        }
        let result = match self.bind_once(&args, None).await {
            Ok(BindReply::NeedPod) => match self.fetch(&args).await {
                Ok(pod) => match self.bind_once(&args, Some(Box::new(pod))).await {
                    Ok(BindReply::Done(r)) => r,
                    Ok(BindReply::NeedPod) => Err("pod could not be modelled".to_owned()),
                    Err(e) => Err(e),
                },
                Err(e) => {
                    self.metrics.extender_call("bind", false, 0.0);
                    Err(e)
                }
            },
            Ok(BindReply::Done(r)) => r,
            Err(e) => Err(e),
        };
        let reply = match result {
            Ok(()) => ExtenderBindingResult::ok(),
            Err(e) => ExtenderBindingResult::failure(e),
        };
        json(&reply, StatusCode::OK)
    }

    async fn bind_once(
        &self,
        args: &ExtenderBindingArgs,
        pod: Option<Box<Pod>>,
    ) -> Result<BindReply, String> {
        self.ask(|reply| ExtenderCall::Bind {
            args: args.clone(),
            pod,
            reply,
        })
        .await
    }

    /// The pod a `bind` names, from the API server (no `filter` call of ours saw it).
    async fn fetch(&self, args: &ExtenderBindingArgs) -> Result<Pod, String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        api.get(&args.pod_name).await.map_err(|e| {
            format!(
                "fetching pod {}/{} to bind it: {}",
                args.pod_namespace,
                args.pod_name,
                numaplane::error_chain(&e)
            )
        })
    }
}
