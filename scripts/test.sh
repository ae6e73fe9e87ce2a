#!/usr/bin/env bash
# Builds switchml and runs every test (unit, scenario, simulation, multi-process).
#
# With CI=true (or SANITIZERS=1) it then also runs, each in a build directory of its own:
#   - the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan; without
#     the Python and PyTorch bindings, which would need the sanitizer runtime preloaded into
#     python3, without the soak, whose timing checks mean nothing under ASan, and without
#     install_test, whose example program is built without the sanitizer runtime);
#   - the tests with threads of their own under ThreadSanitizer (build-tsan): the transports,
#     the control plane (registry, gRPC server and client, TLS), the worker library in one
#     process, and the multi-process tests (one switch, two levels, failures), whose switch and
#     worker processes are the TSan build too (a report in any of them fails its test);
#   - each libFuzzer target for a few seconds from its seed corpus (scripts/fuzz.sh).
# Any sanitizer report fails the test that produced it.
#
# Takes no arguments. Environment: BUILD_DIR (build), BUILD_TYPE (RelWithDebInfo), TEST_JOBS (2),
# CI, SANITIZERS, FUZZ_SECONDS (10).
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in
  "") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "test.sh: unexpected argument '$1': it takes none (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 900)

if [ "${CI:-}" != "true" ] && [ "${SANITIZERS:-0}" != "1" ]; then
  exit 0
fi

sanitizer_build="-DSWITCHML_BUILD_PYTHON=OFF -DSWITCHML_BUILD_TORCH=OFF -DSWITCHML_BUILD_BENCH=OFF"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
# gRPC, absl and protobuf come uninstrumented from Debian: TSan would see their accesses only
# through its interceptors (epoll, memmove) and miss their own synchronization, and report races
# inside them; ignore_noninstrumented_modules keeps it to accesses from our (instrumented) code.
# Our sources that include gRPC's headers are built without TSan for the same reason
# (src/control/CMakeLists.txt); tests/tsan.supp may list library frames only.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1"
export TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$PWD/tests/tsan.supp"

echo "test.sh: the suite under ASan + UBSan"
BUILD_DIR=build-asan CMAKE_ARGS="-DSWITCHML_SANITIZE=address,undefined $sanitizer_build" \
  bash scripts/build.sh
(cd build-asan && ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 900 -E '^(soak_test|install_test)$')

echo "test.sh: the threaded tests under TSan"
tsan_start=$(date +%s)
# The tests with threads of their own (those of them this tree has).
wanted=(transport_udp_test transport_memory_test transport_factory_test
  transport_conformance_test registry_test
  control_session_test control_sync_test control_tls_test control_listener_test
  runtime_uplink_test context_test multiprocess_test hierarchy_multiprocess_test
  failure_multiprocess_test abuse_multiprocess_test transport_auth_test auth_data_test
  striping_multiprocess_test control_status_test)
BUILD_DIR=build-tsan CMAKE_ARGS="-DSWITCHML_SANITIZE=thread $sanitizer_build" \
  bash scripts/build.sh -t targets all >/dev/null
# The target list is read once: `ninja ... | grep -q` under pipefail failed whenever grep's
# early exit cut ninja's long listing short (SIGPIPE), and dropped that test without a word.
targets="$(ninja -C build-tsan -t targets all)"
tsan_tests=()
for t in "${wanted[@]}"; do
  if grep -q "^$t:" <<<"$targets"; then
    tsan_tests+=("$t")
  else
    echo "test.sh: $t is not in this tree: not run under TSan"
  fi
done
ninja -C build-tsan switchml "${tsan_tests[@]}"
(cd build-tsan && ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 900 \
  -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$")
echo "test.sh: TSan phase (build and ${#tsan_tests[@]} tests) took $(( $(date +%s) - tsan_start )) s"

echo "test.sh: fuzzing, a few seconds per target"
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash scripts/fuzz.sh
