#!/usr/bin/env bash
# DDP training steps on one host: gloo, switchml over kernel UDP and switchml over shared memory,
# in one run, each with its own switch where it needs one; prints the median step of each and its
# speed-up over gloo, and writes every run's JSON to --out-dir. Backends: gloo, udp and shm
# (switchml with SWITCHML_TRANSPORT set so, against a switch of that transport), auto (switchml
# with the backend's defaults against a shm switch with its defaults, as a user who starts
# `switchml switch --transport shm` and sets nothing gets it: transport and packet size auto, so
# shm and 2048 elements per packet). The table names the transport and packet size each run
# opened.
#
#   examples/torch/host_train.sh BUILD_DIR [--workers 2,4] [--script train_dnn.py]
#       [--backends gloo,udp,shm] [--out-dir DIR] [-- TRAINING_ARGS...]
#
# BUILD_DIR: the build with tools/switchml and python/ (scripts/build.sh's build). The training
# script runs as `workers` processes on this host (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as
# torchrun sets them); TRAINING_ARGS go to it
# (e.g. -- --model vgg16 --steps 10). The switch's environment (SWITCHML_SPARSE and the rest)
# reaches the workers. Exit status: non-zero when any run failed, naming it.
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
BUILD=$(cd "$1" && pwd)
shift
WORKERS=2,4
SCRIPT=train_dnn.py
BACKENDS=gloo,udp,shm
OUT_DIR=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workers) WORKERS=$2; shift 2 ;;
    --script) SCRIPT=$2; shift 2 ;;
    --backends) BACKENDS=$2; shift 2 ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "host_train.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
SWITCHML="$BUILD/tools/switchml"
PY=/usr/bin/python3
[[ -x "$SWITCHML" ]] || { echo "host_train.sh: $SWITCHML not found: build first" >&2; exit 1; }
[[ -f "$HERE/$SCRIPT" ]] || { echo "host_train.sh: no script $HERE/$SCRIPT" >&2; exit 2; }
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/host-train.XXXXXX)}
mkdir -p "$OUT_DIR"
SHM_DIR=$(mktemp -d /dev/shm/switchml-hosttrain.XXXXXX)
chmod 700 "$SHM_DIR"
SWITCH_PID=
cleanup() {
  [[ -n "$SWITCH_PID" ]] && kill "$SWITCH_PID" 2>/dev/null && wait "$SWITCH_PID" 2>/dev/null
  rm -rf "$SHM_DIR"
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts a switch with transport $1 on a free control port; sets SWITCH_PORT.
start_switch() {
  SWITCH_PORT=$(free_port)
  local data_port
  data_port=$(free_port)
  SWITCHML_SHM_DIR="$SHM_DIR" "$SWITCHML" switch --transport "$1" --bind 127.0.0.1 \
    --control-port "$SWITCH_PORT" --data-port "$data_port" >"$OUT_DIR/switch-$1.log" 2>&1 &
  SWITCH_PID=$!
  for _ in $(seq 100); do
    if "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1',$SWITCH_PORT),0.2)" 2>/dev/null; then
      return 0
    fi
    kill -0 "$SWITCH_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "host_train.sh: the $1 switch did not start (log: $OUT_DIR/switch-$1.log)" >&2
  cat "$OUT_DIR/switch-$1.log" >&2
  exit 1
}
stop_switch() { kill "$SWITCH_PID" 2>/dev/null; wait "$SWITCH_PID" 2>/dev/null || true; SWITCH_PID=; }

failed=0
IFS=, read -ra WS <<<"$WORKERS"
IFS=, read -ra BS <<<"$BACKENDS"
for w in "${WS[@]}"; do
  for b in "${BS[@]}"; do
    out="$OUT_DIR/w$w-$b.json"
    env=(PYTHONPATH="$BUILD/python:$HERE" SWITCHML_SHM_DIR="$SHM_DIR")
    backend=switchml
    case "$b" in
      gloo) backend=gloo ;;
      udp|shm) start_switch "$b"
               env+=(SWITCHML_SWITCH="127.0.0.1:$SWITCH_PORT" SWITCHML_TRANSPORT="$b") ;;
      auto) start_switch shm
            env+=(SWITCHML_SWITCH="127.0.0.1:$SWITCH_PORT") ;;
      *) echo "host_train.sh: unknown backend '$b' (use gloo, udp, shm, auto)" >&2; exit 2 ;;
    esac
    echo "== $w workers, $b" >&2
    # One process per rank, as torchrun would start them (its Debian build's agent fails here).
    master_port=$(free_port)
    pids=()
    for ((r = 0; r < w; r++)); do
      env "${env[@]}" RANK=$r WORLD_SIZE="$w" LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$master_port" OMP_NUM_THREADS=1 "$PY" "$HERE/$SCRIPT" \
        --backend "$backend" --out "$out" "$@" >"$OUT_DIR/w$w-$b-$r.log" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < w; r++)); do
      if ! wait "${pids[$r]}"; then
        echo "host_train.sh: $w workers, $b: rank $r failed (log: $OUT_DIR/w$w-$b-$r.log):" >&2
        tail -20 "$OUT_DIR/w$w-$b-$r.log" >&2
        failed=1
      fi
    done
    [[ -n "$SWITCH_PID" ]] && stop_switch
  done
done

"$PY" - "$OUT_DIR" "$WORKERS" "$BACKENDS" <<'EOF'
import json, os, statistics, sys
out_dir, workers, backends = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
print(f"{'workers':>7s} {'backend':>8s} {'median step':>12s} {'vs gloo':>8s} {'final loss':>11s} "
      f"{'transport':>9s} {'numel':>5s}")
for w in workers:
    base = None
    for b in backends:
        path = os.path.join(out_dir, f"w{w}-{b}.json")
        if not os.path.exists(path):
            print(f"{w:>7s} {b:>8s} {'failed':>12s}")
            continue
        r = json.load(open(path))
        med = statistics.median(r["step_seconds"])
        if b == "gloo":
            base = med
        ratio = f"{base / med:7.2f}x" if base else "      -"
        loss = r.get("losses", [float("nan")])[-1]
        transport = r.get("switchml", {}).get("transport", "-")  # the one the backend opened
        numel = str(r.get("switchml", {}).get("packet_numel", "-"))  # and its packet size
        print(f"{w:>7s} {b:>8s} {med:11.4f}s {ratio:>8s} {loss:11.6g} {transport:>9s} {numel:>5s}")
print(f"(runs in {out_dir})")
EOF
exit $failed
