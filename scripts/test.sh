#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, unit + integration tests (including the
# ibsim + OpenSM fabric tests), and a short run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test
scripts/fuzz-smoke.sh
