//! What the extender adds to kube-scheduler per pod, on its real HTTP endpoint:
//! `numaplane-scheduler extender` (release binary) against the HTTP-level fake API server with
//! NODES nodes of 2 NUMA zones (NRTs published), called as kube-scheduler calls it (one
//! keep-alive connection, `nodeCacheCapable: true`: the pod and every node name) with `filter`
//! then `prioritize` for each pod, ROUNDS pods of each kind:
//! - unaligned: Burstable, 100m CPU / 128Mi (answered without the model);
//! - aligned: Guaranteed, 4 whole CPUs / 1Gi (the model judges every node).
//!
//! Prints, per kind, the `filter`, `prioritize` and per-pod (both) round trip p50/p99/mean, and
//! the transport floor (`GET /healthz` on the same connection). `bind` is not timed: it is one
//! API write for either kind, the same write kube-scheduler's own binder would make.
//!
//! `cargo bench -p numaplane-e2e --bench extender_live -- [NODES] [ROUNDS]` (defaults 500, 2000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use numaplane_e2e::{
    fake_api::FakeApiServer,
    harness::{Agent, bench, nrt},
};
use serde_json::json;

/// A keep-alive HTTP/1.1 connection, as Go's `http.Client` keeps to the extender.
struct Conn {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Conn {
    fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            reader: BufReader::new(stream),
            addr,
        }
    }

    /// One request; returns the status and body.
    fn call(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        let stream = self.reader.get_mut();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut status_line = String::new();
        self.reader.read_line(&mut status_line).unwrap();
        let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut out = vec![0u8; length];
        self.reader.read_exact(&mut out).unwrap();
        (status, String::from_utf8(out).unwrap())
    }
}

struct Stats(Vec<Duration>);

impl Stats {
    fn line(&mut self) -> String {
        self.0.sort_unstable();
        let q = |f: f64| self.0[((self.0.len() as f64 * f) as usize).min(self.0.len() - 1)];
        let mean = self.0.iter().sum::<Duration>() / u32::try_from(self.0.len()).unwrap();
        format!(
            "p50 {:>7.1} µs  p99 {:>7.1} µs  mean {:>7.1} µs",
            q(0.5).as_secs_f64() * 1e6,
            q(0.99).as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6
        )
    }
}

fn pod(i: usize, guaranteed: bool) -> serde_json::Value {
    let resources = if guaranteed {
        let r = json!({"cpu": "4", "memory": "1Gi"});
        json!({"requests": r, "limits": r})
    } else {
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}})
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
        "spec": {"containers": [{"name": "c", "image": "pause", "resources": resources}]}})
}

fn main() {
    let args = bench::Args::from_env();
    let nodes: usize = args.get(0, 500);
    let rounds: usize = args.get(1, 2000);
    let rt = bench::runtime(1);
    let api = rt.block_on(FakeApiServer::start()).unwrap();
    api.install_nrt_crd();
    let names = bench::put_nodes(
        &api,
        nodes,
        "SingleNUMANodeContainerLevel",
        nrt::attributes("single-numa-node", Some("container"), &[]),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    numaplane_e2e::binaries::scheduler();
    let mut ext = Agent::spawn_scheduler(
        "extender",
        &[
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--leader-elect=false".into(),
        ],
    )
    .unwrap();
    rt.block_on(ext.wait_serving(Duration::from_secs(30))).unwrap();
    ext.set_wait(Duration::from_secs(60));
    rt.block_on(ext.wait_ready());
    let mut conn = Conn::open(ext.addr());
    let mut floor = Stats(Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let (status, _) = conn.call("GET", "/healthz", "");
        floor.0.push(t.elapsed());
        assert_eq!(status, 200);
    }
    println!(
        "numaplane-scheduler extender: {nodes} nodes x 2 zones, {rounds} pods per kind, filter + prioritize over all {nodes} node names (nodeCacheCapable)"
    );
    println!("  transport floor (GET /healthz)        {}", floor.line());
    for (kind, guaranteed) in [
        ("unaligned (Burstable 100m)", false),
        ("aligned (Guaranteed 4 CPUs)", true),
    ] {
        let (mut filter, mut prioritize, mut per_pod) =
            (Stats(Vec::new()), Stats(Vec::new()), Stats(Vec::new()));
        // Warm-up, not counted.
        for i in 0..rounds / 10 {
            let body = json!({"Pod": pod(i, guaranteed), "NodeNames": names}).to_string();
            conn.call("POST", "/filter", &body);
        }
        for i in 0..rounds {
            let body = json!({"Pod": pod(i, guaranteed), "NodeNames": names}).to_string();
            let t0 = Instant::now();
            let (status, reply) = conn.call("POST", "/filter", &body);
            let t1 = Instant::now();
            assert_eq!(status, 200);
            assert!(reply.contains("\"Error\":\"\""), "{reply}");
            let (status, _) = conn.call("POST", "/prioritize", &body);
            let t2 = Instant::now();
            assert_eq!(status, 200);
            filter.0.push(t1 - t0);
            prioritize.0.push(t2 - t1);
            per_pod.0.push(t2 - t0);
        }
        println!("  {kind}");
        println!("    filter                              {}", filter.line());
        println!("    prioritize                          {}", prioritize.line());
        println!("    per pod (filter + prioritize)       {}", per_pod.line());
    }
    let metrics = ext.metrics().unwrap();
    let unaligned: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("numaplane_scheduler_extender_unaligned_pods_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("  calls answered without the model      {unaligned}");
    ext.kill();
}
