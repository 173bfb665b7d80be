use super::DomainError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A 64-bit EUI-64 identifier (node or port GUID). Displays as `0x` + 16 lower-case hex digits.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Guid(pub u64);

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

impl FromStr for Guid {
    type Err = DomainError;

    /// Accepts `0x0002c903000e0b72`, `0002c903000e0b72` and `0002:c903:000e:0b72`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex: String = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s)
            .chars()
            .filter(|c| *c != ':')
            .collect();
        if hex.is_empty() || hex.len() > 16 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(DomainError::invalid(
                "guid",
                format!("{s:?} is not a 64-bit hex GUID"),
            ));
        }
        u64::from_str_radix(&hex, 16)
            .map(Guid)
            .map_err(|e| DomainError::invalid("guid", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling() {
        let g = Guid(0x0002_c903_000e_0b72);
        assert_eq!("0x0002c903000e0b72".parse::<Guid>().unwrap(), g);
        assert_eq!("0002c903000e0b72".parse::<Guid>().unwrap(), g);
        assert_eq!("0002:c903:000e:0b72".parse::<Guid>().unwrap(), g);
        assert_eq!(g.to_string(), "0x0002c903000e0b72");
        assert!("0x".parse::<Guid>().is_err());
        assert!("0x10002c903000e0b72".parse::<Guid>().is_err());
        assert!("zz".parse::<Guid>().is_err());
    }
}
