//! The oracle, after every step (see the module docs of `sm_hosts`).

use super::world::{World, HOSTS};
use fabric_agent::domain::AttachmentState;
use std::collections::BTreeMap;

/// Checks the world after a step; `old_master` is the master before the step's sweep, and
/// `restarted` names a host whose agent restarted beside its running OpenSM in this step, with
/// the ports as they were before it.
pub fn check(
    w: &World,
    old_master: Option<usize>,
    restarted: Option<(usize, &Vec<BTreeMap<u32, bool>>)>,
) -> Result<(), String> {
    let fenced = w.fenced();
    for (i, n) in w.nodes.iter().enumerate() {
        for k in &n.released {
            // 1. A key reported RELEASED is on none of the node's ports.
            if w.ports[i].contains_key(k) {
                return Err(format!("{k:#06x} back on node{i}'s port after RELEASED"));
            }
            // 2. ...nor in any live host's served set or partitions file, which an OpenSM may
            // program; a host held fenced (by a fence stored on any host) whose OpenSM is
            // proven not running is excepted.
            for h in 0..HOSTS {
                let host = &w.hosts[h];
                let opensm = w.opensm_runs(h);
                let live = host.agent.is_some() || opensm;
                if !live || (!opensm && fenced.contains(&h)) {
                    continue;
                }
                if host.file_gives(*k, n.guid) {
                    return Err(format!(
                        "{k:#06x}, reported RELEASED by node{i}, is in smhost{h}'s partitions file (agent {}, OpenSM {}{})",
                        if host.agent.is_some() { "up" } else { "down" },
                        if opensm { "running" } else { "down" },
                        if fenced.contains(&h) { ", fenced" } else { "" },
                    ));
                }
                if host.store_gives(n.id.as_str(), *k, n.guid) {
                    return Err(format!(
                        "{k:#06x}, reported RELEASED by node{i}, is in smhost{h}'s stored set"
                    ));
                }
            }
        }
        for a in n
            .attachments
            .iter()
            .filter(|a| a.state == AttachmentState::Active)
        {
            let k = u32::from(u16::from(a.partition.pkey));
            // 3. An ACTIVE key survives a failover to a master that acknowledged it, whose
            // agent has not restarted since and is caught up (or is down: its file is as it
            // acknowledged it).
            if let (Some(m), Some(old)) = (w.master, old_master) {
                let acked = n.active_since.get(a.instance_id.as_str());
                let host = &w.hosts[m];
                let caught_up = host
                    .agent
                    .as_ref()
                    .is_none_or(|a| a.sync.status().caught_up);
                if m != old
                    && acked.is_some_and(|(at, by)| by.contains(&m) && host.started < *at)
                    && caught_up
                    && !w.ports[i].contains_key(&k)
                {
                    return Err(format!(
                        "{k:#06x} lost from node{i}'s port when smhost{m} took over"
                    ));
                }
            }
            // 4. An agent restarted beside its running OpenSM takes no ACTIVE key off a port.
            if let Some((h, before)) = restarted {
                if before[i].contains_key(&k) && !w.ports[i].contains_key(&k) {
                    return Err(format!(
                        "{k:#06x} left node{i}'s port when smhost{h}'s agent restarted beside its running OpenSM"
                    ));
                }
            }
        }
    }
    Ok(())
}
