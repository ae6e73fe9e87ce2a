#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang-14 with ASan + UBSan) and runs each for a while,
# starting from the committed seed corpora (fuzz/corpus/<target>/; never modified: new inputs go
# to a scratch corpus). Fails on the first crash, sanitizer report or broken invariant, leaving
# the input in $FUZZ_OUT/<target>/ (reproduce: build-fuzz/fuzz/<target> <that file>).
#
#   bash scripts/fuzz.sh                  # CI: 10 s per target
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh # a long run: 10 minutes per target
#   FUZZ_TARGETS="switch_fuzz" bash scripts/fuzz.sh
#
# Takes no arguments. Environment: FUZZ_SECONDS (10), FUZZ_TARGETS (all), FUZZ_BUILD_DIR
# (build-fuzz), FUZZ_OUT (a temporary directory), BUILD_JOBS (2, ninja's -j).
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in
  "") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "fuzz: unexpected argument '$1': it takes none, see --help for its environment" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
bash scripts/setup.sh
seconds="${FUZZ_SECONDS:-10}"
targets="${FUZZ_TARGETS:-codec_fuzz switch_fuzz session_fuzz registry_fuzz control_fuzz frame_fuzz shm_ring_fuzz}"
build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
out="${FUZZ_OUT:-$(mktemp -d /tmp/switchml-fuzz.XXXXXX)}"

CXX=clang++-14 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSWITCHML_FUZZ=ON -DSWITCHML_SANITIZE=address,undefined -DSWITCHML_BUILD_TESTS=OFF \
  -DSWITCHML_BUILD_PYTHON=OFF -DSWITCHML_BUILD_TORCH=OFF >/dev/null
# shellcheck disable=SC2086
ninja -C "$build_dir" -j "${BUILD_JOBS:-2}" $targets

status=0
for t in $targets; do
  mkdir -p "$out/$t/corpus"
  log="$out/$t/log"
  echo "fuzz: $t for ${seconds}s (seeds fuzz/corpus/$t, scratch $out/$t)"
  if ! "$build_dir/fuzz/$t" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/$t/" \
      "$out/$t/corpus" "fuzz/corpus/$t" >"$log" 2>&1; then
    echo "fuzz: $t FAILED; log $log, inputs:" >&2
    ls "$out/$t"/crash-* "$out/$t"/leak-* "$out/$t"/timeout-* "$out/$t"/oom-* 2>/dev/null >&2 || true
    tail -30 "$log" >&2
    status=1
    continue
  fi
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  echo "fuzz: $t ok: ${execs:-?} executions, corpus $(ls "$out/$t/corpus" | wc -l) inputs"
done
exit $status
