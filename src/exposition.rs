//! `/metrics` in the format the scraper asks for.
//!
//! prometheus-client encodes OpenMetrics only (checked: version 0.25 has no text 0.0.4
//! encoder, and no maintained crate renders its registry in that format), while `promtool
//! check metrics`, curl users and older scrapers read the classic Prometheus text format, and a
//! client that trusts the content type must get a body valid for it. The two formats differ
//! only in a few comment lines, so the classic one is derived here from the OpenMetrics body.

use std::collections::BTreeSet;

/// OpenMetrics 1.0 (what Prometheus asks for first).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type to answer a request with `accept`: OpenMetrics when the client lists it
/// (with a non-zero quality), the classic text format otherwise.
pub fn negotiate(accept: Option<&str>) -> &'static str {
    let wants_openmetrics = accept.into_iter().flat_map(|a| a.split(',')).any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
    });
    if wants_openmetrics {
        OPENMETRICS
    } else {
        PROMETHEUS_TEXT
    }
}

/// `body` (OpenMetrics, as prometheus-client encodes it) in the content type `content_type`
/// (one of this module's constants).
pub fn render(body: String, content_type: &str) -> String {
    if content_type == OPENMETRICS {
        body
    } else {
        to_prometheus_text(&body)
    }
}

/// The classic text rendering of an OpenMetrics body: counter families are named with their
/// `_total` suffix in `HELP` and `TYPE`, info families become gauges named `<name>_info`, and
/// the `UNIT` and `EOF` lines go. Samples are the same in both formats.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut counters = BTreeSet::new();
    let mut infos = BTreeSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            match rest.split_once(' ') {
                Some((name, "counter")) => {
                    counters.insert(name);
                }
                Some((name, "info")) => {
                    infos.insert(name);
                }
                _ => {}
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        if let Some((prefix, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let renamed = if counters.contains(name) && !name.ends_with("_total") {
                Some(format!("{name}_total"))
            } else if infos.contains(name) {
                Some(format!("{name}_info"))
            } else {
                None
            };
            if let Some(new) = renamed {
                let tail = if prefix == "# TYPE " && infos.contains(name) {
                    "gauge"
                } else {
                    tail
                };
                out.push_str(prefix);
                out.push_str(&new);
                out.push(' ');
                out.push_str(tail);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP app_scans Scans.\n# TYPE app_scans counter\napp_scans_total{result=\"ok\"} 3\n\
        # HELP app_duration_seconds Time.\n# TYPE app_duration_seconds histogram\n# UNIT app_duration_seconds seconds\n\
        app_duration_seconds_sum 1.5\napp_duration_seconds_count 2\napp_duration_seconds_bucket{le=\"+Inf\"} 2\n\
        # HELP app_build Build.\n# TYPE app_build info\napp_build_info{version=\"1\"} 1\n\
        # HELP app_up Up.\n# TYPE app_up gauge\napp_up 1\n# EOF\n";

    #[test]
    fn classic_text_names_counters_with_total_and_drops_openmetrics_only_lines() {
        let text = to_prometheus_text(OM);
        assert!(
            text.contains("# HELP app_scans_total Scans.\n# TYPE app_scans_total counter\n"),
            "{text}"
        );
        assert!(text.contains("app_scans_total{result=\"ok\"} 3\n"), "{text}");
        assert!(
            text.contains("# TYPE app_build_info gauge\napp_build_info{version=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP app_up Up.\n# TYPE app_up gauge\napp_up 1\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(
            text.contains("# TYPE app_duration_seconds histogram\napp_duration_seconds_sum"),
            "{text}"
        );
    }

    #[test]
    fn content_type_follows_the_accept_header() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), OPENMETRICS);
        assert_eq!(negotiate(None), PROMETHEUS_TEXT);
        assert_eq!(negotiate(Some("*/*")), PROMETHEUS_TEXT);
        assert_eq!(negotiate(Some("text/plain")), PROMETHEUS_TEXT);
        assert_eq!(
            negotiate(Some("application/openmetrics-text; q=0")),
            PROMETHEUS_TEXT
        );
        assert_eq!(render(OM.to_owned(), OPENMETRICS), OM);
        assert!(!render(OM.to_owned(), PROMETHEUS_TEXT).contains("# EOF"));
    }
}
