//! Kubernetes RBAC, as much as tests need to hold a ServiceAccount's rules against the requests
//! its binary made on the fake API server: request attributes from the URL and method (as the
//! API server's request-info resolver derives them), the rules bound to a ServiceAccount
//! through ClusterRoleBindings and RoleBindings, and whether they allow a request
//! (`resourceNames` and a RoleBinding's namespace included). Wildcards are refused outright:
//! deploy/ must not use them.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::fake_api::RecordedRequest;

/// What RBAC decides on for one resource request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attributes {
    /// API group, `""` for core.
    pub group: String,
    /// Resource, with `/subresource` if any (`pods/binding`).
    pub resource: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// Namespace of a namespaced request.
    pub namespace: Option<String>,
    /// Object name, when the URL names one.
    pub name: Option<String>,
}

impl Attributes {
    /// (group, resource, verb).
    pub fn triple(&self) -> (String, String, String) {
        (self.group.clone(), self.resource.clone(), self.verb.clone())
    }
}

/// The attributes of a request, or `None` for a non-resource URL (discovery, `/version`), which
/// every authenticated user may GET through `system:discovery`.
pub fn attributes(r: &RecordedRequest) -> Result<Option<Attributes>, String> {
    let mut segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => (String::new(), rest.to_vec()),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => ((*group).to_owned(), rest.to_vec()),
        _ => return Ok(None),
    };
    segments.clear();
    // The legacy `/watch/` prefix makes the request a watch.
    let (legacy_watch, rest) = match rest.as_slice() {
        ["watch", tail @ ..] => (true, tail.to_vec()),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some((*ns).to_owned()), tail.to_vec()),
        _ => (None, rest),
    };
    let (resource, name) = match rest.as_slice() {
        [resource] => ((*resource).to_owned(), None),
        [resource, name] => ((*resource).to_owned(), Some((*name).to_owned())),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some((*name).to_owned())),
        // A proxy subresource carries the path to proxy to (`nodes/NAME/proxy/configz`).
        [resource, name, "proxy", _, ..] => (format!("{resource}/proxy"), Some((*name).to_owned())),
        _ => return Err(format!("unexpected path {}", r.path)),
    };
    let verb = match (r.method.as_str(), name.is_some()) {
        ("GET", _) if legacy_watch || r.is_watch() => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => return Err(format!("unexpected method {m} {}", r.path)),
    };
    Ok(Some(Attributes {
        group,
        resource,
        verb: verb.to_owned(),
        namespace,
        name,
    }))
}

/// The attributes the kubelet authorizes a request to its HTTPS API with (a SubjectAccessReview
/// on the Node `node`): `/configz`, `/pods`, `/runningPods` and `/healthz` as their fine-grained
/// subresources (kubelets 1.33 and later; older ones and the fallback check `nodes/proxy`),
/// `/stats`, `/metrics`, `/logs`, `/spec`, `/checkpoint` as theirs, anything else as `proxy`.
pub fn kubelet_attributes(method: &str, path: &str, node: &str) -> Attributes {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    let sub = match first {
        "configz" => "configz",
        "pods" | "runningPods" => "pods",
        "healthz" => "healthz",
        "stats" => "stats",
        "metrics" => "metrics",
        "logs" => "log",
        "spec" => "spec",
        "checkpoint" => "checkpoint",
        _ => "proxy",
    };
    let verb = match method {
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "unknown",
    };
    Attributes {
        group: String::new(),
        resource: format!("nodes/{sub}"),
        verb: verb.to_owned(),
        namespace: None,
        name: Some(node.to_owned()),
    }
}

/// One policy rule as bound: `namespace` is the RoleBinding's, `None` through a
/// ClusterRoleBinding (every namespace and cluster-scoped objects).
#[derive(Clone, Debug)]
pub struct Rule {
    /// API groups.
    pub groups: Vec<String>,
    /// Resources (`pods/binding` for a subresource).
    pub resources: Vec<String>,
    /// Verbs.
    pub verbs: Vec<String>,
    /// `resourceNames`, if restricted.
    pub names: Option<Vec<String>>,
    /// Where it applies.
    pub namespace: Option<String>,
    /// The Role or ClusterRole it comes from, for messages.
    pub from: String,
}

impl Rule {
    /// Whether this rule allows the request.
    pub fn allows(&self, a: &Attributes) -> bool {
        self.groups.contains(&a.group)
            && self.resources.contains(&a.resource)
            && self.verbs.contains(&a.verb)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| a.namespace.as_ref() == Some(ns))
            && self
                .names
                .as_ref()
                .is_none_or(|names| a.name.as_ref().is_some_and(|n| names.contains(n)))
    }

    /// Every (group, resource, verb) it grants.
    pub fn triples(&self) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for g in &self.groups {
            for r in &self.resources {
                for v in &self.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
        out
    }
}

fn string_list(v: &Value, what: &str) -> Result<Vec<String>, String> {
    let items = v.as_array().ok_or_else(|| format!("{what}: not a list: {v}"))?;
    items
        .iter()
        .map(|i| {
            let s = i.as_str().ok_or_else(|| format!("{what}: {i} is not a string"))?;
            if s.contains('*') {
                return Err(format!("{what}: wildcard {s:?}"));
            }
            Ok(s.to_owned())
        })
        .collect()
}

fn rules_of_role(role: &Value, namespace: Option<String>) -> Result<Vec<Rule>, String> {
    let from = format!(
        "{} {}",
        role["kind"].as_str().unwrap_or_default(),
        role["metadata"]["name"].as_str().unwrap_or_default()
    );
    let mut out = Vec::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        if !rule["nonResourceURLs"].is_null() {
            return Err(format!("{from}: nonResourceURLs"));
        }
        let names = match &rule["resourceNames"] {
            Value::Null => None,
            v => Some(string_list(v, &format!("{from} resourceNames"))?),
        };
        out.push(Rule {
            groups: string_list(&rule["apiGroups"], &format!("{from} apiGroups"))?,
            resources: string_list(&rule["resources"], &format!("{from} resources"))?,
            verbs: string_list(&rule["verbs"], &format!("{from} verbs"))?,
            names,
            namespace: namespace.clone(),
            from: from.clone(),
        });
    }
    Ok(out)
}

/// The rules that `objects` (rendered manifests) bind to ServiceAccount `namespace/name`.
pub fn rules_for(objects: &[Value], namespace: &str, name: &str) -> Result<Vec<Rule>, String> {
    let find = |kind: &str, role: &str, ns: Option<&str>| {
        objects.iter().find(|o| {
            o["kind"] == kind
                && o["apiVersion"] == "rbac.authorization.k8s.io/v1"
                && o["metadata"]["name"] == role
                && ns.is_none_or(|ns| o["metadata"]["namespace"] == ns)
        })
    };
    let mut out = Vec::new();
    for b in objects
        .iter()
        .filter(|o| o["apiVersion"] == "rbac.authorization.k8s.io/v1")
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let bound = b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace);
        if !bound {
            continue;
        }
        let binding_ns = b["metadata"]["namespace"].as_str();
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let scope = if b["kind"] == "RoleBinding" {
            Some(
                binding_ns
                    .ok_or_else(|| format!("RoleBinding {} has no namespace", b["metadata"]["name"]))?,
            )
        } else {
            None
        };
        let role = match role_kind {
            "ClusterRole" => find("ClusterRole", role_name, None),
            "Role" if scope.is_some() => find("Role", role_name, scope),
            other => return Err(format!("binding {}: roleRef kind {other}", b["metadata"]["name"])),
        }
        .ok_or_else(|| format!("binding {}: no {role_kind} {role_name}", b["metadata"]["name"]))?;
        out.extend(rules_of_role(role, scope.map(str::to_owned))?);
    }
    Ok(out)
}

/// Whether any of `rules` allows `a`.
pub fn allowed(rules: &[Rule], a: &Attributes) -> bool {
    rules.iter().any(|r| r.allows(a))
}

/// Every (group, resource, verb) the rules grant.
pub fn granted(rules: &[Rule]) -> BTreeSet<(String, String, String)> {
    rules.iter().flat_map(Rule::triples).collect()
}

/// One row of `kubectl auth can-i --list`: `resource[.group]` (with `/subresource`), the
/// resource names it is limited to (empty: any), and one verb.
pub type Grant = (String, Vec<String>, String);

/// The resource grants `kubectl auth can-i --list` prints (its table), one per verb, without
/// the non-resource URLs and the `selfsubject*` reviews every authenticated user has
/// (`system:basic-user`).
pub fn parse_can_i_list(table: &str) -> Result<BTreeSet<Grant>, String> {
    let mut lines = table.lines();
    let header = lines.next().ok_or("kubectl auth can-i --list printed nothing")?;
    let col = |name: &str| {
        header
            .find(name)
            .ok_or_else(|| format!("no column {name:?} in {header:?}"))
    };
    let (urls, names, verbs) = (col("Non-Resource URLs")?, col("Resource Names")?, col("Verbs")?);
    let list = |s: &str| -> Vec<String> {
        s.trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let mut out = BTreeSet::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let cut = |from: usize, to: usize| line.get(from..to.min(line.len())).unwrap_or_default();
        let resource = cut(0, urls).trim();
        if resource.is_empty() || resource.starts_with("selfsubject") {
            continue;
        }
        let mut resource_names = list(cut(names, verbs));
        resource_names.sort();
        for verb in list(line.get(verbs..).unwrap_or_default()) {
            out.insert((resource.to_owned(), resource_names.clone(), verb));
        }
    }
    Ok(out)
}

/// What `rules` grant in `namespace` (the cluster-wide rules and that namespace's), as
/// `kubectl auth can-i --list --namespace <namespace>` prints it.
pub fn grants_in(rules: &[Rule], namespace: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules
        .iter()
        .filter(|r| r.namespace.as_deref().is_none_or(|ns| ns == namespace))
    {
        let mut names = r.names.clone().unwrap_or_default();
        names.sort();
        for g in &r.groups {
            for res in &r.resources {
                // As kubectl v1.36 prints it: `resourceclaims.resource.k8s.io/binding`.
                let resource = match (g.is_empty(), res.split_once('/')) {
                    (true, _) => res.clone(),
                    (false, Some((base, sub))) => format!("{base}.{g}/{sub}"),
                    (false, None) => format!("{res}.{g}"),
                };
                for v in &r.verbs {
                    out.insert((resource.clone(), names.clone(), v.clone()));
                }
            }
        }
    }
    out
}
