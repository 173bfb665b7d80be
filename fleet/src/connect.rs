//! Channels to the registry's endpoints: unix socket, loopback plaintext, or mTLS with the
//! expected server identity. Channels connect lazily and reconnect by themselves; HTTP/2
//! keepalive makes a silently dead peer fail the stream instead of hanging it.

use crate::registry::{Endpoint, TlsFiles};
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Uri};

/// Why a channel could not be built (nothing is dialled yet at this point).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A CA, certificate or key file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The URL or TLS settings were refused.
    #[error("endpoint {url}: {source}")]
    Endpoint {
        /// The URL.
        url: String,
        /// Why.
        source: tonic::transport::Error,
    },
}

fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first, which is equally fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A lazily connecting channel to `endpoint`.
pub fn channel(endpoint: &Endpoint, keepalive: Duration) -> Result<Channel, ConnectError> {
    let configure = |e: tonic::transport::Endpoint| {
        e.http2_keep_alive_interval(keepalive)
            .keep_alive_timeout(keepalive)
            .keep_alive_while_idle(true)
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
    };
    let bad = |url: &str| {
        let url = url.to_owned();
        move |source| ConnectError::Endpoint { url, source }
    };
    match endpoint {
        Endpoint::Unix(path) => {
            let path = path.clone();
            let e = configure(tonic::transport::Endpoint::from_static("http://localhost"));
            Ok(
                e.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(TokioIo::new)
                    }
                })),
            )
        }
        Endpoint::Plain(url) => {
            let e = tonic::transport::Endpoint::from_shared(url.clone()).map_err(bad(url))?;
            Ok(configure(e).connect_lazy())
        }
        Endpoint::Tls { url, domain, tls } => {
            install_crypto_provider();
            let e = tonic::transport::Endpoint::from_shared(url.clone()).map_err(bad(url))?;
            let e = configure(e)
                .tls_config(tls_config(tls, domain.as_deref())?)
                .map_err(bad(url))?;
            Ok(e.connect_lazy())
        }
    }
}

fn tls_config(tls: &TlsFiles, domain: Option<&str>) -> Result<ClientTlsConfig, ConnectError> {
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|source| ConnectError::Read {
            path: p.clone(),
            source,
        })
    };
    let mut config = ClientTlsConfig::new();
    if let Some(ca) = &tls.ca {
        config = config.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(d) = domain {
        config = config.domain_name(d.to_owned());
    }
    Ok(config)
}
