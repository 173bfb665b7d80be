//! The umad file descriptors and their outstanding requests, with the kernel's rules: a
//! response completes its request; a request whose deadline passed completes with
//! `ETIMEDOUT`. Pure: the caller passes the time.

use crate::mad::{self, Key, Request};
use std::time::Instant;

/// One send waiting for its response.
#[derive(Debug)]
struct Pending {
    fd: i32,
    key: Key,
    deadline: Instant,
    /// The header and MAD as written, returned with status `ETIMEDOUT` at the deadline.
    copy: Vec<u8>,
}

/// The tracked umad fds and their outstanding requests.
#[derive(Debug, Default)]
pub struct Table {
    fds: Vec<i32>,
    pending: Vec<Pending>,
}

impl Table {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            fds: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Starts tracking `fd` (a umad device just opened).
    pub fn open(&mut self, fd: i32) {
        self.close(fd);
        self.fds.push(fd);
    }

    /// Forgets `fd` and its outstanding requests.
    pub fn close(&mut self, fd: i32) {
        self.fds.retain(|&f| f != fd);
        self.pending.retain(|p| p.fd != fd);
    }

    /// Whether `fd` is a tracked umad fd.
    pub fn tracks(&self, fd: i32) -> bool {
        self.fds.contains(&fd)
    }

    /// Remembers `req`, written as `buf` on `fd` at `now` (a request with the same key on the
    /// same fd is replaced). Only the header and one MAD block are kept.
    pub fn sent(&mut self, fd: i32, req: Request, buf: &[u8], now: Instant) {
        self.answered(fd, req.key);
        let copy = buf[..buf.len().min(mad::UMAD_HDR + mad::MAD_BLOCK)].to_vec();
        self.pending.push(Pending {
            fd,
            key: req.key,
            deadline: now + req.wait,
            copy,
        });
    }

    /// Forgets the request on `fd` that `key` answers (or whose write failed); whether there
    /// was one.
    pub fn answered(&mut self, fd: i32, key: Key) -> bool {
        match self.pending.iter().position(|p| p.fd == fd && p.key == key) {
            Some(i) => {
                self.pending.remove(i);
                true
            }
            None => false,
        }
    }

    /// The request on `fd` whose deadline passed first (by `now`), removed, as the buffer a
    /// read returns: its copy with status `ETIMEDOUT`.
    pub fn take_expired(&mut self, fd: i32, now: Instant) -> Option<Vec<u8>> {
        let i = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.fd == fd && p.deadline <= now)
            .min_by_key(|(_, p)| p.deadline)
            .map(|(i, _)| i)?;
        let mut copy = self.pending.remove(i).copy;
        mad::set_status(&mut copy, mad::ETIMEDOUT);
        Some(copy)
    }

    /// Whether a request on `fd` is past its deadline at `now`.
    pub fn expired(&self, fd: i32, now: Instant) -> bool {
        self.pending.iter().any(|p| p.fd == fd && p.deadline <= now)
    }

    /// The earliest deadline of a request on an fd `polled` accepts.
    pub fn next_deadline(&self, polled: impl Fn(i32) -> bool) -> Option<Instant> {
        self.pending
            .iter()
            .filter(|p| polled(p.fd))
            .map(|p| p.deadline)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(class: u8, tid: u32, ms: u64) -> Request {
        Request {
            key: Key { class, tid },
            wait: Duration::from_millis(ms),
        }
    }

    fn buf(tag: u8) -> Vec<u8> {
        let mut b = vec![tag; mad::UMAD_HDR + mad::MAD_BLOCK + 100];
        b[4..8].copy_from_slice(&0u32.to_ne_bytes());
        b
    }

    #[test]
    fn tracks_opened_fds_until_closed() {
        let mut t = Table::new();
        t.open(1024);
        assert!(t.tracks(1024));
        assert!(!t.tracks(3));
        t.close(1024);
        assert!(!t.tracks(1024));
    }

    #[test]
    fn an_unanswered_request_comes_back_timed_out_at_its_deadline_once() {
        let mut t = Table::new();
        let t0 = Instant::now();
        t.open(1024);
        t.sent(1024, req(1, 0x1275, 800), &buf(0xab), t0);
        let before = t0 + Duration::from_millis(799);
        assert!(!t.expired(1024, before));
        assert_eq!(t.take_expired(1024, before), None);
        assert_eq!(
            t.next_deadline(|fd| fd == 1024),
            Some(t0 + Duration::from_millis(800))
        );
        assert_eq!(t.next_deadline(|fd| fd == 1025), None);
        let at = t0 + Duration::from_millis(800);
        assert!(t.expired(1024, at));
        assert!(!t.expired(1025, at));
        let got = t.take_expired(1024, at).expect("timed out");
        assert_eq!(got.len(), mad::UMAD_HDR + mad::MAD_BLOCK);
        assert_eq!(got[4..8], mad::ETIMEDOUT.to_ne_bytes());
        assert!(got[8..].iter().all(|&b| b == 0xab));
        assert_eq!(t.take_expired(1024, at + Duration::from_secs(5)), None);
        assert_eq!(t.next_deadline(|_| true), None);
    }

    #[test]
    fn a_response_completes_only_the_request_with_its_fd_class_and_tid() {
        let mut t = Table::new();
        let t0 = Instant::now();
        t.sent(1024, req(1, 7, 100), &buf(1), t0);
        t.sent(1024, req(0x81, 7, 100), &buf(2), t0);
        t.sent(1032, req(1, 7, 100), &buf(3), t0);
        assert!(!t.answered(1024, Key { class: 1, tid: 8 }));
        assert!(t.answered(1024, Key { class: 1, tid: 7 }));
        assert!(!t.answered(1024, Key { class: 1, tid: 7 }));
        let later = t0 + Duration::from_secs(1);
        assert_eq!(t.take_expired(1024, later).map(|b| b[8]), Some(2));
        assert_eq!(t.take_expired(1024, later), None);
        assert_eq!(t.take_expired(1032, later).map(|b| b[8]), Some(3));
    }

    #[test]
    fn the_earliest_deadline_times_out_first_and_a_resend_replaces() {
        let mut t = Table::new();
        let t0 = Instant::now();
        t.sent(1024, req(1, 1, 500), &buf(1), t0);
        t.sent(1024, req(1, 2, 100), &buf(2), t0);
        t.sent(1024, req(1, 1, 900), &buf(9), t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(t.take_expired(1024, later).map(|b| b[8]), Some(2));
        assert_eq!(t.take_expired(1024, later).map(|b| b[8]), Some(9));
        assert_eq!(t.take_expired(1024, later), None);
    }

    #[test]
    fn closing_an_fd_forgets_its_requests() {
        let mut t = Table::new();
        let t0 = Instant::now();
        t.open(1024);
        t.sent(1024, req(1, 1, 1), &buf(1), t0);
        t.close(1024);
        assert_eq!(t.take_expired(1024, t0 + Duration::from_secs(1)), None);
    }
}
