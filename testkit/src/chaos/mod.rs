//! A fabric chaos campaign with real processes on the ibsim + real OpenSM rig: two SM hosts,
//! node agents, a control-plane driver and a seeded fault scheduler ([`runner`]), checked by an
//! independent checker ([`checker`]) over what the ports (`smpquery`) and the nodes' event
//! streams showed ([`history`], recorded by [`observe`]).
//!
//! - [`faults`]: the faults and their seeded schedule, and the fault log.
//! - [`driver`]: the control plane: attach with a grant, release, revoke, delete behind the
//!   delete guard (key retired).
//! - [`observe`]: the event watchers and the port reader.
//! - [`history`]: what was seen, with wall-clock times.
//! - [`checker`]: the truth rules over a history.
//! - [`runner`]: the campaign.
//! - [`report`]: what a campaign did and found.
//! - [`start`]: the SM-host and node agents started, plaintext or mTLS.
//! - [`tls`]: the run's CAs and certificates, and the agents' configs over mTLS.

pub mod checker;
pub mod driver;
pub mod faults;
pub mod history;
pub mod observe;
pub mod report;
pub mod runner;
pub mod start;
pub mod tls;
