//! The errors of `run`.

use crate::configz::ConfigzError;
use crate::output;
use crate::podresources::PodResourcesError;
use crate::publish::PublishError;
use crate::scan::ScanError;
use crate::triggers::NotifyFileError;
use numaplane::serve::ServeError;

/// Errors of `run`, split into bad configuration (exit 64) and runtime failures (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The machine cannot be read.
    #[error("cannot load the machine topology")]
    LoadMachine(#[source] numaplane_topology::TopologyError),
    /// `--node-address` does not form a URL.
    #[error("bad --node-address")]
    NodeAddress(#[source] ConfigzError),
    /// The kubeconfig cannot be loaded.
    #[error(transparent)]
    KubeConfig(#[from] crate::plumbing::PlumbingError),
    /// The socket path is unusable.
    #[error("bad --podresources-socket")]
    Socket(#[source] PodResourcesError),
    /// The metrics server cannot start.
    #[error("cannot start the metrics server")]
    Server(#[source] ServeError),
    /// The notify file cannot be used.
    #[error("bad --notify-file")]
    NotifyFile(#[source] NotifyFileError),
    /// A scan failed in `--once` mode.
    #[error("scan failed")]
    Scan(#[source] ScanError),
    /// Listing the node's pods failed in `--once` mode.
    #[error("cannot list the pods of node {node}")]
    ListPods {
        /// Node name.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Publishing failed in `--once` mode.
    #[error("publish failed")]
    Publish(#[source] PublishError),
    /// Printing failed.
    #[error("cannot print the object")]
    Render(#[source] output::OutputError),
    /// A supervised task (a trigger, a watch, the metrics server, the allocator) stopped: the
    /// agent exits so that the pod restarts, rather than run on without it.
    #[error("task {0} stopped")]
    TaskEnded(&'static str),
}

impl RunError {
    /// Whether the error is bad configuration (exit 64) rather than a runtime failure.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::LoadMachine(_)
                | Self::NodeAddress(_)
                | Self::KubeConfig(_)
                | Self::Socket(_)
                | Self::Server(_)
                | Self::NotifyFile(_)
        )
    }
}
