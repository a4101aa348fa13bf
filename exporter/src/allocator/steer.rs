//! Which devices to prefer when the kubelet asks (`GetPreferredAllocation`): the plan the
//! scheduler recorded for a pod being admitted. Pure: the caller gathers the candidates.
//!
//! The kubelet's request names no pod. Candidates are pods bound to this node whose record
//! plans devices of the resource and that hold none of it yet (`kubelet-topology-manager.md`
//! §6.4); the caller keeps only the pods pod-resources `List` names, since the kubelet adds
//! each pod of a batch to its pod manager just before admitting it. A plan is
//! honoured when it has exactly the requested size and lies inside what the kubelet offers
//! (`available` plus `must_include`). Among several, the candidate bound first wins: the order
//! the kubelet's watch delivers pods in, which decides when no `List` could narrow them. The
//! kubelet has already narrowed `available` to its NUMA-aligned set, so a wrong pick among
//! equal plans can only swap devices between pods planned in the same zone.

use std::collections::BTreeSet;

/// A pod that may be the one being admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// `namespace/name`.
    pub key: String,
    /// When the pod watch saw it bound (see `Recorded::arrival`); earlier pods are admitted
    /// first.
    pub arrival: u64,
    /// Planned IDs of the resource, per container that plans any, in record order.
    pub plans: Vec<Vec<String>>,
}

/// The kubelet's question for one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Devices it may choose from (NUMA-aligned already).
    pub available: Vec<String>,
    /// Devices already chosen (reused from init containers); part of the answer.
    pub must_include: Vec<String>,
    /// Devices wanted in total.
    pub size: usize,
}

/// Why no plan was honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No pod with a plan for this resource is waiting.
    NoCandidate,
    /// Candidates exist, but no plan has the size and lies inside what the kubelet offers.
    NotHonourable,
}

/// The honoured plan: which pod and which devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The pod whose plan is used.
    pub key: String,
    /// The devices, as planned.
    pub devices: Vec<String>,
}

/// The first-bound candidate's first plan that the request can honour.
pub fn choose(candidates: &[Candidate], req: &Request) -> Result<Choice, Miss> {
    if candidates.iter().all(|c| c.plans.is_empty()) {
        return Err(Miss::NoCandidate);
    }
    let offered: BTreeSet<&str> = req
        .available
        .iter()
        .chain(&req.must_include)
        .map(String::as_str)
        .collect();
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by(|a, b| a.arrival.cmp(&b.arrival).then_with(|| a.key.cmp(&b.key)));
    for c in order {
        for plan in &c.plans {
            let fits = plan.len() == req.size
                && plan.iter().all(|id| offered.contains(id.as_str()))
                && req.must_include.iter().all(|m| plan.contains(m));
            if fits {
                return Ok(Choice {
                    key: c.key.clone(),
                    devices: plan.clone(),
                });
            }
        }
    }
    Err(Miss::NotHonourable)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ids(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| (*x).to_owned()).collect()
    }

    fn cand(key: &str, arrival: u64, plans: &[&[&str]]) -> Candidate {
        Candidate {
            key: key.to_owned(),
            arrival,
            plans: plans.iter().map(|p| ids(p)).collect(),
        }
    }

    fn req(available: &[&str], must: &[&str], size: usize) -> Request {
        Request {
            available: ids(available),
            must_include: ids(must),
            size,
        }
    }

    #[test]
    fn first_bound_honourable_plan_wins() {
        let c = [cand("ns/b", 20, &[&["g1"]]), cand("ns/a", 10, &[&["g0"]])];
        let got = choose(&c, &req(&["g0", "g1", "g2"], &[], 1)).unwrap();
        assert_eq!((got.key.as_str(), got.devices), ("ns/a", ids(&["g0"])));
        // a's device is gone (admitted): b's plan is the one that fits.
        let got = choose(&c, &req(&["g1", "g2"], &[], 1)).unwrap();
        assert_eq!(got.key, "ns/b");
    }

    #[test]
    fn size_containment_and_must_include_are_required() {
        let c = [cand("ns/a", 1, &[&["g0", "g1"]])];
        assert_eq!(
            choose(&c, &req(&["g0", "g1", "g2"], &[], 1)),
            Err(Miss::NotHonourable)
        );
        assert_eq!(choose(&c, &req(&["g0", "g2"], &[], 2)), Err(Miss::NotHonourable));
        assert_eq!(
            choose(&c, &req(&["g1", "g2"], &["g2"], 2)),
            Err(Miss::NotHonourable)
        );
        let got = choose(&c, &req(&["g1"], &["g0"], 2)).unwrap();
        assert_eq!(got.devices, ids(&["g0", "g1"]));
    }

    #[test]
    fn second_container_takes_its_own_plan() {
        let c = [cand("ns/a", 1, &[&["g0"], &["g3"]])];
        assert_eq!(
            choose(&c, &req(&["g1", "g3"], &[], 1)).unwrap().devices,
            ids(&["g3"])
        );
    }

    #[test]
    fn no_candidate_is_told_apart() {
        assert_eq!(choose(&[], &req(&["g0"], &[], 1)), Err(Miss::NoCandidate));
        assert_eq!(
            choose(&[cand("ns/a", 1, &[])], &req(&["g0"], &[], 1)),
            Err(Miss::NoCandidate)
        );
    }
}
