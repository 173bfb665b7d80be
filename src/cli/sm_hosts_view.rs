//! Which SM hosts stand behind a claim, in JSON and in words: an ACTIVE or RELEASED claim's
//! evidence (the acknowledged generation, the SM hosts that acknowledged it, the port read),
//! and `node`'s SM-host set as the last apply saw it (known, fenced, acknowledged, and every
//! host that did not acknowledge with why).

use super::timestamp::time;
use crate::proto::agent as pb;
use serde_json::{json, Value};

fn port_state(v: i32) -> &'static str {
    pb::PortState::try_from(v)
        .map(|s| s.as_str_name().trim_start_matches("PORT_STATE_"))
        .unwrap_or("?")
}

/// What an ACTIVE or RELEASED transition rests on: the acknowledged apply, the SM hosts that
/// acknowledged it, and the port reads.
pub fn evidence_json(e: &pb::Evidence) -> Value {
    json!({
        "sm_generation": e.sm_generation,
        "sm_acknowledged": time(&e.sm_acknowledged),
        "acknowledged_by": e.acknowledged_by,
        "read_started": time(&e.read_started),
        "ports": e.ports.iter().map(|p| json!({
            "device": p.device, "port": p.port_number, "port_guid": p.port_guid,
            "state": port_state(p.state),
        })).collect::<Vec<_>>(),
    })
}

/// The evidence in one line: `generation 7 acknowledged by sm1, sm2 at ...; ports read at ...:
/// mlx5_0/1 ACTIVE`.
pub fn evidence_line(e: &pb::Evidence) -> String {
    let by = if e.acknowledged_by.is_empty() {
        String::new()
    } else {
        format!(" by {}", e.acknowledged_by.join(", "))
    };
    let ports: Vec<String> = e
        .ports
        .iter()
        .map(|p| format!("{}/{} {}", p.device, p.port_number, port_state(p.state)))
        .collect();
    format!(
        "generation {} acknowledged{by} at {}; ports read at {}: {}",
        e.sm_generation,
        time(&e.sm_acknowledged),
        time(&e.read_started),
        if ports.is_empty() {
            "none".to_owned()
        } else {
            ports.join(", ")
        }
    )
}

/// The SM-host set as the node's last finished apply saw it (the remote backend).
pub fn sm_hosts_json(s: &pb::SmHostSetStatus) -> Value {
    json!({
        "generation": s.generation, "answered": time(&s.answered),
        "known_hosts": s.known_hosts,
        "fenced_hosts": s.fenced_hosts.iter().map(|f| json!({
            "host": f.host, "fenced_by": f.fenced_by, "since": time(&f.since), "evidence": f.evidence,
        })).collect::<Vec<_>>(),
        "acknowledged": s.acknowledged, "excused": s.excused,
        "not_acknowledged": s.not_acknowledged.iter().map(|m| json!({
            "host": m.host, "endpoint": m.endpoint, "reason": m.reason, "detail": m.detail,
        })).collect::<Vec<_>>(),
        "problems": s.problems, "not_fenced": s.not_fenced,
    })
}

/// `node`'s lines for the SM-host set, as (label, text) pairs: the hosts and who acknowledged
/// the last apply, then each fenced host and each host that did not acknowledge, with why.
pub fn sm_hosts_lines(s: &pb::SmHostSetStatus) -> Vec<(String, String)> {
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    let mut summary = format!(
        "{} known; generation {} acknowledged by {}",
        list(&s.known_hosts),
        s.generation,
        list(&s.acknowledged)
    );
    if !s.excused.is_empty() {
        summary.push_str(&format!(" (fenced, excused: {})", s.excused.join(", ")));
    }
    let mut lines = vec![("sm hosts: ".to_owned(), summary)];
    for f in &s.fenced_hosts {
        lines.push((
            format!("  fenced {}: ", f.host),
            format!(
                "by {} since {} ({})",
                f.fenced_by.join(", "),
                time(&f.since),
                f.evidence
            ),
        ));
    }
    for m in &s.not_acknowledged {
        let at = if m.endpoint.is_empty() {
            String::new()
        } else {
            format!(" ({})", m.endpoint)
        };
        lines.push((
            format!("  not acknowledged by {}{at}: ", m.host),
            format!("{}: {}", m.reason, m.detail),
        ));
    }
    for n in &s.not_fenced {
        lines.push(("  not fenced: ".to_owned(), n.clone()));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> pb::SmHostSetStatus {
        pb::SmHostSetStatus {
            generation: 12,
            known_hosts: vec!["sm1".into(), "sm2".into(), "sm3".into()],
            fenced_hosts: vec![pb::FencedSmHostStatus {
                host: "sm3".into(),
                fenced_by: vec!["sm1".into()],
                since: None,
                evidence: "SMInfo: no answer".into(),
            }],
            acknowledged: vec!["sm1".into()],
            not_acknowledged: vec![pb::SmHostNotAcknowledged {
                host: "sm2".into(),
                endpoint: "https://sm2:7443".into(),
                reason: "REFUSED".into(),
                detail: "OpenSM has not confirmed".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_sm_host_set_shows_who_acknowledged_and_why_not() {
        let v = sm_hosts_json(&set());
        assert_eq!(v["known_hosts"], json!(["sm1", "sm2", "sm3"]));
        assert_eq!(v["fenced_hosts"][0]["host"], "sm3");
        assert_eq!(v["acknowledged"], json!(["sm1"]));
        assert_eq!(v["not_acknowledged"][0]["reason"], "REFUSED");
        let lines = sm_hosts_lines(&set());
        assert_eq!(lines[0].0, "sm hosts: ");
        assert!(lines[0].1.contains("sm1, sm2, sm3 known"), "{lines:?}");
        assert!(lines[0].1.contains("acknowledged by sm1"), "{lines:?}");
        assert!(lines[1].0.contains("fenced sm3"), "{lines:?}");
        assert!(lines[2]
            .0
            .contains("not acknowledged by sm2 (https://sm2:7443)"));
        assert!(lines[2].1.starts_with("REFUSED: "), "{lines:?}");
    }

    #[test]
    fn the_evidence_names_the_acknowledging_hosts() {
        let e = pb::Evidence {
            sm_generation: 4,
            acknowledged_by: vec!["sm1".into(), "sm2".into()],
            ports: vec![pb::PortReading {
                device: "mlx5_0".into(),
                port_number: 1,
                port_guid: "0x1".into(),
                state: pb::PortState::Active as i32,
            }],
            ..Default::default()
        };
        assert_eq!(evidence_json(&e)["acknowledged_by"], json!(["sm1", "sm2"]));
        let line = evidence_line(&e);
        assert!(
            line.starts_with("generation 4 acknowledged by sm1, sm2 at "),
            "{line}"
        );
        assert!(line.ends_with("mlx5_0/1 ACTIVE"), "{line}");
        let none = pb::Evidence::default();
        assert!(evidence_line(&none).starts_with("generation 0 acknowledged at "));
    }
}
