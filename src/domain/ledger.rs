use super::{Guid, NodeMemberships, PKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What this node may have told its subnet manager, persisted BEFORE anything is sent, so a
/// restarted agent knows which keys may have reached the subnet manager even when no answer
/// ever came back.
///
/// A key stays here from the moment an apply carrying it may be sent until an apply without it
/// was acknowledged; while it is here and no such acknowledgement was seen since the last
/// attempt carrying it, the key is *in doubt* and can never be reported RELEASED.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyLedger {
    /// Every generation up to this one may have been used. Generations are reserved in blocks
    /// (one durable write per block, not per apply); a restarted agent continues above it.
    pub generation_reserved: u64,
    /// Keys an apply may have carried and no later acknowledged apply has removed.
    pub keys: BTreeSet<PKey>,
}

impl ApplyLedger {
    /// How many generations one durable write reserves.
    pub const RESERVE: u64 = 1024;

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
}

/// Per (port, key): the generation of the last apply attempt that may have carried the key to
/// the port, acknowledged or not. Keys from the durable [`ApplyLedger`] (an earlier life's
/// attempts, ports unknown) count as carried to every port at the generation before this
/// life's first; the durable ledger itself stays per key, which is the stricter reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// Key -> generation, for every port.
    every_port: BTreeMap<PKey, u64>,
    /// (key, port) -> generation.
    ports: BTreeMap<(PKey, Guid), u64>,
}

impl Carried {
    /// Every key of `ledger`, carried to every port at `generation`.
    pub fn from_ledger(ledger: &ApplyLedger, generation: u64) -> Carried {
        Carried {
            every_port: ledger.keys.iter().map(|k| (*k, generation)).collect(),
            ports: BTreeMap::new(),
        }
    }

    /// Records an attempt to send `set` at `generation`.
    pub fn record(&mut self, set: &NodeMemberships, generation: u64) {
        for key in set.keys.keys() {
            for g in set.guids_for(*key) {
                self.ports.insert((*key, g), generation);
            }
        }
    }

    /// The last attempt that may have carried `key` to the port `guid`.
    pub fn last(&self, key: PKey, guid: Guid) -> Option<u64> {
        let every = self.every_port.get(&key).copied();
        let port = self.ports.get(&(key, guid)).copied();
        every.max(port)
    }

    /// The last attempt that may have carried `key` to any port.
    pub fn last_any(&self, key: PKey) -> Option<u64> {
        let every = self.every_port.get(&key).copied();
        let ports = self
            .ports
            .range((key, Guid(0))..=(key, Guid(u64::MAX)))
            .map(|(_, g)| *g)
            .max();
        every.max(ports)
    }

    /// Keys some attempt after generation `acked` carried (in doubt).
    pub fn in_doubt(&self, acked: u64) -> Vec<PKey> {
        let keys: BTreeSet<PKey> = self
            .every_port
            .iter()
            .map(|(k, g)| (*k, *g))
            .chain(self.ports.iter().map(|((k, _), g)| (*k, *g)))
            .filter(|(_, g)| *g > acked)
            .map(|(k, _)| k)
            .collect();
        keys.into_iter().collect()
    }

    /// Forgets what the acknowledged `set` at `generation` settled: (key, port) pairs it does
    /// not carry and no later attempt carried.
    pub fn forget_settled(&mut self, set: &NodeMemberships, generation: u64) {
        // The acknowledged set was recorded per port when it was sent, so an earlier life's
        // every-port entries older than it are superseded.
        self.every_port.retain(|_, g| *g >= generation);
        self.ports
            .retain(|(k, port), g| *g >= generation || set.gives(*k, *port));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_is_per_port_and_ledger_keys_count_for_every_port() {
        use crate::domain::{KeySetting, Membership, NodeId};
        let k = PKey::new(0x12).unwrap();
        let set = |ports: &[u64]| NodeMemberships {
            node_id: NodeId::parse("n").unwrap(),
            port_guids: vec![Guid(1), Guid(2)],
            keys: [(
                k,
                KeySetting {
                    membership: Membership::Full,
                    name: String::new(),
                    ports: Some(ports.iter().map(|g| Guid(*g)).collect()),
                },
            )]
            .into(),
        };
        let ledger = ApplyLedger {
            generation_reserved: 10,
            keys: [k].into(),
        };
        let mut c = Carried::from_ledger(&ledger, 10);
        assert_eq!(c.last(k, Guid(1)), Some(10));
        c.record(&set(&[2]), 11);
        assert_eq!(c.last(k, Guid(1)), Some(10));
        assert_eq!(c.last(k, Guid(2)), Some(11));
        assert_eq!(c.last_any(k), Some(11));
        assert_eq!(c.in_doubt(10), vec![k]);
        c.forget_settled(&set(&[2]), 11);
        assert_eq!(c.last(k, Guid(1)), None, "port 1 settled without the key");
        assert_eq!(c.last(k, Guid(2)), Some(11), "port 2 still carries it");
        assert!(c.in_doubt(11).is_empty());
    }

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
}
