//! One scan: read the kubelet, account, build the object. A scan either fully succeeds or
//! returns an error; nothing partial ever reaches the publisher.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use numaplane::nrt::NodeResourceTopology;
use numaplane::proto::podresources::{AllocatableResourcesResponse, ListPodResourcesResponse};

use crate::accounting::{self, Accounting, AccountingConfig, AccountingError, MachineView};
use crate::checkpoint::CheckpointError;
use crate::init_held::{self, PodFacts, PodKey, Sources};
use crate::podresources::{KubeletClient, PodResourcesError};

/// Errors of one scan.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A kubelet call failed.
    #[error("cannot read the kubelet")]
    ReadKubelet(#[source] PodResourcesError),
    /// The kubelet's data cannot be accounted truthfully.
    #[error("cannot account the kubelet's data")]
    Account(#[source] AccountingError),
}

impl ScanError {
    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ReadKubelet(e) => e.kind(),
            Self::Account(_) => "accounting",
        }
    }
}

/// The result of a successful scan.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The accounting.
    pub accounting: Accounting,
    /// The object to publish (no owner reference).
    pub nrt: NodeResourceTopology,
    /// Pods the kubelet listed, as (namespace, name), before any filter.
    pub listed_pods: BTreeSet<(String, String)>,
    /// How long the kubelet calls took.
    pub kubelet_seconds: f64,
    /// Where init containers' leftovers came from, when the pod watch could match pods.
    pub held_sources: Option<Sources>,
    /// Checkpoints that exist but could not be used this scan.
    pub checkpoint_errors: Vec<CheckpointError>,
}

/// Reads the kubelet and accounts; keeps the allocatable response between scans.
pub struct Scanner {
    client: KubeletClient,
    machine: MachineView,
    allocatable: Option<AllocatableResourcesResponse>,
    warned_empty_allocatable: bool,
    /// The kubelet's root directory (`/var/lib/kubelet` on the host), for its checkpoints.
    kubelet_state_dir: Option<PathBuf>,
}

impl Scanner {
    /// A scanner for this machine.
    pub fn new(client: KubeletClient, machine: MachineView, kubelet_state_dir: Option<PathBuf>) -> Self {
        Self {
            client,
            machine,
            allocatable: None,
            warned_empty_allocatable: false,
            kubelet_state_dir,
        }
    }

    /// The client.
    pub fn client(&self) -> &KubeletClient {
        &self.client
    }

    /// The last `GetAllocatableResources` answer a successful scan used (or that a failed one
    /// kept).
    pub fn allocatable(&self) -> Option<&AllocatableResourcesResponse> {
        self.allocatable.as_ref()
    }

    /// Forces `GetAllocatableResources` on the next scan: after a reconnect, periodically, and
    /// whenever device plugins may have (re-)registered.
    pub fn refresh_allocatable(&mut self) {
        self.allocatable = None;
    }

    /// Reads the kubelet and builds the object for `cfg`. `facts`: the pod watch's view of this
    /// node's pods (UIDs, specs), without which init containers' leftovers cannot be matched.
    pub async fn scan(
        &mut self,
        cfg: &AccountingConfig,
        facts: Option<&BTreeMap<PodKey, PodFacts>>,
    ) -> Result<Scan, ScanError> {
        let started = Instant::now();
        let allocatable = match self.allocatable.take() {
            Some(a) => a,
            None => self.client.allocatable().await.map_err(ScanError::ReadKubelet)?,
        };
        let list = match self.client.list().await {
            Ok(l) => l,
            Err(e) => {
                self.allocatable = Some(allocatable);
                return Err(ScanError::ReadKubelet(e));
            }
        };
        let kubelet_seconds = started.elapsed().as_secs_f64();
        self.warn_empty(&allocatable);
        let checkpoints = match (facts, &self.kubelet_state_dir) {
            (Some(_), Some(dir)) => init_held::read_checkpoints(dir).await,
            _ => init_held::Checkpoints::default(),
        };
        let checkpoint_errors = checkpoints.errors();
        // GetAllocatableResources lists CPUs only under the static CPU manager policy.
        let static_cpus = !allocatable.cpu_ids.is_empty();
        let (held, sources) = init_held::held_beyond_list(&list, facts, &checkpoints, static_cpus);
        let held_sources = facts.map(|_| sources);
        let memory_groups = match &checkpoints.memory {
            Some(Ok(m)) => Some(m.groups.clone()),
            _ => None,
        };
        let result = if facts.is_some() {
            let mut cfg = cfg.clone();
            cfg.held_beyond_list = held;
            cfg.held_sources = held_sources;
            cfg.memory_groups = memory_groups;
            build(&self.machine, &allocatable, &list, &cfg)
        } else {
            build(&self.machine, &allocatable, &list, cfg)
        };
        self.allocatable = Some(allocatable);
        let (accounting, nrt) = result?;
        Ok(Scan {
            accounting,
            nrt,
            listed_pods: list
                .pod_resources
                .iter()
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect(),
            kubelet_seconds,
            held_sources,
            checkpoint_errors,
        })
    }

    fn warn_empty(&mut self, a: &AllocatableResourcesResponse) {
        let empty = a.cpu_ids.is_empty() && a.devices.is_empty() && a.memory.is_empty();
        if empty && !self.warned_empty_allocatable {
            tracing::warn!(
                socket = %self.client.socket().display(),
                "kubelet reports no allocatable CPUs, devices or memory (CPU manager policy \
                 none, memory manager None and no device plugins?); zones will show no \
                 exclusive resources"
            );
        }
        self.warned_empty_allocatable = empty;
    }
}

/// The pure part of a scan: accounting plus object build (what the scan benchmark measures).
pub fn build(
    machine: &MachineView,
    allocatable: &AllocatableResourcesResponse,
    list: &ListPodResourcesResponse,
    cfg: &AccountingConfig,
) -> Result<(Accounting, NodeResourceTopology), ScanError> {
    let accounting = accounting::account(machine, allocatable, list, cfg).map_err(ScanError::Account)?;
    let nrt = accounting.to_nrt(&cfg.node_name);
    Ok((accounting, nrt))
}
