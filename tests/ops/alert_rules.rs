//! The packaged Prometheus alert rules (packaging/prometheus/): `promtool check rules` accepts
//! them, `promtool test rules` fires each on synthetic series, the subnet-manager rules
//! without `ignoring(state)` (the README's old `and`) are shown never to fire, and the
//! unreachable and refused rules with their expressions swapped are shown to fail the same
//! tests, so each fires on its own series and not on the other's.

use testkit::common;

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
    assert!(text.contains("4 rules found"), "{text}");
    let o = run(&packaged(), &["test", "rules", RULE_TESTS]);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// `promtool test rules` on the packaged tests against `rules`; its output, asserting failure.
fn failing_rule_tests(rules: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(RULES), rules).unwrap();
    std::fs::copy(packaged().join(RULE_TESTS), tmp.path().join(RULE_TESTS)).unwrap();
    let o = run(tmp.path(), &["test", "rules", RULE_TESTS]);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the altered rules passed: {text}");
    text
}

const UNREACHABLE_EXPR: &str = "fabric_agent_sm_state{state=\"UNREACHABLE\"} == 1";
const REFUSED_EXPR: &str = "fabric_agent_sm_state{state=\"REFUSED\"} == 1";

#[test]
fn without_ignoring_state_the_subnet_manager_rules_never_fire() {
    if !have_promtool() {
        return;
    }
    let rules = std::fs::read_to_string(packaged().join(RULES)).unwrap();
    assert_eq!(rules.matches("and ignoring(state)").count(), 2, "{rules}");
    // The README's first version of the rule: label sets differ, so `and` matches nothing.
    let text = failing_rule_tests(&rules.replace("and ignoring(state)", "and"));
    for alert in [
        "FabricAgentSubnetManagerUnreachable",
        "FabricAgentSubnetManagerRefused",
    ] {
        assert!(text.contains(alert), "{alert} not failing: {text}");
    }
}

#[test]
fn the_unreachable_and_refused_rules_each_fire_on_their_own_series_only() {
    if !have_promtool() {
        return;
    }
    let rules = std::fs::read_to_string(packaged().join(RULES)).unwrap();
    assert_eq!(rules.matches(UNREACHABLE_EXPR).count(), 1, "{rules}");
    assert_eq!(rules.matches(REFUSED_EXPR).count(), 1, "{rules}");
    assert!(
        !rules.contains("fabric_agent_sm_reachable"),
        "a rule on sm_reachable fires for both: {rules}"
    );
    // Each rule watching the other's state: both fire on the wrong series and stay silent on
    // their own, and the tests say so for each.
    let swapped = rules
        .replace(UNREACHABLE_EXPR, "@UNREACHABLE@")
        .replace(REFUSED_EXPR, UNREACHABLE_EXPR)
        .replace("@UNREACHABLE@", REFUSED_EXPR);
    let text = failing_rule_tests(&swapped);
    for alert in [
        "FabricAgentSubnetManagerUnreachable",
        "FabricAgentSubnetManagerRefused",
    ] {
        assert!(text.contains(alert), "{alert} not failing: {text}");
    }
    // One rule on any failed apply (the old sm_reachable == 0): it fires on the other's series.
    let both = rules.replace(
        REFUSED_EXPR,
        "fabric_agent_sm_state{state=~\"REFUSED|UNREACHABLE\"} == 1",
    );
    let text = failing_rule_tests(&both);
    assert!(text.contains("FabricAgentSubnetManagerRefused"), "{text}");
}

#[test]
fn the_metrics_page_shows_the_packaged_rules() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/METRICS.md"))
            .unwrap();
    assert!(
        readme.contains("packaging/prometheus/fabric-agent.rules.yml"),
        "docs/METRICS.md points to the rules file"
    );
    assert!(readme.contains("and ignoring(state)"));
    assert!(!readme.contains("fabric_agent_sm_reachable == 0 and fabric_agent_attachments"));
    // The metrics page names both subnet-manager alerts and the state each watches.
    for name in [
        "FabricAgentSubnetManagerUnreachable",
        "FabricAgentSubnetManagerRefused",
        UNREACHABLE_EXPR,
        REFUSED_EXPR,
    ] {
        assert!(readme.contains(name), "docs/METRICS.md lacks {name}");
    }
}
