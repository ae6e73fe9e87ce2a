#!/usr/bin/env bash
# A job striped over switch servers in the emulated rack of scripts/rack.sh --switch-hosts: three
# workers and three switch hosts, each in its own namespace behind its own 500 Mbit/s tbf-shaped
# cable (MTU 9000), a `switchml switch` on each host bound to its address, the workers given the
# three (--switch h1,h2,h3). Float32 and int32 all-reduces, every result verified; then one
# switch host's switch killed with SIGKILL in the middle of a run: the workers move its share to
# the other two and every result is still verified. Exits 77 (skipped) where namespaces cannot
# be created. Usage: server_rack_test.sh PATH_TO_SWITCHML
set -euo pipefail
bin="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=worker_results.sh
source "$here/worker_results.sh"
rack="$here/../scripts/rack.sh"

# The job, run by rack.sh inside the rack (RACK_* in the environment).
if [ "${2:-}" = "--inside" ]; then
  log="$(mktemp -d)"
  switch_pids=()
  trap 'kill "${switch_pids[@]}" 2>/dev/null || true; rm -rf "$log"' EXIT
  read -r -a ips <<<"$RACK_WORKER_IPS"
  read -r -a hosts <<<"$RACK_SWITCH_HOST_IPS"
  read -r -a host_ns <<<"$RACK_SWITCH_HOST_NS"
  list=""
  for j in 0 1 2; do
    ip netns exec "${host_ns[$j]}" "$bin" switch --bind "${hosts[$j]}" >"$log/s$j" 2>&1 &
    switch_pids+=($!)
    list+="${list:+,}${hosts[$j]}"
  done
  sleep 0.5
  status=0
  # run_job NAME KILL_AFTER WORKER_FLAGS...: three workers; with KILL_AFTER > 0, switch 1 is
  # killed once rank 0 printed that many iterations.
  run_job() {
    local name=$1 kill_after=$2
    shift 2
    local pids=() r
    for r in 0 1 2; do
      ip netns exec "$RACK_NAME-w$r" "$bin" worker --switch "$list" --bind "${ips[$r]}" \
        --rank "$r" --workers 3 --setup-timeout-ms 20000 --report "$@" >"$log/$name-w$r" 2>&1 &
      pids+=($!)
    done
    if [ "$kill_after" -gt 0 ]; then
      local tries=0
      until grep -q "iteration $kill_after/" "$log/$name-w0"; do
        tries=$((tries + 1))
        [ "$tries" -lt 600 ] || break
        sleep 0.05
      done
      sleep 0.1
      kill -KILL "${switch_pids[1]}"
      echo "killed the switch on ${hosts[1]} after rank 0's iteration $kill_after"
    fi
    for r in 0 1 2; do
      check_worker "$name" "$r" "${pids[$r]}" "$log/$name-w$r" || status=1
    done
  }
  run_job float32 0 --size 1M --dtype float32 --iterations 2 --warmup 1 --session 5
  run_job int32 0 --size 1M --dtype int32 --iterations 2 --warmup 1 --session 6
  # Every switch host aggregated its share of both jobs (SIGUSR1 prints the counters).
  for j in 0 1 2; do
    kill -USR1 "${switch_pids[$j]}"
  done
  sleep 0.3
  for j in 0 1 2; do
    grep -q "3/3 workers registered" "$log/s$j" ||
      { echo "FAIL: switch host $j shows no job:"; cat "$log/s$j"; status=1; }
  done
  run_job failover 3 --size 2M --dtype float32 --iterations 12 --warmup 0 --session 7
  for r in 0 1 2; do
    grep -q "is gone" "$log/failover-w$r" ||
      { echo "FAIL: worker $r did not say it moved off the dead switch:"; cat "$log/failover-w$r"; status=1; }
  done
  exit "$status"
fi

rc=0
timeout 100 "$rack" run --name "smlsrv$$" --workers 3 --switch-hosts 3 --rate 500mbit --mtu 9000 \
  -- bash "$0" "$bin" --inside || rc=$?
case "$rc" in
  0) echo "1 passed, 0 failed" ;;
  77)
    echo "SKIPPED: scripts/rack.sh cannot create network namespaces here (needs root and iproute2)"
    ;;
  124) echo "FAIL: the rack run took over 100 s"; echo "0 passed, 1 failed"; rc=1 ;;
  *) echo "0 passed, 1 failed" ;;
esac
exit "$rc"
