# The ibsim + OpenSM half of scripts/run.sh (sourced). Expects: $bin, $work, step, cli_at.
# Every process started here records its own pid and is stopped by pid in cleanup_fabric.

shim=/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so
# Loopback port of the SM-host agent's Partitions service (plaintext, loopback only).
sm_port="${FABRIC_DEMO_SM_PORT:-17443}"
export IBSIM_SOCKNAME="fabric-demo-$$"
pids=()

cleanup_fabric() {
  # Agents first (SIGTERM: they exit and free their ibsim slots), then OpenSM, then ibsim.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "${pids[i]}" 2>/dev/null || true
  done
  exec 7>&- 2>/dev/null || true
}

start_fabric() {
  cat > "$work/net" <<NET
Hca 1 "smhost"
[1] "sw1"[1]

Switch 8 "sw1"
[1] "smhost"[1]
[2] "node1"[1]
[3] "node2"[1]
[8] "sw2"[8]

Switch 8 "sw2"
[1] "node3"[1]
[8] "sw1"[8]

Hca 1 "node1"
[1] "sw1"[2]

Hca 1 "node2"
[1] "sw1"[3]

Hca 1 "node3"
[1] "sw2"[1]
NET
  # The operator's own partitions: tenant ports are limited members of the default partition.
  printf '# Operator entries (fabric-agent keeps these bytes as they are)\nDefault=0x7fff, ipoib : ALL=limited, SELF=full ;\n' > "$work/partitions.conf"
  printf 'partition_config_file %s\nlog_file %s\nforce_log_flush TRUE\nconsole off\n' \
    "$work/partitions.conf" "$work/opensm.log" > "$work/opensm.conf"

  # ibsim's console reads stdin and spins at EOF: feed it a FIFO this shell keeps open.
  mkfifo "$work/console"
  exec 7<>"$work/console"
  (cd "$work" && exec ibsim -s "$work/net" <&7 > "$work/ibsim.log" 2>&1) &
  pids+=($!)
  for _ in $(seq 100); do grep -q "ready" "$work/ibsim.log" 2>/dev/null && break; sleep 0.1; done

  (cd "$work" && LD_PRELOAD=$shim SIM_HOST=smhost OSM_CACHE_DIR="$work" OSM_TMP_DIR="$work" \
    exec opensm -F "$work/opensm.conf" > /dev/null 2>&1) &
  pids+=($!)
  echo "${pids[-1]}" > "$work/opensm.pid"
  for _ in $(seq 200); do grep -q "SUBNET UP" "$work/opensm.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "SUBNET UP" "$work/opensm.log" || { echo "OpenSM did not bring the subnet up" >&2; exit 1; }
  echo "ibsim fabric up: smhost (OpenSM), node1, node2, node3 on two switches"
}

agent_config() { # name backend-table
  cat <<CONF
node_id = "$1"
fabric = "europe-north1-a.fab2"
state_dir = "$work/$1-state"

[listen]
unix_socket = "$work/$1.sock"
$2

[observer]
kind = "smp"
slow_poll_ms = 2000
CONF
}

start_agent() { # node config
  (cd "$work" && LD_PRELOAD=$shim SIM_HOST="$1" exec "$bin" --config "$2" serve 2> "$work/$1.log") &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/$1.sock" ] && break; sleep 0.1; done
  [ -S "$work/$1.sock" ] || { echo "agent on $1 did not start:" >&2; cat "$work/$1.log" >&2; exit 1; }
}

start_agents() {
  # The control plane's grant-signing key: the SM host accepts a key in a node's set only with a
  # grant signed by it ([grants] require = true), exactly as in production.
  "$bin" grant keygen --out "$work" > /dev/null
  agent_config smhost "tcp = \"127.0.0.1:$sm_port\"
insecure_plaintext_for_tests = true

[subnet_manager]
backend = \"opensm\"

[subnet_manager.opensm]
partitions_file = \"$work/partitions.conf\"
log_file = \"$work/opensm.log\"
pid_file = \"$work/opensm.pid\"

# Port ownership (which GUIDs a node may claim) is proven by SA queries from this process; under
# the umad2sim shim one process cannot run those beside its own SMP observer (the shim routes a
# management class to one device), so the demo turns the check off. tests/opensm/ownership.rs
# exercises it on ibsim with the SM host observing through a fixture instead.
[subnet_manager.opensm.ownership]
enabled = false

[grants]
require = true

[[grants.keys]]
id = \"demo-control-plane\"
public_key_file = \"$work/grant-signing.pub\"" > "$work/smhost.toml"
  start_agent smhost "$work/smhost.toml"
  for n in node1 node2; do
    agent_config "$n" "
[subnet_manager]
backend = \"remote\"

[subnet_manager.remote]
endpoint = \"http://127.0.0.1:$sm_port\"" > "$work/$n.toml"
    start_agent "$n" "$work/$n.toml"
  done
  echo "agents up: smhost (opensm backend, serves fabric.sm.v1.Partitions), node1 and node2 (remote backend)"
}

grant_for() { # node instance: a grant for partition train-a (0x0a12), signed as the control plane
  "$bin" grant sign --key "$work/grant-signing.key" --key-id demo-control-plane \
    --fabric europe-north1-a.fab2 --node "$1" --instance "$2" --partition ibpart_7f3k2 --pkey 0x0a12 \
    > "$work/$2.grant"
  echo "signed a grant for $2 on $1 (partition ibpart_7f3k2, P_Key 0x0a12, full) -> $work/$2.grant"
}

smp_pkeys() { # node: the port's non-empty P_Key entries as OpenSM programmed them (smpquery)
  (cd "$work" && LD_PRELOAD=$shim SIM_HOST="$1" smpquery -D pkeys 0 1) |
    grep -v capacity | grep -o '0x[0-9a-f]\{4\}' | grep -v 0x0000 | tr '\n' ' '
  echo
}
