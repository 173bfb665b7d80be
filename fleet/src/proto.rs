//! Generated protobuf and gRPC code of the contract in `proto/` (clients for the control plane;
//! servers only so tests and the bench can run fake agents and a fake SM host).
//!
//! The modules mirror the protobuf packages because generated code names the types of another
//! package by relative path; the short names below are what the crate uses.

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

/// `fabric.agent.v1`: the node agent's API.
pub use fabric::agent::v1 as agent;
/// `fabric.grant.v1`: what the control plane signs.
pub use fabric::grant::v1 as grant;
/// `fabric.sm.v1`: the SM host's partitions service (the fabric's own view).
pub use fabric::sm::v1 as sm;
