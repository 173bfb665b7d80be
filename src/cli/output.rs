//! Human-readable tables and JSON for the CLI.
//!
//! One spelling per value in every human view: P_Keys as the 16-bit value with the membership
//! bit (`0x8a12` full, `0x0a12` limited), except where a value is a base (the in-doubt list,
//! said so); LIDs in decimal, as `ibstat` prints them; backend names lowercase. Tables fit
//! [`WIDTH`] columns and wrap their last column instead of cutting it; `-o wide` adds columns;
//! JSON carries every field the API has.

use super::sm_hosts_view::{evidence_json, evidence_line, sm_hosts_json, sm_hosts_lines};
use super::timestamp::time;
use super::{sm_view, Format};
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

fn port_json(p: &pb::Port) -> Value {
    json!({
        "device": p.device, "port": p.port_number, "port_guid": p.port_guid, "node_guid": p.node_guid,
        "lid": p.lid, "sm_lid": p.sm_lid, "state": port_state(p.state), "link_layer": link_layer(p.link_layer),
        "fabric_port": p.fabric_port, "pkey_table_size": p.pkey_table_size,
        "pkeys": keys(&p.pkeys),
    })
}

fn print_ports(ports: &[pb::Port], wide: bool) {
    let port_name = |p: &pb::Port| format!("{}/{}", p.device, p.port_number);
    let name_w = ports
        .iter()
        .map(|p| port_name(p).chars().count())
        .chain([4])
        .max()
        .unwrap_or(4);
    let mut head = format!(
        "{:<name_w$}  {:<18}  {:<12}  {:>5}  {:>6}  {:<6}  ",
        "PORT", "PORT_GUID", "STATE", "LID", "SM_LID", "FABRIC"
    );
    if wide {
        head.push_str(&format!("{:<18}  {:<10}  ", "NODE_GUID", "LINK"));
    }
    let indent = head.chars().count();
    say!("{head}P_KEYS (used/size: values)");
    for p in ports {
        let mut row = format!(
            "{:<name_w$}  {:<18}  {:<12}  {:>5}  {:>6}  {:<6}  ",
            port_name(p),
            p.port_guid,
            port_state(p.state),
            p.lid,
            p.sm_lid,
            if p.fabric_port { "yes" } else { "no" },
        );
        if wide {
            row.push_str(&format!(
                "{:<18}  {:<10}  ",
                p.node_guid,
                link_layer(p.link_layer)
            ));
        }
        let keys = format!(
            "{}/{}: {}",
            p.pkeys.len(),
            p.pkey_table_size,
            keys(&p.pkeys).join(" ")
        );
        print_wrapped(&row, indent, &keys);
    }
}

/// Prints a node view.
pub fn node(n: &pb::GetNodeResponse, format: Format) {
    match format {
        Format::Json => say!("{}", node_json(n)),
        Format::Table | Format::Wide => node_table(n, format == Format::Wide),
    }
}

fn node_json(n: &pb::GetNodeResponse) -> Value {
    let sm = n.subnet_manager.clone().unwrap_or_default();
    json!({
        "node_id": n.node_id, "fabric": n.fabric, "agent_version": n.agent_version,
        "observer": n.observer, "observer_reason": n.observer_reason, "pkey_capacity": n.pkey_capacity,
        "subnet_manager": {"backend": sm.backend, "state": sm_view::state_name(sm.state), "reachable": sm.reachable,
                           "last_error": sm.last_error, "applies": sm.applies,
                           "generation": sm.generation, "last_apply": time(&sm.last_apply),
                           "in_doubt_pkeys": keys(&sm.in_doubt_pkeys), "in_doubt_pkey_values": keys(&sm.in_doubt_pkey_values),
                           "apply_in_flight": sm.apply_in_flight_since.is_some().then(|| json!({
                               "since": time(&sm.apply_in_flight_since),
                               "generation": sm.apply_in_flight_generation})),
                           "sm_hosts": sm.sm_hosts.as_ref().map(sm_hosts_json)},
        "conditions": n.conditions.iter().map(|c| json!({"kind": c.kind, "detail": c.detail})).collect::<Vec<_>>(),
        "attachment_counts": n.attachment_counts,
        "first_event_seq": n.first_event_seq, "last_event_seq": n.last_event_seq, "log_epoch": n.log_epoch,
        "ports": n.ports.iter().map(port_json).collect::<Vec<_>>(),
        "sm_host": sm.sm_host.as_ref().map(sm_host_json),
    })
}

/// An SM host among several (absent elsewhere): its OpenSM's role and where it came from, its
/// catch-up, and each peer with its last answer.
fn sm_host_json(h: &pb::SmHostStatus) -> Value {
    json!({
        "role": h.role, "role_source": h.role_source, "role_reason": h.role_fallback_reason,
        "caught_up": h.caught_up, "catching_up_with": h.catching_up_with,
        "held_back_nodes": h.held_back_nodes, "disagreeing_nodes": h.disagreeing_nodes,
        "peers": h.peers.iter().map(|p| json!({
            "endpoint": p.endpoint, "host": p.host, "last_answer": time(&p.last_answer),
            "last_error": p.last_error, "caught_up": p.caught_up,
            "last_generation": p.last_generation, "nodes": p.nodes,
        })).collect::<Vec<_>>(),
    })
}

/// The in-doubt list's line: each key as the value the node's attachments give it, with its
/// base (either membership of the base may be held), and why they are in doubt (an apply in
/// flight, refused, or without an answer).
pub fn in_doubt_line(sm: &pb::SubnetManagerStatus) -> String {
    let listed: Vec<String> = sm
        .in_doubt_pkeys
        .iter()
        .enumerate()
        .map(|(i, base)| match sm.in_doubt_pkey_values.get(i) {
            Some(value) => format!("{value:#06x} (base {base:#06x})"),
            None => format!("base {base:#06x}"),
        })
        .collect();
    format!(
        "{}, either membership: {}; not RELEASED until a set without them is acknowledged",
        listed.join(", "),
        sm_view::in_doubt_cause(sm)
    )
}

fn node_table(n: &pb::GetNodeResponse, wide: bool) {
    let sm = n.subnet_manager.clone().unwrap_or_default();
    say!(
        "node {}  fabric {}  agent {}",
        n.node_id,
        n.fabric,
        n.agent_version
    );
    print_wrapped(
        "observer ",
        2,
        &format!("{} ({})", n.observer, n.observer_reason),
    );
    print_wrapped(
        "subnet manager ",
        2,
        &format!(
            "{}: {}  (applies {}, generation {}{})",
            sm.backend.to_lowercase(),
            sm_view::summary(&sm).1,
            sm.applies,
            sm.generation,
            suffix(", last ", &time(&sm.last_apply)),
        ),
    );
    if let Some((_, line)) = sm_view::in_flight(&sm) {
        print_wrapped("apply in flight: ", 2, &line);
    }
    if let Some(h) = &sm.sm_host {
        print_wrapped("sm host: ", 2, &sm_host_line(h));
    }
    for (head, text) in sm.sm_hosts.as_ref().map(sm_hosts_lines).unwrap_or_default() {
        print_wrapped(&head, 4, &text);
    }
    if !sm.in_doubt_pkeys.is_empty() {
        print_wrapped("in doubt: ", 2, &in_doubt_line(&sm));
    }
    for c in &n.conditions {
        print_wrapped(&format!("CONDITION {}: ", c.kind), 2, &c.detail);
    }
    let mut counts: Vec<String> = n
        .attachment_counts
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|(s, c)| format!("{s}={c}"))
        .collect();
    counts.sort();
    say!(
        "attachments {}  capacity {} keys/port",
        if counts.is_empty() {
            "none".into()
        } else {
            counts.join(" ")
        },
        n.pkey_capacity,
    );
    say!(
        "events {}..{}  log epoch {}",
        n.first_event_seq,
        n.last_event_seq,
        n.log_epoch
    );
    if n.ports.is_empty() {
        say!("ports: none read (the observer has not read any port: see `fabric-agent doctor` and the daemon's log)");
    } else {
        print_ports(&n.ports, wide);
    }
}

/// Prints ports read locally.
pub fn ports(observer: &str, ports: &[pb::Port], format: Format) {
    if format == Format::Json {
        say!(
            "{}",
            json!({"observer": observer, "ports": ports.iter().map(port_json).collect::<Vec<_>>()})
        );
    } else {
        say!("observer {observer}");
        print_ports(ports, format == Format::Wide);
    }
}

/// Prints one JSON value on a line (a closed pipe ends the program quietly).
pub fn json(v: &Value) {
    say!("{v}");
}

/// Tables fit this many columns: the last column (a reason, an event's summary, a port's
/// keys) wraps onto indented lines; nothing is cut.
pub const WIDTH: usize = 100;

/// Splits `text` into lines of at most `width` characters at spaces; a word longer than the
/// width stays whole on its own line (never cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let fits = line.chars().count() + 1 + word.chars().count() <= width;
        if line.is_empty() {
            line.push_str(word);
        } else if fits {
            line.push(' ');
            line.push_str(word);
        } else {
            lines.push(std::mem::take(&mut line));
            line.push_str(word);
        }
    }
    lines.push(line);
    lines
}

/// The narrowest room a wrapped column gets; with less, the text moves under the row.
const MIN_ROOM: usize = 24;

/// The indent of text moved under its row.
const UNDER: usize = 4;

/// Prints `head` then `text`, wrapped within [`WIDTH`]: continuation lines are indented by
/// `indent` (the column where the text starts in a table, a small hanging indent otherwise).
/// When the head leaves less than [`MIN_ROOM`] columns (a long instance id), the text goes on
/// the following lines, indented by [`UNDER`], so nothing passes [`WIDTH`].
fn print_wrapped(head: &str, indent: usize, text: &str) {
    let start = head.chars().count();
    let (first_room, indent) = if WIDTH.saturating_sub(start) >= MIN_ROOM {
        (WIDTH - start, indent)
    } else {
        say!("{}", head.trim_end());
        (0, UNDER)
    };
    let rest_room = WIDTH.saturating_sub(indent).max(MIN_ROOM);
    let rest = if first_room == 0 {
        text.to_owned()
    } else {
        let first = wrap(text, first_room);
        let (line, more) = first.split_first().expect("wrap returns a line");
        say!("{head}{line}");
        more.join(" ")
    };
    if !rest.is_empty() {
        for l in wrap(&rest, rest_room) {
            say!("{:indent$}{l}", "");
        }
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
        "evidence": a.evidence.as_ref().map(evidence_json),
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
pub fn attachments(list: &[pb::Attachment], format: Format) {
    if format == Format::Json {
        say!(
            "{}",
            Value::Array(list.iter().map(attachment_json).collect())
        );
        return;
    }
    attachment_table(list, format == Format::Wide);
}

/// Prints one attachment (an attach's or release's answer, `get`): a table row, or (JSON) one
/// attachment object.
pub fn attachment(a: &pb::Attachment, format: Format) {
    if format == Format::Json {
        say!("{}", attachment_json(a));
    } else {
        attachment_table(std::slice::from_ref(a), format == Format::Wide);
        if let Some(e) = &a.evidence {
            print_wrapped("evidence: ", 2, &evidence_line(e));
        }
    }
}

fn attachment_table(list: &[pb::Attachment], wide: bool) {
    let part = |a: &pb::Attachment| a.partition.clone().unwrap_or_default();
    let width = |f: &dyn Fn(&pb::Attachment) -> String, min: usize| {
        list.iter()
            .map(|a| f(a).chars().count())
            .chain([min])
            .max()
            .unwrap_or(min)
    };
    let instance_w = width(&|a| a.instance_id.clone(), 8);
    let partition_w = width(&|a| part(a).id, 9);
    let name_w = width(&|a| part(a).name, 4);
    let workspace_w = width(&|a| part(a).workspace, 9);
    let account_w = width(&|a| part(a).account, 7);
    // The PORTS column appears only when an attachment named its ports (partial-node
    // deployments); whole-node listings keep their shape.
    let ports_w = if list.iter().any(|a| a.named_ports) {
        width(&ports_cell, 5)
    } else {
        0
    };
    let ports_head = if ports_w > 0 {
        format!("{:<ports_w$}  ", "PORTS")
    } else {
        String::new()
    };
    let mut head = format!(
        "{:<instance_w$}  {:<partition_w$}  {:<6}  {:<10}  {:<11}  {ports_head}",
        "INSTANCE", "PARTITION", "P_KEY", "MEMBERSHIP", "STATE"
    );
    if wide {
        head.push_str(&format!(
            "{:<name_w$}  {:<workspace_w$}  {:<account_w$}  {:<24}  ",
            "NAME", "WORKSPACE", "ACCOUNT", "UPDATED"
        ));
    }
    let indent = head.chars().count();
    say!("{head}REASON");
    for a in list {
        let p = part(a);
        let mut row = format!(
            "{:<instance_w$}  {:<partition_w$}  {:<6}  {:<10}  {:<11}  {}",
            a.instance_id,
            p.id,
            format!("{:#06x}", a.pkey_value),
            membership_name(a.membership),
            state_name(a.state),
            if ports_w > 0 {
                format!("{:<ports_w$}  ", ports_cell(a))
            } else {
                String::new()
            },
        );
        if wide {
            row.push_str(&format!(
                "{:<name_w$}  {:<workspace_w$}  {:<account_w$}  {:<24}  ",
                p.name,
                p.workspace,
                p.account,
                time(&a.updated)
            ));
        }
        print_wrapped(&row, indent, &a.reason);
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
            json!({"backend": s.backend, "state": sm_view::state_name(s.state), "reachable": s.reachable, "error": s.error}),
            format!(
                "{} {}{}",
                s.backend.to_lowercase(),
                sm_view::event_state(s.state, s.reachable),
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
    if let Some(e) = &a.evidence {
        detail["evidence"] = evidence_json(e);
    }
    let by = a
        .evidence
        .as_ref()
        .filter(|e| !e.acknowledged_by.is_empty())
        .map(|e| format!(" (acknowledged by {})", e.acknowledged_by.join(", ")))
        .unwrap_or_default();
    let summary = format!(
        "{} {} {:#06x} {}{}{}{}",
        a.instance_id,
        a.partition_id,
        a.pkey_value,
        from.map(|f| format!("{f} -> ")).unwrap_or_default(),
        state_name(a.to),
        suffix(": ", &a.reason),
        by
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

/// The events table's columns before the summary.
fn event_head(seq: &str, time: &str, kind: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{seq:>6}  {time:<24}  {node:<12}  {kind:<14}  "),
        None => format!("{seq:>6}  {time:<24}  {kind:<14}  "),
    }
}

/// Prints the events table's header.
pub fn event_header(format: Format) {
    match format {
        Format::Json => {}
        Format::Table => say!("{}SUMMARY", event_head("SEQ", "TIME", "KIND", None)),
        Format::Wide => say!("{}SUMMARY", event_head("SEQ", "TIME", "KIND", Some("NODE"))),
    }
}

/// Prints one event: a table row whose summary wraps within 100 columns, or (JSON) one object
/// per line with the full detail (the evidence of ACTIVE and RELEASED included).
pub fn event(e: &pb::Event, format: Format) {
    let (kind, detail, summary) = event_parts(e);
    if format == Format::Json {
        say!(
            "{}",
            json!({"seq": e.seq, "time": time(&e.time), "node_id": e.node_id, "log_epoch": e.log_epoch,
                   "kind": kind, "detail": detail})
        );
    } else {
        let node = (format == Format::Wide).then_some(e.node_id.as_str());
        let head = event_head(&e.seq.to_string(), &time(&e.time), kind, node);
        print_wrapped(&head, head.chars().count(), &summary);
    }
}

/// One line for an SM host among several: its OpenSM's role, the sync, each peer.
fn sm_host_line(h: &crate::proto::agent::SmHostStatus) -> String {
    let mut line = match h.role_source.as_str() {
        "sminfo" => format!("opensm {} (SMInfo)", h.role),
        "" => format!("opensm {}", h.role),
        "not-running" => format!("opensm NOT RUNNING ({})", h.role_fallback_reason),
        _ => format!(
            "opensm {} (fallback: OpenSM's log; {})",
            h.role, h.role_fallback_reason
        ),
    };
    if h.caught_up {
        line.push_str(", caught up with its peers");
    } else {
        line.push_str(&format!(
            ", catching up with {}",
            h.catching_up_with.join(", ")
        ));
    }
    if !h.held_back_nodes.is_empty() {
        line.push_str(&format!("; held back: {}", h.held_back_nodes.join(", ")));
    }
    if !h.disagreeing_nodes.is_empty() {
        line.push_str(&format!(
            "; peers disagree on: {}",
            h.disagreeing_nodes.join(", ")
        ));
    }
    for p in &h.peers {
        let host = if p.host.is_empty() {
            "?"
        } else {
            p.host.as_str()
        };
        line.push_str(&format!(
            "; peer {} ({host}): {} nodes, last generation {}",
            p.endpoint, p.nodes, p.last_generation
        ));
        if !p.last_error.is_empty() {
            line.push_str(&format!(", last pull failed: {}", p.last_error));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_json_carries_the_sm_host_role_catch_up_and_peers() {
        let n = pb::GetNodeResponse {
            subnet_manager: Some(pb::SubnetManagerStatus {
                sm_host: Some(pb::SmHostStatus {
                    role: "not running".into(),
                    role_source: "not-running".into(),
                    role_fallback_reason: "OpenSM's pid 9 is gone".into(),
                    caught_up: false,
                    catching_up_with: vec!["https://smhost2:7443".into()],
                    peers: vec![pb::SmPeerStatus {
                        endpoint: "https://smhost2:7443".into(),
                        last_error: "tcp connect error".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = node_json(&n);
        assert_eq!(v["sm_host"]["role"], "not running");
        assert_eq!(v["sm_host"]["caught_up"], false);
        assert_eq!(v["sm_host"]["peers"][0]["last_error"], "tcp connect error");
        assert!(node_json(&pb::GetNodeResponse::default())["sm_host"].is_null());
    }

    #[test]
    fn long_text_wraps_and_is_never_cut() {
        assert_eq!(wrap("short", 10), vec!["short"]);
        let text = "the subnet manager refused the set: partition 0x0a12 is owned elsewhere";
        let lines = wrap(text, 20);
        assert!(lines.iter().all(|l| l.chars().count() <= 20), "{lines:?}");
        assert_eq!(lines.join(" "), text, "every word kept, in order");
        let long = "x".repeat(50);
        assert_eq!(
            wrap(&long, 10),
            vec![long.clone()],
            "a long word stays whole"
        );
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

    #[test]
    fn released_names_the_sm_hosts_that_acknowledged_in_the_event_and_the_attachment() {
        let evidence = pb::Evidence {
            sm_generation: 9,
            acknowledged_by: vec!["sm1".into(), "sm2".into()],
            ..Default::default()
        };
        let e = pb::Event {
            kind: Some(pb::event::Kind::AttachmentChanged(pb::AttachmentChanged {
                instance_id: "i-1".into(),
                partition_id: "ibpart_a".into(),
                pkey_value: 0x8a12,
                from: pb::AttachmentState::Releasing as i32,
                to: pb::AttachmentState::Released as i32,
                evidence: Some(evidence.clone()),
                ..Default::default()
            })),
            ..Default::default()
        };
        let (_, detail, summary) = event_parts(&e);
        assert_eq!(detail["evidence"]["acknowledged_by"], json!(["sm1", "sm2"]));
        assert_eq!(
            summary,
            "i-1 ibpart_a 0x8a12 RELEASING -> RELEASED (acknowledged by sm1, sm2)"
        );
        let a = pb::Attachment {
            evidence: Some(evidence),
            ..Default::default()
        };
        assert_eq!(attachment_json(&a)["evidence"]["sm_generation"], 9);
        assert!(attachment_json(&pb::Attachment::default())["evidence"].is_null());
        let n = pb::GetNodeResponse {
            subnet_manager: Some(pb::SubnetManagerStatus {
                sm_hosts: Some(pb::SmHostSetStatus {
                    known_hosts: vec!["sm1".into(), "sm2".into()],
                    acknowledged: vec!["sm1".into(), "sm2".into()],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = node_json(&n);
        assert_eq!(
            v["subnet_manager"]["sm_hosts"]["known_hosts"],
            json!(["sm1", "sm2"])
        );
        assert!(node_json(&pb::GetNodeResponse::default())["subnet_manager"]["sm_hosts"].is_null());
    }
}
