//! The common MAD header: the first 24 bytes of every management datagram.

use super::{be, check_len, MadError, BASE_VERSION};

/// Byte ranges of the common header.
pub mod field {
    use crate::mad::Field;
    /// Base version (1).
    pub const BASE_VERSION: usize = 0;
    /// Management class.
    pub const MGMT_CLASS: usize = 1;
    /// Class version.
    pub const CLASS_VERSION: usize = 2;
    /// Method (bit 7 = response).
    pub const METHOD: usize = 3;
    /// Status (for directed-route SMPs: D bit + 15-bit status).
    pub const STATUS: Field = 4..6;
    /// Class-specific (for directed-route SMPs: hop pointer, hop count).
    pub const CLASS_SPECIFIC: Field = 6..8;
    /// Transaction id.
    pub const TRANSACTION_ID: Field = 8..16;
    /// Attribute id.
    pub const ATTRIBUTE_ID: Field = 16..18;
    /// Reserved.
    pub const RESERVED: Field = 18..20;
    /// Attribute modifier.
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
    /// First byte after the header.
    pub const END: usize = 24;
}

/// A read/write view of a common MAD header.
#[derive(Debug, Clone)]
pub struct MadHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MadHeader<T> {
    /// Wraps a buffer without checking its length (accessors may panic on a short buffer).
    pub const fn new_unchecked(buffer: T) -> MadHeader<T> {
        MadHeader { buffer }
    }

    /// Wraps a buffer, refusing one shorter than the header.
    pub fn new_checked(buffer: T) -> Result<MadHeader<T>, MadError> {
        check_len("MAD header", buffer.as_ref(), field::END)?;
        Ok(MadHeader { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Base version.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Raw status word.
    pub fn status(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::STATUS)
    }
    /// Raw class-specific word.
    pub fn class_specific(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// Transaction id.
    pub fn transaction_id(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::TRANSACTION_ID)
    }
    /// Attribute id.
    pub fn attribute_id(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::ATTRIBUTE_ID)
    }
    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::ATTRIBUTE_MODIFIER)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadHeader<T> {
    /// Sets the base version.
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = v;
    }
    /// Sets the management class.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[field::MGMT_CLASS] = v;
    }
    /// Sets the class version.
    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = v;
    }
    /// Sets the method.
    pub fn set_method(&mut self, v: u8) {
        self.buffer.as_mut()[field::METHOD] = v;
    }
    /// Sets the raw status word.
    pub fn set_status(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::STATUS, v);
    }
    /// Sets the raw class-specific word.
    pub fn set_class_specific(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::CLASS_SPECIFIC, v);
    }
    /// Sets the transaction id.
    pub fn set_transaction_id(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::TRANSACTION_ID, v);
    }
    /// Sets the attribute id and clears the reserved word after it.
    pub fn set_attribute_id(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::ATTRIBUTE_ID, v);
        be::set_u16(self.buffer.as_mut(), field::RESERVED, 0);
    }
    /// Sets the attribute modifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::ATTRIBUTE_MODIFIER, v);
    }
}

/// The common header as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method.
    pub method: u8,
    /// Raw status word.
    pub status: u16,
    /// Raw class-specific word.
    pub class_specific: u16,
    /// Transaction id.
    pub transaction_id: u64,
    /// Attribute id.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// Reads a header, refusing any base version but 1.
    pub fn parse<T: AsRef<[u8]>>(packet: &MadHeader<T>) -> Result<MadHeaderRepr, MadError> {
        if packet.base_version() != BASE_VERSION {
            return Err(MadError::BaseVersion(packet.base_version()));
        }
        Ok(MadHeaderRepr {
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes every header byte (the reserved word included).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut MadHeader<T>) {
        packet.set_base_version(BASE_VERSION);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_attribute_modifier(self.attribute_modifier);
    }

    /// Whether the method is a response.
    pub fn is_response(&self) -> bool {
        self.method & super::method::RESPONSE_BIT != 0
    }
}

/// Whether two transaction ids agree in their low 32 bits: the part the requester owns (the
/// high half may be rewritten on the way).
pub fn same_transaction(a: u64, b: u64) -> bool {
    (a ^ b) & 0xffff_ffff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::golden;

    #[test]
    fn golden_header_fields() {
        let packet = MadHeader::new_checked(&golden::NODE_INFO_GET_RESP[..]).unwrap();
        let repr = MadHeaderRepr::parse(&packet).unwrap();
        assert_eq!(repr.mgmt_class, 0x81);
        assert_eq!(repr.method, 0x81);
        assert_eq!(repr.attribute_id, 0x0011);
        assert!(repr.is_response());
        let mut buf = [0xa5u8; 24];
        repr.emit(&mut MadHeader::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], &golden::NODE_INFO_GET_RESP[..24]);
    }

    #[test]
    fn short_and_foreign_headers_are_refused() {
        assert!(matches!(
            MadHeader::new_checked(&[1u8; 23][..]),
            Err(MadError::Truncated {
                needed: 24,
                got: 23,
                ..
            })
        ));
        let mut buf = [0u8; 24];
        buf[0] = 2;
        let packet = MadHeader::new_checked(&buf[..]).unwrap();
        assert_eq!(MadHeaderRepr::parse(&packet), Err(MadError::BaseVersion(2)));
    }
}
