//! The node's rule for which SM hosts must acknowledge an apply: the set comes from the fabric
//! side, not from the node's `endpoints`.
//!
//! Every SM host's answer names the host (`SetNodeMembershipsResponse.host`), the SM hosts it
//! knows (itself and its peers) and the ones it holds fenced. An apply is complete only when
//! - every SM host any answer names, less the ones *every* answering host holds fenced, has
//!   acknowledged it through one of the node's endpoints, and
//! - every endpoint acknowledged, or is such a fenced host.
//!
//! Hosts are compared by identity, never by endpoint spelling: over TLS the name the node
//! verified in the host's certificate (`domain_name`, else the URL's host), which the name the
//! host states must equal; on plaintext (loopback test rigs) the stated name as is (for an
//! endpoint that does not answer, the name it last stated). Two endpoints with one identity, a
//! known host missing from the endpoints, or a stated name that is not the verified one make the
//! apply incomplete, with the reason (and the node's `SM_HOST_SET_INCOMPLETE` condition). An SM
//! host that states no name (one without peers, a UFM broker, an older agent) is identified by
//! its endpoint and knows only itself: then every endpoint must acknowledge, as before.

use crate::proto::sm as pb;
use std::collections::{BTreeMap, BTreeSet};

/// One endpoint's part in an apply.
#[derive(Debug, Clone)]
pub struct EndpointView<'a> {
    /// The endpoint as configured.
    pub endpoint: &'a str,
    /// The name TLS verified for it (https), `None` on plaintext.
    pub verified: Option<String>,
    /// On plaintext: the name it stated in an earlier answer.
    pub remembered: Option<String>,
    /// Its answer when it acknowledged the apply; `None` when it did not.
    pub reply: Option<&'a pb::SetNodeMembershipsResponse>,
}

/// What the answers mean for the apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The identities that acknowledged.
    pub acknowledged: Vec<String>,
    /// Hosts excused: fenced by every answering host.
    pub excused: Vec<String>,
    /// Why the host set is not covered (identity and coverage problems).
    pub problems: Vec<String>,
    /// Endpoints (indexes into the views) that did not acknowledge and are not excused.
    pub unacknowledged: Vec<usize>,
    /// Every SM host the answers name (the answering hosts and the peers they know), sorted.
    pub known: Vec<String>,
    /// Known hosts that are not among the endpoints (each is also a problem).
    pub missing: Vec<String>,
    /// Each endpoint's identity, as the views are ordered (None: a plaintext endpoint that
    /// never answered).
    pub identities: Vec<Option<String>>,
}

impl Verdict {
    /// Whether the apply counts as acknowledged.
    pub fn complete(&self) -> bool {
        self.problems.is_empty() && self.unacknowledged.is_empty() && !self.acknowledged.is_empty()
    }
}

fn norm(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// Judges one apply's answers (module docs).
pub fn judge(views: &[EndpointView<'_>]) -> Verdict {
    let mut v = Verdict::default();
    // Each endpoint's identity (None: unknown, a plaintext endpoint that never answered).
    let mut identities: Vec<Option<String>> = Vec::with_capacity(views.len());
    let mut known: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut fenced_by_all: Option<BTreeSet<String>> = None;
    let mut acked: BTreeSet<String> = BTreeSet::new();
    for view in views {
        let Some(reply) = view.reply else {
            identities.push(
                view.verified
                    .clone()
                    .or_else(|| view.remembered.clone())
                    .map(|n| norm(&n)),
            );
            continue;
        };
        let stated = norm(&reply.host);
        let identity = match (&view.verified, stated.is_empty()) {
            (Some(verified), false) if norm(verified) != stated => {
                v.problems.push(format!(
                    "{} states it is SM host {:?} but TLS verified {:?} for it: its acknowledgement is not counted",
                    view.endpoint, reply.host, verified
                ));
                identities.push(Some(norm(verified)));
                None
            }
            (Some(verified), true) => Some(norm(verified)),
            (None, true) => Some(norm(view.endpoint)),
            (_, false) => Some(stated),
        };
        if let Some(id) = &identity {
            identities.push(Some(id.clone()));
            acked.insert(id.clone());
            known.entry(id.clone()).or_default().insert(id.clone());
            for k in &reply.known_hosts {
                known.entry(norm(k)).or_default().insert(id.clone());
            }
        }
        let fenced: BTreeSet<String> = reply.fenced_hosts.iter().map(|f| norm(&f.host)).collect();
        fenced_by_all = Some(match fenced_by_all {
            None => fenced,
            Some(all) => all.intersection(&fenced).cloned().collect(),
        });
    }
    // On plaintext, a host may know a peer only by the endpoint it pulls (before that peer
    // first answered it): that spelling is the node's endpoint with the same spelling.
    let alias: BTreeMap<String, String> = views
        .iter()
        .zip(&identities)
        .filter(|(view, _)| view.verified.is_none())
        .filter_map(|(view, id)| Some((norm(view.endpoint), id.clone()?)))
        .collect();
    let known: BTreeMap<String, BTreeSet<String>> =
        known.into_iter().fold(BTreeMap::new(), |mut m, (k, by)| {
            m.entry(alias.get(&k).cloned().unwrap_or(k))
                .or_default()
                .extend(by);
            m
        });
    let excused: BTreeSet<String> = fenced_by_all
        .unwrap_or_default()
        .into_iter()
        .map(|k| alias.get(&k).cloned().unwrap_or(k))
        .collect();
    // Two endpoints, one host.
    let mut by_identity: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (view, id) in views.iter().zip(&identities) {
        if let Some(id) = id {
            by_identity.entry(id).or_default().push(view.endpoint);
        }
    }
    for (id, endpoints) in &by_identity {
        if endpoints.len() > 1 {
            v.problems.push(format!(
                "endpoints {} answer as one SM host {id:?}: a host must be listed once, and every SM host of the fabric must be listed",
                endpoints.join(" and ")
            ));
        }
    }
    // Every known host that is not excused must have acknowledged, through an endpoint.
    for (host, named_by) in &known {
        if excused.contains(host) || acked.contains(host) {
            continue;
        }
        if identities.iter().any(|id| id.as_deref() == Some(host)) {
            continue; // an endpoint of the node that did not acknowledge: listed below
        }
        v.problems.push(format!(
            "SM host {host:?} (known to {}) is not among this node's endpoints: add it to [subnet_manager.remote] endpoints",
            named_by.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        v.missing.push(host.clone());
    }
    // Every endpoint that did not acknowledge, unless it is a host every answer holds fenced.
    for (i, (view, id)) in views.iter().zip(&identities).enumerate() {
        if view.reply.is_some() && id.as_ref().is_some_and(|id| acked.contains(id)) {
            continue;
        }
        match id {
            Some(id) if excused.contains(id) && !acked.contains(id) => {
                v.excused.push(id.clone());
            }
            _ => v.unacknowledged.push(i),
        }
    }
    v.acknowledged = acked.into_iter().collect();
    v.excused.sort();
    v.excused.dedup();
    v.known = known.into_keys().collect();
    v.identities = identities;
    v
}

/// An SM host's answer naming `host`, the hosts it knows and the ones it holds fenced (tests).
#[cfg(test)]
pub(crate) fn reply(host: &str, known: &[&str], fenced: &[&str]) -> pb::SetNodeMembershipsResponse {
    pb::SetNodeMembershipsResponse {
        sweeps: 1,
        host: host.into(),
        known_hosts: known.iter().map(|s| (*s).to_owned()).collect(),
        fenced_hosts: fenced
            .iter()
            .map(|h| pb::FencedSmHost {
                host: (*h).into(),
                since_unix_ms: 1,
                evidence: "no SMInfo answer".into(),
            })
            .collect(),
        not_fenced: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(
        endpoint: &'a str,
        reply: Option<&'a pb::SetNodeMembershipsResponse>,
    ) -> EndpointView<'a> {
        EndpointView {
            endpoint,
            verified: endpoint
                .starts_with("https://")
                .then(|| crate::sm::opensm::peers::url_host(endpoint))
                .flatten(),
            remembered: None,
            reply,
        }
    }

    #[test]
    fn endpoints_lacking_a_known_host_never_count_complete() {
        let a = reply("sm1", &["sm1", "sm2"], &[]);
        let v = judge(&[view("https://sm1:7443", Some(&a))]);
        assert!(!v.complete());
        assert!(v.problems[0].contains("\"sm2\"") && v.problems[0].contains("not among"));
        // Even when sm1 holds sm2 fenced... no: sm1 is the only answering host and says so.
        let fenced = reply("sm1", &["sm1", "sm2"], &["sm2"]);
        let v = judge(&[view("https://sm1:7443", Some(&fenced))]);
        assert!(v.complete(), "{v:?}");
        // Both listed and both acknowledged: complete.
        let b = reply("sm2", &["sm1", "sm2"], &[]);
        let v = judge(&[
            view("https://sm1:7443", Some(&a)),
            view("https://sm2:7443", Some(&b)),
        ]);
        assert!(v.complete(), "{v:?}");
        assert_eq!(v.acknowledged, vec!["sm1".to_owned(), "sm2".to_owned()]);
        assert_eq!(v.known, ["sm1", "sm2"]);
        assert!(v.missing.is_empty());
        let v = judge(&[view("https://sm1:7443", Some(&a))]);
        assert_eq!(
            (v.known, v.missing),
            (vec!["sm1".into(), "sm2".into()], vec!["sm2".into()])
        );
    }

    #[test]
    fn two_endpoints_answering_as_one_host_are_incomplete() {
        let a = reply("sm1", &["sm1", "sm2"], &[]);
        let mut one = view("http://127.0.0.1:1", Some(&a));
        one.verified = None;
        let mut two = view("http://127.0.0.1:2", Some(&a));
        two.verified = None;
        let v = judge(&[one, two]);
        assert!(!v.complete());
        assert!(v
            .problems
            .iter()
            .any(|p| p.contains("answer as one SM host")));
        assert!(v.problems.iter().any(|p| p.contains("\"sm2\"")));
        // Over TLS: a host stating another name than its certificate's is not counted.
        let liar = reply("sm2", &["sm1", "sm2"], &[]);
        let v = judge(&[
            view("https://sm1:7443", Some(&a)),
            view("https://sm1-alias:7443", Some(&liar)),
        ]);
        assert!(!v.complete());
        assert!(
            v.problems.iter().any(|p| p.contains("TLS verified")),
            "{v:?}"
        );
    }

    #[test]
    fn fenced_is_excused_only_when_every_answering_host_says_so() {
        let a = reply("sm1", &["sm1", "sm2", "sm3"], &["sm3"]);
        let b = reply("sm2", &["sm1", "sm2", "sm3"], &[]);
        let v = judge(&[
            view("https://sm1:7443", Some(&a)),
            view("https://sm2:7443", Some(&b)),
            view("https://sm3:7443", None),
        ]);
        assert!(!v.complete());
        assert_eq!(v.unacknowledged, vec![2]);
        let b = reply("sm2", &["sm1", "sm2", "sm3"], &["sm3"]);
        let v = judge(&[
            view("https://sm1:7443", Some(&a)),
            view("https://sm2:7443", Some(&b)),
            view("https://sm3:7443", None),
        ]);
        assert!(v.complete(), "{v:?}");
        assert_eq!(v.excused, vec!["sm3".to_owned()]);
        // A host no answer holds fenced that did not answer: incomplete.
        let v = judge(&[
            view("https://sm1:7443", None),
            view("https://sm2:7443", Some(&b)),
        ]);
        assert!(!v.complete());
        // Nothing answered: never complete (no one can excuse anyone).
        let v = judge(&[view("https://sm1:7443", None)]);
        assert!(!v.complete());
        // A plaintext endpoint that never answered has no identity: never excused.
        let c = reply("sm1", &["sm1", "sm2"], &["sm2"]);
        let mut silent = view("http://127.0.0.1:2", None);
        silent.verified = None;
        let mut live = view("http://127.0.0.1:1", Some(&c));
        live.verified = None;
        assert!(!judge(&[live.clone(), silent.clone()]).complete());
        silent.remembered = Some("sm2".into());
        assert!(judge(&[live, silent]).complete());
    }

    #[test]
    fn hosts_without_names_are_their_endpoints() {
        let legacy = pb::SetNodeMembershipsResponse {
            sweeps: 1,
            ..Default::default()
        };
        let v = judge(&[
            view("https://sm1:7443", Some(&legacy)),
            view("https://sm2:7443", Some(&legacy)),
        ]);
        assert!(v.complete(), "{v:?}");
        let v = judge(&[
            view("https://sm1:7443", Some(&legacy)),
            view("https://sm2:7443", None),
        ]);
        assert!(!v.complete());
    }
}
