#!/usr/bin/env bash
# The main job: build fabric-agent, start it, and walk one instance through
# attach -> ACTIVE -> release -> RELEASED with the CLI, printing the node's P_Key tables at
# each step.
#
#   scripts/run.sh              on a simulated InfiniBand fabric: ibsim switches and HCAs, the
#                               real OpenSM, an SM-host agent (opensm backend) and two node agents
#                               (remote backend, SMP observer), joined by the umad2sim shim
#   scripts/run.sh --embedded   on the embedded (in-process simulated) fabric
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet
bin="$PWD/target/debug/fabric-agent"

mode=ibsim
[ "${1:-}" = "--embedded" ] && mode=embedded

work="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" || true
  fi
  [ "$mode" = ibsim ] && cleanup_fabric
  rm -rf "$work"
}
trap cleanup EXIT

step() { if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi; }
cli_at() { local sock="$1"; shift; echo "\$ fabric-agent $*"; "$bin" --socket "$sock" "$@"; }

if [ "$mode" = ibsim ]; then
  # shellcheck source=lib/ibsim-demo.sh
  . scripts/lib/ibsim-demo.sh
  step "start ibsim (2 switches, 4 HCAs) and OpenSM on smhost"
  start_fabric
  step "start the agents: smhost (opensm backend) and node1, node2 (remote backend, SMP observer)"
  start_agents
  cli_at "$work/node1.sock" node
  step "the control plane signs a grant per instance; the SM host refuses keys without one"
  grant_for node1 vm-1
  grant_for node2 vm-2
  step "attach vm-1 on node1 and vm-2 on node2 to partition train-a (P_Key 0x0a12); wait for ACTIVE"
  cli_at "$work/node1.sock" attach --instance vm-1 --partition ibpart_7f3k2 --name train-a \
    --workspace ml-team --account acme --pkey 0x0a12 --wait 60 --grant "@$work/vm-1.grant"
  cli_at "$work/node2.sock" attach --instance vm-2 --partition ibpart_7f3k2 --name train-a \
    --workspace ml-team --account acme --pkey 0x0a12 --wait 60 --grant "@$work/vm-2.grant"
  cli_at "$work/node1.sock" node
  echo "smpquery pkeys on node1: $(smp_pkeys node1)"
  echo "OpenSM's partitions file now:"
  sed 's/^/    /' "$work/partitions.conf"
  step "vm-1 is terminated: release on node1, wait for RELEASED (node2 keeps the key)"
  cli_at "$work/node1.sock" release --instance vm-1 --wait 60
  cli_at "$work/node1.sock" node
  echo "smpquery pkeys on node1: $(smp_pkeys node1)"
  echo "smpquery pkeys on node2: $(smp_pkeys node2)"
  step "node1's durable event log"
  cli_at "$work/node1.sock" events
  step "stop the agents (SIGTERM: drain and exit 0), OpenSM and ibsim"
  exit 0
fi

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

cli() { cli_at "$work/agent.sock" --config "$work/config.toml" "$@"; }

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
