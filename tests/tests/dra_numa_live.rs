//! DRA devices on the NUMA node where the kubelet pins the CPUs, end to end on the real
//! kube-apiserver with kube-controller-manager's resourceclaim controller (the control-plane
//! kit): three 2-NUMA nodes under `single-numa-node` with the static CPU manager, each with a
//! fake kubelet (pod-resources on a Unix socket, its own CPU assignment) and a real
//! `numaplane-exporter run` publishing its NRT (with the PCI locality of `gpu-nic.xml`) and
//! counting DRA devices per zone; four GPUs per node in a ResourceSlice, placed by
//! `resource.kubernetes.io/numaNode` or by `resource.kubernetes.io/pciBusID`; a stream of
//! Guaranteed pods with 2–12 exclusive CPUs and one GPU claim from a ResourceClaimTemplate,
//! scheduled by `numaplane-scheduler run`.
//!
//! With `--dra-numa-alignment Required` every pod is admitted and the CPUs the kubelet reports
//! and the devices of the claim's allocation sit on one NUMA node. With `Ignore`
//! (kube-scheduler's choice) the same stream gives misaligned pods: the check catches them.
//! With `Preferred` a pod whose NUMA node has no GPU left gets another, with a Warning Event.
//! The scheduler counts the bound claims by alignment.
//! Throughout, the exporter's per-zone DRA counts equal what the claims allocated on the node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use numaplane::nrt::attr;
use numaplane_e2e::{
    control_plane::Options,
    harness::{
        Agent, ApiTarget,
        dra::{self, Admission, DraKubelet, Outcome},
        scheduler_run_args, unique_name,
    },
};

const WAIT: Duration = Duration::from_secs(30);
const SCHEDULER: &str = "numaplane-scheduler";
const TEMPLATE: &str = "one-gpu";
const NODES: usize = 3;

/// CPUs of the pods, in creation order. The 12-CPU pods fill each NUMA node's CPUs but one GPU's
/// worth: the kubelet pins a node's first on NUMA node 0 and its second on NUMA node 1, where a
/// NUMA-blind allocator hands out `gpu-1` of NUMA node 0. Then each NUMA node has 4 CPUs and one
/// GPU left, and the smaller pods, in non-increasing sizes, never meet a NUMA node with CPUs for
/// them but no GPU: under `Required` every pod fits, wherever the scheduler puts the earlier ones.
const STREAM: [usize; 12] = [12, 12, 12, 12, 12, 12, 4, 4, 4, 3, 3, 2];

fn options() -> Options {
    Options {
        controllers: Some("resourceclaim-controller".to_owned()),
        ..Options::default()
    }
}

struct Env {
    target: ApiTarget,
    ns: String,
    class: String,
    nodes: Vec<String>,
    kubelets: Vec<Arc<DraKubelet>>,
    exporters: Vec<Agent>,
    scheduler: Agent,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Env {
    /// The nodes, their kubelets and exporters, the GPUs, and a scheduler with `alignment`;
    /// `None` (after a line saying so) without the kit.
    async fn start(alignment: &str) -> Option<Env> {
        let cluster = numaplane_e2e::control_plane::require(
            "DRA NUMA alignment on a real kube-apiserver with the resourceclaim controller",
            &options(),
        )?;
        let target = ApiTarget::on(cluster).await.unwrap();
        let client = target.client();
        let ns = unique_name("np-dranuma");
        target.create_namespace(&ns).await.unwrap();
        let class = format!("{ns}-gpu");
        let prefix = unique_name("np-dranuma-node");
        let nodes: Vec<String> = (0..NODES).map(|i| format!("{prefix}-{i}")).collect();
        let (mut kubelets, mut exporters) = (Vec::new(), Vec::new());
        for node in &nodes {
            target
                .create_labelled_node(
                    node,
                    &[("kubernetes.io/hostname", node)],
                    Some(serde_json::json!({"cpu": "32", "memory": "64Gi", "pods": "110"})),
                )
                .await
                .unwrap();
            let slice: ResourceSlice = serde_json::from_value(dra::slice(node)).unwrap();
            Api::<ResourceSlice>::all(client.clone())
                .create(&PostParams::default(), &slice)
                .await
                .unwrap();
            let kubelet = Arc::new(DraKubelet::start(node).await.unwrap());
            exporters.push(kubelet.exporter(target.kubeconfig(), WAIT).await.unwrap());
            kubelets.push(kubelet);
        }
        let dc: DeviceClass = serde_json::from_value(dra::device_class(&class)).unwrap();
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &dc)
            .await
            .unwrap();
        let t: ResourceClaimTemplate =
            serde_json::from_value(dra::one_device_template(TEMPLATE, &class)).unwrap();
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &t)
            .await
            .unwrap();
        // Each exporter's NRT carries the machine's PCI locality (its host bridges), which
        // places gpu-1 and gpu-3, and each exporter counts every GPU free.
        for (node, exporter) in nodes.iter().zip(&exporters) {
            target
                .wait_nrt(node, WAIT, |n| {
                    n.attribute(attr::PCI_LOCALITY) == Some("0000:17=0,0000:4b=0,0000:b1=1,0000:ca=1")
                })
                .await
                .unwrap();
            for zone in 0..2 {
                exporter
                    .until(&format!(
                        "numaplane_exporter_dra_devices_free{{node={node},numa_node={zone},driver={}}} == 2",
                        dra::DRIVER
                    ))
                    .await;
            }
        }
        let mut args = scheduler_run_args(target.kubeconfig());
        args.extend(["--pod-max-backoff", "2s", "--dra-numa-alignment", alignment].map(str::to_owned));
        let mut scheduler = Agent::spawn_scheduler("run", &args).unwrap();
        scheduler.wait_serving(WAIT).await.unwrap();
        let tasks = kubelets
            .iter()
            .map(|k| tokio::spawn(k.clone().run(client.clone())))
            .collect();
        Some(Env {
            target,
            ns,
            class,
            nodes,
            kubelets,
            exporters,
            scheduler,
            tasks,
        })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.target.client(), &self.ns)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.target.client(), &self.ns)
    }

    /// Creates pod `name` with `cpus` CPUs and waits until a kubelet admitted or refused it.
    async fn run_pod(&self, name: &str, cpus: usize) -> Outcome {
        let p: Pod = serde_json::from_value(dra::pod(name, SCHEDULER, cpus, TEMPLATE)).unwrap();
        self.pods().create(&PostParams::default(), &p).await.unwrap();
        let key = format!("{}/{name}", self.ns);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(o) = self.kubelets.iter().find_map(|k| k.outcome(&key)) {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "{key} ({cpus} CPUs) was not admitted within {WAIT:?}\n{}",
                self.scheduler.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the exporter of `node` counts, per NUMA node, the GPUs the claims allocated
    /// there as allocated and the rest as free.
    async fn exporter_counts_match(&self, node: &str) {
        let i = self.nodes.iter().position(|n| n == node).unwrap();
        let claims = self.claims().list(&ListParams::default()).await.unwrap().items;
        for (zone, allocated) in dra::allocated_per_numa(&claims, node) {
            let free = dra::gpus_on(zone) - allocated;
            for (metric, want) in [("allocated", allocated), ("free", free)] {
                self.exporters[i]
                    .until(&format!(
                        "numaplane_exporter_dra_devices_{metric}{{node={node},numa_node={zone},driver={}}} == {want}",
                        dra::DRIVER
                    ))
                    .await;
            }
        }
    }

    /// Waits until the scheduler has counted `aligned` and `misaligned` bound claims.
    async fn bound_claims_counted(&self, aligned: usize, misaligned: usize) {
        for (alignment, want) in [("aligned", aligned), ("misaligned", misaligned)] {
            if want > 0 {
                self.scheduler
                    .until(&format!(
                        "numaplane_scheduler_dra_claims_bound_total{{alignment={alignment}}} == {want}"
                    ))
                    .await;
            }
        }
        let text = self.scheduler.metrics().unwrap();
        for alignment in ["aligned", "misaligned", "no-numa-node", "split", "not-predicted"] {
            let want = match alignment {
                "aligned" => aligned,
                "misaligned" => misaligned,
                _ => 0,
            };
            let got = numaplane_e2e::harness::metric_value(
                &text,
                "numaplane_scheduler_dra_claims_bound_total",
                &[("alignment", alignment)],
            )
            .unwrap_or(0.0);
            assert_eq!(got, want as f64, "{alignment}");
        }
    }

    /// The `ClaimNotNUMAAligned` Events about the pod of `a`.
    async fn not_aligned_events(&self, a: &Admission) -> Vec<k8s_openapi::api::events::v1::Event> {
        let name = a.pod.rsplit('/').next().unwrap();
        self.target
            .events_about(&self.ns, name, "ClaimNotNUMAAligned")
            .await
            .unwrap()
    }

    /// Runs `sizes` one pod at a time; after each admission, checks the exporter of its node.
    async fn stream(&self, sizes: &[usize]) -> Vec<Admission> {
        let mut admitted = Vec::new();
        for (i, cpus) in sizes.iter().enumerate() {
            match self.run_pod(&format!("p{i:02}"), *cpus).await {
                Outcome::Admitted(a) => {
                    assert_eq!(a.cpus.len(), *cpus, "{a:?}");
                    assert_eq!(a.devices.len(), 1, "one GPU of the pod's node: {a:?}");
                    assert_eq!(a.devices[0].1, a.node, "the pool of the pod's node: {a:?}");
                    self.exporter_counts_match(&a.node).await;
                    admitted.push(a);
                }
                Outcome::Refused { pod, why } => panic!("the kubelet refused {pod}: {why}"),
            }
        }
        admitted
    }

    async fn cleanup(self) {
        for t in &self.tasks {
            t.abort();
        }
        let client = self.target.client();
        let _ = self
            .pods()
            .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
            .await;
        dra::delete_gpu_objects(&client, &self.nodes, &self.class).await;
        self.target.delete_test_objects(&self.ns, &self.nodes).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_required_every_admitted_pod_has_its_cpus_and_its_gpu_on_one_numa_node() {
    let Some(env) = Env::start("Required").await else {
        return;
    };
    let admitted = env.stream(&STREAM).await;
    assert_eq!(admitted.len(), STREAM.len());
    let misaligned: Vec<String> = admitted.iter().filter_map(Admission::misalignment).collect();
    assert!(
        misaligned.is_empty(),
        "misaligned under Required:\n{}",
        misaligned.join("\n")
    );
    // Both sources placed devices: every GPU of every node is taken, those placed by
    // `numaNode` and those placed by `pciBusID` through the NRT's PCI locality alike.
    let used: BTreeSet<(String, String)> = admitted
        .iter()
        .flat_map(|a| a.devices.iter().map(|(_, pool, d)| (pool.clone(), d.clone())))
        .collect();
    assert_eq!(used.len(), NODES * dra::GPUS.len(), "{used:?}");
    // Pods were pinned on both NUMA nodes.
    let zones: BTreeSet<_> = admitted.iter().flat_map(|a| a.cpu_numa()).collect();
    assert_eq!(zones, BTreeSet::from([Some(0), Some(1)]));
    env.bound_claims_counted(STREAM.len(), 0).await;
    env.cleanup().await;
}

/// The check can fail: with kube-scheduler's choice the first GPU the allocator reaches is
/// taken, and the second pod of a node, which the kubelet pins on NUMA node 1, gets `gpu-1` of
/// NUMA node 0. The exporter counts the misaligned devices where they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_ignore_the_same_stream_gives_misaligned_pods() {
    let Some(env) = Env::start("Ignore").await else {
        return;
    };
    let admitted = env.stream(&STREAM[..6]).await;
    let misaligned: Vec<String> = admitted.iter().filter_map(Admission::misalignment).collect();
    // Six 12-CPU pods on three nodes: each node's second is pinned on NUMA node 1 and given
    // gpu-1 (NUMA node 0, placed through its pciBusID).
    assert_eq!(misaligned.len(), NODES, "{misaligned:#?}\n{admitted:#?}");
    for a in admitted.iter().filter(|a| a.misalignment().is_some()) {
        assert_eq!(a.cpu_numa(), BTreeSet::from([Some(1)]), "{a:?}");
        assert_eq!(a.devices[0].2, "gpu-1", "{a:?}");
    }
    // The scheduler counts them, and raises no Event: Ignore asked for kube-scheduler's choice.
    env.bound_claims_counted(admitted.len() - NODES, NODES).await;
    for a in &admitted {
        assert!(env.not_aligned_events(a).await.is_empty(), "{a:?}");
    }
    env.cleanup().await;
}

/// `Preferred` places a pod whose NUMA node has CPUs but no GPU left, with a GPU of the other
/// NUMA node, and says so: a Warning Event on the pod and the misaligned count. Nine 2-CPU pods:
/// the kubelet pins them all on NUMA node 0, which has two GPUs per node, six in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_preferred_a_pod_without_an_aligned_gpu_gets_another_and_an_event_says_so() {
    let Some(env) = Env::start("Preferred").await else {
        return;
    };
    let admitted = env.stream(&[2; 9]).await;
    let misaligned: Vec<&Admission> = admitted.iter().filter(|a| a.misalignment().is_some()).collect();
    assert_eq!(misaligned.len(), 9 - 2 * NODES, "{admitted:#?}");
    env.bound_claims_counted(2 * NODES, misaligned.len()).await;
    for a in &admitted {
        let mut events = env.not_aligned_events(a).await;
        let deadline = Instant::now() + WAIT;
        while a.misalignment().is_some() && events.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            events = env.not_aligned_events(a).await;
        }
        if a.misalignment().is_some() {
            assert_eq!(events.len(), 1, "{a:?}");
            let note = events[0].note.as_deref().unwrap_or_default();
            assert!(
                note.contains("devices on NUMA node 1; containers") && note.contains("(cpu) on NUMA node 0"),
                "{note}"
            );
        } else {
            assert!(events.is_empty(), "{a:?}: {events:?}");
        }
    }
    env.cleanup().await;
}
