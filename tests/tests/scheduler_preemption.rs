//! NUMA-aware preemption end to end: `numaplane-scheduler run` against a real kube-apiserver
//! (priorities then come from PriorityClasses the test creates, and the test finishes the
//! victims' deletions as their kubelet would), or the HTTP-level fake API server without one. The test publishes the node's NRT as its exporter would.
//!
//! One node, two zones of 4 CPUs: zone 0 holds `a` (3 CPUs, priority 0) and `c` (1 CPU,
//! priority 500); zone 1 holds `b` and `d` (2 CPUs each, priority 0). A pod of priority 1000
//! needs 4 CPUs on one zone. Evicting `a` and `b` would free 5 CPUs on the node but no whole
//! zone; the scheduler must evict exactly `b` and `d` (zone 1), nominate the node, mark each
//! victim `DisruptionTarget` before deleting it, record `Preempted` events, and bind the pod to
//! zone 1 once the NRT shows the room, while a low-priority pod created in between never gets
//! the freed zone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use numaplane::{allocation::Allocation, nrt::NodeResourceTopology};
use numaplane_e2e::harness::{Agent, ApiTarget, nrt, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

struct Env {
    target: ApiTarget,
    ns: String,
    node: String,
}

impl Env {
    async fn new() -> Env {
        let target = ApiTarget::start().await.unwrap();
        let ns = unique_name("np-preempt");
        let node = unique_name("np-node");
        target.create_namespace(&ns).await.unwrap();
        let allocatable = json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
        target
            .create_labelled_node(&node, &[], Some(allocatable))
            .await
            .unwrap();
        Env { target, ns, node }
    }

    /// The node's NRT: free CPUs per zone, the pods the kubelet reports (fingerprint).
    async fn publish_nrt(&self, free: [i64; 2], pods: &[&str]) {
        let zone = |z: usize| {
            nrt::zone(
                z,
                vec![
                    nrt::resource("cpu", "4", &free[z].to_string()),
                    nrt::resource("memory", "16Gi", "16Gi"),
                ],
            )
        };
        let keys: Vec<String> = pods.iter().map(|p| format!("{}/{p}", self.ns)).collect();
        nrt::publish(self.target.client(), &self.node, &keys, vec![zone(0), zone(1)])
            .await
            .unwrap();
    }

    /// A Guaranteed pod of `cpus` CPUs at `priority`; bound to the node on `zone` (with the
    /// record a numaplane placement carries) when given, else pending for numaplane.
    async fn create_pod(&self, name: &str, cpus: u32, priority: i32, zone: Option<u32>) {
        let r = json!({"cpu": cpus.to_string(), "memory": "1Gi"});
        let mut pod = json!({
            "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true", "app": name}},
            "spec": {
                "schedulerName": "numaplane-scheduler",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": r, "limits": r}}]
            }
        });
        if self.target.is_real() {
            pod["spec"]["priorityClassName"] = json!(self.priority_class(priority).await);
        } else {
            pod["spec"]["priority"] = json!(priority);
        }
        if let Some(z) = zone {
            pod["spec"]["nodeName"] = json!(self.node);
            let record = json!({"version": "v1", "node": self.node, "policy": "single-numa-node",
                "scope": "container", "containers": [{"name": "app", "kind": "app", "numaNodes": [z]}]});
            pod["metadata"]["annotations"] = json!({numaplane::allocation::ANNOTATION: record.to_string()});
        }
        let pods: Api<Pod> = Api::namespaced(self.target.client(), &self.ns);
        let pod: Pod = serde_json::from_value(pod).unwrap();
        // The API server's Priority admission reads PriorityClasses through its informer: a
        // class created a moment ago may not be seen yet, and the pod is refused (403).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => break,
                Err(kube::Error::Api(s))
                    if s.code == 403
                        && s.message.contains("no PriorityClass")
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("create pod {name}: {e}"),
            }
        }
    }

    /// A PriorityClass of `value` (real clusters set `spec.priority` from it).
    async fn priority_class(&self, value: i32) -> String {
        let name = format!("{}-p{value}", self.ns);
        let api: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(self.target.client());
        let _ = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).unwrap(),
            )
            .await;
        name
    }

    async fn pod(&self, name: &str) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.target.client(), &self.ns);
        pods.get_opt(name).await.unwrap()
    }

    async fn cleanup(&self) {
        let client = self.target.client();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.ns);
        let _ = pods
            .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
            .await;
        let _ = Api::<NodeResourceTopology>::all(client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
        let _ = Api::<Node>::all(client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
        if self.target.is_real() {
            let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
            for v in [0, 500, 1000] {
                let _ = classes
                    .delete(&format!("{}-p{v}", self.ns), &DeleteParams::default())
                    .await;
            }
        }
        let _ = Api::<Namespace>::all(client)
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_evicts_exactly_its_zone_and_keeps_it() {
    let env = Env::new().await;
    for (name, cpus, priority, zone) in [("a", 3, 0, 0), ("c", 1, 500, 0), ("b", 2, 0, 1), ("d", 2, 0, 1)] {
        env.create_pod(name, cpus, priority, Some(zone)).await;
    }
    env.publish_nrt([0, 0], &["a", "b", "c", "d"]).await;
    let mut uids = std::collections::BTreeMap::new();
    for v in ["b", "d"] {
        uids.insert(v, env.pod(v).await.unwrap().metadata.uid.unwrap());
    }
    let args = vec![
        "--kubeconfig".to_owned(),
        env.target.kubeconfig().display().to_string(),
        "--leader-elect=false".to_owned(),
        "--kube-api-qps".to_owned(),
        "1000".to_owned(),
        "--kube-api-burst".to_owned(),
        "1000".to_owned(),
    ];
    // The kubelet's part of an eviction, on a real server: the victims go once deleted.
    let terminator = env.target.finish_deletions(&env.ns);
    let mut sched = Agent::spawn_scheduler("run", &args).unwrap();
    sched.wait_serving(WAIT).await.unwrap();
    env.create_pod("high", 4, 1000, None).await;

    // Exactly b and d go; a and c stay.
    let deadline = Instant::now() + WAIT;
    while env.pod("b").await.is_some() || env.pod("d").await.is_some() {
        assert!(
            Instant::now() < deadline,
            "victims not evicted\n{}",
            sched.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(env.pod("a").await.is_some() && env.pod("c").await.is_some());
    let high = env.pod("high").await.unwrap();
    assert_eq!(
        high.status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref()),
        Some(env.node.as_str()),
        "the preemptor is nominated"
    );
    assert_eq!(
        node_of(&high),
        None,
        "not bound while the NRT still shows the victims"
    );

    // A low-priority pod arrives while the victims' room is not yet published, and stays
    // pending after it is: the room is the preemptor's.
    env.create_pod("low", 2, 0, None).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.publish_nrt([0, 4], &["a", "c"]).await;
    let deadline = Instant::now() + WAIT;
    let high = loop {
        let high = env.pod("high").await.unwrap();
        if node_of(&high).is_some() {
            break high;
        }
        assert!(
            Instant::now() < deadline,
            "preemptor not bound\n{}",
            sched.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(node_of(&high).as_deref(), Some(env.node.as_str()));
    let record = high
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(numaplane::allocation::ANNOTATION))
        .map(|a| Allocation::parse(a).unwrap())
        .expect("the record");
    assert_eq!(
        record.containers[0].numa_nodes,
        Some(vec![1]),
        "zone 1, the freed one"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        node_of(&env.pod("low").await.unwrap()),
        None,
        "low took the preemptor's zone"
    );

    if env.target.is_real() {
        // The writes as the server saw them: each victim's deletion asked after it was marked
        // (the pod the deletion is first seen on already has the condition), with its UID,
        // and no pod of zone 0 touched.
        let terminated = terminator.terminated();
        let names: Vec<&str> = terminated
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        assert_eq!(
            names.iter().copied().collect::<std::collections::BTreeSet<_>>(),
            ["b", "d"].into()
        );
        for p in &terminated {
            let v = p.metadata.name.as_deref().unwrap();
            assert_eq!(p.metadata.uid.as_deref(), Some(uids[v].as_str()));
            let conditions = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            assert!(
                conditions.iter().any(|c| c.type_ == "DisruptionTarget"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("PreemptionByScheduler")),
                "{v}: deleted before it was marked DisruptionTarget: {conditions:?}"
            );
        }
        // Preempted events name the preemptor.
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.target.client(), &env.ns);
        let deadline = Instant::now() + WAIT;
        loop {
            let preempted: Vec<_> = events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Preempted"))
                .collect();
            if preempted.len() >= 2 {
                for e in &preempted {
                    let by = format!("Preempted by pod {}", high.metadata.uid.as_deref().unwrap());
                    assert!(e.note.as_deref().unwrap_or_default().starts_with(&by), "{e:?}");
                }
                break;
            }
            assert!(Instant::now() < deadline, "Preempted events: {preempted:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(terminator);
    if let Some(fake) = env.target.fake() {
        let reqs = fake.requests();
        for v in ["b", "d"] {
            let status_at = reqs
                .iter()
                .position(|r| {
                    r.method == "PATCH"
                        && r.path.ends_with(&format!("/pods/{v}/status"))
                        && r.body_str().contains("DisruptionTarget")
                        && r.body_str().contains("PreemptionByScheduler")
                })
                .unwrap_or_else(|| panic!("no DisruptionTarget on {v}"));
            let delete_at = reqs
                .iter()
                .position(|r| r.method == "DELETE" && r.path.ends_with(&format!("/pods/{v}")))
                .unwrap_or_else(|| panic!("{v} not deleted"));
            assert!(status_at < delete_at, "{v}: condition after the deletion");
            let delete = &reqs[delete_at];
            let body = delete.body_json().unwrap_or_default();
            assert_eq!(
                body["preconditions"]["uid"].as_str(),
                Some(uids[v].as_str()),
                "{v}: the deletion is pinned to the UID: {}",
                delete.body_str()
            );
        }
        assert!(
            !reqs
                .iter()
                .any(|r| r.method == "DELETE" && (r.path.ends_with("/pods/a") || r.path.ends_with("/pods/c"))),
            "a pod of zone 0 was deleted"
        );
        // Preempted events name the preemptor.
        let deadline = Instant::now() + WAIT;
        loop {
            let events = fake.list("events.k8s.io/v1", "Event", Some(&env.ns));
            let preempted = events.iter().filter(|e| e["reason"] == "Preempted").count();
            if preempted >= 2 {
                break;
            }
            assert!(Instant::now() < deadline, "Preempted events: {events:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let metrics = sched.metrics().unwrap();
        assert!(
            numaplane_e2e::harness::metric_value(
                &metrics,
                "numaplane_scheduler_preemption_victims_total",
                &[]
            ) == Some(2.0),
            "{metrics}"
        );
    }
    sched.kill();
    env.cleanup().await;
}
