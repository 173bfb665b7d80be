//! A peer SM host that this host holds fenced, as stored and as stated to nodes and peers: plain
//! data, below [`super::fence`] (which decides) and [`super::store`] (which keeps it durably).

/// A peer SM host this host holds fenced.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FencedHost {
    /// The peer's name (as it states it).
    pub host: String,
    /// When it was fenced (ms since the Unix epoch, this host's clock).
    pub since_unix_ms: u64,
    /// The evidence, for humans.
    pub evidence: String,
}
