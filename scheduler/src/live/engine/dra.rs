//! The live loop's side of Dynamic Resource Allocation: watches of DeviceClasses,
//! ResourceSlices and ResourceClaims feeding the index (apply, delete, relist as the other
//! watches), the claim writes a decision asks for, and the release of what an unschedulable
//! pod's claims were given. The PreBind writes themselves are in [`prebind`].

use std::collections::BTreeSet;
use std::time::Instant;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use crate::dra::slice::ResourceSlice as ModelSlice;
use kube::{
    Api, Client,
    runtime::{events::EventType, watcher},
};
use tokio::{sync::mpsc, task::JoinSet};

use super::{Apply, Engine, InitBuffer, Input, Stream};

/// The streams of this module (what the engine waits for before scheduling).
pub const STREAMS: usize = 3;

mod prebind;

pub use crate::live::claim_error::{ClaimError, FINALIZER};
pub use prebind::{
    ClaimWrite, FIELD_MANAGER, PodRef, Reserved, allocated_by_us, bind_with_claims,
    release_when_unschedulable, reserve_claim, unreserve, wait_binding_conditions,
};

/// A DRA watch event (boxed in [`Input`] as a whole).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum DraEvent {
    /// A DeviceClass event.
    Class(watcher::Event<DeviceClass>),
    /// A ResourceSlice event.
    Slice(watcher::Event<ResourceSlice>),
    /// A ResourceClaim event.
    Claim(watcher::Event<ResourceClaim>),
}

/// Objects of one DRA (re)list.
#[derive(Debug)]
pub enum Buffer {
    /// DeviceClasses.
    Classes(Vec<DeviceClass>),
    /// ResourceSlices.
    Slices(Vec<ResourceSlice>),
    /// ResourceClaims.
    Claims(Vec<ResourceClaim>),
}

/// The watch-error label of a DRA stream.
pub fn stream_label(stream: Stream) -> Option<&'static str> {
    match stream {
        Stream::DeviceClasses => Some("deviceclasses"),
        Stream::ResourceSlices => Some("resourceslices"),
        Stream::ResourceClaims => Some("resourceclaims"),
        _ => None,
    }
}

/// Starts the three DRA watches (not in extender mode: kube-scheduler allocates claims there).
pub fn spawn_watches(tasks: &mut JoinSet<&'static str>, client: &Client, tx: &mpsc::UnboundedSender<Input>) {
    let cfg = || watcher::Config::default().any_semantic();
    crate::live::forward(
        tasks,
        "DeviceClass watch",
        Api::<DeviceClass>::all(client.clone()),
        cfg(),
        Stream::DeviceClasses,
        tx.clone(),
        |ev| Input::Dra(Box::new(DraEvent::Class(ev))),
    );
    crate::live::forward(
        tasks,
        "ResourceSlice watch",
        Api::<ResourceSlice>::all(client.clone()),
        cfg(),
        Stream::ResourceSlices,
        tx.clone(),
        |ev| Input::Dra(Box::new(DraEvent::Slice(ev))),
    );
    crate::live::forward(
        tasks,
        "ResourceClaim watch",
        Api::<ResourceClaim>::all(client.clone()),
        cfg(),
        Stream::ResourceClaims,
        tx.clone(),
        |ev| Input::Dra(Box::new(DraEvent::Claim(ev))),
    );
}

impl Engine {
    /// Applies one DRA event.
    pub(super) fn on_dra(&mut self, ev: DraEvent) {
        match ev {
            DraEvent::Class(ev) => self.on_event(Stream::DeviceClasses, ev),
            DraEvent::Slice(ev) => self.on_event(Stream::ResourceSlices, ev),
            DraEvent::Claim(ev) => self.on_event(Stream::ResourceClaims, ev),
        }
    }

    /// The claims of a pending pod that its binding reserves, with the allocation each gets.
    pub(super) fn claim_writes(
        &self,
        namespace: &str,
        claims: &[crate::dra::state::ClaimAllocation],
    ) -> Vec<ClaimWrite> {
        let mut out: Vec<ClaimWrite> = Vec::new();
        for c in claims {
            if out
                .iter()
                .any(|w| w.claim.metadata.name.as_deref() == Some(c.name.as_str()))
            {
                continue;
            }
            if let Some(claim) = self.cluster.dra.claim(namespace, &c.name) {
                let mut claim = claim.clone();
                let allocate = self.cluster.dra.in_flight(namespace, &c.name)
                    || claim.status.as_ref().is_none_or(|s| s.allocation.is_none());
                // An allocation in flight (another pod's binding is writing it) is not the
                // API's yet: this binding writes it too, unless that one lands first.
                if self.cluster.dra.in_flight(namespace, &c.name)
                    && let Some(s) = claim.status.as_mut()
                {
                    s.allocation = None;
                }
                out.push(ClaimWrite {
                    claim,
                    allocation: c.allocation.clone(),
                    allocate,
                });
            }
        }
        out
    }

    /// An unschedulable pod: the claims this scheduler allocated that nobody else uses are
    /// given back (kube-scheduler's PostFilter), so their devices can serve other pods.
    pub(super) fn release_unschedulable_claims(&mut self, key: &str) {
        let Some(p) = self.pending.get(key) else { return };
        let Some(spec) = p.spec.as_ref() else { return };
        let uid = p.pod.metadata.uid.clone().unwrap_or_default();
        let ns = spec.namespace.clone();
        let release: Vec<Reserved> = spec
            .resource_claims
            .iter()
            .filter_map(|c| c.claim.as_deref())
            .filter(|name| !self.cluster.dra.in_flight(&ns, name))
            .filter_map(|name| self.cluster.dra.claim(&ns, name))
            .filter(|c| release_when_unschedulable(c, &uid))
            .filter_map(|c| c.metadata.name.clone())
            .map(|name| Reserved {
                name,
                allocated: true,
                appended: false,
                resource_version: 0,
            })
            .collect();
        if release.is_empty() {
            return;
        }
        let names: Vec<&str> = release.iter().map(|r| r.name.as_str()).collect();
        tracing::info!(pod = %key, claims = ?names, "unschedulable: giving back the claims allocated for it");
        let writer = self.writer.clone();
        let name = spec.name.clone();
        tokio::spawn(async move {
            let pod = PodRef {
                namespace: &ns,
                name: &name,
                uid: &uid,
            };
            unreserve(&writer, pod, &release).await;
        });
    }

    /// A claim is missing for a pending pod (the resourceclaim controller has not created it
    /// from its template yet, or the watch has not shown it): the reason, else `None`.
    pub(super) fn claims_missing(&self, spec: &crate::pod::PodSpec) -> Option<String> {
        if !self.cluster.dra.enabled() {
            return None;
        }
        spec.resource_claims
            .iter()
            .find_map(|c| match c.claim.as_deref() {
                None => Some(format!(
                    "waiting for the ResourceClaim of pod claim {} to be created from its template",
                    c.name
                )),
                Some(name) if c.from_template && self.cluster.dra.claim(&spec.namespace, name).is_none() => {
                    Some(format!(
                        "waiting for ResourceClaim {}/{name} to be seen",
                        spec.namespace
                    ))
                }
                Some(_) => None,
            })
    }

    /// Reports a binding's claim error where the user looks: a Warning event on the pod.
    pub(super) fn report_claim_error(
        &self,
        profile: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
        e: &ClaimError,
    ) {
        self.writer.event(
            profile,
            pod,
            EventType::Warning,
            "FailedScheduling",
            "Scheduling",
            format!(
                "running PreBind plugin \"DynamicResources\": {}",
                numaplane::error_chain(e)
            ),
        );
    }
}

impl Apply for DeviceClass {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Dra(Buffer::Classes(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Dra(Buffer::Classes(v)) => v.push(self),
            other => *other = InitBuffer::Dra(Buffer::Classes(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Dra(Buffer::Classes(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.dra.apply_class(self);
        e.dra_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            e.cluster.dra.delete_class(name);
        }
        e.dra_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.dra.reset_classes(all);
    }
}

impl Apply for ResourceSlice {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Dra(Buffer::Slices(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Dra(Buffer::Slices(v)) => v.push(self),
            other => *other = InitBuffer::Dra(Buffer::Slices(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Dra(Buffer::Slices(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        let slice = ModelSlice::from(self);
        e.check_slice_numa(&slice);
        e.publish_slices_numa_invalid();
        e.cluster.dra.apply_slice(slice);
        e.dra_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            e.cluster.dra.delete_slice(name);
            e.slices_numa_invalid.remove(name);
            e.publish_slices_numa_invalid();
        }
        e.dra_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        let names: BTreeSet<&str> = all.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
        e.slices_numa_invalid
            .retain(|name, _| names.contains(name.as_str()));
        let all: Vec<ModelSlice> = all.into_iter().map(ModelSlice::from).collect();
        for slice in &all {
            e.check_slice_numa(slice);
        }
        // Once per relist, not per slice: the gauge sums over every slice.
        e.publish_slices_numa_invalid();
        e.cluster.dra.set_slices(all);
    }
}

impl Apply for ResourceClaim {
    fn empty_buffer() -> InitBuffer {
        InitBuffer::Dra(Buffer::Claims(Vec::new()))
    }
    fn buffer(self, buffer: &mut InitBuffer) {
        match buffer {
            InitBuffer::Dra(Buffer::Claims(v)) => v.push(self),
            other => *other = InitBuffer::Dra(Buffer::Claims(vec![self])),
        }
    }
    fn take_buffer(buffer: InitBuffer) -> Vec<Self> {
        match buffer {
            InitBuffer::Dra(Buffer::Claims(v)) => v,
            _ => Vec::new(),
        }
    }
    fn apply(self, e: &mut Engine, _: Stream) {
        e.cluster.dra.apply_claim(self);
        e.dra_changed();
    }
    fn delete(self, e: &mut Engine, _: Stream) {
        if let Some(name) = self.metadata.name.as_deref() {
            let ns = self.metadata.namespace.as_deref().unwrap_or("default");
            e.cluster.dra.delete_claim(ns, name);
        }
        e.dra_changed();
    }
    fn reset(e: &mut Engine, _: Stream, all: Vec<Self>) {
        e.cluster.dra.reset_claims(all);
    }
}

impl Engine {
    /// A class, slice or claim changed: pods waiting on them may fit now (a pod waiting for
    /// its claim to be created included).
    fn dra_changed(&mut self) {
        self.queue.cluster_changed(Instant::now());
    }

    /// Logs the devices of `slice` whose NUMA or PCI address attribute is malformed when they differ from what
    /// the slice had before, and records them for the gauge
    /// ([`Self::publish_slices_numa_invalid`]). The allocation itself treats them as devices
    /// without NUMA node.
    fn check_slice_numa(&mut self, slice: &ModelSlice) {
        let Some(name) = slice.metadata.name.as_deref() else {
            return;
        };
        let errors = crate::dra::numa::invalid_device_numa(slice, &self.model.dra_numa.driver_attributes);
        let now: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let before = self.slices_numa_invalid.get(name).map_or(&[][..], Vec::as_slice);
        if now.as_slice() != before {
            for message in &now {
                tracing::warn!(
                    resource_slice = name,
                    driver = %slice.spec.driver,
                    node = slice.spec.node_name.as_deref().unwrap_or_default(),
                    error = %message,
                    "malformed NUMA or PCI address attribute: the device is allocated as one without NUMA node"
                );
            }
        }
        if now.is_empty() {
            self.slices_numa_invalid.remove(name);
        } else {
            self.slices_numa_invalid.insert(name.to_owned(), now);
        }
    }

    fn publish_slices_numa_invalid(&self) {
        let devices: usize = self.slices_numa_invalid.values().map(Vec::len).sum();
        self.metrics
            .dra_devices_numa_invalid
            .set(i64::try_from(devices).unwrap_or(i64::MAX));
    }
}
