//! `simulate`'s reader decodes each object straight from the YAML/JSON parser and keeps only
//! what the model reads. These tests read the same files a second, independent way (each
//! document parsed whole into a value tree, each object decoded into its full Kubernetes type)
//! and check that the reports are the same, byte for byte, as a table and as JSON.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use numaplane_scheduler::simulate::{
    ConfigFile, Explain, Inputs, read_config, read_inputs, render_table, simulate,
};
use serde_json::{Value, json};

/// Every object of `path`, through a value tree: Lists flattened, nested ones too.
fn objects_through_trees(path: &Path) -> Vec<(usize, Value)> {
    let text = std::fs::read_to_string(path).unwrap();
    let trimmed = text.trim_start();
    let docs: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .flat_map(|v| match v.unwrap() {
                Value::Array(items) => items,
                other => vec![other],
            })
            .collect()
    } else {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        docs.into_iter().filter(|d| !d.is_null()).collect()
    };
    fn flatten(index: usize, v: Value, out: &mut Vec<(usize, Value)>) {
        match v["kind"].as_str() {
            Some(k) if k.ends_with("List") => {
                for item in v["items"].as_array().into_iter().flatten() {
                    flatten(index, item.clone(), out);
                }
            }
            _ => out.push((index, v)),
        }
    }
    let mut out = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        flatten(i + 1, d, &mut out);
    }
    out
}

/// The files' objects in their full types, by kind, with the skipped documents.
fn inputs_through_trees(paths: &[PathBuf]) -> Inputs {
    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }
    let mut inputs = Inputs::default();
    for path in paths {
        for (index, o) in objects_through_trees(path) {
            let kind = o["kind"].as_str().unwrap_or("").to_owned();
            let dra_v1 = o["apiVersion"] == "resource.k8s.io/v1";
            match kind.as_str() {
                "Node" => inputs.nodes.push(typed(o)),
                "Pod" => inputs.pods.push(typed(o)),
                "Namespace" => inputs.namespaces.push(typed(o)),
                "NodeResourceTopology" => inputs.nrts.push(typed(o)),
                "PodDisruptionBudget" => inputs.budgets.push(typed(o)),
                "PersistentVolumeClaim" => inputs.storage.claims.push(typed(o)),
                "PersistentVolume" => inputs.storage.volumes.push(typed(o)),
                "StorageClass" => inputs.storage.classes.push(typed(o)),
                "CSINode" => inputs.storage.csi_nodes.push(typed(o)),
                "DeviceClass" | "ResourceSlice" | "ResourceClaim" if !dra_v1 => {
                    inputs.skipped.push(format!(
                        "{}: document {index}: {kind} ignored: only apiVersion resource.k8s.io/v1 is read",
                        path.display()
                    ));
                }
                "DeviceClass" => inputs.device_classes.push(typed(o)),
                "ResourceSlice" => inputs.resource_slices.push(typed(o)),
                "ResourceClaim" => inputs.resource_claims.push(typed(o)),
                other => inputs.skipped.push(format!(
                    "{}: document {index}: kind {other:?} ignored",
                    path.display()
                )),
            }
        }
    }
    inputs
}

/// The table and the JSON report of both readers, compared byte for byte.
fn assert_same_reports(cluster: &[PathBuf], pods: &[PathBuf], config: &ConfigFile) {
    for explain in [Explain::Failed, Explain::All] {
        let fast = simulate(
            read_inputs(cluster).unwrap(),
            read_inputs(pods).unwrap().pods,
            config,
            explain,
        );
        let slow = simulate(
            inputs_through_trees(cluster),
            inputs_through_trees(pods).pods,
            config,
            explain,
        );
        assert!(!slow.results.is_empty());
        assert_eq!(
            render_table(&fast),
            render_table(&slow),
            "{cluster:?} {explain:?}"
        );
        assert_eq!(
            serde_json::to_string_pretty(&fast).unwrap(),
            serde_json::to_string_pretty(&slow).unwrap(),
            "{cluster:?} {explain:?}"
        );
    }
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn example_cluster_reads_the_same_both_ways() {
    let ex = examples();
    let config = read_config(&ex.join("config.yaml")).unwrap();
    assert_same_reports(&[ex.join("cluster.yaml")], &[ex.join("pods.yaml")], &config);
    assert_same_reports(
        &[ex.join("cluster.yaml")],
        &[ex.join("pods.yaml"), ex.join("pods/numa-aligned.yaml")],
        &ConfigFile::default(),
    );
}

/// A cluster as `kubectl get -o yaml|json` dumps it, with everything a real dump holds that
/// the model does not read, and objects the model rejects or skips.
fn dump(nodes: usize) -> (Value, Value) {
    let mut items = Vec::new();
    for i in 0..nodes {
        let name = format!("node-{i:03}");
        let alloc = if i == 7 {
            json!({"cpu": "lots", "memory": "64Gi", "pods": "110"})
        } else {
            json!({"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2", "hugepages-1Gi": "8Gi"})
        };
        let taints = if i % 5 == 1 {
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule", "timeAdded": "2026-11-01T08:00:00Z"}])
        } else {
            json!([])
        };
        items.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": format!("u-{i}"), "resourceVersion": "1",
                "creationTimestamp": "2026-11-01T08:00:00Z",
                "labels": {"kubernetes.io/hostname": name, "pool": format!("pool-{}", i % 3),
                    "topology.kubernetes.io/zone": format!("zone-{}", i % 2)},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": "10.0.0.0/24", "taints": taints, "unschedulable": i == 4},
            "status": {"capacity": alloc, "allocatable": alloc,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-11-24T10:00:00Z"}],
                "addresses": [{"type": "InternalIP", "address": "192.168.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.12",
                    "osImage": "Debian", "containerRuntimeVersion": "containerd://2.1", "kubeletVersion": "v1.36.2",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                "images": [{"names": ["registry.example.com/a:1"], "sizeBytes": 1000}]}}));
    }
    for i in 0..nodes {
        let zones: Vec<Value> = (0..2)
            .map(|z| {
                json!({"name": format!("node-{z}"), "type": "Node",
                    "costs": [{"name": "node-0", "value": if z == 0 { 10 } else { 21 }},
                              {"name": "node-1", "value": if z == 1 { 10 } else { 21 }}],
                    "attributes": [{"name": "numaplane.io/free-devices.nvidia.com/gpu", "value": format!("gpu-{z}")}],
                    "resources": [
                        {"name": "cpu", "capacity": "16", "allocatable": "16", "available": if z == 0 && i % 2 == 0 { "14" } else { "16" }},
                        {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "64Gi"},
                        {"name": "hugepages-1Gi", "capacity": "4Gi", "allocatable": "4Gi", "available": "4Gi"},
                        {"name": "nvidia.com/gpu", "capacity": "1", "allocatable": "1", "available": "1"}]})
            })
            .collect();
        let policy = ["single-numa-node", "restricted", "best-effort"][i % 3];
        items.push(json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": format!("node-{i:03}")},
            "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                           {"name": "topologyManagerScope", "value": if i % 2 == 0 { "container" } else { "pod" }}],
            "zones": zones}));
    }
    for i in (0..nodes).step_by(2) {
        items.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("svc-{i}"), "namespace": "prod", "uid": format!("p-{i}"),
                "labels": {"app": "svc"}, "creationTimestamp": "2026-11-20T08:00:00Z"},
            "spec": {"nodeName": format!("node-{i:03}"), "priority": 10,
                "containers": [{"name": "app", "image": "svc:1",
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}}]},
            "status": {"phase": "Running", "qosClass": "Guaranteed", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}]}}));
    }
    items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod", "labels": {"tier": "prod"}}}));
    items.push(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "svc", "namespace": "prod"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "svc"}}},
        "status": {"currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 1}}));
    items.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}}));
    items.push(
        json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceClass", "metadata": {"name": "old"}}),
    );
    let cluster =
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});

    let guaranteed = |cpu: &str, extra: Value| {
        let mut r = json!({"cpu": cpu, "memory": "2Gi"});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"requests": r, "limits": r})
    };
    let mut pods = Vec::new();
    for i in 0..40 {
        let containers = match i % 4 {
            0 => json!([{"name": "a", "resources": guaranteed("4", json!({}))}]),
            1 => json!([{"name": "a", "resources": guaranteed("2", json!({"nvidia.com/gpu": "1"}))},
                        {"name": "b", "resources": guaranteed("1", json!({}))}]),
            2 => json!([{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]),
            _ => json!([{"name": "a", "resources": guaranteed("12", json!({"hugepages-1Gi": "2Gi"}))}]),
        };
        let mut spec = json!({"containers": containers});
        if i % 6 == 0 {
            spec["tolerations"] =
                json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]);
        }
        if i % 7 == 0 {
            spec["nodeSelector"] = json!({"pool": "pool-1"});
        }
        if i == 13 {
            spec["containers"][0]["resources"] = guaranteed("64", json!({}));
            spec["priority"] = json!(1000);
        }
        if i == 17 {
            spec["schedulingGates"] = json!([{"name": "wait"}]);
        }
        pods.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "batch", "name": format!("p-{i}")}, "spec": spec}));
    }
    let pods = json!({"apiVersion": "v1", "kind": "List", "items": pods});
    (cluster, pods)
}

#[test]
fn a_kubectl_dump_reads_the_same_both_ways_in_yaml_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, pods) = dump(24);
    let mut files = Vec::new();
    for (name, value) in [("cluster", &cluster), ("pods", &pods)] {
        let yaml = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&yaml, serde_saphyr::to_string(value).unwrap()).unwrap();
        let json = dir.path().join(format!("{name}.json"));
        std::fs::write(&json, serde_json::to_string_pretty(value).unwrap()).unwrap();
        files.push((yaml, json));
    }
    let [(cluster_yaml, cluster_json), (pods_yaml, pods_json)] = files.try_into().unwrap();
    let config = ConfigFile::default();
    assert_same_reports(
        std::slice::from_ref(&cluster_yaml),
        std::slice::from_ref(&pods_yaml),
        &config,
    );
    assert_same_reports(&[cluster_json], &[pods_json], &config);

    // Not vacuous: the dump places pods, leaves some pending, and warns about what it skips.
    let report = simulate(
        read_inputs(&[cluster_yaml]).unwrap(),
        read_inputs(&[pods_yaml]).unwrap().pods,
        &config,
        Explain::Failed,
    );
    assert!(report.summary.scheduled > 10 && report.summary.unschedulable > 0);
    let warnings = report.warnings.join("\n");
    for expected in [
        "node skipped",
        "kind \"ConfigMap\" ignored",
        "DeviceClass ignored: only apiVersion resource.k8s.io/v1 is read",
    ] {
        assert!(warnings.contains(expected), "{expected}: {warnings}");
    }
}
