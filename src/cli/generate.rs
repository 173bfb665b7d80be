//! Hidden subcommands that print the man pages and shell completions, generated from the same
//! clap definitions as the command line itself, and the configuration reference page generated
//! from [`crate::config::reference`] (used to build the Debian package), also as the Markdown
//! page docs/CONFIG-REFERENCE.md.

use super::Cli;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Shells whose completion scripts `fabric-agent completions` prints.
pub use clap_complete::Shell;

/// `man` arguments.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write every page into this directory instead: fabric-agent.1, one
    /// fabric-agent-COMMAND.1 per subcommand (the main page names them) and
    /// fabric-agent.toml.5 (the configuration reference).
    #[arg(long, value_name = "DIR", conflicts_with = "config_reference")]
    pub dir: Option<PathBuf>,
    /// Print the configuration reference as Markdown instead (docs/CONFIG-REFERENCE.md is
    /// this output), from the same table as fabric-agent.toml(5).
    #[arg(long)]
    pub config_reference: bool,
}

/// Prints the fabric-agent(1) man page (roff) to stdout, writes every page into `--dir`, or
/// prints the Markdown configuration reference (`--config-reference`).
pub fn man(args: &ManArgs) -> ExitCode {
    let result = match &args.dir {
        _ if args.config_reference => {
            write_stdout(crate::config::reference::markdown_page().as_bytes())
        }
        None => render(&Cli::definition()).and_then(|page| write_stdout(&page)),
        Some(dir) => write_pages(dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn render(command: &clap::Command) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut out)?;
    Ok(out)
}

/// The pages `man --dir` writes: `(file name, roff)`.
pub fn pages() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let root = Cli::definition();
    let mut pages = vec![("fabric-agent.1".to_owned(), render(&root)?)];
    sub_pages(&root, "fabric-agent", &mut pages)?;
    pages.push((
        "fabric-agent.toml.5".to_owned(),
        crate::config::reference::man_page().into_bytes(),
    ));
    Ok(pages)
}

/// One page per visible subcommand of `parent`, and of theirs, named as the parent's
/// SUBCOMMANDS section names them: fabric-agent-serve(1), fabric-agent-grant-sign(1).
fn sub_pages(
    parent: &clap::Command,
    prefix: &str,
    pages: &mut Vec<(String, Vec<u8>)>,
) -> std::io::Result<()> {
    for sub in parent.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let name = format!("{prefix}-{}", sub.get_name());
        let sub = sub
            .clone()
            .display_name(name.clone())
            .bin_name(name.clone());
        pages.push((format!("{name}.1"), render(&sub)?));
        sub_pages(&sub, &name, pages)?;
    }
    Ok(())
}

fn write_pages(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, page) in pages()? {
        std::fs::write(dir.join(name), page)?;
    }
    Ok(())
}

/// Prints the completion script for `shell` to stdout.
pub fn completions(shell: Shell) -> ExitCode {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::definition(), "fabric-agent", &mut out);
    match write_stdout(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_the_main_page_names_is_generated() {
        let pages = pages().unwrap();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        let main = String::from_utf8_lossy(&pages[0].1).into_owned();
        for sub in [
            "serve",
            "node",
            "attach",
            "get",
            "doctor",
            "check-config",
            "grant",
        ] {
            assert!(
                names.contains(&format!("fabric-agent-{sub}.1").as_str()),
                "{names:?}"
            );
            let roff = format!("fabric-agent-{sub}(1)").replace('-', "\\-");
            assert!(main.contains(&roff), "{sub}");
        }
        assert!(names.contains(&"fabric-agent.toml.5"), "{names:?}");
        assert!(names.contains(&"fabric-agent-grant-sign.1"), "{names:?}");
    }
}
