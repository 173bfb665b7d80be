//! The SA GetTable exchange (method 0x12, response 0x92): every record matching a query.
//!
//! A response's records sit `AttributeOffset * 8` bytes apart in the attribute data. A table
//! that does not fit one MAD is sent RMPP-segmented (RMPP header bytes 24..36: version, type,
//! response time + flags, status, segment number, payload length). This codec reads only
//! single-MAD answers: an unsegmented response (as many records as fit, and nothing after the
//! last whole record), or an RMPP response whose one segment is both first and last (its
//! payload length, SA header included, says how many records it holds). Anything longer is
//! refused with [`MadError::Segmented`], never silently cut short: a query that needs it must
//! be narrowed (e.g. by port GUID).
//!
//! OpenSM marks every GetTable response RMPP-active with RMPP version 0 and leaves the rest to
//! the kernel's RMPP layer; a path without one (the umad2sim shim, verified on ibsim) delivers
//! that MAD as it is, cut at 256 bytes. Version 0 is read as "not segmented", and a table cut
//! mid-record shows as bytes after the last whole record.

use super::sa::{self, SaMadRepr, DATA_LEN};
use super::{method, MadError};

/// RMPP header values.
pub mod rmpp {
    /// RMPP type DATA.
    pub const TYPE_DATA: u8 = 1;
    /// Flag: RMPP is active on this MAD.
    pub const FLAG_ACTIVE: u8 = 0x01;
    /// Flag: first segment.
    pub const FLAG_FIRST: u8 = 0x02;
    /// Flag: last segment.
    pub const FLAG_LAST: u8 = 0x04;
    /// The flag bits of the response-time/flags byte.
    pub const FLAGS_MASK: u8 = 0x07;
}

/// Bytes of the SA header (SM_Key, attribute offset, reserved, component mask) that an RMPP
/// payload length counts besides the records.
pub const SA_HEADER_LEN: u32 = 20;

/// A GetTable query of one attribute: `component_mask` says which fields of `record` to match.
pub fn request(attribute_id: u16, component_mask: u64, record: &[u8], tid: u64) -> SaMadRepr {
    SaMadRepr {
        method: method::GET_TABLE,
        ..SaMadRepr::get(attribute_id, component_mask, record, tid)
    }
}

/// The records of a single-MAD GetTable response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRecords<'a> {
    data: &'a [u8; DATA_LEN],
    stride: usize,
    count: usize,
}

impl<'a> TableRecords<'a> {
    /// Reads the record layout of a GetTable response. Refuses another method, an RMPP
    /// response of more than one segment, a payload longer than one MAD, and a zero attribute
    /// offset with records present.
    pub fn new(response: &'a SaMadRepr) -> Result<TableRecords<'a>, MadError> {
        const WHAT: &str = "SA GetTable response";
        if response.method != method::GET_TABLE_RESP {
            return Err(MadError::FieldRange {
                what: WHAT,
                field: "method",
                value: response.method.into(),
            });
        }
        let flags = response.rmpp[sa::RMPP_FLAGS_INDEX] & rmpp::FLAGS_MASK;
        let version = response.rmpp[sa::RMPP_VERSION_INDEX];
        let stride = usize::from(response.attribute_offset) * 8;
        if version == 0 || flags & rmpp::FLAG_ACTIVE == 0 {
            // Not segmented by RMPP (an RMPP version of 0 means the other RMPP fields carry
            // nothing): as many records as fit, and the bytes after the last whole record
            // must be empty, else the table was cut short on the way.
            if stride == 0 {
                if response.data.iter().any(|b| *b != 0) {
                    return Err(MadError::FieldRange {
                        what: WHAT,
                        field: "attribute offset",
                        value: 0,
                    });
                }
                return Ok(TableRecords {
                    data: &response.data,
                    stride,
                    count: 0,
                });
            }
            let count = DATA_LEN / stride;
            if response.data[count * stride..].iter().any(|b| *b != 0) {
                return Err(MadError::Segmented {
                    what: WHAT,
                    payload_len: 0,
                });
            }
            return Ok(TableRecords {
                data: &response.data,
                stride,
                count,
            });
        }
        let rmpp_type = response.rmpp[sa::RMPP_TYPE_INDEX];
        if rmpp_type != rmpp::TYPE_DATA {
            return Err(MadError::FieldRange {
                what: WHAT,
                field: "RMPP type",
                value: rmpp_type.into(),
            });
        }
        let payload = response.rmpp_data2;
        let single = rmpp::FLAG_FIRST | rmpp::FLAG_LAST;
        if flags & single != single || response.rmpp_data1 > 1 {
            return Err(MadError::Segmented {
                what: WHAT,
                payload_len: payload,
            });
        }
        let Some(bytes) = payload.checked_sub(SA_HEADER_LEN) else {
            return Err(MadError::FieldRange {
                what: WHAT,
                field: "RMPP payload length",
                value: payload.into(),
            });
        };
        let record_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        if record_bytes > DATA_LEN {
            return Err(MadError::Segmented {
                what: WHAT,
                payload_len: payload,
            });
        }
        let count = match (stride, record_bytes) {
            (_, 0) => 0,
            (0, _) => {
                return Err(MadError::FieldRange {
                    what: WHAT,
                    field: "attribute offset",
                    value: 0,
                })
            }
            (s, b) => b / s,
        };
        Ok(TableRecords {
            data: &response.data,
            stride,
            count,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Distance between records, in bytes.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The records, each `stride` bytes long.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.count).map(move |i| &self.data[i * self.stride..(i + 1) * self.stride])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::node_record::{self, NodeRecord, NodeRecordRepr};
    use crate::mad::{attribute, golden, SaMad};

    fn parse(bytes: &[u8; 256]) -> SaMadRepr {
        SaMadRepr::parse(&SaMad::new_checked(&bytes[..]).unwrap()).unwrap()
    }

    #[test]
    fn golden_request_is_what_this_codec_emits() {
        let q = NodeRecordRepr::by_port_guid(golden::NODE_RECORD_PORT_GUID);
        let mut repr = request(
            attribute::NODE_RECORD,
            node_record::component::PORT_GUID,
            &q.to_bytes(),
            golden::NODE_RECORD_TID,
        );
        let sent = parse(&golden::NODE_RECORD_GET_TABLE);
        // The transport writes the low 32 bits of the TID; the shim may rewrite the rest.
        repr.transaction_id = sent.transaction_id;
        let mut buf = [0xa5u8; 256];
        repr.emit(&mut SaMad::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden::NODE_RECORD_GET_TABLE);
    }

    #[test]
    fn golden_response_holds_one_record() {
        let response = parse(&golden::NODE_RECORD_GET_TABLE_RESP);
        let table = TableRecords::new(&response).unwrap();
        assert_eq!(table.len(), 1);
        assert_eq!(table.stride(), 112);
        let record = table.iter().next().unwrap();
        let r = NodeRecordRepr::parse(&NodeRecord::new_checked(record).unwrap()).unwrap();
        assert_eq!(r.node_info.port_guid, golden::NODE_RECORD_PORT_GUID);
    }

    #[test]
    fn golden_empty_response_holds_no_record() {
        let response = parse(&golden::NODE_RECORD_GET_TABLE_RESP_EMPTY);
        let table = TableRecords::new(&response).unwrap();
        assert!(table.is_empty());
        assert_eq!(table.iter().count(), 0);
    }

    fn rmpp_response(flags: u8, segment: u32, payload: u32, offset: u16) -> SaMadRepr {
        let mut r = parse(&golden::NODE_RECORD_GET_TABLE_RESP);
        r.rmpp = [1, rmpp::TYPE_DATA, flags, 0];
        r.rmpp_data1 = segment;
        r.rmpp_data2 = payload;
        r.attribute_offset = offset;
        r
    }

    #[test]
    fn rmpp_single_segment_counts_from_the_payload_length() {
        let all = rmpp::FLAG_ACTIVE | rmpp::FLAG_FIRST | rmpp::FLAG_LAST;
        let r = rmpp_response(all | 0xf8, 1, SA_HEADER_LEN + 112, 14);
        assert_eq!(TableRecords::new(&r).unwrap().len(), 1);
        let r = rmpp_response(all, 1, SA_HEADER_LEN, 14);
        assert!(TableRecords::new(&r).unwrap().is_empty());
        let r = rmpp_response(all, 1, SA_HEADER_LEN, 0);
        assert!(TableRecords::new(&r).unwrap().is_empty());
    }

    #[test]
    fn multi_segment_and_malformed_tables_are_refused() {
        let first = rmpp::FLAG_ACTIVE | rmpp::FLAG_FIRST;
        let all = first | rmpp::FLAG_LAST;
        for (r, what) in [
            (
                rmpp_response(first, 1, SA_HEADER_LEN + 224, 14),
                "first of two",
            ),
            (rmpp_response(all, 2, SA_HEADER_LEN + 112, 14), "segment 2"),
            (
                rmpp_response(all, 1, SA_HEADER_LEN + 224, 14),
                "longer than a MAD",
            ),
        ] {
            assert!(
                matches!(TableRecords::new(&r), Err(MadError::Segmented { .. })),
                "{what}"
            );
        }
        for (r, what) in [
            (
                rmpp_response(all, 1, 4, 14),
                "payload shorter than the SA header",
            ),
            (
                rmpp_response(all, 1, SA_HEADER_LEN + 112, 0),
                "zero attribute offset",
            ),
            (
                SaMadRepr {
                    rmpp: [1, 3, all, 0],
                    ..rmpp_response(all, 1, SA_HEADER_LEN + 112, 14)
                },
                "RMPP ACK, not DATA",
            ),
            (
                SaMadRepr {
                    method: method::GET_RESP,
                    ..parse(&golden::NODE_RECORD_GET_TABLE_RESP)
                },
                "GetResp",
            ),
        ] {
            assert!(
                matches!(TableRecords::new(&r), Err(MadError::FieldRange { .. })),
                "{what}"
            );
        }
    }

    #[test]
    fn unsegmented_response_holds_what_fits_and_nothing_after() {
        let mut r = parse(&golden::NODE_RECORD_GET_TABLE_RESP);
        r.rmpp = [0; 4];
        r.attribute_offset = 8; // 64-byte records: three fit in 200 bytes
        assert_eq!(TableRecords::new(&r).unwrap().len(), 3);
        // A second record cut at the end of the MAD (what the shim does to a longer table).
        let mut cut = parse(&golden::NODE_RECORD_GET_TABLE_RESP);
        cut.data.copy_within(..88, 112);
        assert!(matches!(
            TableRecords::new(&cut),
            Err(MadError::Segmented { .. })
        ));
        // Records without an attribute offset.
        let mut bad = parse(&golden::NODE_RECORD_GET_TABLE_RESP);
        bad.attribute_offset = 0;
        assert!(matches!(
            TableRecords::new(&bad),
            Err(MadError::FieldRange { .. })
        ));
    }
}
