//! The seeded fault soak: the whole live loop (two elected scheduler replicas, one
//! exporter hosting the allocator per node, per node a fake kubelet with pod-resources and the
//! device-plugin side, the HTTP-level fake API server) under churn, with faults injected at
//! random from a seed, and the invariants checked while it runs.
//!
//! Nodes: 2 NUMA zones of 16 CPUs, 4 GPUs and one NIC of [`NIC_SLOTS`] slots per zone,
//! `single-numa-node`. Two kinds ([`NodeKind`]): the Static memory manager with container
//! scope (memory is published and pinned per zone), and no memory manager with pod scope, the
//! only nodes pods with an init container select (an init container's exclusive CPUs are reused
//! by the app container only in the same zone, which pod scope guarantees; in container scope
//! the kubelet keeps them, which the exporter can only bound from the pod spec).
//!
//! Pods: Guaranteed, 1–4 CPUs, 1–4 GiB, GPUs and NIC slots as in the whole-system test, some
//! with an init container (no larger than the app container), and a few that fit nowhere (more
//! CPUs than a zone has: node-level room, no NUMA room), which must stay pending and be retried
//! no faster than their backoff. Pods are created at a steady pace while fewer than a window
//! are alive; pods the NRT shows are deleted at random so their CPUs, devices and slots are
//! reused.
//!
//! DRA ([`crate::soak_dra`]): the static-memory nodes publish 4 GPUs each as a ResourceSlice;
//! about a quarter of the pods that fit claim one through their own ResourceClaim, one in ten
//! through one of two claims shared by many pods; the resourceclaim controller's part (gone pods
//! leave `reservedFor`, unused allocations are cleared) is emulated.
//!
//! Faults ([`Fault`]), at seeded times and targets: watch drops and 410 relists while a
//! Binding is held in flight, both 409s of a Binding (a first attempt that landed; the pod
//! deleted and recreated under its name), 500s and 504s on Bindings and NRT writes, slow
//! Binding answers, a scheduler restart, a leader change, an exporter restart, a kubelet
//! restart (its sockets removed and recreated, plugins must register again), a device plugin
//! registering again while the kubelet runs, and an NRT write delayed by seconds.
//!
//! Invariants, checked as things happen ([`Soak::run`] stops at the first violation):
//! - the fake kubelet never finds a zone without the CPUs or memory, or a device or slot
//!   already held or outside the zone (its own ledger, [`crate::whole_system::Ledger`]);
//! - every NRT equals the kubelet state its pod-set fingerprint names;
//! - every pod that fits is bound, admitted and shown by its NRT (the run fails when nothing
//!   progresses for a while);
//! - no pod UID is bound twice (Bindings the fake stored) nor admitted twice;
//! - a pod's recorded devices are what the kubelet gave it, unless the kubelet had no choice
//!   because the recorded devices were not free in the zone when it admitted the pod; every
//!   device here is healthy and registered, so that only happens when the record names a
//!   device another pod holds, which is a double booking and fails the run too;
//! - no device is allocated to two claims, every allocation satisfies its claim (one device
//!   of a slice of its node, a node selector naming it), and every bound pod's claim is
//!   allocated on its node and reserved for it ([`crate::soak_dra::check`]);
//! - a pod that did not fit is not tried again (`PodScheduled=False` written by the same
//!   replica) sooner than the initial backoff after its previous attempt.
//!
//! A failure prints the seed, the replay command and the event log around it (faults and pod
//! operations). See docs/testing.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use numaplane::allocation::{ANNOTATION, Allocation};
use numaplane::nrt::NodeResourceTopology;
use numaplane::quantity::Quantity;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;
use tokio::sync::mpsc;

use crate::fake_api::{FakeApiServer, StoreChange};
use crate::fake_device_kubelet::FakeDeviceKubelet;
use crate::fake_kubelet::FakeKubelet;
use crate::harness::kubelet::key_of;
use crate::harness::kubelet::{admission_order, is_terminal, mark_running, with_queued};
use crate::harness::{self, Agent, HarnessError, metric_value};
use crate::whole_system::{
    CONTAINER, GPU, KubeletParts, KubeletState, NIC, NodeKind, allocate_devices, pool_registrations,
    reregister_plugins, wait_reregistered, zone_cpus,
};

/// Environment variable that sets the seed (a failed run prints it).
pub const SEED_ENV: &str = "NUMAPLANE_SOAK_SEED";
/// The init container's name.
pub const INIT: &str = "init";
/// Label of the pod-scope nodes, which pods with an init container select.
pub const POD_SCOPE_LABEL: &str = "soak.numaplane.io/pod-scope";
const GIB: u64 = 1 << 30;

/// The seed of this run: `NUMAPLANE_SOAK_SEED` (a number, or `random` for a fresh one), else
/// `default` (a fresh one when `None`).
pub fn seed_from_env(default: Option<u64>) -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| rand::random()),
        Err(_) => default.unwrap_or_else(rand::random),
    }
}

/// The size of a run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// Seeds the node kinds, pod shapes, deletions and the fault schedule.
    pub seed: u64,
    /// Simulated nodes.
    pub nodes: usize,
    /// Pods created in all.
    pub pods: usize,
    /// Pods alive (pending or running) at most.
    pub window: usize,
    /// Pod creations are spread over this long (at least), and the faults over 90% of it.
    pub span: Duration,
    /// Faults of each kind.
    pub per_kind: usize,
    /// Faults of random kinds on top.
    pub extra_faults: usize,
    /// The exporters' `--resync-interval`.
    pub resync: &'static str,
    /// The run fails when no pod makes progress for this long while some wait.
    pub stall: Duration,
    /// The whole run fails after this long.
    pub deadline: Duration,
    /// The schedulers' `--pod-initial-backoff`.
    pub initial_backoff: Duration,
    /// The schedulers' `--pod-max-backoff`.
    pub max_backoff: Duration,
    /// Release binaries (built if needed) instead of the test profile's.
    pub release: bool,
    /// Nodes started at once.
    pub start_batch: usize,
}

impl SoakConfig {
    /// The short soak `scripts/test` runs: every fault kind at least once, in about a minute.
    pub fn short(seed: u64) -> Self {
        SoakConfig {
            seed,
            nodes: 10,
            pods: 260,
            window: 90,
            span: Duration::from_secs(40),
            per_kind: 1,
            extra_faults: 4,
            resync: "1s",
            stall: Duration::from_secs(60),
            deadline: Duration::from_secs(150),
            initial_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(8),
            release: false,
            start_batch: 10,
        }
    }

    /// The long soak: 200 nodes, 2,000 pods over several minutes, release binaries.
    pub fn long(seed: u64) -> Self {
        SoakConfig {
            seed,
            nodes: 200,
            pods: 2000,
            window: 700,
            span: Duration::from_secs(240),
            per_kind: 3,
            extra_faults: 15,
            resync: "5s",
            stall: Duration::from_secs(120),
            deadline: Duration::from_secs(900),
            initial_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(10),
            release: true,
            start_batch: 25,
        }
    }
}

// ===================== nodes and pods =====================

/// A pod's requests (requests = limits: Guaranteed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodShape {
    /// The app container's exclusive CPUs.
    pub cpus: usize,
    /// The app container's memory in GiB.
    pub memory_gib: u64,
    /// The app container's devices per resource.
    pub devices: BTreeMap<String, usize>,
    /// An init container's CPUs and GiB (no more than the app container's).
    pub init: Option<(usize, u64)>,
}

impl PodShape {
    /// More CPUs than a zone has: room on the node, none in a zone.
    pub fn unfit() -> Self {
        PodShape {
            cpus: zone_cpus(0).len() + 4,
            memory_gib: 1,
            devices: BTreeMap::new(),
            init: None,
        }
    }

    /// Whether single-numa-node can ever admit it.
    pub fn fits(&self) -> bool {
        self.cpus <= zone_cpus(0).len()
    }

    fn random(rng: &mut StdRng) -> Self {
        let cpus = [1, 2, 2, 4][rng.random_range(0..4)];
        let memory_gib = [1, 2, 1, 4][rng.random_range(0..4)];
        let gpus = [0, 0, 0, 0, 1, 1, 1, 2][rng.random_range(0..8)];
        let nics = rng.random_range(0..2usize);
        let devices = [(GPU, gpus), (NIC, nics)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.to_owned(), n))
            .collect();
        let init = rng
            .random_bool(0.15)
            .then(|| (rng.random_range(1..=cpus), rng.random_range(1..=memory_gib)));
        PodShape {
            cpus,
            memory_gib,
            devices,
            init,
        }
    }

    fn resources(cpus: usize, memory_gib: u64, devices: &BTreeMap<String, usize>) -> serde_json::Value {
        let mut r = json!({"cpu": cpus.to_string(), "memory": format!("{memory_gib}Gi")});
        for (res, n) in devices {
            r[res] = json!(n.to_string());
        }
        json!({"requests": r, "limits": r})
    }

    /// The pod, served by `numaplane-scheduler`.
    pub fn pod(&self, name: &str) -> serde_json::Value {
        let app = json!({"name": CONTAINER, "image": "registry.k8s.io/pause:3.10",
            "resources": Self::resources(self.cpus, self.memory_gib, &self.devices)});
        let mut spec = json!({"schedulerName": "numaplane-scheduler",
            "tolerations": [{"operator": "Exists"}], "containers": [app]});
        if let Some((cpus, gib)) = self.init {
            spec["initContainers"] = json!([{"name": INIT, "image": "registry.k8s.io/pause:3.10",
                "resources": Self::resources(cpus, gib, &BTreeMap::new())}]);
            spec["nodeSelector"] = json!({POD_SCOPE_LABEL: "true"});
        }
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}}, "spec": spec})
    }

    /// What the kubelet reads from a pod's spec.
    pub fn from_pod(pod: &Pod) -> Result<PodShape, String> {
        let spec = pod.spec.as_ref().ok_or("no spec")?;
        let limits = |c: &k8s_openapi::api::core::v1::Container| -> Result<BTreeMap<String, u64>, String> {
            let mut out = BTreeMap::new();
            for (name, q) in c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default()
            {
                let v = Quantity::parse(&q.0)
                    .ok()
                    .and_then(|q| q.as_i64_exact())
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| format!("{name} {:?} is not a whole number", q.0))?;
                out.insert(name, v);
            }
            Ok(out)
        };
        let app = spec
            .containers
            .iter()
            .find(|c| c.name == CONTAINER)
            .ok_or("no container app")?;
        let app = limits(app)?;
        let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        let init = match spec.init_containers.as_deref().unwrap_or_default() {
            [] => None,
            [c] => {
                let l = limits(c)?;
                Some((
                    usize::try_from(get(&l, "cpu")).map_err(|e| e.to_string())?,
                    get(&l, "memory") / GIB,
                ))
            }
            more => return Err(format!("{} init containers", more.len())),
        };
        Ok(PodShape {
            cpus: usize::try_from(get(&app, "cpu")).map_err(|e| e.to_string())?,
            memory_gib: get(&app, "memory") / GIB,
            devices: [GPU, NIC]
                .into_iter()
                .filter_map(|r| {
                    let n = usize::try_from(get(&app, r)).ok()?;
                    (n > 0).then(|| (r.to_owned(), n))
                })
                .collect(),
            init,
        })
    }
}

// ===================== the event log =====================

/// What happened, in order, with the time since the run began: faults injected, pod
/// operations, kubelet decisions. Printed (around the subject) when an invariant fails.
#[derive(Clone)]
pub struct EventLog {
    start: Arc<Mutex<Instant>>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl EventLog {
    fn new() -> Self {
        EventLog {
            start: Arc::new(Mutex::new(Instant::now())),
            lines: Arc::default(),
        }
    }

    /// Times count from now on (the first pod).
    fn reset_clock(&self) {
        *lock(&self.start) = Instant::now();
    }

    /// Appends a line.
    pub fn push(&self, line: impl Into<String>) {
        let t = lock(&self.start).elapsed().as_secs_f64();
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("{t:8.3}s {}", line.into()));
    }

    /// The faults, and the last `tail` lines plus every line naming one of `subjects`.
    pub fn excerpt(&self, subjects: &[String], tail: usize) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let from = lines.len().saturating_sub(tail);
        lines
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                *i >= from
                    || l.contains("FAULT")
                    || subjects.iter().any(|s| !s.is_empty() && l.contains(s.as_str()))
            })
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ===================== one simulated node =====================

/// What happened to a pod, as the kubelets and the NRT watcher saw it.
#[derive(Clone, Debug)]
pub enum Progress {
    /// Admitted; `mismatch` lists devices the kubelet gave other than the record names (with
    /// a choice), `forced` those it could not give as recorded.
    Admitted {
        /// `namespace/name`.
        pod: String,
        /// The pod's UID.
        uid: String,
        /// The node.
        node: String,
        /// Unforced disagreements with the record.
        mismatch: Vec<String>,
        /// Forced ones.
        forced: Vec<String>,
    },
    /// Released by its kubelet.
    Released {
        /// `namespace/name`.
        pod: String,
    },
    /// Shown by its node's NRT.
    Reflected {
        /// `namespace/name`.
        pod: String,
    },
    /// An invariant failed; the strings name the pods and nodes involved.
    Violation {
        /// What.
        what: String,
        /// Pod keys and node names involved.
        subjects: Vec<String>,
    },
}

/// One simulated node: its fake kubelet (pod-resources and device-plugin sides) and its
/// exporter hosting the allocator.
pub struct SoakNode {
    /// The node name.
    pub name: String,
    /// Its kubelet configuration.
    pub kind: NodeKind,
    dp: FakeDeviceKubelet,
    podres: FakeKubelet,
    state: Mutex<KubeletState>,
    exporter: tokio::sync::Mutex<Agent>,
    exporter_bin: PathBuf,
    exporter_args: Vec<String>,
    /// Held while the kubelet admits a pod, and while it or the exporter restarts.
    gate: tokio::sync::Mutex<()>,
    log: EventLog,
    _dir: tempfile::TempDir,
}

fn spawn_exporter(bin: &Path, args: &[String]) -> Result<Agent, HarnessError> {
    Agent::spawn_binary(bin, "run", args, "--listen", "info")
}

impl SoakNode {
    /// Starts the node's fake kubelet and its exporter, and waits until both pools registered.
    pub async fn start(
        name: &str,
        kind: NodeKind,
        kubeconfig: &Path,
        exporter_bin: &Path,
        resync: &str,
        log: EventLog,
    ) -> Result<SoakNode, HarnessError> {
        let parts = KubeletParts::start(kind).await?;
        let args = parts.files.exporter_args(
            name,
            kubeconfig,
            &[
                "--resync-interval",
                resync,
                "--topology-manager-scope",
                kind.scope(),
                "--api-backoff-min",
                "200ms",
                "--api-backoff-max",
                "2s",
                "--kubelet-backoff-max",
                "1s",
            ],
        );
        let mut exporter = spawn_exporter(exporter_bin, &args)?;
        exporter.wait_serving(Duration::from_secs(120)).await?;
        parts.wait_pools(Duration::from_secs(120)).await?;
        Ok(SoakNode {
            name: name.to_owned(),
            kind,
            dp: parts.dp,
            podres: parts.podres,
            state: Mutex::new(KubeletState::new(kind)),
            exporter: tokio::sync::Mutex::new(exporter),
            exporter_bin: exporter_bin.to_owned(),
            exporter_args: args,
            gate: tokio::sync::Mutex::new(()),
            log,
            _dir: parts.files.dir,
        })
    }

    fn state(&self) -> MutexGuard<'_, KubeletState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pods the kubelet holds resources for.
    pub fn admitted(&self) -> usize {
        self.state().ledger.len()
    }

    /// Waits until both plugins registered once more than `before`, after `why`.
    async fn wait_plugins(&self, before: &BTreeMap<&str, usize>, why: &str) -> Result<(), String> {
        wait_reregistered(&self.dp, &self.name, before, why).await
    }

    fn registrations(&self) -> BTreeMap<&'static str, usize> {
        pool_registrations(&self.dp)
    }

    /// Kills the exporter and starts it again; the kubelet admits nothing meanwhile (the
    /// plugin is gone) and resumes once both plugins registered again.
    pub async fn restart_exporter(&self) -> Result<(), String> {
        let _gate = self.gate.lock().await;
        let before = self.registrations();
        let mut exporter = self.exporter.lock().await;
        exporter.kill();
        *exporter = spawn_exporter(&self.exporter_bin, &self.exporter_args)
            .map_err(|e| format!("{}: exporter restart: {e}", self.name))?;
        exporter
            .wait_serving(Duration::from_secs(60))
            .await
            .map_err(|e| format!("{}: exporter restart: {e}", self.name))?;
        drop(exporter);
        self.wait_plugins(&before, "an exporter restart").await
    }

    /// A kubelet restart: the pod-resources server stops, the device-plugin directory's
    /// sockets are removed and `kubelet.sock` comes back, then pod-resources; admissions
    /// resume once both plugins registered again. Allocations survive (the checkpoint).
    pub async fn restart_kubelet(&self) -> Result<(), String> {
        let _gate = self.gate.lock().await;
        let before = self.registrations();
        self.podres.stop().await;
        self.dp
            .restart()
            .await
            .map_err(|e| format!("{}: kubelet restart: {e}", self.name))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.podres
            .restart()
            .await
            .map_err(|e| format!("{}: kubelet restart: {e}", self.name))?;
        self.wait_plugins(&before, "a kubelet restart").await
    }

    /// The node's device plugins register again mid-stream (their sockets removed while the
    /// kubelet runs, as after a plugin restart): admissions resume once both registered again.
    pub async fn reregister_plugins(&self) -> Result<(), String> {
        let _gate = self.gate.lock().await;
        reregister_plugins(&self.dp, &self.name).await
    }

    /// Restarts the part of this node that `fault` names (exporter, kubelet or device plugins);
    /// says what it did.
    pub async fn disturb(&self, fault: Fault) -> Result<String, String> {
        let node = &self.name;
        match fault {
            Fault::ExporterRestart => {
                (self.restart_exporter().await).map(|()| format!("exporter of {node} restarted"))
            }
            Fault::KubeletRestart => {
                (self.restart_kubelet().await).map(|()| format!("kubelet of {node} restarted"))
            }
            Fault::PluginReregister => (self.reregister_plugins().await)
                .map(|()| format!("device plugins of {node} registered again")),
            other => Err(format!("{other:?} is not a fault of one node")),
        }
    }

    /// What the exporter logged.
    pub async fn exporter_stderr(&self) -> String {
        self.exporter.lock().await.stderr()
    }

    /// Admits a pod bound here, as the kubelet does: the zone from the record (the Topology
    /// Manager's choice, predicted by the scheduler), the init container run first, CPUs and
    /// memory checked, devices through the device-plugin protocol, then reported through
    /// pod-resources.
    async fn admit(&self, pod: &Pod) -> Progress {
        let key = key_of(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let _gate = self.gate.lock().await;
        let violation = |what: String| Progress::Violation {
            what: format!("kubelet of {}: {key}: {what}", self.name),
            subjects: vec![key.clone(), self.name.clone()],
        };
        let raw = match pod.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) {
            Some(raw) => raw,
            None => return violation("bound without an allocation record".into()),
        };
        let record = match Allocation::parse(raw) {
            Ok(r) => r,
            Err(e) => return violation(format!("record: {e}")),
        };
        if record.node != self.name {
            return violation(format!("record names node {}", record.node));
        }
        let shape = match PodShape::from_pod(pod) {
            Ok(s) => s,
            Err(e) => return violation(e),
        };
        let app = record.containers.iter().find(|c| c.name == CONTAINER);
        let affinity = match self.kind {
            NodeKind::PodScope => record
                .pod_numa_nodes
                .clone()
                .or_else(|| app.and_then(|c| c.numa_nodes.clone())),
            NodeKind::StaticMemory => app.and_then(|c| c.numa_nodes.clone()),
        };
        let zone = match affinity.as_deref() {
            Some([z]) => *z,
            other => {
                return violation(format!(
                    "single-numa-node needs one zone, the record has {other:?}"
                ));
            }
        };
        if let Some((cpus, gib)) = shape.init {
            if self.kind != NodeKind::PodScope {
                return violation(format!(
                    "a pod with an init container on a {:?} node (nodeSelector)",
                    self.kind
                ));
            }
            // The init container runs first in the pod's zone, then its CPUs and memory are the
            // app container's to reuse.
            if let Err(e) = self.state().ledger.check_fit(&key, zone, cpus, gib) {
                return violation(format!("init container: {e}"));
            }
        }
        if let Err(e) = self
            .state()
            .ledger
            .check_fit(&key, zone, shape.cpus, shape.memory_gib)
        {
            return violation(e.to_string());
        }
        // The kubelet lists the pod it admits, devices still to come.
        self.state().list_admitting(&key, &self.podres);
        let planned = app.map(|c| c.devices.clone()).unwrap_or_default();
        // Whether the kubelet could give the recorded devices: all free in the zone now.
        let choice: BTreeMap<String, bool> = {
            let st = self.state();
            planned
                .iter()
                .map(|(res, ids)| {
                    let free = st.ledger.free_devices(res, zone);
                    (res.clone(), ids.iter().all(|id| free.contains(id)))
                })
                .collect()
        };
        let devices =
            match allocate_devices(&self.dp, &self.state, &self.podres, &key, zone, &shape.devices).await {
                Ok(devices) => devices,
                Err(error) => return violation(format!("device admission failed: {error}")),
            };
        let resources: BTreeSet<&String> = devices.keys().chain(planned.keys()).collect();
        let mut mismatch = Vec::new();
        let mut forced = Vec::new();
        for res in resources {
            let want: BTreeSet<&String> = planned.get(res).into_iter().flatten().collect();
            let got: BTreeSet<&String> = devices.get(res).into_iter().flatten().collect();
            if want != got {
                let line = format!(
                    "{key} on {}: {res} recorded {want:?}, allocated {got:?}",
                    self.name
                );
                if choice.get(res).copied().unwrap_or(true) {
                    mismatch.push(line);
                } else {
                    forced.push(line);
                }
            }
        }
        let mut st = self.state();
        if let Err(e) = st
            .ledger
            .commit(&key, zone, shape.cpus, shape.memory_gib, devices.clone())
        {
            st.report(&self.podres);
            drop(st);
            self.dp.remove_pod(&key);
            return violation(e.to_string());
        }
        st.report(&self.podres);
        drop(st);
        self.log.push(format!(
            "admit {key} on {} zone {zone} devices {devices:?}",
            self.name
        ));
        Progress::Admitted {
            pod: key,
            uid,
            node: self.name.clone(),
            mismatch,
            forced,
        }
    }

    /// The pod is gone: the device manager and the ledger free what it held.
    fn release(&self, key: &str) -> bool {
        self.dp.remove_pod(key);
        self.state().release(key, &self.podres)
    }

    /// Checks an NRT of this node against the kubelet state with its fingerprint; returns the
    /// pods it accounts for.
    fn check_nrt(&self, nrt: &NodeResourceTopology) -> Result<BTreeSet<String>, String> {
        self.state().check_nrt(nrt)
    }

    /// Admits and releases what the pod watch dispatches to this node, in batches sorted by
    /// creation time then name (as the kubelet's HandlePodAdditions), and marks admitted pods
    /// Running.
    async fn run_kubelet(
        self: Arc<Self>,
        client: kube::Client,
        mut rx: mpsc::UnboundedReceiver<NodeEvent>,
        progress: mpsc::UnboundedSender<Progress>,
    ) {
        while let Some(first) = rx.recv().await {
            let batch = with_queued(first, &mut rx);
            let mut added = Vec::new();
            for event in batch {
                match event {
                    NodeEvent::Add(pod) => added.push(*pod),
                    NodeEvent::Gone(key) => {
                        added.retain(|p| key_of(p) != key);
                        if self.release(&key) {
                            self.log.push(format!("release {key} on {}", self.name));
                            if progress.send(Progress::Released { pod: key }).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            admission_order(&mut added);
            for pod in added {
                let outcome = self.admit(&pod).await;
                if matches!(outcome, Progress::Admitted { .. }) {
                    mark_running(&client, &pod);
                }
                if progress.send(outcome).is_err() {
                    return;
                }
            }
        }
    }
}

/// What the pod watch tells one node's kubelet.
enum NodeEvent {
    /// A pod bound to the node appeared.
    Add(Box<Pod>),
    /// The pod (`namespace/name`) is gone.
    Gone(String),
}

/// One pod watch for every kubelet (the real ones each watch `spec.nodeName=<self>`; one
/// stream keeps the fake API's load at that of a few watchers): dispatches pods bound to a
/// node to its kubelet, and removals, relists included.
async fn dispatch_pods(
    client: kube::Client,
    ns: String,
    nodes: BTreeMap<String, mpsc::UnboundedSender<NodeEvent>>,
) {
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    // key → (node, uid)
    let mut known: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut relist: Option<BTreeSet<String>> = None;
    let send = |node: &str, ev: NodeEvent| nodes.get(node).is_some_and(|tx| tx.send(ev).is_ok());
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => relist = Some(BTreeSet::new()),
            Ok(watcher::Event::InitApply(pod)) | Ok(watcher::Event::Apply(pod)) => {
                let key = key_of(&pod);
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let terminal = is_terminal(&pod);
                if let Some(seen) = relist.as_mut() {
                    seen.insert(key.clone());
                }
                // Gone, or replaced under its name by another pod.
                if let Some((was, was_uid)) = known.get(&key).cloned()
                    && (terminal || pod.metadata.deletion_timestamp.is_some() || was_uid != uid)
                {
                    known.remove(&key);
                    send(&was, NodeEvent::Gone(key.clone()));
                }
                if let Some(node) = node
                    && !terminal
                    && pod.metadata.deletion_timestamp.is_none()
                    && !known.contains_key(&key)
                {
                    known.insert(key, (node.clone(), uid));
                    send(&node, NodeEvent::Add(Box::new(pod)));
                }
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    let gone: Vec<String> = known.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                    for key in gone {
                        if let Some((node, _)) = known.remove(&key) {
                            send(&node, NodeEvent::Gone(key));
                        }
                    }
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                let key = key_of(&pod);
                if let Some((node, _)) = known.remove(&key) {
                    send(&node, NodeEvent::Gone(key));
                }
            }
            // Retried by the backoff; the relist that follows restores the picture.
            Err(_) => {}
        }
    }
}

/// Watches every NRT, checks each against its node's kubelet state, and reports the pods each
/// accounts for (once per pod admission) and any disagreement.
async fn watch_nrts(
    client: kube::Client,
    nodes: BTreeMap<String, Arc<SoakNode>>,
    progress: mpsc::UnboundedSender<Progress>,
) {
    harness::kubelet::watch_nrts(client, |nrt| {
        let Some(node) = nrt.metadata.name.as_ref().and_then(|n| nodes.get(n)) else {
            return true;
        };
        match node.check_nrt(&nrt) {
            Ok(pods) => pods
                .into_iter()
                .all(|pod| progress.send(Progress::Reflected { pod }).is_ok()),
            Err(what) => progress
                .send(Progress::Violation {
                    what: format!("NRT of {} disagrees with its kubelet: {what}", node.name),
                    subjects: vec![node.name.clone()],
                })
                .is_ok(),
        }
    })
    .await;
}

// ===================== schedulers =====================

/// The scheduler replicas, elected through a Lease in the fake API. Each process gets its own
/// token (`sched-<n>`), so its requests can be told apart.
struct Schedulers {
    fake: FakeApiServer,
    bin: PathBuf,
    dir: tempfile::TempDir,
    ns: String,
    cfg: SoakConfig,
    replicas: Vec<(Agent, String)>,
    spawned: usize,
    /// Every replica process's log file, labelled `<identity>#<n>`.
    logs: Arc<Mutex<Vec<(String, PathBuf)>>>,
    /// Stopped replicas, kept so their logs can still be read.
    dead: Vec<Agent>,
}

impl Schedulers {
    async fn spawn(&mut self, identity: &str) -> Result<(), HarnessError> {
        self.spawned += 1;
        let token = format!("sched-{}", self.spawned);
        let kubeconfig = self.fake.write_kubeconfig_as(self.dir.path(), &token)?;
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let args: Vec<String> = [
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--leader-elect=true",
            "--leader-elect-resource-name",
            "numaplane-soak",
            "--leader-elect-resource-namespace",
            &self.ns,
            "--leader-elect-identity",
            identity,
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-before",
            "2s",
            "--pod-initial-backoff",
            &secs(self.cfg.initial_backoff),
            "--pod-max-backoff",
            &secs(self.cfg.max_backoff),
            "--kube-api-qps",
            "500",
            "--kube-api-burst",
            "500",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut agent = Agent::spawn_binary(
            &self.bin,
            "run",
            &args,
            "--listen",
            "info,numaplane_scheduler=debug,kube_lease_manager=info",
        )?;
        agent.wait_serving(Duration::from_secs(60)).await?;
        lock(&self.logs).push((
            format!("{identity}#{}", self.spawned),
            agent.stderr_path().to_owned(),
        ));
        self.replicas.push((agent, identity.to_owned()));
        Ok(())
    }

    /// The index of the replica that says it leads, waiting up to `timeout` for one.
    async fn leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<usize> = self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, (a, _))| {
                    metric_value(
                        &a.metrics().unwrap_or_default(),
                        "numaplane_scheduler_leader",
                        &[],
                    ) == Some(1.0)
                })
                .map(|(i, _)| i)
                .collect();
            if let [one] = leaders.as_slice() {
                return Some(*one);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the leader: SIGKILL and restart under the same identity (a crash and restart), or
    /// SIGTERM (it releases the Lease; the standby takes over) and a new standby. Returns
    /// what happened.
    async fn stop_leader(&mut self, graceful: bool) -> Result<String, String> {
        let Some(i) = self.leader(Duration::from_secs(30)).await else {
            return Err("no single scheduler leader within 30 s".into());
        };
        let (mut agent, identity) = self.replicas.remove(i);
        let pid = agent.pid();
        if graceful {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while agent.exited().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        agent.kill();
        self.dead.push(agent);
        let next = if graceful {
            format!("replica-{}", self.spawned + 1)
        } else {
            identity.clone()
        };
        self.spawn(&next).await.map_err(|e| e.to_string())?;
        let leader = self.leader(Duration::from_secs(30)).await;
        Ok(format!(
            "{} leader {identity} (pid {pid}), started {next}; leader now {:?}",
            if graceful { "SIGTERM" } else { "SIGKILL" },
            leader.and_then(|l| self.replicas.get(l)).map(|(_, id)| id)
        ))
    }

    fn stderr(&self) -> String {
        self.replicas
            .iter()
            .map(|(a, id)| {
                let log = a.stderr();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                format!(
                    "--- scheduler {id} (last 40 lines)\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ===================== faults =====================

/// A fault the soak injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Every watch ends while a Binding is held in flight for a second or two.
    WatchDropMidBind,
    /// The watch history is compacted and every watch ends while a Binding is held in flight:
    /// watches resume with 410 Gone and relist.
    RelistMidBind,
    /// A Binding lands, and its answer is the 409 "already assigned" of the retry.
    ConflictAlreadyAssigned,
    /// A pending pod is deleted and recreated under its name just before its Binding: 409 on
    /// the UID precondition.
    ConflictUidPrecondition,
    /// The next Bindings answer 500.
    BindServerError,
    /// The next Bindings answer 504 (the API server's request timeout).
    BindTimeout,
    /// A Binding is answered seconds late.
    SlowBind,
    /// A node's next NRT writes answer 500.
    NrtServerError,
    /// A node's next NRT write is applied and answered seconds late.
    NrtDelayed,
    /// The leading scheduler is SIGKILLed and started again.
    SchedulerRestart,
    /// The leading scheduler is stopped (SIGTERM): the standby takes over.
    LeaderChange,
    /// A node's exporter is killed and started again.
    ExporterRestart,
    /// A node's kubelet restarts: sockets removed and recreated.
    KubeletRestart,
    /// A node's device plugins register again while its kubelet runs.
    PluginReregister,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 14] = [
        Fault::WatchDropMidBind,
        Fault::RelistMidBind,
        Fault::ConflictAlreadyAssigned,
        Fault::ConflictUidPrecondition,
        Fault::BindServerError,
        Fault::BindTimeout,
        Fault::SlowBind,
        Fault::NrtServerError,
        Fault::NrtDelayed,
        Fault::SchedulerRestart,
        Fault::LeaderChange,
        Fault::ExporterRestart,
        Fault::KubeletRestart,
        Fault::PluginReregister,
    ];
}

/// The fault schedule of a seed: `per_kind` of each kind plus extras, shuffled, spread evenly
/// over 5–90% of the span, each with a target seed.
pub fn schedule(cfg: &SoakConfig) -> Vec<(Duration, Fault, u64)> {
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0xfa17_5eed);
    let mut kinds: Vec<Fault> = Fault::ALL
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, cfg.per_kind))
        .collect();
    for _ in 0..cfg.extra_faults {
        kinds.push(Fault::ALL[rng.random_range(0..Fault::ALL.len())]);
    }
    kinds.shuffle(&mut rng);
    let n = kinds.len().max(1) as f64;
    let span = cfg.span.as_secs_f64();
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let at = span * (0.05 + 0.85 * (i as f64 + rng.random_range(0.0..1.0)) / n);
            (Duration::from_secs_f64(at), k, rng.random())
        })
        .collect()
}

// ===================== the run =====================

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// The seed.
    pub seed: u64,
    /// Nodes, and how many were pod-scope.
    pub nodes: (usize, usize),
    /// Pods created (unfit ones included), with an init container, unfit.
    pub created: (usize, usize, usize),
    /// Pods admitted by a kubelet.
    pub admitted: usize,
    /// Pods deleted while the run went on.
    pub deleted: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Binding answers by status.
    pub binding_answers: BTreeMap<u16, usize>,
    /// NRT write answers by status.
    pub nrt_answers: BTreeMap<u16, usize>,
    /// Pod LISTs (relists of the scheduler's and the kubelets' watches).
    pub pod_lists: usize,
    /// Unschedulable attempts (the schedulers' logs), and the most of one pod by one replica.
    pub unschedulable_attempts: (usize, usize),
    /// `PodScheduled=False` writes.
    pub unschedulable_writes: usize,
    /// Shortest interval between two such writes of one pod by one replica.
    pub shortest_retry: Option<Duration>,
    /// Wall time from the first pod to the end.
    pub wall: Duration,
    /// DRA: pods created with a ResourceClaim, the most claims allocated at once, passes of
    /// the claim invariants ([`crate::soak_dra::check`]).
    pub dra: (usize, usize, usize),
}

/// How often pods were tried.
#[derive(Default)]
struct Retries {
    /// Unschedulable attempts per (replica process, pod name), in seconds of the UTC day (the
    /// scheduler's own log time).
    attempts: BTreeMap<(String, String), Vec<f64>>,
    /// `PodScheduled=False` writes per (replica token, pod name).
    writes: BTreeMap<(String, String), Vec<Instant>>,
    /// When a pod was recreated under its name (a new pod: its attempts start afresh).
    recreated: BTreeMap<String, (Instant, f64)>,
    /// Shortest gap between two attempts of one pod by one replica.
    shortest: Option<Duration>,
}

/// Seconds since the start of the UTC day, as the schedulers' log lines show time.
fn day_seconds_now() -> f64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    since.as_secs_f64() % 86_400.0
}

/// The time of a log line (`2026-01-01T12:34:56.789012Z …`, colours removed) in seconds of the
/// UTC day.
fn day_seconds_of(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let (_, time) = stamp.split_once('T')?;
    let time = time.strip_suffix('Z')?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Binding answers and NRT write answers by status, and pod LISTs.
type Answers = (BTreeMap<u16, usize>, BTreeMap<u16, usize>, usize);

/// Shared between the driver, the fault injector and the monitor.
struct Shared {
    violations: Mutex<Vec<(String, Vec<String>)>>,
    /// The pods of the run, by index.
    shapes: Vec<PodShape>,
    /// Pods created so far.
    created: std::sync::atomic::AtomicUsize,
    retries: Mutex<Retries>,
    faults: Mutex<BTreeMap<String, usize>>,
    /// Binding answers, NRT write answers (by status), pod LISTs.
    answers: Mutex<Answers>,
    faults_done: std::sync::atomic::AtomicBool,
    /// Pods armed to be recreated before their first Binding (`name`).
    recreates: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn violate(&self, log: &EventLog, what: String, subjects: Vec<String>) {
        log.push(format!("VIOLATION {what}"));
        lock(&self.violations).push((what, subjects));
    }
}

/// The soak: set up, run, check. See the module comment.
pub struct Soak;

impl Soak {
    /// Runs `cfg` to the end; on a violation prints the seed, the replay command and the
    /// event log excerpt, and panics.
    pub async fn run(cfg: SoakConfig) -> SoakReport {
        eprintln!(
            "soak: seed {} ({} nodes, {} pods); replay with {SEED_ENV}={}",
            cfg.seed, cfg.nodes, cfg.pods, cfg.seed
        );
        let log = EventLog::new();
        match Self::try_run(&cfg, &log).await {
            Ok(report) => report,
            Err((what, subjects, extra)) => {
                let replay = if cfg.release {
                    format!(
                        "{SEED_ENV}={} cargo test -p numaplane-e2e --test soak -- --ignored soak",
                        cfg.seed
                    )
                } else {
                    format!("{SEED_ENV}={} cargo test -p numaplane-e2e --test soak", cfg.seed)
                };
                #[allow(clippy::panic)]
                {
                    panic!(
                        "soak seed {} failed: {what}\nreplay: {replay}\n--- event log (faults, the last lines, and lines naming {subjects:?})\n{}\n{extra}",
                        cfg.seed,
                        log.excerpt(&subjects, 40)
                    );
                }
            }
        }
    }

    #[allow(clippy::too_many_lines)]
    async fn try_run(cfg: &SoakConfig, log: &EventLog) -> Result<SoakReport, (String, Vec<String>, String)> {
        let fail = |e: HarnessError| (format!("set-up: {e}"), Vec::new(), String::new());
        let (scheduler_bin, exporter_bin) = if cfg.release {
            let (s, e) = crate::binaries::release();
            (s.to_owned(), e.to_owned())
        } else {
            (
                crate::binaries::scheduler().to_owned(),
                crate::binaries::exporter().to_owned(),
            )
        };
        let setup = Instant::now();
        let fake = FakeApiServer::start().await.map_err(|e| fail(e.into()))?;
        fake.install_nrt_crd();
        let dir = tempfile::tempdir().map_err(|e| fail(e.into()))?;
        let kubeconfig = fake
            .write_kubeconfig_as(dir.path(), "exporter")
            .map_err(|e| fail(e.into()))?;
        let client = fake.client().await.map_err(fail)?;
        let ns = "soak".to_owned();
        fake.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));

        // Nodes: kinds from the seed, at least one of each.
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let kinds: Vec<NodeKind> = (0..cfg.nodes)
            .map(|i| match i {
                0 => NodeKind::StaticMemory,
                1 => NodeKind::PodScope,
                _ if rng.random_bool(1.0 / 3.0) => NodeKind::PodScope,
                _ => NodeKind::StaticMemory,
            })
            .collect();
        let names: Vec<String> = (0..cfg.nodes).map(|i| format!("soak-node-{i:03}")).collect();
        for (name, kind) in names.iter().zip(&kinds) {
            let mut labels = json!({"numaplane.io/e2e": "true"});
            if *kind == NodeKind::PodScope {
                labels[POD_SCOPE_LABEL] = json!("true");
            }
            fake.put(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "status": {"allocatable": crate::whole_system::node_allocatable(),
                           "capacity": crate::whole_system::node_allocatable()}}));
        }
        // GPUs as ResourceSlices on the static-memory nodes only.
        let dra_nodes: BTreeSet<String> = names
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k == NodeKind::StaticMemory)
            .map(|(n, _)| n.clone())
            .collect();
        crate::soak_dra::setup(&fake, &ns, &dra_nodes.iter().cloned().collect::<Vec<_>>());
        let dra_stats = Arc::new(crate::soak_dra::Stats::default());
        let mut nodes: BTreeMap<String, Arc<SoakNode>> = BTreeMap::new();
        let pairs: Vec<(String, NodeKind)> = names.iter().cloned().zip(kinds.iter().copied()).collect();
        for chunk in pairs.chunks(cfg.start_batch.max(1)) {
            let started = futures::future::try_join_all(chunk.iter().map(|(name, kind)| {
                SoakNode::start(name, *kind, &kubeconfig, &exporter_bin, cfg.resync, log.clone())
            }))
            .await
            .map_err(fail)?;
            for n in started {
                nodes.insert(n.name.clone(), Arc::new(n));
            }
        }
        let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
        for name in nodes.keys() {
            let deadline = Instant::now() + Duration::from_secs(120);
            while nrts.get_opt(name).await.ok().flatten().is_none() {
                if Instant::now() > deadline {
                    return Err((
                        format!("no NRT for {name} after 120 s"),
                        vec![name.clone()],
                        String::new(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        let kubelet_client = {
            let kc = fake
                .write_kubeconfig_as(dir.path(), "kubelet")
                .map_err(|e| fail(e.into()))?;
            let text = std::fs::read_to_string(kc).map_err(|e| fail(e.into()))?;
            let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| fail(e.into()))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| fail(e.into()))?;
            kube::Client::try_from(config).map_err(|e| fail(e.into()))?
        };
        let mut senders = BTreeMap::new();
        for node in nodes.values() {
            let (ntx, nrx) = mpsc::unbounded_channel();
            senders.insert(node.name.clone(), ntx);
            tasks.push(tokio::spawn(node.clone().run_kubelet(
                kubelet_client.clone(),
                nrx,
                tx.clone(),
            )));
        }
        tasks.push(tokio::spawn(dispatch_pods(
            kubelet_client.clone(),
            ns.clone(),
            senders,
        )));
        tasks.push(tokio::spawn(watch_nrts(
            client.clone(),
            nodes.clone(),
            tx.clone(),
        )));
        let mut schedulers = Schedulers {
            fake: fake.clone(),
            bin: scheduler_bin,
            dir: tempfile::tempdir().map_err(|e| fail(e.into()))?,
            ns: ns.clone(),
            cfg: cfg.clone(),
            replicas: Vec::new(),
            spawned: 0,
            logs: Arc::default(),
            dead: Vec::new(),
        };
        for id in ["replica-a", "replica-b"] {
            schedulers.spawn(id).await.map_err(fail)?;
        }
        if schedulers.leader(Duration::from_secs(30)).await.is_none() {
            return Err((
                "no scheduler leader after 30 s".into(),
                Vec::new(),
                schedulers.stderr(),
            ));
        }
        eprintln!(
            "soak: {} nodes ({} pod-scope), 2 scheduler replicas up after {:.1} s",
            nodes.len(),
            kinds.iter().filter(|k| **k == NodeKind::PodScope).count(),
            setup.elapsed().as_secs_f64()
        );

        // The pods of this seed.
        let shapes: Vec<PodShape> = (0..cfg.pods)
            .map(|i| {
                // A few that fit nowhere, two at least.
                if i == 3 || i == cfg.pods / 2 || rng.random_bool(0.005) {
                    PodShape::unfit()
                } else {
                    PodShape::random(&mut rng)
                }
            })
            .collect();
        let shared = Arc::new(Shared {
            violations: Mutex::default(),
            shapes: shapes.clone(),
            created: std::sync::atomic::AtomicUsize::new(0),
            retries: Mutex::default(),
            faults: Mutex::default(),
            answers: Mutex::default(),
            faults_done: std::sync::atomic::AtomicBool::new(false),
            recreates: Mutex::default(),
        });
        let schedulers = Arc::new(tokio::sync::Mutex::new(schedulers));
        let plan = schedule(cfg);
        log.push(format!(
            "seed {}: {} faults planned: {}",
            cfg.seed,
            plan.len(),
            plan.iter()
                .map(|(t, f, _)| format!("{:.1}s {f:?}", t.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let start = Instant::now();
        log.reset_clock();
        tasks.push(tokio::spawn(inject(
            plan,
            fake.clone(),
            ns.clone(),
            nodes.clone(),
            schedulers.clone(),
            shared.clone(),
            log.clone(),
        )));
        let sched_logs = schedulers.lock().await.logs.clone();
        tasks.push(tokio::spawn(monitor(
            fake.clone(),
            ns.clone(),
            cfg.initial_backoff,
            shared.clone(),
            sched_logs,
            log.clone(),
        )));

        tasks.push(tokio::spawn(crate::soak_dra::watch(
            client.clone(),
            ns.clone(),
            dra_nodes,
            dra_stats.clone(),
            {
                let (shared, log) = (shared.clone(), log.clone());
                move |what, subjects| shared.violate(&log, what, subjects)
            },
        )));

        let result = drive(cfg, &client, &ns, &mut rx, &shared, log, start, &fake).await;
        let wall = start.elapsed();
        for t in &tasks {
            t.abort();
        }
        let extra = |sched: &Schedulers| sched.stderr();
        let mut report = match result {
            Ok(r) => r,
            Err((what, subjects)) => {
                let sched = schedulers.lock().await;
                let mut more = extra(&sched);
                for s in &subjects {
                    if let Some(node) = nodes.get(s) {
                        let log = node.exporter_stderr().await;
                        let tail: Vec<&str> = log.lines().rev().take(30).collect();
                        more.push_str(&format!(
                            "\n--- exporter of {s} (last 30 lines)\n{}",
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        ));
                    }
                }
                return Err((what, subjects, more));
            }
        };
        report.seed = cfg.seed;
        report.wall = wall;
        report.nodes = (
            cfg.nodes,
            kinds.iter().filter(|k| **k == NodeKind::PodScope).count(),
        );
        report.faults = lock(&shared.faults).clone();
        {
            use std::sync::atomic::Ordering;
            report.dra = (
                dra_stats.pods.load(Ordering::SeqCst),
                dra_stats.most_allocated.load(Ordering::SeqCst),
                dra_stats.checks.load(Ordering::SeqCst),
            );
        }
        if report.dra.1 == 0 || report.dra.2 == 0 {
            let sched = schedulers.lock().await;
            return Err((
                format!(
                    "no ResourceClaim was ever allocated and checked (DRA: {:?})",
                    report.dra
                ),
                Vec::new(),
                extra(&sched),
            ));
        }
        {
            let answers = lock(&shared.answers);
            report.binding_answers = answers.0.clone();
            report.nrt_answers = answers.1.clone();
            report.pod_lists = answers.2;
        }
        {
            let retries = lock(&shared.retries);
            report.unschedulable_attempts = (
                retries.attempts.values().map(Vec::len).sum(),
                retries.attempts.values().map(Vec::len).max().unwrap_or(0),
            );
            report.unschedulable_writes = retries.writes.values().map(Vec::len).sum();
            report.shortest_retry = retries.shortest;
        }
        // Every kind of fault was injected.
        let missing: Vec<Fault> = Fault::ALL
            .iter()
            .filter(|k| !report.faults.contains_key(&format!("{k:?}")))
            .copied()
            .collect();
        if !missing.is_empty() {
            let sched = schedulers.lock().await;
            return Err((
                format!("faults never injected: {missing:?}"),
                Vec::new(),
                extra(&sched),
            ));
        }
        drop(schedulers);
        drop(nodes);
        Ok(report)
    }
}

/// Creates, follows and deletes the pods until every pod that fits went the whole way; checks
/// what the kubelets and the NRT watcher report as it comes.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
async fn drive(
    cfg: &SoakConfig,
    client: &kube::Client,
    ns: &str,
    progress: &mut mpsc::UnboundedReceiver<Progress>,
    shared: &Shared,
    log: &EventLog,
    start: Instant,
    fake: &FakeApiServer,
) -> Result<SoakReport, (String, Vec<String>)> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let shapes = &shared.shapes;
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0xde1e7e);
    // Which pods claim a device: its own stream, so the other choices stay those of the seed.
    let mut dra_rng = StdRng::seed_from_u64(cfg.seed ^ 0xd2a);
    let mut report = SoakReport::default();
    let fitting = shapes.iter().filter(|s| s.fits()).count();
    let mut alive: BTreeSet<String> = BTreeSet::new();
    let mut admitted: BTreeMap<String, String> = BTreeMap::new(); // key → uid
    let mut admitted_uids: BTreeSet<String> = BTreeSet::new();
    let mut reflected_done: BTreeSet<String> = BTreeSet::new();
    let mut deletable: Vec<String> = Vec::new();
    let mut last_progress = Instant::now();
    let mut created = 0usize;
    let key = |name: &str| format!("{ns}/{name}");
    loop {
        // Creations at a steady pace over the span, while the window has room.
        let due =
            ((start.elapsed().as_secs_f64() / cfg.span.as_secs_f64()) * shapes.len() as f64).ceil() as usize;
        while created < shapes.len().min(due.max(1)) && alive.len() < cfg.window {
            let shape = &shapes[created];
            let name = format!("p-{created:05}");
            let mut pod = shape.pod(&name);
            let dra = if shape.fits() && shape.init.is_none() {
                crate::soak_dra::DraUse::random(&mut dra_rng)
            } else {
                crate::soak_dra::DraUse::None
            };
            crate::soak_dra::decorate(fake, ns, &mut pod, dra);
            let pod: Pod = serde_json::from_value(pod).map_err(|e| (e.to_string(), vec![]))?;
            // The fake may have an injected failure queued for other paths only.
            api.create(&PostParams::default(), &pod)
                .await
                .map_err(|e| (format!("creating {name}: {e}"), vec![key(&name)]))?;
            log.push(format!(
                "create {} {}cpu {}Gi {:?}{}{}{}",
                key(&name),
                shape.cpus,
                shape.memory_gib,
                shape.devices,
                dra.claim(&name)
                    .map(|c| format!(" claim {c}"))
                    .unwrap_or_default(),
                shape.init.map(|i| format!(" init {i:?}")).unwrap_or_default(),
                if shape.fits() { "" } else { " (fits nowhere)" }
            ));
            report.created.0 += 1;
            if shape.init.is_some() {
                report.created.1 += 1;
            }
            if shape.fits() {
                alive.insert(key(&name));
            } else {
                report.created.2 += 1;
            }
            created += 1;
            shared.created.store(created, std::sync::atomic::Ordering::SeqCst);
        }
        let events = match tokio::time::timeout(Duration::from_millis(200), progress.recv()).await {
            Ok(Some(first)) => with_queued(first, progress),
            _ => Vec::new(),
        };
        for event in events {
            match event {
                Progress::Admitted {
                    pod,
                    uid,
                    node,
                    mismatch,
                    forced,
                } => {
                    last_progress = Instant::now();
                    if !admitted_uids.insert(uid.clone()) {
                        shared.violate(
                            log,
                            format!("{pod} (uid {uid}) admitted twice, now on {node}"),
                            vec![pod.clone()],
                        );
                    }
                    if let Some(line) = mismatch.first() {
                        shared.violate(
                            log,
                            format!("the record disagrees with what the kubelet gave, which could follow it: {line}"),
                            vec![pod.clone(), node.clone()],
                        );
                    }
                    // Every device here is healthy and registered: the only reason the
                    // kubelet cannot follow a record is that another pod holds what it names.
                    if let Some(line) = forced.first() {
                        shared.violate(
                            log,
                            format!("the record names devices another pod holds (booked twice): {line}"),
                            vec![pod.clone(), node.clone()],
                        );
                    }
                    admitted.insert(pod, uid);
                    report.admitted += 1;
                }
                Progress::Released { pod } => {
                    admitted.remove(&pod);
                }
                Progress::Reflected { pod } => {
                    // The first NRT showing an admitted, undeleted pod makes it deletable.
                    if admitted.contains_key(&pod)
                        && alive.contains(&pod)
                        && reflected_done.insert(pod.clone())
                    {
                        last_progress = Instant::now();
                        deletable.push(pod);
                    }
                }
                Progress::Violation { what, subjects } => shared.violate(log, what, subjects),
            }
        }
        if let Some((what, subjects)) = lock(&shared.violations).first().cloned() {
            return Err((what, subjects));
        }
        // Half a window of reflected pods stays alive while pods are still being created;
        // then the rest go, so the last pending pods find room.
        let keep = if created < shapes.len() { cfg.window / 2 } else { 0 };
        while deletable.len() > keep {
            let k = deletable.swap_remove(rng.random_range(0..deletable.len()));
            let name = k.rsplit('/').next().unwrap_or_default().to_owned();
            match api.delete(&name, &DeleteParams::default().grace_period(0)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err((format!("deleting {k}: {e}"), vec![k])),
            }
            log.push(format!("delete {k}"));
            alive.remove(&k);
            report.deleted += 1;
        }
        let faults_done = shared.faults_done.load(std::sync::atomic::Ordering::SeqCst);
        if reflected_done.len() == fitting && faults_done {
            break;
        }
        let waiting: Vec<String> = alive
            .iter()
            .filter(|k| !reflected_done.contains(*k))
            .cloned()
            .collect();
        if !waiting.is_empty() && last_progress.elapsed() > cfg.stall {
            return Err((
                format!(
                    "no pod went further for {:?}; {} pods that fit wait: {:?}",
                    cfg.stall,
                    waiting.len(),
                    waiting.iter().take(10).collect::<Vec<_>>()
                ),
                waiting.into_iter().take(5).collect(),
            ));
        }
        if start.elapsed() > cfg.deadline {
            return Err((
                format!(
                    "deadline {:?}: {} of {fitting} fitting pods went the whole way, faults done: {faults_done}",
                    cfg.deadline,
                    reflected_done.len()
                ),
                waiting.into_iter().take(5).collect(),
            ));
        }
    }
    // No UID bound twice, as the fake stored them.
    let twice = fake.bound_more_than_once();
    if !twice.is_empty() {
        return Err((
            format!("pods bound more than once (uid, bindings): {twice:?}"),
            Vec::new(),
        ));
    }
    // The pods that fit nowhere stayed pending, and were tried again.
    let unfit: Vec<String> = shapes
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.fits())
        .map(|(i, _)| format!("p-{i:05}"))
        .collect();
    for name in &unfit {
        let pod = api
            .get(name)
            .await
            .map_err(|e| (e.to_string(), vec![key(name)]))?;
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return Err((
                format!("{name} fits nowhere but was bound to {node}"),
                vec![key(name), node],
            ));
        }
    }
    let retried = {
        let r = lock(&shared.retries);
        r.attempts
            .iter()
            .filter(|((_, p), _)| unfit.contains(p))
            .map(|(_, v)| v.len())
            .max()
            .unwrap_or(0)
    };
    if retried < 2 {
        return Err((
            format!(
                "the pods that fit nowhere were tried {retried} times at most by one replica: the backoff check saw nothing"
            ),
            unfit.iter().map(|n| key(n)).collect(),
        ));
    }
    Ok(report)
}

/// Injects the planned faults at their times.
async fn inject(
    plan: Vec<(Duration, Fault, u64)>,
    fake: FakeApiServer,
    ns: String,
    nodes: BTreeMap<String, Arc<SoakNode>>,
    schedulers: Arc<tokio::sync::Mutex<Schedulers>>,
    shared: Arc<Shared>,
    log: EventLog,
) {
    let start = Instant::now();
    let names: Vec<String> = nodes.keys().cloned().collect();
    let bindings = format!("/api/v1/namespaces/{ns}/pods/");
    let nrt_path = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/";
    for (at, fault, target) in plan {
        tokio::time::sleep(at.saturating_sub(start.elapsed())).await;
        let mut rng = StdRng::seed_from_u64(target);
        let node = names[rng.random_range(0..names.len())].clone();
        let held = Duration::from_millis(rng.random_range(800..2500));
        let what: Result<String, String> = match fault {
            Fault::WatchDropMidBind | Fault::RelistMidBind => {
                let compact = fault == Fault::RelistMidBind;
                fake.change_then_answer_after(
                    "POST",
                    &bindings,
                    vec![StoreChange::CloseWatches { compact }],
                    held,
                );
                Ok(format!(
                    "armed: the next Binding closes every watch (compact: {compact}) and is answered {held:?} later"
                ))
            }
            Fault::ConflictAlreadyAssigned => {
                fake.land_then_repeat_next("POST", &bindings);
                Ok("armed: the next Binding lands and is answered 409 already assigned".into())
            }
            Fault::ConflictUidPrecondition => {
                // A pod a little ahead of the creations: it will exist, unbound, when its first
                // Binding comes.
                let created = shared.created.load(std::sync::atomic::Ordering::SeqCst);
                let ahead = created.saturating_add(rng.random_range(2..12));
                match (ahead..shared.shapes.len()).find(|i| shared.shapes[*i].fits()) {
                    Some(i) => {
                        let name = format!("p-{i:05}");
                        let mut again = shared.shapes[i].pod(&name);
                        again["metadata"]["namespace"] = json!(ns);
                        fake.change_before_next(
                            "POST",
                            &format!("{bindings}{name}/binding"),
                            vec![
                                StoreChange::Delete {
                                    api_version: "v1".into(),
                                    kind: "Pod".into(),
                                    namespace: Some(ns.clone()),
                                    name: name.clone(),
                                },
                                StoreChange::Put(again),
                            ],
                        );
                        lock(&shared.recreates).push(name.clone());
                        Ok(format!(
                            "armed: {ns}/{name} is deleted and recreated just before its first Binding"
                        ))
                    }
                    None => Err("no pod left to create".into()),
                }
            }
            Fault::BindServerError => {
                let n = rng.random_range(1..4);
                fake.fail_next("POST", &bindings, 500, n);
                Ok(format!("the next {n} Bindings answer 500"))
            }
            Fault::BindTimeout => {
                let n = rng.random_range(1..3);
                fake.fail_next("POST", &bindings, 504, n);
                Ok(format!("the next {n} Bindings answer 504"))
            }
            Fault::SlowBind => {
                let late = Duration::from_millis(rng.random_range(1500..4000));
                fake.change_then_answer_after("POST", &bindings, Vec::new(), late);
                Ok(format!("the next Binding is answered {late:?} late"))
            }
            Fault::NrtServerError => {
                let n = rng.random_range(1..3);
                fake.fail_next("PATCH", &format!("{nrt_path}{node}"), 500, n);
                Ok(format!("the next {n} NRT writes of {node} answer 500"))
            }
            Fault::NrtDelayed => {
                let late = Duration::from_millis(rng.random_range(2000..5000));
                fake.change_then_answer_after("PATCH", &format!("{nrt_path}{node}"), Vec::new(), late);
                Ok(format!("the next NRT write of {node} is applied {late:?} late"))
            }
            Fault::SchedulerRestart => schedulers.lock().await.stop_leader(false).await,
            Fault::LeaderChange => schedulers.lock().await.stop_leader(true).await,
            Fault::ExporterRestart | Fault::KubeletRestart | Fault::PluginReregister => {
                match nodes.get(&node) {
                    Some(n) => n.disturb(fault).await,
                    None => Err(format!("no node {node}")),
                }
            }
        };
        match what {
            Ok(what) => {
                log.push(format!("FAULT {fault:?}: {what}"));
                *lock(&shared.faults).entry(format!("{fault:?}")).or_default() += 1;
            }
            // A fault that could not be armed (no pod left) is logged, not counted.
            Err(e) if fault == Fault::ConflictUidPrecondition => {
                log.push(format!("FAULT {fault:?} skipped: {e}"))
            }
            Err(e) => shared.violate(&log, format!("{fault:?}: {e}"), vec![node.clone()]),
        }
    }
    shared
        .faults_done
        .store(true, std::sync::atomic::Ordering::SeqCst);
    log.push("every planned fault injected");
}

/// Reads the fake's requests as they come: Binding and NRT answers, relists, and the
/// `PodScheduled=False` writes of each replica (counted), and the unschedulable attempts each
/// replica logs (a pod tried again before its initial backoff is a violation); checks that no
/// pod UID is bound twice.
async fn monitor(
    fake: FakeApiServer,
    ns: String,
    initial: Duration,
    shared: Arc<Shared>,
    sched_logs: Arc<Mutex<Vec<(String, PathBuf)>>>,
    log: EventLog,
) {
    let status_prefix = format!("/api/v1/namespaces/{ns}/pods/");
    let mut offsets: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for r in fake.drain_requests() {
            if r.method == "POST" && r.path.starts_with(&status_prefix) && r.path.ends_with("/binding") {
                *lock(&shared.answers).0.entry(r.status).or_default() += 1;
                let name = r.path[status_prefix.len()..].trim_end_matches("/binding");
                if lock(&shared.recreates).iter().any(|n| n == name) {
                    // Recreated as this Binding came: attempts from now on are another pod's.
                    let ago = r.at.elapsed().as_secs_f64();
                    lock(&shared.retries)
                        .recreated
                        .entry(name.to_owned())
                        .or_insert((r.at, day_seconds_now() - ago));
                }
                if r.status != 201 {
                    log.push(format!("binding {} answered {}", r.path, r.status));
                }
            } else if r.method == "PATCH" && r.path.contains("/noderesourcetopologies/") {
                *lock(&shared.answers).1.entry(r.status).or_default() += 1;
            } else if r.method == "GET" && r.path.ends_with("/pods") && !r.is_watch() {
                lock(&shared.answers).2 += 1;
            } else if r.method == "PATCH" && r.path.starts_with(&status_prefix) && r.path.ends_with("/status")
            {
                let Some(token) = r
                    .bearer_token()
                    .filter(|t| t.starts_with("sched-"))
                    .map(str::to_owned)
                else {
                    continue;
                };
                let unschedulable = r.body_json().is_some_and(|b| {
                    b.pointer("/status/conditions")
                        .and_then(serde_json::Value::as_array)
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "PodScheduled" && c["status"] == "False")
                        })
                });
                if !unschedulable {
                    continue;
                }
                let name = r.path[status_prefix.len()..]
                    .trim_end_matches("/status")
                    .to_owned();
                // Counted only: a write's time is not its attempt's (status writes wait while
                // Bindings are at the server, up to 10 s, and then go together), so the backoff
                // is checked on the attempts the replicas log, below.
                lock(&shared.retries)
                    .writes
                    .entry((token, name))
                    .or_default()
                    .push(r.at);
            }
        }
        // Every unschedulable attempt of every replica, from its log.
        let files: Vec<(String, PathBuf)> = lock(&sched_logs).clone();
        for (replica, path) in files {
            let offset = offsets.entry(replica.clone()).or_insert(0u64);
            let Ok(mut file) = std::fs::File::open(&path) else {
                continue;
            };
            let mut text = String::new();
            if std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(*offset)).is_err()
                || std::io::Read::read_to_string(&mut file, &mut text).is_err()
            {
                continue;
            }
            // Whole lines only; a partial last line is read again next time.
            let Some(end) = text.rfind('\n') else { continue };
            *offset += (end + 1) as u64;
            for line in text[..end]
                .lines()
                .filter(|l| l.contains("unschedulable attempt"))
            {
                let line = crate::harness::strip_ansi(line);
                let (Some(at), Some(pod)) = (
                    day_seconds_of(&line),
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix("pod="))
                        .map(|p| p.rsplit('/').next().unwrap_or(p).to_owned()),
                ) else {
                    continue;
                };
                let mut retries = lock(&shared.retries);
                let recreated = retries.recreated.get(&pod).map(|(_, s)| *s);
                let times = retries
                    .attempts
                    .entry((replica.clone(), pod.clone()))
                    .or_default();
                let last = times.last().copied();
                times.push(at);
                let Some(last) = last else { continue };
                if recreated.is_some_and(|t| t > last) || at < last {
                    continue; // another pod under the same name, or midnight
                }
                let gap = Duration::from_secs_f64(at - last);
                retries.shortest = Some(retries.shortest.map_or(gap, |s| s.min(gap)));
                // The scheduler logs the attempt right after the decision: a few ms of slack.
                if gap + Duration::from_millis(50) < initial {
                    drop(retries);
                    shared.violate(
                        &log,
                        format!("{ns}/{pod} tried again {gap:?} after its last unschedulable attempt by {replica}, before its initial backoff of {initial:?}"),
                        vec![format!("{ns}/{pod}")],
                    );
                }
            }
        }
        let twice = fake.bound_more_than_once();
        if !twice.is_empty() {
            shared.violate(
                &log,
                format!("pods bound more than once (uid, bindings): {twice:?}"),
                Vec::new(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_schedule_has_every_kind_and_is_the_same_for_a_seed() {
        let cfg = SoakConfig::short(7);
        let a = schedule(&cfg);
        assert_eq!(a, schedule(&cfg));
        assert_ne!(a, schedule(&SoakConfig::short(8)));
        for k in Fault::ALL {
            assert!(a.iter().any(|(_, f, _)| *f == k), "{k:?} missing");
        }
        assert!(a.iter().all(|(t, _, _)| *t < cfg.span));
    }

    #[test]
    fn shapes_read_back_from_their_pods() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen_init = false;
        for i in 0..200 {
            let shape = if i == 0 {
                PodShape::unfit()
            } else {
                PodShape::random(&mut rng)
            };
            seen_init |= shape.init.is_some();
            let mut pod: Pod = serde_json::from_value(shape.pod(&format!("p{i}"))).unwrap();
            pod.metadata.namespace = Some("ns".into());
            assert_eq!(PodShape::from_pod(&pod).unwrap(), shape);
            if let Some((c, g)) = shape.init {
                assert!(c <= shape.cpus && g <= shape.memory_gib);
            }
        }
        assert!(seen_init);
        assert!(!PodShape::unfit().fits());
    }
}
