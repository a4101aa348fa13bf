//! `run --once`: one scan, then print or publish.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use numaplane::nrt::NodeResourceTopology;

use crate::accounting::AccountingConfig;
use crate::backoff::Backoff;
use crate::kubelet_source::{Sources, Tracker};
use crate::metrics::Metrics;
use crate::output::{self, Format};
use crate::pod_watch;
use crate::publish::{self, Publisher};
use crate::run::args::{ObjectFormat, RunArgs};
use crate::run::config::apply_kubelet_settings;
use crate::run::error::RunError;
use crate::run::report::log_anomalies;
use crate::scan::{ScanError, Scanner};

/// `--once`: scan (waiting up to the call timeout for the socket), then print or publish.
pub(crate) async fn once(
    args: &RunArgs,
    mut cfg: AccountingConfig,
    mut scanner: Scanner,
    metrics: Arc<Metrics>,
    kube: Option<kube::Client>,
    sources: Sources,
) -> Result<(), RunError> {
    // One read, as the agent's first: a source that does not answer is logged and its
    // attributes are left out, never a failed run.
    let reading = sources.read().await;
    let mut tracker = Tracker::new(args.kubelet_config_interval);
    tracker.apply(reading, &metrics, &args.node_name);
    apply_kubelet_settings(&mut cfg, args, tracker.known());
    let mut facts = None;
    if let Some(client) = &kube {
        let (terminal, listed) = pod_watch::list_once(client.clone(), &args.node_name)
            .await
            .map_err(|source| RunError::ListPods {
                node: args.node_name.clone(),
                source,
            })?;
        cfg.terminal_pods = terminal;
        facts = Some(listed);
    }
    let deadline = Instant::now() + args.call_timeout;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let scan = loop {
        match scanner.scan(&cfg, facts.as_ref()).await {
            Ok(scan) => break scan,
            Err(ScanError::ReadKubelet(e))
                if matches!(
                    e.code(),
                    Some(tonic::Code::Unavailable | tonic::Code::ResourceExhausted)
                ) && Instant::now() < deadline =>
            {
                tracing::debug!(error = %e, "kubelet not ready; retrying");
                scanner.refresh_allocatable();
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(RunError::Scan(e)),
        }
    };
    let mut seen = BTreeSet::new();
    log_anomalies(&args.node_name, &scan, &mut seen);
    crate::run::report::note_init_held(&args.node_name, &scan, &metrics, &mut BTreeSet::new());
    match kube {
        Some(client) if !args.dry_run => {
            publish::crd_served(&client).await.map_err(RunError::Publish)?;
            let mut publisher = Publisher::new(client, &args.node_name, args.force_write_interval, metrics);
            publisher
                .publish(scan.nrt, true)
                .await
                .map_err(RunError::Publish)?;
            Ok(())
        }
        _ => {
            print!("{}", render(&scan.nrt, args.output)?);
            Ok(())
        }
    }
}

/// The object in the requested format.
pub(crate) fn render(nrt: &NodeResourceTopology, format: ObjectFormat) -> Result<String, RunError> {
    let f = match format {
        ObjectFormat::Json => Format::Json,
        ObjectFormat::Yaml => Format::Yaml,
    };
    output::render_structured(nrt, f).map_err(RunError::Render)
}
