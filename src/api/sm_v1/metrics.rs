//! The SM host's metrics among several SM hosts (docs/OPENSM.md, "Several SM hosts"): its
//! OpenSM's role, whether it caught up with its peers, held-back and disagreeing nodes, and per
//! peer the highest generation and whether its last pull answered. Encoded with their own
//! registry at every scrape and appended to the agent's metrics (one `# EOF`).

use crate::sm::opensm::opensm_state::OpenSmState;
use crate::sm::opensm::sync::SyncStatus;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The agent's OpenMetrics text with the SM host's metrics of `status` appended.
pub fn append(agent_text: String, status: &SyncStatus) -> String {
    let mut registry = Registry::with_prefix("fabric_agent");
    let role: Family<Labels, Gauge> = Family::default();
    registry.register(
        "sm_host_role",
        "1 for this SM host's OpenSM role (from SMInfo, or OpenSM's log as a fallback)",
        role.clone(),
    );
    role.get_or_create(&vec![(
        "role",
        status
            .role
            .unwrap_or(OpenSmState::Unknown)
            .as_str()
            .to_owned(),
    )])
    .set(1);
    let from_sminfo: Gauge = Gauge::default();
    registry.register(
        "sm_host_role_from_sminfo",
        "1 when the role was read from the SM's own SMInfo, 0 when from OpenSM's log (fallback)",
        from_sminfo.clone(),
    );
    from_sminfo.set(i64::from(matches!(
        status.role_source,
        Some(crate::sm::opensm::sminfo::RoleSource::SmInfo { .. })
    )));
    let caught_up: Gauge = Gauge::default();
    registry.register(
        "sm_host_caught_up",
        "1 when every peer SM host answered a pull since this agent started",
        caught_up.clone(),
    );
    caught_up.set(i64::from(status.caught_up));
    let held: Gauge = Gauge::default();
    registry.register(
        "sm_host_held_back_nodes",
        "nodes whose stored set is held back (confirmed by no one since start)",
        held.clone(),
    );
    held.set(i64::try_from(status.gated_nodes.len()).unwrap_or(i64::MAX));
    let disagree: Gauge = Gauge::default();
    registry.register(
        "sm_host_disagreeing_nodes",
        "nodes on which a peer held another generation two pulls in a row",
        disagree.clone(),
    );
    disagree.set(i64::try_from(status.disagreements.len()).unwrap_or(i64::MAX));
    let generation: Family<Labels, Gauge> = Family::default();
    registry.register(
        "sm_peer_generation",
        "highest generation a peer SM host held for any node at its last answer",
        generation.clone(),
    );
    let answering: Family<Labels, Gauge> = Family::default();
    registry.register(
        "sm_peer_answering",
        "1 when the last pull of the peer SM host was answered",
        answering.clone(),
    );
    for p in &status.peers {
        let labels = vec![("peer", p.name.clone())];
        let highest = p.generations.values().copied().max().unwrap_or(0);
        generation
            .get_or_create(&labels)
            .set(i64::try_from(highest).unwrap_or(i64::MAX));
        answering
            .get_or_create(&labels)
            .set(i64::from(p.last_answer.is_some() && p.last_error.is_none()));
    }
    let fenced: Family<Labels, Gauge> = Family::default();
    registry.register(
        "sm_peer_fenced",
        "1 for each peer SM host this host holds fenced (its agent silent and its SM proven not running)",
        fenced.clone(),
    );
    for f in &status.fenced {
        fenced.get_or_create(&vec![("peer", f.host.clone())]).set(1);
    }
    let mut text = agent_text
        .strip_suffix("# EOF\n")
        .map(str::to_owned)
        .unwrap_or(agent_text);
    if encode(&mut text, &registry).is_err() {
        text.push_str("# EOF\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::opensm::sync::PeerStatus;

    #[test]
    fn appended_once_before_the_end() {
        let status = SyncStatus {
            role: Some(OpenSmState::Standby),
            caught_up: true,
            peers: vec![PeerStatus {
                name: "https://smhost1:7443".into(),
                last_answer: Some(std::time::SystemTime::now()),
                generations: [("node1".to_owned(), 9)].into_iter().collect(),
                ..PeerStatus::default()
            }],
            fenced: vec![crate::sm::opensm::fence::FencedHost {
                host: "smhost3".into(),
                since_unix_ms: 1,
                evidence: "SMInfo: no answer".into(),
            }],
            ..SyncStatus::default()
        };
        let text = append("# HELP x y\n# TYPE x gauge\nx 1\n# EOF\n".into(), &status);
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert!(
            text.contains("fabric_agent_sm_host_role{role=\"standby\"} 1"),
            "{text}"
        );
        assert!(text.contains("fabric_agent_sm_host_caught_up 1"));
        assert!(text.contains("fabric_agent_sm_peer_generation{peer=\"https://smhost1:7443\"} 9"));
        assert!(text.contains("fabric_agent_sm_peer_answering{peer=\"https://smhost1:7443\"} 1"));
        assert!(
            text.contains("fabric_agent_sm_peer_fenced{peer=\"smhost3\"} 1"),
            "{text}"
        );
    }
}
