//! Text shapes of the CLI's output.

use crate::guard::Blocker;
use crate::proto::agent::PortState;
use crate::proto::agent::{event, Attachment, AttachmentPort, Event, Membership};
use crate::registry::Registry;
use crate::sm_state::SmState;
use crate::store::AttachRecord;
use crate::view::{state_name, time_text, NodeView, View};
use serde_json::{json, Value};
use std::fmt::Write;

/// `status`: one line per node.
pub fn status(registry: &Registry, view: &View) -> String {
    let mut out =
        String::from("NODE\tREACHABLE\tSUBNET MANAGER\tEPOCH\tCURSOR\tLAG\tRESYNCS\tCONDITIONS\n");
    for n in &registry.nodes {
        let v = view.nodes.get(&n.id).cloned().unwrap_or_default();
        let reach = if v.live.reachable {
            "yes".to_owned()
        } else if let Some(since) = v.live.unreachable_since_ms {
            format!(
                "no since {} ({})",
                time_text(Some(since)),
                v.live.last_error
            )
        } else {
            "unknown".to_owned()
        };
        let conditions = if v.live.conditions.is_empty() {
            "-".to_owned()
        } else {
            v.live
                .conditions
                .iter()
                .map(|(k, d)| format!("{k}: {d}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let epoch = if v.durable.epoch.is_empty() {
            "-"
        } else {
            &v.durable.epoch
        };
        let _ = writeln!(
            out,
            "{}\t{reach}\t{}\t{epoch}\t{}\t{}\t{}\t{conditions}",
            n.id,
            sm_text(v.live.sm_state, &v.live.sm_error),
            v.durable.seq,
            v.lag(),
            v.live.resyncs
        );
    }
    out
}

/// A node's subnet-manager state with the node's word on it: `REACHABLE`, `REFUSED (why)`,
/// `UNREACHABLE (why)`, `UNKNOWN`.
fn sm_text(state: SmState, error: &str) -> String {
    if error.is_empty() || state == SmState::Reachable {
        state.to_string()
    } else {
        format!("{state} ({error})")
    }
}

/// `status -o json`: one object per node, in the nodes file's order.
pub fn status_json(registry: &Registry, view: &View) -> Value {
    let nodes: Vec<Value> = registry
        .nodes
        .iter()
        .map(|n| node_json(&n.id, &view.nodes.get(&n.id).cloned().unwrap_or_default()))
        .collect();
    json!({ "nodes": nodes })
}

fn node_json(id: &str, v: &NodeView) -> Value {
    json!({
        "node": id,
        "reachable": v.live.reachable,
        "unreachable_since": v.live.unreachable_since_ms.map(|ms| time_text(Some(ms))),
        "last_error": v.live.last_error,
        "log_epoch": v.durable.epoch,
        "cursor": v.durable.seq,
        "lag": v.lag(),
        "resyncs": v.live.resyncs,
        "conditions": v.live.conditions,
        "subnet_manager": {
            "state": v.live.sm_state,
            "reachable": v.live.sm_reachable,
            "error": v.live.sm_error,
        },
    })
}

/// `partition P`: every instance of the partition the nodes report, and ledger entries no node
/// reports.
pub fn partition(partition_id: &str, ledger: &[AttachRecord], view: &View) -> String {
    let mut out = String::from("NODE\tINSTANCE\tSTATE\tSINCE\tPKEY\tLAST ERROR\n");
    let listed = view.partition(partition_id);
    for (node, i) in &listed {
        let _ = writeln!(
            out,
            "{node}\t{}\t{}\t{}\t{:#06x}\t{}",
            i.instance_id,
            state_name(i.state),
            time_text(Some(i.since_ms)),
            i.pkey_value,
            if i.last_error.is_empty() {
                "-"
            } else {
                &i.last_error
            }
        );
    }
    for a in ledger {
        if !listed
            .iter()
            .any(|(n, i)| *n == a.node_id && i.instance_id == a.instance_id)
        {
            let _ = writeln!(
                out,
                "{}\t{}\tUNKNOWN\t-\t{:#06x}\tattached through this client, not reported by the node",
                a.node_id, a.instance_id, a.pkey
            );
        }
    }
    out
}

/// `partition P -o json`: the same rows as [`partition`], one object each; `reported` is false
/// for a ledger entry no node reports.
pub fn partition_json(partition_id: &str, ledger: &[AttachRecord], view: &View) -> Value {
    let listed = view.partition(partition_id);
    let mut instances: Vec<Value> = listed
        .iter()
        .map(|(node, i)| {
            json!({
                "node": node,
                "instance_id": i.instance_id,
                "state": state_name(i.state),
                "since": time_text(Some(i.since_ms)),
                "pkey": format!("{:#06x}", i.pkey_value),
                "last_error": i.last_error,
                "reported": true,
            })
        })
        .collect();
    for a in ledger {
        if !listed
            .iter()
            .any(|(n, i)| *n == a.node_id && i.instance_id == a.instance_id)
        {
            instances.push(json!({
                "node": a.node_id,
                "instance_id": a.instance_id,
                "state": "UNKNOWN",
                "since": null,
                "pkey": format!("{:#06x}", a.pkey),
                "last_error": "attached through this client, not reported by the node",
                "reported": false,
            }));
        }
    }
    json!({ "partition_id": partition_id, "instances": instances })
}

/// One blocker of `may-delete -o json`: its fields and the sentence the text form prints.
pub fn blocker_json(b: &Blocker) -> Value {
    let fields = match b {
        Blocker::Instance {
            instance_id,
            node_id,
            state,
            since_ms,
            last_error,
            unreachable_since_ms,
            lag,
        } => json!({
            "kind": "instance",
            "instance_id": instance_id,
            "node": node_id,
            "state": state,
            "since": since_ms.map(|ms| time_text(Some(ms))),
            "last_error": last_error,
            "unreachable_since": unreachable_since_ms.map(|ms| time_text(Some(ms))),
            "lag": lag,
        }),
        Blocker::FabricHolds {
            port_guid,
            node_id,
            pkey,
            fabric,
            source,
        } => json!({
            "kind": "fabric_holds",
            "port_guid": port_guid,
            "node": node_id,
            "pkey": format!("{pkey:#06x}"),
            "fabric": fabric,
            "source": source,
        }),
    };
    let mut fields = fields;
    fields["text"] = Value::String(b.to_string());
    fields
}

/// One attachment, for attach and release: instance, partition, state, P_Key (with the
/// membership bit), the ports it covers, reason.
pub fn attachment_line(a: &Attachment) -> String {
    format!(
        "{}\t{}\t{}\t{:#06x}\t{}\t{}",
        a.instance_id,
        a.partition.as_ref().map_or("", |p| p.id.as_str()),
        state_name(a.state),
        a.pkey_value,
        ports_text(a),
        if a.reason.is_empty() { "-" } else { &a.reason }
    )
}

/// The ports an attachment covers, comma-separated (`sim0/1,sim0/2`, or the GUID of a port
/// the node names by GUID only); `-` when the node recorded none, with `(whole node)` after a
/// whole-node attachment's ports (a fabric port appearing later joins it too).
fn ports_text(a: &Attachment) -> String {
    let ports = if a.ports.is_empty() {
        "-".to_owned()
    } else {
        a.ports.iter().map(port_name).collect::<Vec<_>>().join(",")
    };
    if a.named_ports {
        ports
    } else {
        format!("{ports} (whole node)")
    }
}

fn port_name(p: &AttachmentPort) -> String {
    if p.device.is_empty() {
        p.port_guid.clone()
    } else {
        format!("{}/{}", p.device, p.port_number)
    }
}

/// One attachment as JSON, for attach and release with `-o json`.
pub fn attachment_json(a: &Attachment) -> Value {
    let partition = a.partition.clone().unwrap_or_default();
    let membership = Membership::try_from(a.membership)
        .unwrap_or(Membership::Unspecified)
        .as_str_name()
        .trim_start_matches("MEMBERSHIP_");
    let ports: Vec<Value> = a
        .ports
        .iter()
        .map(|p| {
            json!({
                "name": port_name(p),
                "device": p.device,
                "port_number": p.port_number,
                "port_guid": p.port_guid,
            })
        })
        .collect();
    json!({
        "instance_id": a.instance_id,
        "partition_id": partition.id,
        "state": state_name(a.state),
        "pkey": format!("{:#06x}", a.pkey_value),
        "pkey_base": format!("{:#06x}", partition.pkey),
        "membership": membership,
        "ports": ports,
        "named_ports": a.named_ports,
        "reason": a.reason,
    })
}

/// One event of `watch`.
pub fn event_line(node: &str, ev: &Event) -> String {
    format!("{node}\t{}:{}\t{}", ev.log_epoch, ev.seq, event_text(ev))
}

/// One event of `watch -o json`: one JSON object per line, with the same description.
pub fn event_json(node: &str, ev: &Event) -> Value {
    json!({
        "node": node,
        "log_epoch": ev.log_epoch,
        "seq": ev.seq,
        "kind": event_kind(ev),
        "event": event_text(ev),
    })
}

/// The kind of an event, for `watch -o json`.
fn event_kind(ev: &Event) -> &'static str {
    match &ev.kind {
        Some(event::Kind::AttachmentChanged(_)) => "attachment",
        Some(event::Kind::PkeyTableChanged(_)) => "pkey_table",
        Some(event::Kind::PortStateChanged(_)) => "port_state",
        Some(event::Kind::SubnetManagerChanged(_)) => "subnet_manager",
        Some(event::Kind::ForeignPkey(_)) => "foreign_pkey",
        Some(event::Kind::ConditionChanged(_)) => "condition",
        None => "unknown",
    }
}

/// What an event says, in words.
fn event_text(ev: &Event) -> String {
    match &ev.kind {
        Some(event::Kind::AttachmentChanged(c)) => format!(
            "attachment {} {} {} -> {}{}",
            c.instance_id,
            c.partition_id,
            state_name(c.from),
            state_name(c.to),
            if c.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.reason)
            }
        ),
        Some(event::Kind::PkeyTableChanged(p)) => format!(
            "pkey table {} added {:#06x?} removed {:#06x?}",
            p.port_guid, p.added, p.removed
        ),
        Some(event::Kind::PortStateChanged(p)) => {
            let name = |s: i32| {
                PortState::try_from(s)
                    .unwrap_or(PortState::Unspecified)
                    .as_str_name()
                    .trim_start_matches("PORT_STATE_")
            };
            format!(
                "port {} state {} -> {}",
                p.port_guid,
                name(p.from),
                name(p.to)
            )
        }
        Some(event::Kind::SubnetManagerChanged(s)) => format!(
            "subnet manager {} {}",
            s.backend,
            sm_text(SmState::from_report(s.state, s.reachable), &s.error)
        ),
        Some(event::Kind::ForeignPkey(f)) => {
            format!("foreign pkey {:#06x} on {}", f.pkey_value, f.port_guid)
        }
        Some(event::Kind::ConditionChanged(c)) => format!(
            "condition {} active={}",
            c.condition.as_ref().map_or("", |c| c.kind.as_str()),
            c.active
        ),
        None => "unknown event".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{attachment_json, attachment_line, event_json, event_line};
    use crate::proto::agent::{event, AttachmentChanged, Event};
    use crate::proto::agent::{Attachment, AttachmentPort, AttachmentState, Membership, Partition};

    fn attachment(named_ports: bool, ports: Vec<AttachmentPort>) -> Attachment {
        Attachment {
            instance_id: "vm-1".into(),
            partition: Some(Partition {
                id: "ibpart_a".into(),
                pkey: 0x0a12,
                ..Default::default()
            }),
            membership: Membership::Limited as i32,
            state: AttachmentState::Pending as i32,
            reason: "waiting".into(),
            pkey_value: 0x0a12,
            ports,
            named_ports,
            ..Default::default()
        }
    }

    fn port(device: &str, n: u32, guid: &str) -> AttachmentPort {
        AttachmentPort {
            device: device.into(),
            port_number: n,
            port_guid: guid.into(),
        }
    }

    #[test]
    fn the_line_names_the_ports_covered_and_says_whole_node() {
        let named = attachment(true, vec![port("mlx5_0", 1, "0x1"), port("", 0, "0x2")]);
        assert_eq!(
            attachment_line(&named),
            "vm-1\tibpart_a\tPENDING\t0x0a12\tmlx5_0/1,0x2\twaiting"
        );
        let whole = attachment(false, vec![port("mlx5_0", 1, "0x1")]);
        assert_eq!(
            attachment_line(&whole),
            "vm-1\tibpart_a\tPENDING\t0x0a12\tmlx5_0/1 (whole node)\twaiting"
        );
        let old = attachment(false, Vec::new());
        assert!(attachment_line(&old).contains("\t- (whole node)\t"));
        let doc = attachment_json(&named);
        assert_eq!(doc["membership"], "LIMITED");
        assert_eq!(doc["pkey"], "0x0a12");
        assert_eq!(doc["ports"][1]["name"], "0x2");
        assert_eq!(doc["ports"][0]["port_guid"], "0x1");
    }

    #[test]
    fn a_watched_event_is_one_json_object_with_the_text_line_s_words() {
        let ev = Event {
            log_epoch: "e1".into(),
            seq: 7,
            kind: Some(event::Kind::AttachmentChanged(AttachmentChanged {
                instance_id: "vm-1".into(),
                partition_id: "ibpart_a".into(),
                from: AttachmentState::Releasing as i32,
                to: AttachmentState::Released as i32,
                ..Default::default()
            })),
            ..Default::default()
        };
        let line = event_line("node1", &ev);
        assert_eq!(
            line,
            "node1\te1:7\tattachment vm-1 ibpart_a RELEASING -> RELEASED"
        );
        let doc = event_json("node1", &ev);
        assert_eq!(doc["node"], "node1");
        assert_eq!(doc["seq"], 7);
        assert_eq!(doc["kind"], "attachment");
        assert_eq!(
            doc["event"],
            "attachment vm-1 ibpart_a RELEASING -> RELEASED"
        );
        // One line on stdout: the compact form has no newline.
        assert!(!doc.to_string().contains('\n'));
    }
}
