//! Concurrent commands: attaches and releases in flight at once on the same agent, as a control
//! plane that retries, or that terminates an instance while its attach is still waiting, sends
//! them. A [`Command::Together`] group runs its commands as futures on the one runtime, polled
//! in an order drawn from the group's seed at every poll, and can carry a crash at its `n`-th
//! poll (commands answered by then are acknowledged; the others are cut where they stand).
//!
//! The groups are drawn from a random stream of their own ([`draw`]) and inserted between the
//! schedule's steps: a seed's other commands and their instants are those it had without them.
//! New instances of a group are numbered from [`FIRST_INSTANCE`], apart from the schedule's own.
//!
//! What the agent promises a caller, checked here as each answer arrives (the store and the
//! events are judged by the oracle):
//! - a terminated instance is never attached again: an attach that starts while the instance is
//!   RELEASING or RELEASED is refused, and no attach answers a live state (PENDING, ACTIVE, ...)
//!   for an instance whose release was acknowledged before that answer while the store holds it
//!   RELEASING or RELEASED (not an instance created anew after the released one was pruned);
//! - two partitions never share a port: of two attaches of different partitions on one port,
//!   the agent admits at most one while the other is live (the oracle's check 7).

use super::core::command::{Command, Step};
use super::core::constants::{FABRIC, PARTITIONS, PORTS, PORT_GUID_BASE};
use super::crash::poll_limited;
use super::world::{with, Shared, World};
use fabric_agent::agent::{Agent, AgentError, AttachRequest};
use fabric_agent::domain::{
    Attachment, AttachmentState, Guid, InstanceId, Membership, Partition, PortName,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// The first instance number of the instances groups create.
pub const FIRST_INSTANCE: usize = 100;

/// The instance's name in the agent.
pub fn instance_name(i: usize) -> String {
    format!("i{i}")
}

/// The attach request of the schedule's `Attach` command.
pub fn attach_request(
    name: &str,
    partition: usize,
    membership: Membership,
    port: Option<usize>,
) -> AttachRequest {
    let (id, pname, base) = PARTITIONS[partition];
    AttachRequest {
        instance_id: InstanceId::parse(name).expect("instance id"),
        partition: Partition::new(id, pname, "ws", "acct", FABRIC, u32::from(base))
            .expect("partition"),
        membership,
        grant: None,
        ports: port
            .map(|p| PortName::Guid(Guid(PORT_GUID_BASE + p as u64)))
            .into_iter()
            .collect(),
    }
}

type Answer<T> = Option<Result<T, AgentError>>;

/// One attach call as its caller sees it: what the store held when it started, then its
/// answer (`None`: cut short by a crash).
pub struct AttachCall {
    name: String,
    /// The instance's state when the call started, if it was RELEASING or RELEASED.
    released_at_start: Option<AttachmentState>,
}

impl AttachCall {
    /// The call of `name` starts now.
    pub fn start(agent: &Agent, name: &str) -> AttachCall {
        AttachCall {
            name: name.to_owned(),
            released_at_start: agent
                .get(name)
                .ok()
                .map(|a| a.state)
                .filter(|s| s.is_released_or_releasing()),
        }
    }

    /// Records the answer: traced, counted as acknowledged when Ok, judged against the
    /// "never attached again" promise (`agent` shows what the store holds as it arrives).
    pub fn answered(self, agent: &Agent, world: &Shared, r: &Answer<(Attachment, bool)>) {
        // Read in the same poll as the answer: no commit can come between.
        let stored = agent.get(&self.name).ok().map(|a| a.state);
        with(world, |w| self.judge(w, stored, r));
    }

    fn judge(self, w: &mut World, stored: Option<AttachmentState>, r: &Answer<(Attachment, bool)>) {
        let name = self.name;
        match r {
            Some(Ok((a, created))) => {
                w.log(format!(
                    "agent: attach {name} acknowledged ({:?}{})",
                    a.state,
                    if *created { ", created" } else { "" }
                ));
                w.oracle.acked_attach.insert(name.clone());
                let broken = if let Some(s) = self.released_at_start {
                    Some(format!(
                        "attach of {name} was acknowledged ({:?}) though it was {s:?} when the \
                         call started: a terminated instance is never attached again",
                        a.state
                    ))
                } else if w.oracle.acked_release.contains(&name)
                    && !a.state.is_released_or_releasing()
                    && stored.is_some_and(AttachmentState::is_released_or_releasing)
                {
                    Some(format!(
                        "attach of {name} answered {:?} after its release was acknowledged",
                        a.state
                    ))
                } else {
                    None
                };
                if let Some(what) = broken {
                    let now = w.now_ms();
                    w.oracle
                        .finding
                        .get_or_insert(format!("at t={now} ms: {what}"));
                }
            }
            Some(Err(e)) => w.log(format!("agent: attach {name} refused: {e}")),
            None => w.log(format!("agent: attach {name} cut short by the crash")),
        }
    }
}

/// Records a release's answer (`None`: cut short by a crash): traced, counted as acknowledged
/// when Ok.
pub fn release_answered(w: &mut World, name: &str, r: &Answer<Attachment>) {
    match r {
        Some(Ok(a)) => {
            w.log(format!(
                "agent: release {name} acknowledged ({:?})",
                a.state
            ));
            w.oracle.acked_release.insert(name.to_owned());
        }
        Some(Err(e)) => w.log(format!("agent: release {name} refused: {e}")),
        None => w.log(format!("agent: release {name} cut short by the crash")),
    }
}

type Call<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Polls every call not done yet, at every poll in an order drawn from `order`, until all
/// are done.
async fn join_seeded(mut calls: Vec<Call<'_>>, order: u64) {
    let mut rng = StdRng::seed_from_u64(order);
    let mut done = vec![false; calls.len()];
    std::future::poll_fn(|cx| {
        let mut pending: Vec<usize> = (0..calls.len()).filter(|i| !done[*i]).collect();
        pending.shuffle(&mut rng);
        for i in pending {
            if calls[i].as_mut().poll(cx).is_ready() {
                done[i] = true;
            }
        }
        if done.iter().all(|d| *d) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Runs a [`Command::Together`] group on `agent`. Returns the crash that must follow (the
/// group's own, or a command crash armed before it), as `run`'s commands do.
pub async fn run(agent: &Agent, world: &Shared, group: &Command) -> Option<(u32, u64)> {
    let Command::Together {
        commands,
        wait_ms,
        crash,
        order,
    } = group
    else {
        return None;
    };
    let crash = crash.or_else(|| with(world, |w| w.command_crash.take()));
    let wait = (*wait_ms > 0).then(|| Duration::from_millis(*wait_ms));
    let calls: Vec<Call<'_>> = commands
        .iter()
        .filter_map(|c| -> Option<Call<'_>> {
            if let Some(a) = Attached::of(c) {
                return Some(Box::pin(async move {
                    let name = instance_name(a.instance);
                    let request = attach_request(&name, a.partition, a.membership, a.port);
                    let call = AttachCall::start(agent, &name);
                    let r = Some(agent.attach(request, wait).await);
                    call.answered(agent, world, &r);
                }));
            }
            match *c {
                Command::Release { instance } => Some(Box::pin(async move {
                    let name = instance_name(instance);
                    let r = Some(agent.release(&name, wait).await);
                    with(world, |w| release_answered(w, &name, &r));
                })),
                _ => None,
            }
        })
        .collect();
    let all = join_seeded(calls, *order);
    let finished = match crash {
        Some((n, _)) => poll_limited(all, n).await.is_some(),
        None => {
            all.await;
            true
        }
    };
    if !finished {
        with(world, |w| {
            w.log("agent: the group's commands not answered above were cut short by the crash")
        });
    }
    crash
}

/// What an earlier attach of the schedule asked for.
#[derive(Clone, Copy)]
struct Attached {
    instance: usize,
    partition: usize,
    membership: Membership,
    port: Option<usize>,
}

impl Attached {
    /// The attach `c` asks for, if it is one.
    fn of(c: &Command) -> Option<Attached> {
        match *c {
            Command::Attach {
                instance,
                partition,
                membership,
                port,
            } => Some(Attached {
                instance,
                partition,
                membership,
                port,
            }),
            _ => None,
        }
    }
}

fn attach_of(a: Attached) -> Command {
    Command::Attach {
        instance: a.instance,
        partition: a.partition,
        membership: a.membership,
        port: a.port,
    }
}

/// The attaches among `steps`, groups included.
fn attaches(steps: &[Step]) -> Vec<Attached> {
    fn visit(c: &Command, out: &mut Vec<Attached>) {
        if let Command::Together { commands, .. } = c {
            commands.iter().for_each(|c| visit(c, out));
        }
        out.extend(Attached::of(c));
    }
    let mut out = Vec::new();
    steps.iter().for_each(|s| visit(&s.command, &mut out));
    out
}

/// Inserts 1 to 3 groups of concurrent commands into `steps` for 3 seeds in 5, drawn from a
/// stream of their own (`seed` mixed with a constant): attach + release of one new instance,
/// two attaches of different partitions on one port, re-sends of one attach, release +
/// re-attach of an earlier instance, a release racing an attach of another partition on the
/// released instance's port, or a mix; some carry a crash at one of their polls.
pub fn draw(seed: u64, steps: &mut Vec<Step>, mixed_membership: bool) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x70D6_E7E4_0000_0002);
    if !rng.random_bool(0.6) {
        return;
    }
    // One membership per partition (the schedule's first attach of it decides), so most
    // groups are not refused for a membership conflict.
    let mut memberships: BTreeMap<usize, Membership> = attaches(steps)
        .iter()
        .rev()
        .map(|a| (a.partition, a.membership))
        .collect();
    let mut next = FIRST_INSTANCE;
    for _ in 0..rng.random_range(1..=3) {
        let j = rng.random_range(0..=steps.len());
        let earlier = attaches(&steps[..j]);
        let mut fresh = |rng: &mut StdRng, partition: usize, port: Option<usize>| {
            let m = *memberships.entry(partition).or_insert_with(|| {
                if rng.random_bool(0.5) {
                    Membership::Full
                } else {
                    Membership::Limited
                }
            });
            next += 1;
            Attached {
                instance: next - 1,
                partition,
                membership: if mixed_membership && rng.random_bool(0.3) {
                    match m {
                        Membership::Full => Membership::Limited,
                        Membership::Limited => Membership::Full,
                    }
                } else {
                    m
                },
                port,
            }
        };
        let any_port = |rng: &mut StdRng| match rng.random_range(0..3) {
            0 => None,
            _ => Some(rng.random_range(0..PORTS)),
        };
        let partition = rng.random_range(0..PARTITIONS.len());
        let other = (partition + rng.random_range(1..PARTITIONS.len())) % PARTITIONS.len();
        let port = any_port(&mut rng);
        let earlier_one =
            (!earlier.is_empty()).then(|| earlier[rng.random_range(0..earlier.len())]);
        let mut commands = match (rng.random_range(0..6), earlier_one) {
            (0, _) => {
                let a = fresh(&mut rng, partition, port);
                vec![
                    attach_of(a),
                    Command::Release {
                        instance: a.instance,
                    },
                ]
            }
            (1, _) => {
                let p = rng.random_range(0..PORTS);
                let a = fresh(&mut rng, partition, Some(p));
                let b_port = if rng.random_bool(0.7) { Some(p) } else { None };
                let b = fresh(&mut rng, other, b_port);
                vec![attach_of(a), attach_of(b)]
            }
            (2, e) => {
                let a = match e {
                    Some(e) if rng.random_bool(0.5) => e,
                    _ => fresh(&mut rng, partition, port),
                };
                vec![attach_of(a); rng.random_range(2..=3)]
            }
            (3, Some(e)) => vec![
                Command::Release {
                    instance: e.instance,
                },
                attach_of(e),
            ],
            (4, Some(e)) => {
                let b = fresh(&mut rng, (e.partition + 1) % PARTITIONS.len(), e.port);
                vec![
                    Command::Release {
                        instance: e.instance,
                    },
                    attach_of(b),
                ]
            }
            (_, e) => {
                let a = fresh(&mut rng, partition, port);
                let b_port = any_port(&mut rng);
                let b = fresh(&mut rng, other, b_port);
                let mut c = vec![attach_of(a), attach_of(a), attach_of(b)];
                if let Some(e) = e {
                    c.push(Command::Release {
                        instance: e.instance,
                    });
                }
                c.push(Command::Release {
                    instance: a.instance,
                });
                c
            }
        };
        commands.shuffle(&mut rng);
        let lo = if j == 0 { 0 } else { steps[j - 1].at_ms };
        let hi = steps.get(j).map_or(lo + 5_000, |s| s.at_ms);
        let crash = rng.random_bool(0.3).then(|| {
            (
                rng.random_range(1..=8),
                if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(1..3_000)
                },
            )
        });
        let wait_ms = if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(1..10_000)
        };
        steps.insert(
            j,
            Step {
                at_ms: rng.random_range(lo..=hi),
                command: Command::Together {
                    commands,
                    wait_ms,
                    crash,
                    order: rng.random(),
                },
            },
        );
    }
}
