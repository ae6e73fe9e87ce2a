#!/usr/bin/env bash
# The training proof in the emulated rack of scripts/rack.sh: the software switch in the switch
# namespace, each DDP rank in its own worker namespace behind a tbf-shaped cable, the same
# training (train_digits.py) once with gloo and once with switchml; compares rank 0's loss
# curve, the test accuracy and iterations/s. Needs root (network namespaces); exits 77 where the
# rack cannot be made.
#   rack_digits.sh BUILD_DIR [WORKERS (2)] [EPOCHS (5)] [RATE (1gbit)] [-- TRAIN_DIGITS_FLAGS...]
# e.g. `-- --hidden 2048 --warmup 5` trains a 4.35M-parameter MLP (17 MB of gradients a step).
# For training speed (median step, phases, the bare all-reduce, 4 and 8 workers, the
# communication-bound recommendation model) use rack_train.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

usage="usage: rack_digits.sh BUILD_DIR [WORKERS] [EPOCHS] [RATE] [-- TRAIN_DIGITS_FLAGS...]"
case "${1:-}" in
  -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
    ;;
esac
[ -d "${1:-}" ] || {
  echo "rack_digits: BUILD_DIR '${1:-}' is not a directory" >&2
  echo "$usage" >&2
  exit 2
}
build=$(cd "$1" && pwd)
positional=()
shift
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  positional+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"
workers=${positional[0]:-2} epochs=${positional[1]:-5} rate=${positional[2]:-1gbit}
[[ "$workers" =~ ^[0-9]+$ && "$epochs" =~ ^[0-9]+$ && ${#positional[@]} -le 3 ]] || {
  echo "rack_digits: WORKERS and EPOCHS are whole numbers, then RATE; training flags go after --" >&2
  echo "$usage" >&2
  exit 2
}
if ! PYTHONPATH="$build/python" /usr/bin/python3 -c "import sklearn, switchml.torch" 2>/dev/null; then
  echo "SKIPPED: needs python3-torch, python3-sklearn and the switchml backend built in $build"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rc=0
# Inside the rack, rack_train.sh's launcher runs both trainings (gloo, then switchml).
"$here/../../scripts/rack.sh" run --workers "$workers" --rate "$rate" -- \
  bash "$here/rack_train.sh" --inside "$build" "$workers" train_digits.py "$out" gloo,switchml \
  --epochs "$epochs" "$@" || rc=$?
[ "$rc" = 77 ] && { echo "SKIPPED: the rack cannot be made here (needs root and iproute2)"; exit 77; }
[ "$rc" = 0 ] || exit "$rc"
/usr/bin/python3 - "$out" "$workers" "$rate" <<'PY'
import json, sys
import numpy as np
out, workers, rate = sys.argv[1], sys.argv[2], sys.argv[3]
g, s = (json.load(open(f"{out}/{b}-{workers}.json")) for b in ("gloo", "switchml"))
gap = np.abs(np.array(g["losses"]) - np.array(s["losses"]))
print(f"rack: {workers} workers, {rate} cables, {g.get('parameters', '?')} parameters, "
      f"{g['iterations']} iterations: "
      f"gloo {g['accuracy']:.2f}% {g['iterations_per_s']:.1f} it/s; switchml {s['accuracy']:.2f}% "
      f"{s['iterations_per_s']:.1f} it/s; rank 0's max |loss gap| {gap.max():.2e}, "
      f"accuracy gap {abs(g['accuracy'] - s['accuracy']):.2f} points")
if "step_seconds" in g and "step_seconds" in s:
    gm, sm = np.median(g["step_seconds"]), np.median(s["step_seconds"])
    print(f"RACK_TRAIN workers={workers} rate={rate} parameters={g.get('parameters')} "
          f"gloo_step_s={gm:.5f} switchml_step_s={sm:.5f} gloo_it_s={g['iterations_per_s']:.2f} "
          f"switchml_it_s={s['iterations_per_s']:.2f} "
          f"speedup={s['iterations_per_s'] / g['iterations_per_s']:.3f} "
          f"accuracy_gloo={g['accuracy']:.2f} accuracy_switchml={s['accuracy']:.2f}")
sys.exit(0 if abs(g["accuracy"] - s["accuracy"]) <= 0.5 else 1)
PY
