//! `fabric-agent grant`: the control plane's side of grants for labs, demos and tests: make an
//! Ed25519 key pair (`keygen`) and sign a `fabric.grant.v1.Grant` (`sign`), printed as the
//! base64 of the encoded `SignedGrant` that `attach --grant` takes. A production control plane
//! signs with its own key custody; the format is the same.

use crate::api::grant_v1::encode_grant;
use crate::domain::{is_grant_id, signed_message, Grant, Membership, PKey};
use crate::proto::grant as gpb;
use base64::Engine;
use clap::{Args, Subcommand};
use ed25519_dalek::{Signer, SigningKey};
use prost::Message;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The file names `keygen` writes in its directory.
pub const PRIVATE_KEY_FILE: &str = "grant-signing.key";
/// The public half, for `[[grants.keys]] public_key_file`.
pub const PUBLIC_KEY_FILE: &str = "grant-signing.pub";

/// `grant` subcommands.
#[derive(Debug, Subcommand)]
pub enum GrantCommand {
    /// Write a new Ed25519 key pair: DIR/grant-signing.key (0600, base64 seed) and
    /// DIR/grant-signing.pub (base64 public key, for `[[grants.keys]]`). Never overwrites.
    Keygen {
        /// The directory to write into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a grant and print it (base64 of the encoded fabric.grant.v1.SignedGrant).
    Sign(SignArgs),
}

/// `grant sign` arguments.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The private key file `keygen` wrote.
    #[arg(long)]
    pub key: PathBuf,
    /// The key id the verifiers know this key by.
    #[arg(long)]
    pub key_id: String,
    /// The fabric.
    #[arg(long)]
    pub fabric: String,
    /// The node (exact, case-sensitive).
    #[arg(long)]
    pub node: String,
    /// The instance.
    #[arg(long)]
    pub instance: String,
    /// The partition id (`ibpart_...`).
    #[arg(long)]
    pub partition: String,
    /// P_Key base in hex (0x0a12).
    #[arg(long, value_parser = super::commands::parse_pkey)]
    pub pkey: u32,
    /// Grant limited instead of full membership.
    #[arg(long)]
    pub limited: bool,
    /// The grant's id (default: random).
    #[arg(long)]
    pub grant_id: Option<String>,
}

/// Runs a `grant` subcommand: 0 on success, 1 with a message otherwise.
pub fn run(command: GrantCommand) -> ExitCode {
    let result = match command {
        GrantCommand::Keygen { out } => keygen(&out),
        GrantCommand::Sign(a) => sign(&a).map(|text| println!("{text}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(super::exit::REFUSED)
        }
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn write_new(path: &Path, mode: u32, text: &str) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn keygen(dir: &Path) -> Result<(), String> {
    let seed: [u8; 32] = rand::random();
    let key = SigningKey::from_bytes(&seed);
    let (private, public) = (dir.join(PRIVATE_KEY_FILE), dir.join(PUBLIC_KEY_FILE));
    write_new(&private, 0o600, &format!("{}\n", b64().encode(seed)))?;
    write_new(
        &public,
        0o644,
        &format!("{}\n", b64().encode(key.verifying_key().as_bytes())),
    )?;
    println!("{}\n{}", private.display(), public.display());
    Ok(())
}

/// Reads a private key file `keygen` wrote.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, String> {
    super::secret_file::check(path).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let seed: [u8; 32] = b64()
        .decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("{} is not a base64 32-byte Ed25519 seed", path.display()))?;
    Ok(SigningKey::from_bytes(&seed))
}

fn sign(a: &SignArgs) -> Result<String, String> {
    let key = read_signing_key(&a.key)?;
    let grant_id = a
        .grant_id
        .clone()
        .unwrap_or_else(|| format!("g-{:016x}", rand::random::<u64>()));
    if !is_grant_id(&a.key_id) {
        return Err(format!(
            "--key-id {:?} is not 1-128 characters [A-Za-z0-9._:-]",
            a.key_id
        ));
    }
    let grant = Grant {
        grant_id,
        fabric: a.fabric.clone(),
        node_id: a.node.clone(),
        instance_id: a.instance.clone(),
        partition_id: a.partition.clone(),
        pkey: PKey::new(a.pkey).map_err(|e| e.to_string())?,
        membership: if a.limited {
            Membership::Limited
        } else {
            Membership::Full
        },
        issued_at_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0),
    };
    grant.validate().map_err(|e| e.to_string())?;
    let bytes = encode_grant(&grant);
    let signed = gpb::SignedGrant {
        signature: key.sign(&signed_message(&bytes)).to_bytes().to_vec(),
        grant: bytes,
        key_id: a.key_id.clone(),
    };
    Ok(b64().encode(signed.encode_to_vec()))
}

/// The `--grant` argument of `attach`: base64 text, or `@FILE` holding it.
pub fn grant_argument(arg: &str) -> Result<gpb::SignedGrant, String> {
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?
        }
        None => arg.to_owned(),
    };
    crate::api::grant_v1::signed_grant_from_base64(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grant_v1::signed_grant_from_proto;
    use crate::domain::{GrantKey, GrantKeys};

    #[test]
    fn keygen_then_sign_verifies() {
        let dir = tempfile::tempdir().unwrap();
        keygen(dir.path()).unwrap();
        assert!(keygen(dir.path()).is_err(), "never overwrites");
        let mode = std::fs::metadata(dir.path().join(PRIVATE_KEY_FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let text = sign(&SignArgs {
            key: dir.path().join(PRIVATE_KEY_FILE),
            key_id: "lab".into(),
            fabric: "fab1".into(),
            node: "node1".into(),
            instance: "vm-1".into(),
            partition: "ibpart_a".into(),
            pkey: 0x0a12,
            limited: true,
            grant_id: None,
        })
        .unwrap();
        let wire = grant_argument(&text).unwrap();
        let g = signed_grant_from_proto(&wire).unwrap();
        let public = std::fs::read_to_string(dir.path().join(PUBLIC_KEY_FILE)).unwrap();
        let key: GrantKey = crate::config::decode_public_key("lab", &public).unwrap();
        let verified = GrantKeys::new([key]).unwrap().verify(&g).unwrap().clone();
        assert_eq!(verified.membership, Membership::Limited);
        assert_eq!(verified.node_id, "node1");
        assert!(grant_argument("not base64!").is_err());
    }
}
