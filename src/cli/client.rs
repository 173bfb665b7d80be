//! Connects client subcommands to the daemon: `--endpoint` (TCP, optionally mTLS) when given,
//! else the unix socket from `--socket`, the config file's `[listen] unix_socket`, or the
//! default path, in that order.

use super::ClientOpts;
use crate::api::client::{self, ClientTls};
use crate::config::{Config, ConfigError, DEFAULT_SOCKET};
use crate::proto::agent as pb;
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use tonic::transport::Channel;

/// Where a client command reaches the daemon.
#[derive(Debug, Clone)]
pub enum Target {
    /// The daemon's unix socket.
    Unix(PathBuf),
    /// A TCP endpoint URL, with TLS material for https.
    Tcp(String, ClientTls),
}

impl Target {
    /// Resolves the target: `--endpoint`, else `--socket`, else the config file's socket (an
    /// explicitly named config must load), else the default socket.
    pub fn resolve(
        opts: &ClientOpts,
        config_path: &Path,
        config_given: bool,
    ) -> Result<Target, ConfigError> {
        if let Some(url) = &opts.endpoint {
            return Ok(Target::Tcp(
                url.clone(),
                ClientTls {
                    ca: opts.ca.clone(),
                    identity: opts.cert.clone().zip(opts.key.clone()),
                    domain: opts.tls_domain.clone(),
                },
            ));
        }
        if let Some(socket) = &opts.socket {
            return Ok(Target::Unix(socket.clone()));
        }
        match Config::load(config_path) {
            Ok(c) => Ok(Target::Unix(c.listen.unix_socket)),
            Err(ConfigError::Read { source, .. })
                if !config_given && source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(Target::Unix(PathBuf::from(DEFAULT_SOCKET)))
            }
            Err(e) => Err(e),
        }
    }
}

/// The daemon's client as the subcommands use it: every generated call (through `Deref`),
/// except that [`Client::list_attachments`] pages through to the last page.
pub struct Client(FabricAgentClient<Channel>);

impl Deref for Client {
    type Target = FabricAgentClient<Channel>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Client {
    /// Every attachment matching the request's filters: follows `next_page_token` until the
    /// last page and answers with all of them in one list.
    pub async fn list_attachments(
        &mut self,
        mut request: pb::ListAttachmentsRequest,
    ) -> Result<tonic::Response<pb::ListAttachmentsResponse>, tonic::Status> {
        let mut all = Vec::new();
        loop {
            let page = self.0.list_attachments(request.clone()).await?.into_inner();
            all.extend(page.attachments);
            if page.next_page_token.is_empty() {
                break;
            }
            if page.next_page_token == request.page_token {
                return Err(tonic::Status::internal(
                    "the agent returned the same page token twice; stopping",
                ));
            }
            request.page_token = page.next_page_token;
        }
        Ok(tonic::Response::new(pb::ListAttachmentsResponse {
            attachments: all,
            next_page_token: String::new(),
        }))
    }
}

/// Opens a client to the daemon.
pub async fn connect(target: &Target) -> Result<Client, client::ClientError> {
    let channel = match target {
        Target::Tcp(url, tls) => client::tcp(url, tls).await?,
        Target::Unix(path) => client::unix(path).await?,
    };
    Ok(Client(FabricAgentClient::new(channel)))
}
