//! Timestamps as every human view of the CLI prints them (RFC 3339, milliseconds, UTC).

/// A timestamp as RFC 3339 with milliseconds; empty when unset.
pub(super) fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| {
            let d = std::time::Duration::new(
                u64::try_from(t.seconds).ok()?,
                u32::try_from(t.nanos).ok()?,
            );
            Some(humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + d).to_string())
        })
        .unwrap_or_default()
}
