//! Live scheduler end to end: `numaplane-scheduler run` (release binary) against the HTTP-level
//! fake API server on this machine, with NODES nodes of 2 NUMA zones (NRTs published) and PODS
//! pending pods of 100m CPU / 128Mi (the workload of the kube-scheduler reference figures in
//! BENCHMARKS.md). Prints pods/s from process start and from the first bind, the queue-to-bind
//! latency p50/p99 (the scheduler's own histogram), and the API writes per bound pod.
//!
//! `cargo bench -p numaplane-e2e --bench scheduler_live -- [NODES] [PODS] [QPS]`
//! (defaults 500, 2000, 50; burst = 2 × QPS).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use numaplane_e2e::{
    fake_api::FakeApiServer,
    harness::{Agent, bench, nrt},
};
use serde_json::json;

const NS: &str = "bench";

/// The `le` upper bound below which a fraction `q` of the histogram's samples fall.
fn quantile(metrics: &str, name: &str, q: f64) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
    {
        let le = line.split("le=\"").nth(1)?.split('"').next()?;
        let le: f64 = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let v: f64 = line.rsplit(' ').next()?.parse().ok()?;
        buckets.push((le, v));
    }
    let total = buckets.last()?.1;
    buckets.iter().find(|(_, c)| *c >= q * total).map(|(le, _)| *le)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = bench::Args::from_env();
    let nodes: usize = args.get(0, 500);
    let pods: usize = args.get(1, 2000);
    let qps: u32 = args.get(2, 50);
    let api = FakeApiServer::start().await.unwrap();
    api.install_nrt_crd();
    api.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    bench::put_nodes(&api, nodes, "None", nrt::attributes("none", None, &[]));
    for p in 0..pods {
        api.put(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{p:05}"), "namespace": NS, "uid": format!("uid-{p}"),
                         "creationTimestamp": "2026-11-24T00:00:00Z"},
            "spec": {"schedulerName": "numaplane-scheduler", "containers": [{"name": "c", "image": "pause",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
            "status": {"phase": "Pending"}}));
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    // Build (or find) the binary before the clock starts: the build is not the scheduler's time.
    numaplane_e2e::binaries::scheduler();
    api.clear_requests();
    let start = Instant::now();
    let mut sched = Agent::spawn_scheduler(
        "run",
        &[
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--leader-elect=false".into(),
            "--kube-api-qps".into(),
            qps.to_string(),
            "--kube-api-burst".into(),
            (qps * 2).to_string(),
        ],
    )
    .unwrap();
    sched.wait_serving(Duration::from_secs(30)).await.unwrap();
    let mut first_bind = None;
    let deadline = start + Duration::from_secs(600);
    let bound = loop {
        let bound = api
            .list("v1", "Pod", Some(NS))
            .iter()
            .filter(|p| {
                p.pointer("/spec/nodeName")
                    .is_some_and(|n| n.as_str().is_some_and(|s| !s.is_empty()))
            })
            .count();
        if bound > 0 && first_bind.is_none() {
            first_bind = Some(start.elapsed());
        }
        if bound >= pods || Instant::now() > deadline {
            break bound;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let total = start.elapsed();
    // Let the low-priority writes (events) drain, then count every write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let metrics = sched.metrics().unwrap();
    let reqs = api.requests();
    let writes = |pred: &dyn Fn(&numaplane_e2e::fake_api::RecordedRequest) -> bool| {
        reqs.iter().filter(|r| pred(r)).count()
    };
    let bindings = writes(&|r| r.method == "POST" && r.path.ends_with("/binding"));
    let events = writes(&|r| {
        (r.method == "POST" || r.path.contains("/events/")) && r.path.contains("events") && r.method != "GET"
    });
    let status = writes(&|r| r.method == "PATCH" && r.path.ends_with("/status"));
    let all_writes = writes(&|r| r.method != "GET");
    let first = first_bind.unwrap_or(total);
    let after_first = total.saturating_sub(first).as_secs_f64().max(1e-9);
    println!(
        "numaplane-scheduler run: {nodes} nodes x 2 zones, {pods} pending pods, client QPS {qps} (burst {})",
        qps * 2
    );
    println!("  bound              {bound}/{pods}");
    println!(
        "  all bound after    {:.2} s from process start ({:.0} pods/s)",
        total.as_secs_f64(),
        bound as f64 / total.as_secs_f64()
    );
    println!(
        "  first bind after   {:.3} s; then {:.0} pods/s",
        first.as_secs_f64(),
        (bound.saturating_sub(1)) as f64 / after_first
    );
    let q = |x| quantile(&metrics, "numaplane_scheduler_e2e_scheduling_duration_seconds", x);
    println!(
        "  queue-to-bind      p50 <= {:?} s, p99 <= {:?} s (histogram bucket bounds)",
        q(0.5),
        q(0.99)
    );
    let d = |x| quantile(&metrics, "numaplane_scheduler_decision_duration_seconds", x);
    println!(
        "  decision           p50 <= {:?} s, p99 <= {:?} s",
        d(0.5),
        d(0.99)
    );
    println!(
        "  API writes         {all_writes} total: {bindings} bindings, {events} event writes, {status} status patches = {:.2} writes per bound pod",
        all_writes as f64 / bound.max(1) as f64
    );
    sched.kill();
}
