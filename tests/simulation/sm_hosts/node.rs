//! A node of the simulation: its attachments and what it says of them are decided by the node's
//! real code, not a model of it. An apply takes its set from `agent::desired` and its generation
//! from `SmKnowledge::begin_apply`, sends it to each of the node's endpoints through the SM
//! host's real `Partitions` service, and folds the answers with the remote backend's real
//! `fold_answers` (the host-set rule of `api::sm_v1::host_set`: identities, the known and fenced
//! hosts, `SM_HOST_SET_INCOMPLETE`); `SmKnowledge` records the outcome as the reconciler does.
//! After every step the node reads its port and `agent::plan` decides ACTIVE and RELEASED.
//! Restarts and the start check, which every apply passes through while it is not settled:
//! `node_life`.

use super::hosts::{host_name, Host};
use super::node_life::Life;
use fabric_agent::agent::{desired, plan, Observed, SmKnowledge};
use fabric_agent::api::sm_v1::client::{fold_answers, HostAnswer};
use fabric_agent::domain::{
    set_digest, ApplyLedger, Attachment, AttachmentState, Guid, InstanceId, Inventory, LinkLayer,
    Membership, NodeId, PKey, PKeyValue, Partition, PortInfo, PortState,
};
use fabric_agent::sm::SmError;
use std::collections::{BTreeMap, BTreeSet};

/// What an apply came to, for the trace.
pub enum Outcome {
    Acknowledged { by: Vec<usize> },
    NotAcknowledged(String),
}

pub struct Node {
    pub id: NodeId,
    pub guid: Guid,
    /// The SM hosts listed in its `endpoints` (a stale list misses one).
    pub endpoints: Vec<usize>,
    /// Hosts this node cannot reach.
    pub cut: BTreeSet<usize>,
    /// On plaintext, the name each endpoint last stated (the remote backend keeps it).
    pub remembered: BTreeMap<usize, String>,
    pub attachments: Vec<Attachment>,
    pub knows: SmKnowledge,
    pub ledger: ApplyLedger,
    /// Hosts whose answer was positive in the apply last acknowledged, and its step.
    pub acked_by: (Vec<usize>, usize),
    /// Step at which each ACTIVE attachment's key was acknowledged (instance -> step, hosts).
    pub active_since: BTreeMap<String, (usize, Vec<usize>)>,
    /// Keys reported RELEASED and not attached again since (the control plane's view: a
    /// restore of the node does not take it back).
    pub released: BTreeSet<u32>,
    /// Counted RELEASED transitions.
    pub released_count: usize,
    pub active_count: usize,
    next_instance: usize,
    /// The rule switched off to show the oracle fails: a host-set problem still counts.
    pub ignore_host_set: bool,
    /// Restarts, the start check, the control plane's view (`node_life`).
    pub life: Life,
}

/// The partition key `key` (a valid one).
pub fn pkey(key: u32) -> PKey {
    PKey::new(key).unwrap()
}

fn partition(key: u32) -> Partition {
    Partition::new(
        &format!("ibpart_{key:x}"),
        &format!("p{key:x}"),
        "ws",
        "acct",
        "fab1",
        key,
    )
    .unwrap()
}

impl Node {
    pub fn new(i: usize, endpoints: Vec<usize>) -> Node {
        Node {
            id: NodeId::parse(&format!("node{i}")).unwrap(),
            guid: Guid(0x100 + i as u64),
            endpoints,
            cut: BTreeSet::new(),
            remembered: BTreeMap::new(),
            attachments: Vec::new(),
            knows: SmKnowledge::resume(&ApplyLedger::default()),
            ledger: ApplyLedger::default(),
            acked_by: (Vec::new(), 0),
            active_since: BTreeMap::new(),
            released: BTreeSet::new(),
            released_count: 0,
            active_count: 0,
            next_instance: 0,
            ignore_host_set: false,
            life: Life::default(),
        }
    }

    /// The port as the node reads it: the default partition and every tenant key `held`.
    pub fn inventory(&self, held: &BTreeMap<u32, bool>) -> Inventory {
        let mut pkeys = vec![PKeyValue::DEFAULT_LIMITED];
        pkeys.extend(held.iter().map(|(k, full)| {
            PKey::new(*k).unwrap().value(if *full {
                Membership::Full
            } else {
                Membership::Limited
            })
        }));
        pkeys.resize(16, PKeyValue(0));
        Inventory {
            ports: vec![PortInfo {
                device: "hca".into(),
                port_number: 1,
                port_guid: self.guid,
                state: PortState::Active,
                link_layer: LinkLayer::Infiniband,
                pkeys,
                fabric_port: true,
                ..Default::default()
            }],
        }
    }

    /// Whether the node has an attachment (in any state) of `key`.
    pub fn has(&self, key: u32) -> bool {
        self.attachments
            .iter()
            .any(|a| u32::from(u16::from(a.partition.pkey)) == key)
    }

    /// The control plane attaches a new instance with `key`.
    pub fn attach(&mut self, key: u32) {
        self.next_instance += 1;
        let id = format!("vm{}", self.next_instance);
        self.life.cp.wanted.insert(id.clone(), key);
        self.create(&id, key);
        // The key is covered in the ledger with the attach (`Agent::attach`).
        if let Some(l) = SmKnowledge::ledger_for_attach(&self.ledger, pkey(key)) {
            self.ledger = l;
        }
    }

    /// A new attachment of instance `id` with `key` (admission's `Create`).
    pub fn create(&mut self, id: &str, key: u32) {
        self.released.remove(&key);
        self.attachments.push(Attachment {
            grant: None,
            instance_id: InstanceId::parse(id).unwrap(),
            partition: partition(key),
            membership: Membership::Full,
            state: AttachmentState::Pending,
            reason: String::new(),
            created_unix_ns: 0,
            updated_unix_ns: 0,
            ports: Vec::new(),
            named_ports: false,
            restored: None,
            evidence: None,
        });
    }

    /// The control plane releases the instance it attached with `key`; false when it wants
    /// none. The node's attachment of it goes RELEASING (a restored one is settled by it).
    pub fn release(&mut self, key: u32) -> bool {
        let Some(id) = self
            .life
            .cp
            .wanted
            .iter()
            .find(|(_, k)| **k == key)
            .map(|(id, _)| id.clone())
        else {
            return false;
        };
        self.life.cp.wanted.remove(&id);
        self.life.cp.terminated.insert(id.clone(), key);
        self.begin_release(&id);
        true
    }

    /// The control plane's release of instance `id` reaches the node: a live attachment of it
    /// goes RELEASING (withheld or not). Returns whether one did.
    pub fn begin_release(&mut self, id: &str) -> bool {
        let Some(a) = self
            .attachments
            .iter_mut()
            .find(|a| a.instance_id.as_str() == id && !a.state.is_released_or_releasing())
        else {
            return false;
        };
        a.state = AttachmentState::Releasing;
        a.restored = None;
        a.reason.clear();
        a.evidence = None;
        true
    }

    /// Whether an apply is owed: the last one was not acknowledged, or the desired set differs
    /// from the acknowledged one.
    pub fn owes_apply(&self, held: &BTreeMap<u32, bool>) -> bool {
        let inv = self.inventory(held);
        let want = desired(&self.id, vec![self.guid], Some(&inv), &self.attachments);
        self.life.check.is_some()
            || self.life.force_apply
            || self.knows.unacked()
            || self.knows.ack().is_none_or(|a| a.set.keys != want.keys)
    }

    /// One pass that applies: the start check while it is not settled (`node_life`), then one
    /// apply of what may be sent to every endpoint, judged by the node's real fold. The trace
    /// lines of the check go to `lines`.
    pub async fn apply(
        &mut self,
        hosts: &[Host],
        held: &BTreeMap<u32, bool>,
        step: usize,
        lines: &mut Vec<String>,
    ) -> Outcome {
        self.life.last_pass = step;
        lines.extend(self.check_restored(held));
        let inv = self.inventory(held);
        let mut set = desired(&self.id, vec![self.guid], Some(&inv), &self.attachments);
        if self.life.check.is_some() {
            let (changed, checked) = self.start_check(hosts, held, step, &set).await;
            lines.extend(checked);
            if changed {
                set = desired(&self.id, vec![self.guid], Some(&inv), &self.attachments);
            }
            match self.sendable(&set, step) {
                Some(s) => set = s,
                None => {
                    return Outcome::NotAcknowledged(
                        "start check: no SM host said what it stores yet, nothing sent".into(),
                    )
                }
            }
        }
        let (generation, ledger) = self.knows.begin_apply(&self.ledger, &set);
        if let Some(l) = ledger {
            self.ledger = l;
        }
        self.knows.carrying(&set, generation);
        if let Some(check) = &mut self.life.check {
            check.life.sent.insert((generation, set_digest(&set)));
        }
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|h| format!("http://{}:7443", host_name(*h)))
            .collect();
        let mut answers = Vec::with_capacity(self.endpoints.len());
        let mut positive = Vec::new();
        for (e, h) in self.endpoints.iter().enumerate() {
            let answer = if self.cut.contains(h) {
                Err(tonic::Status::unavailable("node cut from the SM host"))
            } else {
                hosts[*h].set(&set, generation).await
            };
            if let Ok(reply) = &answer {
                positive.push(*h);
                if !reply.host.is_empty() {
                    self.remembered.insert(*h, reply.host.clone());
                }
            }
            answers.push(HostAnswer {
                endpoint: &endpoints[e],
                verified: None,
                remembered: self.remembered.get(h).cloned(),
                answer,
            });
        }
        let (outcome, problems) = fold_answers(answers, generation);
        let counted = match outcome {
            Ok(o) => Ok(o.acknowledged_by),
            // The mutation: a host-set problem alone never blocks.
            Err(SmError::Refused(_))
                if self.ignore_host_set
                    && !problems.is_empty()
                    && positive.len() == self.endpoints.len() =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        };
        match counted {
            Ok(hosts) => {
                self.knows.acknowledged_by(generation, set, 0, hosts);
                if let Some(l) = self.knows.ledger_after_ack(&self.ledger) {
                    self.ledger = l;
                }
                self.acked_by = (positive.clone(), step);
                self.life.force_apply = false;
                Outcome::Acknowledged { by: positive }
            }
            Err(SmError::StaleGeneration { stored, .. }) => {
                self.knows.move_past(stored);
                // Before this life's first acknowledgement a newer generation proves the store
                // lost writes (`runner::apply`, model): raised, and the marks settled from
                // this read (the runner's next pass, at once).
                if self.knows.ack().is_none() && !self.life.rolled_back_stands {
                    self.knows.leap_past_lost_life(stored);
                    self.raise_rolled_back();
                    lines.extend(self.check_restored(held));
                }
                Outcome::NotAcknowledged(format!("stale generation, the SM hosts hold {stored}"))
            }
            Err(e) => Outcome::NotAcknowledged(e.to_string()),
        }
    }

    /// Reads the port and commits what `plan` decides; returns the trace lines.
    pub fn reconcile(&mut self, held: &BTreeMap<u32, bool>) -> Vec<String> {
        let inv = self.inventory(held);
        let gone = BTreeSet::new();
        let transitions = plan(
            &self.attachments,
            Observed {
                sm: &self.knows,
                inventory: Some(&inv),
                read_after_ack: true,
                read_unix_ns: 0,
                posture_ok: true,
                gone: &gone,
            },
        );
        let mut lines = Vec::new();
        for t in &transitions {
            let a = &mut self.attachments[t.index];
            a.state = t.to;
            let key = u32::from(u16::from(a.partition.pkey));
            let instance = a.instance_id.as_str().to_owned();
            match t.to {
                AttachmentState::Active => {
                    self.active_count += 1;
                    self.active_since
                        .insert(instance, (self.acked_by.1, self.acked_by.0.clone()));
                    lines.push(format!("{} {key:#06x} ACTIVE", self.id.as_str()));
                }
                AttachmentState::Drifted => {
                    self.active_since.remove(&instance);
                }
                AttachmentState::Released => {
                    self.released_count += 1;
                    // Guarded until attached again: not when the control plane already wants
                    // another instance with the key (a restore and the resync's attach can put
                    // two on one node).
                    if !self.life.cp.wanted.values().any(|k| *k == key) {
                        self.released.insert(key);
                    }
                    lines.push(format!("{} {key:#06x} RELEASED", self.id.as_str()));
                }
                _ => {}
            }
        }
        self.attachments
            .retain(|a| a.state != AttachmentState::Released);
        self.knows.forget_released();
        // The pass's conditions: `STORE_ROLLED_BACK` stands until this life's first
        // acknowledgement (`agent::conditions`).
        if self.knows.ack().is_some() {
            self.life.rolled_back_stands = false;
        }
        lines
    }
}
