//! Kubelet options the model cannot predict, through `simulate`: a warning naming the node and
//! the option, the node's verdict saying why it is approximate, and `Avoid` keeping aligned
//! pods off the node while other pods still land there.

use super::*;
use crate::model_config::UnknownKubeletOptions;

const CLUSTER: &str = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
 "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"}, "capacity": {"cpu": "8", "memory": "8Gi", "pods": "110"}}}
{"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": "n1"},
 "attributes": [{"name": "topologyManagerPolicy", "value": "restricted"}, {"name": "topologyManagerScope", "value": "container"},
  {"name": "numaplane.io/cpu-manager-policy", "value": "static"},
  {"name": "numaplane.io/cpu-manager-policy-options", "value": "align-by-socket=true"}],
 "zones": [
  {"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]},
  {"name": "node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]}]}
"#;

const PODS: &str = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned", "namespace": "default"},
 "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}]}}
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shared", "namespace": "default"},
 "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}
"#;

fn run(mode: UnknownKubeletOptions, explain: Explain) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let (c, p) = (dir.path().join("cluster.json"), dir.path().join("pods.json"));
    std::fs::write(&c, CLUSTER).unwrap();
    std::fs::write(&p, PODS).unwrap();
    let cfg = ConfigFile {
        unknown_kubelet_options: mode,
        ..ConfigFile::default()
    };
    simulate(
        read_inputs(&[&c]).unwrap(),
        read_inputs(&[&p]).unwrap().pods,
        &cfg,
        explain,
    )
}

#[test]
fn warn_places_the_pod_and_says_the_prediction_is_approximate() {
    // The default explanation: only the chosen node's verdict, from the fast path.
    let r = run(UnknownKubeletOptions::Warn, Explain::Failed);
    assert_eq!(r.results[0].decision.node.as_deref(), Some("n1"));
    assert!(
        r.warnings.iter().any(|w| w.contains("node n1: predictions are approximate: kubelet option align-by-socket=true:")),
        "{:?}",
        r.warnings
    );
    let verdict = &r.results[0].decision.nodes[0];
    assert!(
        verdict.approximate[0].starts_with("kubelet option align-by-socket=true:"),
        "{verdict:?}"
    );
    let table = render_table(&r);
    assert!(
        table.contains("approximate: kubelet option align-by-socket=true"),
        "{table}"
    );
}

#[test]
fn avoid_keeps_aligned_pods_off_the_node_and_places_the_others() {
    let r = run(UnknownKubeletOptions::Avoid, Explain::All);
    assert_eq!(r.results[0].decision.node, None, "the pinned pod");
    let verdict = &r.results[0].decision.nodes[0];
    assert!(
        verdict.reasons[0]
            .starts_with("avoided (--unknown-kubelet-options=Avoid): the prediction here is approximate"),
        "{verdict:?}"
    );
    assert_eq!(verdict.kubelet_reason, None);
    assert_eq!(
        r.results[1].decision.node.as_deref(),
        Some("n1"),
        "the shared pod"
    );
}
