//! Unit tests of the Topology Manager model.

use std::collections::BTreeMap;

use super::merge::{Filter, Strategy, merge_filtered};
use super::*;

fn mask(ids: &[u32]) -> NumaMask {
    NumaMask::from_ids(ids.iter().copied()).unwrap()
}

fn hint(ids: &[u32], preferred: bool) -> TopologyHint {
    TopologyHint::new(mask(ids), preferred)
}

fn provider(resource: &str, hints: Vec<TopologyHint>) -> ProviderHints {
    ProviderHints::no_preference().with_resource(resource, Some(hints))
}

fn machine(nodes: u32) -> NumaInfo {
    NumaInfo::new(0..nodes, None).unwrap()
}

/// Merges `providers` under `policy` with the default options; the merge must not fail.
fn merge_default(policy: Policy, numa: &NumaInfo, providers: &[ProviderHints]) -> MergeOutcome {
    merge_hints(policy, &PolicyOptions::default(), numa, providers).unwrap()
}

fn outcome(hint: TopologyHint, admit: bool) -> MergeOutcome {
    MergeOutcome { hint, admit }
}

// ---- parsers ----

#[test]
fn policy_parses_kubelet_spellings_and_round_trips() {
    for (text, policy) in [
        ("none", Policy::None),
        ("best-effort", Policy::BestEffort),
        ("restricted", Policy::Restricted),
        ("single-numa-node", Policy::SingleNumaNode),
    ] {
        assert_eq!(text.parse::<Policy>().unwrap(), policy);
        assert_eq!(policy.to_string(), text);
    }
    assert_eq!(Policy::default(), Policy::None);
}

#[test]
fn policy_parse_errors_are_typed() {
    for bad in ["", "None", "best_effort", "single-numa", "restricted "] {
        assert_eq!(
            bad.parse::<Policy>(),
            Err(TopologyManagerError::UnknownPolicy {
                value: bad.to_owned()
            }),
            "{bad:?}"
        );
    }
}

#[test]
fn scope_parses_and_rejects() {
    assert_eq!("container".parse::<Scope>().unwrap(), Scope::Container);
    assert_eq!("pod".parse::<Scope>().unwrap(), Scope::Pod);
    assert_eq!(Scope::Pod.to_string(), "pod");
    assert_eq!(Scope::default(), Scope::Container);
    assert_eq!(
        "Pod".parse::<Scope>(),
        Err(TopologyManagerError::UnknownScope {
            value: "Pod".to_owned()
        })
    );
}

#[test]
fn policy_options_parse() {
    let empty: [(&str, &str); 0] = [];
    assert_eq!(
        PolicyOptions::from_kubelet_options(empty).unwrap(),
        PolicyOptions::default()
    );
    assert_eq!(PolicyOptions::default().max_allowable_numa_nodes, 8);
    assert!(!PolicyOptions::default().prefer_closest_numa_nodes);

    let map = BTreeMap::from([
        ("prefer-closest-numa-nodes", "true"),
        ("max-allowable-numa-nodes", "16"),
    ]);
    let opts = PolicyOptions::from_kubelet_options(&map).unwrap();
    assert!(opts.prefer_closest_numa_nodes);
    assert_eq!(opts.max_allowable_numa_nodes, 16);

    for (text, value) in [
        ("1", true),
        ("T", true),
        ("True", true),
        ("0", false),
        ("FALSE", false),
        ("f", false),
    ] {
        let opts = PolicyOptions::from_kubelet_options([(PREFER_CLOSEST_NUMA_NODES, text)]).unwrap();
        assert_eq!(opts.prefer_closest_numa_nodes, value, "{text}");
    }
    let opts = PolicyOptions::from_kubelet_options([(MAX_ALLOWABLE_NUMA_NODES, "8")]).unwrap();
    assert_eq!(opts.max_allowable_numa_nodes, 8);
}

#[test]
fn policy_options_errors_are_typed() {
    assert_eq!(
        PolicyOptions::from_kubelet_options([("numa-allocation-strategy", "x")]),
        Err(TopologyManagerError::UnknownPolicyOption {
            name: "numa-allocation-strategy".to_owned(),
            value: "x".to_owned()
        })
    );
    assert_eq!(
        PolicyOptions::from_kubelet_options([(PREFER_CLOSEST_NUMA_NODES, "yes")]),
        Err(TopologyManagerError::InvalidPolicyOptionValue {
            name: PREFER_CLOSEST_NUMA_NODES.to_owned(),
            value: "yes".to_owned(),
            expected: "a boolean"
        })
    );
    for bad in ["", "sixteen", "16.0", " 16"] {
        assert!(
            matches!(
                PolicyOptions::from_kubelet_options([(MAX_ALLOWABLE_NUMA_NODES, bad)]),
                Err(TopologyManagerError::InvalidPolicyOptionValue { .. })
            ),
            "{bad:?}"
        );
    }
    for (bad, value) in [("7", 7), ("0", 0), ("-16", -16)] {
        assert_eq!(
            PolicyOptions::from_kubelet_options([(MAX_ALLOWABLE_NUMA_NODES, bad)]),
            Err(TopologyManagerError::MaxAllowableNumaNodesTooLow { value, minimum: 8 })
        );
    }
}

// ---- NumaMask / NumaInfo ----

#[test]
fn numa_mask_ops() {
    let m = mask(&[2, 0, 2]);
    assert_eq!(m.value(), 0b101);
    assert_eq!(m.count(), 2);
    assert!(m.contains(0) && m.contains(2) && !m.contains(1) && !m.contains(64));
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(m.iter().len(), 2);
    assert_eq!(m.to_string(), "{0,2}");
    assert_eq!(format!("{:?}", NumaMask::EMPTY), "NumaMask{}");
    assert_eq!(m & mask(&[1, 2]), mask(&[2]));
    assert_eq!(m | mask(&[1]), mask(&[0, 1, 2]));
    assert!(NumaMask::EMPTY.is_empty() && !m.is_empty());
    assert_eq!(mask(&[63]).value(), 1 << 63);
    assert_eq!(mask(&[63]).iter().collect::<Vec<_>>(), vec![63]);
    // Narrower: fewer bits, then lower value ({1,2} = 6 beats {0,3} = 9).
    assert!(mask(&[3]).is_narrower_than(mask(&[0, 1])));
    assert!(mask(&[1, 2]).is_narrower_than(mask(&[0, 3])));
    assert!(!mask(&[0, 3]).is_narrower_than(mask(&[1, 2])));
    assert!(!m.is_narrower_than(m));
}

#[test]
fn numa_mask_rejects_ids_from_64() {
    assert_eq!(
        NumaMask::single(64),
        Err(TopologyManagerError::NumaNodeIdOutOfRange { id: 64 })
    );
    assert_eq!(
        NumaMask::from_ids([0, 70, 1]),
        Err(TopologyManagerError::NumaNodeIdOutOfRange { id: 70 })
    );
    assert_eq!(
        NumaInfo::new([0, 64], None),
        Err(TopologyManagerError::NumaNodeIdOutOfRange { id: 64 })
    );
}

#[test]
fn numa_info_validation() {
    assert_eq!(NumaInfo::new([], None), Err(TopologyManagerError::NoNumaNodes));
    assert_eq!(
        NumaInfo::new([0, 1, 0], None),
        Err(TopologyManagerError::DuplicateNumaNode { id: 0 })
    );
    let info = NumaInfo::new([2, 0], None).unwrap();
    assert_eq!(info.ids(), &[0, 2]);
    assert_eq!(info.default_affinity(), mask(&[0, 2]));
    let d = NumaDistances::new(vec![vec![10, 20], vec![20, 10]]).unwrap();
    assert_eq!(
        NumaInfo::new([0, 2], Some(d)),
        Err(TopologyManagerError::DistanceMissing { id: 2, size: 2 })
    );
    assert_eq!(
        NumaDistances::new(vec![vec![10, 20], vec![20]]),
        Err(TopologyManagerError::DistanceMatrixNotSquare {
            row: 1,
            len: 1,
            expected: 2
        })
    );
    assert_eq!(
        info.closest(mask(&[0]), mask(&[2])),
        Err(TopologyManagerError::MissingNumaDistances)
    );
}

// ---- merge ----

/// verified-facts.md: 1 CPU (hints {0},{1} preferred, {0,1} not) + 2 GPUs one per node
/// (hint {0,1} preferred) is rejected by `restricted`: no preferred merge has equal masks.
#[test]
fn equal_mask_rule_rejects_under_restricted() {
    let numa = machine(2);
    let providers = [
        provider("nvidia.com/gpu", vec![hint(&[0, 1], true)]),
        provider(
            "cpu",
            vec![hint(&[0], true), hint(&[1], true), hint(&[0, 1], false)],
        ),
        ProviderHints::no_preference(),
    ];
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0, 1], false), false));
    // best-effort keeps the same hint but admits.
    let out = merge_default(Policy::BestEffort, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0, 1], false), true));

    // With 3 CPUs the CPU hint is {0,1} preferred as well: the masks agree → admitted.
    let providers = [
        provider("nvidia.com/gpu", vec![hint(&[0, 1], true)]),
        provider("cpu", vec![hint(&[0, 1], true)]),
    ];
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0, 1], true), true));
}

#[test]
fn single_numa_node_on_one_node_machine_gives_no_mask() {
    let numa = machine(1);
    let providers = [
        provider("cpu", vec![hint(&[0], true)]),
        provider("memory", vec![hint(&[0], true)]),
    ];
    let out = merge_default(Policy::SingleNumaNode, &numa, &providers);
    assert_eq!(out, outcome(TopologyHint::any(true), true));
    // Nothing to merge at all → also "no mask", preferred.
    let out = merge_default(Policy::SingleNumaNode, &numa, &[]);
    assert_eq!(out, outcome(TopologyHint::any(true), true));
    // Cannot satisfy → no mask, not preferred, rejected.
    let out = merge_default(Policy::SingleNumaNode, &numa, &[provider("cpu", vec![])]);
    assert_eq!(out, outcome(TopologyHint::any(false), false));
    // restricted keeps the mask.
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0], true), true));
}

#[test]
fn more_nodes_than_max_allowable_is_an_error() {
    let numa = machine(9);
    for policy in [Policy::BestEffort, Policy::Restricted, Policy::SingleNumaNode] {
        assert_eq!(
            merge_hints(policy, &PolicyOptions::default(), &numa, &[]),
            Err(TopologyManagerError::TooManyNumaNodes {
                nodes: 9,
                max_allowable: 8
            })
        );
    }
    // `none` never merges and has no limit.
    let out = merge_default(Policy::None, &numa, &[]);
    assert_eq!(out, outcome(TopologyHint::any(false), true));
    // A raised limit accepts the machine.
    let opts = PolicyOptions::from_kubelet_options([(MAX_ALLOWABLE_NUMA_NODES, "9")]).unwrap();
    let out = merge_hints(
        Policy::Restricted,
        &opts,
        &numa,
        &[provider("cpu", vec![hint(&[8], true)])],
    )
    .unwrap();
    assert_eq!(out, outcome(hint(&[8], true), true));
    // Exactly 8 nodes is fine with the default.
    assert!(merge_hints(Policy::Restricted, &PolicyOptions::default(), &machine(8), &[]).is_ok());
    // A hand-built options struct below the minimum is refused like the parser does.
    let low = PolicyOptions {
        prefer_closest_numa_nodes: false,
        max_allowable_numa_nodes: 4,
    };
    assert_eq!(
        merge_hints(Policy::BestEffort, &low, &machine(2), &[]),
        Err(TopologyManagerError::MaxAllowableNumaNodesTooLow { value: 4, minimum: 8 })
    );
}

#[test]
fn prefer_closest_needs_distances() {
    let opts = PolicyOptions {
        prefer_closest_numa_nodes: true,
        ..PolicyOptions::default()
    };
    for policy in Policy::ALL {
        assert_eq!(
            merge_hints(policy, &opts, &machine(2), &[]),
            Err(TopologyManagerError::MissingNumaDistances),
            "{policy}"
        );
    }
}

#[test]
fn none_policy_ignores_hints() {
    let providers = [provider("cpu", vec![])];
    let out = merge_default(Policy::None, &machine(2), &providers);
    assert_eq!(out, outcome(TopologyHint::any(false), true));
}

#[test]
fn resource_hints_entry_point_matches_provider_maps() {
    let numa = machine(4);
    let cpu = [hint(&[1], true), hint(&[0, 1], false)];
    let gpu = [hint(&[0], true), hint(&[1], true), hint(&[0, 1], false)];
    let resources = [
        ResourceHints::Hints(&cpu),
        ResourceHints::NoPreference,
        ResourceHints::Hints(&gpu),
    ];
    let providers = [
        provider("cpu", cpu.to_vec()),
        ProviderHints::no_preference(),
        ProviderHints::new(BTreeMap::new())
            .with_resource("gpu", Some(gpu.to_vec()))
            .with_resource("mem", None),
    ];
    for policy in Policy::ALL {
        let a = merge_resource_hints(policy, &PolicyOptions::default(), &numa, &resources).unwrap();
        let b = merge_default(policy, &numa, &providers);
        assert_eq!(a, b, "{policy}");
    }
    let out = merge_resource_hints(Policy::Restricted, &PolicyOptions::default(), &numa, &resources).unwrap();
    assert_eq!(out, outcome(hint(&[1], true), true));
    let cannot = [ResourceHints::Hints(&[]), ResourceHints::Hints(&cpu)];
    let out = merge_resource_hints(Policy::Restricted, &PolicyOptions::default(), &numa, &cannot).unwrap();
    assert!(!out.admit && !out.hint.preferred);
}

#[test]
fn provider_hints_normalisation() {
    assert!(ProviderHints::no_preference().is_no_preference());
    assert!(ProviderHints::new(BTreeMap::new()).is_no_preference());
    let p = ProviderHints::no_preference()
        .with_resource("a", None)
        .with_resource("b", Some(vec![]));
    assert!(!p.is_no_preference());
    assert_eq!(p.resource_list_count(), 2);
    assert_eq!(
        p.resource_hints().collect::<Vec<_>>(),
        vec![ResourceHints::NoPreference, ResourceHints::CannotSatisfy]
    );
    assert_eq!(
        ProviderHints::default().resource_hints().collect::<Vec<_>>(),
        vec![ResourceHints::NoPreference]
    );
}

#[test]
fn many_resources_spill_out_of_the_inline_buffers() {
    // 20 resources (> 16 inline slots): all agree on node 2 except one that also allows 3.
    let numa = machine(4);
    let mut providers: Vec<ProviderHints> = (0..19)
        .map(|i| provider(&format!("r{i}"), vec![hint(&[2], true), hint(&[2, 3], false)]))
        .collect();
    providers.push(provider("last", vec![hint(&[2, 3], false)]));
    // B = 2 (the last list's narrowest hint), so {2,3} (count = B) beats {2} (count < B).
    let out = merge_default(Policy::BestEffort, &numa, &providers);
    assert_eq!(out.hint, hint(&[2, 3], false));
    // 17 single-hint lists: the cartesian path with a spilled odometer.
    let providers: Vec<ProviderHints> = (0..17)
        .map(|i| provider(&format!("r{i}"), vec![hint(&[2], true)]))
        .collect();
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[2], true), true));
}

/// Three providers (gpu, cpu, memory) with the same hints.
fn gpu_cpu_memory(hints: Vec<TopologyHint>) -> [ProviderHints; 3] {
    [
        provider("gpu", hints.clone()),
        provider("cpu", hints.clone()),
        provider("memory", hints),
    ]
}

#[test]
fn large_inputs_use_the_set_evaluation_with_the_same_result() {
    // 8 nodes, three providers with every mask: 255³ permutations, only feasible with sets.
    let numa = machine(8);
    let all: Vec<TopologyHint> = (1u64..256)
        .map(|v| TopologyHint::new(NumaMask::from_bits(v), v.count_ones() == 1))
        .collect();
    let providers = gpu_cpu_memory(all);
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0], true), true));
    // Without any preferred hint: B = 1 → the narrowest count-1 mask.
    let np: Vec<TopologyHint> = (3u64..256)
        .map(|v| TopologyHint::new(NumaMask::from_bits(v), false))
        .collect();
    let providers = gpu_cpu_memory(np);
    let out = merge_default(Policy::Restricted, &numa, &providers);
    assert_eq!(out, outcome(hint(&[0], false), false));
}

#[test]
fn distances_break_ties_but_not_for_single_numa_node() {
    // Node 1 is the far one: {0,2} is closer than {0,1} although its value is higher.
    let d = NumaDistances::new(vec![vec![10, 30, 11], vec![30, 10, 30], vec![11, 30, 10]]).unwrap();
    let numa = NumaInfo::new([0, 1, 2], Some(d)).unwrap();
    let closest = PolicyOptions {
        prefer_closest_numa_nodes: true,
        ..PolicyOptions::default()
    };
    let providers = [provider("cpu", vec![hint(&[0, 1], true), hint(&[0, 2], true)])];
    let out = merge_hints(Policy::BestEffort, &closest, &numa, &providers).unwrap();
    assert_eq!(out.hint, hint(&[0, 2], true));
    let out = merge_default(Policy::BestEffort, &numa, &providers);
    assert_eq!(out.hint, hint(&[0, 1], true));
    assert_eq!(numa.average_distance(mask(&[0, 2])).unwrap(), 10.5);
    assert!(numa.closest(mask(&[0, 2]), mask(&[0, 1])).unwrap());
    assert!(numa.closest(mask(&[1]), mask(&[0, 2])).unwrap());
}

#[test]
fn compare_edge_cases() {
    let p0 = hint(&[0], true);
    // No best yet: a non-empty candidate is taken, an empty one or a maskless one is not.
    assert_eq!(compare(None, &p0, 0), Choice::Candidate);
    assert_eq!(
        compare(None, &TopologyHint::new(NumaMask::EMPTY, true), 0),
        Choice::Current
    );
    assert_eq!(compare(Some(&p0), &TopologyHint::any(true), 0), Choice::Current);
    let d = NumaDistances::new(vec![vec![10]]).unwrap();
    assert_eq!(
        compare_with(Some(&p0), &hint(&[1], true), 0, TieBreak::ClosestNodes(&d)),
        Err(TopologyManagerError::DistanceMissing { id: 1, size: 1 })
    );
}

// ---- property test: closed form == kubelet fold, cartesian == sets ----

/// The kubelet's literal algorithm: recursive cartesian product, `mergePermutation`, fold of `compare`.
fn kubelet_fold(default: NumaMask, lists: &[Vec<TopologyHint>], tie: TieBreak<'_>) -> TopologyHint {
    let b = lists
        .iter()
        .filter_map(|l| l.iter().filter_map(|h| h.mask).map(NumaMask::count).min())
        .max()
        .unwrap_or(0);
    let mut best: Option<TopologyHint> = None;
    let mut perm = Vec::new();
    fn rec(lists: &[Vec<TopologyHint>], perm: &mut Vec<TopologyHint>, f: &mut dyn FnMut(&[TopologyHint])) {
        match lists.split_first() {
            None => f(perm),
            Some((first, rest)) => {
                for h in first {
                    perm.push(*h);
                    rec(rest, perm, f);
                    perm.pop();
                }
            }
        }
    }
    rec(lists, &mut perm, &mut |perm| {
        let mut preferred = true;
        let mut masks = Vec::new();
        for h in perm {
            if let Some(m) = h.mask {
                masks.push(m);
                if m != masks[0] {
                    preferred = false;
                }
            }
            if !h.preferred {
                preferred = false;
            }
        }
        let merged = masks.iter().fold(default, |acc, m| acc & *m);
        let candidate = TopologyHint::new(merged, preferred);
        if compare_with(best.as_ref(), &candidate, i64::from(b), tie).unwrap() == Choice::Candidate {
            best = Some(candidate);
        }
    });
    best.unwrap_or(TopologyHint::new(default, false))
}

/// Up to 3 lists of up to 5 hints; masks mostly inside `default`, sometimes maskless, empty or
/// naming nodes the machine does not have.
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

fn random_lists(rng: &mut StdRng, default: NumaMask) -> Vec<Vec<TopologyHint>> {
    let list_count = rng.random_range(0..4_u64) as usize;
    (0..list_count)
        .map(|_| {
            let len = 1 + rng.random_range(0..5_u64) as usize;
            (0..len)
                .map(|_| {
                    let preferred = rng.random_range(0..3_u64) != 0;
                    match rng.random_range(0..10_u64) {
                        0 => TopologyHint::any(preferred),
                        1 => TopologyHint::new(NumaMask::from_bits(rng.random_range(0..1 << 7)), preferred),
                        _ => loop {
                            let m = NumaMask::from_bits(rng.random::<u64>()) & default;
                            if !m.is_empty() {
                                break TopologyHint::new(m, preferred);
                            }
                        },
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn closed_form_and_both_strategies_equal_the_kubelet_fold() {
    let mut rng = StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
    let distances = NumaDistances::new(
        (0..7u64)
            .map(|i| {
                (0..7u64)
                    .map(|j| if i == j { 10 } else { 11 + (i + j) % 3 * 5 })
                    .collect()
            })
            .collect(),
    )
    .unwrap();
    for round in 0..20_000 {
        // Half the machines have ids 0..n, the others arbitrary ids below 7.
        let default = if rng.random_range(0..2_u64) == 0 {
            NumaMask::from_bits((1 << (1 + rng.random_range(0..4_u64))) - 1)
        } else {
            NumaMask::from_bits(1 + rng.random_range(0..(1 << 7) - 1))
        };
        let lists = random_lists(&mut rng, default);
        let slices: Vec<&[TopologyHint]> = lists.iter().map(Vec::as_slice).collect();
        for tie in [TieBreak::LowestValue, TieBreak::ClosestNodes(&distances)] {
            let expected = kubelet_fold(default, &lists, tie);
            for strategy in [
                Strategy::Cartesian,
                Strategy::Sets,
                Strategy::VecSets,
                Strategy::Auto,
            ] {
                let got = merge_filtered(default, &slices, Filter::All, tie, strategy);
                assert_eq!(
                    got, expected,
                    "round {round} {strategy:?} {tie:?} lists {lists:?}"
                );
            }
        }
        // single-numa-node filter: same as folding over pre-filtered lists.
        let filtered: Vec<Vec<TopologyHint>> = lists
            .iter()
            .map(|l| {
                l.iter()
                    .copied()
                    .filter(|h| h.preferred && h.mask.is_none_or(|m| m.count() == 1))
                    .collect()
            })
            .collect();
        let expected = kubelet_fold(default, &filtered, TieBreak::LowestValue);
        for strategy in [Strategy::Cartesian, Strategy::Sets, Strategy::VecSets] {
            let got = merge_filtered(
                default,
                &slices,
                Filter::SingleNuma,
                TieBreak::LowestValue,
                strategy,
            );
            assert_eq!(
                got, expected,
                "round {round} single-numa {strategy:?} lists {lists:?}"
            );
        }
    }
}
