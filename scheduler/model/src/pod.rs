//! The scheduler's plain view of a pod: per-container requests as interned amounts, QoS class,
//! and the fields node fit needs. Built from a k8s `Pod`; invalid quantities are typed errors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, NodeSelector, Pod, Toleration};
use numaplane::quantity::Quantity;

use crate::resources::{CPU, MEMORY, ResId, ResKind, ResList, Resources};

/// Pod QoS class, computed with the standard Kubernetes rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Qos {
    /// Every container has cpu and memory limits equal to requests.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No cpu or memory requests or limits anywhere.
    BestEffort,
}

/// One container's resources.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Requests; a resource with only a limit uses the limit, as API defaulting would.
    pub requests: ResList,
    /// Restartable init container (sidecar, `restartPolicy: Always`).
    pub sidecar: bool,
    /// CPU request is a whole number of cores (exclusive CPUs for Guaranteed pods).
    pub integer_cpu: bool,
    /// `resources.claims`: the pod claims (and optionally one request of each) it uses.
    pub claims: Vec<ContainerClaim>,
}

pub use crate::dra::state::ContainerClaim;

/// Plain pod model.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSpec {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, if any.
    pub uid: Option<String>,
    /// QoS class.
    pub qos: Qos,
    /// Init containers in order (including sidecars).
    pub init_containers: Vec<ContainerSpec>,
    /// App containers in order.
    pub containers: Vec<ContainerSpec>,
    /// `spec.overhead`.
    pub overhead: ResList,
    /// Pod-level `spec.resources` sets a supported resource (cpu, memory, hugepages): the
    /// pod's requests of those are the pod-level ones, and v1.36's CPU and memory managers give
    /// it no exclusive CPUs or memory (see [`PodSpec::pod_requests`]).
    pub pod_level: bool,
    /// Pod-level requests of the supported resources, with the API's defaulting from pod-level
    /// limits applied (`pkg/apis/core/v1/defaults.go` `defaultPodRequests`); they replace the
    /// containers' sum for those resources in [`PodSpec::effective_request`], as
    /// component-helpers' `PodRequests` does.
    pub pod_requests: ResList,
    /// `spec.nodeName` if bound or pinned.
    pub node_name: Option<String>,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity.
    pub required_affinity: Option<NodeSelector>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// `spec.schedulerName`.
    pub scheduler_name: Option<String>,
    /// Phase is Succeeded or Failed.
    pub terminal: bool,
    /// The PersistentVolumeClaims its volumes use.
    pub claims: Vec<ClaimRef>,
    /// What kube-scheduler's constraint plugins read, parsed once.
    pub facts: std::sync::Arc<crate::pod_facts::PodFacts>,
    /// `spec.resourceClaims`, resolved to ResourceClaim names where known.
    pub resource_claims: Vec<crate::dra::state::PodClaim>,
}

/// A pod that cannot be modelled.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// A request, limit or overhead quantity did not parse.
    #[error("pod {pod}: container {container}: {field} of {resource}")]
    ParseQuantity {
        /// `namespace/name`.
        pod: String,
        /// Container name (or `<overhead>`).
        container: String,
        /// `requests`, `limits` or `overhead`.
        field: &'static str,
        /// Resource name.
        resource: String,
        /// Why it failed (includes the text as written); boxed to keep results small.
        #[source]
        source: Box<numaplane::quantity::QuantityError>,
    },
    /// A quantity is negative or too large.
    #[error("pod {pod}: container {container}: {field} {resource}={value} is out of range")]
    QuantityOutOfRange {
        /// `namespace/name`.
        pod: String,
        /// Container name.
        container: String,
        /// `requests`, `limits` or `overhead`.
        field: &'static str,
        /// Resource name.
        resource: String,
        /// The text as written.
        value: String,
    },
    /// The pod has no name.
    #[error("pod without metadata.name")]
    MissingName,
}

type K8sQuantities = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

struct Ctx<'a> {
    pod: &'a str,
    container: &'a str,
}

fn parse_list(
    res: &mut Resources,
    map: Option<&K8sQuantities>,
    field: &'static str,
    ctx: &Ctx<'_>,
) -> Result<(ResList, Vec<(ResId, Quantity)>), PodError> {
    let mut list = ResList::default();
    let mut raw = Vec::new();
    for (name, q) in map.into_iter().flatten() {
        let parsed = Quantity::parse(&q.0).map_err(|source| PodError::ParseQuantity {
            pod: ctx.pod.to_owned(),
            container: ctx.container.to_owned(),
            field,
            resource: name.clone(),
            source: Box::new(source),
        })?;
        let id = res.intern(name);
        let out_of_range = || PodError::QuantityOutOfRange {
            pod: ctx.pod.to_owned(),
            container: ctx.container.to_owned(),
            field,
            resource: name.clone(),
            value: q.0.clone(),
        };
        if parsed < Quantity::zero() {
            return Err(out_of_range());
        }
        let amount = res.amount(id, &parsed).map_err(|_| out_of_range())?;
        list.set(id, amount);
        raw.push((id, parsed));
    }
    Ok((list, raw))
}

fn container_spec(
    res: &mut Resources,
    c: &Container,
    sidecar: bool,
    pod: &str,
    qos: &mut QosAcc,
) -> Result<ContainerSpec, PodError> {
    let ctx = Ctx {
        pod,
        container: &c.name,
    };
    let r = c.resources.as_ref();
    let (requests, raw_req) = parse_list(res, r.and_then(|r| r.requests.as_ref()), "requests", &ctx)?;
    let (limits, raw_lim) = parse_list(res, r.and_then(|r| r.limits.as_ref()), "limits", &ctx)?;
    qos.add(&raw_req, &raw_lim);
    let mut effective = requests.clone();
    for (id, v) in limits.iter() {
        if !effective.contains(id) {
            effective.set(id, v);
        }
    }
    let integer_cpu = effective.get(CPU) % 1000 == 0;
    let claims = container_claims(c);
    Ok(ContainerSpec {
        name: c.name.clone(),
        requests: effective,
        sidecar,
        integer_cpu,
        claims,
    })
}

/// Resources pod-level `spec.resources` may set (component-helpers'
/// `IsSupportedPodLevelResource`: cpu, memory and hugepages).
fn pod_level_supported(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// Pod-level requests and limits of the supported resources, parsed, requests defaulted as the
/// API server does (`defaultPodRequests`): a resource with a pod-level limit and no pod-level
/// request takes the containers' aggregate request when it is cpu or memory and a container
/// requests it, else the limit. Returns `(requests, limits, set)`.
fn pod_level(
    res: &mut Resources,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    aggregate: &ResList,
    pod: &str,
) -> Result<(ResList, ResList, bool), PodError> {
    let Some(r) = spec.resources.as_ref() else {
        return Ok((ResList::default(), ResList::default(), false));
    };
    let supported = |m: Option<&K8sQuantities>| -> K8sQuantities {
        m.into_iter()
            .flatten()
            .filter(|(k, _)| pod_level_supported(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (req, lim) = (supported(r.requests.as_ref()), supported(r.limits.as_ref()));
    let ctx = Ctx {
        pod,
        container: "<pod>",
    };
    let (mut requests, _) = parse_list(res, Some(&req), "requests", &ctx)?;
    let (limits, _) = parse_list(res, Some(&lim), "limits", &ctx)?;
    for (id, v) in limits.iter() {
        if requests.contains(id) {
            continue;
        }
        let overcommit = id == CPU || id == MEMORY;
        if overcommit && aggregate.contains(id) {
            requests.set(id, aggregate.get(id));
        } else {
            requests.set(id, v);
        }
    }
    Ok((requests, limits, !req.is_empty() || !lim.is_empty()))
}

/// Go's `ComputePodQOS` when pod-level `spec.resources` is present
/// (`pkg/apis/core/v1/helper/qos/qos.go`): the class of the pod-level cpu and memory alone:
/// best effort when neither is requested nor limited, guaranteed when both are limited and each
/// request equals its limit.
fn pod_level_qos(req: &ResList, lim: &ResList) -> Qos {
    let positive = |l: &ResList, id: ResId| Some(l.get(id)).filter(|v| l.contains(id) && *v > 0);
    let pairs = [CPU, MEMORY].map(|id| (positive(req, id), positive(lim, id)));
    if pairs.iter().all(|(r, l)| r.is_none() && l.is_none()) {
        Qos::BestEffort
    } else if pairs.iter().all(|(r, l)| l.is_some() && r == l) {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// Per resource, max(largest non-sidecar init container + sidecars started before it, sum of
/// app containers + all sidecars): component-helpers' `AggregateContainerRequests`.
fn aggregate(init_containers: &[ContainerSpec], containers: &[ContainerSpec]) -> ResList {
    let mut sidecars = ResList::default();
    let mut init_max = ResList::default();
    for c in init_containers {
        if c.sidecar {
            sidecars.add_all(&c.requests);
            init_max.max_with(&sidecars);
        } else {
            let mut with = sidecars.clone();
            with.add_all(&c.requests);
            init_max.max_with(&with);
        }
    }
    let mut total = sidecars;
    for c in containers {
        total.add_all(&c.requests);
    }
    total.max_with(&init_max);
    total
}

/// Go's `GetPodQOS`, over cpu and memory only.
#[derive(Default)]
struct QosAcc {
    requests: BTreeMap<ResId, Quantity>,
    limits: BTreeMap<ResId, Quantity>,
    guaranteed: bool,
    seen_container: bool,
}

impl QosAcc {
    fn add(&mut self, req: &[(ResId, Quantity)], lim: &[(ResId, Quantity)]) {
        if !self.seen_container {
            self.guaranteed = true;
            self.seen_container = true;
        }
        let compute = |id: ResId| id == CPU || id == MEMORY;
        for (id, q) in req {
            if compute(*id) && *q > Quantity::zero() {
                let e = self.requests.entry(*id).or_insert_with(Quantity::zero);
                *e += *q;
            }
        }
        let mut found = (false, false);
        for (id, q) in lim {
            if compute(*id) && *q > Quantity::zero() {
                if *id == CPU {
                    found.0 = true;
                } else {
                    found.1 = true;
                }
                let e = self.limits.entry(*id).or_insert_with(Quantity::zero);
                *e += *q;
            }
        }
        if !(found.0 && found.1) {
            self.guaranteed = false;
        }
    }

    fn class(&self) -> Qos {
        if self.requests.is_empty() && self.limits.is_empty() {
            return Qos::BestEffort;
        }
        let mut guaranteed = self.guaranteed;
        if guaranteed {
            for (id, req) in &self.requests {
                if self.limits.get(id) != Some(req) {
                    guaranteed = false;
                    break;
                }
            }
        }
        if guaranteed && self.requests.len() == self.limits.len() {
            Qos::Guaranteed
        } else {
            Qos::Burstable
        }
    }
}

impl PodSpec {
    /// Builds the model of `pod`, interning its resource names into `res`.
    pub fn from_pod(res: &mut Resources, pod: &Pod) -> Result<PodSpec, PodError> {
        let name = pod.metadata.name.clone().ok_or(PodError::MissingName)?;
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let key = format!("{namespace}/{name}");
        let spec = pod.spec.clone().unwrap_or_default();
        let claims = claims_of(&name, Some(&spec));
        let mut qos = QosAcc::default();
        let mut init_containers = Vec::new();
        for c in spec.init_containers.iter().flatten() {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            init_containers.push(container_spec(res, c, sidecar, &key, &mut qos)?);
        }
        let mut containers = Vec::new();
        for c in &spec.containers {
            containers.push(container_spec(res, c, false, &key, &mut qos)?);
        }
        let (pod_requests, pod_limits, pod_level) =
            pod_level(res, &spec, &aggregate(&init_containers, &containers), &key)?;
        let qos_class = if spec.resources.is_some() {
            pod_level_qos(&pod_requests, &pod_limits)
        } else {
            qos.class()
        };
        let (overhead, _) = parse_list(
            res,
            spec.overhead.as_ref(),
            "overhead",
            &Ctx {
                pod: &key,
                container: "<overhead>",
            },
        )?;
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        let facts = std::sync::Arc::new(crate::pod_facts::PodFacts::from_pod(pod, &namespace));
        let resource_claims = crate::dra::state::pod_claims(pod);
        Ok(PodSpec {
            namespace,
            name,
            uid: pod.metadata.uid.clone(),
            qos: qos_class,
            init_containers,
            containers,
            overhead,
            pod_level,
            pod_requests,
            node_name: spec.node_name.filter(|n| !n.is_empty()),
            node_selector: spec.node_selector.unwrap_or_default(),
            required_affinity: spec
                .affinity
                .and_then(|a| a.node_affinity)
                .and_then(|na| na.required_during_scheduling_ignored_during_execution),
            tolerations: spec.tolerations.unwrap_or_default(),
            scheduler_name: spec.scheduler_name,
            terminal,
            claims,
            facts,
            resource_claims,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Effective pod request as the kubelet and kube-scheduler compute it: per resource,
    /// max(largest non-sidecar init container + sidecars started before it,
    ///     sum of app containers + all sidecars), or the pod-level request where one is set,
    /// plus overhead.
    pub fn effective_request(&self) -> ResList {
        let mut total = aggregate(&self.init_containers, &self.containers);
        // component-helpers' `PodRequests`: pod-level requests replace the containers' sum.
        for (id, v) in self.pod_requests.iter() {
            total.set(id, v);
        }
        total.add_all(&self.overhead);
        total
    }

    /// Requests anything other than cpu/memory/pods/ephemeral-storage-like native resources.
    pub fn requests_extended(&self, res: &Resources) -> bool {
        self.init_containers
            .iter()
            .chain(&self.containers)
            .any(|c| c.extended(res).next().is_some())
    }

    /// Whether the kubelet's Topology Manager has anything to align for this pod on some node.
    /// Its hint providers give hints for a Guaranteed pod's whole CPUs (static CPU manager) and
    /// memory and hugepages (Static memory manager), and for any pod's device-plugin
    /// resources; every other pod is admitted under every policy with nothing pinned, so the
    /// NUMA side has nothing to say about it. Init containers count: they are admitted too.
    pub fn topology_aligned(&self, res: &Resources) -> bool {
        self.init_containers.iter().chain(&self.containers).any(|c| {
            (self.qos == Qos::Guaranteed && !self.pod_level && c.pinned_if_guaranteed(res))
                || c.extended(res).next().is_some()
        })
    }
}

/// A claim a pod's volume names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Claim name in the pod's namespace.
    pub name: String,
    /// A generic ephemeral volume: the claim is `<pod>-<volume>` and must be owned by the pod.
    pub ephemeral: bool,
}

/// The claims `pod`'s volumes use, in volume order: `persistentVolumeClaim` volumes and generic
/// ephemeral volumes (whose claim the ephemeral volume controller names `<pod>-<volume>`).
pub fn claims_of(pod_name: &str, spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<ClaimRef> {
    let volumes = spec.and_then(|s| s.volumes.as_deref()).unwrap_or(&[]);
    volumes
        .iter()
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(ClaimRef {
                    name: c.claim_name.clone(),
                    ephemeral: false,
                })
            } else {
                v.ephemeral.as_ref().map(|_| ClaimRef {
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                })
            }
        })
        .collect()
}

impl ContainerSpec {
    /// Whether the kubelet pins some of this container's resources to NUMA nodes when its pod
    /// is Guaranteed: whole CPUs (static CPU manager) or memory and hugepages (Static memory
    /// manager).
    pub fn pinned_if_guaranteed(&self, res: &Resources) -> bool {
        self.requests.positive().any(|(id, _)| {
            (res.kind(id) == ResKind::Cpu && self.integer_cpu) || res.kind(id).is_memory_like()
        })
    }

    /// The extended (device-plugin) resources it requests.
    pub fn extended<'a>(&'a self, res: &'a Resources) -> impl Iterator<Item = ResId> + 'a {
        self.requests
            .positive()
            .map(|(id, _)| id)
            .filter(|&id| res.kind(id) == ResKind::Extended)
    }
}

/// The `resources.claims` of a container (an empty `request` names the whole claim).
pub fn container_claims(c: &Container) -> Vec<ContainerClaim> {
    c.resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ContainerClaim {
            name: c.name.clone(),
            request: c.request.clone().filter(|r| !r.is_empty()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod json")
    }

    fn container(name: &str, req: serde_json::Value, lim: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"requests": req, "limits": lim}})
    }

    #[test]
    fn qos_classes() {
        let mut r = Resources::default();
        let g = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [
            container("c", serde_json::json!({"cpu": "2", "memory": "1Gi"}), serde_json::json!({"cpu": "2", "memory": "1Gi"}))]}}),
        );
        assert_eq!(PodSpec::from_pod(&mut r, &g).expect("pod").qos, Qos::Guaranteed);
        let b = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [
            container("c", serde_json::json!({"cpu": "2"}), serde_json::json!({"cpu": "2"}))]}}),
        );
        assert_eq!(PodSpec::from_pod(&mut r, &b).expect("pod").qos, Qos::Burstable);
        let be = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [
            container("c", serde_json::json!({"nvidia.com/gpu": "1"}), serde_json::json!({"nvidia.com/gpu": "1"}))]}}),
        );
        let be = PodSpec::from_pod(&mut r, &be).expect("pod");
        assert_eq!(be.qos, Qos::BestEffort);
        assert!(be.requests_extended(&r));
        // Limits only (no defaulting applied): Burstable, as Go computes it.
        let lo = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}),
        );
        assert_eq!(PodSpec::from_pod(&mut r, &lo).expect("pod").qos, Qos::Burstable);
    }

    #[test]
    fn effective_request_with_init_and_sidecars() {
        let mut r = Resources::default();
        let p = pod(serde_json::json!({"metadata": {"name": "a"}, "spec": {
            "initContainers": [
                container("init", serde_json::json!({"cpu": "4"}), serde_json::json!({})),
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [container("c", serde_json::json!({"cpu": "2"}), serde_json::json!({}))],
            "overhead": {"cpu": "100m"}}}));
        let p = PodSpec::from_pod(&mut r, &p).expect("pod");
        // max(init 4, app 2 + sidecar 1) + overhead.
        assert_eq!(p.effective_request().get(CPU), 4100);
        assert!(p.init_containers[1].sidecar);
    }

    #[test]
    fn pod_level_requests_replace_the_containers_sum_plus_overhead() {
        let mut r = Resources::default();
        let p = pod(serde_json::json!({"metadata": {"name": "a"}, "spec": {
            "initContainers": [container("init", serde_json::json!({"cpu": "6"}), serde_json::json!({}))],
            "containers": [
                container("a", serde_json::json!({"cpu": "1", "memory": "1Gi", "example.com/gpu": "1"}), serde_json::json!({})),
                container("b", serde_json::json!({"cpu": "500m"}), serde_json::json!({}))],
            "resources": {"requests": {"cpu": "3", "memory": "4Gi"}, "limits": {"cpu": "3", "memory": "4Gi"}},
            "overhead": {"cpu": "100m", "memory": "64Mi"}}}));
        let p = PodSpec::from_pod(&mut r, &p).expect("pod");
        assert!(p.pod_level);
        let e = p.effective_request();
        // Pod-level cpu and memory win over max(init 6, 1.5) and 1Gi; overhead on top; the
        // device is the containers'.
        assert_eq!(e.get(CPU), 3100);
        assert_eq!(e.get(MEMORY), (4 << 30) + (64 << 20));
        let gpu = r.get("example.com/gpu").expect("interned");
        assert_eq!(e.get(gpu), 1);
        // Pod-level limits equal to the requests for both cpu and memory: Guaranteed, though no
        // container sets a limit.
        assert_eq!(p.qos, Qos::Guaranteed);
    }

    #[test]
    fn pod_level_limits_default_the_requests_and_set_the_qos() {
        let mut r = Resources::default();
        let of = |r: &mut Resources, resources: serde_json::Value, c: serde_json::Value| {
            PodSpec::from_pod(
                r,
                &pod(serde_json::json!({"metadata": {"name": "a"}, "spec": {
                    "containers": [container("c", c, serde_json::json!({}))], "resources": resources}})),
            )
            .expect("pod")
        };
        // Limits only, no container request: the requests default to the limits.
        let p = of(
            &mut r,
            serde_json::json!({"limits": {"cpu": "2", "memory": "2Gi"}}),
            serde_json::json!({}),
        );
        assert_eq!(p.effective_request().get(CPU), 2000);
        assert_eq!(p.qos, Qos::Guaranteed);
        // A container requests cpu: the pod-level cpu request defaults to the containers' 1.
        let p = of(
            &mut r,
            serde_json::json!({"limits": {"cpu": "2", "memory": "2Gi"}}),
            serde_json::json!({"cpu": "1"}),
        );
        assert_eq!(p.effective_request().get(CPU), 1000);
        assert_eq!(p.effective_request().get(MEMORY), 2 << 30);
        assert_eq!(p.qos, Qos::Burstable);
        // Requests only: Burstable, and the request counts.
        let p = of(
            &mut r,
            serde_json::json!({"requests": {"memory": "3Gi"}}),
            serde_json::json!({"memory": "1Gi"}),
        );
        assert_eq!(p.effective_request().get(MEMORY), 3 << 30);
        assert_eq!(p.qos, Qos::Burstable);
        // `resources: {}`: the pod-level rule still decides the class (BestEffort), nothing is
        // overridden.
        let p = of(&mut r, serde_json::json!({}), serde_json::json!({"cpu": "1"}));
        assert!(!p.pod_level);
        assert_eq!(p.qos, Qos::BestEffort);
        assert_eq!(p.effective_request().get(CPU), 1000);
        // Only an unsupported resource at pod level: not pod-level resources.
        let p = of(
            &mut r,
            serde_json::json!({"requests": {"example.com/gpu": "1"}}),
            serde_json::json!({"cpu": "1"}),
        );
        assert!(!p.pod_level);
    }

    #[test]
    fn invalid_quantity_is_typed() {
        let mut r = Resources::default();
        let p = pod(
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"containers": [
            container("c", serde_json::json!({"cpu": "two"}), serde_json::json!({}))]}}),
        );
        let err = PodSpec::from_pod(&mut r, &p).expect_err("must fail");
        assert!(
            matches!(err, PodError::ParseQuantity { ref resource, .. } if resource == "cpu"),
            "{err}"
        );
        assert!(err.to_string().contains("ns/a"));
    }
}
