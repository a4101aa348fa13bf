//! `numaplane-scheduler run` allocating ResourceClaims on a real kube-apiserver with
//! kube-controller-manager's resourceclaim controller (the control-plane kit): a pod's claim
//! created from a ResourceClaimTemplate is allocated, reserved and bound in kube-scheduler's
//! write order (the finalizer, then allocation and reservedFor in one status write, then the
//! Binding: seen in a watch of the claim and the pod, by resourceVersion); a claim shared by two
//! pods is allocated once and reserved for both; a pod that fits nowhere leaves every claim it
//! did not allocate alone; a device's binding condition is waited for, within the bound; a
//! device-plugin resource steers the NUMA node and the claim's device follows it (a PCI
//! locality that does not decode is counted first); a stale copy of a claim allocated
//! elsewhere meanwhile is left untouched. The
//! HTTP-level fake gives the one fault a real server cannot be made to give on cue: a conflict
//! on the claim's status write, which is retried.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use numaplane_e2e::{
    control_plane::Options,
    harness::{Agent, ApiTarget, scheduler_run_args, unique_name},
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const DRIVER: &str = "gpu.example.com";
const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

fn options() -> Options {
    Options::with_controllers("resourceclaim-controller")
}

/// A namespace, nodes with two GPUs each (one ResourceSlice per node), a DeviceClass selecting
/// them by CEL, and a scheduler.
struct Env {
    target: ApiTarget,
    ns: String,
    nodes: Vec<String>,
    class: String,
    scheduler: Agent,
    /// The test namespace's pods and claims.
    pods: Api<Pod>,
    claims: Api<ResourceClaim>,
}

impl Env {
    /// On the real control plane; `None` (after a line saying so) without the kit.
    async fn real(nodes: usize, extra: &[&str], binding_conditions: bool) -> Option<Env> {
        let cluster = numaplane_e2e::control_plane::require(
            "live DRA on a real kube-apiserver with the resourceclaim controller",
            &options(),
        )?;
        Some(
            Self::on(
                ApiTarget::on(cluster).await.unwrap(),
                nodes,
                extra,
                binding_conditions,
            )
            .await,
        )
    }

    async fn on(target: ApiTarget, n: usize, extra: &[&str], binding_conditions: bool) -> Env {
        let ns = unique_name("np-dra");
        target.create_namespace(&ns).await.unwrap();
        let prefix = unique_name("np-dra-node");
        let nodes: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
        let class = format!("{ns}-gpu");
        let client = target.client();
        for node in &nodes {
            target
                .create_labelled_node(
                    node,
                    &[("kubernetes.io/hostname", node)],
                    Some(json!({"cpu": "8", "memory": "16Gi", "pods": "110"})),
                )
                .await
                .unwrap();
            let device = |i: usize| {
                let mut d = json!({"name": format!("gpu-{i}"),
                    "attributes": {"model": {"string": "a100"}}});
                if binding_conditions {
                    d["bindingConditions"] = json!(["Attached"]);
                    d["bindingFailureConditions"] = json!(["AttachFailed"]);
                }
                d
            };
            let slice: ResourceSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-gpus")},
                "spec": {"driver": DRIVER, "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [device(0), device(1)]}}))
            .unwrap();
            Api::<ResourceSlice>::all(client.clone())
                .create(&PostParams::default(), &slice)
                .await
                .unwrap();
        }
        let dc: DeviceClass = serde_json::from_value(json!({"metadata": {"name": class},
            "spec": {"selectors": [{"cel": {"expression":
                format!("device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].model == \"a100\"")}}]}}))
        .unwrap();
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &dc)
            .await
            .unwrap();
        let mut args = scheduler_run_args(target.kubeconfig());
        args.extend(["--pod-max-backoff", "2s"].map(str::to_owned));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut scheduler = Agent::spawn_scheduler("run", &args).unwrap();
        scheduler.wait_serving(WAIT).await.unwrap();
        Env {
            pods: Api::namespaced(target.client(), &ns),
            claims: Api::namespaced(target.client(), &ns),
            target,
            ns,
            nodes,
            class,
            scheduler,
        }
    }

    async fn template(&self, name: &str, count: i64) {
        let t: ResourceClaimTemplate = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus",
                "exactly": {"deviceClassName": self.class, "count": count}}]}}}}))
        .unwrap();
        Api::<ResourceClaimTemplate>::namespaced(self.target.client(), &self.ns)
            .create(&PostParams::default(), &t)
            .await
            .unwrap();
    }

    async fn claim(&self, name: &str) {
        let c: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": self.class}}]}}}))
        .unwrap();
        self.claims.create(&PostParams::default(), &c).await.unwrap();
    }

    /// A pod claiming `source` (`{"resourceClaimName": …}` or `{"resourceClaimTemplateName": …}`).
    async fn pod(&self, name: &str, source: Value, node_selector: Option<&str>) {
        let mut claim = json!({"name": "gpu"});
        if let (Some(c), Some(s)) = (claim.as_object_mut(), source.as_object()) {
            c.extend(s.clone());
        }
        let mut spec = json!({"schedulerName": "numaplane-scheduler", "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [claim],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpu"}]}}]});
        if let Some(n) = node_selector {
            spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
        }
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"numaplane.io/e2e": "true"}}, "spec": spec}))
        .unwrap();
        self.pods.create(&PostParams::default(), &p).await.unwrap();
    }

    async fn until<F: AsyncFnMut() -> bool>(&self, what: &str, mut f: F) {
        let deadline = Instant::now() + WAIT;
        while !f().await {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {WAIT:?}\n{}",
                self.scheduler.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn node_of(&self, pod: &str) -> Option<String> {
        self.pods.get(pod).await.unwrap().spec.and_then(|s| s.node_name)
    }

    /// The Warning events' notes on `pod` with `reason`.
    async fn notes(&self, pod: &str, reason: &str) -> Vec<String> {
        self.target
            .events_about(&self.ns, pod, reason)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| e.note)
            .collect()
    }

    async fn cleanup(self) {
        let client = self.target.client();
        let _ = self
            .pods
            .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
            .await;
        numaplane_e2e::harness::dra::delete_gpu_objects(&client, &self.nodes, &self.class).await;
        for n in &self.nodes {
            self.target.cleanup(n, &self.ns).await;
        }
    }
}

/// Every version of the namespace's claims and pods a watch shows, in order.
#[derive(Clone, Default)]
struct Seen {
    claims: Arc<Mutex<Vec<ResourceClaim>>>,
    pods: Arc<Mutex<Vec<Pod>>>,
}

impl Seen {
    fn start(env: &Env) -> Seen {
        let seen = Seen::default();
        let claims = seen.claims.clone();
        let api = env.claims.clone();
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
            while let Some(Ok(c)) = s.next().await {
                claims.lock().unwrap().push(c);
            }
        });
        let pods = seen.pods.clone();
        let api = env.pods.clone();
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
            while let Some(Ok(p)) = s.next().await {
                pods.lock().unwrap().push(p);
            }
        });
        seen
    }
}

fn rv(m: &kube::api::ObjectMeta) -> u64 {
    m.resource_version.as_deref().unwrap().parse().unwrap()
}

fn has_finalizer(c: &ResourceClaim) -> bool {
    c.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

fn allocation(c: &ResourceClaim) -> Option<&k8s_openapi::api::resource::v1::AllocationResult> {
    c.status.as_ref()?.allocation.as_ref()
}

fn reserved_uids(c: &ResourceClaim) -> Vec<String> {
    c.status
        .as_ref()
        .and_then(|s| s.reserved_for.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.uid)
        .collect()
}

fn devices(c: &ResourceClaim) -> Vec<(String, String)> {
    allocation(c)
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.pool, r.device))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_claim_is_created_allocated_reserved_and_bound_in_kube_schedulers_order() {
    let Some(env) = Env::real(2, &[], false).await else {
        return;
    };
    let seen = Seen::start(&env);
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.template("one-gpu", 1).await;
    env.pod("p", json!({"resourceClaimTemplateName": "one-gpu"}), None)
        .await;
    env.until("p is bound", async || env.node_of("p").await.is_some())
        .await;
    let pod = env.pods.get("p").await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    // The controller's claim: generated name, owned by the pod, named in the pod's status.
    let name = pod
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    assert!(name.starts_with("p-gpu-"), "{name}");
    let claim = env.claims.get(&name).await.unwrap();
    assert_eq!(
        claim.metadata.owner_references.as_ref().unwrap()[0].uid,
        uid,
        "created by the controller for the pod"
    );
    assert!(has_finalizer(&claim));
    assert_eq!(reserved_uids(&claim), std::slice::from_ref(&uid));
    let a = allocation(&claim).unwrap();
    assert!(a.allocation_timestamp.is_some());
    // One GPU of the pod's node (each node's pool is named after it).
    let got = devices(&claim);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, node);
    // Written by numaplane-scheduler: the status, under its field manager.
    assert!(
        claim.metadata.managed_fields.iter().flatten().any(|m| {
            m.manager.as_deref() == Some("numaplane-scheduler") && m.subresource.as_deref() == Some("status")
        }),
        "{:?}",
        claim.metadata.managed_fields
    );
    // The order: a version with the finalizer and no allocation, then the allocation and the
    // reservation together (with the finalizer), then the pod's Binding.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claims = seen.claims.lock().unwrap().clone();
    let versions: Vec<&ResourceClaim> = claims
        .iter()
        .filter(|c| c.metadata.name.as_deref() == Some(name.as_str()))
        .collect();
    let finalized = versions
        .iter()
        .find(|c| has_finalizer(c) && allocation(c).is_none())
        .map(|c| rv(&c.metadata))
        .expect("the finalizer is written before the status");
    let first_allocated = versions
        .iter()
        .find(|c| allocation(c).is_some())
        .expect("the allocation is seen");
    assert!(has_finalizer(first_allocated));
    assert_eq!(
        reserved_uids(first_allocated),
        std::slice::from_ref(&uid),
        "allocation and reservedFor in one write"
    );
    let allocated = rv(&first_allocated.metadata);
    let bound = seen
        .pods
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .map(|p| rv(&p.metadata))
        .expect("the Binding is seen");
    assert!(
        finalized < allocated && allocated < bound,
        "finalizer at {finalized}, status at {allocated}, Binding at {bound}"
    );
    // Until then the pod was never reported unschedulable (it waited for its claim).
    assert!(env.notes("p", "FailedScheduling").await.is_empty());
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_claim_is_allocated_once_and_reserved_for_each_pod() {
    let Some(env) = Env::real(2, &[], false).await else {
        return;
    };
    env.claim("shared").await;
    env.pod("a", json!({"resourceClaimName": "shared"}), None).await;
    env.pod("b", json!({"resourceClaimName": "shared"}), None).await;
    env.until("a and b are bound", async || {
        env.node_of("a").await.is_some() && env.node_of("b").await.is_some()
    })
    .await;
    let (na, nb) = (env.node_of("a").await.unwrap(), env.node_of("b").await.unwrap());
    assert_eq!(na, nb, "the claim's devices are on one node");
    let claim = env.claims.get("shared").await.unwrap();
    let mut uids = reserved_uids(&claim);
    uids.sort();
    let mut want = Vec::new();
    for p in ["a", "b"] {
        want.push(env.pods.get(p).await.unwrap().metadata.uid.unwrap());
    }
    want.sort();
    assert_eq!(uids, want);
    assert_eq!(devices(&claim).len(), 1);
    assert_eq!(devices(&claim)[0].0, na);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_nowhere_releases_nothing_it_did_not_make() {
    let Some(env) = Env::real(2, &[], false).await else {
        return;
    };
    let (n0, n1) = (env.nodes[0].clone(), env.nodes[1].clone());
    // A claim a driver's controller allocated on n0 (not numaplane), reserved for nobody.
    env.claim("foreign").await;
    let mut c = env.claims.get("foreign").await.unwrap();
    c.status = Some(
        serde_json::from_value(json!({"allocation": {
            "devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": n0, "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [n0]}]}]}}}))
        .unwrap(),
    );
    let pp = PostParams {
        field_manager: Some("e2e-driver".to_owned()),
        ..PostParams::default()
    };
    let before = env.claims.replace_status("foreign", &pp, &c).await.unwrap();
    // Its pod may only go to n1, where the claim's devices are not: unschedulable.
    env.pod("stuck", json!({"resourceClaimName": "foreign"}), Some(&n1))
        .await;
    // A pod asking for three GPUs of nodes that have two: its claim stays unallocated.
    env.template("three-gpus", 3).await;
    env.pod("greedy", json!({"resourceClaimTemplateName": "three-gpus"}), None)
        .await;
    env.until("both are reported unschedulable twice", async || {
        env.notes("stuck", "FailedScheduling").await.len()
            + env.notes("greedy", "FailedScheduling").await.len()
            >= 2
    })
    .await;
    // Retried after the backoff meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let greedy_notes = env.notes("greedy", "FailedScheduling").await;
    assert!(
        greedy_notes
            .iter()
            .any(|n| n.contains("cannot allocate all claims")),
        "{greedy_notes:?}"
    );
    let after = env.claims.get("foreign").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version,
        "a claim numaplane did not allocate is left alone: {:#?}",
        (
            &after.metadata.managed_fields,
            &after.status,
            &after.metadata.finalizers
        )
    );
    let greedy = env.pods.get("greedy").await.unwrap();
    let name = greedy.status.unwrap().resource_claim_statuses.unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claim = env.claims.get(&name).await.unwrap();
    assert!(
        allocation(&claim).is_none() && !has_finalizer(&claim),
        "{claim:?}"
    );
    assert_eq!(env.node_of("stuck").await, None);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_conditions_are_waited_for_within_the_timeout() {
    let Some(env) = Env::real(1, &["--dra-binding-timeout", "3s"], true).await else {
        return;
    };
    let node = env.nodes[0].clone();
    env.claim("attach").await;
    env.pod("p", json!({"resourceClaimName": "attach"}), None).await;
    // Reserved, not bound: the device is not attached.
    env.until("the claim is reserved", async || {
        let c = env.claims.get("attach").await.unwrap();
        !reserved_uids(&c).is_empty()
    })
    .await;
    assert_eq!(env.node_of("p").await, None);
    // The bound passes: what the binding wrote is given back, and the pod is told why.
    env.until("the binding gives up after 3s", async || {
        env.notes("p", "FailedScheduling")
            .await
            .iter()
            .any(|n| n.contains("binding conditions") && n.contains("not met within 3s"))
    })
    .await;
    assert_eq!(env.node_of("p").await, None);
    // Retried: reserved again; once the driver reports the device attached, the pod is bound.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut c = env.claims.get("attach").await.unwrap();
        if !reserved_uids(&c).is_empty() {
            let (pool, device) = devices(&c)[0].clone();
            c.status.as_mut().unwrap().devices = Some(vec![
                serde_json::from_value(json!({"driver": DRIVER, "pool": pool, "device": device,
                    "conditions": [{"type": "Attached", "status": "True", "reason": "Attached", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
                .unwrap(),
            ]);
            if env
                .claims
                .replace_status("attach", &PostParams::default(), &c)
                .await
                .is_ok()
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "{}", env.scheduler.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.until("p is bound once the device is attached", async || {
        env.node_of("p").await.is_some()
    })
    .await;
    assert_eq!(env.node_of("p").await, Some(node));
    env.cleanup().await;
}

/// The fake answers the first status write of the claim with 409: the scheduler re-reads the
/// claim and writes again, and only then sends the Binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_the_claims_status_write_is_retried_before_the_binding() {
    let env = Env::on(ApiTarget::start_fake(true).await.unwrap(), 1, &[], false).await;
    let fake = env.target.fake().unwrap();
    env.claim("c").await;
    let status = format!(
        "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/c/status",
        env.ns
    );
    fake.fail_next("PUT", &status, 409, 1);
    env.pod("p", json!({"resourceClaimName": "c"}), None).await;
    env.until("p is bound", async || env.node_of("p").await.is_some())
        .await;
    let claim_path = format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/c", env.ns);
    let binding = format!("/api/v1/namespaces/{}/pods/p/binding", env.ns);
    let steps: Vec<(String, String, u16)> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == claim_path || r.path == status || r.path == binding)
        .filter(|r| !r.is_watch())
        .map(|r| (r.method.clone(), r.path.clone(), r.status))
        .collect();
    let want = vec![
        ("PUT".to_owned(), claim_path.clone(), 200),
        ("PUT".to_owned(), status.clone(), 409),
        ("GET".to_owned(), claim_path.clone(), 200),
        ("PUT".to_owned(), status.clone(), 200),
        ("POST".to_owned(), binding, 201),
    ];
    assert_eq!(steps, want);
    let claim = env.claims.get("c").await.unwrap();
    assert!(has_finalizer(&claim));
    assert_eq!(reserved_uids(&claim).len(), 1);
    assert_eq!(devices(&claim).len(), 1);
    env.cleanup().await;
}

/// A device-plugin resource and a DRA claim in one pod: the NIC, on NUMA node 1 only, steers
/// the Topology Manager's hint there, and the claim's GPU follows it (gpu-0 of NUMA node 0 comes
/// first in upstream's order). The allocation record the node-side allocator reads and the
/// claim's allocation the kubelet prepares agree on NUMA node 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_resources_steer_the_hint_and_the_claim_follows_on_the_real_server() {
    let Some(env) = Env::real(1, &[], false).await else {
        return;
    };
    let client = env.target.client();
    let node = env.nodes[0].clone();
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch_status(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"allocatable": {"example.com/nic": "1"}}})),
        )
        .await
        .unwrap();
    let slices = Api::<ResourceSlice>::all(client.clone());
    let mut slice = slices.get(&format!("{node}-gpus")).await.unwrap();
    for (d, numa) in slice.spec.devices.iter_mut().flatten().zip([0, 1]) {
        d.attributes.get_or_insert_default().insert(
            "resource.kubernetes.io/numaNode".to_owned(),
            serde_json::from_value(json!({"int": numa})).unwrap(),
        );
    }
    slices
        .replace(&format!("{node}-gpus"), &PostParams::default(), &slice)
        .await
        .unwrap();
    use numaplane_e2e::harness::nrt;
    // First with a PCI locality that does not decode: the NRT stays usable, and the scheduler
    // counts the node in its gauge.
    nrt::apply(
        client.clone(),
        "numaplane-e2e",
        nrt::single_numa_node(
            json!({"name": node, "labels": {"numaplane.io/e2e": "true"}}),
            &[
                (numaplane::nrt::attr::PCI_LOCALITY, "0000:zz=1"),
                (numaplane::nrt::attr::CPU_MANAGER_POLICY, "static"),
                (
                    numaplane::nrt::attr::CPU_MANAGER_POLICY_OPTIONS,
                    "align-by-socket=true",
                ),
            ],
            vec![nrt::zone(0, vec![nrt::resource("cpu", "4", "4")])],
        ),
    )
    .await
    .unwrap();
    env.scheduler
        .until("numaplane_scheduler_nrt_pci_locality_invalid == 1")
        .await;
    env.scheduler
        .until("numaplane_scheduler_nodes{state=valid} == 1")
        .await;
    // A kubelet option the model cannot predict: the node and the option in one gauge, gone
    // with the option.
    let approximate = format!(
        "numaplane_scheduler_node_prediction_approximate{{node=\"{node}\",option=\"align-by-socket=true\"}} 1"
    );
    let text = env.scheduler.metrics().unwrap();
    assert!(text.contains(&approximate), "{approximate} missing:\n{text}");
    nrt::publish(
        client.clone(),
        &node,
        &[],
        vec![
            nrt::zone(0, vec![nrt::resource("cpu", "4", "4")]),
            nrt::zone(
                1,
                vec![
                    nrt::resource("cpu", "4", "4"),
                    nrt::resource("example.com/nic", "1", "1"),
                ],
            ),
        ],
    )
    .await
    .unwrap();
    env.scheduler
        .until("numaplane_scheduler_nrt_pci_locality_invalid == 0")
        .await;
    let text = env.scheduler.metrics().unwrap();
    assert!(
        !text.contains("numaplane_scheduler_node_prediction_approximate{"),
        "{text}"
    );
    env.claim("gpu").await;
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p", "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": "numaplane-scheduler", "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": "2", "memory": "1Gi", "example.com/nic": "1"},
                    "limits": {"cpu": "2", "memory": "1Gi", "example.com/nic": "1"},
                    "claims": [{"name": "gpu"}]}}]}}),
    )
    .unwrap();
    env.pods.create(&PostParams::default(), &p).await.unwrap();
    env.until("p is bound", async || env.node_of("p").await.is_some())
        .await;
    let pod = env.pods.get("p").await.unwrap();
    let record: numaplane::allocation::Allocation =
        serde_json::from_str(&pod.metadata.annotations.as_ref().unwrap()[numaplane::allocation::ANNOTATION])
            .unwrap();
    assert_eq!(record.containers[0].numa_nodes, Some(vec![1]), "{record:?}");
    let claim = env.claims.get("gpu").await.unwrap();
    assert_eq!(devices(&claim), [(node.clone(), "gpu-1".to_owned())]);
    env.cleanup().await;
}

/// The scheduler's copy of a claim can be behind: here it shows `c` unallocated while a driver
/// has allocated it to another device. The finalizer Update on that copy conflicts; the claim
/// read again is allocated elsewhere, so the reservation fails without writing anything, as
/// kube-scheduler's `bindClaim` does (the finalizer of a claim it does not allocate or reserve
/// would keep a foreign claim from being deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_copy_of_a_claim_allocated_elsewhere_is_left_untouched() {
    use numaplane_scheduler::live::{
        api::Writer,
        engine::dra::{ClaimError, ClaimWrite, PodRef, reserve_claim},
        metrics::Metrics,
    };
    let Some(env) = Env::real(1, &[], false).await else {
        return;
    };
    let node = env.nodes[0].clone();
    env.claim("c").await;
    let stale = env.claims.get("c").await.unwrap();
    let mut c = stale.clone();
    c.status = Some(
        serde_json::from_value(json!({"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": DRIVER, "pool": node, "device": "gpu-1"}]}}}))
        .unwrap(),
    );
    let pp = PostParams {
        field_manager: Some("e2e-driver".to_owned()),
        ..PostParams::default()
    };
    let before = env.claims.replace_status("c", &pp, &c).await.unwrap();
    let budget = numaplane_scheduler::live::api::Budget {
        qps: 100.0,
        burst: 100,
    };
    let (writer, _aux) = Writer::new(
        env.target.client(),
        budget,
        budget,
        "e2e".to_owned(),
        std::sync::Arc::new(Metrics::new()),
    );
    let ours: k8s_openapi::api::resource::v1::AllocationResult = serde_json::from_value(
        json!({"devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": node, "device": "gpu-0"}]}}),
    )
    .unwrap();
    let w = ClaimWrite {
        claim: stale,
        allocation: ours,
        allocate: true,
    };
    let pod = PodRef {
        namespace: &env.ns,
        name: "p",
        uid: "uid-p",
    };
    let got = reserve_claim(&writer, pod, &w).await;
    assert!(
        matches!(got, Err(ClaimError::AllocatedElsewhere { .. })),
        "{got:?}"
    );
    let after = env.claims.get("c").await.unwrap();
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version);
    assert!(!has_finalizer(&after), "{after:?}");
    env.cleanup().await;
}
