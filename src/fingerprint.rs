//! Pod-set fingerprint, bit-compatible with k8stopologyawareschedwg/podfingerprint v0.2.2
//! (format `pfp0` + `v001`).
//!
//! The exporter publishes the fingerprint of the pods it accounted for; the scheduler recomputes it
//! over the pods it believes are on the node and resyncs its cache only when both agree. A pod is
//! identified by its namespace/name pair only, and the set is a multiset (duplicates count).
//!
//! Algorithm: per pod `h = XXH64(name, seed = XXH64(namespace, seed 0))`; sort the hashes
//! ascending; hash them as 8-byte little-endian words with XXH64 (seed 0); render the digest as 16
//! lowercase hex digits (big-endian, as Go's `hash.Sum` appends) after `pfp0v001`.

use std::fmt;
use std::str::FromStr;

use xxhash_rust::xxh64::{Xxh64, xxh64};

/// Prefix common to all fingerprints (always 4 bytes).
pub const PREFIX: &str = "pfp0";
/// Fingerprint format version produced and accepted here (always 4 bytes).
pub const VERSION: &str = "v001";
/// NodeResourceTopology attribute carrying the fingerprint.
pub const ATTRIBUTE_FINGERPRINT: &str = "nodeTopologyPodsFingerprint";
/// NodeResourceTopology attribute declaring which pods entered the fingerprint ([`Method`]).
pub const ATTRIBUTE_METHOD: &str = "nodeTopologyPodsFingerprintMethod";
/// Legacy object annotation carrying the fingerprint.
pub const ANNOTATION_FINGERPRINT: &str = "topology.node.k8s.io/fingerprint";

/// Fingerprint of the empty pod set (XXH64 of no bytes).
pub const EMPTY_SIGNATURE: &str = "pfp0v001ef46db3751d8e999";

// Upstream length rules: a signature shorter than prefix + version + 8 is malformed.
const PREFIX_LEN: usize = 4;
const VERSION_LEN: usize = 4;
const MIN_SUM_LEN: usize = 8;

/// Why a published fingerprint does not validate against a pod set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FingerprintError {
    /// Too short to hold prefix, version and digest, or the prefix is not `pfp0`.
    #[error("malformed pod fingerprint")]
    Malformed,
    /// Well formed, but of a format version other than `v001`.
    #[error("incompatible pod fingerprint version {version:?} (supported: {VERSION})")]
    IncompatibleVersion {
        /// The 4-byte version field found in the signature (lossily decoded if not UTF-8).
        version: String,
    },
    /// Compatible, but computed over a different pod set.
    #[error("pod fingerprint mismatch: expected {expected}, computed {computed}")]
    Mismatch {
        /// The signature that was checked.
        expected: String,
        /// The signature of the local pod set.
        computed: String,
    },
}

/// Accumulates the pod set and signs it.
///
/// Mirrors upstream's `Fingerprint`: adding is cheap (one pair of hashes); sorting and the final
/// hash happen in [`Fingerprint::sign`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    hashes: Vec<u64>,
}

impl Fingerprint {
    /// An empty pod set; `capacity` is a hint for the expected number of pods.
    pub fn new(capacity: usize) -> Self {
        Self {
            hashes: Vec::with_capacity(capacity),
        }
    }

    /// Adds one pod by namespace and name (duplicates are kept).
    pub fn add(&mut self, namespace: &str, name: &str) {
        self.hashes.push(pod_hash(namespace, name));
    }

    /// Adds one pod by its [`pod_hash`], for callers that hash a pod once and sign many sets.
    pub fn add_hash(&mut self, hash: u64) {
        self.hashes.push(hash);
    }

    /// Number of pods added so far.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// True if no pod was added.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The 64-bit digest of the current pod set.
    pub fn digest(&self) -> u64 {
        // Sort a copy so signing stays a read-only operation; pod sets are small.
        let mut sorted = self.hashes.clone();
        sorted.sort_unstable();
        let mut hasher = Xxh64::new(0);
        for h in &sorted {
            hasher.update(&h.to_le_bytes());
        }
        hasher.digest()
    }

    /// The signature of the current pod set: `pfp0v001` + 16 lowercase hex digits.
    pub fn sign(&self) -> String {
        format!("{PREFIX}{VERSION}{:016x}", self.digest())
    }

    /// Checks a published signature against the current pod set, with upstream's distinctions
    /// between malformed, incompatible and mismatching signatures.
    pub fn check(&self, expected: &str) -> Result<(), FingerprintError> {
        // Byte-wise, as Go slices strings; a multi-byte character can never match anyway.
        let bytes = expected.as_bytes();
        if bytes.len() < PREFIX_LEN + VERSION_LEN + MIN_SUM_LEN {
            return Err(FingerprintError::Malformed);
        }
        if &bytes[..PREFIX_LEN] != PREFIX.as_bytes() {
            return Err(FingerprintError::Malformed);
        }
        let version = &bytes[PREFIX_LEN..PREFIX_LEN + VERSION_LEN];
        if version != VERSION.as_bytes() {
            return Err(FingerprintError::IncompatibleVersion {
                version: String::from_utf8_lossy(version).into_owned(),
            });
        }
        let computed = self.sign();
        if computed != expected {
            return Err(FingerprintError::Mismatch {
                expected: expected.to_owned(),
                computed,
            });
        }
        Ok(())
    }
}

/// Hash of one pod: XXH64 of the name, seeded with XXH64 of the namespace.
pub fn pod_hash(namespace: &str, name: &str) -> u64 {
    xxh64(name.as_bytes(), xxh64(namespace.as_bytes(), 0))
}

/// Signature of a pod set given as `(namespace, name)` pairs.
pub fn compute<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    fingerprint_of(pods).sign()
}

/// Checks `expected` against the signature of a pod set given as `(namespace, name)` pairs.
pub fn check<'a>(
    expected: &str,
    computed_over: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), FingerprintError> {
    fingerprint_of(computed_over).check(expected)
}

/// Upstream's `IsVersionCompatible`: a version field must be exactly 4 bytes (else malformed);
/// it is compatible only if it equals `v001`.
pub fn is_version_compatible(version: &str) -> Result<bool, FingerprintError> {
    if version.len() != VERSION_LEN {
        return Err(FingerprintError::Malformed);
    }
    Ok(version == VERSION)
}

fn fingerprint_of<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str)>) -> Fingerprint {
    let pods = pods.into_iter();
    let mut fp = Fingerprint::new(pods.size_hint().0);
    for (namespace, name) in pods {
        fp.add(namespace, name);
    }
    fp
}

/// Which pods enter the fingerprint (value of [`ATTRIBUTE_METHOD`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Every pod the kubelet reports.
    All,
    /// Only pods holding at least one exclusively assigned resource (RTE's default).
    WithExclusiveResources,
}

impl Method {
    /// The attribute value: `all` or `with-exclusive-resources`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::All => "all",
            Method::WithExclusiveResources => "with-exclusive-resources",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fingerprint method value other than `all` or `with-exclusive-resources`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pod fingerprint method {value:?} (expected \"all\" or \"with-exclusive-resources\")")]
pub struct UnknownMethodError {
    /// The rejected value.
    pub value: String,
}

impl FromStr for Method {
    type Err = UnknownMethodError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Exact and case-sensitive, as upstream compares the attribute with `==`.
        match s {
            "all" => Ok(Method::All),
            "with-exclusive-resources" => Ok(Method::WithExclusiveResources),
            other => Err(UnknownMethodError {
                value: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    const VECTORS: &str = include_str!("testdata/fingerprint_vectors.json");
    const EXPORTER_CASES: &str = include_str!("testdata/exporter_fingerprint_cases.json");

    fn vectors() -> Value {
        serde_json::from_str(VECTORS).expect("fingerprint_vectors.json")
    }

    fn pods_of(v: &Value) -> Vec<(String, String)> {
        v.as_array()
            .expect("pods array")
            .iter()
            .map(|p| match p {
                // {"namespace": .., "name": ..} in the vectors file, [ns, name] in exporter cases.
                Value::Object(o) => (
                    o["namespace"].as_str().expect("namespace").to_owned(),
                    o["name"].as_str().expect("name").to_owned(),
                ),
                Value::Array(a) => (
                    a[0].as_str().expect("namespace").to_owned(),
                    a[1].as_str().expect("name").to_owned(),
                ),
                other => panic!("unexpected pod entry {other}"),
            })
            .collect()
    }

    fn sign(pods: &[(String, String)]) -> String {
        compute(pods.iter().map(|(ns, n)| (ns.as_str(), n.as_str())))
    }

    fn testdata_259() -> Vec<(String, String)> {
        let v = vectors();
        let entry = v["vectors"]
            .as_array()
            .expect("vectors")
            .iter()
            .find(|e| e["name"].as_str().is_some_and(|n| n.contains("259 pods")))
            .expect("259-pod vector");
        let pods = pods_of(&entry["pods"]);
        assert_eq!(pods.len(), 259);
        pods
    }

    #[test]
    fn known_hashes() {
        let v = vectors();
        let known = v["knownHashes"].as_object().expect("knownHashes");
        assert_eq!(known.len(), 2);
        assert_eq!(known["xxh64(\"\")"], format!("{:016x}", xxh64(b"", 0)));
        assert_eq!(known["xxh64(\"abc\")"], format!("{:016x}", xxh64(b"abc", 0)));
    }

    #[test]
    fn vectors_match() {
        let v = vectors();
        let list = v["vectors"].as_array().expect("vectors");
        assert_eq!(list.len(), 5);
        for entry in list {
            let name = entry["name"].as_str().expect("name");
            let pods = pods_of(&entry["pods"]);
            let expected = entry["expected"].as_str().expect("expected");
            assert_eq!(sign(&pods), expected, "vector {name}");
            // The debug section pins the intermediate values too.
            if let Some(debug) = entry.get("debug") {
                let mut hashes = Vec::new();
                for ph in debug["podHashes"].as_array().expect("podHashes") {
                    let ns = ph["namespace"].as_str().expect("namespace");
                    let pod = ph["name"].as_str().expect("name");
                    let ns_hash = format!("{:016x}", xxh64(ns.as_bytes(), 0));
                    assert_eq!(ns_hash, ph["nsHash"].as_str().expect("nsHash"), "{name}: nsHash");
                    let h = pod_hash(ns, pod);
                    assert_eq!(
                        format!("{h:016x}"),
                        ph["podHash"].as_str().expect("podHash"),
                        "{name}"
                    );
                    hashes.push(h);
                }
                hashes.sort_unstable();
                let sorted: Vec<String> = hashes.iter().map(|h| format!("{h:016x}")).collect();
                let want: Vec<&str> = debug["sortedHashes"]
                    .as_array()
                    .expect("sortedHashes")
                    .iter()
                    .map(|s| s.as_str().expect("hash"))
                    .collect();
                assert_eq!(sorted, want, "{name}: sortedHashes");
                let mut fp = Fingerprint::new(0);
                for (ns, n) in &pods {
                    fp.add(ns, n);
                }
                assert_eq!(
                    format!("{:016x}", fp.digest()),
                    debug["sumHex"].as_str().expect("sumHex")
                );
            }
            // Order independence: the reversed list signs the same.
            let mut reversed = pods.clone();
            reversed.reverse();
            assert_eq!(sign(&reversed), expected, "vector {name} reversed");
        }
    }

    #[test]
    fn check_vectors() {
        let v = vectors();
        let pods = testdata_259();
        let list = v["checkVectors"].as_array().expect("checkVectors");
        assert_eq!(list.len(), 4);
        for entry in list {
            assert_eq!(entry["pods"], "testdata-259");
            let input = entry["input"].as_str().expect("input");
            let got = check(input, pods.iter().map(|(ns, n)| (ns.as_str(), n.as_str())));
            match entry["expect"].as_str().expect("expect") {
                "ok" => assert_eq!(got, Ok(()), "{input}"),
                "ErrMalformed" => assert_eq!(got, Err(FingerprintError::Malformed), "{input}"),
                "ErrIncompatibleVersion" => assert_eq!(
                    got,
                    Err(FingerprintError::IncompatibleVersion {
                        version: input[4..8].to_owned()
                    }),
                    "{input}"
                ),
                "ErrSignatureMismatch" => assert_eq!(
                    got,
                    Err(FingerprintError::Mismatch {
                        expected: input.to_owned(),
                        computed: "pfp0v001e477a4e3b2fc0ec6".to_owned(),
                    }),
                    "{input}"
                ),
                other => panic!("unknown expectation {other}"),
            }
        }
    }

    #[test]
    fn version_vectors() {
        let v = vectors();
        let list = v["versionVectors"].as_array().expect("versionVectors");
        assert_eq!(list.len(), 5);
        for entry in list {
            let version = entry["version"].as_str().expect("version");
            let got = is_version_compatible(version);
            match entry["expect"].as_str().expect("expect") {
                "ErrMalformed" => assert_eq!(got, Err(FingerprintError::Malformed), "{version:?}"),
                "incompatible (false, no error)" => assert_eq!(got, Ok(false), "{version:?}"),
                "compatible" => assert_eq!(got, Ok(true), "{version:?}"),
                other => panic!("unknown expectation {other}"),
            }
        }
    }

    /// Test-only copy of the exporter's `with-exclusive-resources` rule, enough for the recorded
    /// case: a pod qualifies if a container holds CPU ids, NUMA-pinned memory or NUMA-affine devices.
    fn has_exclusive(pod: &Value) -> bool {
        let pinned = |items: Option<&Value>| {
            items.and_then(Value::as_array).is_some_and(|items| {
                items.iter().any(|item| {
                    item.pointer("/topology/nodes")
                        .and_then(Value::as_array)
                        .is_some_and(|nodes| nodes.iter().any(|n| n["id"].as_i64().is_some_and(|id| id >= 0)))
                })
            })
        };
        pod["containers"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["cpu_ids"].as_array().is_some_and(|ids| !ids.is_empty())
                    || pinned(c.get("memory"))
                    || pinned(c.get("devices"))
            })
        })
    }

    #[test]
    fn exporter_fingerprint_cases() {
        let root: Value = serde_json::from_str(EXPORTER_CASES).expect("exporter_fingerprint_cases.json");
        let list = root["fingerprint_cases"]["vectors"].as_array().expect("vectors");
        assert_eq!(list.len(), 10);
        let shared_list = list
            .iter()
            .find_map(|e| e.get("list"))
            .and_then(|l| l["pod_resources"].as_array())
            .expect("pod_resources list");
        for entry in list {
            let name = entry["name"].as_str().expect("name");
            let expected = entry["expect"].as_str().expect("expect");
            let pods: Vec<(String, String)> = if let Some(pods) = entry.get("pods") {
                pods_of(pods)
            } else if entry.get("pods_ref").is_some() {
                testdata_259()
            } else {
                let method: Method = entry["method"].as_str().expect("method").parse().expect("method");
                shared_list
                    .iter()
                    .filter(|p| method == Method::All || has_exclusive(p))
                    .map(|p| {
                        (
                            p["namespace"].as_str().expect("namespace").to_owned(),
                            p["name"].as_str().expect("name").to_owned(),
                        )
                    })
                    .collect()
            };
            assert_eq!(sign(&pods), expected, "case {name}");
            assert_eq!(
                check(expected, pods.iter().map(|(a, b)| (a.as_str(), b.as_str()))),
                Ok(())
            );
        }
    }

    #[test]
    fn empty_set() {
        assert_eq!(compute(std::iter::empty()), EMPTY_SIGNATURE);
        assert_eq!(Fingerprint::new(8).sign(), EMPTY_SIGNATURE);
        assert!(Fingerprint::default().is_empty());
    }

    #[test]
    fn builder_and_free_function_agree() {
        let mut fp = Fingerprint::new(2);
        fp.add("ns-b", "pod-2");
        fp.add("ns-a", "pod-1");
        assert_eq!(fp.len(), 2);
        let signed = fp.sign();
        assert_eq!(signed, "pfp0v0016286110a65685aa4");
        // Signing does not consume or reorder observable state.
        assert_eq!(fp.sign(), signed);
        assert_eq!(fp.check(&signed), Ok(()));
        assert_eq!(compute([("ns-a", "pod-1"), ("ns-b", "pod-2")]), signed);
    }

    #[test]
    fn check_distinctions() {
        let pods = [("default", "test-pod-0")];
        let good = "pfp0v001fe53c4dbd2c5f4a0";
        assert_eq!(check(good, pods), Ok(()));
        // Shorter than 16 bytes, even with a valid prefix and version.
        assert_eq!(check("pfp0v001abcdef0", pods), Err(FingerprintError::Malformed));
        assert_eq!(check("", pods), Err(FingerprintError::Malformed));
        // 16 bytes is long enough to be judged on content.
        assert!(matches!(
            check("pfp0v00112345678", pods),
            Err(FingerprintError::Mismatch { .. })
        ));
        assert_eq!(
            check("PFP0v001fe53c4dbd2c5f4a0", pods),
            Err(FingerprintError::Malformed)
        );
        assert_eq!(
            check("pfp0v002fe53c4dbd2c5f4a0", pods),
            Err(FingerprintError::IncompatibleVersion {
                version: "v002".into()
            })
        );
        // Upper-case hex or trailing bytes are a mismatch, not malformed (upstream compares strings).
        assert!(matches!(
            check("pfp0v001FE53C4DBD2C5F4A0", pods),
            Err(FingerprintError::Mismatch { .. })
        ));
        assert!(matches!(
            check("pfp0v001fe53c4dbd2c5f4a0 ", pods),
            Err(FingerprintError::Mismatch { .. })
        ));
        // Non-ASCII bytes straddling the version field must not panic.
        assert!(matches!(
            check("pfp0vé01fe53c4dbd2c5f4a0", pods),
            Err(FingerprintError::IncompatibleVersion { .. })
        ));
        assert_eq!(
            check("pféfe53c4dbd2c5f4a0", pods),
            Err(FingerprintError::Malformed)
        );
    }

    #[test]
    fn multiset_and_no_aliasing() {
        let once = compute([("default", "test-pod-0")]);
        let twice = compute([("default", "test-pod-0"), ("default", "test-pod-0")]);
        assert_ne!(once, twice);
        assert_eq!(twice, "pfp0v0017e488ad73adb8253");
        assert_ne!(compute([("ab", "c")]), compute([("a", "bc")]));
    }

    #[test]
    fn method_round_trip() {
        for m in [Method::All, Method::WithExclusiveResources] {
            assert_eq!(m.to_string().parse::<Method>(), Ok(m));
        }
        assert_eq!(Method::All.to_string(), "all");
        assert_eq!(
            Method::WithExclusiveResources.as_str(),
            "with-exclusive-resources"
        );
        for bad in ["", "All", "exclude-terminal", "with-exclusive-resources "] {
            assert_eq!(
                bad.parse::<Method>(),
                Err(UnknownMethodError {
                    value: bad.to_owned()
                })
            );
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            FingerprintError::Malformed.to_string(),
            "malformed pod fingerprint"
        );
        let e = FingerprintError::Mismatch {
            expected: "a".into(),
            computed: "b".into(),
        };
        assert_eq!(e.to_string(), "pod fingerprint mismatch: expected a, computed b");
    }
}
