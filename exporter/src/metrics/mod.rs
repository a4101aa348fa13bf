//! Prometheus metrics of the agent (prometheus-client), named per the Prometheus conventions and
//! labelled `numa_node` for NUMA ids as the kubelet does. No pod names ever become labels.

use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use numaplane::metrics::Registrar;
use numaplane::quantity::Quantity;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;

use crate::accounting::{Accounting, AnomalyKind};

pub mod allocator;

/// Labels of the per-zone resource gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabels {
    /// Node name.
    pub node: String,
    /// Zone name (`node-<id>`).
    pub zone: String,
    /// NUMA node id, as the kubelet labels it.
    pub numa_node: String,
    /// Resource name (`cpu`, `memory`, `hugepages-1Gi`, device resources).
    pub resource: String,
}

/// Labels of the zone distance gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CostLabels {
    /// Node name.
    pub node: String,
    /// Source NUMA node id.
    pub numa_node: String,
    /// Destination zone name.
    pub to_zone: String,
}

/// Pod-resources gRPC method, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PodResourcesMethod {
    /// `List`.
    List,
    /// `GetAllocatableResources`.
    GetAllocatableResources,
    /// `Get`.
    Get,
    /// `Watch`.
    Watch,
}

/// Labels of the pod-resources request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The gRPC method.
    pub method: PodResourcesMethod,
    /// gRPC status code name (`OK`, `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, …).
    pub code: String,
}

/// Labels carrying one bounded string value.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The bounded kind.
    pub kind: String,
}

/// Labels of scans.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScanLabels {
    /// What woke the agent up (`startup`, `resync`, `kubelet_watch`, `pod_watch`, …).
    pub trigger: String,
    /// `success` or the failure kind.
    pub result: String,
}

/// Labels of allocatable re-reads.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RereadLabels {
    /// `device_plugin`, `node_allocatable` or `retry`.
    pub cause: String,
}

/// Labels of waits for devices in allocatable.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// The extended resource.
    pub resource: String,
    /// `appeared` or `gave_up`.
    pub outcome: String,
}

/// Labels of NRT writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `apply`.
    pub operation: String,
    /// `success` or `error`.
    pub result: String,
}

/// Labels of the info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InfoLabels {
    /// Agent version.
    pub version: String,
    /// Node name.
    pub node: String,
    /// Published Topology Manager policy.
    pub topology_manager_policy: String,
    /// Published Topology Manager scope.
    pub topology_manager_scope: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

/// `driver`: a DRA driver name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriverLabels {
    /// The driver.
    pub driver: String,
}

/// Labels of the per-zone DRA device gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraZoneLabels {
    /// Node name.
    pub node: String,
    /// NUMA node id, or `none` for devices no source places on a NUMA node.
    pub numa_node: String,
    /// The DRA driver.
    pub driver: String,
}

/// Labels of the init-held source gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldSourceLabels {
    /// `cpu`, `devices` or `memory`.
    pub resource: String,
    /// `checkpoint`, `pod-spec` or `none`.
    pub source: String,
}

/// Labels of checkpoint errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckpointLabels {
    /// The checkpoint file.
    pub file: String,
    /// `read`, `parse`, `layout` or `checksum`.
    pub reason: String,
}

/// Labels of the kubelet configuration source gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `configz`, `file`, `flags` or `none`.
    pub source: String,
}

/// Labels of kubelet configuration read errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeletConfigErrorLabels {
    /// `configz` or `file`.
    pub source: String,
    /// `forbidden`, `not_found`, `unavailable`, `http`, `tls`, `unreachable`, `timeout`,
    /// `client`, `read`, `parse` or `invalid`.
    pub reason: String,
}

/// Every metric the agent exports, with the registry that serves them.
pub type Metrics = numaplane::metrics::Registered<Families>;

/// The agent's metric families.
#[derive(Debug)]
pub struct Families {
    /// Per-zone capacity.
    pub zone_capacity: Family<ZoneLabels, GaugeF>,
    /// Per-zone allocatable.
    pub zone_allocatable: Family<ZoneLabels, GaugeF>,
    /// Per-zone available.
    pub zone_available: Family<ZoneLabels, GaugeF>,
    /// Zone distances.
    pub zone_cost: Family<CostLabels, Gauge>,
    /// Duration of successful and failed scans.
    pub scan_duration: Histogram,
    /// Scans by trigger and result.
    pub scans: Family<ScanLabels, Counter>,
    /// `GetAllocatableResources` read again because devices may have changed, by cause.
    pub allocatable_rereads: Family<RereadLabels, Counter>,
    /// Waits for expected devices to appear in allocatable, by resource and outcome.
    pub allocatable_waits: Family<WaitLabels, Counter>,
    /// Pod-resources calls by method and code.
    pub podresources_requests: Family<CallLabels, Counter>,
    /// Kubelet outages (socket gone or unanswering), each followed by reconnection attempts.
    pub kubelet_reconnects: Counter,
    /// 1 while the kubelet offers the Watch fast path.
    pub kubelet_watch_active: Gauge,
    /// NRT writes by result.
    pub nrt_writes: Family<WriteLabels, Counter>,
    /// NRT writes skipped because nothing changed.
    pub nrt_write_skips: Counter,
    /// Unix time of the last successful scan.
    pub last_successful_scan: GaugeF,
    /// Unix time of the last successful NRT write (or verified skip).
    pub last_successful_publish: GaugeF,
    /// 1 while the published object may be stale (last scan or publish failed).
    pub stale: Gauge,
    /// Accounting anomalies by kind: new occurrences (one not in the previous scan), so a
    /// condition that persists counts once, not once per scan.
    pub anomalies: Family<KindLabels, Counter>,
    /// Anomalies in the last scan, by kind.
    pub anomalies_current: Family<KindLabels, Gauge>,
    /// The previous scan's anomalies (kind, detail), to tell new occurrences apart.
    last_anomalies: std::sync::Mutex<std::collections::BTreeSet<(AnomalyKind, String)>>,
    /// Accounted pods holding exclusive resources.
    pub pods_with_exclusive: Gauge,
    /// Accounted pods.
    pub pods_accounted: Gauge,
    /// DRA devices held by accounted pods, per driver (not in any zone).
    pub dra_devices: Family<DriverLabels, Gauge>,
    /// DRA devices held by claims of the node's pods, per NUMA node and driver.
    pub dra_devices_allocated: Family<DraZoneLabels, Gauge>,
    /// DRA devices of the node's ResourceSlices no claim holds, per NUMA node and driver.
    pub dra_devices_free: Family<DraZoneLabels, Gauge>,
    /// 1 for the source of what init containers hold beyond List, per kind of resource.
    pub init_held_source: Family<HeldSourceLabels, Gauge>,
    /// Scans that found a kubelet checkpoint unusable, by file and reason.
    pub checkpoint_errors: Family<CheckpointLabels, Counter>,
    /// Errors outside scans (API, CRD, configuration reload), by kind.
    pub errors: Family<KindLabels, Counter>,
    /// 1 for where the kubelet configuration in use came from.
    pub kubelet_config_source: Family<SourceLabels, Gauge>,
    /// Failed reads of a kubelet configuration source, by source and reason.
    pub kubelet_config_errors: Family<KubeletConfigErrorLabels, Counter>,
    /// 1 while the API server serves the NodeResourceTopology API, 0 while discovery says the
    /// CRD is not installed.
    pub nrt_crd_installed: Gauge,
    /// Constant 1 with the agent's configuration as labels.
    pub info: Family<InfoLabels, Gauge>,
    /// The node-side allocator's (zero while no pool is configured).
    pub allocator: allocator::AllocatorMetrics,
}

impl numaplane::metrics::Families for Families {
    const PREFIX: &'static str = "numaplane_exporter";

    fn register(r: &mut Registrar<'_>) -> Self {
        let allocator = allocator::AllocatorMetrics::register(&mut r.sub("allocator"));
        let m = Self {
            allocator,
            zone_capacity: r.family("zone_resource_capacity", "Capacity of a resource in a NUMA zone (cores, bytes or devices)"),
            zone_allocatable: r.family("zone_resource_allocatable", "Allocatable amount of a resource in a NUMA zone"),
            zone_available: r.family("zone_resource_available", "Amount of a resource in a NUMA zone not held exclusively by pods"),
            zone_cost: r.family("zone_cost", "NUMA distance from a zone to another zone (SLIT)"),
            scan_duration: r.with_unit("scan_duration", "Duration of one scan: kubelet calls, accounting and object build", Unit::Seconds, Histogram::new(exponential_buckets(0.000_1, 2.0, 16))),
            scans: r.family("scans", "Scans by trigger and result"),
            allocatable_rereads: r.family("allocatable_rereads", "GetAllocatableResources read again because a device list may have reached the kubelet, by cause"),
            allocatable_waits: r.family("allocatable_waits", "Waits for expected devices to appear in GetAllocatableResources, by resource and outcome"),
            podresources_requests: r.family("podresources_requests", "Calls to the kubelet pod-resources API by method and gRPC code"),
            kubelet_reconnects: r.family("kubelet_reconnects", "Reconnections to the kubelet pod-resources socket"),
            kubelet_watch_active: r.family("kubelet_watch_active", "1 while the kubelet Watch stream is open"),
            nrt_writes: r.family("nrt_writes", "NodeResourceTopology writes by result"),
            nrt_write_skips: r.family("nrt_write_skips", "NodeResourceTopology writes skipped because nothing changed"),
            last_successful_scan: r.with_unit("last_successful_scan_timestamp", "Unix time of the last successful scan", Unit::Seconds, GaugeF::default()),
            last_successful_publish: r.with_unit("last_successful_publish_timestamp", "Unix time the API server last held the current object", Unit::Seconds, GaugeF::default()),
            stale: r.family("stale", "1 while the published object may be stale because the last scan or write failed"),
            anomalies: r.family("accounting_anomalies", "New occurrences of suspicious kubelet data worked around by the accounting (one that persists across scans counts once), by kind"),
            anomalies_current: r.family("accounting_anomalies_current", "Suspicious kubelet data worked around in the last scan, by kind"),
            pods_with_exclusive: r.family("pods_with_exclusive_resources", "Accounted pods holding exclusive CPUs, NUMA-pinned memory or NUMA-affine devices"),
            pods_accounted: r.family("pods_accounted", "Pods left after the namespace, exclusion and terminal-pod filters"),
            dra_devices: r.family("dra_devices", "DRA devices held by accounted pods, per driver (per NUMA node: dra_devices_allocated)"),
            dra_devices_allocated: r.family("dra_devices_allocated", "DRA devices held by claims of the node's pods, per NUMA node (none: no source places the device) and driver"),
            dra_devices_free: r.family("dra_devices_free", "DRA devices of the node's ResourceSlices that no claim of its pods holds, per NUMA node (none: no source places the device) and driver"),
            init_held_source: r.family("init_held_source", "1 for where the resources init containers still hold were read from (kubelet checkpoint, pod spec, or none), per kind"),
            checkpoint_errors: r.family("kubelet_checkpoint_errors", "Scans that found a kubelet checkpoint unusable (unreadable, not JSON, unknown layout, checksum mismatch)"),
            errors: r.family("errors", "Errors outside scans by kind"),
            kubelet_config_source: r.family("kubelet_config_source", "1 for where the kubelet configuration in use was read: configz, file, flags (no source configured) or none (no source answered; its attributes are left out)"),
            kubelet_config_errors: r.family("kubelet_config_errors", "Failed reads of a kubelet configuration source, by source and reason"),
            nrt_crd_installed: r.family("nrt_crd_installed", "1 while the API server serves the NodeResourceTopology API, 0 while the CRD (noderesourcetopologies.topology.node.k8s.io) is not installed"),
            info: r.family("info", "Agent configuration"),
            last_anomalies: std::sync::Mutex::default(),
        };
        for kind in AnomalyKind::ALL {
            // Zero series up front, so rate() works from the first anomaly on.
            let labels = KindLabels {
                kind: kind.as_str().to_owned(),
            };
            let _ = m.anomalies.get_or_create(&labels);
            let _ = m.anomalies_current.get_or_create(&labels);
        }
        m
    }
}

impl Families {
    /// Records where init containers' leftovers came from this scan (`None`: not matched).
    pub fn record_held_sources(&self, sources: Option<crate::init_held::Sources>) {
        use crate::init_held::Source;
        let sources = sources.unwrap_or_default();
        for (resource, source) in [
            ("cpu", sources.cpu),
            ("devices", sources.devices),
            ("memory", sources.memory),
        ] {
            for candidate in [Source::Checkpoint, Source::PodSpec, Source::Unknown] {
                self.init_held_source
                    .get_or_create(&HeldSourceLabels {
                        resource: resource.to_owned(),
                        source: candidate.as_str().to_owned(),
                    })
                    .set(i64::from(candidate == source));
            }
        }
    }

    /// Counts one unusable checkpoint.
    pub fn checkpoint_error(&self, e: &crate::checkpoint::CheckpointError) {
        self.checkpoint_errors
            .get_or_create(&CheckpointLabels {
                file: e.file().to_owned(),
                reason: e.kind().to_owned(),
            })
            .inc();
    }

    /// Sets the kubelet configuration source gauge: 1 for `source`, 0 for the other `all`.
    pub fn set_kubelet_config_source<'a>(&self, source: &str, all: impl IntoIterator<Item = &'a str>) {
        for candidate in all {
            self.kubelet_config_source
                .get_or_create(&SourceLabels {
                    source: candidate.to_owned(),
                })
                .set(i64::from(candidate == source));
        }
    }

    /// Counts one failed read of a kubelet configuration source.
    pub fn kubelet_config_error(&self, source: &str, reason: &str) {
        self.kubelet_config_errors
            .get_or_create(&KubeletConfigErrorLabels {
                source: source.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one error of a bounded kind.
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counts one scan.
    pub fn scan(&self, trigger: &str, result: &str) {
        self.scans
            .get_or_create(&ScanLabels {
                trigger: trigger.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts one re-read of allocatable.
    pub fn allocatable_reread(&self, cause: &str) {
        self.allocatable_rereads
            .get_or_create(&RereadLabels {
                cause: cause.to_owned(),
            })
            .inc();
    }

    /// Counts one ended wait for devices in allocatable.
    pub fn allocatable_wait(&self, resource: &str, outcome: &str) {
        self.allocatable_waits
            .get_or_create(&WaitLabels {
                resource: resource.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts one pod-resources call.
    pub fn call(&self, method: PodResourcesMethod, code: tonic::Code) {
        self.podresources_requests
            .get_or_create(&CallLabels {
                method,
                code: grpc_code_name(code).to_owned(),
            })
            .inc();
    }

    /// Sets the configuration info series.
    pub fn set_info(&self, node: &str, policy: &str, scope: &str) {
        self.info.clear();
        self.info
            .get_or_create(&InfoLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                node: node.to_owned(),
                topology_manager_policy: policy.to_owned(),
                topology_manager_scope: scope.to_owned(),
            })
            .set(1);
    }

    /// Records a successful scan: zone gauges (replacing the previous set so vanished zones or
    /// resources disappear), anomalies and pod counts.
    pub fn record_accounting(&self, node: &str, acc: &Accounting) {
        for family in [&self.zone_capacity, &self.zone_allocatable, &self.zone_available] {
            family.clear();
        }
        self.zone_cost.clear();
        for zone in &acc.zones {
            let numa_node = numaplane::nrt::parse_zone_name(&zone.name)
                .map(|id| id.to_string())
                .unwrap_or_default();
            for res in zone.resources.iter().flatten() {
                let labels = ZoneLabels {
                    node: node.to_owned(),
                    zone: zone.name.clone(),
                    numa_node: numa_node.clone(),
                    resource: res.name.clone(),
                };
                for (family, value) in [
                    (&self.zone_capacity, &res.capacity),
                    (&self.zone_allocatable, &res.allocatable),
                    (&self.zone_available, &res.available),
                ] {
                    if let Some(v) = quantity_value(value) {
                        family.get_or_create(&labels).set(v);
                    }
                }
            }
            for cost in zone.costs.iter().flatten() {
                self.zone_cost
                    .get_or_create(&CostLabels {
                        node: node.to_owned(),
                        numa_node: numa_node.clone(),
                        to_zone: cost.name.clone(),
                    })
                    .set(cost.value);
            }
        }
        let now: std::collections::BTreeSet<(AnomalyKind, String)> =
            acc.anomalies.iter().map(|a| (a.kind, a.detail.clone())).collect();
        {
            let mut last = self
                .last_anomalies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (kind, _) in now.difference(&last) {
                self.anomalies
                    .get_or_create(&KindLabels {
                        kind: kind.as_str().to_owned(),
                    })
                    .inc();
            }
            *last = now;
        }
        let counts = acc.anomaly_counts();
        for kind in AnomalyKind::ALL {
            self.anomalies_current
                .get_or_create(&KindLabels {
                    kind: kind.as_str().to_owned(),
                })
                .set(i64::try_from(counts.get(&kind).copied().unwrap_or(0)).unwrap_or(i64::MAX));
        }
        self.dra_devices.clear();
        for (driver, n) in &acc.dra_devices {
            self.dra_devices
                .get_or_create(&DriverLabels {
                    driver: driver.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.record_dra_zones(node, acc.dra_zones.as_ref());
        self.pods_accounted
            .set(i64::try_from(acc.pods_accounted).unwrap_or(i64::MAX));
        self.pods_with_exclusive
            .set(i64::try_from(acc.pods_with_exclusive).unwrap_or(i64::MAX));
        self.last_successful_scan.set(unix_now());
    }
}

impl Families {
    /// The per-zone DRA gauges: exactly the (NUMA node, driver) pairs of the last scan; none
    /// while the node's ResourceSlices are not known.
    fn record_dra_zones(&self, node: &str, zones: Option<&crate::accounting::DraZones>) {
        self.dra_devices_allocated.clear();
        self.dra_devices_free.clear();
        let Some(zones) = zones else { return };
        let places = zones
            .by_numa
            .iter()
            .map(|(id, counts)| (id.to_string(), counts))
            .chain(std::iter::once(("none".to_owned(), &zones.without_numa)));
        for (numa_node, counts) in places {
            for (driver, c) in counts {
                let labels = DraZoneLabels {
                    node: node.to_owned(),
                    numa_node: numa_node.clone(),
                    driver: driver.clone(),
                };
                let held = c.total.saturating_sub(c.free);
                self.dra_devices_allocated
                    .get_or_create(&labels)
                    .set(i64::try_from(held).unwrap_or(i64::MAX));
                self.dra_devices_free
                    .get_or_create(&labels)
                    .set(i64::try_from(c.free).unwrap_or(i64::MAX));
            }
        }
    }
}

/// A quantity as a float for a gauge (cores, bytes, devices).
fn quantity_value(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<f64> {
    let q = Quantity::try_from(q).ok()?;
    Some(q.millis_ceil() as f64 / 1000.0)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The canonical upper-case gRPC code name, as grpc-go prints it.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::Anomaly;

    fn scan(details: &[&str]) -> Accounting {
        Accounting {
            zones: vec![],
            attributes: vec![],
            topology_policy: String::new(),
            annotations: std::collections::BTreeMap::new(),
            anomalies: details
                .iter()
                .map(|d| Anomaly {
                    kind: AnomalyKind::DuplicateCpu,
                    detail: (*d).to_owned(),
                })
                .collect(),
            pods_accounted: 0,
            pods_with_exclusive: 0,
            fingerprint: None,
            dra_devices: std::collections::BTreeMap::new(),
            dra_zones: None,
        }
    }

    #[test]
    fn dra_gauges_show_the_last_scan_per_numa_node_and_driver() {
        use numaplane::nrt::DraDeviceCount;
        let m = Metrics::new();
        let mut acc = scan(&[]);
        acc.dra_zones = Some(crate::accounting::DraZones {
            by_numa: [(
                0,
                [("gpu.example.com".to_owned(), DraDeviceCount { free: 1, total: 2 })].into(),
            )]
            .into(),
            without_numa: [("gpu.example.com".to_owned(), DraDeviceCount { free: 2, total: 4 })].into(),
        });
        m.record_accounting("n1", &acc);
        let gauge = |family: &Family<DraZoneLabels, Gauge>, numa: &str| {
            family
                .get_or_create(&DraZoneLabels {
                    node: "n1".into(),
                    numa_node: numa.into(),
                    driver: "gpu.example.com".into(),
                })
                .get()
        };
        assert_eq!(gauge(&m.dra_devices_allocated, "0"), 1);
        assert_eq!(gauge(&m.dra_devices_free, "0"), 1);
        assert_eq!(gauge(&m.dra_devices_allocated, "none"), 2);
        assert_eq!(gauge(&m.dra_devices_free, "none"), 2);
        // Slices unknown: no per-zone series at all rather than stale ones.
        m.record_accounting("n1", &scan(&[]));
        let text = m.encode().unwrap();
        assert!(!text.contains("dra_devices_free{"), "{text}");
    }

    #[test]
    fn a_persisting_anomaly_counts_once_and_the_gauge_shows_the_last_scan() {
        let m = Metrics::new();
        let labels = KindLabels {
            kind: AnomalyKind::DuplicateCpu.as_str().to_owned(),
        };
        let counted = || m.anomalies.get_or_create(&labels).get();
        let current = || m.anomalies_current.get_or_create(&labels).get();
        for _ in 0..5 {
            m.record_accounting("n", &scan(&["cpu 3 twice"]));
        }
        assert_eq!((counted(), current()), (1, 1));
        m.record_accounting("n", &scan(&["cpu 3 twice", "cpu 4 twice"]));
        assert_eq!((counted(), current()), (2, 2));
        m.record_accounting("n", &scan(&[]));
        assert_eq!((counted(), current()), (2, 0));
        // It comes back: a new occurrence.
        m.record_accounting("n", &scan(&["cpu 3 twice"]));
        assert_eq!((counted(), current()), (3, 1));
    }
}
