//! The SMP observer: reads the local port's NodeInfo, PortInfo and whole P_Key table with
//! directed-route SMPs (0 hops) over a umad device. Works on hardware (as root) and on the
//! ibsim fabric through umad2sim, where sysfs is only a start-up snapshot.
//!
//! It also answers SA PathRecord queries, which tell whether two ports share a partition.

pub mod transport;

use super::presence::{self, Presence};
use super::{NoDevices, ObserveError, PortObserver, ReadError};
use crate::domain::{Guid, Inventory, LinkLayer, PKeyValue, PortInfo as DomainPort, PortState};
use crate::mad::{
    attribute, get_table, node_record, path_record, pkey_table, smp::DATA_LEN, status, MadError,
    NodeInfo, NodeInfoRepr, NodeRecordRepr, PKeyTable, PKeyTableRepr, PathRecord, PathRecordRepr,
    PortInfo, PortInfoRepr, SaMad, SaMadRepr, Smp, SmpRepr, TableRecords, MAD_LEN,
};
use crate::observe::ObserverConfig;
use crate::sys::umad::{self, MadAddress, UmadError};
use async_trait::async_trait;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use transport::{MadAgent, MadTransport, Timing};

/// Why an SMP or SA exchange failed.
#[derive(Debug, Error)]
pub enum SmpError {
    /// The umad device failed.
    #[error(transparent)]
    Umad(#[from] UmadError),
    /// No answer after every attempt.
    #[error("no answer after {attempts} attempts")]
    Timeout {
        /// Attempts made.
        attempts: u32,
    },
    /// The answer could not be decoded.
    #[error("malformed answer: {0}")]
    Malformed(#[from] MadError),
    /// The answer carries an error status.
    #[error("attribute {attribute:#06x} modifier {modifier:#x}: status {status:#06x}")]
    Status {
        /// Attribute id.
        attribute: u16,
        /// Attribute modifier.
        modifier: u32,
        /// Status word.
        status: u16,
    },
    /// The answer is for another attribute.
    #[error("answer for attribute {got:#06x}, asked {asked:#06x}")]
    Mismatch {
        /// Attribute asked.
        asked: u16,
        /// Attribute answered.
        got: u16,
    },
    /// The port's thread is gone.
    #[error("umad thread closed")]
    Closed,
    /// The port's thread could not start.
    #[error("cannot start the umad thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl From<SmpError> for ObserveError {
    fn from(e: SmpError) -> ObserveError {
        match e {
            SmpError::Umad(UmadError::Open { .. }) => {
                ObserveError::NoDevices(NoDevices::Umad(Arc::new(e)))
            }
            other => ObserveError::Read(ReadError::Smp(Arc::new(other))),
        }
    }
}

/// Port observer over SMPs to the local port.
#[derive(Debug)]
pub struct SmpObserver {
    transport: MadTransport,
    device: String,
    fast_poll: Duration,
    slow_poll: Duration,
}

impl SmpObserver {
    /// Opens `config.umad_device` (e.g. `/dev/infiniband/umad0`), registers its agents and
    /// starts the thread that drives it. Exchanges wait `config.smp_timeout_ms` per attempt,
    /// with `config.smp_retries` further attempts; `changed` sleeps `fast_poll_ms` or
    /// `slow_poll_ms`. The device name reported is the HCA behind the umad device (its
    /// `ibdev` sysfs attribute; "ibsim0" under umad2sim), or the umad file name.
    pub fn open(config: &ObserverConfig) -> Result<SmpObserver, ObserveError> {
        let timing = Timing {
            timeout: Duration::from_millis(config.smp_timeout_ms.max(1)),
            retries: config.smp_retries,
        };
        let transport = MadTransport::open(&config.umad_device, timing)?;
        Ok(SmpObserver {
            transport,
            device: device_name(&config.umad_device),
            fast_poll: config.fast_poll(),
            slow_poll: config.slow_poll(),
        })
    }

    /// The device name used in inventories.
    pub fn device(&self) -> &str {
        &self.device
    }

    async fn get(&self, attribute_id: u16, modifier: u32) -> Result<[u8; DATA_LEN], SmpError> {
        let request = SmpRepr::local_get(attribute_id, modifier, 0);
        let mut mad = [0u8; MAD_LEN];
        request.emit(&mut Smp::new_unchecked(&mut mad[..]));
        let answer = self
            .transport
            .exchange(
                MadAgent::SubnetManagement,
                MadAddress::directed_route(),
                mad,
            )
            .await?;
        let response = SmpRepr::parse(&Smp::new_checked(&answer[..])?)?;
        if response.attribute_id != attribute_id {
            return Err(SmpError::Mismatch {
                asked: attribute_id,
                got: response.attribute_id,
            });
        }
        if response.status != status::OK {
            return Err(SmpError::Status {
                attribute: attribute_id,
                modifier,
                status: response.status,
            });
        }
        Ok(response.data)
    }

    /// NodeInfo of the local node.
    pub async fn node_info(&self) -> Result<NodeInfoRepr, SmpError> {
        let data = self.get(attribute::NODE_INFO, 0).await?;
        Ok(NodeInfoRepr::parse(&NodeInfo::new_checked(&data[..])?)?)
    }

    /// PortInfo of local port `port`.
    pub async fn port_info(&self, port: u8) -> Result<PortInfoRepr, SmpError> {
        let data = self.get(attribute::PORT_INFO, port.into()).await?;
        Ok(PortInfoRepr::parse(&PortInfo::new_checked(&data[..])?)?)
    }

    /// One 32-entry block of the local port's P_Key table.
    pub async fn pkey_block(&self, block: u16) -> Result<PKeyTableRepr, SmpError> {
        let modifier = pkey_table::attribute_modifier(0, block);
        let data = self.get(attribute::PKEY_TABLE, modifier).await?;
        Ok(PKeyTableRepr::parse(&PKeyTable::new_checked(&data[..])?)?)
    }

    /// The whole P_Key table of a port that holds `partition_cap` entries: one SMP per block.
    pub async fn pkey_table(&self, partition_cap: u16) -> Result<Vec<PKeyValue>, SmpError> {
        let blocks = pkey_table::blocks_for(partition_cap);
        let mut keys = Vec::with_capacity(usize::from(partition_cap));
        for block in 0..blocks {
            keys.extend(self.pkey_block(block).await?.entries.map(PKeyValue));
        }
        keys.truncate(usize::from(partition_cap));
        Ok(keys)
    }

    /// The local port as the domain sees it (`fabric_port` left false).
    pub async fn port(&self) -> Result<DomainPort, SmpError> {
        let node = self.node_info().await?;
        let port = self.port_info(node.local_port_num).await?;
        let pkeys = self.pkey_table(node.partition_cap).await?;
        Ok(DomainPort {
            device: self.device.clone(),
            port_number: node.local_port_num,
            port_guid: Guid(node.port_guid),
            node_guid: Guid(node.node_guid),
            lid: port.lid,
            sm_lid: port.master_sm_lid,
            state: PortState::from_iba(port.port_state),
            link_layer: LinkLayer::Infiniband,
            pkeys,
            fabric_port: false,
        })
    }

    /// Asks the subnet administrator at `sm_lid` for the path from `slid` to `dlid`. `None`
    /// when the SA has no record: the two ports share no partition.
    pub async fn path_between(
        &self,
        sm_lid: u16,
        slid: u16,
        dlid: u16,
    ) -> Result<Option<PathRecordRepr>, SmpError> {
        let mask = path_record::component::SLID | path_record::component::DLID;
        self.path_record(sm_lid, &PathRecordRepr::between_lids(slid, dlid), mask)
            .await
    }

    /// Asks the subnet administrator at `sm_lid` for the path between two port GIDs.
    pub async fn path_between_gids(
        &self,
        sm_lid: u16,
        sgid: u128,
        dgid: u128,
    ) -> Result<Option<PathRecordRepr>, SmpError> {
        let mask = path_record::component::SGID | path_record::component::DGID;
        self.path_record(sm_lid, &PathRecordRepr::between_gids(sgid, dgid), mask)
            .await
    }

    /// Sends one SA request to the subnet administrator at `sm_lid` and returns its answer:
    /// `None` for "no records", an error for any other status than OK.
    async fn sa_exchange(
        &self,
        sm_lid: u16,
        request: &SaMadRepr,
    ) -> Result<Option<SaMadRepr>, SmpError> {
        let mut mad = [0u8; MAD_LEN];
        request.emit(&mut SaMad::new_unchecked(&mut mad[..]));
        let answer = self
            .transport
            .exchange(
                MadAgent::SubnetAdministration,
                MadAddress::subnet_administrator(sm_lid),
                mad,
            )
            .await?;
        let response = SaMadRepr::parse(&SaMad::new_checked(&answer[..])?)?;
        match response.status {
            status::OK => Ok(Some(response)),
            status::SA_NO_RECORDS => Ok(None),
            other => Err(SmpError::Status {
                attribute: request.attribute_id,
                modifier: 0,
                status: other,
            }),
        }
    }

    /// Asks the subnet administrator at `sm_lid` for the NodeRecord of one port GUID (a
    /// GetTable narrowed by port GUID: one record, no RMPP). `None` when the SA knows no such
    /// port.
    pub async fn node_record(
        &self,
        sm_lid: u16,
        port_guid: u64,
    ) -> Result<Option<NodeRecordRepr>, SmpError> {
        let query = NodeRecordRepr::by_port_guid(port_guid).to_bytes();
        let request = get_table::request(
            attribute::NODE_RECORD,
            node_record::component::PORT_GUID,
            &query,
            0,
        );
        let Some(response) = self.sa_exchange(sm_lid, &request).await? else {
            return Ok(None);
        };
        let table = TableRecords::new(&response)?;
        Ok(node_record::find_by_port_guid(&table, port_guid)?)
    }

    /// What the subnet manager says of each of `guids`, asked through this observer's own port:
    /// its master SM's LID from the port's PortInfo, then one NodeRecord query per GUID.
    ///
    /// The SA answers a NodeRecord query only with ports that share a partition with the
    /// asking port (OpenSM's `osm_physp_share_pkey`), so "no records" proves a port gone only
    /// when the asking port shares one with every port: when it is a full member of the default
    /// partition (0xFFFF), of which every port is a member. Asked through a limited member (a
    /// tenant port's secure posture), or through a port that is not ACTIVE, every answer is
    /// [`Presence::Unknown`].
    pub async fn presence(&self, guids: &[Guid]) -> Vec<Presence> {
        let local = async {
            let node = self.node_info().await?;
            let port = self.port_info(node.local_port_num).await?;
            let keys = self.pkey_table(node.partition_cap).await?;
            Ok::<_, SmpError>((
                port.master_sm_lid,
                PortState::from_iba(port.port_state),
                keys,
            ))
        };
        let sm_lid = match local.await {
            Ok((_, state, _)) if state != PortState::Active => {
                let why = format!(
                    "{} is {state:?}, not ACTIVE: the subnet administrator is not asked through it",
                    self.device
                );
                return presence::unknown(guids, &why);
            }
            Ok((0, _, _)) => {
                let why = format!("{} knows no master SM (SM LID 0)", self.device);
                return presence::unknown(guids, &why);
            }
            Ok((_, _, keys)) if !keys.contains(&PKeyValue::DEFAULT_FULL) => {
                let why = format!(
                    "{} is not a full member of the default partition: the subnet \
                     administrator shows it only ports it shares a partition with, so its \
                     'no record' proves nothing",
                    self.device
                );
                return presence::unknown(guids, &why);
            }
            Ok((sm_lid, _, _)) => sm_lid,
            Err(e) => {
                let why = format!("the local port {} could not be read: {e}", self.device);
                return presence::unknown(guids, &why);
            }
        };
        let mut out = Vec::with_capacity(guids.len());
        for g in guids {
            match self.node_record(sm_lid, g.0).await {
                Ok(Some(_)) => out.push(Presence::Shown),
                Ok(None) => out.push(Presence::Gone),
                Err(e) => {
                    // One failed question is enough: the rest are not asked, so an SA that does
                    // not answer costs one timeout per pass, not one per port.
                    let why = format!(
                        "the subnet administrator (LID {sm_lid}) could not be asked through {}: {e}",
                        self.device
                    );
                    out.extend(presence::unknown(&guids[out.len()..], &why));
                    break;
                }
            }
        }
        out
    }

    /// One SA PathRecord Get: `query`'s fields selected by `component_mask` must match.
    /// `None` when the SA answers "no records".
    pub async fn path_record(
        &self,
        sm_lid: u16,
        query: &PathRecordRepr,
        component_mask: u64,
    ) -> Result<Option<PathRecordRepr>, SmpError> {
        let request = SaMadRepr::get(attribute::PATH_RECORD, component_mask, &query.to_bytes(), 0);
        let Some(response) = self.sa_exchange(sm_lid, &request).await? else {
            return Ok(None);
        };
        let record = PathRecordRepr::parse(&PathRecord::new_checked(&response.data[..])?)?;
        Ok(Some(record))
    }
}

/// The HCA behind a umad device, from `/sys/class/infiniband_mad/<umadN>/ibdev` (read through
/// libc so umad2sim can redirect it), else the device file's name.
fn device_name(umad_device: &Path) -> String {
    let file = umad_device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "umad".to_owned());
    let ibdev = Path::new("/sys/class/infiniband_mad")
        .join(&file)
        .join("ibdev");
    umad::read_text_file(&ibdev)
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or(file)
}

#[async_trait]
impl PortObserver for SmpObserver {
    fn kind(&self) -> &'static str {
        "smp"
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        Ok(Inventory {
            ports: vec![self.port().await?],
        })
    }

    async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
        self.presence(guids).await
    }

    async fn changed(&self, pending: bool) {
        tokio::time::sleep(super::poll_interval(
            pending,
            self.fast_poll,
            self.slow_poll,
        ))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_is_no_devices() {
        let config = ObserverConfig {
            umad_device: "/nonexistent/umad0".into(),
            ..Default::default()
        };
        assert!(matches!(
            SmpObserver::open(&config),
            Err(ObserveError::NoDevices(_))
        ));
    }

    #[test]
    fn device_name_falls_back_to_the_file_name() {
        assert_eq!(device_name(Path::new("/nonexistent/umad7")), "umad7");
    }
}
