#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit + integration tests (including the
# ibsim + OpenSM fabric tests), a short run of every fuzz target and of every benchmark program.
# Ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A test that cannot run here fails instead of skipping (testkit/src/common/skip.rs); so does a
# fuzz or bench smoke run that finds a tool missing.
export FABRIC_TEST_STRICT=1

# --workspace / --all: the agent crate and the fleet client crate (fleet/).
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# Doc comments: no broken or ambiguous intra-doc link (clap help text is doc comments too).
RUSTDOCFLAGS='-D warnings' cargo doc --no-deps --workspace --quiet

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# The two-SM-host failover test on ibsim (tests/opensm/ha.rs) is #[ignore]d in the run above:
# OpenSM 3.3.23 under ibsim sometimes stops sweeping for good after a handover (about one run in
# five on a 2-core machine, more under load), a fault of the simulated fabric's SM, not of the agent. It runs here
# up to five times; a failed SAFETY assertion (a tenant key lost in the failover, a released key
# back on a port) fails at once.
ha_log="$(mktemp)"
ha_passed=0
for attempt in 1 2 3 4 5; do
  if cargo test -q --test opensm ha:: -- --ignored 2>&1 | tee "$ha_log"; then
    ha_passed=1
    break
  fi
  if grep -q "SAFETY:" "$ha_log"; then
    echo "opensm_ha: a safety assertion failed (see above)" >&2
    exit 1
  fi
  echo "opensm_ha: try $attempt failed on the simulated fabric's OpenSM; trying again" >&2
done
rm -f "$ha_log"
[ "$ha_passed" = 1 ] || { echo "opensm_ha: failed five times" >&2; exit 1; }
# The reconciler's deterministic simulation, long run (docs/SIMULATION.md).
cargo run --release --example simulate -- --seeds 20000
# ... and through the real SM-host backends: OpenSM's (model OpenSM process) and UFM's (model UFM
# executing requests late, out of order and after the client gave up).
cargo run --release --example simulate -- --opensm --seeds 2000
cargo run --release --example simulate -- --ufm --seeds 500
scripts/fuzz-smoke.sh
scripts/bench-smoke.sh

# Totals over every test binary's "test result:" line. No test can have skipped: under this
# command a skip is a failure (FABRIC_TEST_STRICT above).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i;
                                                  if ($(i+1) ~ /^ignored/) g += $i } }
     END { printf "tests: %d passed, %d failed, %d ignored, 0 skipped\n", p, f, g }' "$log"
