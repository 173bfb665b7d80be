#!/usr/bin/env bash
# Proves the README's two commands on a truly fresh Debian 12 (bookworm) root, as root:
#
#   1. debootstrap a minimal bookworm root (variant minbase) from deb.debian.org in a temp dir
#      (or unpack a base saved earlier with --base-cache);
#   2. bind-mount the host's Rust toolchain read-only (RUSTUP_HOME and CARGO_HOME/bin); the root
#      gets its own, empty, writable CARGO_HOME, so every crate is downloaded afresh;
#   3. `git clone` the checkout's HEAD into the root (uncommitted changes are NOT included);
#   4. copy the host's local CA certificates (/usr/local/share/ca-certificates: a site's own
#      trust anchors, e.g. for a TLS-inspecting proxy) and resolv.conf into the root;
#   5. chroot in and run `scripts/run.sh [ARGS]`, then `scripts/test.sh`, exactly as the README
#      says (--run-only: the first command alone);
#   6. print the Debian packages setup installed (dpkg list before/after), the time taken,
#      whether the build and the demo completed, and the test command's totals.
#
# Everything runs in a private mount namespace (unshare), so no mount outlives the script even
# if it is killed; on a normal exit the trap stops what was started inside the root (by pid),
# unmounts and deletes the temp dir (only once nothing is mounted under it).
#
# Not part of scripts/test.sh: it downloads a base system and every crate, and runs the whole
# test suite in the root (~ 60-90 min on 2 cores).
#
#   scripts/fresh-check.sh [--keep] [--run-only] [--base-cache FILE] [--mirror URL] [-- RUN_ARGS...]
#   scripts/fresh-check.sh --deb FILE [--keep] [--base-cache FILE] [--mirror URL]
#     --keep             keep the root (printed) for inspection instead of deleting it
#     --run-only         run the first command (scripts/run.sh) only, not scripts/test.sh
#     --base-cache FILE  a tar of the debootstrapped base: created when missing, reused after
#     --mirror URL       Debian mirror (default http://deb.debian.org/debian)
#     --deb FILE         instead of run.sh: `apt install` the package (scripts/package.sh) in
#                        the fresh root, maintainer scripts and all, check the system user, the
#                        unit's enablement, the conffile and check-config, then purge it
#     RUN_ARGS           passed to scripts/run.sh, e.g. -- --embedded
set -euo pipefail

die() { echo "fresh-check: $*" >&2; exit 1; }

keep=0
run_only=0
base_cache=""
mirror="http://deb.debian.org/debian"
run_args=()
deb=""
while (($#)); do
  case "$1" in
    --keep) keep=1 ;;
    --run-only) run_only=1 ;;
    --base-cache) base_cache="$(realpath -m "$2")"; shift ;;
    --mirror) mirror="$2"; shift ;;
    --deb) deb="$(realpath "$2")"; shift ;;
    --) shift; run_args=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, mount, chroot)"
repo="$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
host_rustup="${RUSTUP_HOME:-$HOME/.rustup}"
host_cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
[ -d "$host_rustup/toolchains" ] || die "no Rust toolchain at $host_rustup (set RUSTUP_HOME)"
[ -x "$host_cargo_bin/cargo" ] || die "no cargo in $host_cargo_bin (set CARGO_HOME)"

# Re-enter in a private mount namespace: its mounts disappear with it, whatever happens.
if [ -z "${FRESH_CHECK_IN_NS:-}" ]; then
  command -v unshare >/dev/null || die "unshare (util-linux) is required"
  args=()
  ((keep)) && args+=(--keep)
  ((run_only)) && args+=(--run-only)
  [ -n "$base_cache" ] && args+=(--base-cache "$base_cache")
  [ -n "$deb" ] && args+=(--deb "$deb")
  exec env FRESH_CHECK_IN_NS=1 unshare --mount --propagation private \
    "$0" "${args[@]}" --mirror "$mirror" -- "${run_args[@]}"
fi

if ! command -v debootstrap >/dev/null; then
  echo "fresh-check: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work="$(mktemp -d /var/tmp/fresh-check.XXXXXX)"
root="$work/root"
log="$work/run.log"
mkdir -p "$root"
mounts=() # mount points, in mount order

mount_bind() { # src dst [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}

stop_root_processes() {
  # Whatever still runs with its root in our chroot was started by this script: stop it by pid.
  local p pids=()
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids+=("${p#/proc/}")
  done
  ((${#pids[@]})) || return 0
  echo "fresh-check: stopping leftover processes in the root: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

cleanup() {
  local rc=$? i
  stop_root_processes
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" || true
  done
  if grep -q " $work/" /proc/self/mounts; then
    echo "fresh-check: something is still mounted under $work; not deleting it" >&2
  elif ((keep)); then
    echo "fresh-check: root kept at $root (log: $log)"
  else
    cp "$log" "/var/tmp/fresh-check-last.log" 2>/dev/null || true
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

commit="$(git -C "$repo" rev-parse --short HEAD)"
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] ||
  echo "fresh-check: note: uncommitted changes in $repo are not part of this check"

t0=$SECONDS
if [ -n "$base_cache" ] && [ -f "$base_cache" ]; then
  echo "fresh-check: unpacking the saved base $base_cache"
  tar -C "$root" -xpf "$base_cache"
else
  echo "fresh-check: debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
  if [ -n "$base_cache" ]; then
    mkdir -p "$(dirname "$base_cache")"
    tar -C "$root" -cpf "$base_cache" .
    echo "fresh-check: saved the base as $base_cache"
  fi
fi
t_base=$((SECONDS - t0))

cp /etc/resolv.conf "$root/etc/resolv.conf"
# The site's own trust anchors (e.g. a TLS-inspecting egress proxy), as the site's images carry
# them: ca-certificates, once setup installs it, adds them to the bundle cargo uses.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  echo "fresh-check: copied the host's local CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
fi
# Standard for chroots: package scripts must not start services (there is no init in here).
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# The root is a mount point, as / is on any machine (a test that makes its own private mount
# namespace with `unshare --propagation private` needs that).
mount_bind "$root" "$root"
mount_bind /proc "$root/proc"
mount_bind /sys "$root/sys" ro
mount_bind /dev "$root/dev"
mount_bind /dev/pts "$root/dev/pts"
mkdir -p "$root/dev/shm" && mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm" && mounts+=("$root/dev/shm")
mount_bind "$host_rustup" "$root/opt/rust/rustup" ro
mount_bind "$host_cargo_bin" "$root/opt/rust/cargo-bin" ro

# The package check: install the .deb the way an operator would, in the fresh root.
deb_check() {
  local name ok=1
  name="$(basename "$deb")"
  cp "$deb" "$root/tmp/$name"
  in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
  check() { # description command...
    local what="$1"; shift
    if out="$("$@" 2>&1)"; then echo "ok    $what: $(echo "$out" | tail -1)"; else echo "FAIL  $what: $out"; ok=0; fi
  }
  echo "fresh-check: apt install /tmp/$name in the fresh root"
  in_root apt-get update -qq
  if ! in_root apt-get install -y -qq --no-install-recommends "/tmp/$name" > "$log" 2>&1; then
    tail -30 "$log"; echo "deb: install FAILED"; return 1
  fi
  check "installed" in_root sh -c 'dpkg -s fabric-agent | grep "^Status: install ok installed"'
  check "conffile" in_root sh -c "dpkg-query -W -f='\${Conffiles}' fabric-agent | grep '^ /etc/fabric-agent/config.toml [0-9a-f]\{32\}\$'"
  check "system user (sysusers)" in_root id fabric-agent
  check "in group rdma" in_root sh -c 'id -nG fabric-agent | grep -qw rdma && echo rdma'
  check "unit enabled" in_root systemctl is-enabled fabric-agent.service
  check "check-config on the shipped example" in_root fabric-agent check-config --syntax
  check "man page" in_root test -s /usr/share/man/man1/fabric-agent.1.gz
  in_root apt-get purge -y -qq fabric-agent > /dev/null 2>&1
  check "purge removes the enablement" in_root sh -c '! test -e /etc/systemd/system/multi-user.target.wants/fabric-agent.service'
  echo
  echo "== fresh-check --deb summary"
  echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "package: $name ($(stat -c %s "$deb") bytes), into Debian 12 bookworm minbase"
  echo "result:  $( ((ok)) && echo "installed, checked and purged" || echo FAILED)"
  ((ok))
}
if [ -n "$deb" ]; then
  deb_check
  exit
fi

git clone --quiet --no-hardlinks "$repo" "$root/src/fabric-agent"

pkgs() { chroot "$root" dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }' | sort; }
pkgs > "$work/before"

# A free loopback port for the demo's SM-host agent (the chroot shares the host's network).
demo_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 17443)"

echo "fresh-check: chroot $root: scripts/run.sh ${run_args[*]} (commit $commit)"
t1=$SECONDS
set +e
chroot "$root" /usr/bin/env -i \
  HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
  PATH=/opt/rust/cargo-bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  RUSTUP_HOME=/opt/rust/rustup CARGO_HOME=/root/.cargo \
  FABRIC_DEMO_SM_PORT="$demo_port" \
  /bin/bash -c 'cd /src/fabric-agent && exec scripts/run.sh "$@"' run.sh "${run_args[@]}" 2>&1 | tee "$log"
run_rc=${PIPESTATUS[0]}
t_run=$((SECONDS - t1))
test_rc=-
t_test=0
if ((!run_only)); then
  echo "fresh-check: chroot $root: scripts/test.sh (commit $commit)"
  t2=$SECONDS
  chroot "$root" /usr/bin/env -i \
    HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
    PATH=/opt/rust/cargo-bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/opt/rust/rustup CARGO_HOME=/root/.cargo \
    /bin/bash -c 'cd /src/fabric-agent && exec scripts/test.sh' 2>&1 | tee "$work/test.log"
  test_rc=${PIPESTATUS[0]}
  t_test=$((SECONDS - t2))
  cp "$work/test.log" /var/tmp/fresh-check-last-test.log 2>/dev/null || true
fi
set -e
pkgs > "$work/after"

built=no
[ -x "$root/src/fabric-agent/target/debug/fabric-agent" ] && built=yes
demo=failed
if [ "$run_rc" = 0 ] && grep -q RELEASED "$log" && grep -Eq "agent exited cleanly|stop the agents" "$log"; then
  demo=completed
fi
installed="$(comm -13 "$work/before" "$work/after")"

cat <<SUMMARY

== fresh-check summary
date:       $(date -u '+%Y-%m-%d %H:%M UTC')
commit:     $commit
base:       Debian 12 bookworm, debootstrap --variant=minbase ($(wc -l < "$work/before") packages, ${t_base}s)
toolchain:  $(chroot "$root" /usr/bin/env RUSTUP_HOME=/opt/rust/rustup /opt/rust/cargo-bin/rustc --version 2>/dev/null || echo unknown)
command:    scripts/run.sh ${run_args[*]}  (exit $run_rc, ${t_run}s including setup, crate download and build)
setup installed $(printf '%s\n' "$installed" | grep -c . || true) packages:
$(printf '%s\n' "$installed" | fmt -w 96 | sed 's/^/  /')
build:      $built
demo:       $demo
$( ((run_only)) && echo "test:       not run (--run-only)" || echo "test:       scripts/test.sh (exit $test_rc, ${t_test}s): $(grep -E '^tests: ' "$work/test.log" | tail -1)")
SUMMARY
[ "$demo" = completed ] && { ((run_only)) || [ "$test_rc" = 0 ]; }
