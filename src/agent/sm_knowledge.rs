//! What this node knows of its subnet manager: the one place the truth rules about the SM's
//! side are decided (README, "When ACTIVE and RELEASED are said (the truth rules)": Acknowledged,
//! In doubt, Generations, Per port). Pure: no I/O, no clock; the reconciler (`runner`) does the
//! sending and the durable writes and tells this module what happened.
//!
//! The life of one apply: [`SmKnowledge::begin_apply`] takes a generation and names the apply
//! ledger the store must hold before anything is sent (write-ahead);
//! [`SmKnowledge::carrying`] records what the apply carries, per (port, key); then either
//! [`SmKnowledge::acknowledged`] (a positive answer), [`SmKnowledge::move_past`] (the SM holds
//! a newer generation), or nothing (any other outcome: what it carried stays in doubt).
//!
//! The one in-doubt rule: a (port, key) is *in doubt* while an attempt after the last
//! acknowledgement may have carried the key to the port. Keys from the durable ledger (an
//! earlier life's attempts, ports unknown) count as carried to every port just below this
//! life's first generation. [`SmKnowledge::acked_with`] and [`SmKnowledge::acked_without_on`]
//! are the SM-side halves of ACTIVE and RELEASED (the port-read halves are in `plan`).

use crate::domain::{set_digest, AckedSet, ApplyLedger, Guid, Membership, NodeMemberships, PKey};
use std::collections::{BTreeMap, BTreeSet};

/// The subnet manager's last positive answer in this process's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The acknowledged apply's generation.
    pub generation: u64,
    /// The set it carried.
    pub set: NodeMemberships,
    /// When the answer arrived, Unix nanoseconds (for the evidence).
    pub unix_ns: i64,
    /// The SM hosts that acknowledged it (for the evidence; empty for a backend without
    /// separate SM hosts).
    pub hosts: Vec<String>,
}

/// What the node knows of the subnet manager's side (see the module doc).
#[derive(Debug, Clone)]
pub struct SmKnowledge {
    ack: Option<Ack>,
    carried: Carried,
    next_generation: u64,
    /// An apply since the last acknowledgement got no positive answer (so far).
    unacked: bool,
}

impl SmKnowledge {
    /// After a start: keys in the durable ledger may have been sent with any generation up to
    /// the reserved one, so they count as carried to every port there; this life's
    /// generations all lie above it. Nothing is acknowledged yet.
    pub fn resume(ledger: &ApplyLedger) -> SmKnowledge {
        let before = ledger.generation_reserved;
        SmKnowledge {
            ack: None,
            carried: Carried::from_ledger(ledger, before),
            next_generation: before.saturating_add(1),
            unacked: false,
        }
    }

    /// The durable ledger an attach must commit with its attachment: the new key entered, so
    /// the reconciler's apply needs no write of its own (None: already covered).
    pub fn ledger_for_attach(ledger: &ApplyLedger, key: PKey) -> Option<ApplyLedger> {
        ledger.covering(0, [&key])
    }

    /// Takes the next generation for an apply of `desired`, and the ledger that must be durable
    /// before it is sent (None: the stored `ledger` already covers it).
    pub fn begin_apply(
        &mut self,
        ledger: &ApplyLedger,
        desired: &NodeMemberships,
    ) -> (u64, Option<ApplyLedger>) {
        let generation = self.next_generation;
        self.next_generation = generation.saturating_add(1);
        (generation, ledger.covering_send(generation, desired))
    }

    /// The apply of `set` at `generation` may now reach the SM: until a positive answer, every
    /// (port, key) it carries is in doubt.
    pub fn carrying(&mut self, set: &NodeMemberships, generation: u64) {
        self.carried.record(set, generation);
        self.unacked = true;
    }

    /// A positive answer to the apply of `set` at `generation`, arrived at `unix_ns`, from a
    /// backend that names no SM hosts.
    #[cfg(test)]
    pub fn acknowledged(&mut self, generation: u64, set: NodeMemberships, unix_ns: i64) {
        self.acknowledged_by(generation, set, unix_ns, Vec::new());
    }

    /// Records that `set` at `generation` was acknowledged, naming the SM `hosts` that
    /// acknowledged it (the evidence of the ACTIVE and RELEASED claims it supports lists them).
    pub fn acknowledged_by(
        &mut self,
        generation: u64,
        set: NodeMemberships,
        unix_ns: i64,
        hosts: Vec<String>,
    ) {
        self.ack = Some(Ack {
            generation,
            set,
            unix_ns,
            hosts,
        });
        self.unacked = false;
    }

    /// The set of SM hosts changed (the node's `endpoints`, re-read on SIGHUP): the last
    /// acknowledgement came from the old set and no longer counts. Everything carried since
    /// this life began is in doubt again, and the current set must be sent until it is
    /// acknowledged by the new set.
    pub fn host_set_changed(&mut self) {
        self.ack = None;
        self.unacked = true;
    }

    /// The SM holds `stored`, a newer generation of this node: later applies go above it.
    pub fn move_past(&mut self, stored: u64) {
        self.next_generation = self.next_generation.max(stored.saturating_add(1));
    }

    /// After a start that may follow a lost life (`ApplyLedger::LOST_LIFE_MARGIN`): the next
    /// generation goes the margin above `known` (the highest generation this node knows was
    /// used or stored), so a request of the lost life that lands later is refused as stale.
    pub fn leap_past_lost_life(&mut self, known: u64) {
        self.move_past(known.saturating_add(ApplyLedger::LOST_LIFE_MARGIN));
    }

    /// The last positive answer in this life.
    pub fn ack(&self) -> Option<&Ack> {
        self.ack.as_ref()
    }

    /// An apply since the last acknowledgement got no positive answer: the current desired set
    /// must be sent until one is acknowledged, even when it equals the acknowledged one.
    pub fn unacked(&self) -> bool {
        self.unacked
    }

    /// The acknowledged generation (0 before any: every generation sent is above it).
    fn acked_generation(&self) -> u64 {
        self.ack.as_ref().map_or(0, |a| a.generation)
    }

    /// The in-doubt rule, for one last attempt's generation.
    fn carried_since_ack(&self, last_attempt: Option<u64>) -> bool {
        last_attempt.is_some_and(|g| g > self.acked_generation())
    }

    /// Whether `key` is in doubt on the port `guid`.
    pub fn in_doubt_on(&self, key: PKey, guid: Guid) -> bool {
        self.carried_since_ack(self.carried.last(key, guid))
    }

    /// Keys in doubt on some port (what `GetNode` reports).
    pub fn in_doubt(&self) -> Vec<PKey> {
        self.carried
            .keys()
            .filter(|k| self.carried_since_ack(self.carried.last_any(*k)))
            .collect()
    }

    /// Whether an acknowledged apply gave `key` with `membership` to every port in `guids`.
    pub fn acked_with(&self, key: PKey, membership: Membership, guids: &[Guid]) -> bool {
        self.ack.as_ref().is_some_and(|a| {
            a.set
                .keys
                .get(&key)
                .is_some_and(|s| s.membership == membership)
                && guids.iter().all(|g| a.set.gives(key, *g))
        })
    }

    /// Whether, for every port in `guids`, an acknowledged apply not giving `key` to it was
    /// issued after the last attempt that carried it there (the key is not in doubt there).
    pub fn acked_without_on(&self, key: PKey, guids: &[Guid]) -> bool {
        self.ack.as_ref().is_some_and(|a| {
            guids
                .iter()
                .all(|g| !a.set.gives(key, *g) && !self.in_doubt_on(key, *g))
        })
    }

    /// Whether an acknowledged apply without `key` on any port was issued after the last
    /// attempt that carried it anywhere: the durable ledger may then forget it.
    fn acked_without(&self, key: PKey) -> bool {
        self.ack.as_ref().is_some_and(|a| {
            a.set.guids_for(key).is_empty() && !self.carried_since_ack(self.carried.last_any(key))
        })
    }

    /// Forgets the (port, key) pairs the acknowledged apply settled: those it does not carry
    /// and no later attempt carried (the durable ledger drops keys in [`Self::ledger_after_ack`]).
    pub fn forget_released(&mut self) {
        if let Some(ack) = &self.ack {
            self.carried.forget_settled(&ack.set, ack.generation);
        }
    }

    /// `ledger` without the keys an acknowledged apply removed everywhere, and with the last
    /// acknowledged (generation, set digest) (None: unchanged). The durable ledger stays per
    /// key, the stricter reading: after a restart a key it holds is in doubt on every port.
    pub fn ledger_after_ack(&self, ledger: &ApplyLedger) -> Option<ApplyLedger> {
        let mut kept = ledger.clone();
        kept.keys.retain(|k| !self.acked_without(*k));
        if let Some(a) = &self.ack {
            // Only ever forward: an older answer never replaces a newer recorded one.
            if kept.acked.is_none_or(|r| r.generation < a.generation) {
                kept.acked = Some(AckedSet {
                    generation: a.generation,
                    digest: set_digest(&a.set),
                });
            }
        }
        (kept != *ledger).then_some(kept)
    }

    /// Knowledge with `ack` and `carried` as given (plan's tests).
    #[cfg(test)]
    pub(crate) fn with(ack: Option<Ack>, carried: Carried) -> SmKnowledge {
        SmKnowledge {
            ack,
            carried,
            next_generation: 0,
            unacked: false,
        }
    }
}

/// Per (port, key): the generation of the last apply attempt that may have carried the key to
/// the port, acknowledged or not. Keys from the durable [`ApplyLedger`] (an earlier life's
/// attempts, ports unknown) count as carried to every port at the generation before this
/// life's first.
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

    /// Every key some attempt may have carried, each once, in order.
    fn keys(&self) -> impl Iterator<Item = PKey> {
        let keys: BTreeSet<PKey> = self
            .every_port
            .keys()
            .copied()
            .chain(self.ports.keys().map(|(k, _)| *k))
            .collect();
        keys.into_iter()
    }

    /// Forgets what the acknowledged `set` at `generation` settled: (key, port) pairs it does
    /// not carry and no later attempt carried.
    fn forget_settled(&mut self, set: &NodeMemberships, generation: u64) {
        // The acknowledged set was recorded per port when it was sent, so an earlier life's
        // every-port entries older than it are superseded.
        self.every_port.retain(|_, g| *g >= generation);
        self.ports
            .retain(|(k, port), g| *g >= generation || set.gives(*k, *port));
    }
}

#[cfg(test)]
mod tests;
