//! Per-identity quotas of the listeners' long-lived resources (TCP connections, open-ended
//! streams), so one certificate cannot take what every other caller needs: each certificate
//! identity holds at most `per_holder` slots, and the identities that are neither operators,
//! control planes nor peer SM hosts (the nodes) hold at most `shared` together, which keeps
//! `total - shared` slots for those. Local callers (the unix socket) count against the total
//! only.

use super::auth::{CertIdentity, ClientAllowlist};
use super::LiveTlsAccess;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Who holds a slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A TLS client, by its certificate's names (all of them, in order); an empty list is a
    /// connection without a client certificate.
    Cert(Arc<str>),
    /// A local caller (the unix socket) or the plaintext test listener: bounded by the total
    /// only.
    Local,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Cert(n) if n.is_empty() => f.write_str("a client without a certificate"),
            Holder::Cert(n) => write!(f, "certificate {n}"),
            Holder::Local => f.write_str("a local caller"),
        }
    }
}

/// Which pool a holder draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Nodes and unlisted identities: the shared pool.
    Shared,
    /// Operators, control planes, peer SM hosts and local callers: may also use the reserve.
    Reserved,
}

/// A holder and its pool, as the listener's layer attaches it to each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Who.
    pub holder: Holder,
    /// Its pool.
    pub class: Class,
}

impl Held {
    /// A local caller.
    pub fn local() -> Held {
        Held {
            holder: Holder::Local,
            class: Class::Reserved,
        }
    }
}

/// Decides which certificates may use the reserve: the TLS listener's operator and
/// control-plane lists in effect (replaced on SIGHUP) and the peer SM hosts' identities.
#[derive(Debug, Clone, Default)]
pub struct Reserve {
    access: Option<LiveTlsAccess>,
    peers: ClientAllowlist,
}

impl Reserve {
    /// The reserve is for the identities on `access`'s operator and `FabricAgent` lists, and
    /// `peers`.
    pub fn new(access: Option<LiveTlsAccess>, peers: ClientAllowlist) -> Reserve {
        Reserve { access, peers }
    }

    /// The holder and pool of a client certificate (leaf DER, its chain already verified by
    /// the handshake); `None`: no certificate.
    pub fn held_by_cert(&self, leaf: Option<&[u8]>) -> Held {
        let Some(der) = leaf else {
            return Held {
                holder: Holder::Cert("".into()),
                class: Class::Shared,
            };
        };
        let names = CertIdentity::names_unverified(der);
        let key = names
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let reserved = self.peers.matches_any(&names)
            || self.access.as_ref().is_some_and(|a| {
                let a = a.current();
                let (agent, _) = a.lists(super::TlsService::Agent);
                let (_, operators) = a.lists(super::TlsService::Partitions);
                agent.matches_any(&names) || operators.matches_any(&names)
            });
        Held {
            holder: Holder::Cert(key.into()),
            class: if reserved {
                Class::Reserved
            } else {
                Class::Shared
            },
        }
    }

    /// The holder of a request by its connection: a TLS client by its certificate, anything
    /// else local.
    pub fn held_by_request<B>(&self, request: &http::Request<B>) -> Held {
        match request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() {
            Some(tls) => {
                let certs = tls.peer_certs();
                self.held_by_cert(certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref()))
            }
            None => Held::local(),
        }
    }
}

/// The configured bounds of one quota, with the `[limits]` keys that set them (named in
/// refusals).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Slots in all.
    pub total: usize,
    /// Slots one certificate identity may hold.
    pub per_holder: usize,
    /// Slots kept for the reserved class: the shared pool is `total - reserved`.
    pub reserved: usize,
    /// What is counted ("connections", "streams").
    pub what: &'static str,
    /// The keys of `total`, `per_holder` and `reserved`.
    pub keys: [&'static str; 3],
}

#[derive(Default)]
struct Counts {
    by_holder: HashMap<Holder, usize>,
    shared: usize,
    total: usize,
}

/// Slots counted per holder and per pool; cloning shares them.
#[derive(Clone)]
pub struct Quota {
    bounds: Bounds,
    counts: Arc<Mutex<Counts>>,
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("bounds", &self.bounds)
            .finish()
    }
}

/// Why a slot was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The holder has its `per_holder`.
    Holder(Holder),
    /// The shared pool is full (the rest is kept for operators and peers).
    Shared,
    /// Every slot is taken.
    Total,
}

impl Quota {
    /// Empty, within `bounds`.
    pub fn new(bounds: Bounds) -> Quota {
        Quota {
            bounds,
            counts: Arc::default(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `held`, given back when the returned slot drops.
    pub fn take(&self, held: &Held) -> Result<QuotaSlot, Refusal> {
        let b = &self.bounds;
        let mut c = self.counts();
        if c.total >= b.total {
            return Err(Refusal::Total);
        }
        if held.class == Class::Shared && c.shared >= b.total.saturating_sub(b.reserved) {
            return Err(Refusal::Shared);
        }
        if let Holder::Cert(_) = &held.holder {
            let n = c.by_holder.entry(held.holder.clone()).or_insert(0);
            if *n >= b.per_holder {
                return Err(Refusal::Holder(held.holder.clone()));
            }
            *n += 1;
        }
        c.total += 1;
        if held.class == Class::Shared {
            c.shared += 1;
        }
        Ok(QuotaSlot {
            quota: self.clone(),
            held: held.clone(),
        })
    }

    /// Takes a slot, or RESOURCE_EXHAUSTED naming the bound that refused it.
    pub fn take_or_status(&self, held: &Held) -> Result<QuotaSlot, Status> {
        self.take(held)
            .map_err(|r| Status::resource_exhausted(self.explain(&r)))
    }

    /// The refusal in words, with the key that sets the bound.
    pub fn explain(&self, refusal: &Refusal) -> String {
        let b = &self.bounds;
        let [total_key, holder_key, reserved_key] = b.keys;
        match refusal {
            Refusal::Holder(h) => format!(
                "{h} already holds its maximum of {} {} ([limits] {holder_key}); close one or \
                 retry later",
                b.per_holder, b.what
            ),
            Refusal::Shared => format!(
                "the nodes' {} {} are all held; the other {} are kept for operators and peer \
                 SM hosts ([limits] {total_key}, {reserved_key}); retry later",
                b.total.saturating_sub(b.reserved),
                b.what,
                b.reserved
            ),
            Refusal::Total => format!(
                "this agent already serves its maximum of {} {} ([limits] {total_key}); \
                 retry later",
                b.total, b.what
            ),
        }
    }

    /// Slots held now, in all.
    pub fn in_use(&self) -> usize {
        self.counts().total
    }

    /// Slots `holder` holds now.
    pub fn held_by(&self, holder: &Holder) -> usize {
        self.counts().by_holder.get(holder).copied().unwrap_or(0)
    }
}

/// One slot of a [`Quota`]; given back when dropped.
pub struct QuotaSlot {
    quota: Quota,
    held: Held,
}

impl fmt::Debug for QuotaSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaSlot")
            .field("held", &self.held)
            .finish()
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        let mut c = self.quota.counts();
        c.total -= 1;
        if self.held.class == Class::Shared {
            c.shared -= 1;
        }
        if let Some(n) = c.by_holder.get_mut(&self.held.holder) {
            *n -= 1;
            if *n == 0 {
                c.by_holder.remove(&self.held.holder);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(total: usize, per_holder: usize, reserved: usize) -> Quota {
        Quota::new(Bounds {
            total,
            per_holder,
            reserved,
            what: "streams",
            keys: [
                "max_watch_streams",
                "max_watch_streams_per_identity",
                "reserved_watch_streams",
            ],
        })
    }

    fn cert(name: &str, class: Class) -> Held {
        Held {
            holder: Holder::Cert(name.into()),
            class,
        }
    }

    #[test]
    fn one_identity_holds_its_quota_and_the_reserve_stays_for_operators() {
        let q = quota(6, 2, 2);
        let a = cert("dns:a", Class::Shared);
        let _a1 = q.take(&a).unwrap();
        let a2 = q.take(&a).unwrap();
        assert_eq!(q.take(&a).unwrap_err(), Refusal::Holder(a.holder.clone()));
        assert!(q
            .explain(&Refusal::Holder(a.holder.clone()))
            .contains("max_watch_streams_per_identity"));
        let b = cert("dns:b", Class::Shared);
        let _b1 = q.take(&b).unwrap();
        let _b2 = q.take(&b).unwrap();
        // The shared pool (6 - 2) is full: a third node is refused, an operator is not.
        assert_eq!(
            q.take(&cert("dns:c", Class::Shared)).unwrap_err(),
            Refusal::Shared
        );
        let op = cert("dns:ops", Class::Reserved);
        let _o1 = q.take(&op).unwrap();
        let _l = q.take(&Held::local()).unwrap();
        assert_eq!(q.take(&op).unwrap_err(), Refusal::Total);
        // A slot given back can be taken again, by the node that gave it back.
        drop(a2);
        assert_eq!(q.held_by(&a.holder), 1);
        assert_eq!(q.in_use(), 5);
        assert!(q.take(&a).is_ok());
    }

    #[test]
    fn local_callers_count_against_the_total_only() {
        let q = quota(3, 1, 1);
        let slots: Vec<_> = (0..3).map(|_| q.take(&Held::local()).unwrap()).collect();
        assert_eq!(q.take(&Held::local()).unwrap_err(), Refusal::Total);
        drop(slots);
        assert_eq!(q.in_use(), 0);
    }
}
