//! The allocation record, defined in the shared crate ([`numaplane::allocation`]) so the
//! scheduler that writes it and the node-side allocator that reads it share one home.

pub use numaplane::allocation::*;
