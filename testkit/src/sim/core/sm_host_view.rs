//! The SM host as the oracle sees it ([`SmHostView`]) in `--opensm` runs: the real backend's
//! stored set for the node and the partitions file on disk (`model_opensm` builds and drives it).

use fabric_agent::domain::PKey;
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::OpenSmBackend;
use std::path::PathBuf;

/// The node's id on the SM host.
pub const NODE: &str = "node-a";

/// The SM host as the oracle sees it: the backend's stored set and the file on disk.
#[derive(Clone)]
pub struct SmHostView {
    /// None while the SM host's agent is down (the file on disk is all that may be read).
    pub(crate) backend: Option<OpenSmBackend>,
    /// The partitions file the backend writes and OpenSM reads.
    pub(crate) file: PathBuf,
    /// OpenSM is down with the whole SM host (a whole-host restore): it reads the file only at
    /// its start, so what the file holds meanwhile reaches no port.
    pub(crate) opensm_down: bool,
}

impl std::fmt::Debug for SmHostView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SmHostView({})", self.file.display())
    }
}

impl SmHostView {
    /// The generation the SM host holds for the node (0: none).
    pub fn stored_generation(&self) -> u64 {
        self.backend
            .as_ref()
            .and_then(|b| b.node(NODE))
            .map_or(0, |n| n.generation)
    }

    /// Why `base` may still reach one of the ports `guids` through the SM host (None: it
    /// cannot): its stored set gives it, or the file on disk does (OpenSM reads it at its next
    /// heavy sweep, whenever that comes).
    pub fn may_program(&self, base: u16, guids: &[u64]) -> Option<String> {
        if let Some(n) = self.backend.as_ref().and_then(|b| b.node(NODE)) {
            let set = &n.memberships;
            for (k, _) in set.keys.iter().filter(|(k, _)| k.base() == base) {
                if let Some(g) = guids
                    .iter()
                    .find(|g| set.gives(*k, fabric_agent::domain::Guid(**g)))
                {
                    return Some(format!(
                        "the SM host's stored set for the node (generation {}) gives {base:#06x} \
                         to port {g:#x}: its next write puts it in the file",
                        n.generation
                    ));
                }
            }
        }
        if self.opensm_down {
            return None;
        }
        let bytes = std::fs::read(&self.file).unwrap_or_default();
        let members = PKey::new(u32::from(base))
            .ok()
            .and_then(|k| members_of(&bytes, k))
            .unwrap_or_default();
        members.iter().find(|m| guids.contains(&m.guid.0)).map(|m| {
            format!(
                "the partitions file on disk gives {base:#06x} to port {:#x}: OpenSM reads \
                     it at its next heavy sweep",
                m.guid.0
            )
        })
    }
}
