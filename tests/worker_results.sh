# Sourced by the rack tests (rack_test.sh, rack_multicast_test.sh, server_rack_test.sh).
#
# check_worker LABEL RANK PID OUTPUT: waits for worker RANK's process PID and checks that OUTPUT
# (its stdout and stderr, `switchml worker --report`) holds a verified result. Prints "ok" with
# the worker's median line, or FAIL, why and the whole output and then returns 1.
check_worker() {
  local label=$1 r=$2 pid=$3 out=$4
  if ! wait "$pid"; then
    echo "FAIL: $label: worker $r exited with an error:"
    cat "$out"
    return 1
  fi
  if ! grep -q "^SWITCHML_RESULT rank=$r status=ok verified=1" "$out"; then
    echo "FAIL: $label: worker $r reported no verified result:"
    cat "$out"
    return 1
  fi
  echo "ok: $label: worker $r: $(grep -o 'median .*' "$out" || grep '^SWITCHML_RESULT' "$out")"
}
