//! SIGHUP on an SM host: the peers (`peers`, `peer_host_names`, `peer_sm_port_guids` and the
//! client settings they are pulled with: `ca`, `cert`, `key`, `domain_name`,
//! `request_timeout_ms`) are re-read for the catch-up pulls, the SM-host set this host states
//! and fencing, without a restart. Every other `[subnet_manager.opensm_ha]` key needs one.
//!
//! The new section is validated first and its clients built; a refused one changes nothing (the
//! error is logged, the peers in effect stay). The removal rule: a peer leaves the list only when
//! this host holds it fenced (its agent silent and its SM proven not running, automatically or
//! with `fabric-agent fence-sm-host NAME`). Dropping a live peer would make this host stop naming
//! it to the nodes, which would then count releases complete without it while its OpenSM may
//! still become master with a stale file. A host added is named to the nodes at once: a node
//! whose `endpoints` lack it counts no apply complete (`SM_HOST_SET_INCOMPLETE`) until they gain
//! it, so the fabric side is edited first, then the nodes.

use super::PeerSync;
use crate::sm::opensm::fence::PeerIdentity;
use crate::sm::opensm::peer_state::Peer;
use crate::sm::opensm::peers::{PeersConfig, PeersConfigError};
use std::sync::Arc;

/// What a re-read `[subnet_manager.opensm_ha]` changes in place, and what it leaves for a
/// restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeersChange {
    /// Peers added (their names as this host will state them, else their endpoints).
    pub added: Vec<String>,
    /// Peers removed (each fenced here).
    pub removed: Vec<String>,
    /// Whether anything applied in place changed (names, GUIDs or client settings included).
    pub in_place: bool,
    /// Keys that changed but take effect only on restart.
    pub restart: Vec<&'static str>,
}

/// Why a re-read `[subnet_manager.opensm_ha]` is refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeersReloadError {
    /// The section does not validate.
    #[error("{0}")]
    Invalid(#[from] PeersConfigError),
    /// A removed peer is not fenced here.
    #[error("peer SM host {0} ({1}) cannot be removed while this host does not hold it fenced: stop its OpenSM and its agent, run `fabric-agent fence-sm-host {0}` here (and on every other live SM host), then remove it (docs/OPENSM.md, \"Removing an SM host\")")]
    NotFenced(String, String),
}

/// The name a peer is known by in fences and to the nodes.
fn label(p: &PeerIdentity, name_of: &dyn Fn(&str) -> String) -> String {
    p.name.clone().unwrap_or_else(|| name_of(&p.endpoint))
}

/// Validates `file` and says what it changes against `running`. `name_of` gives the name this
/// host knows a running peer by (configured, verified or stated); `fenced` whether this host
/// holds that name fenced.
pub fn judge(
    running: &PeersConfig,
    file: &PeersConfig,
    name_of: &dyn Fn(&str) -> String,
    fenced: &dyn Fn(&str) -> bool,
) -> Result<PeersChange, PeersReloadError> {
    file.validate()?;
    let (old, new) = (running.identities(), file.identities());
    let same = |a: &PeerIdentity, b: &PeerIdentity| {
        a.endpoint == b.endpoint && a.name == b.name && a.sm_port_guid == b.sm_port_guid
    };
    let mut change = PeersChange::default();
    for gone in old.iter().filter(|o| !new.iter().any(|n| same(o, n))) {
        let name = label(gone, name_of);
        // A peer whose endpoint stays under the same name (its GUID, say, corrected) is not
        // removed from the nodes' view.
        let stays = new
            .iter()
            .any(|n| n.endpoint == gone.endpoint && label(n, name_of) == name);
        if !stays {
            if !fenced(&name) {
                return Err(PeersReloadError::NotFenced(name, gone.endpoint.clone()));
            }
            change.removed.push(name);
        }
    }
    for added in new.iter().filter(|n| !old.iter().any(|o| same(o, n))) {
        if !old.iter().any(|o| o.endpoint == added.endpoint) {
            change.added.push(label(added, name_of));
        }
    }
    let client = |c: &PeersConfig| format!("{:?}", c.client());
    change.in_place = !change.added.is_empty()
        || !change.removed.is_empty()
        || old.len() != new.len()
        || old.iter().zip(&new).any(|(a, b)| !same(a, b))
        || client(running) != client(file);
    let restart: [(&'static str, bool); 6] = [
        (
            "subnet_manager.opensm_ha.peer_identities",
            running.peer_identities == file.peer_identities,
        ),
        (
            "subnet_manager.opensm_ha.sync_interval_ms",
            running.sync_interval_ms == file.sync_interval_ms,
        ),
        (
            "subnet_manager.opensm_ha.catch_up_timeout_ms",
            running.catch_up_timeout_ms == file.catch_up_timeout_ms,
        ),
        (
            "subnet_manager.opensm_ha.sminfo_umad_device",
            running.sminfo_umad_device == file.sminfo_umad_device,
        ),
        (
            "subnet_manager.opensm_ha.host_name",
            running.host_name == file.host_name,
        ),
        (
            "subnet_manager.opensm_ha.fence_after_ms",
            running.fence_after_ms == file.fence_after_ms,
        ),
    ];
    change.restart = restart
        .into_iter()
        .filter(|(_, unchanged)| !unchanged)
        .map(|(k, _)| k)
        .collect();
    Ok(change)
}

impl PeerSync {
    /// Re-reads the peers (module docs): `file` is judged against `running` and, when accepted,
    /// `build` makes its clients; only then do the pulls, the stated SM-host set and fencing
    /// take the new peers. Returns what changed; on an error nothing did.
    pub fn reload_peers(
        &self,
        running: &PeersConfig,
        file: &PeersConfig,
        build: impl FnOnce(&PeersConfig) -> Result<Vec<Arc<dyn Peer>>, String>,
    ) -> Result<PeersChange, String> {
        let fences = self.fences();
        let fenced: Vec<String> = fences.fenced().into_iter().map(|f| f.host).collect();
        let change = judge(running, file, &|e| fences.name_of(e), &|n| {
            fenced.iter().any(|f| f.eq_ignore_ascii_case(n))
        })
        .map_err(|e| e.to_string())?;
        if !change.in_place {
            return Ok(change);
        }
        let clients = build(file)?;
        self.replace_peers(clients);
        fences.replace_peers(file.identities());
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ha(peers: &[(&str, &str, &str)]) -> PeersConfig {
        PeersConfig {
            peers: peers.iter().map(|p| p.0.to_owned()).collect(),
            peer_host_names: peers.iter().map(|p| p.1.to_owned()).collect(),
            peer_sm_port_guids: peers.iter().map(|p| p.2.to_owned()).collect(),
            sminfo_umad_device: Some("/dev/infiniband/umad0".into()),
            sync_interval_ms: 500,
            catch_up_timeout_ms: 5000,
            request_timeout_ms: 2000,
            ..PeersConfig::default()
        }
    }

    const B: (&str, &str, &str) = ("http://127.0.0.1:2", "sm2", "0x0000000000000022");
    const C: (&str, &str, &str) = ("http://127.0.0.1:3", "sm3", "0x0000000000000033");

    fn by_endpoint(e: &str) -> String {
        e.to_owned()
    }

    #[test]
    fn adding_is_in_place_and_removing_needs_the_peer_fenced_here() {
        let none = |_: &str| false;
        // The only SM host gains a peer, then a second one.
        let got = judge(&ha(&[]), &ha(&[B]), &by_endpoint, &none).unwrap();
        assert_eq!(got.added, vec!["sm2".to_owned()]);
        assert!(got.in_place && got.removed.is_empty() && got.restart.is_empty());
        let got = judge(&ha(&[B]), &ha(&[B, C]), &by_endpoint, &none).unwrap();
        assert_eq!(got.added, vec!["sm3".to_owned()]);
        // Nothing changed.
        let got = judge(&ha(&[B]), &ha(&[B]), &by_endpoint, &none).unwrap();
        assert!(!got.in_place, "{got:?}");
        // Removing a live (unfenced) peer is refused, naming it and what to do.
        let err = judge(&ha(&[B, C]), &ha(&[B]), &by_endpoint, &none).unwrap_err();
        assert!(matches!(err, PeersReloadError::NotFenced(ref n, _) if n == "sm3"));
        assert!(err.to_string().contains("fence-sm-host sm3"), "{err}");
        // Fenced here: removed.
        let got = judge(&ha(&[B, C]), &ha(&[B]), &by_endpoint, &|n| n == "sm3").unwrap();
        assert_eq!(got.removed, vec!["sm3".to_owned()]);
        // Down to no peer at all, fenced.
        let got = judge(&ha(&[B]), &ha(&[]), &by_endpoint, &|n| n == "sm2").unwrap();
        assert_eq!(got.removed, vec!["sm2".to_owned()]);
        // A corrected GUID under the same name and endpoint: in place, nobody removed.
        let mut fixed = B;
        fixed.2 = "0x0000000000000023";
        let got = judge(&ha(&[B]), &ha(&[fixed]), &by_endpoint, &none).unwrap();
        assert!(got.in_place && got.removed.is_empty() && got.added.is_empty());
    }

    #[test]
    fn a_bad_section_is_refused_and_other_keys_wait_for_a_restart() {
        let none = |_: &str| false;
        let mut bad = ha(&[B, C]);
        bad.peer_host_names.pop();
        assert!(matches!(
            judge(&ha(&[B]), &bad, &by_endpoint, &none),
            Err(PeersReloadError::Invalid(PeersConfigError::PeerIdentity(_)))
        ));
        let mut remote = ha(&[B]);
        remote.peers[0] = "http://smhost2:7443".into();
        assert!(matches!(
            judge(&ha(&[B]), &remote, &by_endpoint, &|_| true),
            Err(PeersReloadError::Invalid(PeersConfigError::Endpoint(_)))
        ));
        let mut slower = ha(&[B]);
        slower.sync_interval_ms = 1000;
        slower.host_name = Some("sm1".into());
        let got = judge(&ha(&[B]), &slower, &by_endpoint, &none).unwrap();
        assert!(!got.in_place);
        assert_eq!(
            got.restart,
            vec![
                "subnet_manager.opensm_ha.sync_interval_ms",
                "subnet_manager.opensm_ha.host_name"
            ]
        );
    }
}
