//! Connects client subcommands to the daemon: unix socket by default, TCP (optionally mTLS)
//! with `--endpoint`.

use super::ClientOpts;
use crate::api::client::{self, ClientTls};
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use tonic::transport::Channel;

/// Opens a client to the daemon.
pub async fn connect(opts: &ClientOpts) -> Result<FabricAgentClient<Channel>, String> {
    let channel = match &opts.endpoint {
        Some(url) => {
            let tls = ClientTls {
                ca: opts.ca.clone(),
                identity: opts.cert.clone().zip(opts.key.clone()),
                domain: opts.tls_domain.clone(),
            };
            client::tcp(url, &tls).await?
        }
        None => client::unix(&opts.socket).await?,
    };
    Ok(FabricAgentClient::new(channel))
}
