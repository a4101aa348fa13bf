//! How close the schedulers come to the API server's own binding ceiling, on the real control
//! plane from the kit (`../shared/k8s`: kube-apiserver v1.36.2, no kubelet, and for the last
//! run the kit's kube-scheduler), in one run on the same Nodes and pods.
//!
//! Size (~760 lines of code): one bench binary, whose runs share one cluster setup, one
//! clean-up between runs and one watch of binds and events; its watch is a small copy of
//! dra_alignment_live's (moving both to tests/harness is left to do), and its token bucket is
//! numaplane's writer's own quota.
//!
//! Cluster (the workload of tests/benches/scheduler_live.rs, there on the HTTP-level fake):
//! NODES Nodes (32 CPUs, 256Gi, and enough pods allocatable for PODS / NODES: at least 250),
//! each with a NodeResourceTopology of 2 zones of 16 CPUs and 128Gi under Topology Manager
//! policy `none`, and PODS pending pods of 100m CPU / 128Mi in one namespace, tolerating the
//! `not-ready` and `unreachable` taints of the fake Nodes.
//!
//! Runs, each from the same state (every pod of the run before deleted with grace period 0,
//! gone, and PODS pending pods created anew), each with client QPS QPS and burst 2 × QPS:
//! 1. ceiling: a plain kube client that POSTs `pods/binding` for every pod, nodes round-robin,
//!    CONCURRENCY requests in flight behind a governor token bucket as numaplane's writer has
//!    (0: one run each at 8, 16 and 32). No scheduling at all. Once more at the largest
//!    concurrency with the pod watch a scheduler keeps open (every pod), shown in brackets:
//!    what serving that watch costs the server;
//! 2. `numaplane-scheduler run` (release binary, log level info) with `--kube-api-qps QPS
//!    --kube-api-burst 2×QPS`;
//! 3. the kit's kube-scheduler (default profile, `schedulerName: default-scheduler`), with
//!    `--kube-api-qps` / `--kube-api-burst` through `CONTROL_PLANE_SCHEDULER_FLAGS`; skipped
//!    with `--skip-kube-scheduler` or `SKIP_KUBE_SCHEDULER=1`;
//!
//! numaplane runs ROUNDS times (default 3), each round beside a ceiling run at the best
//! concurrency of step 1, numaplane first in odd rounds and second in even ones: consecutive
//! runs on this machine differ by a third or more, so numaplane's ratio is taken within each
//! round and the median is the figure. The ratio to the best ceiling of every run is printed too.
//!
//! kube-apiserver compacts etcd every 10 s here (`--etcd-compaction-interval=10s`; its default
//! is 5 minutes): every run churns all its pods within seconds, and without compaction each run
//! pays for the history the runs before it left, so the later runs (the schedulers) ran on a
//! slower server than the ceiling they are compared with.
//!
//! Timing: the clock starts at the first POST (ceiling) or the process spawn (numaplane; for
//! kube-scheduler the kit's `control-plane start --scheduler`, its process start and wait for
//! `/readyz` inside the time), and stops at the last bind a watch of the namespace shows.
//! pods/s = bound pods / that time. For numaplane the table also gives its startup apart: spawn
//! to `caches synced` in its log (polled every 10 ms) and to the first bind.
//!
//! Events: after the last bind of a scheduler run the bench waits (at most 60 s, or until 10 s
//! pass without a new one) for a `Scheduled` Event (events.k8s.io/v1, by the pod's UID, as a
//! watch shows them arriving) of every bound pod, and reports how many came, how many the
//! core/v1 list shows, and when the last one arrived relative to the last bind; for numaplane
//! also its counters `numaplane_scheduler_api_writes_total` and `..._api_writes_dropped_total`.
//!
//! `cargo bench -p numaplane-e2e --bench scheduler_ceiling_live -- [NODES] [PODS] [QPS] [CONCURRENCY] [ROUNDS]`
//! (defaults 500, 2000, 1000, 0, 3). `NUMAPLANE_BENCH_SCHEDULER_FLAGS` adds flags to numaplane's
//! command line (split at spaces). Without the kit it prints one line and exits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, stream};
use governor::RateLimiter;
use k8s_openapi::api::core::v1::{Binding, Event as CoreEvent, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Resource,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use numaplane_e2e::{
    control_plane::{self, Options},
    harness::{Agent, ApiTarget, bench, metric_value, nrt, unique_name},
};
use serde_json::{Value, json};

const NUMAPLANE: &str = "numaplane-scheduler";
const KUBE_SCHEDULER: &str = "default-scheduler";
/// The scheduler name of the ceiling's pods: no scheduler serves it.
const NOBODY: &str = "numaplane-ceiling-nobody";
/// How long a run may take to bind every pod.
const BIND_TIMEOUT: Duration = Duration::from_secs(300);
/// How long setup steps (objects created or deleted, watches synced) may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Requests in flight while the bench creates Nodes and pods.
const CREATE_CONCURRENCY: usize = 64;
/// The longest wait for the `Scheduled` events after the last bind, and the quiet time after
/// which the count counts as final.
const EVENTS_WAIT: Duration = Duration::from_secs(60);
const EVENTS_QUIET: Duration = Duration::from_secs(10);
/// The ceiling's concurrencies when the argument is 0.
const CONCURRENCIES: [usize; 3] = [8, 16, 32];

/// The first time a watch of `K` showed each key `key_of` gives (`None`: not yet of interest).
struct FirstSeen {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FirstSeen {
    /// Watches `api`; returns once the watch has listed it.
    async fn watch<K, F>(api: Api<K>, key_of: F) -> FirstSeen
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
        K::DynamicType: Default,
        F: Fn(&K) -> Option<String> + Send + 'static,
    {
        Self::watch_with(api, watcher::Config::default(), key_of).await
    }

    /// [`Self::watch`] with a watcher configuration (selectors).
    async fn watch_with<K, F>(api: Api<K>, wc: watcher::Config, key_of: F) -> FirstSeen
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
        K::DynamicType: Default,
        F: Fn(&K) -> Option<String> + Send + 'static,
    {
        let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let synced = Arc::new(AtomicBool::new(false));
        let (sink, ready) = (seen.clone(), synced.clone());
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, wc).default_backoff());
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    Ok(watcher::Event::InitDone) => {
                        ready.store(true, Ordering::SeqCst);
                        continue;
                    }
                    _ => continue,
                };
                if let Some(key) = key_of(&obj) {
                    sink.lock().unwrap().entry(key).or_insert_with(Instant::now);
                }
            }
        });
        let deadline = Instant::now() + SETUP_TIMEOUT;
        while !synced.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "a watch did not sync");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        FirstSeen { seen, task }
    }

    fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn keys(&self) -> HashSet<String> {
        self.seen.lock().unwrap().keys().cloned().collect()
    }

    /// When the first and the last key were seen.
    fn first_last(&self) -> Option<(Instant, Instant)> {
        let seen = self.seen.lock().unwrap();
        Some((*seen.values().min()?, *seen.values().max()?))
    }

    /// How many of `keys` were seen, and when the last of them was.
    fn of(&self, keys: &HashSet<String>) -> (usize, Option<Instant>) {
        let seen = self.seen.lock().unwrap();
        let at: Vec<Instant> = keys.iter().filter_map(|k| seen.get(k).copied()).collect();
        (at.len(), at.iter().max().copied())
    }
}

impl Drop for FirstSeen {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The binds of the namespace's pods (by UID).
async fn watch_binds(api: Api<Pod>) -> FirstSeen {
    FirstSeen::watch(api, |p: &Pod| {
        p.spec.as_ref()?.node_name.as_ref()?;
        p.metadata.uid.clone()
    })
    .await
}

/// The `Scheduled` events.k8s.io Events of the namespace (by the UID of their pod).
async fn watch_scheduled(api: Api<Event>) -> FirstSeen {
    FirstSeen::watch(api, |e: &Event| {
        (e.reason.as_deref() == Some("Scheduled"))
            .then(|| e.regarding.as_ref()?.uid.clone())
            .flatten()
    })
    .await
}

/// How the `Scheduled` events of a run came.
struct Events {
    /// Bound pods with one (events.k8s.io/v1 watch).
    arrived: usize,
    /// Bound pods with one in the core/v1 list.
    core: usize,
    /// Seconds from the last bind to the last event's arrival (negative: before it).
    last_after_bind: Option<f64>,
}

/// One run's figures.
struct Outcome {
    run: String,
    bound: usize,
    wall: Duration,
    first: Duration,
    /// numaplane: spawn to `caches synced`.
    synced: Option<Duration>,
    events: Option<Events>,
    notes: Vec<String>,
    /// The round of a numaplane run and of the ceiling run beside it.
    round: Option<usize>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        self.bound as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

fn node_nrt(node: &str) -> Value {
    let zone = |i| {
        nrt::zone(
            i,
            vec![
                nrt::resource("cpu", "16", "16"),
                nrt::resource("memory", "128Gi", "128Gi"),
            ],
        )
    };
    json!({"apiVersion": nrt::API_VERSION, "kind": "NodeResourceTopology",
        "metadata": {"name": node, "labels": {"numaplane.io/e2e": "true"}},
        "topologyPolicies": ["None"], "attributes": nrt::attributes("none", None, &[]),
        "zones": [zone(0), zone(1)]})
}

fn pod(name: &str, scheduler: &str) -> Pod {
    let tolerate = |key: &str| json!({"key": key, "operator": "Exists"});
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": scheduler, "automountServiceAccountToken": false,
            "tolerations": [tolerate("node.kubernetes.io/not-ready"), tolerate("node.kubernetes.io/unreachable")],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    }))
    .unwrap()
}

struct Bench {
    target: ApiTarget,
    ns: String,
    nodes: Vec<String>,
    pods: usize,
    qps: u32,
    /// What took how long, in order.
    phases: Mutex<Vec<(String, Duration)>>,
}

impl Bench {
    async fn setup(target: ApiTarget, nodes: usize, pods: usize, qps: u32) -> Bench {
        let t0 = Instant::now();
        let client = target.client();
        let ns = unique_name("np-ceiling");
        target.create_namespace(&ns).await.unwrap();
        let prefix = unique_name("np-ceiling-node");
        let names: Vec<String> = (0..nodes).map(|i| format!("{prefix}-{i:04}")).collect();
        let allocatable = json!({"cpu": "32", "memory": "256Gi",
            "pods": 250.max(2 * pods.div_ceil(nodes)).to_string()});
        let target_ref = &target;
        stream::iter(&names)
            .map(|node| {
                let (client, allocatable) = (client.clone(), allocatable.clone());
                async move {
                    target_ref
                        .create_labelled_node(node, &[("kubernetes.io/hostname", node)], Some(allocatable))
                        .await
                        .unwrap();
                    nrt::apply(client, "numaplane-e2e", node_nrt(node)).await.unwrap();
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let bench = Bench {
            target,
            ns,
            nodes: names,
            pods,
            qps,
            phases: Mutex::default(),
        };
        bench.phase(format!("setup: {nodes} Nodes and NRTs"), t0);
        bench
    }

    fn phase(&self, what: String, since: Instant) {
        let took = since.elapsed();
        eprintln!("{what}: {:.1} s", took.as_secs_f64());
        self.phases.lock().unwrap().push((what, took));
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.target.client(), &self.ns)
    }

    fn pod_name(i: usize) -> String {
        format!("pod-{i:05}")
    }

    /// Creates the PODS pending pods for `scheduler`.
    async fn create_pods(&self, scheduler: &str) {
        let t0 = Instant::now();
        let api = self.pods_api();
        stream::iter(0..self.pods)
            .map(|i| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &pod(&Self::pod_name(i), scheduler))
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let took = t0.elapsed().as_secs_f64();
        eprintln!(
            "{} pods for {scheduler} created in {took:.1} s ({:.0}/s)",
            self.pods,
            self.pods as f64 / took.max(1e-9)
        );
    }

    /// Waits until every pod is bound; panics after [`BIND_TIMEOUT`] with `log()`'s tail.
    /// Returns (bound, time to the last bind, time to the first bind, the last bind).
    async fn wait_bound(
        &self,
        binds: &FirstSeen,
        start: impl Fn() -> Option<Instant>,
        log: impl Fn() -> String,
    ) -> (usize, Duration, Duration, Instant) {
        let t0 = Instant::now();
        loop {
            let bound = binds.len();
            if bound >= self.pods {
                let start = start().expect("a start before the binds");
                let (first, last) = binds.first_last().unwrap();
                return (bound, last - start, first.saturating_duration_since(start), last);
            }
            if t0.elapsed() > BIND_TIMEOUT {
                let log = log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "{bound}/{} pods bound after {BIND_TIMEOUT:?}; the last log lines:\n{}",
                    self.pods,
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for a `Scheduled` event of every bound pod (see the first comment).
    async fn wait_events(&self, events: &FirstSeen, bound: &HashSet<String>, last_bind: Instant) -> Events {
        let mut last_count = (0, Instant::now());
        loop {
            let (n, _) = events.of(bound);
            if n != last_count.0 {
                last_count = (n, Instant::now());
            }
            if n >= bound.len() || last_count.1.elapsed() > EVENTS_QUIET || last_bind.elapsed() > EVENTS_WAIT
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (arrived, last) = events.of(bound);
        let core_api: Api<CoreEvent> = Api::namespaced(self.target.client(), &self.ns);
        let core: HashSet<String> = core_api
            .list(&ListParams::default().fields("reason=Scheduled"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.involved_object.uid)
            .filter(|u| bound.contains(u))
            .collect();
        let signed = |at: Instant| match at.checked_duration_since(last_bind) {
            Some(d) => d.as_secs_f64(),
            None => -last_bind.duration_since(at).as_secs_f64(),
        };
        Events {
            arrived,
            core: core.len(),
            last_after_bind: last.map(signed),
        }
    }

    /// Deletes every pod (grace period 0) and event of the namespace; waits until no pod is left.
    async fn clean(&self) {
        let t0 = Instant::now();
        let pods = self.pods_api();
        let all = ListParams::default();
        pods.delete_collection(&DeleteParams::default().grace_period(0), &all)
            .await
            .unwrap();
        let events: Api<Event> = Api::namespaced(self.target.client(), &self.ns);
        events
            .delete_collection(&DeleteParams::default(), &all)
            .await
            .unwrap();
        let deadline = Instant::now() + SETUP_TIMEOUT;
        while !pods.list_metadata(&all).await.unwrap().items.is_empty() {
            assert!(Instant::now() < deadline, "pods left after {SETUP_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("pods and events deleted in {:.1} s", t0.elapsed().as_secs_f64());
    }

    /// Run 1: Bindings POSTed by a plain client, `concurrency` in flight.
    async fn ceiling(&self, concurrency: usize, with_watches: bool) -> Outcome {
        let t0 = Instant::now();
        self.create_pods(NOBODY).await;
        let binds = watch_binds(self.pods_api()).await;
        // A client of its own, as a scheduler process has.
        let client = control_plane::client_for(self.target.kubeconfig()).await.unwrap();
        // The pod watch a scheduler keeps open (every pod, as numaplane's and kube-scheduler's
        // informer), each Binding showing in it: what serving it costs the server.
        let _watch = if with_watches {
            Some(
                FirstSeen::watch_with(
                    Api::<Pod>::all(client.clone()),
                    watcher::Config::default().any_semantic(),
                    |_| None,
                )
                .await,
            )
        } else {
            None
        };
        let api: Api<Pod> = Api::namespaced(client, &self.ns);
        let limiter = RateLimiter::direct(numaplane_scheduler::live::api::quota(
            f64::from(self.qps),
            2 * self.qps,
        ));
        let start: OnceLock<Instant> = OnceLock::new();
        let (errors, retried_ok) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let (api, limiter, start_ref, errors_ref, retried_ref) =
            (&api, &limiter, &start, &errors, &retried_ok);
        stream::iter(0..self.pods)
            .map(|i| async move {
                let name = Self::pod_name(i);
                let binding = Binding {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    target: ObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("Node".to_owned()),
                        name: Some(self.nodes[i % self.nodes.len()].clone()),
                        ..ObjectReference::default()
                    },
                };
                for attempt in 0..3 {
                    limiter.until_ready().await;
                    start_ref.get_or_init(Instant::now);
                    let r = api
                        .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
                        .await;
                    match r {
                        Ok(_) => {
                            if attempt > 0 {
                                retried_ref.fetch_add(1, Ordering::Relaxed);
                            }
                            return;
                        }
                        Err(e) => {
                            if errors_ref.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("ceiling: binding {name}: {e}");
                            }
                        }
                    }
                }
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<()>>()
            .await;
        let (bound, wall, first, _) = self
            .wait_bound(&binds, || start.get().copied(), String::new)
            .await;
        drop(binds);
        self.clean().await;
        self.phase(
            format!("run ceiling, {concurrency} in flight (with pods and clean-up)"),
            t0,
        );
        let mut notes = Vec::new();
        let errors = errors.into_inner();
        if errors > 0 {
            notes.push(format!(
                "{errors} Binding requests failed ({} pods bound on a retry)",
                retried_ok.into_inner()
            ));
        }
        Outcome {
            run: if with_watches {
                format!("(ceiling, {concurrency} in flight, + pod watch)")
            } else {
                format!("ceiling, {concurrency} in flight")
            },
            bound,
            wall,
            first,
            synced: None,
            events: None,
            notes,
            round: None,
        }
    }

    /// Run 2: numaplane-scheduler.
    async fn numaplane(&self) -> Outcome {
        let t0 = Instant::now();
        self.create_pods(NUMAPLANE).await;
        let binds = watch_binds(self.pods_api()).await;
        let events = watch_scheduled(Api::namespaced(self.target.client(), &self.ns)).await;
        let args: Vec<String> = [
            "--kubeconfig",
            &self.target.kubeconfig().display().to_string(),
            "--leader-elect=false",
            "--kube-api-qps",
            &self.qps.to_string(),
            "--kube-api-burst",
            &(2 * self.qps).to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(
            std::env::var("NUMAPLANE_BENCH_SCHEDULER_FLAGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned),
        )
        .collect();
        let start = Instant::now();
        let mut sched = Agent::spawn_binary(
            numaplane_e2e::binaries::scheduler(),
            "run",
            &args,
            "--listen",
            "info",
        )
        .unwrap();
        let log = sched.stderr_path().to_path_buf();
        let synced = tokio::spawn(async move {
            loop {
                if std::fs::read_to_string(&log).is_ok_and(|t| t.contains("caches synced")) {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let (bound, wall, first, last) = self.wait_bound(&binds, || Some(start), || sched.stderr()).await;
        let synced = if synced.is_finished() {
            Some(synced.await.unwrap() - start)
        } else {
            synced.abort();
            None
        };
        let scheduled = self.wait_events(&events, &binds.keys(), last).await;
        let metrics = sched.metrics().unwrap_or_default();
        let log = sched.stderr();
        sched.kill();
        let mut notes: Vec<String> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("numaplane_scheduler_api_writes_total")
                    || l.starts_with("numaplane_scheduler_api_writes_dropped_total")
                    || l.starts_with("numaplane_scheduler_event_write_errors_total")
                    || l.starts_with("numaplane_scheduler_binding_errors_total")
            })
            .map(str::to_owned)
            .collect();
        if metric_value(&metrics, "numaplane_scheduler_api_writes_dropped_total", &[]).is_none() {
            notes
                .push("numaplane_scheduler_api_writes_dropped_total: no sample (nothing dropped)".to_owned());
        }
        // Startup: when each first list completed, from the scheduler's `listed` lines.
        let listed: Vec<String> = log
            .lines()
            .map(numaplane_e2e::harness::strip_ansi)
            .filter(|l| l.contains(" listed "))
            .filter_map(|l| {
                let field = |name: &str| {
                    l.split(&format!("{name}="))
                        .nth(1)?
                        .split_whitespace()
                        .next()
                        .map(str::to_owned)
                };
                Some(format!(
                    "{} {} objects at {} ms",
                    field("stream")?,
                    field("objects")?,
                    field("since_start_ms")?
                ))
            })
            .collect();
        if !listed.is_empty() {
            notes.push(format!("lists done: {}", listed.join(", ")));
        }
        let warnings = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .count();
        if warnings > 0 {
            notes.push(format!(
                "{warnings} WARN/ERROR log lines, e.g.: {}",
                log.lines()
                    .find(|l| l.contains("WARN") || l.contains("ERROR"))
                    .unwrap_or_default()
            ));
        }
        drop((binds, events));
        self.clean().await;
        self.phase(
            "run numaplane (with pods, events wait and clean-up)".to_owned(),
            t0,
        );
        Outcome {
            run: "numaplane-scheduler".to_owned(),
            bound,
            wall,
            first,
            synced,
            events: Some(scheduled),
            notes,
            round: None,
        }
    }

    /// Run 3: the kit's kube-scheduler (`None` off the kit's cluster).
    async fn kube_scheduler(&self) -> Option<Outcome> {
        let Some(cp) = self.target.control_plane() else {
            println!(
                "SKIPPED kube-scheduler run: not on the kit's control plane ({} is set)",
                control_plane::REAL_CLUSTER_ENV
            );
            return None;
        };
        let t0 = Instant::now();
        let script = control_plane::kit().expect("the kit's control-plane script");
        self.create_pods(KUBE_SCHEDULER).await;
        let binds = watch_binds(self.pods_api()).await;
        let events = watch_scheduled(Api::namespaced(self.target.client(), &self.ns)).await;
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
        let (bound, wall, first, last) = self
            .wait_bound(&binds, || Some(start), || cp.log("kube-scheduler.log"))
            .await;
        let scheduled = self.wait_events(&events, &binds.keys(), last).await;
        drop((binds, events));
        self.clean().await;
        self.phase(
            "run kube-scheduler (with pods, events wait and clean-up)".to_owned(),
            t0,
        );
        Some(Outcome {
            run: "kube-scheduler".to_owned(),
            bound,
            wall,
            first,
            synced: None,
            events: Some(scheduled),
            notes: vec![format!(
                "`control-plane start --scheduler` returned (kube-scheduler ready) after {:.2} s",
                ready.as_secs_f64()
            )],
            round: None,
        })
    }
}

fn print_table(nodes: usize, pods: usize, qps: u32, runs: &[Outcome]) {
    println!(
        "Binding ceiling vs schedulers, real kube-apiserver v1.36.2: {nodes} nodes x 2 zones (policy none), {pods} pending pods of 100m / 128Mi, client QPS {qps} / burst {}",
        2 * qps
    );
    println!(
        "{:<24} {:>10} {:>8} {:>8} {:>12} {:>10} {:>16} {:>12}",
        "run",
        "pods bound",
        "wall s",
        "pods/s",
        "first bind s",
        "synced s",
        "Scheduled events",
        "last event s"
    );
    let opt = |d: Option<f64>, p: usize| d.map_or("-".to_owned(), |d| format!("{d:.p$}"));
    for r in runs {
        let (events, late) = match &r.events {
            Some(e) => (
                format!("{}/{} ({} core)", e.arrived, r.bound, e.core),
                opt(e.last_after_bind, 2),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "{:<24} {:>10} {:>8.2} {:>8.1} {:>12.2} {:>10} {:>16} {:>12}",
            r.run,
            format!("{}/{pods}", r.bound),
            r.wall.as_secs_f64(),
            r.rate(),
            r.first.as_secs_f64(),
            opt(r.synced.map(|d| d.as_secs_f64()), 2),
            events,
            late
        );
    }
    println!(
        "  (wall and first bind from the first POST or the process start; last event: after the last bind)"
    );
    let is_ceiling = |r: &Outcome| r.run.starts_with("ceiling");
    let ceiling = runs
        .iter()
        .filter(|r| is_ceiling(r))
        .max_by(|a, b| a.rate().total_cmp(&b.rate()));
    let after_first =
        |r: &Outcome| (r.bound.saturating_sub(1)) as f64 / (r.wall - r.first).as_secs_f64().max(1e-9);
    for r in runs {
        if let (Some(c), false) = (ceiling, is_ceiling(r)) {
            println!(
                "  {} / the best ceiling of every run ({}): {:.2} (from the first bind on: {:.0} pods/s, {:.2})",
                r.run,
                c.run,
                r.rate() / c.rate(),
                after_first(r),
                after_first(r) / c.rate()
            );
        }
        for n in &r.notes {
            println!("  {}: {n}", r.run);
        }
    }
    // Within each round: numaplane against the ceiling run beside it.
    let mut ratios = Vec::new();
    for r in runs.iter().filter(|r| r.round.is_some() && !is_ceiling(r)) {
        let Some(c) = runs.iter().find(|c| c.round == r.round && is_ceiling(c)) else {
            continue;
        };
        let ratio = r.rate() / c.rate();
        ratios.push(ratio);
        println!(
            "  {} / {}: {ratio:.2} (from the first bind on: {:.2})",
            r.run,
            c.run,
            after_first(r) / c.rate()
        );
    }
    ratios.sort_by(f64::total_cmp);
    if let (Some(lo), Some(hi)) = (ratios.first(), ratios.last()) {
        println!(
            "  numaplane-scheduler / ceiling within a round: median {:.2} over {} rounds (lowest {lo:.2}, highest {hi:.2})",
            ratios[ratios.len() / 2],
            ratios.len()
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = bench::Args::from_env();
    let nodes: usize = args.get(0, 500);
    let pods: usize = args.get(1, 2000);
    let qps: u32 = args.get(2, 1000);
    let concurrency: usize = args.get(3, 0);
    let rounds: usize = args.get(4, 3).max(1);
    let skip_kube_scheduler = std::env::args().any(|a| a == "--skip-kube-scheduler")
        || std::env::var("SKIP_KUBE_SCHEDULER").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        nodes > 0 && pods <= nodes * 160,
        "{pods} pods on {nodes} nodes of 32 CPUs: at most 160 pods of 100m per node"
    );
    // Each run churns every pod (created, bound, deleted) within seconds: without compaction
    // (kube-apiserver's default is every 5 minutes) each later run pays for the history of the
    // runs before it, and the order of the runs would decide their ratios.
    let options = Options {
        apiserver_flags: Some("--etcd-compaction-interval=10s".to_owned()),
        ..Options::default()
    };
    let Some(cluster) = control_plane::require("scheduler_ceiling_live (a real kube-apiserver)", &options)
    else {
        return;
    };
    // Build (or find) the binary before any clock starts.
    let t0 = Instant::now();
    numaplane_e2e::binaries::scheduler();
    eprintln!(
        "control plane and numaplane-scheduler binary ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let target = ApiTarget::on(cluster).await.unwrap();
    let bench = Bench::setup(target, nodes, pods, qps).await;
    let concurrencies = match concurrency {
        0 => CONCURRENCIES.to_vec(),
        n => vec![n],
    };
    let mut runs = Vec::new();
    let mut best: Option<(usize, f64)> = None;
    for &c in &concurrencies {
        let r = bench.ceiling(c, false).await;
        if best.is_none_or(|(_, rate)| r.rate() > rate) {
            best = Some((c, r.rate()));
        }
        runs.push(r);
    }
    if let Some(&most) = concurrencies.iter().max() {
        runs.push(bench.ceiling(most, true).await);
    }
    // numaplane in rounds, each beside a ceiling run at the best concurrency, first one then
    // the other in turn: from one run to the next this machine's server moves by a third or
    // more, so a ratio is taken within a round, and the rounds give its spread.
    let best_concurrency = best.map_or(32, |(c, _)| c);
    for round in 1..=rounds {
        let mut pair = Vec::new();
        for numaplane_first in [round % 2 == 1, round % 2 == 0] {
            let mut r = if numaplane_first {
                bench.numaplane().await
            } else {
                bench.ceiling(best_concurrency, false).await
            };
            r.run.push_str(&format!(", round {round}"));
            r.round = Some(round);
            pair.push(r);
        }
        runs.extend(pair);
    }
    if skip_kube_scheduler {
        println!("SKIPPED kube-scheduler run (--skip-kube-scheduler / SKIP_KUBE_SCHEDULER)");
    } else {
        runs.extend(bench.kube_scheduler().await);
    }
    let t1 = Instant::now();
    bench.target.delete_test_objects(&bench.ns, &bench.nodes).await;
    bench.phase("clean-up: namespace, Nodes and NRTs".to_owned(), t1);
    print_table(nodes, pods, qps, &runs);
    let phases = bench.phases.lock().unwrap();
    let line: Vec<String> = phases
        .iter()
        .map(|(what, d)| format!("{what} {:.1} s", d.as_secs_f64()))
        .collect();
    println!("  time: {}", line.join("; "));
}
