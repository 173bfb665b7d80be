#!/usr/bin/env bash
# Installs what fabric-agent needs to build, test and run its demo on Debian 12, as root:
# a C compiler and CA certificates (the linker, ring's C code, crates.io over https; a bare
# Debian has neither), libibverbs + libclang (rdma-sys), ibsim + OpenSM + infiniband-diags
# (the userspace InfiniBand test fabric), systemd (systemd-analyze verify), g++ (libFuzzer's C++
# sources, built by the fuzz smoke run), python3 + venv (the stock grpcio client test and the
# journald test), qemu-system-x86 + debootstrap + e2fsprogs (scripts/vm-rig.sh: the Debian 12
# guest with a real kernel that tests/vm_rxe.rs boots; the guest's kernel comes from inside its
# own root, so the host installs no kernel package), prometheus (its promtool checks and
# unit-tests packaging/prometheus/fabric-agent.rules.yml in tests/ops/alert_rules.rs; Debian 12 has
# 2.42). Idempotent.
set -euo pipefail

packages=(
  gcc g++ libc6-dev ca-certificates
  pkg-config libclang-dev
  libibverbs-dev librdmacm-dev ibverbs-providers
  ibsim-utils opensm infiniband-diags
  systemd
  python3 python3-venv
  qemu-system-x86 debootstrap e2fsprogs
  prometheus
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found: install the Rust toolchain first" >&2
  exit 1
fi
