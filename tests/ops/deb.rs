//! The Debian package: `scripts/package.sh` builds it with cargo-deb from the binary under test
//! (the test's own profile, fast compression); the test lists it with `dpkg-deb -c`, reads its
//! control files (conffile, maintainer scripts doing only what debhelper does), unpacks it with
//! `dpkg --root --unpack` into a scratch root and runs the shipped `fabric-agent check-config` on
//! the shipped example configuration. (Configuring would run the maintainer scripts, whose
//! systemd helpers act on the running system, so the test stops at unpack.) Skips without dpkg or cargo-deb (and no way to install it),
//! except in CI (`CI` set), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::common::skip::skip;

const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn has_cargo_deb() -> bool {
    Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The cargo profile whose output directory holds the binary under test.
fn profile_of(bin: &Path) -> String {
    let dir = bin.parent().and_then(Path::file_name).unwrap();
    match dir.to_str().unwrap() {
        "debug" => "dev".into(),
        other => other.into(),
    }
}

fn build_deb(out_dir: &Path) -> PathBuf {
    let profile = profile_of(Path::new(BIN));
    run(Command::new("bash")
        .args(["scripts/package.sh", "--profile", &profile])
        .args([
            "--no-build",
            "--fast",
            "--output",
            out_dir.to_str().unwrap(),
        ]));
    let debs: Vec<PathBuf> = std::fs::read_dir(out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one .deb in {}: {debs:?}", out_dir.display());
    debs.into_iter().next().unwrap()
}

#[test]
fn deb_package_contents_scripts_and_scratch_install() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        return skip("dpkg-deb not installed");
    }
    if !has_cargo_deb() {
        let installed = Command::new("cargo")
            .args(["install", "--locked", "--quiet", "cargo-deb"])
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            return skip("cargo-deb missing and `cargo install --locked cargo-deb` failed");
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let deb = build_deb(&tmp.path().join("out"));

    // Contents.
    let listing = text(&run(Command::new("dpkg-deb").arg("-c").arg(&deb)));
    for path in [
        "./usr/bin/fabric-agent",
        "./usr/lib/systemd/system/fabric-agent.service",
        "./usr/lib/sysusers.d/fabric-agent.conf",
        "./usr/lib/tmpfiles.d/fabric-agent.conf",
        "./etc/fabric-agent/config.toml",
        "./usr/share/man/man1/fabric-agent.1.gz",
        "./usr/share/man/man1/fabric-agent-serve.1.gz",
        "./usr/share/man/man5/fabric-agent.toml.5.gz",
        "./usr/share/doc/fabric-agent/fabric-agent.rules.yml",
        "./usr/share/bash-completion/completions/fabric-agent",
        "./usr/share/zsh/vendor-completions/_fabric-agent",
        "./usr/share/doc/fabric-agent/README.md",
        "./usr/share/doc/fabric-agent/copyright",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {path}"))),
            "{path} missing from the package:\n{listing}"
        );
    }

    // Control files: the conffile, and maintainer scripts doing only what debhelper does.
    let control = tmp.path().join("control");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    let read = |name: &str| std::fs::read_to_string(control.join(name)).unwrap_or_default();
    assert_eq!(read("conffiles").trim(), "/etc/fabric-agent/config.toml");
    let fields = read("control");
    assert!(
        fields
            .lines()
            .any(|l| l.starts_with("Depends:") && l.contains("systemd")),
        "{fields}"
    );
    let postinst = read("postinst");
    for step in [
        "systemd-sysusers",
        "systemd-tmpfiles --create fabric-agent.conf",
        "daemon-reload",
        "deb-systemd-helper enable fabric-agent.service",
    ] {
        assert!(
            postinst.contains(step),
            "postinst lacks {step}:\n{postinst}"
        );
    }
    let sysusers_at = postinst.find("systemd-sysusers").unwrap();
    let tmpfiles_at = postinst.find("systemd-tmpfiles").unwrap();
    assert!(
        sysusers_at < tmpfiles_at,
        "the user must exist before tmpfiles chowns to it"
    );
    for start in [
        "deb-systemd-invoke start",
        "systemctl start",
        "systemctl --system start",
    ] {
        assert!(
            !postinst.contains(start),
            "postinst starts the service:\n{postinst}"
        );
    }
    assert!(
        !control.join("preinst").exists(),
        "no preinst expected: {}",
        read("preinst")
    );

    // Unpack into a scratch root with dpkg itself (no maintainer script runs on --unpack).
    let root = tmp.path().join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args(["--force-depends", "--force-not-root", "--unpack"])
        .arg(&deb));
    let status = text(&run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args(["--status", "fabric-agent"])));
    assert!(status.contains("Status: install ok unpacked"), "{status}");
    let conffiles = text(&run(Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f=${Conffiles}", "fabric-agent"])));
    assert!(
        conffiles.lines().any(|l| {
            let mut f = l.split_whitespace();
            // Unpacked, not yet configured: dpkg records the hash as `newconffile`.
            f.next() == Some("/etc/fabric-agent/config.toml") && f.next() == Some("newconffile")
        }),
        "the example config is not registered as a conffile: {conffiles:?}"
    );

    // dpkg handled the example as a conffile: unpacked beside its final name until configure.
    let example = root.join("etc/fabric-agent/config.toml.dpkg-new");
    assert!(
        example.exists(),
        "no conffile {} after unpack",
        example.display()
    );
    // The shipped binary accepts the shipped example (its syntax: its TLS files are this
    // host's to provide).
    let agent = root.join("usr/bin/fabric-agent");
    let checked = text(&run(Command::new(&agent)
        .arg("check-config")
        .arg("--syntax")
        .arg("--config")
        .arg(&example)));
    assert!(checked.contains(": ok ("), "{checked}");
    let man = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/man/man1/fabric-agent.1.gz")));
    assert!(text(&man).contains(".TH fabric-agent 1"), "not a man page");
    let completion =
        std::fs::read_to_string(root.join("usr/share/bash-completion/completions/fabric-agent"))
            .unwrap();
    assert!(
        completion.contains("check-config"),
        "bash completion lacks subcommands"
    );
}
