//! `numaplane-scheduler simulate` on a cluster dump, as a user runs it: the release binary,
//! its default output (`-o table`, `--explain failed`) to a file, on a YAML dump shaped like
//! `kubectl get nodes,noderesourcetopologies,pods -A -o yaml` writes it (one `kind: List`; Nodes
//! with labels, conditions, addresses and image lists; NRTs with 8 zones; two running pods per
//! node) and a YAML file of pending pods.
//!
//! `cargo bench -p numaplane-scheduler --bench simulate_cli -- [NODES] [ZONES] [PODS] [dra] [--keep DIR]`
//! (defaults 5000 8 10000). Prints the dump's size, wall time, peak RSS of the simulate process
//! and its summary line. `--keep DIR` leaves `cluster.yaml` and `pods.yaml` there, to run
//! `numaplane-scheduler simulate --cluster DIR/cluster.yaml --pods DIR/pods.yaml` by hand.
//!
//! With `dra`, a second dump runs after the first: the same one plus what `kubectl get
//! deviceclasses,resourceslices,resourceclaims -A -o yaml` adds on a GPU cluster (one DeviceClass;
//! per node one ResourceSlice of 8 GPUs carrying `resource.kubernetes.io/numaNode`, spread over
//! the zones; a ResourceClaim for every fourth pending pod, which names it in its first
//! container), in `cluster-dra.yaml` and `pods-dra.yaml`, with the default alignment
//! (`Required`). It prints both runs and their ratio.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

fn node(i: usize, zones: usize) -> Value {
    let name = format!("node-{i:05}");
    let cpus = 16 * zones;
    let images: Vec<Value> = (0..30)
        .map(|k| {
            json!({"names": [
                format!("registry.example.com/team-{k}/service@sha256:{:064x}", k * 7919 + i),
                format!("registry.example.com/team-{k}/service:v1.{k}.{}", i % 10)],
                "sizeBytes": 10_000_000 + k * 123_457})
        })
        .collect();
    let amounts = json!({
        "cpu": cpus.to_string(), "memory": format!("{}Gi", 64 * zones),
        "hugepages-1Gi": format!("{}Gi", 8 * zones), "pods": "250",
        "nvidia.com/gpu": zones.to_string(), "example.com/nic": (2 * zones).to_string(),
        "ephemeral-storage": "937234648Ki"});
    let condition = |t: &str, s: &str, reason: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": format!("kubelet has {reason}"),
            "lastHeartbeatTime": "2026-11-24T10:00:00Z", "lastTransitionTime": "2026-11-01T08:00:00Z"})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"),
            "resourceVersion": (100_000 + i).to_string(), "creationTimestamp": "2026-11-01T08:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "metal-2s", "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "topology.kubernetes.io/region": "region-1", "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
                "nvidia.com/gpu.present": "true", "pool": format!("pool-{}", i % 8)},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256), "providerID": format!("metal://{name}")},
        "status": {
            "capacity": amounts, "allocatable": amounts,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady")],
            "addresses": [{"type": "InternalIP", "address": format!("192.168.{}.{}", i / 256, i % 256)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"), "bootID": format!("{i:032x}"),
                "kernelVersion": "6.12.0", "osImage": "Debian GNU/Linux 13", "containerRuntimeVersion": "containerd://2.1.0",
                "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}

fn nrt(i: usize, zones: usize) -> Value {
    let zone_list: Vec<Value> = (0..zones)
        .map(|z| {
            // The two running pods of this node hold 2 CPUs and 4Gi in zone 0.
            let (cpu, mem) = if z == 0 { ("14", "60Gi") } else { ("16", "64Gi") };
            common::zone(z, zones, cpu, mem)
        })
        .collect();
    let policy = common::policy(i);
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": format!("node-{i:05}"), "resourceVersion": (200_000 + i).to_string(),
            "creationTimestamp": "2026-11-01T08:05:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": format!("node-{i:05}"),
                "uid": format!("00000000-0000-4000-8000-{i:012}")}]},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": zone_list
    })
}

fn resources(cpu: &str, mem: &str, extra: &[(&str, &str)]) -> Value {
    let mut r = json!({"cpu": cpu, "memory": mem});
    for (k, v) in extra {
        r[*k] = json!(v);
    }
    json!({"requests": r, "limits": r})
}

/// A running pod on node `i`, as the dump shows it.
fn running_pod(i: usize, k: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("svc-{i}-{k}"), "namespace": "prod", "uid": format!("10000000-0000-4000-8000-{:012}", i * 2 + k),
            "labels": {"app": "svc", "pod-template-hash": "5d9f8c7b6"}, "creationTimestamp": "2026-11-20T08:00:00Z"},
        "spec": {"nodeName": format!("node-{i:05}"), "schedulerName": "numaplane-scheduler",
            "containers": [{"name": "app", "image": "registry.example.com/svc:v1", "resources": resources("1", "2Gi", &[])}]},
        "status": {"phase": "Running", "qosClass": "Guaranteed", "podIP": "10.0.0.1", "startTime": "2026-11-20T08:00:05Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-20T08:00:09Z"}]}
    })
}

const DRIVER: &str = "gpu.example.com";
const GPUS: usize = 8;

/// Node `i`'s GPUs, as its DRA driver publishes them.
fn gpu_slice(i: usize, zones: usize) -> Value {
    let node = format!("node-{i:05}");
    let devices: Vec<Value> = (0..GPUS)
        .map(|d| {
            json!({"name": format!("gpu-{d}"), "attributes": {
                "resource.kubernetes.io/numaNode": {"int": d * zones / GPUS},
                "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", 0x10 + d)},
                "productName": {"string": "Example GPU 80GB"}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}-x7k2p"), "resourceVersion": (300_000 + i).to_string(),
            "creationTimestamp": "2026-11-01T08:06:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                "uid": format!("00000000-0000-4000-8000-{i:012}")}]},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
}

fn device_class() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER, "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}})
}

/// Whether pending pod `i` claims a GPU (a quarter of them).
fn claims_gpu(i: usize) -> bool {
    i.is_multiple_of(4)
}

fn gpu_claim(i: usize) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("p-{i}-gpu"), "namespace": "batch", "resourceVersion": (400_000 + i).to_string(),
            "uid": format!("20000000-0000-4000-8000-{i:012}"), "creationTimestamp": "2026-11-24T09:00:00Z"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
}

/// Pending pod `i`, with its GPU claim when it has one.
fn pending_pod_with_claim(i: usize) -> Value {
    let mut pod = pending_pod(i);
    if claims_gpu(i) {
        pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": format!("p-{i}-gpu")}]);
        pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
    }
    pod
}

/// The pending pods: the scheduler throughput bench's mix.
fn pending_pod(i: usize) -> Value {
    let containers = match i % 5 {
        0 => json!([{"name": "a", "resources": resources("2", "4Gi", &[])}]),
        1 => {
            json!([{"name": "a", "resources": resources("4", "8Gi", &[("hugepages-1Gi", "2Gi"), ("example.com/nic", "1")])}])
        }
        2 => json!([{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                     {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]),
        3 => json!([{"name": "a", "resources": resources("8", "16Gi", &[("nvidia.com/gpu", "1")])},
                     {"name": "b", "resources": resources("1", "1Gi", &[])}]),
        _ => json!([{"name": "a", "resources": resources("1", "2Gi", &[("example.com/nic", "1")])}]),
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "batch", "name": format!("p-{i}")},
        "spec": {"schedulerName": "numaplane-scheduler", "containers": containers}})
}

fn write_yaml(path: &Path, items: Vec<Value>) -> u64 {
    let list =
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    std::fs::write(path, serde_saphyr::to_string(&list).unwrap()).unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// Peak RSS of a running process (VmHWM), in KiB.
fn hwm_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let keep = common::keep_dir(&raw);
    let nums: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let nodes = nums.first().copied().unwrap_or(5000);
    let zones = nums.get(1).copied().unwrap_or(8);
    let pods = nums.get(2).copied().unwrap_or(10000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = keep.unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).unwrap();

    let dra = raw.iter().any(|a| a == "dra");
    let mut items = Vec::with_capacity(nodes * 5);
    for i in 0..nodes {
        items.push(node(i, zones));
    }
    for i in 0..nodes {
        items.push(nrt(i, zones));
    }
    for i in 0..nodes {
        items.push(running_pod(i, 0));
        items.push(running_pod(i, 1));
    }
    let bin = env!("CARGO_BIN_EXE_numaplane-scheduler");
    let cluster = dir.join("cluster.yaml");
    let pending = dir.join("pods.yaml");
    let cluster_bytes = write_yaml(&cluster, items.clone());
    let pods_bytes = write_yaml(&pending, (0..pods).map(pending_pod).collect());
    let plain = run(bin, &cluster, &pending, &dir.join("report.txt"));
    plain.print(
        &format!("nodes={nodes} zones={zones} pods={pods}"),
        cluster_bytes,
        pods_bytes,
        pods,
    );
    if !dra {
        return;
    }
    items.push(device_class());
    items.extend((0..nodes).map(|i| gpu_slice(i, zones)));
    items.extend((0..pods).filter(|&i| claims_gpu(i)).map(gpu_claim));
    let cluster = dir.join("cluster-dra.yaml");
    let pending = dir.join("pods-dra.yaml");
    let cluster_bytes = write_yaml(&cluster, items);
    let pods_bytes = write_yaml(&pending, (0..pods).map(pending_pod_with_claim).collect());
    let with = run(bin, &cluster, &pending, &dir.join("report-dra.txt"));
    with.print(
        &format!(
            "nodes={nodes} zones={zones} pods={pods} ({} with a GPU claim)",
            (0..pods).filter(|&i| claims_gpu(i)).count()
        ),
        cluster_bytes,
        pods_bytes,
        pods,
    );
    println!(
        "with claims / without: wall {:.2}x, peak RSS {:.2}x",
        with.wall.as_secs_f64() / plain.wall.as_secs_f64(),
        with.peak_kib as f64 / plain.peak_kib.max(1) as f64
    );
}

/// One simulate run: wall time, peak RSS, the report's summary line.
struct Run {
    wall: Duration,
    peak_kib: u64,
    summary: String,
}

impl Run {
    fn print(&self, what: &str, cluster_bytes: u64, pods_bytes: u64, pods: usize) {
        println!(
            "simulate {what}: cluster {:.0} MiB, pods {:.1} MiB; wall {:.2}s; {:.0} pods/s; peak RSS {:.0} MiB; {}",
            cluster_bytes as f64 / 1048576.0,
            pods_bytes as f64 / 1048576.0,
            self.wall.as_secs_f64(),
            pods as f64 / self.wall.as_secs_f64(),
            self.peak_kib as f64 / 1024.0,
            self.summary
        );
    }
}

fn run(bin: &str, cluster: &Path, pending: &Path, out_path: &Path) -> Run {
    let start = Instant::now();
    let mut child = Command::new(bin)
        .arg("simulate")
        .arg("--cluster")
        .arg(cluster)
        .arg("--pods")
        .arg(pending)
        .env_remove("NUMAPLANE_SIM_EXPLAIN")
        .env_remove("NUMAPLANE_OUTPUT")
        .env_remove("NUMAPLANE_SIM_DRA_NUMA_ALIGNMENT")
        .stdout(std::fs::File::create(out_path).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    let status = loop {
        if let Some(kib) = hwm_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = start.elapsed();
    assert!(status.success(), "simulate failed: {status}");
    let report = std::fs::read_to_string(out_path).unwrap();
    let summary = report
        .lines()
        .find(|l| l.contains(" pods: "))
        .unwrap_or("<no summary line>")
        .to_owned();
    Run {
        wall,
        peak_kib: peak,
        summary,
    }
}
