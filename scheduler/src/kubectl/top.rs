//! `kubectl numa top`: per node and NUMA zone, what the NodeResourceTopologies say is
//! allocatable and available, with the Topology Manager configuration and each object's age.
//! Pure: built from the listed objects and a clock reading.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use numaplane::{
    nrt::{self, NodeResourceTopology},
    quantity::Quantity,
};
use serde::Serialize;

use super::fetch::ListedNrts;
use crate::{
    node::{NumaTopology, TmConfig},
    resources::Resources,
};

/// Schema of the JSON output.
pub const SCHEMA: &str = "numaplane.io/kubectl-numa/top/v1";

/// Width of a usage bar in characters.
const BAR_WIDTH: usize = 20;

/// The whole `top` output.
#[derive(Debug, Serialize)]
pub struct TopReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// Nodes with a usable NRT, by name.
    pub nodes: Vec<NodeTop>,
    /// One line per problem (malformed NRT, nothing to show); also printed on stderr.
    pub problems: Vec<String>,
}

/// One node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTop {
    /// Node (and NRT) name.
    pub node: String,
    /// Topology Manager policy as the scheduler reads it; `None` when not published.
    pub policy: Option<String>,
    /// Topology Manager scope as the scheduler reads it; `None` when not published.
    pub scope: Option<String>,
    /// When the object last changed (RFC 3339), see [`Freshness`].
    pub updated: Option<String>,
    /// Seconds between that change and now.
    pub age_seconds: Option<i64>,
    /// The field manager of that change (e.g. `numaplane-exporter`).
    pub updated_by: Option<String>,
    /// NUMA zones by id.
    pub zones: Vec<ZoneTop>,
    /// DRA devices without a NUMA node, per driver (numaplane-exporter's
    /// `numaplane.io/dra-devices-without-numa`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra_without_numa: Vec<DraTop>,
}

/// One NUMA zone.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneTop {
    /// Zone name, `node-<id>`.
    pub zone: String,
    /// NUMA node id.
    pub numa_node: u32,
    /// Resources, as the NRT lists them.
    pub resources: Vec<ResourceTop>,
    /// DRA devices on this NUMA node, per driver (numaplane-exporter's
    /// `numaplane.io/dra-devices`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra: Vec<DraTop>,
}

/// The DRA devices of one driver in one place.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DraTop {
    /// Driver name.
    pub driver: String,
    /// Devices no claim holds.
    pub free: u64,
    /// All devices.
    pub total: u64,
    /// Held devices as a whole percentage of `total` (0 when there are none).
    pub used_percent: u32,
}

/// The rows of a DRA counts attribute that `resource` selects (a driver name; all when
/// `None`).
fn dra_rows(value: Option<&str>, resource: Option<&str>) -> Result<Vec<DraTop>, nrt::DraDevicesError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    Ok(nrt::split_dra_devices(value)?
        .into_iter()
        .filter(|(driver, _)| resource.is_none_or(|want| driver == want))
        .map(|(driver, c)| DraTop {
            driver,
            free: c.free,
            total: c.total,
            used_percent: if c.total == 0 {
                0
            } else {
                // free <= total (checked by the decoder), and u128 cannot overflow.
                u32::try_from(u128::from(c.total - c.free) * 100 / u128::from(c.total)).unwrap_or(100)
            },
        })
        .collect())
}

/// One resource of a zone.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceTop {
    /// Resource name.
    pub name: String,
    /// Allocatable, as a quantity.
    pub allocatable: String,
    /// Available, as a quantity.
    pub available: String,
    /// Allocatable minus available, never negative.
    pub used: String,
    /// `used` as a whole percentage of `allocatable` (0 when nothing is allocatable).
    pub used_percent: u32,
}

/// When an NRT last changed and who changed it: the newest `managedFields` entry (the
/// exporter's server-side apply records its time there), else the creation time. A no-op
/// write changes nothing, so a node whose usage is stable shows an old time while its
/// exporter is healthy; the exporter's `last_successful_publish` metric is its heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Freshness {
    /// Time of the last change.
    pub updated: Option<Timestamp>,
    /// Its field manager.
    pub by: Option<String>,
}

impl Freshness {
    /// Reads it from the object's metadata.
    pub fn of(nrt: &NodeResourceTopology) -> Self {
        let newest = nrt
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.time.as_ref().map(|t| (t.0, m.manager.clone())))
            .max_by_key(|(t, _)| *t);
        match newest {
            Some((t, by)) => Freshness { updated: Some(t), by },
            None => Freshness {
                updated: nrt.metadata.creation_timestamp.as_ref().map(|t| t.0),
                by: None,
            },
        }
    }

    /// Whole seconds from the change to `now` (0 for a clock behind the server's).
    pub fn age_seconds(&self, now: Timestamp) -> Option<i64> {
        self.updated
            .map(|t| now.as_second().saturating_sub(t.as_second()).max(0))
    }

    /// `12s ago (numaplane-exporter)`, or `unknown`.
    pub fn describe(&self, now: Timestamp) -> String {
        match self.age_seconds(now) {
            Some(age) => {
                let by = self.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
                format!("{} ago{by}", human_age(age))
            }
            None => "unknown".to_owned(),
        }
    }
}

/// An age as kubectl prints one: `45s`, `12m`, `5h`, `3d`.
pub fn human_age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Validates `t` with the scheduler's own NRT model: an object it would mark "topology unknown
/// or invalid" is reported here as malformed.
pub fn check_nrt(t: &NodeResourceTopology) -> Result<(), String> {
    NumaTopology::from_nrt(&mut Resources::default(), t)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "NodeResourceTopology {} is malformed: {}",
                t.metadata.name.as_deref().unwrap_or("<unnamed>"),
                numaplane::error_chain(&e)
            )
        })
}

/// One resource row from its quantities; `None` when one does not parse (reported by
/// [`check_nrt`] already, since the scheduler parses the same fields).
fn resource_row(r: &nrt::ResourceInfo) -> Option<ResourceTop> {
    let allocatable = Quantity::parse(&r.allocatable.0).ok()?;
    let available = Quantity::parse(&r.available.0).ok()?;
    let used = allocatable.saturating_sub_floor_zero(available);
    let alloc_m = allocatable.millis_ceil();
    let percent = if alloc_m <= 0 {
        0
    } else {
        let used_m = used.millis_ceil().clamp(0, alloc_m);
        // i128: the product of two i64 values cannot overflow it.
        u32::try_from(i128::from(used_m) * 100 / i128::from(alloc_m)).unwrap_or(100)
    };
    Some(ResourceTop {
        name: r.name.clone(),
        allocatable: allocatable.to_string(),
        available: available.to_string(),
        used: used.to_string(),
        used_percent: percent,
    })
}

/// The NUMA zones of `t`, by id, with the resources and DRA drivers `resource` selects (all
/// when `None`). A malformed DRA counts attribute is left out and named in `problems`.
pub fn zones(t: &NodeResourceTopology, resource: Option<&str>, problems: &mut Vec<String>) -> Vec<ZoneTop> {
    let node = t.metadata.name.as_deref().unwrap_or("<unnamed>");
    let mut zones: Vec<ZoneTop> = t
        .zones
        .iter()
        .filter(|z| z.zone_type == nrt::ZONE_TYPE_NODE)
        .filter_map(|z| {
            let id = nrt::parse_zone_name(&z.name)?;
            let resources = z
                .resources
                .iter()
                .flatten()
                .filter(|r| resource.is_none_or(|want| r.name == want))
                .filter_map(resource_row)
                .collect();
            let dra = dra_rows(z.attribute(nrt::attr::DRA_DEVICES), resource).unwrap_or_else(|e| {
                problems.push(format!("NodeResourceTopology {node} zone {}: {e}", z.name));
                Vec::new()
            });
            Some(ZoneTop {
                zone: z.name.clone(),
                numa_node: id,
                resources,
                dra,
            })
        })
        .collect();
    zones.sort_by_key(|z| z.numa_node);
    zones
}

/// Builds the report from the listed NRTs.
pub fn build(listed: &ListedNrts, node: Option<&str>, resource: Option<&str>, now: Timestamp) -> TopReport {
    let wanted = |name: Option<&str>| node.is_none_or(|n| name == Some(n));
    let mut problems: Vec<String> = listed
        .undecodable
        .iter()
        .filter(|p| node.is_none_or(|n| p.starts_with(&format!("NodeResourceTopology {n} "))))
        .cloned()
        .collect();
    let mut nodes = Vec::new();
    let mut seen = false;
    for t in listed.nrts.iter().filter(|t| wanted(t.metadata.name.as_deref())) {
        seen = true;
        if let Err(p) = check_nrt(t) {
            problems.push(p);
            continue;
        }
        let tm = TmConfig::from_nrt(t);
        let fresh = Freshness::of(t);
        nodes.push(NodeTop {
            node: t.metadata.name.clone().unwrap_or_default(),
            policy: tm.policy.map(|p| p.to_string()),
            scope: tm.scope.map(|s| s.to_string()),
            updated: fresh.updated.map(|t| t.to_string()),
            age_seconds: fresh.age_seconds(now),
            updated_by: fresh.by.clone(),
            zones: zones(t, resource, &mut problems),
            dra_without_numa: dra_rows(t.attribute(nrt::attr::DRA_DEVICES_WITHOUT_NUMA), resource)
                .unwrap_or_else(|e| {
                    problems.push(format!(
                        "NodeResourceTopology {}: {e}",
                        t.metadata.name.as_deref().unwrap_or("<unnamed>")
                    ));
                    Vec::new()
                }),
        });
    }
    if !seen && problems.is_empty() {
        problems.push(match node {
            Some(n) => format!(
                "no NodeResourceTopology for node {n}: is an exporter (numaplane-exporter) running there?"
            ),
            None => "no NodeResourceTopology objects in the cluster: the CRD is installed, but no exporter publishes (is the numaplane-exporter DaemonSet running?)".to_owned(),
        });
    }
    if let Some(r) = resource
        && !nodes.is_empty()
        && nodes.iter().all(|n| {
            n.dra_without_numa.is_empty()
                && n.zones.iter().all(|z| z.resources.is_empty() && z.dra.is_empty())
        })
    {
        problems.push(format!("no NUMA zone lists resource {r}"));
    }
    TopReport {
        schema: SCHEMA,
        nodes,
        problems,
    }
}

/// `[########            ]`, `used_percent` of [`BAR_WIDTH`].
pub fn bar(used_percent: u32) -> String {
    let filled = usize::try_from(used_percent.min(100)).unwrap_or(100) * BAR_WIDTH / 100;
    format!("[{}{}]", "#".repeat(filled), " ".repeat(BAR_WIDTH - filled))
}

/// The report for a person: per node a header line, then one row per zone and resource.
pub fn render_table(report: &TopReport) -> String {
    let mut out = String::new();
    for n in &report.nodes {
        let fresh = match (n.age_seconds, &n.updated_by) {
            (Some(age), Some(by)) => format!("{} ago by {by}", human_age(age)),
            (Some(age), None) => format!("{} ago", human_age(age)),
            (None, _) => "unknown".to_owned(),
        };
        let _ = writeln!(
            out,
            "NODE {}  policy={} scope={} updated={}",
            n.node,
            n.policy.as_deref().unwrap_or("unset"),
            n.scope.as_deref().unwrap_or("unset"),
            fresh
        );
        // DRA devices are rows too: `<driver> (DRA)`, free as available, all as allocatable;
        // those without NUMA node under zone `none`.
        let dra_row = |d: &DraTop| ResourceTop {
            name: format!("{} (DRA)", d.driver),
            allocatable: d.total.to_string(),
            available: d.free.to_string(),
            used: (d.total - d.free.min(d.total)).to_string(),
            used_percent: d.used_percent,
        };
        let mut rows: Vec<(String, ResourceTop)> = Vec::new();
        for z in &n.zones {
            for r in &z.resources {
                rows.push((z.zone.clone(), r.clone()));
            }
            for d in &z.dra {
                rows.push((z.zone.clone(), dra_row(d)));
            }
        }
        for d in &n.dra_without_numa {
            rows.push(("none".to_owned(), dra_row(d)));
        }
        let zw = rows.iter().map(|(z, _)| z.len()).max().unwrap_or(0).max(4);
        let rw = rows.iter().map(|(_, r)| r.name.len()).max().unwrap_or(0).max(8);
        let aw = rows
            .iter()
            .map(|(_, r)| r.available.len())
            .max()
            .unwrap_or(0)
            .max(9);
        let lw = rows
            .iter()
            .map(|(_, r)| r.allocatable.len())
            .max()
            .unwrap_or(0)
            .max(11);
        let _ = writeln!(
            out,
            "  {:<zw$}  {:<rw$}  {:>aw$}  {:>lw$}  USED",
            "ZONE", "RESOURCE", "AVAILABLE", "ALLOCATABLE"
        );
        for (z, r) in rows {
            let _ = writeln!(
                out,
                "  {:<zw$}  {:<rw$}  {:>aw$}  {:>lw$}  {} {:>3}%",
                z,
                r.name,
                r.available,
                r.allocatable,
                bar(r.used_percent),
                r.used_percent
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nrt(v: serde_json::Value) -> NodeResourceTopology {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_100).unwrap_or_else(|e| panic!("{e}"))
    }

    fn sample(name: &str) -> NodeResourceTopology {
        nrt(json!({
            "metadata": {"name": name, "managedFields": [
                {"manager": "someone", "operation": "Update", "time": "2027-01-15T08:00:00Z"},
                {"manager": "numaplane-exporter", "operation": "Apply", "time": "2027-01-15T08:01:00Z"}
            ]},
            "attributes": [
                {"name": "topologyManagerPolicy", "value": "single-numa-node"},
                {"name": "topologyManagerScope", "value": "pod"}
            ],
            "zones": [
                {"name": "node-1", "type": "Node", "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "2"}]},
                {"name": "node-0", "type": "Node", "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "6", "available": "6"},
                    {"name": "memory", "capacity": "16Gi", "allocatable": "16Gi", "available": "4Gi"}]}
            ]
        }))
    }

    #[test]
    fn usage_policy_and_freshness() {
        let listed = ListedNrts {
            nrts: vec![sample("a")],
            undecodable: vec![],
        };
        let r = build(&listed, None, None, now());
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let n = &r.nodes[0];
        assert_eq!(n.policy.as_deref(), Some("single-numa-node"));
        assert_eq!(n.scope.as_deref(), Some("pod"));
        assert_eq!(n.updated_by.as_deref(), Some("numaplane-exporter"));
        assert_eq!(n.updated.as_deref(), Some("2027-01-15T08:01:00Z"));
        // 1_800_000_100 is 2027-01-15T08:01:40Z.
        assert_eq!(n.age_seconds, Some(40));
        let ids: Vec<u32> = n.zones.iter().map(|z| z.numa_node).collect();
        assert_eq!(ids, [0, 1]);
        let mem = &n.zones[0].resources[1];
        assert_eq!((mem.used.as_str(), mem.used_percent), ("12Gi", 75));
        assert_eq!(n.zones[1].resources[0].used_percent, 75);
        assert_eq!(n.zones[0].resources[0].used_percent, 0);
        let table = render_table(&r);
        assert!(
            table.contains("policy=single-numa-node scope=pod updated=40s ago by numaplane-exporter"),
            "{table}"
        );
        assert!(table.contains(&format!("{} {:>3}%", bar(75), 75)), "{table}");
    }

    #[test]
    fn filters_and_problems() {
        let mut bad = sample("b");
        bad.zones[0].name = "node-x".into();
        let listed = ListedNrts {
            nrts: vec![sample("a"), bad],
            undecodable: vec!["NodeResourceTopology c is malformed: invalid type".into()],
        };
        let r = build(&listed, None, Some("memory"), now());
        assert_eq!(r.nodes.len(), 1);
        assert_eq!(r.nodes[0].zones[0].resources.len(), 1);
        assert!(r.nodes[0].zones[1].resources.is_empty());
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("NodeResourceTopology b is malformed") && p.contains("node-x"))
        );
        let only_a = build(&listed, Some("a"), None, now());
        assert!(only_a.problems.is_empty(), "{:?}", only_a.problems);
        let missing = build(&listed, Some("zz"), None, now());
        assert!(missing.problems[0].contains("no NodeResourceTopology for node zz"));
        let none = build(&ListedNrts::default(), None, None, now());
        assert!(none.problems[0].contains("no NodeResourceTopology objects"));
        let no_res = build(&listed, Some("a"), Some("example.com/gpu"), now());
        assert_eq!(no_res.problems, ["no NUMA zone lists resource example.com/gpu"]);
    }

    #[test]
    fn dra_devices_show_per_zone_and_without_numa_node() {
        let mut t = sample("a");
        t.zones[0].attributes = Some(vec![nrt::AttributeInfo {
            name: nrt::attr::DRA_DEVICES.into(),
            value: "gpu.example.com=1/4,nic.example.com=2/2".into(),
        }]);
        t.attributes
            .get_or_insert_with(Vec::new)
            .push(nrt::AttributeInfo {
                name: nrt::attr::DRA_DEVICES_WITHOUT_NUMA.into(),
                value: "gpu.example.com=0/1".into(),
            });
        let listed = ListedNrts {
            nrts: vec![t.clone()],
            undecodable: vec![],
        };
        let r = build(&listed, None, None, now());
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let n = &r.nodes[0];
        // node-1 is listed first in the object, second by id.
        let gpu = &n.zones[1].dra[0];
        assert_eq!(
            (gpu.driver.as_str(), gpu.free, gpu.total, gpu.used_percent),
            ("gpu.example.com", 1, 4, 75)
        );
        assert!(n.zones[0].dra.is_empty());
        assert_eq!(n.dra_without_numa[0].total, 1);
        let table = render_table(&r);
        assert!(table.contains("gpu.example.com (DRA)"), "{table}");
        let line = table
            .lines()
            .find(|l| l.contains("node-1") && l.contains("gpu.example.com"))
            .unwrap();
        assert!(line.contains(&format!("{} {:>3}%", bar(75), 75)), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with("none") && l.contains("gpu.example.com (DRA)")),
            "{table}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["nodes"][0]["zones"][1]["dra"][0]["free"], 1);
        assert_eq!(json["nodes"][0]["draWithoutNuma"][0]["driver"], "gpu.example.com");
        // --resource selects a driver too.
        let only = build(&listed, None, Some("nic.example.com"), now());
        assert!(only.problems.is_empty(), "{:?}", only.problems);
        assert_eq!(only.nodes[0].zones[1].dra.len(), 1);
        assert!(only.nodes[0].dra_without_numa.is_empty());
        // A malformed value is a problem, not a crash or a silent zero.
        t.zones[0].attributes.as_mut().unwrap()[0].value = "gpu.example.com=5/4".into();
        let bad = build(
            &ListedNrts {
                nrts: vec![t],
                undecodable: vec![],
            },
            None,
            None,
            now(),
        );
        assert!(
            bad.problems
                .iter()
                .any(|p| p.contains("zone node-1") && p.contains("5/4")),
            "{:?}",
            bad.problems
        );
        assert!(bad.nodes[0].zones[1].dra.is_empty());
    }

    #[test]
    fn ages_and_bars() {
        assert_eq!(human_age(59), "59s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(3 * 3600), "3h");
        assert_eq!(human_age(5 * 86400), "5d");
        assert_eq!(bar(0), format!("[{}]", " ".repeat(BAR_WIDTH)));
        assert_eq!(bar(250), format!("[{}]", "#".repeat(BAR_WIDTH)));
        assert_eq!(bar(50).matches('#').count(), BAR_WIDTH / 2);
    }
}
