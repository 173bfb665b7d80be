//! The PortInfo attribute (0x0015): a port's LIDs, state and link. The attribute modifier is
//! the port number.
//!
//! Bytes 0..37 are decoded field by field; bytes 37..64 (VL, MTU capability, violation counters,
//! timeouts, extended speeds) are carried opaquely so a round trip keeps them.

use super::{be, check_len, MadError};

/// Byte ranges (and nibble positions) of PortInfo.
pub mod field {
    use crate::mad::Field;
    /// M_Key.
    pub const M_KEY: Field = 0..8;
    /// GID prefix.
    pub const GID_PREFIX: Field = 8..16;
    /// LID.
    pub const LID: Field = 16..18;
    /// Master SM LID.
    pub const MASTER_SM_LID: Field = 18..20;
    /// Capability mask.
    pub const CAPABILITY_MASK: Field = 20..24;
    /// Diagnostic code.
    pub const DIAG_CODE: Field = 24..26;
    /// M_Key lease period.
    pub const M_KEY_LEASE_PERIOD: Field = 26..28;
    /// Local port number.
    pub const LOCAL_PORT_NUM: usize = 28;
    /// Link width enabled.
    pub const LINK_WIDTH_ENABLED: usize = 29;
    /// Link width supported.
    pub const LINK_WIDTH_SUPPORTED: usize = 30;
    /// Link width active.
    pub const LINK_WIDTH_ACTIVE: usize = 31;
    /// High nibble: link speed supported; low nibble: port state.
    pub const SPEED_SUPPORTED_PORT_STATE: usize = 32;
    /// High nibble: physical state; low nibble: link-down default state.
    pub const PHYS_STATE_DOWN_DEFAULT: usize = 33;
    /// Bits 7..6: M_Key protect bits; bits 2..0: LMC.
    pub const PROTECT_LMC: usize = 34;
    /// High nibble: link speed active; low nibble: link speed enabled.
    pub const SPEED_ACTIVE_ENABLED: usize = 35;
    /// High nibble: neighbor MTU; low nibble: master SM SL.
    pub const NEIGHBOR_MTU_SM_SL: usize = 36;
    /// Fields carried opaquely.
    pub const REST: Field = 37..64;
    /// First byte after the attribute.
    pub const END: usize = 64;
}

/// Port states (PortInfo.PortState).
pub mod port_state {
    /// No state change requested (only in Set).
    pub const NOP: u8 = 0;
    /// Down.
    pub const DOWN: u8 = 1;
    /// Init.
    pub const INIT: u8 = 2;
    /// Armed.
    pub const ARMED: u8 = 3;
    /// Active.
    pub const ACTIVE: u8 = 4;
    /// Active, deferring.
    pub const ACTIVE_DEFER: u8 = 5;
}

/// A read/write view of PortInfo.
#[derive(Debug, Clone)]
pub struct PortInfo<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PortInfo<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> PortInfo<T> {
        PortInfo { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 64 bytes.
    pub fn new_checked(buffer: T) -> Result<PortInfo<T>, MadError> {
        check_len("PortInfo", buffer.as_ref(), field::END)?;
        Ok(PortInfo { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn hi(&self, at: usize) -> u8 {
        self.b()[at] >> 4
    }
    fn lo(&self, at: usize) -> u8 {
        self.b()[at] & 0x0f
    }
    /// M_Key.
    pub fn m_key(&self) -> u64 {
        be::u64_at(self.b(), field::M_KEY)
    }
    /// GID prefix.
    pub fn gid_prefix(&self) -> u64 {
        be::u64_at(self.b(), field::GID_PREFIX)
    }
    /// LID.
    pub fn lid(&self) -> u16 {
        be::u16_at(self.b(), field::LID)
    }
    /// Master SM LID.
    pub fn master_sm_lid(&self) -> u16 {
        be::u16_at(self.b(), field::MASTER_SM_LID)
    }
    /// Capability mask.
    pub fn capability_mask(&self) -> u32 {
        be::u32_at(self.b(), field::CAPABILITY_MASK)
    }
    /// Diagnostic code.
    pub fn diag_code(&self) -> u16 {
        be::u16_at(self.b(), field::DIAG_CODE)
    }
    /// M_Key lease period.
    pub fn m_key_lease_period(&self) -> u16 {
        be::u16_at(self.b(), field::M_KEY_LEASE_PERIOD)
    }
    /// Local port number.
    pub fn local_port_num(&self) -> u8 {
        self.b()[field::LOCAL_PORT_NUM]
    }
    /// Link width enabled.
    pub fn link_width_enabled(&self) -> u8 {
        self.b()[field::LINK_WIDTH_ENABLED]
    }
    /// Link width supported.
    pub fn link_width_supported(&self) -> u8 {
        self.b()[field::LINK_WIDTH_SUPPORTED]
    }
    /// Link width active.
    pub fn link_width_active(&self) -> u8 {
        self.b()[field::LINK_WIDTH_ACTIVE]
    }
    /// Link speed supported.
    pub fn link_speed_supported(&self) -> u8 {
        self.hi(field::SPEED_SUPPORTED_PORT_STATE)
    }
    /// Port state (see [`port_state`]).
    pub fn port_state(&self) -> u8 {
        self.lo(field::SPEED_SUPPORTED_PORT_STATE)
    }
    /// Physical port state.
    pub fn port_phys_state(&self) -> u8 {
        self.hi(field::PHYS_STATE_DOWN_DEFAULT)
    }
    /// Link-down default state.
    pub fn link_down_default_state(&self) -> u8 {
        self.lo(field::PHYS_STATE_DOWN_DEFAULT)
    }
    /// M_Key protect bits.
    pub fn m_key_protect_bits(&self) -> u8 {
        self.b()[field::PROTECT_LMC] >> 6
    }
    /// LID mask count.
    pub fn lmc(&self) -> u8 {
        self.b()[field::PROTECT_LMC] & 0x07
    }
    /// Link speed active.
    pub fn link_speed_active(&self) -> u8 {
        self.hi(field::SPEED_ACTIVE_ENABLED)
    }
    /// Link speed enabled.
    pub fn link_speed_enabled(&self) -> u8 {
        self.lo(field::SPEED_ACTIVE_ENABLED)
    }
    /// Neighbor MTU.
    pub fn neighbor_mtu(&self) -> u8 {
        self.hi(field::NEIGHBOR_MTU_SM_SL)
    }
    /// Master SM SL.
    pub fn master_sm_sl(&self) -> u8 {
        self.lo(field::NEIGHBOR_MTU_SM_SL)
    }
    /// Bytes carried opaquely.
    pub fn rest(&self) -> &[u8] {
        &self.b()[field::REST]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PortInfo<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    fn set_nibbles(&mut self, at: usize, hi: u8, lo: u8) {
        self.m()[at] = (hi << 4) | (lo & 0x0f);
    }
    /// Sets M_Key.
    pub fn set_m_key(&mut self, v: u64) {
        be::set_u64(self.m(), field::M_KEY, v);
    }
    /// Sets the GID prefix.
    pub fn set_gid_prefix(&mut self, v: u64) {
        be::set_u64(self.m(), field::GID_PREFIX, v);
    }
    /// Sets the LID.
    pub fn set_lid(&mut self, v: u16) {
        be::set_u16(self.m(), field::LID, v);
    }
    /// Sets the master SM LID.
    pub fn set_master_sm_lid(&mut self, v: u16) {
        be::set_u16(self.m(), field::MASTER_SM_LID, v);
    }
    /// Sets the capability mask.
    pub fn set_capability_mask(&mut self, v: u32) {
        be::set_u32(self.m(), field::CAPABILITY_MASK, v);
    }
    /// Sets the diagnostic code.
    pub fn set_diag_code(&mut self, v: u16) {
        be::set_u16(self.m(), field::DIAG_CODE, v);
    }
    /// Sets the M_Key lease period.
    pub fn set_m_key_lease_period(&mut self, v: u16) {
        be::set_u16(self.m(), field::M_KEY_LEASE_PERIOD, v);
    }
    /// Sets the local port number.
    pub fn set_local_port_num(&mut self, v: u8) {
        self.m()[field::LOCAL_PORT_NUM] = v;
    }
    /// Sets the three link width bytes (enabled, supported, active).
    pub fn set_link_widths(&mut self, enabled: u8, supported: u8, active: u8) {
        self.m()[field::LINK_WIDTH_ENABLED] = enabled;
        self.m()[field::LINK_WIDTH_SUPPORTED] = supported;
        self.m()[field::LINK_WIDTH_ACTIVE] = active;
    }
    /// Sets link speed supported and port state.
    pub fn set_speed_supported_and_state(&mut self, speed_supported: u8, state: u8) {
        self.set_nibbles(field::SPEED_SUPPORTED_PORT_STATE, speed_supported, state);
    }
    /// Sets physical state and link-down default state.
    pub fn set_phys_state_and_down_default(&mut self, phys: u8, down_default: u8) {
        self.set_nibbles(field::PHYS_STATE_DOWN_DEFAULT, phys, down_default);
    }
    /// Sets M_Key protect bits and LMC (bits 5..3 are reserved and written as zero).
    pub fn set_protect_bits_and_lmc(&mut self, protect: u8, lmc: u8) {
        self.m()[field::PROTECT_LMC] = ((protect & 0x03) << 6) | (lmc & 0x07);
    }
    /// Sets link speed active and enabled.
    pub fn set_speed_active_and_enabled(&mut self, active: u8, enabled: u8) {
        self.set_nibbles(field::SPEED_ACTIVE_ENABLED, active, enabled);
    }
    /// Sets neighbor MTU and master SM SL.
    pub fn set_neighbor_mtu_and_sm_sl(&mut self, mtu: u8, sl: u8) {
        self.set_nibbles(field::NEIGHBOR_MTU_SM_SL, mtu, sl);
    }
    /// Sets the opaque bytes.
    pub fn set_rest(&mut self, rest: &[u8; REST_LEN]) {
        self.m()[field::REST].copy_from_slice(rest);
    }
}

/// Length of the opaque tail.
pub const REST_LEN: usize = field::END - field::REST.start;

/// PortInfo as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfoRepr {
    /// M_Key.
    pub m_key: u64,
    /// GID prefix.
    pub gid_prefix: u64,
    /// LID.
    pub lid: u16,
    /// Master SM LID.
    pub master_sm_lid: u16,
    /// Capability mask.
    pub capability_mask: u32,
    /// Diagnostic code.
    pub diag_code: u16,
    /// M_Key lease period.
    pub m_key_lease_period: u16,
    /// Local port number.
    pub local_port_num: u8,
    /// Link width enabled.
    pub link_width_enabled: u8,
    /// Link width supported.
    pub link_width_supported: u8,
    /// Link width active.
    pub link_width_active: u8,
    /// Link speed supported (4 bits).
    pub link_speed_supported: u8,
    /// Port state (4 bits, see [`port_state`]).
    pub port_state: u8,
    /// Physical state (4 bits).
    pub port_phys_state: u8,
    /// Link-down default state (4 bits).
    pub link_down_default_state: u8,
    /// M_Key protect bits (2 bits).
    pub m_key_protect_bits: u8,
    /// LMC (3 bits).
    pub lmc: u8,
    /// Link speed active (4 bits).
    pub link_speed_active: u8,
    /// Link speed enabled (4 bits).
    pub link_speed_enabled: u8,
    /// Neighbor MTU (4 bits).
    pub neighbor_mtu: u8,
    /// Master SM SL (4 bits).
    pub master_sm_sl: u8,
    /// Bytes 37..64, not interpreted.
    pub rest: [u8; REST_LEN],
}

impl PortInfoRepr {
    /// Reads PortInfo. Reserved bits of byte 34 must be zero.
    pub fn parse<T: AsRef<[u8]>>(packet: &PortInfo<T>) -> Result<PortInfoRepr, MadError> {
        let reserved = packet.b()[field::PROTECT_LMC] & 0x38;
        if reserved != 0 {
            return Err(MadError::FieldRange {
                what: "PortInfo",
                field: "reserved bits of byte 34",
                value: reserved.into(),
            });
        }
        let mut rest = [0; REST_LEN];
        rest.copy_from_slice(packet.rest());
        Ok(PortInfoRepr {
            m_key: packet.m_key(),
            gid_prefix: packet.gid_prefix(),
            lid: packet.lid(),
            master_sm_lid: packet.master_sm_lid(),
            capability_mask: packet.capability_mask(),
            diag_code: packet.diag_code(),
            m_key_lease_period: packet.m_key_lease_period(),
            local_port_num: packet.local_port_num(),
            link_width_enabled: packet.link_width_enabled(),
            link_width_supported: packet.link_width_supported(),
            link_width_active: packet.link_width_active(),
            link_speed_supported: packet.link_speed_supported(),
            port_state: packet.port_state(),
            port_phys_state: packet.port_phys_state(),
            link_down_default_state: packet.link_down_default_state(),
            m_key_protect_bits: packet.m_key_protect_bits(),
            lmc: packet.lmc(),
            link_speed_active: packet.link_speed_active(),
            link_speed_enabled: packet.link_speed_enabled(),
            neighbor_mtu: packet.neighbor_mtu(),
            master_sm_sl: packet.master_sm_sl(),
            rest,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes all 64 bytes. Values wider than their bit field are cut to it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut PortInfo<T>) {
        packet.set_m_key(self.m_key);
        packet.set_gid_prefix(self.gid_prefix);
        packet.set_lid(self.lid);
        packet.set_master_sm_lid(self.master_sm_lid);
        packet.set_capability_mask(self.capability_mask);
        packet.set_diag_code(self.diag_code);
        packet.set_m_key_lease_period(self.m_key_lease_period);
        packet.set_local_port_num(self.local_port_num);
        packet.set_link_widths(
            self.link_width_enabled,
            self.link_width_supported,
            self.link_width_active,
        );
        packet.set_speed_supported_and_state(self.link_speed_supported, self.port_state);
        packet.set_phys_state_and_down_default(self.port_phys_state, self.link_down_default_state);
        packet.set_protect_bits_and_lmc(self.m_key_protect_bits, self.lmc);
        packet.set_speed_active_and_enabled(self.link_speed_active, self.link_speed_enabled);
        packet.set_neighbor_mtu_and_sm_sl(self.neighbor_mtu, self.master_sm_sl);
        packet.set_rest(&self.rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, smp};

    #[test]
    fn golden_port_info() {
        let data = &golden::PORT_INFO_GET_RESP[smp::field::DATA];
        let repr = PortInfoRepr::parse(&PortInfo::new_checked(data).unwrap()).unwrap();
        assert_eq!(repr.lid, golden::LID);
        assert_eq!(repr.master_sm_lid, golden::SM_LID);
        assert_eq!(repr.gid_prefix, 0xfe80_0000_0000_0000);
        assert_eq!(repr.local_port_num, 1);
        assert_eq!(repr.port_state, port_state::ACTIVE);
        assert_eq!(repr.port_phys_state, 5, "LinkUp");
        assert_eq!(repr.link_down_default_state, 2, "Polling");
        assert_eq!(repr.link_width_active, 2, "4X");
        assert_eq!(repr.link_speed_supported, 7, "2.5, 5 and 10 Gbps");
        assert_eq!(repr.capability_mask, 0x0050_c048);
        assert_eq!(repr.m_key_lease_period, 4089);
        let mut buf = [0xa5u8; field::END];
        repr.emit(&mut PortInfo::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], data);
    }

    #[test]
    fn reserved_bits_and_truncation_are_refused() {
        assert!(PortInfo::new_checked(&[0u8; 63][..]).is_err());
        let mut data = [0u8; 64];
        data[field::PROTECT_LMC] = 0x08;
        assert!(PortInfoRepr::parse(&PortInfo::new_checked(&data[..]).unwrap()).is_err());
    }
}
