//! The report as a table for people: one block per pod (its node, placement and devices, or
//! why it fits nowhere, with the per-node verdicts asked for), then the summary and warnings.

use std::fmt::Write as _;

use super::Report;

/// Renders the report for a person.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    for r in &report.results {
        let d = &r.decision;
        match &d.node {
            Some(node) => {
                let score = d
                    .nodes
                    .iter()
                    .find(|v| &v.node == node)
                    .and_then(|v| v.score)
                    .unwrap_or(0);
                let _ = writeln!(out, "POD {:<32} -> {node} (score {score})", d.pod);
            }
            None if r.gated => {
                let _ = writeln!(out, "POD {:<32} -> GATED", d.pod);
            }
            None => {
                let _ = writeln!(out, "POD {:<32} -> UNSCHEDULABLE", d.pod);
            }
        }
        let _ = writeln!(out, "    {}", d.message);
        if let Some(p) = &d.placement {
            for c in &p.containers {
                let numa = c.numa_nodes.as_ref().map_or("any".to_owned(), |n| {
                    n.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                });
                let devs = c
                    .devices
                    .iter()
                    .map(|(res, ids)| format!("{res}={}", ids.join(",")))
                    .chain(c.device_counts.iter().map(|(res, n)| format!("{res}x{n}")))
                    .collect::<Vec<_>>()
                    .join(" ");
                let devs = if devs.is_empty() {
                    String::new()
                } else {
                    format!("  devices {devs}")
                };
                let _ = writeln!(out, "    {:?} {:<20} NUMA {numa}{devs}", c.kind, c.name);
            }
        }
        for c in &r.claims {
            let Some(numa) = &c.numa else {
                let devices: Vec<String> = c
                    .allocation
                    .devices
                    .iter()
                    .flat_map(|d| d.results.iter().flatten())
                    .map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device))
                    .collect();
                let _ = writeln!(out, "    claim {:<20} devices {}", c.name, devices.join(","));
                continue;
            };
            // Each device's NUMA nodes next to the predicted ones of the containers using it.
            let ids = |n: &Option<Vec<u32>>| {
                n.as_ref().map_or("-".to_owned(), |n| {
                    n.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                })
            };
            let devices: Vec<String> = numa
                .devices
                .iter()
                .map(|d| format!("{} (NUMA {})", d.device, ids(&d.numa_nodes)))
                .collect();
            let containers: Vec<String> = numa
                .containers
                .iter()
                .map(|c| {
                    let pinned = c.pinned.map_or(String::new(), |p| format!(", pins {p}"));
                    format!("{} (NUMA {}{pinned})", c.name, ids(&c.numa_nodes))
                })
                .collect();
            let _ = writeln!(
                out,
                "    claim {:<20} devices {}  containers {}  {}",
                c.name,
                devices.join(", "),
                if containers.is_empty() {
                    "-".to_owned()
                } else {
                    containers.join(", ")
                },
                numa.alignment.label()
            );
        }
        if let Some(e) = &r.error {
            let _ = writeln!(out, "    error: {e}");
        }
        if let Some(e) = &r.claims_error {
            let _ = writeln!(out, "    claims error: {e}");
        }
        if let Some(p) = &r.preemption {
            let zones = p.numa_nodes.as_ref().map_or(String::new(), |z| {
                format!(
                    " (NUMA {})",
                    z.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                )
            });
            let _ = writeln!(
                out,
                "    preemption: would evict {} on {}{zones}",
                p.victims.join(", "),
                p.node
            );
        }
        for u in &r.unsupported {
            let _ = writeln!(out, "    not enforced: {} ({})", u.field, u.rule);
        }
        let width = d.nodes.iter().map(|v| v.node.len()).max().unwrap_or(4).max(4);
        for v in &d.nodes {
            let verdict = if v.feasible { "fits" } else { "rejected" };
            let score = v.score.map_or("-".to_owned(), |s| s.to_string());
            let reason = v.reasons.join("; ");
            let _ = writeln!(
                out,
                "      {:<width$}  {verdict:<8}  {score:>5}  {reason}",
                v.node
            );
            for a in &v.approximate {
                let _ = writeln!(out, "      {:<width$}  approximate: {a}", "");
            }
        }
        out.push('\n');
    }
    let s = &report.summary;
    let _ = writeln!(
        out,
        "{} pods: {} scheduled, {} unschedulable",
        s.pods, s.scheduled, s.unschedulable
    );
    for w in &report.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
