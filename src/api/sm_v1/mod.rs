//! `fabric.sm.v1`, between the nodes and the SM host (or the UFM broker): the `Partitions`
//! service over a fabric side (`service`), who may call what on it (`authorisation`), its
//! protobuf <-> domain mapping and its one error <-> status mapping (`convert`), the nodes'
//! remote backend (`client`; `host_answer` one host's answer, `host_set` and `host_set_view` the
//! SM-host set the answers name, `stored_set` its start check's read of every SM host), the SM
//! hosts' anti-entropy client (`peers`) and the SM host's metrics (`metrics`).

pub mod authorisation;
pub mod client;
pub mod convert;
pub mod host_answer;
pub mod host_set;
pub mod host_set_view;
pub mod metrics;
pub mod peers;
pub mod service;
mod stored_set;

pub use client::{RemoteError, RemoteSm};
pub use service::PartitionsService;
