//! An in-memory fake kube-apiserver speaking plain HTTP/1.1 + JSON on `127.0.0.1:<random port>`,
//! so end-to-end tests drive numaplane through the real kube-rs client (kubeconfig, typed `Api`s,
//! server-side apply, `kube::runtime::watcher`, discovery, the event recorder) without a cluster.
//!
//! # What is emulated
//! - Resources: core `v1` pods, nodes, namespaces, events, persistentvolumeclaims,
//!   persistentvolumes; `storage.k8s.io/v1` storageclasses and csinodes; `events.k8s.io/v1` events;
//!   `policy/v1` poddisruptionbudgets; `resource.k8s.io/v1` deviceclasses, resourceslices,
//!   resourceclaims (with status) and resourceclaimtemplates;
//!   `apiextensions.k8s.io/v1` customresourcedefinitions; `topology.node.k8s.io/v1alpha2`
//!   noderesourcetopologies, which answer 404 everywhere (discovery included) until
//!   [`FakeApiServer::install_nrt_crd`]. More kinds can be added with
//!   [`FakeApiServer::add_resource`]; the store is generic over `serde_json::Value`.
//! - One global `resourceVersion` counter bumped by every write (deletes included);
//!   `metadata.uid` is stable across updates and new on re-create; `metadata.generation` starts at
//!   1 and is bumped when anything outside `metadata`/`status` changes.
//! - Writes through HTTP that leave the object unchanged (no-op PUT, patch or apply) are not
//!   persisted, like the real server: no new `resourceVersion`, no watch event.
//!   [`FakeApiServer::put`] is a test-side "touch" and always writes.
//! - GET/LIST/WATCH with `fieldSelector` (`=`, `==`, `!=`, comma-joined) on the field labels the
//!   real server supports per kind (pods: `spec.nodeName`, `spec.schedulerName`, `status.phase`,
//!   …; others answer 400 `field label not supported: X`) and `labelSelector` (`k=v`, `k==v`,
//!   `k!=v`, `k`, `!k`, `k in (..)`, `k notin (..)`).
//! - WATCH (`?watch=true|1`, or the legacy `/watch/` path prefix): newline-delimited JSON events
//!   streamed chunked. The requested `resourceVersion` is resumed from an event history; a version
//!   older than the history answers one `ERROR` event with a 410 `Expired` status, like the watch
//!   cache. Without a resourceVersion (or `0`) the watch starts with synthetic `ADDED` events;
//!   `sendInitialEvents=true` (kube's streaming lists) ends them with the
//!   `k8s.io/initial-events-end` bookmark. Objects moving into/out of a selector are sent as
//!   `ADDED`/`DELETED`, as the real server does. Watches end after `timeoutSeconds`.
//! - POST (201, 409 `AlreadyExists`, 404 when the namespace does not exist), PUT (409 `Conflict`
//!   on a stale `metadata.resourceVersion`), DELETE (200 with the object, preconditions honoured),
//!   DELETE on a collection, the `status` subresource (main-resource writes keep the stored status
//!   for kinds that have one).
//! - PATCH: `application/apply-patch+yaml` (server-side apply, JSON or YAML body, `fieldManager`
//!   required), `application/merge-patch+json`, `application/strategic-merge-patch+json` (lists
//!   with a Go `patchMergeKey` merge item by item: pod and node conditions by `type`, containers
//!   by `name`, owner references by `uid`, …; `$patch: delete` items) and
//!   `application/json-patch+json` (RFC 6902).
//! - The node proxy's `GET /api/v1/nodes/NAME/proxy/configz` (the kubelet's configuration through
//!   the API server): `{"kubeletconfig": …}` as set by [`FakeApiServer::set_node_configz`], 404
//!   for a Node that does not exist, 503 `ServiceUnavailable` ("error trying to reach service")
//!   for one whose kubelet was given no configuration (as when the kubelet is down; the shape of
//!   that answer is from the API server's proxy code, not observed). No other proxy path.
//! - `POST pods/NAME/binding`: 201 `Status`, the Binding's annotations copied onto the pod with
//!   `spec.nodeName` in one write; 409 `Conflict` with the real server's three bodies: the
//!   Binding's UID is not the pod's (`details.kind: pods`, a storage precondition failure), the
//!   pod is already assigned (`details.kind: pods/binding`), the pod has `spec.schedulingGates`
//!   (`details.kind: pods/binding`).
//! - Validation that numaplane meets: the NRT CRD's schema (quantities must match the quantity
//!   pattern, 422 `Invalid`; unknown fields pruned) and `events.k8s.io/v1` Events
//!   (`eventTime`, `reportingController`, `reportingInstance` required, 422).
//! - Every line of "What a real API server (v1.36.2) answers" in the shared verified facts has a
//!   self-test (`tests/tests/fake_api_selftest.rs`, `fact_*`).
//! - Server-side apply tracks ownership in `metadata.managedFields` at a coarse granularity:
//!   top-level fields (`f:zones`), single labels/annotations, `metadata.ownerReferences` and
//!   `metadata.finalizers`. Fields the manager applied before and omits now are removed unless
//!   another manager owns them; without `force=true`, changing a field owned by another manager is
//!   a 409 with `FieldManagerConflict` causes.
//! - Discovery: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/{group}`, `/apis/{group}/{version}`,
//!   aggregated discovery (`as=APIGroupDiscoveryList`), `/healthz`, `/readyz`, `/livez`.
//! - Metadata-only requests (`Accept: …;as=PartialObjectMetadata…`: kube's `get_metadata`,
//!   `list_metadata`, `Api<PartialObjectMeta<K>>`) answer `PartialObjectMetadata(List)`.
//! - Test hooks: request recording (with each client's bearer token, so processes given their
//!   own kubeconfig by [`FakeApiServer::write_kubeconfig_as`] can be told apart), injected failures with proper `Status` bodies, event-history
//!   compaction, forced watch disconnection and bookmarks, and store changes made just before a
//!   matching request is answered ([`FakeApiServer::change_before_next`]: another client's write
//!   racing the request, so the real answer to the race is given).
//!
//! # Known gaps vs a real API server
//! - No authentication, authorization, admission webhooks or defaulting; schema validation only
//!   as listed above.
//! - `limit`/`continue` are ignored (one page, no continue token); LIST ignores `resourceVersion`
//!   and always answers the latest state.
//! - Strategic merge patch knows the merge keys of the lists above only (other lists are
//!   replaced) and no directive but `$patch: delete` on list items.
//! - Managed fields are coarse (see above); non-apply writes record no `Update` managers, so apply
//!   conflicts only arise between appliers; `fieldsV1` from other sources is read back truncated
//!   to that granularity.
//! - Deletion is immediate: no graceful deletion of pods, no finalizers, no garbage collection,
//!   no namespace termination; deleting a CRD object does not unserve its resource.
//! - No per-kind strategies: every kind gets `generation`, HTTP creates keep the posted status
//!   (a real pod starts `Pending`), immutable fields other than the identity are not enforced.
//! - A watch from a future resourceVersion just waits (the real server answers "too large").
//! - `events` and `events.k8s.io/v1` events are separate stores (real servers convert between them).
//! - Periodic watch bookmarks are not sent; use [`FakeApiServer::send_bookmarks`].
//! - Injected 429/503/504 failures are retried transparently by kube-rs's default retry layer
//!   (no `Retry-After` header is sent, so retries are fast); they still show in
//!   [`FakeApiServer::requests`].
//! - HTTP/1.1 only, JSON only (no protobuf, no TLS, no websockets/exec/logs).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::Stream;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Watch events kept for resuming watches by default; older versions get 410 Gone.
const DEFAULT_HISTORY_CAPACITY: usize = 10_000;
/// Server-side watch timeout when the client asks for none (the real server picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Bearer token written into kubeconfigs; the fake accepts anything, tests may check it arrives.
pub const FAKE_TOKEN: &str = "numaplane-fake-token";
/// Media type of aggregated discovery, requested by `Discovery::run_aggregated`.
const AGGREGATED_DISCOVERY: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];
/// Namespaces a fresh cluster has, so namespaced creates work without set-up.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One HTTP request as the fake received it, with the status it answered.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// `GET`, `PATCH`, …
    pub method: String,
    /// Path without the query, e.g. `/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/n1`.
    pub path: String,
    /// Raw query string without `?` (still percent-encoded; see [`Self::query_param`]).
    pub query: String,
    /// `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// All headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: Bytes,
    /// HTTP status answered (200 for watches, whose errors travel inside the stream).
    pub status: u16,
    /// When the request arrived.
    pub at: Instant,
}

impl RecordedRequest {
    /// Body as text (lossy UTF-8).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Body parsed as JSON, if it is JSON.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// First value of a query parameter, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// A header value by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The bearer token of the `Authorization` header: the client's identity (see
    /// [`FakeApiServer::write_kubeconfig_as`]).
    pub fn bearer_token(&self) -> Option<&str> {
        self.header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
    }

    /// Whether this was a watch request.
    pub fn is_watch(&self) -> bool {
        self.path.contains("/watch/") || matches!(self.query_param("watch").as_deref(), Some("true" | "1"))
    }
}

/// A resource the fake serves: the URL plural ↔ kind mapping plus discovery data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group, empty for core.
    pub group: String,
    /// Version, e.g. `v1`.
    pub version: String,
    /// URL plural, e.g. `pods`.
    pub plural: String,
    /// Singular name for discovery.
    pub singular: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Discovery short names.
    pub short_names: Vec<String>,
    /// Whether `/status` exists (main-resource writes then keep the stored status).
    pub status_subresource: bool,
    /// Unserved resources answer 404, like a CRD that is not installed.
    pub served: bool,
}

impl ResourceDef {
    /// A served resource without short names or status subresource.
    pub fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            singular: kind.to_ascii_lowercase(),
            kind: kind.to_owned(),
            namespaced,
            short_names: Vec::new(),
            status_subresource: false,
            served: true,
        }
    }

    /// With discovery short names.
    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// With a `/status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `noderesourcetopologies.topology.node.k8s.io`, as the real server's messages say.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn details(&self, name: &str) -> Value {
        json!({"name": name, "group": self.group, "kind": self.plural})
    }
}

fn nrt_resource() -> ResourceDef {
    use numaplane::nrt::{GROUP, KIND, PLURAL, VERSION};
    let mut def = ResourceDef::new(GROUP, VERSION, PLURAL, KIND, false).with_short_names(&["node-res-topo"]);
    def.served = false;
    def
}

/// (group, plural, kind, namespaced, short names, a `/status` subresource) of a resource of v1.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

fn builtin_resources() -> Vec<ResourceDef> {
    const NAMESPACED: bool = true;
    const STATUS: bool = true;
    #[rustfmt::skip]
    let builtin: [Builtin; 16] = [
        ("", "pods", "Pod", NAMESPACED, &["po"], STATUS),
        ("", "nodes", "Node", !NAMESPACED, &["no"], STATUS),
        ("", "namespaces", "Namespace", !NAMESPACED, &["ns"], STATUS),
        ("", "events", "Event", NAMESPACED, &["ev"], !STATUS),
        ("events.k8s.io", "events", "Event", NAMESPACED, &["ev"], !STATUS),
        ("coordination.k8s.io", "leases", "Lease", NAMESPACED, &[], !STATUS),
        ("", "persistentvolumeclaims", "PersistentVolumeClaim", NAMESPACED, &["pvc"], STATUS),
        ("", "persistentvolumes", "PersistentVolume", !NAMESPACED, &["pv"], STATUS),
        ("storage.k8s.io", "storageclasses", "StorageClass", !NAMESPACED, &["sc"], !STATUS),
        ("storage.k8s.io", "csinodes", "CSINode", !NAMESPACED, &[], !STATUS),
        ("resource.k8s.io", "deviceclasses", "DeviceClass", !NAMESPACED, &[], !STATUS),
        ("resource.k8s.io", "resourceslices", "ResourceSlice", !NAMESPACED, &[], !STATUS),
        ("resource.k8s.io", "resourceclaims", "ResourceClaim", NAMESPACED, &[], STATUS),
        ("resource.k8s.io", "resourceclaimtemplates", "ResourceClaimTemplate", NAMESPACED, &[], !STATUS),
        ("policy", "poddisruptionbudgets", "PodDisruptionBudget", NAMESPACED, &["pdb"], STATUS),
        ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", !NAMESPACED, &["crd", "crds"], STATUS),
    ];
    let mut defs: Vec<ResourceDef> = builtin
        .into_iter()
        .map(|(group, plural, kind, namespaced, short_names, status)| {
            let def = ResourceDef::new(group, "v1", plural, kind, namespaced).with_short_names(short_names);
            if status { def.with_status() } else { def }
        })
        .collect();
    defs.push(nrt_resource());
    defs
}

/// Handle on a running fake API server; clones share it, the server stops with the last one.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Handle {
    fn stop(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            // Aborting the accept loop drops its JoinSet, which aborts every connection too.
            task.abort();
        }
        self.shared.mutate(|st| st.watch_epoch += 1);
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.inner.shared.addr)
            .finish()
    }
}

impl FakeApiServer {
    /// Binds 127.0.0.1 on a random port and serves until [`Self::shutdown`] or the last drop.
    pub async fn start() -> std::io::Result<FakeApiServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let mut state = State::new();
        for ns in INITIAL_NAMESPACES {
            state.ensure_namespace(ns);
        }
        let (changes, _) = watch::channel(0u64);
        let (recorded, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changes,
            recorded,
            addr,
        });
        let task = tokio::spawn(serve(listener, Arc::clone(&shared)));
        Ok(FakeApiServer {
            inner: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared().addr)
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.shared().addr
    }

    /// Kubeconfig text pointing at this server (context `fake`, namespace `default`, a dummy token).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n  cluster:\n    server: {url}\n\
             contexts:\n\
             - name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n\
             users:\n\
             - name: fake\n  user:\n    token: {FAKE_TOKEN}\n\
             preferences: {{}}\n",
            url = self.url()
        )
    }

    /// A kubeconfig like [`Self::kubeconfig_yaml`] whose token is `token`: each process given
    /// its own identity this way can be told apart in [`Self::requests`]
    /// ([`RecordedRequest::bearer_token`]).
    pub fn kubeconfig_yaml_as(&self, token: &str) -> String {
        self.kubeconfig_yaml()
            .replace(&format!("token: {FAKE_TOKEN}\n"), &format!("token: {token}\n"))
    }

    /// Writes `dir/kubeconfig-<token>` (see [`Self::kubeconfig_yaml_as`]) and returns its path.
    pub fn write_kubeconfig_as(&self, dir: &Path, token: &str) -> std::io::Result<PathBuf> {
        let path = dir.join(format!("kubeconfig-{token}"));
        std::fs::write(&path, self.kubeconfig_yaml_as(token))?;
        Ok(path)
    }

    /// Writes `dir/kubeconfig` (see [`Self::kubeconfig_yaml`]) and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join("kubeconfig");
        std::fs::write(&path, self.kubeconfig_yaml())?;
        Ok(path)
    }

    /// A kube client built from the kubeconfig, through the same path production uses.
    pub async fn client(&self) -> Result<kube::Client, Box<dyn std::error::Error + Send + Sync>> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Serves NodeResourceTopology (and stores its CRD object); idempotent.
    pub fn install_nrt_crd(&self) {
        self.install_crd(nrt_resource());
    }

    /// Serves a custom resource from now on and stores a matching CRD object; idempotent.
    pub fn install_crd(&self, def: ResourceDef) {
        self.shared().mutate(|st| {
            let def = ResourceDef { served: true, ..def };
            match st
                .defs
                .iter_mut()
                .find(|d| d.group == def.group && d.version == def.version && d.plural == def.plural)
            {
                Some(existing) => *existing = def.clone(),
                None => st.defs.push(def.clone()),
            }
            let crd = crd_object(&def);
            let key = ObjKey::of(&crd);
            if !st.objects.contains_key(&key) {
                st.store_create(key, crd);
            }
        });
    }

    /// Serves one more resource kind (generic store; unserved definitions answer 404).
    pub fn add_resource(&self, def: ResourceDef) {
        self.shared().mutate(|st| {
            st.defs
                .retain(|d| !(d.group == def.group && d.version == def.version && d.plural == def.plural));
            st.defs.push(def);
        });
    }

    /// Create-or-replace as the server would store it (uid kept or assigned, timestamps, a new
    /// resourceVersion even when nothing changed), emitting ADDED/MODIFIED; returns the stored
    /// object. Namespaced objects default to `default` and their namespace is created if missing;
    /// a missing name is generated from `generateName` or the kind.
    pub fn put(&self, obj: Value) -> Value {
        self.shared().mutate(|st| st.put(obj))
    }

    /// The stored object, if any.
    pub fn get(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = ObjKey::new(api_version, kind, namespace.unwrap_or(""), name);
        self.shared().lock().objects.get(&key).cloned()
    }

    /// All stored objects of a kind, in one namespace or all of them, in key order.
    pub fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        self.shared()
            .lock()
            .objects
            .iter()
            .filter(|(k, _)| {
                k.api_version == api_version && k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Deletes immediately, emitting DELETED; false if it did not exist.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let key = ObjKey::new(api_version, kind, namespace.unwrap_or(""), name);
        self.shared().mutate(|st| st.store_delete(&key).is_some())
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared().lock().rv
    }

    /// What the kubelet of `node` answers on `/configz` through the node proxy: its
    /// `KubeletConfiguration` fields (`None`: the kubelet cannot be reached, 503).
    pub fn set_node_configz(&self, node: &str, config: Option<Value>) {
        self.shared().mutate(|st| match config {
            Some(c) => {
                st.node_configz.insert(node.to_owned(), c);
            }
            None => {
                st.node_configz.remove(node);
            }
        });
    }

    /// Every request received so far (since the last [`Self::clear_requests`]).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared().lock().requests.clone()
    }

    /// Forgets recorded requests.
    pub fn clear_requests(&self) {
        self.shared().lock().requests.clear();
    }

    /// The next `count` requests whose method matches (case-insensitive, `*` for any) and whose
    /// path starts with `path_prefix` answer `status` with a metav1 `Status` body.
    pub fn fail_next(&self, method: &str, path_prefix: &str, status: u16, count: usize) {
        if count == 0 {
            return;
        }
        self.shared().lock().failures.push(Failure {
            method: method.to_ascii_uppercase(),
            path_prefix: path_prefix.to_owned(),
            status,
            remaining: count,
        });
    }

    /// The next request whose method matches (case-insensitive, `*` for any) and whose path
    /// starts with `path_prefix` is answered after `changes` are made to the store, each a write
    /// with its watch events, as if another client had made them just before: a pod bound by
    /// someone else, or deleted and recreated, while a Binding is in flight. The request then
    /// gets the answer the real server gives to that race.
    pub fn change_before_next(&self, method: &str, path_prefix: &str, changes: Vec<StoreChange>) {
        self.change_then_answer_after(method, path_prefix, changes, Duration::ZERO);
    }

    /// [`Self::change_before_next`], and the request is answered `delay` after the changes:
    /// the clients' watches see the changes well before the request's answer arrives.
    pub fn change_then_answer_after(
        &self,
        method: &str,
        path_prefix: &str,
        changes: Vec<StoreChange>,
        delay: Duration,
    ) {
        self.shared().lock().changes.push(Change {
            method: method.to_ascii_uppercase(),
            path_prefix: path_prefix.to_owned(),
            changes,
            delay,
            repeat: false,
        });
    }

    /// The next request whose method matches (case-insensitive, `*` for any) and whose path
    /// starts with `path_prefix` is handled twice and the second answer is given: a request
    /// whose first attempt landed but whose answer was lost, retried (a Binding then lands and
    /// is answered 409 "already assigned" by the server).
    pub fn land_then_repeat_next(&self, method: &str, path_prefix: &str) {
        self.shared().lock().changes.push(Change {
            method: method.to_ascii_uppercase(),
            path_prefix: path_prefix.to_owned(),
            changes: Vec::new(),
            delay: Duration::ZERO,
            repeat: true,
        });
    }

    /// Bindings the fake stored (a Binding that set `spec.nodeName`), per pod UID, since the
    /// start: a pod bound twice shows 2.
    pub fn accepted_bindings(&self) -> BTreeMap<String, usize> {
        self.shared().lock().bindings.clone()
    }

    /// The pod UIDs the fake stored more than one Binding for, with their counts.
    pub fn bound_more_than_once(&self) -> Vec<(String, usize)> {
        self.accepted_bindings()
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .collect()
    }

    /// Every request received since the last call (or [`Self::clear_requests`]), removed from
    /// the record: lets a long test scan requests as they come without keeping them all.
    pub fn drain_requests(&self) -> Vec<RecordedRequest> {
        std::mem::take(&mut self.shared().lock().requests)
    }

    /// First recorded request (already recorded or arriving before `timeout`) matching `pred`.
    pub async fn wait_for_request<F: Fn(&RecordedRequest) -> bool>(
        &self,
        pred: F,
        timeout: Duration,
    ) -> Option<RecordedRequest> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.shared().recorded.subscribe();
        let mut seen = 0usize;
        loop {
            rx.borrow_and_update();
            {
                let st = self.shared().lock();
                if seen > st.requests.len() {
                    seen = 0; // cleared meanwhile
                }
                if let Some(found) = st.requests[seen..].iter().find(|r| pred(r)) {
                    return Some(found.clone());
                }
                seen = st.requests.len();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// Keeps at most `capacity` watch events; resuming from an older version answers 410.
    pub fn set_history_capacity(&self, capacity: usize) {
        self.shared().mutate(|st| {
            st.history_capacity = capacity;
            st.trim_history();
        });
    }

    /// Forgets all watch history, as etcd compaction does: watches resuming from a version
    /// older than the current one get 410 Gone and must relist.
    pub fn compact_history(&self) {
        self.shared().mutate(|st| {
            st.history.clear();
            st.history_floor = st.rv;
        });
    }

    /// Ends every open watch stream (clients then resume from their last resourceVersion).
    pub fn close_watches(&self) {
        self.shared().mutate(|st| st.watch_epoch += 1);
    }

    /// Sends a BOOKMARK at the current resourceVersion on every open watch that allows them.
    pub fn send_bookmarks(&self) {
        self.shared().mutate(|st| st.bookmark_gen += 1);
    }

    /// Stops serving: closes the listener and every connection, open watches included.
    pub fn shutdown(&self) {
        self.inner.stop();
    }
}

fn crd_object(def: &ResourceDef) -> Value {
    let names = json!({
        "plural": def.plural,
        "singular": def.singular,
        "kind": def.kind,
        "listKind": format!("{}List", def.kind),
        "shortNames": def.short_names,
    });
    let mut versions = vec![json!({
        "name": def.version,
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    })];
    if def.status_subresource
        && let Some(v) = versions.first_mut().and_then(Value::as_object_mut)
    {
        v.insert("subresources".into(), json!({"status": {}}));
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", def.plural, def.group)},
        "spec": {
            "group": def.group,
            "names": names,
            "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
        },
        "status": {
            "acceptedNames": names,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
            ],
            "storedVersions": [def.version],
        },
    })
}

// ===================== shared state =====================

struct Shared {
    state: Mutex<State>,
    /// Bumped after every change watch streams may care about; wakes them.
    changes: watch::Sender<u64>,
    /// Bumped after every recorded request; wakes `wait_for_request`.
    recorded: watch::Sender<u64>,
    addr: SocketAddr,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock and wakes watch streams if it wrote or signalled anything.
    fn mutate<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (result, changed) = {
            let mut st = self.lock();
            let before = (st.rv, st.watch_epoch, st.bookmark_gen, st.history_floor);
            let result = f(&mut st);
            let after = (st.rv, st.watch_epoch, st.bookmark_gen, st.history_floor);
            (result, before != after)
        };
        if changed {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        result
    }

    fn take_failure(&self, method: &str, path: &str) -> Option<u16> {
        let mut st = self.lock();
        let idx = st
            .failures
            .iter()
            .position(|f| (f.method == "*" || f.method == method) && path.starts_with(&f.path_prefix))?;
        let failure = &mut st.failures[idx];
        let status = failure.status;
        failure.remaining -= 1;
        if failure.remaining == 0 {
            st.failures.remove(idx);
        }
        Some(status)
    }

    /// Makes the store changes due before a request of `method` on `path`, if any; returns
    /// how long to wait before answering and whether to handle the request twice.
    fn change_before(&self, method: &str, path: &str) -> (Duration, bool) {
        let due = {
            let mut st = self.lock();
            let idx = st
                .changes
                .iter()
                .position(|c| (c.method == "*" || c.method == method) && path.starts_with(&c.path_prefix));
            idx.map(|i| st.changes.remove(i))
        };
        let Some(due) = due else {
            return (Duration::ZERO, false);
        };
        for change in due.changes {
            match change {
                StoreChange::Put(obj) => {
                    self.mutate(|st| st.put(obj));
                }
                StoreChange::Delete {
                    api_version,
                    kind,
                    namespace,
                    name,
                } => {
                    let key = ObjKey::new(&api_version, &kind, namespace.as_deref().unwrap_or(""), &name);
                    self.mutate(|st| st.store_delete(&key));
                }
                StoreChange::CloseWatches { compact } => self.mutate(|st| {
                    if compact {
                        st.history.clear();
                        st.history_floor = st.rv;
                    }
                    st.watch_epoch += 1;
                }),
            }
        }
        (due.delay, due.repeat)
    }

    fn record(&self, req: RecordedRequest) {
        self.lock().requests.push(req);
        self.recorded.send_modify(|n| *n = n.wrapping_add(1));
    }
}

struct Failure {
    method: String,
    path_prefix: String,
    status: u16,
    remaining: usize,
}

/// A write [`FakeApiServer::change_before_next`] makes.
#[derive(Clone, Debug)]
pub enum StoreChange {
    /// Stores the object, as [`FakeApiServer::put`] (a new object gets a new UID).
    Put(Value),
    /// Deletes the object, as [`FakeApiServer::delete`].
    Delete {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
        /// Namespace, for namespaced kinds.
        namespace: Option<String>,
        /// Name.
        name: String,
    },
    /// Ends every open watch, as [`FakeApiServer::close_watches`]; with `compact`, forgets the
    /// watch history first ([`FakeApiServer::compact_history`]), so the watches resuming from
    /// their last version get 410 Gone and relist.
    CloseWatches {
        /// Compact the history too.
        compact: bool,
    },
}

struct Change {
    method: String,
    path_prefix: String,
    changes: Vec<StoreChange>,
    delay: Duration,
    /// Handle the request twice and answer the second: a retry whose first attempt landed.
    repeat: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ObjKey {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
}

impl ObjKey {
    fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn of(obj: &Value) -> Self {
        Self::new(
            str_at(obj, &["apiVersion"]),
            str_at(obj, &["kind"]),
            str_at(obj, &["metadata", "namespace"]),
            str_at(obj, &["metadata", "name"]),
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

struct HistEvent {
    rv: u64,
    key: ObjKey,
    ty: EventType,
    object: Value,
    /// The object before a MODIFIED, to turn selector transitions into ADDED/DELETED.
    prev: Option<Value>,
}

struct State {
    defs: Vec<ResourceDef>,
    objects: BTreeMap<ObjKey, Value>,
    rv: u64,
    history: VecDeque<HistEvent>,
    /// Every event with a resourceVersion above this one is still in `history`.
    history_floor: u64,
    history_capacity: usize,
    requests: Vec<RecordedRequest>,
    failures: Vec<Failure>,
    changes: Vec<Change>,
    /// Bumped to end open watches.
    watch_epoch: u64,
    /// Bumped to make open watches send a bookmark.
    bookmark_gen: u64,
    /// What each node's kubelet answers on `/configz` through the node proxy.
    node_configz: BTreeMap<String, Value>,
    /// Bindings stored, per pod UID.
    bindings: BTreeMap<String, usize>,
}

impl State {
    fn new() -> Self {
        Self {
            defs: builtin_resources(),
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_floor: 0,
            history_capacity: DEFAULT_HISTORY_CAPACITY,
            requests: Vec::new(),
            failures: Vec::new(),
            changes: Vec::new(),
            watch_epoch: 0,
            bookmark_gen: 0,
            node_configz: BTreeMap::new(),
            bindings: BTreeMap::new(),
        }
    }

    fn def_for(&self, api_version: &str, kind: &str) -> Option<&ResourceDef> {
        self.defs
            .iter()
            .find(|d| d.kind == kind && d.api_version() == api_version)
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_capacity {
            if let Some(ev) = self.history.pop_front() {
                self.history_floor = ev.rv;
            }
        }
    }

    fn push_event(&mut self, ty: EventType, key: &ObjKey, object: &Value, prev: Option<Value>) {
        self.history.push_back(HistEvent {
            rv: self.rv,
            key: key.clone(),
            ty,
            object: object.clone(),
            prev,
        });
        self.trim_history();
    }

    fn next_rv(&mut self, obj: &mut Value) {
        self.rv += 1;
        set_meta(obj, "resourceVersion", Value::String(self.rv.to_string()));
    }

    /// Stores a new object: uid (unless given), creationTimestamp, generation 1, new RV, ADDED.
    fn store_create(&mut self, key: ObjKey, mut obj: Value) -> Value {
        if str_at(&obj, &["metadata", "uid"]).is_empty() {
            set_meta(&mut obj, "uid", Value::String(new_uid()));
        }
        set_meta(&mut obj, "creationTimestamp", Value::String(rfc3339_now()));
        set_meta(&mut obj, "generation", json!(1));
        self.next_rv(&mut obj);
        self.objects.insert(key.clone(), obj.clone());
        self.push_event(EventType::Added, &key, &obj, None);
        obj
    }

    /// Stores a new version of an existing object, keeping server-owned metadata; a no-op
    /// update (unless `force`) is not persisted, as on the real server.
    fn store_update(&mut self, key: ObjKey, old: &Value, mut new: Value, force: bool) -> Value {
        for field in ["uid", "creationTimestamp", "resourceVersion", "generation"] {
            match meta_get(old, field) {
                Some(v) => set_meta(&mut new, field, v.clone()),
                None => remove_meta(&mut new, field),
            }
        }
        if !force && new == *old {
            return new;
        }
        if spec_changed(old, &new) {
            let generation = meta_get(old, "generation").and_then(Value::as_i64).unwrap_or(0);
            set_meta(&mut new, "generation", json!(generation + 1));
        }
        self.next_rv(&mut new);
        self.objects.insert(key.clone(), new.clone());
        self.push_event(EventType::Modified, &key, &new, Some(old.clone()));
        new
    }

    fn store_delete(&mut self, key: &ObjKey) -> Option<Value> {
        let mut obj = self.objects.remove(key)?;
        self.next_rv(&mut obj);
        self.push_event(EventType::Deleted, key, &obj, None);
        Some(obj)
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.objects.contains_key(&ObjKey::new("v1", "Namespace", "", ns))
    }

    fn ensure_namespace(&mut self, ns: &str) {
        if !self.namespace_exists(ns) {
            let obj = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            self.store_create(ObjKey::new("v1", "Namespace", "", ns), obj);
        }
    }

    fn put(&mut self, mut obj: Value) -> Value {
        if !obj.is_object() {
            obj = json!({});
        }
        let api_version = str_at(&obj, &["apiVersion"]).to_owned();
        let kind = str_at(&obj, &["kind"]).to_owned();
        let namespaced = self.def_for(&api_version, &kind).map(|d| d.namespaced);
        if str_at(&obj, &["metadata", "name"]).is_empty() {
            let prefix = match str_at(&obj, &["metadata", "generateName"]) {
                "" => format!("{}-", kind.to_ascii_lowercase()),
                p => p.to_owned(),
            };
            set_meta(&mut obj, "name", Value::String(generated_name(&prefix)));
        }
        match namespaced {
            Some(true) => {
                let mut ns = str_at(&obj, &["metadata", "namespace"]).to_owned();
                if ns.is_empty() {
                    ns = "default".to_owned();
                    set_meta(&mut obj, "namespace", Value::String(ns.clone()));
                }
                self.ensure_namespace(&ns);
            }
            Some(false) => remove_meta(&mut obj, "namespace"),
            None => {}
        }
        remove_meta(&mut obj, "resourceVersion");
        let key = ObjKey::of(&obj);
        match self.objects.get(&key).cloned() {
            Some(old) => {
                if str_at(&obj, &["metadata", "uid"]).is_empty() {
                    remove_meta(&mut obj, "uid");
                }
                self.store_update(key, &old, obj, true)
            }
            None => self.store_create(key, obj),
        }
    }
}

// ===================== HTTP plumbing =====================

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::debug!("fake api server: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req));
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("fake api server: connection ended: {err}");
            }
        });
    }
}

/// What a handler learned from the request.
struct Ctx {
    method: Method,
    params: Vec<(String, String)>,
    body: Bytes,
    content_type: Option<String>,
    accept: Option<String>,
}

impl Ctx {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    /// kube-rs `metadata_watcher`/`list_metadata`/`get_metadata` ask for PartialObjectMetadata.
    fn metadata_only(&self) -> bool {
        self.accept
            .as_deref()
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
    }

    fn wants_aggregated(&self) -> bool {
        self.accept
            .as_deref()
            .is_some_and(|a| a.contains("as=APIGroupDiscoveryList"))
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("couldn't parse request body: {e}")))
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let at = Instant::now();
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let ctx = Ctx {
        method: parts.method.clone(),
        params: parse_query(&query),
        body: body.clone(),
        content_type: header("content-type"),
        accept: header("accept"),
    };
    let (delay, repeat) = shared.change_before(parts.method.as_str(), &path);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if repeat {
        // The first attempt lands; only the answer to the second is sent.
        let _ = route(&shared, &ctx, &path);
    }
    let reply = match shared.take_failure(parts.method.as_str(), &path) {
        Some(code) => Reply::from(ApiError::new(
            code,
            format!("injected failure ({code}) from the fake API server"),
        )),
        None => route(&shared, &ctx, &path).unwrap_or_else(Reply::from),
    };
    shared.record(RecordedRequest {
        method: parts.method.as_str().to_owned(),
        path,
        query,
        content_type: ctx.content_type.clone(),
        headers,
        body,
        status: reply.status(),
        at,
    });
    Ok(reply.into_response())
}

enum Reply {
    Full {
        status: u16,
        content_type: &'static str,
        body: Bytes,
    },
    Watch(Box<WatchStream>),
}

impl Reply {
    fn json(status: u16, value: &Value) -> Self {
        Reply::Full {
            status,
            content_type: JSON,
            body: Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
        }
    }

    /// Answers successful object replies as `PartialObjectMetadata(List)`.
    fn into_partial(self) -> Self {
        match self {
            Reply::Full {
                status,
                content_type: JSON,
                body,
            } if status < 300 => match serde_json::from_slice::<Value>(&body) {
                Ok(v) => Reply::json(status, &partial_metadata(&v)),
                Err(_) => Reply::Full {
                    status,
                    content_type: JSON,
                    body,
                },
            },
            Reply::Watch(mut ws) => {
                ws.metadata_only = true;
                ws.pending = ws
                    .pending
                    .iter()
                    .map(|line| match serde_json::from_slice::<Value>(line) {
                        Ok(ev) => WatchStream::partial_line(&ev),
                        Err(_) => line.clone(),
                    })
                    .collect();
                Reply::Watch(ws)
            }
            other => other,
        }
    }

    fn status(&self) -> u16 {
        match self {
            Reply::Full { status, .. } => *status,
            Reply::Watch(_) => 200,
        }
    }

    fn into_response(self) -> Response<Body> {
        let (status, content_type, body) = match self {
            Reply::Full {
                status,
                content_type,
                body,
            } => (status, content_type, Full::new(body).boxed_unsync()),
            Reply::Watch(stream) => (200, JSON, StreamBody::new(stream.into_stream()).boxed_unsync()),
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }
}

impl From<ApiError> for Reply {
    fn from(err: ApiError) -> Self {
        Reply::json(err.code, &err.to_status())
    }
}

/// A failure answered as a metav1 `Status`, which kube-rs turns into `kube::Error::Api`.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

impl ApiError {
    fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason_for(code),
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    fn path_not_found() -> Self {
        Self::new(404, "the server could not find the requested resource").with_details(json!({}))
    }

    fn method_not_allowed() -> Self {
        Self::new(
            405,
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(404, format!("{} \"{name}\" not found", def.qualified())).with_details(def.details(name))
    }

    fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, format!("namespaces \"{ns}\" not found"))
            .with_details(json!({"name": ns, "kind": "namespaces"}))
    }

    fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self {
            reason: "AlreadyExists",
            ..Self::new(409, format!("{} \"{name}\" already exists", def.qualified()))
                .with_details(def.details(name))
        }
    }

    fn conflict(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                def.qualified()
            ),
        )
        .with_details(def.details(name))
    }

    fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        status
    }
}

// ===================== routing =====================

fn route(shared: &Arc<Shared>, ctx: &Ctx, path: &str) -> Result<Reply, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let discovery = |reply: Reply| {
        if ctx.method == Method::GET {
            Ok(reply)
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    match segs.as_slice() {
        ["healthz" | "readyz" | "livez"] => discovery(Reply::Full {
            status: 200,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from_static(b"ok"),
        }),
        ["version"] => discovery(Reply::json(200, &version_info())),
        ["api"] => {
            let st = shared.lock();
            discovery(if ctx.wants_aggregated() {
                aggregated(&st.defs, true)
            } else {
                Reply::json(
                    200,
                    &json!({
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}
                        ],
                    }),
                )
            })
        }
        ["apis"] => {
            let st = shared.lock();
            discovery(if ctx.wants_aggregated() {
                aggregated(&st.defs, false)
            } else {
                let groups: Vec<Value> = served_groups(&st.defs)
                    .iter()
                    .map(|(g, vs)| api_group(g, vs))
                    .collect();
                Reply::json(
                    200,
                    &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
                )
            })
        }
        ["api", version] => {
            let st = shared.lock();
            discovery(resource_list(&st.defs, "", version)?)
        }
        ["apis", group] => {
            let st = shared.lock();
            let groups = served_groups(&st.defs);
            let (g, vs) = groups
                .iter()
                .find(|(g, _)| g == group)
                .ok_or_else(ApiError::path_not_found)?;
            let mut body = api_group(g, vs);
            if let Some(map) = body.as_object_mut() {
                map.insert("kind".into(), json!("APIGroup"));
                map.insert("apiVersion".into(), json!("v1"));
            }
            discovery(Reply::json(200, &body))
        }
        ["apis", group, version] => {
            let st = shared.lock();
            discovery(resource_list(&st.defs, group, version)?)
        }
        ["api", "v1", "nodes", node, "proxy", "configz"] if ctx.method == Method::GET => {
            node_configz(&shared.lock(), node)
        }
        ["api", version, rest @ ..] => resource_request(shared, ctx, "", version, rest),
        ["apis", group, version, rest @ ..] => resource_request(shared, ctx, group, version, rest),
        _ => Err(ApiError::path_not_found()),
    }
}

/// `GET /api/v1/nodes/NODE/proxy/configz`: the kubelet's answer, through the API server.
fn node_configz(st: &State, node: &str) -> Result<Reply, ApiError> {
    let def = st.def_for("v1", "Node").ok_or_else(ApiError::path_not_found)?;
    if !st.objects.contains_key(&ObjKey::new("v1", "Node", "", node)) {
        return Err(ApiError::not_found(def, node));
    }
    match st.node_configz.get(node) {
        Some(config) => Ok(Reply::json(200, &json!({ "kubeletconfig": config }))),
        None => Err(ApiError::new(
            503,
            format!("error trying to reach service: dial tcp {node}:10250: connect: connection refused"),
        )),
    }
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.0-numaplane-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Served non-core groups with their versions, in first-registration order.
fn served_groups(defs: &[ResourceDef]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for def in defs.iter().filter(|d| d.served && !d.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == def.group) {
            Some((_, versions)) => {
                if !versions.contains(&def.version) {
                    versions.push(def.version.clone());
                }
            }
            None => groups.push((def.group.clone(), vec![def.version.clone()])),
        }
    }
    groups
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv),
    })
}

fn resource_list(defs: &[ResourceDef], group: &str, version: &str) -> Result<Reply, ApiError> {
    let defs: Vec<&ResourceDef> = defs
        .iter()
        .filter(|d| d.served && d.group == group && d.version == version)
        .collect();
    let first = defs.first().ok_or_else(ApiError::path_not_found)?;
    let mut resources = Vec::new();
    for def in &defs {
        let mut entry = json!({
            "name": def.plural,
            "singularName": def.singular,
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": VERBS,
        });
        if !def.short_names.is_empty()
            && let Some(map) = entry.as_object_mut()
        {
            map.insert("shortNames".into(), json!(def.short_names));
        }
        resources.push(entry);
        if def.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", def.plural),
                "singularName": "",
                "namespaced": def.namespaced,
                "kind": def.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    Ok(Reply::json(
        200,
        &json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": first.api_version(),
            "resources": resources,
        }),
    ))
}

fn aggregated(defs: &[ResourceDef], core: bool) -> Reply {
    /// group → version → resource entries, in registration order.
    type Versions = Vec<(String, Vec<Value>)>;
    let mut groups: Vec<(String, Versions)> = Vec::new();
    for def in defs.iter().filter(|d| d.served && d.group.is_empty() == core) {
        let gvk = json!({"group": def.group, "version": def.version, "kind": def.kind});
        let mut resource = json!({
            "resource": def.plural,
            "responseKind": gvk,
            "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": def.singular,
            "verbs": VERBS,
            "shortNames": def.short_names,
        });
        if def.status_subresource
            && let Some(map) = resource.as_object_mut()
        {
            map.insert(
                "subresources".into(),
                json!([{"subresource": "status", "responseKind": gvk, "verbs": STATUS_VERBS}]),
            );
        }
        let group = match groups.iter_mut().position(|(g, _)| *g == def.group) {
            Some(i) => &mut groups[i].1,
            None => {
                groups.push((def.group.clone(), Vec::new()));
                let last = groups.len() - 1;
                &mut groups[last].1
            }
        };
        match group.iter_mut().find(|(v, _)| *v == def.version) {
            Some((_, resources)) => resources.push(resource),
            None => group.push((def.version.clone(), vec![resource])),
        }
    }
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            json!({
                "metadata": {"name": name},
                "versions": versions.into_iter().map(|(v, resources)| json!({
                    "version": v,
                    "resources": resources,
                    "freshness": "Current",
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Reply::Full {
        status: 200,
        content_type: AGGREGATED_DISCOVERY,
        body: Bytes::from(
            serde_json::to_vec(&json!({
                "kind": "APIGroupDiscoveryList",
                "apiVersion": "apidiscovery.k8s.io/v2",
                "metadata": {},
                "items": items,
            }))
            .unwrap_or_default(),
        ),
    }
}

/// A parsed resource URL.
struct Target {
    def: ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn key(&self, name: &str) -> ObjKey {
        ObjKey::new(
            &self.def.api_version(),
            &self.def.kind,
            self.namespace.as_deref().unwrap_or(""),
            name,
        )
    }

    fn in_scope(&self, key: &ObjKey) -> bool {
        key.api_version == self.def.api_version()
            && key.kind == self.def.kind
            && self.namespace.as_ref().is_none_or(|ns| key.namespace == *ns)
    }
}

/// Maps `[watch/][namespaces/NS/]PLURAL[/NAME[/SUB]]` to a served resource; also whether the
/// legacy `/watch/` prefix was used.
fn parse_target(defs: &[ResourceDef], group: &str, version: &str, rest: &[&str]) -> Option<(Target, bool)> {
    let (watch, rest) = match rest.split_first() {
        Some((&"watch", tail)) => (true, tail),
        _ => (false, rest),
    };
    let find = |plural: &str| {
        defs.iter()
            .find(|d| d.served && d.group == group && d.version == version && d.plural == plural)
    };
    let owned = |s: Option<&&str>| s.map(|s| (*s).to_owned());
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && tail.len() <= 2
        && let Some(def) = find(plural).filter(|d| d.namespaced)
    {
        return Some((
            Target {
                def: def.clone(),
                namespace: Some((*ns).to_owned()),
                name: owned(tail.first()),
                sub: owned(tail.get(1)),
            },
            watch,
        ));
    }
    let (plural, tail) = rest.split_first()?;
    let def = find(plural)?;
    if tail.len() > 2 || (def.namespaced && !tail.is_empty()) {
        return None;
    }
    Some((
        Target {
            def: def.clone(),
            namespace: None,
            name: owned(tail.first()),
            sub: owned(tail.get(1)),
        },
        watch,
    ))
}

fn resource_request(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Reply, ApiError> {
    // A group no served resource belongs to (a CRD not installed) is not routed at all: the real
    // server's mux answers a plain-text 404, not a Status.
    if !group.is_empty()
        && !shared
            .lock()
            .defs
            .iter()
            .any(|d| d.served && d.group == group && d.version == version)
    {
        return Ok(Reply::Full {
            status: 404,
            content_type: TEXT,
            body: Bytes::from_static(b"404 page not found\n"),
        });
    }
    let (target, watch_path) = {
        let st = shared.lock();
        parse_target(&st.defs, group, version, rest)
    }
    .ok_or_else(ApiError::path_not_found)?;
    let reply = resource_verb(shared, ctx, target, watch_path)?;
    Ok(if ctx.metadata_only() {
        reply.into_partial()
    } else {
        reply
    })
}

/// The verb of `ctx` on `target` (`watch_path`: the URL had the legacy `/watch/` prefix).
fn resource_verb(
    shared: &Arc<Shared>,
    ctx: &Ctx,
    target: Target,
    watch_path: bool,
) -> Result<Reply, ApiError> {
    let status_only = match target.sub.as_deref() {
        None => false,
        Some("status") if target.def.status_subresource => true,
        Some("binding") if target.def.kind == "Pod" && ctx.method == Method::POST => {
            let name = target.name.clone().ok_or_else(ApiError::path_not_found)?;
            let body = ctx.json_body()?;
            return shared.mutate(|st| st.bind(&target, &name, &body));
        }
        Some(_) => return Err(ApiError::path_not_found()),
    };
    let selectors = Selectors::parse(ctx.param("fieldSelector"), ctx.param("labelSelector"))?;
    if let Some(f) = selectors
        .fields
        .iter()
        .find(|f| !supported_field_label(&target.def, &f.path))
    {
        return Err(ApiError::bad_request(format!(
            "field label not supported: {}",
            f.path
        )));
    }
    let name = target.name.clone();
    match (&ctx.method, name) {
        (&Method::GET, name) if watch_path || ctx.flag("watch") => {
            let mut selectors = selectors;
            if let Some(name) = name {
                selectors.fields.push(FieldReq {
                    path: "metadata.name".into(),
                    value: name,
                    equal: true,
                });
            }
            start_watch(shared, ctx, &target, selectors)
        }
        (&Method::GET, Some(name)) => shared.lock().get_item(&target, &name),
        (&Method::GET, None) => Ok(shared.lock().list(&target, &selectors)),
        (&Method::POST, None) => {
            let body = ctx.json_body()?;
            shared.mutate(|st| st.create(&target, body))
        }
        (&Method::PUT, Some(name)) => {
            let body = ctx.json_body()?;
            shared.mutate(|st| st.replace(&target, &name, body, status_only))
        }
        (&Method::PATCH, Some(name)) => shared.mutate(|st| st.patch(&target, &name, ctx, status_only)),
        (&Method::DELETE, Some(name)) if !status_only => {
            shared.mutate(|st| st.delete(&target, &name, &ctx.body))
        }
        (&Method::DELETE, None) => shared.mutate(|st| st.delete_collection(&target, &selectors)),
        _ => Err(ApiError::method_not_allowed()),
    }
}

// ===================== verbs =====================

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

impl State {
    fn get_item(&self, t: &Target, name: &str) -> Result<Reply, ApiError> {
        self.objects
            .get(&t.key(name))
            .map(|obj| Reply::json(200, obj))
            .ok_or_else(|| ApiError::not_found(&t.def, name))
    }

    fn list_value(&self, t: &Target, items: Vec<Value>) -> Value {
        json!({
            "kind": format!("{}List", t.def.kind),
            "apiVersion": t.def.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        })
    }

    fn list(&self, t: &Target, selectors: &Selectors) -> Reply {
        let mut items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, obj)| t.in_scope(k) && selectors.matches(obj))
            .map(|(_, obj)| obj.clone())
            .collect();
        // One storage behind both Event APIs, as in kube-apiserver: `kubectl describe` lists
        // core/v1 Events and finds those written through events.k8s.io/v1.
        if t.def.group.is_empty() && t.def.kind == "Event" {
            items.extend(
                self.objects
                    .iter()
                    .filter(|(k, _)| {
                        k.api_version == "events.k8s.io/v1"
                            && k.kind == "Event"
                            && t.namespace.as_ref().is_none_or(|ns| k.namespace == *ns)
                    })
                    .map(|(_, obj)| core_event_view(obj))
                    .filter(|obj| selectors.matches(obj)),
            );
        }
        Reply::json(200, &self.list_value(t, items))
    }

    /// Fills or checks apiVersion/kind against the URL, as the server's decoder does.
    fn check_type(def: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
        let map = obj
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
        for (field, expected) in [("apiVersion", def.api_version()), ("kind", def.kind.clone())] {
            match map.get(field).and_then(Value::as_str) {
                None | Some("") => {
                    map.insert(field.into(), Value::String(expected));
                }
                Some(got) if got == expected => {}
                Some(got) => {
                    return Err(ApiError::bad_request(format!(
                        "the {field} in the data ({got}) does not match the expected {field} ({expected})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Sets the name from the URL when absent; rejects a different one.
    fn check_name(obj: &mut Value, name: &str) -> Result<(), ApiError> {
        match str_at(obj, &["metadata", "name"]) {
            "" => {
                set_meta(obj, "name", Value::String(name.to_owned()));
                Ok(())
            }
            got if got == name => Ok(()),
            got => Err(ApiError::bad_request(format!(
                "the name of the object ({got}) does not match the name on the URL ({name})"
            ))),
        }
    }

    /// Sets/validates `metadata.namespace` from the URL; the namespace must exist on create.
    fn check_namespace(&self, t: &Target, obj: &mut Value) -> Result<(), ApiError> {
        if !t.def.namespaced {
            remove_meta(obj, "namespace");
            return Ok(());
        }
        let ns = t.namespace.clone().ok_or_else(ApiError::method_not_allowed)?;
        match str_at(obj, &["metadata", "namespace"]) {
            "" => set_meta(obj, "namespace", Value::String(ns.clone())),
            got if got == ns => {}
            _ => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if !self.namespace_exists(&ns) {
            return Err(ApiError::namespace_not_found(&ns));
        }
        Ok(())
    }

    fn create(&mut self, t: &Target, mut obj: Value) -> Result<Reply, ApiError> {
        Self::check_type(&t.def, &mut obj)?;
        if str_at(&obj, &["metadata", "name"]).is_empty() {
            let prefix = str_at(&obj, &["metadata", "generateName"]).to_owned();
            if prefix.is_empty() {
                return Err(ApiError::new(
                    422,
                    format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        t.def.kind
                    ),
                ));
            }
            set_meta(&mut obj, "name", Value::String(generated_name(&prefix)));
        }
        self.check_namespace(t, &mut obj)?;
        for field in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
            remove_meta(&mut obj, field);
        }
        let key = ObjKey::of(&obj);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&t.def, &key.name));
        }
        admit(&t.def, &mut obj, true)?;
        Ok(Reply::json(201, &self.store_create(key, obj)))
    }

    fn existing(&self, t: &Target, name: &str) -> Result<(ObjKey, Value), ApiError> {
        let key = t.key(name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&t.def, name))?;
        Ok((key, old))
    }

    /// 409 when the body names a resourceVersion other than the stored one.
    fn check_precondition(t: &Target, old: &Value, body: &Value) -> Result<(), ApiError> {
        match str_at(body, &["metadata", "resourceVersion"]) {
            "" => Ok(()),
            rv if rv == str_at(old, &["metadata", "resourceVersion"]) => Ok(()),
            _ => Err(ApiError::conflict(&t.def, str_at(old, &["metadata", "name"]))),
        }
    }

    /// Applies the subresource rules: `/status` writes change only status; main-resource
    /// writes keep the stored status when the kind has a status subresource.
    fn scope_write(t: &Target, old: &Value, mut new: Value, status_only: bool) -> Value {
        if status_only {
            let mut scoped = old.clone();
            copy_key(&mut scoped, &new, "status");
            scoped
        } else {
            if t.def.status_subresource {
                copy_key(&mut new, old, "status");
            }
            new
        }
    }

    /// `POST pods/NAME/binding`, as the real server: 201 with a Status; `spec.nodeName` and the
    /// Binding's annotations land on the pod in one write; 409 `Conflict` when the Binding's
    /// `metadata.uid` is not the pod's (checked first: a storage precondition, `details.kind`
    /// `pods`), when the pod is bound already, or when it has scheduling gates (both
    /// `details.kind` `pods/binding`); the target node is not checked.
    fn bind(&mut self, t: &Target, name: &str, binding: &Value) -> Result<Reply, ApiError> {
        let (key, old) = self.existing(t, name)?;
        let node = str_at(binding, &["target", "name"]).to_owned();
        if node.is_empty() {
            return Err(ApiError::new(400, "Binding.target.name: Required value"));
        }
        let want_uid = str_at(binding, &["metadata", "uid"]);
        let have_uid = str_at(&old, &["metadata", "uid"]);
        if !want_uid.is_empty() && want_uid != have_uid {
            let ns = str_at(&old, &["metadata", "namespace"]);
            return Err(ApiError::new(
                409,
                format!(
                    "Operation cannot be fulfilled on pods \"{name}\": StorageError: invalid object, \
                     Code: 4, Key: /registry/pods/{ns}/{name}, ResourceVersion: 0, AdditionalErrorMsg: \
                     Precondition failed: UID in precondition: {want_uid}, UID in object meta: {have_uid}"
                ),
            )
            .with_details(json!({"name": name, "kind": "pods"})));
        }
        let conflict = |why: String| {
            ApiError::new(
                409,
                format!("Operation cannot be fulfilled on pods/binding \"{name}\": {why}"),
            )
            .with_details(json!({"name": name, "kind": "pods/binding"}))
        };
        let bound = str_at(&old, &["spec", "nodeName"]);
        if !bound.is_empty() {
            return Err(conflict(format!(
                "pod {name} is already assigned to node \"{bound}\""
            )));
        }
        let gated = old
            .pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .is_some_and(|g| !g.is_empty());
        if gated {
            return Err(conflict(format!(
                "pod {name} has non-empty .spec.schedulingGates"
            )));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = Value::String(node);
        if let Some(annotations) = binding
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
        {
            let meta = &mut new["metadata"];
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            for (k, v) in annotations {
                meta["annotations"][k] = v.clone();
            }
        }
        *self.bindings.entry(have_uid.to_owned()).or_default() += 1;
        self.store_update(key, &old, new, true);
        Ok(Reply::json(
            201,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ))
    }

    fn replace(
        &mut self,
        t: &Target,
        name: &str,
        mut obj: Value,
        status_only: bool,
    ) -> Result<Reply, ApiError> {
        Self::check_type(&t.def, &mut obj)?;
        Self::check_name(&mut obj, name)?;
        self.check_namespace(t, &mut obj)?;
        let (key, old) = self.existing(t, name)?;
        Self::check_precondition(t, &old, &obj)?;
        if meta_get(&obj, "managedFields").is_none() {
            match meta_get(&old, "managedFields") {
                Some(mf) => set_meta(&mut obj, "managedFields", mf.clone()),
                None => remove_meta(&mut obj, "managedFields"),
            }
        }
        let mut new = Self::scope_write(t, &old, obj, status_only);
        admit(&t.def, &mut new, false)?;
        Ok(Reply::json(200, &self.store_update(key, &old, new, false)))
    }

    fn patch(&mut self, t: &Target, name: &str, ctx: &Ctx, status_only: bool) -> Result<Reply, ApiError> {
        let media = ctx
            .content_type
            .as_deref()
            .and_then(|ct| ct.split(';').next())
            .map(|ct| ct.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if media == APPLY {
            return self.apply(t, name, ctx, status_only);
        }
        if ![MERGE, STRATEGIC, JSON_PATCH].contains(&media.as_str()) {
            return Err(ApiError::new(
                415,
                format!(
                    "the body of the request was in an unknown format - accepted media types include: {JSON_PATCH}, {MERGE}, {APPLY}, {STRATEGIC}"
                ),
            ));
        }
        let (key, old) = self.existing(t, name)?;
        let patch = ctx.json_body()?;
        let mut new = old.clone();
        if media == JSON_PATCH {
            apply_json_patch(&mut new, &patch).map_err(|msg| ApiError::new(422, msg))?;
        } else if media == STRATEGIC {
            Self::check_precondition(t, &old, &patch)?;
            strategic_merge_patch(&mut new, &patch, &t.def.kind, "");
        } else {
            Self::check_precondition(t, &old, &patch)?;
            merge_patch(&mut new, &patch);
        }
        // Identity fields are immutable through patches.
        copy_key(&mut new, &old, "apiVersion");
        copy_key(&mut new, &old, "kind");
        for field in ["name", "namespace", "uid", "creationTimestamp"] {
            match meta_get(&old, field) {
                Some(v) => set_meta(&mut new, field, v.clone()),
                None => remove_meta(&mut new, field),
            }
        }
        let mut new = Self::scope_write(t, &old, new, status_only);
        release_changed_fields(&old, &mut new);
        admit(&t.def, &mut new, false)?;
        Ok(Reply::json(200, &self.store_update(key, &old, new, false)))
    }

    fn apply(&mut self, t: &Target, name: &str, ctx: &Ctx, status_only: bool) -> Result<Reply, ApiError> {
        let manager = ctx.param("fieldManager").filter(|m| !m.is_empty()).ok_or_else(|| {
            ApiError::new(
                422,
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            )
        })?;
        let force = ctx.flag("force");
        let mut applied: Value = match serde_json::from_slice(&ctx.body) {
            Ok(v) => v,
            Err(_) => serde_saphyr::from_str(&String::from_utf8_lossy(&ctx.body))
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        };
        Self::check_type(&t.def, &mut applied)?;
        Self::check_name(&mut applied, name)?;
        self.check_namespace(t, &mut applied)?;
        if meta_get(&applied, "managedFields").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        if status_only {
            if let Some(map) = applied.as_object_mut() {
                map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
            }
        } else if t.def.status_subresource
            && let Some(map) = applied.as_object_mut()
        {
            map.remove("status");
        }
        let api_version = t.def.api_version();
        let applied_set = applied_fields(&applied);
        let key = t.key(name);
        let Some(old) = self.objects.get(&key).cloned() else {
            if status_only {
                return Err(ApiError::not_found(&t.def, name));
            }
            let mut obj = applied;
            for field in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
                remove_meta(&mut obj, field);
            }
            let entry = managed_entry(manager, &api_version, &rfc3339_now(), &applied_set);
            set_meta(&mut obj, "managedFields", json!([entry]));
            admit(&t.def, &mut obj, true)?;
            return Ok(Reply::json(201, &self.store_create(key, obj)));
        };
        Self::check_precondition(t, &old, &applied)?;

        let entries: Vec<Value> = meta_get(&old, "managedFields")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let is_mine = |e: &Value| str_at(e, &["manager"]) == manager && str_at(e, &["operation"]) == "Apply";
        let mut my_old = FieldSet::new();
        let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
        for entry in &entries {
            let set = fieldset_from_v1(entry.get("fieldsV1"));
            if is_mine(entry) {
                my_old.extend(set);
                continue;
            }
            for path in set.intersection(&applied_set) {
                if value_at(&old, path) != value_at(&applied, path) {
                    conflicts.push((str_at(entry, &["manager"]).to_owned(), path.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(apply_conflict(&t.def, name, &conflicts));
        }

        // Managers: others lose the fields taken over by force; mine is replaced in place.
        let mut new_entries = Vec::new();
        let mut others = FieldSet::new();
        let mut my_slot: Option<(usize, String)> = None;
        for entry in entries {
            if is_mine(&entry) {
                if my_slot.is_none() {
                    my_slot = Some((new_entries.len(), str_at(&entry, &["time"]).to_owned()));
                }
                continue;
            }
            let entry_manager = str_at(&entry, &["manager"]).to_owned();
            let lost: FieldSet = conflicts
                .iter()
                .filter(|(m, _)| *m == entry_manager)
                .map(|(_, p)| p.clone())
                .collect();
            if lost.is_empty() {
                others.extend(fieldset_from_v1(entry.get("fieldsV1")));
                new_entries.push(entry);
                continue;
            }
            let kept: FieldSet = fieldset_from_v1(entry.get("fieldsV1"))
                .difference(&lost)
                .cloned()
                .collect();
            if kept.is_empty() {
                continue;
            }
            let mut entry = entry;
            if let Some(map) = entry.as_object_mut() {
                map.insert("fieldsV1".into(), fieldset_to_v1(&kept));
            }
            others.extend(kept);
            new_entries.push(entry);
        }

        let mut new = old.clone();
        for path in my_old.difference(&applied_set) {
            if !others.contains(path) {
                remove_path(&mut new, path);
            }
        }
        for path in &applied_set {
            if let Some(v) = value_at(&applied, path) {
                set_path(&mut new, path, v.clone());
            }
        }
        let (slot, old_time) = my_slot.unwrap_or((new_entries.len(), rfc3339_now()));
        new_entries.insert(
            slot,
            managed_entry(manager, &api_version, &old_time, &applied_set),
        );
        set_meta(&mut new, "managedFields", Value::Array(new_entries.clone()));
        if new == old {
            // No-op apply: the real server does not write, so no new resourceVersion.
            return Ok(Reply::json(200, &old));
        }
        new_entries[slot] = managed_entry(manager, &api_version, &rfc3339_now(), &applied_set);
        set_meta(&mut new, "managedFields", Value::Array(new_entries));
        admit(&t.def, &mut new, false)?;
        Ok(Reply::json(200, &self.store_update(key, &old, new, false)))
    }

    fn delete(&mut self, t: &Target, name: &str, body: &Bytes) -> Result<Reply, ApiError> {
        let (key, old) = self.existing(t, name)?;
        if let Ok(opts) = serde_json::from_slice::<Value>(body) {
            for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
                let want = str_at(&opts, &["preconditions", field]);
                let have = str_at(&old, &["metadata", field]);
                if !want.is_empty() && want != have {
                    return Err(ApiError::new(
                        409,
                        format!(
                            "Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
                        ),
                    )
                    .with_details(t.def.details(name)));
                }
            }
        }
        let deleted = self
            .store_delete(&key)
            .ok_or_else(|| ApiError::not_found(&t.def, name))?;
        Ok(Reply::json(200, &deleted))
    }

    fn delete_collection(&mut self, t: &Target, selectors: &Selectors) -> Result<Reply, ApiError> {
        let keys: Vec<ObjKey> = self
            .objects
            .iter()
            .filter(|(k, obj)| t.in_scope(k) && selectors.matches(obj))
            .map(|(k, _)| k.clone())
            .collect();
        let items: Vec<Value> = keys.iter().filter_map(|k| self.store_delete(k)).collect();
        Ok(Reply::json(200, &self.list_value(t, items)))
    }
}

fn copy_key(into: &mut Value, from: &Value, key: &str) {
    if let Some(map) = into.as_object_mut() {
        match from.get(key) {
            Some(v) => {
                map.insert(key.to_owned(), v.clone());
            }
            None => {
                map.remove(key);
            }
        }
    }
}

fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Map<String, Value> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    strip(old) != strip(new)
}

// ===================== server-side apply field ownership =====================

/// A field path at the granularity the fake tracks: `["zones"]`, `["metadata","labels","k"]`.
type FieldPath = Vec<String>;
type FieldSet = BTreeSet<FieldPath>;

/// Fields an applied configuration sets.
fn applied_fields(obj: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return set;
    };
    for (key, value) in map {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for (field, inner) in value.as_object().into_iter().flatten() {
                    match field.as_str() {
                        "labels" | "annotations" => {
                            for k in inner.as_object().into_iter().flatten().map(|(k, _)| k) {
                                set.insert(vec!["metadata".into(), field.clone(), k.clone()]);
                            }
                        }
                        "ownerReferences" | "finalizers" => {
                            set.insert(vec!["metadata".into(), field.clone()]);
                        }
                        _ => {}
                    }
                }
            }
            _ => {
                set.insert(vec![key.clone()]);
            }
        }
    }
    set
}

fn fieldset_to_v1(set: &FieldSet) -> Value {
    fn insert(map: &mut Map<String, Value>, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let entry = map
            .entry(format!("f:{first}"))
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Some(child) = entry.as_object_mut() {
            insert(child, rest);
        }
    }
    let mut root = Map::new();
    for path in set {
        insert(&mut root, path);
    }
    Value::Object(root)
}

/// Reads `fieldsV1` back, truncating deeper paths (from other writers) to the tracked granularity.
fn fieldset_from_v1(v: Option<&Value>) -> FieldSet {
    fn walk(v: &Value, prefix: &mut Vec<String>, out: &mut FieldSet) {
        let mut descended = false;
        for (k, child) in v.as_object().into_iter().flatten() {
            if let Some(seg) = k.strip_prefix("f:") {
                descended = true;
                prefix.push(seg.to_owned());
                walk(child, prefix, out);
                prefix.pop();
            }
        }
        if !descended && let Some(path) = normalize_path(prefix) {
            out.insert(path);
        }
    }
    let mut out = FieldSet::new();
    if let Some(v) = v {
        walk(v, &mut Vec::new(), &mut out);
    }
    out
}

fn normalize_path(path: &[String]) -> Option<FieldPath> {
    let first = path.first()?;
    if first != "metadata" {
        return Some(vec![first.clone()]);
    }
    let second = path.get(1)?;
    let len = if matches!(second.as_str(), "labels" | "annotations") {
        path.len().min(3)
    } else {
        2
    };
    Some(path[..len].to_vec())
}

fn managed_entry(manager: &str, api_version: &str, time: &str, set: &FieldSet) -> Value {
    json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fieldset_to_v1(set),
    })
}

fn apply_conflict(def: &ResourceDef, name: &str, conflicts: &[(String, FieldPath)]) -> ApiError {
    let field = |p: &FieldPath| format!(".{}", p.join("."));
    let lines: Vec<String> = conflicts
        .iter()
        .map(|(m, p)| format!("conflict with \"{m}\": {}", field(p)))
        .collect();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": field(p)})
        })
        .collect();
    // The real server's conflict names no object: its details hold the causes only.
    let _ = (def, name);
    let details = json!({"causes": causes});
    ApiError::new(
        409,
        format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            lines.join("\n")
        ),
    )
    .with_details(details)
}

fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |cur, seg| cur.get(seg))
}

fn set_path(obj: &mut Value, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *obj = value;
        return;
    };
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    if let Some(map) = obj.as_object_mut() {
        let child = map.entry(first.clone()).or_insert(Value::Null);
        set_path(child, rest, value);
    }
}

fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = &mut *obj;
    for seg in parents {
        match cur.get_mut(seg) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(map) = cur.as_object_mut() {
        map.remove(last);
    }
    // Drop a labels/annotations map emptied by the removal.
    if path.len() == 3
        && let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        && meta
            .get(&path[1])
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
    {
        meta.remove(&path[1]);
    }
}

// ===================== patches =====================

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(map) = target.as_object_mut() {
        for (k, v) in patch {
            if v.is_null() {
                map.remove(k);
            } else {
                merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// RFC 6902 JSON patch (add, remove, replace, move, copy, test).
fn apply_json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or_else(|| "a JSON patch must be an array of operations".to_owned())?;
    for op in ops {
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("missing path in {op}"))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("missing value in {op}"))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("missing from in {op}"))
        };
        match op.get("op").and_then(Value::as_str) {
            Some("add") => pointer_add(doc, path, value()?)?,
            Some("remove") => {
                pointer_remove(doc, path)?;
            }
            Some("replace") => {
                pointer_remove(doc, path)?;
                pointer_add(doc, path, value()?)?;
            }
            Some("move") => {
                let v = pointer_remove(doc, from()?)?;
                pointer_add(doc, path, v)?;
            }
            Some("copy") => {
                let v = doc
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| format!("copy: no value at {}", from().unwrap_or("")))?;
                pointer_add(doc, path, v)?;
            }
            Some("test") => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(format!("test failed at {path}"));
                }
            }
            other => return Err(format!("unsupported JSON patch op {other:?}")),
        }
    }
    Ok(())
}

fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let idx = path
        .rfind('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    let token = path[idx + 1..].replace("~1", "/").replace("~0", "~");
    Ok((&path[..idx], token))
}

fn pointer_add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, token) = split_pointer(path)?;
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(token, value);
            Ok(())
        }
        Some(Value::Array(items)) => {
            let idx = if token == "-" {
                items.len()
            } else {
                token
                    .parse::<usize>()
                    .map_err(|_| format!("invalid array index in {path}"))?
            };
            if idx > items.len() {
                return Err(format!("array index out of bounds in {path}"));
            }
            items.insert(idx, value);
            Ok(())
        }
        _ => Err(format!("no container at {parent:?} for {path}")),
    }
}

fn pointer_remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, token) = split_pointer(path)?;
    let removed = match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&token),
        Some(Value::Array(items)) => match token.parse::<usize>() {
            Ok(i) if i < items.len() => Some(items.remove(i)),
            _ => None,
        },
        _ => None,
    };
    removed.ok_or_else(|| format!("no value at {path}"))
}

// ===================== selectors =====================

#[derive(Clone, Debug, Default)]
struct Selectors {
    fields: Vec<FieldReq>,
    labels: Vec<LabelReq>,
}

#[derive(Clone, Debug)]
struct FieldReq {
    path: String,
    value: String,
    equal: bool,
}

#[derive(Clone, Debug)]
enum LabelReq {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Selectors {
    fn parse(fields: Option<&str>, labels: Option<&str>) -> Result<Self, ApiError> {
        let invalid =
            |p: &str| ApiError::bad_request(format!("invalid selector: '{p}'; can't understand '{p}'"));
        let mut out = Selectors::default();
        for part in fields
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (path, value, equal) = if let Some((a, b)) = part.split_once("!=") {
                (a, b, false)
            } else if let Some((a, b)) = part.split_once("==") {
                (a, b, true)
            } else if let Some((a, b)) = part.split_once('=') {
                (a, b, true)
            } else {
                return Err(invalid(part));
            };
            out.fields.push(FieldReq {
                path: path.trim().to_owned(),
                value: value.trim().to_owned(),
                equal,
            });
        }
        for part in split_top_level(labels.unwrap_or(""))
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            out.labels
                .push(parse_label_req(part).ok_or_else(|| invalid(part))?);
        }
        Ok(out)
    }

    fn matches(&self, obj: &Value) -> bool {
        let fields_ok = self
            .fields
            .iter()
            .all(|f| (field_value(obj, &f.path) == f.value) == f.equal);
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        fields_ok
            && self.labels.iter().all(|req| match req {
                LabelReq::Equals(k, v) => label(k) == Some(v.as_str()),
                LabelReq::NotEquals(k, v) => label(k) != Some(v.as_str()),
                LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::Exists(k) => label(k).is_some(),
                LabelReq::NotExists(k) => label(k).is_none(),
            })
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_label_req(p: &str) -> Option<LabelReq> {
    let owned = |s: &str| s.trim().to_owned();
    if let Some(open) = p.find('(') {
        let head = p[..open].trim();
        let inner = p[open + 1..].trim_end().strip_suffix(')')?;
        let values: Vec<String> = inner
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect();
        return if let Some(k) = head.strip_suffix(" notin") {
            Some(LabelReq::NotIn(owned(k), values))
        } else {
            head.strip_suffix(" in").map(|k| LabelReq::In(owned(k), values))
        };
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Some(LabelReq::NotEquals(owned(k), owned(v)));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Some(LabelReq::Equals(owned(k), owned(v)));
    }
    if let Some(k) = p.strip_prefix('!') {
        return Some(LabelReq::NotExists(owned(k)));
    }
    (!p.contains(char::is_whitespace)).then(|| LabelReq::Exists(owned(p)))
}

/// An events.k8s.io/v1 Event as core/v1 shows it (the apiserver's conversion:
/// `regarding` → `involvedObject`, `note` → `message`, `reportingController` →
/// `reportingComponent`, `deprecated*` → their core names).
fn core_event_view(obj: &Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!("Event"));
    let renames = [
        ("metadata", "metadata"),
        ("regarding", "involvedObject"),
        ("related", "related"),
        ("note", "message"),
        ("reason", "reason"),
        ("type", "type"),
        ("action", "action"),
        ("eventTime", "eventTime"),
        ("series", "series"),
        ("reportingController", "reportingComponent"),
        ("reportingInstance", "reportingInstance"),
        ("deprecatedSource", "source"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
    ];
    for (from, to) in renames {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// A dotted path's value as the selector compares it; missing fields read as "".
fn field_value(obj: &Value, path: &str) -> String {
    match path.split('.').try_fold(obj, |cur, seg| cur.get(seg)) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

// ===================== per-kind rules =====================

/// Field labels a real server accepts in `fieldSelector`, per kind (others: 400
/// `field label not supported: X`). From the registries of kube-apiserver v1.36.
fn supported_field_label(def: &ResourceDef, label: &str) -> bool {
    const EVENT: &[&str] = &[
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ];
    if matches!(label, "metadata.name" | "metadata.namespace") {
        return true;
    }
    let extra: &[&str] = match (def.group.as_str(), def.kind.as_str()) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["spec.unschedulable"],
        ("resource.k8s.io", "ResourceSlice") => &["spec.nodeName", "spec.driver"],
        ("", "Namespace") => &["status.phase"],
        ("", "Event") | ("events.k8s.io", "Event") => EVENT,
        _ => &[],
    };
    extra.contains(&label)
}

/// What admission and validation do to a write that reaches storage: the NRT CRD's schema
/// (quantities must match the quantity pattern, unknown fields pruned) and the required fields
/// of `events.k8s.io/v1` Events. Errors are 422 `Invalid` with the real server's wording.
fn admit(def: &ResourceDef, obj: &mut Value, create: bool) -> Result<(), ApiError> {
    let name = str_at(obj, &["metadata", "name"]).to_owned();
    // Each cause: (field, reason, what is wrong). Events of events.k8s.io are validated as the
    // core Event they are stored as: the real server names them `Event`, group "".
    let invalid = |causes: Vec<(String, &str, String)>| {
        let group = if def.kind == "Event" {
            ""
        } else {
            def.group.as_str()
        };
        let what = format!("{}.{group}", def.kind);
        let what = what.trim_end_matches('.');
        let lines: Vec<String> = causes.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
        let list = if lines.len() == 1 {
            lines[0].clone()
        } else {
            format!("[{}]", lines.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, reason, m)| json!({"reason": reason, "message": m, "field": f}))
            .collect();
        ApiError::new(422, format!("{what} \"{name}\" is invalid: {list}"))
            .with_details(json!({"name": name, "group": group, "kind": def.kind, "causes": causes}))
    };
    if def.group == numaplane::nrt::GROUP && def.kind == numaplane::nrt::KIND {
        prune_nrt(obj);
        let mut causes = Vec::new();
        for (z, zone) in obj["zones"].as_array().into_iter().flatten().enumerate() {
            for (r, res) in zone["resources"].as_array().into_iter().flatten().enumerate() {
                for field in ["capacity", "allocatable", "available"] {
                    let path = format!("zones[{z}].resources[{r}].{field}");
                    match &res[field] {
                        Value::Number(_) | Value::Null => {}
                        Value::String(q) if quantity_pattern().is_match(q) => {}
                        Value::String(q) => causes.push((
                            path.clone(),
                            "FieldValueInvalid",
                            format!(
                                "Invalid value: \"{q}\": {path} in body should match '{QUANTITY_PATTERN}'"
                            ),
                        )),
                        other => causes.push((
                            path.clone(),
                            "FieldValueInvalid",
                            format!(
                                "Invalid value: \"{}\": {path} in body must be of type integer,string",
                                json_type(other)
                            ),
                        )),
                    }
                }
            }
        }
        if !causes.is_empty() {
            return Err(invalid(causes));
        }
    }
    if create && def.group == "events.k8s.io" && def.kind == "Event" {
        let mut causes = Vec::new();
        if str_at(obj, &["eventTime"]).is_empty() {
            causes.push((
                "eventTime".to_owned(),
                "FieldValueRequired",
                "Required value".to_owned(),
            ));
        }
        if str_at(obj, &["reportingController"]).is_empty() {
            causes.push((
                "reportingController".to_owned(),
                "FieldValueRequired",
                "Required value".to_owned(),
            ));
        }
        if str_at(obj, &["reportingInstance"]).is_empty() {
            causes.push((
                "reportingInstance".to_owned(),
                "FieldValueRequired",
                "Required value".to_owned(),
            ));
        }
        if !causes.is_empty() {
            return Err(invalid(causes));
        }
    }
    Ok(())
}

/// The quantity pattern of the NRT CRD (`deploy/crd.yaml`), as the API server reports it.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn quantity_pattern() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    // A constant pattern: failing to compile is a bug in this file, caught by every NRT test.
    #[allow(clippy::expect_used)]
    RE.get_or_init(|| regex::Regex::new(QUANTITY_PATTERN).expect("quantity pattern compiles"))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Structural-schema pruning of the NRT CRD: fields the schema does not declare are dropped.
fn prune_nrt(obj: &mut Value) {
    fn keep(v: &mut Value, allowed: &[&str]) {
        if let Some(map) = v.as_object_mut() {
            map.retain(|k, _| allowed.contains(&k.as_str()));
        }
    }
    keep(
        obj,
        &[
            "apiVersion",
            "kind",
            "metadata",
            "topologyPolicies",
            "zones",
            "attributes",
        ],
    );
    for zone in obj["zones"].as_array_mut().into_iter().flatten() {
        keep(
            zone,
            &["name", "type", "parent", "costs", "attributes", "resources"],
        );
        for res in zone["resources"].as_array_mut().into_iter().flatten() {
            keep(res, &["name", "capacity", "allocatable", "available"]);
        }
    }
}

/// Merge keys of the lists that strategic merge patch merges item by item (from the Go types'
/// `patchMergeKey` tags), by kind and dotted path; other lists are replaced.
fn strategic_merge_key(kind: &str, path: &str) -> Option<&'static str> {
    Some(match (kind, path) {
        ("Pod", "status.conditions") => "type",
        ("Pod", "status.podIPs") => "ip",
        (
            "Pod",
            "spec.containers"
            | "spec.initContainers"
            | "status.containerStatuses"
            | "status.initContainerStatuses",
        ) => "name",
        ("Node", "status.conditions" | "status.addresses") => "type",
        ("Node", "spec.taints") => "key",
        (_, "metadata.ownerReferences") => "uid",
        _ => return None,
    })
}

/// `application/strategic-merge-patch+json`: a JSON merge patch, except that lists with a merge
/// key merge item by item (an item with `"$patch": "delete"` removes its match). Enough for
/// what schedulers send: `PodScheduled` conditions merged by type into `pods/status`.
fn strategic_merge_patch(target: &mut Value, patch: &Value, kind: &str, path: &str) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(map) = target.as_object_mut() else {
        return;
    };
    for (k, v) in patch_map {
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if v.is_null() {
            map.remove(k);
            continue;
        }
        match (strategic_merge_key(kind, &child), v.as_array()) {
            (Some(key), Some(items)) => {
                let slot = map.entry(k.clone()).or_insert_with(|| Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                if let Some(list) = slot.as_array_mut() {
                    for item in items {
                        let id = item.get(key).cloned();
                        let pos = list
                            .iter()
                            .position(|e| id.is_some() && e.get(key) == id.as_ref());
                        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                        match (pos, delete) {
                            (Some(i), true) => {
                                list.remove(i);
                            }
                            (None, true) => {}
                            (Some(i), false) => strategic_merge_patch(&mut list[i], item, kind, &child),
                            (None, false) => list.push(item.clone()),
                        }
                    }
                }
            }
            _ => strategic_merge_patch(map.entry(k.clone()).or_insert(Value::Null), v, kind, &child),
        }
    }
}

// ===================== watch =====================

struct WatchStream {
    shared: Arc<Shared>,
    api_version: String,
    kind: String,
    namespace: Option<String>,
    selectors: Selectors,
    bookmarks: bool,
    cursor: u64,
    epoch: u64,
    bookmark_gen: u64,
    pending: VecDeque<Bytes>,
    done: bool,
    deadline: tokio::time::Instant,
    changes: watch::Receiver<u64>,
    /// Objects are sent as PartialObjectMetadata.
    metadata_only: bool,
}

fn start_watch(shared: &Arc<Shared>, ctx: &Ctx, t: &Target, selectors: Selectors) -> Result<Reply, ApiError> {
    let requested = match ctx.param("resourceVersion").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let send_initial = match ctx.param("sendInitialEvents") {
        Some(v) => v == "true",
        None => requested.unwrap_or(0) == 0,
    };
    let timeout = ctx
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    // Subscribe before reading the state so that no later change can be missed.
    let changes = shared.changes.subscribe();
    let st = shared.lock();
    let mut ws = WatchStream {
        shared: Arc::clone(shared),
        api_version: t.def.api_version(),
        kind: t.def.kind.clone(),
        namespace: t.namespace.clone(),
        selectors,
        bookmarks: ctx.flag("allowWatchBookmarks"),
        cursor: requested.unwrap_or(st.rv),
        epoch: st.watch_epoch,
        bookmark_gen: st.bookmark_gen,
        pending: VecDeque::new(),
        done: false,
        deadline: tokio::time::Instant::now() + timeout,
        changes,
        metadata_only: false,
    };
    if send_initial {
        for obj in st
            .objects
            .iter()
            .filter(|(k, obj)| t.in_scope(k) && ws.selectors.matches(obj))
            .map(|(_, obj)| obj)
        {
            ws.pending.push_back(event_line("ADDED", obj));
        }
        ws.cursor = st.rv;
        if ctx.param("sendInitialEvents") == Some("true") {
            let line = ws.bookmark(st.rv, true);
            ws.pending.push_back(line);
        }
    }
    Ok(Reply::Watch(Box::new(ws)))
}

/// `PartialObjectMetadata` of an object, or `PartialObjectMetadataList` of a list.
fn partial_metadata(v: &Value) -> Value {
    match (
        v.get("kind").and_then(Value::as_str),
        v.get("items").and_then(Value::as_array),
    ) {
        (Some(kind), Some(items)) if kind.ends_with("List") => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "items": items.iter().map(partial_object).collect::<Vec<_>>(),
        }),
        _ => partial_object(v),
    }
}

fn partial_object(v: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn event_line(ty: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

impl WatchStream {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end && let Some(map) = metadata.as_object_mut() {
            map.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
        }
        event_line(
            "BOOKMARK",
            &json!({"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata}),
        )
    }

    /// Re-renders an already queued event line for a metadata-only watch.
    fn partial_line(ev: &Value) -> Bytes {
        let ty = ev.get("type").and_then(Value::as_str).unwrap_or("");
        let object = ev.get("object").cloned().unwrap_or(Value::Null);
        match ty {
            "ADDED" | "MODIFIED" | "DELETED" => event_line(ty, &partial_object(&object)),
            _ => event_line(ty, &object),
        }
    }

    fn in_scope(&self, obj: &Value) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| str_at(obj, &["metadata", "namespace"]) == ns)
            && self.selectors.matches(obj)
    }

    /// The line this watch sends for a stored event, if any.
    fn render(&self, ev: &HistEvent) -> Option<Bytes> {
        if ev.key.api_version != self.api_version || ev.key.kind != self.kind {
            return None;
        }
        let now = self.in_scope(&ev.object);
        let before = ev.prev.as_ref().map_or(now, |p| self.in_scope(p));
        let ty = match (ev.ty, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Deleted, _, true) => "DELETED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(if self.metadata_only {
            event_line(ty, &partial_object(&ev.object))
        } else {
            event_line(ty, &ev.object)
        })
    }

    /// Queues what happened since the cursor; false when the stream must end.
    fn catch_up(&mut self) -> bool {
        let shared = Arc::clone(&self.shared);
        let st = shared.lock();
        if st.watch_epoch != self.epoch {
            return false;
        }
        if self.cursor < st.history_floor {
            let status = ApiError::new(
                410,
                format!(
                    "too old resource version: {} ({})",
                    self.cursor,
                    st.history_floor + 1
                ),
            )
            .to_status();
            self.pending.push_back(event_line("ERROR", &status));
            self.done = true;
            return true;
        }
        let start = st.history.partition_point(|ev| ev.rv <= self.cursor);
        for ev in st.history.range(start..) {
            if let Some(line) = self.render(ev) {
                self.pending.push_back(line);
            }
        }
        self.cursor = self.cursor.max(st.rv);
        if st.bookmark_gen != self.bookmark_gen {
            self.bookmark_gen = st.bookmark_gen;
            if self.bookmarks {
                let line = self.bookmark(st.rv, false);
                self.pending.push_back(line);
            }
        }
        true
    }

    fn into_stream(self: Box<Self>) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send {
        futures::stream::unfold(self, |mut ws| async move {
            loop {
                if let Some(line) = ws.pending.pop_front() {
                    return Some((Ok(Frame::data(line)), ws));
                }
                if ws.done {
                    return None;
                }
                ws.changes.borrow_and_update();
                if !ws.catch_up() {
                    return None;
                }
                if !ws.pending.is_empty() || ws.done {
                    continue;
                }
                tokio::select! {
                    changed = ws.changes.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                    }
                    () = tokio::time::sleep_until(ws.deadline) => return None,
                }
            }
        })
    }
}

// ===================== small helpers =====================

/// A non-apply write takes ownership of the fields it changes, as on the real server: they
/// leave every applier's managed set (the fake records no `Update` managers), so a later
/// apply of them by another manager does not conflict with the previous applier.
fn release_changed_fields(old: &Value, new: &mut Value) {
    let Some(entries) = meta_get(new, "managedFields").and_then(Value::as_array).cloned() else {
        return;
    };
    let mut kept = Vec::new();
    for mut entry in entries {
        let set = fieldset_from_v1(entry.get("fieldsV1"));
        let unchanged: FieldSet = set
            .iter()
            .filter(|p| value_at(old, p) == value_at(new, p))
            .cloned()
            .collect();
        if unchanged.len() == set.len() {
            kept.push(entry);
        } else if !unchanged.is_empty() {
            if let Some(map) = entry.as_object_mut() {
                map.insert("fieldsV1".into(), fieldset_to_v1(&unchanged));
            }
            kept.push(entry);
        }
    }
    set_meta(new, "managedFields", Value::Array(kept));
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(obj, |cur, seg| cur.get(seg))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_get<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    obj.get("metadata").and_then(|m| m.get(field))
}

fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = obj.as_object_mut()?;
    let meta = map.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if let Some(meta) = meta_mut(obj) {
        meta.insert(field.to_owned(), value);
    }
}

fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

fn new_uid() -> String {
    // Version 4, as the real server's uids are.
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// `prefix` + 5 characters from the alphabet the real name generator uses.
fn generated_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n: u64 = rand::random();
    let mut name = prefix.to_owned();
    for _ in 0..5 {
        name.push(char::from(ALPHABET[(n % ALPHABET.len() as u64) as usize]));
        n /= ALPHABET.len() as u64;
    }
    name
}

fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil-from-days (H. Hinnant), to avoid a date crate for one timestamp format.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `a=b&c=d` → pairs, percent- and `+`-decoded; empty pairs (kube starts with `?&`) skipped.
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match (b, hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
                continue;
            }
            (b'+', _, _) => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
