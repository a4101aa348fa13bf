//! Registering a binary's metric families, shared by the exporter and the scheduler: each
//! family is created and registered in one expression (prometheus-client metrics are handles
//! to shared state, so the registry keeps one and the caller's struct the other), and the
//! registry is encoded in one place.

use prometheus_client::registry::{Metric, Registry, Unit};

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
