//! The volume rules through the cluster index: they decide the node, the verdict cache keeps pods
//! of one resource shape but different volumes apart, and explained verdicts name
//! kube-scheduler's reason.

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::{Cluster, Config};
use crate::volume_binding::NODE_CONFLICT;
use crate::volume_binding::fixtures::{bound_pvc, claim_volume, class, pod, pv, pvc};

#[test]
fn the_cluster_places_pods_where_their_volumes_are() {
    let mut c = Cluster::new();
    for n in ["n1", "n2"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n,
            "labels": {"kubernetes.io/hostname": n}},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "10"}}}))
        .expect("node");
        c.apply_node(&node).expect("indexed");
    }
    let on = |node: &str| {
        json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})
    };
    c.volumes.apply_claim(&bound_pvc("on-n2", "pv2"));
    c.volumes.apply_volume(&pv("pv2", on("n2")));
    c.volumes.apply_claim(&bound_pvc("on-n1", "pv1"));
    c.volumes.apply_volume(&pv("pv1", on("n1")));
    let cfg = Config::default();
    let decide = |c: &Cluster, claim: Option<&str>| {
        let volumes = claim.map_or(json!([]), claim_volume);
        c.decide(&cfg, &pod(volumes)).node
    };
    // The same pod shape, three times: without volumes n1 wins the tie by name.
    assert_eq!(decide(&c, Some("on-n2")).as_deref(), Some("n2"));
    assert_eq!(decide(&c, None).as_deref(), Some("n1"));
    assert_eq!(decide(&c, Some("on-n1")).as_deref(), Some("n1"));
    assert_eq!(decide(&c, Some("on-n2")).as_deref(), Some("n2"));
    let explained = c.schedule(&cfg, &pod(claim_volume("on-n2")), true);
    let n1 = explained.nodes.iter().find(|v| v.node == "n1").expect("n1");
    assert!(!n1.feasible);
    assert_eq!(n1.categories, [NODE_CONFLICT]);
    // A missing claim: one message, as kube-scheduler's PreFilter gives it.
    let d = c.decide(&cfg, &pod(claim_volume("missing")));
    assert_eq!(d.node, None);
    assert_eq!(
        d.message,
        "0/2 nodes are available: persistentvolumeclaim \"missing\" not found."
    );
    // A WaitForFirstConsumer claim: assumed on the chosen node, so a second pod sharing it
    // follows even where it would not have gone.
    c.volumes.apply_class(&class(
        "wffc",
        "WaitForFirstConsumer",
        "csi.example.com",
        json!({}),
    ));
    c.volumes
        .apply_claim(&pvc("shared", json!({"spec": {"storageClassName": "wffc"}})));
    let first = pod(claim_volume("shared"));
    let d = c.decide(&cfg, &first);
    assert_eq!(d.node.as_deref(), Some("n1"));
    assert_eq!(c.volumes.claims_to_select(&first, "n1"), ["shared"]);
    c.assume(&first, &d);
    let mut second = first.clone();
    second.name = "web-1".into();
    second.uid = Some("other".into());
    // n1 is fuller now, so LeastAllocated-style ties do not matter: the claim decides.
    assert!(
        c.schedule(&cfg, &second, true)
            .nodes
            .iter()
            .any(|v| v.node == "n2" && !v.feasible)
    );
    c.forget(&first.key(), first.uid.as_deref());
    assert!(c.schedule(&cfg, &second, true).nodes.iter().all(|v| v.feasible));
}
