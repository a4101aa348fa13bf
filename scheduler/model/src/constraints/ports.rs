//! kube-scheduler's NodePorts: a host port the pod wants conflicts with one a pod already on the
//! node (any scheduler's, assumed ones too) binds: same protocol and port, and the same host IP
//! or `0.0.0.0` on either side.

use super::index::ConstraintIndex;
use crate::pod_facts::HostPort;

/// kube-scheduler's reason text.
pub const NO_FREE_PORTS: &str = "node(s) didn't have free ports for the requested pod ports";

/// `HostPortInfo.CheckConflict` of one wanted port against one in use.
pub fn conflicts(want: &HostPort, used: &HostPort) -> bool {
    want.port > 0
        && want.port == used.port
        && want.protocol == used.protocol
        && (want.ip == "0.0.0.0" || used.ip == "0.0.0.0" || want.ip == used.ip)
}

/// Whether every port in `want` is free on `node`.
pub fn fits(ix: &ConstraintIndex, want: &[HostPort], node: &str) -> bool {
    want.is_empty()
        || !ix
            .pods_on(node)
            .flat_map(|e| e.facts.host_ports.iter())
            .any(|used| want.iter().any(|w| conflicts(w, used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(ip: &str, protocol: &str, port: i32) -> HostPort {
        HostPort {
            ip: ip.into(),
            protocol: protocol.into(),
            port,
        }
    }

    #[test]
    fn conflict_rules() {
        assert!(conflicts(
            &p("0.0.0.0", "UDP", 8080),
            &p("127.0.0.1", "UDP", 8080)
        ));
        assert!(conflicts(
            &p("127.0.0.1", "TCP", 8080),
            &p("0.0.0.0", "TCP", 8080)
        ));
        assert!(!conflicts(
            &p("127.0.0.1", "TCP", 8080),
            &p("127.0.0.2", "TCP", 8080)
        ));
        assert!(!conflicts(&p("0.0.0.0", "TCP", 8080), &p("0.0.0.0", "UDP", 8080)));
        assert!(!conflicts(&p("0.0.0.0", "TCP", 8080), &p("0.0.0.0", "TCP", 8081)));
    }
}
