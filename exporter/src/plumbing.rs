//! Plumbing both subcommands (`run`, `device-plugin`) share, below them so that neither imports
//! the other: the API client, the shutdown signal and the machine's topology.

use std::path::PathBuf;

use kube::Client;
use numaplane_topology::Machine;

/// Why the API client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    /// The kubeconfig cannot be loaded.
    #[error("cannot load the API server configuration{}", .path.as_ref().map(|p| format!(" from {}", p.display())).unwrap_or_default())]
    KubeConfig {
        /// The kubeconfig, if given.
        path: Option<PathBuf>,
        /// Why.
        message: String,
    },
}

/// The API client and the configuration it was built from (whose credentials also reach the
/// kubelet's /configz).
pub(crate) async fn kube_client(path: Option<&PathBuf>) -> Result<(Client, kube::Config), PlumbingError> {
    let config_error = |message: String| PlumbingError::KubeConfig {
        path: path.cloned(),
        message,
    };
    let config = match path {
        Some(p) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| config_error(numaplane::error_chain(&e)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| config_error(numaplane::error_chain(&e)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| config_error(numaplane::error_chain(&e)))?,
    };
    let client = Client::try_from(config.clone()).map_err(|e| config_error(numaplane::error_chain(&e)))?;
    Ok((client, config))
}

/// Resolves on SIGTERM (kubelet stopping the pod) or SIGINT.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Loads the machine from `--topology-xml` or from the live system.
pub fn load_machine(
    topology_xml: Option<&std::path::Path>,
) -> Result<Machine, numaplane_topology::TopologyError> {
    match topology_xml {
        Some(path) => Machine::from_xml_file(path),
        None => Machine::from_system(),
    }
}
