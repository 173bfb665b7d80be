//! The remote backend's SM-host set (`SubnetManagerStatus.sm_hosts`) as protobuf.

use crate::domain::SmHostSet;
use crate::proto::agent as pb;

fn timestamp(unix_ns: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix_ns.div_euclid(1_000_000_000),
        // rem_euclid keeps it in 0..1e9, which always fits.
        nanos: i32::try_from(unix_ns.rem_euclid(1_000_000_000)).unwrap_or(0),
    }
}

/// The SM-host set as the node's last finished apply saw it.
pub fn sm_hosts_to_pb(s: &SmHostSet) -> pb::SmHostSetStatus {
    pb::SmHostSetStatus {
        generation: s.generation,
        answered: (s.answered_unix_ns > 0).then(|| timestamp(s.answered_unix_ns)),
        known_hosts: s.known.clone(),
        fenced_hosts: s
            .fenced
            .iter()
            .map(|f| pb::FencedSmHostStatus {
                host: f.host.clone(),
                fenced_by: f.fenced_by.clone(),
                since: (f.since_unix_ms > 0).then(|| {
                    timestamp(
                        i64::try_from(f.since_unix_ms)
                            .unwrap_or(i64::MAX / 1_000_000)
                            .saturating_mul(1_000_000),
                    )
                }),
                evidence: f.evidence.clone(),
            })
            .collect(),
        acknowledged: s.acknowledged.clone(),
        excused: s.excused.clone(),
        not_acknowledged: s
            .not_acknowledged
            .iter()
            .map(|m| pb::SmHostNotAcknowledged {
                host: m.host.clone(),
                endpoint: m.endpoint.clone(),
                reason: m.kind.name().to_owned(),
                detail: m.detail.clone(),
            })
            .collect(),
        problems: s.problems.clone(),
        not_fenced: s.not_fenced.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{FencedSmHostView, SmHostMiss, SmHostMissKind};

    #[test]
    fn every_field_reaches_the_wire() {
        let s = SmHostSet {
            generation: 7,
            answered_unix_ns: 1_500_000_000_123,
            known: vec!["sm1".into(), "sm2".into(), "sm3".into()],
            fenced: vec![FencedSmHostView {
                host: "sm3".into(),
                fenced_by: vec!["sm1".into(), "sm2".into()],
                since_unix_ms: 2_500,
                evidence: "SMInfo: no answer".into(),
            }],
            acknowledged: vec!["sm1".into()],
            excused: vec!["sm3".into()],
            not_acknowledged: vec![SmHostMiss {
                host: "sm2".into(),
                endpoint: "https://sm2:7443".into(),
                kind: SmHostMissKind::Refused,
                detail: "OpenSM has not confirmed".into(),
            }],
            problems: vec!["p".into()],
            not_fenced: vec!["n".into()],
        };
        let p = sm_hosts_to_pb(&s);
        assert_eq!(p.generation, 7);
        assert_eq!(p.answered.unwrap().seconds, 1500);
        assert_eq!(p.known_hosts, ["sm1", "sm2", "sm3"]);
        assert_eq!(p.fenced_hosts[0].fenced_by, ["sm1", "sm2"]);
        let since = p.fenced_hosts[0].since.unwrap();
        assert_eq!((since.seconds, since.nanos), (2, 500_000_000));
        assert_eq!(p.acknowledged, ["sm1"]);
        assert_eq!(p.excused, ["sm3"]);
        assert_eq!(p.not_acknowledged[0].reason, "REFUSED");
        assert_eq!(p.not_acknowledged[0].endpoint, "https://sm2:7443");
        assert_eq!((p.problems.len(), p.not_fenced.len()), (1, 1));
    }
}
