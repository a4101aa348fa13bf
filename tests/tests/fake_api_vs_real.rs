//! The HTTP-level fake API server against a real kube-apiserver (the kit's control plane, see
//! `numaplane_e2e::control_plane`): every ordinary answer the fault tests rely on the fake for
//! (the 409s of Bindings, creates and stale writes, the 410 of a watch from a too-old version,
//! the 422s of Events and NRTs, server-side apply's conflict, the 400 of an unsupported field
//! selector, a missing object's 404, and the 404 of a resource whose CRD is not installed) is
//! asked of both, the same way, and the two answers must have the same shape: code, reason,
//! status, details, and the message once names, UIDs and versions are replaced by placeholders.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use numaplane::nrt::NodeResourceTopology;
use numaplane_e2e::harness::{ApiTarget, unique_name};
use serde_json::{Value, json};

/// One answer, reduced to what a client may look at.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    code: u16,
    reason: String,
    status: String,
    /// `details.kind`, `details.name`, `details.group`.
    details: Option<(String, String, String)>,
    /// `details.causes[].reason`.
    causes: Vec<String>,
    message: String,
}

/// The answer to one request: an error's `Status`, or a success's status code and `Status`.
/// Creates [`pending_pod`] `name` through `pods`.
async fn create_pending(pods: &Api<Pod>, name: &str, gated: bool) -> Pod {
    let pod = serde_json::from_value(pending_pod(name, gated)).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap()
}

/// A server-side apply of `body` at `path` as field manager `manager`.
async fn apply_as(client: &Client, path: &str, manager: &str, body: Value) -> (u16, Value) {
    let path = format!("{path}?fieldManager={manager}");
    request(client, "PATCH", &path, "application/apply-patch+yaml", Some(body)).await
}

/// The [`Shape`] of the answer to a [`json_request`].
async fn answer(client: &Client, method: &str, path: &str, body: Option<Value>) -> Shape {
    let (code, v) = json_request(client, method, path, body).await;
    shape(code, &v, &[])
}

/// [`request`] with a JSON body (or none).
async fn json_request(client: &Client, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    request(client, method, path, "application/json", body).await
}

async fn request(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default())
        .unwrap();
    let res = client.send(req.map(kube::client::Body::from)).await.unwrap();
    let code = res.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (code, value)
}

/// `value` (a `Status`, or plain text) as a [`Shape`], with `names` replaced in the message.
fn shape(code: u16, value: &Value, names: &[(&str, &str)]) -> Shape {
    let mut message = match value {
        Value::String(text) => text.trim().to_owned(),
        v => v["message"].as_str().unwrap_or_default().to_owned(),
    };
    for (name, placeholder) in names {
        if !name.is_empty() {
            message = message.replace(name, placeholder);
        }
    }
    let d = &value["details"];
    let placeholder = |text: &str| {
        names
            .iter()
            .find(|(name, _)| *name == text)
            .map_or_else(|| text.to_owned(), |(_, p)| (*p).to_owned())
    };
    Shape {
        code,
        reason: value["reason"].as_str().unwrap_or_default().to_owned(),
        status: value["status"].as_str().unwrap_or_default().to_owned(),
        details: d.is_object().then(|| {
            let s = |k: &str| placeholder(d[k].as_str().unwrap_or_default());
            (s("kind"), s("name"), s("group"))
        }),
        causes: d["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
            .collect(),
        message,
    }
}

fn pending_pod(name: &str, gated: bool) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": "numaplane-e2e-nobody", "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    if gated {
        p["spec"]["schedulingGates"] = json!([{"name": "example.com/wait"}]);
    }
    p
}

/// Asks `target` every question; the answers by name.
async fn answers(target: &ApiTarget) -> BTreeMap<&'static str, Shape> {
    let client = target.client();
    let ns = unique_name("np-fake-vs-real");
    target.create_namespace(&ns).await.unwrap();
    let mut out = BTreeMap::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let base = format!("/api/v1/namespaces/{ns}/pods");

    // A missing object.
    out.insert(
        "get a missing pod",
        answer(&client, "GET", &format!("{base}/missing"), None).await,
    );

    // Create twice.
    let created = create_pending(&pods, "b", false).await;
    let uid = created.metadata.uid.clone().unwrap();
    out.insert(
        "create an existing pod",
        answer(&client, "POST", &base, Some(pending_pod("b", false))).await,
    );

    // A write from a stale resourceVersion.
    pods.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    out.insert(
        "replace from a stale resourceVersion",
        answer(
            &client,
            "PUT",
            &format!("{base}/b"),
            Some(serde_json::to_value(&created).unwrap()),
        )
        .await,
    );

    // Bindings: another UID, success, already assigned, gated.
    let binding = |uid: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "b", "uid": uid, "annotations": {"numaplane.io/allocation": "{\"v\":1}"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    let binding_path = format!("{base}/b/binding");
    let (code, v) = json_request(&client, "POST", &binding_path, Some(binding("not-the-uid", "n1"))).await;
    // The storage error names the key and a version: the head and the precondition's words
    // are compared.
    let mut s = shape(code, &v, &[(&uid, "<uid>"), (&ns, "<ns>")]);
    if let (Some((head, _)), Some((_, tail))) = (
        s.message.split_once(": StorageError"),
        s.message.rsplit_once("AdditionalErrorMsg: "),
    ) {
        s.message = format!("{head}: .. {tail}");
    }
    out.insert("bind with another UID", s);
    out.insert(
        "bind",
        answer(&client, "POST", &binding_path, Some(binding(&uid, "n1"))).await,
    );
    out.insert(
        "bind a bound pod",
        answer(&client, "POST", &binding_path, Some(binding(&uid, "n2"))).await,
    );
    let gated = create_pending(&pods, "g", true).await;
    let mut body = binding(gated.metadata.uid.as_deref().unwrap(), "n1");
    body["metadata"]["name"] = json!("g");
    out.insert(
        "bind a gated pod",
        answer(&client, "POST", &format!("{base}/g/binding"), Some(body)).await,
    );

    // A watch from a version older than any the server keeps: 200, then one ERROR event.
    let (code, v) = json_request(
        &client,
        "GET",
        &format!("{base}?watch=true&resourceVersion=1&timeoutSeconds=1"),
        None,
    )
    .await;
    let first = match &v {
        Value::String(text) => {
            serde_json::from_str(text.lines().next().unwrap_or_default()).unwrap_or(Value::Null)
        }
        v => v.clone(),
    };
    let mut s = shape(code, &first["object"], &[]);
    s.reason = format!("{} {}", first["type"].as_str().unwrap_or_default(), s.reason);
    // "too old resource version: 1 (<oldest kept>)".
    s.message = s.message.split(" (").next().unwrap_or_default().to_owned();
    out.insert("watch from a too-old version", s);

    // An Event without reportingInstance.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "eventTime": "2026-11-25T10:00:00.000000Z", "reportingController": "numaplane.io/scheduler",
        "action": "Scheduling", "reason": "FailedScheduling", "type": "Warning",
        "regarding": {"kind": "Pod", "namespace": ns, "name": "b"}});
    out.insert(
        "an Event without reportingInstance",
        answer(
            &client,
            "POST",
            &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
            Some(event),
        )
        .await,
    );

    // Leases: create twice.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "numaplane-scheduler"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    out.insert(
        "create an existing Lease",
        answer(
            &client,
            "POST",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"),
            Some(serde_json::to_value(&lease).unwrap()),
        )
        .await,
    );

    // An unsupported field selector.
    out.insert(
        "an unsupported field selector",
        answer(
            &client,
            "GET",
            &format!("{base}?fieldSelector=spec.priority%3D1"),
            None,
        )
        .await,
    );

    // NRTs: a bad quantity, then a field another manager owns.
    let node = unique_name("np-fake-vs-real-node");
    let nrt = |capacity: &str, policy: &str| {
        json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": node, "labels": {"numaplane.io/e2e": "true"}}, "topologyPolicies": [policy],
            "zones": [{"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": capacity, "allocatable": "4", "available": "4"}]}]})
    };
    let nrt_path = format!("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{node}");
    let (code, v) = apply_as(&client, &nrt_path, "numaplane-exporter", nrt("x4", "None")).await;
    let mut s = shape(code, &v, &[(&node, "<node>")]);
    // The pattern's text is the CRD's: only the part before it is compared.
    s.message = s
        .message
        .split(": Invalid value")
        .next()
        .unwrap_or_default()
        .to_owned();
    out.insert("an NRT with a bad quantity", s);
    let (code, _) = apply_as(&client, &nrt_path, "numaplane-exporter", nrt("4", "None")).await;
    assert_eq!(code, 201);
    let (code, v) = apply_as(
        &client,
        &nrt_path,
        "someone-else",
        nrt("4", "SingleNUMANodeContainerLevel"),
    )
    .await;
    let mut s = shape(code, &v, &[(&node, "<node>")]);
    s.message = s.message.lines().next().unwrap_or_default().to_owned();
    out.insert("apply a field another manager owns", s);
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    let _ = nrts.delete(&node, &Default::default()).await;
    let _ = pods
        .delete_collection(
            &kube::api::DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    out
}

/// A resource whose CRD is not installed: the NRT on the fake without its CRD, a group nobody
/// serves on the real server.
async fn not_installed(client: &Client, path: &str) -> Shape {
    answer(client, "GET", path, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fakes_ordinary_answers_have_the_real_servers_shape() {
    let Some(cluster) = numaplane_e2e::control_plane::require(
        "the fake API server's answers compared with a real kube-apiserver's",
        &Default::default(),
    ) else {
        return;
    };
    let real = ApiTarget::on(cluster).await.unwrap();
    let fake = ApiTarget::start_fake(true).await.unwrap();
    let (real_answers, fake_answers) = (answers(&real).await, answers(&fake).await);
    let mut differ = Vec::new();
    for (question, real_answer) in &real_answers {
        if fake_answers.get(question) != Some(real_answer) {
            differ.push(format!(
                "{question}:\n  real: {real_answer:?}\n  fake: {:?}",
                fake_answers.get(question)
            ));
        }
    }
    assert_eq!(real_answers.len(), fake_answers.len());
    let bare = ApiTarget::start_fake(false).await.unwrap();
    let real_missing = not_installed(&real.client(), "/apis/nosuch.numaplane.io/v1/widgets").await;
    let fake_missing = not_installed(
        &bare.client(),
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
    )
    .await;
    if real_missing != fake_missing {
        differ.push(format!(
            "a resource whose CRD is not installed:\n  real: {real_missing:?}\n  fake: {fake_missing:?}"
        ));
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
