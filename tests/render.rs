//! Manifests as a cluster gets them: `kubectl kustomize` (kubectl 1.21 or later, whose
//! kustomize has components; `scripts/setup` checks that it is installed), and the documents of
//! multi-document YAML.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};
use serde_json::Value;

/// The documents of multi-document YAML text (empty documents skipped).
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs = serde_saphyr::from_multiple::<Value>(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The documents of a multi-document YAML file (empty documents skipped).
pub fn read_documents(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    documents(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `kubectl kustomize dir`, with `components` (directories of `kind: Component`) added as an
/// overlay `resources: [dir]`, `components: [...]` would add them: every object rendered.
///
/// kustomize refuses absolute paths in a kustomization, so the overlay, in a temporary
/// directory, names `dir` and the components by paths relative to itself.
pub fn kustomize(dir: &Path, components: &[PathBuf]) -> Result<Vec<Value>, String> {
    let text = with_overlay(dir, components, |root| {
        let mut cmd = Command::new("kubectl");
        cmd.arg("kustomize").arg(root);
        run_kubectl(cmd, &format!("kubectl kustomize {}", dir.display()))
    })?;
    documents(&text).map_err(|e| format!("kubectl kustomize {}: {e}", dir.display()))
}

/// `kubectl --kubeconfig <kubeconfig> apply -k dir` with `components` added as
/// [`kustomize`] adds them: what a user runs to install the bundle. Returns kubectl's output.
pub fn apply(dir: &Path, components: &[PathBuf], kubeconfig: &Path) -> Result<String, String> {
    with_overlay(dir, components, |root| {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("apply")
            .arg("-k")
            .arg(root);
        run_kubectl(cmd, &format!("kubectl apply -k {}", dir.display()))
    })
}

/// Calls `f` with `dir`, or with an overlay of `dir` and `components` in a temporary directory.
fn with_overlay<T>(
    dir: &Path,
    components: &[PathBuf],
    f: impl FnOnce(&Path) -> Result<T, String>,
) -> Result<T, String> {
    if components.is_empty() {
        return f(dir);
    }
    let overlay = tempfile::tempdir().map_err(|e| format!("overlay directory: {e}"))?;
    let here = canonical(overlay.path())?;
    let entry = |p: &Path| -> Result<Value, String> {
        let rel = relative(&here, &canonical(p)?);
        rel.to_str()
            .map(|s| Value::String(s.to_owned()))
            .ok_or_else(|| format!("{} is not UTF-8", rel.display()))
    };
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [entry(dir)?],
        "components": components.iter().map(|c| entry(c)).collect::<Result<Vec<_>, _>>()?,
    });
    // JSON is YAML.
    std::fs::write(here.join("kustomization.yaml"), kustomization.to_string())
        .map_err(|e| format!("overlay kustomization: {e}"))?;
    f(&here)
}

/// Runs a kubectl command; its stdout, or an error naming `what` with its stderr.
pub fn run_kubectl(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: {e} (scripts/setup says how to install kubectl)"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{what}: {e}"))
}

fn canonical(p: &Path) -> Result<PathBuf, String> {
    p.canonicalize().map_err(|e| format!("{}: {e}", p.display()))
}

/// The path from directory `from` to `to`, both absolute and canonical.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component<'_>> = from.components().collect();
    let to: Vec<Component<'_>> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel: PathBuf = from[common..].iter().map(|_| Component::ParentDir).collect();
    rel.extend(&to[common..]);
    rel
}

/// The value of a container's environment variable `name`, when `value` sets it.
pub fn env_value(c: &Container, name: &str) -> Option<String> {
    env_var(c, name).and_then(|e| e.value.clone())
}

/// The field path of a container's environment variable `name`, when a `fieldRef` sets it.
pub fn env_field(c: &Container, name: &str) -> Option<String> {
    env_var(c, name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone())
}

fn env_var<'c>(c: &'c Container, name: &str) -> Option<&'c k8s_openapi::api::core::v1::EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

/// The value a container gives flag `name` in its command or arguments (`--flag value` or
/// `--flag=value`).
pub fn arg_value(c: &Container, name: &str) -> Option<String> {
    let args: Vec<&String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .collect();
    args.iter().enumerate().find_map(|(i, a)| {
        if a.as_str() == name {
            args.get(i + 1).map(|v| (*v).clone())
        } else {
            a.strip_prefix(&format!("{name}=")).map(str::to_owned)
        }
    })
}

/// What a container uses for a flag `name` of its binary (`f`, from its `--help`): its
/// argument, else its environment variable, else the flag's default.
pub fn effective(c: &Container, name: &str, f: &crate::binaries::Flag) -> Option<String> {
    arg_value(c, name)
        .or_else(|| f.env.as_deref().and_then(|env| env_value(c, env)))
        .or_else(|| f.default.clone())
}

/// The container's volume mount that holds `path` (the deepest), with its volume of `spec`.
pub fn mount_of<'a>(c: &'a Container, spec: &'a PodSpec, path: &str) -> (&'a VolumeMount, &'a Volume) {
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| Path::new(path).starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("no volume mount holds {path}"));
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("no volume {}", mount.name));
    (mount, volume)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn relative_paths() {
        let r = |a: &str, b: &str| relative(Path::new(a), Path::new(b));
        assert_eq!(r("/tmp/x", "/work/deploy"), Path::new("../../work/deploy"));
        assert_eq!(r("/work", "/work/deploy/extender"), Path::new("deploy/extender"));
        assert_eq!(r("/work/a/b", "/work/c"), Path::new("../../c"));
    }

    #[test]
    fn kustomize_adds_components_from_elsewhere() {
        let base = tempfile::tempdir().unwrap();
        let write = |p: &Path, text: &str| std::fs::write(p, text).unwrap();
        write(
            &base.path().join("kustomization.yaml"),
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [cm.yaml]\n",
        );
        write(
            &base.path().join("cm.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: base}\n",
        );
        let component = tempfile::tempdir().unwrap();
        write(
            &component.path().join("kustomization.yaml"),
            r#"apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
patches:
  - target: {kind: ConfigMap, name: a}
    patch: '[{"op": "replace", "path": "/data/k", "value": "patched"}]'
"#,
        );
        let plain = kustomize(base.path(), &[]).unwrap();
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0]["data"]["k"], "base");
        let patched = kustomize(base.path(), &[component.path().to_owned()]).unwrap();
        assert_eq!(patched.len(), 1);
        assert_eq!(patched[0]["data"]["k"], "patched");
        let missing = kustomize(base.path(), &[base.path().join("nowhere")]).unwrap_err();
        assert!(missing.contains("nowhere"), "{missing}");
        let not_a_component = kustomize(base.path(), &[base.path().to_owned()]).unwrap_err();
        assert!(not_a_component.contains("kubectl kustomize"), "{not_a_component}");
    }

    #[test]
    fn documents_skip_empty_ones() {
        let docs = documents("---\na: 1\n---\n---\nb: [x]\n").unwrap();
        assert_eq!(
            docs,
            vec![serde_json::json!({"a": 1}), serde_json::json!({"b": ["x"]})]
        );
    }
}
