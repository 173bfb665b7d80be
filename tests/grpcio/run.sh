#!/usr/bin/env bash
# Drives fabric-agent with the stock Python grpcio client from PyPI, over TCP and over the unix
# socket, using server reflection only (tests/grpcio/client.py).
#
#   tests/grpcio/run.sh path/to/fabric-agent
#
# Environment: GRPCIO_VENV  the venv to create or reuse (default: one in the temp dir).
# Exit codes: 0 passed, 1 failed, 77 cannot run here (no python3/venv, or PyPI unreachable).
set -euo pipefail

bin="$(realpath "${1:?usage: run.sh path/to/fabric-agent}")"
here="$(cd "$(dirname "$0")" && pwd)"
skip() { echo "grpcio: SKIP: $*" >&2; exit 77; }

command -v python3 >/dev/null || skip "python3 not found"
python3 -c 'import venv, ensurepip' 2>/dev/null || skip "python3 has no venv/ensurepip module"

work="$(mktemp -d)"
agent_pid=""
cleanup() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -TERM "$agent_pid"
    wait "$agent_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

venv="${GRPCIO_VENV:-$work/venv}"
py="$venv/bin/python"
if ! "$py" -c 'import grpc, grpc_reflection' 2>/dev/null; then
  python3 -m venv "$venv" || skip "cannot create a venv at $venv"
  "$py" -m pip install --quiet --disable-pip-version-check --timeout 30 grpcio grpcio-reflection \
    > "$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; skip "pip install grpcio grpcio-reflection failed (no network?)"; }
fi
echo "grpcio: $("$py" -c 'import grpc, google.protobuf as p; print("grpcio", grpc.__version__, "protobuf", p.__version__)')"

port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
sock="$work/agent.sock"
cat > "$work/config.toml" <<CONF
node_id = "node1"
fabric = "fab1"
state_dir = "$work/state"

[listen]
unix_socket = "$sock"
tcp = "127.0.0.1:$port"
insecure_plaintext_for_tests = true

[subnet_manager]
backend = "embedded"
CONF

"$bin" --config "$work/config.toml" serve 2> "$work/agent.log" &
agent_pid=$!
for _ in $(seq 200); do
  [ -S "$sock" ] && (exec 3<> "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log" >&2; echo "grpcio: the agent exited" >&2; exit 1; }
  sleep 0.1
done

status=0
echo "== TCP 127.0.0.1:$port (no client option)"
"$py" "$here/client.py" --target "127.0.0.1:$port" --instance vm-tcp --partition ibpart_grpciotcp --pkey 0x0a12 || status=1
echo "== unix socket, grpc.default_authority = localhost"
"$py" "$here/client.py" --target "unix:$sock" --authority localhost --instance vm-unix --partition ibpart_grpciounix --pkey 0x0a13 || status=1
echo "== unix socket without the option (what the README warns about)"
# Informational: the outcome is printed either way. Bounded, because grpcio has been seen to
# hang past its own deadline on this call once (no answer for 10 min).
timeout 90 "$py" "$here/client.py" --target "unix:$sock" --probe-only \
  || echo "grpcio: the probe without the option gave no outcome within 90 s (exit $?)"

if [ "$status" != 0 ]; then
  echo "grpcio: FAILED; the agent's log:" >&2
  cat "$work/agent.log" >&2
fi
exit "$status"
