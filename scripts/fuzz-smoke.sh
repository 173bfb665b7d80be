#!/usr/bin/env bash
# Runs every cargo-fuzz target briefly (default 20 s each) from its seed corpus. Needs the
# nightly toolchain; installs cargo-fuzz from crates.io when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz-smoke: no nightly toolchain; skipping" >&2
  [ -z "${CI:-}${FABRIC_TEST_STRICT:-}" ] || { echo "fuzz-smoke: CI needs the nightly toolchain" >&2; exit 1; }
  exit 0
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz

cd fuzz
for target in $(cargo +nightly fuzz list); do
  corpus="corpus/$target"
  mkdir -p "$corpus"
  echo "fuzz-smoke: $target for ${seconds}s"
  out="$(mktemp)"
  if ! cargo +nightly fuzz run "$target" "$corpus" -- -max_total_time="$seconds" -rss_limit_mb=2048 > "$out" 2>&1; then
    # A build error or a crash: show enough of it to act on.
    grep -v '^#' "$out" | tail -n 60
    rm -f "$out"
    exit 1
  fi
  tail -n 3 "$out"
  rm -f "$out"
done
