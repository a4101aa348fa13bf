//! Compiled CEL selectors, and their verdicts per device, kept across allocations: a cluster
//! has a handful of expressions and a device's verdict does not depend on the node, so a
//! decision over thousands of nodes evaluates each (expression, device) pair once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use foldhash::HashMap as FastMap;

use super::cel::{CelError, DeviceView, Selector};

/// Bound on cached verdicts: past it the verdicts are dropped and rebuilt on demand (memory
/// stays bounded on a cluster with very many devices and expressions).
const MAX_VERDICTS: usize = 1 << 20;

#[derive(Default)]
struct Inner {
    compiled: HashMap<String, Result<(u32, Arc<Selector>), CelError>>,
    /// Per expression id, `driver/pool/device` → verdict (looked up by `&str`: no key is
    /// built for a hit).
    verdicts: FastMap<u32, FastMap<String, Result<bool, CelError>>>,
    /// Verdicts held, for the bound.
    held: usize,
}

/// The cache. Cloning gives an empty one (a clone of the cluster starts cold).
#[derive(Default)]
pub struct SelectorCache {
    inner: Mutex<Inner>,
}

impl Clone for SelectorCache {
    fn clone(&self) -> Self {
        SelectorCache::default()
    }
}

impl std::fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SelectorCache")
    }
}

impl SelectorCache {
    /// Forgets the verdicts (devices changed); compiled expressions stay.
    pub fn devices_changed(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.verdicts.clear();
            inner.held = 0;
        }
    }

    /// Compiles `expression` (once).
    pub fn compile(&self, expression: &str) -> Result<(), CelError> {
        self.compiled(expression).map(|_| ())
    }

    fn compiled(&self, expression: &str) -> Result<(u32, Arc<Selector>), CelError> {
        let mut inner = match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(c) = inner.compiled.get(expression) {
            return c.clone();
        }
        let id = u32::try_from(inner.compiled.len()).unwrap_or(u32::MAX);
        let c = Selector::compile(expression).map(|s| (id, Arc::new(s)));
        inner.compiled.insert(expression.to_owned(), c.clone());
        c
    }

    /// Whether `device` matches `expression`.
    pub fn matches(&self, expression: &str, device: &DeviceView<'_>) -> Result<bool, CelError> {
        let (id, selector) = self.compiled(expression)?;
        if let Ok(inner) = self.inner.lock()
            && let Some(v) = inner.verdicts.get(&id).and_then(|m| m.get(device.id))
        {
            return v.clone();
        }
        let v = selector.matches(device);
        if let Ok(mut inner) = self.inner.lock() {
            if inner.held >= MAX_VERDICTS {
                inner.verdicts.clear();
                inner.held = 0;
            }
            if inner
                .verdicts
                .entry(id)
                .or_default()
                .insert(device.id.to_owned(), v.clone())
                .is_none()
            {
                inner.held += 1;
            }
        }
        v
    }
}
