#!/usr/bin/env bash
# AF_XDP allows one switchml process per interface (the XDP program is the interface's): a second
# process binding another queue of the same interface must be refused with a clear error, and the
# first must keep its XDP program. (It once replaced the first one's program as "stale" and, on
# exit, removed it: the first process then received nothing, silently.) A veth pair with two
# queues in a namespace of its own; needs root and AF_XDP, else exits 77 (skipped), saying why.
# Usage: xdp_interface_test.sh PATH_TO_SWITCHML
set -euo pipefail
bin="$1"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIPPED: needs root and iproute2 to create a network namespace"
  exit 77
fi
ns="smlxq$$"
dir=$(mktemp -d)
first=""
cleanup() {
  [ -z "$first" ] || kill "$first" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
if ! ip netns add "$ns" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (ip netns add failed)"
  exit 77
fi
ip -n "$ns" link add xq0 numtxqueues 2 numrxqueues 2 type veth peer name xq1 numtxqueues 2 \
  numrxqueues 2
ip -n "$ns" addr add 10.95.0.1/24 dev xq0
ip -n "$ns" link set xq0 up
ip -n "$ns" link set xq1 up
program() { ip -n "$ns" link show xq0 | grep -o 'prog/xdp id [0-9]*' || true; }

ip netns exec "$ns" "$bin" switch --transport xdp --bind 10.95.0.1 --data-port 48864 \
  --control-port 0 >"$dir/first.log" 2>&1 &
first=$!
for _ in $(seq 150); do
  grep -q "control port" "$dir/first.log" && break
  if ! kill -0 "$first" 2>/dev/null; then
    echo "SKIPPED: AF_XDP does not start here: $(tail -1 "$dir/first.log")"
    exit 77
  fi
  sleep 0.1
done
grep -q "control port" "$dir/first.log" || { echo "FAIL: the first switch did not start"; exit 1; }
before=$(program)
[ -n "$before" ] || { echo "FAIL: no XDP program on xq0 under the first switch"; exit 1; }
# The lock directory is root's own (issue 28, found 2 and 3: it was /tmp/switchml-xdp, 1777).
mode=$(stat -c %a:%U /run/switchml-xdp)
[ "$mode" = 700:root ] || { echo "FAIL: /run/switchml-xdp is $mode, not 700:root"; exit 1; }

# The second process, on queue 1 of the same interface: refused at once (it would otherwise run
# until killed, so it gets 10 s).
rc=0
SWITCHML_XDP_QUEUE=1 timeout 10 ip netns exec "$ns" "$bin" switch --transport xdp \
  --bind 10.95.0.1 --data-port 48870 --control-port 0 >"$dir/second.log" 2>&1 || rc=$?
echo "second switch: exit $rc: $(tail -1 "$dir/second.log")"
fail=0
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  echo "FAIL: a second switchml process on queue 1 of xq0 was not refused"
  fail=1
fi
grep -q "used by another switchml process" "$dir/second.log" ||
  { echo "FAIL: the refusal does not say the interface is in use"; fail=1; }
after=$(program)
if [ "$after" != "$before" ]; then
  echo "FAIL: the first switch's XDP program ($before) became '${after:-none}'"
  fail=1
fi
kill -0 "$first" || { echo "FAIL: the first switch died"; fail=1; }
kill -TERM "$first"
wait "$first" || true
first=""
[ -z "$(program)" ] || { echo "FAIL: the XDP program outlived the first switch"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
