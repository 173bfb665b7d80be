//! A campaign's report: what it did (faults, the driver's operations, the rig's recoveries)
//! and what the checker found, printed by the tests.

use super::checker::{self, Verdict, Violation};
use super::driver::Ops;
use super::faults::FaultLog;
use super::history::Ms;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a campaign did and found.
#[derive(Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// When the fault loop began (wall-clock ms, as [`Violation::at`]).
    pub started_at: Ms,
    /// Every fault, in order, with counts.
    pub faults: FaultLog,
    /// The driver's operations.
    pub ops: Ops,
    /// The checker's verdict (the convergence violation added).
    pub verdict: Verdict,
    /// `smpquery` reads recorded and failed.
    pub port_reads: (u64, u64),
    /// Time from the end of the faults to convergence; `None`: not within the bound.
    pub convergence: Option<Duration>,
    /// Resyncs of event watchers (a cursor that no longer held).
    pub resyncs: usize,
    /// State changes whose reason names a test mutation (`Settings::mutation`): the switched-off
    /// rule decided them.
    pub mutation_events: usize,
    /// OpenSMs restarted by the rig because they stopped sweeping on their own or announced no
    /// state after a restart.
    pub rig_recoveries: u64,
    /// ibsim slots: (freed in all after deaths by signal, of those found by the campaign's
    /// sweeps before restarts (leaks the guards missed), clients attached at the end, of those
    /// dead processes).
    pub slots: (u64, u64, usize, usize),
    /// Partitions created and deleted by the end.
    pub partitions: (usize, usize),
    /// The guard's view checked at the end: (wanted keys both SM hosts list for their node,
    /// wanted keys), and the first miss.
    pub guard_view: (usize, usize, String),
    /// Whether every gRPC link ran over mTLS ([`super::tls`]).
    pub tls: bool,
    /// Every standing condition reported at convergence (`GetNode` of each node and SM host):
    /// (agent, kind, detail).
    pub conditions: Vec<(String, String, String)>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "chaos report, seed {}", self.seed)?;
        writeln!(
            f,
            "  mTLS: {}",
            if self.tls {
                "on (control plane -> nodes, nodes -> SM hosts, SM host <-> SM host)"
            } else {
                "off (plaintext on loopback, CHAOS_TLS=0)"
            }
        )?;
        writeln!(f, "  faults: {:?}", self.faults.counts)?;
        writeln!(f, "  ops: {:?}", self.ops)?;
        writeln!(
            f,
            "  partitions created {} deleted {}",
            self.partitions.0, self.partitions.1
        )?;
        writeln!(
            f,
            "  checker: {} checks over {} port reads ({} queries failed) and {} events; {} RELEASED events; {} resyncs; {} restored-after-release; {} reads waived (port not Active), {} (link dropped at ibsim or re-linked < 5 s before)",
            self.verdict.checks,
            self.verdict.reads,
            self.port_reads.1,
            self.verdict.events,
            self.verdict.releases,
            self.resyncs,
            self.verdict.restored_after_release,
            self.verdict.not_active_exempt,
            self.verdict.relink_exempt
        )?;
        writeln!(
            f,
            "  convergence after the faults stopped: {}",
            self.convergence
                .map_or("NOT within the bound".to_owned(), |d| format!(
                    "{:.1} s",
                    d.as_secs_f64()
                ))
        )?;
        writeln!(
            f,
            "  the guard's view at the end: {} of {} wanted keys listed by both SM hosts for their node {}",
            self.guard_view.0, self.guard_view.1, self.guard_view.2
        )?;
        if self.mutation_events > 0 {
            writeln!(
                f,
                "  state changes decided by the test mutation: {}",
                self.mutation_events
            )?;
        }
        writeln!(
            f,
            "  rig recoveries (OpenSM stopped sweeping or announced no state, or a restarted node agent's first port read got EPERM): {}",
            self.rig_recoveries
        )?;
        writeln!(
            f,
            "  ibsim slots: {} freed after deaths by signal ({} found by the sweeps before restarts); at the end {} clients attached, {} of them dead",
            self.slots.0, self.slots.1, self.slots.2, self.slots.3
        )?;
        writeln!(
            f,
            "  standing conditions at convergence: {}",
            self.conditions.len()
        )?;
        for (who, kind, detail) in &self.conditions {
            writeln!(f, "    {who}: {kind}: {detail}")?;
        }
        let mut by_rule: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &self.verdict.violations {
            *by_rule.entry(v.rule).or_default() += 1;
        }
        writeln!(
            f,
            "  violations: {} {by_rule:?}",
            self.verdict.violations.len()
        )?;
        let mut shown: Vec<&Violation> = self.verdict.violations.iter().collect();
        shown.sort_by_key(|v| v.rule != checker::NOT_CONVERGED);
        for v in shown.into_iter().take(30) {
            writeln!(f, "    {}: {}", v.rule, v.detail)?;
        }
        Ok(())
    }
}
