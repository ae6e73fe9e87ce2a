#!/usr/bin/env bash
# Across "machines": the switch and two workers each in a network namespace of their own, joined
# by veth pairs on a bridge (in a fourth namespace), talking over real IPv4 between hosts
# 10.77.<n>.1-3. Needs root (CI runs as root); exits 77 (skipped) without it.
# Usage: netns_test.sh PATH_TO_SWITCHML [TRANSPORT [auth]]   (TRANSPORT: udp (default), xdp, ...;
# with xdp the switch and each worker use AF_XDP on their veth end; skipped, saying why, when the
# build has no AF_XDP or the kernel refuses it; with dpdk each uses DPDK's net_af_packet on its
# veth end, one thread, skipped, saying why, when the build has no DPDK or EAL refuses). With
# `auth`, the job uses the authenticated data plane (--auth-data) on a switch that refuses jobs
# without it (--require-auth-data), and every worker must report no tag failure.
set -euo pipefail
# shellcheck source=netns_hosts.sh
source "$(dirname "$0")/netns_hosts.sh"
bin="$1"
transport="${2:-udp}"
auth="${3:-}"
auth_switch=() auth_worker=()
case "$auth" in
  "") ;;
  auth) auth_switch=(--require-auth-data) auth_worker=(--auth-data) ;;
  *) echo "netns_test.sh: the third argument is 'auth' or nothing, not '$auth'" >&2; exit 2 ;;
esac
skip_without_netns
tag="sml$$"
net="10.77.$(( $$ % 200 + 10 ))"
hosts=(sw w0 w1)
cleanup() {
  for h in "${hosts[@]}" br; do ip netns del "$tag-$h" 2>/dev/null || true; done
  [ -n "${switch_pid:-}" ] && kill "$switch_pid" 2>/dev/null || true
}
trap cleanup EXIT
make_hosts "$tag" "$net" "" "${hosts[@]}"

log=$(mktemp)
# Over AF_XDP the switch runs two shards: two sockets sharing one UMEM, as the workers' two threads.
switch_threads=1
[ "$transport" = xdp ] && switch_threads=2
worker_threads=2
dev_args=()
if [ "$transport" = dpdk ]; then  # a DPDK device per host: net_af_packet (no rte_flow: 1 thread)
  dev_args=(--dpdk-device net_af_packet0,iface=eth0)
  worker_threads=1
fi
ip netns exec "$tag-sw" "$bin" switch --bind "$net.1" --data-port 48864 --control-port 50099 \
  --transport "$transport" --threads "$switch_threads" "${dev_args[@]}" "${auth_switch[@]}" \
  >"$log" 2>&1 &
switch_pid=$!
for _ in $(seq 50); do
  grep -q "control port" "$log" && break
  kill -0 "$switch_pid" 2>/dev/null || break
  sleep 0.1
done
if ! kill -0 "$switch_pid" 2>/dev/null && [ "$transport" != udp ] &&
  grep -q "not compiled into this build\\|AF_XDP: cannot\\|AF_XDP: the kernel refused\\|not in this build\\|EAL initialisation failed" "$log"; then
  # The transport cannot start here (the build or the kernel refuses it): skip, saying why.
  echo "SKIPPED: transport $transport cannot run here:"; cat "$log"; rm -f "$log"
  switch_pid=""
  exit 77
fi

pids=()
outs=()
for r in 0 1; do
  out=$(mktemp)
  outs+=("$out")
  ip netns exec "$tag-w$r" "$bin" worker --switch "$net.1" --rank "$r" --workers 2 \
    --size 1000003 --dtype float32 --iterations 3 --session 77 --threads "$worker_threads" \
    --setup-timeout-ms 20000 --transport "$transport" --report "${dev_args[@]}" "${auth_worker[@]}" \
    $([ "$transport" = dpdk ] && echo --bind "$net.$((r + 2))") >"$out" 2>&1 &
  pids+=($!)
done
status=0
for r in 0 1; do
  if ! wait "${pids[$r]}"; then
    echo "FAIL: worker $r on host $net.$((r + 2)):"; cat "${outs[$r]}"; status=1
  elif ! grep -q "status=ok verified=1" "${outs[$r]}"; then
    echo "FAIL: worker $r reported no verified result:"; cat "${outs[$r]}"; status=1
  elif [ -n "$auth" ] && ! grep -q " auth_dropped=0" "${outs[$r]}"; then
    echo "FAIL: worker $r dropped datagrams whose tag did not verify:"; cat "${outs[$r]}"; status=1
  fi
done
kill -TERM "$switch_pid"
wait "$switch_pid" || { echo "FAIL: switch exited with an error"; status=1; }
switch_pid=""
cat "$log"
# The switch registered both hosts' workers at their own addresses (its log; not the job's
# table in the exit counters, which is gone when the workers closed the job and a late datagram
# reached the switch after that).
for r in 0 1; do
  grep -q "session 77: rank $r of 2 registered at $net.$((r + 2)):" "$log" ||
    { echo "FAIL: the switch did not log rank $r's registration from $net.$((r + 2))"; status=1; }
done
rm -f "$log" "${outs[@]}"
if [ "$status" -eq 0 ]; then
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
fi
exit "$status"
