//! `NumaMask`: a set of NUMA node ids in one machine word.

use std::fmt;
use std::iter::FusedIterator;
use std::ops::{BitAnd, BitOr};

use super::TopologyManagerError;

/// Highest NUMA node id a [`NumaMask`] can hold (the kubelet's bitmask is 64 bits too).
pub const MAX_NUMA_NODE_ID: u32 = 63;

/// A set of NUMA node ids; node `n` is bit `n`.
///
/// The integer value ([`NumaMask::value`]) is the kubelet's tie-breaker: among masks with the
/// same number of nodes the lower value wins ({1,2} = 6 beats {0,3} = 9).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NumaMask(u64);

impl NumaMask {
    /// The mask without any node.
    pub const EMPTY: Self = Self(0);

    /// Mask from its raw bits (bit `n` = node `n`).
    #[must_use]
    pub const fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// Mask holding exactly `id`.
    ///
    /// # Errors
    /// [`TopologyManagerError::NumaNodeIdOutOfRange`] if `id` > 63.
    pub fn single(id: u32) -> Result<Self, TopologyManagerError> {
        if id > MAX_NUMA_NODE_ID {
            return Err(TopologyManagerError::NumaNodeIdOutOfRange { id: u64::from(id) });
        }
        Ok(Self(1 << id))
    }

    /// Mask holding every id of `ids` (duplicates are harmless).
    ///
    /// # Errors
    /// [`TopologyManagerError::NumaNodeIdOutOfRange`] for the first id > 63.
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Result<Self, TopologyManagerError> {
        ids.into_iter()
            .try_fold(Self::EMPTY, |acc, id| Ok(acc | Self::single(id)?))
    }

    /// Raw bits, which are also the kubelet's comparison value.
    #[must_use]
    pub const fn value(self) -> u64 {
        self.0
    }

    /// Number of nodes in the mask.
    #[must_use]
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// True if the mask holds no node.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True if node `id` is in the mask (always false for ids > 63).
    #[must_use]
    pub const fn contains(self, id: u32) -> bool {
        id <= MAX_NUMA_NODE_ID && self.0 & (1 << id) != 0
    }

    /// Nodes in both masks.
    #[must_use]
    pub const fn and(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// Nodes in either mask.
    #[must_use]
    pub const fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The kubelet's `IsNarrowerThan`: fewer nodes wins; same count → lower value wins.
    /// Equal masks are not narrower than each other.
    #[must_use]
    pub const fn is_narrower_than(self, other: Self) -> bool {
        let (a, b) = (self.count(), other.count());
        if a == b { self.0 < other.0 } else { a < b }
    }

    /// Node ids in ascending order.
    #[must_use]
    pub const fn iter(self) -> NumaMaskIter {
        NumaMaskIter(self.0)
    }
}

impl BitAnd for NumaMask {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        self.and(rhs)
    }
}

impl BitOr for NumaMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.or(rhs)
    }
}

impl IntoIterator for NumaMask {
    type Item = u32;
    type IntoIter = NumaMaskIter;
    fn into_iter(self) -> NumaMaskIter {
        self.iter()
    }
}

/// Shown as the id list, e.g. `{0,2}`.
impl fmt::Display for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, id) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{id}")?;
        }
        f.write_str("}")
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NumaMask{self}")
    }
}

/// Iterator over the node ids of a [`NumaMask`], ascending.
#[derive(Debug, Clone)]
pub struct NumaMaskIter(u64);

impl Iterator for NumaMaskIter {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let id = self.0.trailing_zeros();
        // Clear the lowest set bit.
        self.0 &= self.0 - 1;
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for NumaMaskIter {}
impl FusedIterator for NumaMaskIter {}
