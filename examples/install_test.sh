#!/usr/bin/env bash
# Installs a switchml build tree into a temporary prefix and checks what an embedding program
# sees there: every public header compiles alone (C++17 and C++20) and defines only SWITCHML_
# macros; examples/allreduce builds with find_package(switchml) and with pkg-config and runs
# against a switch; the Python module imports from the installed tree.
#   install_test.sh BUILD_DIR SWITCHML_BINARY
set -euo pipefail
build=$(cd "$1" && pwd)
switch_bin=$2
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
switch_pid=""
cleanup() {
  if [ -n "$switch_pid" ]; then kill "$switch_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
echo "installed into $prefix"

# Public headers: self-contained, only public includes, and no macro without the project's
# prefix (beyond those of the standard headers they include).
grep -h '^#include <' "$prefix"/include/switchml/*.h | grep -v '<switchml/' | sort -u >"$tmp/std.h"
g++ -std=c++17 -dM -E -x c++ "$tmp/std.h" | awk '{print $2}' | sed 's/(.*//' | sort -u >"$tmp/base.txt"
for h in "$prefix"/include/switchml/*.h; do
  for std in c++17 c++20; do
    echo "#include <switchml/$(basename "$h")>" | g++ -std=$std -fsyntax-only -x c++ -I"$prefix/include" -
  done
  if grep -n '#include "' "$h" | grep -v '"switchml/'; then
    echo "FAIL: $(basename "$h") includes a non-public header"
    exit 1
  fi
  g++ -std=c++17 -dM -E -x c++ -I"$prefix/include" "$h" | awk '{print $2}' | sed 's/(.*//' |
    sort -u | comm -23 - "$tmp/base.txt" | { grep -v '^SWITCHML_' || true; } >"$tmp/bad.txt"
  if [ -s "$tmp/bad.txt" ]; then
    echo "FAIL: $(basename "$h") defines macros without the SWITCHML_ prefix:"
    cat "$tmp/bad.txt"
    exit 1
  fi
done
echo "public headers: self-contained, only SWITCHML_ macros"

# The example, with find_package and with pkg-config.
cmake -S "$src/examples/allreduce" -B "$tmp/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
ninja -C "$tmp/example" >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
static=$(grep -q 'Requires.private: ' "$prefix/lib/pkgconfig/switchml.pc" && echo --static || true)
g++ -std=c++20 -o "$tmp/example_pc" "$src/examples/allreduce/main.cc" \
  $(pkg-config --cflags --libs $static switchml)
echo "example: built with find_package(switchml) and with pkg-config"

# Run both against a switch on free loopback ports.
"$switch_bin" switch --data-port 0 --control-port 0 >"$tmp/switch.log" 2>&1 &
switch_pid=$!
for _ in $(seq 100); do
  port=$(sed -n 's/.*control port \([0-9]*\).*/\1/p' "$tmp/switch.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL: the switch did not start"; cat "$tmp/switch.log"; exit 1; }
timeout 60 "$tmp/example/allreduce_example" --port "$port" --workers 3
# Bad arguments: exit 2 with a message naming the flag, before any worker starts.
for bad in "--workers -1" "--workers 0" "--port 70000" "--port x" "--workers" "--bogus 1"; do
  rc=0
  # shellcheck disable=SC2086  # each case is several words on purpose
  timeout 10 "$tmp/example/allreduce_example" $bad >"$tmp/bad.log" 2>&1 || rc=$?
  if [ "$rc" != 2 ] || ! grep -q "allreduce_example: .*${bad%% *}" "$tmp/bad.log"; then
    echo "FAIL: allreduce_example $bad: exit $rc, expected 2 naming the flag:"; cat "$tmp/bad.log"
    exit 1
  fi
done
"$tmp/example/allreduce_example" --help | grep -q "usage: allreduce_example" ||
  { echo "FAIL: allreduce_example --help"; exit 1; }
# (with a shared libswitchml, a program linked by hand finds it through LD_LIBRARY_PATH)
LD_LIBRARY_PATH=$(pkg-config --variable=libdir switchml) \
  timeout 60 "$tmp/example_pc" --port "$port" --workers 2

# The Python module from the installed tree (when it was built).
pydir=$(find "$prefix" -type d -name dist-packages | head -1)
if [ -n "$pydir" ] && [ -d "$pydir/switchml" ]; then
  PYTHONPATH=$pydir /usr/bin/python3 -c "
import numpy as np, switchml
assert switchml.__file__.startswith('$pydir'), switchml.__file__
ctx = switchml.Context(rank=0, num_workers=1, control_port=$port, session_id=5)
print('python from the install:', ctx.allreduce(np.arange(4, dtype=np.int32)))
"
fi
echo "install test: OK"
