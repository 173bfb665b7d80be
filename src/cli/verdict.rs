//! One verdict shape for every report of checks (`check-config --json`, `doctor --json`):
//! `{"ok": bool, "verdict": "OK"|"FAIL", "checks": [{"check", "verdict", "ok", "detail"}]}`,
//! where a check's verdict is OK, WARN (ok, but look at it) or FAIL (not ok).

use serde::Serialize;

/// One check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Passed.
    Ok,
    /// Passed, with something an operator should look at.
    Warn,
    /// Failed: blocks the daemon (check-config) or ACTIVE/RELEASED (doctor).
    Fail,
}

impl Verdict {
    /// The verdict as printed: `OK`, `WARN`, `FAIL`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }

    /// Whether the check passed (OK or WARN).
    pub fn ok(self) -> bool {
        self != Verdict::Fail
    }
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub check: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Whether it passed (the verdict is OK or WARN).
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

impl Check {
    /// A check with its verdict.
    pub fn new(verdict: Verdict, check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            verdict,
            ok: verdict.ok(),
            detail: detail.into(),
        }
    }
}

/// The overall verdict of a list of checks, with the fields every report carries.
pub fn summary(checks: &[Check]) -> serde_json::Value {
    let ok = checks.iter().all(|c| c.ok);
    serde_json::json!({
        "ok": ok,
        "verdict": if ok { Verdict::Ok } else { Verdict::Fail },
        "checks": checks,
    })
}
