#!/usr/bin/env bash
# The main job: builds switchml, then runs a local SwitchML job (software switch + worker
# processes on this machine, over shared memory by default: `switchml run --transport auto`),
# verifies every result and prints the throughput.
# Arguments go to `switchml run` (see `build/tools/switchml run --help`); without any, it runs
# 4 workers all-reducing 16M float32 elements.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh switchml
if [ $# -eq 0 ]; then
  set -- --workers 4 --size 16M --dtype float32 --iterations 5
fi
exec "${BUILD_DIR:-build}/tools/switchml" run "$@"
