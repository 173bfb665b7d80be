//! Exit codes a script can trust, in one table: `--help`, the man page and the README print
//! [`TABLE`]; the constants below are its codes.

/// Done: the requested end state was reached (or no `--wait` was asked).
pub const OK: u8 = 0;
/// The daemon refused the call, or the attachment ended elsewhere, or (`doctor`) something
/// blocks ACTIVE or RELEASED, or (`get`) no such attachment.
pub const REFUSED: u8 = 1;
/// Bad command-line usage (clap's own code).
pub const USAGE: u8 = 2;
/// The configuration is invalid (sysexits EX_USAGE).
pub const CONFIG: u8 = 64;
/// `opensm check`/`apply`: the operator's partitions file is refused (sysexits EX_DATAERR).
pub const DATA_ERROR: u8 = 65;
/// `opensm check`: the file cannot be read (sysexits EX_NOINPUT).
pub const NO_INPUT: u8 = 66;
/// The daemon cannot be reached (sysexits EX_UNAVAILABLE).
pub const UNREACHABLE: u8 = 69;
/// The system refused a resource (sysexits EX_OSERR): the async runtime or signal handlers.
pub const OS_ERROR: u8 = 71;
/// `--wait` expired before the requested state (sysexits EX_TEMPFAIL).
pub const WAIT_EXPIRED: u8 = 75;
/// Permission denied (sysexits EX_NOPERM): this user may not open the daemon's socket. The
/// daemon may be healthy; monitoring must not restart it for this.
pub const NO_PERMISSION: u8 = 77;

/// Every exit code and what it means, in order.
pub const TABLE: &[(u8, &str)] = &[
    (
        OK,
        "done: the requested end state was reached (or no --wait was asked)",
    ),
    (
        REFUSED,
        "refused: the daemon answered with an error (its gRPC code and message are printed), \
         the attachment ended where the wait cannot lead (FAILED; RELEASING/RELEASED for \
         attach), `get` found no such attachment, or `doctor` found something that blocks \
         ACTIVE or RELEASED",
    ),
    (
        USAGE,
        "usage: bad arguments (the message lists what is accepted)",
    ),
    (
        CONFIG,
        "configuration: the config file is missing or invalid, or a path it names is unusable \
         (what check-config reports)",
    ),
    (
        DATA_ERROR,
        "data (`opensm check`/`apply`): the operator's partitions file is refused; its line and \
         reason are printed and nothing is written",
    ),
    (
        NO_INPUT,
        "no input (`opensm check`): the file cannot be read",
    ),
    (
        UNREACHABLE,
        "unavailable: the daemon cannot be reached, or it is stopping (`opensm apply`: the file \
         was written but OpenSM could not be signalled or was not seen confirming it)",
    ),
    (
        OS_ERROR,
        "system: the async runtime or the signal handlers could not be set up",
    ),
    (
        WAIT_EXPIRED,
        "--wait expired: the current state and reason are printed",
    ),
    (
        NO_PERMISSION,
        "permission denied on the daemon's socket (run as root or as a member of [listen] \
         read_group); the daemon may be healthy",
    ),
];

/// The table as `--help` prints it.
pub fn help() -> String {
    let mut out = String::from("Exit codes:\n");
    for (code, meaning) in TABLE {
        out.push_str(&format!("  {code:<3} {meaning}\n"));
    }
    out.push_str(
        "\nP_Keys are hex as InfiniBand tools print them: 0x0a12 or 0a12 (never decimal); tables \
         show the 16-bit value with the membership bit (0x8a12 full, 0x0a12 limited).\n\
         NO_COLOR is honoured; -o wide shows every column.",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_in_the_table_once() {
        let codes: Vec<u8> = TABLE.iter().map(|(c, _)| *c).collect();
        for c in [
            OK,
            REFUSED,
            USAGE,
            CONFIG,
            UNREACHABLE,
            OS_ERROR,
            WAIT_EXPIRED,
            NO_PERMISSION,
        ] {
            assert_eq!(codes.iter().filter(|x| **x == c).count(), 1, "{c}");
        }
        assert!(help().contains("77  permission denied"), "{}", help());
    }
}
