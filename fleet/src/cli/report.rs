//! Text shapes of the CLI's output.

use crate::proto::agent::PortState;
use crate::proto::agent::{event, Attachment, Event};
use crate::registry::Registry;
use crate::store::AttachRecord;
use crate::view::{state_name, time_text, View};
use std::fmt::Write;

/// `status`: one line per node.
pub fn status(registry: &Registry, view: &View) -> String {
    let mut out = String::from("NODE\tREACHABLE\tEPOCH\tCURSOR\tLAG\tRESYNCS\tCONDITIONS\n");
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
            "{}\t{reach}\t{epoch}\t{}\t{}\t{}\t{conditions}",
            n.id,
            v.durable.seq,
            v.lag(),
            v.live.resyncs
        );
    }
    out
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

/// One attachment, for attach and release.
pub fn attachment_line(a: &Attachment) -> String {
    format!(
        "{}\t{}\t{}\t{:#06x}\t{}",
        a.instance_id,
        a.partition.as_ref().map_or("", |p| p.id.as_str()),
        state_name(a.state),
        a.pkey_value,
        if a.reason.is_empty() { "-" } else { &a.reason }
    )
}

/// One event of `watch`.
pub fn event_line(node: &str, ev: &Event) -> String {
    let what = match &ev.kind {
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
            "subnet manager {} reachable={} {}",
            s.backend, s.reachable, s.error
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
    };
    format!("{node}\t{}:{}\t{what}", ev.log_epoch, ev.seq)
}
