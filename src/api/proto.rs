//! Generated protobuf and gRPC code (re-exported as `crate::proto`). Used by `api` and `cli` only.
//!
//! The modules mirror the protobuf packages (`fabric::sm::v1`, ...) because generated code names
//! the types of another package by relative path; the short names below are what the crate uses.

#![allow(missing_docs, clippy::all)]

/// The protobuf packages, nested as generated code expects.
pub mod fabric {
    /// `fabric.agent.v1`.
    pub mod agent {
        /// `fabric.agent.v1`.
        pub mod v1 {
            tonic::include_proto!("fabric.agent.v1");
        }
    }
    /// `fabric.sm.v1`.
    pub mod sm {
        /// `fabric.sm.v1`.
        pub mod v1 {
            tonic::include_proto!("fabric.sm.v1");
        }
    }
    /// `fabric.grant.v1`.
    pub mod grant {
        /// `fabric.grant.v1`.
        pub mod v1 {
            tonic::include_proto!("fabric.grant.v1");
        }
    }
}

/// `fabric.agent.v1`: the control plane's API.
pub use fabric::agent::v1 as agent;
/// `fabric.grant.v1`: what the control plane signs.
pub use fabric::grant::v1 as grant;
/// `fabric.sm.v1`: the SM host's partitions service.
pub use fabric::sm::v1 as sm;

/// Encoded file descriptors of the APIs, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fabric_descriptor");
