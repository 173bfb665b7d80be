//! The remote subnet-manager backend's gRPC client: sends a node's desired set to the SM host's
//! agent (`fabric.sm.v1.Partitions`) over mTLS, or plaintext to a loopback address. Settings
//! and their rules are `sm::remote`'s; conversion and error mapping are [`super::sm_v1`]'s.

use super::grant_v1::signed_grant_to_proto;
use super::sm_v1::{memberships_to_proto, sm_error_of};
use crate::domain::{NodeMemberships, SignedGrant};
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::remote::{RemoteConfig, RemoteConfigError};
use crate::sm::{ApplyOutcome, SmError, SubnetManager};
use async_trait::async_trait;
use std::path::PathBuf;
use thiserror::Error;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Why the remote backend could not be built.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// A setting is missing or inconsistent.
    #[error("invalid subnet_manager.remote: {0}")]
    Config(#[from] RemoteConfigError),
    /// A certificate or key file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// tonic refused the endpoint or TLS settings.
    #[error("endpoint: {0}")]
    Endpoint(#[from] tonic::transport::Error),
}

fn read(path: &PathBuf) -> Result<Vec<u8>, RemoteError> {
    std::fs::read(path).map_err(|source| RemoteError::Read {
        path: path.clone(),
        source,
    })
}

/// The remote subnet manager.
pub struct RemoteSm {
    client: PartitionsClient<Channel>,
}

impl RemoteSm {
    /// Builds the client. The connection is made lazily on the first apply, so the SM host
    /// need not be up when the agent starts.
    pub fn new(config: &RemoteConfig) -> Result<RemoteSm, RemoteError> {
        config.validate()?;
        let mut endpoint = Endpoint::from_shared(config.endpoint.clone())?
            .connect_timeout(config.connect_timeout())
            .timeout(config.request_timeout());
        if config.endpoint.starts_with("https://") {
            let (Some(ca), Some(cert), Some(key)) = (&config.ca, &config.cert, &config.key) else {
                return Err(RemoteConfigError::HttpsWithoutCertificates.into());
            };
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(ca)?))
                .identity(Identity::from_pem(read(cert)?, read(key)?));
            if let Some(d) = &config.domain_name {
                tls = tls.domain_name(d.clone());
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(RemoteSm {
            client: PartitionsClient::new(endpoint.connect_lazy()),
        })
    }
}

#[async_trait]
impl SubnetManager for RemoteSm {
    fn backend(&self) -> &'static str {
        "remote"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.apply_granted(desired, &[], generation).await
    }

    /// Sends the set with the grants of every desired attachment: the SM host refuses keys
    /// without one when it requires grants.
    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let mut memberships = memberships_to_proto(desired, generation);
        memberships.grants = grants.iter().map(signed_grant_to_proto).collect();
        let request = pb::SetNodeMembershipsRequest {
            memberships: Some(memberships),
        };
        let mut client = self.client.clone();
        let reply = client
            .set_node_memberships(request)
            .await
            .map_err(|s| sm_error_of(&s, generation))?
            .into_inner();
        Ok(ApplyOutcome {
            detail: format!(
                "SM host merged the memberships ({} sweeps requested there so far)",
                reply.sweeps
            ),
        })
    }
}
