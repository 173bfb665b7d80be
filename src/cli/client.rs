//! Connects client subcommands to the daemon: unix socket by default, TCP (optionally mTLS)
//! with `--endpoint`.

use super::ClientOpts;
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

/// Opens a channel to the daemon.
pub async fn connect(opts: &ClientOpts) -> Result<FabricAgentClient<Channel>, String> {
    let channel = match &opts.endpoint {
        Some(url) => {
            let mut endpoint =
                Endpoint::from_shared(url.clone()).map_err(|e| format!("--endpoint {url}: {e}"))?;
            if url.starts_with("https://") {
                let read = |p: &std::path::PathBuf| {
                    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
                };
                let mut tls = ClientTlsConfig::new();
                if let Some(ca) = &opts.ca {
                    tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
                }
                if let (Some(cert), Some(key)) = (&opts.cert, &opts.key) {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                if let Some(domain) = &opts.tls_domain {
                    tls = tls.domain_name(domain.clone());
                }
                endpoint = endpoint.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
            }
            endpoint
                .connect()
                .await
                .map_err(|e| format!("cannot reach {url}: {e}"))?
        }
        None => {
            let path = opts.socket.clone();
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(TokioIo::new)
                    }
                }))
                .await
                .map_err(|e| format!("cannot reach the agent at {}: {e}", opts.socket.display()))?
        }
    };
    Ok(FabricAgentClient::new(channel))
}
