#!/usr/bin/env bash
# A small SwitchML job in the emulated rack of scripts/rack.sh: the switch in the switch
# namespace on the bridge, two workers each in its own namespace behind a 500 Mbit/s tbf-shaped
# cable (MTU 9000), 4 MiB float32 and int32 all-reduces, every result verified. Exits 77
# (skipped) where namespaces cannot be created. Usage: rack_test.sh PATH_TO_SWITCHML [TRANSPORT]
# (TRANSPORT: udp (default) or xdp: AF_XDP on the switch's bridge and the workers' veth ends,
# with the uplinks shaped at the switch end, as AF_XDP bypasses the sender's qdisc; skipped,
# saying why, where the build or the kernel has no AF_XDP)
set -euo pipefail
bin="$(realpath "$1")"
transport="${RACK_TEST_TRANSPORT:-${2:-udp}}"
export RACK_TEST_TRANSPORT="$transport"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=worker_results.sh
source "$here/worker_results.sh"
rack="$here/../scripts/rack.sh"

# The job, run by rack.sh inside the rack (RACK_* in the environment).
if [ "${2:-}" = "--inside" ]; then
  log="$(mktemp -d)"
  trap 'kill "$switch_pid" 2>/dev/null || true; rm -rf "$log"' EXIT
  ip netns exec "$RACK_SWITCH_NS" "$bin" switch --bind "$RACK_SWITCH_IP" \
    --transport "$transport" >"$log/switch" 2>&1 &
  switch_pid=$!
  sleep 0.5
  if ! kill -0 "$switch_pid" 2>/dev/null && [ "$transport" != udp ] &&
    grep -q "not compiled into this build\|AF_XDP: cannot\|AF_XDP: the kernel refused" \
      "$log/switch"; then
    echo "SKIPPED: transport $transport cannot run here:"
    cat "$log/switch"
    exit 77
  fi
  read -r -a ips <<<"$RACK_WORKER_IPS"
  status=0
  # The bridge runs no netfilter hooks (rack.sh --bridge-netfilter off, the default), where the
  # kernel has them at all.
  for f in iptables ip6tables arptables; do
    v=$(ip netns exec "$RACK_SWITCH_NS" cat "/proc/sys/net/bridge/bridge-nf-call-$f" 2>/dev/null ||
      echo absent)
    [ "$v" = 0 ] || [ "$v" = absent ] ||
      { echo "FAIL: bridge-nf-call-$f is $v in the switch namespace, not 0"; status=1; }
  done
  for dtype in float32 int32; do
    pids=()
    for r in 0 1; do
      ip netns exec "$RACK_NAME-w$r" "$bin" worker --switch "$RACK_SWITCH_IP" --bind "${ips[$r]}" \
        --rank "$r" --workers 2 --size 1M --dtype "$dtype" --iterations 2 --warmup 1 \
        --session 5 --setup-timeout-ms 20000 --transport "$transport" --report >"$log/w$r" 2>&1 &
      pids+=($!)
    done
    for r in 0 1; do
      check_worker "$dtype (${ips[$r]})" "$r" "${pids[$r]}" "$log/w$r" || status=1
    done
  done
  kill -TERM "$switch_pid"
  wait "$switch_pid" || { echo "FAIL: the switch exited with an error"; status=1; }
  # Both workers' packets reached the switch over the bridge.
  grep -q "2/2 workers registered" "$log/switch" ||
    { echo "FAIL: the switch's counters show no job:"; cat "$log/switch"; status=1; }
  exit "$status"
fi

rc=0
shaping=()
[ "$transport" = udp ] || shaping=(--ingress-shaping)
timeout 50 "$rack" run --name "smltest$$" --workers 2 --rate 500mbit --mtu 9000 "${shaping[@]}" -- \
  bash "$0" "$bin" --inside || rc=$?
case "$rc" in
  0) echo "1 passed, 0 failed" ;;
  77)
    echo "SKIPPED: scripts/rack.sh cannot create network namespaces here (needs root and iproute2)"
    ;;
  124) echo "FAIL: the rack run took over 50 s"; echo "0 passed, 1 failed"; rc=1 ;;
  *) echo "0 passed, 1 failed" ;;
esac
exit "$rc"
