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
        "pkeys": keys(&p.pkeys),
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
        let keys = keys(&p.pkeys);
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
        say!("{}", node_json(n));
    } else {
        node_table(n);
    }
}

fn node_json(n: &pb::GetNodeResponse) -> Value {
    let sm = n.subnet_manager.clone().unwrap_or_default();
    json!({
        "node_id": n.node_id, "fabric": n.fabric, "agent_version": n.agent_version,
        "observer": n.observer, "observer_reason": n.observer_reason, "pkey_capacity": n.pkey_capacity,
        "subnet_manager": {"backend": sm.backend, "reachable": sm.reachable, "last_error": sm.last_error, "applies": sm.applies,
                           "generation": sm.generation,
                           "in_doubt_pkeys": keys(&sm.in_doubt_pkeys)},
        "conditions": n.conditions.iter().map(|c| json!({"kind": c.kind, "detail": c.detail})).collect::<Vec<_>>(),
        "attachment_counts": n.attachment_counts,
        "first_event_seq": n.first_event_seq, "last_event_seq": n.last_event_seq,
        "ports": n.ports.iter().map(port_json).collect::<Vec<_>>(),
    })
}

fn node_table(n: &pb::GetNodeResponse) {
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
        reachability(sm.reachable),
        suffix(" — ", &sm.last_error),
        sm.applies
    );
    if !sm.in_doubt_pkeys.is_empty() {
        say!(
            "in doubt: {} (an apply carrying them got no answer; not RELEASED until a set without them is acknowledged)",
            keys(&sm.in_doubt_pkeys).join(", ")
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

/// Prints one JSON value on a line (a closed pipe ends the program quietly).
pub fn json(v: &Value) {
    say!("{v}");
}

/// Tables fit this many columns; the last column (a reason or an event's summary) is cut to fit.
const WIDTH: usize = 100;

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn membership_name(v: i32) -> &'static str {
    if v == pb::Membership::Limited as i32 {
        "limited"
    } else {
        "full"
    }
}

fn attachment_json(a: &pb::Attachment) -> Value {
    let p = a.partition.clone().unwrap_or_default();
    json!({
        "instance_id": a.instance_id, "state": state_name(a.state), "reason": a.reason,
        "pkey_value": format!("{:#06x}", a.pkey_value),
        "membership": membership_name(a.membership),
        "partition": {"id": p.id, "name": p.name, "workspace": p.workspace, "account": p.account, "fabric": p.fabric, "pkey": format!("{:#06x}", p.pkey)},
        "created": time(&a.created), "updated": time(&a.updated),
        "ports": ports_json(&a.ports), "named_ports": a.named_ports,
    })
}

fn ports_json(ports: &[pb::AttachmentPort]) -> Value {
    Value::Array(
        ports
            .iter()
            .map(|p| json!({"device": p.device, "port": p.port_number, "port_guid": p.port_guid}))
            .collect(),
    )
}

/// The widest PORTS cell in a table (longer lists are cut; `-o json` has them all).
const PORTS_MAX: usize = 24;

/// An attachment's ports for the table: `all` for a whole-node attachment, else `dev/port,...`.
fn ports_cell(a: &pb::Attachment) -> String {
    if !a.named_ports {
        return "all".into();
    }
    a.ports
        .iter()
        .map(|p| format!("{}/{}", p.device, p.port_number))
        .collect::<Vec<_>>()
        .join(",")
}

/// Prints attachments: a table, or (JSON) one array of attachment objects.
pub fn attachments(list: &[pb::Attachment], json: bool) {
    if json {
        say!(
            "{}",
            Value::Array(list.iter().map(attachment_json).collect())
        );
        return;
    }
    attachment_table(list);
}

/// Prints the one attachment an attach or release answered with: a table row, or (JSON) one
/// attachment object.
pub fn attachment(a: &pb::Attachment, json: bool) {
    if json {
        say!("{}", attachment_json(a));
    } else {
        attachment_table(std::slice::from_ref(a));
    }
}

fn attachment_table(list: &[pb::Attachment]) {
    let partition = |a: &pb::Attachment| {
        a.partition
            .as_ref()
            .map(|p| p.id.clone())
            .unwrap_or_default()
    };
    let instance_w = list
        .iter()
        .map(|a| a.instance_id.chars().count())
        .chain([8])
        .max()
        .unwrap_or(8);
    let partition_w = list
        .iter()
        .map(|a| partition(a).chars().count())
        .chain([9])
        .max()
        .unwrap_or(9);
    // The PORTS column appears only when an attachment named its ports (partial-node
    // deployments); whole-node listings keep their shape.
    let ports_w = if list.iter().any(|a| a.named_ports) {
        list.iter()
            .map(|a| ports_cell(a).chars().count().min(PORTS_MAX))
            .chain([5])
            .max()
            .unwrap_or(5)
    } else {
        0
    };
    let ports_head = if ports_w > 0 {
        format!("{:<ports_w$}  ", "PORTS")
    } else {
        String::new()
    };
    let head = format!(
        "{:<instance_w$}  {:<partition_w$}  {:<6}  {:<10}  {:<11}  {ports_head}",
        "INSTANCE", "PARTITION", "P_KEY", "MEMBERSHIP", "STATE"
    );
    let reason_w = WIDTH.saturating_sub(head.chars().count()).max(20);
    say!("{head}REASON");
    for a in list {
        say!(
            "{:<instance_w$}  {:<partition_w$}  {:<6}  {:<10}  {:<11}  {}{}",
            a.instance_id,
            partition(a),
            format!("{:#06x}", a.pkey_value),
            membership_name(a.membership),
            state_name(a.state),
            if ports_w > 0 {
                format!("{:<ports_w$}  ", fit(&ports_cell(a), PORTS_MAX))
            } else {
                String::new()
            },
            fit(&a.reason, reason_w)
        );
    }
}

/// P_Keys as InfiniBand tools print them (`0x8a12`).
fn keys(list: &[u32]) -> Vec<String> {
    list.iter().map(|k| format!("{k:#06x}")).collect()
}

/// One event's kind, its JSON detail, and a one-line summary for the table.
fn event_parts(e: &pb::Event) -> (&'static str, Value, String) {
    use pb::event::Kind;
    match &e.kind {
        Some(Kind::AttachmentChanged(a)) => attachment_changed(a),
        Some(Kind::PkeyTableChanged(p)) => pkey_table_changed(p),
        Some(Kind::PortStateChanged(p)) => (
            "port_state",
            json!({"device": p.device, "port": p.port_number, "port_guid": p.port_guid, "from": port_state(p.from), "to": port_state(p.to)}),
            format!(
                "{}/{} {} {} -> {}",
                p.device,
                p.port_number,
                p.port_guid,
                port_state(p.from),
                port_state(p.to)
            ),
        ),
        Some(Kind::SubnetManagerChanged(s)) => (
            "subnet_manager",
            json!({"backend": s.backend, "reachable": s.reachable, "error": s.error}),
            format!(
                "{} {}{}",
                s.backend,
                reachability(s.reachable),
                suffix(": ", &s.error)
            ),
        ),
        Some(Kind::ForeignPkey(f)) => (
            "foreign_pkey",
            json!({"device": f.device, "port": f.port_number, "port_guid": f.port_guid, "pkey_value": format!("{:#06x}", f.pkey_value)}),
            format!(
                "{}/{} {} holds {:#06x}, which nobody asked for",
                f.device, f.port_number, f.port_guid, f.pkey_value
            ),
        ),
        Some(Kind::ConditionChanged(c)) => condition_changed(c),
        None => ("unknown", Value::Null, String::new()),
    }
}

/// `prefix` and `text`, or nothing when `text` is empty.
fn suffix(prefix: &str, text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("{prefix}{text}")
    }
}

fn reachability(reachable: bool) -> &'static str {
    if reachable {
        "reachable"
    } else {
        "UNREACHABLE"
    }
}

fn attachment_changed(a: &pb::AttachmentChanged) -> (&'static str, Value, String) {
    let mut detail = json!({"instance_id": a.instance_id, "partition_id": a.partition_id,
        "pkey_value": format!("{:#06x}", a.pkey_value), "to": state_name(a.to), "reason": a.reason});
    if !a.ports.is_empty() {
        detail["ports"] = ports_json(&a.ports);
    }
    // The first event of an attachment has no previous state: no `from` at all.
    let from = (a.from != pb::AttachmentState::Unspecified as i32).then(|| state_name(a.from));
    if let Some(from) = from {
        detail["from"] = json!(from);
    }
    let summary = format!(
        "{} {} {:#06x} {}{}{}",
        a.instance_id,
        a.partition_id,
        a.pkey_value,
        from.map(|f| format!("{f} -> ")).unwrap_or_default(),
        state_name(a.to),
        suffix(": ", &a.reason)
    );
    ("attachment", detail, summary)
}

fn pkey_table_changed(p: &pb::PKeyTableChanged) -> (&'static str, Value, String) {
    let summary = format!(
        "{}/{} {}{}{}",
        p.device,
        p.port_number,
        p.port_guid,
        suffix(" +", &keys(&p.added).join(" +")),
        suffix(" -", &keys(&p.removed).join(" -")),
    );
    (
        "pkey_table",
        json!({"device": p.device, "port": p.port_number, "port_guid": p.port_guid,
               "added": keys(&p.added), "removed": keys(&p.removed)}),
        summary,
    )
}

fn condition_changed(c: &pb::ConditionChanged) -> (&'static str, Value, String) {
    let cond = c.condition.clone().unwrap_or_default();
    (
        "condition",
        json!({"condition": cond.kind, "active": c.active, "detail": cond.detail}),
        format!(
            "{} {}: {}",
            cond.kind,
            if c.active { "raised" } else { "cleared" },
            cond.detail
        ),
    )
}

/// Prints the events table's header.
pub fn event_header(json: bool) {
    if !json {
        say!("{:>6}  {:<24}  {:<14}  SUMMARY", "SEQ", "TIME", "KIND");
    }
}

/// Prints one event: a table row summarised to fit 100 columns, or (JSON) one object per line
/// with the full detail.
pub fn event(e: &pb::Event, json: bool) {
    let (kind, detail, summary) = event_parts(e);
    if json {
        say!(
            "{}",
            json!({"seq": e.seq, "time": time(&e.time), "node_id": e.node_id, "kind": kind, "detail": detail})
        );
    } else {
        let head = format!("{:>6}  {:<24}  {:<14}  ", e.seq, time(&e.time), kind);
        let room = WIDTH.saturating_sub(head.chars().count()).max(20);
        say!("{head}{}", fit(&summary, room));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_to_fit() {
        assert_eq!(fit("short", 10), "short");
        let cut = fit(&"x".repeat(50), 10);
        assert_eq!(cut.chars().count(), 10);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn the_first_event_has_no_from() {
        let e = pb::Event {
            seq: 1,
            kind: Some(pb::event::Kind::AttachmentChanged(pb::AttachmentChanged {
                instance_id: "i-1".into(),
                partition_id: "ibpart_a".into(),
                pkey_value: 0x8a12,
                from: pb::AttachmentState::Unspecified as i32,
                to: pb::AttachmentState::Pending as i32,
                reason: "attach requested".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let (kind, detail, summary) = event_parts(&e);
        assert_eq!(kind, "attachment");
        assert!(detail.get("from").is_none(), "{detail}");
        assert_eq!(summary, "i-1 ibpart_a 0x8a12 PENDING: attach requested");
    }
}
