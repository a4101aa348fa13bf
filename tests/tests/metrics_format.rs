//! `/metrics` of both components in the format the scraper asks for: OpenMetrics when the
//! `Accept` header lists it (as Prometheus does), the classic text format 0.0.4 otherwise, each
//! body valid for its content type. `promtool check metrics` (installed with Prometheus by
//! scripts/setup) must be clean on the classic output of a running exporter (with the device
//! plugin), a running scheduler and a running extender.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use numaplane::proto::podresources::AllocatableResourcesResponse;
use numaplane_e2e::harness::node::NodeFiles;
use numaplane_e2e::harness::{Agent, ApiTarget, http_get_accept, scheduler_run_args, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `NUMAPLANE_PROMTOOL_BIN`, else `promtool` on `PATH`; a missing promtool is a failure.
fn promtool() -> PathBuf {
    if let Some(bin) = std::env::var_os("NUMAPLANE_PROMTOOL_BIN") {
        return PathBuf::from(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test needs promtool, which is not on PATH: run scripts/setup (Debian's \
                 `prometheus` package has it), or set NUMAPLANE_PROMTOOL_BIN"
            )
        })
}

/// Fetches `/metrics` both ways and checks each body against its content type.
fn check(agent: &Agent, what: &str) {
    let (status, content_type, body) = http_get_accept(agent.addr(), "/metrics", None).unwrap();
    assert_eq!(status, 200, "{what}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8", "{what}");
    assert!(
        !body.contains("# EOF") && !body.contains("# UNIT"),
        "{what}:\n{body}"
    );
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "{what}: promtool check metrics:\n{report}"
    );

    let (status, content_type, body) =
        http_get_accept(agent.addr(), "/metrics", Some(PROMETHEUS_ACCEPT)).unwrap();
    assert_eq!(status, 200, "{what}");
    assert_eq!(
        content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "{what}"
    );
    assert!(body.ends_with("# EOF\n"), "{what}:\n{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_components_serve_the_format_asked_for_and_promtool_is_clean() {
    let api = ApiTarget::start().await.unwrap();
    let node = unique_name("np-e2e-metrics");
    api.create_node(&node).await.unwrap();
    let files = NodeFiles::new(
        &json!({"pools": [{"resource": "example.com/cam", "capacity": 2, "devices": [{"id": "cam", "numaNode": 0}]}]}),
    )
    .unwrap();
    let dp = files.device_kubelet().await.unwrap();
    let podres = files
        .podres(AllocatableResourcesResponse {
            cpu_ids: (0..32).collect(),
            ..Default::default()
        })
        .await
        .unwrap();
    let exporter = files
        .exporter(&node, api.kubeconfig(), &["--resync-interval", "200ms"], WAIT)
        .await
        .unwrap();
    dp.wait_registered("example.com/cam", 1, WAIT).await.unwrap();
    let mut scheduler = Agent::spawn_scheduler("run", &scheduler_run_args(api.kubeconfig())).unwrap();
    scheduler.wait_serving(WAIT).await.unwrap();
    let mut extender = Agent::spawn_scheduler("extender", &scheduler_run_args(api.kubeconfig())).unwrap();
    extender.wait_serving(WAIT).await.unwrap();
    // Let both publish their first figures (scans, resyncs, watch events).
    tokio::time::sleep(Duration::from_secs(2)).await;

    tokio::task::spawn_blocking(move || {
        check(&exporter, "exporter");
        check(&scheduler, "scheduler");
        check(&extender, "extender");
    })
    .await
    .unwrap();
    drop(podres);
    api.cleanup(&node, "default").await;
}
