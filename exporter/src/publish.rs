//! Publishing the NodeResourceTopology: server-side apply with a fixed field manager, skipped
//! when nothing changed (with a periodic forced write), an owner reference to the Node so the
//! API server garbage-collects the object with its node, and Kubernetes Events on the Node for
//! what an operator would look for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource as _};
use numaplane::nrt::{self, NodeResourceTopology};
use tokio::time::Instant;

use crate::metrics::{Metrics, WriteLabels, unix_now};

/// The field manager of every write, so that ownership of the fields stays with the agent.
pub const FIELD_MANAGER: &str = "numaplane-exporter";

/// Errors talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The CRD is not installed (discovery does not list the resource).
    #[error("the NodeResourceTopology CRD ({crd}) is not installed")]
    CrdMissing {
        /// The CRD's name, `<plural>.<group>`.
        crd: String,
    },
    /// Discovery of the CRD's group failed for another reason.
    #[error("cannot discover {api_version}")]
    Discover {
        /// Group/version looked up.
        api_version: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The server-side apply failed.
    #[error("cannot apply NodeResourceTopology {name}")]
    Apply {
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl PublishError {
    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::CrdMissing { .. } => "crd_missing",
            Self::Discover { .. } => "discovery",
            Self::Apply { .. } => "apply",
        }
    }
}

/// The name of the NRT CRD, as `kubectl get crd` shows it.
pub fn crd_name() -> String {
    nrt::CRD_NAME.to_owned()
}

/// Checks that the API server serves the NRT API.
pub async fn crd_served(client: &Client) -> Result<(), PublishError> {
    let api_version = nrt::API_VERSION;
    match client.list_api_group_resources(api_version).await {
        Ok(list) if list.resources.iter().any(|r| r.name == nrt::PLURAL) => Ok(()),
        Ok(_) => Err(PublishError::CrdMissing { crd: crd_name() }),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Err(PublishError::CrdMissing { crd: crd_name() })
        }
        Err(source) => Err(PublishError::Discover {
            api_version: api_version.to_owned(),
            source,
        }),
    }
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The object was applied.
    Written,
    /// The object equals the last one applied and the forced resync is not due.
    Skipped,
}

/// Applies objects for one node.
pub struct Publisher {
    api: Api<NodeResourceTopology>,
    nodes: Api<Node>,
    node_name: String,
    owner: Option<OwnerReference>,
    /// The object as last sent, shared with the watch on our own object so that it can tell
    /// our writes from foreign edits. Set before the write (the watch event of our own write may
    /// arrive before the reply), cleared when the write fails.
    applied: Arc<Mutex<Option<NodeResourceTopology>>>,
    last_write: Option<Instant>,
    force_every: Duration,
    metrics: Arc<Metrics>,
}

impl Publisher {
    /// A publisher for `node_name`; a write is forced at least every `force_every`.
    pub fn new(client: Client, node_name: &str, force_every: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            api: Api::all(client.clone()),
            nodes: Api::all(client),
            node_name: node_name.to_owned(),
            owner: None,
            applied: Arc::default(),
            last_write: None,
            force_every,
            metrics,
        }
    }

    /// Forgets what was written, so the next publish writes (object deleted or edited by
    /// someone else).
    pub fn invalidate(&mut self) {
        self.set_applied(None);
    }

    /// The object as last sent (see the field), for the watch on our own object.
    pub fn applied(&self) -> Arc<Mutex<Option<NodeResourceTopology>>> {
        self.applied.clone()
    }

    fn set_applied(&self, nrt: Option<NodeResourceTopology>) {
        *lock_applied(&self.applied) = nrt;
    }

    /// The owner reference to the Node, looked up once (a Node that cannot be read yet leaves
    /// the object without owner until a later publish finds it).
    async fn owner(&mut self) -> Option<OwnerReference> {
        if self.owner.is_none() {
            match self.nodes.get(&self.node_name).await {
                Ok(node) => {
                    self.owner = node.controller_owner_ref(&()).map(|mut r| {
                        // Not a controller: the Node does not manage the object, it only scopes
                        // its lifetime.
                        r.controller = None;
                        r.block_owner_deletion = None;
                        r
                    });
                }
                Err(e) => {
                    self.metrics.error("node_lookup");
                    tracing::warn!(
                        node = %self.node_name,
                        error = %numaplane::error_chain(&e),
                        "cannot read the Node for the owner reference; publishing without it"
                    );
                }
            }
        }
        self.owner.clone()
    }

    /// Applies `nrt` unless it equals the last applied object and no forced write is due.
    pub async fn publish(
        &mut self,
        mut nrt: NodeResourceTopology,
        force: bool,
    ) -> Result<Outcome, PublishError> {
        if let Some(owner) = self.owner().await {
            nrt.metadata.owner_references = Some(vec![owner]);
        }
        let due = self.last_write.is_none_or(|t| t.elapsed() >= self.force_every);
        if !force && !due && lock_applied(&self.applied).as_ref() == Some(&nrt) {
            self.metrics.nrt_write_skips.inc();
            self.metrics.last_successful_publish.set(unix_now());
            return Ok(Outcome::Skipped);
        }
        self.set_applied(Some(nrt.clone()));
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let result = self
            .api
            .patch(&self.node_name, &params, &Patch::Apply(&nrt))
            .await;
        let ok = result.is_ok();
        self.metrics
            .nrt_writes
            .get_or_create(&WriteLabels {
                operation: "apply".to_owned(),
                result: if ok { "success" } else { "error" }.to_owned(),
            })
            .inc();
        match result {
            Ok(_) => {
                self.last_write = Some(Instant::now());
                self.metrics.last_successful_publish.set(unix_now());
                Ok(Outcome::Written)
            }
            Err(source) => {
                self.set_applied(None);
                if matches!(&source, kube::Error::Api(s) if s.code == 422 || s.code == 400) {
                    // The owner reference may point to a replaced Node: look it up again.
                    self.owner = None;
                }
                Err(PublishError::Apply {
                    name: self.node_name.clone(),
                    source,
                })
            }
        }
    }
}

/// Locks the shared last-applied object, recovering from a poisoned lock (the value is replaced
/// whole, never left half-written).
pub fn lock_applied(
    applied: &Mutex<Option<NodeResourceTopology>>,
) -> std::sync::MutexGuard<'_, Option<NodeResourceTopology>> {
    applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Kubernetes Events on the Node, where an operator running `kubectl describe node` looks.
#[derive(Clone)]
pub struct NodeEvents {
    recorder: Recorder,
    client: Client,
    node: k8s_openapi::api::core::v1::ObjectReference,
    /// The Node's UID, read on the first Event: `kubectl describe node` finds a node's events
    /// by `involvedObject.uid`, so an Event without it does not show there.
    uid: tokio::sync::OnceCell<String>,
}

impl NodeEvents {
    /// Events regarding `node_name`, reported by `instance` (the agent's pod name; required by
    /// the events.k8s.io API).
    pub fn new(client: Client, node_name: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node: k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node_name.to_owned()),
                ..Default::default()
            },
            uid: tokio::sync::OnceCell::new(),
        }
    }

    /// The reference to the Node, with its UID once it could be read (a Node that cannot be
    /// read yet gets an Event without it, and a later Event tries again).
    async fn regarding(&self, metrics: &Metrics) -> k8s_openapi::api::core::v1::ObjectReference {
        let name = self.node.name.clone().unwrap_or_default();
        let uid = self
            .uid
            .get_or_try_init(|| async {
                match Api::<Node>::all(self.client.clone()).get(&name).await {
                    Ok(node) => node.metadata.uid.ok_or(()),
                    Err(e) => {
                        metrics.error("node_lookup");
                        tracing::warn!(
                            error = %numaplane::error_chain(&e),
                            "cannot read the Node's UID; this Event goes without it"
                        );
                        Err(())
                    }
                }
            })
            .await
            .ok()
            .cloned();
        k8s_openapi::api::core::v1::ObjectReference {
            uid,
            ..self.node.clone()
        }
    }

    /// Publishes a Warning event; failures are logged and counted, never fatal.
    pub async fn warn(&self, metrics: &Metrics, reason: &str, action: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: action.to_owned(),
            secondary: None,
        };
        let regarding = self.regarding(metrics).await;
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            metrics.error("event");
            tracing::warn!(reason, error = %numaplane::error_chain(&e), "cannot publish Event");
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
