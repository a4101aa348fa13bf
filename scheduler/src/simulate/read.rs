//! Decoding the objects of one file (multi-document YAML, or a stream of JSON values; `List`
//! kinds as `kubectl get -o yaml|json` writes them, nested lists too) straight from the parser
//! into their typed form in [`Inputs`], picked by `kind`. No generic value tree of the file is
//! built: a 5,000-node dump is read at the speed of the parser, and only the typed objects stay.
//!
//! The kind of an object is not always its first key (`kubectl` sorts keys: a List's `items`,
//! an NRT's `attributes` come before `kind`). Keys met before `kind` are kept aside (small,
//! except `items`) and handed to the typed decoder before the rest of the object; `items` met
//! before `kind` is decoded into objects at once, and kept only if the object is a List.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use serde::Deserialize;

use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess, Visitor,
    value::MapAccessDeserializer,
};
use serde_json::Value;

use super::Inputs;

/// The objects read from a stretch of a file, and the kinds it ignored.
#[derive(Default)]
pub(super) struct Objects {
    /// The objects, by kind.
    pub inputs: Inputs,
    /// Objects not read: (0-based document, why).
    pub ignored: Vec<(usize, String)>,
}

impl Objects {
    fn append(&mut self, other: Objects) {
        self.inputs.append(other.inputs);
        self.ignored.extend(other.ignored);
    }
}

/// One top-level value of a file: a YAML document or a JSON value. A JSON array stands for as
/// many documents as it has elements (`JSON_ARRAYS`); a YAML sequence is one document, not an
/// object.
#[derive(Default)]
pub(super) struct Document<const JSON_ARRAYS: bool> {
    /// Its objects; `ignored` counts documents from 0 at this one.
    pub objects: Objects,
    /// How many documents it stands for.
    pub documents: usize,
}

/// A value of a JSON stream.
pub(super) type JsonDocument = Document<true>;
/// A YAML document.
pub(super) type YamlDocument = Document<false>;

impl<'de, const JSON_ARRAYS: bool> de::Deserialize<'de> for Document<JSON_ARRAYS> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut objects = Objects::default();
        let documents = deserializer.deserialize_any(TopLevel {
            into: &mut objects,
            arrays: JSON_ARRAYS,
        })?;
        Ok(Document { objects, documents })
    }
}

/// The documents of a file, in order.
#[derive(Default)]
pub(super) struct Documents {
    /// Their objects; `ignored` counts documents from 0 at the file's first.
    pub objects: Objects,
    /// How many documents were read.
    pub documents: usize,
}

impl<const JSON_ARRAYS: bool> Extend<Document<JSON_ARRAYS>> for Documents {
    fn extend<I: IntoIterator<Item = Document<JSON_ARRAYS>>>(&mut self, iter: I) {
        for mut d in iter {
            for (index, _) in &mut d.objects.ignored {
                *index += self.documents;
            }
            self.documents += d.documents;
            self.objects.append(d.objects);
        }
    }
}

/// A top-level value: an object, or (if `arrays`) an array of objects, each one document.
struct TopLevel<'a> {
    into: &'a mut Objects,
    arrays: bool,
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object or a list of them")
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<usize, M::Error> {
        ObjectVisitor {
            into: self.into,
            document: 0,
        }
        .visit_map(map)?;
        Ok(1)
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<usize, S::Error> {
        if !self.arrays {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return self.visit_unit();
        }
        let mut document = 0;
        while seq
            .next_element_seed(ObjectSeed {
                into: &mut *self.into,
                document,
            })?
            .is_some()
        {
            document += 1;
        }
        Ok(document)
    }

    fn visit_unit<E: de::Error>(self) -> Result<usize, E> {
        ObjectVisitor {
            into: self.into,
            document: 0,
        }
        .ignore("");
        Ok(1)
    }

    fn visit_none<E: de::Error>(self) -> Result<usize, E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<usize, E> {
        self.visit_unit()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<usize, E> {
        self.visit_unit()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<usize, E> {
        self.visit_unit()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<usize, E> {
        self.visit_unit()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<usize, E> {
        self.visit_unit()
    }
}

/// One object (an element of a List's `items`, or a top-level array's).
struct ObjectSeed<'a> {
    into: &'a mut Objects,
    document: usize,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(ObjectVisitor {
            into: self.into,
            document: self.document,
        })
    }
}

struct ObjectVisitor<'a> {
    into: &'a mut Objects,
    document: usize,
}

impl ObjectVisitor<'_> {
    /// An object of a kind not read (`""`: no kind, or not an object).
    fn ignore(self, kind: &str) {
        self.into
            .ignored
            .push((self.document, format!("kind {kind:?} ignored")));
    }
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
        // Keys before `kind`, and `items` decoded before `kind` said whether this is a List.
        let mut before: Vec<(String, Value)> = Vec::new();
        let mut listed: Option<Objects> = None;
        let kind_value = loop {
            let Some(key) = map.next_key::<String>()? else {
                break None;
            };
            match key.as_str() {
                "kind" => break Some(map.next_value::<Value>()?),
                "items" if listed.is_none() => {
                    let mut items = Objects::default();
                    map.next_value_seed(ItemsSeed {
                        into: &mut items,
                        document: self.document,
                    })?;
                    listed = Some(items);
                }
                _ => before.push((key, map.next_value()?)),
            }
        };
        let Some(kind_value) = kind_value else {
            self.ignore("");
            return Ok(());
        };
        // A kind that is not a string is no kind we read.
        let kind = kind_value.as_str().unwrap_or_default().to_owned();
        if kind.ends_with("List") {
            if let Some(items) = listed {
                self.into.append(items);
            }
            while let Some(key) = map.next_key::<String>()? {
                if key == "items" {
                    map.next_value_seed(ItemsSeed {
                        into: &mut *self.into,
                        document: self.document,
                    })?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            return Ok(());
        }
        // A non-string apiVersion is none that is read.
        let api_version = before
            .iter()
            .find(|(k, _)| k == "apiVersion")
            .map(|(_, v)| v.as_str().unwrap_or_default().to_owned());
        let mut rest = Rest {
            before: before.into_iter(),
            kind: Some(kind_value),
            pending: None,
            map: &mut map,
            ended: false,
        };
        let skipped = self
            .into
            .inputs
            .take(
                &kind,
                api_version.as_deref(),
                MapAccessDeserializer::new(&mut rest),
            )
            .map_err(|e| <M::Error as de::Error>::custom(format_args!("{kind}: {e}")))?;
        // What the typed decoder left, or all of an object not read.
        while rest.next_key::<IgnoredAny>()?.is_some() {
            rest.next_value::<IgnoredAny>()?;
        }
        if let Some(why) = skipped {
            self.into.ignored.push((self.document, why));
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.ignore("");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.visit_unit()
    }
}

/// A List's `items`: null, or a sequence of objects.
struct ItemsSeed<'a> {
    into: &'a mut Objects,
    document: usize,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        while seq
            .next_element_seed(ObjectSeed {
                into: &mut *self.into,
                document: self.document,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<M: MapAccess<'de>>(self, _: M) -> Result<(), M::Error> {
        Err(not_a_list())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(not_a_list())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(not_a_list())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(not_a_list())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(not_a_list())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(not_a_list())
    }
}

fn not_a_list<E: de::Error>() -> E {
    E::custom("items is not a list")
}

/// An object's entries for its typed decoder: those read before `kind`, `kind`, then the rest
/// as the parser gives them.
struct Rest<'m, M> {
    before: std::vec::IntoIter<(String, Value)>,
    kind: Option<Value>,
    /// The value of the key last given from `before` or `kind`.
    pending: Option<Value>,
    map: &'m mut M,
    /// The parser's map has ended (it is not asked again).
    ended: bool,
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for Rest<'_, M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, M::Error> {
        if let Some((key, value)) = self.before.next() {
            self.pending = Some(value);
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        if let Some(kind) = self.kind.take() {
            self.pending = Some(kind);
            return seed.deserialize("kind".into_deserializer()).map(Some);
        }
        if self.ended {
            return Ok(None);
        }
        let key = self.map.next_key_seed(seed)?;
        self.ended = key.is_none();
        Ok(key)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, M::Error> {
        match self.pending.take() {
            Some(value) => seed.deserialize(value).map_err(<M::Error as de::Error>::custom),
            None => self.map.next_value_seed(seed),
        }
    }
}

/// A Node as the model reads it ([`crate::cluster::Cluster::apply_node`]): its name, labels,
/// spec (taints, unschedulable) and allocatable. A dump's Nodes are mostly image lists,
/// conditions, addresses and node info; the parser skips those instead of keeping them. The
/// apiVersion is checked as the full type checks it.
pub(super) fn node<'de, D: Deserializer<'de>>(object: D) -> Result<Node, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Read {
        api_version: Option<String>,
        metadata: Option<Meta>,
        spec: Option<NodeSpec>,
        status: Option<Status>,
    }
    #[derive(Deserialize)]
    struct Meta {
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    }
    #[derive(Deserialize)]
    struct Status {
        allocatable: Option<BTreeMap<String, Quantity>>,
    }
    let read = Read::deserialize(object)?;
    if let Some(v) = &read.api_version
        && v != "v1"
    {
        return Err(de::Error::invalid_value(de::Unexpected::Str(v), &"v1"));
    }
    let (name, labels) = read.metadata.map(|m| (m.name, m.labels)).unwrap_or_default();
    Ok(Node {
        metadata: ObjectMeta {
            name,
            labels,
            ..ObjectMeta::default()
        },
        spec: read.spec,
        status: read.status.map(|s| NodeStatus {
            allocatable: s.allocatable,
            ..NodeStatus::default()
        }),
    })
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::{Value, json};

    use super::super::{Inputs, SimulateError, read_inputs};

    /// The reader through a generic value tree, kept as an independent path to compare with:
    /// every document parsed whole, then each object decoded by kind from its tree.
    fn through_trees(text: &str, path: &str) -> Inputs {
        let trimmed = text.trim_start();
        let docs: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
            let mut out = Vec::new();
            for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
                match v.unwrap() {
                    Value::Array(items) => out.extend(items),
                    other => out.push(other),
                }
            }
            out
        } else {
            let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
            docs.into_iter().filter(|d| !d.is_null()).collect()
        };
        let mut inputs = Inputs::default();
        let mut stack = vec![docs.into_iter()];
        let mut index = 0;
        while let Some(top) = stack.last_mut() {
            let Some(mut doc) = top.next() else {
                stack.pop();
                continue;
            };
            if stack.len() == 1 {
                index += 1;
            }
            let kind = doc["kind"].as_str().unwrap_or("").to_owned();
            if kind.ends_with("List") {
                if let Some(Value::Array(items)) = doc.get_mut("items").map(Value::take) {
                    stack.push(items.into_iter());
                }
                continue;
            }
            if let Some(why) = inputs.take(&kind, None, doc).unwrap() {
                inputs.skipped.push(format!("{path}: document {index}: {why}"));
            }
        }
        inputs
    }

    pub(in crate::simulate) fn assert_same(a: &Inputs, b: &Inputs) {
        assert_eq!(a.nodes, b.nodes);
        assert_eq!(a.nrts, b.nrts);
        assert_eq!(a.pods, b.pods);
        assert_eq!(a.namespaces, b.namespaces);
        assert_eq!(a.skipped, b.skipped);
        assert_eq!(a.storage.claims, b.storage.claims);
        assert_eq!(a.storage.volumes, b.storage.volumes);
        assert_eq!(a.storage.classes, b.storage.classes);
        assert_eq!(a.storage.csi_nodes, b.storage.csi_nodes);
        assert_eq!(a.budgets, b.budgets);
        assert_eq!(a.device_classes, b.device_classes);
        assert_eq!(a.resource_slices, b.resource_slices);
        assert_eq!(a.resource_claims, b.resource_claims);
    }

    fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Reads `text` both ways, as YAML and as the same objects in JSON; returns what was read.
    fn read_both_ways(objects: &[Value]) -> Inputs {
        let dir = tempfile::tempdir().unwrap();
        let yaml: String = objects
            .iter()
            .map(|o| format!("---\n{}", serde_saphyr::to_string(o).unwrap()))
            .collect();
        let json: String = objects.iter().map(|o| format!("{o}\n")).collect();
        let mut first = None;
        for (name, text) in [("in.yaml", yaml), ("in.json", json)] {
            let path = write(dir.path(), name, &text);
            let typed = read_inputs(&[&path]).unwrap();
            assert_same(&typed, &through_trees(&text, &path));
            let skipped: Vec<String> = typed.skipped.iter().map(|s| s.replace(name, "IN")).collect();
            match &first {
                None => first = Some(skipped),
                Some(f) => assert_eq!(&skipped, f, "YAML and JSON skip the same documents"),
            }
            if name.ends_with("json") {
                return typed;
            }
        }
        unreachable!()
    }

    /// One object of every kind read, each with more than the model reads, in the key order
    /// `kubectl` writes (sorted: `apiVersion`, `items` and an NRT's `attributes` before `kind`).
    fn every_kind() -> Vec<Value> {
        vec![
            json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "pool": "a"},
                    "annotations": {"x": "y"}},
                "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
                "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "2"},
                    "capacity": {"cpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "images": [{"names": ["a:1", "a@sha256:00"], "sizeBytes": 10}]}}),
            json!({"apiVersion": "topology.node.k8s.io/v1alpha2",
                "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
                "kind": "NodeResourceTopology", "metadata": {"name": "n1"},
                "topologyPolicies": ["SingleNUMANodeContainerLevel"],
                "zones": [{"name": "node-0", "type": "Node", "costs": [{"name": "node-0", "value": 10}],
                    "resources": [{"name": "cpu", "capacity": "8", "allocatable": "8", "available": "7"}]}]}),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}},
                "spec": {"nodeName": "n1", "priority": 5,
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]},
                "status": {"phase": "Running", "qosClass": "Guaranteed"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns", "labels": {"team": "t"}}}),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "b", "namespace": "ns"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "x"}}},
                "status": {"currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 1}}),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "v"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                    "csi": {"driver": "d", "volumeHandle": "h"}}}),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"},
                "provisioner": "d", "volumeBindingMode": "WaitForFirstConsumer"}),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"},
                "spec": {"drivers": [{"name": "d", "nodeID": "n1", "allocatable": {"count": 3}}]}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "n1-gpu"},
                "spec": {"driver": "gpu.example.com", "nodeName": "n1",
                    "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0", "attributes": {"numa": {"int": 0}},
                        "capacity": {"memory": {"value": "40Gi"}}}]}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 1}}]}}}),
        ]
    }

    #[test]
    fn every_kind_read_decodes_as_through_a_tree() {
        let objects = every_kind();
        let read = read_both_ways(&objects);
        // Not vacuous: each list holds its object.
        assert_eq!(
            [
                read.nodes.len(),
                read.nrts.len(),
                read.pods.len(),
                read.namespaces.len(),
                read.budgets.len(),
                read.storage.claims.len(),
                read.storage.volumes.len(),
                read.storage.classes.len(),
                read.storage.csi_nodes.len(),
                read.device_classes.len(),
                read.resource_slices.len(),
                read.resource_claims.len(),
            ],
            [1; 12]
        );
        assert!(read.skipped.is_empty(), "{:?}", read.skipped);
        assert_eq!(read.nrts[0].zones.len(), 1);
        assert_eq!(read.nodes[0].metadata.labels.as_ref().unwrap()["pool"], "a");
    }

    /// A Node keeps what the model reads, exactly as the full type decodes it, and nothing else.
    #[test]
    fn nodes_keep_what_the_model_reads() {
        let object = every_kind().swap_remove(0);
        let full: k8s_openapi::api::core::v1::Node = serde_json::from_value(object.clone()).unwrap();
        let kept = super::node(object).unwrap();
        assert_eq!(kept.metadata.name, full.metadata.name);
        assert_eq!(kept.metadata.labels, full.metadata.labels);
        assert!(kept.metadata.annotations.is_none() && full.metadata.annotations.is_some());
        assert_eq!(kept.spec, full.spec);
        let (kept, full) = (kept.status.unwrap(), full.status.unwrap());
        assert_eq!(kept.allocatable, full.allocatable);
        assert!(kept.images.is_none() && full.images.is_some());
        assert!(kept.conditions.is_none() && kept.capacity.is_none());
        // The same checks as the full type: apiVersion, and the type of each field read.
        assert!(super::node(json!({"apiVersion": "v2", "metadata": {"name": "n"}})).is_err());
        assert!(super::node(json!({"metadata": {"name": 5}})).is_err());
        assert!(super::node(json!({"status": {"allocatable": {"cpu": [1]}}})).is_err());
        assert!(super::node(json!({"spec": {"taints": [{"key": "k", "timeAdded": "yesterday"}]}})).is_err());
        let bare = super::node(json!({"kind": "Node", "metadata": null, "status": null})).unwrap();
        assert_eq!(bare, k8s_openapi::api::core::v1::Node::default());
    }

    #[test]
    fn lists_nested_lists_and_kind_after_the_fields_read_the_same() {
        let objects = every_kind();
        // `kind` last in every object, then every object in a List whose `items` come first,
        // with a nested List inside.
        let kind_last: Vec<Value> = objects
            .iter()
            .map(|o| {
                let mut fields: Vec<(String, Value)> = o
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| *k != "kind")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                fields.push(("kind".into(), o["kind"].clone()));
                Value::Object(fields.into_iter().collect())
            })
            .collect();
        let mut items = vec![json!({"apiVersion": "v1", "items": kind_last[..4], "kind": "NodeList"})];
        items.extend(kind_last[4..].iter().cloned());
        let listed =
            json!({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}});
        let nested = json!({"apiVersion": "v1", "items": [
            {"apiVersion": "v1", "items": kind_last[..4], "kind": "NodeList"}
        ], "kind": "List"});
        let mut flat = vec![json!({"kind": "List", "items": kind_last[4..]}), nested];
        let a = read_both_ways(&[listed]);
        let b = read_both_ways(&objects);
        flat.rotate_left(1);
        let c = read_both_ways(&flat);
        for other in [&b, &c] {
            assert_eq!(a.nodes, other.nodes);
            assert_eq!(a.nrts, other.nrts);
            assert_eq!(a.resource_claims, other.resource_claims);
            assert_eq!(a.storage.csi_nodes, other.storage.csi_nodes);
        }
        assert_eq!(a.nodes.len(), 1);
        assert_eq!(a.resource_slices.len(), 1);
    }

    #[test]
    fn dra_objects_are_read_whether_their_api_version_comes_before_kind_or_after() {
        let dir = tempfile::tempdir().unwrap();
        let slice = "metadata: {name: n1-gpu}\nspec: {driver: gpu.example.com, nodeName: n1, \
                     pool: {name: n1, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0}]}\n";
        let first = write(
            dir.path(),
            "first.yaml",
            &format!("apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\n{slice}"),
        );
        let after = write(
            dir.path(),
            "after.yaml",
            &format!(
                "kind: ResourceSlice\n{slice}apiVersion: resource.k8s.io/v1\n---\n\
                 kind: DeviceClass\nmetadata: {{name: old}}\napiVersion: resource.k8s.io/v1beta1\n"
            ),
        );
        let a = read_inputs(&[&first]).unwrap();
        let b = read_inputs(&[&after]).unwrap();
        assert_eq!(a.resource_slices.len(), 1);
        assert_eq!(a.resource_slices, b.resource_slices);
        assert!(a.skipped.is_empty(), "{:?}", a.skipped);
        assert_eq!(b.device_classes.len(), 0);
        assert_eq!(b.skipped.len(), 1);
        assert!(
            b.skipped[0]
                .ends_with("document 2: DeviceClass ignored: only apiVersion resource.k8s.io/v1 is read"),
            "{:?}",
            b.skipped
        );
    }

    #[test]
    fn objects_not_read_are_skipped_with_their_document() {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "b"}}),
            json!({"apiVersion": "v1", "metadata": {"name": "no-kind"}}),
            json!({"apiVersion": "v1", "kind": 5}),
            json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass", "metadata": {"name": "old"}}),
            json!({"kind": "ResourceClaim", "metadata": {"name": "unversioned"}}),
            json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "ConfigMap"}, null, 7,
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "kept"}}]}),
            json!({"apiVersion": "v1", "kind": "List", "items": null}),
            json!({"apiVersion": "v1", "kind": "PodList"}),
        ];
        let read = read_both_ways(&objects);
        assert_eq!(
            read.skipped
                .iter()
                .map(|s| s.split_once(": ").unwrap().1)
                .collect::<Vec<_>>(),
            [
                "document 1: kind \"Secret\" ignored",
                "document 2: kind \"\" ignored",
                "document 3: kind \"\" ignored",
                "document 4: DeviceClass ignored: only apiVersion resource.k8s.io/v1 is read",
                "document 5: ResourceClaim ignored: only apiVersion resource.k8s.io/v1 is read",
                "document 6: kind \"ConfigMap\" ignored",
                "document 6: kind \"\" ignored",
                "document 6: kind \"\" ignored",
            ]
        );
        assert_eq!(read.nodes.len(), 1);
        assert!(read.device_classes.is_empty() && read.resource_claims.is_empty());
    }

    /// YAML: empty documents are not counted and a sequence is one document that is not an
    /// object; JSON: a top-level array stands for its elements and `null` is a document.
    #[test]
    fn documents_are_counted_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = "---\n---\nkind: Secret\n---\n- kind: Node\n  metadata: {name: a}\n---\nnull\n---\nkind: ConfigMap\n";
        let path = write(dir.path(), "a.yaml", yaml);
        let read = read_inputs(&[&path]).unwrap();
        assert_same(&read, &through_trees(yaml, &path));
        assert!(read.nodes.is_empty());
        assert_eq!(
            read.skipped,
            [
                format!("{path}: document 1: kind \"Secret\" ignored"),
                format!("{path}: document 2: kind \"\" ignored"),
                format!("{path}: document 3: kind \"ConfigMap\" ignored"),
            ]
        );
        let json = "[{\"kind\": \"Secret\"}, {\"kind\": \"Node\", \"metadata\": {\"name\": \"a\"}}]\nnull\n[]\n{\"kind\": \"ConfigMap\"}";
        let path = write(dir.path(), "a.json", json);
        let read = read_inputs(&[&path]).unwrap();
        assert_same(&read, &through_trees(json, &path));
        assert_eq!(read.nodes.len(), 1);
        assert_eq!(
            read.skipped,
            [
                format!("{path}: document 1: kind \"Secret\" ignored"),
                format!("{path}: document 3: kind \"\" ignored"),
                format!("{path}: document 4: kind \"ConfigMap\" ignored"),
            ]
        );
    }

    fn read_error(name: &str, text: &str) -> SimulateError {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), name, text);
        match read_inputs(&[&path]) {
            Ok(_) => panic!("{name} read: {text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn malformed_objects_fail_with_the_kind_and_the_place() {
        // YAML: the parser's place (line and column) and the kind.
        let e = read_error(
            "bad.yaml",
            "kind: Secret\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  labels: [a, b]\n",
        );
        let SimulateError::ParseYaml { path, message } = &e else {
            panic!("{e:?}");
        };
        assert!(path.ends_with("bad.yaml"));
        assert!(
            message.contains("Node: ") && message.contains("line 7"),
            "{message}"
        );
        // The same object when `kind` comes after the bad field.
        let e = read_error("late.yaml", "metadata: {name: n, labels: [a]}\nkind: Node\n");
        assert!(
            matches!(&e, SimulateError::ParseYaml { message, .. } if message.contains("Node: ")),
            "{e:?}"
        );
        // JSON: the document, the kind and the place.
        let e = read_error(
            "bad.json",
            "{\"kind\": \"Secret\"}\n{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"spec\": {\"containers\": 5}}",
        );
        let SimulateError::ParseDocument { index, message, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*index, 2);
        assert!(
            message.contains("Pod: ") && message.contains("line 2"),
            "{message}"
        );
        // A DRA object of the version read, malformed.
        let e = read_error(
            "dra.yaml",
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nspec: {devices: 3}\n",
        );
        assert!(
            matches!(&e, SimulateError::ParseYaml { message, .. } if message.contains("ResourceSlice: ")),
            "{e:?}"
        );
        // A List whose items are not a list.
        let e = read_error("list.json", "{\"kind\": \"List\", \"items\": {\"a\": 1}}");
        assert!(
            matches!(&e, SimulateError::ParseDocument { index: 1, message, .. } if message.contains("items is not a list")),
            "{e:?}"
        );
        // A quantity that is not a string or a number is a decoding error.
        let e = read_error(
            "q.yaml",
            "kind: Node\nmetadata: {name: n}\nstatus:\n  allocatable: {cpu: [8]}\n",
        );
        assert!(
            matches!(&e, SimulateError::ParseYaml { message, .. } if message.contains("Node: ") && message.contains("line 4")),
            "{e:?}"
        );
    }
}
