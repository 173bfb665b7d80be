//! Links flapped at ibsim's console from a thread, until the flapper is stopped or dropped
//! (which restores every link): every `period`, each node's link is dropped (`Unlink "node"`)
//! and, one period later, restored (`ReLink "node"`) ([`LinkFlapper::start`]); or each time a
//! file changes, dropped at once and restored a moment later ([`LinkFlapper::on_change`]: the
//! moment an SM host agent replaced its partitions file and waits for OpenSM's sweeps).

use super::Fabric;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A running flapper.
pub struct LinkFlapper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl LinkFlapper {
    /// Starts flapping the links of `nodes` (HCA names of the net file) every `period`.
    pub fn start(fabric: &Fabric, nodes: &[String], period: Duration) -> io::Result<LinkFlapper> {
        let mut console = fabric.ibsim_console_writer()?;
        let nodes = nodes.to_vec();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut flaps = 0u64;
            while !stopping.load(Ordering::SeqCst) {
                send_all(&mut console, "Unlink", &nodes);
                std::thread::sleep(period);
                send_all(&mut console, "ReLink", &nodes);
                flaps += 1;
                std::thread::sleep(period);
            }
            flaps
        });
        Ok(LinkFlapper {
            stop,
            thread: Some(thread),
        })
    }

    /// Drops the links of `nodes` as soon as `path`'s bytes change (polled every millisecond),
    /// restores them `down` later, and watches again.
    pub fn on_change(
        fabric: &Fabric,
        nodes: &[String],
        path: &Path,
        down: Duration,
    ) -> io::Result<LinkFlapper> {
        let mut console = fabric.ibsim_console_writer()?;
        let nodes = nodes.to_vec();
        let path = path.to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut flaps = 0u64;
            let mut last = std::fs::read(&path).ok();
            while !stopping.load(Ordering::SeqCst) {
                let now = std::fs::read(&path).ok();
                if now != last {
                    last = now;
                    send_all(&mut console, "Unlink", &nodes);
                    std::thread::sleep(down);
                    send_all(&mut console, "ReLink", &nodes);
                    flaps += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            flaps
        });
        Ok(LinkFlapper {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops flapping (every link restored) and returns how many down-up cycles ran.
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .map_or(0, |t| t.join().unwrap_or_default())
    }
}

impl Drop for LinkFlapper {
    fn drop(&mut self) {
        self.halt();
    }
}

fn send_all(console: &mut File, command: &str, nodes: &[String]) {
    for n in nodes {
        let _ = writeln!(console, "{command} \"{n}\"");
    }
    let _ = console.flush();
}
