//! The SA NodeRecord attribute (0x0011): one port of one node as the subnet administrator knows
//! it — the port's LID, the node's NodeInfo (as seen through that port) and its 64-byte
//! NodeDescription. The SM host reads it to learn who owns a port GUID: the node type says
//! whether the port is a channel adapter's, and the description names the host (rdma-core's
//! `rdma-ndd` sets it to `<hostname> <device>`; ibsim to the node's name in its net file).
//!
//! A query by port GUID (component [`component::PORT_GUID`]) matches at most one record for a
//! channel-adapter port (a switch answers one record for its port 0).

use super::node_info::{self, NodeInfo, NodeInfoRepr};
use super::{be, check_len, MadError};

/// Byte ranges of a NodeRecord.
pub mod field {
    use crate::mad::Field;
    /// LID of the port (the base LID).
    pub const LID: Field = 0..2;
    /// Reserved.
    pub const RESERVED: Field = 2..4;
    /// The node's NodeInfo, as read through the port.
    pub const NODE_INFO: Field = 4..44;
    /// The node's NodeDescription: UTF-8, NUL-padded, not necessarily NUL-terminated.
    pub const NODE_DESCRIPTION: Field = 44..108;
    /// First byte after the record.
    pub const END: usize = 108;
}

/// Length of a NodeDescription.
pub const DESCRIPTION_LEN: usize = 64;

/// The attribute offset (in 8-byte words) of NodeRecords in a GetTable response: the record
/// rounded up to a multiple of 8 bytes.
pub const ATTRIBUTE_OFFSET: u16 = 14;
const _: () = assert!(ATTRIBUTE_OFFSET as usize == field::END.div_ceil(8));

/// Component mask bits of a NodeRecord query (one per field, in record order; NodeInfo's
/// fields each have their own bit).
pub mod component {
    /// LID.
    pub const LID: u64 = 1 << 0;
    /// Node type.
    pub const NODE_TYPE: u64 = 1 << 4;
    /// Number of ports.
    pub const NUM_PORTS: u64 = 1 << 5;
    /// System image GUID.
    pub const SYSTEM_IMAGE_GUID: u64 = 1 << 6;
    /// Node GUID.
    pub const NODE_GUID: u64 = 1 << 7;
    /// Port GUID.
    pub const PORT_GUID: u64 = 1 << 8;
    /// Local port number.
    pub const LOCAL_PORT_NUM: u64 = 1 << 12;
    /// NodeDescription.
    pub const NODE_DESCRIPTION: u64 = 1 << 14;
}

/// A read/write view of a NodeRecord.
#[derive(Debug, Clone)]
pub struct NodeRecord<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NodeRecord<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> NodeRecord<T> {
        NodeRecord { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 108 bytes.
    pub fn new_checked(buffer: T) -> Result<NodeRecord<T>, MadError> {
        check_len("NodeRecord", buffer.as_ref(), field::END)?;
        Ok(NodeRecord { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// LID.
    pub fn lid(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::LID)
    }
    /// The embedded NodeInfo.
    pub fn node_info(&self) -> NodeInfo<&[u8]> {
        NodeInfo::new_unchecked(&self.buffer.as_ref()[field::NODE_INFO])
    }
    /// The raw NodeDescription bytes.
    pub fn node_description(&self) -> &[u8] {
        &self.buffer.as_ref()[field::NODE_DESCRIPTION]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> NodeRecord<T> {
    /// Sets the LID and clears the reserved word after it.
    pub fn set_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LID, v);
        be::set_u16(self.buffer.as_mut(), field::RESERVED, 0);
    }
    /// The embedded NodeInfo, writable.
    pub fn node_info_mut(&mut self) -> NodeInfo<&mut [u8]> {
        NodeInfo::new_unchecked(&mut self.buffer.as_mut()[field::NODE_INFO])
    }
    /// Sets the raw NodeDescription bytes.
    pub fn set_node_description(&mut self, v: &[u8; DESCRIPTION_LEN]) {
        self.buffer.as_mut()[field::NODE_DESCRIPTION].copy_from_slice(v);
    }
}

/// A NodeRecord as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRecordRepr {
    /// The port's base LID.
    pub lid: u16,
    /// The node's NodeInfo, as read through the port (its `port_guid` is that port's GUID).
    pub node_info: NodeInfoRepr,
    /// The raw NodeDescription.
    pub description: [u8; DESCRIPTION_LEN],
}

impl NodeRecordRepr {
    /// A query record matching one port GUID (send it with [`component::PORT_GUID`]).
    pub fn by_port_guid(port_guid: u64) -> NodeRecordRepr {
        let mut bytes = [0u8; field::END];
        NodeRecord::new_unchecked(&mut bytes[..])
            .node_info_mut()
            .set_port_guid(port_guid);
        // Parsing a zeroed record of the right length cannot fail.
        NodeRecordRepr::parse(&NodeRecord::new_unchecked(&bytes[..]))
            .expect("a zeroed record parses")
    }

    /// Reads a NodeRecord (the length was checked by [`NodeRecord::new_checked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &NodeRecord<T>) -> Result<NodeRecordRepr, MadError> {
        let mut description = [0u8; DESCRIPTION_LEN];
        description.copy_from_slice(packet.node_description());
        Ok(NodeRecordRepr {
            lid: packet.lid(),
            node_info: NodeInfoRepr::parse(&packet.node_info())?,
            description,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes the 108 bytes of the record (the reserved word as zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut NodeRecord<T>) {
        packet.set_lid(self.lid);
        self.node_info.emit(&mut packet.node_info_mut());
        packet.set_node_description(&self.description);
    }

    /// The record as bytes.
    pub fn to_bytes(&self) -> [u8; field::END] {
        let mut bytes = [0u8; field::END];
        self.emit(&mut NodeRecord::new_unchecked(&mut bytes[..]));
        bytes
    }

    /// The NodeDescription as text: the bytes up to the first NUL, invalid UTF-8 replaced (a
    /// replaced character never equals a node id, so a garbled name never matches one).
    pub fn description_text(&self) -> String {
        let end = self
            .description
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(DESCRIPTION_LEN);
        String::from_utf8_lossy(&self.description[..end]).into_owned()
    }

    /// Whether the record is a channel adapter's port (not a switch's or a router's).
    pub fn is_channel_adapter(&self) -> bool {
        self.node_info.node_type == node_info::node_type::CHANNEL_ADAPTER
    }
}

/// The record of `port_guid` among a GetTable answer's records (`None`: no record is that
/// port's). Only an exact match counts, whatever else an SA might answer; two records of one
/// port are refused as malformed.
pub fn find_by_port_guid(
    table: &super::TableRecords<'_>,
    port_guid: u64,
) -> Result<Option<NodeRecordRepr>, MadError> {
    let mut found = None;
    for bytes in table.iter() {
        let record = NodeRecordRepr::parse(&NodeRecord::new_checked(bytes)?)?;
        if record.node_info.port_guid == port_guid {
            if found.is_some() {
                return Err(MadError::FieldRange {
                    what: "SA NodeRecord by port GUID",
                    field: "records for one port GUID",
                    value: table.len() as u64,
                });
            }
            found = Some(record);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, sa, SaMad, SaMadRepr};

    fn golden_record() -> NodeRecordRepr {
        let mad =
            SaMadRepr::parse(&SaMad::new_checked(&golden::NODE_RECORD_GET_TABLE_RESP[..]).unwrap())
                .unwrap();
        NodeRecordRepr::parse(&NodeRecord::new_checked(&mad.data[..]).unwrap()).unwrap()
    }

    #[test]
    fn golden_node_record() {
        let r = golden_record();
        assert_eq!(r.lid, golden::NODE_RECORD_LID);
        assert!(r.is_channel_adapter());
        assert_eq!(r.node_info.port_guid, golden::NODE_RECORD_PORT_GUID);
        assert_eq!(r.node_info.local_port_num, 1);
        assert_eq!(r.description_text(), golden::NODE_RECORD_DESCRIPTION);
        // Emitting over 0xa5 reproduces every byte, the reserved word included.
        let mut buf = [0xa5u8; field::END];
        r.emit(&mut NodeRecord::new_unchecked(&mut buf[..]));
        assert_eq!(
            &buf[..],
            &golden::NODE_RECORD_GET_TABLE_RESP[sa::field::DATA][..field::END]
        );
    }

    #[test]
    fn query_record_carries_only_the_port_guid() {
        let q = NodeRecordRepr::by_port_guid(0x0002_c903_000e_0b72);
        let bytes = q.to_bytes();
        assert_eq!(&bytes[24..32], &0x0002_c903_000e_0b72u64.to_be_bytes());
        assert!(bytes[..24].iter().chain(&bytes[32..]).all(|b| *b == 0));
        assert_eq!(ATTRIBUTE_OFFSET, 14);
    }

    #[test]
    fn description_stops_at_the_first_nul_and_survives_bad_utf8() {
        let mut r = golden_record();
        r.description = [0; DESCRIPTION_LEN];
        r.description[..12].copy_from_slice(b"gpu-17 mlx5\0");
        r.description[13] = b'x';
        assert_eq!(r.description_text(), "gpu-17 mlx5");
        r.description = [b'a'; DESCRIPTION_LEN];
        assert_eq!(r.description_text().len(), DESCRIPTION_LEN);
        r.description[0] = 0xff;
        assert!(r.description_text().starts_with('\u{fffd}'));
        r.node_info.node_type = node_info::node_type::SWITCH;
        assert!(!r.is_channel_adapter());
    }

    #[test]
    fn truncated_record_is_refused() {
        assert!(matches!(
            NodeRecord::new_checked(&[0u8; 107][..]),
            Err(MadError::Truncated {
                needed: 108,
                got: 107,
                ..
            })
        ));
    }
}
