//! Retired P_Keys: when the control plane deletes a partition it retires the partition's P_Key
//! on the fabric side, with the time of the retirement by its own clock (the clock it signs
//! grants with). No grant for that key issued at or before that time is accepted again, so the
//! key can be given to another tenant with new grants while every grant of the old partition,
//! used or not, stays dead. The SM hosts of a fabric exchange their retirements (union: per key
//! the latest retirement wins; nothing is ever un-retired).

use super::{Grant, GrantError};
use crate::domain::PKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Per retired key, the latest retirement time (ms since the Unix epoch, the control plane's
/// clock).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredKeys(BTreeMap<PKey, u64>);

impl RetiredKeys {
    /// Records that `pkey` was retired at `at_unix_ms`; `true` when this changed anything (a
    /// later time than the one held, or a key not held).
    pub fn retire(&mut self, pkey: PKey, at_unix_ms: u64) -> bool {
        match self.0.get(&pkey) {
            Some(t) if *t >= at_unix_ms => false,
            _ => {
                self.0.insert(pkey, at_unix_ms);
                true
            }
        }
    }

    /// When `pkey` was last retired.
    pub fn retired_at(&self, pkey: PKey) -> Option<u64> {
        self.0.get(&pkey).copied()
    }

    /// Whether a grant for `pkey` issued at `issued_at_unix_ms` is dead: issued at or before the
    /// key's last retirement.
    pub fn kills(&self, pkey: PKey, issued_at_unix_ms: u64) -> bool {
        self.retired_at(pkey)
            .is_some_and(|t| issued_at_unix_ms <= t)
    }

    /// Refuses `grant` when its key was retired after it was issued.
    pub fn check(&self, grant: &Grant) -> Result<(), GrantError> {
        match self.retired_at(grant.pkey) {
            Some(t) if grant.issued_at_unix_ms <= t => Err(GrantError::Retired {
                grant_id: grant.grant_id.clone(),
                pkey: grant.pkey,
                issued_at_unix_ms: grant.issued_at_unix_ms,
                retired_at_unix_ms: t,
            }),
            _ => Ok(()),
        }
    }

    /// Every retirement, by key.
    pub fn iter(&self) -> impl Iterator<Item = (PKey, u64)> + '_ {
        self.0.iter().map(|(k, t)| (*k, *t))
    }

    /// Whether no key is retired.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys are retired.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}
