//! The reader against serde-saphyr: the same values on everything it reads, a refusal on
//! everything else, and `decode` giving serde-saphyr's result either way.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{BlockYamlError, from_str_multiple};
use crate::simulate::{SimulateError, decode, read, yaml_budget};

fn saphyr_values(text: &str) -> Result<Vec<Value>, String> {
    serde_saphyr::from_multiple::<Value>(text).map_err(|e| e.to_string())
}

fn fast_values(text: &str) -> Result<Vec<Value>, BlockYamlError> {
    from_str_multiple::<Value, Vec<Value>>(text)
}

/// Read fast, and the same values as serde-saphyr.
fn assert_reads_as_saphyr(text: &str) -> Vec<Value> {
    let fast = fast_values(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(fast, saphyr_values(text).unwrap(), "{text}");
    fast
}

fn saphyr_documents(text: &str) -> Result<read::Documents, String> {
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(yaml_budget(text.len()));
    serde_saphyr::from_str_multiple_with_options::<read::YamlDocument, read::Documents>(text, options)
        .map_err(|e| e.to_string())
}

fn assert_same_documents(a: &read::Documents, b: &read::Documents) {
    assert_eq!(a.documents, b.documents);
    assert_eq!(a.objects.ignored, b.objects.ignored);
    read::tests::assert_same(&a.objects.inputs, &b.objects.inputs);
}

/// The typed objects read fast, the same as serde-saphyr's.
fn assert_decodes_as_saphyr(text: &str) -> read::Documents {
    let fast = from_str_multiple::<read::YamlDocument, read::Documents>(text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_same_documents(&fast, &saphyr_documents(text).unwrap());
    fast
}

/// `decode` gives what serde-saphyr alone gives: the same objects, or the same message.
fn assert_decode_is_saphyrs(text: &str) {
    let decoded = decode(text, "t.yaml");
    match (decoded, saphyr_documents(text)) {
        (Ok(a), Ok(b)) => assert_same_documents(&a, &b),
        (Err(SimulateError::ParseYaml { message, .. }), Err(e)) => {
            let first = e.lines().next().unwrap();
            assert_eq!(message, first.strip_prefix("error: ").unwrap_or(first), "{text}");
        }
        (a, b) => panic!(
            "decode {:?} but serde-saphyr {:?}: {text}",
            a.map(|d| d.documents),
            b.map(|d| d.documents)
        ),
    }
}

fn examples() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The example in block style reads fast. The others are written with flow collections (some
/// as JSON documents) or comments after values: they are refused, and `decode` reads them
/// through serde-saphyr.
#[test]
fn example_files_read_as_serde_saphyr_reads_them() {
    let mut fast = Vec::new();
    for dir in ["", "dra-numa", "pods"] {
        for entry in std::fs::read_dir(examples().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.strip_prefix(examples()).unwrap().display().to_string();
            if name != "pods/numa-aligned.yaml" {
                let e = fast_values(&text).unwrap_err();
                assert!(matches!(e, BlockYamlError::Read { .. }), "{name}: {e}");
                assert!(e.to_string().contains("is outside the subset"), "{name}: {e}");
                assert_decode_is_saphyrs(&text);
                continue;
            }
            let values = assert_reads_as_saphyr(&text);
            assert!(!values.is_empty(), "{name}");
            assert!(assert_decodes_as_saphyr(&text).documents > 0, "{name}");
            assert_decode_is_saphyrs(&text);
            fast.push(name);
        }
    }
    assert_eq!(fast, ["pods/numa-aligned.yaml"]);
}

/// A cluster dump as `scheduler/benches/simulate_cli.rs` writes it (its Nodes, NRTs and
/// running Pods in one List, through `serde_saphyr::to_string`), smaller.
fn bench_like_dump(nodes: usize) -> String {
    let mut items = Vec::new();
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        // Image lists: digests and tags, the bulk of a real dump.
        let image = |k: usize| {
            let repo = format!("registry.example.com/team-{k}/service");
            let names = [
                format!("{repo}@sha256:{:064x}", k * 7919 + i),
                format!("{repo}:v1.{k}"),
            ];
            json!({"names": names, "sizeBytes": 10_000_000 + k * 123_457})
        };
        let images: Vec<Value> = (0..5).map(image).collect();
        let amounts = json!({"cpu": "128", "memory": "512Gi", "hugepages-1Gi": "64Gi", "pods": "250",
            "nvidia.com/gpu": "8", "ephemeral-storage": "937234648Ki"});
        items.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"),
                "resourceVersion": (100_000 + i).to_string(), "creationTimestamp": "2026-11-01T08:00:00Z",
                "labels": {"kubernetes.io/hostname": name, "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
                    "pool": format!("pool-{}", i % 8)},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256), "providerID": format!("metal://{name}"),
                "taints": if i % 3 == 1 { json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule",
                    "timeAdded": "2026-11-01T08:00:00Z"}]) } else { json!(null) }},
            "status": {"capacity": amounts, "allocatable": amounts,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status. AppArmor enabled, and a message longer than eighty characters",
                    "lastHeartbeatTime": "2026-11-24T10:00:00Z"}],
                "addresses": [{"type": "InternalIP", "address": format!("192.168.{}.{}", i / 256, i % 256)}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": format!("{i:032x}"), "kubeProxyVersion": "", "kubeletVersion": "v1.36.2"},
                "images": images}}));
    }
    for i in 0..nodes {
        let zones: Vec<Value> = (0..4)
            .map(|z| json!({"name": format!("node-{z}"), "type": "Node",
                "costs": (0..4).map(|t| json!({"name": format!("node-{t}"), "value": if t == z { 10 } else { 21 }})).collect::<Vec<_>>(),
                "attributes": [{"name": "numaplane.io/free-devices.example.com/nic", "value": format!("nic-{z}a,nic-{z}b")}],
                "resources": [{"name": "cpu", "capacity": "16", "allocatable": "16", "available": if z == 0 { "14" } else { "16" }},
                    {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "60Gi"}]}))
            .collect();
        items.push(
            json!({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": format!("node-{i:05}"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": format!("node-{i:05}")}]},
            "topologyPolicies": ["SingleNUMANodeContainerLevel"],
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                {"name": "topologyManagerScope", "value": "container"}],
            "zones": zones}),
        );
        items.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("svc-{i}"), "namespace": "prod", "labels": {"app": "svc", "pod-template-hash": "5d9f8c7b6"}},
            "spec": {"nodeName": format!("node-{i:05}"), "priority": 10,
                "containers": [{"name": "app", "image": "registry.example.com/svc:v1",
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}}]},
            "status": {"phase": "Running", "qosClass": "Guaranteed"}}));
    }
    let list =
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    serde_saphyr::to_string(&list).unwrap()
}

/// As `kubectl get -o yaml` writes it (go-yaml): sequences at their key's indentation, long
/// plain strings wrapped over lines, quoted numbers and booleans, literal blocks.
const KUBECTL_DUMP: &str = r#"apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"v1","kind":"Node","metadata":{"annotations":{},"name":"n1"}}
      node.alpha.kubernetes.io/ttl: "0"
    creationTimestamp: "2026-11-01T08:00:00Z"
    labels:
      beta.kubernetes.io/arch: amd64
      feature.node.kubernetes.io/cpu-cpuid.AVX512F: "true"
      kubernetes.io/hostname: n1
    name: n1
    resourceVersion: "4711"
  spec:
    podCIDR: 10.244.0.0/24
    taints:
    - effect: NoSchedule
      key: dedicated
      timeAdded: "2026-11-01T08:00:00Z"
      value: gpu
  status:
    allocatable:
      cpu: "8"
      hugepages-1Gi: 2Gi
      memory: 16318412Ki
      nvidia.com/gpu: "2"
      pods: "110"
    conditions:
    - lastHeartbeatTime: "2026-11-24T10:00:00Z"
      message: kubelet is posting ready status. AppArmor enabled, and this message is long
        enough that go-yaml wraps it over two lines
      reason: KubeletReady
      status: "True"
      type: Ready
    daemonEndpoints:
      kubeletEndpoint:
        Port: 10250
    images:
    - names:
      - registry.k8s.io/pause@sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097
      - registry.k8s.io/pause:3.10
      sizeBytes: 320368
    nodeInfo:
      architecture: amd64
      kubeProxyVersion: ""
- apiVersion: topology.node.k8s.io/v1alpha2
  attributes:
  - name: topologyManagerPolicy
    value: single-numa-node
  kind: NodeResourceTopology
  metadata:
    name: n1
  topologyPolicies:
  - SingleNUMANodeContainerLevel
  zones:
  - costs:
    - name: node-0
      value: 10
    name: node-0
    resources:
    - allocatable: "4"
      available: "3"
      capacity: "4"
      name: cpu
    type: Node
- apiVersion: v1
  kind: Pod
  metadata:
    name: p
    namespace: default
  spec:
    containers:
    - args:
      - --flag="quoted value"
      - 'it''s'
      image: registry.example.com/app:v1
      name: app
      resources:
        limits:
          cpu: "1"
        requests:
          cpu: "1"
    nodeName: n1
    priority: 0
  status:
    phase: Running
kind: List
metadata:
  resourceVersion: ""
"#;

#[test]
fn a_kubectl_dump_reads_fast() {
    assert_reads_as_saphyr(KUBECTL_DUMP);
    let docs = assert_decodes_as_saphyr(KUBECTL_DUMP);
    let inputs = &docs.objects.inputs;
    assert_eq!(
        (inputs.nodes.len(), inputs.nrts.len(), inputs.pods.len()),
        (1, 1, 1)
    );
    let node = &inputs.nodes[0];
    assert_eq!(
        node.status.as_ref().unwrap().allocatable.as_ref().unwrap()["cpu"].0,
        "8"
    );
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()["feature.node.kubernetes.io/cpu-cpuid.AVX512F"],
        "true"
    );
}

#[test]
fn a_dump_written_as_the_bench_writes_it_reads_fast() {
    let text = bench_like_dump(20);
    assert_reads_as_saphyr(&text);
    let docs = assert_decodes_as_saphyr(&text);
    let inputs = &docs.objects.inputs;
    assert_eq!(
        (inputs.nodes.len(), inputs.nrts.len(), inputs.pods.len()),
        (20, 20, 20)
    );
    assert!(inputs.nodes[1].spec.as_ref().unwrap().taints.is_some());
}

/// Each construct of the subset, alone or with its neighbours.
const EDGE_DOCUMENTS: &[&str] = &[
    // Documents: markers, `...`, empty and null documents, comments only.
    "---\na: 1\n---\n---\nb: 2\n...\n---\nc: 3\n",
    "--- \na: 1\n...\n",
    "a: 1\n---\n",
    "# only a comment\n",
    "",
    "---\n",
    "null\n---\n~\n---\nx\n---\n5\n",
    "a: 1",
    // Mappings and sequences: kubectl's items at the key's indentation, indented items,
    // mappings starting on the dash line, empty values.
    "a:\n- 1\n- b: 2\n  c: 3\n-\n  - x\nd: x\n",
    "a:\n  - 1\n  -   two\n  - k: v\n    l:\n    - m\n",
    "-   x: 1\n    y: 2\n- z\n",
    "a:\nb: \nc:\n  d:\ne:\n  - \n  -\n",
    "- \n- a\n-\n",
    "top:\n  mid:\n    low:\n      leaf: 1\n    back: 2\n  up: 3\n",
    // Keys: quoted, with spaces, spaces before the colon.
    "'a b': 1\n\"c\\td\": 2\n'it''s': 3\nplain key: 4\nspaced  : 5\n\"\": 6\n'true': 7\nx.y/z-w_1: 8\n",
    // Plain scalars resolved as serde-saphyr resolves them.
    "a: hello world\nb: http://x:80/y\nc: a:b\nd: -5\ne: 0x1F\nf: 0o17\ng: 1_000\nh: +12\ni: 1.5e3\nj: .5\n",
    "a: 007\nb: 0.\nc: -0\nd: 1__0\ne: -0x10\nf: 0b101\ng: 18446744073709551616\nh: -9223372036854775809\ni: 0x\nj: 1e5\nk: -1.0e-3\n",
    "a: yes\nb: No\nc: ON\nd: y\ne: n\nf: off\ng: True\nh: FALSE\ni: ~\nj: Null\nk: NULL\nl: nul\nn: inf\no: nan\np: 1,2\nq: a#b\n",
    // Multi-line plain scalars.
    "a: this is a long\n  plain scalar folded\n\n  with a blank line\n\n\n  and two\nb: 1\n",
    "- word one\n  word two\n- three\n",
    "- k: first\n    second\n  l: x\n",
    // Single-quoted.
    "a: 'first\n  second\n\n  third '' quote'\nb: ''\nc: ' spaced '\nd: '#: not a comment'\n",
    "a: 'trailing   \n   lead'\n",
    // Double-quoted escapes and folding.
    "a: \"tab\\t nl\\n uni\\u00e9 big\\U0001F600 hex\\x41 bs\\\\ q\\\" sl\\/ sp\\  nel\\N nbsp\\_ ls\\L ps\\P z\\0 e\\e\"\n",
    "a: \"one\n  two\n\n  three \\\n  four\\\n\n  five  \n  six\"\nb: \"\"\nc: \" x \"\n",
    "a: \"bell\\a bs\\b vt\\v ff\\f cr\\r\"\n",
    // Block scalars, each chomping.
    "a: |\n  line1\n   indented\n\n  line3\nb: |-\n  x\n\nc: |+\n  y\n\nd: >\n  folded\n  text\n\n  para\n    more\n  back\ne: >-\n  z\n",
    "a: >+\n  kept\n\n\nb: |\n\n  after an empty line\nc: >\n\n  leading\n  empty\n",
    "- |\n  in a sequence\n  # not a comment\n- >-\n  folded in\n  a sequence\n",
    "a: |\n    four\n      six\n    four\nb: |-\nc: >\nd: 1\n",
    "a: |\n  x\n   \n  y\n",
    "a: |2\n    two more\n   one more\nb: >-2\n\n     lead\n  x\n",
    "- |1+\n  y\n\n- x\n",
    "- |2-\n   kept\n- k: |2\n     in a map in a sequence\n",
    // Nested sequences starting on the dash line.
    "- - a\n  - b\n- - - c\n    - d\n  - e\n- f\n",
    "k:\n- - x\n  - y: 1\n    z: 2\n",
    // Empty flow collections.
    "a: {}\nb: []\nc:\n- {}\n- []\n",
    "[]\n---\n{}\n",
    // Comments and blank lines.
    "# head\na: 1 \n\n  # indented comment\nb:\n  # inside\n  c: 2\n# between\n\nd:\n- 1\n# in a list\n- 2\n",
    // Colons and hashes inside long plain scalars and keys.
    "a_key_longer_than_eight_bytes: http://registry.example.com:5000/a/b@sha256:0123456789abcdef#frag\n\
     another.long/key-with:colon_inside: value-with-#-and-:-inside\n",
    // Unicode.
    "name: héllo wörld ✓ 日本\n'ключ': \"значение\"\n",
];

#[test]
fn each_construct_of_the_subset_reads_as_serde_saphyr_reads_it() {
    for text in EDGE_DOCUMENTS {
        assert_reads_as_saphyr(text);
    }
    // Not vacuous: the values are the ones YAML gives.
    let find = |prefix: &str| *EDGE_DOCUMENTS.iter().find(|d| d.starts_with(prefix)).unwrap();
    let v = assert_reads_as_saphyr(find("---\na: 1"));
    assert_eq!(v, [json!({"a": 1}), json!({"b": 2}), json!({"c": 3})]);
    let v = assert_reads_as_saphyr(find("a: |\n  line1"));
    assert_eq!(
        v[0],
        json!({"a": "line1\n indented\n\nline3\n", "b": "x", "c": "y\n\n",
            "d": "folded text\npara\n  more\nback\n", "e": "z"})
    );
    let v = assert_reads_as_saphyr(find("a: \"one"));
    assert_eq!(v[0]["a"], "one two\nthree four\nfive six");
    let v = assert_reads_as_saphyr(find("a: hello"));
    assert_eq!(
        (&v[0]["e"], &v[0]["g"], &v[0]["i"]),
        (&json!(31), &json!(1000), &json!(1500.0))
    );
    let v = assert_reads_as_saphyr(find("a: this is"));
    assert_eq!(
        v[0]["a"],
        "this is a long plain scalar folded\nwith a blank line\n\nand two"
    );
}

/// Values as the typed decoders ask for them: strings from numbers, numbers from quoted text,
/// options from null forms, sequences and maps from null.
#[test]
fn typed_values_decode_as_serde_saphyr_decodes_them() {
    #[derive(Debug, PartialEq, Deserialize)]
    struct Typed {
        s: String,
        n: i64,
        q: i64,
        u: u8,
        f: f64,
        f32: f32,
        inf: f64,
        b: bool,
        qb: bool,
        c: char,
        none1: Option<String>,
        none2: Option<i32>,
        none3: Option<String>,
        some: Option<String>,
        quoted_null: Option<String>,
        seq_null: Vec<String>,
        map_null: BTreeMap<String, String>,
        seq: Vec<i32>,
        map: BTreeMap<String, String>,
        unit: (),
        tuple: (u16, String),
        missing: Option<u32>,
    }
    let text = "s: 8\nn: 80\nq: ' 42 '\nu: 0x1f\nf: 1e1\nf32: 0.1\ninf: -.Inf\nb: yes\nqb: 'off'\nc: é\n\
        none1:\nnone2: ~\nnone3: null\nsome: ''\nquoted_null: 'null'\nseq_null:\nmap_null: ~\n\
        seq:\n- 1\n- -2\nmap:\n  '8': 9\n  t: true\nunit:\ntuple:\n- 7\n- x\n";
    let fast = from_str_multiple::<Typed, Vec<Typed>>(text).unwrap().remove(0);
    let slow: Typed = serde_saphyr::from_str(text).unwrap();
    assert_eq!(fast, slow);
    assert_eq!((fast.s.as_str(), fast.n, fast.q, fast.u), ("8", 80, 42, 31));
    assert_eq!(
        (fast.some.as_deref(), fast.quoted_null.as_deref(), fast.none1),
        (Some(""), Some("null"), None)
    );
    assert_eq!(fast.map["t"], "true");

    // What serde-saphyr refuses, the reader refuses too.
    fn both_refuse<T: for<'de> Deserialize<'de> + std::fmt::Debug>(text: &str) {
        let fast = from_str_multiple::<T, Vec<T>>(text);
        let slow = serde_saphyr::from_str::<T>(text);
        assert!(fast.is_err() && slow.is_err(), "{text}: {fast:?} {slow:?}");
    }
    both_refuse::<BTreeMap<String, String>>("s: ~\n");
    both_refuse::<BTreeMap<String, String>>("s:\n");
    both_refuse::<BTreeMap<String, i64>>("n: 1.5\n");
    both_refuse::<BTreeMap<String, u8>>("u: 300\n");
    both_refuse::<BTreeMap<String, u8>>("u: -1\n");
    both_refuse::<BTreeMap<String, bool>>("b: maybe\n");
    both_refuse::<BTreeMap<String, char>>("c: ab\n");
    both_refuse::<BTreeMap<String, Vec<i32>>>("seq: 5\n");
    both_refuse::<BTreeMap<String, f64>>("f: 1e999\n");
    both_refuse::<BTreeMap<String, f64>>("f: 1_0\n");
    both_refuse::<Value>("f: .inf\n");
    both_refuse::<Value>("f: 1e999\n");
    both_refuse::<BTreeMap<String, String>>("m:\n  a: 1\n");
}

/// One document per construct outside the subset.
fn outside_the_subset() -> Vec<(&'static str, String)> {
    let mut deep = String::from("kind: Node\nextra:\n  labels:\n");
    for level in 0..60 {
        deep.push_str(&"  ".repeat(level + 2));
        deep.push_str("a:\n");
    }
    deep.push_str(&"  ".repeat(62));
    deep.push_str("b: c\n");
    [
        ("an anchor", "kind: Node\nmetadata:\n  name: &n a\n"),
        (
            "an alias",
            "kind: Node\nmetadata:\n  name: a\n  labels:\n    x: *n\n",
        ),
        ("a tag", "kind: Node\nmetadata:\n  name: !!str a\n"),
        ("a flow mapping", "kind: Node\nmetadata: {name: a}\n"),
        ("a flow sequence", "kind: Node\nspec:\n  taints: [a]\n"),
        ("a complex key", "kind: Node\n? metadata\n: name: a\n"),
        ("a directive", "%YAML 1.2\n---\nkind: Node\n"),
        ("a tab", "kind: Node\nmetadata:\n\tname: a\n"),
        (
            "a tab inside a long line",
            "kind: Node\nmetadata:\n  name: abcdefghijklmnop\tqrstuvwxyz0123\n",
        ),
        (
            "a control character",
            "kind: Node\nmetadata:\n  name: 'abcdefghijklmnopqrstuvwxyz\u{1}0123'\n",
        ),
        (
            "a line separator",
            "kind: Node\nmetadata:\n  name: abcdefghijklmnop\u{2028}qrstuvwxyz0123\n",
        ),
        ("a comment after a value", "kind: Node # the kind\n"),
        (
            "a sequence on the line of its key",
            "kind: List\nitems: - kind: Node\n",
        ),
        ("a duplicate key", "kind: Node\nmetadata:\n  name: a\n  name: b\n"),
        ("a merge key", "kind: Node\n<<:\n  a: 1\n"),
        ("an integer key", "kind: Node\n1: a\n"),
        ("a null key", "kind: Node\n~: a\n"),
        ("an indentation indicator on a document", "--- |2\n  kind: Node\n"),
        ("a carriage return", "kind: Node\r\nmetadata:\r\n  name: a\r\n"),
        ("a byte order mark", "\u{feff}kind: Node\n"),
        ("a scalar on the line after its key", "kind:\n  Node\n"),
        (
            "a document after ... without ---",
            "kind: Secret\n...\nkind: Node\n",
        ),
        ("deep nesting", &deep),
        ("a key too long", &format!("kind: Node\n{}: x\n", "k".repeat(600))),
        ("an unclosed quote", "kind: 'Node\n"),
        (
            "a block scalar without a final line break",
            "kind: Node\nx: |\n  a",
        ),
    ]
    .into_iter()
    .map(|(what, text)| (what, text.to_owned()))
    .collect()
}

#[test]
fn constructs_outside_the_subset_are_refused_and_decoded_by_serde_saphyr() {
    for (what, text) in outside_the_subset() {
        let e = from_str_multiple::<read::YamlDocument, read::Documents>(&text)
            .err()
            .unwrap_or_else(|| panic!("{what} was read"));
        assert!(e.to_string().contains("is outside the subset"), "{what}: {e}");
        assert_decode_is_saphyrs(&text);
    }
    // Not vacuous: serde-saphyr reads some of them into objects, and refuses others.
    let decoded: Vec<bool> = outside_the_subset()
        .iter()
        .map(|(_, text)| decode(text, "t.yaml").is_ok_and(|d| !d.objects.inputs.nodes.is_empty()))
        .collect();
    assert!(decoded.iter().filter(|d| **d).count() >= 5, "{decoded:?}");
    assert!(decoded.iter().any(|d| !*d), "{decoded:?}");
}

/// A value that does not decode into its type: the reader's error, then serde-saphyr's
/// message from `decode`.
#[test]
fn a_decoding_error_falls_back_to_serde_saphyrs_message() {
    let text = "kind: Secret\n---\nkind: Node\nmetadata:\n  name: n\n  labels:\n    a:\n    - x\n";
    let e = from_str_multiple::<read::YamlDocument, read::Documents>(text)
        .err()
        .unwrap();
    assert!(matches!(&e, BlockYamlError::Decode { line: 8 | 9, .. }), "{e:?}");
    let Err(SimulateError::ParseYaml { message, .. }) = decode(text, "t.yaml") else {
        panic!("decoded");
    };
    assert!(
        message.contains("Node: ") && message.contains("line 8"),
        "{message}"
    );
    assert_decode_is_saphyrs(text);
}

fn random_text(rng: &mut StdRng) -> String {
    const PIECES: &[&str] = &[
        "a", "word", " ", "  ", "b c", ":", ": ", " :", "#", " #", "# ", "'", "\"", "\\", "é", "✓", "日本",
        "\n", "\n\n", " \n", "\n ", "\t", "true", "null", "~", "yes", "No", "1", "0x1F", "1.5", "-3", "007",
        "1e3", ".inf", "- ", "-", "{", "}", "[", "]", ",", "&a", "*b", "!t", "%", "@", "`", "?", "|", ">",
        "---", "...", "\u{85}", "\u{a0}",
    ];
    if rng.random_bool(0.1) {
        // Longer than a folded line.
        let words = ["lorem", "ipsum", "dolor", "sit", "amet,", "consectetur"];
        let n = rng.random_range(15..40);
        return (0..n)
            .map(|_| words[rng.random_range(0..words.len())])
            .collect::<Vec<_>>()
            .join(if rng.random_bool(0.8) { " " } else { "  " });
    }
    let n = rng.random_range(0..6);
    (0..n)
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}

fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    let kinds = if depth >= 4 { 6 } else { 9 };
    match rng.random_range(0..kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => match rng.random_range(0..4) {
            0 => json!(u64::MAX - rng.random_range(0..1000)),
            1 => json!(i64::MIN + rng.random_range(0..1000)),
            _ => json!(rng.random_range(-1_000_000i64..1_000_000)),
        },
        3 => match rng.random_range(0..3) {
            0 => json!(f64::from(rng.random_range(-100i32..100))),
            1 => json!(rng.random_range(-1e-3..1e-3)),
            _ => json!(rng.random_range(-1e12..1e12)),
        },
        4 | 5 => Value::String(random_text(rng)),
        6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.random_range(0..5))
                .map(|_| (random_text(rng), random_value(rng, depth + 1)))
                .collect(),
        ),
    }
}

/// Random values written by serde-saphyr read the same through the reader, or are refused;
/// refusals are rare.
#[test]
fn random_values_written_by_serde_saphyr_read_the_same() {
    let mut rng = StdRng::seed_from_u64(0x5EED_0B10_C4A1_u64);
    let cases = 3000;
    let mut refused: Vec<String> = Vec::new();
    for _ in 0..cases {
        let root = if rng.random_bool(0.8) {
            Value::Object(
                (0..rng.random_range(1..5))
                    .map(|_| (random_text(&mut rng), random_value(&mut rng, 1)))
                    .collect(),
            )
        } else {
            Value::Array(
                (0..rng.random_range(1..4))
                    .map(|_| random_value(&mut rng, 1))
                    .collect(),
            )
        };
        let text = serde_saphyr::to_string(&root).unwrap();
        let slow = serde_saphyr::from_str::<Value>(&text);
        match (fast_values(&text), slow) {
            (Ok(fast), Ok(slow)) => assert_eq!(fast, [slow], "{text}"),
            (Ok(fast), Err(e)) => panic!("read {fast:?} where serde-saphyr fails ({e}):\n{text}"),
            (Err(e), _) => refused.push(format!("{e}")),
        }
    }
    assert!(
        refused.len() * 20 < cases,
        "{} of {cases} refused: {refused:#?}",
        refused.len()
    );
}

/// Input a user may hand over broken (a truncated dump, a bad edit): every corruption of valid
/// documents is either refused or read exactly as serde-saphyr reads it, and never panics the
/// reader (slicing at a cut multi-byte character, an index past the end).
#[test]
fn corrupted_documents_are_refused_or_read_as_serde_saphyr_reads_them() {
    let mut rng = StdRng::seed_from_u64(0xC0_44_u64);
    let sources: Vec<String> = [KUBECTL_DUMP.to_owned(), bench_like_dump(2)]
        .into_iter()
        .chain(EDGE_DOCUMENTS.iter().map(|d| (*d).to_owned()))
        .collect();
    let pieces = [
        " ",
        "  ",
        "\n",
        "\n- ",
        ": ",
        "-",
        "'",
        "\"",
        "\\",
        "|",
        ">",
        "#",
        "é",
        "ü\n",
        "{}",
        "[]",
        "---\n",
        "...",
        "\t",
        "key: value\n",
        "  - a\n",
    ];
    let mut read = 0;
    for _ in 0..4000 {
        let mut text = sources[rng.random_range(0..sources.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            let boundaries: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            let at = boundaries[rng.random_range(0..boundaries.len())];
            match rng.random_range(0..3) {
                // Cut here (a truncated file).
                0 => text.truncate(at),
                // Delete a stretch.
                1 => {
                    let to = boundaries
                        .iter()
                        .copied()
                        .filter(|&b| b >= at)
                        .nth(rng.random_range(0..8))
                        .unwrap_or(at);
                    text.replace_range(at..to, "");
                }
                // Insert a piece.
                _ => text.insert_str(at, pieces[rng.random_range(0..pieces.len())]),
            }
        }
        let fast = std::panic::catch_unwind(|| fast_values(&text))
            .unwrap_or_else(|_| panic!("the reader panicked on:\n{text}"));
        if let Ok(fast) = fast {
            read += 1;
            match saphyr_values(&text) {
                Ok(slow) => assert_eq!(fast, slow, "{text}"),
                Err(e) => panic!("read {fast:?} where serde-saphyr fails ({e}):\n{text}"),
            }
        }
    }
    // Many corruptions still leave valid YAML: the comparison above is exercised.
    assert!(read > 400, "only {read} corrupted texts were read");
}
