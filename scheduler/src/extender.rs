//! The kube-scheduler extender protocol (`kube-scheduler/extender/v1`): wire types and the pure
//! decisions behind the `filter`, `prioritize` and `preempt` verbs, for clusters that keep kube-scheduler
//! and call numaplane only for the NUMA side (`docs/extender.md`). The HTTP server and the
//! `bind` side effect live elsewhere; everything here is synchronous and does no I/O.
//!
//! Upstream's Go types carry no JSON tags, so kube-scheduler sends the Go field names
//! (PascalCase) and decodes replies case-insensitively. We answer in PascalCase and accept
//! PascalCase, camelCase and lowercase keys.
//!
//! Node objects (and the Pod) are kept as raw JSON rather than `k8s_openapi` types: in `Nodes`
//! mode kube-scheduler continues with the Node objects we return, so they must come back with
//! every field it sent, including fields newer than our `k8s_openapi`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::{
    cluster::{Cluster, Config},
    decision::NodeVerdict,
    pod::{PodError, PodSpec},
    resources::Resources,
    score::MAX_SCORE,
};

/// Lowest score a prioritize reply may carry (`MinExtenderPriority`).
pub const MIN_EXTENDER_PRIORITY: i64 = 0;
/// Highest score a prioritize reply may carry (`MaxExtenderPriority`); kube-scheduler
/// multiplies it by the extender's `weight` and by 10 to reach its 0..100 node scores.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Reason used when the model rejects a node without giving any text (never expected, but an
/// empty reason would read as a blank in kube-scheduler's `0/N nodes are available` line).
const UNEXPLAINED: &str = "kubelet Topology Manager would reject the pod";

/// A request that cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    /// The request body is not an extender request.
    #[error("cannot decode the extender request body")]
    DecodeArgs {
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// `Pod` is missing or null.
    #[error("extender request carries no Pod")]
    MissingPod,
    /// `Pod` is not a v1 Pod.
    #[error("cannot decode the extender request's Pod")]
    DecodePod {
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The pod decodes but its resources cannot be modelled (e.g. an invalid quantity).
    #[error("cannot model the pod's resources")]
    ModelPod {
        /// Why (names the pod).
        #[source]
        source: PodError,
    },
    /// The index is not ready to judge nodes (caches syncing, or this replica is not the
    /// leader): an empty index would reject or pass nodes wrongly.
    #[error("numaplane extender is not serving yet: {why}")]
    NotReady {
        /// Why.
        why: &'static str,
    },
    /// A binding request with a required field empty.
    #[error("binding request has an empty {field}")]
    ValidateBinding {
        /// Go field name, e.g. `PodUID`.
        field: &'static str,
    },
}

impl ExtenderError {
    /// The message for a reply's `Error` field: this error and its causes.
    pub fn message(&self) -> String {
        numaplane::error_chain(self)
    }
}

/// Go's `*v1.NodeList`: `{"metadata": {...}, "items": [Node...]}`, items kept verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// List metadata, echoed back (Go sends `{}`).
    #[serde(default = "empty_object", deserialize_with = "nullable_object")]
    pub metadata: Value,
    /// The Node objects, as sent.
    #[serde(default, deserialize_with = "nullable")]
    pub items: Vec<Value>,
}

impl Default for NodeList {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl NodeList {
    /// A list of these items with empty metadata.
    pub fn new(items: Vec<Value>) -> Self {
        NodeList {
            metadata: empty_object(),
            items,
        }
    }
}

/// `metadata.name` of a raw Node object.
pub fn node_name(node: &Value) -> Option<&str> {
    node.get("metadata")?.get("name")?.as_str()
}

/// `ExtenderArgs`: the body of `filter` and `prioritize` calls.
///
/// With `nodeCacheCapable: true` kube-scheduler fills only `NodeNames`; with `false` only
/// `Nodes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled (v1 Pod JSON), decoded by [`decode_pod`].
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Value>,
    /// Candidate nodes as objects (`nodeCacheCapable: false`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(rename = "NodeNames", alias = "nodeNames", alias = "nodenames", default)]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names in request order: `NodeNames` when present, else the names of
    /// `Nodes` (objects without a name are skipped: kube-scheduler could not match them).
    pub fn candidate_names(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(String::as_str).collect(),
            (None, Some(list)) => list.items.iter().filter_map(node_name).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// `ExtenderFilterResult`: the reply to `filter`.
///
/// kube-scheduler reads `NodeNames` when the extender is nodeCacheCapable and it is non-null,
/// else `Nodes`; both null means no node passed. A non-empty `Error` fails the call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Passing nodes as objects (request came with `Nodes`); `null` otherwise, as Go sends.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Passing node names (request came with `NodeNames`); `null` otherwise.
    #[serde(rename = "NodeNames", alias = "nodeNames", alias = "nodenames", default)]
    pub node_names: Option<Vec<String>>,
    /// Rejected nodes and why; preemption may still help them. Sorted, as Go encodes maps.
    #[serde(
        rename = "FailedNodes",
        alias = "failedNodes",
        alias = "failednodes",
        default,
        deserialize_with = "nullable"
    )]
    pub failed_nodes: BTreeMap<String, String>,
    /// Rejected nodes preemption cannot help. Omitted when empty: older kube-schedulers
    /// predate the field, and Go decodes an absent map as empty.
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        alias = "failedandunresolvablenodes",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Non-empty fails the whole call. Go's field has no `omitempty`, so `""` is always sent.
    #[serde(rename = "Error", alias = "error", default, deserialize_with = "nullable")]
    pub error: String,
}

impl ExtenderFilterResult {
    /// The reply for a request that cannot be answered: kube-scheduler fails the scheduling
    /// attempt with this text and retries the pod.
    pub fn failure(err: &ExtenderError) -> Self {
        ExtenderFilterResult {
            error: err.message(),
            ..Self::default()
        }
    }
}

/// `HostPriority`: one entry of the prioritize reply (a bare JSON array, `HostPriorityList`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host", alias = "host", default)]
    pub host: String,
    /// `MIN_EXTENDER_PRIORITY..=MAX_EXTENDER_PRIORITY`.
    #[serde(rename = "Score", alias = "score", default)]
    pub score: i64,
}

/// `ExtenderBindingArgs`: the body of `bind`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName", alias = "podName", alias = "podname", default)]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        alias = "podnamespace",
        default
    )]
    pub pod_namespace: String,
    /// Pod UID; the Binding is pinned to it so a recreated pod is not bound by mistake.
    #[serde(
        rename = "PodUID",
        alias = "podUID",
        alias = "podUid",
        alias = "poduid",
        default
    )]
    pub pod_uid: String,
    /// The node kube-scheduler chose.
    #[serde(rename = "Node", alias = "node", default)]
    pub node: String,
}

/// `ExtenderBindingResult`: the reply to `bind`; `{"Error":""}` on success.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Non-empty when the binding failed; kube-scheduler then forgets the pod's assumed
    /// placement and retries it.
    #[serde(rename = "Error", alias = "error", default, deserialize_with = "nullable")]
    pub error: String,
}

impl ExtenderBindingResult {
    /// Success.
    pub fn ok() -> Self {
        Self::default()
    }

    /// Failure with `message`.
    pub fn failure(message: impl Into<String>) -> Self {
        ExtenderBindingResult {
            error: message.into(),
        }
    }
}

/// `MetaPod`: a victim by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    /// The pod's UID.
    #[serde(rename = "UID", alias = "uid", alias = "Uid", default)]
    pub uid: String,
}

/// `MetaVictims`: one node's victims by UID (what a `nodeCacheCapable` extender gets and gives).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    /// The victims.
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "nullable")]
    pub pods: Vec<MetaPod>,
    /// How many of them exceed a PodDisruptionBudget.
    #[serde(
        rename = "NumPDBViolations",
        alias = "numPDBViolations",
        alias = "numpdbviolations",
        default
    )]
    pub num_pdb_violations: i64,
}

/// `Victims`: one node's victims as pod objects (an extender that is not `nodeCacheCapable`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Victims {
    /// The victims (v1 Pod JSON).
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "nullable")]
    pub pods: Vec<Value>,
    /// How many of them exceed a PodDisruptionBudget.
    #[serde(
        rename = "NumPDBViolations",
        alias = "numPDBViolations",
        alias = "numpdbviolations",
        default
    )]
    pub num_pdb_violations: i64,
}

/// `ExtenderPreemptionArgs`: the body of `preempt`, kube-scheduler's candidate nodes with the
/// victims it chose on each.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderPreemptionArgs {
    /// The preemptor (v1 Pod JSON).
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Value>,
    /// Victims as objects (`nodeCacheCapable: false`).
    #[serde(
        rename = "NodeNameToVictims",
        alias = "nodeNameToVictims",
        default,
        deserialize_with = "nullable"
    )]
    pub node_name_to_victims: BTreeMap<String, Victims>,
    /// Victims by UID (`nodeCacheCapable: true`).
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default,
        deserialize_with = "nullable"
    )]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

impl ExtenderPreemptionArgs {
    /// Per candidate node, the victims' UIDs, whichever form kube-scheduler sent.
    pub fn victim_uids(&self) -> BTreeMap<String, (BTreeSet<String>, i64)> {
        let mut out: BTreeMap<String, (BTreeSet<String>, i64)> = BTreeMap::new();
        for (node, v) in &self.node_name_to_meta_victims {
            out.insert(
                node.clone(),
                (
                    v.pods.iter().map(|p| p.uid.clone()).collect(),
                    v.num_pdb_violations,
                ),
            );
        }
        for (node, v) in &self.node_name_to_victims {
            let uids = v
                .pods
                .iter()
                .filter_map(|p| p.get("metadata")?.get("uid")?.as_str().map(str::to_owned))
                .collect();
            out.entry(node.clone()).or_insert((uids, v.num_pdb_violations));
        }
        out
    }
}

/// `ExtenderPreemptionResult`: the reply to `preempt`, the nodes (a subset of the request's)
/// where the victims make room, with the victims to evict there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderPreemptionResult {
    /// Victims by UID per node kept.
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default,
        deserialize_with = "nullable"
    )]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

/// Decodes a `preempt` request body.
pub fn parse_preemption(body: &[u8]) -> Result<ExtenderPreemptionArgs, ExtenderError> {
    serde_json::from_slice(body).map_err(|source| ExtenderError::DecodeArgs { source })
}

/// kube-scheduler's preemption candidates checked for NUMA room: a node stays when its
/// victims leave room that the pod's predicted admission accepts; when they do not, but
/// numaplane's own choice on that node (kube-scheduler's victims plus the lower-priority pods
/// whose zones the pod needs) does, the node stays with that larger set; otherwise it goes
/// (kube-scheduler's victims would be evicted for nothing: the kubelet would reject the pod).
pub fn preempt(
    cluster: &Cluster,
    cfg: &Config,
    pod: &PodSpec,
    priority: i32,
    args: &ExtenderPreemptionArgs,
) -> ExtenderPreemptionResult {
    let mut out = BTreeMap::new();
    for (node, (uids, violations)) in args.victim_uids() {
        let victims = if cluster.fits_after_evicting(cfg, pod, &node, &uids) {
            Some((uids, violations))
        } else {
            cluster
                .preempt_among(cfg, pod, priority, |n| n == node)
                .map(|p| {
                    let mut all = uids.clone();
                    all.extend(p.victims.iter().filter_map(|v| v.uid.clone()));
                    let extra = i64::try_from(p.budget_violations).unwrap_or(i64::MAX);
                    (all, violations.max(extra))
                })
                .filter(|(all, _)| cluster.fits_after_evicting(cfg, pod, &node, all))
        };
        if let Some((uids, num_pdb_violations)) = victims {
            out.insert(
                node,
                MetaVictims {
                    pods: uids.into_iter().map(|uid| MetaPod { uid }).collect(),
                    num_pdb_violations,
                },
            );
        }
    }
    ExtenderPreemptionResult {
        node_name_to_meta_victims: out,
    }
}

/// Decodes a `filter`/`prioritize` request body.
pub fn parse_args(body: &[u8]) -> Result<ExtenderArgs, ExtenderError> {
    serde_json::from_slice(body).map_err(|source| ExtenderError::DecodeArgs { source })
}

/// Decodes a `bind` request body and checks it with [`validate_binding`].
pub fn parse_binding(body: &[u8]) -> Result<ExtenderBindingArgs, ExtenderError> {
    let args: ExtenderBindingArgs =
        serde_json::from_slice(body).map_err(|source| ExtenderError::DecodeArgs { source })?;
    validate_binding(&args)?;
    Ok(args)
}

/// Checks that every field of a binding request is set (Go zero values decode as `""`).
pub fn validate_binding(args: &ExtenderBindingArgs) -> Result<(), ExtenderError> {
    let fields = [
        ("PodName", &args.pod_name),
        ("PodNamespace", &args.pod_namespace),
        ("PodUID", &args.pod_uid),
        ("Node", &args.node),
    ];
    match fields.into_iter().find(|(_, v)| v.is_empty()) {
        Some((field, _)) => Err(ExtenderError::ValidateBinding { field }),
        None => Ok(()),
    }
}

/// The request's Pod as the scheduling model sees it. Needs the cluster's interner
/// (`&mut cluster.res`): a resource no node has yet gets its id here.
pub fn decode_pod(res: &mut Resources, args: &ExtenderArgs) -> Result<PodSpec, ExtenderError> {
    model_pod(res, &pod_object(args)?)
}

/// The request's Pod as a v1 Pod.
pub fn pod_object(args: &ExtenderArgs) -> Result<Pod, ExtenderError> {
    decode_pod_value(args.pod.as_ref())
}

/// A request's `Pod` field (of any verb) as a v1 Pod.
pub fn decode_pod_value(raw: Option<&Value>) -> Result<Pod, ExtenderError> {
    let raw = raw.filter(|v| !v.is_null()).ok_or(ExtenderError::MissingPod)?;
    // `&Value` is a Deserializer: no copy of the pod.
    Pod::deserialize(raw).map_err(|source| ExtenderError::DecodePod { source })
}

/// A v1 Pod as the scheduling model sees it.
pub fn model_pod(res: &mut Resources, pod: &Pod) -> Result<PodSpec, ExtenderError> {
    PodSpec::from_pod(res, pod).map_err(|source| ExtenderError::ModelPod { source })
}

/// The `FailedNodes` text for a rejected node.
///
/// kube-scheduler counts identical texts across nodes into its `0/N nodes are available: …`
/// message, so the short category (`insufficient cpu on any single NUMA node`) is used; the
/// per-node detail (which zone had what) would make every node its own line there.
fn failure_reason(verdict: &NodeVerdict) -> String {
    let short = if verdict.categories.is_empty() {
        &verdict.reasons
    } else {
        &verdict.categories
    };
    let text = short.join(", ");
    if text.is_empty() {
        UNEXPLAINED.to_owned()
    } else {
        text
    }
}

/// The `filter` verb: the NUMA side only.
///
/// kube-scheduler has already run node fit (resources at node level, taints, affinity, …), so
/// each candidate gets [`Cluster::topology_verdict`], the predicted kubelet Topology Manager
/// admission from its NRT. A node the index has no NRT for is handled per `cfg.no_topology`.
/// Rejected nodes go to `FailedNodes` with a short reason (detail goes to the log).
///
/// The reply uses the request's shape: `NodeNames` in, `NodeNames` out; `Nodes` in, `Nodes`
/// out with the passing objects unchanged; input order kept. Only input nodes are named.
pub fn filter(cluster: &Cluster, cfg: &Config, pod: &PodSpec, args: &ExtenderArgs) -> ExtenderFilterResult {
    let key = pod.key();
    // By name, so a node listed in both `NodeNames` and `Nodes` is evaluated once.
    let mut verdicts: HashMap<String, NodeVerdict> = HashMap::new();
    let mut failed_nodes = BTreeMap::new();
    let passes = |name: &str| -> bool {
        let verdict = verdicts
            .entry(name.to_owned())
            .or_insert_with(|| cluster.topology_verdict(cfg, pod, name));
        if !verdict.feasible {
            let reason = failure_reason(verdict);
            tracing::debug!(pod = %key, node = name, reason = %verdict.reasons.join("; "), "extender filter rejects node");
            failed_nodes.insert(name.to_owned(), reason);
        }
        verdict.feasible
    };
    let (nodes, node_names) = keep_nodes(args, passes, &key);
    ExtenderFilterResult {
        nodes,
        node_names,
        failed_nodes,
        failed_and_unresolvable_nodes: BTreeMap::new(),
        error: String::new(),
    }
}

/// The candidates of `args` that `passes`, in the request's shape and order (a Node object
/// without a name is dropped: nothing to judge, and kube-scheduler could not match it).
fn keep_nodes(
    args: &ExtenderArgs,
    mut passes: impl FnMut(&str) -> bool,
    key: &str,
) -> (Option<NodeList>, Option<Vec<String>>) {
    let node_names = args
        .node_names
        .as_ref()
        .map(|names| names.iter().filter(|n| passes(n)).cloned().collect::<Vec<_>>());
    let nodes = args.nodes.as_ref().map(|list| NodeList {
        metadata: list.metadata.clone(),
        items: list
            .items
            .iter()
            .filter(|item| match node_name(item) {
                Some(name) => passes(name),
                None => {
                    tracing::warn!(pod = %key, "extender filter request has a Node without metadata.name");
                    false
                }
            })
            .cloned()
            .collect(),
    });
    (nodes, node_names)
}

/// The `prioritize` verb: [`Cluster::score_node`] (0..=100) scaled to
/// `0..=MAX_EXTENDER_PRIORITY` by integer division (rounds down: 95 → 9), for every candidate
/// of [`ExtenderArgs::candidate_names`], in request order.
pub fn prioritize(cluster: &Cluster, cfg: &Config, pod: &PodSpec, args: &ExtenderArgs) -> Vec<HostPriority> {
    args.candidate_names()
        .into_iter()
        .map(|host| HostPriority {
            host: host.to_owned(),
            score: cluster.score_node(cfg, pod, host).clamp(0, MAX_SCORE) * MAX_EXTENDER_PRIORITY / MAX_SCORE,
        })
        .collect()
}

/// Whether `pod` is one the kubelet's Topology Manager aligns nowhere
/// ([`PodSpec::topology_aligned`]): then the verbs answer without the cluster index, see
/// [`filter_unaligned`]. Judged on a private interner (resource kinds follow from the names),
/// so no caller needs the index for it. A pod that cannot be modelled is not unaligned: the
/// model's path reports it.
pub fn is_unaligned(pod: &Pod) -> bool {
    let mut res = Resources::default();
    PodSpec::from_pod(&mut res, pod).is_ok_and(|spec| !spec.topology_aligned(&res))
}

/// `filter` for an unaligned pod ([`is_unaligned`]): every candidate passes, in the request's
/// shape. The NUMA side has nothing to check, whatever the nodes' NRTs say (or whether they
/// have one: `noTopology: Reject` is about pods the Topology Manager aligns).
pub fn filter_unaligned(args: &ExtenderArgs) -> ExtenderFilterResult {
    let (nodes, node_names) = keep_nodes(args, |_| true, "");
    ExtenderFilterResult {
        nodes,
        node_names,
        failed_nodes: BTreeMap::new(),
        failed_and_unresolvable_nodes: BTreeMap::new(),
        error: String::new(),
    }
}

/// `prioritize` for an unaligned pod: the same score on every candidate, so the extender adds
/// nothing to kube-scheduler's ranking. [`MAX_EXTENDER_PRIORITY`], as the model gives a pod
/// that is not Guaranteed on every node.
pub fn prioritize_unaligned(args: &ExtenderArgs) -> Vec<HostPriority> {
    args.candidate_names()
        .into_iter()
        .map(|host| HostPriority {
            host: host.to_owned(),
            score: MAX_EXTENDER_PRIORITY,
        })
        .collect()
}

/// `preempt` for an unaligned preemptor: kube-scheduler's candidates stand, every node with
/// the victims it chose (evicting them frees what node fit counted, and nothing NUMA-bound
/// is needed).
pub fn preempt_unaligned(args: &ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
    ExtenderPreemptionResult {
        node_name_to_meta_victims: args
            .victim_uids()
            .into_iter()
            .map(|(node, (uids, num_pdb_violations))| {
                let pods = uids.into_iter().map(|uid| MetaPod { uid }).collect();
                (
                    node,
                    MetaVictims {
                        pods,
                        num_pdb_violations,
                    },
                )
            })
            .collect(),
    }
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Go encodes a nil slice, map or pointer as `null`: decode it as the empty value.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn nullable_object<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Ok(Option::<Value>::deserialize(d)?
        .filter(|v| !v.is_null())
        .unwrap_or_else(empty_object))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use numaplane::nrt::NodeResourceTopology;
    use serde_json::json;

    use super::*;
    use crate::cluster::NoTopology;

    // === upstream encodings (kube-scheduler/extender/v1/types_test.go, TestCompatibility) ===

    const BINDING_ARGS: &str =
        r#"{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}"#;
    const BINDING_RESULT: &str = r#"{"Error":"myerror"}"#;
    const HOST_PRIORITY: &str = r#"{"Host":"myhost","Score":1}"#;
    /// The Node of upstream's ExtenderArgs/ExtenderFilterResult cases, as Go encodes it.
    const GO_NODE: &str = r#"{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}"#;
    /// The Pod of upstream's ExtenderArgs case.
    const GO_POD: &str =
        r#"{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}}"#;

    fn upstream_args() -> String {
        format!(r#"{{"Pod":{GO_POD},"Nodes":{{"metadata":{{}},"items":[{GO_NODE}]}},"NodeNames":["node1"]}}"#)
    }

    /// Upstream's case (its version predates FailedAndUnresolvableNodes, hence absent).
    fn upstream_filter_result() -> String {
        format!(
            r#"{{"Nodes":{{"metadata":{{}},"items":[{GO_NODE}]}},"NodeNames":["node1"],"FailedNodes":{{"foo":"bar"}},"Error":"myerror"}}"#
        )
    }

    /// The same with FailedAndUnresolvableNodes set, as current kube-scheduler sends it.
    fn full_filter_result() -> String {
        format!(
            r#"{{"Nodes":{{"metadata":{{}},"items":[{GO_NODE}]}},"NodeNames":["mynode"],"FailedNodes":{{"mynode":"myreason"}},"FailedAndUnresolvableNodes":{{"mynode":"myreason"}},"Error":"myerror"}}"#
        )
    }

    /// Serialises `value` and compares it with Go's `expected` byte for byte, except for the
    /// raw Node/Pod objects in `raw`: serde_json writes their keys sorted where Go writes
    /// struct order, so those parts are compared as JSON values and then swapped back in.
    fn assert_go_encoding<T: Serialize>(value: &T, expected: &str, raw: &[&str]) {
        let mut ours = serde_json::to_string(value).unwrap();
        for go in raw {
            let parsed: Value = serde_json::from_str(go).unwrap();
            let reencoded = serde_json::to_string(&parsed).unwrap();
            assert_eq!(serde_json::from_str::<Value>(&reencoded).unwrap(), parsed);
            assert!(ours.contains(&reencoded), "{ours} lacks {reencoded}");
            ours = ours.replace(&reencoded, go);
        }
        assert_eq!(ours, expected);
    }

    #[test]
    fn binding_and_priority_encode_as_upstream() {
        let args = ExtenderBindingArgs {
            pod_name: "mypodname".into(),
            pod_namespace: "mypodnamespace".into(),
            pod_uid: "mypoduid".into(),
            node: "mynode".into(),
        };
        assert_eq!(serde_json::to_string(&args).unwrap(), BINDING_ARGS);
        assert_eq!(parse_binding(BINDING_ARGS.as_bytes()).unwrap(), args);

        let result = ExtenderBindingResult::failure("myerror");
        assert_eq!(serde_json::to_string(&result).unwrap(), BINDING_RESULT);
        assert_eq!(
            serde_json::from_str::<ExtenderBindingResult>(BINDING_RESULT).unwrap(),
            result
        );
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult::ok()).unwrap(),
            r#"{"Error":""}"#
        );

        let hp = HostPriority {
            host: "myhost".into(),
            score: 1,
        };
        assert_eq!(serde_json::to_string(&hp).unwrap(), HOST_PRIORITY);
        assert_eq!(serde_json::from_str::<HostPriority>(HOST_PRIORITY).unwrap(), hp);
        // HostPriorityList is a bare array.
        assert_eq!(
            serde_json::to_string(&vec![hp]).unwrap(),
            format!("[{HOST_PRIORITY}]")
        );
    }

    #[test]
    fn args_and_filter_result_encode_as_upstream() {
        let args = parse_args(upstream_args().as_bytes()).unwrap();
        assert_eq!(args.node_names, Some(vec!["node1".to_owned()]));
        let nodes = args.nodes.as_ref().unwrap();
        assert_eq!(
            nodes.items.iter().map(node_name).collect::<Vec<_>>(),
            [Some("nodename")]
        );
        assert_go_encoding(&args, &upstream_args(), &[GO_POD, GO_NODE]);
        let mut res = Resources::default();
        let pod = decode_pod(&mut res, &args).unwrap();
        assert_eq!(pod.name, "podname");

        for (expected, name, unresolvable) in [
            (upstream_filter_result(), ("node1", "foo", "bar"), false),
            (full_filter_result(), ("mynode", "mynode", "myreason"), true),
        ] {
            let (passing, failed, reason) = name;
            let result = ExtenderFilterResult {
                nodes: Some(NodeList::new(vec![serde_json::from_str(GO_NODE).unwrap()])),
                node_names: Some(vec![passing.to_owned()]),
                failed_nodes: BTreeMap::from([(failed.to_owned(), reason.to_owned())]),
                failed_and_unresolvable_nodes: if unresolvable {
                    BTreeMap::from([(failed.to_owned(), reason.to_owned())])
                } else {
                    BTreeMap::new()
                },
                error: "myerror".into(),
            };
            assert_go_encoding(&result, &expected, &[GO_NODE]);
            let parsed: ExtenderFilterResult = serde_json::from_str(&expected).unwrap();
            assert_eq!(parsed, result);
        }
    }

    /// Upstream's test decodes `strings.ToLower` of every encoding; so do we.
    #[test]
    fn lowercased_encodings_parse() {
        let binding = parse_binding(BINDING_ARGS.to_lowercase().as_bytes()).unwrap();
        assert_eq!(binding, parse_binding(BINDING_ARGS.as_bytes()).unwrap());
        let hp: HostPriority = serde_json::from_str(&HOST_PRIORITY.to_lowercase()).unwrap();
        assert_eq!((hp.host.as_str(), hp.score), ("myhost", 1));
        let br: ExtenderBindingResult = serde_json::from_str(&BINDING_RESULT.to_lowercase()).unwrap();
        assert_eq!(br.error, "myerror");

        let args = parse_args(upstream_args().to_lowercase().as_bytes()).unwrap();
        assert_eq!(args.node_names, Some(vec!["node1".to_owned()]));
        assert_eq!(args.candidate_names(), ["node1"]);
        assert_eq!(args.nodes.as_ref().map(|l| l.items.len()), Some(1));
        assert_eq!(
            decode_pod(&mut Resources::default(), &args).unwrap().name,
            "podname"
        );

        let fr: ExtenderFilterResult = serde_json::from_str(&full_filter_result().to_lowercase()).unwrap();
        assert_eq!(fr.node_names, Some(vec!["mynode".to_owned()]));
        assert_eq!(fr.failed_nodes["mynode"], "myreason");
        assert_eq!(fr.failed_and_unresolvable_nodes["mynode"], "myreason");
        assert_eq!(fr.error, "myerror");
    }

    #[test]
    fn camel_case_and_go_nulls_parse() {
        let args =
            parse_args(br#"{"pod":{"metadata":{"name":"p"}},"nodes":null,"nodeNames":["a","b"]}"#).unwrap();
        assert_eq!(args.candidate_names(), ["a", "b"]);
        assert_eq!(args.nodes, None);
        let binding =
            parse_binding(br#"{"podName":"p","podNamespace":"ns","podUID":"u","node":"n"}"#).unwrap();
        assert_eq!(binding.pod_uid, "u");
        // A Go reply with nil maps and lists.
        let fr: ExtenderFilterResult = serde_json::from_str(
            r#"{"Nodes":{"metadata":{},"items":null},"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}"#,
        )
        .unwrap();
        assert_eq!(fr.nodes, Some(NodeList::default()));
        assert!(fr.failed_nodes.is_empty() && fr.error.is_empty());
    }

    #[test]
    fn binding_requires_every_field() {
        let ok = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            node: "n".into(),
        };
        assert!(validate_binding(&ok).is_ok());
        for (field, args) in [
            (
                "PodName",
                ExtenderBindingArgs {
                    pod_name: String::new(),
                    ..ok.clone()
                },
            ),
            (
                "PodNamespace",
                ExtenderBindingArgs {
                    pod_namespace: String::new(),
                    ..ok.clone()
                },
            ),
            (
                "PodUID",
                ExtenderBindingArgs {
                    pod_uid: String::new(),
                    ..ok.clone()
                },
            ),
            (
                "Node",
                ExtenderBindingArgs {
                    node: String::new(),
                    ..ok.clone()
                },
            ),
        ] {
            match validate_binding(&args) {
                Err(ExtenderError::ValidateBinding { field: f }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_binding(b"{}"),
            Err(ExtenderError::ValidateBinding { field: "PodName" })
        ));
        assert!(matches!(
            parse_binding(b"[1]"),
            Err(ExtenderError::DecodeArgs { .. })
        ));
    }

    // === decisions ===

    fn node(name: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"zone": "a"}},
               "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}})
    }

    /// Two NUMA zones of 8 CPUs with `free` CPUs each, policy single-numa-node.
    fn nrt(name: &str, free: [u32; 2]) -> NodeResourceTopology {
        let zone = |i: usize| {
            json!({"name": format!("node-{i}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": free[i].to_string()}]})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                           {"name": "topologyManagerScope", "value": "container"}],
            "zones": [zone(0), zone(1)]}))
        .unwrap()
    }

    /// `roomy` (8+8 free), `tight` (3+6: 4 CPUs fit in one zone only) and `split` (3+3: 6 free
    /// at node level, but no zone holds 4).
    fn cluster() -> Cluster {
        let mut c = Cluster::new();
        for (name, free) in [("roomy", [8, 8]), ("tight", [3, 6]), ("split", [3, 3])] {
            c.apply_node(&serde_json::from_value::<Node>(node(name)).unwrap())
                .unwrap();
            c.apply_nrt(&nrt(name, free)).unwrap();
        }
        c
    }

    /// A Guaranteed pod with 4 exclusive CPUs.
    fn pod_json() -> Value {
        let r = json!({"cpu": "4", "memory": "1Gi"});
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
               "spec": {"containers": [{"name": "c", "resources": {"requests": r, "limits": r}}]}})
    }

    fn args_with_names(names: &[&str]) -> ExtenderArgs {
        ExtenderArgs {
            pod: Some(pod_json()),
            nodes: None,
            node_names: Some(names.iter().map(|n| (*n).to_owned()).collect()),
        }
    }

    /// A bound Guaranteed pod of `cpus` CPUs on `node`, recorded on NUMA node `zone`.
    fn bound(name: &str, node: &str, cpus: u32, zone: u32) -> k8s_openapi::api::core::v1::Pod {
        let r = json!({"cpu": cpus.to_string(), "memory": "1Gi"});
        let record = json!({"version": "v1", "node": node, "policy": "single-numa-node", "scope": "container",
            "containers": [{"name": "c", "kind": "app", "numaNodes": [zone]}]});
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                         "annotations": {numaplane::allocation::ANNOTATION: record.to_string()}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": r, "limits": r}}]},
            "status": {"phase": "Running"}}))
        .unwrap()
    }

    #[test]
    fn preempt_keeps_nodes_whose_victims_free_a_zone_and_adds_the_zone_kube_scheduler_missed() {
        let mut c = Cluster::new();
        // `busy`: a (6 CPUs) on zone 0, b and c (3 each) on zone 1; 2 CPUs free per zone, so
        // 4 CPUs fit node-wide and kube-scheduler finds no victim needed. `small`: zones of 2.
        c.apply_node(&serde_json::from_value::<Node>(node("busy")).unwrap())
            .unwrap();
        c.apply_nrt(&nrt("busy", [2, 2])).unwrap();
        for (name, cpus, zone) in [("a", 6, 0), ("b", 3, 1), ("c", 3, 1)] {
            c.apply_pod(&bound(name, "busy", cpus, zone)).unwrap();
        }
        c.apply_node(&serde_json::from_value::<Node>(node("small")).unwrap())
            .unwrap();
        let small: NodeResourceTopology = serde_json::from_value(json!({
            "metadata": {"name": "small"},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                           {"name": "topologyManagerScope", "value": "container"}],
            "zones": [{"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": "2", "allocatable": "2", "available": "2"}]}]}))
        .unwrap();
        c.apply_nrt(&small).unwrap();
        let mut pod = pod_json();
        pod["spec"]["priority"] = json!(100);
        let spec = model_pod(&mut c.res, &serde_json::from_value(pod.clone()).unwrap()).unwrap();
        let ask = |victims: &[(&str, &[&str])]| -> ExtenderPreemptionResult {
            let body = json!({"Pod": pod, "NodeNameToVictims": null, "NodeNameToMetaVictims":
                victims.iter().map(|(n, uids)| ((*n).to_owned(), json!({
                    "Pods": uids.iter().map(|u| json!({"UID": u})).collect::<Vec<_>>(),
                    "NumPDBViolations": 0}))).collect::<serde_json::Map<String, Value>>()});
            let args = parse_preemption(body.to_string().as_bytes()).unwrap();
            preempt(&c, &Config::default(), &spec, 100, &args)
        };
        let uids = |r: &ExtenderPreemptionResult, node: &str| -> Vec<String> {
            r.node_name_to_meta_victims[node]
                .pods
                .iter()
                .map(|p| p.uid.clone())
                .collect()
        };
        // Evicting a frees zone 0: kept as proposed.
        let r = ask(&[("busy", &["u-a"])]);
        assert_eq!(uids(&r, "busy"), vec!["u-a"]);
        // No victim (node-level room): the zone needs some; numaplane adds them.
        let r = ask(&[("busy", &[])]);
        let added = uids(&r, "busy");
        assert!(!added.is_empty());
        assert!(c.fits_after_evicting(
            &Config::default(),
            &spec,
            "busy",
            &added.iter().cloned().collect()
        ));
        // b alone leaves zone 1 at 5 free: enough. Nothing helps on `small`: dropped.
        let r = ask(&[("busy", &["u-b"]), ("small", &[])]);
        assert_eq!(uids(&r, "busy"), vec!["u-b"]);
        assert!(!r.node_name_to_meta_victims.contains_key("small"));
        // The reply as kube-scheduler decodes it.
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(
            wire,
            json!({"NodeNameToMetaVictims": {"busy": {"Pods": [{"UID": "u-b"}], "NumPDBViolations": 0}}})
        );
    }

    fn decode(c: &mut Cluster, args: &ExtenderArgs) -> PodSpec {
        decode_pod(&mut c.res, args).unwrap()
    }

    #[test]
    fn filter_by_names_rejects_the_node_no_zone_can_hold() {
        let mut c = cluster();
        // `ghost` is unknown to the index: no NRT, so `no_topology` decides.
        let args = args_with_names(&["split", "roomy", "ghost", "tight"]);
        let pod = decode(&mut c, &args);
        let result = filter(&c, &Config::default(), &pod, &args);
        assert_eq!(
            result.node_names,
            Some(vec!["roomy".into(), "ghost".into(), "tight".into()])
        );
        assert_eq!(result.nodes, None);
        assert_eq!(
            result.failed_nodes,
            BTreeMap::from([("split".into(), "insufficient cpu on any single NUMA node".into())])
        );
        assert!(result.error.is_empty());

        // The reply as kube-scheduler reads it: NodeNames set, Nodes null, Error "".
        let wire: Value = serde_json::to_value(&result).unwrap();
        assert_eq!(wire["Nodes"], Value::Null);
        assert_eq!(wire["NodeNames"], json!(["roomy", "ghost", "tight"]));
        assert_eq!(wire["Error"], "");

        let reject = Config {
            no_topology: NoTopology::Reject,
            ..Config::default()
        };
        let result = filter(&c, &reject, &pod, &args);
        assert_eq!(result.node_names, Some(vec!["roomy".into(), "tight".into()]));
        assert_eq!(
            result.failed_nodes["ghost"],
            "node(s) had no NodeResourceTopology"
        );
    }

    #[test]
    fn filter_by_objects_returns_passing_objects_unchanged() {
        let mut c = cluster();
        // A field k8s-openapi does not know must survive the round trip.
        let mut roomy = node("roomy");
        roomy["status"]["futureField"] = json!({"x": 1});
        let args = ExtenderArgs {
            pod: Some(pod_json()),
            nodes: Some(NodeList::new(vec![node("split"), roomy.clone(), node("tight")])),
            node_names: None,
        };
        let pod = decode(&mut c, &args);
        let result = filter(&c, &Config::default(), &pod, &args);
        assert_eq!(result.node_names, None);
        assert_eq!(result.nodes, Some(NodeList::new(vec![roomy, node("tight")])));
        assert_eq!(result.failed_nodes.keys().collect::<Vec<_>>(), ["split"]);

        let wire: Value = serde_json::to_value(&result).unwrap();
        assert_eq!(wire["NodeNames"], Value::Null);
        assert_eq!(
            wire["Nodes"]["items"][0]["status"]["futureField"],
            json!({"x": 1})
        );
    }

    #[test]
    fn filter_names_only_input_nodes() {
        let mut c = cluster();
        let args = args_with_names(&["tight"]);
        let pod = decode(&mut c, &args);
        let result = filter(&c, &Config::default(), &pod, &args);
        assert_eq!(result.node_names, Some(vec!["tight".into()]));
        assert!(result.failed_nodes.is_empty());

        // Both lists empty or absent: nothing passes, nothing is named.
        let none = ExtenderArgs {
            pod: Some(pod_json()),
            ..ExtenderArgs::default()
        };
        let result = filter(&c, &Config::default(), &pod, &none);
        assert_eq!((result.nodes, result.node_names), (None, None));
        assert!(result.failed_nodes.is_empty());
    }

    #[test]
    fn malformed_pod_is_an_error_reply() {
        let mut c = cluster();
        let bad_quantity = ExtenderArgs {
            pod: Some(json!({"metadata": {"name": "p", "namespace": "ns"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}})),
            ..args_with_names(&["roomy"])
        };
        let wrong_shape = ExtenderArgs {
            pod: Some(json!({"metadata": {"name": "p"}, "spec": {"containers": "nope"}})),
            ..args_with_names(&["roomy"])
        };
        let no_pod = ExtenderArgs {
            pod: None,
            ..args_with_names(&["roomy"])
        };
        let cases = [
            (bad_quantity, "cannot model the pod's resources: pod ns/p"),
            (wrong_shape, "cannot decode the extender request's Pod"),
            (no_pod, "extender request carries no Pod"),
        ];
        for (args, prefix) in cases {
            let err = decode_pod(&mut c.res, &args).unwrap_err();
            let reply = ExtenderFilterResult::failure(&err);
            assert!(reply.error.starts_with(prefix), "{}", reply.error);
            // An error reply names no node: kube-scheduler fails the attempt as a whole.
            let wire: Value = serde_json::to_value(&reply).unwrap();
            assert_eq!(wire["Nodes"], Value::Null);
            assert_eq!(wire["NodeNames"], Value::Null);
            assert_eq!(wire["FailedNodes"], json!({}));
        }
        assert!(matches!(
            parse_args(b"not json"),
            Err(ExtenderError::DecodeArgs { .. })
        ));
    }

    #[test]
    fn prioritize_scales_to_ten_in_input_order() {
        let mut c = cluster();
        let args = args_with_names(&["tight", "ghost", "roomy"]);
        let pod = decode(&mut c, &args);
        let cfg = Config::default();
        let scores = prioritize(&c, &cfg, &pod, &args);
        assert_eq!(
            scores.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["tight", "ghost", "roomy"]
        );
        for h in &scores {
            assert!(
                (MIN_EXTENDER_PRIORITY..=MAX_EXTENDER_PRIORITY).contains(&h.score),
                "{h:?}"
            );
            assert_eq!(h.score, c.score_node(&cfg, &pod, &h.host) / 10, "{h:?}");
        }
        // More room left in the zone the pod lands in scores higher (LeastAllocated).
        assert!(scores[2].score > scores[0].score, "{scores:?}");

        // The same from Node objects.
        let by_objects = ExtenderArgs {
            pod: Some(pod_json()),
            nodes: Some(NodeList::new(vec![node("tight"), node("ghost"), node("roomy")])),
            node_names: None,
        };
        assert_eq!(prioritize(&c, &cfg, &pod, &by_objects), scores);
    }

    // === pods the Topology Manager does not align ===

    fn pod_with(containers: Value, init: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"initContainers": init, "containers": containers}}))
        .unwrap()
    }

    fn one(resources: Value) -> Pod {
        pod_with(json!([{"name": "c", "resources": resources}]), json!([]))
    }

    #[test]
    fn unaligned_is_the_models_rule() {
        let g = |r: Value| json!({"requests": r.clone(), "limits": r});
        // Nothing the CPU, memory or device manager pins: answered at once.
        for (why, pod) in [
            ("BestEffort", one(json!({}))),
            (
                "Burstable, whole CPUs",
                one(json!({"requests": {"cpu": "4", "memory": "1Gi"}})),
            ),
            (
                "Burstable, hugepages",
                one(
                    json!({"requests": {"cpu": "1", "hugepages-2Mi": "1Gi", "memory": "1Gi"},
                           "limits": {"hugepages-2Mi": "1Gi"}}),
                ),
            ),
            (
                "native non-NUMA resource",
                one(json!({"requests": {"ephemeral-storage": "1Gi"}})),
            ),
        ] {
            assert!(is_unaligned(&pod), "{why}");
        }
        // What the Topology Manager aligns goes to the model.
        for (why, pod) in [
            (
                "Guaranteed, whole CPUs",
                one(g(json!({"cpu": "4", "memory": "1Gi"}))),
            ),
            // The Static memory manager pins a Guaranteed pod's memory whatever its CPUs.
            (
                "Guaranteed, fractional CPUs",
                one(g(json!({"cpu": "500m", "memory": "1Gi"}))),
            ),
            (
                "Guaranteed, hugepages",
                one(g(json!({"cpu": "500m", "memory": "1Gi", "hugepages-1Gi": "2Gi"}))),
            ),
            // The device manager gives hints whatever the QoS class.
            (
                "Burstable, a device",
                one(json!({"requests": {"cpu": "1"}, "limits": {"example.com/gpu": "1"}})),
            ),
            (
                "BestEffort, a device",
                one(json!({"limits": {"nvidia.com/gpu": "1"}})),
            ),
            (
                "a device in an init container",
                pod_with(
                    json!([{"name": "c"}]),
                    json!([{"name": "i", "resources": {"limits": {"example.com/gpu": "1"}}}]),
                ),
            ),
        ] {
            assert!(!is_unaligned(&pod), "{why}");
        }
        // A pod the model cannot read is not unaligned: the model's path reports it.
        assert!(!is_unaligned(&one(json!({"requests": {"cpu": "lots"}}))));
    }

    fn unaligned_args(names: &[&str]) -> ExtenderArgs {
        ExtenderArgs {
            pod: Some(serde_json::to_value(one(json!({"requests": {"cpu": "2", "memory": "1Gi"}}))).unwrap()),
            ..args_with_names(names)
        }
    }

    #[test]
    fn unaligned_filter_passes_every_node_given() {
        // `split` cannot hold a 4-CPU zone, `ghost` has no NRT: neither matters here.
        let args = unaligned_args(&["split", "roomy", "ghost", "tight"]);
        let wire = serde_json::to_string(&filter_unaligned(&args)).unwrap();
        assert_eq!(
            wire,
            r#"{"Nodes":null,"NodeNames":["split","roomy","ghost","tight"],"FailedNodes":{},"Error":""}"#
        );
        // Nodes in, the same Node objects out, unknown fields included; a nameless one dropped.
        let mut roomy = node("roomy");
        roomy["status"]["futureField"] = json!({"x": 1});
        let by_objects = ExtenderArgs {
            nodes: Some(NodeList::new(vec![
                node("split"),
                json!({"metadata": {}}),
                roomy.clone(),
            ])),
            node_names: None,
            ..args
        };
        let result = filter_unaligned(&by_objects);
        assert_eq!(result.nodes, Some(NodeList::new(vec![node("split"), roomy])));
        assert_eq!(result.node_names, None);
        assert!(result.failed_nodes.is_empty() && result.error.is_empty());
        // Nothing given, nothing named.
        let none = ExtenderArgs {
            node_names: None,
            ..unaligned_args(&[])
        };
        assert_eq!(filter_unaligned(&none), ExtenderFilterResult::default());
    }

    #[test]
    fn unaligned_prioritize_scores_every_node_the_same() {
        let list = prioritize_unaligned(&unaligned_args(&["tight", "ghost", "roomy"]));
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"[{"Host":"tight","Score":10},{"Host":"ghost","Score":10},{"Host":"roomy","Score":10}]"#
        );
    }

    #[test]
    fn unaligned_answers_are_the_models_where_it_has_an_nrt() {
        let mut c = cluster();
        let args = unaligned_args(&["split", "roomy", "tight"]);
        let spec = decode(&mut c, &args);
        assert!(!spec.topology_aligned(&c.res));
        let cfg = Config::default();
        assert_eq!(filter(&c, &cfg, &spec, &args), filter_unaligned(&args));
        assert_eq!(prioritize(&c, &cfg, &spec, &args), prioritize_unaligned(&args));
        // Where it has none, the model would follow `noTopology`; an unaligned pod needs no NRT.
        let reject = Config {
            no_topology: NoTopology::Reject,
            ..Config::default()
        };
        let ghost = unaligned_args(&["ghost"]);
        assert_eq!(filter(&c, &reject, &spec, &ghost).node_names, Some(vec![]));
        assert_eq!(
            filter_unaligned(&ghost).node_names,
            Some(vec!["ghost".to_owned()])
        );
    }

    #[test]
    fn unaligned_preempt_keeps_kube_schedulers_candidates() {
        let body = json!({"Pod": unaligned_args(&[]).pod,
            "NodeNameToVictims": {"b": {"Pods": [{"metadata": {"name": "v2", "uid": "u-2"}}], "NumPDBViolations": 1}},
            "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "u-1"}, {"UID": "u-0"}], "NumPDBViolations": 0},
                                      "c": {"Pods": [], "NumPDBViolations": 0}}});
        let args = parse_preemption(body.to_string().as_bytes()).unwrap();
        assert_eq!(
            serde_json::to_value(preempt_unaligned(&args)).unwrap(),
            json!({"NodeNameToMetaVictims": {
                "a": {"Pods": [{"UID": "u-0"}, {"UID": "u-1"}], "NumPDBViolations": 0},
                "b": {"Pods": [{"UID": "u-2"}], "NumPDBViolations": 1},
                "c": {"Pods": [], "NumPDBViolations": 0}}})
        );
    }
}
