//! The kubelet options that can move a container's NUMA node or decide its admission, as the
//! NRT publishes them: which the model predicts exactly, and which make its predictions for a
//! node approximate, with the reason. An option the model does not know is never guessed at:
//! it is reported (simulate's warnings, explain, the node's verdict, the live scheduler's
//! gauge), and `--unknown-kubelet-options=Avoid` keeps aligned pods off such a node.
//!
//! Checked against the real kubelet v1.36.2 by tests/tests/kubelet_oracle.rs
//! (docs/scheduler.md "Kubelet options"):
//! - CPU manager `full-pcpus-only`: modelled (SMTAlignmentError, whole cores);
//! - `distribute-cpus-across-numa`: modelled (the even split of `takeByTopologyNUMADistributed`,
//!   [`crate::admission`]'s CPU distribution);
//! - `strict-cpu-reservation`: modelled; it only keeps shared containers off the reserved CPUs,
//!   exclusive allocation and hints are unchanged;
//! - `prefer-align-cpus-by-uncorecache`: exact where every pool is one NUMA node
//!   (`single-numa-node`), unless `full-pcpus-only` counts whole cores on an SMT machine;
//!   elsewhere it may place CPUs by uncore cache (the socket, without cache information), which
//!   the NRT does not describe: approximate;
//! - `align-by-socket`, `distribute-cpus-across-cores`: they change nothing at the NUMA level
//!   on a machine with one socket per NUMA node and (the latter) one thread per core, but the
//!   NRT does not say how many sockets the machine has: approximate;
//! - Topology Manager `prefer-closest-numa-nodes`, `max-allowable-numa-nodes`: modelled;
//! - anything else: approximate, named.

use numaplane::nrt::{self, NodeResourceTopology};

/// One option whose effect the model cannot predict on this node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Approximation {
    /// `name=value` as the kubelet configuration sets it.
    pub option: String,
    /// Why the prediction may differ.
    pub why: String,
}

impl std::fmt::Display for Approximation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kubelet option {}: {}", self.option, self.why)
    }
}

/// What the static CPU manager's options make of exclusive allocation on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuManagerOptions {
    /// `distribute-cpus-across-numa=true`: multi-NUMA allocations are split evenly.
    pub distribute_across_numa: bool,
    /// The options the model cannot predict here.
    pub approximate: Vec<Approximation>,
}

/// The known CPU manager options the model predicts exactly wherever they are set.
const EXACT_CPU_OPTIONS: [&str; 3] = [
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "strict-cpu-reservation",
];

/// Reads the CPU manager's options from the NRT; `single_numa_pools`: the Topology Manager
/// policy is `single-numa-node`, so every exclusive allocation comes from one NUMA node.
pub fn cpu_manager_options(obj: &NodeResourceTopology, single_numa_pools: bool) -> CpuManagerOptions {
    let mut out = CpuManagerOptions::default();
    if obj.attribute(nrt::attr::CPU_MANAGER_POLICY) != Some("static") {
        return out;
    }
    let Some(value) = obj.attribute(nrt::attr::CPU_MANAGER_POLICY_OPTIONS) else {
        return out;
    };
    let options = nrt::split_cpu_manager_options(value);
    // On SMT, uncore alignment picks other cores inside the NUMA node than the default, and
    // with `full-pcpus-only` the free whole cores the NRT counts then differ.
    let whole_cores_counted = options
        .iter()
        .any(|(k, v)| k == "full-pcpus-only" && numaplane::parse_go_bool(v) == Some(true))
        && obj
            .attribute(nrt::attr::THREADS_PER_CORE)
            .and_then(|t| t.trim().parse::<u32>().ok())
            .is_some_and(|t| t > 1);
    for (name, v) in options {
        let on = numaplane::parse_go_bool(&v);
        let option = format!("{name}={v}");
        if on.is_none() {
            out.approximate.push(Approximation {
                option,
                why: "not a boolean (the kubelet refuses to start with it)".to_owned(),
            });
            continue;
        }
        let on = on == Some(true);
        if name == "distribute-cpus-across-numa" {
            out.distribute_across_numa = on;
        }
        if !on || EXACT_CPU_OPTIONS.contains(&name.as_str()) {
            continue;
        }
        let why = match name.as_str() {
            "prefer-align-cpus-by-uncorecache" if single_numa_pools && !whole_cores_counted => continue,
            "prefer-align-cpus-by-uncorecache" if single_numa_pools => {
                "picks other cores inside the NUMA node than the default on SMT, so with full-pcpus-only the free whole cores differ from what the NRT's count predicts"
            }
            "prefer-align-cpus-by-uncorecache" => {
                "places CPUs that span NUMA nodes by uncore cache (the socket without cache information), which the NRT does not describe"
            }
            "align-by-socket" => {
                "widens hints and allocations to whole sockets; the NRT does not say how many NUMA nodes share a socket (with one socket per NUMA node it changes nothing)"
            }
            "distribute-cpus-across-cores" => {
                "orders CPUs by socket rather than NUMA node; the NRT does not say how many NUMA nodes share a socket (with one socket per NUMA node and one thread per core it changes nothing)"
            }
            _ => "not known to numaplane's model",
        };
        out.approximate.push(Approximation {
            option,
            why: why.to_owned(),
        });
    }
    out
}

/// Topology Manager options the model predicts.
const KNOWN_TOPOLOGY_OPTIONS: [&str; 2] = [
    nrt::kubelet_option::PREFER_CLOSEST_NUMA_NODES,
    nrt::kubelet_option::MAX_ALLOWABLE_NUMA_NODES,
];

/// The Topology Manager options the model does not know, from the NRT's list of every option
/// ([`nrt::attr::TOPOLOGY_MANAGER_POLICY_OPTIONS`]).
pub fn topology_manager_approximations(obj: &NodeResourceTopology) -> Vec<Approximation> {
    let Some(value) = obj.attribute(nrt::attr::TOPOLOGY_MANAGER_POLICY_OPTIONS) else {
        return Vec::new();
    };
    nrt::split_cpu_manager_options(value)
        .into_iter()
        .filter(|(name, _)| !KNOWN_TOPOLOGY_OPTIONS.contains(&name.as_str()))
        .map(|(name, v)| Approximation {
            option: format!("{name}={v}"),
            why: "a Topology Manager option not known to numaplane's model".to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nrt_with(attrs: &[(&str, &str)]) -> NodeResourceTopology {
        let attributes: Vec<serde_json::Value> = attrs
            .iter()
            .map(|(n, v)| serde_json::json!({"name": n, "value": v}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": "n"}, "zones": [], "attributes": attributes,
        }))
        .unwrap()
    }

    #[test]
    fn modelled_options_are_exact_and_the_rest_are_named() {
        let o = cpu_manager_options(
            &nrt_with(&[
                ("numaplane.io/cpu-manager-policy", "static"),
                (
                    "numaplane.io/cpu-manager-policy-options",
                    "distribute-cpus-across-numa=true,full-pcpus-only=true,strict-cpu-reservation=true",
                ),
            ]),
            false,
        );
        assert!(o.distribute_across_numa);
        assert!(o.approximate.is_empty(), "{:?}", o.approximate);
        let o = cpu_manager_options(
            &nrt_with(&[
                ("numaplane.io/cpu-manager-policy", "static"),
                (
                    "numaplane.io/cpu-manager-policy-options",
                    "align-by-socket=true,distribute-cpus-across-cores=false,new-option=true,prefer-align-cpus-by-uncorecache=true",
                ),
            ]),
            false,
        );
        assert!(!o.distribute_across_numa);
        let named: Vec<&str> = o.approximate.iter().map(|a| a.option.as_str()).collect();
        assert_eq!(
            named,
            [
                "align-by-socket=true",
                "new-option=true",
                "prefer-align-cpus-by-uncorecache=true"
            ]
        );
        assert!(o.approximate[1].to_string().contains("not known"));
    }

    #[test]
    fn uncore_alignment_is_exact_when_every_pool_is_one_numa_node() {
        let obj = nrt_with(&[
            ("numaplane.io/cpu-manager-policy", "static"),
            (
                "numaplane.io/cpu-manager-policy-options",
                "prefer-align-cpus-by-uncorecache=true",
            ),
        ]);
        assert!(cpu_manager_options(&obj, true).approximate.is_empty());
        assert_eq!(cpu_manager_options(&obj, false).approximate.len(), 1);
        let smt = nrt_with(&[
            ("numaplane.io/cpu-manager-policy", "static"),
            (
                "numaplane.io/cpu-manager-policy-options",
                "full-pcpus-only=true,prefer-align-cpus-by-uncorecache=true",
            ),
            ("numaplane.io/threads-per-core", "2"),
        ]);
        assert_eq!(cpu_manager_options(&smt, true).approximate.len(), 1);
    }

    #[test]
    fn options_of_a_cpu_manager_that_is_not_static_change_nothing() {
        let o = cpu_manager_options(
            &nrt_with(&[
                ("numaplane.io/cpu-manager-policy", "none"),
                ("numaplane.io/cpu-manager-policy-options", "x=true"),
            ]),
            false,
        );
        assert_eq!(o, CpuManagerOptions::default());
    }

    #[test]
    fn unknown_topology_manager_options_are_named() {
        let obj = nrt_with(&[(
            "numaplane.io/topology-manager-policy-options",
            "max-allowable-numa-nodes=16,prefer-closest-numa-nodes=true,spread=true",
        )]);
        let a = topology_manager_approximations(&obj);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].option, "spread=true");
        assert!(topology_manager_approximations(&nrt_with(&[])).is_empty());
    }
}
