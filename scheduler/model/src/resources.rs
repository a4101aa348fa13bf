//! Resource names, interned ids and amounts.
//!
//! Amounts are integers in the unit the kubelet and kube-scheduler account in: millicores for
//! `cpu`, and whole units (bytes, devices, pods) for everything else. Names are interned once
//! per cluster so that per-node and per-zone checks index dense vectors instead of comparing
//! strings in the hot loop.

use std::collections::HashMap;

use numaplane::quantity::{Format, Quantity};

/// Interned resource id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResId(pub u32);

/// The CPU resource.
pub const CPU: ResId = ResId(0);
/// The memory resource.
pub const MEMORY: ResId = ResId(1);
/// The pod-count resource.
pub const PODS: ResId = ResId(2);
/// Ephemeral storage.
pub const EPHEMERAL_STORAGE: ResId = ResId(3);

/// Kind of a resource, decided once at interning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResKind {
    /// `cpu`.
    Cpu,
    /// `memory`.
    Memory,
    /// `hugepages-<size>`.
    Hugepages,
    /// `ephemeral-storage`, `storage`, `pods` and other native resources without NUMA affinity.
    HostNative,
    /// Extended resources (devices): a domain that does not end in `kubernetes.io`.
    Extended,
}

impl ResKind {
    /// Classifies a resource name with the upstream predicates.
    pub fn of(name: &str) -> Self {
        use numaplane::resource_name::{Class, classify};
        match classify(name) {
            Class::Cpu => ResKind::Cpu,
            Class::Memory => ResKind::Memory,
            Class::Hugepages => ResKind::Hugepages,
            Class::Native => ResKind::HostNative,
            Class::Extended => ResKind::Extended,
        }
    }

    /// cpu, memory and hugepages: the kubelet aligns them to NUMA nodes.
    pub fn is_numa_affine(self) -> bool {
        matches!(self, ResKind::Cpu | ResKind::Memory | ResKind::Hugepages)
    }

    /// Memory-manager resources (memory and hugepages).
    pub fn is_memory_like(self) -> bool {
        matches!(self, ResKind::Memory | ResKind::Hugepages)
    }
}

pub use numaplane::resource_name::is_native;

/// Interner mapping resource names to dense ids.
#[derive(Clone, Debug)]
pub struct Resources {
    names: Vec<String>,
    kinds: Vec<ResKind>,
    index: HashMap<String, ResId>,
}

impl Default for Resources {
    fn default() -> Self {
        let mut r = Resources {
            names: Vec::new(),
            kinds: Vec::new(),
            index: HashMap::new(),
        };
        for n in ["cpu", "memory", "pods", "ephemeral-storage"] {
            r.intern(n);
        }
        r
    }
}

impl Resources {
    /// The id of `name`, interning it if new.
    pub fn intern(&mut self, name: &str) -> ResId {
        if let Some(id) = self.index.get(name) {
            return *id;
        }
        let id = ResId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.names.push(name.to_owned());
        self.kinds.push(ResKind::of(name));
        self.index.insert(name.to_owned(), id);
        id
    }

    /// The id of `name` if known.
    pub fn get(&self, name: &str) -> Option<ResId> {
        self.index.get(name).copied()
    }

    /// The name of `id`.
    pub fn name(&self, id: ResId) -> &str {
        self.names.get(id.0 as usize).map_or("<unknown>", String::as_str)
    }

    /// The kind of `id`.
    pub fn kind(&self, id: ResId) -> ResKind {
        self.kinds
            .get(id.0 as usize)
            .copied()
            .unwrap_or(ResKind::Extended)
    }

    /// Number of interned names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when nothing is interned (never, after construction).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Converts a quantity into an amount for `id` (millicores for cpu, units otherwise).
    pub fn amount(&self, id: ResId, q: &Quantity) -> Result<i64, AmountError> {
        let v = if self.kind(id) == ResKind::Cpu {
            q.millis_ceil()
        } else {
            q.value_ceil()
        };
        // The conversions saturate; a saturated amount cannot be accounted exactly.
        if v == i64::MAX || v == i64::MIN {
            return Err(AmountError {
                resource: self.name(id).to_owned(),
                quantity: q.to_string(),
            });
        }
        Ok(v)
    }

    /// Renders an amount of `id` as a quantity string (`1500m`, `2Gi`, `4`).
    pub fn render(&self, id: ResId, amount: i64) -> String {
        let q = match self.kind(id) {
            ResKind::Cpu => Quantity::from_milli(amount, Format::DecimalSI),
            ResKind::Memory | ResKind::Hugepages | ResKind::HostNative => {
                Quantity::from_int(amount, Format::BinarySI)
            }
            ResKind::Extended => Quantity::from_int(amount, Format::DecimalSI),
        };
        q.to_string()
    }
}

/// A quantity too large for the scheduler's integer accounting.
#[derive(Debug, thiserror::Error)]
#[error("quantity {quantity} of {resource} does not fit in 64-bit accounting")]
pub struct AmountError {
    /// Resource name.
    pub resource: String,
    /// The quantity as written.
    pub quantity: String,
}

/// Sparse resource list: sorted by id, one entry per resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResList(pub Vec<(ResId, i64)>);

impl ResList {
    /// Amount of `id` (0 when absent).
    pub fn get(&self, id: ResId) -> i64 {
        self.0
            .binary_search_by_key(&id, |e| e.0)
            .map_or(0, |i| self.0[i].1)
    }

    /// True if `id` has an entry (even zero).
    pub fn contains(&self, id: ResId) -> bool {
        self.0.binary_search_by_key(&id, |e| e.0).is_ok()
    }

    /// Sets `id` to `v`.
    pub fn set(&mut self, id: ResId, v: i64) {
        match self.0.binary_search_by_key(&id, |e| e.0) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (id, v)),
        }
    }

    /// Adds `v` to `id`.
    pub fn add(&mut self, id: ResId, v: i64) {
        match self.0.binary_search_by_key(&id, |e| e.0) {
            Ok(i) => self.0[i].1 = self.0[i].1.saturating_add(v),
            Err(i) => self.0.insert(i, (id, v)),
        }
    }

    /// Adds every entry of `other`.
    pub fn add_all(&mut self, other: &ResList) {
        for &(id, v) in &other.0 {
            self.add(id, v);
        }
    }

    /// Per-resource maximum with `other`.
    pub fn max_with(&mut self, other: &ResList) {
        for &(id, v) in &other.0 {
            if self.get(id) < v || !self.contains(id) {
                self.set(id, v.max(self.get(id)));
            }
        }
    }

    /// Entries with a positive amount.
    pub fn positive(&self) -> impl Iterator<Item = (ResId, i64)> + '_ {
        self.0.iter().copied().filter(|e| e.1 > 0)
    }

    /// Iterates all entries.
    pub fn iter(&self) -> impl Iterator<Item = (ResId, i64)> + '_ {
        self.0.iter().copied()
    }

    /// True when no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `cpu=2, memory=4Gi` for messages.
    pub fn describe(&self, res: &Resources) -> String {
        self.positive()
            .map(|(id, v)| format!("{}={}", res.name(id), res.render(id, v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Dense per-resource amounts indexed by [`ResId`]; [`ABSENT`] marks a resource not listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dense(pub Vec<i64>);

/// Marker for "this zone does not list the resource".
pub const ABSENT: i64 = i64::MIN;

impl Dense {
    /// Amount, or `None` when absent.
    pub fn get(&self, id: ResId) -> Option<i64> {
        match self.0.get(id.0 as usize) {
            Some(&v) if v != ABSENT => Some(v),
            _ => None,
        }
    }

    /// Amount, 0 when absent.
    pub fn get_or_zero(&self, id: ResId) -> i64 {
        self.get(id).unwrap_or(0)
    }

    /// Sets the amount of `id`, growing the vector.
    pub fn set(&mut self, id: ResId, v: i64) {
        let i = id.0 as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, ABSENT);
        }
        self.0[i] = v;
    }

    /// Subtracts `v` from a listed resource, clamping at zero; absent stays absent.
    pub fn sub_clamped(&mut self, id: ResId, v: i64) {
        if let Some(slot) = self.0.get_mut(id.0 as usize)
            && *slot != ABSENT
        {
            *slot = (*slot - v).max(0);
        }
    }

    /// Listed entries.
    pub fn iter(&self) -> impl Iterator<Item = (ResId, i64)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|e| *e.1 != ABSENT)
            .map(|(i, v)| (ResId(u32::try_from(i).unwrap_or(u32::MAX)), *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_upstream() {
        assert_eq!(ResKind::of("cpu"), ResKind::Cpu);
        assert_eq!(ResKind::of("hugepages-1Gi"), ResKind::Hugepages);
        assert_eq!(ResKind::of("ephemeral-storage"), ResKind::HostNative);
        assert_eq!(ResKind::of("example.kubernetes.io/foo"), ResKind::HostNative);
        assert_eq!(ResKind::of("nvidia.com/gpu"), ResKind::Extended);
        assert!(ResKind::Hugepages.is_numa_affine());
        assert!(!ResKind::Extended.is_numa_affine());
    }

    #[test]
    fn amounts_and_rendering() {
        let mut r = Resources::default();
        let q = |s: &str| Quantity::parse(s).expect("quantity");
        assert_eq!(r.amount(CPU, &q("1500m")).expect("cpu"), 1500);
        assert_eq!(r.amount(CPU, &q("2")).expect("cpu"), 2000);
        assert_eq!(r.amount(MEMORY, &q("1.5Gi")).expect("mem"), 1536 << 20);
        assert_eq!(r.render(CPU, 1500), "1500m");
        assert_eq!(r.render(CPU, 8000), "8");
        assert_eq!(r.render(MEMORY, 16 << 30), "16Gi");
        let gpu = r.intern("nvidia.com/gpu");
        assert_eq!(r.render(gpu, 2), "2");
        assert_eq!(r.intern("nvidia.com/gpu"), gpu);
    }

    #[test]
    fn reslist_ops() {
        let mut l = ResList::default();
        l.add(MEMORY, 5);
        l.add(CPU, 1000);
        l.add(CPU, 500);
        assert_eq!(l.0, vec![(CPU, 1500), (MEMORY, 5)]);
        let mut m = ResList(vec![(CPU, 2000)]);
        m.max_with(&l);
        assert_eq!(m.0, vec![(CPU, 2000), (MEMORY, 5)]);
    }

    #[test]
    fn dense_absent_vs_zero() {
        let mut d = Dense::default();
        d.set(MEMORY, 0);
        assert_eq!(d.get(CPU), None);
        assert_eq!(d.get(MEMORY), Some(0));
        d.set(CPU, 3);
        d.sub_clamped(CPU, 5);
        assert_eq!(d.get(CPU), Some(0));
    }
}
