//! Human-readable tables and JSON for the CLI.

use crate::proto::agent as pb;
use serde_json::{json, Value};
use std::io::Write;

/// Prints a line; a closed pipe (`| head`) ends the program quietly instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

fn state_name(v: i32) -> &'static str {
    pb::AttachmentState::try_from(v)
        .map(|s| s.as_str_name().trim_start_matches("ATTACHMENT_STATE_"))
        .unwrap_or("?")
}

fn port_state(v: i32) -> &'static str {
    pb::PortState::try_from(v)
        .map(|s| s.as_str_name().trim_start_matches("PORT_STATE_"))
        .unwrap_or("?")
}

fn link_layer(v: i32) -> &'static str {
    pb::LinkLayer::try_from(v)
        .map(|s| s.as_str_name().trim_start_matches("LINK_LAYER_"))
        .unwrap_or("?")
}

fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| {
            let d = std::time::Duration::new(
                u64::try_from(t.seconds).ok()?,
                u32::try_from(t.nanos).ok()?,
            );
            Some(humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + d).to_string())
        })
        .unwrap_or_default()
}

fn port_json(p: &pb::Port) -> Value {
    json!({
        "device": p.device, "port": p.port_number, "port_guid": p.port_guid, "node_guid": p.node_guid,
        "lid": p.lid, "sm_lid": p.sm_lid, "state": port_state(p.state), "link_layer": link_layer(p.link_layer),
        "fabric_port": p.fabric_port, "pkey_table_size": p.pkey_table_size,
        "pkeys": p.pkeys.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>(),
    })
}

fn print_ports(ports: &[pb::Port]) {
    say!(
        "{:<10} {:>4} {:<18} {:>5} {:>6} {:<8} {:<10} {:<6} P_KEYS",
        "DEVICE",
        "PORT",
        "PORT_GUID",
        "LID",
        "SM_LID",
        "STATE",
        "LINK",
        "FABRIC"
    );
    for p in ports {
        let keys: Vec<String> = p.pkeys.iter().map(|k| format!("{k:#06x}")).collect();
        say!(
            "{:<10} {:>4} {:<18} {:>5} {:>6} {:<8} {:<10} {:<6} {} ({} of {} slots)",
            p.device,
            p.port_number,
            p.port_guid,
            p.lid,
            p.sm_lid,
            port_state(p.state),
            link_layer(p.link_layer),
            if p.fabric_port { "yes" } else { "no" },
            keys.join(" "),
            p.pkeys.len(),
            p.pkey_table_size
        );
    }
}

/// Prints a node view.
pub fn node(n: &pb::GetNodeResponse, json: bool) {
    if json {
        let sm = n.subnet_manager.clone().unwrap_or_default();
        let v = json!({
            "node_id": n.node_id, "fabric": n.fabric, "agent_version": n.agent_version,
            "observer": n.observer, "observer_reason": n.observer_reason, "pkey_capacity": n.pkey_capacity,
            "subnet_manager": {"backend": sm.backend, "reachable": sm.reachable, "last_error": sm.last_error, "applies": sm.applies,
                               "generation": sm.generation,
                               "in_doubt_pkeys": sm.in_doubt_pkeys.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>()},
            "conditions": n.conditions.iter().map(|c| json!({"kind": c.kind, "detail": c.detail})).collect::<Vec<_>>(),
            "attachment_counts": n.attachment_counts,
            "first_event_seq": n.first_event_seq, "last_event_seq": n.last_event_seq,
            "ports": n.ports.iter().map(port_json).collect::<Vec<_>>(),
        });
        say!("{v}");
        return;
    }
    let sm = n.subnet_manager.clone().unwrap_or_default();
    say!(
        "node {}  fabric {}  agent {}",
        n.node_id,
        n.fabric,
        n.agent_version
    );
    say!("observer {} ({})", n.observer, n.observer_reason);
    say!(
        "subnet manager {}: {}{}  (applies {})",
        sm.backend,
        if sm.reachable {
            "reachable"
        } else {
            "UNREACHABLE"
        },
        if sm.last_error.is_empty() {
            String::new()
        } else {
            format!(" — {}", sm.last_error)
        },
        sm.applies
    );
    if !sm.in_doubt_pkeys.is_empty() {
        let keys: Vec<String> = sm
            .in_doubt_pkeys
            .iter()
            .map(|k| format!("{k:#06x}"))
            .collect();
        say!(
            "in doubt: {} (an apply carrying them got no answer; not RELEASED until a set without them is acknowledged)",
            keys.join(", ")
        );
    }
    for c in &n.conditions {
        say!("CONDITION {}: {}", c.kind, c.detail);
    }
    let mut counts: Vec<String> = n
        .attachment_counts
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|(s, c)| format!("{s}={c}"))
        .collect();
    counts.sort();
    say!(
        "attachments {}  capacity {} keys/port  events {}..{}",
        if counts.is_empty() {
            "none".into()
        } else {
            counts.join(" ")
        },
        n.pkey_capacity,
        n.first_event_seq,
        n.last_event_seq
    );
    print_ports(&n.ports);
}

/// Prints ports read locally.
pub fn ports(observer: &str, ports: &[pb::Port], json: bool) {
    if json {
        say!(
            "{}",
            json!({"observer": observer, "ports": ports.iter().map(port_json).collect::<Vec<_>>()})
        );
    } else {
        say!("observer {observer}");
        print_ports(ports);
    }
}

/// Prints attachments.
pub fn attachments(list: &[pb::Attachment], json: bool) {
    if json {
        let v: Vec<Value> = list
            .iter()
            .map(|a| {
                let p = a.partition.clone().unwrap_or_default();
                json!({
                    "instance_id": a.instance_id, "state": state_name(a.state), "reason": a.reason,
                    "pkey_value": format!("{:#06x}", a.pkey_value),
                    "membership": if a.membership == pb::Membership::Limited as i32 { "limited" } else { "full" },
                    "partition": {"id": p.id, "name": p.name, "workspace": p.workspace, "account": p.account, "fabric": p.fabric, "pkey": format!("{:#06x}", p.pkey)},
                    "created": time(&a.created), "updated": time(&a.updated),
                })
            })
            .collect();
        say!("{}", Value::Array(v));
        return;
    }
    say!(
        "{:<24} {:<24} {:<8} {:<12} REASON",
        "INSTANCE",
        "PARTITION",
        "P_KEY",
        "STATE"
    );
    for a in list {
        let p = a.partition.clone().unwrap_or_default();
        say!(
            "{:<24} {:<24} {:<8} {:<12} {}",
            a.instance_id,
            p.id,
            format!("{:#06x}", a.pkey_value),
            state_name(a.state),
            a.reason
        );
    }
}

/// Prints one event.
pub fn event(e: &pb::Event, json: bool) {
    use pb::event::Kind;
    let (kind, detail) = match &e.kind {
        Some(Kind::AttachmentChanged(a)) => (
            "attachment",
            json!({"instance_id": a.instance_id, "partition_id": a.partition_id, "pkey_value": format!("{:#06x}", a.pkey_value),
                   "from": state_name(a.from), "to": state_name(a.to), "reason": a.reason}),
        ),
        Some(Kind::PkeyTableChanged(p)) => (
            "pkey_table",
            json!({"device": p.device, "port": p.port_number, "port_guid": p.port_guid,
                   "added": p.added.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>(),
                   "removed": p.removed.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>()}),
        ),
        Some(Kind::PortStateChanged(p)) => (
            "port_state",
            json!({"device": p.device, "port": p.port_number, "port_guid": p.port_guid, "from": port_state(p.from), "to": port_state(p.to)}),
        ),
        Some(Kind::SubnetManagerChanged(s)) => (
            "subnet_manager",
            json!({"backend": s.backend, "reachable": s.reachable, "error": s.error}),
        ),
        Some(Kind::ForeignPkey(f)) => (
            "foreign_pkey",
            json!({"device": f.device, "port": f.port_number, "port_guid": f.port_guid, "pkey_value": format!("{:#06x}", f.pkey_value)}),
        ),
        Some(Kind::ConditionChanged(c)) => {
            let cond = c.condition.clone().unwrap_or_default();
            (
                "condition",
                json!({"condition": cond.kind, "active": c.active, "detail": cond.detail}),
            )
        }
        None => ("unknown", Value::Null),
    };
    if json {
        say!(
            "{}",
            json!({"seq": e.seq, "time": time(&e.time), "node_id": e.node_id, "kind": kind, "detail": detail})
        );
    } else {
        say!(
            "{:>6} {} {} {:<15} {}",
            e.seq,
            time(&e.time),
            e.node_id,
            kind,
            detail
        );
    }
}
