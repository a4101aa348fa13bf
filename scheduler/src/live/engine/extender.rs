//! Extender calls inside the loop (`numaplane-scheduler extender`). `filter` and `prioritize`
//! read the index, `bind` predicts again on the node kube-scheduler chose, assumes the
//! placement and writes the Binding with the allocation record, exactly as `run` does. They go
//! through the loop so the index keeps a single writer: a `bind` and the next `filter` see
//! each other's assumptions.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

use super::{Engine, Input, key_of};
use crate::{
    extender::{
        self, ExtenderArgs, ExtenderBindingArgs, ExtenderError, ExtenderFilterResult, ExtenderPreemptionArgs,
        ExtenderPreemptionResult, HostPriority,
    },
    live::{
        api::{BindError, Writer},
        metrics::{Families, KindLabels, Metrics},
    },
};

/// Binds a pod the Topology Manager does not align ([`extender::is_unaligned`]): the Binding
/// alone, no allocation record (there is nothing to record) and no assumption in the index
/// (it takes nothing from any NUMA zone). `t0` is when the call arrived.
pub(crate) async fn bind_unaligned(
    writer: &Writer,
    metrics: &Metrics,
    args: &ExtenderBindingArgs,
    t0: Instant,
) -> Result<(), String> {
    let result = writer
        .bind(
            &args.pod_namespace,
            &args.pod_name,
            Some(&args.pod_uid),
            &args.node,
            None,
        )
        .await;
    metrics.extender_unaligned_call("bind", result.is_ok(), t0.elapsed().as_secs_f64());
    match result {
        Ok(()) => {
            metrics.attempt("scheduled", PROFILE);
            Ok(())
        }
        Err(e) => {
            Families::count(&metrics.binding_errors, e.reason());
            metrics.attempt("error", PROFILE);
            let why = numaplane::error_chain(&e);
            tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, error = %why, "extender binding failed");
            Err(why)
        }
    }
}

/// Pods of `filter` calls are kept this long for the `bind` that follows (kube-scheduler's
/// bind comes within its own timeouts, well under a minute).
pub(crate) const POD_TTL: Duration = Duration::from_secs(600);
/// At most this many pods are kept; beyond, the oldest half goes (a `bind` whose pod is gone
/// fetches it from the API instead).
pub(crate) const POD_CAP: usize = 20_000;

/// Scheduler name under which extender outcomes are counted.
pub const PROFILE: &str = "extender";

/// One extender call, with where its answer goes.
#[derive(Debug)]
pub enum ExtenderCall {
    /// `filter`.
    Filter {
        /// The request.
        args: Box<ExtenderArgs>,
        /// The reply.
        reply: oneshot::Sender<ExtenderFilterResult>,
    },
    /// `prioritize`.
    Prioritize {
        /// The request.
        args: Box<ExtenderArgs>,
        /// The reply, or why there is none.
        reply: oneshot::Sender<Result<Vec<HostPriority>, String>>,
    },
    /// `preempt`.
    Preempt {
        /// The request.
        args: Box<ExtenderPreemptionArgs>,
        /// The reply, or why there is none.
        reply: oneshot::Sender<Result<ExtenderPreemptionResult, String>>,
    },
    /// `bind`.
    Bind {
        /// The request.
        args: ExtenderBindingArgs,
        /// The pod, when the caller fetched it (after [`BindReply::NeedPod`]).
        pod: Option<Box<Pod>>,
        /// The reply.
        reply: oneshot::Sender<BindReply>,
    },
}

/// The answer to a `bind` call.
#[derive(Debug)]
pub enum BindReply {
    /// No `filter` call brought this pod (another replica answered it, or it was evicted):
    /// fetch it and call again.
    NeedPod,
    /// Bound (`Ok`), or why not.
    Done(Result<(), String>),
}

/// A Binding written for an extender `bind`, back in the loop.
#[derive(Debug)]
pub struct ExtenderBindDone {
    key: String,
    /// The UID the Binding was pinned to: a late failure ends this pod's placement only.
    uid: Option<String>,
    node: String,
    result: Result<(), BindError>,
    reply: oneshot::Sender<BindReply>,
}

/// A pod seen in a `filter` call.
#[derive(Debug)]
pub struct SeenPod {
    pod: Box<Pod>,
    at: Instant,
}

impl Engine {
    fn extender_ready(&self) -> Result<(), ExtenderError> {
        if self.synced.len() < self.streams {
            Err(ExtenderError::NotReady {
                why: "caches not synced yet",
            })
        } else if !self.leading {
            Err(ExtenderError::NotReady {
                why: "this replica is not the leader",
            })
        } else {
            Ok(())
        }
    }

    pub(super) fn on_extender(&mut self, call: ExtenderCall) {
        match call {
            ExtenderCall::Filter { args, reply } => {
                let t0 = Instant::now();
                let result = self.extender_filter(&args);
                self.metrics
                    .extender_call("filter", result.error.is_empty(), t0.elapsed().as_secs_f64());
                let _ = reply.send(result);
            }
            ExtenderCall::Prioritize { args, reply } => {
                let t0 = Instant::now();
                let result = self.extender_prioritize(&args).map_err(|e| e.message());
                self.metrics
                    .extender_call("prioritize", result.is_ok(), t0.elapsed().as_secs_f64());
                let _ = reply.send(result);
            }
            ExtenderCall::Preempt { args, reply } => {
                let t0 = Instant::now();
                let result = self.extender_preempt(&args).map_err(|e| e.message());
                self.metrics
                    .extender_call("preempt", result.is_ok(), t0.elapsed().as_secs_f64());
                let _ = reply.send(result);
            }
            ExtenderCall::Bind { args, pod, reply } => self.extender_bind(args, pod, reply),
        }
    }

    fn model_request(&mut self, args: &ExtenderArgs) -> Result<(Pod, crate::pod::PodSpec), ExtenderError> {
        self.extender_ready()?;
        let pod = extender::pod_object(args)?;
        match extender::model_pod(&mut self.cluster.res, &pod) {
            Ok(spec) => Ok((pod, spec)),
            Err(e) => {
                self.metrics
                    .invalid_objects
                    .get_or_create(&KindLabels {
                        kind: "pod".to_owned(),
                    })
                    .inc();
                Err(e)
            }
        }
    }

    /// kube-scheduler's preemption candidates, kept where the victims make NUMA room.
    fn extender_preempt(
        &mut self,
        args: &ExtenderPreemptionArgs,
    ) -> Result<ExtenderPreemptionResult, ExtenderError> {
        let as_args = ExtenderArgs {
            pod: args.pod.clone(),
            ..ExtenderArgs::default()
        };
        let (pod, spec) = self.model_request(&as_args)?;
        let priority = crate::preempt::priority_of(&pod);
        Ok(extender::preempt(
            &self.cluster,
            &self.model,
            &spec,
            priority,
            args,
        ))
    }

    fn extender_filter(&mut self, args: &ExtenderArgs) -> ExtenderFilterResult {
        match self.model_request(args) {
            Ok((pod, spec)) => {
                let result = extender::filter(&self.cluster, &self.model, &spec, args);
                self.remember(pod);
                result
            }
            Err(e) => {
                tracing::warn!(error = %e.message(), "extender filter cannot be answered");
                ExtenderFilterResult::failure(&e)
            }
        }
    }

    fn extender_prioritize(&mut self, args: &ExtenderArgs) -> Result<Vec<HostPriority>, ExtenderError> {
        let (_, spec) = self.model_request(args).inspect_err(|e| {
            tracing::warn!(error = %e.message(), "extender prioritize cannot be answered");
        })?;
        Ok(extender::prioritize(&self.cluster, &self.model, &spec, args))
    }

    /// Keeps the pod of a `filter` call for its `bind` (which names the pod only).
    fn remember(&mut self, pod: Pod) {
        if self.extender_pods.len() >= POD_CAP {
            let mut ages: Vec<Instant> = self.extender_pods.values().map(|p| p.at).collect();
            ages.sort_unstable();
            if let Some(&median) = ages.get(ages.len() / 2) {
                self.extender_pods.retain(|_, p| p.at > median);
            }
        }
        self.extender_pods.insert(
            key_of(&pod),
            SeenPod {
                pod: Box::new(pod),
                at: Instant::now(),
            },
        );
    }

    /// Drops pods kept longer than [`POD_TTL`].
    pub(super) fn expire_extender_pods(&mut self) {
        let now = Instant::now();
        self.extender_pods
            .retain(|_, p| now.duration_since(p.at) < POD_TTL);
    }

    fn extender_bind(
        &mut self,
        args: ExtenderBindingArgs,
        pod: Option<Box<Pod>>,
        reply: oneshot::Sender<BindReply>,
    ) {
        let t0 = Instant::now();
        let done = |metrics: &Metrics, reply: oneshot::Sender<BindReply>, r: Result<(), String>| {
            metrics.extender_call("bind", r.is_ok(), t0.elapsed().as_secs_f64());
            let _ = reply.send(BindReply::Done(r));
        };
        if let Err(e) = self.extender_ready() {
            return done(&self.metrics, reply, Err(e.message()));
        }
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let same_uid = |p: &Pod| p.metadata.uid.as_deref().is_none_or(|u| u == args.pod_uid);
        let pod = match pod {
            Some(p) => p,
            None => match self.extender_pods.remove(&key) {
                Some(seen) if same_uid(&seen.pod) => seen.pod,
                _ => {
                    let _ = reply.send(BindReply::NeedPod);
                    return;
                }
            },
        };
        if !same_uid(&pod) {
            return done(
                &self.metrics,
                reply,
                Err(format!(
                    "pod {key} has UID {}, not {} as the bind request says: it was recreated",
                    pod.metadata.uid.as_deref().unwrap_or_default(),
                    args.pod_uid
                )),
            );
        }
        let spec = match extender::model_pod(&mut self.cluster.res, &pod) {
            Ok(s) => s,
            Err(e) => return done(&self.metrics, reply, Err(e.message())),
        };
        if !spec.topology_aligned(&self.cluster.res) {
            // Nothing NUMA-bound to place (its filter came through another replica, or before
            // a restart): a plain Binding, nothing assumed.
            let (writer, metrics) = (self.writer.clone(), self.metrics.clone());
            tokio::spawn(async move {
                let result = bind_unaligned(&writer, &metrics, &args, t0).await;
                let _ = reply.send(BindReply::Done(result));
            });
            return;
        }
        let decision = match self.cluster.decide_on(&self.model, &spec, &args.node) {
            Ok(d) => d,
            Err(verdict) => {
                self.metrics.attempt("unschedulable", PROFILE);
                let why = format!(
                    "node {} can no longer admit pod {key}: {}",
                    args.node,
                    verdict.reasons.join("; ")
                );
                tracing::info!(pod = %key, node = %args.node, reason = %why, "extender bind refused");
                return done(&self.metrics, reply, Err(why));
            }
        };
        let annotation = self.annotation_of(&key, &decision);
        self.cluster.assume_at(&spec, &decision, self.now_ms());
        let writer = self.writer.clone();
        let tx = self.tx.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let result = writer
                .bind(
                    &args.pod_namespace,
                    &args.pod_name,
                    Some(&args.pod_uid),
                    &args.node,
                    annotation.as_deref(),
                )
                .await;
            metrics.extender_call("bind", result.is_ok(), t0.elapsed().as_secs_f64());
            // The loop is gone only at shutdown; nothing to report to then.
            let _ = tx.send(Input::ExtenderBound(Box::new(ExtenderBindDone {
                key,
                uid: Some(args.pod_uid),
                node: args.node,
                result,
                reply,
            })));
        });
    }

    pub(super) fn on_extender_bound(&mut self, done: ExtenderBindDone) {
        let ExtenderBindDone {
            key,
            uid,
            node,
            result,
            reply,
        } = done;
        let outcome = match result {
            Ok(()) => {
                self.cluster
                    .binding_succeeded(&key, uid.as_deref(), self.now_ms());
                self.metrics.attempt("scheduled", PROFILE);
                tracing::debug!(pod = %key, node = %node, "bound for kube-scheduler");
                Ok(())
            }
            Err(e) => {
                Families::count(&self.metrics.binding_errors, e.reason());
                self.metrics.attempt("error", PROFILE);
                tracing::warn!(pod = %key, node = %node, error = %numaplane::error_chain(&e), "extender binding failed; placement dropped");
                self.binding_refused(&key, uid.as_deref(), &e);
                Err(numaplane::error_chain(&e))
            }
        };
        let _ = reply.send(BindReply::Done(outcome));
    }
}
