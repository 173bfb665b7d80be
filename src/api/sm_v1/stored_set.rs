//! The remote backend's start check: what every configured SM host stores for this node
//! (`GetNodeMemberships`, the node's own set only), asked at once of all of them. The rule the
//! answers feed is the agent's (`agent::start_check`); this file only asks and converts.
//!
//! A host's NOT_FOUND is an answer (it stores nothing for the node); any other status, a
//! transport failure or a set that does not convert is no answer, named with the host.

use super::convert::memberships_from_proto;
use crate::domain::NodeId;
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::{HostStoredSet, StoredSetAnswer};
use tonic::transport::Channel;

/// Asks every host (endpoint, client) for `node`'s stored set, concurrently; one answer per
/// host, in the given order. Each call is bounded by the channel's request timeout.
pub(super) async fn query<'a>(
    hosts: impl IntoIterator<Item = (&'a str, PartitionsClient<Channel>)>,
    node: &NodeId,
) -> Vec<HostStoredSet> {
    let request = pb::GetNodeMembershipsRequest {
        node_id: node.to_string(),
    };
    futures::future::join_all(hosts.into_iter().map(|(endpoint, mut client)| {
        let request = request.clone();
        async move {
            let answer = client.get_node_memberships(request).await;
            HostStoredSet {
                host: endpoint.to_owned(),
                answer: answer_of(answer.map(tonic::Response::into_inner), node),
            }
        }
    }))
    .await
}

/// One host's reply to `GetNodeMemberships` for `node`, as the start check reads it.
pub fn answer_of(
    reply: Result<pb::NodeMemberships, tonic::Status>,
    node: &NodeId,
) -> StoredSetAnswer {
    match reply {
        Ok(m) => {
            let (set, generation) = match memberships_from_proto(m) {
                Ok(converted) => converted,
                Err(s) => {
                    return StoredSetAnswer::NoAnswer(format!(
                        "unreadable stored set: {}",
                        s.message()
                    ))
                }
            };
            if &set.node_id != node {
                return StoredSetAnswer::NoAnswer(format!(
                    "answered with node {:?}'s set instead of {:?}",
                    set.node_id.as_str(),
                    node.as_str()
                ));
            }
            StoredSetAnswer::Stored(generation, set)
        }
        Err(s) if s.code() == tonic::Code::NotFound => StoredSetAnswer::NotStored,
        // The host's own refusal (not a transport failure behind the status).
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ) && std::error::Error::source(&s).is_none() =>
        {
            StoredSetAnswer::Refused(format!("{:?}: {}", s.code(), s.message()))
        }
        Err(s) => StoredSetAnswer::NoAnswer(format!("{:?}: {}", s.code(), s.message())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn node() -> NodeId {
        NodeId::parse("node1").unwrap()
    }

    fn stored(node: &str, generation: u64) -> pb::NodeMemberships {
        pb::NodeMemberships {
            node_id: node.into(),
            port_guids: vec!["0x0002c90300000001".into()],
            keys: vec![pb::KeyMembership {
                pkey: 0x0a61,
                full: true,
                name: "a".into(),
                port_guids: vec![],
            }],
            generation,
            grants: vec![],
        }
    }

    #[test]
    fn not_found_and_refusals_are_answers_other_errors_are_not() {
        assert_eq!(
            answer_of(Err(Status::not_found("no memberships")), &node()),
            StoredSetAnswer::NotStored
        );
        let StoredSetAnswer::Refused(why) =
            answer_of(Err(Status::permission_denied("nope")), &node())
        else {
            panic!("a refusal");
        };
        assert!(
            why.contains("PermissionDenied") && why.contains("nope"),
            "{why}"
        );
        let StoredSetAnswer::NoAnswer(why) = answer_of(Err(Status::unavailable("down")), &node())
        else {
            panic!("no answer");
        };
        assert!(why.contains("down"), "{why}");
    }

    #[test]
    fn a_stored_set_converts_and_must_be_the_nodes_own() {
        let StoredSetAnswer::Stored(generation, set) = answer_of(Ok(stored("node1", 7)), &node())
        else {
            panic!("stored");
        };
        assert_eq!(generation, 7);
        assert_eq!(set.keys.len(), 1);
        let answer = answer_of(Ok(stored("node2", 7)), &node());
        assert!(
            matches!(&answer, StoredSetAnswer::NoAnswer(why) if why.contains("node2")),
            "{answer:?}"
        );
        let answer = answer_of(Ok(stored("node1", 0)), &node());
        assert!(
            matches!(&answer, StoredSetAnswer::NoAnswer(why) if why.contains("unreadable")),
            "{answer:?}"
        );
    }
}
