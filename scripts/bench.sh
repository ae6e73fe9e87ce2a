#!/usr/bin/env bash
# Puts SwitchML's throughput in context: for each worker count, runs `switchml run` (software
# switch + N worker processes on loopback) and, right after it, Gloo's CPU ring all-reduce over
# loopback TCP with N processes (bench/gloo_allreduce), on the same tensor with the same
# statistics, then prints one table and writes it as JSON. See --help.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench.sh [--help]

Builds `switchml` and the Gloo baseline `gloo_allreduce` into build-bench/ (CMake option
SWITCHML_BUILD_BENCH=ON; installs libgloo-dev and the build packages if missing), then for
every dtype and worker count runs, one after the other on this machine:

  switchml: build-bench/tools/switchml run --workers N --size SIZE --dtype DTYPE
            --iterations ITERATIONS --warmup WARMUP --json FILE
  Gloo:     N build-bench/bench/gloo_allreduce processes (ring all-reduce, SUM, TCP on
            127.0.0.1, rendezvous in a fresh temporary directory)

Both fill the same verifiable input (src/testing/pattern.h), barrier, time one all-reduce,
verify every result after the timer stops, and report per iteration the slowest worker's
time; the median over the timed iterations is t, and elements/s = SIZE / t.
ratio = SwitchML elements/s / Gloo elements/s (> 1: SwitchML is faster).

Prints one table and writes it as JSON to build-bench/bench.json; logs go to
build-bench/bench-logs/.

Environment variables:
  WORKERS          worker counts, space-separated          (default "2 4")
  DTYPE            element types, space-separated: float32 and/or int32  (default float32)
  SIZE             elements per all-reduce, suffix K, M, G = 2^10, 2^20, 2^30  (default 16M)
  ITERATIONS       timed all-reduces per run                (default 5)
  WARMUP           untimed all-reduces before them          (default 1)
  RUN_TIMEOUT      seconds after which one run is killed    (default 900)
  BENCH_BUILD_DIR  build directory                          (default build-bench)
  BUILD_TYPE       CMake build type                         (default RelWithDebInfo)

Example: WORKERS="2 4 8" DTYPE="float32 int32" SIZE=64M scripts/bench.sh
Everything runs on this machine's cores: keep it otherwise idle while it runs.
EOF
}

case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
  "") ;;
  *)
    echo "bench: unexpected argument '$1' (settings are environment variables; see --help)" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/.."

workers_list="${WORKERS:-2 4}"
dtypes="${DTYPE:-float32}"
size="${SIZE:-16M}"
iterations="${ITERATIONS:-5}"
warmup="${WARMUP:-1}"
run_timeout="${RUN_TIMEOUT:-900}"
build_dir="${BENCH_BUILD_DIR:-build-bench}"

die() {
  echo "bench: $*" >&2
  exit 2
}
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# Validate the settings before installing or building anything.
[[ "$size" =~ ^([0-9]+)([KkMmGg]?)$ ]] || die "SIZE must be a number with an optional K, M or G suffix, not '$size'"
case "${BASH_REMATCH[2]}" in
  K | k) elements=$((BASH_REMATCH[1] << 10)) ;;
  M | m) elements=$((BASH_REMATCH[1] << 20)) ;;
  G | g) elements=$((BASH_REMATCH[1] << 30)) ;;
  *) elements=$((10#${BASH_REMATCH[1]})) ;;
esac
[ "$elements" -ge 1 ] || die "SIZE must be at least 1 element"
if ! is_uint "$iterations" || [ "$iterations" -lt 1 ]; then
  die "ITERATIONS must be a positive integer, not '$iterations'"
fi
if ! is_uint "$warmup"; then die "WARMUP must be a non-negative integer, not '$warmup'"; fi
if ! is_uint "$run_timeout" || [ "$run_timeout" -lt 1 ]; then
  die "RUN_TIMEOUT must be a positive integer, not '$run_timeout'"
fi
[ -n "${workers_list// /}" ] || die "WORKERS is empty"
for n in $workers_list; do
  if ! is_uint "$n" || [ "$n" -lt 1 ] || [ "$n" -gt 64 ]; then
    die "WORKERS must list integers in 1..64, not '$n'"
  fi
done
[ -n "${dtypes// /}" ] || die "DTYPE is empty"
for d in $dtypes; do
  if [ "$d" != float32 ] && [ "$d" != int32 ]; then
    die "DTYPE must list float32 and/or int32, not '$d'"
  fi
done

# Install what is missing (idempotent, like scripts/setup.sh), configure and build.
bash scripts/setup.sh
if ! dpkg-query -W -f='${Status}' libgloo-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install libgloo-dev"
    sudo="sudo"
  fi
  echo "bench: installing libgloo-dev"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libgloo-dev
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DSWITCHML_BUILD_BENCH=ON -DSWITCHML_BUILD_TESTS=OFF >/dev/null
ninja -C "$build_dir" switchml gloo_allreduce

switchml="$build_dir/tools/switchml"
gloo="$build_dir/bench/gloo_allreduce"
logs="$build_dir/bench-logs"
mkdir -p "$logs"

# Everything this script starts in the background, and the rendezvous directory in use, are
# cleaned up on any exit.
running_pids=()
rendezvous=""
cleanup() {
  for p in "${running_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -z "$rendezvous" ] || rm -rf "$rendezvous"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Median of the numbers on stdin, one a line (mean of the middle two for an even count).
median() {
  sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) exit 1
    if (NR % 2) printf "%.9g\n", v[(NR + 1) / 2]; else printf "%.9g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# A number field of the one-line JSON `switchml run --json` writes.
json_field() {
  sed -n "s/.*\"$2\": *\([-0-9.eE+]*\).*/\1/p" "$1"
}

# Runs `switchml run`; sets sw_median, sw_min, sw_max.
run_switchml() {
  local n=$1 dtype=$2 tag="switchml-$2-$1w"
  local json="$logs/$tag.json" log="$logs/$tag.log"
  rm -f "$json"
  echo
  echo "bench: SwitchML, $n workers, $size $dtype ($iterations iterations after $warmup warm-up)"
  # All of its output goes to the log; progress and the summary to the terminal too.
  local rc
  set +e
  timeout "$run_timeout" "$switchml" run --workers "$n" --size "$size" --dtype "$dtype" \
    --iterations "$iterations" --warmup "$warmup" --json "$json" 2>&1 | tee "$log" |
    grep --line-buffered -E "warm-up|iteration|FAILED|OK:|tensor aggregation|aggregated elements"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ] || [ ! -s "$json" ]; then
    local why="exit code $rc"
    [ "$rc" -ne 124 ] || why="killed after RUN_TIMEOUT=$run_timeout s"
    echo "bench: FAILED: switchml run ($why); the end of its output, $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  sw_median=$(json_field "$json" median_s)
  sw_min=$(json_field "$json" min_s)
  sw_max=$(json_field "$json" max_s)
}

# Runs the Gloo baseline with n processes; sets gl_median, gl_min, gl_max, gl_times.
run_gloo() {
  local n=$1 dtype=$2 tag="gloo-$2-$1w"
  echo
  echo "bench: Gloo, $n processes, $size $dtype ($iterations iterations after $warmup warm-up)"
  rendezvous=$(mktemp -d "${TMPDIR:-/tmp}/switchml-bench-gloo.XXXXXX")
  running_pids=()
  local r
  for ((r = 0; r < n; r++)); do
    rm -f "$logs/$tag-r$r.out" "$logs/$tag-r$r.err"
    # Rank 0's progress goes to the terminal too; the others only write on failure.
    if [ "$r" -eq 0 ]; then
      timeout "$run_timeout" "$gloo" --rank "$r" --workers "$n" --size "$size" --dtype "$dtype" \
        --iterations "$iterations" --warmup "$warmup" --rendezvous "$rendezvous" --report \
        >"$logs/$tag-r$r.out" 2> >(tee "$logs/$tag-r$r.err" >&2) &
    else
      timeout "$run_timeout" "$gloo" --rank "$r" --workers "$n" --size "$size" --dtype "$dtype" \
        --iterations "$iterations" --warmup "$warmup" --rendezvous "$rendezvous" --report \
        >"$logs/$tag-r$r.out" 2>"$logs/$tag-r$r.err" &
    fi
    running_pids+=($!)
  done
  # Wait for every rank; on the first failure stop the others.
  local failed="" pid rc
  local -a left=("${running_pids[@]}")
  while [ ${#left[@]} -gt 0 ]; do
    rc=0
    wait -n -p pid "${left[@]}" || rc=$?
    local -a still=()
    for p in "${left[@]}"; do [ "$p" = "$pid" ] || still+=("$p"); done
    left=("${still[@]+"${still[@]}"}")
    if [ "$rc" -ne 0 ] && [ -z "$failed" ]; then
      failed="a gloo_allreduce process (pid $pid) exited with code $rc"
      [ "$rc" -ne 124 ] || failed="$failed (killed after RUN_TIMEOUT=$run_timeout s)"
      for p in "${left[@]+"${left[@]}"}"; do kill "$p" 2>/dev/null || true; done
    fi
  done
  running_pids=()
  rm -rf "$rendezvous"
  rendezvous=""
  if [ -n "$failed" ]; then
    echo "bench: FAILED: Gloo baseline, $n processes: $failed; their errors:" >&2
    for ((r = 0; r < n; r++)); do sed "s/^/  rank $r: /" "$logs/$tag-r$r.err" | tail -n 5 >&2; done
    exit 1
  fi
  # Per iteration, the slowest rank's time; then the median over iterations.
  gl_times=$(cat "$logs/$tag"-r*.out | awk -v n="$n" -v iters="$iterations" '
    /^GLOO_RESULT / {
      ok = 0; times = ""
      for (f = 2; f <= NF; f++) {
        eq = index($f, "="); k = substr($f, 1, eq - 1); v = substr($f, eq + 1)
        if (k == "status" && v == "ok") ok = 1
        if (k == "times") times = v
      }
      if (!ok) { bad = 1; next }
      ranks++
      c = split(times, t, ",")
      if (c != iters) bad = 1
      for (i = 1; i <= c; i++) if (!(i in m) || t[i] + 0 > m[i]) m[i] = t[i] + 0
    }
    END {
      if (bad || ranks != n) exit 1
      for (i = 1; i <= iters; i++) print m[i]
    }') || {
    echo "bench: FAILED: Gloo baseline, $n processes: missing or bad GLOO_RESULT lines in $logs/$tag-r*.out" >&2
    exit 1
  }
  gl_median=$(median <<<"$gl_times")
  gl_min=$(sort -g <<<"$gl_times" | head -n 1)
  gl_max=$(sort -g <<<"$gl_times" | tail -n 1)
  echo "bench: Gloo: per-iteration time (slowest rank): $(tr '\n' ' ' <<<"$gl_times")s; median $gl_median s"
}

rows=()
json_rows=()
for dtype in $dtypes; do
  for n in $workers_list; do
    run_switchml "$n" "$dtype"
    run_gloo "$n" "$dtype"
    row=$(awk -v n="$n" -v d="$dtype" -v s="$size" -v e="$elements" -v sm="$sw_median" \
      -v gm="$gl_median" 'BEGIN {
      printf "%7d  %-7s  %5s  %17.4f  %19.3e  %13.4f  %15.3e  %7.3f", n, d, s, sm, e / sm, gm, e / gm, gm / sm }')
    rows+=("$row")
    json_rows+=("$(awk -v n="$n" -v d="$dtype" -v e="$elements" -v it="$iterations" -v w="$warmup" \
      -v sm="$sw_median" -v smin="$sw_min" -v smax="$sw_max" \
      -v gm="$gl_median" -v gmin="$gl_min" -v gmax="$gl_max" 'BEGIN {
      printf "{\"workers\": %d, \"dtype\": \"%s\", \"size\": %d, \"iterations\": %d, \"warmup\": %d, ", n, d, e, it, w
      printf "\"switchml_median_s\": %.6g, \"switchml_min_s\": %.6g, \"switchml_max_s\": %.6g, ", sm, smin, smax
      printf "\"switchml_elements_per_s\": %.6g, ", e / sm
      printf "\"gloo_median_s\": %.6g, \"gloo_min_s\": %.6g, \"gloo_max_s\": %.6g, ", gm, gmin, gmax
      printf "\"gloo_elements_per_s\": %.6g, \"ratio\": %.6g}", e / gm, gm / sm }')")
  done
done

echo
echo "bench: $size elements ($elements) per all-reduce, median of $iterations iterations after $warmup warm-up," \
  "slowest worker per iteration; every result verified"
echo "bench: ratio = SwitchML elements/s / Gloo elements/s"
echo
printf "%7s  %-7s  %5s  %17s  %19s  %13s  %15s  %7s\n" workers dtype size "SwitchML median s" \
  "SwitchML elements/s" "Gloo median s" "Gloo elements/s" ratio
for row in "${rows[@]}"; do echo "$row"; done

json="$build_dir/bench.json"
{
  echo "{\"benchmark\": \"switchml run vs gloo ring allreduce (TCP loopback)\", \"host_cpus\": $(nproc), \"results\": ["
  for i in "${!json_rows[@]}"; do
    sep=","
    [ "$i" -eq $((${#json_rows[@]} - 1)) ] && sep=""
    echo "  ${json_rows[$i]}$sep"
  done
  echo "]}"
} >"$json.tmp"
mv "$json.tmp" "$json"
echo
echo "bench: wrote $json"
