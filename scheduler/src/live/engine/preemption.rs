//! The live side of preemption: when a pod fits nowhere, the model's choice of victims
//! ([`crate::cluster::Cluster::preempt`]) is carried out through the API (nomination,
//! `DisruptionTarget`, deletion, `Preempted` event), and the preemptor's hold keeps the room
//! for it until it is placed. While its hold stands (the victims leave the node's NRT only
//! when the exporter publishes again) it does not preempt again.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{Api, Client, runtime::watcher};
use tokio::{sync::mpsc, task::JoinSet};

use super::{Apply, Engine, InitBuffer, Input, Stream};
use crate::{live::eviction, preempt};

/// The streams of this module (what the engine waits for before scheduling).
pub const STREAMS: usize = 1;

/// Starts the PodDisruptionBudget watch (not in extender mode: kube-scheduler preempts there).
pub fn spawn_watches(tasks: &mut JoinSet<&'static str>, client: &Client, tx: &mpsc::UnboundedSender<Input>) {
    crate::live::forward(
        tasks,
        "PodDisruptionBudget watch",
        Api::<PodDisruptionBudget>::all(client.clone()),
        watcher::Config::default().any_semantic(),
        Stream::Budgets,
        tx.clone(),
        Input::Budget,
    );
}

impl Apply for PodDisruptionBudget {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Budgets(Vec::new())
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Budgets(v) => v.push(self),
            other => *other = InitBuffer::Budgets(vec![self]),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Budgets(v) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.apply_pdb(&self);
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        let key = format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or("default"),
            self.metadata.name.as_deref().unwrap_or_default()
        );
        e.cluster.delete_pdb(&key);
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.reset_pdbs(&all);
    }
}

/// What a failed decision led to.
pub(super) enum Outcome {
    /// Nothing: the pod may not preempt, or no eviction helps.
    None,
    /// Victims were chosen on `node`; their eviction is under way.
    Started {
        /// The nominated node.
        node: String,
        /// How many pods are evicted.
        victims: usize,
    },
    /// A hold stands: the pod waits for its victims' room on `node`.
    Waiting {
        /// The nominated node.
        node: String,
    },
}

impl Engine {
    /// Takes the hold of `key` before it is decided (its own reservation must not stand in
    /// its way); [`Self::after_unschedulable`] puts it back if the pod still does not fit.
    pub(super) fn take_hold(&mut self, key: &str) -> Option<crate::cluster::Hold> {
        self.cluster.release_hold(key)
    }

    /// After `key` fitted nowhere: keeps waiting on its hold, or preempts for it.
    pub(super) fn after_unschedulable(&mut self, key: &str, hold: Option<crate::cluster::Hold>) -> Outcome {
        let now = self.now_ms();
        let timeout = u64::try_from(self.cfg.assume_timeout.as_millis()).unwrap_or(u64::MAX);
        if let Some(h) = hold {
            if now.saturating_sub(h.since_ms) < timeout {
                let node = h.node.clone();
                self.cluster.restore_hold(key, h);
                self.count_attempt("waiting_for_victims");
                return Outcome::Waiting { node };
            }
            tracing::warn!(pod = %key, node = %h.node, "preemption hold expired: the node never showed room; preempting again if needed");
        }
        let Some(p) = self.pending.get(key) else {
            return Outcome::None;
        };
        let Some(spec) = p.spec.as_ref() else {
            return Outcome::None;
        };
        if !preempt::may_preempt(&p.pod) {
            return Outcome::None;
        }
        let priority = preempt::priority_of(&p.pod);
        // Nominated earlier (by this replica before a restart, or by another leader) and the
        // victims still terminating: their room is coming, preempting again would evict more.
        let nominated = p
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.clone())
            .filter(|n| !n.is_empty());
        if let Some(node) = nominated.filter(|n| self.cluster.victims_leaving(n, priority)) {
            self.count_attempt("waiting_for_victims");
            return Outcome::Waiting { node };
        }
        let Some(found) = self.cluster.preempt(&self.model, spec, priority) else {
            self.count_attempt("no_victims");
            return Outcome::None;
        };
        let spec = spec.clone();
        let preemptor = p.pod.clone();
        let profile = p.profile.clone();
        self.cluster.hold_for(&spec, &found, now);
        self.count_attempt("victims_chosen");
        self.metrics
            .preemption_victims
            .inc_by(u64::try_from(found.victims.len()).unwrap_or(u64::MAX));
        tracing::info!(
            pod = %key,
            node = %found.node,
            victims = ?found.victims.iter().map(|v| v.key.as_str()).collect::<Vec<_>>(),
            budget_violations = found.budget_violations,
            "preempting"
        );
        let writer = self.writer.clone();
        let metrics = self.metrics.clone();
        let node = found.node.clone();
        let victims = found.victims.clone();
        // Not joined, as the bind tasks: it ends on its own. A failed write is logged and counted,
        // and the hold's expiry brings a new attempt.
        tokio::spawn(async move {
            let ns = spec.namespace.clone();
            if let Err(e) = eviction::nominate(&writer, &ns, &spec.name, &node).await {
                metrics.status_patch_errors.inc();
                tracing::warn!(error = %numaplane::error_chain(&e), "cannot nominate");
            }
            for v in &victims {
                if let Err(e) = eviction::evict(&writer, &profile, &preemptor, &node, v).await {
                    metrics.eviction_errors.inc();
                    tracing::warn!(error = %numaplane::error_chain(&e), "cannot evict a preemption victim");
                }
            }
        });
        Outcome::Started {
            node: found.node,
            victims: found.victims.len(),
        }
    }

    fn count_attempt(&self, result: &'static str) {
        self.metrics
            .preemption_attempts
            .get_or_create(&crate::live::metrics::ResultLabels { result })
            .inc();
    }
}
