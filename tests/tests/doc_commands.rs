//! Every shell command the README and the docs show runs as written.
//!
//! Each ```sh / ```bash block of README.md, docs/*.md and deploy/README.md runs as one bash
//! script (`set -euo pipefail`) in a scratch copy of the repository, and must succeed. The
//! commands run for real where that is possible here: `cargo run` runs the binaries the suite
//! built (through tests/bin/doc_shim.rs, which chooses the binary exactly as cargo does, so a
//! command cargo would refuse fails here too); `kubectl get` and `kubectl numa` talk to the fake
//! API server holding the demo cluster (examples/); the exporter reads a fake kubelet's
//! pod-resources socket; servers must still be serving after a few seconds. What needs a real
//! cluster, a container runtime or a registry (`kubectl apply`, `rollout status`, `describe`,
//! `ctr`, `kind`, `docker`, `podman`, `skopeo`) is checked with `--help` (and `apply -k` renders with the real
//! `kubectl kustomize`). `./scripts/test` is the suite itself and is not run from inside it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use numaplane_e2e::{
    fake_api::FakeApiServer,
    fake_kubelet::{FakeKubelet, FakeKubeletOptions},
};
use serde_json::Value;

/// A fenced shell block: where it is and what it says.
struct Block {
    file: String,
    line: usize,
    text: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The ```sh, ```bash and ```shell blocks of the user-facing Markdown files.
fn blocks() -> Vec<Block> {
    let root = repo();
    let mut files = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut current: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let fence = line.trim_start().strip_prefix("```");
            match (&mut current, fence) {
                (None, Some(info)) if matches!(info.trim(), "sh" | "bash" | "shell") => {
                    current = Some((i + 2, String::new()));
                }
                (Some(_), Some(_)) => {
                    let (line, text) = current.take().unwrap();
                    out.push(Block {
                        file: f.strip_prefix(&root).unwrap().display().to_string(),
                        line,
                        text,
                    });
                }
                (Some((_, body)), None) => {
                    body.push_str(line);
                    body.push('\n');
                }
                (None, _) => {}
            }
        }
    }
    out
}

/// Copies the repository's sources (not `target/` or `.git`) so that commands that write files
/// (`> deploy/crd.yaml`, `cargo build`) change nothing in the checkout.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&e.path(), &to.join(&name));
        } else if ty.is_file() {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Package → binaries, `default-run`, tests and benches, from `cargo metadata`.
fn cargo_table() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut table = serde_json::Map::new();
    for p in meta["packages"].as_array().unwrap() {
        let of_kind = |k: &str| -> Vec<Value> {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["kind"].as_array().unwrap().iter().any(|x| x == k))
                .map(|t| t["name"].clone())
                .collect()
        };
        table.insert(
            p["name"].as_str().unwrap().to_owned(),
            serde_json::json!({
                "bins": of_kind("bin"), "default_run": p["default_run"],
                "tests": of_kind("test"), "benches": of_kind("bench"),
            }),
        );
    }
    Value::Object(table)
}

/// The objects of a generated example file (JSON documents separated by `---`).
fn example_objects(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .split("\n---\n")
        .map(str::trim)
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Functions the blocks run under: tools that need a container runtime or a cluster of their
/// own are checked with `--help` where installed, and said to be skipped where not.
const PRELUDE: &str = r#"set -euo pipefail
doc_external() { local t=$1; shift
  if command -v "$t" >/dev/null 2>&1; then command "$t" "$@" --help >/dev/null
  else echo "doc check: $t is not installed here; \`$t $*\` not run" >&2; fi; }
ctr() { doc_external ctr "$@"; }
kind() { doc_external kind "$@"; }
docker() { doc_external docker "$@"; }
podman() { doc_external podman "$@"; }
skopeo() { doc_external skopeo "$@"; }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shell_command_in_the_readme_and_docs_runs_as_written() {
    let root = repo();
    let work = tempfile::tempdir().unwrap();
    let checkout = work.path().join("numaplane");
    copy_tree(&root, &checkout);
    let home = work.path().join("home");
    std::fs::create_dir_all(home.join(".local/bin")).unwrap();

    // The stand-ins, under the names the docs use.
    let shim_dir = work.path().join("shims");
    std::fs::create_dir_all(&shim_dir).unwrap();
    for name in ["cargo", "kubectl", "numaplane-scheduler", "numaplane-exporter"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_numaplane-doc-shim"), shim_dir.join(name)).unwrap();
    }
    let table = work.path().join("cargo-table.json");
    std::fs::write(&table, cargo_table().to_string()).unwrap();
    let bin_dir = numaplane_e2e::binaries::scheduler()
        .parent()
        .unwrap()
        .to_path_buf();
    for b in [
        numaplane_e2e::binaries::exporter(),
        numaplane_e2e::binaries::kubectl_numa(),
    ] {
        assert_eq!(b.parent().unwrap(), bin_dir);
    }
    let crdgen = bin_dir.join("numaplane-crdgen");
    if !crdgen.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "numaplane", "--bin", "numaplane-crdgen"])
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let real_kubectl = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v kubectl"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    assert!(
        !real_kubectl.is_empty(),
        "kubectl is needed (scripts/setup checks for it)"
    );

    // The demo cluster on the fake API server, with its pods pending.
    let api = FakeApiServer::start().await.unwrap();
    api.install_nrt_crd();
    for o in example_objects(&root.join("examples/cluster.yaml"))
        .into_iter()
        .chain(example_objects(&root.join("examples/pods.yaml")))
    {
        api.put(o);
    }
    let kubeconfig = api.write_kubeconfig(work.path()).unwrap();
    let socket = work.path().join("kubelet.sock");
    let _kubelet = FakeKubelet::start(
        &socket,
        Default::default(),
        Vec::new(),
        FakeKubeletOptions::default(),
    )
    .await
    .unwrap();

    let path = format!(
        "{}:{}:{}",
        shim_dir.display(),
        home.join(".local/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let env: BTreeMap<&str, String> = [
        ("PATH", path),
        ("HOME", home.display().to_string()),
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("NODE_NAME", "cpu-a".into()),
        ("NUMAPLANE_PODRESOURCES_SOCKET", socket.display().to_string()),
        ("NUMAPLANE_DOC_BIN_DIR", bin_dir.display().to_string()),
        ("NUMAPLANE_DOC_CARGO_TABLE", table.display().to_string()),
        ("NUMAPLANE_DOC_REAL_KUBECTL", real_kubectl),
    ]
    .into();

    let blocks = blocks();
    assert!(blocks.len() >= 10, "only {} shell blocks found", blocks.len());
    let mut failures = Vec::new();
    let mut ran = 0;
    for b in &blocks {
        // The suite itself (CI runs it): checked to exist and to be what .ci/run calls.
        let text = b.text.replace("./scripts/test", ": scripts/test");
        let mut cmd = Command::new("timeout");
        cmd.args(["300", "bash", "-c"])
            .arg(format!("{PRELUDE}{text}"))
            .current_dir(&checkout)
            .env_clear()
            .envs(&env);
        // Blocking, off the runtime that serves the fake API server and the fake kubelet.
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        ran += 1;
        if !out.status.success() {
            failures.push(format!(
                "{}:{} ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
                b.file,
                b.line,
                out.status,
                b.text,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} blocks fail:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == "exec scripts/test"), "{ci}");
}

/// The stand-in refuses what cargo refuses: the bug of a README command that no test ran.
#[test]
fn the_cargo_stand_in_refuses_a_package_with_two_binaries_and_no_default_run() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.json");
    std::fs::write(
        &table,
        r#"{"two": {"bins": ["a", "b"], "default_run": null, "tests": [], "benches": []}}"#,
    )
    .unwrap();
    let cargo = dir.path().join("cargo");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_numaplane-doc-shim"), &cargo).unwrap();
    let out = Command::new(&cargo)
        .args(["run", "-p", "two", "--", "simulate"])
        .env("NUMAPLANE_DOC_CARGO_TABLE", &table)
        .env("NUMAPLANE_DOC_BIN_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not determine which binary to run"),
        "{stderr}"
    );
}

/// What `cargo tree --prefix none --format <format> args…` prints, one line a crate.
fn cargo_tree(format: &str, args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--locked",
            "--offline",
            "--prefix",
            "none",
            "--format",
            format,
        ])
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Crate → the feature sets cargo resolves for it, per `cargo tree` over `args`.
fn resolved_features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let text = cargo_tree("{p} [{f}]", args);
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.replace(" (*)", "").replace(" (proc-macro)", "");
        let Some((krate, features)) = line.split_once(" [") else {
            continue;
        };
        if krate.starts_with("numaplane") {
            continue;
        }
        map.entry(krate.to_owned())
            .or_default()
            .insert(features.to_owned());
    }
    map
}

/// `./scripts/demo` runs `cargo run -p numaplane-scheduler`. Cargo resolves features for the
/// packages a command names, so unless the scheduler alone asks for every feature the whole
/// workspace turns on (workspace-hack/), the demo builds a second copy of the dependencies
/// after the test build: 90 s of the suite on a fresh machine.
#[test]
fn the_demo_build_resolves_the_features_of_the_test_build() {
    let alone = resolved_features(&["-p", "numaplane-scheduler", "-e", "normal,build"]);
    let workspace = resolved_features(&["--workspace", "-e", "normal,build,dev"]);
    let differ: Vec<String> = alone
        .iter()
        .filter_map(|(krate, features)| {
            let all = workspace.get(krate)?;
            (features != all).then(|| format!("{krate}: {features:?} alone, {all:?} in the workspace"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "add these features to workspace-hack/Cargo.toml:\n{}",
        differ.join("\n")
    );
}

/// The crates `cargo tree -e normal` lists under `package` (names only).
fn normal_graph(package: &str) -> BTreeSet<String> {
    cargo_tree("{p}", &["-p", package, "-e", "normal"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The scheduling model is pure by its manifest: no kube client or runtime, no async runtime,
/// no HTTP or gRPC stack anywhere in its normal dependencies (the shared crate's kubelet APIs
/// and server are features the model does not turn on). The scheduler's own graph has them,
/// which shows the query reads what it should.
#[test]
fn the_model_crate_has_no_client_runtime_or_server_in_its_graph() {
    const FORBIDDEN: [&str; 8] = [
        "kube",
        "kube-client",
        "kube-runtime",
        "tokio",
        "hyper",
        "tonic",
        "warp",
        "tower",
    ];
    let model = normal_graph("numaplane-model");
    assert!(
        model.contains("numaplane") && model.contains("k8s-openapi") && model.contains("cel"),
        "{model:?}"
    );
    let found: Vec<&str> = FORBIDDEN.into_iter().filter(|c| model.contains(*c)).collect();
    assert!(found.is_empty(), "numaplane-model depends on {found:?}");
    let front = normal_graph("numaplane-scheduler");
    for c in ["numaplane-model", "kube", "tokio", "warp"] {
        assert!(front.contains(c), "numaplane-scheduler lacks {c}: {front:?}");
    }
}
