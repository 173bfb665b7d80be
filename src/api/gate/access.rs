//! Who may call over the mTLS listener, replaceable while it serves: the three allowlists and the
//! certificate -> node mapping ([`TlsAccess`]) behind one shared [`LiveTlsAccess`]. The gate
//! reads the current value on every call and the Partitions handlers read its node mapping on
//! every call, so once [`LiveTlsAccess::replace`] returns, the next call is judged by the new
//! lists: an identity taken off a list is refused without a restart (calls already admitted,
//! such as an open WatchEvents stream, run to their end).

use super::auth::ClientAllowlist;
use super::node_identity::NodeMapping;
use std::sync::{Arc, RwLock};

/// The mTLS listener's allowlists and node mapping, as one value.
#[derive(Debug, Clone)]
pub struct TlsAccess {
    agent: ClientAllowlist,
    partitions: ClientAllowlist,
    operators: ClientAllowlist,
    anyone: ClientAllowlist,
    nobody: ClientAllowlist,
    nodes: NodeMapping,
}

/// Which service's list a call is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsService {
    /// `fabric.agent.v1.FabricAgent`: `allowed_clients`.
    Agent,
    /// `fabric.sm.v1.Partitions`: `partitions_clients`, operators reading.
    Partitions,
    /// Health and reflection: anyone on any list.
    Other,
}

impl TlsAccess {
    /// Who may call `FabricAgent` (`agent`), `Partitions` (`partitions`, and `operators` for its
    /// operator methods), and which node a certificate speaks for (`nodes`).
    pub fn new(
        agent: ClientAllowlist,
        partitions: ClientAllowlist,
        operators: ClientAllowlist,
        nodes: NodeMapping,
    ) -> TlsAccess {
        let anyone = agent.union(&partitions).union(&operators);
        TlsAccess {
            agent,
            partitions,
            operators,
            anyone,
            nobody: ClientAllowlist::default(),
            nodes,
        }
    }

    /// The lists a call to `service` is judged by: (who may call it, who may call it as an
    /// operator, to read and for the operator methods).
    pub fn lists(&self, service: TlsService) -> (&ClientAllowlist, &ClientAllowlist) {
        match service {
            TlsService::Agent => (&self.agent, &self.nobody),
            TlsService::Partitions => (&self.partitions, &self.operators),
            TlsService::Other => (&self.anyone, &self.nobody),
        }
    }

    /// Which node a certificate speaks for.
    pub fn nodes(&self) -> &NodeMapping {
        &self.nodes
    }
}

/// The [`TlsAccess`] in effect, shared by the gate and the handlers; cloning shares it.
#[derive(Debug, Clone)]
pub struct LiveTlsAccess {
    current: Arc<RwLock<Arc<TlsAccess>>>,
}

impl LiveTlsAccess {
    /// Starts with `access`.
    pub fn new(access: TlsAccess) -> LiveTlsAccess {
        LiveTlsAccess {
            current: Arc::new(RwLock::new(Arc::new(access))),
        }
    }

    /// The access in effect now (a snapshot: one call is judged by one version).
    pub fn current(&self) -> Arc<TlsAccess> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `access` in effect for every call admitted from now on.
    pub fn replace(&self, access: TlsAccess) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(access);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> ClientAllowlist {
        ClientAllowlist::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_replaced_access_is_what_every_holder_sees_next() {
        let live = LiveTlsAccess::new(TlsAccess::new(
            list(&["dns:a.example", "dns:b.example"]),
            list(&["dns:n1"]),
            list(&["dns:ops"]),
            NodeMapping::default(),
        ));
        let gate = live.clone();
        let before = gate.current();
        live.replace(TlsAccess::new(
            list(&["dns:b.example"]),
            ClientAllowlist::default(),
            ClientAllowlist::default(),
            NodeMapping::default(),
        ));
        let after = gate.current();
        let agent = |a: &TlsAccess| format!("{:?}", a.lists(TlsService::Agent).0);
        assert!(agent(&before).contains("a.example"));
        assert!(!agent(&after).contains("a.example"), "{}", agent(&after));
        assert!(agent(&after).contains("b.example"));
        let other = format!("{:?}", before.lists(TlsService::Other).0);
        for name in ["a.example", "n1", "ops"] {
            assert!(other.contains(name), "{other}");
        }
        let ops = |a: &TlsAccess, s| format!("{:?}", a.lists(s).1);
        assert!(ops(&before, TlsService::Partitions).contains("ops"));
        assert!(!ops(&before, TlsService::Agent).contains("ops"));
    }
}
