#!/usr/bin/env bash
# What the Debian package ships, checked in CI without building the package (scripts/package.sh
# builds and checks it; packaging/debian12_proof.sh installs it on a fresh Debian 12):
#   - switchml-switch.service passes `systemd-analyze verify`, alone and with the AF_XDP
#     drop-in, and keeps its hardening (own user, no capabilities, ProtectSystem, PrivateTmp,
#     Restart=on-failure); the drop-in grants exactly the capabilities AF_XDP needs;
#   - the flags of /etc/default/switchml-switch start a switch (ports moved to free ones) that
#     serves metrics, and it stops cleanly on SIGTERM;
#   - a man page made from each command's --help (packaging/man_page.sh, help2man) names every
#     flag of that command.
# Usage: packaging_test.sh SWITCHML_BINARY
set -euo pipefail
bin="$(realpath "${1:?usage: packaging_test.sh SWITCHML_BINARY}")"
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
switch_pid=""
cleanup() {
  [ -z "$switch_pid" ] || kill "$switch_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

unit="$here/switchml-switch.service"
dropin="$here/examples/switchml-switch.service.d/xdp.conf"
if command -v systemd-analyze >/dev/null; then
  # (the installed path of the binary is this build's; the man page is not installed here)
  sed "s|/usr/bin/switchml|$bin|" "$unit" >"$tmp/switchml-switch.service"
  systemd-analyze verify --man=no "$tmp/switchml-switch.service" 2>"$tmp/verify.log" ||
    { cat "$tmp/verify.log"; fail "systemd-analyze verify refused the unit"; }
  [ ! -s "$tmp/verify.log" ] || { cat "$tmp/verify.log"; fail "systemd-analyze verify warned"; }
  mkdir "$tmp/xdp"
  cat "$tmp/switchml-switch.service" "$dropin" >"$tmp/xdp/switchml-switch.service"
  systemd-analyze verify --man=no "$tmp/xdp/switchml-switch.service" 2>"$tmp/verify.log" &&
    [ ! -s "$tmp/verify.log" ] || { cat "$tmp/verify.log"; fail "the unit with the drop-in"; }
  echo "systemd-analyze verify: the unit, alone and with the AF_XDP drop-in"
else
  echo "no systemd-analyze here: the unit's verification is left to debian12_proof.sh"
fi
for line in "User=switchml" "CapabilityBoundingSet=" "NoNewPrivileges=yes" "ProtectSystem=strict" \
  "PrivateTmp=yes" "Restart=on-failure" "EnvironmentFile=-/etc/default/switchml-switch"; do
  grep -qx "$line" "$unit" || fail "the unit lacks $line"
done
grep -q '^ExecStart=/usr/bin/switchml switch \$SWITCHML_SWITCH_ARGS$' "$unit" ||
  fail "the unit does not start \`switchml switch \$SWITCHML_SWITCH_ARGS\`"
caps="$(sed -n 's/^AmbientCapabilities=//p' "$dropin")"
[ "$caps" = "CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_IPC_LOCK" ] ||
  fail "the AF_XDP drop-in grants '$caps'"

# The shipped flags, with the ports moved to free ones and the address to loopback.
SWITCHML_SWITCH_ARGS=""
# shellcheck source=/dev/null
. "$here/switchml-switch.default"
[ -n "$SWITCHML_SWITCH_ARGS" ] || fail "switchml-switch.default sets no SWITCHML_SWITCH_ARGS"
read -r -a args <<<"$SWITCHML_SWITCH_ARGS"
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --data-port | --control-port | --metrics-port) args[$((i + 1))]=0 ;;
    --bind) args[$((i + 1))]=127.0.0.1 ;;
  esac
done
"$bin" switch "${args[@]}" >"$tmp/switch.log" 2>&1 &
switch_pid=$!
for _ in $(seq 100); do
  grep -q "metrics on http" "$tmp/switch.log" && break
  kill -0 "$switch_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "metrics on http" "$tmp/switch.log" ||
  { cat "$tmp/switch.log"; fail "the shipped flags did not start a switch serving metrics"; }
kill -TERM "$switch_pid"
wait "$switch_pid" || { cat "$tmp/switch.log"; fail "the switch did not stop cleanly"; }
switch_pid=""
echo "the shipped /etc/default flags: ${args[*]}: started, served metrics, stopped"

# Man pages from --help name every flag.
if command -v help2man >/dev/null; then
  for command in "" switch worker run status sim; do
    page="$tmp/page${command:+-$command}.1.gz"
    bash "$here/man_page.sh" "$(command -v help2man)" "$bin" "$command" "test" 0.0 "$page"
    zcat "$page" | sed 's/\\-/-/g; s/\\f[BRI]//g' >"$tmp/page.txt"
    if [ -n "$command" ]; then
      flags="$("$bin" "$command" --help | grep -o '^  --[a-z0-9-]*' | tr -d ' ' | sort -u)"
      [ -n "$flags" ] || fail "switchml $command --help lists no flags"
      for f in $flags; do
        grep -q -- "$f" "$tmp/page.txt" || fail "the man page of switchml $command lacks $f"
      done
    fi
  done
  echo "man pages: every command's page names all its flags"
else
  echo "no help2man here (scripts/setup.sh installs it): man pages not checked"
fi
echo "packaging_test: OK"
