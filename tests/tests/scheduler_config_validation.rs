//! Every KubeSchedulerConfiguration the project ships or shows passes the real kube-scheduler
//! v1.36.2's own validation (`control-plane validate-scheduler-config` of ../shared/k8s: strict
//! decoding, defaulting, validation, every profile and plugin built). Unit tests of our reading
//! of the rules are not enough: the shipped extender config once named `cpu` in
//! `managedResources`, which kube-scheduler's validation refuses, and kube-scheduler exited.
//!
//! Checked: every YAML document under deploy/ and examples/ of kind KubeSchedulerConfiguration,
//! also when embedded in a ConfigMap's data, and every fenced code block of README.md,
//! deploy/README.md and docs/*.md that holds one.
//!
//! Without ../shared/k8s (a fresh clone) the test prints what it skipped and how to run it;
//! with `CI=true`, a missing kit or a validator that cannot run fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use numaplane_e2e::control_plane;
use serde_json::Value;

fn repo() -> PathBuf {
    control_plane::repo_root()
}

/// The control-plane script of the kit, or `None` after one line saying what was skipped and
/// how to run it (a fresh clone); with `CI=true`, where the kit always is, a missing kit fails.
fn kit() -> Option<PathBuf> {
    if let Some(script) = control_plane::kit() {
        return Some(script);
    }
    let why = format!(
        "{} not found: the real kube-scheduler's validation of the shipped KubeSchedulerConfigurations was not run \
         (put the k8s kit at ../shared/k8s and run `cargo test -p numaplane-e2e --test scheduler_config_validation`)",
        repo().join("../shared/k8s/control-plane").display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true: {why}");
    println!("SKIPPED: {why}");
    None
}

/// One configuration found in the repository.
struct Found {
    /// `file:line` (line of a Markdown block) or `file` (`[key]` for ConfigMap data).
    source: String,
    text: String,
}

fn is_scheduler_config(v: &Value) -> bool {
    v["kind"] == "KubeSchedulerConfiguration"
}

/// The YAML files under `dir`, recursively, sorted.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

/// Splits a YAML stream into its documents' texts (kube-scheduler reads one document).
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let last = docs.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
    }
    docs.retain(|d| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

fn from_yaml_files(root: &Path, out: &mut Vec<Found>) {
    let mut files = Vec::new();
    for dir in ["deploy", "examples"] {
        yaml_files(&root.join(dir), &mut files);
    }
    for f in files {
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        if !text.contains("KubeSchedulerConfiguration") {
            continue;
        }
        for doc in documents(&text) {
            let v: Value = serde_saphyr::from_str(&doc).unwrap_or_else(|e| panic!("{rel}: {e}"));
            if is_scheduler_config(&v) {
                out.push(Found {
                    source: rel.clone(),
                    text: doc,
                });
            } else if v["kind"] == "ConfigMap" {
                for (key, data) in v["data"].as_object().into_iter().flatten() {
                    let data = data.as_str().unwrap_or_default();
                    let parsed: Option<Value> = serde_saphyr::from_str(data).ok();
                    if parsed.as_ref().is_some_and(is_scheduler_config) {
                        out.push(Found {
                            source: format!("{rel} [ConfigMap {} {key}]", v["metadata"]["name"]),
                            text: data.to_owned(),
                        });
                    }
                }
            }
        }
    }
}

fn from_markdown(root: &Path, out: &mut Vec<Found>) {
    let mut files = vec![root.join("README.md"), root.join("deploy/README.md")];
    for dir in ["docs", "examples"] {
        let mut md: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        md.sort();
        files.extend(md);
    }
    for f in files {
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let mut block: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let fence = line.trim_start().starts_with("```");
            match (&mut block, fence) {
                (None, true) => block = Some((i + 2, String::new())),
                (Some(_), true) => {
                    let (at, body) = block.take().unwrap();
                    if body.contains("kind: KubeSchedulerConfiguration") {
                        out.push(Found {
                            source: format!("{rel}:{at}"),
                            text: body,
                        });
                    }
                }
                (Some((_, body)), false) => {
                    body.push_str(line);
                    body.push('\n');
                }
                (None, false) => {}
            }
        }
    }
}

/// Every KubeSchedulerConfiguration the repository ships or shows.
fn configurations() -> Vec<Found> {
    let root = repo();
    let mut out = Vec::new();
    from_yaml_files(&root, &mut out);
    from_markdown(&root, &mut out);
    out
}

/// The file kube-scheduler reads: `text` with its `clientConnection.kubeconfig` (a path on a
/// control-plane node, which kube-scheduler requires to exist) pointed at `kubeconfig`.
fn runnable(text: &str, kubeconfig: &Path) -> String {
    let re = regex::Regex::new(r"(?m)^(\s+kubeconfig:\s*)\S.*$").unwrap();
    re.replace_all(text, |c: &regex::Captures<'_>| {
        format!("{}{}", &c[1], kubeconfig.display())
    })
    .into_owned()
}

/// kube-scheduler's verdict on `text`: `Ok` or its error.
fn validate(script: &Path, dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let kubeconfig = dir.join("scheduler.conf");
    std::fs::write(&kubeconfig, "").unwrap();
    let file = dir.join(name);
    std::fs::write(&file, runnable(text, &kubeconfig)).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(script).arg("validate-scheduler-config").arg(&file);
    if std::env::var_os("CONTROL_PLANE_CACHE").is_none() {
        // Unpacked once, shared with the control planes of the other test binaries.
        cmd.env("CONTROL_PLANE_CACHE", repo().join("target/control-plane-cache"));
    }
    let out = cmd
        .output()
        .expect("running control-plane validate-scheduler-config");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        Some(0) => Ok(()),
        // 1: kube-scheduler refused it. Anything else: the validator itself could not run,
        // which is never a pass.
        Some(1) if said.contains("invalid:") => Err(said.trim().to_owned()),
        _ => panic!("validate-scheduler-config could not run ({}): {said}", out.status),
    }
}

#[test]
fn the_configurations_found_include_the_shipped_and_documented_ones() {
    let found = configurations();
    let sources: Vec<&str> = found.iter().map(|f| f.source.as_str()).collect();
    // The shipped one (deploy/extender's ConfigMap) and the two shown in docs/extender.md.
    assert!(
        sources
            .iter()
            .any(|s| s.starts_with("deploy/extender/extender.yaml [ConfigMap")),
        "{sources:?}"
    );
    assert!(
        sources
            .iter()
            .filter(|s| s.starts_with("docs/extender.md:"))
            .count()
            >= 2,
        "{sources:?}"
    );
}

#[test]
fn every_shipped_and_documented_scheduler_config_passes_kube_schedulers_validation() {
    let Some(script) = kit() else { return };
    let dir = tempfile::tempdir().unwrap();
    let found = configurations();
    assert!(!found.is_empty());
    let failures: Vec<String> = found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            validate(&script, dir.path(), &format!("config-{i}.yaml"), &f.text)
                .err()
                .map(|e| format!("{}: {e}", f.source))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "kube-scheduler v1.36.2 refuses:\n{}",
        failures.join("\n")
    );
}

/// The check can fail: the config that made kube-scheduler exit (native resources in
/// `managedResources`) is refused with kube-scheduler's own message, and so is a misspelt field.
#[test]
fn kube_schedulers_validation_refuses_native_managed_resources() {
    let Some(script) = kit() else { return };
    let dir = tempfile::tempdir().unwrap();
    let shipped = configurations()
        .into_iter()
        .find(|f| f.source.starts_with("deploy/extender/extender.yaml"))
        .unwrap();
    let mut native = shipped.text.clone();
    native.push_str(
        "    managedResources:\n      - name: cpu\n        ignoredByScheduler: false\n      - name: hugepages-2Mi\n        ignoredByScheduler: false\n",
    );
    let err = validate(&script, dir.path(), "native.yaml", &native).unwrap_err();
    assert!(
        err.contains(r#"extenders[0].managedResources[0].name: Invalid value: "cpu": is an invalid extended resource name"#),
        "{err}"
    );
    let devices = format!(
        "{}    managedResources:\n      - name: example.com/gpu\n        ignoredByScheduler: false\n",
        shipped.text
    );
    validate(&script, dir.path(), "devices.yaml", &devices).unwrap();
    let misspelt = shipped.text.replace("nodeCacheCapable:", "nodeCacheCapabel:");
    let err = validate(&script, dir.path(), "misspelt.yaml", &misspelt).unwrap_err();
    assert!(err.contains("nodeCacheCapabel"), "{err}");
}

#[test]
fn markdown_and_configmap_extraction() {
    let kc = Path::new("/tmp/k");
    assert_eq!(
        runnable(
            "clientConnection:\n  kubeconfig: /etc/kubernetes/scheduler.conf\n",
            kc
        ),
        "clientConnection:\n  kubeconfig: /tmp/k\n"
    );
    assert_eq!(documents("# c\n---\na: 1\n---\n\nb: 2\n").len(), 2);
}
