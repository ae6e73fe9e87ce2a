#!/usr/bin/env bash
# All-reduce side by side: builds switchml and the baselines (Gloo ring and halving-doubling,
# Open MPI) into build-bench/ and runs bench/bench.py, which measures them one after another on
# loopback and in the emulated rack (scripts/rack.sh) and writes JSON, a Markdown table and PNG
# plots. See --help and docs/benchmarks.md.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench.sh [bench.py flags]

Installs what is missing (scripts/setup.sh's packages, plus libgloo-dev, libopenmpi-dev,
openmpi-bin and python3-matplotlib), builds `switchml`, `gloo_allreduce` and `mpi_allreduce`
into build-bench/ (CMake option SWITCHML_BUILD_BENCH=ON), then runs
/usr/bin/python3 bench/bench.py with the flags given here. For each setting (loopback; the
emulated rack at a rate), worker count and size it runs switchml, Gloo ring, Gloo
halving-doubling, Open MPI over TCP and (loopback only) Open MPI over shared memory on the same
verified tensors. Results: build-bench/bench-results/ (bench.json, bench.md, bench-*.png,
logs/). The rack needs root; without it the rack setting is reported as skipped.

Examples:
  scripts/bench.sh                                   # the defaults below
  scripts/bench.sh --settings rack:1gbit --workers 4,8 --sizes 64M
  scripts/bench.sh --settings loopback,rack:1gbit,rack:10gbit --docs-dir docs/bench
  scripts/bench.sh --settings loopback --workers 2 --sizes 1M,4M --iterations 3  # a smoke run

Environment: BENCH_BUILD_DIR (default build-bench), BUILD_TYPE (default RelWithDebInfo).
Everything runs on this machine's cores: keep it otherwise idle while it runs.

bench.py's flags:
EOF
  /usr/bin/python3 bench/bench.py --help | sed -n '/^options:/,$p'
}

cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
esac
# A bad flag fails now (exit 2, naming it), not after the installs and the build.
/usr/bin/python3 bench/bench.py --check-args "$@"

build_dir="${BENCH_BUILD_DIR:-build-bench}"
export BENCH_BUILD_DIR="$build_dir"

# Install what is missing (idempotent, like scripts/setup.sh), configure and build.
bash scripts/setup.sh
bench_packages=(libgloo-dev libopenmpi-dev openmpi-bin python3-matplotlib)
missing=()
for p in "${bench_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "bench: need root (or sudo) to install ${missing[*]}" >&2; exit 2; }
    sudo="sudo"
  fi
  echo "bench: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DSWITCHML_BUILD_BENCH=ON -DSWITCHML_BUILD_TESTS=OFF >/dev/null
targets=(switchml gloo_allreduce mpi_allreduce)
for arg in "$@"; do
  case "$arg" in --ddp | --ddp=*) targets+=(switchml_python_core switchml_torch) ;; esac
done
ninja -C "$build_dir" "${targets[@]}"

exec /usr/bin/python3 bench/bench.py "$@"
