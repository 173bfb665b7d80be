//! The only unsafe code of the crate: thin, safe wrappers over kernel and C interfaces.
//! Every unsafe block is one small operation with a `// SAFETY:` comment.

pub mod access;
pub mod dirwatch;
pub mod umad;
pub mod users;
pub mod verbs;
