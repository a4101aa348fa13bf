//! What kube-scheduler's inter-pod, spread, port and volume plugins read from a pod, parsed once
//! when the pod is applied (as kube-scheduler's `PodInfo`), never per decision.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Pod, PodAffinityTerm, Toleration, TopologySpreadConstraint, Volume, WeightedPodAffinityTerm,
};

use crate::{
    nodeaffinity::{PreferredNodeAffinity, RequiredNodeAffinity},
    selector::{Op, Requirement, Selector, SelectorError},
};

/// One host port a container binds (`hostPort > 0`), with upstream's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// `hostIP`, `0.0.0.0` when empty.
    pub ip: String,
    /// `protocol`, `TCP` when empty.
    pub protocol: String,
    /// `hostPort`.
    pub port: i32,
}

/// A volume that VolumeRestrictions compares between pods on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestrictedVolume {
    /// GCE persistent disk.
    GcePd {
        /// `pdName`.
        name: String,
        /// `readOnly`.
        read_only: bool,
    },
    /// AWS EBS volume.
    AwsEbs {
        /// `volumeID`.
        id: String,
    },
    /// iSCSI volume.
    Iscsi {
        /// `iqn`.
        iqn: String,
        /// `readOnly`.
        read_only: bool,
    },
    /// Ceph RBD image.
    Rbd {
        /// `monitors`.
        monitors: Vec<String>,
        /// `pool` (`rbd` when empty, the API default).
        pool: String,
        /// `image`.
        image: String,
        /// `readOnly`.
        read_only: bool,
    },
}

/// A parsed `PodAffinityTerm` (`framework.AffinityTerm`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityTerm {
    /// Namespaces named by the term (the pod's own when neither namespaces nor a namespace
    /// selector is given).
    pub namespaces: BTreeSet<String>,
    /// `namespaceSelector` (`Nothing` when absent).
    pub namespace_selector: Selector,
    /// `labelSelector` with `matchLabelKeys` / `mismatchLabelKeys` merged in.
    pub selector: Selector,
    /// `topologyKey`.
    pub topology_key: String,
}

/// The term lists of a pod's inter-pod affinity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AffinityFacts {
    /// Required affinity terms.
    pub required: Vec<AffinityTerm>,
    /// Required anti-affinity terms.
    pub required_anti: Vec<AffinityTerm>,
    /// Preferred affinity terms with their weights.
    pub preferred: Vec<(i32, AffinityTerm)>,
    /// Preferred anti-affinity terms with their weights.
    pub preferred_anti: Vec<(i32, AffinityTerm)>,
    /// The first parse error, if a list did not parse (that list is then empty, as in
    /// `PodInfo`); an incoming pod with one fits nowhere, as upstream's PreFilter decides.
    pub error: Option<String>,
}

impl AffinityFacts {
    /// Whether no list holds a term.
    pub fn is_empty(&self) -> bool {
        self.required.is_empty()
            && self.required_anti.is_empty()
            && self.preferred.is_empty()
            && self.preferred_anti.is_empty()
    }
}

/// A topology spread constraint with upstream's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpreadConstraint {
    /// `maxSkew`.
    pub max_skew: i32,
    /// `topologyKey`.
    pub topology_key: String,
    /// `whenUnsatisfiable: DoNotSchedule` (else `ScheduleAnyway`).
    pub hard: bool,
    /// Which pods count.
    pub selector: SpreadSelector,
    /// `minDomains` (1 when absent).
    pub min_domains: i32,
    /// `nodeAffinityPolicy: Honor` (the default).
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default `Ignore`).
    pub honor_node_taints: bool,
}

/// The pods a spread constraint counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SpreadSelector {
    /// Pods whose labels match (the constraint's `labelSelector`, `matchLabelKeys` merged).
    Labels(Selector),
    /// Pods with the same controller (default constraints; see [`Owner`]).
    Owner(String),
}

/// The controller owning a pod, for the default spread constraints: kube-scheduler selects the
/// pods its Services, ReplicaSet, StatefulSet or ReplicationController select. numaplane does not
/// watch those objects, so it counts the pods of the same controller (the pods that
/// controller's selector selects, in practice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Controller UID (or `Kind/name` when the reference has none).
    pub id: String,
}

/// Everything the constraint plugins read from one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set (spread counting skips such pods).
    pub terminating: bool,
    /// Host ports of app and restartable init containers.
    pub host_ports: Vec<HostPort>,
    /// Volumes VolumeRestrictions compares.
    pub volumes: Vec<RestrictedVolume>,
    /// Inter-pod affinity (`None` when the pod has none).
    pub affinity: Option<Box<AffinityFacts>>,
    /// Explicit spread constraints (both kinds); unknown `whenUnsatisfiable` values are dropped.
    pub spread: Vec<SpreadConstraint>,
    /// A spread constraint whose selector did not parse.
    pub spread_error: Option<String>,
    /// The pod's controller, if a ReplicaSet, StatefulSet or ReplicationController.
    pub owner: Option<Owner>,
    /// nodeSelector and required node affinity.
    pub node_affinity: RequiredNodeAffinity,
    /// Preferred node affinity (the NodeAffinity score).
    pub preferred_node: PreferredNodeAffinity,
    /// Tolerations (the spread constraints' `nodeTaintsPolicy: Honor` reads them).
    pub tolerations: Vec<Toleration>,
}

impl PodFacts {
    /// Reads the facts of `pod` (namespace already defaulted by the caller).
    pub fn from_pod(pod: &Pod, namespace: &str) -> Self {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return PodFacts {
                namespace: namespace.to_owned(),
                labels,
                terminating: pod.metadata.deletion_timestamp.is_some(),
                ..PodFacts::default()
            };
        };
        let mut host_ports = Vec::new();
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        for c in sidecars.chain(&spec.containers) {
            for p in c
                .ports
                .iter()
                .flatten()
                .filter(|p| p.host_port.is_some_and(|h| h > 0))
            {
                host_ports.push(HostPort {
                    ip: p
                        .host_ip
                        .clone()
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| "0.0.0.0".to_owned()),
                    protocol: p
                        .protocol
                        .clone()
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| "TCP".to_owned()),
                    port: p.host_port.unwrap_or(0),
                });
            }
        }
        let volumes = spec.volumes.iter().flatten().filter_map(restricted).collect();
        let affinity = spec.affinity.as_ref().and_then(|a| {
            let facts = affinity_facts(
                a.pod_affinity.as_ref().map(|p| {
                    (
                        p.required_during_scheduling_ignored_during_execution.as_deref(),
                        p.preferred_during_scheduling_ignored_during_execution.as_deref(),
                    )
                }),
                a.pod_anti_affinity.as_ref().map(|p| {
                    (
                        p.required_during_scheduling_ignored_during_execution.as_deref(),
                        p.preferred_during_scheduling_ignored_during_execution.as_deref(),
                    )
                }),
                namespace,
                &labels,
            );
            (!facts.is_empty() || facts.error.is_some()).then(|| Box::new(facts))
        });
        let (spread, spread_error) = spread_constraints(spec.topology_spread_constraints.as_deref(), &labels);
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .filter(|o| {
                let group = o.api_version.split_once('/').map_or("", |(g, _)| g);
                matches!(
                    (group, o.kind.as_str()),
                    ("apps", "ReplicaSet") | ("apps", "StatefulSet") | ("", "ReplicationController")
                )
            })
            .map(|o| Owner {
                id: if o.uid.is_empty() {
                    format!("{}/{}", o.kind, o.name)
                } else {
                    o.uid.clone()
                },
            });
        let required_node = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
        PodFacts {
            namespace: namespace.to_owned(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            host_ports,
            volumes,
            affinity,
            spread,
            spread_error,
            owner,
            node_affinity: RequiredNodeAffinity::new(
                &spec.node_selector.clone().unwrap_or_default(),
                required_node,
            ),
            preferred_node: PreferredNodeAffinity::new(
                spec.affinity
                    .as_ref()
                    .and_then(|a| a.node_affinity.as_ref())
                    .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_deref())
                    .unwrap_or(&[]),
            ),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            labels,
        }
    }
}

fn restricted(v: &Volume) -> Option<RestrictedVolume> {
    if let Some(d) = &v.gce_persistent_disk {
        return Some(RestrictedVolume::GcePd {
            name: d.pd_name.clone(),
            read_only: d.read_only.unwrap_or(false),
        });
    }
    if let Some(d) = &v.aws_elastic_block_store {
        return Some(RestrictedVolume::AwsEbs {
            id: d.volume_id.clone(),
        });
    }
    if let Some(d) = &v.iscsi {
        return Some(RestrictedVolume::Iscsi {
            iqn: d.iqn.clone(),
            read_only: d.read_only.unwrap_or(false),
        });
    }
    if let Some(d) = &v.rbd {
        return Some(RestrictedVolume::Rbd {
            monitors: d.monitors.clone(),
            pool: d
                .pool
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "rbd".to_owned()),
            image: d.image.clone(),
            read_only: d.read_only.unwrap_or(false),
        });
    }
    None
}

type TermLists<'a> = (
    Option<&'a [PodAffinityTerm]>,
    Option<&'a [WeightedPodAffinityTerm]>,
);

fn affinity_facts(
    affinity: Option<TermLists<'_>>,
    anti: Option<TermLists<'_>>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> AffinityFacts {
    let mut facts = AffinityFacts::default();
    let note = |e: SelectorError, list: &str, facts: &mut AffinityFacts| {
        if facts.error.is_none() {
            facts.error = Some(format!("{list}: {e}"));
        }
    };
    let required = |terms: Option<&[PodAffinityTerm]>| -> Result<Vec<AffinityTerm>, SelectorError> {
        terms
            .into_iter()
            .flatten()
            .map(|t| parse_term(t, namespace, labels))
            .collect()
    };
    let preferred =
        |terms: Option<&[WeightedPodAffinityTerm]>| -> Result<Vec<(i32, AffinityTerm)>, SelectorError> {
            terms
                .into_iter()
                .flatten()
                .map(|w| parse_term(&w.pod_affinity_term, namespace, labels).map(|t| (w.weight, t)))
                .collect()
        };
    // As `PodInfo`: a list with a term that does not parse is dropped whole.
    match required(affinity.and_then(|a| a.0)) {
        Ok(v) => facts.required = v,
        Err(e) => note(e, "requiredAffinityTerms", &mut facts),
    }
    match required(anti.and_then(|a| a.0)) {
        Ok(v) => facts.required_anti = v,
        Err(e) => note(e, "requiredAntiAffinityTerms", &mut facts),
    }
    match preferred(affinity.and_then(|a| a.1)) {
        Ok(v) => facts.preferred = v,
        Err(e) => note(e, "preferredAffinityTerms", &mut facts),
    }
    match preferred(anti.and_then(|a| a.1)) {
        Ok(v) => facts.preferred_anti = v,
        Err(e) => note(e, "preferredAntiAffinityTerms", &mut facts),
    }
    facts
}

/// `newAffinityTerm`, with `matchLabelKeys` (`key in (value)`) and `mismatchLabelKeys`
/// (`key notin (value)`) merged into the selector as the API server merges them at creation
/// (merging twice adds the same requirement, which changes nothing).
fn parse_term(
    t: &PodAffinityTerm,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<AffinityTerm, SelectorError> {
    let mut selector = Selector::from_label_selector(t.label_selector.as_ref())?;
    let mut extra = Vec::new();
    for (keys, op) in [(&t.match_label_keys, Op::In), (&t.mismatch_label_keys, Op::NotIn)] {
        for k in keys.iter().flatten() {
            if let Some(v) = labels.get(k) {
                extra.push(Requirement::new(
                    k,
                    op,
                    std::slice::from_ref(v),
                    "matchLabelKeys",
                )?);
            }
        }
    }
    selector.add(extra);
    let namespace_selector = Selector::from_label_selector(t.namespace_selector.as_ref())?;
    let listed = t.namespaces.as_deref().unwrap_or(&[]);
    let namespaces = if listed.is_empty() && t.namespace_selector.is_none() {
        BTreeSet::from([namespace.to_owned()])
    } else {
        listed.iter().cloned().collect()
    };
    Ok(AffinityTerm {
        namespaces,
        namespace_selector,
        selector,
        topology_key: t.topology_key.clone(),
    })
}

/// Parses explicit constraints (`filterTopologySpreadConstraints` for both actions).
fn spread_constraints(
    list: Option<&[TopologySpreadConstraint]>,
    labels: &BTreeMap<String, String>,
) -> (Vec<SpreadConstraint>, Option<String>) {
    let mut out = Vec::new();
    let mut error = None;
    for c in list.into_iter().flatten() {
        let hard = match c.when_unsatisfiable.as_str() {
            "DoNotSchedule" => true,
            "ScheduleAnyway" => false,
            _ => continue,
        };
        let mut selector = match Selector::from_label_selector(c.label_selector.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                error.get_or_insert_with(|| format!("topologySpreadConstraints {}: {e}", c.topology_key));
                continue;
            }
        };
        let extra: Vec<Requirement> = c
            .match_label_keys
            .iter()
            .flatten()
            .filter_map(|k| labels.get(k).map(|v| (k, v)))
            .filter_map(|(k, v)| Requirement::new(k, Op::In, std::slice::from_ref(v), "=").ok())
            .collect();
        selector.add(extra);
        out.push(SpreadConstraint {
            max_skew: c.max_skew,
            topology_key: c.topology_key.clone(),
            hard,
            selector: SpreadSelector::Labels(selector),
            min_domains: c.min_domains.unwrap_or(1),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        });
    }
    (out, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(v: serde_json::Value) -> PodFacts {
        let pod: Pod = serde_json::from_value(v).expect("pod json");
        PodFacts::from_pod(&pod, pod.metadata.namespace.as_deref().unwrap_or("default"))
    }

    #[test]
    fn host_ports_default_ip_and_protocol_and_include_sidecars_only() {
        let f = facts(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "s", "restartPolicy": "Always", "ports": [{"containerPort": 1, "hostPort": 81}]},
                {"name": "i", "ports": [{"containerPort": 1, "hostPort": 82}]}],
            "containers": [{"name": "c", "ports": [
                {"containerPort": 1, "hostPort": 80, "protocol": "UDP", "hostIP": "10.0.0.1"},
                {"containerPort": 2}]}]}}));
        assert_eq!(
            f.host_ports,
            vec![
                HostPort {
                    ip: "0.0.0.0".into(),
                    protocol: "TCP".into(),
                    port: 81
                },
                HostPort {
                    ip: "10.0.0.1".into(),
                    protocol: "UDP".into(),
                    port: 80
                },
            ]
        );
    }

    #[test]
    fn affinity_terms_default_namespace_and_merge_label_keys() {
        let f = facts(serde_json::json!({"metadata": {"name": "p", "namespace": "ns",
            "labels": {"app": "a", "hash": "h1", "tenant": "t"}}, "spec": {"containers": [],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "kubernetes.io/hostname",
                 "matchLabelKeys": ["hash", "missing"], "mismatchLabelKeys": ["tenant"]}]}}}}));
        let a = f.affinity.expect("affinity");
        let t = &a.required_anti[0];
        assert_eq!(t.namespaces, BTreeSet::from(["ns".to_owned()]));
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert!(
            t.selector
                .matches(&l(&[("app", "a"), ("hash", "h1"), ("tenant", "u")]))
        );
        assert!(
            !t.selector
                .matches(&l(&[("app", "a"), ("hash", "h2"), ("tenant", "u")]))
        );
        assert!(
            !t.selector
                .matches(&l(&[("app", "a"), ("hash", "h1"), ("tenant", "t")]))
        );
    }

    #[test]
    fn an_invalid_list_is_dropped_and_reported() {
        let f = facts(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"service": "a b"}}, "topologyKey": "zone"}]}}}}),
        );
        let a = f.affinity.expect("affinity");
        assert!(a.required.is_empty());
        assert!(
            a.error
                .as_deref()
                .is_some_and(|e| e.starts_with("requiredAffinityTerms"))
        );
    }

    #[test]
    fn spread_defaults_and_owner() {
        let f = facts(
            serde_json::json!({"metadata": {"name": "p", "labels": {"app": "a"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": true}]},
            "spec": {"containers": [], "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": {"app": "a"}}},
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]}}),
        );
        assert_eq!(f.spread.len(), 1);
        let c = &f.spread[0];
        assert!(c.hard && c.honor_node_affinity && !c.honor_node_taints);
        assert_eq!(c.min_domains, 1);
        assert_eq!(f.owner, Some(Owner { id: "u1".into() }));
    }
}
