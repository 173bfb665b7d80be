//! Connects client subcommands to the daemon: unix socket by default, TCP (optionally mTLS)
//! with `--endpoint`.

use super::ClientOpts;
use crate::api::client::{self, ClientTls};
use crate::proto::agent as pb;
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use std::ops::{Deref, DerefMut};
use tonic::transport::Channel;

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
pub async fn connect(opts: &ClientOpts) -> Result<Client, String> {
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
    Ok(Client(FabricAgentClient::new(channel)))
}
