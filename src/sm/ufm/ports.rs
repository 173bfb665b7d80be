//! UFM's own port inventory (`GET …/resources/ports`) and one partition's members, read for the
//! UFM broker: which port GUIDs UFM shows in which host, and which GUIDs a key holds.
//!
//! Modelled on the public UFM Enterprise REST API guide (Ports REST API): the answer is a JSON
//! list of port objects; the broker uses `guid`, `system_name` (the host's name),
//! `node_description` (rdma-core's `<hostname> <device>` by default) and `description`
//! (`"Computer IB Port"` for a host's port, `"Switch IB Port"` for a switch's). Other fields are
//! ignored. Not exercised against a real UFM.

use super::auth::{self, Loaded};
use super::http::{Answer, Exchange, ReqwestLink};
use super::wire::{self, pkey_text, PartitionState, WireError};
use super::{refused, UfmError, UfmSm};
use crate::domain::{Guid, Membership, PKey};
use crate::sm::{SmError, SmFailure};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// One port as UFM's inventory shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UfmPort {
    /// The port GUID.
    pub guid: Guid,
    /// The host (system) UFM shows the port in; empty when UFM gives none.
    pub system_name: String,
    /// The port's node description; empty when UFM gives none.
    pub node_description: String,
    /// UFM's description of the port kind (`Computer IB Port`, `Switch IB Port`, ...).
    pub description: String,
}

impl UfmPort {
    /// Whether UFM shows this port in node `node_id`: a host's port (not a switch's) whose
    /// `system_name` is exactly the node id, or whose node description is the node id followed
    /// by a space (rdma-core's `<hostname> <device>`). Exact comparison, never case-folded.
    pub fn belongs_to(&self, node_id: &str) -> bool {
        if self.description.starts_with("Switch") {
            return false;
        }
        self.system_name == node_id
            || self
                .node_description
                .strip_prefix(node_id)
                .is_some_and(|rest| rest.starts_with(' '))
    }
}

/// Parses `GET …/resources/ports`: a list of port objects. A port without a `guid` string, or
/// with a GUID that is not hex, makes the whole answer not understood (fail closed).
pub fn parse_ports(body: &[u8]) -> Result<Vec<UfmPort>, WireError> {
    let value: Value = serde_json::from_slice(body).map_err(WireError::PortsJson)?;
    let Value::Array(list) = value else {
        return Err(WireError::PortsNotList);
    };
    let text = |p: &Value, field: &str| {
        p.get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    list.iter()
        .map(|p| {
            let raw = p
                .get("guid")
                .and_then(Value::as_str)
                .ok_or(WireError::PortWithoutGuid)?;
            let guid: Guid = raw
                .parse()
                .map_err(|_| WireError::MemberGuid(raw.to_owned()))?;
            Ok(UfmPort {
                guid,
                system_name: text(p, "system_name"),
                node_description: text(p, "node_description"),
                description: text(p, "description"),
            })
        })
        .collect()
}

impl UfmSm {
    /// Runs one read with this backend's client, credentials, retry policy and budget.
    async fn read_once(&self, path: &str) -> Result<(Answer, Loaded), SmError> {
        let loaded = auth::load(&self.auth).await?;
        let client = {
            let mut state = self.state.lock().await;
            if let Some((fingerprint, status)) = state.rejected {
                if fingerprint == loaded.fingerprint {
                    return Err(refused(Self::rejected(&loaded, status)));
                }
            }
            self.refresh_identity(&mut state, &loaded)?;
            state.client.clone()
        };
        let reqwest = ReqwestLink {
            client: &client,
            credential: &loaded,
        };
        let ex = Exchange {
            link: self.link.as_deref().unwrap_or(&reqwest),
            base: &self.base,
            credential: &loaded,
            policy: self.policy,
            sent: AtomicUsize::new(0),
            budget: &self.budget,
        };
        let answer = ex
            .call(Method::GET, path, None)
            .await
            .map_err(|e| SmError::Unreachable(SmFailure::Ufm(UfmError::NoAnswer(e))))?;
        if matches!(
            answer.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            self.state.lock().await.rejected = Some((loaded.fingerprint, answer.status));
            return Err(refused(Self::rejected(&loaded, answer.status)));
        }
        Ok((answer, loaded))
    }

    /// UFM's port inventory (`GET …/resources/ports`). Any failure is an error: the broker
    /// accepts no new port claim without it.
    pub async fn ports(&self) -> Result<Vec<UfmPort>, SmError> {
        let path = "/resources/ports";
        let (answer, loaded) = self.read_once(path).await?;
        if !answer.status.is_success() {
            return Err(refused(refusal(&loaded, &answer, "listing ports")));
        }
        parse_ports(&answer.body).map_err(|why| {
            refused(UfmError::NotUnderstood {
                path: path.to_owned(),
                source: Arc::new(why),
            })
        })
    }

    /// The members UFM lists in `key`, with their membership (empty: no such partition).
    pub async fn partition_members(&self, key: PKey) -> Result<Vec<(Guid, Membership)>, SmError> {
        Ok(self
            .partition(key)
            .await?
            .map(|p| {
                p.members
                    .into_iter()
                    .map(|(g, m)| (g, m.membership))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn partition(&self, key: PKey) -> Result<Option<PartitionState>, SmError> {
        let path = format!("/resources/pkeys/{}?guids_data=true", pkey_text(key));
        let (answer, loaded) = self.read_once(&path).await?;
        match answer.status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => wire::parse_partition(&answer.body).map_err(|why| {
                refused(UfmError::NotUnderstood {
                    path,
                    source: Arc::new(why),
                })
            }),
            _ => Err(refused(refusal(
                &loaded,
                &answer,
                &format!("reading {key}"),
            ))),
        }
    }
}

/// A 4xx answer as UFM's refusal, its words redacted and cut short.
fn refusal(loaded: &Loaded, answer: &Answer, what: &str) -> UfmError {
    let text = String::from_utf8_lossy(&answer.body);
    let mut text: String = loaded.redact(text.trim()).chars().take(200).collect();
    if text.is_empty() {
        text = "no details".into();
    }
    UfmError::Refused {
        what: what.to_owned(),
        status: answer.status,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_port_inventory() {
        let body = br#"[
          {"guid":"0002c903000e0b72","name":"0002c903000e0b72_1","system_name":"node1",
           "node_description":"node1 mlx5_0","description":"Computer IB Port","number":1},
          {"guid":"0x0002c903000e0b73","system_name":"","node_description":"node2 mlx5_0",
           "description":"Computer IB Port"},
          {"guid":"248a070300aa0001","system_name":"sw-1","node_description":"node1 switch",
           "description":"Switch IB Port"}]"#;
        let ports = parse_ports(body).unwrap();
        assert_eq!(ports.len(), 3);
        assert!(ports[0].belongs_to("node1"));
        assert!(!ports[0].belongs_to("NODE1"));
        assert!(!ports[0].belongs_to("node"));
        assert!(ports[1].belongs_to("node2"));
        assert!(!ports[1].belongs_to("node"));
        // A switch's port is never a node's, whatever its description says.
        assert!(!ports[2].belongs_to("node1"));
    }

    #[test]
    fn refuses_an_inventory_it_does_not_understand() {
        assert!(matches!(parse_ports(b"{}"), Err(WireError::PortsNotList)));
        assert!(matches!(
            parse_ports(br#"[{"system_name":"node1"}]"#),
            Err(WireError::PortWithoutGuid)
        ));
        assert!(matches!(
            parse_ports(br#"[{"guid":"zz"}]"#),
            Err(WireError::MemberGuid(_))
        ));
        assert!(matches!(
            parse_ports(b"not json"),
            Err(WireError::PortsJson(_))
        ));
    }
}
