//! Who is calling: the [`Caller`] of one request, established from the connection (SO_PEERCRED
//! on the unix socket, the verified client certificate on TLS), and the [`Policy`] a listener
//! admits callers by for each method. [`super::Guarded`] applies it to every service.

use super::access::{LiveTlsAccess, TlsService};
use super::auth::{CertIdentity, ClientAllowlist, ClientId};
use crate::sys::users::GroupError;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tonic::Status;

/// The verified caller of one request.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A local process on the unix socket, identified by SO_PEERCRED.
    Local {
        /// Its effective uid.
        uid: u32,
        /// Whether it may call mutating RPCs (root, the agent's user, `listen.allowed_uids`).
        privileged: bool,
    },
    /// A TLS client with a verified certificate.
    Cert {
        /// The certificate's names.
        identity: Arc<CertIdentity>,
        /// The name that matched the service's allowlist (or the operator list).
        matched: ClientId,
        /// Whether the certificate is on the operator list (may read every node's memberships).
        operator: bool,
    },
    /// A plaintext loopback test rig (`insecure_plaintext_for_tests`): nobody is authenticated.
    InsecureTest,
}

impl Caller {
    /// The caller a guarded request carries.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&Caller> {
        request.extensions().get::<Caller>()
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Local { uid, .. } => write!(f, "unix uid={uid}"),
            Caller::Cert { matched, .. } => write!(f, "cert {matched}"),
            Caller::InsecureTest => f.write_str("plaintext (test rig, unauthenticated)"),
        }
    }
}

/// Methods that change nothing; every other method counts as mutating (fail closed).
const READ_ONLY: &[&str] = &[
    "/fabric.agent.v1.FabricAgent/GetNode",
    "/fabric.agent.v1.FabricAgent/GetAttachment",
    "/fabric.agent.v1.FabricAgent/ListAttachments",
    "/fabric.agent.v1.FabricAgent/WatchEvents",
    "/fabric.sm.v1.Partitions/GetNodeMemberships",
    "/fabric.sm.v1.Partitions/ListPartitionMembers",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Mutating methods that callers on the operator list may call too (the handler then admits
/// only operators): the control plane's revocation and P_Key retirement on the fabric side.
const OPERATOR_MUTATIONS: &[&str] = &[
    "/fabric.sm.v1.Partitions/RevokeInstance",
    "/fabric.sm.v1.Partitions/RetirePartitionKey",
];

/// Whether a gRPC path names a read-only method.
pub fn is_read_only(path: &str) -> bool {
    READ_ONLY.contains(&path)
}

/// Who may call over the unix socket: root, the agent's own user and `allowed_uids` may call
/// anything; members of the read group may call read-only methods. The group's supplementary
/// members are read once at start, so no request waits on the user database.
#[derive(Debug, Clone)]
pub struct LocalPolicy {
    own_uid: u32,
    read_gid: Option<u32>,
    readers: Arc<BTreeSet<u32>>,
    mutators: Arc<BTreeSet<u32>>,
}

impl LocalPolicy {
    /// From `[listen]`'s `read_group` (resolved here) and `allowed_uids`. Without a read
    /// group, only root, the agent's own user and `allowed_uids` may call at all: the agent's
    /// own group is never a read group by default, since it may read the agent's configuration
    /// and keys.
    pub fn new(read_group: Option<&str>, allowed_uids: &[u32]) -> Result<LocalPolicy, GroupError> {
        let (own_uid, _) = crate::sys::users::own_ids();
        let read_gid = match read_group {
            Some(g) => Some(crate::sys::users::group_id(g)?),
            None => None,
        };
        let readers = match read_gid {
            Some(gid) => crate::sys::users::group_member_uids(gid)?,
            None => Vec::new(),
        };
        Ok(LocalPolicy {
            own_uid,
            read_gid,
            readers: Arc::new(readers.into_iter().collect()),
            mutators: Arc::new(allowed_uids.iter().copied().collect()),
        })
    }

    /// The read group's gid, if one is configured (the socket file is given that group).
    pub fn read_gid(&self) -> Option<u32> {
        self.read_gid
    }

    fn may_mutate(&self, uid: u32) -> bool {
        uid == 0 || uid == self.own_uid || self.mutators.contains(&uid)
    }

    fn admit(&self, uid: u32, gid: u32, read_only: bool, path: &str) -> Result<Caller, Status> {
        let privileged = self.may_mutate(uid);
        let reader = Some(gid) == self.read_gid || self.readers.contains(&uid);
        if privileged || (read_only && reader) {
            return Ok(Caller::Local { uid, privileged });
        }
        Err(Status::permission_denied(if read_only {
            format!(
                "unix uid={uid} may not call {path}: reading needs root, the agent's user, \
                 listen.allowed_uids or membership of the read group ({})",
                self.read_gid.map_or_else(
                    || "none is configured: listen.read_group".to_owned(),
                    |g| format!("gid {g}")
                )
            )
        } else {
            format!(
                "unix uid={uid} may not call {path}: changes need root, the agent's user or \
                 listen.allowed_uids"
            )
        }))
    }
}

/// What one listener requires of the callers of one service.
#[derive(Debug, Clone)]
pub enum Policy {
    /// The unix socket.
    Local(LocalPolicy),
    /// TLS with the lists in effect at each call (replaced on SIGHUP): `service` picks which
    /// list may call, and which may call its read-only and operator methods.
    LiveTls {
        /// The lists in effect.
        access: LiveTlsAccess,
        /// Whose lists.
        service: TlsService,
    },
    /// Plaintext loopback on a test rig.
    InsecureTest,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Policy {
    /// The caller of a request, or the status refusing it.
    pub fn admit<B>(&self, request: &http::Request<B>) -> Result<Caller, Status> {
        let path = request.uri().path();
        let read_only = is_read_only(path);
        match self {
            Policy::InsecureTest => Ok(Caller::InsecureTest),
            Policy::Local(local) => {
                let cred = request
                    .extensions()
                    .get::<UdsConnectInfo>()
                    .and_then(|i| i.peer_cred)
                    .ok_or_else(|| {
                        Status::permission_denied("the caller's credentials are unavailable")
                    })?;
                local.admit(cred.uid(), cred.gid(), read_only, path)
            }
            Policy::LiveTls { access, service } => {
                let access = access.current();
                let (allowed, operators) = access.lists(*service);
                admit_cert(request, allowed, operators)
            }
        }
    }
}

/// A TLS caller: a verified certificate on `allowed`, or on `operators` for a read-only or
/// operator method.
fn admit_cert<B>(
    request: &http::Request<B>,
    allowed: &ClientAllowlist,
    operators: &ClientAllowlist,
) -> Result<Caller, Status> {
    let path = request.uri().path();
    let read_only = is_read_only(path);
    let certs = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
    let identity = CertIdentity::verify(&certs, now())?;
    let operator = operators.matching(&identity);
    let matched = match (allowed.matching(&identity), &operator) {
        (Some(m), _) => m,
        (None, Some(op)) if read_only || OPERATOR_MUTATIONS.contains(&path) => op.clone(),
        (None, Some(op)) => {
            return Err(Status::permission_denied(format!(
                "operator identity {op} may only read here, not call {path}"
            )))
        }
        (None, None) => return Err(allowed.refusal(&identity)),
    };
    Ok(Caller::Cert {
        identity: Arc::new(identity),
        matched,
        operator: operator.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_policy() {
        let p = LocalPolicy {
            own_uid: 990,
            read_gid: Some(990),
            readers: Arc::new([1002].into()),
            mutators: Arc::new([1000].into()),
        };
        let attach = "/fabric.agent.v1.FabricAgent/AttachPartition";
        let get = "/fabric.agent.v1.FabricAgent/GetNode";
        assert!(p.admit(0, 0, false, attach).is_ok());
        assert!(p.admit(990, 990, false, attach).is_ok());
        assert!(p.admit(1000, 1000, false, attach).is_ok());
        let e = p.admit(1001, 990, false, attach).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("uid=1001"), "{}", e.message());
        assert!(p.admit(1001, 990, true, get).is_ok());
        assert!(p.admit(1001, 1001, true, get).is_err());
        assert!(
            p.admit(1002, 1002, true, get).is_ok(),
            "a supplementary member reads"
        );
        assert!(p.admit(1002, 1002, false, attach).is_err());
        assert!(!is_read_only("/fabric.agent.v1.FabricAgent/NewMethod"));
        assert!(is_read_only(get));
    }
}
