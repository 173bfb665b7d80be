# The guest image half of scripts/vm-rig.sh (sourced): a Debian 12 root built with debootstrap
# from Debian's packages, turned into a raw ext4 image without mounting anything
# (`mkfs.ext4 -d`), plus the guest's own kernel and initrd taken out of its /boot. Expects:
# $cache. Rebuilt only when the stamp (script version + package list) differs.

# Bump when the image's content changes in a way the package list does not show.
vm_image_version=3

# What the guest needs: systemd as PID 1, the Debian kernel (it carries rdma_rxe, ib_uverbs,
# ib_umad, 9p and virtio), rdma-core + libibverbs + the rxe provider, `rdma`/`ip` (iproute2),
# kmod, udev, and fabric-agent's .deb dependencies (libibverbs1 and libnl, via rdma-core), so
# `apt install ./fabric-agent*.deb` needs no network. procps is left out on purpose: the guest is
# the minimal host the packaged unit must work on.
vm_packages=(
  systemd systemd-sysv udev kmod
  linux-image-amd64 initramfs-tools
  rdma-core ibverbs-utils ibverbs-providers libibverbs1
  iproute2
)

vm_stamp() {
  printf 'version %s\nsuite bookworm\npackages %s\n' "$vm_image_version" "${vm_packages[*]}"
}

vm_image_fresh() {
  [ -f "$cache/stamp" ] && [ -f "$cache/rootfs.raw" ] && [ -f "$cache/vmlinuz" ] &&
    [ -f "$cache/initrd.img" ] && [ "$(cat "$cache/stamp")" = "$(vm_stamp)" ]
}

# The unit that runs the test script shared from the host, then powers the guest off.
vm_test_unit() {
  cat <<'UNIT'
[Unit]
Description=fabric-agent VM test: run the host's script from the 9p share, then power off
After=local-fs.target systemd-udevd.service systemd-journald.service
Wants=systemd-udevd.service
OnSuccess=poweroff.target
OnFailure=poweroff.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/fabric-vm-test
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
}

# Mounts the share, records the guest's facts, runs the script, writes its exit code.
vm_test_runner() {
  cat <<'RUNNER'
#!/bin/sh
# Runs /mnt/share/guest.sh (written by the host) with its output and exit code in
# /mnt/share/out; the share is virtio-9p, tag "share".
set -u
modprobe -q 9pnet_virtio; modprobe -q 9p
mkdir -p /mnt/share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt/share || exit 1
out=/mnt/share/out
mkdir -p "$out"
uname -r > "$out/kernel"
cut -d' ' -f1 /proc/uptime > "$out/ready"
cd /mnt/share
sh ./guest.sh > "$out/guest.log" 2>&1
echo $? > "$out/guest.rc.tmp"
journalctl -b --no-pager > "$out/journal.txt" 2>&1
sync
mv "$out/guest.rc.tmp" "$out/guest.rc"
sync
RUNNER
}

vm_build_image() {
  local root="$cache/root.tmp" t0 t1
  t0=$(date +%s)
  echo "vm-rig: building the guest image in $cache (debootstrap bookworm, once)" >&2
  rm -rf "$root" "$cache/stamp"
  mkdir -p "$root"
  local include
  include=$(IFS=,; echo "${vm_packages[*]}")
  debootstrap --variant=minbase --include="$include" bookworm "$root" \
    "${FABRIC_VM_MIRROR:-http://deb.debian.org/debian}" > "$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log" >&2
    echo "vm-rig: debootstrap failed (full log: $cache/debootstrap.log)" >&2
    return 1
  }

  echo fabric-vm > "$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 fabric-vm\n' > "$root/etc/hosts"
  printf '/dev/vda / ext4 rw,relatime 0 1\n' > "$root/etc/fstab"
  # The root account has no password: the guest is reachable only through its serial console.
  chroot "$root" passwd -d root >/dev/null
  # eth0 (net.ifnames=0) comes up with the test script, not with a network manager.
  vm_test_unit > "$root/etc/systemd/system/fabric-vm-test.service"
  vm_test_runner > "$root/usr/local/sbin/fabric-vm-test"
  chmod 755 "$root/usr/local/sbin/fabric-vm-test"
  ln -sf /etc/systemd/system/fabric-vm-test.service \
    "$root/etc/systemd/system/multi-user.target.wants/fabric-vm-test.service"
  # Nothing the test does not need at boot: no login prompt on the console, no apt timers.
  for unit in getty@tty1.service serial-getty@ttyS0.service apt-daily.timer \
    apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    systemd-timesyncd.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  echo 'Storage=volatile' >> "$root/etc/systemd/journald.conf"
  rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

  # The guest's own kernel and initrd boot it; the host needs no kernel package.
  cp "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)" "$cache/vmlinuz"
  cp "$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)" "$cache/initrd.img"
  rm -f "$cache/rootfs.raw"
  mkfs.ext4 -q -F -L fabric-vm -d "$root" "$cache/rootfs.raw" 2G
  rm -rf "$root"
  vm_stamp > "$cache/stamp"
  t1=$(date +%s)
  echo "vm-rig: image built in $((t1 - t0)) s ($(du -sh "$cache/rootfs.raw" | cut -f1) used)" >&2
  echo "$((t1 - t0))" > "$cache/build-seconds"
}
