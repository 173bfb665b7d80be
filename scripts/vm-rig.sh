#!/usr/bin/env bash
# A KVM guest with a real kernel for the tests that need one (soft-RoCE, libibverbs, systemd):
# a Debian 12 image built once from Debian's packages and cached, booted with the guest's own
# kernel, running a script shared from the host, then powered off.
#
#   scripts/vm-rig.sh image            build the cached image if missing or stale; print its dir
#   scripts/vm-rig.sh run SHARE [SECS] boot a clean guest (writes go to a throw-away snapshot)
#                                      that runs SHARE/guest.sh as root at boot, SHARE shared
#                                      read-write over virtio-9p; results in SHARE/out
#                                      (guest.log, guest.rc, kernel, ready, journal.txt,
#                                      console.log). Waits SECS (default 240) then kills qemu by
#                                      its pid. Exit: guest.sh's own code, 124 on timeout.
#
# Environment: FABRIC_VM_CACHE (default /var/cache/fabric-agent-vm), FABRIC_VM_MIRROR,
# FABRIC_VM_MEM (MiB, default 1024), FABRIC_VM_ACCEL (auto|kvm|tcg, see pick_accel). Needs root
# (debootstrap), qemu-system-x86, debootstrap, e2fsprogs (scripts/setup.sh installs them); uses
# /dev/kvm when hardware KVM backs it, else emulates. Exit 77 when a tool is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${FABRIC_VM_CACHE:-/var/cache/fabric-agent-vm}"
# shellcheck source=lib/vm-image.sh
. "$here/lib/vm-image.sh"

need() {
  command -v "$1" >/dev/null || PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null || {
    echo "vm-rig: $1 not found (scripts/setup.sh installs it)" >&2
    exit 77
  }
}

ensure_image() {
  need debootstrap
  need mkfs.ext4
  export PATH="$PATH:/usr/sbin:/sbin"
  mkdir -p "$cache"
  # One builder at a time; the others wait and then find the image fresh.
  exec 9> "$cache/lock"
  flock 9
  vm_image_fresh || vm_build_image
  flock -u 9
}

# Hardware KVM (kvm_intel/kvm_amd) when /dev/kvm is backed by it. A /dev/kvm served by kvm_pvm
# (pagetable-based nested virtualisation, as on Firecracker hosts) runs only kernels built as PVM
# guests: Debian's kernel hangs right after decompression there, so the rig emulates (TCG),
# about 4x slower to boot. FABRIC_VM_ACCEL=kvm|tcg overrides.
pick_accel() {
  local want="${FABRIC_VM_ACCEL:-auto}"
  if [ "$want" = auto ]; then
    want=tcg
    if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
      want=kvm
    fi
  fi
  case "$want" in
    # arch-capabilities: nested KVM on some hosts refuses MSR 0x10a, aborting qemu.
    kvm) echo "-enable-kvm -cpu host,-arch-capabilities" ;;
    tcg) echo "-accel tcg,thread=multi -cpu max" ;;
    *) echo "vm-rig: FABRIC_VM_ACCEL must be auto, kvm or tcg" >&2; exit 2 ;;
  esac
}

run_guest() {
  local share="$1" secs="${2:-240}"
  [ -f "$share/guest.sh" ] || { echo "vm-rig: $share/guest.sh missing" >&2; exit 2; }
  need qemu-system-x86_64
  local accel
  accel=$(pick_accel)
  ensure_image
  local out="$share/out"
  rm -rf "$out"
  mkdir -p "$out"
  local t0 pid ready="" rc
  t0=$(date +%s.%N)
  # snapshot=on: the guest's writes go to a temporary file, the cached image stays as built.
  qemu-system-x86_64 $accel -smp 1 -m "${FABRIC_VM_MEM:-1024}" \
    -nodefaults -no-user-config -display none -serial "file:$out/console.log" -no-reboot \
    -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet systemd.show_status=0 panic=-1" \
    -drive "file=$cache/rootfs.raw,format=raw,if=virtio,snapshot=on" \
    -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0,mac=52:54:00:ab:cd:ef \
    > "$out/qemu.log" 2>&1 &
  pid=$!
  local deadline=$(($(date +%s) + secs))
  while kill -0 "$pid" 2>/dev/null; do
    if [ -z "$ready" ] && [ -f "$out/ready" ]; then
      ready=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t0}")
    fi
    if (($(date +%s) >= deadline)); then
      echo "vm-rig: guest still running after ${secs} s: killing qemu (pid $pid)" >&2
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      tail -30 "$out/console.log" >&2 || true
      return 124
    fi
    sleep 0.05
  done
  wait "$pid" || true
  local total
  total=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t0}")
  if [ ! -f "$out/guest.rc" ]; then
    echo "vm-rig: the guest stopped without a result; console:" >&2
    tail -40 "$out/console.log" >&2 || true
    cat "$out/qemu.log" >&2 || true
    return 1
  fi
  rc=$(cat "$out/guest.rc")
  printf 'vm-rig: %s, guest kernel %s, boot-to-ready %.2f s (guest uptime %s s), whole run %s s, guest.sh exit %s\n' \
    "$([[ $accel == *enable-kvm* ]] && echo KVM || echo 'TCG (emulated)')" "$(cat "$out/kernel")" "${ready:-0}" "$(cat "$out/ready")" "$total" "$rc" >&2
  return "$rc"
}

case "${1:-}" in
  image) ensure_image; echo "$cache" ;;
  run) shift; run_guest "$@" ;;
  *) sed -n '5,17p' "$0" >&2; exit 2 ;;
esac
