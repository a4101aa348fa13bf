//! `numaplane-scheduler run` started before the NodeResourceTopology CRD exists (install order,
//! a CRD removed): it says so once in its log, in `/readyz` and in a metric, keeps scheduling
//! what the `noTopology` behaviour allows, and reads NRTs as soon as the CRD appears.
//! On the kit's control plane, started without the CRD (this binary's own: the real server's
//! plain-text 404 and the CRD's establishment), else on the fake API server (a shared
//! cluster's CRD cannot be removed under other tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use numaplane::nrt::CRD_MISSING;
use numaplane_e2e::control_plane;
use numaplane_e2e::harness::{Agent, ApiTarget, nrt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const METRIC: &str = "numaplane_scheduler_nrt_crd_installed";

async fn create_pod(api: &Api<Pod>, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "numaplane-scheduler",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
}

async fn wait_bound(api: &Api<Pod>, name: &str, sched: &Agent) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = api.get(name).await.unwrap();
        if let Some(node) = pod.spec.and_then(|s| s.node_name) {
            return node;
        }
        assert!(Instant::now() < deadline, "{name} not bound\n{}", sched.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn says_the_crd_is_missing_schedules_anyway_and_picks_it_up() {
    let options = control_plane::Options {
        without_nrt_crd: true,
        ..Default::default()
    };
    let target = match control_plane::cluster_with(&options) {
        Ok(Some(cluster @ control_plane::Cluster::Kit(_))) => ApiTarget::on(cluster).await.unwrap(),
        Ok(_) => {
            println!(
                "{}",
                control_plane::skip_line(
                    "the missing CRD on a real kube-apiserver (ran on the HTTP-level fake)"
                )
            );
            ApiTarget::start_fake(false).await.unwrap()
        }
        Err(e) => panic!("no real API server: {e}"),
    };
    target.create_namespace("np").await.unwrap();
    target
        .create_labelled_node(
            "n0",
            &[],
            Some(json!({"cpu": "8", "memory": "32Gi", "pods": "110"})),
        )
        .await
        .unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        &target.kubeconfig().display().to_string(),
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut sched = Agent::spawn_scheduler("run", &args).unwrap();
    sched.wait_serving(WAIT).await.unwrap();

    // The default `noTopology: AssumeNone` schedules on a node without an NRT.
    let pods: Api<Pod> = Api::namespaced(target.client(), "np");
    create_pod(&pods, "before-crd").await;
    assert_eq!(wait_bound(&pods, "before-crd", &sched).await, "n0");
    sched.wait_until(&format!("{METRIC} == 0"), WAIT).await.unwrap();
    let (status, body) = sched.http_get("/readyz").unwrap();
    assert_eq!(status, 200, "ready means can serve: {body}");
    assert!(body.contains(CRD_MISSING), "{body}");

    // Several watch retries later, the log still says it once, not once a retry.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        sched.stderr().matches(CRD_MISSING).count(),
        1,
        "{}",
        sched.stderr()
    );
    assert!(
        !sched.stderr().contains("page not found"),
        "no raw 404 text in the log: {}",
        sched.stderr()
    );

    // The CRD appears: the metric, /readyz and the NRTs follow without a restart.
    match (target.fake(), target.control_plane()) {
        (Some(fake), _) => fake.install_nrt_crd(),
        (None, Some(cp)) => cp.install_nrt_crd().unwrap(),
        (None, None) => unreachable!("the kit's control plane or the fake"),
    }
    sched.wait_until(&format!("{METRIC} == 1"), WAIT).await.unwrap();
    let (status, body) = sched.http_get("/readyz").unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // An NRT whose only zone has no CPU left now keeps the next pod pending: NRTs are read.
    let zone = nrt::zone(
        0,
        vec![
            nrt::resource("cpu", "8", "0"),
            nrt::resource("memory", "32Gi", "31Gi"),
        ],
    );
    let body = nrt::single_numa_node(json!({"name": "n0"}), &[], vec![zone]);
    nrt::apply(target.client(), "e2e", body).await.unwrap();
    // The NRT watch starts once the CRD is seen: the node counts as valid once it has read it.
    sched
        .wait_until("numaplane_scheduler_nodes{state=valid} == 1", WAIT)
        .await
        .unwrap();
    create_pod(&pods, "after-crd").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod = pods.get("after-crd").await.unwrap();
    assert_eq!(
        pod.spec.and_then(|s| s.node_name),
        None,
        "the NRT's zone has no CPU: {}",
        sched.stderr()
    );
    assert!(sched.exited().is_none(), "{}", sched.stderr());
}
