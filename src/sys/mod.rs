//! The only unsafe code of the crate: thin, safe wrappers over kernel and C interfaces.
//! `nix` and `libc` are used here and nowhere else. Every unsafe block is one small operation with a `// SAFETY:` comment.

pub mod access;
pub mod dirwatch;
pub mod fs_flags;
pub mod host;
pub mod process;
pub mod umad;
pub mod users;
pub mod verbs;
