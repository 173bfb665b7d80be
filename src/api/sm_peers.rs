//! `fabric.sm.v1.Partitions/PullNodeSets`: anti-entropy between the SM hosts of one fabric. The
//! client ([`PeerClient`], one per configured peer) and the conversions of a peer's answer; the
//! sync itself is `sm::opensm::sync`'s. A peer's sets are converted through the same boundary as
//! a node's request (generation bounds, ids, GUIDs, keys, grants decoded), and a set that does
//! not convert is left out of the answer (logged), never taken in part.

use super::grant_v1::{signed_grant_from_proto, signed_grant_to_proto};
use super::sm_client::{sm_host_channel, RemoteError};
use super::sm_v1::{memberships_from_proto, memberships_to_proto};
use crate::domain::NodeId;
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::opensm::peers::PeersConfig;
use crate::sm::opensm::sync::{Peer, PeerAnswer, PeerRevocation, PeerSet};
use async_trait::async_trait;
use std::sync::Arc;
use tonic::transport::Channel;

/// The SM host's sync state as `GetNode` shows it (`fabric.agent.v1.SmHostStatus`).
pub fn sync_status_to_pb(
    s: &crate::sm::opensm::sync::SyncStatus,
) -> crate::proto::agent::SmHostStatus {
    use crate::proto::agent as apb;
    apb::SmHostStatus {
        role: s.role.unwrap_or_default().as_str().to_owned(),
        role_source: s.role_source.as_ref().map_or("", |r| r.as_str()).to_owned(),
        role_fallback_reason: match &s.role_source {
            Some(crate::sm::opensm::sminfo::RoleSource::LogFallback { reason }) => reason.clone(),
            _ => String::new(),
        },
        caught_up: s.caught_up,
        catching_up_with: s.waiting_for.clone(),
        held_back_nodes: s.gated_nodes.clone(),
        disagreeing_nodes: s.disagreements.clone(),
        peers: s
            .peers
            .iter()
            .map(|p| apb::SmPeerStatus {
                endpoint: p.name.clone(),
                host: p.host.clone(),
                last_answer: p.last_answer.map(prost_types::Timestamp::from),
                last_error: p.last_error.clone().unwrap_or_default(),
                caught_up: p.caught_up,
                last_generation: p.generations.values().copied().max().unwrap_or(0),
                nodes: u32::try_from(p.generations.len()).unwrap_or(u32::MAX),
            })
            .collect(),
    }
}

/// A peer's answer as sent.
pub fn answer_to_proto(a: &PeerAnswer) -> pb::PullNodeSetsResponse {
    pb::PullNodeSetsResponse {
        host: a.host.clone(),
        caught_up: a.caught_up,
        sets: a
            .sets
            .iter()
            .map(|s| {
                let mut m = memberships_to_proto(&s.memberships, s.generation);
                m.grants = s.grants.iter().map(signed_grant_to_proto).collect();
                pb::PeerNodeSet {
                    memberships: Some(m),
                    confirmed: s.confirmed,
                }
            })
            .collect(),
        revocations: a
            .revocations
            .iter()
            .map(|r| pb::RevokedInstance {
                node_id: r.node.to_string(),
                instance_id: r.instance.clone(),
                grant_ids: r.grant_ids.iter().cloned().collect(),
            })
            .collect(),
    }
}

/// A peer's revocation as received, or why it is left out (a bad node, instance or grant id).
fn revocation_from_proto(r: pb::RevokedInstance) -> Result<PeerRevocation, String> {
    let node =
        NodeId::try_from(r.node_id.clone()).map_err(|e| format!("node id {:?}: {e}", r.node_id))?;
    if let Some(bad) = std::iter::once(&r.instance_id)
        .chain(&r.grant_ids)
        .find(|id| !crate::domain::is_grant_id(id))
    {
        return Err(format!("{bad:?} is not 1-128 characters [A-Za-z0-9._:-]"));
    }
    Ok(PeerRevocation {
        node,
        instance: r.instance_id,
        grant_ids: r.grant_ids.into_iter().collect(),
    })
}

/// A peer's answer as received: every set that converts (the others are logged and left out).
pub fn answer_from_proto(peer: &str, r: pb::PullNodeSetsResponse) -> PeerAnswer {
    let sets = r
        .sets
        .into_iter()
        .filter_map(|s| {
            let mut m = s.memberships?;
            let node = m.node_id.clone();
            let grants = std::mem::take(&mut m.grants)
                .iter()
                .map(signed_grant_from_proto)
                .collect::<Result<Vec<_>, _>>();
            match (memberships_from_proto(m), grants) {
                (Ok((memberships, generation)), Ok(grants)) => Some(PeerSet {
                    memberships,
                    generation,
                    grants,
                    confirmed: s.confirmed,
                }),
                (Err(e), _) => {
                    tracing::warn!(peer, node_id = %node, error = %e.message(), "peer sent a set that does not convert; left out");
                    None
                }
                (_, Err(e)) => {
                    tracing::warn!(peer, node_id = %node, error = %e, "peer sent a grant that does not decode; set left out");
                    None
                }
            }
        })
        .collect();
    let revocations = r
        .revocations
        .into_iter()
        .filter_map(|rev| {
            let node = rev.node_id.clone();
            revocation_from_proto(rev)
                .inspect_err(|e| tracing::warn!(peer, node_id = %node, error = %e, "peer sent a revocation that does not convert; left out"))
                .ok()
        })
        .collect();
    PeerAnswer {
        host: r.host,
        caught_up: r.caught_up,
        sets,
        revocations,
    }
}

/// One peer SM host's agent.
pub struct PeerClient {
    endpoint: String,
    client: PartitionsClient<Channel>,
}

#[async_trait]
impl Peer for PeerClient {
    fn name(&self) -> &str {
        &self.endpoint
    }

    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String> {
        let mut client = self.client.clone();
        let reply = client
            .pull_node_sets(pb::PullNodeSetsRequest {
                from_host: from_host.to_owned(),
            })
            .await
            .map_err(|s| format!("{}: {}", s.code(), s.message()))?
            .into_inner();
        Ok(answer_from_proto(&self.endpoint, reply))
    }
}

/// Clients for every configured peer (connected lazily: a peer need not be up).
pub fn peers(config: &PeersConfig) -> Result<Vec<Arc<dyn Peer>>, RemoteError> {
    let client = config.client();
    client.validate()?;
    client
        .all_endpoints()
        .into_iter()
        .map(|endpoint| {
            Ok(Arc::new(PeerClient {
                client: PartitionsClient::new(sm_host_channel(&client, &endpoint)?),
                endpoint,
            }) as Arc<dyn Peer>)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Guid, NodeMemberships};

    #[test]
    fn answers_round_trip_and_bad_sets_are_left_out() {
        let m = NodeMemberships {
            node_id: crate::domain::NodeId::try_from("node1".to_owned()).unwrap(),
            port_guids: vec![Guid(0x100001)],
            keys: Default::default(),
        };
        let a = PeerAnswer {
            host: "smhost".into(),
            caught_up: true,
            sets: vec![PeerSet {
                memberships: m.clone(),
                generation: 7,
                grants: Vec::new(),
                confirmed: true,
            }],
            revocations: vec![PeerRevocation {
                node: m.node_id.clone(),
                instance: "i-1".into(),
                grant_ids: ["g-1".to_owned()].into(),
            }],
        };
        let mut wire = answer_to_proto(&a);
        let mut bad = wire.clone();
        bad.revocations.push(pb::RevokedInstance {
            node_id: "node1".into(),
            instance_id: "i 2".into(),
            grant_ids: Vec::new(),
        });
        assert_eq!(answer_from_proto("p", bad).revocations, a.revocations);
        let back = answer_from_proto("p", wire.clone());
        assert_eq!(back.sets.len(), 1);
        assert_eq!(back.sets[0].memberships, m);
        assert_eq!(back.sets[0].generation, 7);
        assert!(back.caught_up);
        wire.sets[0].memberships.as_mut().unwrap().generation = 0;
        assert!(answer_from_proto("p", wire).sets.is_empty());
    }
}
