//! Open flags that std does not name, for `OpenOptionsExt::custom_flags` outside sys/.

/// `O_NOFOLLOW`: the open fails instead of following a symlink in the last path component.
pub const O_NOFOLLOW: i32 = nix::libc::O_NOFOLLOW;
