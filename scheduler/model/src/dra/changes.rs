//! Which nodes' DRA devices changed, in order: a cached verdict on a node stays valid while
//! neither its devices nor the cluster-wide DRA objects changed since it was made.
//!
//! Every change of what an allocation reads (DeviceClasses, ResourceSlices, the devices claims
//! hold) is noted with the node it concerns, or with none when it can concern every node (a
//! DeviceClass, a slice without a node name, an allocation from such a slice). A reader keeps
//! the generation it last saw and asks what changed since.

use std::collections::VecDeque;

use k8s_openapi::api::resource::v1::AllocationResult;

use super::slice::ResourceSlice;

/// Changes remembered by node; an older reader sees everything changed.
const KEPT: usize = 4096;

/// The log of DRA changes.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Renewed by every change; 0 before the first.
    generation: u64,
    /// The latest changes, oldest first: (generation, node; `None`: every node; its kind).
    log: VecDeque<(u64, Option<Box<str>>, Kind)>,
}

/// What a change did to a node's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// More of them are held (an allocation added, none given back): a search that found
    /// nothing there still finds nothing, since the structured allocator's search is complete
    /// and held devices are never candidates.
    Taken,
    /// Anything else (devices given back, slices, classes, labels).
    Changed,
}

/// What changed after a generation, node by node with the kind of each change.
#[derive(Debug, PartialEq, Eq)]
pub enum Since<'a> {
    /// Nothing.
    Nothing,
    /// The devices of these nodes only (a name may repeat).
    Nodes(Vec<(&'a str, Kind)>),
    /// Possibly every node.
    Everything,
}

impl Changes {
    /// The generation of the latest change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Notes a change of `node`'s devices (`None`: of every node's).
    pub fn note(&mut self, node: Option<&str>) {
        self.note_kind(node, Kind::Changed);
    }

    fn note_kind(&mut self, node: Option<&str>, kind: Kind) {
        self.generation += 1;
        if self.log.len() >= KEPT {
            self.log.pop_front();
        }
        self.log.push_back((self.generation, node.map(Into::into), kind));
    }

    /// Notes the nodes an allocation's devices belong to.
    pub fn note_allocation(&mut self, allocation: &AllocationResult) {
        self.note(allocation_node(allocation));
    }

    /// Notes an allocation added where none was given back: its devices are only taken.
    pub fn note_taken(&mut self, allocation: &AllocationResult) {
        self.note_kind(allocation_node(allocation), Kind::Taken);
    }

    /// Notes the node of a slice (every node for a slice without a node name).
    pub fn note_slice(&mut self, slice: &ResourceSlice) {
        self.note(slice_node(slice));
    }

    /// What changed after generation `seen`.
    pub fn since(&self, seen: u64) -> Since<'_> {
        if seen >= self.generation {
            return Since::Nothing;
        }
        // The oldest change still kept must be the first one after `seen`, or some are lost.
        match self.log.front() {
            Some(&(first, _, _)) if first <= seen + 1 => {}
            _ => return Since::Everything,
        }
        let mut nodes = Vec::new();
        for (g, node, kind) in self.log.iter().rev() {
            if *g <= seen {
                break;
            }
            match node {
                Some(n) => nodes.push((&**n, *kind)),
                None => return Since::Everything,
            }
        }
        Since::Nodes(nodes)
    }
}

/// The one node an allocation's devices are on: its node selector is the single
/// `metadata.name In [node]` field selector a node-local allocation carries. `None` for
/// anything else (devices reachable from several nodes, or no selector).
pub fn allocation_node(allocation: &AllocationResult) -> Option<&str> {
    let terms = &allocation.node_selector.as_ref()?.node_selector_terms;
    let [term] = terms.as_slice() else {
        return None;
    };
    if term.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return None;
    }
    match term.match_fields.as_deref() {
        Some([f]) if f.key == "metadata.name" && f.operator == "In" => match f.values.as_deref() {
            Some([node]) => Some(node.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// The node of a slice published for one node.
fn slice_node(slice: &ResourceSlice) -> Option<&str> {
    slice.spec.node_name.as_deref().filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(node: &str) -> AllocationResult {
        serde_json::from_value(serde_json::json!({
            "devices": {"results": []},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        }))
        .unwrap()
    }

    #[test]
    fn readers_see_the_nodes_changed_since_their_generation() {
        let mut c = Changes::default();
        assert_eq!(c.since(0), Since::Nothing);
        c.note_allocation(&on("a"));
        let seen = c.generation();
        c.note_allocation(&on("b"));
        c.note_allocation(&on("c"));
        assert_eq!(
            c.since(seen),
            Since::Nodes(vec![("c", Kind::Changed), ("b", Kind::Changed)])
        );
        assert_eq!(c.since(c.generation()), Since::Nothing);
        // An allocation without a single-node selector may concern every node.
        c.note_allocation(&AllocationResult::default());
        assert_eq!(c.since(seen), Since::Everything);
        let two = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}]}
        }))
        .unwrap();
        assert_eq!(allocation_node(&two), None);
        assert_eq!(allocation_node(&on("a")), Some("a"));
    }

    #[test]
    fn a_reader_older_than_the_log_sees_everything_changed() {
        let mut c = Changes::default();
        for _ in 0..KEPT + 1 {
            c.note(Some("a"));
        }
        assert_eq!(c.since(0), Since::Everything);
        assert_eq!(c.since(1), Since::Nodes(vec![("a", Kind::Changed); KEPT]));
    }

    #[test]
    fn each_change_keeps_its_kind() {
        let mut c = Changes::default();
        c.note_taken(&on("a"));
        c.note_allocation(&on("b"));
        assert_eq!(
            c.since(0),
            Since::Nodes(vec![("b", Kind::Changed), ("a", Kind::Taken)])
        );
        // Taken from devices several nodes reach: every node may be concerned.
        c.note_taken(&AllocationResult::default());
        assert_eq!(c.since(1), Since::Everything);
    }
}
