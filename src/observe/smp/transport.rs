//! A umad port driven from a thread of its own, behind an async request/response interface.
//!
//! The device's fd may be a shim's fake fd that no event loop can watch, so one blocking thread
//! owns the [`UmadPort`]: it takes requests from a channel, sends each MAD, polls for the
//! answer (matched on the low 32 bits of the transaction id, the part every hop preserves),
//! retries on timeout, and hands the answer back through a oneshot. Idle, it sleeps in the
//! channel's `recv`: no polling.

use super::SmpError;
use crate::mad::header::{same_transaction, MadHeader};
use crate::mad::{class, method, MAD_LEN};
use crate::sys::umad::{AgentId, MadAddress, UmadPort, QP0, QP1};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Which agent a request goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadAgent {
    /// Directed-route subnet management (QP0).
    SubnetManagement,
    /// Subnet administration (QP1).
    SubnetAdministration,
}

struct Job {
    agent: MadAgent,
    address: MadAddress,
    mad: [u8; MAD_LEN],
    reply: oneshot::Sender<Result<[u8; MAD_LEN], SmpError>>,
}

/// Timing of each exchange.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Wait for one answer.
    pub timeout: Duration,
    /// Further attempts after a timeout.
    pub retries: u32,
}

/// The handle to the thread that owns a umad port.
#[derive(Debug)]
pub struct MadTransport {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl MadTransport {
    /// Opens `device`, registers the subnet-management and subnet-administration agents and
    /// starts the port's thread.
    pub fn open(device: &Path, timing: Timing) -> Result<MadTransport, SmpError> {
        let mut port = UmadPort::open(device)?;
        let smi = port.register_agent(QP0, class::SUBN_DIRECTED_ROUTE, class::SMP_CLASS_VERSION)?;
        let sa = port.register_agent(QP1, class::SUBN_ADM, class::SA_CLASS_VERSION)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("umad".into())
            .spawn(move || serve(port, smi, sa, timing, queue))
            .map_err(SmpError::Thread)?;
        Ok(MadTransport {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Sends a request MAD and waits for its response. The transaction id's low 32 bits are
    /// chosen here; the caller's are overwritten.
    pub async fn exchange(
        &self,
        agent: MadAgent,
        address: MadAddress,
        mad: [u8; MAD_LEN],
    ) -> Result<[u8; MAD_LEN], SmpError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            agent,
            address,
            mad,
            reply,
        };
        self.jobs
            .as_ref()
            .ok_or(SmpError::Closed)?
            .send(job)
            .map_err(|_| SmpError::Closed)?;
        answer.await.map_err(|_| SmpError::Closed)?
    }
}

impl Drop for MadTransport {
    fn drop(&mut self) {
        // Closing the channel ends the thread, which unregisters the agents and closes the fd.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(port: UmadPort, smi: AgentId, sa: AgentId, timing: Timing, queue: mpsc::Receiver<Job>) {
    let mut next_tid: u32 = rand::random();
    while let Ok(job) = queue.recv() {
        next_tid = next_tid.wrapping_add(1);
        let agent = match job.agent {
            MadAgent::SubnetManagement => smi,
            MadAgent::SubnetAdministration => sa,
        };
        let result = exchange(&port, agent, &job, next_tid, timing);
        let _ = job.reply.send(result);
    }
}

fn exchange(
    port: &UmadPort,
    agent: AgentId,
    job: &Job,
    tid: u32,
    timing: Timing,
) -> Result<[u8; MAD_LEN], SmpError> {
    let mut mad = job.mad;
    MadHeader::new_unchecked(&mut mad[..]).set_transaction_id(u64::from(tid));
    for _attempt in 0..=timing.retries {
        port.send(agent, &job.address, &mad, timing.timeout)?;
        let deadline = Instant::now() + timing.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Some(received) = port.recv(left)? else {
                continue;
            };
            let header = MadHeader::new_unchecked(&received.mad[..]);
            if !same_transaction(header.transaction_id(), u64::from(tid)) {
                continue; // a late answer to an earlier attempt, or unsolicited
            }
            if received.status != 0 || header.method() & method::RESPONSE_BIT == 0 {
                break; // the kernel gave our send back: no answer in time
            }
            return Ok(received.mad);
        }
    }
    Err(SmpError::Timeout {
        attempts: timing.retries + 1,
    })
}
