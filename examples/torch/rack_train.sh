#!/usr/bin/env bash
# Training speed in the emulated rack of scripts/rack.sh, gloo against switchml: for each worker
# count, one rack (the software switch in the switch namespace, each DDP rank in its own worker
# namespace behind a tbf-shaped cable), the same training run once with gloo and once with
# switchml (same seeds, same data); then the median step time of each (the slowest rank's, after
# warm-up), the speed-up, where the step's time went, the bare all-reduce of the same gradients,
# the test accuracy and rank 0's loss curves. Needs root (network namespaces); exits 77 where the
# rack cannot be made.
#
#   rack_train.sh BUILD_DIR [--workers 4,8] [--rate 1gbit] [--script train_rec.py]
#                 [--json FILE] [--plot FILE.png] [--backends gloo,switchml] [--logs DIR]
#                 [--multicast auto|on|off] [--switch-hosts K|n] [--rack-name NAME]
#                 [-- TRAINING_SCRIPT_FLAGS...]
#
# --rack-name: the racks' namespace prefix (scripts/rack.sh --name; default rack.sh's own,
# smlrack<pid>); one rack per worker count, so NAME gets the worker count appended.
#
# --switch-hosts: the server rack (scripts/rack.sh --switch-hosts; docs/deployment.md): K
# switch servers (n: as many as the workers), each behind its own cable, a `switchml switch` on
# each and switchml's job striped over them (SWITCHML_SWITCH=h1,h2,...). Default 0: one software
# switch on the bridge, as a switch ASIC.
#
# --multicast: switchml's results (SWITCHML_MULTICAST, as `switchml worker --multicast`): auto
# (the default) one datagram per worker from the switch, as the workers are on other hosts; on:
# LAN multicast, each result sent once to the job's group and replicated by the rack's bridge
# (the switch is bound to the bridge's address, as bench.py's switchml-mcast); off: never.
#
# Packet size: the switches take up to 2048 elements per packet (`switchml switch`'s default over
# udp) and the ranks choose the largest the switch and the rack's MTU allow (the backend's
# default, SWITCHML_PACKET_NUMEL=auto: 2048 with the rack's MTU of 9000; docs/protocol.md 2.6).
# SWITCHML_PACKET_NUMEL in the environment (64, 256, 512, 1024 or 2048) reaches the ranks.
#
# --script: train_rec.py (default; the communication-bound recommendation model),
# train_digits.py (the compute-bound MLP; e.g. `-- --hidden 2048 --epochs 1 --warmup 5`) or
# train_dnn.py (DDP steps of ResNet-50, VGG-16 or BERT-base shapes: `-- --model vgg16`).
# --backends: run only these (e.g. one, under perf); the comparison needs both. --logs DIR: keep
# every rank's output and results there (e.g. with `-- --profile 5`: rank 0's torch.profiler table). Prints one
# RACK_TRAIN line per worker count; fails when a run fails or the two backends'
# accuracies differ by more than 0.5 points. docs/python.md has the measured figures.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# Run by rack.sh inside the rack (RACK_* in the environment); rack_digits.sh uses it too:
#   --inside BUILD WORKERS SCRIPT OUT BACKENDS [FLAGS...]
# writes OUT/BACKEND-WORKERS.json (rank 0's results) and OUT/BACKEND-WORKERS-RANK.log.
if [ "${1:-}" = "--inside" ]; then
  build=$2 workers=$3 script=$4 out=$5 backends=$6
  shift 6
  switch_pids=()
  trap 'kill "${switch_pids[@]}" 2>/dev/null || true' EXIT
  switches=""
  if [ "${RACK_SWITCH_HOSTS:-0}" -gt 0 ]; then
    # The server rack: a switch on each switch server, the job striped over them.
    read -r -a host_ips <<<"$RACK_SWITCH_HOST_IPS"
    read -r -a host_ns <<<"$RACK_SWITCH_HOST_NS"
    for ((j = 0; j < RACK_SWITCH_HOSTS; j++)); do
      ip netns exec "${host_ns[$j]}" "$build/tools/switchml" switch --bind "${host_ips[$j]}" \
        --log-level warning >"$out/switch-$workers-$j.log" 2>&1 &
      switch_pids+=($!)
      switches+="${switches:+,}${host_ips[$j]}:50099"
    done
  else
    ip netns exec "$RACK_SWITCH_NS" "$build/tools/switchml" switch --bind "$RACK_SWITCH_IP" \
      --log-level warning >"$out/switch-$workers.log" 2>&1 &
    switch_pids+=($!)
    switches="$RACK_SWITCH_IP:50099"
  fi
  read -r -a ips <<<"$RACK_WORKER_IPS"
  port=29500
  for backend in ${backends//,/ }; do
    port=$((port + 1))
    pids=()
    for ((r = 0; r < workers; r++)); do
      ip netns exec "$RACK_NAME-w$r" env PYTHONPATH="$build/python" RANK=$r \
        WORLD_SIZE="$workers" MASTER_ADDR="${ips[0]}" MASTER_PORT=$port GLOO_SOCKET_IFNAME=eth0 \
        SWITCHML_SWITCH="$switches" SWITCHML_MULTICAST="${SWITCHML_MULTICAST:-auto}" \
        /usr/bin/python3 "$here/$script" \
        --backend "$backend" --out "$out/$backend-$workers.json" "$@" \
        >"$out/$backend-$workers-$r.log" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < workers; r++)); do
      wait "${pids[$r]}" || {
        echo "FAIL: $backend rank $r:"
        tail -20 "$out/$backend-$workers-$r.log"
        exit 1
      }
    done
    grep -h "^$backend:" "$out/$backend-$workers-0.log" || true
  done
  exit 0
fi

usage="usage: rack_train.sh BUILD_DIR [--workers N[,N...]] [--rate R] [--script S] [--json F] [--plot F] [--backends B[,B]] [--logs DIR] [--multicast auto|on|off] [--switch-hosts K|n] [--rack-name NAME] [-- FLAGS...]"
case "${1:-}" in
  -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
    ;;
esac
[ -d "${1:-}" ] || {
  echo "rack_train: BUILD_DIR '${1:-}' is not a directory" >&2
  echo "$usage" >&2
  exit 2
}
build=$(cd "$1" && pwd)
shift
workers_list=4 rate=1gbit script=train_rec.py json="" plot="" backends=gloo,switchml logs=""
multicast=auto switch_hosts=0 rack_name=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  if [ $# -lt 2 ] || [[ "$2" == --* ]]; then
    echo "rack_train: $1 needs a value" >&2
    echo "$usage" >&2
    exit 2
  fi
  case "$1" in
    --workers) workers_list=$2 ;;
    --rate) rate=$2 ;;
    --script) script=$2 ;;
    --json) json=$2 ;;
    --plot) plot=$2 ;;
    --backends) backends=$2 ;;
    --logs) logs=$2 ;;
    --multicast) multicast=$2 ;;
    --switch-hosts) switch_hosts=$2 ;;
    --rack-name) rack_name=$2 ;;
    *)
      echo "rack_train: unknown option '$1'" >&2
      echo "$usage" >&2
      exit 2
      ;;
  esac
  shift 2
done
[ $# -gt 0 ] && shift  # the "--"
case "$multicast" in
  auto | on | off) ;;
  *)
    echo "rack_train: --multicast must be auto, on or off, not '$multicast'" >&2
    exit 2
    ;;
esac
[[ "$switch_hosts" =~ ^([0-9]+|n)$ ]] || {
  echo "rack_train: --switch-hosts must be a number or n, not '$switch_hosts'" >&2
  exit 2
}
# Read by --inside (below, through rack.sh) for the switchml runs' workers.
export SWITCHML_MULTICAST=$multicast
[ -f "$here/$script" ] || {
  echo "rack_train: no training script $here/$script" >&2
  exit 2
}
if ! PYTHONPATH="$build/python" /usr/bin/python3 -c "import switchml.torch" 2>/dev/null; then
  echo "SKIPPED: needs python3-torch and the switchml backend built in $build"
  exit 77
fi
[ -x "$build/tools/switchml" ] || {
  echo "rack_train: no $build/tools/switchml" >&2
  exit 2
}
if [ -n "$logs" ]; then
  mkdir -p "$logs"
  out=$(cd "$logs" && pwd)
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
IFS=, read -r -a counts <<<"$workers_list"
for workers in "${counts[@]}"; do
  rc=0
  hosts=$switch_hosts
  [ "$hosts" = n ] && hosts=$workers
  name_args=()
  [ -n "$rack_name" ] && name_args=(--name "$rack_name$workers")
  "$here/../../scripts/rack.sh" run "${name_args[@]}" --workers "$workers" --rate "$rate" \
    --switch-hosts "$hosts" -- \
    bash "$0" --inside "$build" "$workers" "$script" "$out" "$backends" "$@" || rc=$?
  [ "$rc" = 77 ] && {
    echo "SKIPPED: the rack cannot be made here (needs root and iproute2)"
    exit 77
  }
  [ "$rc" = 0 ] || exit "$rc"
done
[ "$backends" = gloo,switchml ] || exit 0  # one backend (e.g. for profiling): no comparison
/usr/bin/python3 "$here/rack_report.py" "$out" "$workers_list" "$rate" "$script" "$json" "$plot" \
  "$multicast" "$switch_hosts"
