//! `grant keygen` and `grant sign`.

use super::exit;
use crate::grant::{generate_seed, load_seed, write_seed, Signer};
use crate::proto::grant::{Grant, Membership};
use base64::Engine;
use clap::Subcommand;
use prost::Message;
use std::path::PathBuf;

/// Grant subcommands.
#[derive(Debug, Subcommand)]
pub enum GrantCommand {
    /// Writes a new Ed25519 seed (base64, mode 0600, never overwriting) and prints the public
    /// key (base64) verifiers are configured with.
    Keygen {
        /// The seed file to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// Signs one grant and prints the encoded `SignedGrant` as base64.
    Sign {
        /// The seed file.
        #[arg(long)]
        key: PathBuf,
        /// The key's id.
        #[arg(long)]
        key_id: String,
        /// Grant id.
        #[arg(long)]
        grant_id: String,
        /// Fabric.
        #[arg(long)]
        fabric: String,
        /// Node.
        #[arg(long)]
        node: String,
        /// Instance.
        #[arg(long)]
        instance: String,
        /// Partition id.
        #[arg(long)]
        partition_id: String,
        /// P_Key base.
        #[arg(long, value_parser = super::parse_pkey)]
        pkey: u32,
        /// Limited membership (default full).
        #[arg(long)]
        limited: bool,
    },
}

/// Runs a grant subcommand.
pub fn run(cmd: &GrantCommand) -> u8 {
    let b64 = base64::engine::general_purpose::STANDARD;
    match cmd {
        GrantCommand::Keygen { out } => {
            let seed = generate_seed();
            if let Err(e) = write_seed(out, &seed) {
                eprintln!("fabric-fleet: {e}");
                return exit::USAGE;
            }
            let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
            println!("{}", b64.encode(public.to_bytes()));
            exit::OK
        }
        GrantCommand::Sign {
            key,
            key_id,
            grant_id,
            fabric,
            node,
            instance,
            partition_id,
            pkey,
            limited,
        } => {
            let signed = load_seed(key)
                .map_err(crate::grant::GrantError::from)
                .and_then(|seed| Signer::new(vec![(key_id.clone(), seed)], key_id))
                .and_then(|signer| {
                    signer.sign(&Grant {
                        grant_id: grant_id.clone(),
                        fabric: fabric.clone(),
                        node_id: node.clone(),
                        instance_id: instance.clone(),
                        partition_id: partition_id.clone(),
                        pkey: *pkey,
                        membership: if *limited {
                            Membership::Limited
                        } else {
                            Membership::Full
                        } as i32,
                        issued_at_unix_ms: crate::view::now_ms(),
                    })
                });
            match signed {
                Ok(s) => {
                    println!("{}", b64.encode(s.encode_to_vec()));
                    exit::OK
                }
                Err(e) => {
                    eprintln!("fabric-fleet: {e}");
                    exit::USAGE
                }
            }
        }
    }
}
