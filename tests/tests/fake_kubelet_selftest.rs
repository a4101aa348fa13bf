//! The fake kubelet against the real generated tonic client over a Unix socket: what the
//! exporter tests rely on (round trips, kubelet-like errors, Watch events, injected failures,
//! restarts, call counting) is checked here once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use numaplane::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use numaplane::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, ListPodResourcesRequest, NumaNode, PodResources, TopologyInfo, WatchPodAction,
    WatchPodResourcesRequest,
};
use numaplane_e2e::fake_kubelet::{
    self, FakeKubelet, FakeKubeletOptions, GET_DISABLED_MESSAGE, GetMode, Method, RATE_LIMIT_MESSAGE,
    connect, pod_uid, start_not_grpc,
};
use tonic::Code;
use tonic::transport::Channel;

/// Upper bound for anything that should be immediate; keeps a broken fake from hanging CI.
const SOON: Duration = Duration::from_secs(10);

fn allocatable() -> AllocatableResourcesResponse {
    AllocatableResourcesResponse {
        devices: vec![ContainerDevices {
            resource_name: "fake.io/gpu".into(),
            device_ids: vec!["gpu0".into()],
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        }],
        cpu_ids: vec![0, 1, 2, 3],
        memory: vec![],
    }
}

fn pod(namespace: &str, name: &str, cpus: &[i64]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: "c".into(),
            cpu_ids: cpus.to_vec(),
            ..ContainerResources::default()
        }],
        ..PodResources::default()
    }
}

const ALL: FakeKubeletOptions = FakeKubeletOptions {
    watch: true,
    get: GetMode::Offered,
};

/// A kubelet without Watch whose Get answers as `get`, running pod `default/a`, and a client;
/// the directory holds the socket.
async fn without_watch(get: GetMode) -> (tempfile::TempDir, FakeKubelet, PodResourcesListerClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = FakeKubeletOptions { watch: false, get };
    let kubelet = start(dir.path(), vec![pod("default", "a", &[1])], opts).await;
    let client = connect(kubelet.socket()).await.unwrap();
    (dir, kubelet, client)
}

/// A Get request for pod `namespace/name`.
fn get_request(namespace: &str, name: &str) -> GetPodResourcesRequest {
    GetPodResourcesRequest {
        pod_name: name.into(),
        pod_namespace: namespace.into(),
    }
}

async fn start(dir: &Path, pods: Vec<PodResources>, opts: FakeKubeletOptions) -> FakeKubelet {
    FakeKubelet::start(&dir.join("kubelet.sock"), allocatable(), pods, opts)
        .await
        .unwrap()
}

/// Polls `f` until it holds or [`SOON`] passes.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + SOON;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn list_and_allocatable_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let pods = vec![pod("default", "a", &[1]), pod("kube-system", "b", &[])];
    let kubelet = start(dir.path(), pods.clone(), FakeKubeletOptions::default()).await;
    let mut client = connect(kubelet.socket()).await.unwrap();

    let list = client.list(ListPodResourcesRequest {}).await.unwrap();
    assert_eq!(list.into_inner().pod_resources, pods);
    let alloc = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap();
    assert_eq!(alloc.into_inner(), allocatable());

    // New state is answered by the next call on the same connection.
    let mut changed = allocatable();
    changed.cpu_ids = vec![2, 3];
    kubelet.set_allocatable(changed.clone());
    kubelet.set_pods(vec![]);
    let alloc = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap();
    assert_eq!(alloc.into_inner(), changed);
    let list = client.list(ListPodResourcesRequest {}).await.unwrap();
    assert!(list.into_inner().pod_resources.is_empty());

    assert_eq!(kubelet.calls(Method::List), 2);
    assert_eq!(kubelet.calls(Method::GetAllocatableResources), 2);
    assert_eq!(kubelet.calls_by_code(Method::List), [(Code::Ok, 2)]);
    assert_eq!(kubelet.calls(Method::Get), 0);
    assert_eq!(kubelet.calls(Method::Watch), 0);
}

#[tokio::test]
async fn get_and_watch_answer_unimplemented_like_the_kubelet_when_disabled() {
    let (_dir, kubelet, mut client) = without_watch(GetMode::Unimplemented).await;

    let err = client.get(get_request("default", "a")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert_eq!(
        err.message(),
        "unknown method Get for service v1.PodResourcesLister"
    );
    let err = client.watch(WatchPodResourcesRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert_eq!(
        err.message(),
        "unknown method Watch for service v1.PodResourcesLister"
    );
    assert_eq!(
        err.message(),
        fake_kubelet::unimplemented(Method::Watch).message()
    );

    // A disabled method does not consume failures queued for it, and List is unaffected.
    kubelet.fail_next(Method::Get, 1, Code::Internal, "boom");
    let err = client.get(GetPodResourcesRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    client.list(ListPodResourcesRequest {}).await.unwrap();

    assert_eq!(kubelet.calls_by_code(Method::Get), [(Code::Unimplemented, 2)]);
    assert_eq!(kubelet.calls_by_code(Method::Watch), [(Code::Unimplemented, 1)]);
    assert_eq!(kubelet.watchers(), 0);
}

#[tokio::test]
async fn get_returns_the_pod_or_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let a = pod("default", "a", &[1]);
    let kubelet = start(dir.path(), vec![a.clone(), pod("other", "a", &[2])], ALL).await;
    let mut client = connect(kubelet.socket()).await.unwrap();

    let got = client.get(get_request("default", "a")).await.unwrap();
    assert_eq!(got.into_inner().pod_resources, Some(a));

    let err = client.get(get_request("default", "missing")).await.unwrap_err();
    // What a real v1.36.2 kubelet answers: Unknown, not NotFound.
    assert_eq!(err.code(), Code::Unknown);
    assert_eq!(err.message(), "pod missing in namespace default not found");
    assert_eq!(
        kubelet.calls_by_code(Method::Get),
        [(Code::Ok, 1), (Code::Unknown, 1)]
    );
}

#[tokio::test]
async fn get_gated_off_answers_unknown_disabled_like_kubelets_1_27_to_1_33() {
    let (_dir, kubelet, mut client) = without_watch(GetMode::Disabled).await;
    // Even for a pod the kubelet runs.
    let err = client.get(get_request("default", "a")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unknown);
    assert_eq!(err.message(), GET_DISABLED_MESSAGE);
    assert_eq!(kubelet.calls_by_code(Method::Get), [(Code::Unknown, 1)]);
    client.list(ListPodResourcesRequest {}).await.unwrap();
}

#[tokio::test]
async fn watch_streams_set_pods_changes() {
    let dir = tempfile::tempdir().unwrap();
    let a = pod("ns", "a", &[1]);
    let b = pod("ns", "b", &[2]);
    let kubelet = start(dir.path(), vec![a.clone(), b.clone()], ALL).await;
    let mut client = connect(kubelet.socket()).await.unwrap();
    let mut first = client
        .watch(WatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut second = client
        .watch(WatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kubelet.watchers(), 2);

    // a changes, b goes, c comes; an unchanged pod produces no event.
    let a2 = pod("ns", "a", &[1, 3]);
    let c = pod("ns", "c", &[]);
    let unchanged = pod("ns", "d", &[0]);
    kubelet.set_pods(vec![a2.clone(), c.clone()]);
    let want = [
        (WatchPodAction::Deleted, pod_uid("ns", "a"), a.clone()),
        (WatchPodAction::Deleted, pod_uid("ns", "b"), b),
        (WatchPodAction::Added, pod_uid("ns", "a"), a2.clone()),
        (WatchPodAction::Added, pod_uid("ns", "c"), c.clone()),
    ];
    for stream in [&mut first, &mut second] {
        for (action, uid, pod) in &want {
            let event = tokio::time::timeout(SOON, stream.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(event.action(), *action);
            assert_eq!(&event.uid, uid);
            assert_eq!(event.pod_resources, std::slice::from_ref(pod));
        }
    }
    assert_eq!(pod_uid("ns", "a"), "uid-ns-a");

    kubelet.set_pods(vec![a2.clone(), c.clone(), unchanged.clone()]);
    let event = tokio::time::timeout(SOON, first.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (event.action(), event.uid.as_str()),
        (WatchPodAction::Added, "uid-ns-d")
    );

    // A client that goes away stops counting as a watcher.
    drop(second);
    eventually("dropped watcher is noticed", || kubelet.watchers() == 1).await;
    assert_eq!(kubelet.calls_by_code(Method::Watch), [(Code::Ok, 2)]);
}

#[tokio::test]
async fn fail_next_gives_resource_exhausted_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = start(dir.path(), vec![pod("default", "a", &[1])], ALL).await;
    let mut client = connect(kubelet.socket()).await.unwrap();

    kubelet.fail_next(Method::List, 2, Code::ResourceExhausted, RATE_LIMIT_MESSAGE);
    for _ in 0..2 {
        let err = client.list(ListPodResourcesRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert_eq!(err.message(), "rejected by rate limit");
    }
    // Other methods were not affected.
    client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap();
    let list = client.list(ListPodResourcesRequest {}).await.unwrap();
    assert_eq!(list.into_inner().pod_resources.len(), 1);

    assert_eq!(kubelet.calls(Method::List), 3);
    assert_eq!(
        kubelet.calls_by_code(Method::List),
        [(Code::ResourceExhausted, 2), (Code::Ok, 1)]
    );
    assert_eq!(
        kubelet.calls_by_code(Method::GetAllocatableResources),
        [(Code::Ok, 1)]
    );
}

#[tokio::test]
async fn stop_removes_the_socket_and_restart_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = start(dir.path(), vec![pod("default", "a", &[1])], ALL).await;
    let socket = kubelet.socket().to_owned();
    let mut client = connect(&socket).await.unwrap();
    let mut watch = client
        .watch(WatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    client.list(ListPodResourcesRequest {}).await.unwrap();

    tokio::time::timeout(SOON, kubelet.stop()).await.unwrap();
    assert!(!socket.exists(), "socket file left behind");
    assert_eq!(kubelet.watchers(), 0);
    // The open Watch stream ends (cleanly or with an error), it does not hang.
    let end = tokio::time::timeout(SOON, watch.message()).await.unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    assert!(connect(&socket).await.is_err(), "connected to a stopped kubelet");

    // Changes while down are served after the restart.
    kubelet.set_pods(vec![pod("default", "b", &[2])]);
    kubelet.restart().await.unwrap();
    assert!(socket.exists());
    let mut client = connect(&socket).await.unwrap();
    let list = client.list(ListPodResourcesRequest {}).await.unwrap();
    let names: Vec<String> = list
        .into_inner()
        .pod_resources
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["b"]);
    // Counters span the restart.
    assert_eq!(kubelet.calls(Method::List), 2);

    // Stop is idempotent, and so is the cleanup of a missing socket.
    kubelet.stop().await;
    kubelet.stop().await;
    assert!(!socket.exists());
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    std::fs::write(&socket, b"stale").unwrap();
    let kubelet = FakeKubelet::start(&socket, allocatable(), vec![], ALL)
        .await
        .unwrap();
    let mut client = connect(&socket).await.unwrap();
    client.list(ListPodResourcesRequest {}).await.unwrap();
    kubelet.stop().await;
}

#[tokio::test]
async fn a_not_grpc_socket_fails_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let server = start_not_grpc(&socket).await.unwrap();
    assert!(socket.exists());
    let outcome = tokio::time::timeout(SOON, async {
        let mut client = connect(&socket).await?;
        client
            .list(ListPodResourcesRequest {})
            .await
            .map(|_| ())
            .map_err(|e| -> Box<dyn std::error::Error> { Box::new(e) })?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .await
    .unwrap();
    assert!(outcome.is_err(), "a garbage server answered a gRPC call");
    server.abort();
}
