#!/usr/bin/env bash
# Runs every benchmark program once at a small size (debug build, a few seconds to a minute
# each), so a bench that no longer completes, hangs, or prints NaN fails CI instead of being
# found when someone needs its figures. The figures printed here are not measurements: the
# real runs are in docs/PERFORMANCE.md, with their commands.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${BENCH_SMOKE_SECONDS:-300}"

# name | environment | arguments
benches=(
  "daemon||--cycles 20"
  "ufm||--applies 5"
  "ufm_fleet||--fleet 20 --runs 1"
  "smp||"
  "fabric_attach||--cycles 3"
  "grant_flood||--copies 2000 --attaches 20 --floods 3"
  "opensm_commit||--nodes 50 --per-leaf 10 --runs 1 --off-nodes 2"
  "opensm_commit_ha||--nodes 50 --per-leaf 24 --runs 1 --sweeps 1"
  "opensm_restart||--nodes 50 --per-leaf 10 --runs 1"
  "streams||--streams 50 --cycles 5 --stalled 10"
  "soak||--minutes 1 --interval-secs 20"
  "follow||--agents 100 --seconds 2 --rate 2000"
)

# --workspace: the fleet client crate's bench (follow) too.
cargo test --workspace --benches --no-run -q
for entry in "${benches[@]}"; do
  IFS='|' read -r name vars args <<< "$entry"
  out="$(mktemp)"
  start=$(date +%s)
  # shellcheck disable=SC2086 # vars and args are word lists
  if ! env $vars timeout --signal=TERM --kill-after=10 "$limit" \
      cargo test --workspace -q --bench "$name" -- $args > "$out" 2>&1; then
    echo "bench-smoke: $name failed or ran past ${limit}s:" >&2
    tail -n 60 "$out" >&2
    rm -f "$out"
    exit 1
  fi
  if grep -Ew 'NaN|nan|inf|TIMEOUT' "$out" >/dev/null; then
    echo "bench-smoke: $name printed NaN, inf or TIMEOUT:" >&2
    grep -Ew -n 'NaN|nan|inf|TIMEOUT' "$out" | head -n 20 >&2
    rm -f "$out"
    exit 1
  fi
  # CI installs ibsim and OpenSM (scripts/setup.sh): a fabric bench that measured nothing there
  # is a failure, not a skip.
  if [ -n "${CI:-}" ] && grep -q 'not installed' "$out"; then
    echo "bench-smoke: $name measured nothing:" >&2
    tail -n 20 "$out" >&2
    rm -f "$out"
    exit 1
  fi
  echo "bench-smoke: $name ok in $(( $(date +%s) - start ))s ($(wc -l < "$out") lines)"
  rm -f "$out"
done
