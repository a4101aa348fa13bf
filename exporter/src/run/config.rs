//! The agent's configuration: the flags merged over what is known of the kubelet's
//! configuration, into the accounting configuration and the kubelet configuration sources.

use std::collections::{BTreeMap, BTreeSet};

use kube::Client;
use numaplane::fingerprint::Method;

use crate::accounting::AccountingConfig;
use crate::configz::{ConfigzClient, ConfigzVia, KubeletTls};
use crate::kubelet_config::ResourceManagerSettings;
use crate::kubelet_source::{Known, Sources};
use crate::run::args::{FingerprintArg, RunArgs};
use crate::run::error::RunError;

/// The effective Topology Manager settings: the flags over what is known of the kubelet's
/// configuration.
pub fn effective_settings(args: &RunArgs, known: &Known) -> ResourceManagerSettings {
    let mut s = known.settings.clone().unwrap_or_default();
    if let Some(p) = &args.topology_manager_policy {
        s.policy = Some(p.clone());
    }
    if let Some(sc) = &args.topology_manager_scope {
        s.scope = Some(sc.clone());
    }
    if let Some(n) = args.topology_manager_max_numa_nodes {
        s.max_numa_nodes = Some(n);
    }
    if let Some(c) = args.topology_manager_prefer_closest_numa_nodes {
        s.prefer_closest_numa_nodes = Some(c);
    }
    s
}

/// Puts the effective kubelet settings for `known` into `cfg`; returns whether they changed.
pub fn apply_kubelet_settings(cfg: &mut AccountingConfig, args: &RunArgs, known: &Known) -> bool {
    let tm = effective_settings(args, known);
    let fresh = (
        tm.policy.unwrap_or_default(),
        tm.scope.unwrap_or_default(),
        tm.max_numa_nodes,
        tm.prefer_closest_numa_nodes,
        tm.resource_managers,
        known.unknown(),
    );
    let before = (
        std::mem::take(&mut cfg.topology_manager_policy),
        std::mem::take(&mut cfg.topology_manager_scope),
        cfg.max_numa_nodes,
        cfg.prefer_closest_numa_nodes,
        cfg.resource_managers.take(),
        cfg.kubelet_config_unknown,
    );
    let changed = before != fresh;
    (
        cfg.topology_manager_policy,
        cfg.topology_manager_scope,
        cfg.max_numa_nodes,
        cfg.prefer_closest_numa_nodes,
        cfg.resource_managers,
        cfg.kubelet_config_unknown,
    ) = fresh;
    changed
}

/// The info series' policy and scope labels for `cfg`: the kubelet defaults for empty values,
/// `unknown` when no configured source answered.
pub(super) fn info_labels(cfg: &AccountingConfig) -> (&str, &str) {
    fn or<'a>(value: &'a str, unknown: bool, default: &'static str) -> &'a str {
        match (value, unknown) {
            ("", true) => "unknown",
            ("", false) => default,
            (v, _) => v,
        }
    }
    let unknown = cfg.kubelet_config_unknown;
    (
        or(
            &cfg.topology_manager_policy,
            unknown,
            crate::accounting::DEFAULT_TOPOLOGY_MANAGER_POLICY,
        ),
        or(
            &cfg.topology_manager_scope,
            unknown,
            crate::accounting::DEFAULT_TOPOLOGY_MANAGER_SCOPE,
        ),
    )
}

/// The kubelet configuration sources the flags configure. `kube` is the API client and its
/// configuration (none with `--dry-run` and no `--kubeconfig`): /configz needs credentials.
pub fn kubelet_sources(args: &RunArgs, kube: Option<&(Client, kube::Config)>) -> Result<Sources, RunError> {
    let configz = match (args.kubelet_configz, kube) {
        (ConfigzVia::Off, _) | (_, None) => None,
        (ConfigzVia::ApiServer, Some((client, _))) => {
            Some(ConfigzClient::api_server(client.clone(), &args.node_name))
        }
        (ConfigzVia::Kubelet, Some((_, config))) => {
            match args.node_address.as_deref().filter(|a| !a.is_empty()) {
                Some(address) => Some(
                    ConfigzClient::kubelet(
                        config,
                        "https",
                        address,
                        args.kubelet_port,
                        &KubeletTls {
                            ca_file: args.kubelet_ca_file.clone(),
                            insecure_skip_verify: args.kubelet_insecure_skip_tls_verify,
                        },
                        args.kubelet_config_timeout,
                    )
                    .map_err(RunError::NodeAddress)?,
                ),
                None => None,
            }
        }
    };
    Ok(Sources {
        configz,
        file: args.kubelet_config.clone(),
        dir: args.kubelet_config_dir.clone(),
        timeout: args.kubelet_config_timeout,
    })
}

/// The accounting configuration from the flags.
pub fn accounting_config(args: &RunArgs, tm: &ResourceManagerSettings) -> AccountingConfig {
    let mut resource_exclude: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, res) in &args.exclude_resources {
        resource_exclude
            .entry(node.clone())
            .or_default()
            .push(res.clone());
    }
    AccountingConfig {
        node_name: args.node_name.clone(),
        resource_exclude,
        watch_namespace: args.watch_namespace.clone(),
        pod_exclude: args.exclude_pods.clone(),
        terminal_pods: BTreeSet::new(),
        fingerprint_method: match args.pods_fingerprint_method {
            FingerprintArg::All => Some(Method::All),
            FingerprintArg::WithExclusiveResources => Some(Method::WithExclusiveResources),
            FingerprintArg::None => None,
        },
        topology_manager_policy: tm.policy.clone().unwrap_or_default(),
        topology_manager_scope: tm.scope.clone().unwrap_or_default(),
        max_numa_nodes: tm.max_numa_nodes,
        prefer_closest_numa_nodes: tm.prefer_closest_numa_nodes,
        resource_managers: tm.resource_managers.clone(),
        kubelet_config_unknown: false,
        cluster_shared: BTreeSet::new(),
        held_beyond_list: BTreeMap::new(),
        held_sources: None,
        memory_groups: None,
        node_level: None,
    }
}
