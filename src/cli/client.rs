//! Connects client subcommands to the daemon: `--endpoint` (TCP, optionally mTLS) when given,
//! else the unix socket from `--socket`, the config file's `[listen] unix_socket`, or the
//! default path, in that order.

use super::ClientOpts;
use crate::api::agent_v1::client::AgentClient;
use crate::api::client::{ClientError, ClientTls};
use crate::config::{Config, ConfigError, DEFAULT_SOCKET};
use std::path::{Path, PathBuf};

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

/// Opens a client to the daemon.
pub async fn connect(target: &Target) -> Result<AgentClient, ClientError> {
    match target {
        Target::Tcp(url, tls) => AgentClient::tcp(url, tls).await,
        Target::Unix(path) => AgentClient::unix(path).await,
    }
}
