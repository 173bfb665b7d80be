//! The ListAttachments page token: opaque to clients, bound to the filters it was issued for
//! (`p1.<instance id in hex>.<FNV-1a of the filters>`), so a token is refused with other
//! filters. Stable across restarts: it holds no state of the agent's.

use crate::agent::ListFilter;
use crate::domain::InstanceId;

const TOKEN_VERSION: &str = "p1";

/// Why a page token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadToken {
    /// Not a token this agent issues (another version, not hex, not an instance id).
    NotIssued,
    /// Issued for other filters than the request's.
    OtherFilters,
}

impl BadToken {
    /// The reason, as the `page_token` field's error says it.
    pub fn reason(self) -> &'static str {
        match self {
            BadToken::NotIssued => "not a token this agent issued",
            BadToken::OtherFilters => {
                "issued for other filters; send the same state, partition_id and instance_id as the first page"
            }
        }
    }
}

/// The token for the page after `last_instance_id`: opaque to clients, bound to the filters.
pub fn encode(last_instance_id: &str, filter: &ListFilter) -> String {
    let hex: String = last_instance_id
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{TOKEN_VERSION}.{hex}.{:016x}", filter_fingerprint(filter))
}

/// The instance id a page starts after, from a token issued for `filter`.
pub fn decode(token: &str, filter: &ListFilter) -> Result<String, BadToken> {
    let mut parts = token.split('.');
    let (Some(TOKEN_VERSION), Some(hex), Some(fingerprint), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BadToken::NotIssued);
    };
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return Err(BadToken::NotIssued);
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| BadToken::NotIssued)?;
    let id = String::from_utf8(bytes).map_err(|_| BadToken::NotIssued)?;
    InstanceId::parse(&id).map_err(|_| BadToken::NotIssued)?;
    if fingerprint != format!("{:016x}", filter_fingerprint(filter)) {
        return Err(BadToken::OtherFilters);
    }
    Ok(id)
}

/// FNV-1a over the filters, stable across restarts.
fn filter_fingerprint(f: &ListFilter) -> u64 {
    let text = format!(
        "{}|{}|{}",
        f.state.map(|s| s.name()).unwrap_or(""),
        f.partition_id.as_deref().unwrap_or(""),
        f.instance_id.as_deref().unwrap_or("")
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttachmentState;

    #[test]
    fn tokens_round_trip_for_their_filters_only() {
        let all = ListFilter::default();
        let active = ListFilter {
            state: Some(AttachmentState::Active),
            ..Default::default()
        };
        let token = encode("i-42", &all);
        assert_eq!(decode(&token, &all).as_deref(), Ok("i-42"));
        assert_eq!(decode(&token, &active), Err(BadToken::OtherFilters));
        for bad in [
            "junk",
            "p1.zz.0000000000000000",
            "p2.692d3432.0000000000000000",
        ] {
            assert_eq!(decode(bad, &all), Err(BadToken::NotIssued), "{bad}");
        }
    }
}
