//! The SA P_KeyTableRecord attribute (0x0033): one 32-entry block of one port's P_Key table as
//! the subnet manager holds it (IBA 15.2.5.11; opensm's and rdma-core's `ib_pkey_table_record_t`):
//! LID (a channel adapter's port; a switch's port 0), block number, port number (switches only),
//! three reserved bytes, then the 32 big-endian P_Keys. 72 bytes, so a GetTable response holds
//! records 9 words apart and a single MAD holds two: ask per (LID, block).

use super::pkey_table::ENTRIES_PER_BLOCK;
use super::{be, check_len, MadError};

/// Byte ranges of a P_KeyTableRecord.
pub mod field {
    use crate::mad::Field;
    /// The port's LID.
    pub const LID: Field = 0..2;
    /// The block of the table (0: entries 0..32).
    pub const BLOCK: Field = 2..4;
    /// A switch's port number; reserved for a channel adapter.
    pub const PORT_NUM: usize = 4;
    /// Reserved (one byte, then a 16-bit word).
    pub const RESERVED: Field = 5..8;
    /// Entry `i` (0..32) of the block.
    pub const fn entry(i: usize) -> Field {
        8 + 2 * i..8 + 2 * i + 2
    }
    /// First byte after the record.
    pub const END: usize = 8 + 2 * super::ENTRIES_PER_BLOCK;
}

/// The attribute offset (8-byte words) of P_KeyTableRecords in a GetTable response.
pub const ATTRIBUTE_OFFSET: u16 = 9;
const _: () = assert!(ATTRIBUTE_OFFSET as usize == field::END.div_ceil(8));

/// Component mask bits of a P_KeyTableRecord query.
pub mod component {
    /// LID.
    pub const LID: u64 = 1 << 0;
    /// Block number.
    pub const BLOCK: u64 = 1 << 1;
    /// Port number.
    pub const PORT_NUM: u64 = 1 << 2;
}

/// A read/write view of a P_KeyTableRecord.
#[derive(Debug, Clone)]
pub struct PKeyTableRecord<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PKeyTableRecord<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> PKeyTableRecord<T> {
        PKeyTableRecord { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 72 bytes.
    pub fn new_checked(buffer: T) -> Result<PKeyTableRecord<T>, MadError> {
        check_len("P_KeyTableRecord", buffer.as_ref(), field::END)?;
        Ok(PKeyTableRecord { buffer })
    }
    /// LID.
    pub fn lid(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::LID)
    }
    /// Block number.
    pub fn block(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::BLOCK)
    }
    /// Port number.
    pub fn port_num(&self) -> u8 {
        self.buffer.as_ref()[field::PORT_NUM]
    }
    /// Entry `i` (0..32).
    pub fn entry(&self, i: usize) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::entry(i))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PKeyTableRecord<T> {
    /// Sets the LID.
    pub fn set_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LID, v);
    }
    /// Sets the block number.
    pub fn set_block(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::BLOCK, v);
    }
    /// Sets the port number and clears the reserved bytes after it.
    pub fn set_port_num(&mut self, v: u8) {
        let b = self.buffer.as_mut();
        b[field::PORT_NUM] = v;
        b[field::RESERVED].fill(0);
    }
    /// Sets entry `i` (0..32).
    pub fn set_entry(&mut self, i: usize, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::entry(i), v);
    }
}

/// A P_KeyTableRecord as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PKeyTableRecordRepr {
    /// The port's LID.
    pub lid: u16,
    /// The block.
    pub block: u16,
    /// A switch's port number (0 for a channel adapter).
    pub port_num: u8,
    /// The block's 32 P_Keys (bit 15: full membership).
    pub entries: [u16; ENTRIES_PER_BLOCK],
}

impl PKeyTableRecordRepr {
    /// A query record for block `block` of the port at `lid` (send it with
    /// [`component::LID`] | [`component::BLOCK`]).
    pub fn query(lid: u16, block: u16) -> PKeyTableRecordRepr {
        PKeyTableRecordRepr {
            lid,
            block,
            port_num: 0,
            entries: [0; ENTRIES_PER_BLOCK],
        }
    }

    /// Reads a record (the length was checked by [`PKeyTableRecord::new_checked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &PKeyTableRecord<T>) -> PKeyTableRecordRepr {
        let mut entries = [0u16; ENTRIES_PER_BLOCK];
        for (i, e) in entries.iter_mut().enumerate() {
            *e = packet.entry(i);
        }
        PKeyTableRecordRepr {
            lid: packet.lid(),
            block: packet.block(),
            port_num: packet.port_num(),
            entries,
        }
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes the 72 bytes of the record (the reserved bytes as zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut PKeyTableRecord<T>) {
        packet.set_lid(self.lid);
        packet.set_block(self.block);
        packet.set_port_num(self.port_num);
        for (i, e) in self.entries.iter().enumerate() {
            packet.set_entry(i, *e);
        }
    }

    /// The record as bytes.
    pub fn to_bytes(&self) -> [u8; field::END] {
        let mut bytes = [0u8; field::END];
        self.emit(&mut PKeyTableRecord::new_unchecked(&mut bytes[..]));
        bytes
    }

    /// The entry holding `base` (the low 15 bits), if any: `Some(true)` when a full member.
    pub fn membership_of(&self, base: u16) -> Option<bool> {
        self.entries
            .iter()
            .find(|e| **e & 0x7fff == base && **e & 0x7fff != 0)
            .map(|e| e & 0x8000 != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block 0 of LID 4's table with the default partition (full) and 0x8001 (full) and 0x0a12
    /// (limited), laid out as IBA 15.2.5.11 / `ib_pkey_table_record_t` put it.
    const GOLDEN: [u8; field::END] = {
        let mut b = [0u8; field::END];
        b[0] = 0x00; // LID 0x0004
        b[1] = 0x04;
        b[2] = 0x00; // block 0
        b[3] = 0x00;
        b[4] = 0x00; // port number (channel adapter: reserved)
        b[8] = 0xff; // entry 0: 0xffff
        b[9] = 0xff;
        b[10] = 0x80; // entry 1: 0x8001
        b[11] = 0x01;
        b[12] = 0x0a; // entry 2: 0x0a12
        b[13] = 0x12;
        b
    };

    #[test]
    fn golden_record_parses_and_emits_every_byte() {
        let r = PKeyTableRecordRepr::parse(&PKeyTableRecord::new_checked(&GOLDEN[..]).unwrap());
        assert_eq!((r.lid, r.block, r.port_num), (4, 0, 0));
        assert_eq!(&r.entries[..4], &[0xffff, 0x8001, 0x0a12, 0]);
        assert_eq!(r.membership_of(0x0001), Some(true));
        assert_eq!(r.membership_of(0x0a12), Some(false));
        assert_eq!(r.membership_of(0x0b22), None);
        // An empty slot never matches.
        assert_eq!(r.membership_of(0), None);
        // Emitting over 0xa5 reproduces every byte, the reserved ones included.
        let mut buf = [0xa5u8; field::END];
        r.emit(&mut PKeyTableRecord::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
        assert_eq!(r.buffer_len(), 72);
    }

    #[test]
    fn a_query_names_the_lid_and_block() {
        let q = PKeyTableRecordRepr::query(0x0123, 2).to_bytes();
        assert_eq!(&q[..8], &[0x01, 0x23, 0x00, 0x02, 0, 0, 0, 0]);
        assert!(q[8..].iter().all(|b| *b == 0));
    }

    #[test]
    fn a_short_buffer_is_refused() {
        assert!(matches!(
            PKeyTableRecord::new_checked(&[0u8; 71][..]),
            Err(MadError::Truncated { needed: 72, .. })
        ));
    }
}
