//! `fabric.sm.v1.Partitions`: served by the fabric side, the SM host's agent (backend `opensm`)
//! or the UFM broker (backend `ufm` with `[subnet_manager.ufm_broker]`). Nodes send their
//! complete desired set of memberships; the handlers convert and validate it through the
//! `fabric.sm.v1` boundary ([`super::convert`]) and hand it to the [`FabricSide`], which checks
//! and persists it and answers once the subnet manager holds it.
//!
//! Every call is authorised ([`super::authorisation`]) by the verified [`Caller`] the call gate
//! attached, before the backend sees it.

use super::authorisation::{authorise, authorise_operator, Access, PartitionsRefusal};
use super::convert::{
    memberships_from_proto, node_id, status_of_fabric_side as status_of, status_of_refusal,
    stored_to_proto,
};
use crate::api::gate::{audit, Caller, ClientAllowlist, LiveTlsAccess, NodeMapping};
use crate::api::grant_v1::signed_grant_from_proto;
use crate::domain::PKey;
use crate::proto::sm as pb;
use crate::proto::sm::partitions_server::{Partitions, PartitionsServer};
use crate::sm::FabricSide;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Partitions service over a fabric side (OpenSM SM host, UFM broker).
#[derive(Clone)]
pub struct PartitionsService {
    backend: Arc<dyn FabricSide>,
    /// The mTLS listener's identity -> node mapping, read at each call; `None`: the default rule.
    nodes: Option<LiveTlsAccess>,
    peers: ClientAllowlist,
    /// About the most one `PullNodeSets` answer holds.
    page_bytes: usize,
}

impl PartitionsService {
    /// Wraps the backend; certificates map to nodes by the default rule (a DNS SAN equal to the
    /// node id) until [`PartitionsService::with_live_node_mapping`].
    pub fn new(backend: impl FabricSide) -> Self {
        PartitionsService {
            backend: Arc::new(backend),
            nodes: None,
            peers: ClientAllowlist::default(),
            page_bytes: super::peers::PAGE_BYTES,
        }
    }

    /// Pages `PullNodeSets` answers at about `bytes` (default [`super::peers::PAGE_BYTES`]).
    pub fn with_page_bytes(self, bytes: usize) -> Self {
        PartitionsService {
            page_bytes: bytes.max(1),
            ..self
        }
    }

    /// Peer SM hosts' certificate identities: they may pull every stored set (`PullNodeSets`).
    pub fn with_peer_identities(self, peers: ClientAllowlist) -> Self {
        PartitionsService { peers, ..self }
    }

    /// The peer SM hosts' identities.
    pub fn peer_identities(&self) -> &ClientAllowlist {
        &self.peers
    }

    /// Uses the mTLS listener's mapping in effect at each call.
    pub fn with_live_node_mapping(self, access: LiveTlsAccess) -> Self {
        PartitionsService {
            nodes: Some(access),
            ..self
        }
    }

    /// The identity -> node mapping in effect now.
    fn node_mapping(&self) -> NodeMapping {
        self.nodes
            .as_ref()
            .map_or_else(NodeMapping::default, |access| {
                access.current().nodes().clone()
            })
    }

    /// The tonic server for this service, ready for `Server::add_service`.
    pub fn into_server(self) -> PartitionsServer<PartitionsService> {
        PartitionsServer::new(self)
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl PartitionsService {
    /// Authorises (operators only) and revokes one instance's grants on one node.
    async fn revoke(
        &self,
        caller: Option<&Caller>,
        r: &pb::RevokeInstanceRequest,
    ) -> Result<Response<pb::RevokeInstanceResponse>, Status> {
        authorise_operator(caller, "RevokeInstance", true).map_err(|r| status_of_refusal(&r))?;
        let node = node_id(&r.node_id)?;
        if !crate::domain::is_grant_id(&r.instance_id) {
            return Err(Status::invalid_argument(format!(
                "instance_id {:?} is not 1-128 characters [A-Za-z0-9._:-]",
                r.instance_id
            )));
        }
        match self.backend.revoke_instance(&node, &r.instance_id).await {
            Ok(out) => Ok(Response::new(pb::RevokeInstanceResponse {
                revoked_grant_ids: out.revoked_grant_ids,
                removed_pkeys: out
                    .removed_pkeys
                    .iter()
                    .map(|k| u32::from(k.base()))
                    .collect(),
            })),
            Err(e) => {
                tracing::warn!(error = %e, "revocation not confirmed");
                Err(status_of(&e))
            }
        }
    }

    /// Authorises (operators only) and retires one P_Key.
    async fn retire(
        &self,
        caller: Option<&Caller>,
        r: &pb::RetirePartitionKeyRequest,
    ) -> Result<Response<pb::RetirePartitionKeyResponse>, Status> {
        authorise_operator(caller, "RetirePartitionKey", true)
            .map_err(|r| status_of_refusal(&r))?;
        let pkey = PKey::new(r.pkey).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !r.partition_id.is_empty() && !crate::domain::is_grant_id(&r.partition_id) {
            return Err(Status::invalid_argument(format!(
                "partition_id {:?} is not 1-128 characters [A-Za-z0-9._:-]",
                r.partition_id
            )));
        }
        let out = self
            .backend
            .retire_pkey(pkey, r.retired_at_unix_ms)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::RetirePartitionKeyResponse {
            retired_at_unix_ms: out.retired_at_unix_ms,
            removed: out
                .removed
                .into_iter()
                .map(|(node, ids, _)| pb::RetiredFromNode {
                    node_id: node.to_string(),
                    consumed_grant_ids: ids,
                })
                .collect(),
        }))
    }

    /// Validates, authorises (before anything is written) and applies one node's set.
    async fn set(
        &self,
        caller: Option<&Caller>,
        mut m: pb::NodeMemberships,
    ) -> Result<Response<pb::SetNodeMembershipsResponse>, Status> {
        if m.node_id.is_empty() && m.keys.is_empty() && m.port_guids.is_empty() {
            return Err(status_of_refusal(&PartitionsRefusal::MembershipsMissing));
        }
        let mut carried = std::mem::take(&mut m.grants);
        let (desired, generation) = memberships_from_proto(m)?;
        authorise(
            caller,
            &self.node_mapping(),
            &desired.node_id,
            Access::Write,
        )
        .map_err(|r| status_of_refusal(&r))?;
        // Grants are decoded only where they are enforced; a grant that does not decode refuses
        // the set like any other refused grant.
        let grants = if self.backend.requires_grants() {
            // Exact copies of one grant are dropped before anything is decoded or verified: a
            // set repeating one grant costs what one copy costs.
            let mut seen = std::collections::HashSet::new();
            carried
                .retain(|g| seen.insert((g.grant.clone(), g.key_id.clone(), g.signature.clone())));
            carried
                .iter()
                .map(signed_grant_from_proto)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    let r = PartitionsRefusal::Grant(format!(
                        "node {:?}: {e}",
                        desired.node_id.as_str()
                    ));
                    tracing::warn!(node_id = %desired.node_id, error = %r, "set refused: grant");
                    status_of_refusal(&r)
                })?
        } else {
            Vec::new()
        };
        match self.backend.set_node(desired, &grants, generation).await {
            Ok(sweeps) => {
                let hosts = self.backend.sm_hosts().unwrap_or_default();
                Ok(Response::new(pb::SetNodeMembershipsResponse {
                    sweeps,
                    host: hosts.host,
                    known_hosts: hosts.known,
                    fenced_hosts: hosts
                        .fenced
                        .iter()
                        .map(super::convert::fenced_to_proto)
                        .collect(),
                    not_fenced: hosts.not_fenced,
                }))
            }
            Err(e) => {
                tracing::warn!(error = %e, "memberships not applied");
                Err(status_of(&e))
            }
        }
    }
}

fn keys_summary(keys: &[pb::KeyMembership]) -> String {
    keys.iter()
        .map(|k| {
            format!(
                "{:#06x}:{}",
                k.pkey,
                if k.full { "full" } else { "limited" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[tonic::async_trait]
impl Partitions for PartitionsService {
    #[tracing::instrument(skip_all, fields(node_id))]
    async fn set_node_memberships(
        &self,
        request: Request<pb::SetNodeMembershipsRequest>,
    ) -> Result<Response<pb::SetNodeMembershipsResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let m = request.into_inner().memberships.unwrap_or_default();
        tracing::Span::current().record("node_id", m.node_id.as_str());
        let (node, keys, ports, generation) = (
            m.node_id.clone(),
            keys_summary(&m.keys),
            m.port_guids.len(),
            m.generation,
        );
        let admitted = audit::sm_admitted(
            caller.as_ref(),
            "SetNodeMemberships",
            &node,
            &format!("keys {keys} on {ports} port(s), generation {generation}"),
        );
        let result = self.set(caller.as_ref(), m).await;
        admitted.answered();
        audit::set_node_memberships(
            caller.as_ref(),
            &node,
            &keys,
            ports,
            generation,
            audit::code_of(&result),
        );
        result
    }

    #[tracing::instrument(skip_all)]
    async fn get_node_memberships(
        &self,
        request: Request<pb::GetNodeMembershipsRequest>,
    ) -> Result<Response<pb::NodeMemberships>, Status> {
        let caller = Caller::of(&request).cloned();
        let id = node_id(&request.into_inner().node_id)?;
        authorise(caller.as_ref(), &self.node_mapping(), &id, Access::Read)
            .map_err(|r| status_of_refusal(&r))?;
        match self.backend.node(&id) {
            // A held-back record is loaded without its keys: answering it as stored would tell
            // the node's start check that this host holds no key for it, and the node would send
            // a set without its tenants' keys. It is no answer until confirmed.
            Some(n) if n.gated => Err(Status::unavailable(format!(
                "node {id}'s stored set (generation {}) is held back on this SM host: not confirmed by the node or a caught-up peer since this agent started, so its keys are not known here yet",
                n.generation
            ))),
            Some(n) => Ok(Response::new(stored_to_proto(&n))),
            None => Err(status_of_refusal(&PartitionsRefusal::NotStored(id))),
        }
    }

    #[tracing::instrument(skip_all, fields(node_id))]
    async fn revoke_instance(
        &self,
        request: Request<pb::RevokeInstanceRequest>,
    ) -> Result<Response<pb::RevokeInstanceResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let r = request.into_inner();
        tracing::Span::current().record("node_id", r.node_id.as_str());
        let admitted = audit::sm_admitted(
            caller.as_ref(),
            "RevokeInstance",
            &r.node_id,
            &format!("instance {:?}", r.instance_id),
        );
        let result = self.revoke(caller.as_ref(), &r).await;
        admitted.answered();
        audit::revoke_instance(
            caller.as_ref(),
            &r.node_id,
            &r.instance_id,
            audit::code_of(&result),
        );
        result
    }

    #[tracing::instrument(skip_all)]
    async fn pull_node_sets(
        &self,
        request: Request<pb::PullNodeSetsRequest>,
    ) -> Result<Response<pb::PullNodeSetsResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let peer = match &caller {
            Some(Caller::InsecureTest)
            | Some(Caller::Local {
                privileged: true, ..
            }) => true,
            Some(Caller::Cert { identity, .. }) => self.peers.matching(identity).is_some(),
            _ => false,
        };
        if !peer {
            let who = caller.map_or_else(|| "an unverified caller".to_owned(), |c| c.to_string());
            tracing::warn!(caller = %who, "PullNodeSets refused: not a peer SM host");
            return Err(Status::permission_denied(format!(
                "{who} may not call PullNodeSets: only the peer SM hosts ([subnet_manager.opensm_ha] peer_identities) may"
            )));
        }
        let r = request.into_inner();
        let answer = self.backend.peer_sets(&r.from_host).ok_or_else(|| {
            Status::failed_precondition(
                "this host has no peer SM hosts ([subnet_manager.opensm_ha])",
            )
        })?;
        super::peers::answer_page(&answer, &r.page_token, self.page_bytes)
            .map(Response::new)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "page_token {:?} is not one this host handed out",
                    r.page_token
                ))
            })
    }

    #[tracing::instrument(skip_all)]
    async fn fence_sm_host(
        &self,
        request: Request<pb::FenceSmHostRequest>,
    ) -> Result<Response<pb::FencedSmHost>, Status> {
        use crate::sm::opensm::fence::FenceRefusal as R;
        let caller = Caller::of(&request).cloned();
        authorise_operator(caller.as_ref(), "FenceSmHost", true)
            .map_err(|r| status_of_refusal(&r))?;
        let host = request.into_inner().host;
        let who = caller.map_or_else(|| "an unverified caller".to_owned(), |c| c.to_string());
        let result = self.backend.fence_sm_host(&host).await.ok_or_else(|| {
            Status::failed_precondition(
                "this host has no peer SM hosts ([subnet_manager.opensm_ha])",
            )
        })?;
        match result {
            Ok(f) => {
                tracing::warn!(caller = %who, host = %f.host, evidence = %f.evidence, "FenceSmHost");
                Ok(Response::new(super::convert::fenced_to_proto(&f)))
            }
            Err(e) => {
                tracing::warn!(caller = %who, %host, error = %e, "FenceSmHost refused");
                Err(match e {
                    R::UnknownPeer(..) => Status::not_found(e.to_string()),
                    R::Store(..) => Status::unavailable(e.to_string()),
                    _ => Status::failed_precondition(e.to_string()),
                })
            }
        }
    }

    #[tracing::instrument(skip_all)]
    async fn retire_partition_key(
        &self,
        request: Request<pb::RetirePartitionKeyRequest>,
    ) -> Result<Response<pb::RetirePartitionKeyResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let r = request.into_inner();
        let result = self.retire(caller.as_ref(), &r).await;
        let who = caller.map_or_else(|| "an unverified caller".to_owned(), |c| c.to_string());
        match &result {
            Ok(_) => {
                tracing::warn!(caller = %who, pkey = r.pkey, partition_id = %r.partition_id, retired_at_unix_ms = r.retired_at_unix_ms, "RetirePartitionKey")
            }
            Err(s) => {
                tracing::warn!(caller = %who, pkey = r.pkey, partition_id = %r.partition_id, code = ?s.code(), error = %s.message(), "RetirePartitionKey refused or not confirmed")
            }
        }
        result
    }

    #[tracing::instrument(skip_all)]
    async fn list_partition_members(
        &self,
        request: Request<pb::ListPartitionMembersRequest>,
    ) -> Result<Response<pb::ListPartitionMembersResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        authorise_operator(caller.as_ref(), "ListPartitionMembers", false)
            .map_err(|r| status_of_refusal(&r))?;
        let pkey = PKey::new(request.into_inner().pkey)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let read_at_unix_ms = now_unix_ms();
        let members = self
            .backend
            .partition_members(pkey)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::ListPartitionMembersResponse {
            members: members
                .members
                .into_iter()
                .map(|m| pb::PartitionMember {
                    port_guid: m.guid.to_string(),
                    node_id: m.node.map(String::from).unwrap_or_default(),
                    full: m.full,
                })
                .collect(),
            source: members.source.into(),
            read_at_unix_ms,
        }))
    }
}
