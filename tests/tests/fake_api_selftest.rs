//! The fake API server against the real kube-rs client: what the exporter end-to-end tests rely
//! on (kubeconfig, GET/404, discovery gating of the NRT CRD, server-side apply and its
//! resourceVersion rules, optimistic concurrency, watches through `kube::runtime::watcher`,
//! 410 recovery, injected failures, request recording) is checked here once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::{events, watcher};
use kube::{Client, ResourceExt};
use numaplane::nrt::{self, AttributeInfo, NodeResourceTopology, Zone};
use numaplane_e2e::fake_api::{FAKE_TOKEN, FakeApiServer, RecordedRequest, StoreChange};
use serde_json::{Value, json};

/// Upper bound for anything that should be immediate; keeps a broken fake from hanging CI.
const SOON: Duration = Duration::from_secs(10);
const MANAGER: &str = "numaplane-exporter";
const NRT_PATH: &str = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies";
const NRT_API_VERSION: &str = "topology.node.k8s.io/v1alpha2";

/// A server plus a client built from its kubeconfig file, the way the exporter builds one.
async fn setup() -> (FakeApiServer, Client, tempfile::TempDir) {
    let server = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = server.write_kubeconfig(dir.path()).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    (server, client, dir)
}

fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

fn pod(name: &str, node: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase},
    })
}

fn nrt(node: &str, attrs: &[(&str, &str)]) -> NodeResourceTopology {
    let mut obj = NodeResourceTopology::new(node);
    obj.zones = vec![Zone {
        name: "node-0".into(),
        zone_type: nrt::ZONE_TYPE_NODE.into(),
        parent: None,
        costs: None,
        attributes: None,
        resources: None,
    }];
    obj.attributes = Some(
        attrs
            .iter()
            .map(|(name, value)| AttributeInfo {
                name: (*name).into(),
                value: (*value).into(),
            })
            .collect(),
    );
    obj
}

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

async fn next_event<S>(stream: &mut S) -> Result<watcher::Event<Pod>, watcher::Error>
where
    S: Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(SOON, stream.next())
        .await
        .expect("watcher event in time")
        .expect("watcher stream still open")
}

/// A compact rendering of watcher events for order-sensitive assertions.
fn describe(ev: &watcher::Event<Pod>) -> String {
    let pod_desc = |p: &Pod| {
        format!(
            "{}@{}:{}",
            p.name_any(),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            p.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default()
        )
    };
    match ev {
        watcher::Event::Init => "init".into(),
        watcher::Event::InitApply(p) => format!("init-apply {}", pod_desc(p)),
        watcher::Event::InitDone => "init-done".into(),
        watcher::Event::Apply(p) => format!("apply {}", pod_desc(p)),
        watcher::Event::Delete(p) => format!("delete {}", pod_desc(p)),
    }
}

async fn expect_events<S>(stream: &mut S, expected: &[&str])
where
    S: Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Unpin,
{
    for want in expected {
        let got = describe(&next_event(stream).await.unwrap());
        assert_eq!(got, *want);
    }
}

#[tokio::test]
async fn kubeconfig_client_gets_nodes_and_not_found_is_an_api_error() {
    let (server, client, _dir) = setup().await;
    let stored = server.put(node("n1"));
    assert!(!stored["metadata"]["uid"].as_str().unwrap().is_empty());

    let nodes: Api<Node> = Api::all(client);
    let n1 = nodes.get("n1").await.unwrap();
    assert_eq!(n1.name_any(), "n1");
    assert_eq!(
        n1.resource_version().unwrap(),
        stored["metadata"]["resourceVersion"].as_str().unwrap()
    );

    let status = api_status(nodes.get("n2").await.unwrap_err());
    assert_eq!(status.code, 404);
    assert_eq!(status.reason, "NotFound");
    assert_eq!(status.message, "nodes \"n2\" not found");
    let details = status.details.unwrap();
    assert_eq!((details.name.as_str(), details.kind.as_str()), ("n2", "nodes"));
    assert!(nodes.get_opt("n2").await.unwrap().is_none());

    let get = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/nodes/n2")
        .unwrap();
    assert_eq!((get.method.as_str(), get.status), ("GET", 404));
    assert_eq!(
        get.header("authorization"),
        Some(format!("Bearer {FAKE_TOKEN}").as_str())
    );
}

#[tokio::test]
async fn discovery_hides_the_nrt_group_until_the_crd_is_installed() {
    let (server, client, _dir) = setup().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");

    let groups = client.list_api_groups().await.unwrap();
    assert!(!groups.groups.iter().any(|g| g.name == nrt::GROUP));
    let status = api_status(
        client
            .list_api_group_resources(nrt::API_VERSION)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 404);
    assert!(kube::discovery::group(&client, nrt::GROUP).await.is_err());
    let nrts: Api<NodeResourceTopology> = Api::all(client.clone());
    assert_eq!(
        api_status(nrts.list(&ListParams::default()).await.unwrap_err()).code,
        404
    );

    server.install_nrt_crd();
    let resources = client.list_api_group_resources(nrt::API_VERSION).await.unwrap();
    let res = resources
        .resources
        .iter()
        .find(|r| r.name == nrt::PLURAL)
        .unwrap();
    assert!(!res.namespaced);
    assert_eq!(res.kind, nrt::KIND);
    assert_eq!(
        res.short_names.as_deref(),
        Some(&["node-res-topo".to_owned()][..])
    );
    assert!(res.verbs.iter().any(|v| v == "patch"));

    let group = kube::discovery::group(&client, nrt::GROUP).await.unwrap();
    let (ar, caps) = group.recommended_kind(nrt::KIND).unwrap();
    assert_eq!(ar.plural, nrt::PLURAL);
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);

    let discovery = kube::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    assert!(discovery.has_group(nrt::GROUP));
    assert!(discovery.has_group(""));
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group(nrt::GROUP));

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get("noderesourcetopologies.topology.node.k8s.io")
        .await
        .unwrap();
    assert_eq!(crd.spec.scope, "Cluster");
    assert!(nrts.list(&ListParams::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn nrt_server_side_apply_tracks_resource_versions_managers_and_uids() {
    let (server, client, _dir) = setup().await;
    let nrts: Api<NodeResourceTopology> = Api::all(client);
    let first = nrt("n1", &[("topologyManagerPolicy", "single-numa-node")]);

    let before = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&first))
        .await
        .unwrap_err();
    assert_eq!(api_status(before).code, 404);

    server.install_nrt_crd();
    server.clear_requests();
    let created = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&first))
        .await
        .unwrap();
    let rv1 = created.resource_version().unwrap();
    let uid1 = created.uid().unwrap();
    assert_eq!(created.zones, first.zones);

    let patch = server
        .wait_for_request(|r| r.method == "PATCH", SOON)
        .await
        .unwrap();
    assert_eq!(patch.path, format!("{NRT_PATH}/n1"));
    assert_eq!(patch.query_param("fieldManager").as_deref(), Some(MANAGER));
    assert_eq!(patch.query_param("force").as_deref(), Some("true"));
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(patch.status, 201);
    assert_eq!(patch.body_json().unwrap()["kind"], nrt::KIND);

    // The real server does not write on a no-op apply: same resourceVersion, no event.
    let same = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&first))
        .await
        .unwrap();
    assert_eq!(same.resource_version().unwrap(), rv1);
    assert_eq!(server.resource_version().to_string(), rv1);

    let changed = nrt(
        "n1",
        &[
            ("topologyManagerPolicy", "single-numa-node"),
            ("topologyManagerScope", "pod"),
        ],
    );
    let updated = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&changed))
        .await
        .unwrap();
    let rv2 = updated.resource_version().unwrap();
    assert!(rv2.parse::<u64>().unwrap() > rv1.parse::<u64>().unwrap());
    assert_eq!(updated.uid().unwrap(), uid1);
    assert_eq!(updated.attribute("topologyManagerScope"), Some("pod"));
    let managers = updated.managed_fields();
    assert_eq!(managers.len(), 1);
    assert_eq!(managers[0].manager.as_deref(), Some(MANAGER));
    assert_eq!(managers[0].operation.as_deref(), Some("Apply"));
    assert_eq!(managers[0].fields_type.as_deref(), Some("FieldsV1"));

    // Fields the manager stops applying are removed.
    let mut no_attrs = changed.clone();
    no_attrs.attributes = None;
    let pruned = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&no_attrs))
        .await
        .unwrap();
    assert!(pruned.attributes.is_none());

    // Another manager changing an owned field conflicts unless forced.
    let other = nrt("n1", &[("topologyManagerPolicy", "none")]);
    let mut other_zones = other.clone();
    other_zones.attributes = None;
    other_zones.zones[0].name = "node-9".into();
    let conflict = nrts
        .patch(
            "n1",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(&other_zones),
        )
        .await
        .unwrap_err();
    let status = api_status(conflict);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status
            .message
            .contains("conflict with \"numaplane-exporter\": .zones")
    );
    let forced = nrts
        .patch(
            "n1",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&other_zones),
        )
        .await
        .unwrap();
    assert_eq!(forced.zones[0].name, "node-9");
    assert_eq!(forced.managed_fields().len(), 1);
    assert_eq!(
        forced.managed_fields()[0].manager.as_deref(),
        Some("someone-else")
    );

    // Delete then apply re-creates with a new uid and a newer resourceVersion.
    nrts.delete("n1", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_status(nrts.get("n1").await.unwrap_err()).code, 404);
    let recreated = nrts
        .patch("n1", &apply_params(), &Patch::Apply(&first))
        .await
        .unwrap();
    assert_ne!(recreated.uid().unwrap(), uid1);
    assert!(
        recreated.resource_version().unwrap().parse::<u64>().unwrap()
            > forced.resource_version().unwrap().parse::<u64>().unwrap()
    );
    assert_eq!(
        server.get(nrt::API_VERSION, nrt::KIND, None, "n1").unwrap()["metadata"]["uid"],
        json!(recreated.uid().unwrap())
    );

    // Apply without a field manager is rejected, as by the real server.
    let no_manager = nrts
        .patch("n1", &PatchParams::default(), &Patch::Apply(&first))
        .await;
    assert!(no_manager.is_err());
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_conflicts() {
    let (server, client, _dir) = setup().await;
    server.put(pod("p", "n1", "Running"));
    let pods: Api<Pod> = Api::namespaced(client, "default");

    let stale = pods.get("p").await.unwrap();
    let mut fresh = stale.clone();
    fresh.labels_mut().insert("tier".into(), "gold".into());
    let replaced = pods.replace("p", &PostParams::default(), &fresh).await.unwrap();
    assert_ne!(replaced.resource_version(), stale.resource_version());
    assert_eq!(replaced.uid(), stale.uid());

    let status = api_status(
        pods.replace("p", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on pods \"p\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );

    // A no-op replace is not written.
    let again = pods
        .replace("p", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(again.resource_version(), replaced.resource_version());

    let exists = api_status(pods.create(&PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((exists.code, exists.reason.as_str()), (409, "AlreadyExists"));
    let missing = api_status(
        pods.replace("nope", &PostParams::default(), &{
            let mut p = stale.clone();
            p.metadata.name = Some("nope".into());
            p
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(missing.code, 404);
}

#[tokio::test]
async fn watcher_follows_the_pods_of_one_node_only() {
    let (server, client, _dir) = setup().await;
    server.put(pod("a", "n1", "Pending"));
    server.put(pod("b", "n2", "Running"));
    server.put(pod("c", "n1", "Running"));

    let config = watcher::Config::default().fields("spec.nodeName=n1");
    let mut stream = watcher(Api::<Pod>::all(client), config).boxed();
    expect_events(
        &mut stream,
        &[
            "init",
            "init-apply a@n1:Pending",
            "init-apply c@n1:Running",
            "init-done",
        ],
    )
    .await;

    server.put(pod("d", "n2", "Pending"));
    server.put(pod("e", "n1", "Pending"));
    expect_events(&mut stream, &["apply e@n1:Pending"]).await;

    server.put(pod("a", "n1", "Running"));
    expect_events(&mut stream, &["apply a@n1:Running"]).await;

    server.delete("v1", "Pod", Some("default"), "b");
    assert!(server.delete("v1", "Pod", Some("default"), "c"));
    expect_events(&mut stream, &["delete c@n1:Running"]).await;

    let list = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .unwrap();
    assert_eq!(
        list.query_param("fieldSelector").as_deref(),
        Some("spec.nodeName=n1")
    );
    let watch = server
        .requests()
        .into_iter()
        .find(RecordedRequest::is_watch)
        .unwrap();
    assert_eq!(watch.query_param("allowWatchBookmarks").as_deref(), Some("true"));
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_live_ones() {
    let (server, client, _dir) = setup().await;
    server.put(pod("a", "n1", "Running"));
    server.put(pod("b", "n2", "Running"));
    let config = watcher::Config::default()
        .fields("spec.nodeName=n1")
        .streaming_lists();
    let mut stream = watcher(Api::<Pod>::all(client), config).boxed();
    expect_events(&mut stream, &["init", "init-apply a@n1:Running", "init-done"]).await;
    // A pod moving onto the node shows up as an apply, moving off as a delete.
    server.put(pod("b", "n1", "Running"));
    expect_events(&mut stream, &["apply b@n1:Running"]).await;
    server.put(pod("b", "n3", "Running"));
    expect_events(&mut stream, &["delete b@n3:Running"]).await;
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.query_param("sendInitialEvents").as_deref() == Some("true"))
    );
}

#[tokio::test]
async fn injected_failure_fails_exactly_once() {
    let (server, client, _dir) = setup().await;
    server.put(node("n1"));
    let nodes: Api<Node> = Api::all(client);
    server.fail_next("GET", "/api/v1/nodes/n1", 500, 1);
    let status = api_status(nodes.get("n1").await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"));
    assert_eq!(nodes.get("n1").await.unwrap().name_any(), "n1");

    // Kube-rs retries 503s by itself: the caller succeeds, the log shows both answers.
    server.fail_next("*", "/api/v1/nodes", 503, 1);
    nodes.get("n1").await.unwrap();
    let statuses: Vec<u16> = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/nodes/n1")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [500, 200, 503, 200]);

    // wait_for_request also sees requests that arrive while it waits.
    server.clear_requests();
    let later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        nodes.get_opt("late").await.unwrap()
    });
    let seen = server
        .wait_for_request(|r| r.path.ends_with("/late"), SOON)
        .await
        .unwrap();
    assert_eq!(seen.status, 404);
    assert!(later.await.unwrap().is_none());
}

#[tokio::test]
async fn raw_watches_time_out_and_carry_bookmarks() {
    let (server, client, _dir) = setup().await;
    server.put(pod("a", "n1", "Running"));
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let rv = server.resource_version().to_string();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    server.send_bookmarks();
    match tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Bookmark(bm)) => assert_eq!(bm.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    server.put(pod("a", "n1", "Succeeded"));
    match tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Modified(p)) => assert_eq!(p.name_any(), "a"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // The server ends the watch after timeoutSeconds.
    let end = tokio::time::timeout(SOON, stream.try_next()).await.unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_410_and_the_watcher_relists() {
    let (server, client, _dir) = setup().await;
    server.put(pod("a", "n1", "Running"));
    let pods: Api<Pod> = Api::all(client);

    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .boxed();
    expect_events(&mut stream, &["init", "init-apply a@n1:Running", "init-done"]).await;
    server.put(pod("x", "n1", "Running"));
    expect_events(&mut stream, &["apply x@n1:Running"]).await;

    // Writes the watcher does not see move the cluster past its resourceVersion; compaction
    // then makes that version too old, and the (re)connecting watch gets 410 Gone.
    server.put(pod("b", "n2", "Running"));
    server.compact_history();
    server.close_watches();
    match next_event(&mut stream).await {
        Err(watcher::Error::WatchError(status)) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 watch error, got {other:?}"),
    }
    expect_events(
        &mut stream,
        &[
            "init",
            "init-apply a@n1:Running",
            "init-apply x@n1:Running",
            "init-done",
        ],
    )
    .await;
    server.put(pod("c", "n1", "Pending"));
    expect_events(&mut stream, &["apply c@n1:Pending"]).await;
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .count();
    assert_eq!(lists, 2);

    // The raw watch API sees the ERROR event itself.
    let mut raw = pods.watch(&WatchParams::default(), "1").await.unwrap().boxed();
    match tokio::time::timeout(SOON, raw.try_next()).await.unwrap().unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn patches_status_subresource_selectors_and_namespaces() {
    let (server, client, _dir) = setup().await;
    server.put(pod("web", "n1", "Pending"));
    server.put(pod("db", "n1", "Pending"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // Main-resource patches keep the stored status of kinds with a status subresource.
    let patched = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels().get("tier").map(String::as_str), Some("front"));
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Pending"));
    let running = pods
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(running.status.unwrap().phase.as_deref(), Some("Running"));

    // RFC 6902 JSON patch through the raw client.
    let req = http::Request::patch("/api/v1/namespaces/default/pods/db")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([
                {"op": "test", "path": "/metadata/labels/app", "value": "db"},
                {"op": "add", "path": "/metadata/labels/role", "value": "primary"},
            ]))
            .unwrap(),
        )
        .unwrap();
    let db: Pod = client.request(req).await.unwrap();
    assert_eq!(db.labels().get("role").map(String::as_str), Some("primary"));

    let names =
        |list: kube::core::ObjectList<Pod>| list.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
    let lp = |labels: &str| ListParams::default().labels(labels);
    assert_eq!(names(pods.list(&lp("app=web")).await.unwrap()), ["web"]);
    assert_eq!(
        names(pods.list(&lp("app in (web,db)")).await.unwrap()),
        ["db", "web"]
    );
    assert_eq!(names(pods.list(&lp("role")).await.unwrap()), ["db"]);
    assert_eq!(names(pods.list(&lp("!role,app!=x")).await.unwrap()), ["web"]);
    let fields = ListParams::default().fields("metadata.name!=web,status.phase=Pending");
    assert_eq!(names(pods.list(&fields).await.unwrap()), ["db"]);
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    assert!(
        elsewhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let missing_ns: Api<Pod> = Api::namespaced(client, "nope");
    let mut orphan: Pod = serde_json::from_value(pod("x", "n1", "Pending")).unwrap();
    orphan.metadata.namespace = None;
    let status = api_status(
        missing_ns
            .create(&PostParams::default(), &orphan)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 404);
    assert_eq!(status.message, "namespaces \"nope\" not found");
}

#[tokio::test]
async fn event_recorder_publishes_events() {
    let (server, client, _dir) = setup().await;
    server.put(node("n1"));
    let recorder = events::Recorder::new(
        client,
        events::Reporter {
            controller: MANAGER.into(),
            instance: Some("n1".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("n1".into()),
        ..ObjectReference::default()
    };
    let event = events::Event {
        type_: events::EventType::Warning,
        reason: "KubeletUnreachable".into(),
        note: Some("podresources socket missing".into()),
        action: "Export".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let stored = server.list("events.k8s.io/v1", "Event", Some("default"));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["reason"], "KubeletUnreachable");
    assert_eq!(stored[0]["regarding"]["name"], "n1");
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let (server, client, _dir) = setup().await;
    let copy = server.clone();
    server.put(node("n1"));
    let nodes: Api<Node> = Api::all(client);
    nodes.get("n1").await.unwrap();
    copy.shutdown();
    let err = tokio::time::timeout(SOON, nodes.get("n1"))
        .await
        .unwrap()
        .unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
}

#[tokio::test]
async fn metadata_only_requests_get_partial_objects() {
    let (server, client, _dir) = setup().await;
    server.put(pod("a", "n1", "Running"));
    server.put(pod("b", "n2", "Running"));
    let pods: Api<Pod> = Api::all(client);
    let meta = Api::<Pod>::namespaced(pods.clone().into_client(), "default")
        .get_metadata("a")
        .await
        .unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("a"));
    assert_eq!(meta.types.unwrap().kind, "PartialObjectMetadata");
    let list = pods
        .list_metadata(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("b"));

    let mut stream = watcher(
        Api::<PartialObjectMeta<Pod>>::all(pods.into_client()),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .boxed();
    let mut names = Vec::new();
    while names.len() < 2 {
        match tokio::time::timeout(SOON, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(m) | watcher::Event::Apply(m) => names.push(m.metadata.name.unwrap()),
            watcher::Event::InitDone => {
                server.put(pod("c", "n1", "Pending"));
            }
            _ => {}
        }
    }
    assert_eq!(names, ["a", "c"]);
    let watch = server
        .requests()
        .into_iter()
        .find(RecordedRequest::is_watch)
        .unwrap();
    assert!(watch.header("accept").unwrap().contains("PartialObjectMetadata"));
}

// ===== "What a real API server (v1.36.2) answers" (verified-facts.md), one test per line =====

#[tokio::test]
async fn fact_pod_field_selectors_work_and_unsupported_ones_are_400() {
    let (server, client, _dir) = setup().await;
    let mut pending = pod("p", "", "Pending");
    pending["spec"]["schedulerName"] = json!("numaplane-scheduler");
    server.put(pending);
    let mut other = pod("q", "", "Pending");
    other["spec"]["schedulerName"] = json!("default-scheduler");
    server.put(other);
    server.put(pod("done", "n1", "Succeeded"));
    server.put(pod("run", "n1", "Running"));
    let pods: Api<Pod> = Api::all(client);
    let names = |l: kube::core::ObjectList<Pod>| l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    let ours = pods
        .list(&ListParams::default().fields("spec.schedulerName=numaplane-scheduler,spec.nodeName="))
        .await
        .unwrap();
    assert_eq!(names(ours), ["p"]);
    let live = pods
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .unwrap();
    let mut live = names(live);
    live.sort();
    assert_eq!(live, ["p", "q", "run"]);
    let err = api_status(
        pods.list(&ListParams::default().fields("spec.priority=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    assert_eq!(err.message, "field label not supported: spec.priority");
    // Watches check it too; other kinds have their own lists.
    match pods
        .watch(&WatchParams::default().fields("spec.priority=1"), "0")
        .await
    {
        Ok(_) => panic!("a watch with an unsupported field label must fail"),
        Err(e) => assert_eq!(api_status(e).code, 400),
    }
    let nodes: Api<Node> = Api::all(pods.clone().into_client());
    assert!(
        nodes
            .list(&ListParams::default().fields("spec.unschedulable=false"))
            .await
            .is_ok()
    );
    assert_eq!(
        api_status(
            nodes
                .list(&ListParams::default().fields("spec.nodeName="))
                .await
                .unwrap_err()
        )
        .code,
        400
    );
}

/// POST pods/NAME/binding through kube-rs's raw request path, as the scheduler sends it.
async fn post_binding(client: &Client, name: &str, body: Value) -> Result<Value, kube::Error> {
    let req = http::Request::post(format!("/api/v1/namespaces/default/pods/{name}/binding"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    client.request::<Value>(req).await
}

#[tokio::test]
async fn fact_binding_is_201_copies_annotations_and_conflicts_on_bound_or_other_uid() {
    let (server, client, _dir) = setup().await;
    let stored = server.put(pod("b", "", "Pending"));
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let binding = |uid: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "b", "uid": uid, "annotations": {"numaplane.io/allocation": "{\"v\":1}"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    // A UID other than the pod's: 409, nothing written; the body of the real server.
    let err = api_status(
        post_binding(&client, "b", binding("not-the-uid", "nowhere"))
            .await
            .unwrap_err(),
    );
    assert_conflict(&err, "pods", "b");
    assert!(
        err.message
            .starts_with("Operation cannot be fulfilled on pods \"b\": StorageError: invalid object, "),
        "{}",
        err.message
    );
    assert!(
        err.message.ends_with(&format!(
            "Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"
        )),
        "{}",
        err.message
    );
    // The target node is not checked: binding to a node that does not exist succeeds.
    let status = post_binding(&client, "b", binding(&uid, "nowhere"))
        .await
        .unwrap();
    assert_eq!(
        (status["kind"].as_str(), status["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    let bound: Pod = Api::namespaced(client.clone(), "default").get("b").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("nowhere"));
    assert_eq!(
        bound.metadata.annotations.unwrap()["numaplane.io/allocation"],
        "{\"v\":1}"
    );
    let created = server
        .requests()
        .into_iter()
        .rfind(|r| r.path.ends_with("/binding"))
        .unwrap();
    assert_eq!(created.status, 201);
    // Already bound: 409 with the real body.
    let err = api_status(
        post_binding(&client, "b", binding(&uid, "other"))
            .await
            .unwrap_err(),
    );
    assert_conflict(&err, "pods/binding", "b");
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on pods/binding \"b\": pod b is already assigned to node \"nowhere\""
    );
    // A pod with scheduling gates cannot be bound: the same reason and kind as "already
    // assigned", told apart by the message only.
    let mut gated = pod("g", "", "Pending");
    gated["spec"]["schedulingGates"] = json!([{"name": "example.com/wait"}]);
    let gated_uid = server.put(gated)["metadata"]["uid"].as_str().unwrap().to_owned();
    let body = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "g", "uid": gated_uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n"}});
    let err = api_status(post_binding(&client, "g", body).await.unwrap_err());
    assert_conflict(&err, "pods/binding", "g");
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on pods/binding \"g\": pod g has non-empty .spec.schedulingGates"
    );
}

/// The shape every 409 of `pods/binding` has on the real server (verified facts).
fn assert_conflict(err: &kube::core::Status, kind: &str, name: &str) {
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "Conflict");
    assert_eq!(err.status, Some(kube::core::response::StatusSummary::Failure));
    let details = err.details.as_ref().expect("details");
    assert_eq!((details.kind.as_str(), details.name.as_str()), (kind, name));
}

/// A write made just before a request is answered: the request meets the race's real answer.
#[tokio::test]
async fn changes_before_the_next_request_race_it() {
    let (server, client, _dir) = setup().await;
    let uid = server.put(pod("r", "", "Pending"))["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    // Recreated under its name just before the Binding: a new UID, so a precondition 409.
    server.change_before_next(
        "POST",
        "/api/v1/namespaces/default/pods/r/binding",
        vec![
            StoreChange::Delete {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some("default".into()),
                name: "r".into(),
            },
            StoreChange::Put(pod("r", "", "Pending")),
        ],
    );
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "r", "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n"}});
    let err = api_status(post_binding(&client, "r", binding.clone()).await.unwrap_err());
    assert_conflict(&err, "pods", "r");
    let new_uid = server.get("v1", "Pod", Some("default"), "r").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_uid, uid);
    // Used once: the next request is answered as usual (still the old UID: 409 again).
    let err = api_status(post_binding(&client, "r", binding).await.unwrap_err());
    assert_conflict(&err, "pods", "r");
}

#[tokio::test]
async fn fact_status_strategic_merge_patch_merges_conditions_by_type() {
    let (server, client, _dir) = setup().await;
    let mut p = pod("u", "", "Pending");
    p["status"]["conditions"] = json!([
        {"type": "PodScheduled", "status": "Unknown"},
        {"type": "DisruptionTarget", "status": "False", "reason": "Kept"}
    ]);
    server.put(p);
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let patch = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable", "message": "0/3 nodes are available"}]}});
    pods.patch_status("u", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let conds = pods.get("u").await.unwrap().status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2, "merged by type, not replaced: {conds:?}");
    let scheduled = conds.iter().find(|c| c.type_ == "PodScheduled").unwrap();
    assert_eq!(
        (scheduled.status.as_str(), scheduled.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    assert!(conds.iter().any(|c| c.reason.as_deref() == Some("Kept")));
    // A JSON merge patch replaces the list, as on a real server.
    pods.patch_status("u", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let conds = pods.get("u").await.unwrap().status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 1);
}

#[tokio::test]
async fn fact_events_k8s_io_require_event_time_and_reporting_instance() {
    let (_server, client, _dir) = setup().await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let event = |instance: Option<&str>| {
        serde_json::from_value(json!({
            "metadata": {"name": "e1"},
            "eventTime": "2026-11-25T10:00:00.000000Z",
            "reportingController": "numaplane.io/scheduler",
            "reportingInstance": instance,
            "action": "Scheduling", "reason": "FailedScheduling", "type": "Warning",
            "regarding": {"kind": "Pod", "namespace": "default", "name": "p"}
        }))
        .unwrap()
    };
    let err = api_status(
        events
            .create(&PostParams::default(), &event(None))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        err.message,
        "Event \"e1\" is invalid: reportingInstance: Required value"
    );
    events
        .create(&PostParams::default(), &event(Some("replica-1")))
        .await
        .unwrap();
}

#[tokio::test]
async fn fact_watch_from_a_too_old_version_is_200_then_one_410_error_event() {
    let (server, _client, _dir) = setup().await;
    server.put(pod("a", "n1", "Running"));
    server.put(pod("b", "n1", "Running"));
    server.compact_history();
    let current = server.resource_version();
    let addr = server.addr();
    let (status, body) = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(SOON)).unwrap();
        write!(
            s,
            "GET /api/v1/pods?watch=true&resourceVersion=1&timeoutSeconds=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {FAKE_TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status: u16 = out.split(' ').nth(1).unwrap().parse().unwrap();
        (status, out)
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    let line = body
        .lines()
        .find(|l| l.contains("\"ERROR\""))
        .unwrap_or_else(|| panic!("no ERROR event in {body}"));
    let ev: Value = serde_json::from_str(line).unwrap();
    assert_eq!(ev["object"]["kind"], "Status");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    // "too old resource version: <asked> (<oldest version still served>)".
    let message = ev["object"]["message"].as_str().unwrap();
    let oldest: u64 = message
        .strip_prefix("too old resource version: 1 (")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected message {message:?}"));
    assert!(
        oldest > 1 && oldest <= current + 1,
        "{message} (current {current})"
    );
}

#[tokio::test]
async fn fact_lease_create_existing_is_409_already_exists_and_stale_put_is_409_conflict() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (_server, client, _dir) = setup().await;
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "numaplane-scheduler"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let err = api_status(leases.create(&PostParams::default(), &lease).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    let mut mine = created.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("numaplane-scheduler", &PostParams::default(), &mine)
        .await
        .unwrap();
    // `created` still has the old resourceVersion.
    let err = api_status(
        leases
            .replace("numaplane-scheduler", &PostParams::default(), &created)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.ends_with(
            "the object has been modified; please apply your changes to the latest version and try again"
        ),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn fact_nrt_crd_refuses_bad_quantities_with_422_and_prunes_unknown_fields() {
    let (server, client, _dir) = setup().await;
    server.install_nrt_crd();
    let api: Api<NodeResourceTopology> = Api::all(client);
    let mut bad = json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n1"}, "topologyPolicies": ["None"],
        "zones": [{"name": "node-0", "type": "Node", "resources": [
            {"name": "cpu", "capacity": "x4", "allocatable": "4", "available": "4"}]}]});
    let params = PatchParams::apply(MANAGER);
    let err = api_status(api.patch("n1", &params, &Patch::Apply(&bad)).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.starts_with(
            "NodeResourceTopology.topology.node.k8s.io \"n1\" is invalid: zones[0].resources[0].capacity: Invalid value: \"x4\""
        ),
        "{}",
        err.message
    );
    assert!(err.message.contains("should match '^(\\+|-)?"), "{}", err.message);
    assert!(
        server
            .get(NRT_API_VERSION, "NodeResourceTopology", None, "n1")
            .is_none()
    );
    // Fixed, plus a field the schema does not know: stored without it.
    bad["zones"][0]["resources"][0]["capacity"] = json!("4");
    bad["zones"][0]["resources"][0]["vendorExtra"] = json!("x");
    bad["extra"] = json!(1);
    api.patch("n1", &params, &Patch::Apply(&bad)).await.unwrap();
    let stored = server
        .get(NRT_API_VERSION, "NodeResourceTopology", None, "n1")
        .unwrap();
    assert!(stored.get("extra").is_none());
    assert!(stored["zones"][0]["resources"][0].get("vendorExtra").is_none());
    assert_eq!(stored["zones"][0]["resources"][0]["capacity"], "4");
}

/// The storage kinds the scheduler watches and writes: StorageClasses, PersistentVolumes and
/// PersistentVolumeClaims are listed, watched (through kube's watcher) and patched (the merge
/// patch of a claim's `volume.kubernetes.io/selected-node`), with the claim's status a
/// subresource and a missing claim a 404 naming `persistentvolumeclaims`.
#[tokio::test]
async fn storage_kinds_are_served_listed_watched_and_patched() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let (server, client, _dir) = setup().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let sc: StorageClass = serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass", "metadata": {"name": "wffc"}, "provisioner": "csi.example.com",
        "volumeBindingMode": "WaitForFirstConsumer"}))
    .unwrap();
    classes.create(&PostParams::default(), &sc).await.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({"apiVersion": "v1",
        "kind": "PersistentVolume", "metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": "1Gi"}}}))
    .unwrap();
    volumes.create(&PostParams::default(), &pv).await.unwrap();
    assert_eq!(classes.list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert_eq!(volumes.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let missing = api_status(claims.get("data").await.unwrap_err());
    assert_eq!(missing.code, 404);
    assert_eq!(missing.message, "persistentvolumeclaims \"data\" not found");

    let mut stream = watcher(claims.clone(), watcher::Config::default()).boxed();
    let init = tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(init, Some(watcher::Event::Init)), "{init:?}");
    let done = tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(done, Some(watcher::Event::InitDone)), "{done:?}");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({"apiVersion": "v1",
        "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"storageClassName": "wffc", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Pending"}}))
    .unwrap();
    claims.create(&PostParams::default(), &pvc).await.unwrap();
    let added = tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&added, Some(watcher::Event::Apply(c)) if c.metadata.name.as_deref() == Some("data")),
        "{added:?}"
    );
    let patch = json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "n1"}}});
    let patched = claims
        .patch("data", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.annotations.unwrap()["volume.kubernetes.io/selected-node"],
        "n1"
    );
    let modified = tokio::time::timeout(SOON, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    let Some(watcher::Event::Apply(c)) = modified else {
        panic!("{modified:?}")
    };
    assert_eq!(
        c.metadata.annotations.unwrap()["volume.kubernetes.io/selected-node"],
        "n1"
    );
    // The status is a subresource: a main-resource write keeps it.
    let mut again = claims.get("data").await.unwrap();
    again.status = None;
    let replaced = claims
        .replace("data", &PostParams::default(), &again)
        .await
        .unwrap();
    assert_eq!(replaced.status.unwrap().phase.as_deref(), Some("Pending"));
    let path = "/api/v1/namespaces/default/persistentvolumeclaims/data";
    assert!(
        server
            .requests()
            .iter()
            .any(|r: &RecordedRequest| r.method == "PATCH" && r.path == path && r.status == 200)
    );
}
