//! The bytes of a umad buffer: the `struct ib_user_mad` header the kernel (and umad2sim) read
//! and write, followed by the MAD.
//!
//! Header (host byte order): `agent_id` u32 @0, `status` u32 @4, `timeout_ms` u32 @8,
//! `retries` u32 @12, `length` u32 @16, then the address; the MAD starts at [`UMAD_HDR`]
//! (`umad_size()` in libibumad). MAD (big-endian): `mgmt_class` @1, `method` @3 (response
//! bit 0x80), transaction id u64 @8.

use std::time::Duration;

/// Size of `struct ib_user_mad` (libibumad's `umad_size()`): where the MAD starts.
pub const UMAD_HDR: usize = 64;
/// Size of the common MAD header (up to and including the attribute modifier).
pub const MAD_HDR: usize = 24;
/// Largest MAD block the interposer keeps a copy of (a MAD is 256 bytes; RMPP segments are
/// only sent as responses, which are never tracked).
pub const MAD_BLOCK: usize = 256;
/// `ETIMEDOUT`: the status the kernel reports on a send whose response never came.
pub const ETIMEDOUT: u32 = 110;

const STATUS_AT: usize = 4;
const TIMEOUT_AT: usize = 8;
const RETRIES_AT: usize = 12;
const RESPONSE_BIT: u8 = 0x80;
const METHOD_TRAP_REPRESS: u8 = 0x07;

/// The key a response is matched with: management class and the low 32 bits of the
/// transaction id (what OpenSM's `get_madw` compares; umad2sim puts the agent id above them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Management class (MAD byte 1).
    pub class: u8,
    /// Low 32 bits of the transaction id.
    pub tid: u32,
}

/// A send that expects a response: its key and how long the kernel would wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// What its response carries.
    pub key: Key,
    /// `timeout_ms` × (`retries` + 1).
    pub wait: Duration,
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at + 4)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// The MAD's key and method, when `buf` holds a header and at least a MAD header.
fn key_and_method(buf: &[u8]) -> Option<(Key, u8)> {
    let mad = buf.get(UMAD_HDR..UMAD_HDR + MAD_HDR)?;
    let tid = u32::from_be_bytes([mad[12], mad[13], mad[14], mad[15]]);
    Some((Key { class: mad[1], tid }, mad[3]))
}

/// `buf` (what a caller writes) as a request the kernel would complete with a response or a
/// timeout: a method without the response bit, not a TrapRepress, and `timeout_ms` > 0.
pub fn request(buf: &[u8]) -> Option<Request> {
    let timeout_ms = u32_at(buf, TIMEOUT_AT)?;
    let retries = u32_at(buf, RETRIES_AT)?;
    let (key, method) = key_and_method(buf)?;
    if timeout_ms == 0 || method & RESPONSE_BIT != 0 || method == METHOD_TRAP_REPRESS {
        return None;
    }
    let wait = u64::from(timeout_ms) * (u64::from(retries) + 1);
    Some(Request {
        key,
        wait: Duration::from_millis(wait),
    })
}

/// `buf` (what a read returned) as the completion of a request: its key, when it is a
/// response, or a MAD returned with a nonzero status (ibsim returns a request it drops, e.g. one
/// to a port no client serves, at once with status `ETIMEDOUT`).
pub fn completion(buf: &[u8]) -> Option<Key> {
    let (key, method) = key_and_method(buf)?;
    let status = u32_at(buf, STATUS_AT)?;
    (method & RESPONSE_BIT != 0 || status != 0).then_some(key)
}

/// Sets the header's `status` (no-op on a buffer shorter than the header).
pub fn set_status(buf: &mut [u8], status: u32) {
    if let Some(b) = buf.get_mut(STATUS_AT..STATUS_AT + 4) {
        b.copy_from_slice(&status.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A umad buffer with the given header fields and MAD header.
    fn umad(timeout_ms: u32, retries: u32, class: u8, method: u8, tid: u64) -> Vec<u8> {
        let mut b = vec![0u8; UMAD_HDR + MAD_BLOCK];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[8..12].copy_from_slice(&timeout_ms.to_ne_bytes());
        b[12..16].copy_from_slice(&retries.to_ne_bytes());
        let m = UMAD_HDR;
        b[m] = 1;
        b[m + 1] = class;
        b[m + 2] = 1;
        b[m + 3] = method;
        b[m + 8..m + 16].copy_from_slice(&tid.to_be_bytes());
        b
    }

    #[test]
    fn a_trap_with_a_timeout_is_a_request_waiting_timeout_times_tries() {
        let b = umad(200, 3, 0x01, 0x05, 0x0000_1234_0000_1275);
        let r = request(&b).expect("request");
        assert_eq!(
            r.key,
            Key {
                class: 0x01,
                tid: 0x1275
            }
        );
        assert_eq!(r.wait, Duration::from_millis(800));
    }

    #[test]
    fn no_timeout_response_bit_trap_repress_or_short_buffer_is_no_request() {
        assert_eq!(request(&umad(0, 3, 0x81, 0x01, 5)), None);
        assert_eq!(request(&umad(200, 3, 0x81, 0x81, 5)), None);
        assert_eq!(request(&umad(200, 3, 0x01, 0x07, 5)), None);
        let b = umad(200, 3, 0x81, 0x01, 5);
        assert_eq!(request(&b[..UMAD_HDR + MAD_HDR - 1]), None);
        assert!(request(&b[..UMAD_HDR + MAD_HDR]).is_some());
    }

    #[test]
    fn a_response_completes_keyed_by_class_and_low_tid_bits() {
        // umad2sim puts the agent id in bits 32..48 of what comes back.
        let b = umad(0, 0, 0x81, 0x81, 0x0003_0000_dead_beef);
        let key = Key {
            class: 0x81,
            tid: 0xdead_beef,
        };
        assert_eq!(completion(&b), Some(key));
        assert_eq!(completion(&b[..UMAD_HDR]), None);
    }

    #[test]
    fn an_incoming_request_completes_nothing_unless_it_has_a_status() {
        let mut b = umad(0, 0, 0x81, 0x01, 0x0003_0000_0000_1276);
        assert_eq!(completion(&b), None);
        set_status(&mut b, ETIMEDOUT);
        let key = Key {
            class: 0x81,
            tid: 0x1276,
        };
        assert_eq!(completion(&b), Some(key));
    }

    #[test]
    fn set_status_writes_the_header_status_only() {
        let mut b = umad(200, 3, 0x01, 0x05, 9);
        let before = b.clone();
        set_status(&mut b, ETIMEDOUT);
        assert_eq!(u32_at(&b, STATUS_AT), Some(110));
        assert_eq!(b[..STATUS_AT], before[..STATUS_AT]);
        assert_eq!(b[STATUS_AT + 4..], before[STATUS_AT + 4..]);
        let mut short = vec![0u8; 6];
        set_status(&mut short, ETIMEDOUT);
        assert_eq!(short, vec![0u8; 6]);
    }
}
