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

# The docs: every relative link and anchor in README.md and docs/ resolves, every docs page is in
# docs/README.md, inline diagrams match their sources (the self-test shows each rule can fail).
python3 scripts/check-docs.py --self-test
python3 scripts/check-docs.py

# --workspace / --all: the agent crate and the fleet client crate (fleet/).
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# Doc comments: no broken or ambiguous intra-doc link (clap help text is doc comments too).
RUSTDOCFLAGS='-D warnings' cargo doc --no-deps --workspace --quiet

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# Tests must not depend on the signal dispositions they were started with: under nohup SIGHUP
# is ignored and children inherit that unless spawned through sys::process::with_default_signals
# (a signalled child would survive). The process tests again, with SIGHUP ignored.
# Piped, so nohup writes no nohup.out; not added to the totals below (counted above already).
nohup cargo test --lib sys:: < /dev/null 2>&1 | cat
# The SM-host failover tests on ibsim (tests/opensm/ha.rs, ha_fence.rs, ha_fence_command.rs,
# ha_three.rs, ha_opensm_only.rs) are #[ignore]d in the run above and run here on their own, up
# to five times:
# OpenSM under plain umad2sim stops sweeping for good after a handover (no MAD send timeouts;
# docs/TESTING.md "Why OpenSM stalls under ibsim"). The rig's timeout interposer ended that (0
# stalls in 26 runs); the tries stay as a safety net for the simulated fabric. A failed SAFETY
# assertion (a tenant key lost in the failover, a released key back on a port) fails at once.
ha_log="$(mktemp)"
ha_passed=0
for attempt in 1 2 3 4 5; do
  if cargo test -q --test opensm -- --ignored ha:: ha_fence:: ha_fence_command:: ha_three:: ha_opensm_only:: 2>&1 | tee "$ha_log"; then
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
# The chaos campaign (tests/chaos, its seed-1 smoke ran above): a second fixed seed, 150 s of faults.
CHAOS_SECS=150 CHAOS_SEED=2 cargo test -q --test chaos -- --ignored campaign_from_env
# The reconciler's deterministic simulation, long run (docs/SIMULATION.md).
cargo run --release --example simulate -- --seeds 20000
# ... and through the real SM-host backends: OpenSM's (model OpenSM process) and UFM's (model UFM
# executing requests late, out of order and after the client gave up).
cargo run --release --example simulate -- --opensm --seeds 2000
cargo run --release --example simulate -- --ufm --seeds 500
# Several SM hosts on the real code of both sides: more seeds, and OpenSMs started on fenced
# hosts as the real system allows (tests/simulation/sm_hosts).
FABRIC_SIM_SM_HOSTS_SEEDS=200 cargo test -q --test simulation sm_hosts::several
FABRIC_SIM_SM_HOSTS_SEEDS=200 FABRIC_SIM_SM_HOSTS_REJOIN_WHILE_FENCED=1 cargo test -q --test simulation sm_hosts::several
scripts/fuzz-smoke.sh
scripts/bench-smoke.sh

# Totals over every test binary's "test result:" line. No test can have skipped: under this
# command a skip is a failure (FABRIC_TEST_STRICT above).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i;
                                                  if ($(i+1) ~ /^ignored/) g += $i } }
     END { printf "tests: %d passed, %d failed, %d ignored, 0 skipped\n", p, f, g }' "$log"
