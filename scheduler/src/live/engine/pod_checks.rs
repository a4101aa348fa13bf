//! What the live loop does with a pending pod before deciding it: a gated pod is kept out of
//! the queue with its `PodScheduled=False, reason SchedulingGated` condition (written once, by
//! the leader, when the pod does not carry it yet), and a pod that sets fields the model does
//! not enforce gets one `UnsupportedConstraint` Warning event and its count in
//! `numaplane_scheduler_unsupported_constraints_total{field}` when first decided.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;

use super::Engine;
use crate::{gates, live::metrics::FieldLabels, unsupported};

impl Engine {
    /// Whether `pod` is gated. A gated pod leaves the queue (an update that removes its gates
    /// brings it back at once, as a new pod: no backoff) and, if it does not show the
    /// `SchedulingGated` condition, the leader writes it once per pod.
    pub(super) fn gated_pod(&mut self, key: &str, pod: &Pod) -> bool {
        if !gates::gated(pod) {
            self.gated_written.remove(key);
            return false;
        }
        self.pending.remove(key);
        self.queue.remove(key);
        let uid = pod.metadata.uid.clone();
        let written = gates::condition_set(pod) || self.gated_written.get(key) == Some(&uid);
        if !written && self.leading {
            self.gated_written.insert(key.to_owned(), uid);
            tracing::debug!(pod = %key, "scheduling gated");
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            self.writer.scheduling_gated(ns, name);
        }
        true
    }

    /// Warns once per pod (UID) of the fields it sets that the model does not enforce.
    pub(super) fn warn_unsupported(&mut self, key: &str) {
        let Some(p) = self.pending.get(key) else { return };
        if self.warned.get(key) == Some(&p.pod.metadata.uid) {
            return;
        }
        self.warned.insert(key.to_owned(), p.pod.metadata.uid.clone());
        let found = unsupported::detect(&p.pod);
        if found.is_empty() {
            return;
        }
        let message = unsupported::message(&found);
        tracing::info!(pod = %key, %message, "pod sets fields the model does not enforce");
        for u in &found {
            self.metrics
                .unsupported_constraints
                .get_or_create(&FieldLabels { field: u.field })
                .inc();
        }
        self.writer.event(
            &p.profile,
            &p.pod,
            EventType::Warning,
            unsupported::EVENT_REASON,
            "Scheduling",
            message,
        );
    }

    /// Forgets what was written or warned for a pod that left (bound, deleted, finished).
    pub(super) fn forget_pod_checks(&mut self, key: &str) {
        self.gated_written.remove(key);
        self.warned.remove(key);
    }
}
