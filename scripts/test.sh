#!/usr/bin/env bash
# Builds switchml and runs every test (unit, scenario, simulation, multi-process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 900
