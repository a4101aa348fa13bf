//! Topology hints and the per-provider hint maps.

use std::collections::BTreeMap;
use std::fmt;

use super::NumaMask;

/// One hint: a NUMA affinity (or "any node") and whether it is a preferred placement.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TopologyHint {
    /// The NUMA nodes; `None` means "any NUMA node / don't care".
    pub mask: Option<NumaMask>,
    /// True if the provider considers this placement optimal.
    pub preferred: bool,
}

impl TopologyHint {
    /// Hint with a mask.
    #[must_use]
    pub const fn new(mask: NumaMask, preferred: bool) -> Self {
        Self {
            mask: Some(mask),
            preferred,
        }
    }

    /// Hint without a mask ("any NUMA node").
    #[must_use]
    pub const fn any(preferred: bool) -> Self {
        Self {
            mask: None,
            preferred,
        }
    }
}

/// Shown as e.g. `{0,1} preferred` or `any not-preferred`.
impl fmt::Display for TopologyHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mask {
            Some(mask) => write!(f, "{mask}")?,
            None => f.write_str("any")?,
        }
        f.write_str(if self.preferred {
            " preferred"
        } else {
            " not-preferred"
        })
    }
}

/// The answer of one provider for one resource, borrowed (no resource name: the merge
/// does not use it). This is the allocation-free input of
/// [`merge_resource_hints`](super::merge_resource_hints).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ResourceHints<'a> {
    /// No preference (the kubelet's nil hint list): becomes `[any, preferred]`.
    NoPreference,
    /// The resource cannot be satisfied (the kubelet's empty list): becomes `[any, not preferred]`.
    CannotSatisfy,
    /// The hints as given. An empty slice means [`ResourceHints::CannotSatisfy`].
    Hints(&'a [TopologyHint]),
}

/// What one hint provider (device manager, CPU manager, memory manager) answered.
///
/// Semantics, as in the kubelet:
/// * `None` or an empty map: the provider has no preference at all;
/// * resource → `None`: no preference for that resource;
/// * resource → `Some(vec![])`: the resource cannot be satisfied;
/// * resource → `Some(hints)`: those hints.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ProviderHints(Option<BTreeMap<String, Option<Vec<TopologyHint>>>>);

impl ProviderHints {
    /// A provider without any preference (the kubelet's nil map).
    #[must_use]
    pub const fn no_preference() -> Self {
        Self(None)
    }

    /// A provider answer from its resource map.
    #[must_use]
    pub const fn new(resources: BTreeMap<String, Option<Vec<TopologyHint>>>) -> Self {
        Self(Some(resources))
    }

    /// Builder: adds (or replaces) the answer for one resource.
    #[must_use]
    pub fn with_resource(mut self, resource: impl Into<String>, hints: Option<Vec<TopologyHint>>) -> Self {
        self.0
            .get_or_insert_with(BTreeMap::new)
            .insert(resource.into(), hints);
        self
    }

    /// The resource map, `None` for the nil map.
    #[must_use]
    pub const fn resources(&self) -> Option<&BTreeMap<String, Option<Vec<TopologyHint>>>> {
        self.0.as_ref()
    }

    /// The raw value.
    #[must_use]
    pub fn into_inner(self) -> Option<BTreeMap<String, Option<Vec<TopologyHint>>>> {
        self.0
    }

    /// True if the provider expresses no preference at all (nil or empty map).
    #[must_use]
    pub fn is_no_preference(&self) -> bool {
        self.0.as_ref().is_none_or(BTreeMap::is_empty)
    }

    /// The normalised per-resource lists this provider contributes to the merge: one
    /// [`ResourceHints::NoPreference`] for a provider without preference, else one entry per
    /// resource (in name order; the merge result does not depend on the order).
    pub fn resource_hints(&self) -> impl Iterator<Item = ResourceHints<'_>> + '_ {
        let none = std::iter::once(ResourceHints::NoPreference).take(usize::from(self.is_no_preference()));
        let some = self.0.iter().flat_map(BTreeMap::values).map(|hints| match hints {
            None => ResourceHints::NoPreference,
            Some(list) if list.is_empty() => ResourceHints::CannotSatisfy,
            Some(list) => ResourceHints::Hints(list),
        });
        none.chain(some)
    }

    /// Number of per-resource lists this provider contributes (≥ 1).
    #[must_use]
    pub fn resource_list_count(&self) -> usize {
        self.0.as_ref().map_or(0, BTreeMap::len).max(1)
    }
}

impl From<BTreeMap<String, Option<Vec<TopologyHint>>>> for ProviderHints {
    fn from(resources: BTreeMap<String, Option<Vec<TopologyHint>>>) -> Self {
        Self::new(resources)
    }
}

impl From<Option<BTreeMap<String, Option<Vec<TopologyHint>>>>> for ProviderHints {
    fn from(resources: Option<BTreeMap<String, Option<Vec<TopologyHint>>>>) -> Self {
        Self(resources)
    }
}
