//! lanefs's file systems: `null` (the overhead probe) and `passthrough` (a host directory).

pub mod null;
pub mod passthrough;
