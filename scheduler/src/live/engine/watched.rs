//! What each watched kind does to the loop's state: the relist buffer that resets the index in
//! one step, and the apply/delete/reset of Nodes, NRTs, pods and Namespaces (the storage kinds
//! and PodDisruptionBudgets are in their own modules).

use super::*;

/// Objects of one (re)list, held until the list is complete so the index is
/// reset in one step; one variant per kind so nothing is re-encoded or lost.
#[derive(Debug)]
pub enum InitBuffer {
    /// Nodes.
    Nodes(Vec<Node>),
    /// NRTs.
    Nrts(Vec<NodeResourceTopology>),
    /// Pods (bound or pending).
    Pods(Vec<Pod>),
    /// Claims, volumes or classes.
    Storage(volumes::Buffer),
    /// DeviceClasses, ResourceSlices or ResourceClaims.
    Dra(dra::Buffer),
    /// PodDisruptionBudgets.
    Budgets(Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>),
    /// Namespaces.
    Namespaces(Vec<k8s_openapi::api::core::v1::Namespace>),
}

// Namespace labels feed the constraint index; a change may let pods fit.
impl Apply for k8s_openapi::api::core::v1::Namespace {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Namespaces(Vec::new())
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Namespaces(v) => v.push(self),
            other => *other = InitBuffer::Namespaces(vec![self]),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Namespaces(v) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.apply_namespace(&self);
        e.queue.cluster_changed(Instant::now());
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(n) = self.metadata.name.as_deref() {
            e.cluster.delete_namespace(n);
        }
        e.queue.cluster_changed(Instant::now());
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.reset_namespaces(&all);
    }
}

/// How a watched kind changes the loop's state.
pub trait Apply: Sized {
    /// An empty relist buffer for this kind.
    fn empty_buffer() -> InitBuffer;
    /// Adds one listed object to the buffer.
    fn buffer(self, buffer: &mut InitBuffer);
    /// The listed objects (none if the buffer holds another kind).
    fn take_buffer(buffer: InitBuffer) -> Vec<Self>;
    /// An added or modified object.
    fn apply(self, e: &mut Engine, stream: Stream);
    /// A deleted object.
    fn delete(self, e: &mut Engine, stream: Stream);
    /// The complete list after a (re)list.
    fn reset(e: &mut Engine, stream: Stream, all: Vec<Self>);
}

impl Apply for Node {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Nodes(Vec::new())
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Nodes(v) => v.push(self),
            other => *other = InitBuffer::Nodes(vec![self]),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Nodes(v) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        if let Err(err) = e.cluster.apply_node(&self) {
            e.cluster.anomalies.invalid_nodes += 1;
            tracing::warn!(error = %numaplane::error_chain(&err), "node cannot be indexed");
        }
        e.queue.cluster_changed(Instant::now());
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(n) = self.metadata.name.as_deref() {
            e.nrt_behind.remove(n);
            e.cluster.delete_node(n);
        }
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.reset_nodes(&all);
    }
}

impl Apply for NodeResourceTopology {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Nrts(Vec::new())
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Nrts(v) => v.push(self),
            other => *other = InitBuffer::Nrts(vec![self]),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Nrts(v) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        if let Some(n) = self.metadata.name.as_deref() {
            e.nrt_behind.remove(n);
        }
        if let Err(err) = e.cluster.apply_nrt(&self) {
            tracing::warn!(
                nrt = self.metadata.name.as_deref().unwrap_or_default(),
                error = %numaplane::error_chain(&err),
                "NodeResourceTopology is invalid; its node is rejected until it is fixed"
            );
        }
        e.queue.cluster_changed(Instant::now());
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(n) = self.metadata.name.as_deref() {
            e.nrt_behind.remove(n);
            e.cluster.delete_nrt(n);
        }
        e.queue.cluster_changed(Instant::now());
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.reset_nrts(&all);
    }
}

/// Whether `pod` is bound to a node.
fn bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

impl Apply for Pod {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Pods(Vec::new())
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Pods(v) => v.push(self),
            other => *other = InitBuffer::Pods(vec![self]),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Pods(v) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, stream: Stream) {
        match stream {
            Stream::Pods => match e.served_unbound(&self) {
                Some(i) => e.apply_pending(i, self),
                // Bound: the index's; an unbound pod of another scheduler: nobody's here.
                None if bound(&self) => e.apply_bound(&self),
                None => {}
            },
            _ => e.apply_bound(&self),
        }
    }
    fn delete(self, e: &mut Engine, stream: Stream) {
        match stream {
            Stream::Pods if !bound(&self) => {
                let key = key_of(&self);
                if e.pending.contains_key(&key) {
                    e.drop_pending(&key);
                }
            }
            _ => e.delete_bound(&self),
        }
    }
    fn reset(e: &mut Engine, stream: Stream, all: Vec<Self>) {
        let (bound_pods, unbound): (Vec<Pod>, Vec<Pod>) = all.into_iter().partition(bound);
        if stream == Stream::Pods {
            let mut per_name: Vec<Vec<Pod>> = vec![Vec::new(); e.cfg.scheduler_names.len()];
            for p in unbound {
                if let Some(i) = e.served_unbound(&p)
                    && let Some(list) = per_name.get_mut(i)
                {
                    list.push(p);
                }
            }
            for (i, pods) in per_name.into_iter().enumerate() {
                e.reset_pending(i, pods);
            }
        }
        let all = bound_pods;
        let listed_from = e.list_started.get(&stream).copied().unwrap_or(0);
        for p in &all {
            if let Some(uid) = e.superseded.remove(&key_of(p)) {
                e.cluster.forget(&key_of(p), uid.as_deref());
            }
        }
        let known: Vec<bool> = all.iter().map(|p| e.known_bound(p)).collect();
        e.cluster.reset_pods(&all, listed_from);
        for (p, known_here) in all.iter().zip(known) {
            e.apply_bound_known(p, known_here);
        }
    }
}
