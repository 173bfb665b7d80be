//! Credentials: read from their files on every apply (rotation needs no restart), fingerprinted
//! so a rejected secret is not sent again until its file changes, and never shown: [`Secret`]'s
//! `Debug` is redacted and no error message carries file contents.

use super::config::{AuthConfig, TokenScheme};
use super::{refused, SmError, UfmError};
use reqwest::header::HeaderValue;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A secret value whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What goes with every request.
#[derive(Debug, Clone)]
pub(crate) enum Credential {
    /// HTTP basic authentication.
    Basic {
        /// User name (not secret, but kept out of messages anyway).
        user: String,
        /// Password.
        password: Secret,
    },
    /// A complete `Authorization` header value (marked sensitive).
    Header(HeaderValue, Secret),
    /// TLS client certificate: the PEM key + chain, for (re)building the HTTP client.
    ClientCert(Secret),
}

/// Credentials as read from their file(s), with a fingerprint of the file contents.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// What to send.
    pub credential: Credential,
    /// Hash of the file contents: equal fingerprints mean the same secret.
    pub fingerprint: u64,
    /// The file an operator must change after a rejection.
    pub source: PathBuf,
}

impl Loaded {
    /// Replaces every occurrence of the secret in `text` (e.g. a server's error body). For
    /// basic authentication that includes the encoded `user:password` of the `Authorization`
    /// header, which a server may quote back.
    pub(crate) fn redact(&self, text: &str) -> String {
        let secrets = match &self.credential {
            Credential::Basic { user, password } => vec![
                base64(format!("{user}:{}", password.expose()).as_bytes()),
                password.expose().to_string(),
            ],
            Credential::Header(_, token) => vec![token.expose().to_string()],
            Credential::ClientCert(_) => return text.to_string(),
        };
        secrets
            .iter()
            .filter(|s| !s.is_empty())
            .fold(text.to_string(), |t, s| t.replace(s.as_str(), "<redacted>"))
    }
}

/// Standard base64 with padding, as in an `Authorization: Basic` header.
fn base64(input: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(input)
}

fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

fn unreadable(path: &Path, what: &'static str, e: std::io::Error) -> SmError {
    refused(UfmError::ReadFile {
        what,
        path: path.to_owned(),
        source: Arc::new(e),
    })
}

fn bad_file(path: &Path, what: &'static str, problem: &'static str) -> SmError {
    refused(UfmError::BadFile {
        what,
        path: path.to_owned(),
        problem,
    })
}

async fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, SmError> {
    let owned = path.to_owned();
    crate::sm::blocking::unblock(move || std::fs::read(owned))
        .await
        .map_err(std::io::Error::other)
        .and_then(|read| read)
        .map_err(|e| unreadable(path, what, e))
}

/// Reads the configured credentials.
pub(crate) async fn load(auth: &AuthConfig) -> Result<Loaded, SmError> {
    match auth {
        AuthConfig::Basic(path) => {
            let bytes = read(path, "credentials_file").await?;
            let credential =
                parse_basic(&bytes).map_err(|why| bad_file(path, "credentials_file", why))?;
            Ok(Loaded {
                credential,
                fingerprint: fingerprint(&[&bytes]),
                source: path.clone(),
            })
        }
        AuthConfig::Token(path, scheme) => {
            let bytes = read(path, "token_file").await?;
            let credential =
                parse_token(&bytes, *scheme).map_err(|why| bad_file(path, "token_file", why))?;
            Ok(Loaded {
                credential,
                fingerprint: fingerprint(&[&bytes]),
                source: path.clone(),
            })
        }
        AuthConfig::ClientCert { cert, key } => {
            let c = read(cert, "client_cert").await?;
            let k = read(key, "client_key").await?;
            Ok(Loaded {
                fingerprint: fingerprint(&[&c, &k]),
                credential: Credential::ClientCert(identity_pem(&c, &k, cert, key)?),
                source: cert.clone(),
            })
        }
    }
}

/// Reads a client certificate and key synchronously (at construction).
pub(crate) fn load_identity_blocking(cert: &Path, key: &Path) -> Result<(Secret, u64), SmError> {
    let read = |p: &Path, what: &'static str| std::fs::read(p).map_err(|e| unreadable(p, what, e));
    let c = read(cert, "client_cert")?;
    let k = read(key, "client_key")?;
    Ok((identity_pem(&c, &k, cert, key)?, fingerprint(&[&c, &k])))
}

fn identity_pem(
    cert: &[u8],
    key: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<Secret, SmError> {
    let cert = std::str::from_utf8(cert)
        .ok()
        .filter(|c| c.contains("-----BEGIN CERTIFICATE-----"));
    let Some(cert) = cert else {
        return Err(bad_file(
            cert_path,
            "client_cert",
            "no PEM certificate found",
        ));
    };
    let key = std::str::from_utf8(key)
        .ok()
        .filter(|k| k.contains("PRIVATE KEY-----"));
    let Some(key) = key else {
        return Err(bad_file(key_path, "client_key", "no PEM private key found"));
    };
    Ok(Secret(format!("{key}\n{cert}")))
}

/// `user:password` on the first line; surrounding whitespace and a trailing newline ignored.
fn parse_basic(bytes: &[u8]) -> Result<Credential, &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text")?;
    let line = text.lines().next().unwrap_or("").trim();
    let Some((user, password)) = line.split_once(':') else {
        return Err("expected `user:password` on the first line");
    };
    if user.is_empty() || password.is_empty() {
        return Err("expected `user:password` with a non-empty user and password");
    }
    Ok(Credential::Basic {
        user: user.to_string(),
        password: Secret(password.to_string()),
    })
}

/// The token on the first line.
fn parse_token(bytes: &[u8], scheme: TokenScheme) -> Result<Credential, &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text")?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err("the first line must hold the access token");
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err("the token must be printable ASCII without spaces");
    }
    let word = match scheme {
        TokenScheme::Basic => "Basic",
        TokenScheme::Bearer => "Bearer",
    };
    let mut value = HeaderValue::from_str(&format!("{word} {token}"))
        .map_err(|_| "the token is not a valid header value")?;
    value.set_sensitive(true);
    Ok(Credential::Header(value, Secret(token.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_file_is_user_colon_password() {
        let Credential::Basic { user, password } = parse_basic(b"admin:pa:ss\n").unwrap() else {
            panic!("not basic")
        };
        assert_eq!(user, "admin");
        assert_eq!(password.expose(), "pa:ss");
        assert!(parse_basic(b"admin\n").is_err());
        assert!(parse_basic(b":x\n").is_err());
        assert!(parse_basic(b"").is_err());
    }

    #[test]
    fn token_goes_into_the_chosen_scheme() {
        let Credential::Header(v, _) = parse_token(b"abc123\n", TokenScheme::Basic).unwrap() else {
            panic!("not a header")
        };
        assert_eq!(v.to_str().unwrap(), "Basic abc123");
        assert!(v.is_sensitive());
        let Credential::Header(v, _) = parse_token(b"abc123", TokenScheme::Bearer).unwrap() else {
            panic!("not a header")
        };
        assert_eq!(v.to_str().unwrap(), "Bearer abc123");
        assert!(parse_token(b"a b", TokenScheme::Basic).is_err());
        assert!(parse_token(b"\n", TokenScheme::Basic).is_err());
    }

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"admin:123456"), "YWRtaW46MTIzNDU2");
    }

    #[test]
    fn secrets_never_show_in_debug_and_are_redacted() {
        let loaded = Loaded {
            credential: parse_basic(b"admin:hunter2-secret").unwrap(),
            fingerprint: fingerprint(&[b"admin:hunter2-secret"]),
            source: "/c".into(),
        };
        let dbg = format!("{loaded:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert_eq!(
            loaded.redact("bad password hunter2-secret"),
            "bad password <redacted>"
        );
        // The encoded header value a server may quote back ("admin:hunter2-secret").
        assert_eq!(
            loaded.redact(r#"{"authorization":"Basic YWRtaW46aHVudGVyMi1zZWNyZXQ="}"#),
            r#"{"authorization":"Basic <redacted>"}"#
        );
        let token = parse_token(b"tok-SECRET-42", TokenScheme::Basic).unwrap();
        assert!(!format!("{token:?}").contains("SECRET"));
    }
}
