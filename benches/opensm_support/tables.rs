//! Reads many ports' P_Key tables fast, with the crate's own SMP code: a child process of the
//! bench, run under the umad2sim shim as one HCA of the fabric, keeps one umad client open and
//! sends LID-routed NodeInfo and P_KeyTable Gets to many ports at once (a window of requests in
//! flight, answers matched by transaction id, a lost one resent), instead of one `smpquery`
//! process per port.
//!
//! The bench's `main` calls [`serve_if_child`] first; [`TableReader::spawn`] starts the child.
//! Protocol on the child's stdin/stdout: a line of LIDs (decimal, space-separated) in, one line
//! per LID out (`<lid> <entry> <entry> ...` in hex, or `<lid> ! <error>`), then a line `.`.
//! The child exits, closing its umad client (and so its ibsim slot), when its stdin closes.

use crate::opensm_support::{secs, Check};
use crate::rig::Fabric;
use fabric_agent::mad::{
    attribute, class, method, pkey_table, MadHeader, NodeInfo, NodeInfoRepr, PKeyTable,
    PKeyTableRepr, Smp, SmpRepr, SmpRouting, MAD_LEN,
};
use fabric_agent::observe::ObserverConfig;
use fabric_agent::sys::umad::{AgentId, MadAddress, UmadPort, QP0};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

/// Set in the child's environment: serve table reads instead of running the bench.
const CHILD_ENV: &str = "FABRIC_AGENT_TABLE_READER";
/// Requests in flight at once (`--read-window N` overrides; the child gets it in `CHILD_ENV`).
const WINDOW: usize = 64;
/// Wait for one answer before it is sent again.
const ANSWER_TIMEOUT: Duration = Duration::from_millis(500);
/// Sends of one request before its port is reported as failed.
const ATTEMPTS: u32 = 6;
/// Wait for the child to exit once its stdin is closed.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// One port's whole P_Key table, or why it could not be read.
pub type Table = Result<Vec<u16>, String>;

/// A table-reading child process (one umad client of the fabric).
pub struct TableReader {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl TableReader {
    /// Starts the reader as fabric node `node` (the bench's own executable under the shim).
    pub fn spawn(fabric: &Fabric, node: &str) -> Check<TableReader> {
        let exe = std::env::current_exe().map_err(|e| format!("FAILED: current_exe: {e}"))?;
        let mut child = fabric
            .client_command(node, exe)
            .env(
                CHILD_ENV,
                crate::support::arg_usize("--read-window", WINDOW).to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("FAILED: starting the table reader: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(TableReader {
            child,
            stdin,
            stdout,
        })
    }

    /// The whole P_Key table of port 1 of each port at `lids`, in order (an error per port
    /// that did not answer). Fails when the child itself fails.
    pub fn read(&mut self, lids: &[u16]) -> Check<Vec<Table>> {
        let line: Vec<String> = lids.iter().map(u16::to_string).collect();
        let stdin = self.stdin.as_mut().ok_or("FAILED: table reader closed")?;
        writeln!(stdin, "{}", line.join(" "))
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("FAILED: table reader: {e}"))?;
        let mut by_lid: HashMap<u16, Table> = HashMap::new();
        loop {
            let mut text = String::new();
            let n = self
                .stdout
                .read_line(&mut text)
                .map_err(|e| format!("FAILED: table reader: {e}"))?;
            if n == 0 {
                return Err("FAILED: the table reader exited".into());
            }
            let text = text.trim_end();
            if text == "." {
                break;
            }
            let (lid, rest) = parse_line(text)?;
            by_lid.insert(lid, rest);
        }
        lids.iter()
            .map(|lid| {
                by_lid
                    .remove(lid)
                    .ok_or_else(|| format!("FAILED: table reader gave no line for LID {lid}"))
            })
            .collect()
    }
}

impl Drop for TableReader {
    fn drop(&mut self) {
        // EOF on stdin ends the child, which closes its umad client; only if it hangs is it
        // killed (by pid), which leaks its ibsim slot.
        self.stdin.take();
        let start = Instant::now();
        while start.elapsed() < EXIT_DEADLINE {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "TIMEOUT: table reader did not exit within {}; killing it",
            secs(EXIT_DEADLINE)
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_line(text: &str) -> Check<(u16, Table)> {
    let bad = || format!("FAILED: table reader sent {text:?}");
    let (lid, rest) = text.split_once(' ').unwrap_or((text, ""));
    let lid: u16 = lid.parse().map_err(|_| bad())?;
    if let Some(error) = rest.strip_prefix("! ") {
        return Ok((lid, Err(error.to_owned())));
    }
    let entries = rest
        .split_whitespace()
        .map(|v| u16::from_str_radix(v, 16))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad())?;
    Ok((lid, Ok(entries)))
}

/// In the child (env set): serves table reads on stdin/stdout until EOF, then exits the
/// process. Returns false in the bench itself.
pub fn serve_if_child() -> bool {
    if std::env::var_os(CHILD_ENV).is_none() {
        return false;
    }
    if let Err(e) = serve() {
        eprintln!("table reader: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

fn serve() -> Result<(), String> {
    let window = std::env::var(CHILD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(WINDOW)
        .max(1);
    let device = ObserverConfig::default().umad_device;
    let mut port = UmadPort::open(&device).map_err(|e| e.to_string())?;
    let agent = port
        .register_agent(QP0, class::SUBN_LID_ROUTED, class::SMP_CLASS_VERSION)
        .map_err(|e| e.to_string())?;
    let mut reader = Reads {
        port,
        agent,
        window,
        next_tid: rand::random(),
        partition_cap: HashMap::new(),
    };
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let lids = line
            .split_whitespace()
            .map(|v| v.parse::<u16>().map_err(|_| format!("bad LID {v:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        for (lid, table) in reader.tables(&lids)? {
            match table {
                Ok(entries) => {
                    let hex: Vec<String> = entries.iter().map(|e| format!("{e:04x}")).collect();
                    writeln!(out, "{lid} {}", hex.join(" "))
                }
                Err(e) => writeln!(out, "{lid} ! {e}"),
            }
            .map_err(|e| e.to_string())?;
        }
        writeln!(out, ".")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What one request asks: a port's NodeInfo (for its table size), or one table block.
#[derive(Debug, Clone, Copy)]
enum Ask {
    NodeInfo,
    Block(u16),
}

impl Ask {
    /// The LID-routed Get that asks this, with transaction id `tid`.
    fn request(self, tid: u32) -> SmpRepr {
        let (attribute_id, attribute_modifier) = match self {
            Ask::NodeInfo => (attribute::NODE_INFO, 0),
            Ask::Block(b) => (attribute::PKEY_TABLE, pkey_table::attribute_modifier(1, b)),
        };
        SmpRepr {
            routing: SmpRouting::LidRouted,
            method: method::GET,
            status: 0,
            transaction_id: u64::from(tid),
            attribute_id,
            attribute_modifier,
            m_key: 0,
            data: [0; fabric_agent::mad::smp::DATA_LEN],
        }
    }
}

/// One request in flight.
struct Sent {
    lid: u16,
    ask: Ask,
    attempts: u32,
    at: Instant,
}

/// The child's state: its umad client and each port's table size, learnt once.
struct Reads {
    port: UmadPort,
    agent: AgentId,
    window: usize,
    next_tid: u32,
    partition_cap: HashMap<u16, u16>,
}

impl Reads {
    /// Reads the whole table of every LID, many requests in flight at once.
    fn tables(&mut self, lids: &[u16]) -> Result<Vec<(u16, Table)>, String> {
        let mut queue: VecDeque<(u16, Ask, u32)> = VecDeque::new();
        let mut blocks: HashMap<u16, Vec<Option<[u16; 32]>>> = HashMap::new();
        let mut failed: HashMap<u16, String> = HashMap::new();
        for &lid in lids {
            match self.partition_cap.get(&lid) {
                Some(&cap) => self.queue_blocks(&mut queue, &mut blocks, lid, cap),
                None => queue.push_back((lid, Ask::NodeInfo, 0)),
            }
        }
        let mut in_flight: HashMap<u32, Sent> = HashMap::new();
        while !queue.is_empty() || !in_flight.is_empty() {
            while in_flight.len() < self.window {
                let Some((lid, ask, attempts)) = queue.pop_front() else {
                    break;
                };
                let tid = self.send(lid, ask)?;
                in_flight.insert(
                    tid,
                    Sent {
                        lid,
                        ask,
                        attempts: attempts + 1,
                        at: Instant::now(),
                    },
                );
            }
            let oldest = in_flight.values().map(|s| s.at).min();
            let wait = oldest.map_or(Duration::ZERO, |at| {
                (at + ANSWER_TIMEOUT).saturating_duration_since(Instant::now())
            });
            if let Some(received) = self.port.recv(wait).map_err(|e| e.to_string())? {
                let tid = MadHeader::new_unchecked(&received.mad[..]).transaction_id() as u32;
                if let Some(sent) = in_flight.remove(&tid) {
                    if received.status != 0 {
                        // The shim or kernel gave our send back unanswered: send it again.
                        self.retry(&mut queue, &mut failed, sent, "no answer".into());
                        continue;
                    }
                    match answer(&received.mad, sent.ask, tid) {
                        Ok(Answered::Cap(cap)) => {
                            self.partition_cap.insert(sent.lid, cap);
                            self.queue_blocks(&mut queue, &mut blocks, sent.lid, cap);
                        }
                        Ok(Answered::Block(b, entries)) => {
                            if let Some(slot) = blocks.get_mut(&sent.lid).and_then(|v| v.get_mut(b))
                            {
                                *slot = Some(entries);
                            }
                        }
                        Err(e) => self.retry(&mut queue, &mut failed, sent, e),
                    }
                }
            }
            let now = Instant::now();
            let late: Vec<u32> = in_flight
                .iter()
                .filter(|(_, s)| now.duration_since(s.at) >= ANSWER_TIMEOUT)
                .map(|(tid, _)| *tid)
                .collect();
            for tid in late {
                if let Some(sent) = in_flight.remove(&tid) {
                    self.retry(&mut queue, &mut failed, sent, "no answer".into());
                }
            }
        }
        Ok(lids
            .iter()
            .map(|lid| {
                let table = match failed.get(lid) {
                    Some(e) => Err(e.clone()),
                    None => blocks
                        .get(lid)
                        .map(|b| b.iter().flatten().flatten().copied().collect())
                        .ok_or_else(|| "not read".to_owned()),
                };
                (*lid, table)
            })
            .collect())
    }

    fn queue_blocks(
        &self,
        queue: &mut VecDeque<(u16, Ask, u32)>,
        blocks: &mut HashMap<u16, Vec<Option<[u16; 32]>>>,
        lid: u16,
        cap: u16,
    ) {
        let n = cap.div_ceil(pkey_table::ENTRIES_PER_BLOCK as u16).max(1);
        blocks.insert(lid, vec![None; usize::from(n)]);
        queue.extend((0..n).map(|b| (lid, Ask::Block(b), 0)));
    }

    /// Sends `sent` again, or after [`ATTEMPTS`] records `why` as its port's failure.
    fn retry(
        &self,
        queue: &mut VecDeque<(u16, Ask, u32)>,
        failed: &mut HashMap<u16, String>,
        sent: Sent,
        why: String,
    ) {
        if sent.attempts < ATTEMPTS {
            queue.push_back((sent.lid, sent.ask, sent.attempts));
        } else {
            failed.insert(sent.lid, format!("{why} after {} attempts", sent.attempts));
        }
    }

    /// Sends one LID-routed Get; returns its transaction id.
    fn send(&mut self, lid: u16, ask: Ask) -> Result<u32, String> {
        self.next_tid = self.next_tid.wrapping_add(1);
        let request = ask.request(self.next_tid);
        let mut mad = [0u8; MAD_LEN];
        request.emit(&mut Smp::new_unchecked(&mut mad[..]));
        let address = MadAddress {
            qpn: QP0,
            lid,
            ..Default::default()
        };
        self.port
            .send(self.agent, &address, &mad, ANSWER_TIMEOUT)
            .map_err(|e| e.to_string())?;
        Ok(self.next_tid)
    }
}

enum Answered {
    Cap(u16),
    Block(usize, [u16; 32]),
}

/// Reads the answer to `ask` sent with transaction id `tid`; anything else is an error.
fn answer(mad: &[u8; MAD_LEN], ask: Ask, tid: u32) -> Result<Answered, String> {
    let smp = Smp::new_checked(&mad[..]).map_err(|e| e.to_string())?;
    let reply = SmpRepr::parse(&smp).map_err(|e| e.to_string())?;
    if !reply.answers(&ask.request(tid)) {
        return Err(format!(
            "not an answer to {ask:?}: method {:#04x}, attribute {:#06x}/{:#x}",
            reply.method, reply.attribute_id, reply.attribute_modifier
        ));
    }
    if reply.status != 0 {
        return Err(format!("status {:#06x}", reply.status));
    }
    match ask {
        Ask::NodeInfo => {
            let info = NodeInfoRepr::parse(
                &NodeInfo::new_checked(&reply.data[..]).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?;
            Ok(Answered::Cap(info.partition_cap))
        }
        Ask::Block(b) => {
            let block = PKeyTableRepr::parse(
                &PKeyTable::new_checked(&reply.data[..]).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?;
            Ok(Answered::Block(usize::from(b), block.entries))
        }
    }
}
