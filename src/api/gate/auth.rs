//! Client certificate identities for the TCP listener. The TLS layer verifies the chain against
//! the configured CA bundle; [`CertIdentity::verify`] then checks the validity period and the
//! extended key usage, and a [`ClientAllowlist`] of typed entries (`dns:`, `uri:`, `cn:`) says
//! who may call. A subject CN is an identity only for a certificate without DNS/URI SANs, so a
//! certificate issued for `dns:a` can never pass as `cn:b`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use tonic::Status;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::time::ASN1Time;

/// One name a certificate can carry, typed by where it sits in the certificate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClientId {
    /// A DNS subject alternative name (compared case-insensitively; stored lower case).
    Dns(String),
    /// A URI subject alternative name, e.g. a SPIFFE id (compared exactly).
    Uri(String),
    /// The subject common name of a certificate without DNS/URI SANs.
    Cn(String),
}

/// An allowlist entry that does not parse; each says how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientIdError {
    /// No `dns:`, `uri:` or `cn:` prefix.
    #[error(
        "{0:?} does not say what it matches; write \"dns:{0}\" (a DNS SAN), \
         \"uri:spiffe://...\" (a URI SAN) or \"cn:{0}\" (the subject CN of a \
         certificate without DNS/URI SANs)"
    )]
    Untyped(String),
    /// The name after the prefix is empty or has surrounding spaces.
    #[error("{entry:?}: the name after \"{kind}:\" is empty or has surrounding spaces")]
    EmptyName {
        /// The entry.
        entry: String,
        /// Its prefix.
        kind: String,
    },
    /// A `*` elsewhere than a leading `*.` label (or a `/`).
    #[error("{0:?}: a DNS name may only use \"*.\" as its first label")]
    DnsWildcard(String),
    /// A URI without a scheme.
    #[error("{0:?}: a URI entry needs a scheme, e.g. \"uri:spiffe://fab2.example/node/n1\"")]
    UriWithoutScheme(String),
}

impl ClientId {
    /// Parses a typed allowlist entry: `dns:NAME`, `uri:URI` or `cn:NAME`. The error says how
    /// to write an untyped or empty entry.
    pub fn parse(entry: &str) -> Result<ClientId, ClientIdError> {
        let (kind, name) = match entry.split_once(':') {
            Some((k @ ("dns" | "uri" | "cn"), n)) => (k, n),
            _ => return Err(ClientIdError::Untyped(entry.to_owned())),
        };
        if name.is_empty() || name.trim() != name {
            return Err(ClientIdError::EmptyName {
                entry: entry.to_owned(),
                kind: kind.to_owned(),
            });
        }
        Ok(match kind {
            "dns" => {
                let bare = name.strip_prefix("*.").unwrap_or(name);
                if bare.is_empty() || bare.contains('*') || bare.contains('/') {
                    return Err(ClientIdError::DnsWildcard(entry.to_owned()));
                }
                ClientId::Dns(name.to_ascii_lowercase())
            }
            "uri" => {
                if !name.contains("://") {
                    return Err(ClientIdError::UriWithoutScheme(entry.to_owned()));
                }
                ClientId::Uri(name.to_owned())
            }
            _ => ClientId::Cn(name.to_owned()),
        })
    }

    /// Whether this allowlist entry matches a certificate's name. A `dns:*.suffix` entry matches
    /// exactly one extra leading label.
    pub fn matches(&self, name: &ClientId) -> bool {
        match (self, name) {
            (ClientId::Dns(pattern), ClientId::Dns(n)) => match pattern.strip_prefix("*.") {
                Some(suffix) => n
                    .strip_suffix(suffix)
                    .and_then(|head| head.strip_suffix('.'))
                    .is_some_and(|label| !label.is_empty() && !label.contains('.')),
                None => pattern == n,
            },
            _ => self == name,
        }
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientId::Dns(n) => write!(f, "dns:{n}"),
            ClientId::Uri(u) => write!(f, "uri:{u}"),
            ClientId::Cn(c) => write!(f, "cn:{c}"),
        }
    }
}

/// The names of a verified client certificate: its DNS and URI SANs, or, only when it has
/// neither, its subject CN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    names: Vec<ClientId>,
    /// The DNS SANs exactly as written (not case-folded): node ids are case-sensitive.
    dns_as_written: Vec<String>,
}

impl CertIdentity {
    /// Checks a presented chain (leaf first) at `now` (seconds since the epoch): every
    /// certificate parses and is within its validity period, and the leaf's extended key usage,
    /// when present, includes clientAuth. Refusals are UNAUTHENTICATED with the reason.
    pub fn verify(chain: &[impl AsRef<[u8]>], now: i64) -> Result<CertIdentity, Status> {
        if chain.is_empty() {
            return Err(Status::unauthenticated("a client certificate is required"));
        }
        let at = ASN1Time::from_timestamp(now)
            .map_err(|_| Status::internal("the system clock is out of range"))?;
        let mut names = Vec::new();
        let mut dns_as_written = Vec::new();
        for (i, der) in chain.iter().enumerate() {
            let (_, cert) = X509Certificate::from_der(der.as_ref())
                .map_err(|_| Status::unauthenticated("client certificate does not parse"))?;
            let what = if i == 0 {
                "client certificate".to_owned()
            } else {
                format!("intermediate certificate {i} of the client's chain")
            };
            let v = cert.validity();
            if at < v.not_before {
                return Err(Status::unauthenticated(format!(
                    "{what} is not valid yet (valid from {})",
                    v.not_before
                )));
            }
            if at > v.not_after {
                return Err(Status::unauthenticated(format!(
                    "{what} expired at {}",
                    v.not_after
                )));
            }
            if i == 0 {
                if let Ok(Some(eku)) = cert.extended_key_usage() {
                    if !eku.value.client_auth && !eku.value.any {
                        return Err(Status::unauthenticated(
                            "client certificate's extended key usage does not include clientAuth",
                        ));
                    }
                }
                names = names_of(&cert);
                dns_as_written = dns_of(&cert);
            }
        }
        Ok(CertIdentity {
            names,
            dns_as_written,
        })
    }

    /// The names of a certificate without any check (to describe a refused peer in logs).
    pub fn names_unverified(der: &[u8]) -> Vec<ClientId> {
        X509Certificate::from_der(der)
            .map(|(_, cert)| names_of(&cert))
            .unwrap_or_default()
    }

    /// Its names, SANs first.
    pub fn names(&self) -> &[ClientId] {
        &self.names
    }

    /// Its DNS SANs (lower case).
    pub fn dns_names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().filter_map(|n| match n {
            ClientId::Dns(d) => Some(d.as_str()),
            _ => None,
        })
    }

    /// Its DNS SANs exactly as the certificate writes them (for node ids, which are
    /// case-sensitive: `NODE1` is not `node1`).
    pub fn dns_names_as_written(&self) -> impl Iterator<Item = &str> {
        self.dns_as_written.iter().map(String::as_str)
    }
}

fn dns_of(cert: &X509Certificate<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(s) = name {
                out.push((*s).to_owned());
            }
        }
    }
    out
}

fn names_of(cert: &X509Certificate<'_>) -> Vec<ClientId> {
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(s) => out.push(ClientId::Dns(s.to_ascii_lowercase())),
                GeneralName::URI(s) => out.push(ClientId::Uri((*s).to_owned())),
                _ => {}
            }
        }
    }
    if out.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                out.push(ClientId::Cn(s.to_owned()));
            }
        }
    }
    out
}

/// Who may call one service over TCP: typed entries.
#[derive(Debug, Clone, Default)]
pub struct ClientAllowlist {
    allowed: Arc<BTreeSet<ClientId>>,
}

impl ClientAllowlist {
    /// Allows exactly these identities.
    pub fn new(entries: impl IntoIterator<Item = ClientId>) -> ClientAllowlist {
        ClientAllowlist {
            allowed: Arc::new(entries.into_iter().collect()),
        }
    }

    /// Parses typed entries (`dns:`, `uri:`, `cn:`).
    pub fn parse(entries: &[String]) -> Result<ClientAllowlist, ClientIdError> {
        entries
            .iter()
            .map(|e| ClientId::parse(e))
            .collect::<Result<Vec<_>, _>>()
            .map(ClientAllowlist::new)
    }

    /// The same entries plus another list's.
    pub fn union(&self, other: &ClientAllowlist) -> ClientAllowlist {
        ClientAllowlist::new(self.allowed.iter().chain(other.allowed.iter()).cloned())
    }

    /// The certificate name an entry matches, if any.
    pub fn matching(&self, identity: &CertIdentity) -> Option<ClientId> {
        identity
            .names()
            .iter()
            .find(|n| self.allowed.iter().any(|e| e.matches(n)))
            .cloned()
    }

    /// Whether an entry matches one of `names` (a certificate's names, unverified).
    pub fn matches_any(&self, names: &[ClientId]) -> bool {
        names
            .iter()
            .any(|n| self.allowed.iter().any(|e| e.matches(n)))
    }

    /// The matched name, or PERMISSION_DENIED naming the certificate's first name.
    pub fn check(&self, identity: &CertIdentity) -> Result<ClientId, Status> {
        self.matching(identity)
            .ok_or_else(|| self.refusal(identity))
    }

    /// The PERMISSION_DENIED status for an identity this list does not match.
    pub fn refusal(&self, identity: &CertIdentity) -> Status {
        Status::permission_denied(format!(
            "client identity {} is not allowed here",
            identity
                .names()
                .first()
                .map(ToString::to_string)
                .unwrap_or_else(|| "(none)".into())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};

    fn cert(sans: &[SanType], cn: &str, edit: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        let mut p = CertificateParams::default();
        p.subject_alt_names = sans.to_vec();
        p.distinguished_name.push(DnType::CommonName, cn);
        edit(&mut p);
        p.self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .to_vec()
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn dns(n: &str) -> SanType {
        SanType::DnsName(n.try_into().unwrap())
    }

    #[test]
    fn entries_are_typed() {
        assert_eq!(
            ClientId::parse("dns:CP.example").unwrap(),
            ClientId::Dns("cp.example".into())
        );
        assert_eq!(
            ClientId::parse("uri:spiffe://fab2/ns/cp").unwrap(),
            ClientId::Uri("spiffe://fab2/ns/cp".into())
        );
        assert_eq!(
            ClientId::parse("cn:control-plane").unwrap(),
            ClientId::Cn("control-plane".into())
        );
        let e = ClientId::parse("control-plane.example").unwrap_err();
        assert_eq!(e, ClientIdError::Untyped("control-plane.example".into()));
        assert!(
            e.to_string().contains("\"dns:control-plane.example\""),
            "{e}"
        );
        for bad in [
            "spiffe://x/y",
            "dns:",
            "cn: x",
            "uri:nothing",
            "dns:a.*.b",
            "ip:1.2.3.4",
        ] {
            assert!(ClientId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wildcard_matches_one_label() {
        let p = ClientId::parse("dns:*.nodes.fab2.example").unwrap();
        let d = |s: &str| ClientId::Dns(s.into());
        assert!(p.matches(&d("n1.nodes.fab2.example")));
        assert!(!p.matches(&d("a.n1.nodes.fab2.example")));
        assert!(!p.matches(&d("nodes.fab2.example")));
        assert!(!p.matches(&d("xnodes.fab2.example")));
        assert!(!p.matches(&ClientId::Cn("n1.nodes.fab2.example".into())));
    }

    proptest::proptest! {
        #[test]
        fn a_wildcard_covers_exactly_one_label(
            a in "[a-z0-9-]{1,12}",
            b in "[a-z0-9-]{1,12}",
            suffix in "[a-z0-9-]{1,10}(\\.[a-z0-9-]{1,10}){0,2}",
        ) {
            let p = ClientId::parse(&format!("dns:*.{suffix}")).unwrap();
            let one = ClientId::Dns(format!("{a}.{suffix}"));
            let two = ClientId::Dns(format!("{a}.{b}.{suffix}"));
            let bare = ClientId::Dns(suffix.clone());
            let glued = ClientId::Dns(format!("{a}{suffix}"));
            let cn = ClientId::Cn(format!("{a}.{suffix}"));
            proptest::prop_assert!(p.matches(&one));
            proptest::prop_assert!(!p.matches(&two));
            proptest::prop_assert!(!p.matches(&bare));
            proptest::prop_assert!(!p.matches(&glued));
            proptest::prop_assert!(!p.matches(&cn));
            let exact = ClientId::parse(&format!("dns:{a}.{suffix}")).unwrap();
            proptest::prop_assert!(exact.matches(&one));
            proptest::prop_assert!(!exact.matches(&two));
        }
    }

    #[test]
    fn cn_counts_only_without_sans() {
        let list = ClientAllowlist::parse(&["cn:control-plane".into()]).unwrap();
        let with_san = cert(&[dns("other.example")], "control-plane", |_| {});
        let id = CertIdentity::verify(&[with_san], now()).unwrap();
        assert_eq!(id.names(), &[ClientId::Dns("other.example".into())]);
        let e = list.check(&id).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("dns:other.example"), "{}", e.message());
        let uri_only = cert(
            &[SanType::URI("spiffe://f/x".try_into().unwrap())],
            "control-plane",
            |_| {},
        );
        assert!(list
            .check(&CertIdentity::verify(&[uri_only], now()).unwrap())
            .is_err());
        let bare = cert(&[], "control-plane", |_| {});
        assert_eq!(
            list.check(&CertIdentity::verify(&[bare], now()).unwrap())
                .unwrap(),
            ClientId::Cn("control-plane".into())
        );
    }

    #[test]
    fn names_do_not_cross_types() {
        let list = ClientAllowlist::parse(&["uri:spiffe://f/cp".into()]).unwrap();
        let c = cert(&[dns("spiffe://f/cp")], "x", |_| {});
        assert!(list
            .check(&CertIdentity::verify(&[c], now()).unwrap())
            .is_err());
    }

    #[test]
    fn validity_and_key_usage_are_checked() {
        let expired = cert(&[dns("a.example")], "a", |p| {
            p.not_before = rcgen::date_time_ymd(2001, 1, 1);
            p.not_after = rcgen::date_time_ymd(2002, 1, 1);
        });
        let e = CertIdentity::verify(&[expired], now()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("expired"), "{}", e.message());
        let future = cert(&[dns("a.example")], "a", |p| {
            p.not_before = rcgen::date_time_ymd(2990, 1, 1);
            p.not_after = rcgen::date_time_ymd(2991, 1, 1);
        });
        let e = CertIdentity::verify(&[future], now()).unwrap_err();
        assert!(e.message().contains("not valid yet"), "{}", e.message());
        let server_only = cert(&[dns("a.example")], "a", |p| {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        });
        let e = CertIdentity::verify(&[server_only], now()).unwrap_err();
        assert!(e.message().contains("clientAuth"), "{}", e.message());
        let client = cert(&[dns("a.example")], "a", |p| {
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
        });
        assert!(CertIdentity::verify(&[client], now()).is_ok());
        let none: [&[u8]; 0] = [];
        assert_eq!(
            CertIdentity::verify(&none, now()).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }
}
