//! The live loop's side of [`crate::volume_binding`]: watches of PersistentVolumeClaims,
//! PersistentVolumes, StorageClasses and CSINodes (attach limits) feeding the index (apply, delete, relist as the other
//! watches), and the Binding that first writes each unbound `WaitForFirstConsumer` claim's
//! selected node (kube-scheduler's VolumeBinding PreBind): a failed write is a failed Binding
//! (retried with backoff, the placement and the assumed selected node forgotten).

use std::time::Instant;

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass},
};
use kube::{Api, Client, runtime::watcher};
use tokio::{sync::mpsc, task::JoinSet};

use super::{Apply, Engine, InitBuffer, Input, Stream};
use crate::live::api::{BindError, Writer};

/// The streams of this module (what the engine waits for before scheduling).
pub const STREAMS: usize = 4;

/// A storage watch event (boxed in [`Input`] as a whole, so its variants' sizes do not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum StorageEvent {
    /// A PersistentVolumeClaim event.
    Claim(watcher::Event<PersistentVolumeClaim>),
    /// A PersistentVolume event.
    Volume(watcher::Event<PersistentVolume>),
    /// A StorageClass event.
    Class(watcher::Event<StorageClass>),
    /// A CSINode event.
    CsiNode(watcher::Event<CSINode>),
}

/// Objects of one storage (re)list.
#[derive(Debug)]
pub enum Buffer {
    /// Claims.
    Claims(Vec<PersistentVolumeClaim>),
    /// Volumes.
    Volumes(Vec<PersistentVolume>),
    /// Classes.
    Classes(Vec<StorageClass>),
    /// CSINodes.
    CsiNodes(Vec<CSINode>),
}

/// The watch-error label of a storage stream.
pub fn stream_label(stream: Stream) -> Option<&'static str> {
    match stream {
        Stream::Claims => Some("persistentvolumeclaims"),
        Stream::Volumes => Some("persistentvolumes"),
        Stream::Classes => Some("storageclasses"),
        Stream::CsiNodes => Some("csinodes"),
        _ => None,
    }
}

/// Starts the four storage watches (not in extender mode: kube-scheduler binds volumes there).
pub fn spawn_watches(tasks: &mut JoinSet<&'static str>, client: &Client, tx: &mpsc::UnboundedSender<Input>) {
    let cfg = || watcher::Config::default().any_semantic();
    crate::live::forward(
        tasks,
        "PersistentVolumeClaim watch",
        Api::<PersistentVolumeClaim>::all(client.clone()),
        cfg(),
        Stream::Claims,
        tx.clone(),
        |ev| Input::Storage(Box::new(StorageEvent::Claim(ev))),
    );
    crate::live::forward(
        tasks,
        "PersistentVolume watch",
        Api::<PersistentVolume>::all(client.clone()),
        cfg(),
        Stream::Volumes,
        tx.clone(),
        |ev| Input::Storage(Box::new(StorageEvent::Volume(ev))),
    );
    crate::live::forward(
        tasks,
        "StorageClass watch",
        Api::<StorageClass>::all(client.clone()),
        cfg(),
        Stream::Classes,
        tx.clone(),
        |ev| Input::Storage(Box::new(StorageEvent::Class(ev))),
    );
    crate::live::forward(
        tasks,
        "CSINode watch",
        Api::<CSINode>::all(client.clone()),
        cfg(),
        Stream::CsiNodes,
        tx.clone(),
        |ev| Input::Storage(Box::new(StorageEvent::CsiNode(ev))),
    );
}

impl Engine {
    /// Applies one storage event.
    pub(super) fn on_storage(&mut self, ev: StorageEvent) {
        match ev {
            StorageEvent::Claim(ev) => self.on_event(Stream::Claims, ev),
            StorageEvent::Volume(ev) => self.on_event(Stream::Volumes, ev),
            StorageEvent::Class(ev) => self.on_event(Stream::Classes, ev),
            StorageEvent::CsiNode(ev) => self.on_event(Stream::CsiNodes, ev),
        }
    }

    /// A claim, volume, class or CSINode changed: pods waiting on them may fit now.
    fn storage_changed(&mut self) {
        self.queue.cluster_changed(Instant::now());
    }
}

/// Writes the selected node on each of `claims`, then POSTs the Binding; the first failed write
/// fails the whole Binding (not sent).
#[allow(clippy::too_many_arguments)]
pub async fn bind_with_volumes(
    writer: &Writer,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    node: &str,
    annotation: Option<&str>,
    claims: &[String],
) -> Result<(), BindError> {
    for claim in claims {
        writer
            .select_node(namespace, claim, node)
            .await
            .map_err(|source| BindError::SelectNode {
                pod: format!("{namespace}/{name}"),
                claim: claim.clone(),
                source,
            })?;
    }
    writer.bind(namespace, name, uid, node, annotation).await
}

impl Apply for PersistentVolumeClaim {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Storage(Buffer::Claims(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Storage(Buffer::Claims(v)) => v.push(self),
            other => *other = InitBuffer::Storage(Buffer::Claims(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Storage(Buffer::Claims(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.volumes.apply_claim(&self);
        e.storage_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            let ns = self.metadata.namespace.as_deref().unwrap_or("default");
            e.cluster.volumes.delete_claim(ns, name);
        }
        e.storage_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.volumes.reset_claims(&all);
    }
}

impl Apply for PersistentVolume {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Storage(Buffer::Volumes(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Storage(Buffer::Volumes(v)) => v.push(self),
            other => *other = InitBuffer::Storage(Buffer::Volumes(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Storage(Buffer::Volumes(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.volumes.apply_volume(&self);
        e.storage_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            e.cluster.volumes.delete_volume(name);
        }
        e.storage_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.volumes.reset_volumes(&all);
    }
}

impl Apply for StorageClass {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Storage(Buffer::Classes(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Storage(Buffer::Classes(v)) => v.push(self),
            other => *other = InitBuffer::Storage(Buffer::Classes(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Storage(Buffer::Classes(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.volumes.apply_class(&self);
        e.storage_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            e.cluster.volumes.delete_class(name);
        }
        e.storage_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.volumes.reset_classes(&all);
    }
}

impl Apply for CSINode {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Storage(Buffer::CsiNodes(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Storage(Buffer::CsiNodes(v)) => v.push(self),
            other => *other = InitBuffer::Storage(Buffer::CsiNodes(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Storage(Buffer::CsiNodes(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.volumes.apply_csi_node(&self);
        e.storage_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            e.cluster.volumes.delete_csi_node(name);
        }
        e.storage_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.volumes.reset_csi_nodes(&all);
    }
}
