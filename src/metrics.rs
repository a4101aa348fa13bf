//! Registering a binary's metric families, shared by the exporter and the scheduler: each
//! family is created and registered in one expression (prometheus-client metrics are handles
//! to shared state, so the registry keeps one and the caller's struct the other), and the
//! registry is encoded in one place.

use prometheus_client::registry::{Metric, Registry, Unit};

/// The metric families of one binary: the handles its code records into, registered under one
/// prefix. [`Registered`] builds them with the registry that serves them.
pub trait Families: Sized {
    /// The prefix of every name (`numaplane_exporter`, `numaplane_scheduler`).
    const PREFIX: &'static str;

    /// Registers every family and returns the handles.
    fn register(r: &mut Registrar<'_>) -> Self;
}

/// A binary's families and the registry that serves them, built together; the families are
/// reached through `Deref` (`metrics.scans.inc()`).
#[derive(Debug)]
pub struct Registered<F> {
    registry: Registry,
    families: F,
}

impl<F: Families> Registered<F> {
    /// Registers every family of `F` under [`Families::PREFIX`].
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(F::PREFIX);
        let families = F::register(&mut Registrar::new(&mut registry));
        Registered { registry, families }
    }
}

impl<F: Families> Default for Registered<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F> Registered<F> {
    /// The OpenMetrics text of every family.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        encode(&self.registry)
    }
}

impl<F> std::ops::Deref for Registered<F> {
    type Target = F;

    fn deref(&self) -> &F {
        &self.families
    }
}

/// Registers families into a registry (or a sub-registry) and hands each back.
#[derive(Debug)]
pub struct Registrar<'a> {
    registry: &'a mut Registry,
}

impl<'a> Registrar<'a> {
    /// Registers into `registry` (names get its prefix).
    pub fn new(registry: &'a mut Registry) -> Self {
        Registrar { registry }
    }

    /// Registers `metric` as `name` with `help`; returns it.
    pub fn add<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.registry.register(name, help, metric.clone());
        metric
    }

    /// Registers a default-constructed family (counters, gauges, families of them).
    pub fn family<M: Metric + Clone + Default>(&mut self, name: &str, help: &str) -> M {
        self.add(name, help, M::default())
    }

    /// Registers `metric` as `name` with `help` and `unit` (the unit becomes a name suffix).
    pub fn with_unit<M: Metric + Clone>(&mut self, name: &str, help: &str, unit: Unit, metric: M) -> M {
        self.registry.register_with_unit(name, help, unit, metric.clone());
        metric
    }

    /// A registrar for the sub-registry whose names get `prefix` too.
    pub fn sub(&mut self, prefix: &str) -> Registrar<'_> {
        Registrar {
            registry: self.registry.sub_registry_with_prefix(prefix),
        }
    }
}

/// The registry in OpenMetrics text ([`crate::exposition::render`] turns it into the format the
/// scraper asked for).
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};

    #[derive(Debug)]
    struct Two {
        calls: Counter,
        up: Gauge,
    }

    impl Families for Two {
        const PREFIX: &'static str = "two";

        fn register(r: &mut Registrar<'_>) -> Self {
            Two {
                calls: r.family("calls", "Calls"),
                up: r.family("up", "1 while up"),
            }
        }
    }

    #[test]
    fn a_binary_s_families_are_served_by_the_registry_built_with_them() {
        let m = Registered::<Two>::new();
        m.calls.inc_by(3);
        m.up.set(1);
        let text = m.encode().expect("encode");
        assert!(text.contains("two_calls_total 3"), "{text}");
        assert!(text.contains("two_up 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn registered_families_share_state_with_the_handles_returned() {
        let mut registry = Registry::with_prefix("app");
        let mut r = Registrar::new(&mut registry);
        let hits: Counter = r.family("hits", "Hits");
        let up = r.add("up", "1 while up", Gauge::<i64>::default());
        let latency = r.with_unit("latency", "Latency", Unit::Seconds, Histogram::new([0.1, 1.0]));
        let inner: Counter = r.sub("sub").family("calls", "Calls");
        hits.inc();
        up.set(1);
        latency.observe(0.5);
        inner.inc_by(2);
        let text = encode(&registry).expect("encode");
        for line in [
            "app_hits_total 1",
            "app_up 1",
            "app_latency_seconds_count 1",
            "app_sub_calls_total 2",
            "# HELP app_hits Hits.",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
