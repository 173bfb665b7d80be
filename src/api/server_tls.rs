//! The TCP listener's TLS, reloadable: handshakes run on tokio-rustls with a rustls
//! `ServerConfig` that a [`TlsReloader`] swaps when the certificate, key or client CA bundle is
//! re-read: on SIGHUP, and when one of the files is rewritten or replaced in its directory
//! ([`TlsReloader::watch_files`]). Connections already open keep the material they started with; a bad new
//! file is reported and the old material stays in use.
//!
//! The client verifier checks the chain against the CA bundle. A chain that is only outside
//! its validity period is let through the handshake so that every call on it is refused with
//! UNAUTHENTICATED and the reason (see [`super::gate::Policy`]) instead of a bare TLS alert.

use super::gate::conn_limits::{BoundedConn, ConnLimits, Refused};
use super::settings::TlsConfig;
use crate::sys::dirwatch::{Change, DirWatch};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};
use rustls::{ServerConfig, SignatureScheme};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use x509_parser::prelude::{FromDer, X509Certificate};

/// How long a burst of file changes (certificate, key and CA replaced one after another) may
/// take before the material is reloaded once.
pub const SETTLE: Duration = Duration::from_millis(300);

/// Whether a change in a watched directory concerns one of the TLS files: the file itself, or a
/// `..`-prefixed entry (the symlinked data directory of a Kubernetes secret volume).
fn touches(change: &Change, names: &[std::ffi::OsString]) -> bool {
    let name = match change {
        Change::Removed(_) | Change::DirGone => return false,
        Change::Created(n) | Change::Written(n) => n,
    };
    names.contains(name) || name.as_encoded_bytes().starts_with(b"..")
}

/// What a load or reload read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsLoaded {
    /// Certificates in this agent's chain.
    pub chain_certs: usize,
    /// CA certificates client certificates may chain to.
    pub client_cas: usize,
}

impl fmt::Display for TlsLoaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "server certificate chain of {} and client CA bundle of {} certificate(s)",
            self.chain_certs, self.client_cas
        )
    }
}

/// The current TLS material and the files it came from. Cloning shares it.
#[derive(Clone)]
pub struct TlsReloader {
    files: Arc<(PathBuf, PathBuf, PathBuf)>,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl fmt::Debug for TlsReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsReloader")
            .field("cert", &self.files.0)
            .field("key", &self.files.1)
            .field("client_ca", &self.files.2)
            .finish()
    }
}

impl TlsReloader {
    /// Loads the configured files.
    pub fn load(config: &TlsConfig) -> Result<(TlsReloader, TlsLoaded), TlsLoadError> {
        let files = (
            config.cert.clone(),
            config.key.clone(),
            config.client_ca.clone(),
        );
        let (server, loaded) = build(&files.0, &files.1, &files.2)?;
        Ok((
            TlsReloader {
                files: Arc::new(files),
                current: Arc::new(RwLock::new(Arc::new(server))),
            },
            loaded,
        ))
    }

    /// Re-reads the files; on any error the material in use is kept and the error returned.
    pub fn reload(&self) -> Result<TlsLoaded, TlsLoadError> {
        let (cert, key, ca) = &*self.files;
        let (server, loaded) = build(cert, key, ca)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(server);
        Ok(loaded)
    }

    /// Reloads the material whenever one of its files is rewritten, replaced by a rename, or
    /// swapped in with a `..data`-style symlink (a Kubernetes secret volume), without polling:
    /// inotify watches each file's directory. Changes arriving together are reloaded once, after
    /// `SETTLE` (300 ms); a reload that fails (say the certificate was replaced before its key)
    /// keeps the material in use and waits for the next change. SIGHUP still reloads at any time. The task
    /// ends when a watched directory disappears (logged).
    pub fn watch_files(&self) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let (cert, key, ca) = &*self.files;
        let mut watched: Vec<(PathBuf, Vec<std::ffi::OsString>)> = Vec::new();
        for file in [cert, key, ca] {
            let dir = match file.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let name = file
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_default();
            match watched.iter_mut().find(|(d, _)| *d == dir) {
                Some((_, names)) => names.push(name),
                None => watched.push((dir, vec![name])),
            }
        }
        let watches = watched
            .into_iter()
            .map(|(dir, names)| Ok((DirWatch::new(&dir)?, dir, names)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let me = self.clone();
        Ok(tokio::spawn(async move {
            let (tx, mut rx) = mpsc::channel::<()>(1);
            for (watch, dir, names) in watches {
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let changes = match watch.changes().await {
                            Ok(c) => c,
                            Err(e) => {
                                tracing::warn!(dir = %dir.display(), error = %e, "watching TLS files failed; SIGHUP still reloads them");
                                return;
                            }
                        };
                        if changes.contains(&Change::DirGone) {
                            tracing::warn!(dir = %dir.display(), "the TLS files' directory is gone; SIGHUP still reloads them");
                            return;
                        }
                        if changes.iter().any(|c| touches(c, &names)) && tx.send(()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            while rx.recv().await.is_some() {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
                match me.reload() {
                    Ok(loaded) => tracing::info!(%loaded, "TLS files changed: material reloaded"),
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS files changed but do not load; the previous material stays in use")
                    }
                }
            }
        }))
    }

    fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Accepts TCP connections within `limits` and completes TLS handshakes with the material
    /// current at accept time; the stream ends when the consumer (the server) is dropped. A
    /// connection beyond the limits is closed as soon as it is accepted; one whose handshake
    /// does not finish within the unauthenticated deadline is dropped; one that completes it
    /// without a client certificate is served (each call is refused UNAUTHENTICATED with the
    /// reason) until that deadline.
    pub fn incoming(
        &self,
        listener: TcpListener,
        limits: ConnLimits,
    ) -> mpsc::Receiver<std::io::Result<BoundedConn<TlsStream<TcpStream>>>> {
        let (tx, rx) = mpsc::channel(64);
        let me = self.clone();
        tokio::spawn(async move {
            let mut refused = RefusalLog::default();
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    _ = tx.closed() => break,
                };
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accepting a TCP connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let admitted = match limits.admit(peer.ip()) {
                    Ok(a) => a,
                    Err(why) => {
                        refused.note(why, peer);
                        drop(tcp);
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = TlsAcceptor::from(me.current());
                let tx = tx.clone();
                let limits = limits.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(limits.unauthenticated_for(), acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(stream)) => {
                            let leaf = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first().map(|c| c.as_ref().to_vec()));
                            let conn = admitted.into_identified_conn(
                                stream,
                                leaf.as_deref(),
                                peer,
                                &limits,
                            );
                            let _ = tx.send(Ok(conn)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake refused"),
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        rx
    }
}

/// Logs connections closed at accept at most once a second, with how many were closed since.
#[derive(Default)]
struct RefusalLog {
    last: Option<tokio::time::Instant>,
    since: u64,
}

impl RefusalLog {
    fn note(&mut self, why: Refused, peer: std::net::SocketAddr) {
        self.since += 1;
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        let reason = match why {
            Refused::TooManyConnections => "[limits] max_connections are open",
            Refused::TooManyFromAddress => {
                "its address holds [limits] max_unauthenticated_per_address connections that \
                 have not authenticated"
            }
        };
        tracing::warn!(%peer, closed = self.since, "closed TCP connections at accept: {reason}");
        self.last = Some(now);
        self.since = 0;
    }
}

/// Why the TLS material could not be loaded; each names its file and keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum TlsLoadError {
    /// A file could not be read, or its contents were refused.
    #[error("{}: {source}", .path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{}: no PEM certificate in the file", .0.display())]
    NoCertificate(PathBuf),
    /// The CA file holds no PEM certificate.
    #[error("{}: no PEM CA certificate in the file", .0.display())]
    NoCa(PathBuf),
    /// The key does not belong to the certificate (or is unusable).
    #[error("{} with {}: {source}", .cert.display(), .key.display())]
    KeyPair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

fn read_err<E: std::error::Error + Send + Sync + 'static>(
    path: &Path,
) -> impl Fn(E) -> TlsLoadError + '_ {
    move |e| TlsLoadError::File {
        path: path.to_owned(),
        source: Box::new(e),
    }
}

fn build(cert: &Path, key: &Path, ca: &Path) -> Result<(ServerConfig, TlsLoaded), TlsLoadError> {
    crate::tls::install_crypto_provider();
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(read_err(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err(cert))?;
    if chain.is_empty() {
        return Err(TlsLoadError::NoCertificate(cert.to_owned()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(read_err(key))?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(read_err(ca))? {
        roots.add(c.map_err(read_err(ca))?).map_err(read_err(ca))?;
    }
    if roots.is_empty() {
        return Err(TlsLoadError::NoCa(ca.to_owned()));
    }
    let loaded = TlsLoaded {
        chain_certs: chain.len(),
        client_cas: roots.len(),
    };
    let inner = WebPkiClientVerifier::builder(Arc::new(roots))
        // A certificate-less handshake gets a clear UNAUTHENTICATED status, not a TLS alert.
        .allow_unauthenticated()
        .build()
        .map_err(read_err(ca))?;
    let mut server = ServerConfig::builder()
        .with_client_cert_verifier(Arc::new(PeriodChecked { inner }))
        .with_single_cert(chain, key_der)
        .map_err(|source| TlsLoadError::KeyPair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        })?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    Ok((server, loaded))
}

/// WebPKI client verification, except that a chain refused only for its validity period is
/// re-verified at the leaf's notBefore: if it chains to a trusted CA then, the handshake
/// completes and the call gate refuses every call with UNAUTHENTICATED naming the dates.
#[derive(Debug)]
struct PeriodChecked {
    inner: Arc<dyn ClientCertVerifier>,
}

fn is_period_error(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. }
        )
    )
}

impl ClientCertVerifier for PeriodChecked {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(e) if is_period_error(&e) => {
                let (_, leaf) = X509Certificate::from_der(end_entity.as_ref()).map_err(|_| {
                    rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
                })?;
                let from = leaf.validity().not_before.timestamp().max(0) as u64;
                self.inner.verify_client_cert(
                    end_entity,
                    intermediates,
                    UnixTime::since_unix_epoch(Duration::from_secs(from + 1)),
                )
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
