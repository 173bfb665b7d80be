//! The aggregated view: per node, what its event stream said (durable part: cursor, ports,
//! instances) and how its follower fares (live part: reachability, lag, conditions). Pure: the
//! follower feeds it, the guard and the CLI read it.
//!
//! Rules: an event is applied only when its `log_epoch` is the cursor's and its `seq` is the
//! cursor's + 1 (the log is gap-free); anything else asks for a resync. A resync replaces the
//! node's instances by what ListAttachments lists, except that a RELEASED instance the listing
//! no longer shows (pruned, or the state directory was wiped) stays RELEASED: RELEASED is final.

use crate::proto::agent::{event, Attachment, AttachmentState, Event};
use crate::sm_state::SmState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A time in milliseconds since the Unix epoch as RFC 3339 UTC (`-` for none).
pub fn time_text(ms: Option<u64>) -> String {
    match ms {
        Some(ms) if ms > 0 => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + std::time::Duration::from_millis(ms))
                .to_string()
        }
        _ => "-".to_owned(),
    }
}

fn ts_ms(t: &Option<prost_types::Timestamp>) -> u64 {
    t.as_ref().map_or(0, |t| {
        (t.seconds.max(0) as u64) * 1000 + (t.nanos.max(0) as u64) / 1_000_000
    })
}

/// The short name of an attachment state (`ACTIVE`, ...).
pub fn state_name(state: i32) -> &'static str {
    AttachmentState::try_from(state)
        .unwrap_or(AttachmentState::Unspecified)
        .as_str_name()
        .trim_start_matches("ATTACHMENT_STATE_")
}

/// One instance's attachment as the node last reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceView {
    /// The instance.
    pub instance_id: String,
    /// Its partition.
    pub partition_id: String,
    /// The 16-bit P_Key value its ports hold.
    pub pkey_value: u32,
    /// `AttachmentState` as its protobuf number.
    pub state: i32,
    /// When the node reported this state (node's clock, ms since the Unix epoch).
    pub since_ms: u64,
    /// The node's last reason (FAILED reason or last transient error), empty when none.
    pub last_error: String,
    /// The log epoch this record comes from.
    pub epoch: String,
    /// The seq of the event that set this state (for a listed record: the resync's cursor).
    #[serde(default)]
    pub seq: u64,
}

impl InstanceView {
    /// Whether the node said RELEASED.
    pub fn released(&self) -> bool {
        self.state == AttachmentState::Released as i32
    }
}

/// What is persisted per node, in one record: the cursor and everything it summarises.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeDurable {
    /// The cursor's log epoch (empty: never synchronised).
    pub epoch: String,
    /// The cursor: the last applied event's seq.
    pub seq: u64,
    /// The node's fabric (from GetNode).
    pub fabric: String,
    /// Fabric port GUIDs the node reported (GetNode, and RELEASED evidence), lower-case.
    pub ports: BTreeSet<String>,
    /// Instances by id.
    pub instances: BTreeMap<String, InstanceView>,
}

/// Why an event was not applied: the follower must resynchronise.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Resync(pub String);

impl NodeDurable {
    /// Applies the next event of the stream, or says why the cursor cannot take it.
    pub fn apply(&mut self, ev: &Event) -> Result<(), Resync> {
        if ev.log_epoch != self.epoch {
            return Err(Resync(format!(
                "event epoch {} differs from the cursor's {}",
                ev.log_epoch, self.epoch
            )));
        }
        if ev.seq != self.seq + 1 {
            return Err(Resync(format!(
                "event seq {} does not follow the cursor's {}",
                ev.seq, self.seq
            )));
        }
        self.seq = ev.seq;
        if let Some(event::Kind::AttachmentChanged(c)) = &ev.kind {
            let since = ts_ms(&ev.time);
            let entry = self
                .instances
                .entry(c.instance_id.clone())
                .or_insert_with(|| InstanceView {
                    instance_id: c.instance_id.clone(),
                    partition_id: c.partition_id.clone(),
                    pkey_value: c.pkey_value,
                    state: 0,
                    since_ms: since,
                    last_error: String::new(),
                    epoch: ev.log_epoch.clone(),
                    seq: ev.seq,
                });
            entry.partition_id.clone_from(&c.partition_id);
            entry.pkey_value = c.pkey_value;
            entry.state = c.to;
            entry.since_ms = since;
            entry.epoch.clone_from(&ev.log_epoch);
            entry.seq = ev.seq;
            if !c.reason.is_empty() {
                entry.last_error.clone_from(&c.reason);
            }
            if let Some(evidence) = &c.evidence {
                for p in &evidence.ports {
                    self.ports.insert(p.port_guid.to_ascii_lowercase());
                }
            }
        }
        Ok(())
    }

    /// Replaces the node's state by a full listing taken at cursor (`epoch`, `seq`).
    pub fn replace(&mut self, epoch: &str, seq: u64, listed: &[Attachment]) {
        let mut instances: BTreeMap<String, InstanceView> = self
            .instances
            .iter()
            .filter(|(_, i)| i.released())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for a in listed {
            instances.insert(
                a.instance_id.clone(),
                InstanceView {
                    instance_id: a.instance_id.clone(),
                    partition_id: a
                        .partition
                        .as_ref()
                        .map(|p| p.id.clone())
                        .unwrap_or_default(),
                    pkey_value: a.pkey_value,
                    state: a.state,
                    since_ms: ts_ms(&a.updated),
                    last_error: a.reason.clone(),
                    epoch: epoch.to_owned(),
                    seq,
                },
            );
        }
        self.instances = instances;
        self.epoch = epoch.to_owned();
        self.seq = seq;
    }
}

/// How a node's follower fares (not persisted).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeLive {
    /// The event stream is open.
    pub reachable: bool,
    /// First failure since the last success (ms since the Unix epoch).
    pub unreachable_since_ms: Option<u64>,
    /// The last connection or stream error.
    pub last_error: String,
    /// The newest seq the node is known to have (GetNode at connect, or the last event).
    pub head_seq: u64,
    /// The follower caught up with the head it saw at connect, in this process.
    pub caught_up: bool,
    /// The follower heard from the node (answer or failure) at least once in this process.
    pub settled: bool,
    /// Standing conditions by kind (GetNode, ConditionChanged).
    pub conditions: BTreeMap<String, String>,
    /// The node's subnet manager acknowledged the last apply (GetNode, SubnetManagerChanged);
    /// false for a refusal and for no answer alike: [`NodeLive::sm_state`] tells them apart.
    pub sm_reachable: bool,
    /// What the node's subnet manager did with the last apply: reachable, refused (up, said
    /// no), unreachable (no answer) or unknown (GetNode, SubnetManagerChanged).
    pub sm_state: SmState,
    /// The node's word on the refusal or the missing answer; empty when acknowledged.
    pub sm_error: String,
    /// Full resyncs done in this process.
    pub resyncs: u64,
    /// Events applied in this process.
    pub events: u64,
}

/// One node in the view.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    /// Persisted part.
    pub durable: NodeDurable,
    /// Live part.
    pub live: NodeLive,
}

impl NodeView {
    /// Events the node has that the follower has not applied.
    pub fn lag(&self) -> u64 {
        self.live.head_seq.saturating_sub(self.durable.seq)
    }

    /// Applies the live side effects of an event (conditions, SM reachability, head).
    pub fn note_live(&mut self, ev: &Event) {
        self.live.head_seq = self.live.head_seq.max(ev.seq);
        self.live.events += 1;
        match &ev.kind {
            Some(event::Kind::ConditionChanged(c)) => {
                if let Some(cond) = &c.condition {
                    if c.active {
                        self.live
                            .conditions
                            .insert(cond.kind.clone(), cond.detail.clone());
                    } else {
                        self.live.conditions.remove(&cond.kind);
                    }
                }
            }
            Some(event::Kind::SubnetManagerChanged(s)) => {
                self.live.sm_reachable = s.reachable;
                self.live.sm_state = SmState::from_report(s.state, s.reachable);
                self.live.sm_error.clone_from(&s.error);
            }
            _ => {}
        }
    }
}

/// Every followed node's view.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Nodes by id.
    pub nodes: HashMap<String, NodeView>,
    /// Events applied in this process, all nodes.
    pub events_total: u64,
    /// The store's last write error; set, the guard refuses to decide.
    pub store_error: Option<String>,
}

impl View {
    /// Every (node, instance) of one partition.
    pub fn partition(&self, partition_id: &str) -> Vec<(&str, &InstanceView)> {
        let mut out: Vec<(&str, &InstanceView)> = self
            .nodes
            .iter()
            .flat_map(|(n, v)| {
                v.durable
                    .instances
                    .values()
                    .filter(move |i| i.partition_id == partition_id)
                    .map(move |i| (n.as_str(), i))
            })
            .collect();
        out.sort_by(|a, b| (a.0, &a.1.instance_id).cmp(&(b.0, &b.1.instance_id)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::{AttachmentChanged, Evidence, Partition, PortReading};

    fn changed(seq: u64, epoch: &str, instance: &str, to: AttachmentState) -> Event {
        Event {
            seq,
            time: Some(prost_types::Timestamp {
                seconds: seq as i64,
                nanos: 0,
            }),
            node_id: "n".into(),
            log_epoch: epoch.into(),
            kind: Some(event::Kind::AttachmentChanged(AttachmentChanged {
                instance_id: instance.into(),
                partition_id: "ibpart_a".into(),
                pkey_value: 0x8010,
                from: 0,
                to: to as i32,
                reason: String::new(),
                evidence: Some(Evidence {
                    ports: vec![PortReading {
                        port_guid: "0xABC".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ports: Vec::new(),
            })),
        }
    }

    #[test]
    fn applies_in_order_and_refuses_gaps_and_other_epochs() {
        let mut d = NodeDurable {
            epoch: "e1".into(),
            ..Default::default()
        };
        d.apply(&changed(1, "e1", "i1", AttachmentState::Pending))
            .unwrap();
        assert!(d
            .apply(&changed(3, "e1", "i1", AttachmentState::Active))
            .is_err());
        assert!(d
            .apply(&changed(2, "e2", "i1", AttachmentState::Active))
            .is_err());
        assert!(d
            .apply(&changed(1, "e1", "i1", AttachmentState::Active))
            .is_err());
        d.apply(&changed(2, "e1", "i1", AttachmentState::Released))
            .unwrap();
        assert_eq!(d.seq, 2);
        assert!(d.instances["i1"].released());
        assert_eq!(d.instances["i1"].since_ms, 2000);
        assert!(d.ports.contains("0xabc"));
    }

    #[test]
    fn resync_keeps_released_and_drops_unlisted_others() {
        let mut d = NodeDurable {
            epoch: "e1".into(),
            ..Default::default()
        };
        d.apply(&changed(1, "e1", "gone", AttachmentState::Released))
            .unwrap();
        d.apply(&changed(2, "e1", "lost", AttachmentState::Active))
            .unwrap();
        let listed = Attachment {
            instance_id: "new".into(),
            partition: Some(Partition {
                id: "ibpart_a".into(),
                ..Default::default()
            }),
            state: AttachmentState::Pending as i32,
            ..Default::default()
        };
        d.replace("e2", 7, &[listed]);
        assert_eq!((d.epoch.as_str(), d.seq), ("e2", 7));
        assert!(d.instances["gone"].released());
        assert!(!d.instances.contains_key("lost"));
        assert_eq!(d.instances["new"].state, AttachmentState::Pending as i32);
    }
}
