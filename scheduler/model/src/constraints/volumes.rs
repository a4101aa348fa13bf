//! kube-scheduler's VolumeRestrictions for in-tree disks: the same GCE PD (unless every mount is
//! read-only), the same AWS EBS volume, the same iSCSI IQN (unless all read-only), or the same
//! RBD image (an overlapping monitor, same pool and image, unless all read-only) cannot be used
//! by two pods on one node.

use super::index::ConstraintIndex;
use crate::pod_facts::RestrictedVolume;

/// kube-scheduler's reason text.
pub const DISK_CONFLICT: &str = "node(s) had no available disk";

/// `isVolumeConflict` for one pair of volumes.
pub fn conflicts(a: &RestrictedVolume, b: &RestrictedVolume) -> bool {
    use RestrictedVolume::*;
    match (a, b) {
        (
            GcePd {
                name: x,
                read_only: rx,
            },
            GcePd {
                name: y,
                read_only: ry,
            },
        ) => x == y && !(*rx && *ry),
        (AwsEbs { id: x }, AwsEbs { id: y }) => x == y,
        (
            Iscsi {
                iqn: x,
                read_only: rx,
            },
            Iscsi {
                iqn: y,
                read_only: ry,
            },
        ) => x == y && !(*rx && *ry),
        (
            Rbd {
                monitors: mx,
                pool: px,
                image: ix,
                read_only: rx,
            },
            Rbd {
                monitors: my,
                pool: py,
                image: iy,
                read_only: ry,
            },
        ) => mx.iter().any(|m| my.contains(m)) && px == py && ix == iy && !(*rx && *ry),
        _ => false,
    }
}

/// Whether none of `want` conflicts with a volume of a pod on `node`.
pub fn fits(ix: &ConstraintIndex, want: &[RestrictedVolume], node: &str) -> bool {
    want.is_empty()
        || !ix
            .pods_on(node)
            .flat_map(|e| e.facts.volumes.iter())
            .any(|used| want.iter().any(|w| conflicts(w, used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rbd(monitors: &[&str], image: &str, read_only: bool) -> RestrictedVolume {
        RestrictedVolume::Rbd {
            monitors: monitors.iter().map(|m| (*m).to_owned()).collect(),
            pool: "rbd".into(),
            image: image.into(),
            read_only,
        }
    }

    #[test]
    fn read_only_nuances() {
        let gce = |ro| RestrictedVolume::GcePd {
            name: "d".into(),
            read_only: ro,
        };
        assert!(conflicts(&gce(false), &gce(true)));
        assert!(!conflicts(&gce(true), &gce(true)));
        let ebs = RestrictedVolume::AwsEbs { id: "v".into() };
        assert!(conflicts(&ebs, &ebs), "EBS conflicts even read-only");
        assert!(conflicts(
            &rbd(&["a", "b"], "i", false),
            &rbd(&["b", "c"], "i", true)
        ));
        assert!(!conflicts(&rbd(&["a"], "i", false), &rbd(&["c"], "i", false)));
        assert!(!conflicts(&rbd(&["a"], "i", true), &rbd(&["a"], "i", true)));
        assert!(!conflicts(&gce(false), &ebs));
    }
}
