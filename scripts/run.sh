#!/usr/bin/env bash
# The main job: build fabric-agent, start it, and walk one instance through
# attach -> ACTIVE -> release -> RELEASED with the CLI, printing the node's P_Key tables at
# each step.
#
#   scripts/run.sh              on the embedded (simulated) fabric
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet
bin="$PWD/target/debug/fabric-agent"

work="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/config.toml" <<CONF
node_id = "gpu-node-1"
fabric = "europe-north1-a.fab2"
state_dir = "$work/state"

[listen]
unix_socket = "$work/agent.sock"

[subnet_manager]
backend = "embedded"

[subnet_manager.embedded]
ports = 2
pkey_table_size = 64
apply_delay_ms = 200
CONF

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cli() { echo "\$ fabric-agent $*"; "$bin" --config "$work/config.toml" --socket "$work/agent.sock" "$@"; }

step "start the agent (embedded fabric)"
"$bin" --config "$work/config.toml" serve 2> "$work/agent.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$work/agent.sock" ] && break; sleep 0.1; done
cli node

step "attach instance gpu-vm-1 to partition train-a (P_Key 0x0a12), wait for ACTIVE"
cli attach --instance gpu-vm-1 --partition ibpart_7f3k2 --name train-a --workspace ml-team \
  --account acme --pkey 0x0a12 --wait 30
cli node

step "the instance is terminated: release, wait for RELEASED"
cli release --instance gpu-vm-1 --wait 30
cli node

step "the durable event log"
cli events

step "stop the agent (SIGTERM: drain and exit 0)"
kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=""
echo "agent exited cleanly"
