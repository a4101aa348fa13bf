//! `numaplane-scheduler simulate` reads PersistentVolumeClaims, PersistentVolumes and
//! StorageClasses from its cluster input and decides pods with claims as the live scheduler
//! does; it says a gated pod is gated instead of placing it; it lists the fields a pod sets that
//! the model does not enforce.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {kubernetes.io/hostname: n1, topology.kubernetes.io/zone: a}}
status: {allocatable: {cpu: "8", memory: 16Gi, pods: "10"}}
---
apiVersion: v1
kind: Node
metadata: {name: n2, labels: {kubernetes.io/hostname: n2, topology.kubernetes.io/zone: b}}
status: {allocatable: {cpu: "8", memory: 16Gi, pods: "10"}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: zonal}
provisioner: csi.example.com
volumeBindingMode: WaitForFirstConsumer
allowedTopologies:
  - matchLabelExpressions: [{key: topology.kubernetes.io/zone, values: [b]}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: standard}
provisioner: csi.example.com
volumeBindingMode: Immediate
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: PersistentVolume
    metadata: {name: pv-n2}
    spec:
      capacity: {storage: 1Gi}
      accessModes: [ReadWriteOnce]
      nodeAffinity:
        required:
          nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [n2]}]
  - apiVersion: v1
    kind: PersistentVolumeClaim
    metadata:
      name: bound
      namespace: ns
      annotations: {pv.kubernetes.io/bind-completed: "yes"}
    spec: {volumeName: pv-n2, storageClassName: standard}
    status: {phase: Bound}
  - apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {name: later, namespace: ns}
    spec: {storageClassName: zonal}
  - apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {name: now, namespace: ns}
    spec: {storageClassName: standard}
"#;

fn pod(name: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  containers: [{{name: c, resources: {{requests: {{cpu: '1'}}}}}}]\n{extra}"
    )
}

fn claim(name: &str) -> String {
    format!("  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {name}}}}}]\n")
}

fn run(pods: &str, explain: &str) -> serde_json::Value {
    common::simulate_json(CLUSTER, pods, explain)
}

fn result<'a>(report: &'a serde_json::Value, pod: &str) -> &'a serde_json::Value {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pod"] == format!("ns/{pod}"))
        .unwrap()
}

#[test]
fn claims_decide_the_node_and_missing_or_immediate_claims_keep_the_pod_pending() {
    let pods = [
        pod("on-pv", &claim("bound")),
        pod("wffc", &claim("later")),
        pod("missing", &claim("nowhere")),
        pod("immediate", &claim("now")),
        pod("plain", ""),
    ]
    .concat();
    let report = run(&pods, "all");
    assert!(
        report["warnings"].as_array().unwrap().is_empty(),
        "storage kinds are read, not skipped: {}",
        report["warnings"]
    );
    // Without volumes n1 wins the tie by name; the bound volume and the class's topology say n2.
    assert_eq!(result(&report, "plain")["node"], "n1");
    let on_pv = result(&report, "on-pv");
    assert_eq!(on_pv["node"], "n2", "{on_pv}");
    let n1 = on_pv["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["node"] == "n1")
        .unwrap();
    assert_eq!(n1["feasible"], false);
    assert_eq!(result(&report, "wffc")["node"], "n2");
    let missing = result(&report, "missing");
    assert_eq!(missing["node"], serde_json::Value::Null);
    assert_eq!(
        missing["message"],
        "0/2 nodes are available: persistentvolumeclaim \"nowhere\" not found."
    );
    assert_eq!(
        result(&report, "immediate")["message"],
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    );
    assert_eq!(report["summary"]["scheduled"], 3);
}

#[test]
fn a_gated_pod_is_said_gated_and_not_placed() {
    let pods = [
        pod("gated", "  schedulingGates: [{name: example.com/quota}]\n"),
        pod("free", ""),
    ]
    .concat();
    let report = run(&pods, "all");
    let gated = result(&report, "gated");
    assert_eq!(gated["gated"], true);
    assert_eq!(gated["node"], serde_json::Value::Null);
    assert_eq!(
        gated["message"],
        "Scheduling is blocked due to non-empty scheduling gates: example.com/quota"
    );
    assert_eq!(gated["nodes"], serde_json::json!([]));
    // Not assumed: the other pod still gets the emptier, first node.
    assert_eq!(result(&report, "free")["node"], "n1");
    assert!(result(&report, "free").get("gated").is_none());
}

#[test]
fn unenforced_fields_are_listed_with_the_result() {
    let pods = pod("gang", "  schedulingGroup: {podGroupName: g}\n");
    let report = run(&pods, "none");
    let r = result(&report, "gang");
    assert_eq!(r["unsupported"][0]["field"], "spec.schedulingGroup");
    assert!(
        r["unsupported"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("GangScheduling")
    );
    assert!(
        result(&run(&pod("plain", ""), "none"), "plain")
            .get("unsupported")
            .is_none()
    );
}
