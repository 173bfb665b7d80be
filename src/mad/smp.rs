//! Subnet management packets (SMPs): directed-route (class 0x81) and LID-routed (class 0x01).
//!
//! Layout (256 bytes): common header 0..24 (for directed route, bytes 4..6 hold the D bit and a
//! 15-bit status, byte 6 the hop pointer, byte 7 the hop count), M_Key 24..32, DrSLID 32..34,
//! DrDLID 34..36, reserved 36..64, attribute data 64..128, initial path 128..192, return path
//! 192..256. In LID-routed SMPs everything after the M_Key except the data is reserved.

use super::header::{self, MadHeader, MadHeaderRepr};
use super::{be, check_len, class, MadError, MAD_LEN};

/// Byte ranges of an SMP.
pub mod field {
    use crate::mad::Field;
    /// M_Key.
    pub const M_KEY: Field = 24..32;
    /// Directed-route source LID.
    pub const DR_SLID: Field = 32..34;
    /// Directed-route destination LID.
    pub const DR_DLID: Field = 34..36;
    /// Reserved.
    pub const RESERVED: Field = 36..64;
    /// Attribute data.
    pub const DATA: Field = 64..128;
    /// Directed-route initial path (one egress port per hop, byte 0 unused).
    pub const INITIAL_PATH: Field = 128..192;
    /// Directed-route return path.
    pub const RETURN_PATH: Field = 192..256;
    /// The D (direction) bit inside the status word.
    pub const D_BIT: u16 = 0x8000;
}

/// Length of the attribute data of an SMP.
pub const DATA_LEN: usize = 64;
/// Length of a directed-route path.
pub const PATH_LEN: usize = 64;
/// The permissive LID, used as DrSLID/DrDLID when a whole route is directed.
pub const PERMISSIVE_LID: u16 = 0xFFFF;

/// A read/write view of an SMP.
#[derive(Debug, Clone)]
pub struct Smp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Smp<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Smp<T> {
        Smp { buffer }
    }

    /// Wraps a buffer, refusing one shorter than 256 bytes.
    pub fn new_checked(buffer: T) -> Result<Smp<T>, MadError> {
        check_len("SMP", buffer.as_ref(), MAD_LEN)?;
        Ok(Smp { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The common header.
    pub fn header(&self) -> MadHeader<&[u8]> {
        MadHeader::new_unchecked(&self.buffer.as_ref()[..header::field::END])
    }
    /// M_Key.
    pub fn m_key(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::M_KEY)
    }
    /// Directed-route source LID.
    pub fn dr_slid(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::DR_SLID)
    }
    /// Directed-route destination LID.
    pub fn dr_dlid(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::DR_DLID)
    }
    /// Attribute data.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
    /// Initial path.
    pub fn initial_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::INITIAL_PATH]
    }
    /// Return path.
    pub fn return_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::RETURN_PATH]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Smp<T> {
    /// The common header, writable.
    pub fn header_mut(&mut self) -> MadHeader<&mut [u8]> {
        MadHeader::new_unchecked(&mut self.buffer.as_mut()[..header::field::END])
    }
    /// Sets the M_Key.
    pub fn set_m_key(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::M_KEY, v);
    }
    /// Sets the directed-route source LID.
    pub fn set_dr_slid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::DR_SLID, v);
    }
    /// Sets the directed-route destination LID.
    pub fn set_dr_dlid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::DR_DLID, v);
    }
    /// Zeroes the reserved bytes 36..64.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }
    /// Attribute data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
    /// Initial path, writable.
    pub fn initial_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::INITIAL_PATH]
    }
    /// Return path, writable.
    pub fn return_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::RETURN_PATH]
    }
}

/// How an SMP is routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmpRouting {
    /// LID-routed (class 0x01).
    LidRouted,
    /// Directed route (class 0x81).
    Directed(DirectedRoute),
}

/// The directed-route fields of an SMP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectedRoute {
    /// The D bit: set on the way back (responses).
    pub inbound: bool,
    /// Hop pointer.
    pub hop_pointer: u8,
    /// Hop count (0 = the local port); at most 63.
    pub hop_count: u8,
    /// Directed-route source LID.
    pub dr_slid: u16,
    /// Directed-route destination LID.
    pub dr_dlid: u16,
    /// Initial path.
    pub initial_path: [u8; PATH_LEN],
    /// Return path.
    pub return_path: [u8; PATH_LEN],
}

impl DirectedRoute {
    /// The route to the sender's own port: 0 hops, permissive LIDs on both ends.
    pub fn local() -> DirectedRoute {
        DirectedRoute {
            inbound: false,
            hop_pointer: 0,
            hop_count: 0,
            dr_slid: PERMISSIVE_LID,
            dr_dlid: PERMISSIVE_LID,
            initial_path: [0; PATH_LEN],
            return_path: [0; PATH_LEN],
        }
    }
}

/// An SMP as plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmpRepr {
    /// Routing and its fields.
    pub routing: SmpRouting,
    /// Method.
    pub method: u8,
    /// Status: 15 bits for directed route (the D bit lives in [`DirectedRoute::inbound`]),
    /// 16 bits for LID-routed.
    pub status: u16,
    /// Transaction id.
    pub transaction_id: u64,
    /// Attribute id.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
    /// M_Key.
    pub m_key: u64,
    /// Attribute data.
    pub data: [u8; DATA_LEN],
}

impl SmpRepr {
    /// A Get of an attribute of the sender's own port (directed route, 0 hops, M_Key 0).
    pub fn local_get(attribute_id: u16, attribute_modifier: u32, transaction_id: u64) -> SmpRepr {
        SmpRepr {
            routing: SmpRouting::Directed(DirectedRoute::local()),
            method: super::method::GET,
            status: 0,
            transaction_id,
            attribute_id,
            attribute_modifier,
            m_key: 0,
            data: [0; DATA_LEN],
        }
    }

    /// Reads an SMP, refusing other classes, class versions and impossible hop counts.
    pub fn parse<T: AsRef<[u8]>>(packet: &Smp<T>) -> Result<SmpRepr, MadError> {
        let header = MadHeaderRepr::parse(&packet.header())?;
        if header.class_version != class::SMP_CLASS_VERSION {
            return Err(MadError::ClassVersion {
                what: "SMP",
                got: header.class_version,
            });
        }
        let (routing, status) = match header.mgmt_class {
            class::SUBN_LID_ROUTED => (SmpRouting::LidRouted, header.status),
            class::SUBN_DIRECTED_ROUTE => {
                let [hop_pointer, hop_count] = header.class_specific.to_be_bytes();
                if usize::from(hop_count) >= PATH_LEN {
                    return Err(MadError::FieldRange {
                        what: "SMP",
                        field: "hop_count",
                        value: hop_count.into(),
                    });
                }
                let mut initial_path = [0; PATH_LEN];
                initial_path.copy_from_slice(packet.initial_path());
                let mut return_path = [0; PATH_LEN];
                return_path.copy_from_slice(packet.return_path());
                let route = DirectedRoute {
                    inbound: header.status & field::D_BIT != 0,
                    hop_pointer,
                    hop_count,
                    dr_slid: packet.dr_slid(),
                    dr_dlid: packet.dr_dlid(),
                    initial_path,
                    return_path,
                };
                (SmpRouting::Directed(route), header.status & !field::D_BIT)
            }
            got => return Err(MadError::Class { what: "SMP", got }),
        };
        let mut data = [0; DATA_LEN];
        data.copy_from_slice(packet.data());
        Ok(SmpRepr {
            routing,
            method: header.method,
            status,
            transaction_id: header.transaction_id,
            attribute_id: header.attribute_id,
            attribute_modifier: header.attribute_modifier,
            m_key: packet.m_key(),
            data,
        })
    }

    /// Bytes [`emit`](Self::emit) writes: a whole MAD.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes all 256 bytes (reserved fields as zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Smp<T>) {
        let (mgmt_class, status, class_specific) = match &self.routing {
            SmpRouting::LidRouted => (class::SUBN_LID_ROUTED, self.status, 0),
            SmpRouting::Directed(r) => (
                class::SUBN_DIRECTED_ROUTE,
                (self.status & !field::D_BIT) | if r.inbound { field::D_BIT } else { 0 },
                u16::from_be_bytes([r.hop_pointer, r.hop_count]),
            ),
        };
        MadHeaderRepr {
            mgmt_class,
            class_version: class::SMP_CLASS_VERSION,
            method: self.method,
            status,
            class_specific,
            transaction_id: self.transaction_id,
            attribute_id: self.attribute_id,
            attribute_modifier: self.attribute_modifier,
        }
        .emit(&mut packet.header_mut());
        packet.set_m_key(self.m_key);
        packet.clear_reserved();
        packet.data_mut().copy_from_slice(&self.data);
        match &self.routing {
            SmpRouting::LidRouted => {
                packet.set_dr_slid(0);
                packet.set_dr_dlid(0);
                packet.initial_path_mut().fill(0);
                packet.return_path_mut().fill(0);
            }
            SmpRouting::Directed(r) => {
                packet.set_dr_slid(r.dr_slid);
                packet.set_dr_dlid(r.dr_dlid);
                packet.initial_path_mut().copy_from_slice(&r.initial_path);
                packet.return_path_mut().copy_from_slice(&r.return_path);
            }
        }
    }

    /// Whether this is a response (GetResp) to `request`: same transaction id in the low 32 bits
    /// (the high half may be rewritten on the way), same attribute and modifier.
    pub fn answers(&self, request: &SmpRepr) -> bool {
        self.method & super::method::RESPONSE_BIT != 0
            && super::header::same_transaction(self.transaction_id, request.transaction_id)
            && self.attribute_id == request.attribute_id
            && self.attribute_modifier == request.attribute_modifier
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{attribute, golden, method, status};

    fn parse(bytes: &[u8]) -> Result<SmpRepr, MadError> {
        SmpRepr::parse(&Smp::new_checked(bytes)?)
    }

    fn emit(repr: &SmpRepr) -> Vec<u8> {
        let mut buf = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut Smp::new_unchecked(&mut buf[..]));
        buf
    }

    #[test]
    fn golden_requests_are_what_we_emit() {
        let request = SmpRepr::local_get(attribute::NODE_INFO, 0, golden::NODE_INFO_TID);
        assert_eq!(emit(&request), golden::NODE_INFO_GET.to_vec());
        let request = SmpRepr::local_get(attribute::PKEY_TABLE, 1, golden::PKEY_TABLE_1_TID);
        assert_eq!(emit(&request), golden::PKEY_TABLE_1_GET.to_vec());
    }

    #[test]
    fn golden_vectors_round_trip() {
        for bytes in golden::SMPS {
            let repr = parse(bytes).unwrap();
            assert_eq!(emit(&repr), bytes.to_vec());
        }
    }

    #[test]
    fn golden_response_matches_its_request() {
        let request = SmpRepr::local_get(attribute::NODE_INFO, 0, golden::NODE_INFO_TID);
        let response = parse(&golden::NODE_INFO_GET_RESP).unwrap();
        assert!(response.answers(&request));
        assert!(!request.answers(&request));
        assert_eq!(response.method, method::GET_RESP);
        assert_eq!(response.status, status::OK);
        match response.routing {
            SmpRouting::Directed(r) => {
                assert!(r.inbound);
                assert_eq!(r.hop_count, 0);
                assert_eq!(r.dr_slid, PERMISSIVE_LID);
            }
            SmpRouting::LidRouted => panic!("expected directed route"),
        }
    }

    #[test]
    fn block_past_the_table_reports_invalid_field() {
        let response = parse(&golden::PKEY_TABLE_2_GET_RESP).unwrap();
        assert_eq!(response.status, status::INVALID_FIELD);
    }

    #[test]
    fn lid_routed_round_trips() {
        let repr = SmpRepr {
            routing: SmpRouting::LidRouted,
            method: method::GET,
            status: 0,
            transaction_id: 0x0102_0304_0506_0708,
            attribute_id: attribute::PORT_INFO,
            attribute_modifier: 1,
            m_key: 7,
            data: [3; DATA_LEN],
        };
        let bytes = emit(&repr);
        assert_eq!(bytes[1], class::SUBN_LID_ROUTED);
        assert_eq!(parse(&bytes).unwrap(), repr);
    }

    #[test]
    fn malformed_smps_are_refused() {
        assert!(matches!(
            parse(&golden::NODE_INFO_GET_RESP[..255]),
            Err(MadError::Truncated { needed: 256, .. })
        ));
        let mut bytes = golden::NODE_INFO_GET_RESP;
        bytes[1] = 0x03;
        assert_eq!(
            parse(&bytes),
            Err(MadError::Class {
                what: "SMP",
                got: 0x03
            })
        );
        let mut bytes = golden::NODE_INFO_GET_RESP;
        bytes[2] = 2;
        assert!(matches!(parse(&bytes), Err(MadError::ClassVersion { .. })));
        let mut bytes = golden::NODE_INFO_GET_RESP;
        bytes[7] = 64;
        assert!(matches!(parse(&bytes), Err(MadError::FieldRange { .. })));
    }
}
