//! Dynamic Resource Allocation: claims allocated from ResourceSlices the way kube-scheduler's
//! DynamicResources plugin allocates them (the v1.36 "incubating" structured allocator). Pure:
//! plain data in, an allocation or a reason out.

pub mod cel;
