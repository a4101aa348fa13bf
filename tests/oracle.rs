//! The kubelet oracle: scenarios (a fake NUMA machine, kubelet policies and options, devices,
//! pods in order) run on the real kubelet v1.36.2 of the kit (`../shared/k8s/node`) and through
//! numaplane's own chain, the exporter's NodeResourceTopology of that very kubelet and the
//! `simulate` binary, and the two answers compared pod by pod.
//!
//! A scenario is the kit's format (`../shared/conformance/kubelet-oracle/README.md`), with
//! optional fields for the kubelet's options: `cpu_manager_policy_options`,
//! `topology_manager_policy_options`, `memory_manager_policy`, `feature_gates` (maps), and
//! `nightly` (run only with `NUMAPLANE_ORACLE_NIGHTLY=1`). `kubelet_starts: false` says the
//! kubelet refuses the configuration (then the model must refuse the node too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use numaplane_topology::Distance;
use numaplane_topology::synth::{MachineSpec, NumaNodeSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control_plane::HarnessError;

/// Runs the nightly-sized scenarios too.
pub const NIGHTLY_ENV: &str = "NUMAPLANE_ORACLE_NIGHTLY";

/// The node name the kit's kubelet registers.
pub const NODE: &str = "oracle-node";

/// One scenario file.
#[derive(Clone, Debug, Deserialize)]
pub struct Scenario {
    /// Its name (the file's stem when absent).
    #[serde(default)]
    pub name: String,
    /// What it checks, for a person.
    #[serde(default)]
    pub notes: String,
    /// The fake machine, in the kit's MACHINE.json form.
    pub machine: Value,
    /// The fake device plugin's devices, in the kit's DEVICES.json form.
    #[serde(default)]
    pub devices: Option<Value>,
    /// `reservedSystemCPUs`.
    #[serde(default = "default_reserved")]
    pub reserved_cpus: String,
    /// Topology Manager policies to run under.
    pub policy: Vec<String>,
    /// Topology Manager scopes to run under.
    #[serde(default = "default_scopes")]
    pub scope: Vec<String>,
    /// `cpuManagerPolicyOptions`.
    #[serde(default)]
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// `topologyManagerPolicyOptions`.
    #[serde(default)]
    pub topology_manager_policy_options: BTreeMap<String, String>,
    /// `memoryManagerPolicy` (`None` or `Static`).
    #[serde(default)]
    pub memory_manager_policy: Option<String>,
    /// `featureGates`.
    #[serde(default)]
    pub feature_gates: BTreeMap<String, bool>,
    /// Whether the kubelet accepts this configuration (default: it does).
    #[serde(default = "yes")]
    pub kubelet_starts: bool,
    /// What the kubelet says when it refuses (`kubelet_starts: false`).
    #[serde(default)]
    pub kubelet_error: String,
    /// Only with [`NIGHTLY_ENV`].
    #[serde(default)]
    pub nightly: bool,
    /// The options (`name=value`) simulate must report as making its predictions approximate;
    /// with none listed, it must report none.
    #[serde(default)]
    pub approximate: Vec<String>,
    /// Pods, in creation order.
    pub pods: Vec<ScenarioPod>,
}

fn default_reserved() -> String {
    "0".to_owned()
}

fn default_scopes() -> Vec<String> {
    vec!["container".to_owned()]
}

fn yes() -> bool {
    true
}

/// One pod of a scenario.
#[derive(Clone, Debug, Deserialize)]
pub struct ScenarioPod {
    /// Pod name.
    pub name: String,
    /// Init containers (a `restart_policy: Always` one is a sidecar).
    #[serde(default)]
    pub init_containers: Vec<ScenarioContainer>,
    /// App containers.
    pub containers: Vec<ScenarioContainer>,
}

/// One container: its limits (requests default to them: Guaranteed when it has CPU and
/// memory limits) and explicit requests.
#[derive(Clone, Debug, Deserialize)]
pub struct ScenarioContainer {
    /// Container name.
    pub name: String,
    /// `resources.limits`.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
    /// `resources.requests`.
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
    /// `restartPolicy` of an init container (`Always`: sidecar).
    #[serde(default)]
    pub restart_policy: Option<String>,
}

/// What one container holds: where its exclusive CPUs, memory and devices are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// NUMA nodes of its exclusive CPUs (empty: none).
    pub cpu_numa: BTreeSet<u32>,
    /// NUMA nodes of its pinned memory (empty: none).
    pub memory_numa: BTreeSet<u32>,
    /// Device IDs per resource.
    pub devices: BTreeMap<String, BTreeSet<String>>,
}

/// One pod's answer, from the kubelet or the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Admitted (the kubelet), or placed on the node (the model).
    pub admitted: bool,
    /// The reject reason (`TopologyAffinityError`, `UnexpectedAdmissionError`, …).
    pub reason: Option<String>,
    /// Per container that the pod-resources API lists (app containers and sidecars).
    pub containers: BTreeMap<String, Held>,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.admitted {
            return write!(f, "rejected ({})", self.reason.as_deref().unwrap_or("no reason"));
        }
        write!(f, "admitted")?;
        for (name, h) in &self.containers {
            write!(f, "; {name}:")?;
            if !h.cpu_numa.is_empty() {
                write!(f, " cpus on NUMA {:?}", h.cpu_numa)?;
            }
            if !h.memory_numa.is_empty() {
                write!(f, " memory on NUMA {:?}", h.memory_numa)?;
            }
            for (r, ids) in &h.devices {
                write!(f, " {r}={ids:?}")?;
            }
        }
        Ok(())
    }
}

/// One run of a scenario: the policy and scope, and per pod both answers.
#[derive(Debug)]
pub struct Run {
    /// `scenario policy/scope`.
    pub label: String,
    /// Per pod in order: (name, kubelet, model).
    pub pods: Vec<(String, Verdict, Verdict)>,
    /// Warnings simulate printed (approximate predictions, …).
    pub warnings: Vec<String>,
    /// The kubelet refused the configuration, as the scenario says it must: its error.
    pub refused: Option<String>,
}

impl Run {
    /// Every pod whose answers differ, named with both.
    pub fn mismatches(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, k, m)| k != m)
            .map(|(pod, k, m)| format!("{}: pod {pod}: kubelet {k}; model {m}", self.label))
            .collect()
    }
}

/// The scenarios of `dir` (every `*.json` that parses as one), sorted by name.
pub fn scenarios(dir: &Path) -> Result<Vec<Scenario>, HarnessError> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p)?;
        let mut s: Scenario =
            serde_json::from_str(&text).map_err(|e| format!("{}: not a scenario: {e}", p.display()))?;
        if s.name.is_empty() {
            s.name = p
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
        }
        out.push(s);
    }
    Ok(out)
}

/// The scenario's machine as the synth spec the exporter's hwloc XML is written from: the same
/// CPUs, SMT siblings, memory per NUMA node and distances as the kit's fake sysfs.
pub fn machine_spec(machine: &Value) -> Result<MachineSpec, HarnessError> {
    let nodes = machine["numa_nodes"].as_array().ok_or("machine: no numa_nodes")?;
    let total_memory = machine["memory_bytes"].as_u64();
    let distances = machine["distances"].as_array();
    let count = u64::try_from(nodes.len()).unwrap_or(1).max(1);
    let mut spec = MachineSpec::default();
    for (row, n) in nodes.iter().enumerate() {
        let id = u32::try_from(n["id"].as_u64().ok_or("machine: a node without id")?)?;
        let mut cpus = Vec::new();
        let mut siblings = Vec::new();
        for c in n["cpus"].as_array().ok_or("machine: a node without cpus")? {
            match c {
                Value::Array(threads) => {
                    let t: Vec<u32> = threads
                        .iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| u32::try_from(x).ok())
                        .collect();
                    cpus.extend(&t);
                    siblings.push(t);
                }
                v => cpus.push(u32::try_from(
                    v.as_u64().ok_or("machine: a CPU that is not a number")?,
                )?),
            }
        }
        let memory = n["memory_bytes"]
            .as_u64()
            .or(total_memory.map(|t| t / count))
            .unwrap_or(4 << 30);
        let distances = match distances.and_then(|d| d.get(row)).and_then(Value::as_array) {
            Some(r) => r
                .iter()
                .zip(nodes)
                .map(|(v, to)| Distance {
                    node: to["id"].as_u64().and_then(|x| u32::try_from(x).ok()).unwrap_or(0),
                    value: v.as_u64().unwrap_or(10),
                })
                .collect(),
            None => Vec::new(),
        };
        spec.numa_nodes.push(NumaNodeSpec {
            id,
            cpus,
            smt_siblings: (!siblings.is_empty()).then_some(siblings),
            memory_bytes: Some(memory),
            distances,
            ..NumaNodeSpec::default()
        });
    }
    Ok(spec)
}

/// The NUMA node of every CPU of the machine.
fn cpu_nodes(machine: &Value) -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    for n in machine["numa_nodes"].as_array().into_iter().flatten() {
        let id = n["id"].as_u64().and_then(|x| u32::try_from(x).ok()).unwrap_or(0);
        for c in n["cpus"].as_array().into_iter().flatten() {
            let threads: Vec<&Value> = match c {
                Value::Array(t) => t.iter().collect(),
                v => vec![v],
            };
            for t in threads {
                if let Some(cpu) = t.as_u64().and_then(|x| u32::try_from(x).ok()) {
                    out.insert(cpu, id);
                }
            }
        }
    }
    out
}

fn container_json(c: &ScenarioContainer, init: bool) -> Value {
    let mut v = json!({
        "name": c.name,
        "image": "localhost/oracle/not-pulled:none",
        "imagePullPolicy": "Never",
        "resources": {"limits": c.limits, "requests": if c.requests.is_empty() { &c.limits } else { &c.requests }},
    });
    if init && let Some(p) = &c.restart_policy {
        v["restartPolicy"] = json!(p);
    }
    v
}

/// The pod as the kubelet gets it (`node`: bound there) or as simulate schedules it (`None`).
pub fn pod_json(p: &ScenarioPod, namespace: &str, node: Option<&str>) -> Value {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        // The kit's node keeps the not-ready taint (no node lifecycle controller); the kubelet
        // ignores NoSchedule for a bound pod, simulate must be told.
        "tolerations": [{"operator": "Exists"}],
        "initContainers": p.init_containers.iter().map(|c| container_json(c, true)).collect::<Vec<_>>(),
        "containers": p.containers.iter().map(|c| container_json(c, false)).collect::<Vec<_>>(),
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p.name, "namespace": namespace}, "spec": spec})
}

/// `node start` arguments for one run.
fn node_args(s: &Scenario, dir: &Path, files: &Path, policy: &str, scope: &str) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "start".into(),
        dir.display().to_string(),
        "--machine".into(),
        files.join("machine.json").display().to_string(),
        "--node-name".into(),
        NODE.into(),
        "--reserved-cpus".into(),
        s.reserved_cpus.clone(),
        "--topology-manager-policy".into(),
        policy.into(),
        "--topology-manager-scope".into(),
        scope.into(),
    ];
    let join = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    if !s.cpu_manager_policy_options.is_empty() {
        a.push("--cpu-manager-policy-options".into());
        a.push(join(&s.cpu_manager_policy_options));
    }
    if !s.topology_manager_policy_options.is_empty() {
        a.push("--topology-manager-policy-options".into());
        a.push(join(&s.topology_manager_policy_options));
    }
    if let Some(m) = &s.memory_manager_policy {
        a.push("--memory-manager-policy".into());
        a.push(m.clone());
    }
    if !s.feature_gates.is_empty() {
        a.push("--feature-gates".into());
        a.push(
            s.feature_gates
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if s.devices.is_some() {
        a.push("--devices".into());
        a.push(files.join("devices.json").display().to_string());
    }
    a
}

/// The kit's `node` script.
pub fn node_script() -> PathBuf {
    crate::control_plane::kit_dir().join("node")
}

/// Runs `bash node args…`; Ok(stderr) when it exits 0, Err(stderr) otherwise.
fn node(args: &[String]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(node_script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("bash node: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stderr)
    } else {
        Err(stderr)
    }
}

/// The kubelet's answer for pod `name`: admitted (phase Pending with container statuses) or
/// rejected (phase Failed, with its reason), polled for up to 15 s.
async fn kubelet_verdict(pods: &Api<Pod>, name: &str) -> Result<Verdict, HarnessError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let p = pods.get(name).await?;
        if let Some(st) = &p.status {
            if st.phase.as_deref() == Some("Failed") {
                return Ok(Verdict {
                    admitted: false,
                    reason: st.reason.clone(),
                    containers: BTreeMap::new(),
                });
            }
            let started = st.container_statuses.as_ref().is_some_and(|c| !c.is_empty())
                || st.init_container_statuses.as_ref().is_some_and(|c| !c.is_empty());
            if started {
                return Ok(Verdict {
                    admitted: true,
                    ..Verdict::default()
                });
            }
        }
        if Instant::now() > deadline {
            return Err(format!("pod {name}: no kubelet verdict within 15 s: {:?}", p.status).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What pod-resources `List` says each container of the admitted pods holds.
async fn kubelet_holdings(
    socket: &Path,
    namespace: &str,
    cpu_node: &BTreeMap<u32, u32>,
) -> Result<BTreeMap<String, BTreeMap<String, Held>>, HarnessError> {
    let client = numaplane_exporter::podresources::KubeletClient::new(
        socket,
        Duration::from_secs(10),
        std::sync::Arc::new(numaplane_exporter::metrics::Metrics::new()),
    )?;
    let list = client.list().await?;
    let mut out: BTreeMap<String, BTreeMap<String, Held>> = BTreeMap::new();
    for p in list.pod_resources.iter().filter(|p| p.namespace == namespace) {
        let pod = out.entry(p.name.clone()).or_default();
        for c in &p.containers {
            let mut h = Held {
                cpu_numa: c
                    .cpu_ids
                    .iter()
                    .filter_map(|id| u32::try_from(*id).ok())
                    .filter_map(|id| cpu_node.get(&id).copied())
                    .collect(),
                ..Held::default()
            };
            for m in &c.memory {
                if m.size > 0 {
                    for n in m.topology.iter().flat_map(|t| &t.nodes) {
                        h.memory_numa.extend(u32::try_from(n.id).ok());
                    }
                }
            }
            for d in &c.devices {
                h.devices
                    .entry(d.resource_name.clone())
                    .or_default()
                    .extend(d.device_ids.iter().cloned());
            }
            pod.insert(c.name.clone(), h);
        }
    }
    Ok(out)
}

/// The exporter's NodeResourceTopology of the kit's kubelet now: `numaplane-exporter run --once
/// --dry-run` on its pod-resources socket, its KubeletConfiguration file and state directory,
/// and the machine as hwloc XML.
fn exporter_nrt(dir: &Path, files: &Path, socket: &Path) -> Result<Value, HarnessError> {
    let out = Command::new(crate::binaries::exporter())
        .args(["run", "--once", "--dry-run", "-o", "json", "--node-name", NODE])
        .arg("--podresources-socket")
        .arg(socket)
        .arg("--topology-xml")
        .arg(files.join("machine.xml"))
        .arg("--kubelet-config")
        .arg(dir.join("node/config/kubelet-config.yaml"))
        .arg("--kubelet-state-dir")
        .arg(dir.join("node/kubelet"))
        .env_remove("KUBECONFIG")
        .env_remove("NUMAPLANE_KUBECONFIG")
        .env("NUMAPLANE_LOG", "warn")
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "numaplane-exporter run --once --dry-run: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The model's answers: `simulate -o json` over the Node and the NRT, the pods in order.
fn model_verdicts(
    files: &Path,
    node: &Node,
    nrt: &Value,
    s: &Scenario,
    namespace: &str,
) -> Result<(Vec<Verdict>, Vec<String>), HarnessError> {
    let mut node = node.clone();
    node.metadata.managed_fields = None;
    let cluster = json!({"apiVersion": "v1", "kind": "List", "items": [node, nrt]});
    std::fs::write(files.join("cluster.json"), serde_json::to_vec_pretty(&cluster)?)?;
    let pods: Vec<Value> = s.pods.iter().map(|p| pod_json(p, namespace, None)).collect();
    std::fs::write(
        files.join("pods.json"),
        serde_json::to_vec_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": pods}))?,
    )?;
    let out = Command::new(crate::binaries::scheduler())
        .args(["simulate", "-o", "json", "--explain", "failed", "--cluster"])
        .arg(files.join("cluster.json"))
        .arg("--pods")
        .arg(files.join("pods.json"))
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "simulate: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let report: Value = serde_json::from_slice(&out.stdout)?;
    let warnings = report["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let mut verdicts = Vec::new();
    for (r, p) in report["results"].as_array().into_iter().flatten().zip(&s.pods) {
        let admitted = r["node"].as_str() == Some(NODE);
        let mut v = Verdict {
            admitted,
            ..Verdict::default()
        };
        if admitted {
            // The containers pod-resources lists: app containers and sidecars.
            let listed: BTreeSet<&str> = p
                .containers
                .iter()
                .map(|c| c.name.as_str())
                .chain(
                    p.init_containers
                        .iter()
                        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                        .map(|c| c.name.as_str()),
                )
                .collect();
            for c in r["placement"]["containers"].as_array().into_iter().flatten() {
                let Some(name) = c["name"].as_str().filter(|n| listed.contains(n)) else {
                    continue;
                };
                let ids = |k: &str| -> BTreeSet<u32> {
                    c[k].as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| u32::try_from(x).ok())
                        .collect()
                };
                let mut h = Held {
                    cpu_numa: ids("cpuNumaNodes"),
                    memory_numa: ids("memoryNumaNodes"),
                    ..Held::default()
                };
                for (res, list) in c["devices"].as_object().into_iter().flatten() {
                    h.devices.insert(
                        res.clone(),
                        list.as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect(),
                    );
                }
                v.containers.insert(name.to_owned(), h);
            }
        } else {
            v.reason = r["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|n| n["node"].as_str() == Some(NODE))
                .and_then(|n| n["kubeletReason"].as_str())
                .map(str::to_owned);
        }
        verdicts.push(v);
    }
    if verdicts.len() != s.pods.len() {
        return Err(format!("simulate answered {} of {} pods", verdicts.len(), s.pods.len()).into());
    }
    Ok((verdicts, warnings))
}

/// The kubelet's holdings with what the model can be asked to predict: containers without
/// anything exclusive stay listed (empty), as the model lists them.
fn normalise(mut v: Verdict, p: &ScenarioPod) -> Verdict {
    if v.admitted {
        for c in p.containers.iter().map(|c| c.name.as_str()).chain(
            p.init_containers
                .iter()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .map(|c| c.name.as_str()),
        ) {
            v.containers.entry(c.to_owned()).or_default();
        }
        for h in v.containers.values_mut() {
            h.devices.retain(|_, ids| !ids.is_empty());
        }
    }
    v
}

/// Runs scenario `s` under every policy and scope it lists, on the kit's node of the control
/// plane in `dir` (which this call restarts for each run), with the Kubernetes client `client`.
pub async fn run_scenario(client: &kube::Client, dir: &Path, s: &Scenario) -> Result<Vec<Run>, HarnessError> {
    let files = tempfile::Builder::new().prefix("oracle-").tempdir()?;
    std::fs::write(files.path().join("machine.json"), serde_json::to_vec(&s.machine)?)?;
    if let Some(d) = &s.devices {
        std::fs::write(files.path().join("devices.json"), serde_json::to_vec(d)?)?;
    }
    std::fs::write(
        files.path().join("machine.xml"),
        machine_spec(&s.machine)?.to_hwloc_xml()?,
    )?;
    let cpu_node = cpu_nodes(&s.machine);
    let mut runs = Vec::new();
    for policy in &s.policy {
        for scope in &s.scope {
            let label = format!("{} {policy}/{scope}", s.name);
            let args = node_args(s, dir, files.path(), policy, scope);
            match (node(&args), s.kubelet_starts) {
                (Ok(_), true) => {}
                (Err(e), true) => return Err(format!("{label}: node start failed:\n{e}").into()),
                (Ok(_), false) => {
                    return Err(
                        format!("{label}: the kubelet started, but the scenario says it refuses").into(),
                    );
                }
                (Err(e), false) => {
                    // No kubelet, so no node and no NRT: nothing reaches the model.
                    runs.push(Run {
                        label,
                        pods: Vec::new(),
                        warnings: Vec::new(),
                        refused: Some(e),
                    });
                    continue;
                }
            }
            let socket = dir.join("node/kubelet/pod-resources/kubelet.sock");
            let nrt = exporter_nrt(dir, files.path(), &socket).map_err(|e| format!("{label}: {e}"))?;
            let node_obj = Api::<Node>::all(client.clone()).get(NODE).await?;
            let namespace = crate::harness::unique_name("oracle");
            prepare_namespace(client, &namespace).await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let mut kubelet = Vec::new();
            for p in &s.pods {
                let pod: Pod = serde_json::from_value(pod_json(p, &namespace, Some(NODE)))?;
                pods.create(&PostParams::default(), &pod).await?;
                kubelet.push(
                    kubelet_verdict(&pods, &p.name)
                        .await
                        .map_err(|e| format!("{label}: {e}"))?,
                );
            }
            let holdings = kubelet_holdings(&socket, &namespace, &cpu_node).await?;
            for (v, p) in kubelet.iter_mut().zip(&s.pods) {
                if v.admitted {
                    v.containers = holdings.get(&p.name).cloned().unwrap_or_default();
                }
            }
            let (model, warnings) = model_verdicts(files.path(), &node_obj, &nrt, s, &namespace)
                .map_err(|e| format!("{label}: {e}"))?;
            let _ = Api::<Namespace>::all(client.clone())
                .delete(&namespace, &DeleteParams::default())
                .await;
            runs.push(Run {
                label,
                pods: s
                    .pods
                    .iter()
                    .zip(kubelet.into_iter().zip(model))
                    .map(|(p, (k, m))| (p.name.clone(), normalise(k, p), normalise(m, p)))
                    .collect(),
                warnings,
                refused: None,
            });
        }
    }
    Ok(runs)
}

async fn prepare_namespace(client: &kube::Client, namespace: &str) -> Result<(), HarnessError> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await?;
    Ok(())
}
