//! A pod's derived requests, computed once per scheduling decision and passed down to node fit,
//! the admission prediction and scoring, which otherwise rebuild them for every node evaluated.

use crate::{
    pod::{ContainerSpec, PodSpec, Qos},
    resources::{CPU, PODS, ResList},
};
use numaplane::allocation::ContainerKind;

/// One request unit the kubelet's Topology Manager admits: a container, or the whole pod in pod
/// scope.
#[derive(Clone, Debug)]
pub struct Unit<'a> {
    /// The container (`None` for the pod-scope unit).
    pub container: Option<&'a ContainerSpec>,
    /// Init, sidecar or app container (`App` for the pod-scope unit).
    pub kind: ContainerKind,
    /// The pod's QoS class.
    pub qos: Qos,
    /// What the unit requests.
    pub request: ResList,
    /// Whole CPUs the static CPU manager grants exclusively if the node runs it: a Guaranteed
    /// pod and a whole, positive CPU request (§3.1 eligibility).
    pub whole_cpus: Option<i64>,
    /// Whether the static CPU and memory managers serve the unit at all. Not for a pod with
    /// pod-level resources: with v1.36's default gates (`PodLevelResourceManagers` is alpha and
    /// off) the static CPU policy allocates it no exclusive CPUs and the static memory policy no
    /// memory, and both give the Topology Manager no hint for it
    /// (`pkg/kubelet/cm/cpumanager/policy_static.go`, `pkg/kubelet/cm/memorymanager/policy_static.go`);
    /// devices are still aligned.
    pub managed: bool,
}

impl<'a> Unit<'a> {
    /// A unit of `kind` requesting `request` in a pod of class `qos`.
    pub fn new(
        container: Option<&'a ContainerSpec>,
        kind: ContainerKind,
        request: ResList,
        qos: Qos,
    ) -> Self {
        let cpu = request.get(CPU);
        let whole_cpus = (qos == Qos::Guaranteed && cpu > 0 && cpu % 1000 == 0).then_some(cpu / 1000);
        Unit {
            container,
            kind,
            qos,
            request,
            whole_cpus,
            managed: true,
        }
    }

    /// The unit of a pod the CPU and memory managers leave alone (see [`Self::managed`]).
    pub fn unmanaged(mut self) -> Self {
        self.whole_cpus = None;
        self.managed = false;
        self
    }

    /// The container's name (empty for the pod-scope unit).
    pub fn name(&self) -> &str {
        self.container.map_or("", |c| c.name.as_str())
    }
}

/// A pod with everything the decision derives from it, computed once.
#[derive(Clone, Debug)]
pub struct PreparedPod<'a> {
    /// The pod.
    pub spec: &'a PodSpec,
    /// QoS class.
    pub qos: Qos,
    /// Effective request with overhead, as kube-scheduler computes it.
    pub effective: ResList,
    /// What node fit checks: the effective request plus one pod.
    pub fit_request: ResList,
    /// The kubelet's pod-level request (pod scope): the effective request without overhead.
    pub pod_unit: Unit<'a>,
    /// Containers in the kubelet's admission order: init containers (sidecars included), then
    /// app containers.
    pub containers: Vec<Unit<'a>>,
    /// What the pod's volumes allow (set by the cluster index, which knows the
    /// claims; none when prepared without it).
    pub volumes: crate::volume_binding::VolumeFilter,
}

impl<'a> PreparedPod<'a> {
    /// Derives the requests of `spec`.
    pub fn new(spec: &'a PodSpec) -> Self {
        let effective = spec.effective_request();
        let mut fit_request = effective.clone();
        fit_request.set(PODS, 1);
        let mut pod_request = effective.clone();
        // The kubelet's pod-level requests do not include overhead.
        for (id, v) in spec.overhead.iter() {
            pod_request.add(id, -v);
        }
        let containers: Vec<Unit<'a>> = spec
            .init_containers
            .iter()
            .map(|c| {
                let kind = if c.sidecar {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                };
                (c, kind)
            })
            .chain(spec.containers.iter().map(|c| (c, ContainerKind::App)))
            .map(|(c, kind)| {
                let u = Unit::new(Some(c), kind, c.requests.clone(), spec.qos);
                if spec.pod_level { u.unmanaged() } else { u }
            })
            .collect();
        let mut pod_unit = Unit::new(None, ContainerKind::App, pod_request, spec.qos);
        pod_unit.whole_cpus = pod_whole_cpus(&containers);
        if spec.pod_level {
            pod_unit = pod_unit.unmanaged();
        }
        PreparedPod {
            spec,
            qos: spec.qos,
            effective,
            fit_request,
            pod_unit,
            containers,
            volumes: crate::volume_binding::VolumeFilter::None,
        }
    }
}

/// The CPU manager's pod-level request (`podGuaranteedCPUs`, §2.7): the pod-level formula over
/// each container's exclusive CPUs, where a container without a whole CPU request counts 0 (so
/// a Guaranteed pod of 1.5 + 0.5 CPUs asks for no exclusive CPUs, not 2).
fn pod_whole_cpus(containers: &[Unit<'_>]) -> Option<i64> {
    let (mut sidecars, mut init_max, mut apps) = (0i64, 0i64, 0i64);
    for u in containers {
        let cpus = u.whole_cpus.unwrap_or(0);
        match u.kind {
            ContainerKind::Sidecar => sidecars = sidecars.saturating_add(cpus),
            ContainerKind::Init => init_max = init_max.max(sidecars.saturating_add(cpus)),
            ContainerKind::App => apps = apps.saturating_add(cpus),
        }
    }
    let cpus = init_max.max(apps.saturating_add(sidecars));
    (cpus > 0).then_some(cpus)
}
