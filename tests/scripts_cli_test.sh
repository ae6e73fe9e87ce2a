#!/usr/bin/env bash
# The scripts in scripts/, bench/ and examples/torch/ (the rack ones) answer --help without doing
# anything else, and refuse bad arguments with exit 2 and a message naming what to fix, before
# they build, install, format, fuzz or start a process (several of them used to treat --help as
# a target or ignore it and build, run the suite or reformat the tree). Each case is bounded by `timeout`; nothing here
# needs root or builds anything.
# Usage: scripts_cli_test.sh PATH_TO_SWITCHML
set -uo pipefail
bin="$(readlink -f "$1")"
root="$(cd "$(dirname "$0")/.." && pwd)"
py=/usr/bin/python3
failed=0
scratch=$(mktemp -d /tmp/switchml-scripts-cli.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
# check WANT_RC "TEXT THE OUTPUT HOLDS" COMMAND...
check() {
  local want_rc="$1" want="$2"
  shift 2
  local out rc
  out=$(cd "$scratch" && timeout 20 "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want_rc" ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL: $*: exit $rc (want $want_rc), output (want '$want'):"
    echo "$out" | head -5
    failed=1
  else
    echo "ok: $*: exit $rc: $(echo "$out" | grep -v '^$' | head -1)"
  fi
}
s="$root/scripts"
check 0 "runs every test" bash "$s/test.sh" --help
check 2 "test.sh: unexpected argument '--bogus'" bash "$s/test.sh" --bogus
check 0 "configures and builds switchml" bash "$s/build.sh" --help
check 0 "only reports files" bash "$s/format.sh" -h
check 2 "format: unknown argument '--fix'" bash "$s/format.sh" --fix
check 2 "format: one argument at most" bash "$s/format.sh" --check --check
check 0 "FUZZ_SECONDS" bash "$s/fuzz.sh" --help
check 2 "fuzz: unexpected argument '10'" bash "$s/fuzz.sh" 10
check 0 "Installs the Debian 12 packages" bash "$s/setup.sh" --help
check 2 "setup: unexpected argument '-y'" bash "$s/setup.sh" -y
check 0 "Commands:" bash "$s/rack.sh" --help
# A flag without its value: bash's ${2:?} said "line 106: 2: --workers needs a value", exit 1.
check 2 "rack: --workers needs a value" bash "$s/rack.sh" up --workers
check 2 "rack: --name needs a value" bash "$s/rack.sh" down --name --workers 2
check 2 "rack: --workers must be an integer in 1..64, not '0'" bash "$s/rack.sh" up --workers 0
# soak.py ran every one of these: a 0 or negative --seconds and 0 jobs or workers reported a
# FAIL about switch memory, a --loss the switch refuses waited for the workers' setup timeout,
# a missing binary ended in a Python traceback.
soak=("$py" "$s/soak.py" --switchml "$bin")
check 0 "--rss-slack-mib" "${soak[@]}" --help
check 2 "--seconds must be positive, not -1" "${soak[@]}" --seconds -1
check 2 "--jobs must be in 1..1000, not 0" "${soak[@]}" --jobs 0
check 2 "--workers must be in 1..64, not 0" "${soak[@]}" --workers 0
check 2 "--loss must be in [0, 1)" "${soak[@]}" --loss 2
check 2 "--switchml /nonexistent/switchml is not an executable file" \
  "$py" "$s/soak.py" --switchml /nonexistent/switchml
# sim_experiments.py ran the experiments before a misspelt one in --only stopped it (exit 1), and
# a --binary that does not exist ended in a traceback.
check 2 "--only: unknown experiment 'bogus'" \
  "$py" "$s/sim_experiments.py" --binary "$bin" --only scaling,bogus
check 2 "no switchml binary at /nonexistent/switchml" \
  "$py" "$s/sim_experiments.py" --binary /nonexistent/switchml
# bench.py made its --out directory before refusing its arguments.
check 2 "--workers must be in 1..64" "$py" "$root/bench/bench.py" --out "$scratch/out" --workers 0
if [ -e "$scratch/out" ]; then
  echo "FAIL: bench.py made --out $scratch/out for a run it refused"
  failed=1
fi
# The rack training examples: --help exited 2 without a word (it was taken as BUILD_DIR), a flag
# without its value died on `set -u`, a misplaced training flag reached rack.sh.
e="$root/examples/torch"
build="$(dirname "$(dirname "$bin")")"
check 0 "Training speed in the emulated rack" bash "$e/rack_train.sh" --help
check 2 "rack_train: BUILD_DIR '/nonexistent/build' is not a directory" \
  bash "$e/rack_train.sh" /nonexistent/build
check 2 "rack_train: --workers needs a value" bash "$e/rack_train.sh" "$build" --workers
check 2 "rack_train: unknown option '--steps'" bash "$e/rack_train.sh" "$build" --steps 3
check 0 "The training proof in the emulated rack" bash "$e/rack_digits.sh" -h
check 2 "rack_digits: WORKERS and EPOCHS are whole numbers" \
  bash "$e/rack_digits.sh" "$build" --workers 4
exit $failed
