//! The umad device (`/dev/infiniband/umadN`): send and receive management datagrams.
//!
//! One [`UmadPort`] owns one open device: it reads the ABI version, registers one agent per
//! management class and unregisters them on drop. MADs travel behind the kernel's default
//! 56-byte `ib_user_mad_hdr` (no P_Key index; QP0 and QP1 traffic uses index 0).
//! Every call goes through the libc symbols `open`, `ioctl`, `write`, `poll`, `read` and
//! `close`, so an LD_PRELOADed shim sees them all. All calls block: drive a port from a thread
//! of its own (its fd may be a shim's fake fd that no event loop can watch).
//!
//! Under umad2sim (the ibsim fabric's shim): the ABI version file exists in the shim's sysfs
//! snapshot, so the check holds there too; the shim hands out fake fds from 1024 up and
//! captures every call on fds >= 1024, so a process using it must keep its real fds below
//! 1024; it answers `read` with `-EWOULDBLOCK` as a value when nothing is queued, which
//! [`UmadPort::recv`] tolerates (it always polls first); and it rewrites transaction id bits
//! 32..63, so replies are matched on the low 32 bits.

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::os::fd::{IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The ABI version this module speaks.
pub const ABI_VERSION: u32 = 5;
/// Where the kernel publishes the ABI version.
pub const ABI_VERSION_PATH: &str = "/sys/class/infiniband_mad/abi_version";
/// Length of a MAD.
pub const MAD_LEN: usize = 256;
/// Length of `ib_user_mad_hdr` as the kernel uses it by default (without
/// `IB_USER_MAD_ENABLE_PKEY`, so without a P_Key index); umad2sim uses the same layout.
pub const HEADER_LEN: usize = 56;
/// The queue pair of the subnet management classes.
pub const QP0: u32 = 0;
/// The queue pair of every other class (SA, ...).
pub const QP1: u32 = 1;
/// The well-known Q_Key of QP1.
pub const QP1_QKEY: u32 = 0x8001_0000;

/// Byte offsets inside `ib_user_mad_hdr`. `id`..`length` are host-endian; the address fields
/// are big-endian.
mod hdr {
    use std::ops::Range;
    pub const ID: Range<usize> = 0..4;
    pub const STATUS: Range<usize> = 4..8;
    pub const TIMEOUT_MS: Range<usize> = 8..12;
    pub const RETRIES: Range<usize> = 12..16;
    pub const LENGTH: Range<usize> = 16..20;
    pub const QPN: Range<usize> = 20..24;
    pub const QKEY: Range<usize> = 24..28;
    pub const LID: Range<usize> = 28..30;
    pub const SL: usize = 30;
    pub const PATH_BITS: usize = 31;
}

/// `struct ib_user_mad_reg_req` (28 bytes, 4-byte aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RegReq {
    id: u32,
    method_mask: [u32; 4],
    qpn: u8,
    mgmt_class: u8,
    mgmt_class_version: u8,
    oui: [u8; 3],
    rmpp_version: u8,
}

const _: () = assert!(std::mem::size_of::<RegReq>() == 28);

nix::ioctl_readwrite!(
    /// `IB_USER_MAD_REGISTER_AGENT`: registers an agent; the kernel writes its id back.
    ioctl_register_agent,
    0x1b,
    1,
    RegReq
);
nix::ioctl_write_ptr!(
    /// `IB_USER_MAD_UNREGISTER_AGENT`: unregisters the agent with this id.
    ioctl_unregister_agent,
    0x1b,
    2,
    u32
);

/// Why a umad operation failed. Each variant keeps the real errno.
#[derive(Debug, Error)]
pub enum UmadError {
    /// The device could not be opened.
    #[error("cannot open {path}: {errno}")]
    Open {
        /// The device.
        path: PathBuf,
        /// The errno.
        errno: Errno,
    },
    /// The ABI version file could not be read.
    #[error("cannot read {ABI_VERSION_PATH}: {0}")]
    AbiRead(Errno),
    /// The kernel speaks another ABI.
    #[error("umad ABI version {0:?} is not supported (need {ABI_VERSION})")]
    AbiVersion(String),
    /// Registering an agent failed.
    #[error("cannot register an agent for class {class:#04x}: {errno}")]
    Register {
        /// The management class.
        class: u8,
        /// The errno.
        errno: Errno,
    },
    /// A class already has an agent on this port.
    #[error("class {0:#04x} already has an agent on this port")]
    DuplicateAgent(u8),
    /// Sending failed.
    #[error("umad write failed: {0}")]
    Write(Errno),
    /// The device took fewer bytes than a whole MAD.
    #[error("umad write took {written} of {expected} bytes")]
    ShortWrite {
        /// Bytes taken.
        written: usize,
        /// Bytes offered.
        expected: usize,
    },
    /// Waiting for a MAD failed.
    #[error("umad poll failed: {0}")]
    Poll(Errno),
    /// Reading a MAD failed.
    #[error("umad read failed: {0}")]
    Read(Errno),
    /// A read returned less than a header.
    #[error("umad read returned {0} bytes, less than a header")]
    ShortRead(usize),
}

/// An agent registered on a port: one per management class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentId(pub u32);

/// Where a MAD goes (or came from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadAddress {
    /// Remote queue pair (0 for SMPs, 1 for SA).
    pub qpn: u32,
    /// Q_Key ([`QP1_QKEY`] for QP1, 0 for QP0).
    pub qkey: u32,
    /// Remote LID (0xFFFF, the permissive LID, for directed-route SMPs).
    pub lid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub path_bits: u8,
}

impl MadAddress {
    /// The address of a directed-route SMP.
    pub fn directed_route() -> MadAddress {
        MadAddress {
            qpn: QP0,
            lid: 0xFFFF,
            ..Default::default()
        }
    }

    /// The address of the subnet administrator at `sm_lid`.
    pub fn subnet_administrator(sm_lid: u16) -> MadAddress {
        MadAddress {
            qpn: QP1,
            qkey: QP1_QKEY,
            lid: sm_lid,
            ..Default::default()
        }
    }
}

/// A MAD read from the device.
#[derive(Debug, Clone)]
pub struct ReceivedMad {
    /// The agent it was delivered to.
    pub agent: AgentId,
    /// Status from the kernel: 0, or an errno such as ETIMEDOUT when this is a send of ours
    /// that got no answer.
    pub status: u32,
    /// The sender.
    pub address: MadAddress,
    /// The MAD (zero-padded when the device delivered fewer than 256 bytes).
    pub mad: [u8; MAD_LEN],
}

/// An open umad device with its agents.
#[derive(Debug)]
pub struct UmadPort {
    /// Closed explicitly in `Drop`: under umad2sim this is a fake fd (>= 1024) that only the
    /// shim's `close` knows, and std's `OwnedFd` would abort on an unexpected close result.
    fd: RawFd,
    agents: Vec<(u8, AgentId)>,
}

fn ne_u32(buf: &[u8], r: std::ops::Range<usize>) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&buf[r]);
    u32::from_ne_bytes(a)
}

fn be_u32(buf: &[u8], r: std::ops::Range<usize>) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&buf[r]);
    u32::from_be_bytes(a)
}

/// Reads a small text file through the libc `open` symbol (so a preloaded shim can redirect
/// it; Rust's std uses `open64`, which shims usually do not wrap).
pub fn read_text_file(path: &Path) -> Result<String, Errno> {
    let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut buf = [0u8; 256];
    let mut len = 0;
    loop {
        let n = nix::unistd::read(&fd, &mut buf[len..])?;
        if n == 0 || len + n == buf.len() {
            len += n;
            break;
        }
        len += n;
    }
    Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
}

/// Turns a raw libc return into a byte count. Some shims return `-errno` as a value instead
/// of `-1` + errno, so any negative value is an error.
fn byte_count(ret: isize) -> Result<usize, Errno> {
    match ret {
        -1 => Err(Errno::last()),
        r if r < 0 => Err(Errno::from_raw(i32::try_from(-r).unwrap_or(libc::EIO))),
        r => Ok(r.unsigned_abs()),
    }
}

/// The umad2sim shim's library file name (ibsim's userspace umad, loaded with LD_PRELOAD).
pub const UMAD2SIM_LIBRARY: &str = "libumad2sim.so";

/// Whether the umad2sim shim is (or will be) in this process: loaded (its library among the
/// mappings of `/proc/self/maps`) or preloaded (named in `LD_PRELOAD`, as `check-config` run
/// with the service's environment sees it). Returns what gave it away.
///
/// Under the shim, one process may have only one user per umad device: the shim routes every
/// answer by management class to the last fd that registered that class on the device, and
/// when that fd is closed its receiver thread dereferences the freed fd's queue (a NULL pointer
/// since `close` cleared the slot) on the next answer of that class and the whole process dies
/// with SIGSEGV. Two users that open the same device (the SMP observer, the SMInfo read, the
/// port-ownership SA check, the SA presence check) therefore crash an agent under the shim,
/// while on a kernel each fd's agents are apart.
pub fn umad2sim_in_process() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let preload = std::env::var("LD_PRELOAD").ok();
    umad2sim_named(&maps, preload.as_deref())
}

/// [`umad2sim_in_process`] on given texts.
fn umad2sim_named(maps: &str, ld_preload: Option<&str>) -> Option<String> {
    if let Some(line) = maps.lines().find(|l| l.ends_with(UMAD2SIM_LIBRARY)) {
        let path = line.split_whitespace().last().unwrap_or(UMAD2SIM_LIBRARY);
        return Some(format!("{path} is loaded in this process"));
    }
    let preload = ld_preload?;
    preload
        .split([':', ' '])
        .find(|entry| entry.ends_with(UMAD2SIM_LIBRARY))
        .map(|entry| format!("LD_PRELOAD names {entry}"))
}

impl UmadPort {
    /// Opens a umad device and checks the ABI version. The P_Key index header is left off
    /// (no `IB_USER_MAD_ENABLE_PKEY`): MADs use the default 56-byte header, see [`HEADER_LEN`].
    pub fn open(path: &Path) -> Result<UmadPort, UmadError> {
        let fd = nix::fcntl::open(path, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty()).map_err(
            |errno| UmadError::Open {
                path: path.to_owned(),
                errno,
            },
        )?;
        let abi = read_text_file(Path::new(ABI_VERSION_PATH)).map_err(UmadError::AbiRead)?;
        if abi.parse::<u32>() != Ok(ABI_VERSION) {
            return Err(UmadError::AbiVersion(abi));
        }
        Ok(UmadPort {
            fd: fd.into_raw_fd(),
            agents: Vec::new(),
        })
    }

    /// Registers the agent of a management class (no unsolicited methods: responses only).
    pub fn register_agent(
        &mut self,
        qpn: u32,
        mgmt_class: u8,
        class_version: u8,
    ) -> Result<AgentId, UmadError> {
        if self.agents.iter().any(|(c, _)| *c == mgmt_class) {
            return Err(UmadError::DuplicateAgent(mgmt_class));
        }
        let mut req = RegReq {
            qpn: u8::try_from(qpn).unwrap_or(u8::MAX),
            mgmt_class,
            mgmt_class_version: class_version,
            ..Default::default()
        };
        // SAFETY: `req` is a live, correctly laid-out ib_user_mad_reg_req the kernel fills in.
        unsafe { ioctl_register_agent(self.fd, &mut req) }.map_err(|errno| {
            UmadError::Register {
                class: mgmt_class,
                errno,
            }
        })?;
        let id = AgentId(req.id);
        self.agents.push((mgmt_class, id));
        Ok(id)
    }

    /// Sends one MAD. `timeout` is the kernel's wait for the response (0 = none expected).
    pub fn send(
        &self,
        agent: AgentId,
        address: &MadAddress,
        mad: &[u8; MAD_LEN],
        timeout: Duration,
    ) -> Result<(), UmadError> {
        let mut buf = [0u8; HEADER_LEN + MAD_LEN];
        let len = HEADER_LEN + MAD_LEN;
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        buf[hdr::ID].copy_from_slice(&agent.0.to_ne_bytes());
        buf[hdr::TIMEOUT_MS].copy_from_slice(&timeout_ms.to_ne_bytes());
        buf[hdr::RETRIES].copy_from_slice(&0u32.to_ne_bytes());
        // A few hundred bytes: always fits.
        let len32 = u32::try_from(len).unwrap_or(u32::MAX);
        buf[hdr::LENGTH].copy_from_slice(&len32.to_ne_bytes());
        buf[hdr::QPN].copy_from_slice(&address.qpn.to_be_bytes());
        buf[hdr::QKEY].copy_from_slice(&address.qkey.to_be_bytes());
        buf[hdr::LID].copy_from_slice(&address.lid.to_be_bytes());
        buf[hdr::SL] = address.sl;
        buf[hdr::PATH_BITS] = address.path_bits;
        buf[HEADER_LEN..len].copy_from_slice(mad);
        // SAFETY: writes `len` initialised bytes of `buf` (len <= buf.len()) to an owned fd.
        let ret = unsafe { libc::write(self.fd, buf.as_ptr().cast(), len) };
        let written = byte_count(ret).map_err(UmadError::Write)?;
        if written != len {
            return Err(UmadError::ShortWrite {
                written,
                expected: len,
            });
        }
        Ok(())
    }

    /// Waits up to `timeout` for a MAD; `Ok(None)` when none arrived in time.
    pub fn recv(&self, timeout: Duration) -> Result<Option<ReceivedMad>, UmadError> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `pfd` is one valid pollfd and the count passed is 1.
        let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        match ready {
            0 => return Ok(None),
            r if r < 0 => {
                let errno = Errno::last();
                return if errno == Errno::EINTR {
                    Ok(None)
                } else {
                    Err(UmadError::Poll(errno))
                };
            }
            _ => {}
        }
        let mut buf = [0u8; HEADER_LEN + MAD_LEN];
        let want = HEADER_LEN + MAD_LEN;
        // SAFETY: reads at most `want` (<= buf.len()) bytes into `buf`, from an owned fd.
        let ret = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), want) };
        let got = match byte_count(ret) {
            Ok(n) => n,
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => return Ok(None),
            Err(errno) => return Err(UmadError::Read(errno)),
        };
        if got < HEADER_LEN {
            return Err(UmadError::ShortRead(got));
        }
        let mut mad = [0u8; MAD_LEN];
        mad[..got - HEADER_LEN].copy_from_slice(&buf[HEADER_LEN..got]);
        let mut lid = [0; 2];
        lid.copy_from_slice(&buf[hdr::LID]);
        Ok(Some(ReceivedMad {
            agent: AgentId(ne_u32(&buf, hdr::ID)),
            status: ne_u32(&buf, hdr::STATUS),
            address: MadAddress {
                qpn: be_u32(&buf, hdr::QPN),
                qkey: be_u32(&buf, hdr::QKEY),
                lid: u16::from_be_bytes(lid),
                sl: buf[hdr::SL],
                path_bits: buf[hdr::PATH_BITS],
            },
            mad,
        }))
    }
}

impl Drop for UmadPort {
    fn drop(&mut self) {
        for (_, agent) in self.agents.drain(..) {
            // SAFETY: passes a pointer to a live u32 agent id to an ioctl on an owned fd.
            let _ = unsafe { ioctl_unregister_agent(self.fd, &agent.0) };
        }
        // SAFETY: closes the fd this port owns, once; nothing uses it afterwards.
        let _ = unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_values_are_errnos() {
        assert_eq!(byte_count(-11), Err(Errno::EAGAIN));
        assert_eq!(byte_count(312), Ok(312));
    }

    #[test]
    fn missing_device_keeps_its_errno() {
        match UmadPort::open(Path::new("/nonexistent/umad0")) {
            Err(UmadError::Open { errno, .. }) => assert_eq!(errno, Errno::ENOENT),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_shim_is_found_loaded_or_preloaded() {
        let maps = "7f00-7f01 r-xp 0 08:01 42 /usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so\n";
        assert!(umad2sim_named(maps, None).unwrap().contains("is loaded"));
        assert!(umad2sim_named("", Some("/x/libfoo.so:/y/libumad2sim.so"))
            .unwrap()
            .contains("LD_PRELOAD names /y/libumad2sim.so"));
        assert_eq!(
            umad2sim_named("7f00 r-xp /usr/lib/libc.so.6\n", Some("")),
            None
        );
        assert_eq!(umad2sim_named("", None), None);
    }

    #[test]
    fn directed_route_address() {
        let a = MadAddress::directed_route();
        assert_eq!((a.qpn, a.lid), (0, 0xFFFF));
        assert_eq!(MadAddress::subnet_administrator(1).qkey, QP1_QKEY);
    }
}
