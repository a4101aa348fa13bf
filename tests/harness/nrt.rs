//! NodeResourceTopology objects the tests publish in an exporter's stead, as JSON: the
//! kubelet's Topology Manager attributes, zones `node-<i>` and their resources, and the
//! pod-set fingerprint a scheduler compares with the pods it bound.

use kube::Api;
use kube::api::{Patch, PatchParams};
use numaplane::fingerprint;
use numaplane::nrt::NodeResourceTopology;
use serde_json::{Value, json};

use crate::control_plane::HarnessError;

/// The NRT CRD's `apiVersion`.
pub const API_VERSION: &str = "topology.node.k8s.io/v1alpha2";

/// One resource of a zone: all of `capacity` allocatable, `available` left.
pub fn resource(name: &str, capacity: &str, available: &str) -> Value {
    json!({"name": name, "capacity": capacity, "allocatable": capacity, "available": available})
}

/// Zone `node-<index>` holding `resources`.
pub fn zone(index: usize, resources: Vec<Value>) -> Value {
    json!({"name": format!("node-{index}"), "type": "Node", "resources": resources})
}

/// The `attributes` of a kubelet's Topology Manager (`policy`, e.g. `single-numa-node`, and
/// `scope`), followed by `extra` name/value pairs.
pub fn attributes(policy: &str, scope: Option<&str>, extra: &[(&str, &str)]) -> Vec<Value> {
    let mut out = vec![json!({"name": "topologyManagerPolicy", "value": policy})];
    if let Some(scope) = scope {
        out.push(json!({"name": "topologyManagerScope", "value": scope}));
    }
    out.extend(extra.iter().map(|(n, v)| json!({"name": n, "value": v})));
    out
}

/// An NRT of a node under the single-numa-node policy at container scope: `metadata` (name,
/// labels), the policy's attributes then `extra`, and `zones`.
pub fn single_numa_node(metadata: Value, extra: &[(&str, &str)], zones: Vec<Value>) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "NodeResourceTopology",
        "metadata": metadata,
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": attributes("single-numa-node", Some("container"), extra),
        "zones": zones
    })
}

/// The pod-set fingerprint (method `all`) of the pods `namespace/name` a kubelet reports.
pub fn pods_fingerprint(keys: &[String]) -> String {
    fingerprint::compute(keys.iter().filter_map(|k| k.split_once('/')))
}

/// Applies `nrt` (server-side, forced, as field manager `manager`) and returns the stored object.
pub async fn apply(
    client: kube::Client,
    manager: &str,
    nrt: Value,
) -> Result<NodeResourceTopology, HarnessError> {
    let nrt: NodeResourceTopology = serde_json::from_value(nrt)?;
    let name = nrt.metadata.name.clone().unwrap_or_default();
    let api: Api<NodeResourceTopology> = Api::all(client);
    Ok(api
        .patch(&name, &PatchParams::apply(manager).force(), &Patch::Apply(&nrt))
        .await?)
}

/// Publishes, as an exporter would, a single-numa-node NRT of `node` (labelled as a test
/// object) with `zones` and the pod-set fingerprint of `pods` (`namespace/name`).
pub async fn publish(
    client: kube::Client,
    node: &str,
    pods: &[String],
    zones: Vec<Value>,
) -> Result<(), HarnessError> {
    let fp = pods_fingerprint(pods);
    let metadata = json!({"name": node, "labels": {"numaplane.io/e2e": "true"}});
    let fingerprint = [
        ("nodeTopologyPodsFingerprint", fp.as_str()),
        ("nodeTopologyPodsFingerprintMethod", "all"),
    ];
    apply(
        client,
        "numaplane-e2e",
        single_numa_node(metadata, &fingerprint, zones),
    )
    .await?;
    Ok(())
}
