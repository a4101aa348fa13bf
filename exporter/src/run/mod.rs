//! `numaplane-exporter run`: the agent loop, and its `--once`/`--dry-run` offline view.
//!
//! - [`args`]: the flags; [`config`]: the flags merged over the kubelet's configuration;
//! - [`supervise`]: starting the agent's tasks under supervision; [`main_loop`]: the loop;
//! - [`once`]: `--once`/`--dry-run`; [`report`]: logging what a scan met.

pub mod args;
pub mod config;
pub mod error;
mod main_loop;
mod once;
pub(crate) mod report;
mod supervise;

use std::sync::Arc;

use crate::accounting::MachineView;
use crate::kubelet_config::ResourceManagerSettings;
use crate::metrics::Metrics;
use crate::podresources::KubeletClient;
use crate::scan::Scanner;

pub use args::{FingerprintArg, ObjectFormat, RunArgs};
pub use config::{accounting_config, apply_kubelet_settings, effective_settings, kubelet_sources};
pub use error::RunError;

/// Runs `run`. Returns after `--once`, on SIGTERM/SIGINT, or on a configuration error.
pub async fn run(
    args: RunArgs,
    machine_view: MachineView,
    pools: Vec<crate::allocator::pools::Pool>,
) -> Result<(), RunError> {
    let mut cfg = accounting_config(&args, &ResourceManagerSettings::default());
    cfg.cluster_shared = pools
        .iter()
        .filter(|p| p.shared == crate::allocator::pools::Sharing::Cluster)
        .map(|p| p.resource.clone())
        .collect();
    let metrics = Arc::new(Metrics::new());
    let client = KubeletClient::new(&args.podresources_socket, args.call_timeout, metrics.clone())
        .map_err(RunError::Socket)?
        .with_budget(
            args.kubelet_requests_per_second,
            crate::podresources::DEFAULT_BURST,
        );
    let scanner = Scanner::new(client, machine_view, args.kubelet_state_dir.clone());
    // Without a kubeconfig (--kubeconfig, NUMAPLANE_KUBECONFIG or $KUBECONFIG) a dry run needs
    // no API server; kube's inference reads $KUBECONFIG when no path is given.
    let kube = if args.dry_run && args.kubeconfig.is_none() && std::env::var_os("KUBECONFIG").is_none() {
        None
    } else {
        Some(crate::plumbing::kube_client(args.kubeconfig.as_ref()).await?)
    };
    let sources = kubelet_sources(&args, kube.as_ref())?;
    if args.once {
        // A one-shot run keeps to one stderr line on failure; the sources are a detail here.
        tracing::debug!(node = %args.node_name, sources = %sources.describe(), "kubelet configuration sources");
        return once::once(&args, cfg, scanner, metrics, kube.map(|(c, _)| c), sources).await;
    }
    main_loop::Agent::start(args, cfg, scanner, metrics, pools, kube.map(|(c, _)| c), sources)
        .await?
        .run()
        .await
}
