#!/usr/bin/env bash
# Packet rates of the software switch per transport, and `switchml run` over each (issue 9):
#   1. a do-nothing DPDK forwarder (memif server echoing frames) vs the switch over DPDK memif,
#      both driven by the same one-thread load generator (a 1-worker job, W packets in flight);
#   2. the switch over kernel UDP with GSO/GRO ("udp") and plain kernel UDP ("udp-plain") with the
#      same generator: packets/s, per switch core (packets/s divided by the switch process's CPU
#      share) and per generator (worker) core;
#   3. `switchml run` over memif and over kernel UDP with 2 and 4 workers.
# Usage: scripts/transport_bench.sh [build dir] (env: SECONDS_PER_RUN=3 RUNS=3 SIZE=16M)
set -euo pipefail
build=${1:-build}
bench=$build/tools/switchml_transport_bench
sml=$build/tools/switchml
secs=${SECONDS_PER_RUN:-3}
runs=${RUNS:-3}
size=${SIZE:-16M}
window=${WINDOW:-256}
port=47100
export SWITCHML_DPDK_EAL=${SWITCHML_DPDK_EAL:-"--no-huge --no-pci --no-shconf -m 512 --no-telemetry --log-level=*:error"}

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime, clock ticks
tick=$(getconf CLK_TCK)
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# measure <server pid> <gen args...>: prints "pps switch_cores gen_cpu"
measure() {
  local pid=$1; shift
  local c0 c1 out
  c0=$(cpu_of "$pid")
  out=$("$bench" gen "$@" --seconds "$secs" --window "$window" 2>"$tmp/gen.err" | grep '^pps=' || true)
  if [ -z "$out" ]; then  # the generator failed (e.g. the server never came up): say so, count 0
    echo "transport_bench: generator failed: $(tail -1 "$tmp/gen.err")" >&2
    out="pps=0 gen_cpu=0"
  fi
  c1=$(cpu_of "$pid")
  local pps gcpu
  pps=$(sed 's/.*pps=\([0-9.]*\).*/\1/' <<<"$out")
  gcpu=$(sed 's/.*gen_cpu=\([0-9.]*\).*/\1/' <<<"$out")
  # the server's CPU over the generator's whole run (0.5 s warm-up + secs)
  awk -v a="$c0" -v b="$c1" -v t="$tick" -v s="$secs" -v p="$pps" -v g="$gcpu" \
    'BEGIN {c = (b - a) / t / (s + 0.5); printf "%s %.2f %s\n", p, c, g}'
}

row() {  # row <label> <results file>
  local pps cores gcpu
  pps=$(awk '{print $1}' "$2" | median)
  cores=$(awk '{print $2}' "$2" | median)
  gcpu=$(awk '{print $3}' "$2" | median)
  awk -v l="$1" -v p="$pps" -v c="$cores" -v g="$gcpu" 'BEGIN {
    printf "%-26s %12.0f %10.2f %14.0f %14.0f %16.4g\n", l, p, c, (c > 0 ? p / c : 0),
      (g > 0 ? p / g : 0), (c > 0 ? p / c * 256 : 0)}'
}

tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

echo "# switch packet rates: one generator thread, window $window, ${secs}s x $runs runs (median)"
printf "%-26s %12s %10s %14s %14s %16s\n" server pkts/s "srv cores" "pkts/s/srv-core" \
  "pkts/s/gen-core" "elems/s/srv-core"

# 1. The do-nothing DPDK forwarder.
for r in $(seq "$runs"); do
  "$bench" fwd --port $port --seconds $((secs + 8)) >"$tmp/fwd.log" 2>&1 &
  fpid=$!
  for _ in $(seq 300); do grep -q ready "$tmp/fwd.log" && break; sleep 0.1; done
  measure $fpid --kind dpdk --data 127.0.0.1:$port >>"$tmp/fwd"
  kill $fpid 2>/dev/null; wait $fpid 2>/dev/null || true
done
row "dpdk forwarder (memif)" "$tmp/fwd"

# 2. The switch over each transport (busy-polling, as the forwarder does; and adaptive for dpdk).
switch_rows() {  # <label> <transport> <switch flags...>
  local label=$1 kind=$2; shift 2
  for r in $(seq "$runs"); do
    "$sml" switch --transport "$kind" --bind 127.0.0.1 --data-port $port --control-port 0 \
      --log-level info "$@" >"$tmp/sw.log" 2>&1 &
    local spid=$!
    local cport=""
    for _ in $(seq 300); do
      cport=$(grep -o 'control port [0-9]*' "$tmp/sw.log" | awk '{print $3}' | head -1 || true)
      [ -n "$cport" ] && break
      sleep 0.1
    done
    measure $spid --kind "$kind" --data 127.0.0.1:$port --control 127.0.0.1:"$cport" \
      >>"$tmp/${label//[^a-z]/_}"
    kill $spid 2>/dev/null; wait $spid 2>/dev/null || true
  done
  row "$label" "$tmp/${label//[^a-z]/_}"
}
switch_rows "switch dpdk (busy-poll)" dpdk --busy-poll
switch_rows "switch dpdk (adaptive)" dpdk
switch_rows "switch udp GSO/GRO" udp --busy-poll
switch_rows "switch udp-plain" udp-plain --busy-poll

fwd=$(awk '{print $1}' "$tmp/fwd" | median)
sw=$(awk '{print $1}' "$tmp/switch_dpdk__busy_poll_" | median)
plain=$(awk '{print $1 / ($2 > 0 ? $2 : 1)}' "$tmp/switch_udp_plain" | median)
dp=$(awk '{print $1 / ($2 > 0 ? $2 : 1)}' "$tmp/switch_dpdk__busy_poll_" | median)
awk -v a="$sw" -v b="$fwd" -v c="$dp" -v d="$plain" 'BEGIN {
  printf "switch over memif / forwarder: %.2f (target >= 0.80)\n", a / b
  printf "dpdk / udp-plain per switch core: %.2f (target >= 4)\n", c / d }'

# 3. switchml run: elements/s over memif and kernel UDP.
echo
echo "# switchml run, $size float32, $runs timed iterations (median)"
for n in 2 4; do
  for kind in dpdk udp; do
    line=$("$sml" run --transport "$kind" --workers "$n" --size "$size" --iterations "$runs" \
      --warmup 1 2>&1 | grep -E 'aggregation time|aggregated elements/s' | tr -s ' ' | tr '\n' ' ')
    echo "workers=$n transport=$kind: $line"
  done
done
