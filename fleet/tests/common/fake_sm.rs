//! A fake SM host serving `fabric.sm.v1.Partitions` on loopback: ListPartitionMembers answers
//! what the test sets; RevokeInstance and RetirePartitionKey are counted and answered OK; every
//! other RPC is UNIMPLEMENTED.

use fabric_fleet::proto::sm::partitions_server::{Partitions, PartitionsServer};
use fabric_fleet::proto::sm::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// The fake's state: members by P_Key base, and whether it answers at all.
#[derive(Default)]
pub struct FakeSmState {
    pub members: Mutex<BTreeMap<u32, Vec<PartitionMember>>>,
    pub calls: Mutex<u64>,
    /// (node, instance) of every RevokeInstance.
    pub revoked: Mutex<Vec<(String, String)>>,
    /// (pkey, retired_at) of every RetirePartitionKey.
    pub retired: Mutex<Vec<(u32, u64)>>,
}

impl FakeSmState {
    /// Sets the ports the "fabric" holds in `pkey`.
    pub fn hold(&self, pkey: u32, ports: &[&str]) {
        self.members.lock().unwrap().insert(
            pkey,
            ports
                .iter()
                .map(|p| PartitionMember {
                    port_guid: (*p).into(),
                    node_id: String::new(),
                    full: true,
                })
                .collect(),
        );
    }
}

#[derive(Clone)]
struct Fake(Arc<FakeSmState>);

#[tonic::async_trait]
impl Partitions for Fake {
    async fn set_node_memberships(
        &self,
        _: Request<SetNodeMembershipsRequest>,
    ) -> Result<Response<SetNodeMembershipsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_node_memberships(
        &self,
        _: Request<GetNodeMembershipsRequest>,
    ) -> Result<Response<NodeMemberships>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn pull_node_sets(
        &self,
        _: Request<PullNodeSetsRequest>,
    ) -> Result<Response<PullNodeSetsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn fence_sm_host(
        &self,
        _: Request<FenceSmHostRequest>,
    ) -> Result<Response<FencedSmHost>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn revoke_instance(
        &self,
        r: Request<RevokeInstanceRequest>,
    ) -> Result<Response<RevokeInstanceResponse>, Status> {
        let r = r.into_inner();
        self.0
            .revoked
            .lock()
            .unwrap()
            .push((r.node_id, r.instance_id));
        Ok(Response::new(RevokeInstanceResponse::default()))
    }
    async fn retire_partition_key(
        &self,
        r: Request<RetirePartitionKeyRequest>,
    ) -> Result<Response<RetirePartitionKeyResponse>, Status> {
        let r = r.into_inner();
        self.0
            .retired
            .lock()
            .unwrap()
            .push((r.pkey, r.retired_at_unix_ms));
        Ok(Response::new(RetirePartitionKeyResponse {
            retired_at_unix_ms: r.retired_at_unix_ms,
            removed: Vec::new(),
        }))
    }
    async fn list_partition_members(
        &self,
        r: Request<ListPartitionMembersRequest>,
    ) -> Result<Response<ListPartitionMembersResponse>, Status> {
        *self.0.calls.lock().unwrap() += 1;
        let pkey = r.into_inner().pkey;
        let members = self
            .0
            .members
            .lock()
            .unwrap()
            .get(&pkey)
            .cloned()
            .unwrap_or_default();
        Ok(Response::new(ListPartitionMembersResponse {
            members,
            source: "fake".into(),
            read_at_unix_ms: fabric_fleet::view::now_ms(),
        }))
    }
}

/// Serves the fake on 127.0.0.1 (a free port); returns its state and URL. It stops with the
/// test's runtime.
pub async fn start() -> (Arc<FakeSmState>, String) {
    let state = Arc::new(FakeSmState::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let svc = PartitionsServer::new(Fake(state.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (state, url)
}
