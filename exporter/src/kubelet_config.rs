//! The part of the kubelet's `KubeletConfiguration` that the published object carries: the
//! Topology Manager policy, scope and policy options (`max-allowable-numa-nodes`,
//! `prefer-closest-numa-nodes`) and the CPU and memory manager settings. Read from the kubelet's
//! `/configz` answer ([`parse_configz`]) or from its config file and drop-in directory
//! ([`read_files`]); both end in the same document checks ([`parse_value`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Topology Manager policies the kubelet accepts.
pub const POLICIES: [&str; 4] = ["none", "best-effort", "restricted", "single-numa-node"];
/// Topology Manager scopes the kubelet accepts.
pub const SCOPES: [&str; 2] = ["container", "pod"];
pub use numaplane::nrt::kubelet_option::{
    MAX_ALLOWABLE_NUMA_NODES as MAX_ALLOWABLE_NUMA_NODES_OPTION,
    PREFER_CLOSEST_NUMA_NODES as PREFER_CLOSEST_NUMA_NODES_OPTION,
};

/// The kubelet's resource-manager settings the exporter publishes: the Topology Manager's policy,
/// scope and options, and the CPU and memory managers' settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceManagerSettings {
    /// Policy; `None` means the kubelet default (`none`).
    pub policy: Option<String>,
    /// Scope; `None` means the kubelet default (`container`).
    pub scope: Option<String>,
    /// The `max-allowable-numa-nodes` option, when set.
    pub max_numa_nodes: Option<u32>,
    /// The `prefer-closest-numa-nodes` option, when set.
    pub prefer_closest_numa_nodes: Option<bool>,
    /// CPU and memory manager settings; known only from a config file (defaults filled in).
    pub resource_managers: Option<crate::accounting::ResourceManagers>,
}

/// CPU manager policies the kubelet accepts.
pub const CPU_MANAGER_POLICIES: [&str; 2] = ["none", "static"];
/// Memory manager policies the kubelet accepts.
pub const MEMORY_MANAGER_POLICIES: [&str; 2] = ["None", "Static"];

/// Errors reading the kubelet configuration.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    /// The file cannot be read.
    #[error("cannot read kubelet config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The drop-in directory cannot be listed.
    #[error("cannot list kubelet config directory {path}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a KubeletConfiguration document.
    #[error("cannot parse kubelet config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Parser message (serde-saphyr errors carry the location).
        message: String,
    },
    /// A field holds a value the kubelet itself would refuse.
    #[error("invalid {field} {value:?} in {origin}: expected {expected}")]
    InvalidValue {
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: String,
        /// Where it came from (a file path or a flag).
        origin: String,
        /// The accepted values.
        expected: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    topology_manager_policy: Option<String>,
    #[serde(default)]
    topology_manager_scope: Option<String>,
    #[serde(default, deserialize_with = "scalar_map")]
    topology_manager_policy_options: BTreeMap<String, String>,
    #[serde(default)]
    cpu_manager_policy: Option<String>,
    #[serde(default, deserialize_with = "scalar_map")]
    cpu_manager_policy_options: BTreeMap<String, String>,
    #[serde(default, rename = "reservedSystemCPUs")]
    reserved_system_cpus: Option<String>,
    #[serde(default)]
    memory_manager_policy: Option<String>,
}

/// A map of option names to values as the kubelet writes them (strings). `/configz` answers
/// `null` for an empty map, and a hand-written YAML file may leave a number or boolean unquoted:
/// both are read rather than refused, as the value is what matters.
fn scalar_map<'de, D>(d: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let raw: Option<BTreeMap<String, serde_json::Value>> = Option::deserialize(d)?;
    raw.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            serde_json::Value::Number(n) => Ok((k, n.to_string())),
            serde_json::Value::Bool(b) => Ok((k, b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "option {k}: expected a string, got {other}"
            ))),
        })
        .collect()
}

/// Reads the Topology Manager settings from a kubelet config file.
pub fn read(path: &Path) -> Result<ResourceManagerSettings, KubeletConfigError> {
    read_files(Some(path), None)
}

/// Reads the kubelet's config file and its drop-in directory (`--config-dir`, kubelet 1.28+) as
/// the kubelet merges them: every `*.conf` file of the directory, in lexical order, over the
/// file; maps merge key by key, anything else (lists included) is replaced. Either may be absent.
pub fn read_files(
    file: Option<&Path>,
    dir: Option<&Path>,
) -> Result<ResourceManagerSettings, KubeletConfigError> {
    let mut merged = serde_json::Value::Object(serde_json::Map::new());
    let mut origins = Vec::new();
    if let Some(path) = file {
        merge(&mut merged, read_document(path)?);
        origins.push(path.display().to_string());
    }
    if let Some(dir) = dir {
        for path in drop_ins(dir)? {
            merge(&mut merged, read_document(&path)?);
            origins.push(path.display().to_string());
        }
    }
    parse_value(merged, &origins.join(" + "))
}

/// The drop-in files of `dir`, in the order the kubelet applies them.
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, KubeletConfigError> {
    let read_dir = |source| KubeletConfigError::ReadDir {
        path: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir)? {
        let path = entry.map_err(read_dir)?.path();
        if path.extension().is_some_and(|e| e == "conf") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// One YAML (or JSON) document as a generic value; an empty file is an empty document.
fn read_document(path: &Path) -> Result<serde_json::Value, KubeletConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| KubeletConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    }
    let value: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| KubeletConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(KubeletConfigError::Parse {
            path: path.to_owned(),
            message: "not a mapping".to_owned(),
        })
    }
}

/// Merges `over` into `base` as the kubelet merges drop-ins: objects key by key, recursively;
/// any other value replaces. A `null` changes nothing (decoding null into a Go field is a no-op).
fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None if !v.is_null() => {
                        b.insert(k, v);
                    }
                    None => {}
                }
            }
        }
        (_, serde_json::Value::Null) => {}
        (b, o) => *b = o,
    }
}

/// Parses the body of the kubelet's `/configz` answer, `{"kubeletconfig": {...}}` (the
/// `kubelet.config.k8s.io/v1beta1` fields, defaults filled in, without `kind`).
pub fn parse_configz(body: &str, origin: &str) -> Result<ResourceManagerSettings, KubeletConfigError> {
    let parse_error = |message: String| KubeletConfigError::Parse {
        path: PathBuf::from(origin),
        message,
    };
    let mut value: serde_json::Value = serde_json::from_str(body).map_err(|e| parse_error(e.to_string()))?;
    match value.get_mut("kubeletconfig").map(serde_json::Value::take) {
        Some(config @ serde_json::Value::Object(_)) => parse_value(config, origin),
        _ => Err(parse_error(
            "no \"kubeletconfig\" object in the answer".to_owned(),
        )),
    }
}

/// Parses a kubelet config document; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<ResourceManagerSettings, KubeletConfigError> {
    let cfg: KubeletConfiguration = if text.trim().is_empty() {
        KubeletConfiguration::default()
    } else {
        serde_saphyr::from_str(text).map_err(|e| KubeletConfigError::Parse {
            path: PathBuf::from(origin),
            message: e.to_string(),
        })?
    };
    settings(cfg, origin)
}

/// Checks a kubelet config document given as a generic value (merged files, `/configz`).
pub fn parse_value(
    value: serde_json::Value,
    origin: &str,
) -> Result<ResourceManagerSettings, KubeletConfigError> {
    let cfg: KubeletConfiguration = serde_json::from_value(value).map_err(|e| KubeletConfigError::Parse {
        path: PathBuf::from(origin),
        message: e.to_string(),
    })?;
    settings(cfg, origin)
}

fn settings(cfg: KubeletConfiguration, origin: &str) -> Result<ResourceManagerSettings, KubeletConfigError> {
    if let Some(kind) = cfg.kind.as_deref().filter(|k| *k != "KubeletConfiguration") {
        return Err(KubeletConfigError::Parse {
            path: PathBuf::from(origin),
            message: format!("kind is {kind:?}, expected KubeletConfiguration"),
        });
    }
    let max_numa_nodes = cfg
        .topology_manager_policy_options
        .get(MAX_ALLOWABLE_NUMA_NODES_OPTION)
        .map(|v| parse_max_numa_nodes(v, origin))
        .transpose()?;
    let prefer_closest_numa_nodes = cfg
        .topology_manager_policy_options
        .get(PREFER_CLOSEST_NUMA_NODES_OPTION)
        .map(|v| parse_option_bool(PREFER_CLOSEST_NUMA_NODES_OPTION, v, origin))
        .transpose()?;
    for name in cfg.topology_manager_policy_options.keys().filter(|k| {
        ![MAX_ALLOWABLE_NUMA_NODES_OPTION, PREFER_CLOSEST_NUMA_NODES_OPTION].contains(&k.as_str())
    }) {
        // A newer kubelet may know options we do not model: say so, do not refuse to run. The
        // option is published with the others, and the scheduler reports its predictions
        // for this node as approximate.
        tracing::warn!(option = %name, origin, "unknown Topology Manager policy option");
    }
    let cpu_manager_policy = cfg
        .cpu_manager_policy
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "none".to_owned());
    if !CPU_MANAGER_POLICIES.contains(&cpu_manager_policy.as_str()) {
        return Err(KubeletConfigError::InvalidValue {
            field: "cpuManagerPolicy",
            value: cpu_manager_policy,
            origin: origin.to_owned(),
            expected: CPU_MANAGER_POLICIES.join(", "),
        });
    }
    let memory_manager_policy = cfg
        .memory_manager_policy
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "None".to_owned());
    if !MEMORY_MANAGER_POLICIES.contains(&memory_manager_policy.as_str()) {
        return Err(KubeletConfigError::InvalidValue {
            field: "memoryManagerPolicy",
            value: memory_manager_policy,
            origin: origin.to_owned(),
            expected: MEMORY_MANAGER_POLICIES.join(", "),
        });
    }
    let settings = ResourceManagerSettings {
        policy: cfg.topology_manager_policy.filter(|p| !p.is_empty()),
        scope: cfg.topology_manager_scope.filter(|s| !s.is_empty()),
        max_numa_nodes,
        prefer_closest_numa_nodes,
        resource_managers: Some(crate::accounting::ResourceManagers {
            cpu_manager_policy,
            cpu_manager_policy_options: cfg.cpu_manager_policy_options,
            reserved_cpus: cfg
                .reserved_system_cpus
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty()),
            memory_manager_policy,
            topology_manager_policy_options: cfg.topology_manager_policy_options,
        }),
    };
    validate(&settings, origin)?;
    Ok(settings)
}

/// Parses the option value as the kubelet does (a positive integer).
pub fn parse_max_numa_nodes(value: &str, origin: &str) -> Result<u32, KubeletConfigError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| KubeletConfigError::InvalidValue {
            field: "topologyManagerPolicyOptions.max-allowable-numa-nodes",
            value: value.to_owned(),
            origin: origin.to_owned(),
            expected: "a positive integer".to_owned(),
        })
}

/// Parses a boolean option value as the kubelet does (Go's `strconv.ParseBool`).
pub fn parse_option_bool(
    option: &'static str,
    value: &str,
    origin: &str,
) -> Result<bool, KubeletConfigError> {
    numaplane::parse_go_bool(value).ok_or_else(|| KubeletConfigError::InvalidValue {
        field: option,
        value: value.to_owned(),
        origin: origin.to_owned(),
        expected: "a boolean (true or false)".to_owned(),
    })
}

/// Checks policy and scope against the values the kubelet accepts.
pub fn validate(s: &ResourceManagerSettings, origin: &str) -> Result<(), KubeletConfigError> {
    if let Some(p) = s.policy.as_deref().filter(|p| !POLICIES.contains(p)) {
        return Err(KubeletConfigError::InvalidValue {
            field: "topologyManagerPolicy",
            value: p.to_owned(),
            origin: origin.to_owned(),
            expected: POLICIES.join(", "),
        });
    }
    if let Some(sc) = s.scope.as_deref().filter(|sc| !SCOPES.contains(sc)) {
        return Err(KubeletConfigError::InvalidValue {
            field: "topologyManagerScope",
            value: sc.to_owned(),
            origin: origin.to_owned(),
            expected: SCOPES.join(", "),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_policy_scope_and_max_numa_nodes() {
        let s = parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\n\
             topologyManagerScope: pod\ntopologyManagerPolicyOptions:\n  \
             max-allowable-numa-nodes: \"10\"\n  prefer-closest-numa-nodes: \"true\"\n",
            "cfg",
        )
        .unwrap();
        assert_eq!(s.policy.as_deref(), Some("single-numa-node"));
        assert_eq!(s.scope.as_deref(), Some("pod"));
        assert_eq!(s.max_numa_nodes, Some(10));
        assert_eq!(s.prefer_closest_numa_nodes, Some(true));
        let rm = s.resource_managers.unwrap();
        assert_eq!(rm.cpu_manager_policy, "static");
        assert_eq!(rm.memory_manager_policy, "None");
        let s = parse(
            "cpuManagerPolicy: static\ncpuManagerPolicyOptions: {full-pcpus-only: \"true\"}\n\
             reservedSystemCPUs: \"0-1\"\nmemoryManagerPolicy: Static\n",
            "cfg",
        )
        .unwrap();
        let rm = s.resource_managers.unwrap();
        assert_eq!(rm.cpu_manager_policy_options["full-pcpus-only"], "true");
        assert_eq!(rm.reserved_cpus.as_deref(), Some("0-1"));
        assert_eq!(rm.memory_manager_policy, "Static");
        let s = parse(
            "topologyManagerPolicyOptions: {prefer-closest-numa-nodes: \"F\"}\n",
            "cfg",
        )
        .unwrap();
        assert_eq!(s.prefer_closest_numa_nodes, Some(false));
    }

    #[test]
    fn absent_fields_mean_kubelet_defaults() {
        let defaults = ResourceManagerSettings {
            resource_managers: Some(crate::accounting::ResourceManagers {
                cpu_manager_policy: "none".into(),
                memory_manager_policy: "None".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = parse("kind: KubeletConfiguration\n", "cfg").unwrap();
        assert_eq!(s, defaults);
        assert_eq!(parse("", "cfg").unwrap(), defaults);
    }

    #[test]
    fn rejects_values_the_kubelet_refuses() {
        for (doc, field) in [
            ("topologyManagerPolicy: strict\n", "topologyManagerPolicy"),
            ("topologyManagerScope: node\n", "topologyManagerScope"),
            (
                "topologyManagerPolicyOptions: {max-allowable-numa-nodes: \"0\"}\n",
                "max-allowable-numa-nodes",
            ),
            (
                "topologyManagerPolicyOptions: {prefer-closest-numa-nodes: \"yes\"}\n",
                "prefer-closest-numa-nodes",
            ),
            ("cpuManagerPolicy: dynamic\n", "cpuManagerPolicy"),
            ("memoryManagerPolicy: static\n", "memoryManagerPolicy"),
        ] {
            let err = parse(doc, "cfg").unwrap_err().to_string();
            assert!(err.contains(field), "{doc}: {err}");
        }
        let err = parse("kind: Pod\n", "cfg").unwrap_err().to_string();
        assert!(err.contains("KubeletConfiguration"), "{err}");
        let err = parse("topologyManagerPolicy: [a\n", "cfg").unwrap_err();
        assert!(matches!(err, KubeletConfigError::Parse { .. }), "{err}");
    }

    #[test]
    fn drop_ins_merge_in_lexical_order_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "kind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n\
             cpuManagerPolicy: static\ntopologyManagerPolicyOptions:\n  \
             max-allowable-numa-nodes: \"9\"\n",
        )
        .unwrap();
        let drop = dir.path().join("conf.d");
        std::fs::create_dir(&drop).unwrap();
        // 20 after 10: its policy wins; options merge key by key; non-.conf files are ignored.
        std::fs::write(
            drop.join("20-policy.conf"),
            "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n",
        )
        .unwrap();
        std::fs::write(
            drop.join("10-options.conf"),
            "kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n\
             topologyManagerPolicyOptions: {prefer-closest-numa-nodes: \"true\"}\n",
        )
        .unwrap();
        std::fs::write(drop.join("30-ignored.yaml"), "topologyManagerPolicy: none\n").unwrap();
        let s = read_files(Some(&file), Some(&drop)).unwrap();
        assert_eq!(s.policy.as_deref(), Some("single-numa-node"));
        assert_eq!(s.max_numa_nodes, Some(9));
        assert_eq!(s.prefer_closest_numa_nodes, Some(true));
        assert_eq!(s.resource_managers.unwrap().cpu_manager_policy, "static");
        // The directory alone (a kubelet started with --config-dir only).
        let s = read_files(None, Some(&drop)).unwrap();
        assert_eq!(s.policy.as_deref(), Some("single-numa-node"));
        assert_eq!(s.max_numa_nodes, None);
        // A bad drop-in is named.
        std::fs::write(drop.join("40-bad.conf"), "topologyManagerScope: node\n").unwrap();
        let err = read_files(Some(&file), Some(&drop)).unwrap_err().to_string();
        assert!(
            err.contains("40-bad.conf") && err.contains("topologyManagerScope"),
            "{err}"
        );
        let err = read_files(None, Some(&dir.path().join("none"))).unwrap_err();
        assert!(matches!(err, KubeletConfigError::ReadDir { .. }), "{err}");
    }

    #[test]
    fn configz_answer_is_read_like_a_file() {
        // As a v1.36 kubelet answers: every field defaulted, no kind, null for empty maps.
        let body = r#"{"kubeletconfig":{"enableServer":true,"cpuManagerPolicy":"static",
            "cpuManagerPolicyOptions":{"full-pcpus-only":"true"},"memoryManagerPolicy":"None",
            "topologyManagerPolicy":"restricted","topologyManagerScope":"container",
            "topologyManagerPolicyOptions":null,"reservedSystemCPUs":"",
            "evictionHard":{"memory.available":"100Mi"},"clusterDNS":["10.96.0.10"]}}"#;
        let s = parse_configz(body, "configz").unwrap();
        assert_eq!(s.policy.as_deref(), Some("restricted"));
        assert_eq!(s.scope.as_deref(), Some("container"));
        assert_eq!(s.max_numa_nodes, None);
        let rm = s.resource_managers.unwrap();
        assert_eq!(rm.cpu_manager_policy, "static");
        assert_eq!(rm.cpu_manager_policy_options["full-pcpus-only"], "true");
        assert_eq!(rm.reserved_cpus, None);
        for bad in ["", "{}", r#"{"kubeletconfig": "x"}"#, "<html>"] {
            let err = parse_configz(bad, "configz").unwrap_err();
            assert!(matches!(err, KubeletConfigError::Parse { .. }), "{bad}: {err}");
        }
        let err = parse_configz(
            r#"{"kubeletconfig":{"topologyManagerPolicy":"strict"}}"#,
            "configz",
        )
        .unwrap_err();
        assert!(matches!(err, KubeletConfigError::InvalidValue { .. }), "{err}");
    }

    #[test]
    fn unreadable_file_is_a_read_error_naming_the_path() {
        let err = read(Path::new("/nonexistent/kubelet/config.yaml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kubelet/config.yaml"));
        assert!(matches!(err, KubeletConfigError::Read { .. }));
    }
}
