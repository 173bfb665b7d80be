//! The device list and open device contexts, with the queries the observers need.

use super::convert::{be16_to_host, be64_to_host, AsyncEvent, Gid};
use super::{check_rc, VerbsError};
use rdma_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::mem::{offset_of, size_of, MaybeUninit};
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};

/// The array `ibv_get_device_list` returns, freed on drop.
///
/// Devices are opened from the list; an opened [`Device`] stays valid after the list is freed
/// (libibverbs documents exactly that).
pub struct DeviceList {
    /// NULL-terminated array, or `None` when the kernel has no RDMA support.
    raw: Option<NonNull<*mut ffi::ibv_device>>,
    len: usize,
}

impl DeviceList {
    /// Lists the RDMA devices libibverbs can see.
    ///
    /// With no RDMA in the kernel, `ibv_get_device_list` returns NULL with errno `ENOSYS`: that
    /// is zero devices (see [`DeviceList::kernel_has_rdma`]), not an error. Any other NULL
    /// return is an error carrying its errno.
    pub fn get() -> Result<DeviceList, VerbsError> {
        let mut count: libc::c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the duration of the call.
        let raw = unsafe { ffi::ibv_get_device_list(&mut count) };
        let Some(raw) = NonNull::new(raw) else {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(DeviceList { raw: None, len: 0 });
            }
            return Err(VerbsError::Library {
                call: "ibv_get_device_list",
                source,
            });
        };
        // A negative count never happens with a non-NULL list; treat it as empty.
        let len = usize::try_from(count).unwrap_or(0);
        Ok(DeviceList {
            raw: Some(raw),
            len,
        })
    }

    /// False when libibverbs reported `ENOSYS` (the kernel has no RDMA subsystem).
    pub fn kernel_has_rdma(&self) -> bool {
        self.raw.is_some()
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no device was found.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn entry(&self, index: usize) -> Option<*mut ffi::ibv_device> {
        let raw = self.raw?;
        if index >= self.len {
            return None;
        }
        // SAFETY: the array holds `len` device pointers (plus a NULL terminator) and stays
        // allocated until `self` is dropped; `index < len`.
        Some(unsafe { raw.as_ptr().add(index).read() })
    }

    /// The name of device `index` (`mlx5_0`, `rxe0`), or `None` past the end.
    pub fn name(&self, index: usize) -> Option<String> {
        let device = self.entry(index)?;
        // SAFETY: `device` comes from the live list; libibverbs returns a pointer to the
        // NUL-terminated name inside the device struct (or NULL for a NULL device).
        let name = unsafe { ffi::ibv_get_device_name(device) };
        if name.is_null() {
            return None;
        }
        // SAFETY: non-NULL, NUL-terminated, and valid while the list lives; copied at once.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Every device's name, in list order.
    pub fn names(&self) -> Vec<String> {
        (0..self.len).filter_map(|i| self.name(i)).collect()
    }

    /// Opens device `index`.
    pub fn open(&self, index: usize) -> Result<Device, VerbsError> {
        let name = self
            .name(index)
            .unwrap_or_else(|| format!("device #{index}"));
        let device = self.entry(index).ok_or_else(|| VerbsError::Device {
            call: "ibv_open_device".to_owned(),
            device: name.clone(),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        // SAFETY: `device` comes from the live list; the result is NULL or a new context.
        let ctx = unsafe { ffi::ibv_open_device(device) };
        let Some(ctx) = NonNull::new(ctx) else {
            return Err(VerbsError::Device {
                call: "ibv_open_device".to_owned(),
                device: name,
                source: io::Error::last_os_error(),
            });
        };
        // SAFETY: `device` is valid (above); the GUID is returned by value, big-endian.
        let node_guid = be64_to_host(unsafe { ffi::ibv_get_device_guid(device) });
        Ok(Device {
            ctx,
            name,
            node_guid,
        })
    }

    /// Opens every device, in list order.
    pub fn open_all(&self) -> Result<Vec<Device>, VerbsError> {
        (0..self.len).map(|i| self.open(i)).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if let Some(raw) = self.raw {
            // SAFETY: the array came from ibv_get_device_list and is freed exactly once;
            // contexts opened from it stay valid.
            unsafe { ffi::ibv_free_device_list(raw.as_ptr()) };
        }
    }
}

/// An open device context (`ibv_open_device`), closed on drop.
pub struct Device {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    node_guid: u64,
}

// SAFETY: libibverbs contexts may be used from any thread and concurrently (rdma-core documents
// the verbs API as thread-safe); `Device` only calls query functions and the async event pair,
// and closes the context once, in Drop, when no other reference exists.
unsafe impl Send for Device {}
// SAFETY: see `Send`: every method takes `&self` and calls thread-safe libibverbs functions.
unsafe impl Sync for Device {}

/// The device attributes the observers use (`ibv_query_device`), in host byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttributes {
    /// Firmware version text.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Number of physical ports (numbered 1..=n).
    pub phys_port_cnt: u8,
    /// P_Key table size the device supports per port.
    pub max_pkeys: u16,
}

/// The port attributes the observers use (`ibv_query_port`), raw libibverbs codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttributes {
    /// `enum ibv_port_state` (0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).
    pub state: u32,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Base LID.
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// `IBV_LINK_LAYER_*` (0 unspecified, 1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Number of P_Key table entries.
    pub pkey_tbl_len: u16,
    /// Number of GID table entries.
    pub gid_tbl_len: i32,
}

/// The provider's `query_port` op of an extended context (`struct verbs_context`).
type QueryPortOp =
    unsafe extern "C" fn(*mut ffi::ibv_context, u8, *mut ffi::ibv_port_attr, usize) -> libc::c_int;

impl Device {
    /// The device name, e.g. `mlx5_0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node GUID from `ibv_get_device_guid`, host byte order.
    pub fn node_guid(&self) -> u64 {
        self.node_guid
    }

    fn error(&self, call: impl Into<String>, source: io::Error) -> VerbsError {
        VerbsError::Device {
            call: call.into(),
            device: self.name.clone(),
            source,
        }
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttributes, VerbsError> {
        // SAFETY: ibv_device_attr is plain integers and char arrays: all-zero is valid.
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open for the lifetime of `self`; `attr` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        check_rc(rc).map_err(|e| self.error("ibv_query_device", e))?;
        let fw: Vec<u8> = attr
            .fw_ver
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| c.to_ne_bytes()[0])
            .collect();
        Ok(DeviceAttributes {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: be64_to_host(attr.node_guid),
            sys_image_guid: be64_to_host(attr.sys_image_guid),
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            phys_port_cnt: attr.phys_port_cnt,
            max_pkeys: attr.max_pkeys,
        })
    }

    /// `ibv_query_port`, done as verbs.h's inline `___ibv_query_port` does, corrected (see
    /// `query_port_raw`).
    pub fn query_port(&self, port: u8) -> Result<PortAttributes, VerbsError> {
        // SAFETY: `ctx` is an open context for the lifetime of `self`.
        let (rc, attr) = unsafe { query_port_raw(self.ctx.as_ptr(), port) };
        check_rc(rc).map_err(|e| self.error(format!("ibv_query_port(port {port})"), e))?;
        Ok(PortAttributes {
            state: attr.state,
            phys_state: attr.phys_state,
            lid: attr.lid,
            sm_lid: attr.sm_lid,
            link_layer: attr.link_layer,
            pkey_tbl_len: attr.pkey_tbl_len,
            gid_tbl_len: attr.gid_tbl_len,
        })
    }

    /// `ibv_query_gid`: GID `index` of `port`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<Gid, VerbsError> {
        let mut gid = MaybeUninit::<ffi::ibv_gid>::zeroed();
        // SAFETY: `ctx` is open; `gid` is a valid out-pointer to a 16-byte union.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), port, index, gid.as_mut_ptr()) };
        check_rc(rc).map_err(|e| self.error(format!("ibv_query_gid(port {port}, {index})"), e))?;
        // SAFETY: zero-initialised and then filled by the call; `raw` is the byte view of the
        // union, valid for any bit pattern.
        let raw = unsafe { gid.assume_init().raw };
        Ok(Gid(raw))
    }

    /// `ibv_query_pkey`: entry `index` of `port`'s P_Key table, in host byte order.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16, VerbsError> {
        let mut pkey: ffi::__be16 = 0;
        // SAFETY: `ctx` is open; `pkey` is a valid out-pointer.
        let rc = unsafe {
            ffi::ibv_query_pkey(self.ctx.as_ptr(), port, libc::c_int::from(index), &mut pkey)
        };
        check_rc(rc).map_err(|e| self.error(format!("ibv_query_pkey(port {port}, {index})"), e))?;
        Ok(be16_to_host(pkey))
    }

    /// The whole P_Key table of `port` (`len` entries, from `PortAttributes::pkey_tbl_len`).
    pub fn pkey_table(&self, port: u8, len: u16) -> Result<Vec<u16>, VerbsError> {
        (0..len).map(|i| self.query_pkey(port, i)).collect()
    }

    /// The context's async event fd (owned by the context).
    pub(super) fn async_fd(&self) -> RawFd {
        // SAFETY: `ctx` is open; `async_fd` is a plain int field.
        unsafe { ptr::addr_of!((*self.ctx.as_ptr()).async_fd).read() }
    }

    /// Takes one async event if one is queued, acknowledges it and returns it typed.
    /// `Ok(None)` when none is queued (EAGAIN: the fd must be non-blocking).
    pub(super) fn take_async_event(&self) -> Result<Option<AsyncEvent>, VerbsError> {
        let mut event = MaybeUninit::<ffi::ibv_async_event>::zeroed();
        let p = event.as_mut_ptr();
        loop {
            // SAFETY: `ctx` is open; `p` points to writable memory of the event's size.
            let rc = unsafe { ffi::ibv_get_async_event(self.ctx.as_ptr(), p) };
            match check_rc(rc) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(self.error("ibv_get_async_event", e)),
            }
        }
        // SAFETY: the call filled the event. rdma-sys types `event_type` as a Rust enum, which
        // must never hold a value outside its variants; the field is read through a `u32`
        // pointer instead (a C enum is 4 bytes: asserted below), so a code newer than the
        // bindings is just a number.
        let raw_type = unsafe { ptr::addr_of!((*p).event_type).cast::<u32>().read() };
        let typed = AsyncEvent::from_raw(raw_type, || {
            // SAFETY: only called for port events, for which libibverbs stores the port number
            // in `element.port_num` (a c_int member of the union).
            unsafe { ptr::addr_of!((*p).element.port_num).read() }
        });
        // SAFETY: every event returned by ibv_get_async_event must be acknowledged exactly once;
        // `p` is that event, unmodified. (Only CQ/QP/SRQ/WQ events touch the object they name,
        // and this crate creates none, so none can name a freed object.)
        unsafe { ffi::ibv_ack_async_event(p) };
        Ok(Some(typed))
    }
}

/// The extended context's `query_port` op, as verbs.h's `verbs_get_ctx_op(ctx, query_port)`
/// finds it, or `None` for a legacy context or a library too old to have the op.
///
/// rdma-sys 0.3's port of this check compares `abi_compat` with `u32::MAX`, so on 64-bit it
/// never finds the op; this one compares with `usize::MAX` (`__VERBS_ABI_IS_EXTENDED` is
/// `(void *)UINTPTR_MAX`). Field addresses are computed backwards from `context`, the last
/// member of `struct verbs_context`: the library's struct may be smaller than the header this
/// crate was built against (it grows at the front), and `sz` says how far back it reaches, so
/// nothing before the library's allocation is ever read.
///
/// # Safety
/// `ctx` points to a live `ibv_context`; if its `abi_compat` is `UINTPTR_MAX`, that context is
/// the `context` member of a live `struct verbs_context` whose `sz` is initialised.
unsafe fn extended_query_port_op(ctx: *mut ffi::ibv_context) -> Option<QueryPortOp> {
    // SAFETY: `ctx` is live (caller); `abi_compat` is a plain pointer-sized field.
    let abi_compat = unsafe { ptr::addr_of!((*ctx).abi_compat).read() };
    if abi_compat as usize != usize::MAX {
        return None;
    }
    let context_at = offset_of!(ffi::verbs_context, context);
    let base = ctx.cast::<u8>();
    let sz_ptr = base
        .wrapping_sub(context_at - offset_of!(ffi::verbs_context, sz))
        .cast::<usize>();
    // SAFETY: an extended context is the `context` member of a `struct verbs_context` (caller),
    // and `sz` is the member immediately before it in every rdma-core version ("Must be
    // immediately before struct ibv_context"), set by the library to its own sizeof.
    let sz = unsafe { sz_ptr.read() };
    let needed = size_of::<ffi::verbs_context>() - offset_of!(ffi::verbs_context, query_port);
    if sz < needed {
        return None;
    }
    let op_ptr = base
        .wrapping_sub(context_at - offset_of!(ffi::verbs_context, query_port))
        .cast::<Option<QueryPortOp>>();
    // SAFETY: `sz >= needed` proves the library's verbs_context extends back to the
    // `query_port` member, so this reads an initialised function pointer (or NULL = None).
    unsafe { op_ptr.read() }
}

/// `ibv_query_port` as verbs.h's inline `___ibv_query_port` does it, corrected: returns the
/// return code and the attributes.
///
/// The attribute struct is zeroed first. An extended context (every provider of rdma-core
/// since v13) is asked through its `query_port` op with the full `sizeof(ibv_port_attr)` of
/// this build, which libibverbs' `__lib_query_port` copes with whether its own struct is larger
/// or smaller. Otherwise the exported compat symbol `ibv_query_port` is called, which fills the
/// older, shorter `_compat_ibv_port_attr` prefix; the zeroing makes the remaining field
/// (`port_cap_flags2`) read as 0 instead of garbage. rdma-sys's own `___ibv_query_port` always
/// takes the compat path on 64-bit and skips the zeroing.
///
/// # Safety
/// As [`extended_query_port_op`]: `ctx` is a live (open) context.
unsafe fn query_port_raw(
    ctx: *mut ffi::ibv_context,
    port: u8,
) -> (libc::c_int, ffi::ibv_port_attr) {
    // SAFETY: ibv_port_attr is plain integers (its enums are C integer typedefs in rdma-sys):
    // all-zero is a valid value, and the zeroing is what the inline does too.
    let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is live (caller).
    let rc = match unsafe { extended_query_port_op(ctx) } {
        // SAFETY: `op` is the provider's query_port of this live context; `attr` is a valid
        // out-pointer of exactly the size passed.
        Some(op) => unsafe { op(ctx, port, &mut attr, size_of::<ffi::ibv_port_attr>()) },
        // SAFETY: the compat symbol writes at most sizeof(_compat_ibv_port_attr), a prefix of
        // ibv_port_attr with the same layout, into `attr`.
        None => unsafe {
            ffi::ibv_query_port(
                ctx,
                port,
                ptr::addr_of_mut!(attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        },
    };
    (rc, attr)
}

// `event_type` is read as a u32 above: the C enum must be exactly that size.
const _: () = assert!(size_of::<ffi::ibv_event_type>() == size_of::<u32>());

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the context was opened by ibv_open_device and is closed exactly once; every
        // AsyncEvents holding this device has been dropped (they keep it in an Arc).
        let rc = unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
        if let Err(e) = check_rc(rc) {
            tracing::warn!(device = %self.name, error = %e, "ibv_close_device failed");
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("node_guid", &format_args!("{:#018x}", self.node_guid))
            .finish()
    }
}

impl std::fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceList")
            .field("kernel_has_rdma", &self.kernel_has_rdma())
            .field("names", &self.names())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    //! The port-query dispatch against a `verbs_context` built in memory (no device needed):
    //! the extended op is found with `abi_compat == UINTPTR_MAX` (rdma-sys's `u32::MAX` check
    //! never finds it on 64-bit), called with a zeroed struct and the full size, and refused
    //! when the library's struct is too short to hold it.

    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The size the fake op was last handed (only one test calls the op).
    static SIZE_SEEN: AtomicUsize = AtomicUsize::new(0);

    /// A provider op: fails with EFAULT unless handed an all-zero struct, then fills it.
    unsafe extern "C" fn fake_query_port(
        _ctx: *mut ffi::ibv_context,
        port: u8,
        attr: *mut ffi::ibv_port_attr,
        len: usize,
    ) -> libc::c_int {
        SIZE_SEEN.store(len, Ordering::SeqCst);
        // `len` is checked against the struct size before the whole struct is viewed.
        if len != size_of::<ffi::ibv_port_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: `attr` is the caller's out-pointer to a whole, initialised ibv_port_attr
        // (`len` says so).
        let bytes = unsafe { std::slice::from_raw_parts(attr.cast::<u8>(), len) };
        if bytes.iter().any(|b| *b != 0) {
            return libc::EFAULT;
        }
        // SAFETY: as above; no other reference to it exists during the call.
        let attr = unsafe { &mut *attr };
        attr.state = 4;
        attr.lid = 0x11 + u16::from(port);
        attr.sm_lid = 1;
        attr.link_layer = 1;
        attr.pkey_tbl_len = 128;
        0
    }

    fn fake_context(abi_compat: usize, sz: usize) -> Box<ffi::verbs_context> {
        // SAFETY: verbs_context is C data: integers, raw pointers, nullable function pointers
        // (Option, None when zero) and opaque byte arrays; all-zero is valid for each.
        let mut vctx: Box<ffi::verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        vctx.context.abi_compat = abi_compat as *mut libc::c_void;
        vctx.sz = sz;
        vctx.query_port = Some(fake_query_port);
        vctx
    }

    #[test]
    fn extended_op_is_found_and_called_with_a_zeroed_full_struct() {
        let mut vctx = fake_context(usize::MAX, size_of::<ffi::verbs_context>());
        // SAFETY: `vctx` is a whole verbs_context with `sz` set: exactly the caller contract.
        let (rc, attr) = unsafe { query_port_raw(&mut vctx.context, 2) };
        assert_eq!(rc, 0);
        assert_eq!(
            SIZE_SEEN.load(Ordering::SeqCst),
            size_of::<ffi::ibv_port_attr>()
        );
        assert_eq!(
            (
                attr.state,
                attr.lid,
                attr.sm_lid,
                attr.link_layer,
                attr.pkey_tbl_len
            ),
            (4, 0x13, 1, 1, 128)
        );
        // The smallest library struct that still holds the op is enough.
        let needed = size_of::<ffi::verbs_context>() - offset_of!(ffi::verbs_context, query_port);
        vctx.sz = needed;
        // SAFETY: as above.
        assert!(unsafe { extended_query_port_op(&mut vctx.context) }.is_some());
    }

    #[test]
    fn op_is_not_used_on_legacy_or_short_contexts() {
        // The value rdma-sys 0.3 compares with: not the extended marker on 64-bit.
        let mut legacy = fake_context(u32::MAX as usize, size_of::<ffi::verbs_context>());
        // SAFETY: `legacy` is a whole verbs_context.
        assert!(unsafe { extended_query_port_op(&mut legacy.context) }.is_none());
        let needed = size_of::<ffi::verbs_context>() - offset_of!(ffi::verbs_context, query_port);
        let mut short = fake_context(usize::MAX, needed - 1);
        // SAFETY: `short` is a whole verbs_context (its `sz` merely claims less).
        assert!(unsafe { extended_query_port_op(&mut short.context) }.is_none());
        let mut no_op = fake_context(usize::MAX, size_of::<ffi::verbs_context>());
        no_op.query_port = None;
        // SAFETY: as above.
        assert!(unsafe { extended_query_port_op(&mut no_op.context) }.is_none());
    }
}
