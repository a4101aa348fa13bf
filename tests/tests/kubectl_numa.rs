//! `kubectl-numa` end to end, as a user runs it: the binary with a kubeconfig, against the
//! HTTP-level fake API server, or a real cluster when `NUMAPLANE_E2E_KUBECONFIG` is set (the
//! NRT CRD from deploy/crd.yaml installed; the tests create their own namespace, fake Nodes
//! and NRTs, and delete them afterwards). Cases a real cluster cannot be made to show (no CRD,
//! an object the CRD schema refuses, a 403) run on the fake only and say so when skipped.
//!
//! Checked: `top` in table and JSON; `explain` of a pending pod (a verdict per node, a
//! rejected node with a reason naming the cause, the fitting node); `explain` of a bound pod
//! with its allocation record next to the NRT, and its DRA claims' devices with their NUMA
//! nodes next to the container's recorded ones (MISALIGNED or aligned); and one clear stderr
//! line with the documented exit code for a missing CRD, missing or malformed NRTs, access
//! denied, a missing pod and bad usage.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use numaplane::nrt::NodeResourceTopology;
use numaplane_e2e::{
    binaries,
    harness::{ApiTarget, guaranteed_spec, unique_name},
};
use serde_json::{Value, json};

const GPU: &str = "example.com/gpu";
/// Field manager of the test's NRT writes, shown as "updated by" in `top`.
const MANAGER: &str = "numaplane-e2e";

struct Env {
    target: ApiTarget,
    ns: String,
    nodes: Vec<String>,
}

impl Env {
    async fn new() -> Env {
        Self::on(ApiTarget::start().await.unwrap()).await
    }

    async fn on(target: ApiTarget) -> Env {
        let ns = unique_name("np-kubectl");
        target.create_namespace(&ns).await.unwrap();
        Env {
            target,
            ns,
            nodes: Vec::new(),
        }
    }

    /// A Node (4 CPUs, 2 GPUs per zone, two zones) and its NRT, single-numa-node/container:
    /// `cpus` free CPUs per zone, `free` the GPU IDs still free per zone (of `g<zone><0|1>`).
    async fn node(&mut self, suffix: &str, cpus: [u32; 2], free: [&[&str]; 2]) -> String {
        let name = format!("{}-{suffix}", unique_name("np-kn"));
        let allocatable = json!({"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4"});
        self.target
            .create_labelled_node(&name, &[], Some(allocatable))
            .await
            .unwrap();
        self.nodes.push(name.clone());
        let zone = |z: usize| {
            json!({
                "name": format!("node-{z}"), "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "4", "allocatable": "4", "available": cpus[z].to_string()},
                    {"name": "memory", "capacity": "16Gi", "allocatable": "16Gi", "available": "16Gi"},
                    {"name": GPU, "capacity": "2", "allocatable": "2", "available": free[z].len().to_string()}
                ],
                "attributes": [{"name": format!("numaplane.io/free-devices.{GPU}"), "value": free[z].join(",")}]
            })
        };
        self.apply_nrt(json!({
            "metadata": {"name": name},
            "attributes": [
                {"name": "topologyManagerPolicy", "value": "single-numa-node"},
                {"name": "topologyManagerScope", "value": "container"}
            ],
            "zones": [zone(0), zone(1)]
        }))
        .await;
        name
    }

    async fn apply_nrt(&self, body: Value) {
        let mut body = body;
        body["apiVersion"] = json!("topology.node.k8s.io/v1alpha2");
        body["kind"] = json!("NodeResourceTopology");
        let nrt: NodeResourceTopology = serde_json::from_value(body).unwrap();
        let name = nrt.metadata.name.clone().unwrap();
        let api: Api<NodeResourceTopology> = Api::all(self.target.client());
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&nrt))
            .await
            .unwrap();
    }

    /// A pod asking for `cpu` exclusive CPUs and one GPU, for a scheduler nobody runs (so a
    /// real cluster leaves it pending), optionally bound with an allocation record.
    async fn pod(&self, name: &str, bound: Option<(&str, Value)>) {
        let mut meta = json!({"name": name, "labels": {"numaplane.io/e2e": "true"}});
        let mut spec = nobodys_pod_spec();
        if let Some((node, record)) = bound {
            spec["nodeName"] = json!(node);
            meta["annotations"] = json!({"numaplane.io/allocation": record.to_string()});
        }
        let pod: Pod = serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap();
        let pods: Api<Pod> = Api::namespaced(self.target.client(), &self.ns);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    /// Runs `kubectl-numa --kubeconfig K args…` off the runtime (the fake serves on it).
    async fn run(&self, args: &[&str]) -> Run {
        run_with(self.target.kubeconfig(), args).await
    }

    async fn cleanup(&self) {
        if !self.target.is_real() {
            return;
        }
        self.target.delete_test_objects(&self.ns, &self.nodes).await;
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    /// Exit `code` with exactly one stderr line containing every one of `needles`.
    fn assert_fails(&self, code: i32, needles: &[&str]) {
        assert_eq!(
            self.code,
            Some(code),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one clear line, got:\n{}", self.stderr);
        assert!(lines[0].starts_with("kubectl-numa: "), "{}", self.stderr);
        for n in needles {
            assert!(lines[0].contains(n), "{n:?} missing from {:?}", lines[0]);
        }
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
    }

    /// Asserts that stdout contains `text`.
    #[track_caller]
    fn assert_says(&self, text: &str) {
        assert!(
            self.stdout.contains(text),
            "{text:?} missing from:\n{}",
            self.stdout
        );
    }

    /// Asserts that stdout starts with `text`.
    #[track_caller]
    fn assert_starts(&self, text: &str) {
        assert!(
            self.stdout.starts_with(text),
            "{text:?} does not start:\n{}",
            self.stdout
        );
    }

    fn assert_ok(&self) {
        assert_eq!(
            self.code,
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(self.stderr.is_empty(), "{}", self.stderr);
    }
}

/// The spec of a pod for a scheduler nobody runs, asking for 2 exclusive CPUs and one GPU.
fn nobodys_pod_spec() -> Value {
    guaranteed_spec(
        "numaplane-e2e-nobody",
        &json!({"cpu": "2", "memory": "1Gi", GPU: "1"}),
    )
}

async fn run_with(kubeconfig: &std::path::Path, args: &[&str]) -> Run {
    let mut full = vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()];
    full.extend(args.iter().map(|a| (*a).to_owned()));
    let out: Output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binaries::kubectl_numa())
            .args(&full)
            // What the user's shell may set must not change what the test asks for.
            .env_remove("NUMAPLANE_OUTPUT")
            .env_remove("NUMAPLANE_CONTEXT")
            .env_remove("NUMAPLANE_SCHEDULER_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_zones_usage_policy_and_freshness() {
    let mut env = Env::new().await;
    let node = env.node("a", [1, 4], [&["g01"], &["g10", "g11"]]).await;

    let json = env.run(&["top", "--node", &node, "-o", "json"]).await;
    json.assert_ok();
    let v = json.json();
    assert_eq!(v["schema"], "numaplane.io/kubectl-numa/top/v1");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{v}");
    let n = &nodes[0];
    assert_eq!(n["node"], node.as_str());
    assert_eq!(n["policy"], "single-numa-node");
    assert_eq!(n["scope"], "container");
    assert_eq!(n["updatedBy"], MANAGER);
    let age = n["ageSeconds"].as_i64().unwrap();
    assert!((0..600).contains(&age), "age {age}");
    let zone0 = &n["zones"][0];
    assert_eq!(zone0["zone"], "node-0");
    let cpu = &zone0["resources"][0];
    assert_eq!(
        (
            &cpu["name"],
            &cpu["allocatable"],
            &cpu["available"],
            &cpu["used"],
            &cpu["usedPercent"]
        ),
        (&json!("cpu"), &json!("4"), &json!("1"), &json!("3"), &json!(75))
    );
    let gpu1 = &n["zones"][1]["resources"][2];
    assert_eq!((&gpu1["name"], &gpu1["usedPercent"]), (&json!(GPU), &json!(0)));

    let table = env.run(&["top", "--node", &node]).await;
    table.assert_ok();
    table.assert_says(&format!(
        "NODE {node}  policy=single-numa-node scope=container updated="
    ));
    table.assert_says(&format!("ago by {MANAGER}"));
    let cpu_row = table
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("node-0") && l.contains(" cpu "))
        .unwrap_or_else(|| panic!("no node-0 cpu row:\n{}", table.stdout));
    assert!(
        cpu_row.ends_with(&format!("[{}{}]  75%", "#".repeat(15), " ".repeat(5))),
        "{cpu_row:?}"
    );

    let only_gpu = env.run(&["top", "--node", &node, "--resource", GPU]).await;
    only_gpu.assert_ok();
    assert!(!only_gpu.stdout.contains(" cpu "), "{}", only_gpu.stdout);
    assert_eq!(only_gpu.stdout.matches(GPU).count(), 2, "{}", only_gpu.stdout);

    let missing = env.run(&["top", "--node", "np-no-such-node"]).await;
    missing.assert_fails(2, &["no NodeResourceTopology for node np-no-such-node"]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_pending_pod_gives_every_nodes_verdict() {
    let mut env = Env::new().await;
    // 4 free CPUs but no free GPU: a 1-GPU pod is rejected there.
    let full = env.node("full", [4, 4], [&[], &[]]).await;
    let roomy = env.node("roomy", [4, 1], [&["g00"], &[]]).await;
    env.pod("waiting", None).await;
    let pod = format!("{}/waiting", env.ns);

    let table = env.run(&["explain", &pod]).await;
    table.assert_ok();
    table.assert_starts(&format!(
        "Pod {pod} is pending (schedulerName numaplane-e2e-nobody)."
    ));
    let verdict = |node: &str| {
        table
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("no verdict line for {node}:\n{}", table.stdout))
            .to_owned()
    };
    let full_line = verdict(&full);
    assert!(full_line.contains("rejected"), "{full_line}");
    assert!(full_line.contains(GPU), "the reason names the GPU: {full_line}");
    assert!(verdict(&roomy).contains("fits"), "{}", table.stdout);

    let json = env.run(&["explain", &pod, "-o", "json"]).await;
    json.assert_ok();
    let v = json.json();
    assert_eq!(v["state"], "pending");
    assert_eq!(v["schema"], "numaplane.io/kubectl-numa/explain/v1");
    let decision = &v["report"]["results"][0];
    assert_eq!(decision["pod"], pod.as_str());
    let verdicts = decision["nodes"].as_array().unwrap();
    let of = |n: &str| {
        verdicts
            .iter()
            .find(|x| x["node"] == n)
            .unwrap_or_else(|| panic!("{n} missing: {v}"))
    };
    assert_eq!(of(&full)["feasible"], false);
    assert!(of(&full)["reasons"].to_string().contains(GPU), "{v}");
    assert_eq!(of(&roomy)["feasible"], true);
    // The model's placement on the fitting node: the zone with the free GPU.
    if decision["node"] == roomy.as_str() {
        assert_eq!(
            decision["allocation"]["containers"][0]["devices"][GPU],
            json!(["g00"])
        );
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_bound_pod_shows_its_record_next_to_the_nrt() {
    let mut env = Env::new().await;
    // g10 went to the pod; g11 is still free in zone 1.
    let node = env.node("b", [4, 2], [&["g00", "g01"], &["g11"]]).await;
    let record = json!({"version": "v1", "node": node, "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "app", "kind": "app", "numaNodes": [1], "devices": {GPU: ["g10"]}}]});
    env.pod("placed", Some((&node, record))).await;
    let pod = format!("{}/placed", env.ns);

    let table = env.run(&["explain", &pod]).await;
    table.assert_ok();
    let out = &table.stdout;
    assert!(
        out.starts_with(&format!("Pod {pod} is bound to node {node}")),
        "{out}"
    );
    assert!(
        out.contains(
            "Recorded allocation (numaplane.io/allocation): policy single-numa-node, scope container"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "NodeResourceTopology {node} now: policy=single-numa-node"
        )),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("node-1") && l.contains(GPU) && l.ends_with("g11")),
        "free IDs per zone:\n{out}"
    );
    assert!(
        out.contains(&format!("{GPU} g10 (container app, NUMA 1): held")),
        "{out}"
    );

    let json = env.run(&["explain", &pod, "-o", "json"]).await;
    json.assert_ok();
    let v = json.json();
    assert_eq!(v["state"], "bound");
    assert_eq!(v["record"]["containers"][0]["devices"][GPU], json!(["g10"]));
    assert_eq!(v["devices"][0]["listedFreeIn"], json!([]));
    assert_eq!(v["nrt"]["zones"][1]["freeDevices"][GPU], json!(["g11"]));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_nrts_are_named_and_fail_the_exit_code() {
    let mut env = Env::new().await;
    let good = env.node("good", [4, 4], [&[], &[]]).await;
    // The CRD schema accepts this one; the scheduler's model refuses its zone name.
    let bad = format!("{}-bad", unique_name("np-kn"));
    env.nodes.push(bad.clone());
    env.apply_nrt(json!({
        "metadata": {"name": bad},
        "zones": [{"name": "node-x", "type": "Node", "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]}]
    }))
    .await;
    let run = env.run(&["top", "--node", &bad]).await;
    run.assert_fails(
        2,
        &[&format!("NodeResourceTopology {bad} is malformed"), "node-x"],
    );

    match env.target.fake() {
        Some(fake) => {
            // An object the CRD would refuse (written past validation): zones is not a list.
            let broken = format!("{}-broken", unique_name("np-kn"));
            fake.put(
                json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                "metadata": {"name": broken}, "zones": "oops"}),
            );
            let all = env.run(&["top", "-o", "json"]).await;
            assert_eq!(all.code, Some(2), "{}", all.stderr);
            let lines: Vec<&str> = all.stderr.lines().collect();
            assert_eq!(lines.len(), 2, "one line per malformed object:\n{}", all.stderr);
            assert!(
                all.stderr
                    .contains(&format!("NodeResourceTopology {broken} is malformed"))
            );
            assert!(
                all.stderr
                    .contains(&format!("NodeResourceTopology {bad} is malformed"))
            );
            // The good node is still shown.
            let nodes = all.json()["nodes"].as_array().unwrap().clone();
            assert_eq!(nodes.len(), 1);
            assert_eq!(nodes[0]["node"], good.as_str());
        }
        None => eprintln!("skipped on a real cluster: an NRT its CRD schema refuses cannot be stored there"),
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_pod_and_bad_usage() {
    let env = Env::new().await;
    let missing = env.run(&["explain", &format!("{}/nope", env.ns)]).await;
    missing.assert_fails(1, &[&format!("pod {}/nope not found", env.ns)]);
    env.run(&["explain", "a/b/c"])
        .await
        .assert_fails(64, &["\"a/b/c\" is not NAMESPACE/POD or POD"]);
    env.run(&["top", "--no-such-flag"])
        .await
        .assert_fails(64, &["--no-such-flag"]);
    env.run(&["top", "-o", "yaml"]).await.assert_fails(64, &["yaml"]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sched.yaml");
    std::fs::write(&cfg, "noTopolgy: Reject\n").unwrap();
    env.run(&["explain", "x/y", "--config", cfg.to_str().unwrap()])
        .await
        .assert_fails(64, &["scheduler config", "noTopolgy"]);
    run_with(std::path::Path::new("/nonexistent/kubeconfig"), &["top"])
        .await
        .assert_fails(64, &["loading kubeconfig /nonexistent/kubeconfig"]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_or_without_any_nrt() {
    // A real cluster's CRD cannot be removed for one test: this one is the fake's.
    let env = Env::on(ApiTarget::start_fake(false).await.unwrap()).await;
    env.pod("p", None).await;
    for args in [vec!["top"], vec!["explain", &format!("{}/p", env.ns)]] {
        env.run(&args).await.assert_fails(
            1,
            &[
                "NodeResourceTopology API (topology.node.k8s.io/v1alpha2) is not served",
                "install the CRD",
            ],
        );
    }
    env.target.fake().unwrap().install_nrt_crd();
    env.run(&["top"])
        .await
        .assert_fails(2, &["no NodeResourceTopology objects in the cluster"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_bound_pod_shows_its_claims_devices_next_to_the_containers_numa_nodes() {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    const DRIVER: &str = "gpu.example.com";
    let mut env = Env::new().await;
    let node = env.node("c", [4, 2], [&["g00", "g01"], &["g10", "g11"]]).await;
    let client = env.target.client();
    let class = format!("{}-gpu", env.ns);
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": class}, "spec": {"selectors": [
                {"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // One GPU per NUMA node, placed by the standard attribute.
    Api::<ResourceSlice>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("{node}-gpus")},
                "spec": {"driver": DRIVER, "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": "gpu-0", "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}}},
                        {"name": "gpu-1", "attributes": {"resource.kubernetes.io/numaNode": {"int": 1}}}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &env.ns);
    for name in ["placed-far", "placed-near"] {
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    // The container's CPUs are recorded on NUMA node 1.
    let record = json!({"version": "v1", "node": node, "policy": "single-numa-node", "scope": "container",
        "containers": [{"name": "app", "kind": "app", "numaNodes": [1]}]});
    let mut spec = nobodys_pod_spec();
    spec["nodeName"] = json!(node);
    spec["resourceClaims"] = json!([
        {"name": "far", "resourceClaimName": "placed-far"},
        {"name": "near", "resourceClaimName": "placed-near"}
    ]);
    spec["containers"][0]["resources"]["claims"] = json!([{"name": "far"}, {"name": "near"}]);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "placed",
        "labels": {"numaplane.io/e2e": "true"},
        "annotations": {"numaplane.io/allocation": record.to_string()}}, "spec": spec}))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &env.ns);
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    // As kube-scheduler writes it: the allocation and the pod reserving it, through the
    // status subresource. placed-far got the GPU of NUMA node 0, placed-near the one of node 1.
    for (name, device) in [("placed-far", "gpu-0"), ("placed-near", "gpu-1")] {
        claims
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]}},
                    "reservedFor": [{"resource": "pods", "name": "placed", "uid": uid}]}})),
            )
            .await
            .unwrap();
    }
    let pod = format!("{}/placed", env.ns);

    let table = env.run(&["explain", &pod]).await;
    table.assert_ok();
    table.assert_says(&format!(
        "DRA claims: each device's NUMA nodes (from the ResourceSlices of {node}) next to the recorded NUMA nodes of the containers that use it:\n\
         \x20 claim far (ResourceClaim placed-far): MISALIGNED (a device is on none of the NUMA nodes of its containers)\n\
         \x20   device {DRIVER}/{node}/gpu-0 (request gpu): NUMA 0\n\
         \x20   container app: NUMA 1\n\
         \x20 claim near (ResourceClaim placed-near): aligned\n\
         \x20   device {DRIVER}/{node}/gpu-1 (request gpu): NUMA 1\n\
         \x20   container app: NUMA 1\n"
    ));

    let json = env.run(&["explain", &pod, "-o", "json"]).await;
    json.assert_ok();
    let v = json.json();
    assert_eq!(v["state"], "bound");
    let far = &v["claims"][0];
    assert_eq!(far["name"], "far");
    assert_eq!(far["state"], "allocated");
    assert_eq!(
        far["numa"]["devices"][0],
        json!({"device": format!("{DRIVER}/{node}/gpu-0"), "request": "gpu", "numaNodes": [0]})
    );
    assert_eq!(
        far["numa"]["containers"],
        json!([{"name": "app", "numaNodes": [1]}])
    );
    assert_eq!(far["numa"]["alignment"], "misaligned");
    assert_eq!(v["claims"][1]["numa"]["devices"][0]["numaNodes"], json!([1]));
    assert_eq!(v["claims"][1]["numa"]["alignment"], "aligned");

    // The slice gone: the device's NUMA node is unknown, said on stderr (exit 2), no panic.
    Api::<ResourceSlice>::all(client.clone())
        .delete(&format!("{node}-gpus"), &Default::default())
        .await
        .unwrap();
    let gone = env.run(&["explain", &pod]).await;
    assert_eq!(gone.code, Some(2), "{}\n{}", gone.stdout, gone.stderr);
    gone.assert_says(&format!(
        "device {DRIVER}/{node}/gpu-0 (request gpu): NUMA unknown (in no ResourceSlice of {node})"
    ));
    assert!(
        gone.stderr.contains(&format!(
            "kubectl-numa: pod {pod} claim far: device {DRIVER}/{node}/gpu-0 is in no ResourceSlice of node {node}"
        )),
        "{}",
        gone.stderr
    );
    assert!(!gone.stderr.contains("panicked"), "{}", gone.stderr);
    numaplane_e2e::harness::dra::delete_gpu_objects(&client, std::slice::from_ref(&node), &class).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_is_one_clear_line() {
    // The 403 is injected: this one is the fake's.
    let mut env = Env::on(ApiTarget::start_fake(true).await.unwrap()).await;
    env.node("a", [4, 4], [&[], &[]]).await;
    env.pod("p", None).await;
    let fake = env.target.fake().unwrap().clone();
    fake.fail_next(
        "GET",
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
        403,
        1,
    );
    env.run(&["top"]).await.assert_fails(
        1,
        &[
            "access denied: cannot list noderesourcetopologies.topology.node.k8s.io",
            "injected failure (403)",
        ],
    );
    fake.fail_next("GET", &format!("/api/v1/namespaces/{}/pods/p", env.ns), 403, 1);
    env.run(&["explain", &format!("{}/p", env.ns)])
        .await
        .assert_fails(1, &[&format!("access denied: cannot get pod {}/p", env.ns)]);
    fake.fail_next("GET", "/api/v1/nodes", 403, 1);
    env.run(&["explain", &format!("{}/p", env.ns)])
        .await
        .assert_fails(1, &["access denied: cannot list nodes"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_from_the_environment_and_contexts() {
    let mut env = Env::new().await;
    let node = env.node("ctx", [4, 4], [&[], &[]]).await;
    // The test's kubeconfig plus a context whose server refuses connections.
    let text = std::fs::read_to_string(env.target.kubeconfig()).unwrap();
    let mut kc: Value = serde_saphyr::from_str(&text).unwrap();
    let current = kc["current-context"].as_str().unwrap().to_owned();
    let user = kc["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == current.as_str())
        .unwrap()["context"]["user"]
        .clone();
    kc["clusters"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "np-dead", "cluster": {"server": "http://127.0.0.1:1"}}));
    kc["contexts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "np-dead", "context": {"cluster": "np-dead", "user": user}}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();

    // $KUBECONFIG, as kubectl: no --kubeconfig flag.
    let from_env = {
        let path = path.clone();
        let node = node.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(binaries::kubectl_numa())
                .args(["top", "--node", &node, "-o", "json"])
                .env("KUBECONFIG", &path)
                .env_remove("NUMAPLANE_KUBECONFIG")
                .env_remove("NUMAPLANE_CONTEXT")
                .env_remove("NUMAPLANE_OUTPUT")
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(
        from_env.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&from_env.stderr)
    );
    let v: Value = serde_json::from_slice(&from_env.stdout).unwrap();
    assert_eq!(v["nodes"][0]["node"], node.as_str());

    let args = ["--context", current.as_str(), "top", "--node", node.as_str()];
    run_with(&path, &args).await.assert_ok();
    run_with(&path, &["--context", "np-dead", "top"])
        .await
        .assert_fails(1, &["cannot list noderesourcetopologies.topology.node.k8s.io"]);
    run_with(&path, &["--context", "np-no-such-context", "top"])
        .await
        .assert_fails(64, &["np-no-such-context"]);
    env.cleanup().await;
}

/// `explain` of a pending pod with a claim reads the claim, its PersistentVolume and the
/// StorageClasses, so the volume's node affinity decides as in the scheduler; a gated pod is
/// said gated, with no node evaluated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_pods_volumes_and_says_a_gated_pod_is_gated() {
    let mut env = Env::new().await;
    if env.target.is_real() && env.target.control_plane().is_none() {
        // Creating PersistentVolumes on a shared cluster is left to the fake and the kit's own.
        env.cleanup().await;
        return;
    }
    let a = env.node("a", [4, 4], [&["g00"], &[]]).await;
    let b = env.node("b", [4, 4], [&["g00"], &[]]).await;
    let client = env.target.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for n in [&a, &b] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/hostname": n}}})),
            )
            .await
            .unwrap();
    }
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    volumes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("{}-pv", env.ns)},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "local": {"path": "/mnt/e2e"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [b]}]}]}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &env.ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data",
                    "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                "spec": {"volumeName": format!("{}-pv", env.ns), "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // A real server takes the status through its subresource only.
    claims
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &env.ns);
    let pod = |name: &str, extra: Value| -> Pod {
        let mut spec = nobodys_pod_spec();
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    pods.create(
        &PostParams::default(),
        &pod(
            "with-volume",
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "gated",
            json!({"schedulingGates": [{"name": "example.com/wait"}]}),
        ),
    )
    .await
    .unwrap();

    let run = env
        .run(&["explain", &format!("{}/with-volume", env.ns), "-o", "json"])
        .await;
    run.assert_ok();
    let v = run.json();
    let result = &v["report"]["results"][0];
    assert_eq!(result["node"], b.as_str(), "{v}");
    let rejected = result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["node"] == a.as_str())
        .unwrap();
    assert_eq!(rejected["feasible"], false);
    assert!(
        result["unsupported"].as_array().is_none_or(|u| u.is_empty()),
        "a claim is fully modelled (attach limits included): {v}"
    );

    let table = env.run(&["explain", &format!("{}/gated", env.ns)]).await;
    table.assert_ok();
    table.assert_says("-> GATED");
    assert!(
        table
            .stdout
            .contains("Scheduling is blocked due to non-empty scheduling gates: example.com/wait"),
        "{}",
        table.stdout
    );
    let json = env
        .run(&["explain", &format!("{}/gated", env.ns), "-o", "json"])
        .await;
    assert_eq!(json.json()["report"]["results"][0]["gated"], true);
    env.cleanup().await;
}
