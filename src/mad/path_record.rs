//! The SA PathRecord attribute (0x0035): the path between two ports, including the P_Key they
//! share. A query constrains SGID/DGID or SLID/DLID through the component mask; a port pair
//! that shares no partition gets no record.

use super::{be, check_len, MadError};

/// Byte ranges of a PathRecord.
pub mod field {
    use crate::mad::Field;
    /// Service id.
    pub const SERVICE_ID: Field = 0..8;
    /// Destination GID.
    pub const DGID: Field = 8..24;
    /// Source GID.
    pub const SGID: Field = 24..40;
    /// Destination LID.
    pub const DLID: Field = 40..42;
    /// Source LID.
    pub const SLID: Field = 42..44;
    /// Bit 31 raw traffic; bits 27..8 flow label; bits 7..0 hop limit.
    pub const FLOW: Field = 44..48;
    /// Traffic class.
    pub const TCLASS: usize = 48;
    /// Bit 7 reversible; bits 6..0 number of paths.
    pub const REVERSIBLE_NUMB_PATH: usize = 49;
    /// P_Key.
    pub const PKEY: Field = 50..52;
    /// Bits 15..4 QoS class; bits 3..0 SL.
    pub const QOS_SL: Field = 52..54;
    /// Bits 7..6 MTU selector; bits 5..0 MTU.
    pub const MTU: usize = 54;
    /// Bits 7..6 rate selector; bits 5..0 rate.
    pub const RATE: usize = 55;
    /// Bits 7..6 packet lifetime selector; bits 5..0 packet lifetime.
    pub const PACKET_LIFE: usize = 56;
    /// Preference.
    pub const PREFERENCE: usize = 57;
    /// Reserved.
    pub const RESERVED: Field = 58..64;
    /// First byte after the record.
    pub const END: usize = 64;
}

/// Component mask bits of a PathRecord query.
pub mod component {
    /// Service id.
    pub const SERVICE_ID: u64 = 0b11;
    /// Destination GID.
    pub const DGID: u64 = 1 << 2;
    /// Source GID.
    pub const SGID: u64 = 1 << 3;
    /// Destination LID.
    pub const DLID: u64 = 1 << 4;
    /// Source LID.
    pub const SLID: u64 = 1 << 5;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// Number of paths.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// SL.
    pub const SL: u64 = 1 << 15;
}

/// A read/write view of a PathRecord.
#[derive(Debug, Clone)]
pub struct PathRecord<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PathRecord<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> PathRecord<T> {
        PathRecord { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 64 bytes.
    pub fn new_checked(buffer: T) -> Result<PathRecord<T>, MadError> {
        check_len("PathRecord", buffer.as_ref(), field::END)?;
        Ok(PathRecord { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Service id.
    pub fn service_id(&self) -> u64 {
        be::u64_at(self.b(), field::SERVICE_ID)
    }
    /// Destination GID.
    pub fn dgid(&self) -> u128 {
        be::u128_at(self.b(), field::DGID)
    }
    /// Source GID.
    pub fn sgid(&self) -> u128 {
        be::u128_at(self.b(), field::SGID)
    }
    /// Destination LID.
    pub fn dlid(&self) -> u16 {
        be::u16_at(self.b(), field::DLID)
    }
    /// Source LID.
    pub fn slid(&self) -> u16 {
        be::u16_at(self.b(), field::SLID)
    }
    /// Raw flow word (raw traffic, flow label, hop limit).
    pub fn flow_word(&self) -> u32 {
        be::u32_at(self.b(), field::FLOW)
    }
    /// Traffic class.
    pub fn tclass(&self) -> u8 {
        self.b()[field::TCLASS]
    }
    /// Reversible bit and number of paths.
    pub fn reversible_numb_path(&self) -> u8 {
        self.b()[field::REVERSIBLE_NUMB_PATH]
    }
    /// P_Key.
    pub fn pkey(&self) -> u16 {
        be::u16_at(self.b(), field::PKEY)
    }
    /// QoS class and SL word.
    pub fn qos_sl(&self) -> u16 {
        be::u16_at(self.b(), field::QOS_SL)
    }
    /// MTU selector and MTU.
    pub fn mtu_byte(&self) -> u8 {
        self.b()[field::MTU]
    }
    /// Rate selector and rate.
    pub fn rate_byte(&self) -> u8 {
        self.b()[field::RATE]
    }
    /// Packet lifetime selector and lifetime.
    pub fn packet_life_byte(&self) -> u8 {
        self.b()[field::PACKET_LIFE]
    }
    /// Preference.
    pub fn preference(&self) -> u8 {
        self.b()[field::PREFERENCE]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PathRecord<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the service id.
    pub fn set_service_id(&mut self, v: u64) {
        be::set_u64(self.m(), field::SERVICE_ID, v);
    }
    /// Sets the destination GID.
    pub fn set_dgid(&mut self, v: u128) {
        be::set_u128(self.m(), field::DGID, v);
    }
    /// Sets the source GID.
    pub fn set_sgid(&mut self, v: u128) {
        be::set_u128(self.m(), field::SGID, v);
    }
    /// Sets the destination LID.
    pub fn set_dlid(&mut self, v: u16) {
        be::set_u16(self.m(), field::DLID, v);
    }
    /// Sets the source LID.
    pub fn set_slid(&mut self, v: u16) {
        be::set_u16(self.m(), field::SLID, v);
    }
    /// Sets the raw flow word.
    pub fn set_flow_word(&mut self, v: u32) {
        be::set_u32(self.m(), field::FLOW, v);
    }
    /// Sets the traffic class.
    pub fn set_tclass(&mut self, v: u8) {
        self.m()[field::TCLASS] = v;
    }
    /// Sets the reversible bit and number of paths.
    pub fn set_reversible_numb_path(&mut self, v: u8) {
        self.m()[field::REVERSIBLE_NUMB_PATH] = v;
    }
    /// Sets the P_Key.
    pub fn set_pkey(&mut self, v: u16) {
        be::set_u16(self.m(), field::PKEY, v);
    }
    /// Sets the QoS class and SL word.
    pub fn set_qos_sl(&mut self, v: u16) {
        be::set_u16(self.m(), field::QOS_SL, v);
    }
    /// Sets the MTU selector and MTU.
    pub fn set_mtu_byte(&mut self, v: u8) {
        self.m()[field::MTU] = v;
    }
    /// Sets the rate selector and rate.
    pub fn set_rate_byte(&mut self, v: u8) {
        self.m()[field::RATE] = v;
    }
    /// Sets the packet lifetime selector and lifetime.
    pub fn set_packet_life_byte(&mut self, v: u8) {
        self.m()[field::PACKET_LIFE] = v;
    }
    /// Sets the preference and clears the reserved tail.
    pub fn set_preference(&mut self, v: u8) {
        self.m()[field::PREFERENCE] = v;
        self.m()[field::RESERVED].fill(0);
    }
}

/// A PathRecord as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRecordRepr {
    /// Service id.
    pub service_id: u64,
    /// Destination GID.
    pub dgid: u128,
    /// Source GID.
    pub sgid: u128,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Raw traffic.
    pub raw_traffic: bool,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible.
    pub reversible: bool,
    /// Number of paths (7 bits).
    pub numb_path: u8,
    /// P_Key shared by both ends.
    pub pkey: u16,
    /// QoS class (12 bits).
    pub qos_class: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// MTU selector (2 bits).
    pub mtu_selector: u8,
    /// MTU (6 bits).
    pub mtu: u8,
    /// Rate selector (2 bits).
    pub rate_selector: u8,
    /// Rate (6 bits).
    pub rate: u8,
    /// Packet lifetime selector (2 bits).
    pub packet_life_selector: u8,
    /// Packet lifetime (6 bits).
    pub packet_life: u8,
    /// Preference.
    pub preference: u8,
}

fn split_sel(b: u8) -> (u8, u8) {
    (b >> 6, b & 0x3f)
}
fn join_sel(sel: u8, v: u8) -> u8 {
    ((sel & 0x03) << 6) | (v & 0x3f)
}

impl PathRecordRepr {
    /// A query record between two LIDs (component mask: [`component::SLID`] | [`component::DLID`]).
    pub fn between_lids(slid: u16, dlid: u16) -> PathRecordRepr {
        PathRecordRepr {
            slid,
            dlid,
            ..Default::default()
        }
    }

    /// A query record between two GIDs (component mask: [`component::SGID`] | [`component::DGID`]).
    pub fn between_gids(sgid: u128, dgid: u128) -> PathRecordRepr {
        PathRecordRepr {
            sgid,
            dgid,
            ..Default::default()
        }
    }

    /// Reads a PathRecord. Reserved bits of the flow word must be zero.
    pub fn parse<T: AsRef<[u8]>>(packet: &PathRecord<T>) -> Result<PathRecordRepr, MadError> {
        let flow = packet.flow_word();
        if flow & 0x7000_0000 != 0 {
            return Err(MadError::FieldRange {
                what: "PathRecord",
                field: "reserved bits of the flow word",
                value: flow.into(),
            });
        }
        let rnp = packet.reversible_numb_path();
        let qos = packet.qos_sl();
        let (mtu_selector, mtu) = split_sel(packet.mtu_byte());
        let (rate_selector, rate) = split_sel(packet.rate_byte());
        let (packet_life_selector, packet_life) = split_sel(packet.packet_life_byte());
        Ok(PathRecordRepr {
            service_id: packet.service_id(),
            dgid: packet.dgid(),
            sgid: packet.sgid(),
            dlid: packet.dlid(),
            slid: packet.slid(),
            raw_traffic: flow & 0x8000_0000 != 0,
            flow_label: (flow >> 8) & 0x000f_ffff,
            hop_limit: (flow & 0xff) as u8,
            tclass: packet.tclass(),
            reversible: rnp & 0x80 != 0,
            numb_path: rnp & 0x7f,
            pkey: packet.pkey(),
            qos_class: qos >> 4,
            sl: (qos & 0x0f) as u8,
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            packet_life_selector,
            packet_life,
            preference: packet.preference(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes all 64 bytes. Values wider than their bit field are cut to it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut PathRecord<T>) {
        packet.set_service_id(self.service_id);
        packet.set_dgid(self.dgid);
        packet.set_sgid(self.sgid);
        packet.set_dlid(self.dlid);
        packet.set_slid(self.slid);
        let raw = if self.raw_traffic { 0x8000_0000 } else { 0 };
        packet.set_flow_word(
            raw | ((self.flow_label & 0x000f_ffff) << 8) | u32::from(self.hop_limit),
        );
        packet.set_tclass(self.tclass);
        packet.set_reversible_numb_path(
            if self.reversible { 0x80 } else { 0 } | (self.numb_path & 0x7f),
        );
        packet.set_pkey(self.pkey);
        packet.set_qos_sl(((self.qos_class & 0x0fff) << 4) | u16::from(self.sl & 0x0f));
        packet.set_mtu_byte(join_sel(self.mtu_selector, self.mtu));
        packet.set_rate_byte(join_sel(self.rate_selector, self.rate));
        packet.set_packet_life_byte(join_sel(self.packet_life_selector, self.packet_life));
        packet.set_preference(self.preference);
    }

    /// The record as 64 bytes.
    pub fn to_bytes(&self) -> [u8; field::END] {
        let mut buf = [0; field::END];
        self.emit(&mut PathRecord::new_unchecked(&mut buf[..]));
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, sa};

    #[test]
    fn golden_path_record_query_and_answer() {
        let request = &golden::PATH_RECORD_GET[sa::field::DATA][..field::END];
        let query = PathRecordRepr::parse(&PathRecord::new_checked(request).unwrap()).unwrap();
        assert_eq!(
            query,
            PathRecordRepr::between_lids(golden::LID, golden::PEER_LID)
        );
        let data = &golden::PATH_RECORD_GET_RESP[sa::field::DATA][..field::END];
        let record = PathRecordRepr::parse(&PathRecord::new_checked(data).unwrap()).unwrap();
        assert_eq!(record.slid, golden::LID);
        assert_eq!(record.dlid, golden::PEER_LID);
        assert_eq!(record.pkey, golden::SHARED_PKEY);
        assert_eq!(
            record.sgid & u128::from(u64::MAX),
            u128::from(golden::PORT_GUID)
        );
        assert_eq!((record.sgid >> 64) as u64, 0xfe80_0000_0000_0000);
        let mut buf = [0xa5u8; field::END];
        record.emit(&mut PathRecord::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], data);
    }

    #[test]
    fn bit_fields_round_trip() {
        let repr = PathRecordRepr {
            raw_traffic: true,
            flow_label: 0xabcde,
            hop_limit: 0xff,
            reversible: true,
            numb_path: 0x7f,
            qos_class: 0xfff,
            sl: 0xf,
            mtu_selector: 2,
            mtu: 4,
            rate_selector: 3,
            rate: 0x3f,
            packet_life_selector: 1,
            packet_life: 0x12,
            ..PathRecordRepr::between_gids(1 << 100, 7)
        };
        let bytes = repr.to_bytes();
        let back = PathRecordRepr::parse(&PathRecord::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(back, repr);
    }

    #[test]
    fn reserved_flow_bits_are_refused() {
        let mut bytes = [0u8; 64];
        bytes[44] = 0x10;
        assert!(PathRecordRepr::parse(&PathRecord::new_checked(&bytes[..]).unwrap()).is_err());
        assert!(PathRecord::new_checked(&bytes[..63]).is_err());
    }
}
