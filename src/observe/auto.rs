//! Observer selection for `[observer] kind = "auto" | "verbs" | "sysfs"`: `auto` takes verbs
//! when libibverbs finds devices, else sysfs. Every choice comes with a one-line reason for the
//! node view and the log, e.g. "verbs: 9 devices (mlx5_0, ..., mlx5_bond_0)" or
//! "sysfs (/sys/class/infiniband): libibverbs found no devices (ENOSYS: the kernel has no RDMA)".

use super::sysfs::{self, SysfsObserver};
use super::verbs::VerbsObserver;
use super::{ObserveError, PortObserver, ReadError};
use super::{ObserverConfig, ObserverKind};

/// A selected observer and why it was chosen.
pub type Selection = (Box<dyn PortObserver>, String);

/// Builds the observer for `kind` (`Auto`, `Verbs` or `Sysfs`). Must be called inside a tokio
/// runtime (the verbs observer registers its event fds).
///
/// `Verbs` fails when libibverbs finds no device (the reason says why); `Auto` then falls back
/// to sysfs under `config.sysfs_root` and says why in the reason. `Embedded` and `Smp` are not
/// built here (they need the embedded fabric or the umad settings): asking for them is an error.
pub fn select(config: &ObserverConfig, kind: ObserverKind) -> Result<Selection, ObserveError> {
    match kind {
        ObserverKind::Verbs => {
            let observer = VerbsObserver::open(config)?;
            let reason = verbs_reason(&observer);
            Ok((Box::new(observer), reason))
        }
        ObserverKind::Sysfs => {
            let reason = format!("sysfs ({}): configured", config.sysfs_root.display());
            Ok((sysfs_observer(config), reason))
        }
        ObserverKind::Auto => Ok(match VerbsObserver::open(config) {
            Ok(observer) => {
                let reason = verbs_reason(&observer);
                (Box::new(observer), reason)
            }
            Err(why) => {
                let why = match why {
                    ObserveError::NoDevices(why) => why.to_string(),
                    ObserveError::Read(why) => format!("libibverbs failed: {why}"),
                };
                let root = &config.sysfs_root;
                let found = match sysfs::device_names(root) {
                    Ok(names) if names.is_empty() => "; no device under it either".to_owned(),
                    Ok(names) => format!("; {} devices under it", names.len()),
                    Err(_) => "; it does not exist".to_owned(),
                };
                let reason = format!("sysfs ({}): {why}{found}", root.display());
                (sysfs_observer(config), reason)
            }
        }),
        ObserverKind::Embedded | ObserverKind::Smp => Err(ReadError::NotSelectable(kind).into()),
    }
}

fn sysfs_observer(config: &ObserverConfig) -> Box<dyn PortObserver> {
    Box::new(SysfsObserver::new(&config.sysfs_root, config))
}

fn verbs_reason(observer: &VerbsObserver) -> String {
    let names = observer.device_names();
    let noun = if names.len() == 1 {
        "device"
    } else {
        "devices"
    };
    format!("verbs: {} {noun} ({})", names.len(), names.join(", "))
}
