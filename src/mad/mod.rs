//! MAD codec: the management datagrams the agent exchanges with ports and the subnet
//! administrator. Pure byte layout: no unsafe, no I/O.
//!
//! Modelled on a classic packet codec: every field is declared once as a byte range (`field`
//! modules), a zero-copy `Packet<T: AsRef<[u8]>>` view checks the buffer length in
//! `new_checked`, and a high-level `Repr` has `parse`, `emit` and `buffer_len`. All multi-byte
//! fields are big-endian. Bit-packed fields are converted to byte offsets here and nowhere else.
//!
//! - [`header`]       — the 24-byte common MAD header
//! - [`smp`]          — subnet management packets, directed-route (class 0x81) and LID-routed (0x01)
//! - [`node_info`]    — the NodeInfo attribute (0x0011)
//! - [`port_info`]    — the PortInfo attribute (0x0015)
//! - [`pkey_table`]   — the P_KeyTable attribute (0x0016), 32 entries per block
//! - [`sm_info`]      — the SMInfo attribute (0x0020): an SM's GUID, priority and state
//! - [`sa`]           — subnet administration MADs (class 0x03)
//! - [`path_record`]  — the PathRecord attribute (0x0035) and its component mask bits
//! - [`node_record`]  — the SA NodeRecord attribute (0x0011): LID, NodeInfo, NodeDescription
//! - [`pkey_table_record`] — the SA P_KeyTableRecord attribute (0x0033): one block of one port's table as the SM holds it
//! - [`get_table`]    — SA GetTable (0x12/0x92): records `AttributeOffset * 8` apart, one MAD only

pub mod get_table;
pub mod header;
pub mod node_info;
pub mod node_record;
pub mod path_record;
pub mod pkey_table;
pub mod pkey_table_record;
pub mod port_info;
pub mod sa;
pub mod sm_info;
pub mod smp;

#[cfg(test)]
mod golden;

pub use get_table::TableRecords;
pub use header::{MadHeader, MadHeaderRepr};
pub use node_info::{NodeInfo, NodeInfoRepr};
pub use node_record::{NodeRecord, NodeRecordRepr};
pub use path_record::{PathRecord, PathRecordRepr};
pub use pkey_table::{PKeyTable, PKeyTableRepr};
pub use pkey_table_record::{PKeyTableRecord, PKeyTableRecordRepr};
pub use port_info::{PortInfo, PortInfoRepr};
pub use sa::{SaMad, SaMadRepr};
pub use sm_info::{SmInfo, SmInfoRepr};
pub use smp::{Smp, SmpRepr, SmpRouting};

use thiserror::Error;

/// A field's position inside a buffer, in bytes.
pub type Field = core::ops::Range<usize>;

/// Every MAD is exactly this long on the wire (no RMPP segmentation is used).
pub const MAD_LEN: usize = 256;

/// Base version of every MAD this codec speaks.
pub const BASE_VERSION: u8 = 1;

/// Management classes.
pub mod class {
    /// LID-routed subnet management.
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    /// Directed-route subnet management.
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    /// Subnet administration.
    pub const SUBN_ADM: u8 = 0x03;
    /// Class version of the subnet management classes.
    pub const SMP_CLASS_VERSION: u8 = 1;
    /// Class version of subnet administration.
    pub const SA_CLASS_VERSION: u8 = 2;
}

/// MAD methods used by the agent.
pub mod method {
    /// Get.
    pub const GET: u8 = 0x01;
    /// Set.
    pub const SET: u8 = 0x02;
    /// Response to Get or Set.
    pub const GET_RESP: u8 = 0x81;
    /// SA GetTable.
    pub const GET_TABLE: u8 = 0x12;
    /// SA GetTable response.
    pub const GET_TABLE_RESP: u8 = 0x92;
    /// The response bit: set in every response method.
    pub const RESPONSE_BIT: u8 = 0x80;
}

/// Attribute identifiers.
pub mod attribute {
    /// NodeInfo.
    pub const NODE_INFO: u16 = 0x0011;
    /// PortInfo.
    pub const PORT_INFO: u16 = 0x0015;
    /// P_KeyTable.
    pub const PKEY_TABLE: u16 = 0x0016;
    /// SMInfo.
    pub const SM_INFO: u16 = 0x0020;
    /// SA PathRecord.
    pub const PATH_RECORD: u16 = 0x0035;
    /// SA NodeRecord (the same id as NodeInfo, in the SA class).
    pub const NODE_RECORD: u16 = 0x0011;
    /// SA P_KeyTableRecord.
    pub const PKEY_TABLE_RECORD: u16 = 0x0033;
}

/// Status codes seen in MAD headers (the low 15 bits; the directed-route D bit is separate).
pub mod status {
    /// Success.
    pub const OK: u16 = 0x0000;
    /// Unsupported method / attribute combination, or an invalid attribute modifier
    /// (e.g. a P_KeyTable block past the end of the table).
    pub const INVALID_FIELD: u16 = 0x001C;
    /// SA: no records matched the query.
    pub const SA_NO_RECORDS: u16 = 0x0300;
}

/// Why a buffer could not be decoded or encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MadError {
    /// The buffer is shorter than the structure.
    #[error("{what}: truncated, need {needed} bytes, got {got}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Bytes required.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The MAD's base version is not 1.
    #[error("unsupported MAD base version {0}")]
    BaseVersion(u8),
    /// The management class is not the one the parser handles.
    #[error("{what}: unexpected management class {got:#04x}")]
    Class {
        /// The structure being read.
        what: &'static str,
        /// The class found.
        got: u8,
    },
    /// The class version is not the one the parser handles.
    #[error("{what}: unexpected class version {got}")]
    ClassVersion {
        /// The structure being read.
        what: &'static str,
        /// The version found.
        got: u8,
    },
    /// An SA table that does not fit one MAD (RMPP with more than one segment): refused, never
    /// cut short.
    #[error(
        "{what}: RMPP-segmented answer ({payload_len} payload bytes) is not read; narrow the query"
    )]
    Segmented {
        /// The structure being read.
        what: &'static str,
        /// The payload length the RMPP header announced.
        payload_len: u32,
    },
    /// A field holds a value the structure cannot carry.
    #[error("{what}: field {field} out of range ({value})")]
    FieldRange {
        /// The structure.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

/// Fails with [`MadError::Truncated`] when `buf` is shorter than `needed`.
pub(crate) fn check_len(what: &'static str, buf: &[u8], needed: usize) -> Result<(), MadError> {
    if buf.len() < needed {
        Err(MadError::Truncated {
            what,
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Big-endian accessors on fixed byte ranges. Callers check the buffer length first (in
/// `new_checked`), so every range here is in bounds.
pub(crate) mod be {
    use super::Field;

    fn array<const N: usize>(buf: &[u8], field: Field) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&buf[field]);
        out
    }

    pub fn u16_at(buf: &[u8], field: Field) -> u16 {
        u16::from_be_bytes(array(buf, field))
    }
    pub fn u32_at(buf: &[u8], field: Field) -> u32 {
        u32::from_be_bytes(array(buf, field))
    }
    pub fn u64_at(buf: &[u8], field: Field) -> u64 {
        u64::from_be_bytes(array(buf, field))
    }
    pub fn u128_at(buf: &[u8], field: Field) -> u128 {
        u128::from_be_bytes(array(buf, field))
    }
    pub fn set_u16(buf: &mut [u8], field: Field, v: u16) {
        buf[field].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u32(buf: &mut [u8], field: Field, v: u32) {
        buf[field].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u64(buf: &mut [u8], field: Field, v: u64) {
        buf[field].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u128(buf: &mut [u8], field: Field, v: u128) {
        buf[field].copy_from_slice(&v.to_be_bytes());
    }
}

/// Runs `bytes` through every parser of this module, as a MAD and as each attribute, and
/// re-emits whatever parses; returns how many parsers accepted the bytes. Used by the fuzz
/// target and the property tests. Malformed input never panics; the function panics only when
/// a parsed value does not survive emit + parse unchanged, which is a codec bug.
pub fn decode_everything(bytes: &[u8]) -> usize {
    let mut parsed = 0;
    if let Ok(p) = MadHeader::new_checked(bytes) {
        parsed += usize::from(MadHeaderRepr::parse(&p).is_ok());
    }
    if let Ok(p) = Smp::new_checked(bytes) {
        if let Ok(repr) = SmpRepr::parse(&p) {
            let mut buf = [0u8; MAD_LEN];
            repr.emit(&mut Smp::new_unchecked(&mut buf[..]));
            let again = SmpRepr::parse(&Smp::new_unchecked(&buf[..]));
            assert_eq!(again.as_ref(), Ok(&repr), "SMP round trip");
            parsed += 1;
        }
    }
    if let Ok(p) = SaMad::new_checked(bytes) {
        if let Ok(repr) = SaMadRepr::parse(&p) {
            let mut buf = [0u8; MAD_LEN];
            repr.emit(&mut SaMad::new_unchecked(&mut buf[..]));
            let again = SaMadRepr::parse(&SaMad::new_unchecked(&buf[..]));
            assert_eq!(again.as_ref(), Ok(&repr), "SA MAD round trip");
            parsed += 1;
        }
    }
    let attribute = bytes.get(smp::field::DATA).unwrap_or(bytes);
    if let Ok(p) = NodeInfo::new_checked(attribute) {
        parsed += usize::from(NodeInfoRepr::parse(&p).is_ok());
    }
    if let Ok(p) = PortInfo::new_checked(attribute) {
        if let Ok(repr) = PortInfoRepr::parse(&p) {
            let mut buf = [0u8; port_info::field::END];
            repr.emit(&mut PortInfo::new_unchecked(&mut buf[..]));
            assert_eq!(
                &buf[..],
                &attribute[..port_info::field::END],
                "PortInfo round trip"
            );
            parsed += 1;
        }
    }
    if let Ok(p) = PKeyTable::new_checked(attribute) {
        parsed += usize::from(PKeyTableRepr::parse(&p).is_ok());
    }
    if let Ok(p) = SmInfo::new_checked(attribute) {
        if let Ok(repr) = SmInfoRepr::parse(&p) {
            let mut buf = [0u8; sm_info::field::END];
            let emitted = repr.emit(&mut SmInfo::new_unchecked(&mut buf[..]));
            assert_eq!(emitted, Ok(()), "SMInfo emit");
            assert_eq!(
                &buf[..],
                &attribute[..sm_info::field::END],
                "SMInfo round trip"
            );
            parsed += 1;
        }
    }
    let record = bytes.get(sa::field::DATA).unwrap_or(bytes);
    if let Ok(p) = NodeRecord::new_checked(record) {
        if let Ok(repr) = NodeRecordRepr::parse(&p) {
            let again = NodeRecordRepr::parse(&NodeRecord::new_unchecked(&repr.to_bytes()[..]));
            assert_eq!(again, Ok(repr), "NodeRecord round trip");
            parsed += 1;
        }
    }
    if let Ok(p) = SaMad::new_checked(bytes) {
        if let Ok(repr) = SaMadRepr::parse(&p) {
            if let Ok(table) = TableRecords::new(&repr) {
                // Every record slice lies inside the data.
                parsed += usize::from(table.iter().map(<[u8]>::len).sum::<usize>() <= sa::DATA_LEN);
            }
        }
    }
    if let Ok(p) = PathRecord::new_checked(record) {
        if let Ok(repr) = PathRecordRepr::parse(&p) {
            let bytes = repr.to_bytes();
            let again = PathRecordRepr::parse(&PathRecord::new_unchecked(&bytes[..]));
            assert_eq!(again, Ok(repr), "PathRecord round trip");
            parsed += 1;
        }
    }
    parsed
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            decode_everything(&bytes);
        }

        #[test]
        fn mutated_golden_mads_never_panic(
            which in 0usize..12,
            flips in proptest::collection::vec((0usize..256, any::<u8>()), 1..8),
            cut in 0usize..=256,
        ) {
            let mut all: Vec<&[u8; 256]> = golden::SMPS.to_vec();
            all.extend(golden::SA_MADS);
            let mut bytes = all[which % all.len()].to_vec();
            for (at, v) in flips {
                bytes[at] = v;
            }
            bytes.truncate(cut);
            decode_everything(&bytes);
        }

        #[test]
        fn smp_repr_round_trips(
            lid_routed in any::<bool>(),
            method in any::<u8>(),
            status in 0u16..0x8000,
            tid in any::<u64>(),
            attribute_id in any::<u16>(),
            modifier in any::<u32>(),
            m_key in any::<u64>(),
            hops in 0u8..64,
            fill in any::<u8>(),
        ) {
            let routing = if lid_routed {
                SmpRouting::LidRouted
            } else {
                let mut r = smp::DirectedRoute::local();
                r.hop_count = hops;
                r.initial_path = [fill; smp::PATH_LEN];
                SmpRouting::Directed(r)
            };
            let repr = SmpRepr {
                routing,
                method,
                status,
                transaction_id: tid,
                attribute_id,
                attribute_modifier: modifier,
                m_key,
                data: [fill; smp::DATA_LEN],
            };
            let mut buf = [0xa5u8; MAD_LEN];
            repr.emit(&mut Smp::new_unchecked(&mut buf[..]));
            prop_assert_eq!(SmpRepr::parse(&Smp::new_checked(&buf[..]).unwrap()), Ok(repr));
        }

        #[test]
        fn node_info_round_trips(bytes in proptest::collection::vec(any::<u8>(), 40)) {
            let repr = NodeInfoRepr::parse(&NodeInfo::new_checked(&bytes[..]).unwrap()).unwrap();
            let mut buf = [0xa5u8; 40];
            repr.emit(&mut NodeInfo::new_unchecked(&mut buf[..]));
            prop_assert_eq!(&buf[..], &bytes[..]);
        }

        #[test]
        fn pkey_blocks_round_trip(entries in proptest::array::uniform32(any::<u16>())) {
            let repr = PKeyTableRepr { entries };
            let mut buf = [0xa5u8; 64];
            repr.emit(&mut PKeyTable::new_unchecked(&mut buf[..]));
            prop_assert_eq!(PKeyTableRepr::parse(&PKeyTable::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }

    #[test]
    fn golden_mads_decode_as_what_they_are() {
        for bytes in golden::SMPS {
            assert!(decode_everything(&bytes[..]) >= 2);
        }
        for bytes in golden::SA_MADS {
            assert!(decode_everything(&bytes[..]) >= 2);
        }
    }
}
