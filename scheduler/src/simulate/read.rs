//! Decoding the objects of one file (multi-document YAML, or a stream of JSON values; `List`
//! kinds as `kubectl get -o yaml|json` writes them, nested lists too) straight from the parser
//! into their typed form in [`Inputs`], picked by `kind`. No generic value tree of the file is
//! built: a 5,000-node dump is read at the speed of the parser, and only the typed objects stay.
//!
//! The kind of an object is not always its first key (`kubectl` sorts keys: a List's `items`,
//! an NRT's `attributes` come before `kind`). Keys met before `kind` are kept aside (small,
//! except `items`) and handed to the typed decoder before the rest of the object; `items` met
//! before `kind` is decoded into objects at once, and kept only if the object is a List.

use std::fmt;

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
    /// Objects of kinds not read: (0-based document, kind).
    pub ignored: Vec<(usize, String)>,
}

impl Objects {
    fn append(&mut self, other: Objects) {
        self.inputs.append(other.inputs);
        self.ignored.extend(other.ignored);
    }
}

/// One top-level value of a file: a YAML document or a JSON value (a JSON array stands for as
/// many documents as it has elements).
#[derive(Default)]
pub(super) struct Document {
    /// Its objects; `ignored` counts documents from 0 at this one.
    pub objects: Objects,
    /// How many documents it stands for.
    pub documents: usize,
}

impl<'de> de::Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut objects = Objects::default();
        let documents = deserializer.deserialize_any(TopLevel(&mut objects))?;
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

impl Extend<Document> for Documents {
    fn extend<I: IntoIterator<Item = Document>>(&mut self, iter: I) {
        for mut d in iter {
            for (index, _) in &mut d.objects.ignored {
                *index += self.documents;
            }
            self.documents += d.documents;
            self.objects.append(d.objects);
        }
    }
}

/// A top-level value: an object, or an array of objects (each one document).
struct TopLevel<'a>(&'a mut Objects);

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object or a list of them")
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<usize, M::Error> {
        ObjectVisitor {
            into: self.0,
            document: 0,
        }
        .visit_map(map)?;
        Ok(1)
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<usize, S::Error> {
        let mut document = 0;
        while seq
            .next_element_seed(ObjectSeed {
                into: &mut *self.0,
                document,
            })?
            .is_some()
        {
            document += 1;
        }
        Ok(document)
    }

    fn visit_unit<E: de::Error>(self) -> Result<usize, E> {
        self.0.ignored.push((0, String::new()));
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
    fn ignore(self, kind: String) {
        self.into.ignored.push((self.document, kind));
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
            self.ignore(String::new());
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
        let mut rest = Rest {
            before: before.into_iter(),
            kind: Some(kind_value),
            pending: None,
            map: &mut map,
            ended: false,
        };
        let taken = self
            .into
            .inputs
            .take(&kind, MapAccessDeserializer::new(&mut rest))
            .map_err(|e| <M::Error as de::Error>::custom(format_args!("{kind}: {e}")))?;
        // What the typed decoder left, or all of an object not read.
        while rest.next_key::<IgnoredAny>()?.is_some() {
            rest.next_value::<IgnoredAny>()?;
        }
        if !taken {
            self.ignore(kind);
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.ignore(String::new());
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
