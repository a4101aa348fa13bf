//! Conformance of the Topology Manager model against the vectors translated from the upstream
//! kubelet tests (`topology_manager_cases.json`): merge/admit cases, the pairwise comparator,
//! `NUMAInfo.Closest` and the average distance.
//!
//! The project keeps its own copy in `tests/data/`; the shared original is the fallback.

use std::collections::BTreeMap;
use std::path::PathBuf;

use numaplane_scheduler::topology_manager::{
    Choice, NumaDistances, NumaInfo, NumaMask, Policy, PolicyOptions, ProviderHints, Scope, TopologyHint,
    average_distance, compare, merge_hints,
};
use serde::Deserialize;

const FILE: &str = "topology_manager_cases.json";

#[derive(Deserialize)]
struct Vectors {
    cases: Vec<MergeCase>,
    comparator_cases: Section<ComparatorCase>,
    closest_cases: Section<ClosestCase>,
    average_distance_cases: Section<AverageCase>,
}

#[derive(Deserialize)]
struct Section<T> {
    cases: Vec<T>,
}

#[derive(Deserialize, Debug)]
struct JsonHint {
    mask: Option<Vec<u32>>,
    preferred: bool,
}

#[derive(Deserialize)]
struct MergeCase {
    id: String,
    policy: String,
    policy_options: BTreeMap<String, String>,
    scopes: Vec<String>,
    numa_nodes: Vec<u32>,
    numa_distances: Option<Vec<Vec<u64>>>,
    providers: Vec<Option<BTreeMap<String, Option<Vec<JsonHint>>>>>,
    expected: Expected,
}

#[derive(Deserialize)]
struct Expected {
    mask: Option<Vec<u32>>,
    preferred: bool,
    admit: bool,
}

#[derive(Deserialize)]
struct ComparatorCase {
    name: String,
    best_non_preferred_affinity_count: i64,
    current: Option<JsonHint>,
    candidate: JsonHint,
    expected: String,
}

#[derive(Deserialize)]
struct ClosestCase {
    name: String,
    current: Vec<u32>,
    candidate: Vec<u32>,
    numa_distances: Vec<Vec<u64>>,
    expected: String,
}

#[derive(Deserialize)]
struct AverageCase {
    mask: Vec<u32>,
    numa_distances: Vec<Vec<u64>>,
    expected_average: f64,
}

fn vectors_path() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let own = manifest.join("tests/data").join(FILE);
    if own.exists() {
        own
    } else {
        manifest.join("../../shared/conformance").join(FILE)
    }
}

fn load() -> Vectors {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn mask(ids: &[u32]) -> Result<NumaMask, String> {
    NumaMask::from_ids(ids.iter().copied()).map_err(|e| e.to_string())
}

fn hint(h: &JsonHint) -> Result<TopologyHint, String> {
    Ok(TopologyHint {
        mask: h.mask.as_deref().map(mask).transpose()?,
        preferred: h.preferred,
    })
}

fn show(h: &TopologyHint) -> String {
    h.to_string()
}

/// Runs one section, collecting "id: problem" lines; prints the tally.
fn run<T>(section: &str, cases: &[T], check: impl Fn(&T) -> (String, Result<(), String>)) -> Vec<String> {
    assert!(!cases.is_empty(), "section {section} has no cases");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let (id, result) = check(case);
            result.err().map(|e| format!("{section}/{id}: {e}"))
        })
        .collect();
    println!(
        "{section}: {}/{} passing",
        cases.len() - failures.len(),
        cases.len()
    );
    failures
}

fn check_merge(case: &MergeCase) -> Result<(), String> {
    for scope in &case.scopes {
        scope.parse::<Scope>().map_err(|e| e.to_string())?;
    }
    let policy = case.policy.parse::<Policy>().map_err(|e| e.to_string())?;
    let options = PolicyOptions::from_kubelet_options(&case.policy_options).map_err(|e| e.to_string())?;
    let distances = case
        .numa_distances
        .clone()
        .map(NumaDistances::new)
        .transpose()
        .map_err(|e| e.to_string())?;
    let numa = NumaInfo::new(case.numa_nodes.iter().copied(), distances).map_err(|e| e.to_string())?;
    let providers = case
        .providers
        .iter()
        .map(|p| {
            let Some(map) = p else {
                return Ok(ProviderHints::no_preference());
            };
            let map = map
                .iter()
                .map(|(name, hints)| {
                    let hints = hints
                        .as_ref()
                        .map(|hs| hs.iter().map(hint).collect::<Result<Vec<_>, _>>());
                    Ok((name.clone(), hints.transpose()?))
                })
                .collect::<Result<BTreeMap<_, _>, String>>()?;
            Ok(ProviderHints::new(map))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let out = merge_hints(policy, &options, &numa, &providers).map_err(|e| e.to_string())?;
    let expected = TopologyHint {
        mask: case.expected.mask.as_deref().map(mask).transpose()?,
        preferred: case.expected.preferred,
    };
    if out.hint != expected || out.admit != case.expected.admit {
        return Err(format!(
            "got hint {} admit {}, expected hint {} admit {}",
            show(&out.hint),
            out.admit,
            show(&expected),
            case.expected.admit
        ));
    }
    Ok(())
}

fn expect_choice(text: &str) -> Result<Choice, String> {
    match text {
        "current" => Ok(Choice::Current),
        "candidate" => Ok(Choice::Candidate),
        other => Err(format!("unknown expected value {other:?}")),
    }
}

fn check_comparator(case: &ComparatorCase) -> Result<(), String> {
    let current = case.current.as_ref().map(hint).transpose()?;
    let candidate = hint(&case.candidate)?;
    let got = compare(
        current.as_ref(),
        &candidate,
        case.best_non_preferred_affinity_count,
    );
    let want = expect_choice(&case.expected)?;
    if got != want {
        return Err(format!("got {got:?}, expected {want:?}"));
    }
    Ok(())
}

fn check_closest(case: &ClosestCase) -> Result<(), String> {
    let distances = NumaDistances::new(case.numa_distances.clone()).map_err(|e| e.to_string())?;
    let ids = 0..u32::try_from(distances.size()).map_err(|e| e.to_string())?;
    let numa = NumaInfo::new(ids, Some(distances)).map_err(|e| e.to_string())?;
    let candidate_wins = numa
        .closest(mask(&case.candidate)?, mask(&case.current)?)
        .map_err(|e| e.to_string())?;
    let got = if candidate_wins {
        Choice::Candidate
    } else {
        Choice::Current
    };
    let want = expect_choice(&case.expected)?;
    if got != want {
        return Err(format!("got {got:?}, expected {want:?}"));
    }
    Ok(())
}

fn check_average(case: &AverageCase) -> Result<(), String> {
    let distances = NumaDistances::new(case.numa_distances.clone()).map_err(|e| e.to_string())?;
    let got = average_distance(&distances, mask(&case.mask)?).map_err(|e| e.to_string())?;
    if (got - case.expected_average).abs() > 1e-9 {
        return Err(format!("got {got}, expected {}", case.expected_average));
    }
    Ok(())
}

#[test]
fn all_vectors_conform() {
    let v = load();
    let mut failures = Vec::new();
    failures.extend(run("cases", &v.cases, |c| (c.id.clone(), check_merge(c))));
    failures.extend(run("comparator_cases", &v.comparator_cases.cases, |c| {
        (c.name.clone(), check_comparator(c))
    }));
    failures.extend(run("closest_cases", &v.closest_cases.cases, |c| {
        (c.name.clone(), check_closest(c))
    }));
    failures.extend(run(
        "average_distance_cases",
        &v.average_distance_cases.cases,
        |c| (format!("{:?}", c.mask), check_average(c)),
    ));
    assert!(
        failures.is_empty(),
        "{} vector(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The project's copy must stay a faithful copy of the shared vectors when both exist.
#[test]
fn project_copy_matches_shared_vectors() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let own = manifest.join("tests/data").join(FILE);
    assert!(own.exists(), "missing project copy {}", own.display());
    let shared = manifest.join("../../shared/conformance").join(FILE);
    if let Ok(shared_text) = std::fs::read_to_string(&shared) {
        let own_json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
        let shared_json: serde_json::Value = serde_json::from_str(&shared_text).unwrap();
        assert_eq!(
            own_json,
            shared_json,
            "tests/data copy differs from {}",
            shared.display()
        );
    }
}
