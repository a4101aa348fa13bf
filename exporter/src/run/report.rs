//! What a scan reports besides the object: anomalies and unusable checkpoints, logged once.

use std::collections::BTreeSet;

use crate::accounting::AnomalyKind;
use crate::metrics::Metrics;
use crate::scan::Scan;

/// Logs each anomaly once per distinct detail and scan streak, with context.
pub(crate) fn log_anomalies(node: &str, scan: &Scan, seen: &mut BTreeSet<String>) {
    let mut now = BTreeSet::new();
    for a in &scan.accounting.anomalies {
        if seen.contains(&a.detail) {
            tracing::debug!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly (repeated)");
        } else if a.kind == AnomalyKind::UnalignedDevice {
            tracing::info!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly");
        } else {
            tracing::warn!(node, kind = %a.kind, detail = %a.detail, "accounting anomaly");
        }
        now.insert(a.detail.clone());
    }
    *seen = now;
}

/// Records where init containers' leftovers came from, and logs each unusable checkpoint once
/// per distinct problem (a metric counts every scan that met it).
pub(crate) fn note_init_held(node: &str, scan: &Scan, metrics: &Metrics, seen: &mut BTreeSet<String>) {
    metrics.record_held_sources(scan.held_sources);
    let mut now = BTreeSet::new();
    for e in &scan.checkpoint_errors {
        metrics.checkpoint_error(e);
        let text = e.to_string();
        if !seen.contains(&text) {
            tracing::warn!(
                node,
                file = e.file(),
                reason = e.kind(),
                error = %text,
                "kubelet checkpoint unusable; what init containers hold is derived from pod specs"
            );
        }
        now.insert(text);
    }
    *seen = now;
}
