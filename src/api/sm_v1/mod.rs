//! `fabric.sm.v1`, between the nodes and the SM host (or the UFM broker): the `Partitions`
//! service over a fabric side (`service`), who may call what on it (`authorisation`), its
//! protobuf <-> domain mapping and its one error <-> status mapping (`convert`), the nodes'
//! remote backend (`client`), the SM hosts' anti-entropy client (`peers`) and the SM host's
//! metrics (`metrics`).

pub mod authorisation;
pub mod client;
pub mod convert;
pub mod metrics;
pub mod peers;
pub mod service;

pub use client::{RemoteError, RemoteSm};
pub use service::PartitionsService;
