//! Subnet administration MADs (class 0x03, version 2): the common header, an RMPP header
//! (requests never segment; see [`super::get_table`] for responses), the SM_Key, the attribute offset, the component
//! mask and 200 bytes of attribute data.

use super::header::{self, MadHeader, MadHeaderRepr};
use super::{be, check_len, class, MadError, MAD_LEN};

/// Byte ranges of an SA MAD.
pub mod field {
    use crate::mad::Field;
    /// RMPP version.
    pub const RMPP_VERSION: usize = 24;
    /// RMPP type.
    pub const RMPP_TYPE: usize = 25;
    /// RMPP response time and flags.
    pub const RMPP_RTIME_FLAGS: usize = 26;
    /// RMPP status.
    pub const RMPP_STATUS: usize = 27;
    /// RMPP data 1 (segment number).
    pub const RMPP_DATA1: Field = 28..32;
    /// RMPP data 2 (payload length).
    pub const RMPP_DATA2: Field = 32..36;
    /// SM_Key.
    pub const SM_KEY: Field = 36..44;
    /// Attribute offset, in 8-byte words (the record size in GetTable responses).
    pub const ATTRIBUTE_OFFSET: Field = 44..46;
    /// Reserved.
    pub const RESERVED: Field = 46..48;
    /// Component mask: which record fields the query constrains.
    pub const COMPONENT_MASK: Field = 48..56;
    /// Attribute data.
    pub const DATA: Field = 56..256;
}

/// Length of an SA MAD's attribute data.
pub const DATA_LEN: usize = 200;
/// Index of the RMPP version in [`SaMadRepr::rmpp`].
pub const RMPP_VERSION_INDEX: usize = 0;
/// Index of the RMPP type in [`SaMadRepr::rmpp`].
pub const RMPP_TYPE_INDEX: usize = 1;
/// Index of the RMPP response time and flags in [`SaMadRepr::rmpp`].
pub const RMPP_FLAGS_INDEX: usize = 2;

/// A read/write view of an SA MAD.
#[derive(Debug, Clone)]
pub struct SaMad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SaMad<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> SaMad<T> {
        SaMad { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 256 bytes.
    pub fn new_checked(buffer: T) -> Result<SaMad<T>, MadError> {
        check_len("SA MAD", buffer.as_ref(), MAD_LEN)?;
        Ok(SaMad { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The common header.
    pub fn header(&self) -> MadHeader<&[u8]> {
        MadHeader::new_unchecked(&self.buffer.as_ref()[..header::field::END])
    }
    /// RMPP header bytes: version, type, rtime/flags, status.
    pub fn rmpp_bytes(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [
            b[field::RMPP_VERSION],
            b[field::RMPP_TYPE],
            b[field::RMPP_RTIME_FLAGS],
            b[field::RMPP_STATUS],
        ]
    }
    /// RMPP data 1.
    pub fn rmpp_data1(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RMPP_DATA1)
    }
    /// RMPP data 2.
    pub fn rmpp_data2(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RMPP_DATA2)
    }
    /// SM_Key.
    pub fn sm_key(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::SM_KEY)
    }
    /// Attribute offset.
    pub fn attribute_offset(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::ATTRIBUTE_OFFSET)
    }
    /// Component mask.
    pub fn component_mask(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::COMPONENT_MASK)
    }
    /// Attribute data.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SaMad<T> {
    /// The common header, writable.
    pub fn header_mut(&mut self) -> MadHeader<&mut [u8]> {
        MadHeader::new_unchecked(&mut self.buffer.as_mut()[..header::field::END])
    }
    /// Sets the RMPP header bytes: version, type, rtime/flags, status.
    pub fn set_rmpp_bytes(&mut self, v: [u8; 4]) {
        let b = self.buffer.as_mut();
        b[field::RMPP_VERSION] = v[0];
        b[field::RMPP_TYPE] = v[1];
        b[field::RMPP_RTIME_FLAGS] = v[2];
        b[field::RMPP_STATUS] = v[3];
    }
    /// Sets RMPP data 1.
    pub fn set_rmpp_data1(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::RMPP_DATA1, v);
    }
    /// Sets RMPP data 2.
    pub fn set_rmpp_data2(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::RMPP_DATA2, v);
    }
    /// Sets the SM_Key.
    pub fn set_sm_key(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::SM_KEY, v);
    }
    /// Sets the attribute offset and clears the reserved word after it.
    pub fn set_attribute_offset(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::ATTRIBUTE_OFFSET, v);
        be::set_u16(self.buffer.as_mut(), field::RESERVED, 0);
    }
    /// Sets the component mask.
    pub fn set_component_mask(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::COMPONENT_MASK, v);
    }
    /// Attribute data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
}

/// An SA MAD as plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaMadRepr {
    /// Method (Get, GetResp, GetTable, ...).
    pub method: u8,
    /// Status word.
    pub status: u16,
    /// Transaction id.
    pub transaction_id: u64,
    /// Attribute id.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
    /// RMPP version, type, rtime/flags and status.
    pub rmpp: [u8; 4],
    /// RMPP data 1.
    pub rmpp_data1: u32,
    /// RMPP data 2.
    pub rmpp_data2: u32,
    /// SM_Key.
    pub sm_key: u64,
    /// Attribute offset (8-byte words).
    pub attribute_offset: u16,
    /// Component mask.
    pub component_mask: u64,
    /// Attribute data (one record, or the first records of a table).
    pub data: [u8; DATA_LEN],
}

impl SaMadRepr {
    /// A query of one attribute: `component_mask` says which fields of `record` to match.
    pub fn get(attribute_id: u16, component_mask: u64, record: &[u8], tid: u64) -> SaMadRepr {
        let mut data = [0; DATA_LEN];
        let n = record.len().min(DATA_LEN);
        data[..n].copy_from_slice(&record[..n]);
        SaMadRepr {
            method: super::method::GET,
            status: 0,
            transaction_id: tid,
            attribute_id,
            attribute_modifier: 0,
            rmpp: [0; 4],
            rmpp_data1: 0,
            rmpp_data2: 0,
            sm_key: 0,
            attribute_offset: 0,
            component_mask,
            data,
        }
    }

    /// Reads an SA MAD, refusing other classes and class versions.
    pub fn parse<T: AsRef<[u8]>>(packet: &SaMad<T>) -> Result<SaMadRepr, MadError> {
        let header = MadHeaderRepr::parse(&packet.header())?;
        if header.mgmt_class != class::SUBN_ADM {
            return Err(MadError::Class {
                what: "SA MAD",
                got: header.mgmt_class,
            });
        }
        if header.class_version != class::SA_CLASS_VERSION {
            return Err(MadError::ClassVersion {
                what: "SA MAD",
                got: header.class_version,
            });
        }
        let mut data = [0; DATA_LEN];
        data.copy_from_slice(packet.data());
        Ok(SaMadRepr {
            method: header.method,
            status: header.status,
            transaction_id: header.transaction_id,
            attribute_id: header.attribute_id,
            attribute_modifier: header.attribute_modifier,
            rmpp: packet.rmpp_bytes(),
            rmpp_data1: packet.rmpp_data1(),
            rmpp_data2: packet.rmpp_data2(),
            sm_key: packet.sm_key(),
            attribute_offset: packet.attribute_offset(),
            component_mask: packet.component_mask(),
            data,
        })
    }

    /// Bytes [`emit`](Self::emit) writes: a whole MAD.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes all 256 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut SaMad<T>) {
        MadHeaderRepr {
            mgmt_class: class::SUBN_ADM,
            class_version: class::SA_CLASS_VERSION,
            method: self.method,
            status: self.status,
            class_specific: 0,
            transaction_id: self.transaction_id,
            attribute_id: self.attribute_id,
            attribute_modifier: self.attribute_modifier,
        }
        .emit(&mut packet.header_mut());
        packet.set_rmpp_bytes(self.rmpp);
        packet.set_rmpp_data1(self.rmpp_data1);
        packet.set_rmpp_data2(self.rmpp_data2);
        packet.set_sm_key(self.sm_key);
        packet.set_attribute_offset(self.attribute_offset);
        packet.set_component_mask(self.component_mask);
        packet.data_mut().copy_from_slice(&self.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, method};

    fn emit(repr: &SaMadRepr) -> Vec<u8> {
        let mut buf = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut SaMad::new_unchecked(&mut buf[..]));
        buf
    }

    #[test]
    fn golden_sa_mads_round_trip() {
        for bytes in golden::SA_MADS {
            let repr = SaMadRepr::parse(&SaMad::new_checked(&bytes[..]).unwrap()).unwrap();
            assert_eq!(emit(&repr), bytes.to_vec());
        }
        let response =
            SaMadRepr::parse(&SaMad::new_checked(&golden::PATH_RECORD_GET_RESP[..]).unwrap())
                .unwrap();
        assert_eq!(response.method, method::GET_RESP);
        assert_eq!(response.status, 0);
    }

    #[test]
    fn foreign_and_truncated_sa_mads_are_refused() {
        assert!(SaMad::new_checked(&golden::PATH_RECORD_GET_RESP[..200]).is_err());
        let smp = SaMad::new_checked(&golden::NODE_INFO_GET_RESP[..]).unwrap();
        assert!(matches!(
            SaMadRepr::parse(&smp),
            Err(MadError::Class { got: 0x81, .. })
        ));
    }
}
