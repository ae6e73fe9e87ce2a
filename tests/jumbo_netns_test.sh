#!/usr/bin/env bash
# Jumbo packets across "machines" (docs/protocol.md 2.6): a switch and two workers, each in a
# network namespace of its own, joined by veth pairs with an MTU of 9000 on a bridge. Expects
# 2048-element packets to verify between hosts over kernel UDP, and a worker whose interface
# toward the switch has an MTU of 1500 to be refused at setup naming that interface, its MTU and
# the largest packet_numel that fits. Needs root; exits 77 (skipped) without it.
# Usage: jumbo_netns_test.sh PATH_TO_SWITCHML
set -euo pipefail
# shellcheck source=netns_hosts.sh
source "$(dirname "$0")/netns_hosts.sh"
bin="$1"
skip_without_netns
tag="smlj$$"
net="10.78.$(( $$ % 200 + 10 ))"
hosts=(sw w0 w1)
cleanup() {
  [ -n "${switch_pid:-}" ] && kill "$switch_pid" 2>/dev/null || true
  for h in "${hosts[@]}" br; do ip netns del "$tag-$h" 2>/dev/null || true; done
}
trap cleanup EXIT
make_hosts "$tag" "$net" 9000 "${hosts[@]}"

log=$(mktemp)
ip netns exec "$tag-sw" "$bin" switch --bind "$net.1" --data-port 48864 --control-port 50099 \
  --max-packet-numel 2048 >"$log" 2>&1 &
switch_pid=$!
for _ in $(seq 50); do
  grep -q "control port" "$log" && break
  sleep 0.1
done
status=0
grep -q "packets up to 2048 elements" "$log" ||
  { echo "FAIL: the switch did not say it takes 2048-element packets:"; cat "$log"; status=1; }

pids=() outs=()
for r in 0 1; do
  out=$(mktemp)
  outs+=("$out")
  ip netns exec "$tag-w$r" "$bin" worker --switch "$net.1" --rank "$r" --workers 2 \
    --size 1000003 --dtype float32 --iterations 3 --session 78 --packet-numel 2048 \
    --setup-timeout-ms 20000 --report >"$out" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  if ! wait "${pids[$r]}"; then
    echo "FAIL: worker $r:"; cat "${outs[$r]}"; status=1
  elif ! grep -q "status=ok verified=1" "${outs[$r]}"; then
    echo "FAIL: worker $r reported no verified result:"; cat "${outs[$r]}"; status=1
  fi
done

# A transport that cannot carry 8202-byte datagrams (xdp: one UMEM frame) is refused at setup
# rather than cutting them; where AF_XDP cannot run here at all, that part is skipped.
out=$(mktemp)
outs+=("$out")
if ip netns exec "$tag-w0" "$bin" worker --switch "$net.1" --rank 0 --workers 1 --size 1000 \
  --session 80 --packet-numel 2048 --transport xdp --setup-timeout-ms 5000 >"$out" 2>&1; then
  echo "FAIL: a worker with packet_numel 2048 over xdp was not refused:"; cat "$out"; status=1
elif grep -q "not compiled into this build\|AF_XDP: cannot\|AF_XDP: the kernel refused" "$out"; then
  echo "(xdp cannot run here: its refusal of jumbo packets not checked)"
elif ! grep -q "packet_numel 2048 needs datagrams of 8202 bytes and the xdp.* transport carries at most [0-9]*; use packet_numel 256" "$out"; then
  echo "FAIL: the xdp refusal does not say what to fix:"; cat "$out"; status=1
fi

# An MTU of 1500 toward the switch: 2048-element packets (8230-byte IP packets) do not fit.
ip -n "$tag-w0" link set eth0 mtu 1500
out=$(mktemp)
outs+=("$out")
if ip netns exec "$tag-w0" "$bin" worker --switch "$net.1" --rank 0 --workers 1 --size 1000 \
  --session 79 --packet-numel 2048 --setup-timeout-ms 5000 >"$out" 2>&1; then
  echo "FAIL: a worker with packet_numel 2048 behind an MTU of 1500 was not refused:"
  cat "$out"; status=1
elif ! grep -q "more than the MTU 1500 of eth0, the interface toward the switch $net.1; use packet_numel 256 or less" "$out"; then
  echo "FAIL: the refusal does not name the interface, its MTU and what fits:"; cat "$out"; status=1
fi

kill -TERM "$switch_pid"
wait "$switch_pid" || { echo "FAIL: switch exited with an error"; status=1; }
switch_pid=""
rm -f "$log" "${outs[@]}"
if [ "$status" -eq 0 ]; then
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
fi
exit "$status"
