//! The packaged Prometheus alert rules (packaging/prometheus/): `promtool check rules` accepts
//! them, `promtool test rules` fires each on synthetic series, and the README's old
//! subnet-manager rule (an `and` without `ignoring(state)`) is shown never to fire, so the unit
//! test can tell a rule that works from one that cannot.

mod common;

use common::skip::skip;
use std::path::{Path, PathBuf};
use std::process::Command;

const RULES: &str = "fabric-agent.rules.yml";
const RULE_TESTS: &str = "fabric-agent.rules.test.yml";

fn packaged() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/prometheus")
}

/// Whether `promtool` runs here; else a skip (a failure under CI: scripts/setup.sh installs
/// Debian's prometheus package, which ships it).
fn have_promtool() -> bool {
    match Command::new("promtool").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            skip("promtool not found (Debian package prometheus; scripts/setup.sh installs it)");
            false
        }
    }
}

fn run(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run promtool")
}

#[test]
fn the_packaged_rules_pass_promtool_and_fire_on_synthetic_series() {
    if !have_promtool() {
        return;
    }
    let o = run(&packaged(), &["check", "rules", RULES]);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("3 rules found"), "{text}");
    let o = run(&packaged(), &["test", "rules", RULE_TESTS]);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

#[test]
fn without_ignoring_state_the_subnet_manager_rule_never_fires() {
    if !have_promtool() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rules = std::fs::read_to_string(packaged().join(RULES)).unwrap();
    assert!(rules.contains("and ignoring(state)"), "{rules}");
    // The README's first version of the rule: label sets differ, so `and` matches nothing.
    std::fs::write(
        tmp.path().join(RULES),
        rules.replace("and ignoring(state)", "and"),
    )
    .unwrap();
    std::fs::copy(packaged().join(RULE_TESTS), tmp.path().join(RULE_TESTS)).unwrap();
    let o = run(tmp.path(), &["test", "rules", RULE_TESTS]);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the broken rule passed: {text}");
    assert!(
        text.contains("FabricAgentSubnetManagerApplyFailing"),
        "{text}"
    );
}

#[test]
fn the_readme_shows_the_packaged_rules() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(
        readme.contains("packaging/prometheus/fabric-agent.rules.yml"),
        "README points to the rules file"
    );
    assert!(readme.contains("and ignoring(state)"));
    assert!(!readme.contains("fabric_agent_sm_reachable == 0 and fabric_agent_attachments"));
}
