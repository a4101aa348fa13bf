//! The CPU prediction of a pod on a node, kept while the node is unchanged: a decision with
//! claims predicts a node once for its search and the explanation of its failure, and pods of
//! one shape and the same container names (replicas, a retry, other claims) share it.

use std::sync::{Arc, Mutex};

use crate::admission::Placement;

/// Predictions kept per node; the oldest goes beyond.
const PER_NODE: usize = 8;

/// A kept prediction: the node's generation, the pod's digest, the prediction.
type Kept = (u64, u64, Arc<Placement>);

/// By node slot, the predictions kept.
#[derive(Default)]
pub(super) struct PredictionMemo(Mutex<Vec<Vec<Kept>>>);

impl PredictionMemo {
    /// The prediction for the pod of `digest` on the node in `slot` at `generation`, made by
    /// `predict` when none is kept (not kept when it fails: the NUMA filter refuses the node).
    /// Without the lock (another thread holds it), `predict` alone.
    pub(super) fn get_or<E>(
        &self,
        slot: usize,
        generation: u64,
        digest: u64,
        predict: impl FnOnce() -> Result<Placement, E>,
    ) -> Result<Arc<Placement>, E> {
        let kept = self.0.try_lock().ok().and_then(|memo| {
            memo.get(slot)?
                .iter()
                .find(|(g, d, _)| *g == generation && *d == digest)
                .map(|(_, _, p)| Arc::clone(p))
        });
        if let Some(p) = kept {
            return Ok(p);
        }
        let placement = Arc::new(predict()?);
        if let Ok(mut memo) = self.0.try_lock() {
            if memo.len() <= slot {
                memo.resize_with(slot + 1, Vec::new);
            }
            if let Some(v) = memo.get_mut(slot) {
                // Predictions of an older state of the node are of no use any more.
                v.retain(|(g, _, _)| *g == generation);
                if v.len() >= PER_NODE {
                    v.remove(0);
                }
                v.push((generation, digest, Arc::clone(&placement)));
            }
        }
        Ok(placement)
    }
}

impl Clone for PredictionMemo {
    /// A clone starts empty, which is always valid.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for PredictionMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PredictionMemo")
    }
}
