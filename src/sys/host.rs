//! This host's name.

/// The kernel's host name (`gethostname`), or `None` when it cannot be read or is not UTF-8.
pub fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_has_a_name() {
        let name = super::hostname().expect("host name");
        assert!(!name.is_empty());
    }
}
