//! Client identity checks for the TCP listener: the TLS layer verifies the client certificate
//! against the configured CA; this interceptor then requires a certificate and an identity on the
//! allowlist (DNS or URI subject alternative name, or the subject's common name).

use std::collections::BTreeSet;
use std::sync::Arc;
use tonic::service::Interceptor;
use tonic::{Request, Status};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Who may call over TCP.
#[derive(Debug, Clone)]
pub struct ClientAllowlist {
    allowed: Arc<BTreeSet<String>>,
}

impl ClientAllowlist {
    /// Allows exactly these identities.
    pub fn new(identities: impl IntoIterator<Item = String>) -> ClientAllowlist {
        ClientAllowlist {
            allowed: Arc::new(identities.into_iter().collect()),
        }
    }

    /// Checks a DER client certificate: Ok(identity) when allowed.
    pub fn check(&self, der: &[u8]) -> Result<String, Status> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|_| Status::unauthenticated("client certificate does not parse"))?;
        let ids = identities(&cert);
        ids.iter()
            .find(|id| self.allowed.contains(*id))
            .cloned()
            .ok_or_else(|| {
                Status::permission_denied(format!(
                    "client identity {} is not allowed",
                    ids.first().map(String::as_str).unwrap_or("(none)")
                ))
            })
    }
}

fn identities(cert: &X509Certificate<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(s) | GeneralName::URI(s) => out.push((*s).to_owned()),
                _ => {}
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            out.push(s.to_owned());
        }
    }
    out
}

/// The per-listener gate: open on the unix socket (file permissions guard it), allowlisted on TCP
/// with TLS, open on plaintext loopback TCP (explicitly configured).
#[derive(Debug, Clone)]
pub(super) enum Gate {
    Open,
    Allowlist(ClientAllowlist),
}

impl Interceptor for Gate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match self {
            Gate::Open => Ok(request),
            Gate::Allowlist(list) => {
                let certs = request
                    .peer_certs()
                    .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
                let leaf = certs
                    .first()
                    .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
                let who = list.check(leaf.as_ref())?;
                tracing::debug!(client = %who, "authorised");
                Ok(request)
            }
        }
    }
}
