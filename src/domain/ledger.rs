use super::{Guid, NodeMemberships, PKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What this node may have told its subnet manager, persisted BEFORE anything is sent, so a
/// restarted agent knows which keys may have reached the subnet manager even when no answer
/// ever came back.
///
/// A key stays here from the moment an apply carrying it may be sent until an apply without it
/// was acknowledged. What that means for in doubt and RELEASED: the README's truth rules and
/// `agent::sm_knowledge`, which decides when the ledger is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyLedger {
    /// Every generation up to this one may have been used. Generations are reserved in blocks
    /// (one durable write per block, not per apply); a restarted agent continues above it.
    pub generation_reserved: u64,
    /// Keys an apply may have carried and no later acknowledged apply has removed.
    pub keys: BTreeSet<PKey>,
    /// The fabric side's last positive answer to this node, as recorded in the same commit as
    /// the apply's outcome (ACTIVE, RELEASED): at a start, a fabric side that holds a newer
    /// generation with a set that is neither this one nor the node's current desired set
    /// proves the store went back in time (`agent::start_check`). None before the first
    /// acknowledgement (and in stores written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked: Option<AckedSet>,
    /// The set this node sends, and the generation it was first sent at: written durably
    /// before an apply whose set differs from the recorded one is sent, so every send from
    /// `from` on carried this set. At a start, a host holding a generation at or above `from`
    /// with another set holds a write of a life the store does not know of: the store lost
    /// writes (`agent::start_check`). None before the first apply (and in stores written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sending: Option<SentSet>,
}

/// The set a node sends, as the ledger keeps it: its digest, the first generation it was sent
/// at, and what it gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentSet {
    /// [`set_digest`] of the set.
    pub digest: u64,
    /// The generation of its first apply.
    pub from: u64,
    /// Every (key, port) the set gives (None in records written before it was kept): an
    /// attachment whose key and ports are all here was sent, so a release of it needs a send
    /// the SM hosts can show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gives: Option<BTreeSet<(PKey, Guid)>>,
}

impl SentSet {
    /// The record of `set` first sent at `generation`.
    pub fn new(set: &NodeMemberships, generation: u64) -> SentSet {
        SentSet {
            digest: set_digest(set),
            from: generation,
            gives: Some(gives(set)),
        }
    }

    /// Whether the recorded set gives `key` to every one of `guids` (None: not recorded).
    pub fn gave_all(&self, key: PKey, guids: &[Guid]) -> Option<bool> {
        let gives = self.gives.as_ref()?;
        Some(guids.iter().all(|g| gives.contains(&(key, *g))))
    }
}

/// Every (key, port) `set` gives.
fn gives(set: &NodeMemberships) -> BTreeSet<(PKey, Guid)> {
    set.keys
        .keys()
        .flat_map(|k| set.guids_for(*k).into_iter().map(move |g| (*k, g)))
        .collect()
}

/// One acknowledged apply, as the ledger keeps it: its generation and its set's digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckedSet {
    /// The acknowledged apply's generation.
    pub generation: u64,
    /// [`set_digest`] of the set it carried.
    pub digest: u64,
}

/// A digest of what a set asks of the fabric: its port GUIDs and, per key, the membership and
/// the ports that get it (not the partition names, which are labels). Two sets with the same
/// digest program the same P_Key tables; stable across versions (FNV-1a over a fixed text).
pub fn set_digest(set: &NodeMemberships) -> u64 {
    let mut guids: Vec<_> = set.port_guids.clone();
    guids.sort_unstable();
    guids.dedup();
    let mut text = String::new();
    for g in &guids {
        text.push_str(&format!("port {g}\n"));
    }
    for (key, setting) in &set.keys {
        let mut ports = set.guids_for(*key);
        ports.sort_unstable();
        ports.dedup();
        text.push_str(&format!("key {:#06x} {}", key.base(), setting.membership));
        for p in ports {
            text.push_str(&format!(" {p}"));
        }
        text.push('\n');
    }
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl ApplyLedger {
    /// How many generations one durable write reserves.
    pub const RESERVE: u64 = 1024;

    /// How far above everything it knows a life that may follow a lost one starts its
    /// generations (an unclean stop, which is every state directory put back from a copy of a
    /// running agent, or a store found rolled back): a lost life's request still in flight, or
    /// retried by a dead process's TCP stack, carries a generation at most its own reservation,
    /// which no host may have seen yet. 64 blocks: a lost life would need more than 65,536
    /// sets beyond everything every SM host stored to outrank the new one. The generation
    /// bound (2^53) leaves room for 2^37 such starts, and the margin stays well under how far
    /// a peer SM host's set may lead another's (2^20, `sm::opensm::generation_bound`).
    pub const LOST_LIFE_MARGIN: u64 = 64 * Self::RESERVE;

    /// The ledger needed before sending `keys` at `generation`, or None when this one already
    /// covers it (no write needed).
    pub fn covering<'a>(
        &self,
        generation: u64,
        keys: impl IntoIterator<Item = &'a PKey>,
    ) -> Option<ApplyLedger> {
        let mut next = self.clone();
        next.keys.extend(keys);
        if generation > next.generation_reserved {
            next.generation_reserved = generation.saturating_add(Self::RESERVE - 1);
        }
        (next != *self).then_some(next)
    }

    /// The ledger needed before sending `set` at `generation`: [`Self::covering`] its keys and
    /// generation, and recording it as the set sent from `generation` on when it differs from
    /// the one recorded (None: this one already covers it, no write needed).
    pub fn covering_send(&self, generation: u64, set: &NodeMemberships) -> Option<ApplyLedger> {
        let mut next = self
            .covering(generation, set.keys.keys())
            .unwrap_or_else(|| self.clone());
        let digest = set_digest(set);
        next.sending = match next.sending.take() {
            // A record written before it named what the set gives: completed (one write).
            Some(s) if s.digest == digest => Some(SentSet {
                gives: s.gives.or_else(|| Some(gives(set))),
                ..s
            }),
            _ => Some(SentSet::new(set, generation)),
        };
        (next != *self).then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_writes_only_for_new_keys_or_generations() {
        let k = PKey::new(0x12).unwrap();
        let l = ApplyLedger::default();
        let l1 = l.covering(1, [&k]).expect("new key and generation");
        assert_eq!(l1.generation_reserved, ApplyLedger::RESERVE);
        assert!(l1.keys.contains(&k));
        assert_eq!(l1.covering(2, [&k]), None);
        assert_eq!(l1.covering(ApplyLedger::RESERVE, []), None);
        let l2 = l1
            .covering(ApplyLedger::RESERVE + 1, [])
            .expect("next block");
        assert_eq!(l2.generation_reserved, 2 * ApplyLedger::RESERVE);
    }

    #[test]
    fn a_send_is_recorded_once_per_change_of_the_set() {
        let k = PKey::new(0x12).unwrap();
        let empty = NodeMemberships {
            node_id: crate::domain::NodeId::parse("node1").unwrap(),
            port_guids: vec![crate::domain::Guid(1)],
            keys: Default::default(),
        };
        let mut with_k = empty.clone();
        with_k.keys.insert(
            k,
            crate::domain::KeySetting {
                membership: crate::domain::Membership::Full,
                name: "p12".into(),
                ports: None,
            },
        );
        let l1 = ApplyLedger::default()
            .covering_send(1, &empty)
            .expect("first send");
        assert_eq!(l1.sending, Some(SentSet::new(&empty, 1)));
        assert_eq!(
            l1.sending.as_ref().map(|s| (s.digest, s.from)),
            Some((set_digest(&empty), 1))
        );
        assert_eq!(
            l1.sending
                .as_ref()
                .and_then(|s| s.gave_all(k, &[crate::domain::Guid(1)])),
            Some(false)
        );
        assert_eq!(
            l1.covering_send(2, &empty),
            None,
            "the same set again: no write"
        );
        let l2 = l1.covering_send(3, &with_k).expect("another set");
        assert_eq!(l2.sending.as_ref().map(|s| s.from), Some(3));
        assert!(l2.keys.contains(&k));
        let sent = l2.sending.as_ref().expect("recorded");
        assert_eq!(sent.gave_all(k, &[crate::domain::Guid(1)]), Some(true));
        assert_eq!(
            sent.gave_all(k, &[crate::domain::Guid(1), crate::domain::Guid(2)]),
            Some(false),
            "a port it was not sent to"
        );
        let l3 = l2.covering_send(4, &empty).expect("back to the first set");
        assert_eq!(l3.sending.map(|s| s.from), Some(4));
    }
}
