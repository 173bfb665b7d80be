//! `fabric-agent doctor`: the checks an operator runs on a host, one verdict per line.
//!
//! Ports are read directly through the configured observer (the daemon's view for the embedded
//! fabric); the daemon, the subnet manager, standing conditions and the store are checked
//! through the daemon's socket and the state directory. The exit code is 1 when anything would
//! block ACTIVE or RELEASED (a FAIL line), 0 otherwise (WARN lines included).

use super::verdict::{Check, Verdict};
use super::{client, exit};
use crate::config::{Config, ObserverKind};
use crate::proto::agent as pb;
use std::path::Path;
use std::process::ExitCode;

struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, verdict: Verdict, check: impl Into<String>, detail: impl Into<String>) {
        self.0.push(Check::new(verdict, check, detail));
    }
}

/// Runs every check and prints the verdicts.
pub async fn doctor(config_path: &Path, json: bool) -> ExitCode {
    let config = match super::loaded::load(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut checks = Checks(Vec::new());
    checks.add(
        Verdict::Ok,
        "config",
        format!(
            "{}: {}",
            config_path.display(),
            super::loaded::summary(&config)
        ),
    );
    clock(&mut checks);
    store(&mut checks, &config.state_dir);
    grants(&mut checks, &config);
    opensm_log(&mut checks, &config);
    let daemon = daemon(&mut checks, &config).await;
    let ports = ports(&mut checks, &config, daemon.as_ref()).await;
    let sm_host = config.subnet_manager.backend == crate::config::Backend::Opensm;
    if let Some(ports) = &ports {
        port_checks(&mut checks, &config, ports);
    }
    if sm_host {
        super::doctor_sm_host::opensm_unit(
            &mut checks.0,
            &super::doctor_sm_host::UnitSource::System,
        );
    }
    if let Some(node) = &daemon {
        daemon_checks(&mut checks, node, sm_host, ports.as_deref());
    }
    let failed = checks.0.iter().any(|c| !c.ok);
    if json {
        // The shape check-config --json prints too (super::verdict).
        println!("{}", super::verdict::summary(&checks.0));
    } else {
        for c in &checks.0 {
            println!("{:<5} {:<28} {}", c.verdict.name(), c.check, c.detail);
        }
        println!(
            "{}",
            if failed {
                "verdict: something above blocks ACTIVE or RELEASED"
            } else {
                "verdict: nothing blocks ACTIVE or RELEASED"
            }
        );
    }
    if failed {
        ExitCode::from(exit::REFUSED)
    } else {
        ExitCode::SUCCESS
    }
}

/// `[grants]`: the keys load; not requiring grants is a WARN (on the SM host it lets any node
/// join any partition).
fn grants(checks: &mut Checks, config: &Config) {
    match config.grants.load() {
        Err(e) => checks.add(Verdict::Fail, "grants", e.to_string()),
        Ok(g) if g.require => checks.add(
            Verdict::Ok,
            "grants",
            format!("required; {} key(s) {}", g.keys.len(), g.keys),
        ),
        Ok(_)
            if config.subnet_manager.backend == crate::config::Backend::Opensm
                || config.subnet_manager.ufm_broker() =>
        {
            checks.add(
                Verdict::Warn,
                "grants",
                "not required ([grants] require = false): this fabric side (SM host or UFM broker) accepts any key a node names, so a rooted node joins every tenant's partition",
            )
        }
        Ok(_) => checks.add(
            Verdict::Warn,
            "grants",
            "not required ([grants] require = false): attaches without the control plane's grant are accepted",
        ),
    }
}

fn clock(checks: &mut Checks) {
    // 2024-01-01: a clock before it was never set (certificates and event times would be wrong).
    const SANE: u64 = 1_704_067_200;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if now >= SANE {
        checks.add(Verdict::Ok, "clock", format!("unix time {now}"));
    } else {
        checks.add(
            Verdict::Fail,
            "clock",
            format!("unix time {now} is before 2024: the clock was never set (TLS and event times depend on it)"),
        );
    }
}

/// On an OpenSM SM host: the configured log is the one OpenSM writes (WARN when it cannot be
/// seen, FAIL when it is not), and OpenSM's M_Key settings (WARN when a host could write its
/// own P_Key table).
fn opensm_log(checks: &mut Checks, config: &Config) {
    let Some(o) = &config.subnet_manager.opensm else {
        return;
    };
    if config.subnet_manager.backend != crate::config::Backend::Opensm {
        return;
    }
    match crate::sm::opensm::log_check::verify(o) {
        Ok(c) if c.unverified.is_empty() => checks.add(Verdict::Ok, "opensm log", c.summary()),
        Ok(c) => checks.add(Verdict::Warn, "opensm log", c.summary()),
        Err(e) => checks.add(Verdict::Fail, "opensm log", e.to_string()),
    }
    for f in crate::sm::opensm::mkey_check::verify(o) {
        let verdict = if f.warn { Verdict::Warn } else { Verdict::Ok };
        checks.add(verdict, "opensm m_key", f.detail);
    }
}

fn store(checks: &mut Checks, dir: &Path) {
    let probe = dir.join(".doctor-probe");
    match std::fs::write(&probe, b"probe").and_then(|()| std::fs::remove_file(&probe)) {
        Ok(()) => checks.add(
            Verdict::Ok,
            "state directory",
            format!("{} is writable", dir.display()),
        ),
        Err(e) => checks.add(
            Verdict::Fail,
            "state directory",
            format!("{}: {e} (the store cannot commit)", dir.display()),
        ),
    }
}

async fn daemon(checks: &mut Checks, config: &Config) -> Option<pb::GetNodeResponse> {
    let target = client::Target::Unix(config.listen.unix_socket.clone());
    let node = match client::connect(&target).await {
        Ok(mut c) => c.node().await.map_err(|e| e.message),
        Err(e) if super::remote::connect_exit_code(&e) == exit::NO_PERMISSION => Err(format!(
            "{e} (permission denied: this user may not open the socket; the daemon may be \
             healthy: run doctor as root or as a member of [listen] read_group)"
        )),
        Err(e) => Err(e.to_string()),
    };
    match node {
        Ok(n) => {
            let mine = env!("CARGO_PKG_VERSION");
            if n.agent_version == mine {
                checks.add(
                    Verdict::Ok,
                    "daemon",
                    format!(
                        "answers on {} (version {mine})",
                        config.listen.unix_socket.display()
                    ),
                );
            } else {
                checks.add(
                    Verdict::Warn,
                    "daemon",
                    format!("runs version {}, this binary is {mine}: restart the service after an upgrade", n.agent_version),
                );
            }
            Some(n)
        }
        Err(e) => {
            checks.add(
                Verdict::Fail,
                "daemon",
                format!(
                    "not reachable on {}: {e}",
                    config.listen.unix_socket.display()
                ),
            );
            None
        }
    }
}

async fn ports(
    checks: &mut Checks,
    config: &Config,
    daemon: Option<&pb::GetNodeResponse>,
) -> Option<Vec<pb::Port>> {
    let kind = config.observer_kind();
    if kind == ObserverKind::Embedded {
        let ports = daemon.map(|n| n.ports.clone());
        match &ports {
            Some(_) => checks.add(
                Verdict::Ok,
                "observer",
                "embedded: the simulated fabric, as the daemon sees it",
            ),
            None => checks.add(
                Verdict::Fail,
                "observer",
                "embedded: its tables live in the daemon, which is not reachable",
            ),
        }
        return ports;
    }
    match crate::daemon::read_ports_once(config).await {
        Ok((observer, inventory)) => {
            let how = if observer == "smp" {
                format!(
                    "smp: SMPs answered through {} (umad access and agent registration work)",
                    config.observer.umad_device.display()
                )
            } else {
                format!("{observer}: read {} port(s)", inventory.ports.len())
            };
            checks.add(Verdict::Ok, "observer", how);
            Some(
                inventory
                    .ports
                    .iter()
                    .map(crate::api::agent_v1::convert::port_to_pb)
                    .collect(),
            )
        }
        Err(e) => {
            checks.add(
                Verdict::Fail,
                "observer",
                format!("{}: {e}", super::loaded::observer_name(config)),
            );
            None
        }
    }
}

fn port_checks(checks: &mut Checks, config: &Config, ports: &[pb::Port]) {
    let selected_by_config = !config.ports.devices.is_empty() || !config.ports.guids.is_empty();
    if !ports.iter().any(|p| p.fabric_port) {
        checks.add(
            Verdict::Fail,
            "fabric ports",
            "no fabric port: nothing can become ACTIVE or RELEASED (check [ports] and the link layers)",
        );
    }
    let sm_host = config.subnet_manager.backend == crate::config::Backend::Opensm;
    for p in ports {
        port_check(
            checks,
            p,
            selected_by_config,
            config.allow_full_default,
            sm_host,
        );
    }
}

/// On an SM host, whether `p` is the port of the master SM (its LID is the SM LID it knows):
/// OpenSM makes its own port a full member of the default partition (`SELF=full`), as it must
/// to serve every port; that is expected there, not a tenant's exposure.
fn is_sm_port(p: &pb::Port, sm_host: bool) -> bool {
    sm_host && p.lid != 0 && p.lid == p.sm_lid
}

/// One port: its state and why it is (not) a fabric port; for a fabric port also its
/// default-partition membership and its P_Key table space.
fn port_check(
    checks: &mut Checks,
    p: &pb::Port,
    selected_by_config: bool,
    allow_full: bool,
    sm_host: bool,
) {
    let name = format!("port {}/{}", p.device, p.port_number);
    let state = pb::PortState::try_from(p.state)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("PORT_STATE_")
        .to_owned();
    let link = pb::LinkLayer::try_from(p.link_layer)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("LINK_LAYER_")
        .to_owned();
    // LIDs in decimal, as `node` and ibstat print them.
    let facts = format!("{state}, {link}, LID {}, SM LID {}", p.lid, p.sm_lid);
    if !p.fabric_port {
        let why = if selected_by_config {
            "not selected by [ports]"
        } else {
            "not InfiniBand (default selection)"
        };
        checks.add(
            Verdict::Ok,
            name,
            format!("{facts}; not a fabric port: {why}"),
        );
        return;
    }
    let why = if selected_by_config {
        "selected by [ports]"
    } else {
        "InfiniBand link layer (default selection)"
    };
    let active = p.state == pb::PortState::Active as i32;
    checks.add(
        if active { Verdict::Ok } else { Verdict::Fail },
        name.clone(),
        format!(
            "{facts}; fabric port ({why}){}",
            if active {
                ""
            } else {
                ": not ACTIVE, so no key can be ACTIVE on this node"
            }
        ),
    );
    let (verdict, detail) = if is_sm_port(p, sm_host) && p.pkeys.contains(&0xffff) {
        (
            Verdict::Ok,
            "full member (0xffff): the master SM's own port (OpenSM's SELF=full), as expected",
        )
    } else {
        default_partition(&p.pkeys, allow_full)
    };
    checks.add(verdict, format!("{name} default partition"), detail);
    let used = u32::try_from(p.pkeys.len()).unwrap_or(u32::MAX);
    let free = p.pkey_table_size.saturating_sub(used);
    checks.add(
        if free == 0 {
            Verdict::Fail
        } else {
            Verdict::Ok
        },
        format!("{name} P_Key table"),
        format!("{used} of {} entries used, {free} free", p.pkey_table_size),
    );
}

/// A fabric port's membership of the default partition, judged against `allow_full_default`.
fn default_partition(pkeys: &[u32], allow_full: bool) -> (Verdict, &'static str) {
    let full = pkeys.contains(&0xffff);
    let limited = pkeys.contains(&0x7fff);
    match (full, limited, allow_full) {
        (true, _, false) => (
            Verdict::Fail,
            "full member (0xffff): every tenant can reach this port; tenant keys are not reported ACTIVE (allow_full_default = false)",
        ),
        (true, _, true) => (
            Verdict::Warn,
            "full member (0xffff): insecure, accepted by allow_full_default",
        ),
        (false, true, _) => (Verdict::Ok, "limited member (0x7fff)"),
        (false, false, _) => (
            Verdict::Warn,
            "not a member of the default partition (no 0x7fff/0xffff entry)",
        ),
    }
}

fn daemon_checks(
    checks: &mut Checks,
    n: &pb::GetNodeResponse,
    sm_host: bool,
    ports: Option<&[pb::Port]>,
) {
    let sm = n.subnet_manager.clone().unwrap_or_default();
    if let Some(h) = &sm.sm_host {
        super::doctor_sm_host::role(&mut checks.0, h, &n.conditions);
    }
    let backend = sm.backend.to_lowercase();
    let (verdict, summary) = super::sm_view::summary(&sm);
    checks.add(verdict, "subnet manager", format!("{backend}: {summary}"));
    if let Some((verdict, line)) = super::sm_view::in_flight(&sm) {
        checks.add(verdict, "apply in flight", line);
    }
    if !sm.in_doubt_pkeys.is_empty() {
        checks.add(
            Verdict::Warn,
            "keys in doubt",
            super::output::in_doubt_line(&sm),
        );
    }
    // The SM host's full default membership is its own SM port's only (SELF=full): expected.
    let only_sm_ports_full = ports.is_some_and(|ports| {
        let full: Vec<&pb::Port> = ports
            .iter()
            .filter(|p| p.fabric_port && p.pkeys.contains(&0xffff))
            .collect();
        !full.is_empty() && full.iter().all(|p| is_sm_port(p, sm_host))
    });
    for c in &n.conditions {
        let accepted = c.detail.contains("accepted by allow_full_default");
        let sm_self = c.kind == "FULL_DEFAULT_MEMBERSHIP" && only_sm_ports_full;
        let (verdict, detail) = if sm_self {
            (
                Verdict::Ok,
                format!(
                    "{} (the master SM's own port: OpenSM's SELF=full, expected on the SM host)",
                    c.detail
                ),
            )
        } else if accepted {
            (Verdict::Warn, c.detail.clone())
        } else {
            (Verdict::Fail, c.detail.clone())
        };
        checks.add(verdict, format!("condition {}", c.kind), detail);
    }
    checks.add(
        Verdict::Ok,
        "event log",
        format!("events {}..{}", n.first_event_seq, n.last_event_seq),
    );
}
