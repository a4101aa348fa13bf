//! A small kustomize renderer for the subset `deploy/` uses, because `kubectl` cannot be
//! installed here (Debian's `kubernetes-client` is 1.20, whose built-in kustomize predates
//! components). What `kubectl kustomize DIR` does for these fields, this does too:
//!
//! - `resources`: YAML files (every document is an object) and directories with their own
//!   `kustomization.yaml`, rendered recursively, in order;
//! - `components`: directories whose `kustomization.yaml` is `kind: Component`, applied after
//!   the resources, in order (their resources added, then their patches applied to everything
//!   rendered so far);
//! - `patches` with `path` and a `target` (`group`, `version`, `kind`, `name`, `namespace`) and
//!   an RFC 6902 JSON patch in the file (`add`, `remove`, `replace`, `test`; `-` appends).
//!
//! Anything else (another field, a strategic-merge patch, a generator, a remote resource) is an
//! error rather than ignored, so a manifest change that needs a real kustomize fails here
//! instead of rendering differently. Two objects with the same group, kind, namespace and name
//! are an error, as in kustomize.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why rendering failed.
#[derive(Debug)]
pub struct RenderError(pub String);

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RenderError {}

fn err<T>(msg: impl Into<String>) -> Result<T, RenderError> {
    Err(RenderError(msg.into()))
}

/// The documents of a multi-document YAML file (empty documents skipped).
pub fn read_documents(path: &Path) -> Result<Vec<Value>, RenderError> {
    let text = std::fs::read_to_string(path).map_err(|e| RenderError(format!("{}: {e}", path.display())))?;
    let docs = serde_saphyr::from_multiple::<Value>(&text)
        .map_err(|e| RenderError(format!("{}: {e}", path.display())))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `kubectl kustomize dir`, for the subset above: every object, in kustomize's input order.
pub fn render(dir: &Path) -> Result<Vec<Value>, RenderError> {
    render_with(dir, &[])
}

/// [`render`] with `components` (directories) added after those the kustomization lists, as an
/// overlay `resources: [dir]` + `components: [...]` would.
pub fn render_with(dir: &Path, components: &[PathBuf]) -> Result<Vec<Value>, RenderError> {
    let mut objects = Vec::new();
    build(dir, "Kustomization", &mut objects)?;
    for c in components {
        build(c, "Component", &mut objects)?;
    }
    check_unique(&objects)?;
    Ok(objects)
}

fn kustomization(dir: &Path, kind: &str) -> Result<serde_json::Map<String, Value>, RenderError> {
    let path = dir.join("kustomization.yaml");
    let docs = read_documents(&path)?;
    let [doc] = docs.as_slice() else {
        return err(format!("{}: want one document", path.display()));
    };
    let map = doc
        .as_object()
        .cloned()
        .ok_or_else(|| RenderError(format!("{}: not a mapping", path.display())))?;
    let want_api = if kind == "Component" {
        "kustomize.config.k8s.io/v1alpha1"
    } else {
        "kustomize.config.k8s.io/v1beta1"
    };
    if map.get("kind").and_then(Value::as_str) != Some(kind)
        || map.get("apiVersion").and_then(Value::as_str) != Some(want_api)
    {
        return err(format!("{}: want {want_api} {kind}", path.display()));
    }
    for key in map.keys() {
        if !matches!(
            key.as_str(),
            "apiVersion" | "kind" | "resources" | "components" | "patches"
        ) {
            return err(format!(
                "{}: field {key:?} is not supported by this renderer",
                path.display()
            ));
        }
    }
    Ok(map)
}

fn strings(map: &serde_json::Map<String, Value>, key: &str, dir: &Path) -> Result<Vec<String>, RenderError> {
    match map.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| RenderError(format!("{}: {key}: {i} is not a string", dir.display())))
            })
            .collect(),
        Some(other) => err(format!("{}: {key}: {other} is not a list", dir.display())),
    }
}

fn local(dir: &Path, entry: &str) -> Result<PathBuf, RenderError> {
    if entry.contains("://") || entry.starts_with("github.com/") {
        return err(format!("{}: remote {entry} is not supported", dir.display()));
    }
    Ok(dir.join(entry))
}

fn build(dir: &Path, kind: &str, objects: &mut Vec<Value>) -> Result<(), RenderError> {
    let k = kustomization(dir, kind)?;
    for r in strings(&k, "resources", dir)? {
        let path = local(dir, &r)?;
        if path.is_dir() {
            build(&path, "Kustomization", objects)?;
        } else {
            for d in read_documents(&path)? {
                if !(d["apiVersion"].is_string()
                    && d["kind"].is_string()
                    && d["metadata"]["name"].is_string())
                {
                    return err(format!("{}: not a Kubernetes object: {d}", path.display()));
                }
                objects.push(d);
            }
        }
    }
    for c in strings(&k, "components", dir)? {
        build(&local(dir, &c)?, "Component", objects)?;
    }
    for p in k.get("patches").and_then(Value::as_array).into_iter().flatten() {
        apply_patch(dir, p, objects)?;
    }
    Ok(())
}

fn apply_patch(dir: &Path, patch: &Value, objects: &mut [Value]) -> Result<(), RenderError> {
    let Some(file) = patch["path"].as_str() else {
        return err(format!(
            "{}: only patches with a path are supported: {patch}",
            dir.display()
        ));
    };
    let target = &patch["target"];
    if !target.is_object() {
        return err(format!("{}: patch {file} has no target", dir.display()));
    }
    let path = local(dir, file)?;
    let docs = read_documents(&path)?;
    let [Value::Array(ops)] = docs.as_slice() else {
        return err(format!(
            "{}: not a JSON patch (a list of operations)",
            path.display()
        ));
    };
    let mut matched = 0;
    for obj in objects.iter_mut().filter(|o| targets(target, o)) {
        for op in ops {
            apply_op(obj, op).map_err(|e| RenderError(format!("{}: {e}", path.display())))?;
        }
        matched += 1;
    }
    if matched == 0 {
        return err(format!("{}: patch {file} matches no object", dir.display()));
    }
    Ok(())
}

fn targets(target: &Value, obj: &Value) -> bool {
    let api = obj["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
    let field = |k: &str| target[k].as_str();
    field("group").is_none_or(|g| g == group)
        && field("version").is_none_or(|v| v == version)
        && field("kind").is_none_or(|k| Some(k) == obj["kind"].as_str())
        && field("name").is_none_or(|n| Some(n) == obj["metadata"]["name"].as_str())
        && field("namespace").is_none_or(|n| Some(n) == obj["metadata"]["namespace"].as_str())
}

/// The parent of the location `pointer` names, and the last (unescaped) token.
fn parent<'a>(doc: &'a mut Value, pointer: &str) -> Result<(&'a mut Value, String), String> {
    let tokens: Vec<String> = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("path {pointer:?} does not start with /"))?
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let (last, init) = tokens.split_last().ok_or("empty path")?;
    let mut cur = doc;
    for t in init {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("path {pointer:?}: no {t:?}"))?;
    }
    Ok((cur, last.clone()))
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let name = op["op"].as_str().ok_or_else(|| format!("no op in {op}"))?;
    let pointer = op["path"].as_str().ok_or_else(|| format!("no path in {op}"))?;
    let (parent, last) = parent(doc, pointer)?;
    let index = |a: &Vec<Value>, allow_end: bool| -> Result<usize, String> {
        let i = if last == "-" && allow_end {
            a.len()
        } else {
            last.parse::<usize>()
                .map_err(|_| format!("{pointer}: bad index {last:?}"))?
        };
        if i > a.len() || (!allow_end && i == a.len()) {
            return Err(format!("{pointer}: index {i} out of range"));
        }
        Ok(i)
    };
    match (name, parent) {
        ("add", Value::Object(m)) => {
            m.insert(last, op["value"].clone());
        }
        ("add", Value::Array(a)) => {
            let i = index(a, true)?;
            a.insert(i, op["value"].clone());
        }
        ("replace", Value::Object(m)) if m.contains_key(&last) => {
            m.insert(last, op["value"].clone());
        }
        ("replace", Value::Array(a)) => {
            let i = index(a, false)?;
            a[i] = op["value"].clone();
        }
        ("remove", Value::Object(m)) => {
            m.remove(&last)
                .ok_or_else(|| format!("{pointer}: nothing to remove"))?;
        }
        ("remove", Value::Array(a)) => {
            let i = index(a, false)?;
            a.remove(i);
        }
        ("test", Value::Object(m)) if m.get(&last) == Some(&op["value"]) => {}
        ("test", Value::Array(a)) if index(a, false).is_ok_and(|i| a[i] == op["value"]) => {}
        (other, _) => return Err(format!("op {other} at {pointer} cannot be applied")),
    }
    Ok(())
}

fn check_unique(objects: &[Value]) -> Result<(), RenderError> {
    let mut seen = std::collections::BTreeSet::new();
    for o in objects {
        let api = o["apiVersion"].as_str().unwrap_or_default();
        let group = api.rsplit_once('/').map_or("", |(g, _)| g);
        let id = (
            group.to_owned(),
            o["kind"].as_str().unwrap_or_default().to_owned(),
            o["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
            o["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        );
        if !seen.insert(id.clone()) {
            return err(format!("two objects {id:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"a": {"b": [1, 2]}});
        apply_op(&mut d, &json!({"op": "add", "path": "/a/b/-", "value": 3})).unwrap();
        apply_op(&mut d, &json!({"op": "add", "path": "/a/b/0", "value": 0})).unwrap();
        apply_op(&mut d, &json!({"op": "replace", "path": "/a/b/1", "value": 9})).unwrap();
        apply_op(&mut d, &json!({"op": "add", "path": "/a/c~1d", "value": "x"})).unwrap();
        apply_op(&mut d, &json!({"op": "remove", "path": "/a/b/3"})).unwrap();
        assert_eq!(d, json!({"a": {"b": [0, 9, 2], "c/d": "x"}}));
        assert!(apply_op(&mut d, &json!({"op": "replace", "path": "/a/zz", "value": 1})).is_err());
        assert!(apply_op(&mut d, &json!({"op": "add", "path": "/a/b/7", "value": 1})).is_err());
        assert!(apply_op(&mut d, &json!({"op": "move", "path": "/a/b/0", "from": "/a/c"})).is_err());
        assert!(apply_op(&mut d, &json!({"op": "test", "path": "/a/b/0", "value": 1})).is_err());
    }
}
