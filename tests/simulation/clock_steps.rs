//! Wall-clock steps in the simulation (`testkit/src/sim/clock_steps.rs`, docs/SIMULATION.md
//! "Clock steps"): the node's wall clock jumps an hour forward or back inside applies, across
//! agent restarts and at seeded instants, through the real UFM backend. Every invariant holds;
//! and with the UFM link reading the stepped wall clock at every call (the steady clock
//! switched off) a seed's forward step inside an apply ends a late-write watch early, and the
//! oracle catches the false RELEASED.

use testkit::sim::{self, core::command::Command};

fn ufm(unsteady: bool) -> sim::GenOptions {
    sim::GenOptions {
        ufm: true,
        ufm_unsteady_clock: unsteady,
        ..Default::default()
    }
}

#[test]
fn ufm_schedules_with_clock_steps_keep_every_invariant() {
    let (mut stepped, mut in_apply, mut across) = (0, 0, 0);
    for seed in 0..12 {
        let o = sim::run_seed(seed, ufm(false));
        if o.finding.is_some() {
            panic!("{}", sim::report(&o, Some(80)));
        }
        stepped += o
            .trace
            .iter()
            .filter(|l| l.contains("clock: the node's wall clock steps"))
            .count();
        let steps = &o.schedule.steps;
        for (i, s) in steps.iter().enumerate() {
            if let Command::ClockStep { in_apply: a, .. } = s.command {
                in_apply += usize::from(a);
                let next = steps.get(i + 1).map(|n| (n.at_ms, &n.command));
                across += usize::from(matches!(
                    next,
                    Some((at, Command::Crash { .. } | Command::Restart)) if at == s.at_ms
                ));
            }
        }
    }
    eprintln!("clock steps: {stepped} taken, {in_apply} drawn inside an apply, {across} just before an agent restart");
    assert!(stepped >= 10, "only {stepped} clock steps were taken");
    assert!(
        in_apply > 0 && across > 0,
        "{in_apply} inside an apply, {across} across a restart"
    );
}

/// Seed 94 (`--ufm`): a forward step of an hour lands during an apply's retries. On the steady
/// clock the watch of the retried add runs its real length; on the stepped wall clock it ends
/// at once and the key is reported RELEASED while UFM may still execute the add.
#[test]
fn a_ufm_link_on_the_stepped_wall_clock_fails_the_simulation() {
    const SEED: u64 = 94;
    let on = sim::run_seed(SEED, ufm(false));
    assert!(on.finding.is_none(), "{}", sim::report(&on, Some(60)));
    let off = sim::run_seed(SEED, ufm(true));
    let finding = off.finding.clone().unwrap_or_default();
    assert!(
        finding.contains("reported RELEASED") && finding.contains("UFM request"),
        "expected a RELEASED while an add may still land, got: {finding:?}\n{}",
        sim::report(&off, Some(60))
    );
}
