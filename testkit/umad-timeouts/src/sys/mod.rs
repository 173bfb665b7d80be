//! The C side: the libc functions this library interposes, each calling the next definition
//! (umad2sim's, then libc's) found with `dlsym(RTLD_NEXT)`.
//!
//! The table's mutex is never held while a next definition runs, so it cannot be taken in an
//! order inverse to umad2sim's own mutexes (umad2sim calls `write` on its socket with its
//! device mutex held; that call comes through here and only takes the table's mutex briefly).

use crate::mad;
use crate::table::Table;
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!(
    "open() is defined with a fixed mode argument: only checked for x86_64/aarch64 Linux"
);

/// Longest single wait in the next `poll`, so that a deadline is noticed in time.
const POLL_SLICE: Duration = Duration::from_millis(50);
/// The umad device files' prefix (`/dev/infiniband/umad0`, ...).
const UMAD_PATH: &[u8] = b"/dev/infiniband/umad";
/// `POLLIN` of `<poll.h>`.
const POLLIN: i16 = 0x001;
/// `RTLD_NEXT` of glibc's `<dlfcn.h>`.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// `struct pollfd`.
#[repr(C)]
pub struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, usize) -> isize;
type PollFn = unsafe extern "C" fn(*mut PollFd, c_ulong, c_int) -> c_int;

static TABLE: Mutex<Table> = Mutex::new(Table::new());

/// The table (a panic cannot happen while it is held, but poisoning is ignored anyway).
fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The next definition of `name`, looked up once into `slot` (a race looks it up twice and
/// stores the same pointer). Aborts when there is none: libc defines all five.
fn next(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let cached = slot.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // SAFETY: `name` is a NUL-terminated string; RTLD_NEXT is a valid pseudo-handle for a
    // lookup from a shared object.
    let found = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    if found.is_null() {
        std::process::abort();
    }
    slot.store(found, Ordering::Release);
    found
}

macro_rules! next_fn {
    ($fn_name:ident, $ty:ty, $sym:literal) => {
        fn $fn_name() -> $ty {
            static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let p = next(&SLOT, $sym);
            // SAFETY: `p` is the address of the next definition of the libc function of that
            // name, whose C signature `$ty` is.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }
    };
}

next_fn!(next_open, OpenFn, c"open");
next_fn!(next_close, CloseFn, c"close");
next_fn!(next_read, ReadFn, c"read");
next_fn!(next_write, WriteFn, c"write");
next_fn!(next_poll, PollFn, c"poll");

/// `open(2)`: tracks the fd of a umad device.
///
/// Defined with a fixed `mode` argument (stable Rust cannot define a variadic function): on
/// x86_64 and aarch64 Linux a variadic caller passes it in the same register, and when the
/// caller passed none the value is unspecified but only read by the next `open` under
/// `O_CREAT`/`O_TMPFILE`, when the caller must pass it.
///
/// # Safety
/// As `open(2)`: `path` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged (`mode` as the variadic argument).
    let fd = unsafe { next_open()(path, flags, mode) };
    // SAFETY: `path` is NUL-terminated (the caller's contract) and was just read by `open`.
    if fd >= 0
        && !path.is_null()
        && unsafe { CStr::from_ptr(path) }
            .to_bytes()
            .starts_with(UMAD_PATH)
    {
        table().open(fd);
    }
    fd
}

/// `close(2)`: forgets a tracked fd and its requests.
///
/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    table().close(fd);
    // SAFETY: the caller's argument, passed on unchanged.
    unsafe { next_close()(fd) }
}

/// `write(2)`: remembers a request sent on a tracked fd before passing it on.
///
/// # Safety
/// As `write(2)`: `buf` is valid for reading `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: usize) -> isize {
    let mut sent = None;
    if !buf.is_null() {
        let mut t = table();
        if t.tracks(fd) {
            // SAFETY: the caller's buffer of `count` readable bytes, not written meanwhile.
            let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) };
            if let Some(req) = mad::request(bytes) {
                // Remembered before it leaves: the response may be read before write returns.
                t.sent(fd, req, bytes, Instant::now());
                sent = Some(req.key);
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { next_write()(fd, buf, count) };
    if let (true, Some(key)) = (n < 0, sent) {
        table().answered(fd, key);
    }
    n
}

/// `read(2)`: on a tracked fd, a request past its deadline comes back with status `ETIMEDOUT`;
/// otherwise the next read, and a response (or a request ibsim returned with a status) it
/// returns completes its request.
///
/// # Safety
/// As `read(2)`: `buf` is valid for writing `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    let expired = {
        let mut t = table();
        match t.tracks(fd) && !buf.is_null() {
            true => Some(t.take_expired(fd, Instant::now())),
            false => None,
        }
    };
    match expired {
        Some(Some(copy)) => {
            let n = copy.len().min(count);
            // SAFETY: `buf` is valid for `count` >= `n` bytes (the caller's contract) and
            // does not overlap the table's own copy.
            unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), buf.cast::<u8>(), n) };
            n as isize
        }
        Some(None) => {
            // SAFETY: the caller's arguments, passed on unchanged.
            let n = unsafe { next_read()(fd, buf, count) };
            if n > 0 {
                let len = (n as usize).min(count);
                // SAFETY: the next read filled the first `len` bytes of the caller's buffer.
                let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
                if let Some(key) = mad::completion(bytes) {
                    table().answered(fd, key);
                }
            }
            n
        }
        // SAFETY: the caller's arguments, passed on unchanged.
        None => unsafe { next_read()(fd, buf, count) },
    }
}

/// `poll(2)`: with a tracked fd among `fds`, waits in slices of at most [`POLL_SLICE`] and
/// reports `POLLIN` on a tracked fd whose request passed its deadline.
///
/// # Safety
/// As `poll(2)`: `fds` points to `nfds` `pollfd`s.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut PollFd, nfds: c_ulong, timeout: c_int) -> c_int {
    let poll_next = next_poll();
    if fds.is_null() || nfds == 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { poll_next(fds, nfds, timeout) };
    }
    // SAFETY: the caller's array of `nfds` pollfds, ours until poll returns.
    let list = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    if !list.iter().any(|p| table().tracks(p.fd)) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { poll_next(list.as_mut_ptr(), nfds, timeout) };
    }
    let until = u64::try_from(timeout)
        .ok()
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    loop {
        let now = Instant::now();
        let (due, deadline) = {
            let t = table();
            let due = list
                .iter()
                .position(|p| t.tracks(p.fd) && t.expired(p.fd, now));
            (due, t.next_deadline(|fd| list.iter().any(|p| p.fd == fd)))
        };
        if let Some(i) = due {
            for p in list.iter_mut() {
                p.revents = 0;
            }
            list[i].revents = POLLIN;
            return 1;
        }
        let mut wait = POLL_SLICE;
        for limit in [until, deadline].into_iter().flatten() {
            wait = wait.min(limit.saturating_duration_since(now));
        }
        let ms = wait.as_nanos().div_ceil(1_000_000) as c_int;
        // SAFETY: the caller's array (through `list`), a timeout of at most 50 ms.
        let n = unsafe { poll_next(list.as_mut_ptr(), nfds, ms) };
        if n != 0 || until.is_some_and(|u| Instant::now() >= u) {
            return n;
        }
    }
}
