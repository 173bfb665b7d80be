//! Bounds on the TCP listener's connections, applied before any call: how many are open, how
//! many one address may hold while unauthenticated (in its TLS handshake, or completed without a
//! client certificate), how long an unauthenticated connection lives, and how long any
//! connection lives at most (its maximum age plus grace: the server's GOAWAY at the maximum age
//! lets calls in progress finish, this deadline ends the connection even if a stream never
//! does). A [`BoundedConn`] holds its slots for as long as the connection is open.
//!
//! With an identity quota ([`ConnLimits::with_identity_quota`]), a connection that presented a
//! client certificate also takes a slot of its certificate's identity ([`super::quota`]). One
//! beyond that quota is treated like an unauthenticated connection (it keeps its address slot
//! and ends after `unauthenticated_for`) and is marked by its remote address, so the listener's
//! layer answers each of its calls with RESOURCE_EXHAUSTED and the reason instead of a bare
//! reset.

use super::quota::{Quota, QuotaSlot, Reserve};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// Unauthenticated connections per source address.
#[derive(Clone, Default)]
pub struct PerAddress {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One unauthenticated slot of one address; given back when dropped.
pub struct AddressSlot {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    addr: IpAddr,
}

impl PerAddress {
    /// Takes a slot for `addr` unless it already holds `max`.
    pub fn try_take(&self, addr: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(addr).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            held: self.held.clone(),
            addr,
        })
    }

    /// Slots `addr` holds now.
    #[cfg(test)]
    pub fn held_by(&self, addr: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&addr).copied().unwrap_or(0)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.addr);
            }
        }
    }
}

/// Connections refused by the identity quota, by remote address, with the reason.
type Marked = Arc<Mutex<HashMap<SocketAddr, String>>>;

/// The listener's connection bounds.
#[derive(Clone)]
pub struct ConnLimits {
    open: Arc<Semaphore>,
    unauthenticated: PerAddress,
    per_address: usize,
    unauthenticated_for: Duration,
    lifetime: Duration,
    identities: Option<(Quota, Reserve)>,
    over_quota: Marked,
}

impl ConnLimits {
    /// At most `max_connections` open, `per_address` unauthenticated per address, each living
    /// at most `unauthenticated_for` while unauthenticated and `lifetime` in any case.
    pub fn new(
        max_connections: usize,
        per_address: usize,
        unauthenticated_for: Duration,
        lifetime: Duration,
    ) -> Self {
        ConnLimits {
            open: Arc::new(Semaphore::new(max_connections)),
            unauthenticated: PerAddress::default(),
            per_address,
            unauthenticated_for,
            lifetime,
            identities: None,
            over_quota: Marked::default(),
        }
    }

    /// Also bounds the connections of each certificate identity by `quota`, `reserve` telling
    /// which identities may use its reserved slots.
    pub fn with_identity_quota(self, quota: Quota, reserve: Reserve) -> Self {
        ConnLimits {
            identities: Some((quota, reserve)),
            ..self
        }
    }

    /// Why the connection from `peer` is refused, if its identity was over its quota when it
    /// was accepted.
    pub fn refusal_of(&self, peer: &SocketAddr) -> Option<String> {
        let marked = self.over_quota.lock().unwrap_or_else(|p| p.into_inner());
        marked.get(peer).cloned()
    }

    /// Slots for a connection just accepted from `addr`, or why it must be closed now.
    pub fn admit(&self, addr: IpAddr) -> Result<ConnSlots, Refused> {
        let open = self
            .open
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::TooManyConnections)?;
        let slot = self
            .unauthenticated
            .try_take(addr, self.per_address)
            .ok_or(Refused::TooManyFromAddress)?;
        Ok(ConnSlots { open, slot })
    }

    /// How long a handshake may take, and an unauthenticated connection may live.
    pub fn unauthenticated_for(&self) -> Duration {
        self.unauthenticated_for
    }
}

/// Why a connection was closed as soon as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` are open.
    TooManyConnections,
    /// Its address already holds `max_unauthenticated_per_address`.
    TooManyFromAddress,
}

/// The slots of an accepted connection that has not authenticated yet.
pub struct ConnSlots {
    open: OwnedSemaphorePermit,
    slot: AddressSlot,
}

impl ConnSlots {
    /// The connection with its slots: a connection that presented a client certificate gives
    /// its address slot back and ends (reads see EOF) after the lifetime; one that did not
    /// keeps its slot and ends after `unauthenticated_for`.
    pub fn into_conn<T>(self, io: T, authenticated: bool, limits: &ConnLimits) -> BoundedConn<T> {
        let (slot, lives) = if authenticated {
            (None, limits.lifetime)
        } else {
            (Some(self.slot), limits.unauthenticated_for)
        };
        let deadline = Some(Box::pin(tokio::time::sleep(lives)));
        BoundedConn {
            io,
            _open: self.open,
            _slot: slot,
            _identity: None,
            _mark: None,
            deadline,
        }
    }

    /// The connection from `peer` with its slots, after its handshake presented `leaf` (the
    /// client certificate, chain verified) or none: as [`ConnSlots::into_conn`], and with an
    /// identity quota the certificate's identity takes a slot; one over its quota is kept like
    /// an unauthenticated connection and marked refused (see the module doc).
    pub fn into_identified_conn<T>(
        self,
        io: T,
        leaf: Option<&[u8]>,
        peer: SocketAddr,
        limits: &ConnLimits,
    ) -> BoundedConn<T> {
        let (Some(leaf), Some((quota, reserve))) = (leaf, &limits.identities) else {
            return self.into_conn(io, leaf.is_some(), limits);
        };
        let held = reserve.held_by_cert(Some(leaf));
        match quota.take(&held) {
            Ok(identity) => {
                let mut conn = self.into_conn(io, true, limits);
                conn._identity = Some(identity);
                conn
            }
            Err(refusal) => {
                let reason = quota.explain(&refusal);
                tracing::info!(%peer, reason, "connection over its identity's quota: its calls are refused");
                let mut conn = self.into_conn(io, false, limits);
                let mut marked = limits.over_quota.lock().unwrap_or_else(|p| p.into_inner());
                marked.insert(peer, reason);
                conn._mark = Some(Mark {
                    marked: limits.over_quota.clone(),
                    peer,
                });
                conn
            }
        }
    }
}

/// A connection's entry among those refused by the identity quota; removed when dropped.
struct Mark {
    marked: Marked,
    peer: SocketAddr,
}

impl Drop for Mark {
    fn drop(&mut self) {
        let mut marked = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        marked.remove(&self.peer);
    }
}

/// A connection holding its slots; an unauthenticated one reads EOF after its deadline.
pub struct BoundedConn<T> {
    io: T,
    _open: OwnedSemaphorePermit,
    _slot: Option<AddressSlot>,
    _identity: Option<QuotaSlot>,
    _mark: Option<Mark>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for BoundedConn<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(deadline) = self.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                // EOF: the server closes the connection.
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BoundedConn<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<T: Connected> Connected for BoundedConn<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_slots_and_gets_them_back() {
        let limits = ConnLimits::new(3, 2, Duration::from_secs(1), Duration::from_secs(60));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let first = limits.admit(a).unwrap();
        let _second = limits.admit(a).unwrap();
        assert_eq!(limits.admit(a).err(), Some(Refused::TooManyFromAddress));
        // Another address is not affected, up to the total.
        let _third = limits.admit(b).unwrap();
        assert_eq!(limits.admit(b).err(), Some(Refused::TooManyConnections));
        drop(first);
        assert_eq!(limits.unauthenticated.held_by(a), 1);
        assert!(limits.admit(a).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unauthenticated_connection_reads_eof_after_its_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = ConnLimits::new(4, 4, Duration::from_secs(10), Duration::from_secs(60));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let (client, server) = tokio::io::duplex(64);
        let mut conn = limits.admit(a).unwrap().into_conn(server, false, &limits);
        assert_eq!(limits.unauthenticated.held_by(a), 1);
        let mut client = client;
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        // Nothing more arrives; after 10 s the read ends.
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        drop(conn);
        assert_eq!(limits.unauthenticated.held_by(a), 0);
        // An authenticated one gives its address slot back at once.
        let (_c, server) = tokio::io::duplex(64);
        let _conn = limits.admit(a).unwrap().into_conn(server, true, &limits);
        assert_eq!(limits.unauthenticated.held_by(a), 0);
    }
}
