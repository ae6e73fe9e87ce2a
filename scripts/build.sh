#!/usr/bin/env bash
# Installs what is missing, then configures and builds switchml into build/ (or $BUILD_DIR).
# Extra CMake options in $CMAKE_ARGS (e.g. -DSWITCHML_SANITIZE=thread); targets as arguments
# (they go to ninja: `scripts/build.sh switchml`); BUILD_TYPE is the CMake build type
# (default RelWithDebInfo).
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  ${CMAKE_ARGS:-} >/dev/null
ninja -C "$build_dir" "$@"
