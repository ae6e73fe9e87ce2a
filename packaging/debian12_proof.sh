#!/usr/bin/env bash
# The package's proof on a fresh Debian 12 (docs/operations.md, section 1; outside CI: about
# ten minutes, most of it debootstrap and apt): in a new debootstrap root (minbase bookworm,
# from the mirror this machine's apt uses),
#   1. `apt-get install ./switchml_*.deb` pulls every dependency from Debian and the maintainer
#      script creates the service's user;
#   2. `switchml run` (a switch and 2 workers, results verified) works;
#   3. `import switchml.torch` works with Debian's python3 (and an all-reduce through the module);
#   4. examples/allreduce builds out of tree with find_package(switchml) (g++ and cmake are
#      installed for that) and runs against a switch;
#   5. `systemd-analyze verify` passes on switchml-switch.service, its man page included
#      (systemd and man-db installed for that), alone and with the AF_XDP drop-in.
# Needs root. Removes the root afterwards unless --keep.
#   packaging/debian12_proof.sh DEB [--root DIR] [--keep]
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
deb="" root=/var/tmp/switchml-deb12-proof keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --root) root="${2:?--root needs a directory}"; shift ;;
    --keep) keep=1 ;;
    -*) echo "debian12_proof: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    *) deb="$1" ;;
  esac
  shift
done
[ -f "$deb" ] || { echo "debian12_proof: give the package (scripts/package.sh builds it)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "debian12_proof: needs root (debootstrap, chroot)" >&2; exit 2; }
[ ! -e "$root" ] || { echo "debian12_proof: $root exists: remove it or give another --root" >&2; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap

# The mirror apt uses here (deb822 sources first, then one-line ones).
mirror=$(sed -n 's/^URIs: *\(\S*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  if [ "$keep" -eq 0 ] && [ -d "$root" ]; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
step() { echo; echo "=== debian12_proof: $* ($(date +%T))"; }
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

step "debootstrap bookworm (minbase) from $mirror into $root"
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
rm -f "$root.debootstrap.log"
# The same sources (and snapshot settings) as this machine's apt.
cp -a /etc/apt/sources.list.d/. "$root/etc/apt/sources.list.d/" 2>/dev/null || true
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/"
ls "$root"/etc/apt/sources.list.d/*.sources >/dev/null 2>&1 && rm -f "$root/etc/apt/sources.list"
for f in /etc/apt/apt.conf.d/99*; do [ -f "$f" ] && cp "$f" "$root/etc/apt/apt.conf.d/"; done
cp /etc/resolv.conf "$root/etc/resolv.conf"
for m in proc sys dev dev/pts dev/shm; do
  mount --bind "/$m" "$root/$m"
  mounted+=("$root/$m")
done
echo "debootstrap: $(($(date +%s) - t0)) s, $(in_root dpkg-query -W | wc -l) packages"

step "1. apt-get install ./$(basename "$deb")"
cp "$deb" "$root/tmp/"
in_root apt-get update -qq
before=$(in_root dpkg-query -W | wc -l)
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq "/tmp/$(basename "$deb")" >"$root/tmp/install.log" 2>&1 ||
  { tail -30 "$root/tmp/install.log"; exit 1; }
echo "installed: $(($(in_root dpkg-query -W | wc -l) - before)) packages (switchml and its dependencies)"
in_root getent passwd switchml >/dev/null || { echo "FAIL: no switchml user"; exit 1; }
echo "the service's user: $(in_root getent passwd switchml)"
in_root switchml --version

step "2. switchml run"
in_root switchml run --workers 2 --size 1M --iterations 3 --transport udp >"$root/tmp/run.log" 2>&1 ||
  { tail -20 "$root/tmp/run.log"; echo "FAIL: switchml run"; exit 1; }
tail -3 "$root/tmp/run.log"

step "3. import switchml.torch (Debian's python3)"
in_root /usr/bin/python3 -c '
import numpy as np, switchml, switchml.torch, torch
print("switchml from", switchml.__file__, "; torch", torch.__version__)
' || { echo "FAIL: import switchml.torch"; exit 1; }

step "4. an out-of-tree program with find_package(switchml)"
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq --no-install-recommends g++ cmake make >/dev/null
mkdir -p "$root/tmp/example"
cp "$src/examples/allreduce/CMakeLists.txt" "$src/examples/allreduce/main.cc" "$root/tmp/example/"
in_root cmake -S /tmp/example -B /tmp/example/build >/dev/null
in_root cmake --build /tmp/example/build >/dev/null
in_root sh -c 'switchml switch --bind 127.0.0.1 --data-port 0 --control-port 0 >/tmp/switch.log 2>&1 &
  sw=$!
  for i in $(seq 100); do port=$(sed -n "s/.*control port \([0-9]*\).*/\1/p" /tmp/switch.log); [ -n "$port" ] && break; sleep 0.1; done
  timeout 60 /tmp/example/build/allreduce_example --port "$port" --workers 2; rc=$?
  kill "$sw"; wait "$sw"; exit $rc' ||
  { echo "FAIL: the out-of-tree example"; exit 1; }

step "5. systemd-analyze verify switchml-switch.service"
# (man-db: verify also checks that the unit's Documentation= man page exists)
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq --no-install-recommends systemd man-db >/dev/null
# (a warning fails too: verify exits 0 on an unknown key, which systemd then ignores)
verify() {
  in_root systemd-analyze verify "$1" >"$root/tmp/verify.log" 2>&1 && [ ! -s "$root/tmp/verify.log" ] ||
    { cat "$root/tmp/verify.log"; echo "FAIL: systemd-analyze verify $1"; exit 1; }
}
verify /lib/systemd/system/switchml-switch.service
mkdir -p "$root/etc/systemd/system/switchml-switch.service.d"
cp "$root/usr/share/doc/switchml/examples/switchml-switch.service.d/xdp.conf" \
  "$root/etc/systemd/system/switchml-switch.service.d/"
verify switchml-switch.service
echo "verify: OK, no warning (the unit, and with the AF_XDP drop-in)"
in_root systemd-analyze security --offline=yes /lib/systemd/system/switchml-switch.service 2>/dev/null |
  tail -1 || true

step "all passed in $(($(date +%s) - t0)) s"
