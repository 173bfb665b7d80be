//! The campaign's checker: the truth rules checked over a [`History`], independent of the agents
//! (the port tables come from `smpquery`, the states from the node's own event streams as the
//! control plane received them).
//!
//! Rules (each violation names its rule):
//! - [`RELEASED_KEY_ON_PORT`]: no port read that *started* after an instance's RELEASED event
//!   holds that instance's key, unless another instance of that node in the same partition was
//!   granted before the read ended and not RELEASED before it started, or the port was seen not
//!   Active (TRUTH-RULES.md: a DOWN port counts as not holding a key; the SM reprograms it
//!   before it can go ACTIVE again; counted in [`Verdict::not_active_exempt`]), or the read
//!   started while the node's link was dropped at ibsim's console or within [`RELINK_SETTLE`]
//!   after it came back: ibsim's `ReLink` puts a port straight back to Active with its old
//!   table (no Init step, measured), until OpenSM's sweep reprograms it — a simulator artefact
//!   a real HCA does not have (counted in [`Verdict::relink_exempt`]).
//! - [`TWO_TENANTS`]: no Active port holds two tenant keys at once (the driver gives a node one
//!   partition at a time: a new instance is attached only once the previous one is RELEASED).
//! - [`NEVER_GRANTED`]: no port holds a tenant key the control plane never granted to that node
//!   (a grant issued before the read ended).
//! - [`DELETED_KEY_ON_PORT`]: no read of an Active port that started after the delete guard
//!   said yes for a key holds that key.
//! - [`STREAM_GAP`]: per node and log epoch, the events received are gap-free (each seq the
//!   previous + 1) between two resyncs; one (epoch, seq) names one event only.
//! - [`RELEASE_LOST`]: an instance reported RELEASED (final) is never reported in another state
//!   afterwards in the same log epoch, unless the reason names a restored store (`RESTORED`:
//!   documented, counted).

use super::history::{Entry, History, Ms, PortRead};
use std::collections::{BTreeMap, HashMap};

/// Rule: a released instance's key on one of its ports after the RELEASED event.
pub const RELEASED_KEY_ON_PORT: &str = "released-key-on-port";
/// Rule: two tenant partitions on one port.
pub const TWO_TENANTS: &str = "two-tenant-partitions-on-one-port";
/// Rule: a key on a port that was never granted to that node.
pub const NEVER_GRANTED: &str = "key-never-granted";
/// Rule: a deleted partition's key on a port after the guard said yes.
pub const DELETED_KEY_ON_PORT: &str = "deleted-partition-key-on-port";
/// Rule: an event stream with a gap or a reused seq within an epoch.
pub const STREAM_GAP: &str = "event-stream-gap";
/// Rule: a RELEASED instance reported in another state later.
pub const RELEASE_LOST: &str = "release-lost";
/// Rule: the campaign did not converge within its bound after the faults stopped.
pub const NOT_CONVERGED: &str = "not-converged";
/// Rule: at convergence, a node or SM host reports a standing condition (`GetNode`) with no
/// explanation (an empty detail).
pub const UNEXPLAINED_CONDITION: &str = "condition-without-explanation";

/// AttachmentState RELEASED.
pub const RELEASED: i32 = 6;

/// How long after an ibsim `ReLink` a port's old table may still show (see the module doc).
pub const RELINK_SETTLE: Ms = 5_000;

/// One broken rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The rule ([`RELEASED_KEY_ON_PORT`], ...).
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
    /// When it was seen (wall-clock ms): the read's start, or the event's receipt.
    pub at: Ms,
}

/// What the checker did and found.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Rule evaluations made (one per read per port rule, one per event per stream rule).
    pub checks: u64,
    /// Port reads checked.
    pub reads: usize,
    /// Events checked.
    pub events: usize,
    /// RELEASED events (each a release whose key must stay off).
    pub releases: usize,
    /// Instances seen back from RELEASED with a restored store's reason (documented).
    pub restored_after_release: usize,
    /// Reads of a port seen not Active that would otherwise have broken a rule (documented).
    pub not_active_exempt: usize,
    /// Reads during or right after an ibsim link drop that would otherwise have broken a rule.
    pub relink_exempt: usize,
    /// Every violation.
    pub violations: Vec<Violation>,
}

/// A RELEASED event: (node, instance, key, time).
struct Released {
    instance: String,
    pkey: u16,
    at: Ms,
}

/// Checks every rule over `history`.
pub fn check(history: &History) -> Verdict {
    let mut v = Verdict::default();
    // Per node: grants (instance, key, issued) and RELEASED events.
    let mut grants: HashMap<&str, Vec<(&str, u16, Ms)>> = HashMap::new();
    for g in history.grants() {
        grants
            .entry(g.node.as_str())
            .or_default()
            .push((&g.instance, g.pkey, g.at));
    }
    let mut released: HashMap<&str, Vec<Released>> = HashMap::new();
    // First RELEASED event time per (node, instance).
    let mut released_at: HashMap<(&str, &str), Ms> = HashMap::new();
    for e in history.events() {
        if let Some(c) = &e.change {
            if c.to == RELEASED {
                released_at
                    .entry((e.node.as_str(), c.instance.as_str()))
                    .and_modify(|t| *t = (*t).min(e.at))
                    .or_insert(e.at);
                released.entry(e.node.as_str()).or_default().push(Released {
                    instance: c.instance.clone(),
                    pkey: c.pkey,
                    at: e.at,
                });
            }
        }
    }
    v.releases = released.values().map(Vec::len).sum();
    let deletes: Vec<(u16, Ms)> = history
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::DeleteYes { pkey, at } => Some((*pkey, *at)),
            _ => None,
        })
        .collect();

    // Per node: windows [dropped, restored + settle) of its link.
    let mut windows: HashMap<&str, Vec<(Ms, Ms)>> = HashMap::new();
    let mut open: HashMap<&str, Ms> = HashMap::new();
    for e in &history.entries {
        if let Entry::Link { node, up, at } = e {
            if *up {
                let from = open.remove(node.as_str()).unwrap_or(*at);
                windows
                    .entry(node.as_str())
                    .or_default()
                    .push((from, at + RELINK_SETTLE));
            } else {
                open.insert(node.as_str(), *at);
            }
        }
    }
    for (node, from) in open {
        windows.entry(node).or_default().push((from, Ms::MAX));
    }
    for r in history.reads() {
        v.reads += 1;
        v.checks += 4;
        let before = v.violations.len();
        check_read(r, &grants, &released, &released_at, &deletes, &mut v);
        let relinked = windows
            .get(r.node.as_str())
            .is_some_and(|w| w.iter().any(|(a, b)| *a <= r.started && r.started < *b));
        if relinked && v.violations.len() > before {
            let found: Vec<Violation> = v.violations.drain(before..).collect();
            let (kept, waived): (Vec<_>, Vec<_>) =
                found.into_iter().partition(|x| x.rule == NEVER_GRANTED);
            if !waived.is_empty() {
                v.relink_exempt += 1;
            }
            v.violations.extend(kept);
        }
    }
    check_streams(history, &mut v);
    v
}

fn check_read(
    r: &PortRead,
    grants: &HashMap<&str, Vec<(&str, u16, Ms)>>,
    released: &HashMap<&str, Vec<Released>>,
    released_at: &HashMap<(&str, &str), Ms>,
    deletes: &[(u16, Ms)],
    v: &mut Verdict,
) {
    let node = r.node.as_str();
    let exempt = r.not_active();
    let before = v.violations.len();
    if r.bases.len() > 1 {
        v.violations.push(Violation {
            at: r.started,
            rule: TWO_TENANTS,
            detail: format!(
                "{node}'s port held {:04x?} (read started {}, ended {})",
                r.bases, r.started, r.ended
            ),
        });
    }
    let node_grants = grants.get(node).map(Vec::as_slice).unwrap_or_default();
    for &base in &r.bases {
        if !node_grants
            .iter()
            .any(|(_, k, at)| *k == base && *at <= r.ended)
        {
            v.violations.push(Violation {
                at: r.started,
                rule: NEVER_GRANTED,
                detail: format!(
                    "{node}'s port held {base:#06x}, never granted to {node} (read started {}, ended {})",
                    r.started, r.ended
                ),
            });
        }
        // Another instance of this node in this partition, granted before the read ended and
        // not RELEASED before it started, may hold the key.
        let wanted_by_another = |except: &str| {
            node_grants.iter().any(|(i, k, at)| {
                *k == base
                    && *i != except
                    && *at <= r.ended
                    && released_at
                        .get(&(node, *i))
                        .is_none_or(|rel| *rel >= r.started)
            })
        };
        for rel in released.get(node).map(Vec::as_slice).unwrap_or_default() {
            if rel.pkey == base && rel.at < r.started && !wanted_by_another(&rel.instance) {
                v.violations.push(Violation {
                    at: r.started,
                    rule: RELEASED_KEY_ON_PORT,
                    detail: format!(
                        "{node}'s port held {base:#06x} in a read started {} ms after {}'s RELEASED event (at {}; read {}..{})",
                        r.started - rel.at,
                        rel.instance,
                        rel.at,
                        r.started,
                        r.ended
                    ),
                });
            }
        }
        for (k, at) in deletes {
            if *k == base && *at < r.started {
                v.violations.push(Violation {
                    at: r.started,
                    rule: DELETED_KEY_ON_PORT,
                    detail: format!(
                        "{node}'s port held {base:#06x} in a read started {} ms after the delete guard said yes (at {at})",
                        r.started - at
                    ),
                });
            }
        }
    }
    if exempt {
        let found: Vec<Violation> = v.violations.drain(before..).collect();
        let (kept, waived): (Vec<_>, Vec<_>) =
            found.into_iter().partition(|x| x.rule == NEVER_GRANTED);
        if !waived.is_empty() {
            v.not_active_exempt += 1;
        }
        v.violations.extend(kept);
    }
}

fn check_streams(history: &History, v: &mut Verdict) {
    // Per node: the previous (epoch, seq) within the current segment (reset by a resync).
    let mut previous: HashMap<&str, Option<(&str, u64)>> = HashMap::new();
    let mut digests: HashMap<(&str, &str, u64), &str> = HashMap::new();
    // Per (node, epoch, instance): the last state received. A new epoch is a log that
    // restarted (a store put back: its attachments are what the copy held, API.md), so RELEASED
    // is final within one epoch.
    let mut last_state: BTreeMap<(&str, &str, &str), i32> = BTreeMap::new();
    for e in &history.entries {
        match e {
            Entry::Resync { node, .. } => {
                previous.insert(node.as_str(), None);
            }
            Entry::Event(e) => {
                v.events += 1;
                v.checks += 3;
                let node = e.node.as_str();
                let prev = previous.entry(node).or_insert(None);
                if let Some((epoch, seq)) = *prev {
                    if epoch == e.epoch && e.seq != seq + 1 {
                        v.violations.push(Violation {
                            at: e.at,
                            rule: STREAM_GAP,
                            detail: format!(
                                "{node}: epoch {epoch}: seq {} followed seq {seq}",
                                e.seq
                            ),
                        });
                    }
                    if epoch != e.epoch && e.seq != 1 {
                        v.violations.push(Violation {
                            at: e.at,
                            rule: STREAM_GAP,
                            detail: format!(
                                "{node}: epoch {} began at seq {} (after epoch {epoch} seq {seq}) without a resync",
                                e.epoch, e.seq
                            ),
                        });
                    }
                }
                *prev = Some((&e.epoch, e.seq));
                match digests.get(&(node, e.epoch.as_str(), e.seq)) {
                    Some(d) if *d != e.digest => v.violations.push(Violation {
                        at: e.at,
                        rule: STREAM_GAP,
                        detail: format!(
                            "{node}: epoch {} seq {} named two events: {d} / {}",
                            e.epoch, e.seq, e.digest
                        ),
                    }),
                    Some(_) => {}
                    None => {
                        digests.insert((node, e.epoch.as_str(), e.seq), &e.digest);
                    }
                }
                if let Some(c) = &e.change {
                    let key = (node, e.epoch.as_str(), c.instance.as_str());
                    if last_state.get(&key) == Some(&RELEASED) && c.to != RELEASED {
                        if c.reason.contains("RESTORED") {
                            v.restored_after_release += 1;
                        } else {
                            v.violations.push(Violation {
                                at: e.at,
                                rule: RELEASE_LOST,
                                detail: format!(
                                    "{node}: {} reported {} ({}) after RELEASED (seq {})",
                                    c.instance, c.to, c.reason, e.seq
                                ),
                            });
                        }
                    }
                    last_state.insert(key, c.to);
                }
            }
            _ => {}
        }
    }
}

/// Standing conditions reported at convergence, as (agent, kind, detail), and when: a
/// violation of [`UNEXPLAINED_CONDITION`] for each one whose detail is empty.
pub fn unexplained(conditions: &[(String, String, String)], at: Ms) -> Vec<Violation> {
    conditions
        .iter()
        .filter(|(_, _, detail)| detail.trim().is_empty())
        .map(|(who, kind, _)| Violation {
            at,
            rule: UNEXPLAINED_CONDITION,
            detail: format!("{who} reports the standing condition {kind} with no explanation"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::history::{Change, Granted, SeenEvent};
    use super::*;

    fn read(node: &str, started: Ms, bases: &[u16]) -> Entry {
        Entry::Read(PortRead {
            node: node.into(),
            started,
            ended: started + 20,
            bases: bases.to_vec(),
            link: None,
        })
    }

    fn grant(node: &str, instance: &str, pkey: u16, at: Ms) -> Entry {
        Entry::Grant(Granted {
            node: node.into(),
            instance: instance.into(),
            pkey,
            at,
        })
    }

    fn event(node: &str, seq: u64, at: Ms, change: Option<(&str, u16, i32)>) -> Entry {
        Entry::Event(SeenEvent {
            node: node.into(),
            epoch: "e1".into(),
            seq,
            at,
            digest: format!("{seq}@{at}"),
            change: change.map(|(i, k, to)| Change {
                instance: i.into(),
                pkey: k,
                to,
                reason: String::new(),
            }),
        })
    }

    fn rules(h: &History) -> Vec<&'static str> {
        check(h).violations.iter().map(|v| v.rule).collect()
    }

    /// A clean history: granted, ACTIVE, RELEASED, the key off afterwards; a second instance in
    /// the same partition later holds the key again legitimately.
    fn clean() -> History {
        History {
            entries: vec![
                grant("n1", "i-1", 0x1001, 100),
                event("n1", 1, 150, Some(("i-1", 0x1001, 3))),
                read("n1", 200, &[0x1001]),
                event("n1", 2, 300, Some(("i-1", 0x1001, RELEASED))),
                // Started before the RELEASED event: may still show the key.
                read("n1", 290, &[0x1001]),
                read("n1", 310, &[]),
                grant("n1", "i-2", 0x1001, 400),
                read("n1", 450, &[0x1001]),
                event("n1", 3, 460, Some(("i-2", 0x1001, 3))),
            ],
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let v = check(&clean());
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((v.reads, v.events, v.releases), (4, 3, 1));
    }

    #[test]
    fn a_released_key_back_on_the_port_is_a_violation() {
        let mut h = clean();
        h.push(read("n1", 320, &[0x1001]));
        assert_eq!(rules(&h), [RELEASED_KEY_ON_PORT]);
        // The second instance's release ends its exception too.
        let mut h = clean();
        h.push(event("n1", 4, 500, Some(("i-2", 0x1001, RELEASED))));
        h.push(read("n1", 600, &[0x1001]));
        assert_eq!(rules(&h), [RELEASED_KEY_ON_PORT, RELEASED_KEY_ON_PORT]);
    }

    #[test]
    fn a_key_never_granted_and_two_tenants_are_violations() {
        let mut h = clean();
        h.push(read("n2", 320, &[0x1001]));
        assert_eq!(rules(&h), [NEVER_GRANTED]);
        let mut h = clean();
        h.push(grant("n1", "i-3", 0x1002, 470));
        h.push(read("n1", 480, &[0x1001, 0x1002]));
        assert_eq!(rules(&h), [TWO_TENANTS]);
        // A grant issued after the read ended does not cover it.
        let mut h = clean();
        h.push(read("n1", 480, &[0x1003]));
        h.push(grant("n1", "i-4", 0x1003, 600));
        assert_eq!(rules(&h), [NEVER_GRANTED]);
    }

    #[test]
    fn a_port_seen_not_active_counts_as_not_holding_its_keys() {
        let mut h = clean();
        let down = |link: &str| {
            Entry::Read(PortRead {
                node: "n1".into(),
                started: 320,
                ended: 340,
                bases: vec![0x1001, 0x1002],
                link: Some(link.into()),
            })
        };
        h.push(down("Down"));
        let v = check(&h);
        // The released key and the second tenant are waived; a key never granted is not.
        assert_eq!(rules(&h), [NEVER_GRANTED]);
        assert_eq!(v.not_active_exempt, 1);
        let mut h = clean();
        h.push(down("Active"));
        assert_eq!(
            rules(&h),
            [TWO_TENANTS, RELEASED_KEY_ON_PORT, NEVER_GRANTED]
        );
    }

    #[test]
    fn a_read_during_or_right_after_a_link_drop_is_waived() {
        let mut h = History {
            entries: vec![
                grant("n1", "i-1", 0x1001, 100),
                event("n1", 1, 300, Some(("i-1", 0x1001, RELEASED))),
                Entry::Link {
                    node: "n1".into(),
                    up: false,
                    at: 305,
                },
                read("n1", 340, &[0x1001]),
                Entry::Link {
                    node: "n1".into(),
                    up: true,
                    at: 360,
                },
                read("n1", 400, &[0x1001]),
            ],
        };
        let v = check(&h);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.relink_exempt, 2);
        h.push(read("n1", 360 + RELINK_SETTLE, &[0x1001]));
        assert_eq!(rules(&h), [RELEASED_KEY_ON_PORT]);
    }

    #[test]
    fn a_deleted_key_on_a_port_is_a_violation() {
        let mut h = clean();
        h.push(Entry::DeleteYes {
            pkey: 0x1001,
            at: 455,
        });
        assert!(rules(&h).is_empty());
        h.push(read("n1", 470, &[0x1001]));
        assert_eq!(rules(&h), [DELETED_KEY_ON_PORT]);
    }

    #[test]
    fn stream_gaps_reused_seqs_and_lost_releases_are_violations() {
        let mut h = clean();
        h.push(event("n1", 5, 470, None));
        assert_eq!(rules(&h), [STREAM_GAP]);
        // After a resync the stream may start anywhere.
        let mut h = clean();
        h.push(Entry::Resync {
            node: "n1".into(),
            at: 465,
            why: "rewound".into(),
        });
        h.push(event("n1", 2, 300, Some(("i-1", 0x1001, RELEASED))));
        assert!(rules(&h).is_empty(), "{:?}", check(&h).violations);
        // ... but one seq of one epoch names one event.
        h.push(event("n1", 3, 999, None));
        assert_eq!(rules(&h), [STREAM_GAP]);
        // RELEASED is final within an epoch; a new epoch (a store put back) starts over.
        let mut h = clean();
        h.push(event("n1", 4, 470, Some(("i-1", 0x1001, 1))));
        assert_eq!(rules(&h), [RELEASE_LOST]);
        let mut h = clean();
        h.push(Entry::Resync {
            node: "n1".into(),
            at: 465,
            why: "new epoch".into(),
        });
        if let Entry::Event(mut e) = event("n1", 1 << 32, 470, Some(("i-1", 0x1001, 5))) {
            e.epoch = "e2".into();
            h.push(Entry::Event(e));
        }
        assert!(rules(&h).is_empty(), "{:?}", check(&h).violations);
    }

    #[test]
    fn a_standing_condition_without_an_explanation_is_a_violation() {
        let c = |who: &str, kind: &str, detail: &str| (who.into(), kind.into(), detail.into());
        let explained = [c("node1", "UNCLEAN_STOP", "unclean stop: new epoch")];
        assert!(unexplained(&explained, 7).is_empty());
        let bare = [
            explained[0].clone(),
            c("smhost", "PARTITIONS_FILE_UNCONFIRMED", " "),
        ];
        let v = unexplained(&bare, 7);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].rule, UNEXPLAINED_CONDITION);
        assert!(
            v[0].detail.contains("smhost") && v[0].detail.contains("PARTITIONS_FILE_UNCONFIRMED")
        );
    }
}
