//! Live exporter figures: reaction time from a kubelet allocation change to the NRT write
//! arriving at the API server, with and without the kubelet Watch fast path, and the idle
//! footprint (RSS, CPU) of the agent at a 10 s resync.
//!
//! `cargo bench -p numaplane-e2e --bench exporter_live -- [CHANGES] [IDLE_SECONDS] [BURST_PODS]`
//! (defaults 200, 60 and 100; 0 changes or 0 burst pods skips that part). The burst measures
//! the kubelet request rate under pod churn against the kubelet's shared 100 requests/s. The
//! agent is the release binary, against the fake kubelet (tonic on a Unix socket) and the HTTP-level fake API server, all on this machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use numaplane::proto::podresources::{AllocatableResourcesResponse, ContainerResources, PodResources};
use numaplane_e2e::fake_api::{FakeApiServer, RecordedRequest};
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, GetMode};
use numaplane_e2e::harness::{Agent, bench};
use serde_json::json;

const NODE: &str = "bench-node";

fn fixture() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topology/tests/fixtures/2numa.xml"
    )
    .to_owned()
}

fn allocatable() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        cpu_ids: (0..32).collect(),
        ..Default::default()
    }
}

/// Pod `i` holds CPUs 0..2 when `i` is odd (node-0 cpu available 14), none otherwise (16).
fn pods(i: usize) -> Vec<PodResources> {
    if i.is_multiple_of(2) {
        return vec![];
    }
    vec![PodResources {
        name: format!("pod-{i}"),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            cpu_ids: vec![0, 1],
            ..Default::default()
        }],
        ..Default::default()
    }]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

struct Env {
    api: FakeApiServer,
    kubelet: FakeKubelet,
    agent: Agent,
    _dir: tempfile::TempDir,
}

async fn start(watch: bool, resync: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start().await.unwrap();
    api.install_nrt_crd();
    api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    let kubelet = FakeKubelet::start(
        &dir.path().join("kubelet.sock"),
        allocatable(),
        vec![],
        FakeKubeletOptions {
            watch,
            get: GetMode::Offered,
        },
    )
    .await
    .unwrap();
    let args: Vec<String> = [
        "--node-name",
        NODE,
        "--podresources-socket",
        &kubelet.socket().display().to_string(),
        "--topology-xml",
        &fixture(),
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--resync-interval",
        resync,
        "--pods-fingerprint-method",
        "all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent = Agent::spawn(&args).unwrap();
    agent.wait_serving(Duration::from_secs(30)).await.unwrap();
    api.wait_for_request(
        |r| r.method == "PATCH" && r.path.contains("noderesourcetopologies"),
        Duration::from_secs(30),
    )
    .await
    .expect("first write");
    Env {
        api,
        kubelet,
        agent,
        _dir: dir,
    }
}

async fn reaction(watch: bool, changes: usize) -> Vec<Duration> {
    let env = start(watch, "10s").await;
    let mut latencies = Vec::with_capacity(changes);
    for i in 1..=changes {
        // Let the previous write settle and stay clear of the minimum scan interval.
        tokio::time::sleep(Duration::from_millis(60)).await;
        env.api.clear_requests();
        let expected = if i % 2 == 1 { "\"14\"" } else { "\"16\"" };
        let t0 = Instant::now();
        env.kubelet.set_pods(pods(i));
        if !watch {
            // What the API server shows when the kubelet admits a pod: a pod event on the node.
            env.api.put(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("pod-{i}"), "namespace": "default"},
                "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "x"}]},
                "status": {"phase": if i % 2 == 1 { "Running" } else { "Succeeded" }}}));
        }
        let write = nrt_write(
            &env,
            expected,
            Duration::from_secs(10),
            &format!("change {i} never written"),
        )
        .await;
        latencies.push(write.at.saturating_duration_since(t0));
    }
    latencies.sort();
    latencies
}

/// The agent's first NRT write containing `text` within `timeout`; `what` names it when
/// there is none.
async fn nrt_write(env: &Env, text: &str, timeout: Duration, what: &str) -> RecordedRequest {
    env.api
        .wait_for_request(
            |r| {
                r.method == "PATCH"
                    && r.path.contains("noderesourcetopologies")
                    && r.body_str().contains(text)
            },
            timeout,
        )
        .await
        .unwrap_or_else(|| panic!("{what}\n{}", env.agent.stderr()))
}

/// A burst of `n` pod creations on the node, admitted by the kubelet 10 ms apart: the kubelet
/// calls per second the agent makes (peak over any 1 s window, and the average), and the time
/// from the last admission to the NRT write that shows every pod (its fingerprint).
async fn burst(n: usize) -> (f64, f64, Duration, Duration) {
    use numaplane_e2e::fake_kubelet::Method;
    let env = start(false, "10s").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = |k: &FakeKubelet| {
        [
            Method::List,
            Method::GetAllocatableResources,
            Method::Get,
            Method::Watch,
        ]
        .iter()
        .map(|m| k.calls(*m))
        .sum::<usize>()
    };
    let names: Vec<String> = (0..n).map(|i| format!("burst-{i}")).collect();
    let t0 = Instant::now();
    let mut samples = vec![(Duration::ZERO, calls(&env.kubelet))];
    for name in &names {
        env.api.put(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "x"}]},
            "status": {"phase": "Pending"}}));
    }
    let mut admitted: Vec<PodResources> = Vec::new();
    for name in &names {
        tokio::time::sleep(Duration::from_millis(10)).await;
        admitted.push(PodResources {
            name: name.clone(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        env.kubelet.set_pods(admitted.clone());
        samples.push((t0.elapsed(), calls(&env.kubelet)));
    }
    let last = Instant::now();
    let want = numaplane::fingerprint::compute(names.iter().map(|n| ("default", n.as_str())));
    let write = nrt_write(
        &env,
        &want,
        Duration::from_secs(60),
        "the burst never reached the NRT",
    )
    .await;
    let reaction = write.at.saturating_duration_since(last);
    // Keep sampling while the agent catches up (its poller gives up 5 s after a pod appears).
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        samples.push((t0.elapsed(), calls(&env.kubelet)));
    }
    let mut peak = 0.0f64;
    for (i, (at, c)) in samples.iter().enumerate() {
        if let Some((_, c1)) = samples[i..]
            .iter()
            .take_while(|(t, _)| *t <= *at + Duration::from_secs(1))
            .last()
        {
            peak = peak.max((c1 - c) as f64);
        }
    }
    let (end, total) = samples.last().copied().unwrap();
    let average = (total - samples[0].1) as f64 / end.as_secs_f64();
    (peak, average, end, reaction)
}

fn proc_stat(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based); after the comm they are 12 and 13 (1-based).
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (rss_kib, ticks as f64 / 100.0)
}

async fn idle(seconds: u64) -> (u64, u64, f64) {
    let env = start(false, "10s").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = env.agent.pid();
    let (_, cpu0) = proc_stat(pid);
    let mut peak = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak = peak.max(proc_stat(pid).0);
    }
    let (rss, cpu1) = proc_stat(pid);
    let millicores = (cpu1 - cpu0) / t0.elapsed().as_secs_f64() * 1000.0;
    drop(env.kubelet);
    (rss, peak, millicores)
}

fn main() {
    let args = bench::Args::from_env();
    let changes: usize = args.get(0, 200);
    let idle_seconds: u64 = args.get(1, 60);
    let burst_pods: usize = args.get(2, 100);
    let rt = bench::runtime(2);
    rt.block_on(async {
        let modes: &[(bool, &str)] = if changes == 0 {
            &[]
        } else {
            &[(true, "kubelet Watch"), (false, "pod watch (no kubelet Watch)")]
        };
        for &(watch, label) in modes {
            let l = reaction(watch, changes).await;
            println!(
                "reaction via {label}: n={} p50={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms",
                l.len(),
                percentile(&l, 0.5).as_secs_f64() * 1e3,
                percentile(&l, 0.9).as_secs_f64() * 1e3,
                percentile(&l, 0.99).as_secs_f64() * 1e3,
                l.last().unwrap().as_secs_f64() * 1e3,
            );
        }
        if burst_pods > 0 {
            let (peak, average, span, reaction) = burst(burst_pods).await;
            println!(
                "burst of {burst_pods} pod creations admitted 10 ms apart: kubelet calls peak {peak:.0}/s (any 1 s window), average {average:.1}/s over {:.1} s; last admission to NRT {:.1} ms",
                span.as_secs_f64(),
                reaction.as_secs_f64() * 1e3
            );
        }
        let (rss, peak, mc) = idle(idle_seconds).await;
        println!(
            "idle over {idle_seconds} s at 10 s resync: RSS {:.1} MiB (peak {:.1} MiB), CPU {mc:.2} millicores",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    });
}
