#!/usr/bin/env bash
# Failover in the emulated server rack (scripts/rack.sh --switch-hosts; docs/deployment.md):
# N workers and K switch servers, each behind its own shaped cable, one job striped over the K
# switches running ITERATIONS verified all-reduces; during all-reduce KILL_AT a `kill -9` of the
# switch on one server. Prints, per rank, whether every result was verified and what the worker
# logged of the move, how long the all-reduce the kill interrupted took against the median of
# the others, and the time from the kill to rank 0's line of that all-reduce (its end, then the
# verification of its result). Needs root. Exits 77 where the rack cannot be made.
#
#   bench/failover.sh BUILD_DIR [--workers 4] [--switch-hosts 4] [--rate 1gbit] [--size 16M]
#                     [--iterations 20] [--kill-at 6] [--victim 2] [--logs DIR]
#
# --size counts float32 elements, as `switchml worker --size`; --victim is the switch server
# (0..K-1) killed; --kill-at the 1-based all-reduce during which it is killed: once the victim's
# cable has carried a few thousand packets of it (its eth0 counters), so mid-way.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--inside" ]; then
  bin=$2 n=$3 size=$4 iterations=$5 kill_at=$6 victim=$7 out=$8
  read -r -a ips <<<"$RACK_WORKER_IPS"
  read -r -a host_ips <<<"$RACK_SWITCH_HOST_IPS"
  read -r -a host_ns <<<"$RACK_SWITCH_HOST_NS"
  switch_pids=()
  trap 'kill "${switch_pids[@]}" 2>/dev/null || true' EXIT
  list=""
  for ((j = 0; j < RACK_SWITCH_HOSTS; j++)); do
    ip netns exec "${host_ns[$j]}" "$bin" switch --bind "${host_ips[$j]}" --log-level warning \
      >"$out/switch-$j.log" 2>&1 &
    switch_pids+=($!)
    list+="${list:+,}${host_ips[$j]}"
  done
  sleep 0.5
  pids=()
  for ((r = 0; r < n; r++)); do
    ip netns exec "$RACK_NAME-w$r" "$bin" worker --switch "$list" --bind "${ips[$r]}" --rank "$r" \
      --workers "$n" --size "$size" --dtype float32 --iterations "$iterations" --warmup 1 \
      --session 9 --report >"$out/w$r.log" 2>&1 &
    pids+=($!)
  done
  # Rank 0 prints a line per all-reduce once it is verified; the next one starts after a barrier
  # and the tensor's fill: the victim is killed once its cable carried packets of it.
  previous="iteration $((kill_at - 1))/"
  [ "$kill_at" -gt 1 ] || previous="warm-up 1/"
  until grep -q "$previous" "$out/w0.log"; do sleep 0.01; done
  rx() { ip netns exec "${host_ns[$victim]}" cat /sys/class/net/eth0/statistics/rx_packets; }
  start=$(rx)
  until [ $(($(rx) - start)) -gt 3000 ]; do sleep 0.002; done
  kill -KILL "${switch_pids[$victim]}"
  killed=$(date +%s.%N)
  lines=$(grep -c "iteration\|warm-up" "$out/w0.log" || true)
  until [ "$(grep -c "iteration\|warm-up" "$out/w0.log" || true)" -gt "$lines" ]; do
    sleep 0.005
    kill -0 "${pids[0]}" 2>/dev/null || break
  done
  next=$(date +%s.%N)
  status=0
  for ((r = 0; r < n; r++)); do
    if wait "${pids[$r]}" && grep -q "^SWITCHML_RESULT rank=$r status=ok verified=1" "$out/w$r.log"
    then
      echo "rank $r: every result verified; $(grep -o 'moved off in [^;]*' "$out/w$r.log" || echo 'no move logged')"
    else
      echo "rank $r: FAILED:"
      tail -5 "$out/w$r.log"
      status=1
    fi
  done
  interrupted=$(grep -o "iteration $kill_at/[0-9]*: [0-9.]*" "$out/w0.log" | awk '{print $3}')
  echo "FAILOVER workers=$n switch_hosts=$RACK_SWITCH_HOSTS rate=$RACK_RATE size=$size" \
    "killed_during=$kill_at interrupted_allreduce_s=$interrupted" \
    "median_s=$(grep -o 'median [0-9.]*' "$out/w0.log" | cut -d' ' -f2)" \
    "kill_to_its_line_s=$(awk -v a="$next" -v b="$killed" 'BEGIN { printf "%.3f", a - b }')" \
    "verified=$([ $status = 0 ] && echo yes || echo no)"
  exit "$status"
fi

case "${1:-}" in
  -h | --help | "")
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ -n "${1:-}" ] && exit 0 || exit 2
    ;;
esac
bin="$(cd "$1" && pwd)/tools/switchml"
shift
[ -x "$bin" ] || { echo "failover: no $bin" >&2; exit 2; }
n=4 k=4 rate=1gbit size=16M iterations=20 kill_at=6 victim=2 logs=""
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "failover: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --workers) n=$2 ;;
    --switch-hosts) k=$2 ;;
    --rate) rate=$2 ;;
    --size) size=$2 ;;
    --iterations) iterations=$2 ;;
    --kill-at) kill_at=$2 ;;
    --victim) victim=$2 ;;
    --logs) logs=$2 ;;
    *) echo "failover: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
[[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 2 ] || { echo "failover: --switch-hosts must be at least 2" >&2; exit 2; }
[[ "$victim" =~ ^[0-9]+$ ]] && [ "$victim" -lt "$k" ] || { echo "failover: --victim must be in 0..$((k - 1))" >&2; exit 2; }
[[ "$kill_at" =~ ^[0-9]+$ ]] && [ "$kill_at" -ge 1 ] && [ "$kill_at" -lt "$iterations" ] ||
  { echo "failover: --kill-at must be in 1..$((iterations - 1))" >&2; exit 2; }
if [ -n "$logs" ]; then
  mkdir -p "$logs"
  out=$(cd "$logs" && pwd)
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
exec "$here/../scripts/rack.sh" run --workers "$n" --switch-hosts "$k" --rate "$rate" -- \
  bash "$0" --inside "$bin" "$n" "$size" "$iterations" "$kill_at" "$victim" "$out"
