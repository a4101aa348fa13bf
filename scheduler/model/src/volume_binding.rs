//! A pod's PersistentVolumeClaims, as kube-scheduler's VolumeBinding and VolumeZone plugins
//! judge them: the claims, volumes and storage classes the index knows (fed by watches, or read
//! from `simulate`'s input), the pod-level verdicts of their PreFilters (a missing or lost
//! claim, an unbound claim of an `Immediate` class), the per-node rules of their Filters (the
//! bound volume's `nodeAffinity`, its zone labels, a `WaitForFirstConsumer` claim's selected
//! node and its class's `allowedTopologies`), and the claims whose
//! `volume.kubernetes.io/selected-node` annotation the scheduler writes before the Binding (the
//! VolumeBinding PreBind), so a provisioner creates the volume where the pod lands.
//!
//! NodeVolumeLimits (kube-scheduler's CSI attach limits) is judged here too: per node, the unique
//! CSI volumes its pods use (claim → bound PersistentVolume's `csi.driver`/`volumeHandle`, or an
//! unbound claim's StorageClass provisioner) plus the pod's own new ones, per driver, against the
//! node's CSINode `spec.drivers[].allocatable.count`
//! (`pkg/scheduler/framework/plugins/nodevolumelimits/csi.go`).
//!
//! Pure and synchronous: the live loop feeds the index and writes the annotations.
//!
//! Not modelled (the pod stays pending with kube-scheduler's reason rather than be placed
//! where the volume cannot follow): binding a `WaitForFirstConsumer` claim to a pre-provisioned
//! volume (a class without a provisioner, such as local volumes: kube-scheduler writes the
//! volume's `claimRef` itself), and storage capacity (`CSIStorageCapacity`). Attach limits do
//! not translate in-tree volumes (`awsElasticBlockStore` and the like) to their CSI drivers, do
//! not count VolumeAttachments no pod references, and do not read the Node's legacy
//! `attachable-volumes-csi-*` allocatable; inline `csi` volumes count for nothing, as upstream.
//!
//! Size (~690 lines of code): one module on purpose. The three plugins judge the same index of
//! claims, volumes, classes and CSINodes (`VolumeIndex`), and a claim's verdict (bound, waiting
//! for its first consumer, lost) decides which rule of each applies; split by plugin, each part
//! would re-derive that verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::{
    core::v1::{NodeSelector, PersistentVolume, PersistentVolumeClaim, TopologySelectorTerm},
    storage::v1::{CSINode, StorageClass},
};

use crate::{
    fit::{Filter, FitFailure},
    pod::PodSpec,
};

/// The annotation through which the scheduler tells the provisioner where the pod goes.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set by the PV controller once a claim's binding is complete.
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The storage class of a claim before `spec.storageClassName` existed; it still wins.
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The provisioner of classes whose volumes are all created by hand (local volumes).
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// kube-scheduler's VolumeBinding reason: a bound volume's node affinity excludes the node.
pub const NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
/// kube-scheduler's VolumeBinding reason: an unbound claim cannot get a volume on the node.
pub const BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
/// kube-scheduler's VolumeZone reason: a bound volume's zone labels exclude the node.
pub const ZONE_CONFLICT: &str = "node(s) had no available volume zone";
/// kube-scheduler's VolumeBinding PreFilter reason for unbound `Immediate` claims.
pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
/// kube-scheduler's VolumeRestrictions reason for a `ReadWriteOncePod` claim in use.
pub const READ_WRITE_ONCE_POD_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

/// kube-scheduler's NodeVolumeLimits reason.
pub const MAX_VOLUME_COUNT: &str = "node(s) exceed max volume count";
/// The handle prefix of an unbound claim's volume (upstream uses a random prefix per process so
/// that it collides with no real handle; this one cannot collide either: handles hold no NUL).
const UNBOUND_HANDLE: &str = "\u{0}unbound";

/// The zone and region labels VolumeZone compares (beta and GA).
const ZONE_LABELS: [&str; 4] = [
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

/// What the index keeps of a claim.
#[derive(Clone, Debug, PartialEq)]
struct Claim {
    volume_name: Option<String>,
    /// `spec.volumeName` set and the PV controller finished binding.
    bound: bool,
    class: Option<String>,
    selected_node: Option<String>,
    /// `status.phase: Lost`.
    lost: bool,
    deleting: bool,
    /// The UID of the controller owner, if any (an ephemeral claim's pod).
    controller: Option<String>,
    /// `spec.accessModes` holds `ReadWriteOncePod`: one pod in the cluster at a time.
    once_pod: bool,
}

impl Claim {
    fn of(c: &PersistentVolumeClaim) -> Self {
        let annotations = c.metadata.annotations.as_ref();
        let volume_name = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty());
        let class = annotations
            .and_then(|a| a.get(BETA_CLASS).cloned())
            .or_else(|| c.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
            .filter(|s| !s.is_empty());
        Claim {
            bound: volume_name.is_some() && annotations.is_some_and(|a| a.contains_key(BIND_COMPLETED)),
            volume_name,
            class,
            selected_node: annotations
                .and_then(|a| a.get(SELECTED_NODE).cloned())
                .filter(|n| !n.is_empty()),
            lost: c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost"),
            deleting: c.metadata.deletion_timestamp.is_some(),
            controller: c
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
            once_pod: c
                .spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .is_some_and(|m| m.iter().any(|a| a == "ReadWriteOncePod")),
        }
    }
}

/// What the index keeps of a volume.
#[derive(Clone, Debug, PartialEq)]
struct Volume {
    node_affinity: Option<NodeSelector>,
    /// `spec.csi`: driver and volume handle.
    csi: Option<(String, String)>,
    /// VolumeZone: per zone/region label, the values it allows (`a__b` lists several).
    zones: Vec<(String, BTreeSet<String>)>,
}

impl Volume {
    fn of(v: &PersistentVolume) -> Self {
        let labels = v.metadata.labels.as_ref();
        let zones = ZONE_LABELS
            .iter()
            .filter_map(|k| {
                let value = labels?.get(*k)?;
                let set: BTreeSet<String> = value
                    .split("__")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                Some(((*k).to_owned(), set))
            })
            .collect();
        Volume {
            csi: v
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .map(|c| (c.driver.clone(), c.volume_handle.clone())),
            node_affinity: v
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.clone()),
            zones,
        }
    }
}

/// What the index keeps of a storage class.
#[derive(Clone, Debug, PartialEq)]
struct Class {
    wait_for_first_consumer: bool,
    /// Volumes of the class can be created on demand.
    provisions: bool,
    allowed_topologies: Vec<TopologySelectorTerm>,
    /// `provisioner`: the CSI driver of an unbound claim's volume-to-be.
    provisioner: String,
}

impl Class {
    fn of(c: &StorageClass) -> Self {
        Class {
            provisioner: c.provisioner.clone(),
            wait_for_first_consumer: c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"),
            provisions: !c.provisioner.is_empty() && c.provisioner != NO_PROVISIONER,
            allowed_topologies: c.allowed_topologies.clone().unwrap_or_default(),
        }
    }
}

/// One node-level rule a pod's volumes impose.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeRule {
    /// A bound volume's `spec.nodeAffinity.required` (matched against the node's labels only, as
    /// upstream's `CheckNodeAffinity`).
    VolumeAffinity(NodeSelector),
    /// A bound volume's zone or region label: the node's label (beta or GA) must be one of the
    /// values, when the node has any zone or region label at all.
    Zone {
        /// Label key on the volume.
        key: String,
        /// Allowed values.
        values: BTreeSet<String>,
    },
    /// An unbound `WaitForFirstConsumer` claim already selected this node.
    SelectedNode(String),
    /// An unbound `WaitForFirstConsumer` claim whose class restricts where it provisions.
    AllowedTopologies(Vec<TopologySelectorTerm>),
    /// An unbound `WaitForFirstConsumer` claim of a class that provisions nothing: it needs a
    /// pre-provisioned volume bound by the scheduler, which numaplane does not do.
    NeedsStaticBinding,
    /// NodeVolumeLimits: the nodes where the pod's new CSI volumes would exceed a driver's
    /// attach limit, each with what is exceeded.
    AttachLimit(BTreeMap<String, String>),
}

/// The verdict of a pod's volumes before any node is looked at.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum VolumeFilter {
    /// No claims: nothing to check.
    #[default]
    None,
    /// Infeasible everywhere, with kube-scheduler's PreFilter reason.
    Unschedulable(String),
    /// Feasible where every rule holds.
    Nodes(Vec<NodeRule>),
}

impl VolumeFilter {
    /// Part of the verdict cache's shape key: pods whose volumes impose the same rules share
    /// verdicts. Empty for pods without claims.
    pub fn shape(&self) -> String {
        match self {
            VolumeFilter::None => String::new(),
            other => format!("{other:?}"),
        }
    }

    /// The pod-level reason, when the pod fits nowhere because of its volumes.
    pub fn blocked(&self) -> Option<&str> {
        match self {
            VolumeFilter::Unschedulable(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the node `name` with `labels` passes every rule (the hot path).
    pub fn admits(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            VolumeFilter::None => true,
            VolumeFilter::Unschedulable(_) => false,
            VolumeFilter::Nodes(rules) => rules.iter().all(|r| rule_holds(r, name, labels)),
        }
    }

    /// The failures on the node `name` with `labels`: the reasons of the first plugin that
    /// fails (VolumeBinding, then VolumeZone), one per kube-scheduler reason.
    pub fn failures(&self, name: &str, labels: &BTreeMap<String, String>) -> Vec<FitFailure> {
        let rules = match self {
            VolumeFilter::None => return vec![],
            VolumeFilter::Unschedulable(r) => {
                return vec![FitFailure {
                    filter: Filter::VolumeBinding,
                    category: r.clone(),
                    message: r.clone(),
                }];
            }
            VolumeFilter::Nodes(rules) => rules,
        };
        let mut out: Vec<FitFailure> = Vec::new();
        for rule in rules.iter().filter(|r| !rule_holds(r, name, labels)) {
            let (category, message) = match rule {
                NodeRule::VolumeAffinity(_) => (
                    NODE_CONFLICT,
                    "a bound PersistentVolume's node affinity does not match the node's labels".to_owned(),
                ),
                NodeRule::Zone { key, values } => (
                    ZONE_CONFLICT,
                    format!(
                        "a bound PersistentVolume is in {key} {}",
                        values.iter().cloned().collect::<Vec<_>>().join(",")
                    ),
                ),
                NodeRule::SelectedNode(n) => (
                    BIND_CONFLICT,
                    format!("a WaitForFirstConsumer claim already selected node {n}"),
                ),
                NodeRule::AllowedTopologies(_) => (
                    BIND_CONFLICT,
                    "the StorageClass's allowedTopologies exclude the node".to_owned(),
                ),
                NodeRule::AttachLimit(over) => {
                    (MAX_VOLUME_COUNT, over.get(name).cloned().unwrap_or_default())
                }
                NodeRule::NeedsStaticBinding => (
                    BIND_CONFLICT,
                    "a WaitForFirstConsumer claim's StorageClass has no provisioner; binding it to \
                     a pre-provisioned PersistentVolume is not done by numaplane"
                        .to_owned(),
                ),
            };
            let filter = if category == ZONE_CONFLICT {
                Filter::VolumeZone
            } else {
                Filter::VolumeBinding
            };
            if !out.iter().any(|f| f.category == category) {
                out.push(FitFailure {
                    filter,
                    category: category.to_owned(),
                    message,
                });
            }
        }
        // kube-scheduler reports a node under its first failing plugin: VolumeBinding's
        // reasons hide VolumeZone's.
        if let Some(first) = out.iter().map(|f| f.filter).min() {
            out.retain(|f| f.filter == first);
        }
        out
    }
}

fn rule_holds(rule: &NodeRule, name: &str, labels: &BTreeMap<String, String>) -> bool {
    match rule {
        // Upstream matches a node that has only labels (no name): `matchFields` never match.
        NodeRule::VolumeAffinity(sel) => crate::nodeaffinity::affinity_matches(sel, "", labels),
        NodeRule::Zone { key, values } => {
            if !ZONE_LABELS.iter().any(|k| labels.contains_key(*k)) {
                // A node without any zone label (a one-zone cluster) takes any volume.
                return true;
            }
            let value = labels.get(key).or_else(|| labels.get(ga_label(key)));
            value.is_some_and(|v| values.contains(v))
        }
        NodeRule::SelectedNode(n) => n == name,
        NodeRule::AllowedTopologies(terms) => topology_terms_match(terms, labels),
        NodeRule::NeedsStaticBinding => false,
        NodeRule::AttachLimit(over) => !over.contains_key(name),
    }
}

/// The GA label of a beta zone/region label (VolumeZone's `translateToGALabel`).
fn ga_label(key: &str) -> &str {
    match key {
        "failure-domain.beta.kubernetes.io/zone" => "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region" => "topology.kubernetes.io/region",
        other => other,
    }
}

/// `MatchTopologySelectorTerms`: no terms match everything; terms are ORed, requirements inside
/// a term ANDed, each a label whose value is one of the listed values.
fn topology_terms_match(terms: &[TopologySelectorTerm], labels: &BTreeMap<String, String>) -> bool {
    if terms.is_empty() {
        return true;
    }
    terms.iter().any(|t| {
        t.match_label_expressions
            .iter()
            .flatten()
            .all(|r| labels.get(&r.key).is_some_and(|v| r.values.contains(v)))
    })
}

/// The claims, volumes and classes the scheduler knows, and the selected nodes it assumed.
#[derive(Clone, Debug, Default)]
pub struct VolumeIndex {
    /// `namespace/name` → claim.
    claims: HashMap<String, Claim>,
    volumes: HashMap<String, Volume>,
    classes: HashMap<String, Class>,
    /// Claim key → (pod key, node): selected nodes of our decisions the claim does not show
    /// yet, so the next pod sharing the claim goes to the same node.
    assumed: HashMap<String, (String, String)>,
    /// Claim key → the pods bound (or placed by us) that use it, whichever scheduler's:
    /// VolumeRestrictions' `ReadWriteOncePod` rule.
    users: HashMap<String, BTreeSet<String>>,
    /// Pod key → the claim keys it is a user of (to drop it without a scan), and its node.
    used_by: HashMap<String, (Vec<String>, String)>,
    /// Node → the claim keys its pods use, with the number of pods using each (NodeVolumeLimits).
    node_claims: HashMap<String, BTreeMap<String, u32>>,
    /// Node → CSI driver → `allocatable.count` of its CSINode (drivers without a count left out).
    csi_limits: HashMap<String, BTreeMap<String, i64>>,
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    let name = meta.name.as_deref()?;
    Some(format!(
        "{}/{name}",
        meta.namespace.as_deref().unwrap_or("default")
    ))
}

impl VolumeIndex {
    /// Adds or replaces a claim. An assumed selected node ends once the claim shows one (or is
    /// bound).
    pub fn apply_claim(&mut self, c: &PersistentVolumeClaim) {
        let Some(key) = object_key(&c.metadata) else {
            return;
        };
        let claim = Claim::of(c);
        if claim.selected_node.is_some() || claim.volume_name.is_some() {
            self.assumed.remove(&key);
        }
        self.claims.insert(key, claim);
    }

    /// Removes a claim.
    pub fn delete_claim(&mut self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.claims.remove(&key);
        self.assumed.remove(&key);
    }

    /// Replaces every claim (after a relist).
    pub fn reset_claims(&mut self, all: &[PersistentVolumeClaim]) {
        self.claims.clear();
        let assumed = std::mem::take(&mut self.assumed);
        for c in all {
            self.apply_claim(c);
        }
        // Assumptions for claims that still exist and show no selected node stay.
        for (k, v) in assumed {
            if self
                .claims
                .get(&k)
                .is_some_and(|c| c.selected_node.is_none() && c.volume_name.is_none())
            {
                self.assumed.insert(k, v);
            }
        }
    }

    /// Adds or replaces a PersistentVolume.
    pub fn apply_volume(&mut self, v: &PersistentVolume) {
        if let Some(name) = v.metadata.name.clone() {
            self.volumes.insert(name, Volume::of(v));
        }
    }

    /// Removes a PersistentVolume.
    pub fn delete_volume(&mut self, name: &str) {
        self.volumes.remove(name);
    }

    /// Replaces every PersistentVolume.
    pub fn reset_volumes(&mut self, all: &[PersistentVolume]) {
        self.volumes.clear();
        for v in all {
            self.apply_volume(v);
        }
    }

    /// Adds or replaces a StorageClass.
    pub fn apply_class(&mut self, c: &StorageClass) {
        if let Some(name) = c.metadata.name.clone() {
            self.classes.insert(name, Class::of(c));
        }
    }

    /// Removes a StorageClass.
    pub fn delete_class(&mut self, name: &str) {
        self.classes.remove(name);
    }

    /// Replaces every StorageClass.
    pub fn reset_classes(&mut self, all: &[StorageClass]) {
        self.classes.clear();
        for c in all {
            self.apply_class(c);
        }
    }

    /// Adds or replaces a CSINode (its drivers' attach limits).
    pub fn apply_csi_node(&mut self, n: &CSINode) {
        let Some(name) = n.metadata.name.clone() else {
            return;
        };
        let limits: BTreeMap<String, i64> = n
            .spec
            .drivers
            .iter()
            .filter_map(|d| Some((d.name.clone(), i64::from(d.allocatable.as_ref()?.count?))))
            .collect();
        if limits.is_empty() {
            self.csi_limits.remove(&name);
        } else {
            self.csi_limits.insert(name, limits);
        }
    }

    /// Removes a CSINode.
    pub fn delete_csi_node(&mut self, name: &str) {
        self.csi_limits.remove(name);
    }

    /// Replaces every CSINode.
    pub fn reset_csi_nodes(&mut self, all: &[CSINode]) {
        self.csi_limits.clear();
        for n in all {
            self.apply_csi_node(n);
        }
    }

    /// upstream's `getCSIDriverInfo`: the driver and unique volume name (`driver/handle`) of the
    /// claim `key`; `None` when it counts against no limit (unknown claim, no CSI volume, no
    /// class or an unknown one).
    fn csi_volume(&self, key: &str) -> Option<(String, String)> {
        let claim = self.claims.get(key)?;
        if let Some(pv) = claim.volume_name.as_deref().and_then(|n| self.volumes.get(n)) {
            let (driver, handle) = pv.csi.as_ref()?;
            return Some((driver.clone(), format!("{driver}/{handle}")));
        }
        // Unbound, or its volume is not known (yet): the class's provisioner counts.
        let class = self.classes.get(claim.class.as_deref()?)?;
        let driver = &class.provisioner;
        (!driver.is_empty()).then(|| (driver.clone(), format!("{driver}/{UNBOUND_HANDLE}-{key}")))
    }

    /// NodeVolumeLimits for a pod whose claims are `keys`: the nodes where its new volumes
    /// exceed a driver's limit, with what is exceeded. Empty when nothing is limited.
    fn attach_limits(&self, keys: &[String]) -> BTreeMap<String, String> {
        let mut over = BTreeMap::new();
        if self.csi_limits.is_empty() {
            return over;
        }
        // Unique volume → driver, as upstream's `newVolumes`.
        let new: BTreeMap<String, String> = keys
            .iter()
            .filter_map(|k| self.csi_volume(k))
            .map(|(driver, unique)| (unique, driver))
            .collect();
        if new.is_empty() {
            return over;
        }
        for (node, limits) in &self.csi_limits {
            if !new.values().any(|d| limits.contains_key(d)) {
                continue;
            }
            let attached: BTreeMap<String, String> = self
                .node_claims
                .get(node)
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| self.csi_volume(k))
                .map(|(driver, unique)| (unique, driver))
                .collect();
            let mut counts: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
            for driver in attached.values() {
                counts.entry(driver).or_default().0 += 1;
            }
            for (unique, driver) in &new {
                if !attached.contains_key(unique) {
                    counts.entry(driver).or_default().1 += 1;
                }
            }
            for (driver, (attached, adding)) in counts {
                let Some(&limit) = limits.get(driver) else {
                    continue;
                };
                if adding > 0 && attached.saturating_add(adding) > limit {
                    over.insert(
                        node.clone(),
                        format!(
                            "CSI driver {driver}: {attached} volume(s) attached and {adding} new, limit {limit} (CSINode)"
                        ),
                    );
                    break;
                }
            }
        }
        over
    }

    /// Whether the claim's class binds on the first consumer (a missing class, or none, means
    /// `Immediate`, as upstream's `IsDelayBindingMode`).
    fn delayed(&self, claim: &Claim) -> Option<&Class> {
        let class = self.classes.get(claim.class.as_deref()?)?;
        class.wait_for_first_consumer.then_some(class)
    }

    /// The selected node of a claim: on the object, or assumed by our own decision.
    fn selected_node<'a>(&'a self, key: &str, claim: &'a Claim) -> Option<&'a str> {
        claim
            .selected_node
            .as_deref()
            .or_else(|| self.assumed.get(key).map(|(_, n)| n.as_str()))
    }

    /// The verdict of `pod`'s volumes before nodes are looked at: kube-scheduler's VolumeBinding
    /// PreFilter (claims missing, lost, being deleted, not the pod's; unbound `Immediate`
    /// claims) and VolumeZone's (the bound volume must exist), then the rules its Filters apply
    /// per node.
    pub fn filter(&self, pod: &PodSpec) -> VolumeFilter {
        if pod.claims.is_empty() {
            return VolumeFilter::None;
        }
        let ns = &pod.namespace;
        let mut found = Vec::with_capacity(pod.claims.len());
        for r in &pod.claims {
            let key = format!("{ns}/{}", r.name);
            let Some(claim) = self.claims.get(&key) else {
                return VolumeFilter::Unschedulable(if r.ephemeral {
                    format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{}\"",
                        r.name
                    )
                } else {
                    format!("persistentvolumeclaim \"{}\" not found", r.name)
                });
            };
            if claim.lost {
                return VolumeFilter::Unschedulable(format!(
                    "persistentvolumeclaim \"{}\" bound to non-existent persistentvolume \"{}\"",
                    r.name,
                    claim.volume_name.as_deref().unwrap_or_default()
                ));
            }
            if claim.deleting {
                return VolumeFilter::Unschedulable(format!(
                    "persistentvolumeclaim \"{}\" is being deleted",
                    r.name
                ));
            }
            if r.ephemeral && (pod.uid.is_none() || claim.controller != pod.uid) {
                return VolumeFilter::Unschedulable(format!(
                    "PVC {ns}/{} was not created for pod {ns}/{} (pod is not owner)",
                    r.name, pod.name
                ));
            }
            // VolumeRestrictions: a ReadWriteOncePod claim another pod uses fits nowhere.
            if claim.once_pod
                && self
                    .users
                    .get(&key)
                    .is_some_and(|users| users.iter().any(|u| *u != pod.key()))
            {
                return VolumeFilter::Unschedulable(READ_WRITE_ONCE_POD_CONFLICT.to_owned());
            }
            found.push((key, claim));
        }
        // Unbound claims that are not delayed (pre-bound ones included) wait for the PV
        // controller.
        if found
            .iter()
            .any(|(_, c)| !c.bound && (c.volume_name.is_some() || self.delayed(c).is_none()))
        {
            return VolumeFilter::Unschedulable(UNBOUND_IMMEDIATE.to_owned());
        }
        let mut rules = Vec::new();
        for (key, claim) in &found {
            if claim.bound {
                let name = claim.volume_name.as_deref().unwrap_or_default();
                let Some(v) = self.volumes.get(name) else {
                    return VolumeFilter::Unschedulable(format!("persistentvolume \"{name}\" not found"));
                };
                if let Some(sel) = &v.node_affinity {
                    rules.push(NodeRule::VolumeAffinity(sel.clone()));
                }
                for (k, values) in &v.zones {
                    rules.push(NodeRule::Zone {
                        key: k.clone(),
                        values: values.clone(),
                    });
                }
                continue;
            }
            let Some(class) = self.delayed(claim) else {
                continue;
            };
            if let Some(node) = self.selected_node(key, claim) {
                rules.push(NodeRule::SelectedNode(node.to_owned()));
            }
            if !class.provisions {
                rules.push(NodeRule::NeedsStaticBinding);
            } else if !class.allowed_topologies.is_empty() {
                rules.push(NodeRule::AllowedTopologies(class.allowed_topologies.clone()));
            }
        }
        // NodeVolumeLimits runs before VolumeBinding and VolumeZone in kube-scheduler's order.
        let keys: Vec<String> = found.iter().map(|(k, _)| k.clone()).collect();
        let over = self.attach_limits(&keys);
        if !over.is_empty() {
            rules.insert(0, NodeRule::AttachLimit(over));
        }
        let mut deduped: Vec<NodeRule> = Vec::with_capacity(rules.len());
        for r in rules {
            if !deduped.contains(&r) {
                deduped.push(r);
            }
        }
        VolumeFilter::Nodes(deduped)
    }

    /// The claims of `pod` whose selected node must be written (to `node`) before its Binding:
    /// unbound `WaitForFirstConsumer` claims that do not name `node` already.
    pub fn claims_to_select(&self, pod: &PodSpec, node: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &pod.claims {
            let key = format!("{}/{}", pod.namespace, r.name);
            let Some(claim) = self.claims.get(&key) else {
                continue;
            };
            let unbound = !claim.bound && claim.volume_name.is_none();
            if unbound
                && self.delayed(claim).is_some()
                && claim.selected_node.as_deref() != Some(node)
                && !out.contains(&r.name)
            {
                out.push(r.name.clone());
            }
        }
        out
    }

    /// Records that `pod` was placed on `node`: its unbound `WaitForFirstConsumer` claims have
    /// that node selected until the claims show it (or [`Self::forget`]).
    pub fn assume(&mut self, pod: &PodSpec, node: &str) {
        let key = pod.key();
        for name in self.claims_to_select(pod, node) {
            self.assumed.insert(
                format!("{}/{name}", pod.namespace),
                (key.clone(), node.to_owned()),
            );
        }
    }

    /// Drops the selected nodes assumed for `pod_key` (its Binding or annotation write failed).
    pub fn forget(&mut self, pod_key: &str) {
        self.assumed.retain(|_, (p, _)| p != pod_key);
    }

    /// Records that the pod `pod` (bound, or placed by us) uses its claims on `node`.
    pub fn note_user(&mut self, pod: &PodSpec, node: &str) {
        let key = pod.key();
        self.drop_user(&key);
        if pod.claims.is_empty() {
            return;
        }
        let mut claims: Vec<String> = pod
            .claims
            .iter()
            .map(|r| format!("{}/{}", pod.namespace, r.name))
            .collect();
        claims.sort_unstable();
        claims.dedup();
        let on_node = self.node_claims.entry(node.to_owned()).or_default();
        for c in &claims {
            self.users.entry(c.clone()).or_default().insert(key.clone());
            *on_node.entry(c.clone()).or_default() += 1;
        }
        self.used_by.insert(key, (claims, node.to_owned()));
    }

    /// The pod `pod_key` no longer runs (or was not placed after all).
    pub fn drop_user(&mut self, pod_key: &str) {
        let Some((claims, node)) = self.used_by.remove(pod_key) else {
            return;
        };
        for c in claims {
            if let Some(pods) = self.users.get_mut(&c) {
                pods.remove(pod_key);
                if pods.is_empty() {
                    self.users.remove(&c);
                }
            }
            if let Some(on_node) = self.node_claims.get_mut(&node) {
                if let Some(n) = on_node.get_mut(&c) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        on_node.remove(&c);
                    }
                }
                if on_node.is_empty() {
                    self.node_claims.remove(&node);
                }
            }
        }
    }

    /// Whether any claim, volume, class or CSINode limit is known (for tests and reports).
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.volumes.is_empty()
            && self.classes.is_empty()
            && self.csi_limits.is_empty()
    }
}

/// Storage objects read from `simulate`'s input or listed by `kubectl numa explain`.
#[derive(Clone, Debug, Default)]
pub struct StorageObjects {
    /// PersistentVolumeClaims.
    pub claims: Vec<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub volumes: Vec<PersistentVolume>,
    /// StorageClasses.
    pub classes: Vec<StorageClass>,
    /// CSINodes (`storage.k8s.io/v1`): attach limits.
    pub csi_nodes: Vec<CSINode>,
}

impl StorageObjects {
    /// Decodes `object` if `kind` is one of the storage kinds; `Ok(false)`, with `object` left
    /// unread, for any other kind.
    pub fn read<'de, D: serde::Deserializer<'de>>(
        &mut self,
        kind: &str,
        object: D,
    ) -> Result<bool, D::Error> {
        use serde::Deserialize as _;
        match kind {
            "PersistentVolumeClaim" => self.claims.push(PersistentVolumeClaim::deserialize(object)?),
            "PersistentVolume" => self.volumes.push(PersistentVolume::deserialize(object)?),
            "StorageClass" => self.classes.push(StorageClass::deserialize(object)?),
            "CSINode" => self.csi_nodes.push(CSINode::deserialize(object)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Loads them into `index`.
    pub fn load_into(&self, index: &mut VolumeIndex) {
        index.reset_claims(&self.claims);
        index.reset_volumes(&self.volumes);
        index.reset_classes(&self.classes);
        index.reset_csi_nodes(&self.csi_nodes);
    }
}

#[cfg(test)]
/// Objects for the volume rules' tests, here and in the cluster index's.
pub(crate) mod fixtures {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    pub(crate) fn spec_of(pod: &Pod) -> PodSpec {
        let mut res = crate::resources::Resources::default();
        PodSpec::from_pod(&mut res, pod).expect("a pod")
    }

    pub(crate) fn pod(volumes: serde_json::Value) -> PodSpec {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}
        }))
        .expect("pod");
        spec_of(&p)
    }

    pub(crate) fn pvc(name: &str, extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {}});
        json_patch::merge(&mut v, &extra);
        serde_json::from_value(v).expect("pvc")
    }

    pub(crate) fn bound_pvc(name: &str, pv: &str) -> PersistentVolumeClaim {
        pvc(
            name,
            json!({"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": pv},
                   "status": {"phase": "Bound"}}),
        )
    }

    pub(crate) fn pv(name: &str, extra: serde_json::Value) -> PersistentVolume {
        let mut v = json!({"metadata": {"name": name}, "spec": {}});
        json_patch::merge(&mut v, &extra);
        serde_json::from_value(v).expect("pv")
    }

    pub(crate) fn class(name: &str, mode: &str, provisioner: &str, extra: serde_json::Value) -> StorageClass {
        let mut v =
            json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode});
        json_patch::merge(&mut v, &extra);
        serde_json::from_value(v).expect("class")
    }

    pub(crate) fn claim_volume(name: &str) -> serde_json::Value {
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": name}}])
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn categories(f: &VolumeFilter, node: &str, l: &BTreeMap<String, String>) -> Vec<String> {
        f.failures(node, l).into_iter().map(|f| f.category).collect()
    }

    #[test]
    fn a_read_write_once_pod_claim_in_use_fits_nowhere() {
        let mut idx = VolumeIndex::default();
        let mut claim = bound_pvc("c", "pv1");
        claim.spec.get_or_insert_with(Default::default).access_modes = Some(vec!["ReadWriteOncePod".into()]);
        idx.apply_claim(&claim);
        idx.apply_volume(&pv("pv1", json!({})));
        let me = pod(claim_volume("c"));
        assert_eq!(idx.filter(&me).blocked(), None, "nobody uses it yet");
        // The pod itself (re-placed, or seen bound) is no conflict; another one is.
        idx.note_user(&me, "n1");
        assert_eq!(idx.filter(&me).blocked(), None);
        let other: PodSpec = spec_of(
            &serde_json::from_value(json!({
                "metadata": {"name": "web-1", "namespace": "ns", "uid": "u2"},
                "spec": {"containers": [{"name": "c"}], "volumes": claim_volume("c")}
            }))
            .expect("pod"),
        );
        assert_eq!(idx.filter(&other).blocked(), Some(READ_WRITE_ONCE_POD_CONFLICT));
        idx.drop_user(&me.key());
        assert_eq!(idx.filter(&other).blocked(), None, "freed when the user goes");
        // ReadWriteOnce claims are shared freely (node-level rules are the kubelet's).
        let mut rwo = bound_pvc("c", "pv1");
        rwo.spec.get_or_insert_with(Default::default).access_modes = Some(vec!["ReadWriteOnce".into()]);
        idx.apply_claim(&rwo);
        idx.note_user(&me, "n1");
        assert_eq!(idx.filter(&other).blocked(), None);
    }

    #[test]
    fn pods_without_claims_are_not_filtered() {
        let idx = VolumeIndex::default();
        let p = pod(json!([{"name": "tmp", "emptyDir": {}}]));
        assert!(p.claims.is_empty());
        assert_eq!(idx.filter(&p), VolumeFilter::None);
        assert!(idx.filter(&p).admits("n", &BTreeMap::new()));
    }

    #[test]
    fn a_missing_claim_blocks_the_pod_everywhere_with_upstreams_words() {
        let idx = VolumeIndex::default();
        let f = idx.filter(&pod(claim_volume("data-web-0")));
        assert_eq!(
            f.blocked(),
            Some("persistentvolumeclaim \"data-web-0\" not found")
        );
        assert!(!f.admits("n", &BTreeMap::new()));
        let eph = pod(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]));
        assert_eq!(eph.claims[0].name, "web-0-scratch");
        assert_eq!(
            idx.filter(&eph).blocked(),
            Some(
                "waiting for ephemeral volume controller to create the persistentvolumeclaim \"web-0-scratch\""
            )
        );
    }

    #[test]
    fn an_ephemeral_claim_must_be_owned_by_the_pod() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "fast",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        let owned = |uid: &str| {
            pvc(
                "web-0-scratch",
                json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web-0",
                    "uid": uid, "controller": true}]}, "spec": {"storageClassName": "fast"}}),
            )
        };
        let eph = pod(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]));
        idx.apply_claim(&owned("someone-else"));
        assert_eq!(
            idx.filter(&eph).blocked(),
            Some("PVC ns/web-0-scratch was not created for pod ns/web-0 (pod is not owner)")
        );
        idx.apply_claim(&owned("pod-uid"));
        assert_eq!(idx.filter(&eph), VolumeFilter::Nodes(vec![]));
    }

    #[test]
    fn lost_and_deleted_claims_block_the_pod() {
        let mut idx = VolumeIndex::default();
        idx.apply_claim(&pvc(
            "c",
            json!({"spec": {"volumeName": "gone"}, "status": {"phase": "Lost"}}),
        ));
        assert_eq!(
            idx.filter(&pod(claim_volume("c"))).blocked(),
            Some("persistentvolumeclaim \"c\" bound to non-existent persistentvolume \"gone\"")
        );
        idx.apply_claim(&pvc(
            "c",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ));
        assert_eq!(
            idx.filter(&pod(claim_volume("c"))).blocked(),
            Some("persistentvolumeclaim \"c\" is being deleted")
        );
    }

    #[test]
    fn unbound_immediate_claims_block_the_pod() {
        let mut idx = VolumeIndex::default();
        let p = pod(claim_volume("c"));
        // No class at all.
        idx.apply_claim(&pvc("c", json!({})));
        assert_eq!(idx.filter(&p).blocked(), Some(UNBOUND_IMMEDIATE));
        // An Immediate class.
        idx.apply_class(&class("std", "Immediate", "csi.example.com", json!({})));
        idx.apply_claim(&pvc("c", json!({"spec": {"storageClassName": "std"}})));
        assert_eq!(idx.filter(&p).blocked(), Some(UNBOUND_IMMEDIATE));
        // A class that does not exist counts as Immediate.
        idx.apply_claim(&pvc("c", json!({"spec": {"storageClassName": "nowhere"}})));
        assert_eq!(idx.filter(&p).blocked(), Some(UNBOUND_IMMEDIATE));
        // Pre-bound (volumeName set, binding not completed), even in a delayed class.
        idx.apply_class(&class(
            "wffc",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        idx.apply_claim(&pvc(
            "c",
            json!({"spec": {"storageClassName": "wffc", "volumeName": "pv1"}}),
        ));
        assert_eq!(idx.filter(&p).blocked(), Some(UNBOUND_IMMEDIATE));
        // The beta annotation names the class and wins over the field.
        idx.apply_claim(&pvc(
            "c",
            json!({"metadata": {"annotations": {BETA_CLASS: "wffc"}}, "spec": {"storageClassName": "std"}}),
        ));
        assert_eq!(idx.filter(&p), VolumeFilter::Nodes(vec![]));
    }

    #[test]
    fn a_bound_volumes_node_affinity_restricts_the_nodes() {
        let mut idx = VolumeIndex::default();
        idx.apply_claim(&bound_pvc("c", "pv1"));
        let p = pod(claim_volume("c"));
        assert_eq!(
            idx.filter(&p).blocked(),
            Some("persistentvolume \"pv1\" not found")
        );
        idx.apply_volume(&pv(
            "pv1",
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}}),
        ));
        let f = idx.filter(&p);
        assert!(f.admits("n1", &labels(&[("kubernetes.io/hostname", "n1")])));
        let n2 = labels(&[("kubernetes.io/hostname", "n2")]);
        assert!(!f.admits("n2", &n2));
        assert_eq!(categories(&f, "n2", &n2), [NODE_CONFLICT]);
        // A volume without node affinity goes anywhere.
        idx.apply_volume(&pv("pv1", json!({})));
        assert!(idx.filter(&p).admits("n2", &n2));
    }

    #[test]
    fn volume_affinity_matches_labels_only_as_upstream() {
        let mut idx = VolumeIndex::default();
        idx.apply_claim(&bound_pvc("c", "pv1"));
        idx.apply_volume(&pv(
            "pv1",
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
        ));
        assert!(!idx.filter(&pod(claim_volume("c"))).admits("n1", &BTreeMap::new()));
    }

    #[test]
    fn a_bound_volumes_zone_labels_restrict_zoned_nodes() {
        let mut idx = VolumeIndex::default();
        idx.apply_claim(&bound_pvc("c", "pv1"));
        idx.apply_volume(&pv(
            "pv1",
            json!({"metadata": {"labels": {"failure-domain.beta.kubernetes.io/zone": "us-a__us-b"}}}),
        ));
        let f = idx.filter(&pod(claim_volume("c")));
        // The beta label on the volume is matched against the node's GA label.
        assert!(f.admits("n", &labels(&[("topology.kubernetes.io/zone", "us-b")])));
        let c = labels(&[("topology.kubernetes.io/zone", "us-c")]);
        assert!(!f.admits("n", &c));
        assert_eq!(categories(&f, "n", &c), [ZONE_CONFLICT]);
        // A node with a region label but no zone label fails; one with no such label passes.
        assert!(!f.admits("n", &labels(&[("topology.kubernetes.io/region", "us")])));
        assert!(f.admits("n", &labels(&[("other", "x")])));
    }

    #[test]
    fn wait_for_first_consumer_claims_fit_anywhere_their_class_allows() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "zonal",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({"allowedTopologies": [{"matchLabelExpressions": [
                {"key": "topology.kubernetes.io/zone", "values": ["a", "b"]}]}]}),
        ));
        idx.apply_claim(&pvc("c", json!({"spec": {"storageClassName": "zonal"}})));
        let p = pod(claim_volume("c"));
        let f = idx.filter(&p);
        assert!(f.admits("n1", &labels(&[("topology.kubernetes.io/zone", "a")])));
        let c = labels(&[("topology.kubernetes.io/zone", "c")]);
        assert!(!f.admits("n3", &c));
        assert_eq!(categories(&f, "n3", &c), [BIND_CONFLICT]);
        assert!(!f.admits("n4", &BTreeMap::new()));
        assert_eq!(idx.claims_to_select(&p, "n1"), ["c"]);
        // Without allowedTopologies: any node.
        idx.apply_class(&class(
            "zonal",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        assert!(idx.filter(&p).admits("n4", &BTreeMap::new()));
    }

    #[test]
    fn a_selected_node_pins_the_claim_and_is_not_written_again() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "wffc",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        idx.apply_claim(&pvc(
            "c",
            json!({"metadata": {"annotations": {SELECTED_NODE: "n1"}}, "spec": {"storageClassName": "wffc"}}),
        ));
        let p = pod(claim_volume("c"));
        let f = idx.filter(&p);
        assert!(f.admits("n1", &BTreeMap::new()));
        assert!(!f.admits("n2", &BTreeMap::new()));
        assert_eq!(categories(&f, "n2", &BTreeMap::new()), [BIND_CONFLICT]);
        assert!(idx.claims_to_select(&p, "n1").is_empty());
    }

    #[test]
    fn an_assumed_selected_node_holds_until_the_claim_shows_one_or_it_is_forgotten() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "wffc",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        idx.apply_claim(&pvc("shared", json!({"spec": {"storageClassName": "wffc"}})));
        let first = pod(claim_volume("shared"));
        idx.assume(&first, "n1");
        // A second pod sharing the claim goes where the first went.
        let f = idx.filter(&first);
        assert!(f.admits("n1", &BTreeMap::new()));
        assert!(!f.admits("n2", &BTreeMap::new()));
        // An update that does not show the annotation keeps the assumption; one that does
        // replaces it.
        idx.apply_claim(&pvc(
            "shared",
            json!({"metadata": {"labels": {"x": "y"}}, "spec": {"storageClassName": "wffc"}}),
        ));
        assert!(!idx.filter(&first).admits("n2", &BTreeMap::new()));
        idx.forget(&first.key());
        assert!(idx.filter(&first).admits("n2", &BTreeMap::new()));
        idx.assume(&first, "n1");
        idx.apply_claim(&pvc(
            "shared",
            json!({"metadata": {"annotations": {SELECTED_NODE: "n1"}}, "spec": {"storageClassName": "wffc"}}),
        ));
        assert!(idx.assumed.is_empty());
    }

    #[test]
    fn a_class_without_provisioner_is_not_bound_by_numaplane() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class("local", "WaitForFirstConsumer", NO_PROVISIONER, json!({})));
        idx.apply_claim(&pvc("c", json!({"spec": {"storageClassName": "local"}})));
        let f = idx.filter(&pod(claim_volume("c")));
        assert!(!f.admits("n1", &BTreeMap::new()));
        assert_eq!(categories(&f, "n1", &BTreeMap::new()), [BIND_CONFLICT]);
    }

    #[test]
    fn shapes_differ_by_rules_not_by_claim_names() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "wffc",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        idx.apply_claim(&pvc("a", json!({"spec": {"storageClassName": "wffc"}})));
        idx.apply_claim(&pvc("b", json!({"spec": {"storageClassName": "wffc"}})));
        let a = idx.filter(&pod(claim_volume("a")));
        let b = idx.filter(&pod(claim_volume("b")));
        assert_eq!(a.shape(), b.shape());
        idx.apply_claim(&pvc(
            "b",
            json!({"metadata": {"annotations": {SELECTED_NODE: "n1"}}, "spec": {"storageClassName": "wffc"}}),
        ));
        assert_ne!(a.shape(), idx.filter(&pod(claim_volume("b"))).shape());
        assert_eq!(VolumeFilter::None.shape(), "");
    }

    #[test]
    fn relists_replace_everything_but_live_assumptions() {
        let mut idx = VolumeIndex::default();
        idx.apply_class(&class(
            "wffc",
            "WaitForFirstConsumer",
            "csi.example.com",
            json!({}),
        ));
        let c = pvc("c", json!({"spec": {"storageClassName": "wffc"}}));
        idx.apply_claim(&c);
        idx.apply_claim(&pvc("old", json!({})));
        let p = pod(claim_volume("c"));
        idx.assume(&p, "n1");
        idx.reset_claims(std::slice::from_ref(&c));
        assert!(!idx.filter(&p).admits("n2", &BTreeMap::new()));
        assert!(idx.filter(&pod(claim_volume("old"))).blocked().is_some());
        idx.reset_classes(&[]);
        assert_eq!(idx.filter(&p).blocked(), Some(UNBOUND_IMMEDIATE));
        idx.delete_claim("ns", "c");
        assert!(idx.filter(&p).blocked().is_some_and(|r| r.contains("not found")));
    }

    #[test]
    fn storage_kinds_are_read_from_documents() {
        let mut s = StorageObjects::default();
        assert!(
            s.read(
                "PersistentVolumeClaim",
                json!({"metadata": {"name": "c", "namespace": "ns"}})
            )
            .expect("claim")
        );
        assert!(!s.read("Secret", json!({})).expect("other kinds are not ours"));
        let mut idx = VolumeIndex::default();
        s.load_into(&mut idx);
        assert!(!idx.is_empty());
    }
}
