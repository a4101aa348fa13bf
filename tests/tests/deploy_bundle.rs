//! The whole `deploy/` bundle (the base and its optional components in every combination,
//! rendered by `kubectl kustomize`) against the binaries it deploys:
//!
//! - every object has what the API server requires, in the namespace the bundle creates, and
//!   parses as its typed Kubernetes object; workloads have images, named ports, HTTP probes on
//!   the serving port, resources, a ServiceAccount with bindings, volumes for every mount;
//!   Services, the PodDisruptionBudget and the ServiceMonitors select what they should;
//! - every flag and environment variable a container uses is one its binary's `--help` lists,
//!   and the ports, config file, Lease name and extender URL agree with what the binary does;
//! - each ServiceAccount's rules grant exactly the requests its binary makes: the exporter with
//!   its device plugin (a cluster-shared pool), the scheduler (`run`, leader election, a pod
//!   bound and one that fits nowhere) and the extender (`filter` and `bind`) run against the
//!   fake API server, each with its own token, and the requests recorded per token are held
//!   against the rendered RBAC: every one allowed, every grant used;
//! - each scheduler Deployment's rolling update, simulated (`numaplane_e2e::rollout`) from old
//!   leader and new follower to the end, on one node and on three.
//!
//! With `NUMAPLANE_E2E_KUBECONFIG` the same flows run against a real cluster where the bundle
//! is installed with both components (`deploy/allocator`, `deploy/extender`) and the
//! `numaplane-scheduler` and `numaplane-scheduler-extender` Deployments are scaled to 0 (the
//! test's replicas take their Leases and their pods), and whose test user may impersonate
//! ServiceAccounts: each binary then runs as its ServiceAccount, so any request its rules do not
//! allow fails the flow. That the rules grant nothing unused is checked on the fake only (a real
//! server records nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{ListParams, PostParams};
use numaplane::allocation::ANNOTATION;
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::binaries::{Flag, assert_args_are_flags, assert_env_is_read};
use numaplane_e2e::fake_device_kubelet::FakeDeviceKubelet;
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, Method};
use numaplane_e2e::fake_kubelet_https::{Answer, FakeKubeletHttps};
use numaplane_e2e::harness::{ApiTarget, free_port, http_get, http_post, recorded_hint, unique_name};
use numaplane_e2e::rbac;
use numaplane_e2e::render::{self, env_field, env_value};
use numaplane_e2e::rollout::{self, Readiness, Snapshot};
use serde_json::{Value, json};

const NAMESPACE: &str = "numaplane-system";
const WAIT: Duration = Duration::from_secs(90);
const GPU: &str = "example.com/gpu";
const LICENSE: &str = "example.com/license";

// ---------------------------------------------------------------------------------------------
// The bundle
// ---------------------------------------------------------------------------------------------

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy() -> PathBuf {
    workspace().join("deploy")
}

const COMPONENTS: [&str; 4] = ["allocator", "extender", "kubelet-state", "servicemonitor"];

/// The base with `components` (in an overlay), by `kubectl kustomize`; rendered once a run.
fn render(components: &[&str]) -> Vec<Value> {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<Vec<String>, Vec<Value>>>> = OnceLock::new();
    // Held while rendering, so that tests running at once render each set once; a panic while
    // rendering leaves nothing cached.
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key: Vec<String> = components.iter().map(|c| (*c).to_owned()).collect();
    cache
        .entry(key)
        .or_insert_with(|| {
            let dirs: Vec<PathBuf> = components.iter().map(|c| deploy().join(c)).collect();
            render::kustomize(&deploy(), &dirs)
                .unwrap_or_else(|e| panic!("rendering deploy/ with {components:?}: {e}"))
        })
        .clone()
}

fn full() -> &'static [Value] {
    static FULL: OnceLock<Vec<Value>> = OnceLock::new();
    FULL.get_or_init(|| render(&COMPONENTS))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn typed<T: serde::de::DeserializeOwned>(o: &Value) -> T {
    serde_json::from_value(o.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", o["kind"], o["metadata"]["name"]))
}

/// (kind, name) → the pod template of every workload.
fn workloads(objects: &[Value]) -> Vec<(String, String, Value)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
                o["spec"]["template"].clone(),
            )
        })
        .collect()
}

fn pod_spec(template: &Value) -> PodSpec {
    serde_json::from_value(template["spec"].clone()).unwrap()
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

// ---------------------------------------------------------------------------------------------
// The binaries' command lines
// ---------------------------------------------------------------------------------------------

/// Options by long name.
type Flags = BTreeMap<String, Flag>;

/// The options of `binary subcommand` (see [`numaplane_e2e::binaries::help_flags`]), cached.
fn help_flags(binary: &str, subcommand: &str) -> Flags {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<(String, String), Flags>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (binary.to_owned(), subcommand.to_owned());
    if let Some(f) = cache.lock().unwrap().get(&key) {
        return f.clone();
    }
    let path = match binary {
        "numaplane-exporter" => numaplane_e2e::binaries::exporter(),
        "numaplane-scheduler" => numaplane_e2e::binaries::scheduler(),
        other => panic!("unknown binary {other}"),
    };
    let flags = numaplane_e2e::binaries::help_flags(path, subcommand);
    cache.lock().unwrap().insert(key, flags.clone());
    flags
}

/// The binary a container runs: its command, else the image's entrypoint (the exporter).
fn binary_of(c: &Container) -> String {
    match c.command.as_ref().and_then(|c| c.first()) {
        Some(cmd) => Path::new(cmd).file_name().unwrap().to_string_lossy().into_owned(),
        None => "numaplane-exporter".to_owned(),
    }
}

/// What the container uses for `flag`: its argument, its variable, else the binary's default.
fn effective(c: &Container, flag: &str) -> Option<String> {
    let flags = help_flags(&binary_of(c), &c.args.as_ref().unwrap()[0]);
    let f = flags.get(flag).unwrap_or_else(|| panic!("no flag {flag}"));
    render::effective(c, flag, f)
}

fn containers(objects: &[Value]) -> Vec<(String, Container, PodSpec)> {
    workloads(objects)
        .into_iter()
        .flat_map(|(kind, name, template)| {
            let spec = pod_spec(&template);
            spec.containers
                .clone()
                .into_iter()
                .map(move |c| (format!("{kind} {name}"), c, spec.clone()))
        })
        .collect()
}

/// The text of the file a container reads at `path` from a ConfigMap volume.
fn config_file(objects: &[Value], c: &Container, spec: &PodSpec, path: &str) -> String {
    let (mount, volume) = render::mount_of(c, spec, path);
    let cm_name = &volume
        .config_map
        .as_ref()
        .unwrap_or_else(|| panic!("{path} is not from a ConfigMap"))
        .name;
    let cm: ConfigMap = typed(find(objects, "ConfigMap", cm_name));
    let key = Path::new(path).strip_prefix(&mount.mount_path).unwrap();
    cm.data
        .unwrap_or_default()
        .get(key.to_str().unwrap())
        .cloned()
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {}", key.display()))
}

// ---------------------------------------------------------------------------------------------
// Static checks
// ---------------------------------------------------------------------------------------------

#[test]
fn base_and_every_component_render_and_every_object_is_complete() {
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    ];
    // Every subset of the components, in order.
    let sets = (0..1 << COMPONENTS.len()).map(|bits: u32| {
        COMPONENTS
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, c)| *c)
            .collect::<Vec<_>>()
    });
    for set in sets {
        let objects = render(&set);
        for c in &set {
            // What a component adds or patches is there.
            let (kind, name) = match *c {
                "allocator" => ("ConfigMap", "numaplane-pools"),
                "extender" => ("DaemonSet", "numaplane-scheduler-extender"),
                "kubelet-state" => ("DaemonSet", "numaplane-exporter"),
                _ => ("ServiceMonitor", "numaplane-scheduler"),
            };
            let o = find(&objects, kind, name);
            if *c == "kubelet-state" {
                let volumes = o["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
                assert!(
                    volumes
                        .iter()
                        .any(|v| v["hostPath"]["path"] == "/var/lib/kubelet"),
                    "{set:?}: kubelet-state mounts the kubelet's directory"
                );
            }
        }
        assert!(
            objects
                .iter()
                .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == NAMESPACE)
        );
        for o in &objects {
            let what = format!("{set:?}: {} {}", o["kind"], o["metadata"]["name"]);
            assert!(o["apiVersion"].is_string() && o["kind"].is_string(), "{what}");
            let name = o["metadata"]["name"].as_str().unwrap();
            assert!(
                !name.is_empty() && name.len() <= 63 && !name.contains(['_', ' ']),
                "{what}: name"
            );
            if cluster_scoped.contains(&o["kind"].as_str().unwrap()) {
                assert!(o["metadata"]["namespace"].is_null(), "{what}: cluster-scoped");
            } else {
                assert_eq!(o["metadata"]["namespace"], NAMESPACE, "{what}");
            }
            if o["kind"] != "CustomResourceDefinition" {
                // The CRD is generated as upstream ships it.
                assert_eq!(
                    o["metadata"]["labels"]["app.kubernetes.io/part-of"], "numaplane",
                    "{what}"
                );
            }
            // Typed parsing enforces the fields the API requires (containers' names, ports…).
            match o["kind"].as_str().unwrap() {
                "Deployment" => drop(typed::<Deployment>(o)),
                "DaemonSet" => drop(typed::<DaemonSet>(o)),
                "Service" => drop(typed::<Service>(o)),
                "ConfigMap" => drop(typed::<ConfigMap>(o)),
                "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(o)),
                "ClusterRole" => drop(typed::<k8s_openapi::api::rbac::v1::ClusterRole>(o)),
                "Role" => drop(typed::<k8s_openapi::api::rbac::v1::Role>(o)),
                "ClusterRoleBinding" => drop(typed::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(o)),
                "RoleBinding" => drop(typed::<k8s_openapi::api::rbac::v1::RoleBinding>(o)),
                "ServiceAccount" => drop(typed::<k8s_openapi::api::core::v1::ServiceAccount>(o)),
                "Namespace" => drop(typed::<k8s_openapi::api::core::v1::Namespace>(o)),
                "CustomResourceDefinition" => drop(typed::<
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
                >(o)),
                "ServiceMonitor" => {
                    assert_eq!(o["apiVersion"], "monitoring.coreos.com/v1", "{what}");
                    assert!(o["spec"]["endpoints"].as_array().is_some_and(|e| !e.is_empty()), "{what}");
                }
                other => panic!("{what}: unexpected kind {other}"),
            }
        }
        check_workloads(&objects);
        check_services(&objects);
    }
}

/// Images, ports, probes, resources, ServiceAccounts and volumes of every workload.
fn check_workloads(objects: &[Value]) {
    for (kind, name, template) in workloads(objects) {
        let what = format!("{kind} {name}");
        let o = find(objects, &kind, &name);
        assert!(
            labels_match(
                &o["spec"]["selector"]["matchLabels"],
                &template["metadata"]["labels"]
            ),
            "{what}: selector"
        );
        let spec = pod_spec(&template);
        let sa = spec.service_account_name.clone().expect("a ServiceAccount");
        find(objects, "ServiceAccount", &sa);
        assert!(
            !rbac::rules_for(objects, NAMESPACE, &sa).unwrap().is_empty(),
            "{what}: ServiceAccount {sa} has no rules"
        );
        assert_eq!(
            spec.security_context
                .as_ref()
                .and_then(|s| s.seccomp_profile.as_ref())
                .map(|p| p.type_.as_str()),
            Some("RuntimeDefault"),
            "{what}"
        );
        for c in &spec.containers {
            let what = format!("{what} container {}", c.name);
            assert_eq!(
                c.image.as_deref(),
                Some(format!("ghcr.io/numaplane/numaplane:{}", env!("CARGO_PKG_VERSION")).as_str()),
                "{what}: image tag = workspace version"
            );
            let ports = c.ports.clone().unwrap_or_default();
            assert!(!ports.is_empty(), "{what}: ports");
            for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
                let get = probe
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .unwrap_or_else(|| panic!("{what}: no {path} probe"));
                assert_eq!(get.path.as_deref(), Some(path), "{what}");
                let k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(port) = &get.port
                else {
                    panic!("{what}: probe on a port number; name it")
                };
                assert!(
                    ports.iter().any(|p| p.name.as_deref() == Some(port.as_str())),
                    "{what}: probe port {port}"
                );
            }
            let res = c
                .resources
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: resources"));
            let requests = res.requests.clone().unwrap_or_default();
            assert!(
                requests.contains_key("cpu") && requests.contains_key("memory"),
                "{what}: requests"
            );
            assert!(
                res.limits.clone().unwrap_or_default().contains_key("memory"),
                "{what}: memory limit"
            );
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: securityContext"));
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
            assert_eq!(
                sc.capabilities
                    .as_ref()
                    .and_then(|c| c.drop.clone())
                    .unwrap_or_default(),
                ["ALL"],
                "{what}"
            );
            for m in c.volume_mounts.iter().flatten() {
                let v = spec
                    .volumes
                    .iter()
                    .flatten()
                    .find(|v| v.name == m.name)
                    .unwrap_or_else(|| panic!("{what}: no volume {}", m.name));
                if let Some(cm) = &v.config_map {
                    find(objects, "ConfigMap", &cm.name);
                }
            }
        }
    }
}

/// Every Service selects a workload and targets one of its named ports; every ServiceMonitor
/// selects Services with its port; the PodDisruptionBudget selects the scheduler.
fn check_services(objects: &[Value]) {
    let loads = workloads(objects);
    for s in objects.iter().filter(|o| o["kind"] == "Service") {
        let svc: Service = typed(s);
        let spec = svc.spec.unwrap();
        let selector = serde_json::to_value(spec.selector.clone().unwrap()).unwrap();
        let selected: Vec<_> = loads
            .iter()
            .filter(|(_, _, t)| labels_match(&selector, &t["metadata"]["labels"]))
            .collect();
        assert_eq!(
            selected.len(),
            1,
            "Service {} selects {selected:?}",
            s["metadata"]["name"]
        );
        let pod = pod_spec(&selected[0].2);
        for p in spec.ports.unwrap() {
            let k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(target) =
                p.target_port.unwrap()
            else {
                panic!("Service {}: name the target port", s["metadata"]["name"])
            };
            let port = pod
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| cp.name.as_deref() == Some(target.as_str()))
                .unwrap_or_else(|| panic!("Service {}: no container port {target}", s["metadata"]["name"]));
            assert_eq!(
                p.port, port.container_port,
                "Service {}: same port number",
                s["metadata"]["name"]
            );
            assert_eq!(p.name.as_deref(), Some("metrics"));
        }
    }
    let monitors: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ServiceMonitor").collect();
    if !monitors.is_empty() {
        for s in objects.iter().filter(|o| o["kind"] == "Service") {
            let by = monitors
                .iter()
                .filter(|m| labels_match(&m["spec"]["selector"]["matchLabels"], &s["metadata"]["labels"]))
                .count();
            assert_eq!(
                by, 1,
                "Service {} is scraped by {by} ServiceMonitors",
                s["metadata"]["name"]
            );
        }
        for m in monitors {
            for e in m["spec"]["endpoints"].as_array().unwrap() {
                assert_eq!(e["path"], "/metrics");
                let port = e["port"].as_str().unwrap();
                for s in objects
                    .iter()
                    .filter(|o| o["kind"] == "Service")
                    .filter(|s| labels_match(&m["spec"]["selector"]["matchLabels"], &s["metadata"]["labels"]))
                {
                    assert!(
                        s["spec"]["ports"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| p["name"] == port),
                        "ServiceMonitor {} port {port} on Service {}",
                        m["metadata"]["name"],
                        s["metadata"]["name"]
                    );
                }
            }
        }
    }
    for p in objects.iter().filter(|o| o["kind"] == "PodDisruptionBudget") {
        let selected: Vec<_> = loads
            .iter()
            .filter(|(_, _, t)| labels_match(&p["spec"]["selector"]["matchLabels"], &t["metadata"]["labels"]))
            .collect();
        assert_eq!(selected.len(), 1, "PDB {}", p["metadata"]["name"]);
        let d = find(objects, &selected[0].0, &selected[0].1);
        let replicas = d["spec"]["replicas"].as_i64().unwrap();
        let min = p["spec"]["minAvailable"].as_i64().unwrap();
        assert!(
            0 < min && min < replicas,
            "PDB {}: a drain must be possible",
            p["metadata"]["name"]
        );
    }
}

#[test]
fn every_flag_and_environment_variable_is_one_the_binary_reads() {
    for (what, c, _) in containers(full()) {
        let binary = binary_of(&c);
        let args = c.args.clone().unwrap_or_default();
        let sub = args.first().unwrap_or_else(|| panic!("{what}: no subcommand"));
        let flags = help_flags(&binary, sub);
        let command = format!("{binary} {sub}");
        let env = c.env.clone().unwrap_or_default();
        assert_env_is_read(&what, &command, &env, &flags);
        assert_args_are_flags(&what, &command, args.get(1..).unwrap_or_default(), &flags);
        for off in [
            "--kubeconfig",
            "--topology-xml",
            "--once",
            "--dry-run",
            "--leader-elect",
        ] {
            // The extender turns election off on purpose (one per kube-scheduler, loopback).
            if off == "--leader-elect" && what.contains("numaplane-scheduler-extender") {
                continue;
            }
            if let Some(f) = flags.get(off) {
                assert!(!args.iter().any(|a| a.starts_with(off)), "{what}: {off}");
                if let Some(env) = &f.env {
                    assert!(env_value(&c, env).is_none(), "{what}: {env}");
                }
            }
        }
        // The serving port is the container port the probes and the Service use.
        // The extender's verbs stay on loopback; its probes and metrics have their own address.
        // Both binaries call it `--listen`; only the scheduler has a separate metrics address.
        let listen_flag = if binary != "numaplane-exporter" && effective(&c, "--metrics-listen").is_some() {
            "--metrics-listen"
        } else {
            "--listen"
        };
        let addr: SocketAddr = effective(&c, listen_flag).unwrap().parse().unwrap();
        let named = c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .unwrap_or_else(|| panic!("{what}: no port named metrics"));
        assert_eq!(named.container_port, i32::from(addr.port()), "{what}");
        assert!(addr.ip().is_unspecified(), "{what}: listen on every address");
    }
}

#[test]
fn scheduler_config_and_leases_agree_with_the_roles() {
    let objects = full();
    // The extender runs without a Lease: see extender_runs_next_to_kube_scheduler_on_loopback.
    {
        let name = "numaplane-scheduler";
        let d: Deployment = typed(find(objects, "Deployment", name));
        let spec = d.spec;
        assert_eq!(spec.replicas, Some(2), "{name}");
        let pod = spec.template.spec.unwrap();
        // Preferred, not required: two replicas must also run on a one-node cluster.
        let anti = pod
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.clone())
            .unwrap_or_else(|| panic!("{name}: preferred anti-affinity"));
        assert!(
            pod.affinity
                .as_ref()
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
                .is_none(),
            "{name}: required anti-affinity leaves the second replica Pending on one node"
        );
        let anti = [anti[0].pod_affinity_term.clone()];
        assert_eq!(anti[0].topology_key, "kubernetes.io/hostname");
        let own =
            serde_json::to_value(anti[0].label_selector.as_ref().unwrap().match_labels.clone()).unwrap();
        assert!(labels_match(
            &own,
            &serde_json::to_value(spec.template.metadata.unwrap().labels).unwrap()
        ));
        let c = &pod.containers[0];
        assert_eq!(binary_of(c), "numaplane-scheduler");
        // The configuration file parses and resolves as the binary does.
        let path = effective(c, "--config").unwrap_or_else(|| panic!("{name}: no config file"));
        let text = config_file(objects, c, &pod, &path);
        let file: numaplane_scheduler::config_file::FileConfig =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{name}: {path}: {e}"));
        let lease_in_file = file.leader_election.resource_name.clone();
        let cfg = serve_args(c)
            .merge(file)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cfg.scheduler_names, ["numaplane-scheduler"]);
        let le = cfg
            .leader_election
            .unwrap_or_else(|| panic!("{name}: leader election off"));
        let lease = effective(c, "--leader-elect-resource-name")
            .or(lease_in_file)
            .unwrap_or_else(|| "numaplane-scheduler".into());
        assert_eq!(le.name, lease);
        assert_eq!(lease, name, "{name}: each its own Lease");
        assert_eq!(
            env_field(c, "NUMAPLANE_LEADER_ELECT_RESOURCE_NAMESPACE").as_deref(),
            Some("metadata.namespace")
        );
        assert_eq!(
            env_field(c, "NUMAPLANE_LEADER_ELECT_IDENTITY").as_deref(),
            Some("metadata.name")
        );
        // The Role allows that Lease in the pod's namespace, and no other by name.
        let rules =
            rbac::rules_for(objects, NAMESPACE, pod.service_account_name.as_deref().unwrap()).unwrap();
        let at = |verb: &str, lease: Option<&str>| rbac::Attributes {
            group: "coordination.k8s.io".into(),
            resource: "leases".into(),
            verb: verb.into(),
            namespace: Some(NAMESPACE.into()),
            name: lease.map(str::to_owned),
        };
        assert!(rbac::allowed(&rules, &at("create", None)), "{name}");
        assert!(rbac::allowed(&rules, &at("patch", Some(&lease))), "{name}");
        assert!(
            !rbac::allowed(&rules, &at("patch", Some("kube-scheduler"))),
            "{name}"
        );
        let mut elsewhere = at("create", None);
        elsewhere.namespace = Some("kube-system".into());
        assert!(!rbac::allowed(&rules, &elsewhere), "{name}");
    }
}

/// `ServeArgs` as the container's environment sets them (the flags merge tests need).
fn serve_args(c: &Container) -> numaplane_scheduler::live::daemon_config::ServeArgs {
    numaplane_scheduler::live::daemon_config::ServeArgs {
        config: None,
        kubeconfig: None,
        scheduler_names: Vec::new(),
        kube_api_qps: None,
        kube_api_burst: None,
        event_qps: None,
        event_burst: None,
        listen: env_value(c, "NUMAPLANE_LISTEN").map(|l| l.parse().unwrap()),
        metrics_listen: env_value(c, "NUMAPLANE_METRICS_LISTEN").map(|l| l.parse().unwrap()),
        leader_elect: env_value(c, "NUMAPLANE_LEADER_ELECT").map(|v| v.parse().unwrap()),
        leader_elect_resource_name: env_value(c, "NUMAPLANE_LEADER_ELECT_RESOURCE_NAME"),
        leader_elect_resource_namespace: Some(NAMESPACE.into()),
        leader_elect_identity: Some("pod".into()),
        leader_elect_lease_duration: None,
        leader_elect_renew_before: None,
        pod_initial_backoff: None,
        pod_max_backoff: None,
        assume_timeout: None,
        bind_concurrency: None,
        dra_numa_alignment: None,
        unknown_kubelet_options: None,
        dra_binding_timeout: None,
    }
}

#[test]
fn extender_runs_next_to_kube_scheduler_on_loopback() {
    let objects = render(&["extender"]);
    let cm: ConfigMap = typed(find(&objects, "ConfigMap", "numaplane-kube-scheduler-config"));
    let text = &cm.data.unwrap()["kube-scheduler-config.yaml"];
    let ksc: Value = serde_saphyr::from_str(text).unwrap();
    assert_eq!(ksc["apiVersion"], "kubescheduler.config.k8s.io/v1");
    assert_eq!(ksc["kind"], "KubeSchedulerConfiguration");
    let extenders = ksc["extenders"].as_array().unwrap();
    assert_eq!(extenders.len(), 1);
    let e = &extenders[0];
    // The wire format of docs/extender.md: verbs are the last path segment.
    assert_eq!(e["filterVerb"], "filter");
    assert_eq!(e["prioritizeVerb"], "prioritize");
    assert_eq!(e["bindVerb"], "bind");
    assert_eq!(e["preemptVerb"], "preempt");
    assert_eq!(e["nodeCacheCapable"], true);
    // kube-scheduler goes on without it while it is down (docs/extender.md, failure modes).
    assert_eq!(e["ignorable"], true);
    assert_eq!(e["enableHTTPS"], false);
    assert!(e["weight"].as_i64().is_some_and(|w| w > 0));

    // A hostNetwork kube-scheduler has the node's resolver: no Service name, loopback only.
    let ds: DaemonSet = typed(find(&objects, "DaemonSet", "numaplane-scheduler-extender"));
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    let selector = pod.node_selector.clone().unwrap_or_default();
    assert!(
        selector.contains_key("node-role.kubernetes.io/control-plane"),
        "where kube-scheduler runs: {selector:?}"
    );
    assert!(
        pod.tolerations.iter().flatten().any(|t| t.key.as_deref()
            == Some("node-role.kubernetes.io/control-plane")
            && t.effect.as_deref() == Some("NoSchedule")),
        "control-plane nodes are tainted"
    );
    let c = &pod.containers[0];
    assert_eq!(c.args.as_deref(), Some(&["extender".to_owned()][..]));
    let verbs: SocketAddr = effective(c, "--listen").unwrap().parse().unwrap();
    assert!(verbs.ip().is_loopback(), "verbs only for this node: {verbs}");
    let url = e["urlPrefix"].as_str().unwrap();
    assert_eq!(url, format!("http://127.0.0.1:{}", verbs.port()));
    // Each kube-scheduler asks its own node's extender: no Lease, every instance serves.
    assert_eq!(effective(c, "--leader-elect").as_deref(), Some("false"));
    let cfg = serve_args(c).merge(Default::default()).unwrap();
    assert!(cfg.leader_election.is_none());
    // Not kube-scheduler's own ports (10259 secure, 10251 old insecure) on the shared host network.
    let metrics: SocketAddr = effective(c, "--metrics-listen").unwrap().parse().unwrap();
    for port in [verbs.port(), metrics.port()] {
        assert!(![10251, 10259, 10250, 10257].contains(&port), "{port}");
    }
    assert_ne!(verbs.port(), metrics.port());
}

/// Kubernetes' `IsInterested` of an HTTP extender (pkg/scheduler/extender.go): no
/// managedResources means every pod; otherwise a pod whose containers or init containers
/// request or limit one of them.
fn extender_is_interested(managed: &[&str], pod: &Value) -> bool {
    if managed.is_empty() {
        return true;
    }
    let spec = &pod["spec"];
    ["containers", "initContainers"].iter().any(|list| {
        spec[list].as_array().into_iter().flatten().any(|c| {
            ["requests", "limits"].iter().any(|kind| {
                c["resources"][kind]
                    .as_object()
                    .is_some_and(|m| m.keys().any(|k| managed.contains(&k.as_str())))
            })
        })
    })
}

#[test]
fn shipped_extender_config_is_consulted_for_every_pod_and_may_be_skipped() {
    let objects = render(&["extender"]);
    let cm: ConfigMap = typed(find(&objects, "ConfigMap", "numaplane-kube-scheduler-config"));
    let ksc: Value = serde_saphyr::from_str(&cm.data.unwrap()["kube-scheduler-config.yaml"]).unwrap();
    let e = &ksc["extenders"][0];
    // kube-scheduler refuses native resources (cpu, hugepages) in managedResources, so a
    // CPU-only Guaranteed pod reaches the extender only when none are listed.
    assert!(e.get("managedResources").is_none(), "{e}");
    let pod = |resources: Value| json!({"spec": {"containers": [{"name": "c", "resources": resources}]}});
    // The telco case that went unchecked to a TopologyAffinityError: Guaranteed, 3 CPUs, no device.
    let cpu_only =
        pod(json!({"requests": {"cpu": "3", "memory": "1Gi"}, "limits": {"cpu": "3", "memory": "1Gi"}}));
    let hugepages = pod(json!({"limits": {"hugepages-1Gi": "2Gi", "memory": "1Gi"}}));
    let gpu = pod(json!({"limits": {"example.com/gpu": "1"}}));
    for p in [&cpu_only, &hugepages, &gpu] {
        assert!(extender_is_interested(&[], p), "{p}");
    }
    // Its own pod is sent to it too: kube-scheduler must be able to go on without it (a
    // DaemonSet pod is scheduled by kube-scheduler), so the extender is ignorable.
    let ds = find(&objects, "DaemonSet", "numaplane-scheduler-extender");
    let own = json!({"spec": ds["spec"]["template"]["spec"].clone()});
    assert!(extender_is_interested(&[], &own));
    assert_eq!(e["ignorable"], true);
    // The variant for clusters that align only devices (docs/extender.md): the extender's own
    // pod is not sent then, nor is the CPU-only pod.
    assert!(!extender_is_interested(&["example.com/gpu"], &own));
    assert!(!extender_is_interested(&["example.com/gpu"], &cpu_only));
    assert!(extender_is_interested(&["example.com/gpu"], &gpu));
}

#[test]
fn service_monitors_tell_the_scheduler_from_the_extender() {
    let objects = render(&["extender", "servicemonitor"]);
    for (monitor, service) in [
        ("numaplane-scheduler", "numaplane-scheduler"),
        ("numaplane-scheduler-extender", "numaplane-scheduler-extender"),
    ] {
        let m = find(&objects, "ServiceMonitor", monitor);
        let selected: Vec<&str> = objects
            .iter()
            .filter(|o| {
                o["kind"] == "Service"
                    && labels_match(&m["spec"]["selector"]["matchLabels"], &o["metadata"]["labels"])
            })
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(selected, [service], "ServiceMonitor {monitor}");
    }
}

#[test]
fn allocator_component_mounts_the_plugin_directory_and_a_valid_pools_file() {
    let base = render(&[]);
    let objects = render(&["allocator"]);
    let ds_of = |objects: &[Value]| -> (Container, PodSpec) {
        let ds: DaemonSet = typed(find(objects, "DaemonSet", "numaplane-exporter"));
        let pod = ds.spec.template.spec.unwrap();
        (pod.containers[0].clone(), pod)
    };
    let (c0, _) = ds_of(&base);
    assert!(
        effective(&c0, "--pools").is_none(),
        "the base runs without the allocator"
    );
    let (c, pod) = ds_of(&objects);
    let dir = effective(&c, "--device-plugin-dir").unwrap();
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == dir)
        .expect("the device-plugin directory itself is mounted");
    assert_ne!(
        mount.read_only,
        Some(true),
        "the plugins create their sockets there"
    );
    let v = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let host = v.host_path.as_ref().unwrap();
    assert_eq!(host.path, "/var/lib/kubelet/device-plugins");
    assert_eq!(host.type_.as_deref(), Some("Directory"));
    let pools = effective(&c, "--pools").unwrap();
    let text = config_file(&objects, &c, &pod, &pools);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    // The shipped pools match the GPUs of a GPU machine (hwloc fixture).
    let machine =
        numaplane_topology::Machine::from_xml_file(&workspace().join("topology/tests/fixtures/gpu-nic.xml"))
            .unwrap();
    let loaded = numaplane_exporter::allocator::pools::load(file.path(), &machine).unwrap();
    assert!(!loaded.is_empty());
}

/// Whether a hostPath of `path` makes `target` on the node visible (`/` and `/var/lib/kubelet`
/// hold `/var/lib/kubelet/pods`; `/var/lib/kubelet/pod-resources` does not).
fn covers(path: &str, target: &str) -> bool {
    Path::new(target).starts_with(Path::new(path))
}

#[test]
fn only_the_kubelet_state_component_exposes_pod_volumes() {
    // Every pod's volumes, secrets included, live under the kubelet's pods directory.
    const POD_VOLUMES: &str = "/var/lib/kubelet/pods";
    assert!(covers("/", POD_VOLUMES) && covers("/var/lib/kubelet", POD_VOLUMES));
    assert!(!covers("/var/lib/kubelet/pod-resources", POD_VOLUMES));
    for mask in 0..1u32 << COMPONENTS.len() {
        let set: Vec<&str> = COMPONENTS
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, c)| *c)
            .collect();
        let objects = render(&set);
        let exposing: Vec<String> = workloads(&objects)
            .into_iter()
            .flat_map(|(kind, name, template)| {
                pod_spec(&template)
                    .volumes
                    .into_iter()
                    .flatten()
                    .filter_map(move |v| {
                        let path = v.host_path?.path;
                        covers(&path, POD_VOLUMES)
                            .then(|| format!("{kind} {name}: volume {} = {path}", v.name))
                    })
            })
            .collect();
        if set.contains(&"kubelet-state") {
            // The documented opt-in: the kubelet's checkpoints need its root directory.
            assert!(
                !exposing.is_empty(),
                "{set:?}: kubelet-state mounts /var/lib/kubelet"
            );
            let ds: DaemonSet = typed(find(&objects, "DaemonSet", "numaplane-exporter"));
            let c = &ds.spec.template.spec.unwrap().containers[0];
            let state = effective(c, "--kubelet-state-dir").unwrap();
            let mount = c
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.mount_path == state)
                .expect("the state directory is a mount");
            assert_eq!(mount.read_only, Some(true), "{set:?}");
        } else {
            assert!(exposing.is_empty(), "{set:?} exposes pod volumes: {exposing:?}");
        }
    }
}

#[test]
fn example_pods_select_numaplane_and_ask_for_aligned_resources() {
    let dir = workspace().join("examples/pods");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut asked = BTreeSet::new();
    let mut names = Vec::new();
    for f in &files {
        for d in render::read_documents(f).unwrap() {
            let pod: Pod = typed(&d);
            let spec = pod.spec.unwrap();
            assert_eq!(
                spec.scheduler_name.as_deref(),
                Some("numaplane-scheduler"),
                "{}",
                f.display()
            );
            for c in &spec.containers {
                let r = c.resources.as_ref().unwrap();
                assert_eq!(r.requests, r.limits, "{}: Guaranteed", f.display());
                let limits = r.limits.clone().unwrap();
                let cpu = &limits["cpu"].0;
                assert!(cpu.parse::<u32>().is_ok(), "{}: whole CPUs ({cpu})", f.display());
                for k in limits.keys() {
                    asked.insert(if k.starts_with("hugepages-") {
                        "hugepages".to_owned()
                    } else if k.contains('/') {
                        "device".to_owned()
                    } else {
                        k.clone()
                    });
                }
            }
            names.push(format!(
                "{}/{}",
                pod.metadata.namespace.unwrap_or_else(|| "default".into()),
                pod.metadata.name.unwrap()
            ));
        }
    }
    assert_eq!(
        asked,
        ["cpu", "device", "hugepages", "memory"].map(str::to_owned).into(),
        "the examples together ask for every aligned resource"
    );
    // Each is placed on the example cluster by the scheduler's model.
    let out = Command::new(numaplane_e2e::binaries::scheduler())
        .args(["simulate", "--cluster"])
        .arg(workspace().join("examples/cluster.yaml"))
        .arg("--pods")
        .args(&files)
        .args(["-o", "json"])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let placed: BTreeMap<String, String> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| Some((r["pod"].as_str()?.to_owned(), r["node"].as_str()?.to_owned())))
        .collect();
    for n in &names {
        assert!(placed.contains_key(n), "{n} is not placed: {report}");
    }
    assert_eq!(report["summary"]["unschedulable"], 0, "{report}");
}

// ---------------------------------------------------------------------------------------------
// Upgrades: a rolling update, simulated (numaplane_e2e::rollout), from old leader and new
// follower to the end
// ---------------------------------------------------------------------------------------------

const ROLLOUT_STEPS: usize = 20;

/// The rollout of Deployment `name` of `objects` to a new template on `nodes` nodes, with the
/// PodDisruptionBudget that selects its pods, if one does.
fn rollout_of(objects: &[Value], name: &str, nodes: usize, readiness: Readiness) -> rollout::Outcome {
    let d = find(objects, "Deployment", name);
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    let pdbs: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "PodDisruptionBudget" && labels_match(&o["spec"]["selector"]["matchLabels"], labels)
        })
        .collect();
    assert!(pdbs.len() <= 1, "{name}: {} PodDisruptionBudgets", pdbs.len());
    rollout::simulate(d, pdbs.first().copied(), nodes, readiness, ROLLOUT_STEPS)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every running replica is Ready (the leader and its followers serve): the rollout of `name`
/// (rendered with `components`) ends with every pod new, never below its PodDisruptionBudget.
fn assert_rollout_finishes(components: &[&str], name: &str, nodes: usize) {
    let o = rollout_of(&render(components), name, nodes, Readiness::Running);
    let trace = o.trace.join("\n");
    assert!(
        o.completed_after.is_some(),
        "{name} on {nodes} node(s): the rollout stops at {}\n{trace}",
        o.last
    );
    assert_eq!(
        o.pdb_breached_after, None,
        "{name} on {nodes} node(s): fewer Ready pods than its PodDisruptionBudget requires\n{trace}"
    );
}

#[test]
fn scheduler_rollout_finishes_on_one_node() {
    assert_rollout_finishes(&[], "numaplane-scheduler", 1);
}

#[test]
fn scheduler_rollout_finishes_on_three_nodes() {
    assert_rollout_finishes(&[], "numaplane-scheduler", 3);
}

/// The extender is a DaemonSet on the host network: its rolling update replaces one node's pod
/// at a time (never two on a node, which would collide on the port), so it cannot wait for a
/// pod that never becomes Ready because of leadership: there is no Lease, and Ready means
/// "caches synced".
#[test]
fn extender_rollout_replaces_one_node_at_a_time_and_never_waits_for_a_lease() {
    let objects = render(&["extender"]);
    let ds: DaemonSet = typed(find(&objects, "DaemonSet", "numaplane-scheduler-extender"));
    let spec = ds.spec;
    let strategy = spec.update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let ru = strategy.rolling_update.unwrap();
    assert_eq!(
        ru.max_surge
            .unwrap_or(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0),
        "a surge pod would collide on the host port"
    );
    assert_eq!(
        ru.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let c = &spec.template.spec.unwrap().containers[0];
    assert_eq!(effective(c, "--leader-elect").as_deref(), Some("false"));
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "PodDisruptionBudget"
                && o["metadata"]["name"] == "numaplane-scheduler-extender"),
        "one pod per control-plane node: a PDB would block draining it"
    );
}

#[test]
fn a_rollout_deadlocks_when_only_the_leader_is_ready_and_nothing_surges() {
    let mut d = find(&render(&[]), "Deployment", "numaplane-scheduler").clone();
    d["spec"]["replicas"] = json!(2);
    d["spec"]["strategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}});
    // Three nodes, so that no anti-affinity holds a pod back.
    let o = rollout::simulate(&d, None, 3, Readiness::LeaderOnly, ROLLOUT_STEPS).unwrap();
    let trace = o.trace.join("\n");
    assert_eq!(o.completed_after, None, "{trace}");
    // The old leader goes only once a new pod is available, and the new follower never is.
    let stuck = Snapshot {
        old_pods: 1,
        old_ready: 1,
        new_pods: 1,
        new_ready: 0,
        pending: 0,
        leader_is_new: Some(false),
    };
    assert_eq!(o.last, stuck, "{trace}");
    // With Ready followers the same rollout ends.
    let o = rollout::simulate(&d, None, 3, Readiness::Running, ROLLOUT_STEPS).unwrap();
    assert!(o.completed_after.is_some(), "{}", o.trace.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// What each running binary asks the API server for
// ---------------------------------------------------------------------------------------------

/// A child process, killed on drop, logging to a file.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn assert_running(&mut self, what: &str) {
        if let Some(s) = self.child.try_wait().unwrap() {
            panic!("{what} exited ({s}):\n{}", self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `binary` with the container's arguments and environment: plain values as written,
/// downward-API values from `fields`, and `replace` over both (node paths, ports, test speed).
fn spawn(
    binary: &Path,
    c: &Container,
    replace: &BTreeMap<&str, String>,
    fields: &BTreeMap<&str, String>,
    dir: &Path,
    name: &str,
) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(binary);
    cmd.args(c.args.clone().unwrap_or_default())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    for e in c.env.iter().flatten() {
        if let Some(v) = replace.get(e.name.as_str()) {
            cmd.env(&e.name, v);
        } else if let Some(v) = &e.value {
            cmd.env(&e.name, v);
        } else {
            let path = &e
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path;
            let v = fields
                .get(path.as_str())
                .unwrap_or_else(|| panic!("{name}: no test value for {path}"));
            cmd.env(&e.name, v);
        }
    }
    for (k, v) in replace {
        cmd.env(k, v);
    }
    Proc {
        child: cmd.spawn().unwrap(),
        log,
    }
}

/// A kubeconfig for `identity` (a ServiceAccount name): on the fake its own token; on a real
/// cluster the test's credentials impersonating the ServiceAccount.
fn kubeconfig_for(target: &ApiTarget, dir: &Path, identity: &str) -> PathBuf {
    match target.fake() {
        Some(fake) => fake.write_kubeconfig_as(dir, identity).unwrap(),
        None => {
            let mut kc = kube::config::Kubeconfig::read_from(target.kubeconfig()).unwrap();
            for a in &mut kc.auth_infos {
                if let Some(info) = a.auth_info.as_mut() {
                    info.impersonate = Some(format!("system:serviceaccount:{NAMESPACE}:{identity}"));
                }
            }
            let path = dir.join(format!("kubeconfig-{identity}"));
            std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
            path
        }
    }
}

fn pod_json(name: &str, scheduler: &str, cpu: &str, gpus: u32) -> Pod {
    let r = json!({"cpu": cpu, "memory": "1Gi", GPU: gpus.to_string()});
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"numaplane.io/e2e": "true"}},
        "spec": {"schedulerName": scheduler, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": r, "limits": r}}]}}))
    .unwrap()
}

async fn until<F, Fut>(what: &str, log: &dyn Fn() -> String, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !f().await {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}\n{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Holds the requests of `identity` against the rules the bundle binds to it: every one
/// allowed, every grant used (but `unused_ok`, each with its reason in deploy/README.md).
fn check_identity(
    target: &ApiTarget,
    identity: &str,
    unused_ok: &[(&str, &str, &str)],
    kubelet: &[rbac::Attributes],
) {
    let Some(fake) = target.fake() else {
        return;
    };
    let rules = rbac::rules_for(full(), NAMESPACE, identity).unwrap();
    let mut used = BTreeSet::new();
    let requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.bearer_token() == Some(identity))
        .collect();
    assert!(!requests.is_empty(), "{identity} made no request");
    for r in &requests {
        let Some(mut attrs) = rbac::attributes(r).unwrap() else {
            assert_eq!(
                r.method, "GET",
                "{identity}: non-resource {} {}",
                r.method, r.path
            );
            continue;
        };
        let mut all = vec![attrs.clone()];
        // An apply that creates the object is authorized as a create too.
        if attrs.verb == "patch" && r.status == 201 {
            attrs.verb = "create".into();
            attrs.name = None;
            all.push(attrs);
        }
        for a in all {
            assert!(
                rbac::allowed(&rules, &a),
                "{identity}: {} {}?{} needs {a:?}, which its rules do not grant",
                r.method,
                r.path,
                r.query
            );
            used.insert(a.triple());
        }
    }
    // What the kubelet authorized (a SubjectAccessReview against the same rules).
    for a in kubelet {
        assert!(
            rbac::allowed(&rules, a),
            "{identity}: the kubelet needs {a:?}, which its rules do not grant"
        );
        used.insert(a.triple());
    }
    let ok: BTreeSet<(String, String, String)> = unused_ok
        .iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect();
    let unused: Vec<_> = rbac::granted(&rules)
        .difference(&used)
        .filter(|t| !ok.contains(*t))
        .cloned()
        .collect();
    assert!(
        unused.is_empty(),
        "{identity}: granted but never used: {unused:?}"
    );
}

fn topo(numa: i64) -> Option<TopologyInfo> {
    Some(TopologyInfo {
        nodes: vec![NumaNode { id: numa }],
    })
}

/// `kubectl apply -k deploy/` with every component, as a user installs it, on the kit's control
/// plane (a cluster of `NUMAPLANE_E2E_KUBECONFIG` has it installed already). The Prometheus
/// Operator is not there: a stand-in for its ServiceMonitor CRD (any spec) lets the
/// servicemonitor component apply.
async fn install_bundle(target: &ApiTarget) {
    let Some(cp) = target.control_plane() else {
        return;
    };
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors", "singular": "servicemonitor"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("servicemonitor-crd.json");
    std::fs::write(&file, crd.to_string()).unwrap();
    cp.kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()])
        .unwrap();
    cp.kubectl(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
    ])
    .unwrap();
    let components: Vec<PathBuf> = COMPONENTS.iter().map(|c| deploy().join(c)).collect();
    let out = render::apply(&deploy(), &components, cp.kubeconfig())
        .unwrap_or_else(|e| panic!("kubectl apply -k deploy/ with {COMPONENTS:?}: {e}"));
    // Every object of the rendered bundle is there (one `kubectl get` of them all).
    let rendered = dir.path().join("bundle.json");
    std::fs::write(
        &rendered,
        json!({"apiVersion": "v1", "kind": "List", "items": full()}).to_string(),
    )
    .unwrap();
    let there = cp
        .kubectl(&["get", "-f", rendered.to_str().unwrap(), "-o", "name"])
        .unwrap_or_else(|e| panic!("the bundle is not all there after apply: {e}\n{out}"));
    assert_eq!(there.lines().count(), full().len(), "{there}");
}

/// The bundle on a real API server: each ServiceAccount is allowed, as the server itself
/// answers `kubectl auth can-i --list` for it, exactly what the bundle's rules grant, which
/// [`each_service_account_grants_exactly_what_its_binary_requests`] holds against what the
/// binaries request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_account_can_exactly_what_its_rules_grant_on_a_real_server() {
    let Some(cluster) = numaplane_e2e::control_plane::require(
        "deploy/'s RBAC checked as each ServiceAccount on a real kube-apiserver",
        &Default::default(),
    ) else {
        return;
    };
    let target = ApiTarget::on(cluster).await.unwrap();
    install_bundle(&target).await;
    let accounts: Vec<&str> = full()
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(accounts.len() >= 3, "{accounts:?}");
    for sa in accounts {
        let rules = rbac::rules_for(full(), NAMESPACE, sa).unwrap();
        let table = numaplane_e2e::control_plane::kubectl(
            target.kubeconfig(),
            &[
                "auth",
                "can-i",
                "--list",
                &format!("--as=system:serviceaccount:{NAMESPACE}:{sa}"),
                "--namespace",
                NAMESPACE,
            ],
        )
        .unwrap();
        let server = rbac::parse_can_i_list(&table).unwrap();
        let bundle = rbac::grants_in(&rules, NAMESPACE);
        assert!(!bundle.is_empty(), "{sa}: the bundle grants nothing");
        assert_eq!(
            server, bundle,
            "{sa}: what the server allows (left) differs from the bundle's rules (right)\n{table}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_account_grants_exactly_what_its_binary_requests() {
    let target = ApiTarget::start().await.unwrap();
    install_bundle(&target).await;
    let client = target.client();
    let dir = tempfile::tempdir().unwrap();
    let ns = unique_name("np-rbac");
    let node = unique_name("np-rbac-node");
    target.create_namespace(&ns).await.unwrap();
    // The kubelet's part of the eviction below, where there is no kubelet.
    let _terminator = target.finish_deletions(&ns);
    if let Some(fake) = target.fake() {
        // Where the bundle puts the Leases.
        fake.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}));
    }
    let allocatable = json!({"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "4", LICENSE: "2"});
    target
        .create_labelled_node(&node, &[], Some(allocatable))
        .await
        .unwrap();
    let objects = full();
    let container_of = |kind: &str, name: &str| -> (Container, PodSpec) {
        let t = &find(objects, kind, name)["spec"]["template"];
        let spec = pod_spec(t);
        (spec.containers[0].clone(), spec)
    };

    // The exporter with its device plugin: 4 GPUs and a license shared cluster-wide.
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir(&plugins).unwrap();
    let dp = FakeDeviceKubelet::start(&plugins).await.unwrap();
    let gpus: Vec<(String, i64)> = (0..4).map(|i| (format!("g{i}"), i / 2)).collect();
    let podres_socket = dir.path().join("podres.sock");
    let podres = FakeKubelet::start(
        &podres_socket,
        AllocatableResourcesResponse {
            cpu_ids: (0..32).collect(),
            devices: gpus
                .iter()
                .map(|(id, numa)| ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: vec![id.clone()],
                    topology: topo(*numa),
                })
                .collect(),
            memory: vec![],
        },
        vec![],
        FakeKubeletOptions::default(),
    )
    .await
    .unwrap();
    // The kubelet is down at start-up, and once more later: a ScanFailed Event, then patched.
    podres.fail_next(Method::List, 1, tonic::Code::Unavailable, "kubelet restarting");
    let pools = dir.path().join("pools.yaml");
    let devices: Vec<_> = gpus
        .iter()
        .map(|(id, n)| json!({"id": id, "numaNode": n}))
        .collect();
    std::fs::write(
        &pools,
        json!({"pools": [
            {"resource": GPU, "devices": devices},
            {"resource": LICENSE, "shared": "cluster", "capacity": 2, "devices": [{"id": "lic"}]}
        ]})
        .to_string(),
    )
    .unwrap();
    // The node's kubelet HTTPS API, for /configz.
    let kubelet_api = FakeKubeletHttps::start(Answer::Config(json!({"cpuManagerPolicy": "static"})))
        .await
        .unwrap();
    let (mut exporter_c, _) = container_of("DaemonSet", "numaplane-exporter");
    // No kubelet files here (deploy/kubelet-state's paths are the node's): the configuration
    // from the fake kubelet's /configz, the machine from a fixture.
    exporter_c
        .env
        .as_mut()
        .unwrap()
        .retain(|e| e.name != "NUMAPLANE_KUBELET_CONFIG" && e.name != "NUMAPLANE_KUBELET_STATE_DIR");
    let exporter_metrics: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let replace: BTreeMap<&str, String> = [
        (
            "NUMAPLANE_PODRESOURCES_SOCKET",
            podres_socket.display().to_string(),
        ),
        ("NUMAPLANE_LISTEN", exporter_metrics.to_string()),
        ("NUMAPLANE_POOLS", pools.display().to_string()),
        ("NUMAPLANE_DEVICE_PLUGIN_DIR", plugins.display().to_string()),
        (
            "KUBECONFIG",
            kubeconfig_for(&target, dir.path(), "numaplane-exporter")
                .display()
                .to_string(),
        ),
        ("NUMAPLANE_TOPOLOGY_MANAGER_POLICY", "single-numa-node".into()),
        ("NUMAPLANE_KUBELET_PORT", kubelet_api.port().to_string()),
        (
            "NUMAPLANE_KUBELET_CA_FILE",
            FakeKubeletHttps::ca_file().display().to_string(),
        ),
        (
            "NUMAPLANE_TOPOLOGY_XML",
            workspace()
                .join("topology/tests/fixtures/2numa.xml")
                .display()
                .to_string(),
        ),
        ("NUMAPLANE_RESYNC_INTERVAL", "500ms".into()),
        ("NUMAPLANE_API_BACKOFF_MIN", "200ms".into()),
        ("NUMAPLANE_API_BACKOFF_MAX", "1s".into()),
    ]
    .into();
    let fields: BTreeMap<&str, String> = [
        ("spec.nodeName", node.clone()),
        ("metadata.name", "numaplane-exporter-rbac".to_owned()),
        ("status.hostIP", "127.0.0.1".to_owned()),
    ]
    .into();
    let mut exporter_cmd = spawn(
        numaplane_e2e::binaries::exporter(),
        &exporter_c,
        &replace,
        &fields,
        dir.path(),
        "exporter",
    );
    let exporter_log = exporter_cmd.log.clone();
    let elog = move || std::fs::read_to_string(&exporter_log).unwrap_or_default();
    dp.wait_registered(GPU, 1, WAIT).await.unwrap();
    dp.wait_registered(LICENSE, 1, WAIT).await.unwrap();
    let nrts: Api<numaplane::nrt::NodeResourceTopology> = Api::all(client.clone());
    until("the exporter publishes", &elog, || async {
        nrts.get_opt(&node).await.unwrap().is_some()
    })
    .await;
    until("the exporter reads the kubelet's /configz", &elog, || async {
        !kubelet_api.requests().is_empty()
    })
    .await;
    exporter_cmd.assert_running("exporter");

    // The scheduler (`run`, leader election on, as deployed) with the shipped config file.
    let (sched_c, sched_pod) = container_of("Deployment", "numaplane-scheduler");
    let config = dir.path().join("scheduler-config.yaml");
    let config_path = effective(&sched_c, "--config").unwrap();
    std::fs::write(&config, config_file(objects, &sched_c, &sched_pod, &config_path)).unwrap();
    let sched_addr: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let replace: BTreeMap<&str, String> = [
        ("NUMAPLANE_SCHEDULER_CONFIG", config.display().to_string()),
        ("NUMAPLANE_LISTEN", sched_addr.to_string()),
        (
            "NUMAPLANE_KUBECONFIG",
            kubeconfig_for(&target, dir.path(), "numaplane-scheduler")
                .display()
                .to_string(),
        ),
        // A pod that fits nowhere is retried (and reported again) within the test.
        ("NUMAPLANE_POD_MAX_BACKOFF", "2s".into()),
        ("NUMAPLANE_LOG", "info,numaplane_scheduler=debug".into()),
    ]
    .into();
    let fields: BTreeMap<&str, String> = [
        ("metadata.name", "numaplane-scheduler-rbac".to_owned()),
        ("metadata.namespace", NAMESPACE.to_owned()),
    ]
    .into();
    let mut scheduler = spawn(
        numaplane_e2e::binaries::scheduler(),
        &sched_c,
        &replace,
        &fields,
        dir.path(),
        "scheduler",
    );
    let slog_path = scheduler.log.clone();
    let slog = move || std::fs::read_to_string(&slog_path).unwrap_or_default();
    until("the scheduler leads", &slog, || async {
        http_get(sched_addr, "/metrics").is_ok_and(|(_, m)| m.contains("numaplane_scheduler_leader 1"))
    })
    .await;

    // The extender, as deployed (no Lease: each serves its own kube-scheduler).
    let (ext_c, _) = container_of("DaemonSet", "numaplane-scheduler-extender");
    let ext_addr: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let ext_metrics: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let replace: BTreeMap<&str, String> = [
        ("NUMAPLANE_SCHEDULER_CONFIG", config.display().to_string()),
        ("NUMAPLANE_LISTEN", ext_addr.to_string()),
        ("NUMAPLANE_METRICS_LISTEN", ext_metrics.to_string()),
        (
            "NUMAPLANE_KUBECONFIG",
            kubeconfig_for(&target, dir.path(), "numaplane-scheduler-extender")
                .display()
                .to_string(),
        ),
    ]
    .into();
    let fields: BTreeMap<&str, String> = [
        ("metadata.name", "numaplane-scheduler-extender-rbac".to_owned()),
        ("metadata.namespace", NAMESPACE.to_owned()),
    ]
    .into();
    let mut extender = spawn(
        numaplane_e2e::binaries::scheduler(),
        &ext_c,
        &replace,
        &fields,
        dir.path(),
        "extender",
    );
    let xlog_path = extender.log.clone();
    let xlog = move || std::fs::read_to_string(&xlog_path).unwrap_or_default();
    until("the extender is ready", &xlog, || async {
        http_get(ext_metrics, "/readyz").is_ok_and(|(s, _)| s == 200)
    })
    .await;

    // Pods: one the scheduler binds (a GPU and the license), one that fits nowhere, and two
    // for the extender (one filtered then bound, one bound without a filter of its own).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut fits = pod_json("fits", "numaplane-scheduler", "2", 1);
    let limits = fits.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap();
    for m in [limits.limits.as_mut().unwrap(), limits.requests.as_mut().unwrap()] {
        m.insert(
            LICENSE.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        );
    }
    pods.create(&PostParams::default(), &fits).await.unwrap();
    pods.create(
        &PostParams::default(),
        &pod_json("too-big", "numaplane-scheduler", "64", 0),
    )
    .await
    .unwrap();
    // A pod whose WaitForFirstConsumer claim gets its selected node before the Binding (the
    // scheduler's claim `patch`; the storage watches are its `list`/`watch` grants).
    let class_name = format!("{ns}-wffc");
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": class_name},
                "provisioner": "csi.example.com", "volumeBindingMode": "WaitForFirstConsumer"}))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data"},
                "spec": {"storageClassName": class_name, "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut with_claim = pod_json("with-claim", "numaplane-scheduler", "100m", 0);
    with_claim.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}))
            .unwrap(),
    ]);
    pods.create(&PostParams::default(), &with_claim).await.unwrap();
    // A pod with a ResourceClaim on a device with a binding condition: the scheduler's claim
    // watches, the finalizer `update`, the status `update`, and the `get`s while it waits for
    // the condition, which the test then sets as a driver would.
    let device_class = format!("{ns}-gpu");
    let dra_objects = [
        (
            "deviceclasses",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": device_class}, "spec": {}}),
        ),
        (
            "resourceslices",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu")},
            "spec": {"driver": "gpu.example.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev0", "bindingConditions": ["Attached"],
                    "bindingFailureConditions": ["AttachFailed"]}]}}),
        ),
    ];
    for (plural, o) in &dra_objects {
        let gvk = kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", o["kind"].as_str().unwrap());
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            client.clone(),
            &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural),
        );
        api.create(
            &PostParams::default(),
            &serde_json::from_value(o.clone()).unwrap(),
        )
        .await
        .unwrap();
    }
    let resource_claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client.clone(), &ns);
    resource_claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": device_class}}]}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut with_device = pod_json("with-device", "numaplane-scheduler", "100m", 0);
    {
        let spec = with_device.spec.as_mut().unwrap();
        spec.resource_claims = Some(vec![
            serde_json::from_value(json!({"name": "dev", "resourceClaimName": "dev"})).unwrap(),
        ]);
        let r = spec.containers[0].resources.as_mut().unwrap();
        r.requests.as_mut().unwrap().remove(GPU);
        r.limits.as_mut().unwrap().remove(GPU);
    }
    pods.create(&PostParams::default(), &with_device).await.unwrap();
    until(
        "the scheduler reserves claim dev for with-device",
        &slog,
        || async {
            let c = resource_claims.get("dev").await.unwrap();
            c.status
                .is_some_and(|s| s.allocation.is_some() && s.reserved_for.is_some_and(|r| r.len() == 1))
        },
    )
    .await;
    assert_eq!(
        pods.get("with-device").await.unwrap().spec.unwrap().node_name,
        None,
        "bound before its device's binding condition holds"
    );
    let mut c = resource_claims.get("dev").await.unwrap();
    c.status.as_mut().unwrap().devices = Some(vec![
        serde_json::from_value(json!({
        "driver": "gpu.example.com", "pool": node, "device": "dev0",
        "conditions": [{"type": "Attached", "status": "True", "reason": "Attached", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
        .unwrap(),
    ]);
    resource_claims
        .replace_status("dev", &PostParams::default(), &c)
        .await
        .unwrap();
    until(
        "with-device is bound once its device is attached",
        &slog,
        || async {
            pods.get("with-device")
                .await
                .unwrap()
                .spec
                .unwrap()
                .node_name
                .as_deref()
                == Some(node.as_str())
        },
    )
    .await;
    let deadline = Instant::now() + WAIT;
    let record = loop {
        let p = pods.get("fits").await.unwrap();
        if let Some(a) = p.metadata.annotations.and_then(|a| a.get(ANNOTATION).cloned()) {
            assert_eq!(p.spec.unwrap().node_name.as_deref(), Some(node.as_str()));
            break numaplane::allocation::Allocation::parse(&a).unwrap();
        }
        assert!(Instant::now() < deadline, "`fits` not bound:\n{}", slog());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    until(
        "with-claim is bound, its claim's node selected",
        &slog,
        || async {
            let bound = pods.get("with-claim").await.unwrap().spec.unwrap().node_name;
            let selected = claims
                .get("data")
                .await
                .unwrap()
                .metadata
                .annotations
                .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned());
            bound.as_deref() == Some(node.as_str()) && selected.as_deref() == Some(node.as_str())
        },
    )
    .await;
    // Preemption (the scheduler's pod `delete`, the PodDisruptionBudget watch): a pod bound
    // here by someone else holds nearly all the node's memory; a higher-priority pod that
    // needs some evicts exactly it and is bound.
    let mut hog = pod_json("hog", "default-scheduler", "100m", 0);
    {
        let spec = hog.spec.as_mut().unwrap();
        spec.node_name = Some(node.clone());
        let r = spec.containers[0].resources.as_mut().unwrap();
        r.requests.as_mut().unwrap().insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("126Gi".into()),
        );
        // Burstable: no limits, and so no extended resource (the API server requires limits
        // equal to requests for those).
        r.requests.as_mut().unwrap().remove(GPU);
        r.limits = None;
    }
    pods.create(&PostParams::default(), &hog).await.unwrap();
    let mut urgent = pod_json("urgent", "numaplane-scheduler", "100m", 0);
    {
        let spec = urgent.spec.as_mut().unwrap();
        let r = spec.containers[0].resources.as_mut().unwrap();
        r.requests.as_mut().unwrap().insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("4Gi".into()),
        );
        r.requests.as_mut().unwrap().remove(GPU);
        r.limits = None;
        if target.fake().is_some() {
            spec.priority = Some(1000);
        } else {
            // A real API server takes the priority from a PriorityClass only.
            let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
            let name = format!("{ns}-urgent");
            let _ = classes
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": name}, "value": 1000})).unwrap(),
                )
                .await;
            spec.priority_class_name = Some(name);
        }
    }
    pods.create(&PostParams::default(), &urgent).await.unwrap();
    until("urgent evicts the hog and is bound", &slog, || async {
        let hog_gone = pods.get_opt("hog").await.unwrap().is_none();
        let bound = pods.get("urgent").await.unwrap().spec.unwrap().node_name;
        hog_gone && bound.as_deref() == Some(node.as_str())
    })
    .await;
    assert!(
        pods.get_opt("fits").await.unwrap().is_some() && pods.get_opt("with-claim").await.unwrap().is_some(),
        "only the hog is a victim"
    );

    // The kubelet admits it on the recorded NUMA node; pod-resources then reports it, so the
    // exporter publishes the license as held here.
    let c = &record.containers[0];
    let hint = recorded_hint(c);
    let key = format!("{ns}/fits");
    // The kubelet lists the pod it admits from just before, devices still to come.
    podres.set_pods(vec![PodResources {
        name: "fits".into(),
        namespace: ns.clone(),
        ..Default::default()
    }]);
    let (got, _) = dp.admit(&key, "app", GPU, 1, Some(&hint)).await.unwrap();
    assert_eq!(
        Some(&got),
        c.devices.get(GPU),
        "the kubelet was not steered to the recorded GPU"
    );
    let (lic, _) = dp.admit(&key, "app", LICENSE, 1, None).await.unwrap();
    podres.set_pods(vec![PodResources {
        name: "fits".into(),
        namespace: ns.clone(),
        containers: vec![ContainerResources {
            name: "app".into(),
            devices: vec![
                ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: got.clone(),
                    topology: topo(hint[0]),
                },
                ContainerDevices {
                    resource_name: LICENSE.into(),
                    device_ids: lic,
                    topology: None,
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    }]);

    // The extender: filter then bind one pod, bind another it never saw.
    for name in ["ext-a", "ext-b"] {
        pods.create(
            &PostParams::default(),
            &pod_json(name, "default-scheduler", "1", 1),
        )
        .await
        .unwrap();
    }
    let a = pods.get("ext-a").await.unwrap();
    let filter = json!({"Pod": a, "Nodes": null, "NodeNames": [node]}).to_string();
    let (status, body) = tokio::task::spawn_blocking(move || http_post(ext_addr, "/filter", &filter))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["NodeNames"], json!([node]), "{body}\n{}", xlog());
    for name in ["ext-a", "ext-b"] {
        let p = pods.get(name).await.unwrap();
        let bind =
            json!({"PodName": name, "PodNamespace": ns, "PodUID": p.metadata.uid, "Node": node}).to_string();
        let (status, body) = tokio::task::spawn_blocking(move || http_post(ext_addr, "/bind", &bind))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["Error"],
            "",
            "{body}\n{}",
            xlog()
        );
    }

    // Everything each binary does has happened: Events created and patched, the status
    // condition, the Binding, the license published as held.
    let is_events = |r: &numaplane_e2e::fake_api::RecordedRequest, who: &str, method: &str| {
        r.bearer_token() == Some(who) && r.method == method && r.path.contains("/events")
    };
    if let Some(fake) = target.fake() {
        let deadline = Instant::now() + WAIT;
        let mut injected = Instant::now();
        loop {
            let reqs = fake.requests();
            // Only scans call GetAllocatableResources (the allocator Lists): fail it until a
            // repeated ScanFailed is patched.
            if !reqs.iter().any(|r| is_events(r, "numaplane-exporter", "PATCH"))
                && injected.elapsed() > Duration::from_secs(2)
            {
                podres.fail_next(
                    Method::GetAllocatableResources,
                    1,
                    tonic::Code::Unavailable,
                    "kubelet restarting",
                );
                injected = Instant::now();
            }
            let mut missing = Vec::new();
            for who in ["numaplane-exporter", "numaplane-scheduler"] {
                for method in ["POST", "PATCH"] {
                    if !reqs.iter().any(|r| is_events(r, who, method)) {
                        missing.push(format!("{who}: {method} events"));
                    }
                }
            }
            if !reqs
                .iter()
                .any(|r| r.bearer_token() == Some("numaplane-scheduler") && r.path.ends_with("/status"))
            {
                missing.push("numaplane-scheduler: pods/status".to_owned());
            }
            if !reqs.iter().any(|r| {
                r.bearer_token() == Some("numaplane-scheduler")
                    && r.method == "PATCH"
                    && r.path.ends_with("/persistentvolumeclaims/data")
            }) {
                missing.push("numaplane-scheduler: persistentvolumeclaims patch".to_owned());
            }
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "missing {missing:?}; requests: {:#?}\nexporter:\n{}",
                reqs.iter()
                    .filter(|r| r.bearer_token() != Some(numaplane_e2e::fake_api::FAKE_TOKEN))
                    .map(|r| format!("{:?} {} {} {}", r.bearer_token(), r.method, r.path, r.status))
                    .collect::<BTreeSet<_>>(),
                elog()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    until("the NRT shows the license held", &elog, || async {
        nrts.get(&node)
            .await
            .unwrap()
            .attributes
            .iter()
            .flatten()
            .any(|a| a.name == format!("numaplane.io/cluster-held.{LICENSE}") && !a.value.is_empty())
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let reasons: BTreeSet<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.contains("Scheduled") && reasons.contains("FailedScheduling"),
        "{reasons:?}"
    );
    exporter_cmd.assert_running("exporter");
    scheduler.assert_running("scheduler");
    extender.assert_running("extender");
    drop((exporter_cmd, scheduler, extender));

    // Server-side apply creates the NRT (`create`); nothing reads it back with get or update.
    let kubelet_requests: Vec<rbac::Attributes> = kubelet_api
        .requests()
        .iter()
        .filter(|r| target.fake().is_none() || r.bearer_token.as_deref() == Some("numaplane-exporter"))
        .map(|r| rbac::kubelet_attributes(&r.method, &r.path, &node))
        .collect();
    check_identity(&target, "numaplane-exporter", &[], &kubelet_requests);
    // `resourceclaims/binding` is no URL: the API server checks it on a claim status write
    // that changes allocation or reservedFor (the real server's `auth can-i` test holds it).
    check_identity(
        &target,
        "numaplane-scheduler",
        &[("resource.k8s.io", "resourceclaims/binding", "update")],
        &[],
    );
    check_identity(&target, "numaplane-scheduler-extender", &[], &[]);

    let _ = pods
        .delete_collection(
            &kube::api::DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    let _ = classes
        .delete(&class_name, &kube::api::DeleteParams::default())
        .await;
    let _ = resource_claims
        .delete_collection(&kube::api::DeleteParams::default(), &ListParams::default())
        .await;
    for (plural, o) in &dra_objects {
        let gvk = kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", o["kind"].as_str().unwrap());
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            client.clone(),
            &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural),
        );
        let _ = api
            .delete(o["metadata"]["name"].as_str().unwrap(), &Default::default())
            .await;
    }
    target.cleanup(&node, &ns).await;
    drop(podres);
}
