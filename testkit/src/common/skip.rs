//! The one way a test says it cannot run here. A skip is allowed only on a developer's machine:
//! under CI (`CI` set) or the README's test command (`FABRIC_TEST_STRICT` set by
//! `scripts/test.sh`) it is a failure, so a missing tool can never turn into a silent pass.

/// Whether a skip must fail the test instead (CI, or the README's test command).
pub fn skips_are_failures() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("FABRIC_TEST_STRICT").is_some()
}

/// Says why this test does not run here; panics instead under CI or the test command.
pub fn skip(why: &str) {
    assert!(
        !skips_are_failures(),
        "this test cannot run here and skips are failures under CI and scripts/test.sh: {why}"
    );
    eprintln!("skipping: {why}");
}
