//! gRPC services.
pub mod partitions;
