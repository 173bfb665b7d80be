use super::{DomainError, Membership};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A partition key base: the low 15 bits of a P_Key, 0x0001..=0x7FFE.
///
/// 0x0000 is invalid by the IBA spec and 0x7FFF is the default partition, which every port holds
/// and no tenant may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u16", into = "u16")]
pub struct PKey(u16);

impl PKey {
    /// The default partition's base.
    pub const DEFAULT_BASE: u16 = 0x7FFF;

    /// Validates a tenant P_Key base.
    pub fn new(base: u32) -> Result<Self, DomainError> {
        match base {
            0 => Err(DomainError::invalid(
                "pkey",
                "0x0000 is not a valid P_Key (the IBA spec reserves it)",
            )),
            0x7FFF => Err(DomainError::invalid(
                "pkey",
                "0x7fff is the default partition, which every port already holds; choose 0x0001..=0x7ffe",
            )),
            b if b > 0x7FFF => Err(DomainError::invalid(
                "pkey",
                format!("{b:#06x} is above 0x7fff: give the 15-bit base, membership is a separate field"),
            )),
            // The match arms above exclude every value that does not fit 15 bits.
            b => u16::try_from(b).map(PKey).map_err(|_| {
                DomainError::invalid("pkey", format!("{b:#06x} is above 0x7fff"))
            }),
        }
    }

    /// The 15-bit base.
    pub fn base(self) -> u16 {
        self.0
    }

    /// The 16-bit table value for a membership (bit 15 set for full members).
    pub fn value(self, membership: Membership) -> PKeyValue {
        match membership {
            Membership::Full => PKeyValue(self.0 | 0x8000),
            Membership::Limited => PKeyValue(self.0),
        }
    }
}

impl TryFrom<u16> for PKey {
    type Error = DomainError;
    fn try_from(v: u16) -> Result<Self, Self::Error> {
        PKey::new(u32::from(v))
    }
}

impl From<PKey> for u16 {
    fn from(k: PKey) -> u16 {
        k.0
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A raw 16-bit P_Key table entry as a port holds it (bit 15 = full membership).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PKeyValue(pub u16);

impl PKeyValue {
    /// The default partition, full membership.
    pub const DEFAULT_FULL: PKeyValue = PKeyValue(0xFFFF);
    /// The default partition, limited membership.
    pub const DEFAULT_LIMITED: PKeyValue = PKeyValue(0x7FFF);

    /// The low 15 bits.
    pub fn base(self) -> u16 {
        self.0 & 0x7FFF
    }

    /// Bit 15: full membership.
    pub fn is_full(self) -> bool {
        self.0 & 0x8000 != 0
    }

    /// The membership bit as a [`Membership`].
    pub fn membership(self) -> Membership {
        if self.is_full() {
            Membership::Full
        } else {
            Membership::Limited
        }
    }

    /// An unused table slot (base 0).
    pub fn is_empty(self) -> bool {
        self.base() == 0
    }

    /// The tenant key this entry carries, if it is neither empty nor the default partition.
    pub fn tenant_key(self) -> Option<PKey> {
        PKey::new(u32::from(self.base())).ok()
    }
}

impl fmt::Display for PKeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_reserved_and_oversized_bases() {
        assert!(PKey::new(0).is_err());
        assert!(PKey::new(0x7FFF).is_err());
        assert!(PKey::new(0x8001).is_err());
        assert!(PKey::new(0x1_0001).is_err());
        assert_eq!(PKey::new(0x7FFE).unwrap().base(), 0x7FFE);
    }

    #[test]
    fn membership_sets_bit_15() {
        let k = PKey::new(0x0a12).unwrap();
        assert_eq!(k.value(Membership::Full), PKeyValue(0x8a12));
        assert_eq!(k.value(Membership::Limited), PKeyValue(0x0a12));
        assert!(PKeyValue(0x8a12).is_full());
        assert_eq!(PKeyValue(0x8a12).tenant_key(), Some(k));
        assert_eq!(PKeyValue(0xFFFF).tenant_key(), None);
        assert!(PKeyValue(0x8000).is_empty());
    }
}
