//! Every exporter conformance case through the real `numaplane-exporter` binary:
//! `run --once --dry-run -o json` against a fake kubelet on a Unix socket and a synth hwloc
//! XML machine, judged by the same rules and DIFFERENCES as the pure accounting test; plus the
//! binary's behaviour on kubelets without Watch/Get, bad configuration, unreachable kubelets,
//! suspicious kubelet data and kubelet Topology Manager configuration.
//!
//! The binary comes from [`numaplane_e2e::binaries::exporter`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use numaplane::nrt::{self, NodeResourceTopology, attr};
use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use numaplane_e2e::exporter_vectors::{self as vectors, RoundedHugepages, Verdict, case_name};
use numaplane_e2e::fake_api::FakeApiServer;
use numaplane_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, GetMode, Method, start_not_grpc};
use numaplane_exporter::accounting::{AccountingConfig, MachineView, account};
use numaplane_topology::Machine;
use serde_json::{Value, json};

/// Node name every run publishes for (the vectors' `node_name`).
const NODE: &str = "TEST";

/// Exit code for bad configuration (`EX_USAGE`).
const EXIT_CONFIG: i32 = 64;

/// Exit code when the kubelet cannot be read.
const EXIT_KUBELET: i32 = 1;

/// Kill a run that takes longer than this: a hang is a failure, not a stuck CI job.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// `--call-timeout` of the runs that are expected to succeed: generous for a loaded machine.
const CALL_TIMEOUT_OK: &str = "10s";

// ---------------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------------

fn exporter_bin() -> &'static Path {
    numaplane_e2e::binaries::exporter()
}

/// Outcome of one run of the binary.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    /// Non-empty stderr lines.
    fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| !l.trim().is_empty()).collect()
    }

    /// The printed object; panics with the run's output when there is none.
    fn nrt(&self, what: &str) -> NodeResourceTopology {
        assert_eq!(
            self.code,
            Some(0),
            "{what}: exit status; stderr:\n{}",
            self.stderr
        );
        assert!(
            !self.stderr.contains("panicked"),
            "{what}: the binary panicked:\n{}",
            self.stderr
        );
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "{what}: stdout is not a NodeResourceTopology: {e}\nstdout:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts a failed run with `code` and exactly one stderr line, and returns the line.
    fn one_line_failure(&self, code: i32, what: &str) -> String {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: exit status; stderr:\n{}",
            self.stderr
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "{what}: want one stderr line, got:\n{}",
            self.stderr
        );
        assert!(self.stdout.trim().is_empty(), "{what}: printed {}", self.stdout);
        lines.first().map(|l| (*l).to_owned()).unwrap_or_default()
    }
}

/// Runs the binary with `args` off the async runtime, so the fake kubelet keeps serving.
async fn run_exporter(args: Vec<OsString>, scratch: &Path) -> Run {
    let bin = exporter_bin().to_owned();
    let scratch = scratch.to_owned();
    tokio::task::spawn_blocking(move || run_blocking(&bin, &args, &scratch))
        .await
        .unwrap()
}

fn run_blocking(bin: &Path, args: &[OsString], scratch: &Path) -> Run {
    // Files rather than pipes: nothing to drain while polling for the deadline.
    let (out_path, err_path) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    // The run must depend on its flags only, not on the developer's environment.
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("NUMAPLANE_") || key_str == "KUBECONFIG" {
            cmd.env_remove(&key);
        }
    }
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "numaplane-exporter {args:?} still running after {RUN_DEADLINE:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
        elapsed: start.elapsed(),
    }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `run --once --dry-run -o json` for [`NODE`] on `socket` and `xml`.
fn base_args(socket: &Path, xml: &Path, call_timeout: &str) -> Vec<OsString> {
    let mut args = os(&["run", "--once", "--dry-run", "-o", "json", "--node-name", NODE]);
    args.push("--podresources-socket".into());
    args.push(socket.into());
    args.push("--topology-xml".into());
    args.push(xml.into());
    args.push("--call-timeout".into());
    args.push(call_timeout.into());
    args
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// What one case needs on disk and on the socket.
struct Setup {
    dir: tempfile::TempDir,
    xml: PathBuf,
    socket: PathBuf,
    rounded: Vec<RoundedHugepages>,
}

fn setup(machine: &Value) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (xml_text, rounded) = vectors::machine_xml(machine).unwrap();
    let xml = dir.path().join("machine.xml");
    std::fs::write(&xml, xml_text).unwrap();
    let socket = dir.path().join("kubelet.sock");
    Setup {
        dir,
        xml,
        socket,
        rounded,
    }
}

/// The vector case `name` and its [`setup`].
fn case_setup(name: &str) -> (Value, Setup) {
    let root = vectors::embedded().unwrap();
    let case = vectors::find_case(&root, name).unwrap().clone();
    let s = setup(&case["machine"]);
    (case, s)
}

/// The hwloc fixture `name` and a directory for the kubelet's socket.
fn fixture_setup(name: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let xml = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures")
        .join(name);
    let socket = dir.path().join("kubelet.sock");
    Setup {
        dir,
        xml,
        socket,
        rounded: Vec::new(),
    }
}

/// A fake kubelet on `s`'s socket.
async fn start_kubelet(
    s: &Setup,
    allocatable: AllocatableResourcesResponse,
    pods: Vec<PodResources>,
    opts: FakeKubeletOptions,
) -> FakeKubelet {
    FakeKubelet::start(&s.socket, allocatable, pods, opts)
        .await
        .unwrap()
}

/// A fake kubelet on `s`'s socket offering `cpu_ids` and nothing else, no pods.
async fn cpu_kubelet(s: &Setup, cpu_ids: Vec<i64>) -> FakeKubelet {
    let allocatable = AllocatableResourcesResponse {
        cpu_ids,
        ..Default::default()
    };
    start_kubelet(s, allocatable, vec![], FakeKubeletOptions::default()).await
}

/// The case's `config` as flags; the fake API server when it names terminal pods (kept alive
/// by the caller for the run).
async fn config_flags(case: &Value, dir: &Path) -> Result<(Vec<OsString>, Option<FakeApiServer>), String> {
    let config = &case["config"];
    vectors::check_config_keys(config)?;
    let mut flags = Vec::new();
    for (node, names) in vectors::resource_exclude(config)? {
        for name in names {
            flags.push("--exclude-resource".into());
            flags.push(format!("{node}={name}").into());
        }
    }
    if let Some(ns) = config.get("watch_namespace").and_then(Value::as_str) {
        flags.push("--watch-namespace".into());
        flags.push(ns.into());
    }
    for e in vectors::pod_exclude(config) {
        flags.push("--exclude-pods".into());
        flags.push(format!("{}/{}", e.namespace_pattern, e.name_pattern).into());
    }
    flags.push("--pods-fingerprint-method".into());
    flags.push(
        vectors::fingerprint_method(config)?
            .map_or("none", |m| m.as_str())
            .into(),
    );
    let terminal = vectors::terminal_pods(config);
    let api = if terminal.is_empty() {
        None
    } else {
        // The API server knows every listed pod; the terminal ones have finished.
        let api = FakeApiServer::start()
            .await
            .map_err(|e| format!("fake API: {e}"))?;
        for p in vectors::pods(&case["list"])? {
            let key = (p.namespace.clone(), p.name.clone());
            let phase = if terminal.contains(&key) {
                "Succeeded"
            } else {
                "Running"
            };
            api.put(pod_object(&p.namespace, &p.name, phase));
        }
        let kubeconfig = api
            .write_kubeconfig(dir)
            .map_err(|e| format!("kubeconfig: {e}"))?;
        flags.push("--kubeconfig".into());
        flags.push(kubeconfig.into());
        Some(api)
    };
    Ok((flags, api))
}

fn pod_object(namespace: &str, name: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": numaplane_e2e::fake_kubelet::pod_uid(namespace, name),
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
        "status": {"phase": phase},
    })
}

/// Every attribute the binary must publish for `case`, written from the inputs alone (not by
/// the accounting code under test): what the vector pins, plus what it leaves out, namely the
/// Topology Manager defaults (no kubelet configuration source is configured, so the kubelet's
/// `container`/`none`), the machine's SMT width, and, when the pods were read from the API
/// server, where init containers' leftovers came from (the pod specs; no memory source).
fn expected_attributes(case: &Value) -> BTreeSet<(String, String)> {
    let mut want: BTreeSet<(String, String)> = vectors::expected_attributes(&case["expect"])
        .into_iter()
        .collect();
    let mut add = |name: &str, value: String| {
        if !want.iter().any(|(n, _)| n == name) {
            want.insert((name.to_owned(), value));
        }
    };
    add(attr::TOPOLOGY_MANAGER_SCOPE, "container".to_owned());
    add(attr::TOPOLOGY_MANAGER_POLICY, "none".to_owned());
    let threads = case["machine"]["numa_nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["smt_siblings"].as_array().into_iter().flatten())
        .filter_map(|core| core.as_array().map(Vec::len))
        .max()
        .unwrap_or(1);
    add(attr::THREADS_PER_CORE, threads.to_string());
    if !vectors::terminal_pods(&case["config"]).is_empty() {
        add(
            attr::INIT_HELD_SOURCE,
            "cpu=pod-spec,devices=pod-spec,memory=none".to_owned(),
        );
    }
    want
}

/// Runs one vector case through the binary and judges it.
async fn dry_run_case(case: &Value, opts: FakeKubeletOptions) -> Result<(Verdict, Run), String> {
    let name = case_name(case);
    let s = setup(&case["machine"]);
    let kubelet = FakeKubelet::start(
        &s.socket,
        vectors::allocatable(&case["allocatable"])?,
        vectors::pods(&case["list"])?,
        opts,
    )
    .await
    .map_err(|e| format!("fake kubelet: {e}"))?;
    let (flags, api) = config_flags(case, s.dir.path()).await?;
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(flags);
    let run = run_exporter(args, s.dir.path()).await;
    kubelet.stop().await;

    if run.code != Some(0) {
        return Err(format!("{name}: exit {:?}; stderr:\n{}", run.code, run.stderr));
    }
    let printed: NodeResourceTopology = serde_json::from_str(&run.stdout)
        .map_err(|e| format!("{name}: stdout is not an NRT: {e}\n{}", run.stdout))?;
    if printed.kind != nrt::KIND || printed.api_version != nrt::API_VERSION {
        return Err(format!("{name}: {} {}", printed.api_version, printed.kind));
    }
    if printed.metadata.name.as_deref() != Some(NODE) {
        return Err(format!("{name}: metadata.name {:?}", printed.metadata.name));
    }
    if kubelet.calls(Method::List) == 0 || kubelet.calls(Method::GetAllocatableResources) == 0 {
        return Err(format!("{name}: the kubelet was not read"));
    }
    if let Some(api) = &api {
        // Terminal pods come from this node's pods only.
        let listed = api.requests().iter().any(|r| {
            r.method == "GET"
                && r.path.ends_with("/pods")
                && r.query_param("fieldSelector").as_deref() == Some(format!("spec.nodeName={NODE}").as_str())
        });
        if !listed {
            return Err(format!(
                "{name}: no pod list with fieldSelector spec.nodeName={NODE}: {:?}",
                api.requests()
                    .iter()
                    .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
                    .collect::<Vec<_>>()
            ));
        }
    }
    let rounded = s.rounded.clone();
    let verdict = vectors::check_case_zones(case, &printed.zones, &|want| {
        vectors::apply_rounding(want, &rounded)
    })?;
    vectors::check_attributes(&printed, &case["expect"]).map_err(|e| format!("{name}: {e}"))?;
    vectors::check_free_devices(&printed.zones).map_err(|e| format!("{name}: {e}"))?;
    let published: BTreeSet<(String, String)> = printed
        .attributes
        .iter()
        .flatten()
        .map(|a| (a.name.clone(), a.value.clone()))
        .collect();
    let want = expected_attributes(case);
    if published != want {
        return Err(format!(
            "{name}: attributes {published:?}, want (from the inputs) {want:?}"
        ));
    }
    // No case configures a Topology Manager policy: the kubelet default `none` at any scope.
    if printed.topology_policies != Some(vec!["None".to_owned()]) {
        return Err(format!(
            "{name}: topologyPolicies {:?}, want [\"None\"]",
            printed.topology_policies
        ));
    }
    Ok((verdict, run))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_through_the_binary() {
    let root = vectors::embedded().unwrap();
    let cases = vectors::cases(&root);
    assert_eq!(cases.len(), vectors::CASE_COUNT, "the vectors changed");
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for case in cases {
        let name = case_name(case);
        match dry_run_case(case, FakeKubeletOptions::default()).await {
            Ok((verdict, run)) => {
                let rounded = vectors::representable_spec(&case["machine"])
                    .map(|(_, r)| r.len())
                    .unwrap_or_default();
                report.push(format!(
                    "{name}: {verdict:?} in {:?}{}",
                    run.elapsed,
                    if rounded > 0 {
                        format!(" ({rounded} hugepage pools rounded to whole pages)")
                    } else {
                        String::new()
                    }
                ));
            }
            Err(e) => failures.push(e),
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Neither Get nor Watch is needed: a kubelet answering UNIMPLEMENTED for both (every
/// kubelet before 1.27) gives the same object as one serving both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_reads_only_list_and_allocatable_even_where_watch_and_get_are_offered() {
    // `--once` is one scan: its object depends on List and GetAllocatableResources alone, so
    // it must not spend the kubelet's shared request budget on Watch or Get.
    let (case, s) = case_setup("rte-pod-fingerprint");
    let kubelet = start_kubelet(
        &s,
        vectors::allocatable(&case["allocatable"]).unwrap(),
        vectors::pods(&case["list"]).unwrap(),
        FakeKubeletOptions {
            watch: true,
            get: GetMode::Offered,
        },
    )
    .await;
    let (flags, _api) = config_flags(&case, s.dir.path()).await.unwrap();
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(flags);
    let run = run_exporter(args, s.dir.path()).await;
    run.nrt("rte-pod-fingerprint");
    assert_eq!(kubelet.calls(Method::Watch), 0);
    assert_eq!(kubelet.calls(Method::Get), 0);
    assert_eq!(kubelet.calls(Method::List), 1);
    assert_eq!(kubelet.calls(Method::GetAllocatableResources), 1);
    kubelet.stop().await;
}

/// A fake kubelet for `case` in `s`, for the tests that are about something else.
async fn kubelet_for(case: &Value, s: &Setup) -> FakeKubelet {
    start_kubelet(
        s,
        vectors::allocatable(&case["allocatable"]).unwrap(),
        vectors::pods(&case["list"]).unwrap(),
        FakeKubeletOptions::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_kubelet_config_is_a_warning_and_its_attributes_are_left_out() {
    // Distributions keep the file elsewhere or have none: never a failed (crash-looping) run.
    let (case, s) = case_setup("rte-no-pods");
    let kubelet = kubelet_for(&case, &s).await;

    let missing = s.dir.path().join("no-such-kubelet-config.yaml");
    for config in [missing.clone(), s.dir.path().to_owned()] {
        let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
        args.push("--kubelet-config".into());
        args.push(config.clone().into());
        let run = run_exporter(args, s.dir.path()).await;
        let nrt = run.nrt("unreadable --kubelet-config");
        for name in [
            attr::TOPOLOGY_MANAGER_POLICY,
            attr::TOPOLOGY_MANAGER_SCOPE,
            attr::CPU_MANAGER_POLICY,
        ] {
            assert_eq!(nrt.attribute(name), None, "{name} without a readable config");
        }
        assert!(
            run.stderr.contains("cannot read the kubelet configuration")
                && run.stderr.contains(&config.display().to_string()),
            "the warning should name the file:\n{}",
            run.stderr
        );
    }
    // A flag still says what it says.
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(os(&[
        "--topology-manager-policy",
        "restricted",
        "--kubelet-config",
    ]));
    args.push(missing.into());
    let nrt = run_exporter(args, s.dir.path()).await.nrt("policy by flag");
    assert_eq!(nrt.attribute(attr::TOPOLOGY_MANAGER_POLICY), Some("restricted"));
    assert_eq!(nrt.attribute(attr::TOPOLOGY_MANAGER_SCOPE), None);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_topology_xml_exits_64_with_one_line() {
    let (case, s) = case_setup("rte-no-pods");
    let kubelet = kubelet_for(&case, &s).await;
    std::fs::write(&s.xml, "<topology version=\"2.0\"><object").unwrap();
    let run = run_exporter(base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK), s.dir.path()).await;
    run.one_line_failure(EXIT_CONFIG, "truncated --topology-xml");
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flag_values_exit_64_with_one_line() {
    let (case, s) = case_setup("rte-no-pods");
    let kubelet = kubelet_for(&case, &s).await;
    for bad in [
        ["--pods-fingerprint-method", "sometimes"],
        ["--exclude-resource", "no-equals-sign"],
    ] {
        let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
        args.extend(os(&bad));
        let run = run_exporter(args, s.dir.path()).await;
        run.one_line_failure(EXIT_CONFIG, &bad.join(" "));
    }
    let run = run_exporter(base_args(&s.socket, &s.xml, "soon"), s.dir.path()).await;
    run.one_line_failure(EXIT_CONFIG, "--call-timeout soon");
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_that_is_not_grpc_exits_1_naming_the_socket() {
    let (_, s) = case_setup("rte-no-pods");
    let server = start_not_grpc(&s.socket).await.unwrap();
    let run = run_exporter(base_args(&s.socket, &s.xml, "2s"), s.dir.path()).await;
    server.abort();
    let line = run.one_line_failure(EXIT_KUBELET, "not a gRPC server");
    assert!(
        line.contains(&s.socket.display().to_string()),
        "the line should name the socket: {line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_socket_exits_1_within_the_timeout() {
    let (_, s) = case_setup("rte-no-pods");
    let run = run_exporter(base_args(&s.socket, &s.xml, "2s"), s.dir.path()).await;
    run.one_line_failure(EXIT_KUBELET, "no socket");
    // 2s of waiting plus process start-up on a loaded machine; a retry loop that ignores the
    // timeout would take far longer.
    assert!(
        run.elapsed < Duration::from_secs(12),
        "took {:?} for a 2s timeout",
        run.elapsed
    );
}

/// CPU ids the machine does not have and the same device id twice are worked around with a
/// log line, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspicious_kubelet_data_gives_output_and_a_log_line() {
    let (_, s) = case_setup("rte-no-pods");
    let on = |node: i64| {
        Some(TopologyInfo {
            nodes: vec![NumaNode { id: node }],
        })
    };
    let gpu = ContainerDevices {
        resource_name: "fake.io/gpu".into(),
        device_ids: vec!["gpu0".into()],
        topology: on(0),
    };
    let allocatable = AllocatableResourcesResponse {
        // 97 is not a CPU of the machine (0..=23).
        cpu_ids: vec![0, 1, 2, 3, 97],
        devices: vec![gpu.clone(), gpu.clone()],
        memory: vec![],
    };
    let pods = vec![PodResources {
        name: "p".into(),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "c".into(),
            cpu_ids: vec![2, 98],
            devices: vec![gpu],
            ..ContainerResources::default()
        }],
        ..PodResources::default()
    }];
    let kubelet = start_kubelet(
        &s,
        allocatable.clone(),
        pods.clone(),
        FakeKubeletOptions::default(),
    )
    .await;
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(os(&["--pods-fingerprint-method", "none"]));
    let run = run_exporter(args, s.dir.path()).await;
    kubelet.stop().await;
    let printed = run.nrt("suspicious data");
    let stderr = run.stderr.to_lowercase();
    assert!(
        stderr.contains("anomal") || stderr.contains("97") || stderr.contains("98"),
        "no log line about the bad data:\n{}",
        run.stderr
    );

    let machine = Machine::from_xml_file(&s.xml).unwrap();
    let acc = account(
        &MachineView::from(&machine),
        &allocatable,
        &numaplane::proto::podresources::ListPodResourcesResponse { pod_resources: pods },
        &AccountingConfig {
            node_name: NODE.into(),
            fingerprint_method: None,
            ..AccountingConfig::default()
        },
    )
    .unwrap();
    assert!(!acc.anomalies.is_empty());
    assert_eq!(printed.zones, acc.zones);
    // The duplicate is one GPU, and it is held.
    let node0 = printed
        .zones
        .iter()
        .find(|z| z.name == nrt::zone_name(0))
        .unwrap();
    let gpu_row = node0
        .resources
        .iter()
        .flatten()
        .find(|r| r.name == "fake.io/gpu")
        .unwrap();
    assert_eq!(
        (gpu_row.allocatable.0.as_str(), gpu_row.available.0.as_str()),
        ("1", "0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_config_file_sets_topology_manager_attributes() {
    let (case, s) = case_setup("rte-no-pods");
    let kubelet = kubelet_for(&case, &s).await;
    let config = s.dir.path().join("kubelet-config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         topologyManagerPolicy: single-numa-node\n\
         topologyManagerScope: pod\n\
         topologyManagerPolicyOptions:\n  max-allowable-numa-nodes: \"10\"\n",
    )
    .unwrap();
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(os(&["--pods-fingerprint-method", "none", "--kubelet-config"]));
    args.push(config.into());
    let printed = run_exporter(args, s.dir.path()).await.nrt("kubelet config");
    assert_eq!(
        printed.attribute(attr::TOPOLOGY_MANAGER_POLICY),
        Some("single-numa-node")
    );
    assert_eq!(printed.attribute(attr::TOPOLOGY_MANAGER_SCOPE), Some("pod"));
    assert_eq!(
        printed.attribute(attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES),
        Some("10")
    );
    assert_eq!(
        printed.topology_policies,
        Some(vec![
            nrt::legacy_topology_policy("single-numa-node", "pod").to_owned()
        ])
    );
    vectors::check_attributes(&printed, &json!({})).unwrap();

    // The same through flags, without a file; no max-NUMA attribute when nothing sets it.
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.extend(os(&[
        "--pods-fingerprint-method",
        "none",
        "--topology-manager-policy",
        "restricted",
        "--topology-manager-scope",
        "container",
    ]));
    let printed = run_exporter(args, s.dir.path()).await.nrt("flags");
    assert_eq!(
        printed.attribute(attr::TOPOLOGY_MANAGER_POLICY),
        Some("restricted")
    );
    assert_eq!(printed.attribute(attr::TOPOLOGY_MANAGER_SCOPE), Some("container"));
    assert_eq!(printed.attribute(attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES), None);
    assert_eq!(
        printed.topology_policies,
        Some(vec!["RestrictedContainerLevel".to_owned()])
    );
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_numa_machine_publishes_its_local_cost() {
    // hwloc reports no distance matrix for one NUMA node (the real capture in 1numa.xml has
    // none); RTE and NFD publish `node-0: 10`, and so must we.
    let s = fixture_setup("1numa.xml");
    let kubelet = cpu_kubelet(&s, vec![0, 1]).await;
    let run = run_exporter(base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK), s.dir.path()).await;
    let nrt = run.nrt("1numa.xml");
    assert_eq!(nrt.zones.len(), 1);
    let costs = nrt.zones[0].costs.as_ref().expect("costs published");
    assert_eq!(costs.len(), 1, "{costs:?}");
    assert_eq!((costs[0].name.as_str(), costs[0].value), ("node-0", 10));
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_topology_manager_setting_of_the_kubelet_config_is_published() {
    let s = fixture_setup("2numa.xml");
    let kubelet = cpu_kubelet(&s, (0..32).collect()).await;
    let config = s.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         topologyManagerPolicy: restricted\ntopologyManagerScope: pod\n\
         topologyManagerPolicyOptions:\n  prefer-closest-numa-nodes: \"true\"\n  max-allowable-numa-nodes: \"12\"\n\
         cpuManagerPolicy: static\ncpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\n\
         reservedSystemCPUs: \"0\"\nmemoryManagerPolicy: Static\n",
    )
    .unwrap();
    let mut args = base_args(&s.socket, &s.xml, CALL_TIMEOUT_OK);
    args.push("--kubelet-config".into());
    args.push(config.into());
    let nrt = run_exporter(args, s.dir.path()).await.nrt("kubelet config");
    for (name, value) in [
        (attr::TOPOLOGY_MANAGER_POLICY, "restricted"),
        (attr::TOPOLOGY_MANAGER_SCOPE, "pod"),
        (attr::TOPOLOGY_MANAGER_PREFER_CLOSEST, "true"),
        (attr::TOPOLOGY_MANAGER_MAX_NUMA_NODES, "12"),
        (attr::CPU_MANAGER_POLICY, "static"),
        (attr::CPU_MANAGER_POLICY_OPTIONS, "full-pcpus-only=true"),
        (attr::RESERVED_CPUS, "0"),
        (attr::MEMORY_MANAGER_POLICY, "Static"),
        // From the machine (2numa.xml: two threads per core).
        (attr::THREADS_PER_CORE, "2"),
    ] {
        assert_eq!(nrt.attribute(name), Some(value), "{name}: {:?}", nrt.attributes);
    }
    // Every CPU allocatable, none held: each zone's 8 two-thread cores are free.
    for z in &nrt.zones {
        assert_eq!(z.attribute(attr::FREE_CORES), Some("8"), "{z:?}");
    }
    kubelet.stop().await;
}
