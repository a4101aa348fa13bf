//! Serde helpers writing PCI ids as 4 hex digits (`"10de"`), the way `lspci -n` shows them.
//! Deserializing also accepts a `0x` prefix or a plain JSON/YAML integer.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// Serialize a PCI id as 4 lowercase hex digits.
pub(crate) fn serialize<S: Serializer>(id: &u16, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{id:04x}"))
}

/// Deserialize a PCI id from a hex string (`"10de"`, `"0x10de"`) or an integer.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    deserializer.deserialize_any(HexIdVisitor)
}

/// Accepts both encodings because hand-written specs often use `0x10de` or plain numbers.
struct HexIdVisitor;

impl Visitor<'_> for HexIdVisitor {
    type Value = u16;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a 16-bit PCI id as hex digits (\"10de\", \"0x10de\") or an integer")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<u16, E> {
        let digits = value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
            .unwrap_or(value);
        u16::from_str_radix(digits, 16).map_err(|_| E::invalid_value(de::Unexpected::Str(value), &self))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<u16, E> {
        u16::try_from(value).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<u16, E> {
        u16::try_from(value).map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &self))
    }
}
