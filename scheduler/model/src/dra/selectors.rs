//! Compiled CEL selectors, and their verdicts per device, kept across allocations: a cluster
//! has a handful of expressions and a device's verdict does not depend on the node, so a
//! decision over thousands of nodes evaluates each (expression, device) pair once.

use std::sync::{Arc, Mutex};

use foldhash::HashMap as FastMap;

use super::cel::{CelError, DeviceView, Selector};

/// Bound on cached verdicts: past it the verdicts are dropped and rebuilt on demand (memory
/// stays bounded on a cluster with very many devices and expressions).
const MAX_VERDICTS: usize = 1 << 20;

#[derive(Default)]
struct Inner {
    compiled: FastMap<String, Result<(u32, Arc<Selector>), CelError>>,
    /// Per expression id, `driver/pool/device` → verdict (looked up by `&str`: no key is
    /// built for a hit).
    verdicts: FastMap<u32, FastMap<String, Result<bool, CelError>>>,
    /// Verdicts held, for the bound.
    held: usize,
}

/// Why a selector gave no verdict.
#[derive(Debug, Clone)]
pub enum VerdictError {
    /// The expression does not compile.
    Compile(CelError),
    /// It compiles, and fails on the device.
    Evaluate(CelError),
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
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Forgets the verdicts (devices changed); compiled expressions stay.
    pub fn devices_changed(&self) {
        let mut inner = self.lock();
        inner.verdicts.clear();
        inner.held = 0;
    }

    /// Compiles `expression` (once).
    pub fn compile(&self, expression: &str) -> Result<(), CelError> {
        Self::compiled(&mut self.lock(), expression).map(|_| ())
    }

    fn compiled(inner: &mut Inner, expression: &str) -> Result<(u32, Arc<Selector>), CelError> {
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
        self.verdict(expression, device).map_err(|e| match e {
            VerdictError::Compile(e) | VerdictError::Evaluate(e) => e,
        })
    }

    /// Whether `device` matches `expression`, telling a compile error from an evaluation one.
    /// A cached verdict costs one lock and two lookups.
    pub fn verdict(&self, expression: &str, device: &DeviceView<'_>) -> Result<bool, VerdictError> {
        let selector = {
            let mut inner = self.lock();
            let (id, selector) = Self::compiled(&mut inner, expression).map_err(VerdictError::Compile)?;
            if let Some(v) = inner.verdicts.get(&id).and_then(|m| m.get(device.id)) {
                return v.clone().map_err(VerdictError::Evaluate);
            }
            (id, selector)
        };
        // Evaluated without the lock: a CEL program may take a while.
        let (id, selector) = selector;
        let v = selector.matches(device);
        let mut inner = self.lock();
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
        v.map_err(VerdictError::Evaluate)
    }
}
