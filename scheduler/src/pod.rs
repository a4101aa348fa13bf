//! The scheduler's plain view of a pod: per-container requests as interned amounts, QoS class,
//! and the fields node fit needs. Built from a k8s `Pod`; invalid quantities are typed errors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, NodeSelector, Pod, Toleration};
use numaplane::quantity::Quantity;

use crate::resources::{CPU, MEMORY, ResId, ResList, Resources};

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
}

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
    /// hook(volumes): the PersistentVolumeClaims its volumes use.
    pub claims: Vec<crate::volume_binding::ClaimRef>,
    /// hook (issue 19): what kube-scheduler's constraint plugins read, parsed once.
    pub facts: std::sync::Arc<crate::constraints::PodFacts>,
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
    Ok(ContainerSpec {
        name: c.name.clone(),
        requests: effective,
        sidecar,
        integer_cpu,
    })
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
        // hook(volumes)
        let claims = crate::volume_binding::claims_of(&name, Some(&spec));
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
        // hook (issue 19)
        let facts = std::sync::Arc::new(crate::constraints::PodFacts::from_pod(pod, &namespace));
        let resource_claims = crate::dra::state::pod_claims(pod);
        Ok(PodSpec {
            namespace,
            name,
            uid: pod.metadata.uid.clone(),
            qos: qos.class(),
            init_containers,
            containers,
            overhead,
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
    ///     sum of app containers + all sidecars), plus overhead.
    pub fn effective_request(&self) -> ResList {
        let mut sidecars = ResList::default();
        let mut init_max = ResList::default();
        for c in &self.init_containers {
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
        for c in &self.containers {
            total.add_all(&c.requests);
        }
        total.max_with(&init_max);
        total.add_all(&self.overhead);
        total
    }

    /// Requests anything other than cpu/memory/pods/ephemeral-storage-like native resources.
    pub fn requests_extended(&self, res: &Resources) -> bool {
        self.init_containers.iter().chain(&self.containers).any(|c| {
            c.requests
                .positive()
                .any(|(id, _)| res.kind(id) == crate::resources::ResKind::Extended)
        })
    }
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
