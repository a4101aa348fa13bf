//! DRA devices beside pinned CPUs on a real control plane: the GPUs the tests publish per node
//! (two per NUMA node, placed by the standard `resource.kubernetes.io/numaNode` attribute or by
//! their `resource.kubernetes.io/pciBusID` through the PCI locality of the `gpu-nic.xml`
//! machine), and a fake kubelet per node that admits bound pods the way the kubelet does under
//! `single-numa-node` with the static CPU manager and no memory manager, and reports each pod's
//! CPUs and its claims' devices through pod-resources (`dynamic_resources`).
//!
//! The kubelet here chooses the NUMA node on its own: the Topology Manager's merged hint for a
//! container whose only hint provider is the CPU manager is the lowest NUMA node with enough free
//! CPUs (single-NUMA hints are all preferred, and of equal width the lower mask wins), and DRA
//! devices give no hint. It never reads the scheduler's allocation record. Its CPU books are its
//! own rather than [`crate::whole_system`]'s ledger: the harness sits below that module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use numaplane::proto::podresources::{AllocatableResourcesResponse, ClaimResource, DynamicResource};
use serde_json::{Value, json};

use numaplane::proto::podresources::{ContainerResources, PodResources};
use numaplane::quantity::Quantity;

use super::kubelet::{key_of, mark_running};
use super::{Agent, HarnessError};
use crate::fake_kubelet::{FakeKubelet, FakeKubeletOptions};

/// The container name of every pod.
pub const CONTAINER: &str = "app";
/// NUMA nodes of the machine.
pub const ZONES: u32 = 2;

/// Logical CPUs of `zone` in `gpu-nic.xml`: 0-7,16-23 and 8-15,24-31.
pub fn zone_cpus(zone: u32) -> Vec<i64> {
    let base = i64::from(zone) * 8;
    (base..base + 8).chain(base + 16..base + 24).collect()
}

/// The DRA driver of the GPUs.
pub const DRIVER: &str = "gpu.example.com";

/// Where a GPU's NUMA node is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `resource.kubernetes.io/numaNode`.
    NumaNode,
    /// `resource.kubernetes.io/pciBusID`, resolved through the node's PCI locality.
    PciBusId(&'static str),
}

/// The GPUs of every node, in the order of their ResourceSlice (the allocator's search order):
/// name, NUMA node, and how the slice tells it. A GPU of NUMA node 0 comes first on each NUMA
/// node's turn, so an allocator blind to NUMA gives the second pod of a node, pinned on NUMA
/// node 1, `gpu-1` of NUMA node 0. The PCI addresses are host bridges of `gpu-nic.xml`
/// (`0000:4b` on NUMA node 0, `0000:b1` on NUMA node 1).
pub const GPUS: [(&str, u32, Source); 4] = [
    ("gpu-0", 0, Source::NumaNode),
    ("gpu-1", 0, Source::PciBusId("0000:4b:00.0")),
    ("gpu-2", 1, Source::NumaNode),
    ("gpu-3", 1, Source::PciBusId("0000:b1:00.0")),
];

/// The hwloc fixture of every node: the CPUs of `2numa.xml` plus PCI host bridges on both NUMA
/// nodes, so that the exporter publishes a PCI locality.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/tests/fixtures/gpu-nic.xml")
}

/// The NUMA node of GPU `device`, as the test placed it (`None`: not one of [`GPUS`]).
pub fn gpu_numa(device: &str) -> Option<u32> {
    GPUS.iter().find(|(n, _, _)| *n == device).map(|(_, z, _)| *z)
}

/// GPUs per NUMA node on each node.
pub fn gpus_on(zone: u32) -> usize {
    GPUS.iter().filter(|(_, z, _)| *z == zone).count()
}

/// Deletes the ResourceSlices `<node>-gpus` of `nodes` and the DeviceClass `class`, ignoring
/// what is already gone: the DRA part of a test's cleanup.
pub async fn delete_gpu_objects(client: &kube::Client, nodes: &[String], class: &str) {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
    use kube::api::DeleteParams;
    for n in nodes {
        let _ = Api::<ResourceSlice>::all(client.clone())
            .delete(&format!("{n}-gpus"), &DeleteParams::default())
            .await;
    }
    let _ = Api::<DeviceClass>::all(client.clone())
        .delete(class, &DeleteParams::default())
        .await;
}

/// The ResourceSlice `<node>-gpus` publishing [`GPUS`] in pool `node`.
pub fn slice(node: &str) -> Value {
    let devices: Vec<Value> = GPUS
        .iter()
        .map(|(name, zone, source)| {
            let mut attributes = json!({"model": {"string": "a100"}});
            match source {
                Source::NumaNode => {
                    attributes["resource.kubernetes.io/numaNode"] = json!({"int": zone});
                }
                Source::PciBusId(bdf) => {
                    attributes["resource.kubernetes.io/pciBusID"] = json!({"string": bdf});
                }
            }
            json!({"name": name, "attributes": attributes})
        })
        .collect();
    json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}
    })
}

/// A DeviceClass `name` selecting the GPUs by CEL.
pub fn device_class(name: &str) -> Value {
    json!({"metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].model == \"a100\"")}}]}})
}

/// A ResourceClaimTemplate `name` asking one device of `class`.
pub fn one_device_template(name: &str, class: &str) -> Value {
    json!({"metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": class}}]}}}})
}

/// A Guaranteed pod `name` for `scheduler` with `cpus` exclusive CPUs, 1Gi, and claim `gpu`
/// from `template` used by its container.
pub fn pod(name: &str, scheduler: &str, cpus: usize, template: &str) -> Value {
    let r = json!({"cpu": cpus.to_string(), "memory": "1Gi"});
    json!({
        "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": scheduler, "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": CONTAINER, "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": r, "limits": r, "claims": [{"name": "gpu"}]}}]}
    })
}

/// What the kubelet answers `GetAllocatableResources` with: every CPU of the machine, no
/// device-plugin devices, no memory manager.
pub fn allocatable() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: (0..ZONES).flat_map(zone_cpus).collect(),
        ..Default::default()
    }
}

/// `numaplane-exporter run` flags for `node` on `socket`: [`fixture`], `single-numa-node` at
/// container scope, fast resync and backoffs; DRA counting is on by default.
pub fn exporter_args(node: &str, socket: &Path, kubeconfig: &Path) -> Vec<String> {
    [
        "--node-name",
        node,
        "--podresources-socket",
        &socket.display().to_string(),
        "--topology-xml",
        &fixture().display().to_string(),
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--topology-manager-policy",
        "single-numa-node",
        "--topology-manager-scope",
        "container",
        "--resync-interval",
        "200ms",
        "--api-backoff-min",
        "100ms",
        "--api-backoff-max",
        "1s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The NUMA node of a CPU of the machine.
pub fn cpu_numa(cpu: i64) -> Option<u32> {
    (0..ZONES).find(|z| zone_cpus(*z).contains(&cpu))
}

/// One pod the kubelet admitted: what it reported through pod-resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// `namespace/name`.
    pub pod: String,
    /// The node.
    pub node: String,
    /// The exclusive CPUs the kubelet pinned.
    pub cpus: Vec<i64>,
    /// The claims' devices as `(claim, pool, device)`, from each claim's `status.allocation`.
    pub devices: Vec<(String, String, String)>,
}

impl Admission {
    /// NUMA nodes of the pinned CPUs.
    pub fn cpu_numa(&self) -> BTreeSet<Option<u32>> {
        self.cpus.iter().map(|c| cpu_numa(*c)).collect()
    }

    /// NUMA nodes of the claims' devices.
    pub fn device_numa(&self) -> BTreeSet<Option<u32>> {
        self.devices.iter().map(|(_, _, d)| gpu_numa(d)).collect()
    }

    /// Why the pod is not aligned (every CPU and every device on one and the same NUMA node),
    /// or `None` when it is.
    pub fn misalignment(&self) -> Option<String> {
        let (cpus, devices) = (self.cpu_numa(), self.device_numa());
        let one = |s: &BTreeSet<Option<u32>>| match s.iter().collect::<Vec<_>>().as_slice() {
            [Some(z)] => Some(*z),
            _ => None,
        };
        match (one(&cpus), one(&devices)) {
            (Some(c), Some(d)) if c == d => None,
            _ => Some(format!(
                "{} on {}: CPUs {:?} on NUMA {cpus:?}, devices {:?} on NUMA {devices:?}",
                self.pod, self.node, self.cpus, self.devices
            )),
        }
    }
}

/// What the fake kubelet saw: an admission, or a pod it could not admit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and reported.
    Admitted(Admission),
    /// Refused (a Topology Manager admission error, an unreadable pod or claim).
    Refused {
        /// `namespace/name`.
        pod: String,
        /// Why.
        why: String,
    },
}

/// One node's kubelet: a pod-resources server on a Unix socket and the CPU accounting.
pub struct DraKubelet {
    /// The node name.
    pub node: String,
    podres: FakeKubelet,
    state: Mutex<State>,
    _dir: tempfile::TempDir,
}

#[derive(Default)]
struct State {
    /// Exclusive CPUs per admitted pod (`namespace/name`).
    cpus: BTreeMap<String, Vec<i64>>,
    /// Claims per admitted pod.
    claims: BTreeMap<String, Vec<DynamicResource>>,
    outcomes: Vec<Outcome>,
}

impl State {
    /// CPUs of `zone` no pod holds, ascending.
    fn free_cpus(&self, zone: u32) -> Vec<i64> {
        let used: BTreeSet<i64> = self.cpus.values().flatten().copied().collect();
        zone_cpus(zone)
            .into_iter()
            .filter(|c| !used.contains(c))
            .collect()
    }

    /// The NUMA node the Topology Manager gives a container of `cpus` exclusive CPUs: the
    /// lowest one with that many free.
    fn hint(&self, cpus: usize) -> Option<u32> {
        (0..ZONES).find(|z| self.free_cpus(*z).len() >= cpus)
    }
}

impl DraKubelet {
    /// Starts the pod-resources server of `node` (no pods yet) in a directory of its own.
    pub async fn start(node: &str) -> Result<DraKubelet, HarnessError> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("podres.sock");
        let podres =
            FakeKubelet::start(&socket, allocatable(), vec![], FakeKubeletOptions::default()).await?;
        Ok(DraKubelet {
            node: node.to_owned(),
            podres,
            state: Mutex::new(State::default()),
            _dir: dir,
        })
    }

    /// The pod-resources socket.
    pub fn socket(&self) -> &Path {
        self.podres.socket()
    }

    /// Spawns this node's `numaplane-exporter run` ([`exporter_args`]) and waits until it serves.
    pub async fn exporter(
        &self,
        kubeconfig: &Path,
        timeout: std::time::Duration,
    ) -> Result<Agent, HarnessError> {
        let mut agent = Agent::spawn(&exporter_args(&self.node, self.socket(), kubeconfig))?;
        agent.set_wait(timeout);
        agent.wait_serving(timeout).await?;
        Ok(agent)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Everything the kubelet did so far, in order.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.state().outcomes.clone()
    }

    /// The outcome for pod `key` (`namespace/name`), if it reached this kubelet.
    pub fn outcome(&self, key: &str) -> Option<Outcome> {
        self.state().outcomes.iter().find(|o| o.pod() == key).cloned()
    }

    /// Admits a pod bound here: its CPUs pinned on the NUMA node of the kubelet's own hint, its
    /// claims' devices read from their allocation, both reported through pod-resources.
    pub async fn admit(&self, claims: &Api<ResourceClaim>, pod: &Pod) -> Outcome {
        let key = key_of(pod);
        let refused = |why: String| Outcome::Refused {
            pod: key.clone(),
            why,
        };
        let wanted = match exclusive_cpus(pod) {
            Ok(n) => n,
            Err(why) => return refused(why),
        };
        // The kubelet prepares the claims named in the pod's status (the resourceclaim
        // controller's generated names) from their allocation.
        let names: Vec<String> = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| s.resource_claim_name)
            .collect();
        let mut dynamic = Vec::new();
        let mut devices = Vec::new();
        for name in names {
            let claim = match claims.get(&name).await {
                Ok(c) => c,
                Err(e) => return refused(format!("claim {name}: {e}")),
            };
            let results = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            if results.is_empty() {
                return refused(format!("claim {name} is not allocated"));
            }
            devices.extend(
                results
                    .iter()
                    .map(|r| (name.clone(), r.pool.clone(), r.device.clone())),
            );
            dynamic.push(DynamicResource {
                claim_name: name,
                claim_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                claim_resources: results
                    .into_iter()
                    .map(|r| ClaimResource {
                        driver_name: r.driver,
                        pool_name: r.pool,
                        device_name: r.device,
                        ..Default::default()
                    })
                    .collect(),
            });
        }
        let mut st = self.state();
        if st.cpus.contains_key(&key) {
            return refused("admitted twice".to_owned());
        }
        let Some(zone) = st.hint(wanted) else {
            return refused(format!(
                "TopologyAffinityError: no NUMA node has {wanted} free CPUs"
            ));
        };
        // The static CPU manager packs: the lowest free CPUs of the NUMA node.
        let cpus: Vec<i64> = st.free_cpus(zone).into_iter().take(wanted).collect();
        st.cpus.insert(key.clone(), cpus.clone());
        st.claims.insert(key.clone(), dynamic);
        self.report(&st);
        Outcome::Admitted(Admission {
            pod: key,
            node: self.node.clone(),
            cpus,
            devices,
        })
    }

    /// Tells pod-resources the admitted pods: each one's CPUs and claims.
    fn report(&self, st: &State) {
        let pods = st
            .cpus
            .iter()
            .map(|(key, cpus)| {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                PodResources {
                    name: name.to_owned(),
                    namespace: ns.to_owned(),
                    containers: vec![ContainerResources {
                        name: CONTAINER.to_owned(),
                        cpu_ids: cpus.clone(),
                        dynamic_resources: st.claims.get(key).cloned().unwrap_or_default(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        self.podres.set_pods(pods);
    }

    /// Runs the kubelet: admits each pod bound to this node once, in the order the watch shows
    /// them, and marks it Running. Runs until aborted.
    pub async fn run(self: Arc<Self>, client: kube::Client) {
        let pods: Api<Pod> = Api::all(client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut stream = watcher(pods, cfg).default_backoff().applied_objects().boxed();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        while let Some(event) = stream.next().await {
            let Ok(pod) = event else { continue };
            if pod.metadata.deletion_timestamp.is_some() || !seen.insert(key_of(&pod)) {
                continue;
            }
            let claims: Api<ResourceClaim> = Api::namespaced(
                client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let outcome = self.admit(&claims, &pod).await;
            if matches!(outcome, Outcome::Admitted(_)) {
                mark_running(&client, &pod);
            }
            self.state().outcomes.push(outcome);
        }
    }
}

impl Outcome {
    /// The pod's `namespace/name`.
    pub fn pod(&self) -> &str {
        match self {
            Outcome::Admitted(a) => &a.pod,
            Outcome::Refused { pod, .. } => pod,
        }
    }
}

/// The exclusive CPUs of a Guaranteed pod's one container: its whole-number CPU limit, equal
/// to its request.
fn exclusive_cpus(pod: &Pod) -> Result<usize, String> {
    let c = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .ok_or("no container")?;
    let r = c.resources.as_ref().ok_or("no resources")?;
    let cpu = |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        m.and_then(|m| m.get("cpu"))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .and_then(|q| q.as_i64_exact())
            .and_then(|n| usize::try_from(n).ok())
    };
    match (cpu(r.requests.as_ref()), cpu(r.limits.as_ref())) {
        (Some(req), Some(lim)) if req == lim && lim > 0 => Ok(lim),
        other => Err(format!("not a whole number of exclusive CPUs: {other:?}")),
    }
}

/// Allocated devices of `node`'s pool per NUMA node (every NUMA node of the machine listed),
/// counted from the claims' `status.allocation`.
pub fn allocated_per_numa(claims: &[ResourceClaim], node: &str) -> BTreeMap<u32, usize> {
    let mut out: BTreeMap<u32, usize> = (0..ZONES).map(|z| (z, 0)).collect();
    for r in claims
        .iter()
        .filter_map(|c| {
            c.status
                .as_ref()?
                .allocation
                .as_ref()?
                .devices
                .as_ref()?
                .results
                .as_ref()
        })
        .flatten()
        .filter(|r| r.driver == DRIVER && r.pool == node)
    {
        if let Some(z) = gpu_numa(&r.device) {
            *out.entry(z).or_default() += 1;
        }
    }
    out
}
