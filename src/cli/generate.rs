//! Hidden subcommands that print the man page and shell completions, generated from the same
//! clap definitions as the command line itself (used to build the Debian package).

use super::Cli;
use clap::CommandFactory;
use std::io::Write;
use std::process::ExitCode;

/// Shells whose completion scripts `fabric-agent completions` prints.
pub use clap_complete::Shell;

/// Prints the fabric-agent(1) man page (roff) to stdout.
pub fn man_page() -> ExitCode {
    let mut out = Vec::new();
    if let Err(e) = clap_mangen::Man::new(Cli::command()).render(&mut out) {
        eprintln!("error: cannot render the man page: {e}");
        return ExitCode::FAILURE;
    }
    write_stdout(&out)
}

/// Prints the completion script for `shell` to stdout.
pub fn completions(shell: Shell) -> ExitCode {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "fabric-agent", &mut out);
    write_stdout(&out)
}

fn write_stdout(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}
