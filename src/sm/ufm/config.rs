//! `[subnet_manager.ufm]`: where UFM is, how to authenticate, how patiently to talk to it.

use reqwest::Url;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::PathBuf;

/// `[subnet_manager.ufm]` settings. Exactly one authentication method must be set:
/// `credentials_file` (HTTP basic), `token_file` (UFM access token) or `client_cert` +
/// `client_key` (TLS client certificate).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UfmConfig {
    /// Base URL of the UFM server, e.g. `https://ufm.example.net` (no path, no credentials).
    /// Plain `http` is accepted only for a loopback host.
    pub url: String,
    /// PEM CA bundle that UFM's server certificate must chain to. When unset, the system's
    /// trust store is used.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// File holding `user:password` on its first line (HTTP basic authentication, API path
    /// `/ufmRest`). Re-read on every apply, so rotating it needs no restart.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// PEM client certificate (chain) for TLS client authentication (API path `/ufmRestV2`).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_cert`.
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// File holding a UFM access token (API path `/ufmRestV3`). Re-read on every apply.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// How the token is sent: `basic` (`Authorization: Basic <token>`, what UFM expects) or
    /// `bearer` (`Authorization: Bearer <token>`, for gateways in front of UFM).
    #[serde(default)]
    pub token_scheme: TokenScheme,
    /// Overrides the API path chosen from the authentication method (`/ufmRest`,
    /// `/ufmRestV2`, `/ufmRestV3`), e.g. for a reverse proxy.
    #[serde(default)]
    pub api_path: Option<String>,
    /// TCP + TLS connect timeout, milliseconds.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Whole-request timeout (connect, send, answer), milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Extra attempts per request after a timeout, a connection error or a 5xx answer.
    /// 4xx answers are never retried.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// First retry delay, milliseconds; doubles per attempt up to `backoff_max_ms`, with
    /// jitter (a random delay between half and all of the step).
    #[serde(default = "default_backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    /// Cap of the retry delay, milliseconds.
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Sent as `index0` with every added GUID: store the key at index 0 of the port's table.
    #[serde(default)]
    pub index0: bool,
    /// Sent as `ip_over_ib` with every added GUID: the partition carries IPoIB.
    #[serde(default = "default_true")]
    pub ip_over_ib: bool,
    /// Read partitions through one `GET …/resources/pkeys?guids_data=true` (every partition
    /// with its GUIDs) whenever two or more keys need reading, instead of one `GET` per key.
    /// That answer grows with every membership in the fabric (about 70 bytes each); when it is
    /// larger than the 8 MiB answer cap while the per-key reads work, the backend uses per-key
    /// reads from then on. `false`: per-key reads only, and the
    /// start-up scan of all partitions is skipped (see docs/UFM.md).
    #[serde(default = "default_true")]
    pub list_reads: bool,
    /// How many re-checks in a row may be answered from UFM's `last_updated` stamp alone
    /// (`GET …/resources/pkeys/last_updated`, one small request) when it has not moved since
    /// the read that last confirmed this node's keys; the next re-check reads the partitions
    /// anyway. 0: never skip.
    #[serde(default = "default_max_skipped_rechecks")]
    pub max_skipped_rechecks: u32,
    /// How long after an add was sent UFM may still execute it when no answer came (a timeout,
    /// an error, a retry, a cancelled apply), milliseconds: the key stays watched that long (see
    /// docs/UFM.md, late writes). Default 600,000 (10 minutes).
    #[serde(default = "default_late_write_window_ms")]
    pub late_write_window_ms: u64,
    /// Request budget: at most this many requests per second to UFM on average (retries
    /// included). Beyond it requests wait; they never fail because of the budget.
    #[serde(default = "default_max_requests_per_sec")]
    pub max_requests_per_sec: u32,
    /// Request budget: how many requests may go out at once after a quiet spell.
    #[serde(default = "default_request_burst")]
    pub request_burst: u32,
}

/// How an access token is put in the `Authorization` header.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TokenScheme {
    /// `Authorization: Basic <token>` (UFM's own token form, `/ufmRestV3`).
    #[default]
    Basic,
    /// `Authorization: Bearer <token>`.
    Bearer,
}

fn default_connect_timeout_ms() -> u64 {
    3_000
}
fn default_request_timeout_ms() -> u64 {
    15_000
}
fn default_retries() -> u32 {
    3
}
fn default_backoff_initial_ms() -> u64 {
    200
}
fn default_backoff_max_ms() -> u64 {
    5_000
}
fn default_true() -> bool {
    true
}
fn default_late_write_window_ms() -> u64 {
    600_000
}

fn default_max_skipped_rechecks() -> u32 {
    11
}
fn default_max_requests_per_sec() -> u32 {
    20
}
fn default_request_burst() -> u32 {
    64
}

/// Why a URL does not parse (the `url` crate's error, named through `reqwest`).
pub type UrlParseError = <Url as std::str::FromStr>::Err;

/// Most extra attempts per request.
const MAX_RETRIES: u32 = 20;

/// Why `[subnet_manager.ufm]` is refused: each names the field and says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UfmConfigError {
    /// `url` does not parse.
    #[error("url {url:?} is not a URL")]
    NotAUrl {
        /// The configured text.
        url: String,
        /// Why it does not parse.
        #[source]
        source: UrlParseError,
    },
    /// `url` holds a user or password (never echoed: it is a secret).
    #[error("url must not contain credentials; put them in credentials_file or token_file")]
    UrlCredentials,
    /// `url` names no host.
    #[error("url {0:?} has no host")]
    NoHost(String),
    /// `url` is plain http to a host that is not loopback.
    #[error("url {0:?} must use https (plain http is only allowed on loopback)")]
    PlainHttp(String),
    /// `url`'s scheme is neither http nor https.
    #[error("url scheme {0:?} is not http(s)")]
    Scheme(String),
    /// `url` has a path, query or fragment.
    #[error("url {0:?} must be the server's base URL without path or query (see api_path)")]
    NotABaseUrl(String),
    /// Only one of `client_cert` and `client_key` is set.
    #[error("client_cert and client_key must be set together")]
    HalfClientCert,
    /// No authentication method is set.
    #[error(
        "set one authentication method: credentials_file, token_file, or client_cert + client_key"
    )]
    NoAuth,
    /// More than one authentication method is set.
    #[error("set only one authentication method: credentials_file, token_file, or client_cert + client_key")]
    SeveralAuth,
    /// `api_path` is not an absolute path.
    #[error("api_path {0:?} must be an absolute path such as \"/ufmRest\"")]
    ApiPath(String),
    /// A timeout is 0.
    #[error("connect_timeout_ms and request_timeout_ms must be > 0")]
    ZeroTimeout,
    /// `retries` is above the limit.
    #[error("retries must be 0-{MAX_RETRIES}, not {0}")]
    Retries(u32),
    /// The backoff is 0 or its cap is below its start.
    #[error("backoff must be > 0 and backoff_max_ms >= backoff_initial_ms")]
    Backoff,
    /// The request budget is 0.
    #[error("max_requests_per_sec and request_burst must be > 0 (requests beyond them wait)")]
    ZeroBudget,
}

/// Which authentication method a valid configuration selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthConfig {
    /// `credentials_file`.
    Basic(PathBuf),
    /// `token_file`.
    Token(PathBuf, TokenScheme),
    /// `client_cert` + `client_key`.
    ClientCert {
        /// PEM certificate chain.
        cert: PathBuf,
        /// PEM key.
        key: PathBuf,
    },
}

impl UfmConfig {
    /// A configuration with defaults for everything but the URL and the authentication.
    pub fn with_credentials_file(url: impl Into<String>, credentials_file: PathBuf) -> Self {
        UfmConfig {
            url: url.into(),
            ca_file: None,
            credentials_file: Some(credentials_file),
            client_cert: None,
            client_key: None,
            token_file: None,
            token_scheme: TokenScheme::default(),
            api_path: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            retries: default_retries(),
            backoff_initial_ms: default_backoff_initial_ms(),
            backoff_max_ms: default_backoff_max_ms(),
            index0: false,
            ip_over_ib: true,
            list_reads: true,
            max_skipped_rechecks: default_max_skipped_rechecks(),
            late_write_window_ms: default_late_write_window_ms(),
            max_requests_per_sec: default_max_requests_per_sec(),
            request_burst: default_request_burst(),
        }
    }

    /// Checks the settings; the error names the field and says how to fix it.
    pub fn validate(&self) -> Result<(), UfmConfigError> {
        self.base_url()?;
        self.auth()?;
        if let Some(path) = &self.api_path {
            if !path.starts_with('/') || path.contains(['?', '#']) {
                return Err(UfmConfigError::ApiPath(path.clone()));
            }
        }
        if self.connect_timeout_ms == 0 || self.request_timeout_ms == 0 {
            return Err(UfmConfigError::ZeroTimeout);
        }
        if self.retries > MAX_RETRIES {
            return Err(UfmConfigError::Retries(self.retries));
        }
        if self.backoff_initial_ms == 0 || self.backoff_max_ms < self.backoff_initial_ms {
            return Err(UfmConfigError::Backoff);
        }
        if self.max_requests_per_sec == 0 || self.request_burst == 0 {
            return Err(UfmConfigError::ZeroBudget);
        }
        Ok(())
    }

    /// The parsed base URL: https, or http on a loopback host; no credentials, query or path.
    pub(crate) fn base_url(&self) -> Result<Url, UfmConfigError> {
        let url = Url::parse(&self.url).map_err(|source| UfmConfigError::NotAUrl {
            url: self.url.clone(),
            source,
        })?;
        if !url.username().is_empty() || url.password().is_some() {
            // Never keep the URL here: it holds a secret.
            return Err(UfmConfigError::UrlCredentials);
        }
        let Some(host) = url.host_str() else {
            return Err(UfmConfigError::NoHost(self.url.clone()));
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = match bare.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => bare.eq_ignore_ascii_case("localhost"),
        };
        match url.scheme() {
            "https" => {}
            "http" if loopback => {}
            "http" => return Err(UfmConfigError::PlainHttp(self.url.clone())),
            other => return Err(UfmConfigError::Scheme(other.to_owned())),
        }
        if url.query().is_some() || url.fragment().is_some() || url.path() != "/" {
            return Err(UfmConfigError::NotABaseUrl(self.url.clone()));
        }
        Ok(url)
    }

    /// The one configured authentication method.
    pub(crate) fn auth(&self) -> Result<AuthConfig, UfmConfigError> {
        let mut methods = Vec::new();
        if let Some(f) = &self.credentials_file {
            methods.push(AuthConfig::Basic(f.clone()));
        }
        if let Some(f) = &self.token_file {
            methods.push(AuthConfig::Token(f.clone(), self.token_scheme));
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => methods.push(AuthConfig::ClientCert {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => {}
            _ => return Err(UfmConfigError::HalfClientCert),
        }
        match methods.len() {
            1 => Ok(methods.remove(0)),
            0 => Err(UfmConfigError::NoAuth),
            _ => Err(UfmConfigError::SeveralAuth),
        }
    }

    /// The API path: configured, or the one UFM serves for the authentication method.
    pub(crate) fn effective_api_path(&self, auth: &AuthConfig) -> String {
        match (&self.api_path, auth) {
            (Some(p), _) => p.trim_end_matches('/').to_string(),
            (None, AuthConfig::Basic(_)) => "/ufmRest".into(),
            (None, AuthConfig::ClientCert { .. }) => "/ufmRestV2".into(),
            (None, AuthConfig::Token(..)) => "/ufmRestV3".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(url: &str) -> UfmConfig {
        UfmConfig::with_credentials_file(url, PathBuf::from("/etc/fabric-agent/ufm.cred"))
    }

    #[test]
    fn parses_a_minimal_file_with_defaults() {
        let c: UfmConfig = toml::from_str(
            "url = \"https://ufm.example.net\"\ncredentials_file = \"/etc/fabric-agent/ufm.cred\"\n",
        )
        .unwrap();
        assert_eq!(c, basic("https://ufm.example.net"));
        c.validate().unwrap();
        assert!(!c.index0);
        assert!(c.ip_over_ib);
    }

    #[test]
    fn rejects_unknown_fields() {
        let e = toml::from_str::<UfmConfig>("url = \"https://u\"\npassword = \"x\"\n");
        assert!(e.unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn url_must_be_https_unless_loopback() {
        assert!(basic("https://ufm.example.net").validate().is_ok());
        assert!(basic("http://127.0.0.1:8080").validate().is_ok());
        assert!(basic("http://[::1]:8080").validate().is_ok());
        assert!(basic("http://localhost:8080").validate().is_ok());
        assert_eq!(
            basic("http://ufm.example.net").validate(),
            Err(UfmConfigError::PlainHttp("http://ufm.example.net".into()))
        );
        assert_eq!(
            basic("ftp://ufm.example.net").validate(),
            Err(UfmConfigError::Scheme("ftp".into()))
        );
        assert_eq!(
            basic("https://ufm.example.net/ufmRest").validate(),
            Err(UfmConfigError::NotABaseUrl(
                "https://ufm.example.net/ufmRest".into()
            ))
        );
        assert!(matches!(
            basic("not a url").validate(),
            Err(UfmConfigError::NotAUrl { .. })
        ));
    }

    #[test]
    fn url_with_credentials_is_refused_without_echoing_them() {
        let e = basic("https://admin:s3cret@ufm.example.net")
            .validate()
            .unwrap_err();
        assert_eq!(e, UfmConfigError::UrlCredentials);
        assert!(!format!("{e:?} {e}").contains("s3cret"));
    }

    #[test]
    fn exactly_one_auth_method() {
        let mut c = basic("https://u.example");
        c.token_file = Some("/t".into());
        assert_eq!(c.validate(), Err(UfmConfigError::SeveralAuth));
        c.credentials_file = None;
        c.token_file = None;
        assert_eq!(c.validate(), Err(UfmConfigError::NoAuth));
        c.client_cert = Some("/c.pem".into());
        assert_eq!(c.validate(), Err(UfmConfigError::HalfClientCert));
        c.client_key = Some("/k.pem".into());
        c.validate().unwrap();
        assert_eq!(c.effective_api_path(&c.auth().unwrap()), "/ufmRestV2");
    }

    #[test]
    fn api_path_follows_the_auth_method_unless_set() {
        let mut c = basic("https://u.example");
        assert_eq!(c.effective_api_path(&c.auth().unwrap()), "/ufmRest");
        c.credentials_file = None;
        c.token_file = Some("/t".into());
        assert_eq!(c.effective_api_path(&c.auth().unwrap()), "/ufmRestV3");
        c.api_path = Some("/proxy/ufmRest/".into());
        assert_eq!(c.effective_api_path(&c.auth().unwrap()), "/proxy/ufmRest");
        c.api_path = Some("ufmRest".into());
        assert_eq!(c.validate(), Err(UfmConfigError::ApiPath("ufmRest".into())));
    }

    #[test]
    fn timeouts_and_backoff_must_make_sense() {
        let mut c = basic("https://u.example");
        c.request_timeout_ms = 0;
        assert_eq!(c.validate(), Err(UfmConfigError::ZeroTimeout));
        let mut c = basic("https://u.example");
        c.backoff_max_ms = 1;
        assert_eq!(c.validate(), Err(UfmConfigError::Backoff));
        let mut c = basic("https://u.example");
        c.retries = 21;
        assert_eq!(c.validate(), Err(UfmConfigError::Retries(21)));
    }

    #[test]
    fn fleet_settings_have_sane_defaults_and_a_budget_is_never_zero() {
        let c: UfmConfig = toml::from_str(
            "url = \"https://u.example\"\ncredentials_file = \"/c\"\nmax_skipped_rechecks = 0\nlist_reads = false\n",
        )
        .unwrap();
        assert_eq!(c.max_skipped_rechecks, 0);
        assert!(!c.list_reads);
        assert_eq!((c.max_requests_per_sec, c.request_burst), (20, 64));
        let mut c = basic("https://u.example");
        c.max_requests_per_sec = 0;
        assert_eq!(c.validate(), Err(UfmConfigError::ZeroBudget));
        let mut c = basic("https://u.example");
        c.request_burst = 0;
        assert_eq!(c.validate(), Err(UfmConfigError::ZeroBudget));
    }
}
