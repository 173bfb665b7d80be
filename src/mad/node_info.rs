//! The NodeInfo attribute (0x0011): what a node is and how many P_Keys its ports hold.

use super::{be, check_len, MadError};

/// Byte ranges of NodeInfo inside an SMP's attribute data.
pub mod field {
    use crate::mad::Field;
    /// Base version.
    pub const BASE_VERSION: usize = 0;
    /// Class version.
    pub const CLASS_VERSION: usize = 1;
    /// Node type (1 channel adapter, 2 switch, 3 router).
    pub const NODE_TYPE: usize = 2;
    /// Number of physical ports.
    pub const NUM_PORTS: usize = 3;
    /// System image GUID.
    pub const SYSTEM_IMAGE_GUID: Field = 4..12;
    /// Node GUID.
    pub const NODE_GUID: Field = 12..20;
    /// GUID of the port the SMP was received on.
    pub const PORT_GUID: Field = 20..28;
    /// P_Key table entries per port (switch port 0 / CA ports).
    pub const PARTITION_CAP: Field = 28..30;
    /// Device id.
    pub const DEVICE_ID: Field = 30..32;
    /// Revision.
    pub const REVISION: Field = 32..36;
    /// Number of the port the SMP was received on.
    pub const LOCAL_PORT_NUM: usize = 36;
    /// Vendor id (24 bits).
    pub const VENDOR_ID: Field = 37..40;
    /// First byte after the attribute.
    pub const END: usize = 40;
}

/// Node types.
pub mod node_type {
    /// Channel adapter (HCA).
    pub const CHANNEL_ADAPTER: u8 = 1;
    /// Switch.
    pub const SWITCH: u8 = 2;
    /// Router.
    pub const ROUTER: u8 = 3;
}

/// A read/write view of NodeInfo.
#[derive(Debug, Clone)]
pub struct NodeInfo<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NodeInfo<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> NodeInfo<T> {
        NodeInfo { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 40 bytes.
    pub fn new_checked(buffer: T) -> Result<NodeInfo<T>, MadError> {
        check_len("NodeInfo", buffer.as_ref(), field::END)?;
        Ok(NodeInfo { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Base version.
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }
    /// Node type.
    pub fn node_type(&self) -> u8 {
        self.b()[field::NODE_TYPE]
    }
    /// Number of physical ports.
    pub fn num_ports(&self) -> u8 {
        self.b()[field::NUM_PORTS]
    }
    /// System image GUID.
    pub fn system_image_guid(&self) -> u64 {
        be::u64_at(self.b(), field::SYSTEM_IMAGE_GUID)
    }
    /// Node GUID.
    pub fn node_guid(&self) -> u64 {
        be::u64_at(self.b(), field::NODE_GUID)
    }
    /// Port GUID.
    pub fn port_guid(&self) -> u64 {
        be::u64_at(self.b(), field::PORT_GUID)
    }
    /// Partition capacity.
    pub fn partition_cap(&self) -> u16 {
        be::u16_at(self.b(), field::PARTITION_CAP)
    }
    /// Device id.
    pub fn device_id(&self) -> u16 {
        be::u16_at(self.b(), field::DEVICE_ID)
    }
    /// Revision.
    pub fn revision(&self) -> u32 {
        be::u32_at(self.b(), field::REVISION)
    }
    /// Local port number.
    pub fn local_port_num(&self) -> u8 {
        self.b()[field::LOCAL_PORT_NUM]
    }
    /// Vendor id.
    pub fn vendor_id(&self) -> u32 {
        let b = &self.b()[field::VENDOR_ID];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> NodeInfo<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the base version.
    pub fn set_base_version(&mut self, v: u8) {
        self.m()[field::BASE_VERSION] = v;
    }
    /// Sets the class version.
    pub fn set_class_version(&mut self, v: u8) {
        self.m()[field::CLASS_VERSION] = v;
    }
    /// Sets the node type.
    pub fn set_node_type(&mut self, v: u8) {
        self.m()[field::NODE_TYPE] = v;
    }
    /// Sets the number of ports.
    pub fn set_num_ports(&mut self, v: u8) {
        self.m()[field::NUM_PORTS] = v;
    }
    /// Sets the system image GUID.
    pub fn set_system_image_guid(&mut self, v: u64) {
        be::set_u64(self.m(), field::SYSTEM_IMAGE_GUID, v);
    }
    /// Sets the node GUID.
    pub fn set_node_guid(&mut self, v: u64) {
        be::set_u64(self.m(), field::NODE_GUID, v);
    }
    /// Sets the port GUID.
    pub fn set_port_guid(&mut self, v: u64) {
        be::set_u64(self.m(), field::PORT_GUID, v);
    }
    /// Sets the partition capacity.
    pub fn set_partition_cap(&mut self, v: u16) {
        be::set_u16(self.m(), field::PARTITION_CAP, v);
    }
    /// Sets the device id.
    pub fn set_device_id(&mut self, v: u16) {
        be::set_u16(self.m(), field::DEVICE_ID, v);
    }
    /// Sets the revision.
    pub fn set_revision(&mut self, v: u32) {
        be::set_u32(self.m(), field::REVISION, v);
    }
    /// Sets the local port number.
    pub fn set_local_port_num(&mut self, v: u8) {
        self.m()[field::LOCAL_PORT_NUM] = v;
    }
    /// Sets the vendor id (low 24 bits).
    pub fn set_vendor_id(&mut self, v: u32) {
        let [_, a, b, c] = v.to_be_bytes();
        self.m()[field::VENDOR_ID].copy_from_slice(&[a, b, c]);
    }
}

/// NodeInfo as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfoRepr {
    /// Base version.
    pub base_version: u8,
    /// Class version.
    pub class_version: u8,
    /// Node type (see [`node_type`]).
    pub node_type: u8,
    /// Number of physical ports.
    pub num_ports: u8,
    /// System image GUID.
    pub system_image_guid: u64,
    /// Node GUID.
    pub node_guid: u64,
    /// GUID of the port that answered.
    pub port_guid: u64,
    /// P_Key table entries per port.
    pub partition_cap: u16,
    /// Device id.
    pub device_id: u16,
    /// Revision.
    pub revision: u32,
    /// Number of the port that answered.
    pub local_port_num: u8,
    /// Vendor id (24 bits).
    pub vendor_id: u32,
}

impl NodeInfoRepr {
    /// Reads NodeInfo, refusing a vendor id wider than 24 bits is impossible by layout, so only
    /// the length is checked (by [`NodeInfo::new_checked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &NodeInfo<T>) -> Result<NodeInfoRepr, MadError> {
        Ok(NodeInfoRepr {
            base_version: packet.base_version(),
            class_version: packet.class_version(),
            node_type: packet.node_type(),
            num_ports: packet.num_ports(),
            system_image_guid: packet.system_image_guid(),
            node_guid: packet.node_guid(),
            port_guid: packet.port_guid(),
            partition_cap: packet.partition_cap(),
            device_id: packet.device_id(),
            revision: packet.revision(),
            local_port_num: packet.local_port_num(),
            vendor_id: packet.vendor_id(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes the 40 bytes of NodeInfo.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut NodeInfo<T>) {
        packet.set_base_version(self.base_version);
        packet.set_class_version(self.class_version);
        packet.set_node_type(self.node_type);
        packet.set_num_ports(self.num_ports);
        packet.set_system_image_guid(self.system_image_guid);
        packet.set_node_guid(self.node_guid);
        packet.set_port_guid(self.port_guid);
        packet.set_partition_cap(self.partition_cap);
        packet.set_device_id(self.device_id);
        packet.set_revision(self.revision);
        packet.set_local_port_num(self.local_port_num);
        packet.set_vendor_id(self.vendor_id);
    }

    /// Number of 32-entry P_KeyTable blocks that hold `partition_cap` entries.
    pub fn pkey_blocks(&self) -> u16 {
        super::pkey_table::blocks_for(self.partition_cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{golden, smp};

    #[test]
    fn golden_node_info() {
        let data = &golden::NODE_INFO_GET_RESP[smp::field::DATA];
        let repr = NodeInfoRepr::parse(&NodeInfo::new_checked(data).unwrap()).unwrap();
        assert_eq!(repr.node_type, node_type::CHANNEL_ADAPTER);
        assert_eq!(repr.num_ports, 1);
        assert_eq!(repr.node_guid, golden::NODE_GUID);
        assert_eq!(repr.port_guid, golden::PORT_GUID);
        assert_eq!(repr.partition_cap, 64);
        assert_eq!(repr.pkey_blocks(), 2);
        assert_eq!(repr.local_port_num, 1);
        let mut buf = [0xa5u8; field::END];
        repr.emit(&mut NodeInfo::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], &data[..field::END]);
    }

    #[test]
    fn block_count_rounds_up() {
        let mut repr =
            NodeInfoRepr::parse(&NodeInfo::new_checked(&[0u8; 40][..]).unwrap()).unwrap();
        for (cap, blocks) in [(0, 0), (1, 1), (32, 1), (33, 2), (128, 4), (u16::MAX, 2048)] {
            repr.partition_cap = cap;
            assert_eq!(repr.pkey_blocks(), blocks, "cap {cap}");
        }
    }

    #[test]
    fn truncated_node_info_is_refused() {
        assert!(matches!(
            NodeInfo::new_checked(&[0u8; 39][..]),
            Err(MadError::Truncated {
                needed: 40,
                got: 39,
                ..
            })
        ));
    }
}
