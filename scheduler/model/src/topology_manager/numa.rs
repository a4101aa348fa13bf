//! The machine's NUMA nodes and their distances (the kubelet's `NUMAInfo`).

use super::{NumaMask, TopologyManagerError};

/// Square NUMA distance matrix: row `i`, column `j` = distance from node id `i` to node id `j`
/// (indexed by node *id*, as the kubelet does; unused rows of missing ids may hold anything).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct NumaDistances {
    size: usize,
    flat: Vec<u64>,
}

impl NumaDistances {
    /// Matrix from its rows.
    ///
    /// # Errors
    /// [`TopologyManagerError::DistanceMatrixNotSquare`] if a row's length differs from the row count.
    pub fn new(rows: Vec<Vec<u64>>) -> Result<Self, TopologyManagerError> {
        let size = rows.len();
        let mut flat = Vec::with_capacity(size * size);
        for (row, values) in rows.into_iter().enumerate() {
            if values.len() != size {
                return Err(TopologyManagerError::DistanceMatrixNotSquare {
                    row,
                    len: values.len(),
                    expected: size,
                });
            }
            flat.extend(values);
        }
        Ok(Self { size, flat })
    }

    /// Rows (= columns) of the matrix; node ids below this have distances.
    #[must_use]
    pub const fn size(&self) -> usize {
        self.size
    }

    /// Distance from node `from` to node `to`, `None` if outside the matrix.
    #[must_use]
    pub fn get(&self, from: u32, to: u32) -> Option<u64> {
        let (from, to) = (from as usize, to as usize);
        if from >= self.size || to >= self.size {
            return None;
        }
        self.flat.get(from * self.size + to).copied()
    }

    /// True if every node of `mask` has a row and column.
    #[must_use]
    pub fn covers(&self, mask: NumaMask) -> bool {
        mask.iter().all(|id| (id as usize) < self.size)
    }

    /// Sum of `dist[i][j]` over all ordered pairs (i, j) of nodes in `mask`, including i = j.
    /// Comparing these integer sums for masks of equal count is exactly the kubelet's
    /// average-distance comparison, without float rounding.
    ///
    /// # Errors
    /// [`TopologyManagerError::DistanceMissing`] if a node of `mask` is outside the matrix.
    pub fn distance_sum(&self, mask: NumaMask) -> Result<u64, TopologyManagerError> {
        if let Some(id) = mask.iter().find(|&id| id as usize >= self.size) {
            return Err(TopologyManagerError::DistanceMissing { id, size: self.size });
        }
        Ok(self.sum_covered(mask))
    }

    /// [`Self::distance_sum`] for a mask already known to be covered.
    pub(super) fn sum_covered(&self, mask: NumaMask) -> u64 {
        let mut sum = 0u64;
        for i in mask {
            let row = i as usize * self.size;
            for j in mask {
                // Covered masks always index inside the matrix; 0 is never used.
                sum = sum.saturating_add(self.flat.get(row + j as usize).copied().unwrap_or(0));
            }
        }
        sum
    }

    /// The kubelet's `CalculateAverageFor`: [`Self::distance_sum`] / count², 0 for an empty mask.
    ///
    /// # Errors
    /// [`TopologyManagerError::DistanceMissing`] if a node of `mask` is outside the matrix.
    pub fn average_distance(&self, mask: NumaMask) -> Result<f64, TopologyManagerError> {
        let sum = self.distance_sum(mask)?;
        let count = f64::from(mask.count());
        // Empty mask: the kubelet guards the division the same way.
        Ok(if mask.is_empty() {
            0.0
        } else {
            sum as f64 / (count * count)
        })
    }
}

/// Free-function form of [`NumaDistances::average_distance`] (the kubelet's `CalculateAverageFor`).
///
/// # Errors
/// [`TopologyManagerError::DistanceMissing`] if a node of `mask` is outside the matrix.
pub fn average_distance(distances: &NumaDistances, mask: NumaMask) -> Result<f64, TopologyManagerError> {
    distances.average_distance(mask)
}

/// The NUMA nodes of one machine and, optionally, their distances.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NumaInfo {
    ids: Vec<u32>,
    default_affinity: NumaMask,
    distances: Option<NumaDistances>,
}

impl NumaInfo {
    /// Machine with the given node ids (any order, may be non-contiguous such as {0, 2}).
    ///
    /// # Errors
    /// [`TopologyManagerError::NoNumaNodes`], [`TopologyManagerError::NumaNodeIdOutOfRange`],
    /// [`TopologyManagerError::DuplicateNumaNode`], or [`TopologyManagerError::DistanceMissing`]
    /// if `distances` is given but lacks a node.
    pub fn new(
        ids: impl IntoIterator<Item = u32>,
        distances: Option<NumaDistances>,
    ) -> Result<Self, TopologyManagerError> {
        let mut default_affinity = NumaMask::EMPTY;
        for id in ids {
            let bit = NumaMask::single(id)?;
            if !(default_affinity & bit).is_empty() {
                return Err(TopologyManagerError::DuplicateNumaNode { id });
            }
            default_affinity = default_affinity | bit;
        }
        if default_affinity.is_empty() {
            return Err(TopologyManagerError::NoNumaNodes);
        }
        if let Some(d) = &distances {
            d.distance_sum(default_affinity)?;
        }
        Ok(Self {
            ids: default_affinity.iter().collect(),
            default_affinity,
            distances,
        })
    }

    /// Node ids, ascending.
    #[must_use]
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Number of NUMA nodes.
    #[must_use]
    pub fn node_count(&self) -> usize {
        self.ids.len()
    }

    /// Mask of all nodes (the kubelet's default affinity).
    #[must_use]
    pub const fn default_affinity(&self) -> NumaMask {
        self.default_affinity
    }

    /// The distance matrix, if known.
    #[must_use]
    pub const fn distances(&self) -> Option<&NumaDistances> {
        self.distances.as_ref()
    }

    /// The kubelet's `NUMAInfo.Closest(candidate, current)`: true if `candidate` is the better
    /// mask — fewer nodes; same count → lower average distance; same distance → lower value.
    ///
    /// # Errors
    /// [`TopologyManagerError::MissingNumaDistances`] without a distance matrix,
    /// [`TopologyManagerError::DistanceMissing`] if a mask has a node outside it.
    pub fn closest(&self, candidate: NumaMask, current: NumaMask) -> Result<bool, TopologyManagerError> {
        let distances = self
            .distances
            .as_ref()
            .ok_or(TopologyManagerError::MissingNumaDistances)?;
        if candidate.count() != current.count() {
            return Ok(candidate.is_narrower_than(current));
        }
        let (a, b) = (
            distances.distance_sum(candidate)?,
            distances.distance_sum(current)?,
        );
        Ok(if a == b {
            candidate.value() < current.value()
        } else {
            a < b
        })
    }

    /// Average distance of `mask` ([`NumaDistances::average_distance`]).
    ///
    /// # Errors
    /// As [`NumaInfo::closest`].
    pub fn average_distance(&self, mask: NumaMask) -> Result<f64, TopologyManagerError> {
        self.distances
            .as_ref()
            .ok_or(TopologyManagerError::MissingNumaDistances)?
            .average_distance(mask)
    }
}
