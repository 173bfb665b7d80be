//! `fabric.sm.v1.Partitions/PullNodeSets`: anti-entropy between the SM hosts of one fabric. The
//! client ([`PeerClient`], one per configured peer) and the conversions of a peer's answer; the
//! sync itself is `sm::opensm::sync`'s. A peer's sets are converted through the same boundary as
//! a node's request (generation bounds, ids, GUIDs, keys, grants decoded), and a set that does
//! not convert is left out of the answer (logged), never taken in part.

use super::client::{sm_host_channel, RemoteError};
use super::convert::{memberships_from_proto, memberships_to_proto};
use crate::api::grant_v1::{signed_grant_from_proto, signed_grant_to_proto};
use crate::domain::NodeId;
use crate::domain::RetiredKeys;
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::opensm::peers::PeersConfig;
use crate::sm::opensm::sync::{Peer, PeerAnswer, PeerConsumed, PeerRevocation, PeerSet};
use async_trait::async_trait;
use std::sync::Arc;
use tonic::transport::Channel;

/// About the most one `PullNodeSets` answer holds (encoded), well under the 4 MiB message
/// limit whatever the sets hold: the rest follows in further pages.
pub const PAGE_BYTES: usize = 1 << 20;

/// Most pages one pull asks for before giving up (a peer whose paging never ends).
const MAX_PAGES: usize = 100_000;

/// Where an entry of an answer sorts, and what a page token names: (kind, node, sub-key).
type PageKey = (u8, String, String);

fn page_token(k: &PageKey) -> String {
    format!("{}/{}/{}", k.0, k.1, k.2)
}

/// A page token back to its key; `None` when it is not one this host hands out.
fn page_key(token: &str) -> Option<PageKey> {
    let mut parts = token.splitn(3, '/');
    let kind = parts.next()?.parse().ok()?;
    Some((kind, parts.next()?.to_owned(), parts.next()?.to_owned()))
}

/// One entry of an answer.
enum Entry<'a> {
    Retired(crate::domain::PKey, u64),
    Set(&'a PeerSet),
    Revocation(&'a PeerRevocation),
    Consumed(&'a NodeId, &'a str),
}

fn set_to_proto(s: &PeerSet) -> pb::PeerNodeSet {
    let mut m = memberships_to_proto(&s.memberships, s.generation);
    m.grants = s.grants.iter().map(signed_grant_to_proto).collect();
    pb::PeerNodeSet {
        memberships: Some(m),
        confirmed: s.confirmed,
    }
}

fn revocation_to_proto(r: &PeerRevocation) -> pb::RevokedInstance {
    pb::RevokedInstance {
        node_id: r.node.to_string(),
        instance_id: r.instance.clone(),
        grant_ids: r.grant_ids.iter().cloned().collect(),
    }
}

/// A peer's whole answer as sent, in one message (tests; the service sends [`answer_page`]).
pub fn answer_to_proto(a: &PeerAnswer) -> pb::PullNodeSetsResponse {
    answer_page(a, "", usize::MAX).unwrap_or_default()
}

/// The page of `a` after `token` ("" for the first): entries in a fixed order (retired keys,
/// sets, revocations, consumed grant ids, each by node), as many as fit in about `budget`
/// encoded bytes (at least one); `next_page_token` names the last one when more follow. The
/// token is a position, not an index: what changed between two pages is seen by the next pull.
/// `None`: the token is not one this host hands out.
pub fn answer_page(a: &PeerAnswer, token: &str, budget: usize) -> Option<pb::PullNodeSetsResponse> {
    use prost::Message;
    let after = if token.is_empty() {
        None
    } else {
        Some(page_key(token)?)
    };
    let mut entries: Vec<(PageKey, Entry<'_>)> = Vec::new();
    for (k, t) in a.retired.iter() {
        entries.push((
            (0, format!("{:04x}", k.base()), String::new()),
            Entry::Retired(k, t),
        ));
    }
    for s in &a.sets {
        entries.push((
            (1, s.memberships.node_id.to_string(), String::new()),
            Entry::Set(s),
        ));
    }
    for r in &a.revocations {
        entries.push((
            (2, r.node.to_string(), r.instance.clone()),
            Entry::Revocation(r),
        ));
    }
    for c in &a.consumed {
        for id in &c.grant_ids {
            entries.push((
                (3, c.node.to_string(), id.clone()),
                Entry::Consumed(&c.node, id),
            ));
        }
    }
    entries.sort_by(|x, y| x.0.cmp(&y.0));
    let mut page = pb::PullNodeSetsResponse {
        host: a.host.clone(),
        caught_up: a.caught_up,
        host_name: a.host_name.clone(),
        fenced_hosts: a
            .fenced
            .iter()
            .map(super::convert::fenced_to_proto)
            .collect(),
        ..pb::PullNodeSetsResponse::default()
    };
    let mut size = page.encoded_len();
    let mut last: Option<&PageKey> = None;
    let mut rest = entries
        .iter()
        .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
        .peekable();
    while let Some((key, entry)) = rest.peek() {
        let cost = match entry {
            Entry::Retired(k, t) => pb::RetiredPKey {
                pkey: u32::from(k.base()),
                retired_at_unix_ms: *t,
            }
            .encoded_len(),
            Entry::Set(s) => set_to_proto(s).encoded_len(),
            Entry::Revocation(r) => revocation_to_proto(r).encoded_len(),
            Entry::Consumed(node, id) => node.as_str().len() + id.len() + 8,
        } + 8;
        if last.is_some() && size.saturating_add(cost) > budget {
            break;
        }
        size += cost;
        match entry {
            Entry::Retired(k, t) => page.retired_pkeys.push(pb::RetiredPKey {
                pkey: u32::from(k.base()),
                retired_at_unix_ms: *t,
            }),
            Entry::Set(s) => page.sets.push(set_to_proto(s)),
            Entry::Revocation(r) => page.revocations.push(revocation_to_proto(r)),
            Entry::Consumed(node, id) => match page.consumed.last_mut() {
                Some(c) if c.node_id == node.as_str() => c.grant_ids.push((*id).to_owned()),
                _ => page.consumed.push(pb::ConsumedGrants {
                    node_id: node.to_string(),
                    grant_ids: vec![(*id).to_owned()],
                }),
            },
        }
        last = Some(key);
        rest.next();
    }
    if rest.peek().is_some() {
        page.next_page_token = last.map(page_token).unwrap_or_default();
    }
    Some(page)
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
    let consumed = r
        .consumed
        .into_iter()
        .filter_map(|c| {
            let node = NodeId::try_from(c.node_id.clone());
            match (node, c.grant_ids.iter().find(|id| !crate::domain::is_grant_id(id))) {
                (Ok(node), None) => Some(PeerConsumed {
                    node,
                    grant_ids: c.grant_ids.into_iter().collect(),
                }),
                (Err(e), _) => {
                    tracing::warn!(peer, node_id = %c.node_id, error = %e, "peer sent consumed grants for a bad node id; left out");
                    None
                }
                (_, Some(bad)) => {
                    tracing::warn!(peer, node_id = %c.node_id, grant_id = %bad, "peer sent a bad consumed grant id; that node's left out");
                    None
                }
            }
        })
        .collect();
    let mut retired = RetiredKeys::default();
    for k in r.retired_pkeys {
        match crate::domain::PKey::new(k.pkey) {
            Ok(pkey) if k.retired_at_unix_ms > 0 => {
                retired.retire(pkey, k.retired_at_unix_ms);
            }
            _ => {
                tracing::warn!(
                    peer,
                    pkey = k.pkey,
                    retired_at_unix_ms = k.retired_at_unix_ms,
                    "peer sent a bad retired P_Key; left out"
                )
            }
        }
    }
    PeerAnswer {
        host: r.host,
        caught_up: r.caught_up,
        sets,
        revocations,
        consumed,
        retired,
        host_name: r.host_name,
        fenced: r
            .fenced_hosts
            .into_iter()
            .map(|f| crate::sm::opensm::fence::FencedHost {
                host: f.host,
                since_unix_ms: f.since_unix_ms,
                evidence: f.evidence,
            })
            .collect(),
    }
}

/// Adds a further page's entries to the first page.
fn merge_page(into: &mut pb::PullNodeSetsResponse, page: pb::PullNodeSetsResponse) {
    into.sets.extend(page.sets);
    into.revocations.extend(page.revocations);
    into.consumed.extend(page.consumed);
    into.retired_pkeys.extend(page.retired_pkeys);
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

    /// Every page of the peer's answer (nothing is taken from a pull that did not finish).
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String> {
        let mut client = self.client.clone();
        let mut whole: Option<pb::PullNodeSetsResponse> = None;
        let mut token = String::new();
        for _ in 0..MAX_PAGES {
            let mut reply = client
                .pull_node_sets(pb::PullNodeSetsRequest {
                    from_host: from_host.to_owned(),
                    page_token: token.clone(),
                })
                .await
                .map_err(|s| format!("{}: {}", s.code(), s.message()))?
                .into_inner();
            let next = std::mem::take(&mut reply.next_page_token);
            match &mut whole {
                None => whole = Some(reply),
                Some(w) => merge_page(w, reply),
            }
            if next.is_empty() {
                let whole = whole.unwrap_or_default();
                return Ok(answer_from_proto(&self.endpoint, whole));
            }
            let advances = match (page_key(&next), page_key(&token)) {
                (Some(n), Some(t)) => n > t,
                (Some(_), None) => token.is_empty(),
                _ => false,
            };
            if !advances {
                return Err(format!(
                    "the peer's page token {next:?} does not advance past {token:?}"
                ));
            }
            token = next;
        }
        Err(format!(
            "the peer's answer did not end within {MAX_PAGES} pages"
        ))
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
            consumed: vec![PeerConsumed {
                node: m.node_id.clone(),
                grant_ids: ["g-0".to_owned()].into(),
            }],
            retired: RetiredKeys::default(),
            host_name: "smhost.fab".into(),
            fenced: vec![crate::sm::opensm::fence::FencedHost {
                host: "smhost3".into(),
                since_unix_ms: 5,
                evidence: "SMInfo: no answer".into(),
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
        assert_eq!(back.host_name, "smhost.fab");
        assert_eq!(back.fenced, a.fenced);
        assert_eq!(back.sets.len(), 1);
        assert_eq!(back.sets[0].memberships, m);
        assert_eq!(back.sets[0].generation, 7);
        assert!(back.caught_up);
        wire.sets[0].memberships.as_mut().unwrap().generation = 0;
        assert!(answer_from_proto("p", wire).sets.is_empty());
    }

    #[test]
    fn answers_are_paged_under_the_budget_and_lose_nothing() {
        let sets: Vec<PeerSet> = (0..300)
            .map(|i| PeerSet {
                memberships: NodeMemberships {
                    node_id: crate::domain::NodeId::try_from(format!("node{i}")).unwrap(),
                    port_guids: vec![Guid(0x100000 + i)],
                    keys: Default::default(),
                },
                generation: 1,
                grants: Vec::new(),
                confirmed: true,
            })
            .collect();
        let consumed = sets
            .iter()
            .map(|s| PeerConsumed {
                node: s.memberships.node_id.clone(),
                grant_ids: (0..40).map(|j| format!("g-{j:03}-{:0>100}", 7)).collect(),
            })
            .collect();
        let mut retired = RetiredKeys::default();
        retired.retire(crate::domain::PKey::new(0x0a11).unwrap(), 5);
        let a = PeerAnswer {
            host: "h".into(),
            caught_up: true,
            sets,
            revocations: Vec::new(),
            consumed,
            retired,
            ..PeerAnswer::default()
        };
        let whole = answer_to_proto(&a);
        assert!(whole.next_page_token.is_empty());
        let budget = 64 * 1024;
        let mut token = String::new();
        let mut merged: Option<pb::PullNodeSetsResponse> = None;
        let mut pages = 0;
        loop {
            let mut page = answer_page(&a, &token, budget).unwrap();
            pages += 1;
            assert!(
                prost::Message::encoded_len(&page) <= budget + 256,
                "page {pages}: {} bytes",
                prost::Message::encoded_len(&page)
            );
            let next = std::mem::take(&mut page.next_page_token);
            match &mut merged {
                None => merged = Some(page),
                Some(m) => merge_page(m, page),
            }
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert!(pages > 10, "{pages} pages");
        let merged = answer_from_proto("p", merged.unwrap());
        let back = answer_from_proto("p", whole);
        assert_eq!(merged.sets.len(), 300);
        assert_eq!(merged.retired, back.retired);
        let ids = |x: &PeerAnswer| -> usize { x.consumed.iter().map(|c| c.grant_ids.len()).sum() };
        assert_eq!(ids(&merged), 300 * 40);
        assert_eq!(ids(&back), 300 * 40);
        assert!(answer_page(&a, "not a token", budget).is_none());
    }
}
