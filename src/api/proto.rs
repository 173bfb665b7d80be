//! Generated protobuf and gRPC code (re-exported as `crate::proto`). Used by `api` and `cli` only.

#![allow(missing_docs, clippy::all)]

/// `fabric.agent.v1`: the control plane's API.
pub mod agent {
    tonic::include_proto!("fabric.agent.v1");
}

/// `fabric.sm.v1`: the SM host's partitions service.
pub mod sm {
    tonic::include_proto!("fabric.sm.v1");
}

/// Encoded file descriptors of both APIs, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fabric_descriptor");
