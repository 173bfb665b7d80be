//! The SM host's questions to the fabric, over one umad device: the local port (NodeInfo and
//! PortInfo by directed-route SMP, 0 hops: its port GUID, its LID and the master SM's LID) and
//! SA NodeRecords by port GUID (GetTable to the SM's LID on QP1); and the SMInfo of the SM on the
//! local port (its role, [`super::sminfo`]).
//!
//! Blocking: a [`SaSession`] opens the device, registers one agent for directed-route SMPs and
//! one for SA, and closes both when dropped; run it on a blocking thread. Every exchange waits
//! `timeout` per attempt with `retries` further attempts, and the whole session stops at its
//! deadline. Replies are matched on the low 32 bits of the transaction id (the umad2sim shim
//! rewrites the high half).
//!
//! Under umad2sim a process routes each management class to one device fd: a session must not
//! run in a process whose SMP observer holds agents for the same classes (see docs/OPENSM.md).

use crate::mad::class;
use crate::mad::header::same_transaction;
use crate::mad::{
    attribute, get_table, header::MadHeader, method, node_record, pkey_table_record, status,
    MadError, NodeInfo, NodeInfoRepr, NodeRecordRepr, PKeyTableRecord, PKeyTableRecordRepr,
    PortInfo, PortInfoRepr, SaMad, SaMadRepr, SmInfo, SmInfoRepr, Smp, SmpRepr, TableRecords,
    MAD_LEN,
};
use crate::sys::umad::{AgentId, MadAddress, UmadError, UmadPort, QP0, QP1};
use std::path::Path;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Timing of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaTiming {
    /// Wait for one answer.
    pub timeout: Duration,
    /// Further attempts after a timeout.
    pub retries: u32,
    /// The whole session (every exchange of one check) ends by then.
    pub deadline: Duration,
}

/// Why the fabric could not be asked.
#[derive(Debug, Error)]
pub enum SaError {
    /// The umad device failed.
    #[error(transparent)]
    Umad(#[from] UmadError),
    /// No answer after every attempt.
    #[error("{what}: no answer after {attempts} attempts")]
    Timeout {
        /// The question.
        what: &'static str,
        /// Attempts made.
        attempts: u32,
    },
    /// The session's deadline passed.
    #[error("{what}: the deadline of {deadline_ms} ms passed")]
    Deadline {
        /// The question being asked when it passed.
        what: &'static str,
        /// The deadline.
        deadline_ms: u128,
    },
    /// An answer could not be decoded.
    #[error("{what}: malformed answer: {source}")]
    Malformed {
        /// The question.
        what: &'static str,
        /// The decoding error.
        source: MadError,
    },
    /// An answer carries an error status.
    #[error("{what}: status {status:#06x}")]
    Status {
        /// The question.
        what: &'static str,
        /// The status word.
        status: u16,
    },
    /// The local port knows no SM (master SM LID 0: the subnet is not up).
    #[error("the local port knows no master SM (SM LID 0): the subnet is not up")]
    NoSm,
}

/// The SM host's own port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    /// Its port GUID.
    pub port_guid: u64,
    /// Its LID.
    pub lid: u16,
    /// The master SM's LID (where the SA answers).
    pub sm_lid: u16,
}

/// An open device with its two agents, until dropped.
pub struct SaSession {
    port: UmadPort,
    smi: AgentId,
    sa: AgentId,
    /// The LID-routed SMP agent, registered on first use ([`SaSession::sm_info_at`]).
    lid_smi: Option<AgentId>,
    tid: u32,
    timing: SaTiming,
    deadline: Instant,
}

impl SaSession {
    /// Opens `device` and registers the agents; the session's deadline starts now.
    pub fn open(device: &Path, timing: SaTiming) -> Result<SaSession, SaError> {
        let deadline = Instant::now() + timing.deadline;
        let mut port = UmadPort::open(device)?;
        let smi = port.register_agent(QP0, class::SUBN_DIRECTED_ROUTE, class::SMP_CLASS_VERSION)?;
        let sa = port.register_agent(QP1, class::SUBN_ADM, class::SA_CLASS_VERSION)?;
        Ok(SaSession {
            port,
            smi,
            sa,
            lid_smi: None,
            tid: rand::random(),
            timing,
            deadline,
        })
    }

    /// The local port: NodeInfo (port GUID, port number) then PortInfo of that port (LID, SM
    /// LID). Fails with [`SaError::NoSm`] when the port knows no SM.
    pub fn local_port(&mut self) -> Result<LocalPort, SaError> {
        let data = self.smp_get("NodeInfo of the local port", attribute::NODE_INFO, 0)?;
        let node = NodeInfo::new_checked(&data[..])
            .and_then(|p| NodeInfoRepr::parse(&p))
            .map_err(|source| SaError::Malformed {
                what: "NodeInfo of the local port",
                source,
            })?;
        let data = self.smp_get(
            "PortInfo of the local port",
            attribute::PORT_INFO,
            node.local_port_num.into(),
        )?;
        let port = PortInfo::new_checked(&data[..])
            .and_then(|p| PortInfoRepr::parse(&p))
            .map_err(|source| SaError::Malformed {
                what: "PortInfo of the local port",
                source,
            })?;
        if port.master_sm_lid == 0 {
            return Err(SaError::NoSm);
        }
        Ok(LocalPort {
            port_guid: node.port_guid,
            lid: port.lid,
            sm_lid: port.master_sm_lid,
        })
    }

    /// The SMInfo of the SM bound to the local port (directed route, 0 hops): answered by the
    /// SM software there, so no answer when no SM runs on this port.
    pub fn sm_info(&mut self) -> Result<SmInfoRepr, SaError> {
        const WHAT: &str = "SMInfo of the local port";
        let data = self.smp_get(WHAT, attribute::SM_INFO, 0)?;
        SmInfo::new_checked(&data[..])
            .and_then(|p| SmInfoRepr::parse(&p))
            .map_err(|source| SaError::Malformed { what: WHAT, source })
    }

    /// The SMInfo of the SM on the port at `lid` (LID-routed `SubnGet(SMInfo)`): answered by the
    /// SM software bound to that port, so no answer ([`SaError::Timeout`]) when no SM runs
    /// there. Registers a LID-routed SMP agent on first use.
    pub fn sm_info_at(&mut self, lid: u16) -> Result<SmInfoRepr, SaError> {
        const WHAT: &str = "SMInfo of a remote SM port (LID-routed)";
        let agent = match self.lid_smi {
            Some(a) => a,
            None => {
                let a = self.port.register_agent(
                    QP0,
                    class::SUBN_LID_ROUTED,
                    class::SMP_CLASS_VERSION,
                )?;
                self.lid_smi = Some(a);
                a
            }
        };
        let mut mad = [0u8; MAD_LEN];
        let request = SmpRepr {
            routing: crate::mad::SmpRouting::LidRouted,
            method: method::GET,
            status: 0,
            transaction_id: 0,
            attribute_id: attribute::SM_INFO,
            attribute_modifier: 0,
            m_key: 0,
            data: [0; crate::mad::smp::DATA_LEN],
        };
        request.emit(&mut Smp::new_unchecked(&mut mad[..]));
        let address = MadAddress {
            qpn: QP0,
            lid,
            ..MadAddress::default()
        };
        let answer = self.exchange(WHAT, agent, address, mad)?;
        let malformed = |source| SaError::Malformed { what: WHAT, source };
        let response = SmpRepr::parse(&Smp::new_checked(&answer[..]).map_err(malformed)?)
            .map_err(malformed)?;
        if response.attribute_id != attribute::SM_INFO {
            return Err(malformed(MadError::FieldRange {
                what: WHAT,
                field: "attribute id",
                value: response.attribute_id.into(),
            }));
        }
        if response.status != status::OK {
            return Err(SaError::Status {
                what: WHAT,
                status: response.status,
            });
        }
        SmInfo::new_checked(&response.data[..])
            .and_then(|p| SmInfoRepr::parse(&p))
            .map_err(malformed)
    }

    /// The SA's NodeRecord of one port GUID: `None` when the SA knows no such port.
    pub fn node_record(
        &mut self,
        sm_lid: u16,
        port_guid: u64,
    ) -> Result<Option<NodeRecordRepr>, SaError> {
        const WHAT: &str = "SA NodeRecord by port GUID";
        let query = NodeRecordRepr::by_port_guid(port_guid).to_bytes();
        let request = get_table::request(
            attribute::NODE_RECORD,
            node_record::component::PORT_GUID,
            &query,
            0,
        );
        let Some(response) = self.get_table(WHAT, sm_lid, &request)? else {
            return Ok(None);
        };
        let malformed = |source| SaError::Malformed { what: WHAT, source };
        let table = TableRecords::new(&response).map_err(malformed)?;
        node_record::find_by_port_guid(&table, port_guid).map_err(malformed)
    }

    /// The SA's P_KeyTableRecord of block `block` of the port at `lid`: the keys the subnet
    /// manager holds for that port. `None` when the SA has no such record (no such port or
    /// block). The SA answers these only to a trusted request: `sm_key` must be its SA key.
    pub fn pkey_table_record(
        &mut self,
        sm_lid: u16,
        sm_key: u64,
        lid: u16,
        block: u16,
    ) -> Result<Option<PKeyTableRecordRepr>, SaError> {
        const WHAT: &str = "SA P_KeyTableRecord by LID and block";
        let query = PKeyTableRecordRepr::query(lid, block).to_bytes();
        let mut request = get_table::request(
            attribute::PKEY_TABLE_RECORD,
            pkey_table_record::component::LID | pkey_table_record::component::BLOCK,
            &query,
            0,
        );
        request.sm_key = sm_key;
        let Some(response) = self.get_table(WHAT, sm_lid, &request)? else {
            return Ok(None);
        };
        let malformed = |source| SaError::Malformed { what: WHAT, source };
        let table = TableRecords::new(&response).map_err(malformed)?;
        let mut found = None;
        for bytes in table.iter() {
            let record = PKeyTableRecordRepr::parse(
                &PKeyTableRecord::new_checked(bytes).map_err(malformed)?,
            );
            // Only the asked port and block count, whatever else an SA might answer.
            if record.lid == lid && record.block == block {
                if found.is_some() {
                    return Err(malformed(MadError::FieldRange {
                        what: WHAT,
                        field: "records for one LID and block",
                        value: table.len() as u64,
                    }));
                }
                found = Some(record);
            }
        }
        Ok(found)
    }

    /// Sends the GetTable `request` to the SA at `sm_lid` and returns its answer: `None` when
    /// the SA has no such records, an error for any other status than OK.
    fn get_table(
        &mut self,
        what: &'static str,
        sm_lid: u16,
        request: &SaMadRepr,
    ) -> Result<Option<SaMadRepr>, SaError> {
        let mut mad = [0u8; MAD_LEN];
        request.emit(&mut SaMad::new_unchecked(&mut mad[..]));
        let answer = self.exchange(what, self.sa, MadAddress::subnet_administrator(sm_lid), mad)?;
        let malformed = |source| SaError::Malformed { what, source };
        let response = SaMadRepr::parse(&SaMad::new_checked(&answer[..]).map_err(malformed)?)
            .map_err(malformed)?;
        match response.status {
            status::OK => Ok(Some(response)),
            status::SA_NO_RECORDS => Ok(None),
            other => Err(SaError::Status {
                what,
                status: other,
            }),
        }
    }

    fn smp_get(
        &mut self,
        what: &'static str,
        attribute_id: u16,
        modifier: u32,
    ) -> Result<[u8; crate::mad::smp::DATA_LEN], SaError> {
        let mut mad = [0u8; MAD_LEN];
        SmpRepr::local_get(attribute_id, modifier, 0).emit(&mut Smp::new_unchecked(&mut mad[..]));
        let answer = self.exchange(what, self.smi, MadAddress::directed_route(), mad)?;
        let malformed = |source| SaError::Malformed { what, source };
        let response = SmpRepr::parse(&Smp::new_checked(&answer[..]).map_err(malformed)?)
            .map_err(malformed)?;
        if response.attribute_id != attribute_id {
            return Err(malformed(MadError::FieldRange {
                what,
                field: "attribute id",
                value: response.attribute_id.into(),
            }));
        }
        if response.status != status::OK {
            return Err(SaError::Status {
                what,
                status: response.status,
            });
        }
        Ok(response.data)
    }

    /// Sends `mad` and waits for the response with the same low 32 TID bits, retrying on
    /// timeout, never past the session's deadline.
    fn exchange(
        &mut self,
        what: &'static str,
        agent: AgentId,
        address: MadAddress,
        mut mad: [u8; MAD_LEN],
    ) -> Result<[u8; MAD_LEN], SaError> {
        self.tid = self.tid.wrapping_add(1);
        let tid = self.tid;
        MadHeader::new_unchecked(&mut mad[..]).set_transaction_id(u64::from(tid));
        let deadline_passed = || SaError::Deadline {
            what,
            deadline_ms: self.timing.deadline.as_millis(),
        };
        for _attempt in 0..=self.timing.retries {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(deadline_passed());
            }
            let wait = self.timing.timeout.min(self.deadline - now);
            self.port.send(agent, &address, &mad, wait)?;
            let until = Instant::now() + wait;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let Some(received) = self.port.recv(left)? else {
                    continue;
                };
                let header = MadHeader::new_unchecked(&received.mad[..]);
                if !same_transaction(header.transaction_id(), u64::from(tid)) {
                    continue; // a late answer to an earlier question
                }
                if received.status != 0 || header.method() & method::RESPONSE_BIT == 0 {
                    break; // the device gave our send back: no answer in time
                }
                return Ok(received.mad);
            }
        }
        if Instant::now() >= self.deadline {
            return Err(deadline_passed());
        }
        Err(SaError::Timeout {
            what,
            attempts: self.timing.retries + 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_an_error_not_an_answer() {
        let timing = SaTiming {
            timeout: Duration::from_millis(10),
            retries: 0,
            deadline: Duration::from_millis(100),
        };
        assert!(matches!(
            SaSession::open(Path::new("/nonexistent/umad0"), timing),
            Err(SaError::Umad(UmadError::Open { .. }))
        ));
    }
}
