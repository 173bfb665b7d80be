#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit + integration tests (including the
# ibsim + OpenSM fabric tests), a short run of every fuzz target and of every benchmark program.
# Ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A test that cannot run here fails instead of skipping (tests/common/skip.rs); so does a
# fuzz or bench smoke run that finds a tool missing.
export FABRIC_TEST_STRICT=1

# --workspace / --all: the agent crate and the fleet client crate (fleet/).
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# The reconciler's deterministic simulation, long run (docs/SIMULATION.md).
cargo run --release --example simulate -- --seeds 20000
scripts/fuzz-smoke.sh
scripts/bench-smoke.sh

# Totals over every test binary's "test result:" line. No test can have skipped: under this
# command a skip is a failure (FABRIC_TEST_STRICT above).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i;
                                                  if ($(i+1) ~ /^ignored/) g += $i } }
     END { printf "tests: %d passed, %d failed, %d ignored, 0 skipped\n", p, f, g }' "$log"
