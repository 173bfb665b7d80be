use super::{validate_label, DomainError, LabelRules, PKey};
use serde::{Deserialize, Serialize};

const NAME_RULES: LabelRules = LabelRules {
    max_len: 63,
    punctuation: "._-",
};
const FABRIC_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._-",
};

/// A partition id: `ibpart_` followed by 1-64 characters `[a-z0-9]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PartitionId(String);

impl PartitionId {
    /// The required prefix.
    pub const PREFIX: &'static str = "ibpart_";

    /// Validates a partition id.
    pub fn parse(s: &str) -> Result<Self, DomainError> {
        let Some(rest) = s.strip_prefix(Self::PREFIX) else {
            return Err(DomainError::invalid(
                "partition.id",
                format!("{s:?} does not start with {:?}", Self::PREFIX),
            ));
        };
        if rest.is_empty() || rest.len() > 64 {
            return Err(DomainError::invalid(
                "partition.id",
                "needs 1-64 characters after \"ibpart_\"",
            ));
        }
        if !rest
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(DomainError::invalid(
                "partition.id",
                "only [a-z0-9] may follow \"ibpart_\"",
            ));
        }
        Ok(PartitionId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A fabric's name, e.g. `europe-north1-a.fab2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FabricName(String);

impl FabricName {
    /// Validates a fabric name: 1-128 characters `[A-Za-z0-9._-]`.
    pub fn parse(s: &str) -> Result<Self, DomainError> {
        validate_label("fabric", s, FABRIC_RULES)?;
        Ok(FabricName(s.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An isolated RDMA network on one fabric, identified by one P_Key. Owned by the control plane;
/// the agent keeps the copy each attach request carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// `ibpart_...`
    pub id: PartitionId,
    /// Unique within its workspace.
    pub name: String,
    /// Owning workspace.
    pub workspace: String,
    /// Owning account.
    pub account: String,
    /// The fabric the partition lives on.
    pub fabric: FabricName,
    /// Its P_Key base.
    pub pkey: PKey,
}

impl Partition {
    /// Validates every field of a partition.
    pub fn new(
        id: &str,
        name: &str,
        workspace: &str,
        account: &str,
        fabric: &str,
        pkey: u32,
    ) -> Result<Self, DomainError> {
        let id = PartitionId::parse(id)?;
        validate_label("partition.name", name, NAME_RULES)?;
        validate_label("partition.workspace", workspace, NAME_RULES)?;
        validate_label("partition.account", account, NAME_RULES)?;
        Ok(Partition {
            id,
            name: name.to_owned(),
            workspace: workspace.to_owned(),
            account: account.to_owned(),
            fabric: FabricName::parse(fabric)?,
            pkey: PKey::new(pkey)?,
        })
    }

    /// `account/workspace/name`, the partition's resource path.
    pub fn resource_path(&self) -> String {
        format!("{}/{}/{}", self.account, self.workspace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_ids_and_names() {
        assert!(PartitionId::parse("ibpart_abc123").is_ok());
        assert!(PartitionId::parse("ibpart_").is_err());
        assert!(PartitionId::parse("ibpart_ABC").is_err());
        assert!(PartitionId::parse("part_abc").is_err());
        assert!(PartitionId::parse(&format!("ibpart_{}", "a".repeat(65))).is_err());
        let p = Partition::new("ibpart_1", "train-a", "ws", "acct", "fab1", 0x10).unwrap();
        assert_eq!(p.resource_path(), "acct/ws/train-a");
        assert!(Partition::new("ibpart_1", "", "ws", "acct", "fab1", 0x10).is_err());
        assert!(Partition::new("ibpart_1", "a b", "ws", "acct", "fab1", 0x10).is_err());
        assert!(Partition::new("ibpart_1", "-a", "ws", "acct", "fab1", 0x10).is_err());
        assert!(Partition::new("ibpart_1", "a", "ws", "acct", "fab1", 0).is_err());
    }
}
