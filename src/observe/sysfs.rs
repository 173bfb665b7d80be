//! sysfs observer: reads `<root>/<device>/node_guid` and
//! `<root>/<device>/ports/<n>/{state,lid,sm_lid,link_layer,gids/0,pkeys/*}` (root
//! `/sys/class/infiniband` by default, a fixture tree in tests) and polls: fast while a
//! transition is pending, slow otherwise.
//!
//! The kernel's formats: `state` "4: ACTIVE", `lid`/`sm_lid` "0x11", `link_layer` "InfiniBand",
//! "Ethernet" or "Unknown", `node_guid` "a088:c203:00f1:2e40", `gids/0`
//! "fe80:0000:0000:0000:a088:c203:00f1:2e40" (the port GUID is its low 64 bits), `pkeys/<i>`
//! "0xffff" with empty slots "0x0000"; the table size is the number of `pkeys` files.

use super::sa_presence::{self, SaPresence};
use super::{
    poll_interval, read_blocking, NoDevices, ObserveError, PortObserver, Presence, ReadError,
};
use crate::domain::{Guid, Inventory, LinkLayer, PKeyValue, PortInfo, PortState};
use crate::observe::ObserverConfig;
use async_trait::async_trait;
use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Observer that polls a sysfs tree shaped like `/sys/class/infiniband`.
#[derive(Debug, Clone)]
pub struct SysfsObserver {
    root: PathBuf,
    fast_poll: Duration,
    slow_poll: Duration,
    /// Where a missing port's presence in the fabric is asked (`sa_umad_device`).
    presence: Option<SaPresence>,
}

impl SysfsObserver {
    /// Observes the tree under `root` with `config`'s poll intervals (its own `sysfs_root` is
    /// not consulted, so callers choose: `SysfsObserver::new(&config.sysfs_root, &config)`).
    pub fn new(root: impl Into<PathBuf>, config: &ObserverConfig) -> SysfsObserver {
        SysfsObserver {
            root: root.into(),
            fast_poll: config.fast_poll(),
            slow_poll: config.slow_poll(),
            presence: SaPresence::configured(config),
        }
    }

    /// The observed root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads every port now, blocking (the async [`PortObserver::inventory`] runs this on the
    /// blocking pool).
    pub fn read_inventory(&self) -> Result<Inventory, ObserveError> {
        read_inventory(&self.root)
    }
}

#[async_trait]
impl PortObserver for SysfsObserver {
    fn kind(&self) -> &'static str {
        "sysfs"
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        let root = self.root.clone();
        read_blocking("sysfs", move || read_inventory(&root)).await
    }

    async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
        sa_presence::ask_optional(self.presence.as_ref(), "sysfs", guids).await
    }

    async fn changed(&self, pending: bool) {
        // sysfs offers no change notification for these attributes (they are computed on
        // read), so this is a plain timer.
        tokio::time::sleep(poll_interval(pending, self.fast_poll, self.slow_poll)).await;
    }
}

/// The device directories under `root`, in natural order (`mlx5_2` before `mlx5_10`).
/// A missing root is [`ObserveError::NoDevices`].
pub fn device_names(root: &Path) -> Result<Vec<String>, ObserveError> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ObserveError::NoDevices(NoDevices::NoSysfsRoot(
                root.to_owned(),
            )))
        }
        Err(e) => return Err(io_error(root, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(root, e))?;
        // Real entries are symlinks to the device's directory: follow them.
        let is_dir = std::fs::metadata(entry.path())
            .map_err(|e| io_error(&entry.path(), e))?
            .is_dir();
        if is_dir {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(names)
}

/// One unreadable port fails the whole inventory: leaving it out could make a key look absent
/// from every fabric port (a false RELEASED).
fn read_inventory(root: &Path) -> Result<Inventory, ObserveError> {
    let mut ports = Vec::new();
    for device in device_names(root)? {
        let dir = root.join(&device);
        let node_guid = parse_file(&dir.join("node_guid"), parse_guid)?;
        let ports_dir = dir.join("ports");
        let mut numbers = numbered_entries(&ports_dir)?;
        numbers.sort_unstable();
        for number in numbers {
            let port_number = u8::try_from(number).map_err(|_| ReadError::PortNumber {
                dir: ports_dir.clone(),
                number,
            })?;
            let port_dir = ports_dir.join(number.to_string());
            ports.push(read_port(&device, port_number, node_guid, &port_dir)?);
        }
    }
    Ok(Inventory { ports })
}

fn read_port(
    device: &str,
    port_number: u8,
    node_guid: Guid,
    dir: &Path,
) -> Result<PortInfo, ObserveError> {
    let pkeys_dir = dir.join("pkeys");
    let link_layer = parse_file(&dir.join("link_layer"), parse_link_layer)?;
    let mut state = parse_file(&dir.join("state"), parse_state)?;
    // The kernel creates `pkeys` only for ports with a P_Key table (not iWARP): there, no
    // directory is an empty table. An InfiniBand port always has one, so a missing directory
    // (a device being reset or re-registered) is a table that could not be read, never an
    // empty one: the port's state is reported unknown, which blocks ACTIVE and RELEASED for
    // every attachment covering it.
    let mut indexes = if pkeys_dir.exists() {
        numbered_entries(&pkeys_dir)?
    } else {
        if link_layer == LinkLayer::Infiniband {
            tracing::warn!(dir = %pkeys_dir.display(), "InfiniBand port without a pkeys directory: its table is unreadable");
            state = PortState::Unknown;
        }
        Vec::new()
    };
    indexes.sort_unstable();
    if let Some((position, index)) = indexes.iter().enumerate().find(|(p, i)| *p != **i) {
        return Err(ReadError::PKeyGap {
            dir: pkeys_dir,
            position,
            index: *index,
        }
        .into());
    }
    let pkeys = indexes
        .iter()
        .map(|i| parse_file(&pkeys_dir.join(i.to_string()), parse_hex_u16).map(PKeyValue))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PortInfo {
        device: device.to_owned(),
        port_number,
        // GID 0's low 64 bits: the port GUID on InfiniBand, the MAC-derived EUI-64 on RoCE.
        port_guid: Guid(interface_id(parse_file(&dir.join("gids/0"), parse_gid)?)),
        node_guid,
        lid: parse_file(&dir.join("lid"), parse_hex_u16)?,
        sm_lid: parse_file(&dir.join("sm_lid"), parse_hex_u16)?,
        state,
        link_layer,
        pkeys,
        fabric_port: false,
    })
}

/// Reads one attribute file and parses its first line; errors name the path.
fn parse_file<T>(path: &Path, parse: fn(&str) -> Result<T, AttrError>) -> Result<T, ObserveError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    let value = text.trim_end_matches('\n');
    parse(value).map_err(|source| {
        ReadError::Attr {
            path: path.to_owned(),
            source,
        }
        .into()
    })
}

/// The numeric entries of a directory (`ports/1`, `pkeys/0..127`); anything else is an error.
fn numbered_entries(dir: &Path) -> Result<Vec<usize>, ObserveError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    let mut numbers = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let number = name
            .parse::<usize>()
            .map_err(|_| ReadError::UnexpectedEntry {
                dir: dir.to_owned(),
                name: name.clone(),
            })?;
        numbers.push(number);
    }
    Ok(numbers)
}

fn io_error(path: &Path, e: std::io::Error) -> ObserveError {
    ReadError::File {
        path: path.to_owned(),
        source: Arc::new(e),
    }
    .into()
}

/// An attribute file's text that does not parse (the text is kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// Not `"<n>: <NAME>"`.
    #[error("{0:?} is not a port state like \"4: ACTIVE\"")]
    NotAState(String),
    /// A state number IBA does not define.
    #[error("{0:?}: unknown port state {1}")]
    UnknownState(String, u8),
    /// Not `0x` and up to 4 hex digits.
    #[error("{0:?} is not a 16-bit hex value like \"0xffff\"")]
    NotHex16(String),
    /// Not a link layer name.
    #[error("{0:?} is not a link layer (InfiniBand, Ethernet or Unknown)")]
    NotLinkLayer(String),
    /// Not a GUID in sysfs's form.
    #[error("{0:?} is not a GUID like \"a088:c203:00f1:2e40\"")]
    NotGuid(String),
    /// Not a GID in sysfs's form.
    #[error("{0:?} is not a GID like \"fe80:0000:0000:0000:a088:c203:00f1:2e40\"")]
    NotGid(String),
}

/// `state`: "4: ACTIVE" (the IBA PortState number, then its name).
fn parse_state(text: &str) -> Result<PortState, AttrError> {
    let not_a_state = || AttrError::NotAState(text.to_owned());
    let (number, name) = text.split_once(':').ok_or_else(not_a_state)?;
    let number: u8 = number.trim().parse().map_err(|_| not_a_state())?;
    match (number, PortState::from_iba(number)) {
        (0, _) if name.trim() == "NOP" => Ok(PortState::Unknown),
        (_, PortState::Unknown) => Err(AttrError::UnknownState(text.to_owned(), number)),
        (_, state) => Ok(state),
    }
}

/// `lid`, `sm_lid`, `pkeys/<i>`: "0x" + hex, 16 bits.
fn parse_hex_u16(text: &str) -> Result<u16, AttrError> {
    text.strip_prefix("0x")
        .filter(|h| !h.is_empty() && h.len() <= 4)
        .and_then(|h| u16::from_str_radix(h, 16).ok())
        .ok_or_else(|| AttrError::NotHex16(text.to_owned()))
}

/// `link_layer`: "InfiniBand", "Ethernet" or "Unknown".
fn parse_link_layer(text: &str) -> Result<LinkLayer, AttrError> {
    match text {
        "InfiniBand" => Ok(LinkLayer::Infiniband),
        "Ethernet" => Ok(LinkLayer::Ethernet),
        "Unknown" => Ok(LinkLayer::Unknown),
        other => Err(AttrError::NotLinkLayer(other.to_owned())),
    }
}

/// `node_guid`: four colon-separated groups of four hex digits.
fn parse_guid(text: &str) -> Result<Guid, AttrError> {
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 4 || !groups.iter().all(|g| is_hex_group(g)) {
        return Err(AttrError::NotGuid(text.to_owned()));
    }
    // Sixteen hex digits always fit.
    u64::from_str_radix(&groups.concat(), 16)
        .map(Guid)
        .map_err(|_| AttrError::NotGuid(text.to_owned()))
}

/// `gids/<i>`: eight colon-separated groups of four hex digits, as a 128-bit number.
fn parse_gid(text: &str) -> Result<u128, AttrError> {
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 8 || !groups.iter().all(|g| is_hex_group(g)) {
        return Err(AttrError::NotGid(text.to_owned()));
    }
    u128::from_str_radix(&groups.concat(), 16).map_err(|_| AttrError::NotGid(text.to_owned()))
}

/// A GID's low 64 bits (its interface id).
fn interface_id(gid: u128) -> u64 {
    let [_, _, _, _, _, _, _, _, low @ ..] = gid.to_be_bytes();
    u64::from_be_bytes(low)
}

fn is_hex_group(g: &str) -> bool {
    g.len() == 4 && g.chars().all(|c| c.is_ascii_hexdigit())
}

/// Orders names with digit runs compared as numbers: `mlx5_2` < `mlx5_10` < `mlx5_bond_0`.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.chars().next(), b.chars().next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (na, nb) = (
                    a[..da].trim_start_matches('0'),
                    b[..db].trim_start_matches('0'),
                );
                let order = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                // Digits sort before other characters, so `mlx5_7` < `mlx5_bond_0`.
                let order = (!x.is_ascii_digit(), x).cmp(&(!y.is_ascii_digit(), y));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (&a[x.len_utf8()..], &b[y.len_utf8()..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        assert_eq!(parse_state("4: ACTIVE"), Ok(PortState::Active));
        assert_eq!(parse_state("1: DOWN"), Ok(PortState::Down));
        assert_eq!(parse_state("2: INIT"), Ok(PortState::Init));
        assert_eq!(parse_state("3: ARMED"), Ok(PortState::Armed));
        assert_eq!(parse_state("5: ACTIVE_DEFER"), Ok(PortState::ActiveDefer));
        assert_eq!(parse_state("0: NOP"), Ok(PortState::Unknown));
        assert!(parse_state("ACTIVE").is_err());
        assert_eq!(
            parse_state("9: BOGUS"),
            Err(AttrError::UnknownState("9: BOGUS".into(), 9))
        );
        assert!(parse_state("x: ACTIVE").is_err());
    }

    #[test]
    fn hex_values() {
        assert_eq!(parse_hex_u16("0x5"), Ok(5));
        assert_eq!(parse_hex_u16("0xffff"), Ok(0xffff));
        assert_eq!(parse_hex_u16("0x0000"), Ok(0));
        assert!(parse_hex_u16("5").is_err());
        assert!(parse_hex_u16("0x").is_err());
        assert!(parse_hex_u16("0x10000").is_err());
        assert!(parse_hex_u16("0xzz").is_err());
    }

    #[test]
    fn link_layers() {
        assert_eq!(parse_link_layer("InfiniBand"), Ok(LinkLayer::Infiniband));
        assert_eq!(parse_link_layer("Ethernet"), Ok(LinkLayer::Ethernet));
        assert_eq!(parse_link_layer("Unknown"), Ok(LinkLayer::Unknown));
        assert_eq!(
            parse_link_layer("infiniband"),
            Err(AttrError::NotLinkLayer("infiniband".into()))
        );
    }

    #[test]
    fn guids_and_gids() {
        assert_eq!(
            parse_guid("0002:c903:000e:0b72"),
            Ok(Guid(0x0002_c903_000e_0b72))
        );
        assert!(parse_guid("0002c903000e0b72").is_err());
        assert!(parse_guid("0002:c903:000e:0b7").is_err());
        let gid = parse_gid("fe80:0000:0000:0000:0002:c903:000e:0b73").unwrap();
        assert_eq!(interface_id(gid), 0x0002_c903_000e_0b73);
        assert_eq!((gid >> 64) as u64, 0xfe80_0000_0000_0000);
        assert!(parse_gid("fe80::2:c903:e:b73").is_err());
    }

    #[test]
    fn natural_order() {
        let mut names = vec![
            "mlx5_10",
            "mlx5_bond_0",
            "mlx5_2",
            "ibp1s0",
            "mlx5_0",
            "rxe0",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "ibp1s0",
                "mlx5_0",
                "mlx5_2",
                "mlx5_10",
                "mlx5_bond_0",
                "rxe0"
            ]
        );
        assert_eq!(natural_cmp("a01", "a1"), Ordering::Equal);
    }
}
