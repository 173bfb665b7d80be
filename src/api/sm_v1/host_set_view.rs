//! The fabric's SM-host set as one apply's answers show it, for `GetNode` (`sm_hosts`): the
//! same judgement that decides the acknowledgement ([`super::host_set::judge`]), laid out host
//! by host: known, fenced (and by whom), acknowledged, excused, and every host that did not
//! acknowledge with why (no answer, a refusal, an answer not counted, a host missing from the
//! endpoints).

use super::host_answer::{classify, HostAnswer};
use super::host_set::{judge, EndpointView, Verdict};
use crate::domain::{FencedSmHostView, SmHostMiss, SmHostMissKind, SmHostSet};
use crate::sm::SmError;
use std::collections::{BTreeMap, BTreeSet};

/// The views [`judge`] reads, one per answer, in the answers' order.
pub fn endpoint_views<'a>(answers: &'a [HostAnswer<'a>]) -> Vec<EndpointView<'a>> {
    answers
        .iter()
        .map(|a| EndpointView {
            endpoint: a.endpoint,
            verified: a.verified.clone(),
            remembered: a.remembered.clone(),
            reply: a.answer.as_ref().ok(),
        })
        .collect()
}

/// The SM-host set one apply at `generation` saw, its answers all in at `answered_unix_ns`.
pub fn view(answers: &[HostAnswer<'_>], generation: u64, answered_unix_ns: i64) -> SmHostSet {
    let verdict = judge(&endpoint_views(answers));
    of(answers, &verdict, generation, answered_unix_ns)
}

fn of(
    answers: &[HostAnswer<'_>],
    verdict: &Verdict,
    generation: u64,
    answered_unix_ns: i64,
) -> SmHostSet {
    let identity = |i: usize| {
        verdict
            .identities
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| answers[i].endpoint.to_owned())
    };
    let mut fenced: BTreeMap<String, FencedSmHostView> = BTreeMap::new();
    let mut not_fenced: BTreeSet<String> = BTreeSet::new();
    for (i, a) in answers.iter().enumerate() {
        let Ok(reply) = &a.answer else { continue };
        for f in &reply.fenced_hosts {
            let host = f.host.to_ascii_lowercase();
            let entry = fenced
                .entry(host.clone())
                .or_insert_with(|| FencedSmHostView {
                    host,
                    fenced_by: Vec::new(),
                    since_unix_ms: f.since_unix_ms,
                    evidence: f.evidence.clone(),
                });
            entry.fenced_by.push(identity(i));
            entry.since_unix_ms = entry.since_unix_ms.min(f.since_unix_ms);
        }
        not_fenced.extend(reply.not_fenced.iter().cloned());
    }
    let mut not_acknowledged: Vec<SmHostMiss> = verdict
        .unacknowledged
        .iter()
        .map(|&i| {
            let (kind, detail) = match &answers[i].answer {
                Err(status) => match classify(status, generation) {
                    e @ SmError::Unreachable(_) => (SmHostMissKind::Unreachable, e.to_string()),
                    e => (SmHostMissKind::Refused, e.to_string()),
                },
                Ok(_) => (
                    SmHostMissKind::NotCounted,
                    "it acknowledged, but its acknowledgement is not counted (see the problems)"
                        .to_owned(),
                ),
            };
            SmHostMiss {
                host: identity(i),
                endpoint: answers[i].endpoint.to_owned(),
                kind,
                detail,
            }
        })
        .collect();
    not_acknowledged.extend(verdict.missing.iter().map(|host| {
        SmHostMiss {
            host: host.clone(),
            endpoint: String::new(),
            kind: SmHostMissKind::NotListed,
            detail: "not among this node's endpoints: add it to [subnet_manager.remote] endpoints"
                .to_owned(),
        }
    }));
    let known: BTreeSet<String> = verdict
        .known
        .iter()
        .cloned()
        .chain((0..answers.len()).map(identity))
        .collect();
    SmHostSet {
        generation,
        answered_unix_ns,
        known: known.into_iter().collect(),
        fenced: fenced.into_values().collect(),
        acknowledged: verdict.acknowledged.clone(),
        excused: verdict.excused.clone(),
        not_acknowledged,
        problems: verdict.problems.clone(),
        not_fenced: not_fenced.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::host_set::reply;
    use super::*;
    use tonic::Status;

    fn answer<'a>(
        endpoint: &'a str,
        answer: Result<crate::proto::sm::SetNodeMembershipsResponse, Status>,
    ) -> HostAnswer<'a> {
        HostAnswer {
            endpoint,
            verified: crate::sm::opensm::peers::url_host(endpoint),
            remembered: None,
            answer,
        }
    }

    fn unreachable() -> Status {
        Status::from_error(Box::new(std::io::Error::other("tcp connect error")))
    }

    #[test]
    fn every_host_is_shown_with_why_it_did_not_acknowledge() {
        let four = ["sm1", "sm2", "sm3", "sm4"];
        let answers = [
            answer("https://sm1:7443", Ok(reply("sm1", &four, &["sm3"]))),
            answer(
                "https://sm2:7443",
                Err(Status::unavailable("OpenSM has not confirmed")),
            ),
            answer("https://sm3:7443", Err(unreachable())),
        ];
        let v = view(&answers, 9, 42);
        assert_eq!((v.generation, v.answered_unix_ns), (9, 42));
        assert_eq!(v.known, ["sm1", "sm2", "sm3", "sm4"]);
        assert_eq!(v.acknowledged, ["sm1"]);
        // sm1 alone answered and holds sm3 fenced: excused.
        assert_eq!(v.excused, ["sm3"]);
        assert_eq!(v.fenced.len(), 1);
        assert_eq!(v.fenced[0].host, "sm3");
        assert_eq!(v.fenced[0].fenced_by, ["sm1"]);
        assert_eq!(v.fenced[0].evidence, "no SMInfo answer");
        let misses: Vec<(&str, SmHostMissKind)> = v
            .not_acknowledged
            .iter()
            .map(|m| (m.host.as_str(), m.kind))
            .collect();
        // A refusal is never shown as unreachable; sm4 is not among the endpoints.
        assert_eq!(
            misses,
            [
                ("sm2", SmHostMissKind::Refused),
                ("sm4", SmHostMissKind::NotListed)
            ]
        );
        assert!(v.not_acknowledged[0]
            .detail
            .contains("OpenSM has not confirmed"));
        assert_eq!(v.not_acknowledged[0].endpoint, "https://sm2:7443");
        assert!(!v.complete());
        assert!(v.problems.iter().any(|p| p.contains("\"sm4\"")));
        // sm3 not fenced by anyone: no answer is UNREACHABLE.
        let answers = [
            answer("https://sm1:7443", Ok(reply("sm1", &["sm1", "sm2"], &[]))),
            answer("https://sm2:7443", Err(unreachable())),
        ];
        let v = view(&answers, 10, 0);
        assert_eq!(v.not_acknowledged.len(), 1);
        assert_eq!(v.not_acknowledged[0].kind, SmHostMissKind::Unreachable);
        assert_eq!(v.not_acknowledged[0].host, "sm2");
        // Both acknowledged: complete, nothing missing.
        let answers = [
            answer("https://sm1:7443", Ok(reply("sm1", &["sm1", "sm2"], &[]))),
            answer("https://sm2:7443", Ok(reply("sm2", &["sm1", "sm2"], &[]))),
        ];
        let v = view(&answers, 11, 0);
        assert!(v.complete(), "{v:?}");
        assert_eq!(v.acknowledged, ["sm1", "sm2"]);
        assert!(v.fenced.is_empty() && v.not_acknowledged.is_empty());
    }

    #[test]
    fn an_acknowledgement_not_counted_is_named_so() {
        let answers = [
            answer("https://sm1:7443", Ok(reply("sm1", &["sm1", "sm2"], &[]))),
            // States sm9 while TLS verified sm2.
            answer("https://sm2:7443", Ok(reply("sm9", &["sm1", "sm2"], &[]))),
        ];
        let v = view(&answers, 3, 0);
        assert_eq!(v.not_acknowledged.len(), 1, "{v:?}");
        assert_eq!(v.not_acknowledged[0].host, "sm2");
        assert_eq!(v.not_acknowledged[0].kind, SmHostMissKind::NotCounted);
    }
}
