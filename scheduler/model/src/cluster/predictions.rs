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
        self.keep(slot, generation, digest, Arc::clone(&placement));
        Ok(placement)
    }

    /// Keeps a prediction made elsewhere (the plain verdict's run), for [`Self::get_or`].
    pub(super) fn put(&self, slot: usize, generation: u64, digest: u64, placement: Placement) {
        self.keep(slot, generation, digest, Arc::new(placement));
    }

    fn keep(&self, slot: usize, generation: u64, digest: u64, placement: Arc<Placement>) {
        let Ok(mut memo) = self.0.try_lock() else {
            return;
        };
        if memo.len() <= slot {
            memo.resize_with(slot + 1, Vec::new);
        }
        if let Some(v) = memo.get_mut(slot) {
            // Predictions of an older state of the node are of no use any more.
            v.retain(|(g, _, _)| *g == generation);
            if v.iter().any(|(_, d, _)| *d == digest) {
                return;
            }
            if v.len() >= PER_NODE {
                v.remove(0);
            }
            v.push((generation, digest, placement));
        }
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

#[cfg(test)]
mod tests {
    use super::PredictionMemo;
    use crate::admission::Placement;

    fn placement(max_span: usize) -> Placement {
        Placement {
            pod_numa_nodes: None,
            containers: Vec::new(),
            max_span,
        }
    }

    #[test]
    fn a_prediction_kept_from_elsewhere_is_used_until_the_node_changes() {
        let memo = PredictionMemo::default();
        memo.put(3, 7, 42, placement(1));
        let fresh = |span| move || Ok::<_, ()>(placement(span));
        // Same node state and pod: the kept one, not a new prediction.
        assert_eq!(memo.get_or(3, 7, 42, fresh(2)).unwrap().max_span, 1);
        // Kept twice: the first stays.
        memo.put(3, 7, 42, placement(5));
        assert_eq!(memo.get_or(3, 7, 42, fresh(2)).unwrap().max_span, 1);
        // Another pod, another node, or the node changed: predicted again.
        assert_eq!(memo.get_or(3, 7, 43, fresh(2)).unwrap().max_span, 2);
        assert_eq!(memo.get_or(4, 7, 42, fresh(2)).unwrap().max_span, 2);
        assert_eq!(memo.get_or(3, 8, 42, fresh(4)).unwrap().max_span, 4);
        // The older state's predictions went with the change.
        assert_eq!(memo.get_or(3, 7, 42, fresh(6)).unwrap().max_span, 6);
    }
}
