//! DRA NUMA alignment on the real control plane from the kit (`../shared/k8s`: kube-apiserver,
//! kube-controller-manager with its resourceclaim controller, and for the last run the kit's own
//! kube-scheduler; all v1.36.2, no kubelet): how fast pods with a GPU claim are bound and how many
//! get their GPU on the NUMA node where the kubelet pins their CPUs.
//!
//! Size (~730 lines of code): one bench binary, whose three runs share one cluster setup, one
//! clean-up between runs and one alignment replay. What other benches and tests share is
//! already in `tests/harness`.
//!
//! Cluster (the setup of tests/tests/dra_numa_live.rs, with the NRTs published by the bench instead
//! of one exporter per node): NODES Nodes (32 CPUs, 256Gi, 110 pods allocatable), each with
//! - a NodeResourceTopology: 2 NUMA zones of 16 CPUs (per-zone `cpu`, so the static CPU manager is
//!   modelled), Topology Manager `single-numa-node` at container scope, CPU manager `static`, an
//!   empty pod-set fingerprint; NUMA node 0 has 4, 2, 5 or 16 CPUs free (node index mod 4; the
//!   rest already pinned: the NRT's `available`), NUMA node 1 all 16;
//! - a ResourceSlice `<node>-gpus` of driver `gpu.example.com` with 4 GPUs in PCI order, `gpu-0`
//!   and `gpu-1` on NUMA node 0, `gpu-2` and `gpu-3` on NUMA node 1
//!   (`resource.kubernetes.io/numaNode`);
//!
//! one DeviceClass selecting them by CEL, and PODS Guaranteed pods (2 CPUs, 1Gi, limits =
//! requests) whose container names a pod claim from a ResourceClaimTemplate asking one GPU of
//! that class (harness::dra's pod). With those free CPUs the kubelet pins a node's first pods on
//! NUMA node 0 and the later ones on NUMA node 1, at a different count per node, so a NUMA-blind
//! device choice misaligns some; a node has 4, 3, 4 or 2 aligned places (650 on 200 nodes), and
//! the bench refuses a PODS above the cluster's count.
//!
//! Three runs, each on the same Nodes, NRTs and slices with no pod or claim left of the run
//! before (every pod deleted, every claim's finalizer dropped and the claim deleted):
//! 1. `numaplane-scheduler run --dra-numa-alignment Required` (release binary);
//! 2. the same scheduler on the same pods without their claims;
//! 3. the kit's kube-scheduler (default profile, DynamicResources on) on the DRA pods, with
//!    `schedulerName: default-scheduler`.
//!
//! Both schedulers talk to the API server with client QPS QPS and burst 2 × QPS (default 1000 /
//! 2000; kube-scheduler gets them as `--kube-api-qps` / `--kube-api-burst` through
//! `CONTROL_PLANE_SCHEDULER_FLAGS`, where the kit runs it without `--config`).
//!
//! Timing. Every run starts from the same state: all PODS pods pending and, for the DRA runs,
//! every claim already created by the resourceclaim controller (the bench waits for it; the
//! controller's own rate, 200 QPS in the kit, is not a scheduler's). Then the clock starts and the
//! scheduler process with it: numaplane-scheduler spawned (built before the clock), and
//! kube-scheduler started by `control-plane start DIR --scheduler` (the kit's bash wrapper, the
//! process start and its wait for `/readyz` are inside the time; the table says when the kit
//! returned). So for kube-scheduler too the time runs from its process start, not from the pods'
//! creation: timed from the creation, its figure would include the controller's claim creation
//! and the pod writes, which numaplane's does not. The clock stops at the last bind, as a watch
//! of the namespace shows it. pods/s = bound pods / that time.
//!
//! Alignment. With `single-numa-node`, the static CPU manager and no memory manager, the CPU
//! manager is a container's only Topology Manager hint provider (DRA devices give no hint), so the
//! kubelet pins its exclusive CPUs on the lowest NUMA node with that many free CPUs (the rule of
//! harness::dra's fake kubelet). The bench replays the binds in the order the watch showed them
//! (resourceVersion order: the order a kubelet's own watch of its node sees them) from each
//! node's NRT `available`, and counts a pod aligned (the table's `aligned %`) when the NUMA node
//! of its claim's one device (from the claim's `status.allocation`, which must be on the pod's
//! node) is the NUMA node so computed. For numaplane two more counts tell a wrong prediction from
//! a reordering: the allocation record on the pod (`numaplane.io/allocation`, the container's
//! `numaNodes`) must name the device's NUMA node, and the same replay in the order numaplane
//! decided (its `binding` debug log lines) must give it too; the scheduler's own count
//! `numaplane_scheduler_dra_claims_bound_total{alignment="aligned"}` is printed beside them.
//! numaplane binds up to `--bind-concurrency` pods at once (32 by default; each DRA bind is
//! three writes: the claim's finalizer, its status, the Binding), but the Bindings of pinned pods
//! to one node one after another, in decision order: sent side by side, two pods decided for one
//! node could reach the API server, and the kubelet, in the other order, and the kubelet would
//! pin the first to arrive where numaplane predicted the second.
//!
//! Panics when a run leaves a pod unbound after 300 s, or when numaplane's DRA run binds a pod
//! whose device is not on the kubelet's NUMA node by any of the three counts (after printing the
//! table): a reordered bind fails it as a wrong prediction does, since the kubelet pins the same
//! either way. kube-scheduler's alignment is reported, not enforced. Without the kit it prints
//! one line and exits; on the cluster of `NUMAPLANE_E2E_KUBECONFIG` it skips the kube-scheduler
//! run (it cannot start one there).
//!
//! `cargo bench -p numaplane-e2e --bench dra_alignment_live -- [NODES] [PODS] [QPS] [BIND_CONCURRENCY]`
//! (defaults 200, 600, 1000, and numaplane's own `--bind-concurrency`; 0 = that default).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, stream};
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use numaplane::nrt::attr;
use numaplane_e2e::{
    control_plane::{self, Options},
    harness::{Agent, ApiTarget, bench, dra, nrt, unique_name},
};
use serde_json::{Value, json};

const NUMAPLANE: &str = "numaplane-scheduler";
const KUBE_SCHEDULER: &str = "default-scheduler";
const TEMPLATE: &str = "one-gpu";
/// Exclusive CPUs of every pod.
const CPUS: usize = 2;
/// CPUs of each NUMA node.
const ZONE_CPUS: usize = 16;
/// Free CPUs of NUMA node 0, by node index mod 4 (NUMA node 1 is all free).
const FREE0: [usize; 4] = [4, 2, 5, 16];
/// The GPUs of every node, in slice (PCI) order, with their NUMA nodes.
const GPUS: [(&str, usize); 4] = [("gpu-0", 0), ("gpu-1", 0), ("gpu-2", 1), ("gpu-3", 1)];
/// How long a run may take to bind every pod.
const BIND_TIMEOUT: Duration = Duration::from_secs(300);
/// How long setup steps (claims created, objects deleted) may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Requests in flight while the bench creates or deletes objects.
const CONCURRENCY: usize = 16;

/// The free CPUs per NUMA node of node `index`, as its NRT publishes them.
fn free_cpus(index: usize) -> [usize; 2] {
    [FREE0[index % FREE0.len()], ZONE_CPUS]
}

/// The NUMA node the kubelet pins a container of `cpus` exclusive CPUs on: the lowest one with
/// that many free (`None`: a `TopologyAffinityError`).
fn kubelet_zone(free: &[usize; 2], cpus: usize) -> Option<usize> {
    (0..free.len()).find(|z| free[*z] >= cpus)
}

/// How many pods of [`CPUS`] a node of `free` CPUs takes with every GPU beside its CPUs: the
/// pods go where the kubelet pins them until a pod's NUMA node has no GPU left.
fn aligned_places(mut free: [usize; 2]) -> usize {
    let mut gpus = [0usize; 2];
    for (_, z) in GPUS {
        gpus[z] += 1;
    }
    let mut n = 0;
    while let Some(z) = kubelet_zone(&free, CPUS) {
        if gpus[z] == 0 {
            break;
        }
        free[z] -= CPUS;
        gpus[z] -= 1;
        n += 1;
    }
    n
}

fn gpu_numa(device: &str) -> Option<usize> {
    GPUS.iter().find(|(d, _)| *d == device).map(|(_, z)| *z)
}

/// The ResourceSlice `<node>-gpus` (the name harness::dra's cleanup deletes) with [`GPUS`].
fn slice(node: &str) -> Value {
    let devices: Vec<Value> = GPUS
        .iter()
        .map(|(name, zone)| {
            json!({"name": name, "attributes": {"model": {"string": "a100"},
                "resource.kubernetes.io/numaNode": {"int": zone}}})
        })
        .collect();
    json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": dra::DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}
    })
}

/// The NRT of node `index`.
fn node_nrt(node: &str, index: usize) -> Value {
    let free = free_cpus(index);
    let fingerprint = nrt::pods_fingerprint(&[]);
    let zones = (0..free.len())
        .map(|z| {
            nrt::zone(
                z,
                vec![nrt::resource("cpu", &ZONE_CPUS.to_string(), &free[z].to_string())],
            )
        })
        .collect();
    nrt::single_numa_node(
        json!({"name": node, "labels": {"numaplane.io/e2e": "true"}}),
        &[
            (attr::PODS_FINGERPRINT, fingerprint.as_str()),
            (attr::PODS_FINGERPRINT_METHOD, "all"),
            (attr::CPU_MANAGER_POLICY, "static"),
        ],
        zones,
    )
}

/// The claim the resourceclaim controller generated for the pod, once it is in the pod's status.
fn claim_of(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find_map(|s| s.resource_claim_name.clone())
}

/// numaplane's decisions in the order it made them, from its debug log (`binding
/// pod=NS/NAME node=Some("NODE")`, one line per decision; a pod decided again keeps its last).
fn decisions(log: &str) -> Vec<(String, String)> {
    let ansi = regex::Regex::new("\x1b\\[[0-9;]*m").unwrap();
    let line = regex::Regex::new(r#" binding pod=[^/\s]+/(\S+) node=Some\("([^"]+)"\)"#).unwrap();
    let plain = ansi.replace_all(log, "");
    let mut out: Vec<(String, String)> = Vec::new();
    for c in line.captures_iter(&plain) {
        out.retain(|(p, _)| *p != c[1]);
        out.push((c[1].to_owned(), c[2].to_owned()));
    }
    out
}

/// One bind as the watch showed it.
struct Bind {
    pod: String,
    node: String,
    at: Instant,
}

/// The binds of a namespace's pods in the order a watch shows them.
struct Binds {
    seen: Arc<Mutex<Vec<Bind>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Binds {
    /// Watches `pods`; returns once the watch has listed them.
    async fn watch(pods: Api<Pod>) -> Binds {
        let seen: Arc<Mutex<Vec<Bind>>> = Arc::default();
        let synced = Arc::new(AtomicBool::new(false));
        let (sink, ready) = (seen.clone(), synced.clone());
        let task = tokio::spawn(async move {
            let mut names = HashSet::new();
            let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                let pod = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                    Ok(watcher::Event::InitDone) => {
                        ready.store(true, Ordering::SeqCst);
                        continue;
                    }
                    _ => continue,
                };
                let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                    continue;
                };
                let name = pod.metadata.name.clone().unwrap_or_default();
                if names.insert(name.clone()) {
                    sink.lock().unwrap().push(Bind {
                        pod: name,
                        node,
                        at: Instant::now(),
                    });
                }
            }
        });
        let deadline = Instant::now() + SETUP_TIMEOUT;
        while !synced.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the pod watch did not sync");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Binds { seen, task }
    }

    fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// (pod, node) in bind order.
    fn order(&self) -> Vec<(String, String)> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|b| (b.pod.clone(), b.node.clone())).collect()
    }

    /// When the first and the last bind were seen.
    fn first_last(&self) -> Option<(Instant, Instant)> {
        let seen = self.seen.lock().unwrap();
        Some((seen.first()?.at, seen.iter().map(|b| b.at).max()?))
    }
}

impl Drop for Binds {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the DRA pods of a run sit.
#[derive(Default)]
struct Alignment {
    /// Pods whose device is on the NUMA node the kubelet pins their CPUs on.
    aligned: usize,
    /// numaplane only: pods whose allocation record names their device's NUMA node.
    record_aligned: Option<usize>,
    /// numaplane only: pods whose device is on the NUMA node the kubelet would pin them on had
    /// it seen the binds in the order numaplane decided them.
    decision_aligned: Option<usize>,
    /// Pods counted.
    pods: usize,
    /// What is wrong with the others, one line each.
    misaligned: Vec<String>,
}

impl Alignment {
    fn percent(n: usize, of: usize) -> f64 {
        100.0 * n as f64 / of.max(1) as f64
    }
}

/// One run's figures.
struct Outcome {
    run: &'static str,
    bound: usize,
    wall: Duration,
    first: Duration,
    ready: Option<Duration>,
    alignment: Option<Alignment>,
    /// numaplane's own count of aligned bound claims.
    counted_aligned: Option<f64>,
}

/// The cluster of the three runs.
struct Bench {
    target: ApiTarget,
    ns: String,
    class: String,
    nodes: Vec<String>,
    pods: usize,
    qps: u32,
    /// numaplane's `--bind-concurrency` (0: its default).
    bind_concurrency: usize,
}

impl Bench {
    async fn setup(target: ApiTarget, nodes: usize, pods: usize, qps: u32, bind_concurrency: usize) -> Bench {
        let t0 = Instant::now();
        let client = target.client();
        let ns = unique_name("np-drabench");
        target.create_namespace(&ns).await.unwrap();
        let class = format!("{ns}-gpu");
        let prefix = unique_name("np-drabench-node");
        let names: Vec<String> = (0..nodes).map(|i| format!("{prefix}-{i:04}")).collect();
        let target_ref = &target;
        stream::iter(names.iter().enumerate())
            .map(|(i, node)| {
                let client = client.clone();
                async move {
                    let allocatable =
                        json!({"cpu": (2 * ZONE_CPUS).to_string(), "memory": "256Gi", "pods": "110"});
                    target_ref
                        .create_labelled_node(node, &[("kubernetes.io/hostname", node)], Some(allocatable))
                        .await
                        .unwrap();
                    let s: ResourceSlice = serde_json::from_value(slice(node)).unwrap();
                    Api::<ResourceSlice>::all(client.clone())
                        .create(&PostParams::default(), &s)
                        .await
                        .unwrap();
                    nrt::apply(client, "numaplane-e2e", node_nrt(node, i))
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let dc: DeviceClass = serde_json::from_value(dra::device_class(&class)).unwrap();
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &dc)
            .await
            .unwrap();
        let t: ResourceClaimTemplate =
            serde_json::from_value(dra::one_device_template(TEMPLATE, &class)).unwrap();
        Api::<ResourceClaimTemplate>::namespaced(client, &ns)
            .create(&PostParams::default(), &t)
            .await
            .unwrap();
        eprintln!(
            "setup: {nodes} Nodes, NRTs and ResourceSlices in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Bench {
            target,
            ns,
            class,
            nodes: names,
            pods,
            qps,
            bind_concurrency,
        }
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.target.client(), &self.ns)
    }

    fn claims_api(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.target.client(), &self.ns)
    }

    /// Creates the pods for `scheduler`, with their claims or without; for claims, waits until
    /// the resourceclaim controller has created every one and named it in its pod's status.
    async fn create_pods(&self, scheduler: &str, claims: bool) {
        let t0 = Instant::now();
        let api = self.pods_api();
        stream::iter(0..self.pods)
            .map(|p| {
                let api = api.clone();
                async move {
                    let mut v = dra::pod(&format!("pod-{p:04}"), scheduler, CPUS, TEMPLATE);
                    if !claims {
                        v["spec"].as_object_mut().unwrap().remove("resourceClaims");
                        v["spec"]["containers"][0]["resources"]
                            .as_object_mut()
                            .unwrap()
                            .remove("claims");
                    }
                    let pod: Pod = serde_json::from_value(v).unwrap();
                    api.create(&PostParams::default(), &pod).await.unwrap();
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let created = t0.elapsed();
        if claims {
            let deadline = Instant::now() + SETUP_TIMEOUT;
            loop {
                let pods = api.list(&ListParams::default()).await.unwrap().items;
                let named = pods.iter().filter(|p| claim_of(p).is_some()).count();
                let made = self
                    .claims_api()
                    .list_metadata(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .len();
                if named == self.pods && made == self.pods {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the resourceclaim controller made {made} claims and named {named} in pods of {} within {SETUP_TIMEOUT:?}",
                    self.pods
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        eprintln!(
            "{} pods for {scheduler} created in {:.1} s{}",
            self.pods,
            created.as_secs_f64(),
            if claims {
                format!(", their claims after {:.1} s", t0.elapsed().as_secs_f64())
            } else {
                String::new()
            }
        );
    }

    /// Waits until every pod is bound; panics after [`BIND_TIMEOUT`] with `log()`'s tail.
    /// Returns (bound, time to the last bind, time to the first bind), both from `start`.
    async fn wait_bound(
        &self,
        binds: &Binds,
        start: Instant,
        log: impl Fn() -> String,
    ) -> (usize, Duration, Duration) {
        loop {
            let bound = binds.len();
            if bound >= self.pods {
                let (first, last) = binds.first_last().unwrap();
                return (bound, last - start, first - start);
            }
            if start.elapsed() > BIND_TIMEOUT {
                let log = log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "{bound}/{} pods bound after {BIND_TIMEOUT:?}; the scheduler's last log lines:\n{}",
                    self.pods,
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Where the kubelet pins each pod of `order` ((pod, node), in the order the kubelet sees
    /// them), from each node's NRT `available`: `None` for a pod it would refuse.
    fn replay(&self, order: &[(String, String)]) -> HashMap<String, Option<usize>> {
        let mut free: BTreeMap<&str, [usize; 2]> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), free_cpus(i)))
            .collect();
        order
            .iter()
            .map(|(pod, node)| {
                let pinned = free.get_mut(node.as_str()).and_then(|f| {
                    let z = kubelet_zone(f, CPUS)?;
                    f[z] -= CPUS;
                    Some(z)
                });
                (pod.clone(), pinned)
            })
            .collect()
    }

    /// Checks each bound pod's device against the NUMA node the kubelet pins it on, replaying
    /// the binds in `bound` order; for numaplane (`decided`: its decisions in order, from its
    /// log) also against its allocation record and against the kubelet replayed in the order
    /// numaplane decided.
    async fn alignment(&self, bound: &[(String, String)], decided: Option<&[(String, String)]>) -> Alignment {
        let pods: HashMap<String, Pod> = self
            .pods_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
            .collect();
        let devices: HashMap<String, Vec<(String, String)>> = self
            .claims_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| {
                let results = c
                    .status
                    .and_then(|s| s.allocation)
                    .and_then(|a| a.devices)
                    .and_then(|d| d.results)
                    .unwrap_or_default();
                (
                    c.metadata.name.unwrap_or_default(),
                    results.into_iter().map(|r| (r.pool, r.device)).collect(),
                )
            })
            .collect();
        let pinned = self.replay(bound);
        let as_decided = decided.map(|d| self.replay(d));
        let numaplane = decided.is_some();
        let mut out = Alignment {
            record_aligned: numaplane.then_some(0),
            decision_aligned: numaplane.then_some(0),
            ..Alignment::default()
        };
        for (name, node) in bound {
            out.pods += 1;
            let pod = &pods[name];
            let got = claim_of(pod)
                .and_then(|c| devices.get(&c).cloned())
                .unwrap_or_default();
            let device_numa = match got.as_slice() {
                [(pool, device)] if pool == node => gpu_numa(device),
                _ => None,
            };
            let on_device = |z: Option<usize>| device_numa.is_some() && device_numa == z;
            let kubelet = pinned[name];
            let kubelet_ok = on_device(kubelet);
            if kubelet_ok {
                out.aligned += 1;
            }
            if !numaplane {
                if !kubelet_ok {
                    out.misaligned.push(format!(
                        "{name} on {node}: devices {got:?} (NUMA {device_numa:?}), the kubelet pins on NUMA {kubelet:?}"
                    ));
                }
                continue;
            }
            let record: Option<Vec<u32>> = (|| {
                let text = pod
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(numaplane::allocation::ANNOTATION)?;
                let a: numaplane::allocation::Allocation = serde_json::from_str(text).ok()?;
                a.containers.first()?.numa_nodes.clone()
            })();
            let record_ok = device_numa
                .and_then(|d| u32::try_from(d).ok())
                .is_some_and(|d| record.as_deref() == Some(&[d][..]));
            let decided_zone = as_decided.as_ref().and_then(|m| m.get(name).copied().flatten());
            let decided_ok = on_device(decided_zone);
            for (ok, n) in [
                (record_ok, out.record_aligned.as_mut()),
                (decided_ok, out.decision_aligned.as_mut()),
            ] {
                if ok && let Some(n) = n {
                    *n += 1;
                }
            }
            if !(kubelet_ok && record_ok && decided_ok) {
                out.misaligned.push(format!(
                    "{name} on {node}: devices {got:?} (NUMA {device_numa:?}); the record says NUMA {record:?}; \
                     the kubelet pins on NUMA {kubelet:?} in bind order, {decided_zone:?} in numaplane's decision order"
                ));
            }
        }
        out
    }

    /// Deletes every pod and claim of the namespace and waits until they are gone.
    async fn clean(&self) {
        let (pods, claims) = (self.pods_api(), self.claims_api());
        let all = ListParams::default();
        pods.delete_collection(&DeleteParams::default().grace_period(0), &all)
            .await
            .unwrap();
        let deadline = Instant::now() + SETUP_TIMEOUT;
        while !pods.list_metadata(&all).await.unwrap().items.is_empty() {
            assert!(Instant::now() < deadline, "pods left after {SETUP_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Their claims carry the scheduler's finalizer: drop it (the controller may be at it too).
        let names: Vec<String> = claims
            .list_metadata(&all)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        stream::iter(names)
            .map(|name| {
                let claims = claims.clone();
                async move {
                    let _ = claims
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let _ = claims.delete_collection(&DeleteParams::default(), &all).await;
        while !claims.list_metadata(&all).await.unwrap().items.is_empty() {
            assert!(Instant::now() < deadline, "claims left after {SETUP_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Run 1 (`claims`) or 2: numaplane-scheduler on pending pods.
    async fn numaplane(&self, claims: bool) -> Outcome {
        self.create_pods(NUMAPLANE, claims).await;
        let binds = Binds::watch(self.pods_api()).await;
        let mut args: Vec<String> = [
            "--kubeconfig",
            &self.target.kubeconfig().display().to_string(),
            "--leader-elect=false",
            "--kube-api-qps",
            &self.qps.to_string(),
            "--kube-api-burst",
            &(2 * self.qps).to_string(),
            "--dra-numa-alignment",
            "Required",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if self.bind_concurrency > 0 {
            args.extend(["--bind-concurrency".to_owned(), self.bind_concurrency.to_string()]);
        }
        let start = Instant::now();
        let mut sched = Agent::spawn_scheduler("run", &args).unwrap();
        let (bound, wall, first) = self.wait_bound(&binds, start, || sched.stderr()).await;
        let counted_aligned = claims.then(|| {
            numaplane_e2e::harness::metric_value(
                &sched.metrics().unwrap_or_default(),
                "numaplane_scheduler_dra_claims_bound_total",
                &[("alignment", "aligned")],
            )
            .unwrap_or(0.0)
        });
        let decided = claims.then(|| decisions(&sched.stderr()));
        sched.kill();
        let alignment = match &decided {
            Some(d) => {
                assert_eq!(
                    d.len(),
                    bound,
                    "numaplane's log shows {} `binding` decisions for {bound} bound pods",
                    d.len()
                );
                Some(self.alignment(&binds.order(), Some(d)).await)
            }
            None => None,
        };
        drop(binds);
        self.clean().await;
        Outcome {
            run: if claims {
                "numaplane Required, DRA"
            } else {
                "numaplane, no claims"
            },
            bound,
            wall,
            first,
            ready: None,
            alignment,
            counted_aligned,
        }
    }

    /// Run 3: the kit's kube-scheduler on pending DRA pods (`None` off the kit's cluster).
    async fn kube_scheduler(&self) -> Option<Outcome> {
        let Some(cp) = self.target.control_plane() else {
            println!(
                "SKIPPED kube-scheduler run: not on the kit's control plane ({} is set)",
                control_plane::REAL_CLUSTER_ENV
            );
            return None;
        };
        let script = control_plane::kit().expect("the kit's control-plane script");
        self.create_pods(KUBE_SCHEDULER, true).await;
        let binds = Binds::watch(self.pods_api()).await;
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(&script)
            .arg("start")
            .arg(cp.dir())
            .arg("--scheduler")
            .env(
                "CONTROL_PLANE_SCHEDULER_FLAGS",
                format!("--kube-api-qps={} --kube-api-burst={}", self.qps, 2 * self.qps),
            )
            .stdin(std::process::Stdio::null());
        if std::env::var_os("CONTROL_PLANE_CACHE").is_none() {
            // Where the harness unpacked the binaries: nothing is unpacked inside the time.
            cmd.env(
                "CONTROL_PLANE_CACHE",
                control_plane::repo_root().join("target/control-plane-cache"),
            );
        }
        let start = Instant::now();
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        let ready = start.elapsed();
        assert!(
            out.status.success(),
            "control-plane start --scheduler: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let (bound, wall, first) = self
            .wait_bound(&binds, start, || cp.log("kube-scheduler.log"))
            .await;
        let alignment = self.alignment(&binds.order(), None).await;
        drop(binds);
        self.clean().await;
        Some(Outcome {
            run: "kube-scheduler, DRA",
            bound,
            wall,
            first,
            ready: Some(ready),
            alignment: Some(alignment),
            counted_aligned: None,
        })
    }

    async fn cleanup(&self) {
        let client = self.target.client();
        dra::delete_gpu_objects(&client, &self.nodes, &self.class).await;
        self.target.delete_test_objects(&self.ns, &self.nodes).await;
    }
}

fn print_table(nodes: usize, pods: usize, qps: u32, bind_concurrency: usize, runs: &[Outcome]) {
    let concurrency = match bind_concurrency {
        0 => "numaplane's default".to_owned(),
        n => n.to_string(),
    };
    println!(
        "DRA NUMA alignment, real kube-apiserver v1.36.2: {nodes} nodes x 2 NUMA x 4 GPUs, {pods} Guaranteed pods of {CPUS} CPUs (+1 GPU claim), client QPS {qps} / burst {}, numaplane --bind-concurrency {concurrency}",
        2 * qps
    );
    println!(
        "{:<26} {:>10} {:>8} {:>8} {:>12} {:>10}",
        "run", "pods bound", "wall s", "pods/s", "first bind s", "aligned %"
    );
    for r in runs {
        let aligned = match &r.alignment {
            Some(a) => format!("{:.1}", Alignment::percent(a.aligned, a.pods)),
            None => "-".to_owned(),
        };
        println!(
            "{:<26} {:>10} {:>8.2} {:>8.1} {:>12.2} {:>10}",
            r.run,
            format!("{}/{pods}", r.bound),
            r.wall.as_secs_f64(),
            r.bound as f64 / r.wall.as_secs_f64().max(1e-9),
            r.first.as_secs_f64(),
            aligned
        );
    }
    for r in runs {
        if let Some(a) = &r.alignment {
            let record = a
                .record_aligned
                .map(|n| format!("; allocation record names the device's NUMA node: {n}/{}", a.pods))
                .unwrap_or_default();
            let decided = a
                .decision_aligned
                .map(|n| {
                    format!(
                        "; device on the kubelet's NUMA node with the binds in numaplane's decision order: {n}/{}",
                        a.pods
                    )
                })
                .unwrap_or_default();
            let counted = r
                .counted_aligned
                .map(|n| format!("; scheduler counted {n} aligned claims"))
                .unwrap_or_default();
            println!(
                "  {}: device on the kubelet's NUMA node (binds replayed in watch order): {}/{}{record}{decided}{counted}",
                r.run, a.aligned, a.pods
            );
        }
        if let Some(ready) = r.ready {
            println!(
                "  {}: `control-plane start --scheduler` returned (kube-scheduler ready) after {:.2} s",
                r.run,
                ready.as_secs_f64()
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = bench::Args::from_env();
    let nodes: usize = args.get(0, 200);
    let pods: usize = args.get(1, 600);
    let qps: u32 = args.get(2, 1000);
    let bind_concurrency: usize = args.get(3, 0);
    let places: usize = (0..nodes).map(|i| aligned_places(free_cpus(i))).sum();
    assert!(
        pods <= places,
        "{pods} pods: {nodes} nodes have {places} places with the GPU beside the CPUs; under Required the rest would stay pending"
    );
    let Some(cluster) = control_plane::require(
        "dra_alignment_live (a real kube-apiserver with the resourceclaim controller)",
        &Options::with_controllers("resourceclaim-controller"),
    ) else {
        return;
    };
    // Build (or find) the binary before any clock starts.
    numaplane_e2e::binaries::scheduler();
    let target = ApiTarget::on(cluster).await.unwrap();
    let bench = Bench::setup(target, nodes, pods, qps, bind_concurrency).await;
    let mut runs = vec![bench.numaplane(true).await, bench.numaplane(false).await];
    runs.extend(bench.kube_scheduler().await);
    print_table(nodes, pods, qps, bind_concurrency, &runs);
    for r in &runs[1..] {
        if let Some(a) = &r.alignment
            && !a.misaligned.is_empty()
        {
            println!("  {} misaligned, e.g.: {}", r.run, a.misaligned[0]);
        }
    }
    bench.cleanup().await;
    let a = runs[0].alignment.as_ref().unwrap();
    assert!(
        a.misaligned.is_empty(),
        "numaplane under Required bound {} of {} DRA pods without their GPU on the kubelet's NUMA node \
         ({} aligned as the binds reached the API server, {:?} in its record, {:?} had the binds reached it \
         in the order numaplane decided them):\n{}",
        a.misaligned.len(),
        a.pods,
        a.aligned,
        a.record_aligned,
        a.decision_aligned,
        a.misaligned.join("\n")
    );
}
