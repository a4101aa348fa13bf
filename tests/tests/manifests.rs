//! `deploy/` against the binary it deploys: the DaemonSet's mounts, environment, arguments and
//! probes must match what `numaplane-exporter run --help` says the agent reads, listens on and
//! defaults to; the ClusterRole must grant every request a running agent makes (observed on the
//! fake API server) and nothing more; the kustomization must list every manifest. Each check
//! fails when the manifests drift from the binary, not when they are merely edited.
//!
//! The binary is built as in `exporter_dry_run.rs` (or taken from `NUMAPLANE_EXPORTER_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Service, ServiceAccount, Volume, VolumeMount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use numaplane::proto::podresources::{AllocatableResourcesResponse, ContainerResources, PodResources};
use numaplane_e2e::binaries::{Flag, assert_args_are_flags, assert_env_is_read, help_flags};
use numaplane_e2e::fake_api::{FakeApiServer, RecordedRequest};
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, Method};
use numaplane_e2e::fake_kubelet_https::{Answer, FakeKubeletHttps};
use numaplane_e2e::render::{self, arg_value, env_field, env_value};
use serde_json::{Value, json};

/// What the agent is allowed to do: (API group, resource, verb). The reason of each is in
/// deploy/README.md.
const GRANTS: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "nodes/configz", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("topology.node.k8s.io", "noderesourcetopologies", "list"),
    ("topology.node.k8s.io", "noderesourcetopologies", "watch"),
    ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    ("topology.node.k8s.io", "noderesourcetopologies", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

// ---------------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------------

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn exporter_bin() -> &'static Path {
    numaplane_e2e::binaries::exporter()
}

/// The options of `numaplane-exporter run`, by long name (`--node-name`), from its `--help`.
fn run_flags() -> &'static BTreeMap<String, Flag> {
    static FLAGS: OnceLock<BTreeMap<String, Flag>> = OnceLock::new();
    FLAGS.get_or_init(|| {
        let flags = help_flags(exporter_bin(), "run");
        assert!(
            flags.contains_key("--node-name") && flags.contains_key("--podresources-socket"),
            "run --help lacks its core flags: {flags:?}"
        );
        flags
    })
}

fn flag(name: &str) -> &'static Flag {
    run_flags()
        .get(name)
        .unwrap_or_else(|| panic!("numaplane-exporter run has no {name}"))
}

// ---------------------------------------------------------------------------------------------
// The manifests
// ---------------------------------------------------------------------------------------------

fn deploy_dir() -> PathBuf {
    workspace().join("deploy")
}

/// The documents of a multi-document YAML file in `deploy/`.
fn documents(file: &str) -> Vec<Value> {
    let path = deploy_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one object of `kind` in `deploy/exporter.yaml`, as its k8s-openapi type.
fn object<T: serde::de::DeserializeOwned>(kind: &str) -> T {
    let docs = documents("exporter.yaml");
    let matching: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(matching.len(), 1, "want one {kind} in deploy/exporter.yaml");
    serde_json::from_value(matching[0].clone())
        .unwrap_or_else(|e| panic!("the {kind} of deploy/exporter.yaml: {e}"))
}

fn daemonset() -> DaemonSet {
    object("DaemonSet")
}

fn pod_spec(ds: &DaemonSet) -> &k8s_openapi::api::core::v1::PodSpec {
    ds.spec.template.spec.as_ref().unwrap()
}

fn container(ds: &DaemonSet) -> &Container {
    let containers = &pod_spec(ds).containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// What the agent in the DaemonSet uses for `flag`: its argument, else its environment
/// variable, else the binary's default.
fn effective(c: &Container, name: &str) -> Option<String> {
    render::effective(c, name, flag(name))
}

/// The container mount that holds `path`, with its volume.
fn mount_of<'a>(ds: &'a DaemonSet, path: &str) -> (&'a VolumeMount, &'a Volume) {
    render::mount_of(container(ds), pod_spec(ds), path)
}

/// The metrics port: the port of the effective `--listen`.
fn metrics_port(c: &Container) -> i32 {
    let addr: std::net::SocketAddr = effective(c, "--listen").unwrap().parse().unwrap();
    i32::from(addr.port())
}

// ---------------------------------------------------------------------------------------------
// Static checks
// ---------------------------------------------------------------------------------------------

#[test]
fn daemonset_mounts_the_pod_resources_directory_and_points_the_socket_inside() {
    let ds = daemonset();
    let c = container(&ds);
    let socket = effective(c, "--podresources-socket").unwrap();
    let (mount, volume) = mount_of(&ds, &socket);
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("volume {} is not a hostPath", volume.name));
    // The kubelet's socket directory, as the binary's default names it.
    let default_socket = flag("--podresources-socket").default.clone().unwrap();
    let kubelet_dir = Path::new(&default_socket).parent().unwrap();
    assert_eq!(Path::new(&host.path), kubelet_dir, "host directory of the socket");
    assert_eq!(
        host.type_.as_deref(),
        Some("Directory"),
        "mount the directory, not the socket file: a kubelet restart recreates the socket"
    );
    assert_ne!(
        Path::new(&socket),
        Path::new(&mount.mount_path),
        "the socket itself is mounted; mount its directory"
    );
    // The socket file name inside the mount is the kubelet's.
    let inside = Path::new(&socket).strip_prefix(&mount.mount_path).unwrap();
    assert_eq!(
        Some(inside),
        Path::new(&default_socket).strip_prefix(kubelet_dir).ok()
    );
    // No hostPath anywhere points at a socket file.
    for v in pod_spec(&ds).volumes.iter().flatten() {
        if let Some(h) = &v.host_path {
            assert!(
                !h.path.ends_with(".sock"),
                "volume {} mounts a socket file",
                v.name
            );
            assert_ne!(h.type_.as_deref(), Some("Socket"), "volume {}", v.name);
        }
    }
}

#[test]
fn daemonset_reads_the_kubelet_config_from_configz_and_mounts_no_kubelet_state() {
    let ds = daemonset();
    let c = container(&ds);
    // The kubelet's /configz, on the node's own address, is the source: no file of the node.
    assert_eq!(effective(c, "--kubelet-configz").as_deref(), Some("kubelet"));
    assert_eq!(flag("--node-address").env.as_deref(), Some("NODE_ADDRESS"));
    let host_ip = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_ADDRESS")
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(host_ip.as_deref(), Some("status.hostIP"));
    for off in ["--kubelet-config", "--kubelet-config-dir", "--kubelet-state-dir"] {
        assert!(effective(c, off).is_none(), "{off} in the default DaemonSet");
    }
    // kubeadm's and kind's kubelets serve self-signed certificates: the default install reads
    // its own node's kubelet without verifying them (deploy/README.md says why and how to turn
    // verification on).
    assert_eq!(
        effective(c, "--kubelet-insecure-skip-tls-verify").as_deref(),
        Some("true")
    );
    // Of the node, only the pod-resources directory and /sys.
    let host_paths: BTreeSet<&str> = pod_spec(&ds)
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.as_str()))
        .collect();
    assert_eq!(
        host_paths,
        BTreeSet::from(["/var/lib/kubelet/pod-resources", "/sys"])
    );

    // hwloc reads the machine from /sys (and /proc, the container's own).
    assert!(
        effective(c, "--topology-xml").is_none(),
        "the live machine, not an XML file"
    );
    let (mount, volume) = mount_of(&ds, "/sys/devices/system/node");
    assert_eq!(mount.mount_path, "/sys");
    assert_eq!(mount.read_only, Some(true), "/sys mount");
    assert_eq!(volume.host_path.as_ref().map(|h| h.path.as_str()), Some("/sys"));
}

#[test]
fn every_env_var_and_argument_is_a_flag_of_the_binary() {
    let ds = daemonset();
    let c = container(&ds);
    let env = c.env.clone().unwrap_or_default();
    assert_env_is_read("the DaemonSet", "numaplane-exporter run", &env, run_flags());
    let field = |name: &str| env_field(c, name);
    assert_eq!(flag("--node-name").env.as_deref(), Some("NODE_NAME"));
    assert_eq!(field("NODE_NAME").as_deref(), Some("spec.nodeName"));
    assert_eq!(flag("--pod-name").env.as_deref(), Some("POD_NAME"));
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"));

    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"), "args {args:?}");
    assert_args_are_flags(
        "the DaemonSet",
        "numaplane-exporter run",
        args.get(1..).unwrap_or_default(),
        run_flags(),
    );
    for off in ["--once", "--dry-run", "--topology-xml", "--kubeconfig"] {
        assert!(
            arg_value(c, off).is_none() && !args.iter().any(|a| a == off),
            "{off} in a DaemonSet"
        );
        if let Some(env) = &flag(off).env {
            assert!(env_value(c, env).is_none(), "{env} in a DaemonSet");
        }
    }
    assert_eq!(
        c.image.as_deref(),
        Some(format!("ghcr.io/numaplane/numaplane:{}", env!("CARGO_PKG_VERSION")).as_str()),
        "image tag = workspace version"
    );
}

#[test]
fn probes_and_scraping_use_the_metrics_port() {
    let ds = daemonset();
    let c = container(&ds);
    let port = metrics_port(c);
    let named = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(
        named.container_port, port,
        "the metrics port is the --listen port"
    );
    let resolves = |p: &IntOrString| match p {
        IntOrString::Int(n) => *n == port,
        IntOrString::String(s) => s == "metrics",
    };
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("no httpGet probe for {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert!(resolves(&get.port), "probe {path} on {:?}", get.port);
        assert!(get.scheme.as_deref().is_none_or(|s| s == "HTTP"));
    }

    let meta = ds.spec.template.metadata.as_ref().unwrap();
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("prometheus.io/port"), Some(&port.to_string()));
    assert_eq!(
        annotations.get("prometheus.io/path").map(String::as_str),
        Some("/metrics")
    );
    assert_eq!(
        annotations.get("prometheus.io/scrape").map(String::as_str),
        Some("true")
    );

    let svc: Service = object("Service");
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
    let labels = meta.labels.clone().unwrap_or_default();
    for (k, v) in spec.selector.clone().unwrap_or_default() {
        assert_eq!(labels.get(&k), Some(&v), "Service selector {k}={v}");
    }
    let svc_port = &spec.ports.unwrap()[0];
    assert!(resolves(svc_port.target_port.as_ref().unwrap()));
}

#[test]
fn daemonset_runs_everywhere_locked_down() {
    let ds = daemonset();
    let spec = &ds.spec;
    let template_labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
    for (k, v) in spec.selector.match_labels.clone().unwrap() {
        assert_eq!(template_labels.get(&k), Some(&v), "selector {k}={v}");
    }
    let pod = pod_spec(&ds);
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "tolerate every taint"
    );
    assert!(!pod.host_network.unwrap_or(false) && !pod.host_pid.unwrap_or(false));

    let sa: ServiceAccount = object("ServiceAccount");
    let ns: Namespace = serde_json::from_value(documents("namespace.yaml")[0].clone()).unwrap();
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!(sa.metadata.namespace, ns.metadata.name);
    assert_eq!(ds.metadata.namespace, ns.metadata.name);

    let c = container(&ds);
    let sc = c.security_context.as_ref().expect("container securityContext");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert!(!sc.privileged.unwrap_or(false), "privileged");
    assert_eq!(sc.run_as_user, Some(0), "the pod-resources socket is root's");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.clone().unwrap_or_default(), ["ALL"]);
    assert!(caps.add.clone().unwrap_or_default().is_empty());

    let res = c.resources.as_ref().unwrap();
    let q = |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
             k: &str| { m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone()) };
    assert_eq!(q(&res.requests, "cpu").as_deref(), Some("10m"));
    assert_eq!(q(&res.requests, "memory").as_deref(), Some("32Mi"));
    assert_eq!(q(&res.limits, "memory").as_deref(), Some("64Mi"));
    assert_eq!(
        q(&res.limits, "cpu"),
        None,
        "no CPU limit: throttling delays scans"
    );
}

/// (group, resource, verb) triples a ClusterRole grants.
fn granted(role: &ClusterRole) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(rule.non_resource_urls.is_none(), "nonResourceURLs in {rule:?}");
        assert!(rule.resource_names.is_none(), "resourceNames in {rule:?}");
        let words = rule.api_groups.iter().flatten();
        for v in words.chain(rule.resources.iter().flatten()).chain(&rule.verbs) {
            assert!(!v.contains('*'), "wildcard {v:?} in {rule:?}");
        }
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn expected_grants() -> BTreeSet<(String, String, String)> {
    GRANTS
        .iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn cluster_role_grants_exactly_what_the_exporter_needs() {
    let role: ClusterRole = object("ClusterRole");
    assert_eq!(granted(&role), expected_grants());

    let binding: ClusterRoleBinding = object("ClusterRoleBinding");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let sa: ServiceAccount = object("ServiceAccount");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);

    // The NRT rule names the CRD this repository installs.
    let crd = documents("crd.yaml")
        .into_iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .unwrap();
    let want = (
        crd["spec"]["group"].as_str().unwrap().to_owned(),
        crd["spec"]["names"]["plural"].as_str().unwrap().to_owned(),
        "patch".to_owned(),
    );
    assert!(granted(&role).contains(&want), "{want:?}");
    assert_eq!(crd["spec"]["scope"], "Cluster");
}

#[test]
fn kustomization_lists_every_manifest() {
    let docs = documents("kustomization.yaml");
    assert_eq!(docs.len(), 1);
    let listed: BTreeSet<String> = docs[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| (n.ends_with(".yaml") || n.ends_with(".yml")) && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
    // Every document of every listed file is a Kubernetes object.
    for file in &listed {
        for d in documents(file) {
            assert!(
                d["apiVersion"].is_string() && d["kind"].is_string() && d["metadata"]["name"].is_string(),
                "{file}: not a Kubernetes object: {d}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What a running agent asks the API server for
// ---------------------------------------------------------------------------------------------

/// The RBAC attributes of a request: (group, resource, verb), or `None` for discovery
/// (non-resource URLs every authenticated user may GET through `system:discovery`).
fn rbac_attributes(r: &RecordedRequest) -> Option<(String, String, String)> {
    numaplane_e2e::rbac::attributes(r)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|a| a.triple())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the agent against the fake API server through everything it does against an API
/// server: discovery, pod list/watch, Node lookup, apply, own-object watch, Events (created,
/// then patched when repeated); every request must be granted by the ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_role_allows_every_request_of_a_running_agent() {
    const NODE: &str = "rbac-node";
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let allocatable = AllocatableResourcesResponse {
        // CPU 97 is not on the machine: an AccountingAnomaly Event.
        cpu_ids: vec![1, 2, 3, 97],
        ..AllocatableResourcesResponse::default()
    };
    let pods = vec![PodResources {
        name: "p".into(),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "c".into(),
            cpu_ids: vec![2],
            ..ContainerResources::default()
        }],
        ..PodResources::default()
    }];
    let kubelet = FakeKubelet::start(&socket, allocatable, pods, FakeKubeletOptions::default())
        .await
        .unwrap();
    // The kubelet is down at start-up: a ScanFailed Event.
    kubelet.fail_next(Method::List, 1, tonic::Code::Unavailable, "kubelet restarting");

    let api = FakeApiServer::start().await.unwrap();
    api.install_nrt_crd();
    api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    api.put(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {"phase": "Running"},
    }));
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    // The node's kubelet HTTPS API, for /configz.
    let kubelet_api = FakeKubeletHttps::start(Answer::Config(
        json!({"topologyManagerPolicy": "single-numa-node", "cpuManagerPolicy": "static"}),
    ))
    .await
    .unwrap();

    // The DaemonSet's environment, with test values where the cluster's would not work here.
    let ds = daemonset();
    let c = container(&ds);
    let log = dir.path().join("exporter.log");
    let mut cmd = Command::new(exporter_bin());
    cmd.args(c.args.clone().unwrap_or_default())
        .env_clear()
        .env("NODE_NAME", NODE)
        .env("POD_NAME", "numaplane-exporter-rbac")
        .env("NUMAPLANE_PODRESOURCES_SOCKET", &socket)
        .env("NUMAPLANE_LISTEN", "127.0.0.1:0")
        .env(
            "NUMAPLANE_TOPOLOGY_XML",
            workspace().join("topology/tests/fixtures/2numa.xml"),
        )
        .env("KUBECONFIG", &kubeconfig)
        .env("NUMAPLANE_RESYNC_INTERVAL", "1s")
        .env("NUMAPLANE_API_BACKOFF_MIN", "200ms")
        .env("NUMAPLANE_API_BACKOFF_MAX", "1s")
        .env("NODE_ADDRESS", "127.0.0.1")
        .env("NUMAPLANE_KUBELET_PORT", kubelet_api.port().to_string())
        .env("NUMAPLANE_KUBELET_CA_FILE", FakeKubeletHttps::ca_file())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    for e in c.env.iter().flatten() {
        // Values meant for a node (kubelet paths, the port) stay out; the rest applies.
        if let Some(v) = &e.value
            && !matches!(
                e.name.as_str(),
                "NUMAPLANE_PODRESOURCES_SOCKET" | "NUMAPLANE_KUBELET_CONFIG" | "NUMAPLANE_LISTEN"
            )
        {
            cmd.env(&e.name, v);
        }
    }
    let mut agent = Killed(cmd.spawn().unwrap());
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let is = |r: &RecordedRequest, method: &str, needle: &str| r.method == method && r.path.contains(needle);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut injected_again = false;
    loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            panic!("the agent exited ({status}):\n{}", log_text());
        }
        let reqs = api.requests();
        let applied = reqs.iter().any(|r| is(r, "PATCH", "/noderesourcetopologies/"));
        let created = reqs.iter().filter(|r| is(r, "POST", "/events")).count();
        let patched = reqs.iter().any(|r| is(r, "PATCH", "/events/"));
        if applied && created >= 2 && !injected_again {
            // The kubelet fails again: the same ScanFailed Event, now patched.
            kubelet.fail_next(Method::List, 1, tonic::Code::Unavailable, "kubelet restarting");
            injected_again = true;
        }
        if applied && created >= 2 && patched && !kubelet_api.requests().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not apply, create and patch Events in time; requests: {:?}\nlog:\n{}",
            reqs.iter()
                .map(|r| format!("{} {} {}", r.method, r.path, r.status))
                .collect::<Vec<_>>(),
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(agent);
    kubelet.stop().await;

    // The Events carry the Node's UID: `kubectl describe node` selects a node's events by
    // `involvedObject.uid` (the UID, or the name as the kubelet sets it), kind and name.
    let node_uid = api.get("v1", "Node", None, NODE).unwrap()["metadata"]["uid"].clone();
    assert!(node_uid.is_string(), "{node_uid}");
    let events = api.list("events.k8s.io/v1", "Event", Some("default"));
    assert!(events.len() >= 2, "{events:?}");
    for e in &events {
        assert_eq!(e["regarding"]["uid"], node_uid, "{e}");
        assert_eq!(e["regarding"]["kind"], "Node", "{e}");
        assert_eq!(e["regarding"]["name"], NODE, "{e}");
    }

    let grants = expected_grants();
    let role: ClusterRole = object("ClusterRole");
    let role_grants = granted(&role);
    let mut used = BTreeSet::new();
    for r in api.requests() {
        match rbac_attributes(&r) {
            Some(attrs) => {
                assert!(
                    role_grants.contains(&attrs),
                    "{} {}?{} needs {attrs:?}, which the ClusterRole does not grant",
                    r.method,
                    r.path,
                    r.query
                );
                if attrs.1 == "events" {
                    assert!(
                        r.path.starts_with("/apis/events.k8s.io/v1/namespaces/default/"),
                        "{}",
                        r.path
                    );
                }
                used.insert(attrs);
            }
            None => assert_eq!(r.method, "GET", "non-resource {} {}", r.method, r.path),
        }
    }
    // What the kubelet authorized: /configz, by this agent's token.
    for r in kubelet_api.requests() {
        assert_eq!(
            r.bearer_token.as_deref(),
            Some(numaplane_e2e::fake_api::FAKE_TOKEN)
        );
        let attrs = numaplane_e2e::rbac::kubelet_attributes(&r.method, &r.path, NODE).triple();
        assert!(
            role_grants.contains(&attrs),
            "kubelet {} {} needs {attrs:?}, which the ClusterRole does not grant",
            r.method,
            r.path
        );
        used.insert(attrs);
    }
    // Pod list/watch carry this node's field selector.
    for r in api.requests().iter().filter(|r| r.path == "/api/v1/pods") {
        assert_eq!(
            r.query_param("fieldSelector").as_deref(),
            Some(format!("spec.nodeName={NODE}").as_str()),
            "{}?{}",
            r.path,
            r.query
        );
    }
    // `create` is what the API server also checks for the apply that creates the object (the
    // fake records it as a PATCH); everything else must have been exercised.
    let unused: BTreeSet<_> = grants.difference(&used).cloned().collect();
    let allowed_unused: BTreeSet<(String, String, String)> = ["create"]
        .iter()
        .map(|v| {
            (
                "topology.node.k8s.io".to_owned(),
                "noderesourcetopologies".to_owned(),
                (*v).to_owned(),
            )
        })
        .collect();
    assert!(
        unused.is_subset(&allowed_unused),
        "granted but never used by a running agent: {:?}",
        unused.difference(&allowed_unused).collect::<Vec<_>>()
    );
}
