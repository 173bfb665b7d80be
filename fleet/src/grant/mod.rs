//! Grant signing (`fabric.grant.v1`): key files and the rotating [`Signer`].

mod key;
mod signer;

pub use key::{generate_seed, load_seed, write_seed, KeyError, SigningKeyFile};
pub use signer::{GrantError, Signer, DOMAIN};
