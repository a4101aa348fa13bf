//! kube-scheduler v1.36's own DRA allocator test cases, run through the real
//! `numaplane-scheduler simulate -o json` binary: for each case, a cluster file (the node, the
//! DeviceClasses, the ResourceSlices, the claims to allocate, and one allocated claim per
//! device already in use or capacity already consumed) and a pod that references the claims.
//! The outcome and the allocations are compared as `DRA-README.md` says: results as a
//! multiset, shareID by presence, node selectors as sets, config in order, errors by meaning
//! and kind (node or fatal), unsatisfiable apart from errors.
//!
//! `NUMAPLANE_DRA_VECTORS` names another vector file of the same format (the held-out half).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use numaplane::quantity::Quantity;
use numaplane_e2e::binaries;
use serde_json::{Value, json};

fn vectors_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NUMAPLANE_DRA_VECTORS") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/dra_allocator_cases.json")
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The cluster documents and the pod of one case.
fn inputs(case: &Value) -> (Vec<Value>, Value) {
    let mut docs = Vec::new();
    let mut node = case["node"].clone();
    // Node fit needs allocatable; the allocator reads only the name and labels.
    node["status"]["allocatable"] = json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
    docs.push(node);
    docs.extend(case["classes"].as_array().cloned().unwrap_or_default());
    docs.extend(case["slices"].as_array().cloned().unwrap_or_default());
    let mut claim_names = Vec::new();
    for c in case["claims"].as_array().cloned().unwrap_or_default() {
        let mut c = c;
        c["metadata"]["namespace"] = json!("default");
        // Some upstream cases give two claims one name; in a cluster they are two objects.
        let mut name = s(&c["metadata"]["name"]).to_owned();
        while claim_names.contains(&name) {
            name.push_str("-again");
        }
        c["metadata"]["name"] = json!(name);
        claim_names.push(name);
        docs.push(c);
    }
    // Devices in use by other claims: one allocated claim per device.
    let allocated_claim = |n: usize, result: Value| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("already-allocated-{n}"), "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "none"}}]}},
            "status": {"allocation": {"devices": {"results": [result]}}}
        })
    };
    let mut n = 0;
    for d in case["allocated_devices"].as_array().cloned().unwrap_or_default() {
        let parts: Vec<&str> = s(&d).splitn(3, '/').collect();
        let [driver, pool, device] = parts[..] else {
            continue;
        };
        docs.push(allocated_claim(
            n,
            json!({"request": "r", "driver": driver, "pool": pool, "device": device}),
        ));
        n += 1;
    }
    let state = &case["allocated_state"];
    let mut with_capacity = BTreeSet::new();
    if let Some(agg) = state["aggregatedCapacity"].as_object() {
        for (id, consumed) in agg {
            let parts: Vec<&str> = id.splitn(3, '/').collect();
            let [driver, pool, device] = parts[..] else {
                continue;
            };
            with_capacity.insert(id.clone());
            docs.push(allocated_claim(
                n,
                json!({"request": "r", "driver": driver, "pool": pool, "device": device,
                       "shareID": format!("00000000-0000-0000-0000-{n:012}"), "consumedCapacity": consumed}),
            ));
            n += 1;
        }
    }
    for shared in state["allocatedSharedDeviceIDs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let parts: Vec<&str> = s(&shared).splitn(4, '/').collect();
        let [driver, pool, device, share] = parts[..] else {
            continue;
        };
        if with_capacity.contains(&format!("{driver}/{pool}/{device}")) {
            continue;
        }
        docs.push(allocated_claim(
            n,
            json!({"request": "r", "driver": driver, "pool": pool, "device": device, "shareID": share}),
        ));
        n += 1;
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "x",
                "resources": {"claims": claim_names.iter().enumerate().map(|(i, _)| json!({"name": format!("c{i}")})).collect::<Vec<_>>()}}],
            "resourceClaims": claim_names.iter().enumerate()
                .map(|(i, name)| json!({"name": format!("c{i}"), "resourceClaimName": name}))
                .collect::<Vec<_>>()
        }
    });
    (docs, pod)
}

fn quantity(v: &Value) -> String {
    Quantity::parse(s(v)).map_or_else(|_| format!("unparsable {v}"), |q| format!("{}", q.nanos()))
}

fn absent_or_empty(v: &Value) -> bool {
    v.is_null()
        || v.as_array().is_some_and(Vec::is_empty)
        || v.as_object().is_some_and(serde_json::Map::is_empty)
}

/// One device result in a comparable form.
fn device_key(r: &Value) -> String {
    let list = |v: &Value| {
        if absent_or_empty(v) {
            Value::Null
        } else {
            v.clone()
        }
    };
    let consumed: Vec<(String, String)> = r["consumedCapacity"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), quantity(v))).collect())
        .unwrap_or_default();
    json!({
        "request": r["request"], "driver": r["driver"], "pool": r["pool"], "device": r["device"],
        "adminAccess": r["adminAccess"].as_bool().unwrap_or(false),
        "tolerations": list(&r["tolerations"]),
        "bindingConditions": list(&r["bindingConditions"]),
        "bindingFailureConditions": list(&r["bindingFailureConditions"]),
        "consumedCapacity": consumed,
        "shareID": !r["shareID"].is_null(),
    })
    .to_string()
}

fn requirements(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let values: BTreeSet<&str> = r["values"].as_array().into_iter().flatten().map(s).collect();
            format!("{}|{}|{values:?}", s(&r["key"]), s(&r["operator"]))
        })
        .collect()
}

fn node_selector(v: &Value) -> BTreeSet<String> {
    v["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "fields {:?} expressions {:?}",
                requirements(&t["matchFields"]),
                requirements(&t["matchExpressions"])
            )
        })
        .collect()
}

fn config(v: &Value) -> Vec<Value> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let mut c = c.clone();
            if c.get("requests").is_some_and(absent_or_empty) {
                c.as_object_mut().map(|m| m.remove("requests"));
            }
            c
        })
        .collect()
}

fn compare_allocation(i: usize, got: &Value, want: &Value) -> Result<(), String> {
    let mut got_devices: Vec<String> = got["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(device_key)
        .collect();
    let mut want_devices: Vec<String> = want["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(device_key)
        .collect();
    got_devices.sort();
    want_devices.sort();
    if got_devices != want_devices {
        return Err(format!(
            "claim {i}: devices\n  got  {got_devices:?}\n  want {want_devices:?}"
        ));
    }
    let (g, w) = (
        node_selector(&got["nodeSelector"]),
        node_selector(&want["nodeSelector"]),
    );
    if g != w {
        return Err(format!("claim {i}: nodeSelector\n  got  {g:?}\n  want {w:?}"));
    }
    let (g, w) = (
        config(&got["devices"]["config"]),
        config(&want["devices"]["config"]),
    );
    if g != w {
        return Err(format!(
            "claim {i}: config\n  got  {}\n  want {}",
            Value::from(g),
            Value::from(w)
        ));
    }
    Ok(())
}

/// Runs one case through the binary; `Err` says what differs.
fn run_case(case: &Value, dir: &std::path::Path) -> Result<(), String> {
    let name = s(&case["name"]);
    let (docs, pod) = inputs(case);
    let cluster = dir.join(format!("{name}-cluster.json"));
    let pods = dir.join(format!("{name}-pod.json"));
    std::fs::write(&cluster, Value::from(docs).to_string()).map_err(|e| e.to_string())?;
    std::fs::write(&pods, pod.to_string()).map_err(|e| e.to_string())?;
    let out = Command::new(binaries::scheduler())
        .args(["simulate", "-o", "json", "--cluster"])
        .arg(&cluster)
        .arg("--pods")
        .arg(&pods)
        .output()
        .map_err(|e| format!("running simulate: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "simulate exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("report: {e}"))?;
    let result = &report["results"][0];
    let reasons: Vec<String> = result["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["reasons"].as_array().cloned().unwrap_or_default())
        .map(|r| s(&r).to_owned())
        .collect();
    let (outcome, message) = if !result["node"].is_null() {
        ("success", String::new())
    } else if let Some(e) = result["claimsError"].as_str() {
        ("fatal", e.to_owned())
    } else if let Some(r) = reasons.iter().find(|r| r.contains("invalid resource pools")) {
        ("node", r.clone())
    } else if reasons.iter().any(|r| r == "cannot allocate all claims") {
        ("unsatisfiable", String::new())
    } else {
        ("other", format!("{}: {reasons:?}", s(&result["message"])))
    };
    let expect = &case["expect"];
    let want = match s(&expect["outcome"]) {
        "error" => s(&expect["error_kind"]),
        other => other,
    };
    if outcome != want {
        return Err(format!(
            "outcome {outcome} ({message}), want {want} ({})",
            s(&expect["error_text"])
        ));
    }
    if want == "node" || want == "fatal" {
        let needle = s(&expect["error"]);
        // The upstream claims have no namespace; here they live in `default`.
        if !message.replace("claim default/", "claim ").contains(needle) {
            return Err(format!("error {message:?} does not say {needle:?}"));
        }
        return Ok(());
    }
    if want != "success" {
        return Ok(());
    }
    let got = result["claims"].as_array().cloned().unwrap_or_default();
    let want_results = expect["results"].as_array().cloned().unwrap_or_default();
    if got.len() != want_results.len() {
        return Err(format!(
            "{} claims allocated, want {}",
            got.len(),
            want_results.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(&want_results).enumerate() {
        compare_allocation(i, &g["allocation"], w)?;
    }
    Ok(())
}

#[test]
fn dra_allocator_vectors_pass_through_the_simulate_binary() {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let vectors: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let cases = vectors["cases"].as_array().cloned().unwrap_or_default();
    assert!(!cases.is_empty(), "no cases in {}", path.display());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(e) = run_case(case, dir.path()) {
            failures.push(format!("{}: {e}", s(&case["name"])));
        }
    }
    eprintln!(
        "{}/{} DRA allocator vectors pass",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} vectors fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
