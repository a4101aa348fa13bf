//! `numaplane-scheduler simulate` counts CSI attach limits as kube-scheduler's NodeVolumeLimits
//! does (CSINodes read from the cluster input), and counts pod-level `spec.resources` in node fit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

/// n1 allows 2 volumes of `csi.example.com` and holds 2 (one pod using c1 and c2); n2 allows 1
/// and holds none; n3 has no CSINode (no limit) but a taint no test pod tolerates.
const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {kubernetes.io/hostname: n1}}
status: {allocatable: {cpu: "8", memory: 16Gi, pods: "10"}}
---
apiVersion: v1
kind: Node
metadata: {name: n2, labels: {kubernetes.io/hostname: n2}}
status: {allocatable: {cpu: "8", memory: 16Gi, pods: "10"}}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: n1}
spec:
  drivers:
    - {name: csi.example.com, nodeID: n1, allocatable: {count: 2}}
    - {name: other.example.com, nodeID: n1}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: n2}
spec:
  drivers: [{name: csi.example.com, nodeID: n2, allocatable: {count: 1}}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: wffc}
provisioner: csi.example.com
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv1},
     spec: {capacity: {storage: 1Gi}, csi: {driver: csi.example.com, volumeHandle: h1}}}
  - {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv2},
     spec: {capacity: {storage: 1Gi}, csi: {driver: csi.example.com, volumeHandle: h2}}}
  - {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv3},
     spec: {capacity: {storage: 1Gi}, csi: {driver: csi.example.com, volumeHandle: h3}}}
  - {apiVersion: v1, kind: PersistentVolumeClaim,
     metadata: {name: c1, namespace: ns, annotations: {pv.kubernetes.io/bind-completed: "yes"}},
     spec: {volumeName: pv1}, status: {phase: Bound}}
  - {apiVersion: v1, kind: PersistentVolumeClaim,
     metadata: {name: c2, namespace: ns, annotations: {pv.kubernetes.io/bind-completed: "yes"}},
     spec: {volumeName: pv2}, status: {phase: Bound}}
  - {apiVersion: v1, kind: PersistentVolumeClaim,
     metadata: {name: c3, namespace: ns, annotations: {pv.kubernetes.io/bind-completed: "yes"}},
     spec: {volumeName: pv3}, status: {phase: Bound}}
  - {apiVersion: v1, kind: PersistentVolumeClaim,
     metadata: {name: later, namespace: ns}, spec: {storageClassName: wffc}}
  - apiVersion: v1
    kind: Pod
    metadata: {name: holder, namespace: ns}
    spec:
      nodeName: n1
      containers: [{name: c}]
      volumes:
        - {name: a, persistentVolumeClaim: {claimName: c1}}
        - {name: b, persistentVolumeClaim: {claimName: c2}}
    status: {phase: Running}
"#;

fn pod(name: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  containers: [{{name: c, resources: {{requests: {{cpu: '1'}}}}}}]\n{extra}"
    )
}

fn claims(names: &[&str]) -> String {
    let v: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{{name: v{i}, persistentVolumeClaim: {{claimName: {n}}}}}"))
        .collect();
    format!("  volumes: [{}]\n", v.join(", "))
}

fn run(pods: &str) -> serde_json::Value {
    common::simulate_json(CLUSTER, pods, "all")
}

fn verdict<'a>(result: &'a serde_json::Value, node: &str) -> &'a serde_json::Value {
    result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["node"] == node)
        .unwrap()
}

#[test]
fn attach_limits_count_unique_volumes_per_driver_and_the_placements_made() {
    let pods = [
        // c3 is new everywhere: n1 is full (2 of 2), n2 takes it (0 of 1).
        pod("a", &claims(&["c3"])),
        // An unbound WaitForFirstConsumer claim counts under its class's provisioner: n1 is
        // full, n2 now holds c3 (1 of 1).
        pod("b", &claims(&["later"])),
        // c1 is attached on n1 already: no new volume there; on n2 it would be a second one.
        pod("c", &claims(&["c1", "c1"])),
    ]
    .concat();
    let r = run(&pods);
    let results = r["results"].as_array().unwrap();
    assert_eq!(results[0]["node"], "n2", "{}", results[0]);
    let n1 = verdict(&results[0], "n1");
    assert_eq!(n1["feasible"], false);
    assert!(
        n1["reasons"][0]
            .as_str()
            .unwrap()
            .contains("CSI driver csi.example.com: 2 volume(s) attached and 1 new, limit 2"),
        "{n1}"
    );
    assert_eq!(results[1]["node"], serde_json::Value::Null, "{}", results[1]);
    assert_eq!(
        results[1]["message"], "0/2 nodes are available: 2 node(s) exceed max volume count.",
        "{}",
        results[1]
    );
    assert_eq!(results[2]["node"], "n1", "{}", results[2]);
    assert_eq!(verdict(&results[2], "n2")["feasible"], false);
    assert!(results.iter().all(|r| r.get("unsupported").is_none()), "{r}");
}

#[test]
fn pod_level_requests_count_in_node_fit() {
    let r = run(&[
        pod("big", "  resources: {requests: {cpu: '9'}, limits: {cpu: '9'}}\n"),
        pod("fits", "  resources: {requests: {cpu: '7', memory: 1Gi}}\n"),
        pod("after", "  resources: {requests: {cpu: '2'}}\n"),
    ]
    .concat());
    let results = r["results"].as_array().unwrap();
    // The container asks 1 CPU, the pod 9: more than the nodes' 8.
    assert_eq!(results[0]["node"], serde_json::Value::Null);
    assert_eq!(
        results[0]["message"], "0/2 nodes are available: 2 Insufficient cpu.",
        "{}",
        results[0]
    );
    // 7 CPUs go to n1 (ties break by name); 2 more no longer fit there.
    assert_eq!(results[1]["node"], "n1");
    assert_eq!(results[2]["node"], "n2", "{}", results[2]);
    assert_eq!(verdict(&results[2], "n1")["feasible"], false);
}
