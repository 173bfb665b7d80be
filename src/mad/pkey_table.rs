//! The P_KeyTable attribute (0x0016): one block of 32 big-endian P_Keys. The attribute
//! modifier's low 16 bits select the block; on a switch's external ports bits 31..16 select
//! the port.

use super::{be, check_len, MadError};

/// Entries in one block.
pub const ENTRIES_PER_BLOCK: usize = ENTRIES_PER_BLOCK_U16 as usize;
const ENTRIES_PER_BLOCK_U16: u16 = 32;

/// How many blocks hold `entries` P_Keys.
pub fn blocks_for(entries: u16) -> u16 {
    entries.div_ceil(ENTRIES_PER_BLOCK_U16)
}

/// Byte ranges of a P_KeyTable block.
pub mod field {
    use crate::mad::Field;
    /// Entry `i` of the block.
    pub const fn entry(i: usize) -> Field {
        2 * i..2 * i + 2
    }
    /// First byte after the block.
    pub const END: usize = 2 * super::ENTRIES_PER_BLOCK;
}

/// The attribute modifier that selects `block` (of port `port` on a switch; 0 otherwise).
pub fn attribute_modifier(port: u8, block: u16) -> u32 {
    (u32::from(port) << 16) | u32::from(block)
}

/// A read/write view of one P_KeyTable block.
#[derive(Debug, Clone)]
pub struct PKeyTable<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PKeyTable<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> PKeyTable<T> {
        PKeyTable { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 64 bytes.
    pub fn new_checked(buffer: T) -> Result<PKeyTable<T>, MadError> {
        check_len("P_KeyTable", buffer.as_ref(), field::END)?;
        Ok(PKeyTable { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Entry `i` (0..32).
    pub fn entry(&self, i: usize) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::entry(i))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PKeyTable<T> {
    /// Sets entry `i` (0..32).
    pub fn set_entry(&mut self, i: usize, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::entry(i), v);
    }
}

/// One P_KeyTable block as plain values (0x0000 = empty slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PKeyTableRepr {
    /// The 32 entries, in table order.
    pub entries: [u16; ENTRIES_PER_BLOCK],
}

impl PKeyTableRepr {
    /// Reads a block.
    pub fn parse<T: AsRef<[u8]>>(packet: &PKeyTable<T>) -> Result<PKeyTableRepr, MadError> {
        let mut entries = [0; ENTRIES_PER_BLOCK];
        for (i, e) in entries.iter_mut().enumerate() {
            *e = packet.entry(i);
        }
        Ok(PKeyTableRepr { entries })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }
    /// Writes the block.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut PKeyTable<T>) {
        for (i, e) in self.entries.iter().enumerate() {
            packet.set_entry(i, *e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, smp};

    #[test]
    fn golden_blocks() {
        let data = &golden::PKEY_TABLE_0_GET_RESP[smp::field::DATA];
        let repr = PKeyTableRepr::parse(&PKeyTable::new_checked(data).unwrap()).unwrap();
        assert_eq!(repr.entries, golden::PKEY_BLOCK_0);
        let mut buf = [0xa5u8; field::END];
        repr.emit(&mut PKeyTable::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], data);
    }

    #[test]
    fn modifier_selects_port_and_block() {
        assert_eq!(attribute_modifier(0, 1), 1);
        assert_eq!(attribute_modifier(3, 2), 0x0003_0002);
    }

    #[test]
    fn truncated_block_is_refused() {
        assert!(PKeyTable::new_checked(&[0u8; 63][..]).is_err());
    }
}
