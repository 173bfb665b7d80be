//! Pure conversions of libibverbs values: byte order, GIDs and async event codes. No FFI here,
//! so everything is unit-tested on machines without RDMA.

/// Converts a big-endian 16-bit value as libibverbs returns it (`__be16`, e.g. from
/// `ibv_query_pkey`) to host order.
pub fn be16_to_host(raw: u16) -> u16 {
    u16::from_be(raw)
}

/// Converts a big-endian 64-bit value as libibverbs returns it (`__be64`, e.g. from
/// `ibv_get_device_guid` or `ibv_device_attr.node_guid`) to host order.
pub fn be64_to_host(raw: u64) -> u64 {
    u64::from_be(raw)
}

/// A 128-bit GID as the port holds it (network byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The upper 64 bits (`fe80::` for link-local GIDs).
    pub fn subnet_prefix(&self) -> u64 {
        let mut hi = [0u8; 8];
        hi.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(hi)
    }

    /// The lower 64 bits. On InfiniBand, GID index 0 carries the port GUID here; on RoCE it is
    /// the EUI-64 derived from the interface's MAC address.
    pub fn interface_id(&self) -> u64 {
        let mut lo = [0u8; 8];
        lo.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(lo)
    }
}

/// What an `ibv_async_event` reports, mapped from its raw `event_type` number (the values of
/// `enum ibv_event_type` in verbs.h). Unknown numbers are kept, never guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    /// `IBV_EVENT_PKEY_CHANGE` (12): the port's P_Key table changed.
    PKeyChange,
    /// `IBV_EVENT_PORT_ACTIVE` (9): the port went ACTIVE.
    PortActive,
    /// `IBV_EVENT_PORT_ERR` (10): the port left ACTIVE.
    PortError,
    /// `IBV_EVENT_LID_CHANGE` (11): the port's LID changed.
    LidChange,
    /// `IBV_EVENT_SM_CHANGE` (13): the subnet manager changed.
    SmChange,
    /// `IBV_EVENT_GID_CHANGE` (18): the GID table changed.
    GidChange,
    /// `IBV_EVENT_CLIENT_REREGISTER` (17): the SM asks clients to re-register.
    ClientReregister,
    /// `IBV_EVENT_DEVICE_FATAL` (8): the device failed; its context is unusable.
    DeviceFatal,
    /// Any other code (QP/CQ/SRQ/WQ events, or codes newer than this build knows).
    Other(u32),
}

impl AsyncEventKind {
    /// Maps a raw `event_type` value; total (unknown values become [`AsyncEventKind::Other`]).
    pub fn from_raw(raw: u32) -> AsyncEventKind {
        match raw {
            8 => AsyncEventKind::DeviceFatal,
            9 => AsyncEventKind::PortActive,
            10 => AsyncEventKind::PortError,
            11 => AsyncEventKind::LidChange,
            12 => AsyncEventKind::PKeyChange,
            13 => AsyncEventKind::SmChange,
            17 => AsyncEventKind::ClientReregister,
            18 => AsyncEventKind::GidChange,
            other => AsyncEventKind::Other(other),
        }
    }

    /// Whether the event's `element` union holds a port number (`element.port_num`). Only
    /// these kinds may read it; the others carry a QP/CQ/SRQ/WQ pointer or nothing.
    pub fn carries_port(self) -> bool {
        matches!(
            self,
            AsyncEventKind::PKeyChange
                | AsyncEventKind::PortActive
                | AsyncEventKind::PortError
                | AsyncEventKind::LidChange
                | AsyncEventKind::SmChange
                | AsyncEventKind::GidChange
                | AsyncEventKind::ClientReregister
        )
    }

    /// Whether the port inventory may have changed because of this event.
    pub fn affects_ports(self) -> bool {
        self.carries_port() || self == AsyncEventKind::DeviceFatal
    }
}

/// One async event, already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// The port it concerns, for port events.
    pub port: Option<u8>,
}

impl AsyncEvent {
    /// Builds an event from the raw `event_type` and `element.port_num` (the latter is only
    /// consulted for port events; a number outside 1..=255 is dropped).
    pub fn from_raw(event_type: u32, port_num: impl FnOnce() -> i32) -> AsyncEvent {
        let kind = AsyncEventKind::from_raw(event_type);
        let port = if kind.carries_port() {
            u8::try_from(port_num()).ok().filter(|p| *p != 0)
        } else {
            None
        };
        AsyncEvent { kind, port }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_event_type;

    #[test]
    fn byte_order_is_converted_once() {
        // The wire bytes 0x80 0x01 are P_Key 0x8001 whatever the host order is.
        let raw = u16::from_ne_bytes([0x80, 0x01]);
        assert_eq!(be16_to_host(raw), 0x8001);
        let raw = u16::from_ne_bytes([0xff, 0xff]);
        assert_eq!(be16_to_host(raw), 0xffff);
        let raw = u64::from_ne_bytes([0x00, 0x02, 0xc9, 0x03, 0x00, 0x0e, 0x0b, 0x72]);
        assert_eq!(be64_to_host(raw), 0x0002_c903_000e_0b72);
    }

    #[test]
    fn gid_halves() {
        let gid = Gid([
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x0e, 0x0b, 0x73,
        ]);
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x0002_c903_000e_0b73);
    }

    #[test]
    fn event_codes_match_the_bindings() {
        let known = [
            (
                ibv_event_type::IBV_EVENT_DEVICE_FATAL,
                AsyncEventKind::DeviceFatal,
            ),
            (
                ibv_event_type::IBV_EVENT_PORT_ACTIVE,
                AsyncEventKind::PortActive,
            ),
            (
                ibv_event_type::IBV_EVENT_PORT_ERR,
                AsyncEventKind::PortError,
            ),
            (
                ibv_event_type::IBV_EVENT_LID_CHANGE,
                AsyncEventKind::LidChange,
            ),
            (
                ibv_event_type::IBV_EVENT_PKEY_CHANGE,
                AsyncEventKind::PKeyChange,
            ),
            (
                ibv_event_type::IBV_EVENT_SM_CHANGE,
                AsyncEventKind::SmChange,
            ),
            (
                ibv_event_type::IBV_EVENT_CLIENT_REREGISTER,
                AsyncEventKind::ClientReregister,
            ),
            (
                ibv_event_type::IBV_EVENT_GID_CHANGE,
                AsyncEventKind::GidChange,
            ),
        ];
        for (code, kind) in known {
            assert_eq!(AsyncEventKind::from_raw(code as u32), kind, "{code:?}");
        }
        assert_eq!(
            AsyncEventKind::from_raw(ibv_event_type::IBV_EVENT_QP_FATAL as u32),
            AsyncEventKind::Other(1)
        );
        assert_eq!(
            AsyncEventKind::from_raw(ibv_event_type::IBV_EVENT_WQ_FATAL as u32),
            AsyncEventKind::Other(19)
        );
    }

    #[test]
    fn unknown_event_codes_are_kept() {
        assert_eq!(AsyncEventKind::from_raw(20), AsyncEventKind::Other(20));
        assert_eq!(
            AsyncEventKind::from_raw(u32::MAX),
            AsyncEventKind::Other(u32::MAX)
        );
        assert!(!AsyncEventKind::Other(20).affects_ports());
    }

    #[test]
    fn port_number_is_read_only_for_port_events() {
        let pkey = AsyncEvent::from_raw(12, || 1);
        assert_eq!(
            pkey,
            AsyncEvent {
                kind: AsyncEventKind::PKeyChange,
                port: Some(1)
            }
        );
        let fatal = AsyncEvent::from_raw(8, || panic!("a device event has no port"));
        assert_eq!(fatal.port, None);
        assert!(fatal.kind.affects_ports());
        let qp = AsyncEvent::from_raw(1, || panic!("a QP event holds a pointer"));
        assert_eq!(qp.kind, AsyncEventKind::Other(1));
        assert_eq!(AsyncEvent::from_raw(9, || 300).port, None);
        assert_eq!(AsyncEvent::from_raw(9, || 0).port, None);
    }
}
