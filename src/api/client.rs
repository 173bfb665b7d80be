//! Client channels to a fabric-agent daemon: over its unix socket, or over TCP (mTLS when the
//! URL is https). Used by the CLI and by anything embedding the client.

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

/// PEM material for an https endpoint.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// CA bundle the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (mTLS).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Server name to verify instead of the URL's host.
    pub domain: Option<String>,
}

/// Why a client channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon's unix socket did not answer.
    #[error("cannot reach the agent at {}: {}", .path.display(), chain(.source))]
    Unix {
        /// The socket.
        path: PathBuf,
        /// What the transport said.
        source: tonic::transport::Error,
    },
    /// The URL is not an endpoint.
    #[error("endpoint {url}: {source}")]
    Endpoint {
        /// The URL.
        url: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// A CA, certificate or key file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS settings were refused.
    #[error("TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The TCP endpoint did not answer.
    #[error("cannot reach {url}: {}", chain(.source))]
    Tcp {
        /// The URL.
        url: String,
        /// What the transport said.
        source: tonic::transport::Error,
    },
}

/// Connects over a unix socket.
pub async fn unix(path: &Path) -> Result<Channel, ClientError> {
    let path = path.to_owned();
    let socket = path.clone();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = socket.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .map_err(|source| ClientError::Unix { path, source })
}

/// Connects over TCP; `tls` applies to https URLs.
pub async fn tcp(url: &str, tls: &ClientTls) -> Result<Channel, ClientError> {
    let mut endpoint =
        Endpoint::from_shared(url.to_owned()).map_err(|source| ClientError::Endpoint {
            url: url.to_owned(),
            source,
        })?;
    if url.starts_with("https://") {
        crate::tls::install_crypto_provider();
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|source| ClientError::Read {
                path: p.clone(),
                source,
            })
        };
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &tls.ca {
            config = config.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(config).map_err(ClientError::Tls)?;
    }
    endpoint.connect().await.map_err(|source| ClientError::Tcp {
        url: url.to_owned(),
        source,
    })
}

/// An error with its causes, `a: b: c`, each cause said once (tonic's transport error repeats
/// its source in its own text) and without tonic's bare "transport error" prefix.
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if text != "transport error" && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[tokio::test]
    async fn a_missing_socket_is_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let e = super::unix(&dir.path().join("absent.sock"))
            .await
            .unwrap_err();
        assert!(matches!(e, super::ClientError::Unix { .. }), "{e:?}");
        let e = e.to_string();
        assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
        assert!(!e.contains("transport error"), "{e}");
    }

    #[test]
    fn causes_are_joined() {
        let e = std::io::Error::other("outer");
        assert_eq!(chain(&e), "outer");
    }
}
