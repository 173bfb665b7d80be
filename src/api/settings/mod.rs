//! The settings the listeners own: `[listen]` (the unix socket, the TCP listener and its mTLS)
//! and `[limits]` (what one client may hold). Each section validates itself with its own error
//! into the typed values the listeners use; `config` composes them into the whole
//! configuration.

pub mod limits;
pub mod listen;

pub use limits::{LimitsConfig, LimitsError};
pub use listen::{
    BadSocketMode, ListenConfig, ListenError, ListenSection, SocketMode, TlsConfig, TlsSection,
    DEFAULT_SOCKET,
};
