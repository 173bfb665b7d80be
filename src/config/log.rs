//! `[log]`: the daemon's log filter, and the check every filter passes before it is used (the
//! config file's and `FABRIC_AGENT_LOG`'s).

use super::error::{invalid, ConfigError};
use serde::Deserialize;
use std::str::FromStr;
use tracing_subscriber::filter::LevelFilter;

/// The levels a filter directive may name, as the error messages list them.
pub const LEVELS: &str = "trace, debug, info, warn, error, off";

/// `[log]`: the daemon's log filter, re-read on SIGHUP.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `info,fabric_agent::agent=debug` (default `info`;
    /// the `FABRIC_AGENT_LOG` environment variable overrides it).
    #[serde(default)]
    pub filter: Option<String>,
}

impl LogConfig {
    /// The filter, when given, is one [`check_filter`] accepts.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(filter) = &self.filter {
            check_filter(filter).map_err(|e| invalid("log.filter", e))?;
        }
        Ok(())
    }
}

/// Checks a log filter the way an operator means it, not only as tracing parses it.
///
/// Tracing reads a bare word that is not a level (`warning`, `debugg`) as a *target* name: the
/// filter then enables nothing else, and the daemon logs nothing at all for its whole life. So
/// every comma-separated directive must be a level (`warn`), or `target=level`
/// (`fabric_agent::agent=debug`), or a span directive (`target[span]=level`); an empty filter,
/// and one naming only other crates' targets (`h2=debug`), are refused too. The message names
/// the value and the valid levels.
pub fn check_filter(filter: &str) -> Result<(), String> {
    if filter.trim().is_empty() {
        return Err(format!(
            "{filter:?} is empty: it would log nothing; give a level ({LEVELS})"
        ));
    }
    for directive in filter.split(',').map(str::trim) {
        if directive.is_empty() {
            return Err(format!("{filter:?} has an empty directive (a stray comma)"));
        }
        match directive.rsplit_once('=') {
            Some((target, level)) => {
                if target.trim().is_empty() {
                    return Err(format!(
                        "{filter:?}: {directive:?} names no target before '='"
                    ));
                }
                if LevelFilter::from_str(level.trim()).is_err() {
                    return Err(format!(
                        "{filter:?}: {level:?} in {directive:?} is not a level (valid: {LEVELS})"
                    ));
                }
            }
            None if directive.contains('[') => {}
            None => {
                if LevelFilter::from_str(directive).is_err() {
                    return Err(format!(
                        "{filter:?}: {directive:?} is not a level (valid: {LEVELS}); \
                         for one module write module=level, e.g. fabric_agent::agent=debug"
                    ));
                }
            }
        }
    }
    // Directives only for other crates' targets would log nothing of the agent's own.
    let own = filter
        .split(',')
        .map(str::trim)
        .any(|d| !d.contains('=') && !d.contains('[') || d.starts_with("fabric_agent"));
    if !own {
        return Err(format!(
            "{filter:?} names only other modules, so the agent itself would log nothing; \
             add a level first, e.g. \"info,{filter}\" (valid: {LEVELS})"
        ));
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map(drop)
        .map_err(|e| format!("{filter:?} is not a log filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::check_filter;

    #[test]
    fn filters_that_would_silence_the_daemon_are_refused() {
        for good in [
            "info",
            "WARN",
            "debug,fabric_agent::agent=trace",
            "fabric_agent=debug",
            "info,h2=off",
            "off",
        ] {
            assert_eq!(check_filter(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("warning", "\"warning\" is not a level"),
            ("debugg", "valid: trace, debug, info, warn, error, off"),
            ("info,fabric_agent=debugg", "\"debugg\""),
            ("", "empty"),
            ("info,", "stray comma"),
            ("=info", "no target"),
            ("h2=debug", "the agent itself would log nothing"),
        ] {
            let e = check_filter(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
