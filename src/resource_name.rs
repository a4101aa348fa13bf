//! Kubernetes resource names: one classification for the exporter (what a zone row is), the
//! scheduler (how a request is aligned) and the allocator (which pool names are valid).

/// Logical CPUs.
pub const CPU: &str = "cpu";
/// Regular memory (also the kubelet's memory type).
pub const MEMORY: &str = "memory";
/// Prefix of hugepage resources and memory types (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

/// What a resource name denotes, with the upstream predicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `cpu`.
    Cpu,
    /// `memory`.
    Memory,
    /// `hugepages-<size>`.
    Hugepages,
    /// Other native resources (no domain, or a domain ending in `kubernetes.io`):
    /// `ephemeral-storage`, `pods`, … No NUMA affinity.
    Native,
    /// Extended resources (devices): a domain that does not end in `kubernetes.io`.
    Extended,
}

/// Classifies `name`.
pub fn classify(name: &str) -> Class {
    match name {
        CPU => Class::Cpu,
        MEMORY => Class::Memory,
        n if n.starts_with(HUGEPAGES_PREFIX) => Class::Hugepages,
        n if is_native(n) => Class::Native,
        _ => Class::Extended,
    }
}

/// Native: no domain, or a domain ending in `kubernetes.io` (`IsNativeResource`).
pub fn is_native(name: &str) -> bool {
    match name.split_once('/') {
        None => true,
        Some((domain, _)) => domain.ends_with("kubernetes.io"),
    }
}

/// `memory` or `hugepages-<something>`: a kubelet memory type.
pub fn is_memory_type(name: &str) -> bool {
    name == MEMORY
        || name
            .strip_prefix(HUGEPAGES_PREFIX)
            .is_some_and(|size| !size.is_empty())
}

/// A name a device plugin may register: `domain/name` with a DNS domain (at least one dot)
/// outside `kubernetes.io` and a qualified-name part (the kubelet refuses others).
pub fn is_valid_extended(r: &str) -> bool {
    let Some((domain, name)) = r.split_once('/') else {
        return false;
    };
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    dns(domain) && domain.contains('.') && !domain.ends_with("kubernetes.io") && name_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_classified_like_upstream() {
        assert_eq!(classify("cpu"), Class::Cpu);
        assert_eq!(classify("memory"), Class::Memory);
        assert_eq!(classify("hugepages-2Mi"), Class::Hugepages);
        assert_eq!(classify("ephemeral-storage"), Class::Native);
        assert_eq!(classify("example.kubernetes.io/foo"), Class::Native);
        assert_eq!(classify("nvidia.com/gpu"), Class::Extended);
        assert!(is_memory_type("hugepages-1Gi") && is_memory_type("memory"));
        assert!(!is_memory_type("hugepages-") && !is_memory_type("cpu"));
        assert!(is_valid_extended("example.com/gpu"));
        for bad in [
            "gpu",
            "example/gpu",
            "kubernetes.io/gpu",
            "example.com/",
            "Example.com/gpu",
            "example.com/-x",
        ] {
            assert!(!is_valid_extended(bad), "{bad}");
        }
    }
}
