#!/usr/bin/env bash
# A root switch and root workers must never follow an unprivileged user's files, nor let that
# user hold their locks (issue 28, found 2 and 3). Run as root in a mount and network namespace
# of its own, with fresh /tmp and /run (tmpfs, seen only there), so that it may play the other
# user (nobody, through setpriv) on the real paths without touching the host's:
#   2. DPDK: nobody makes /tmp/switchml-dpdk first, with symbolic links named like the switch's
#      doorbell and id-lock files to a root file and to a path of its choice; a root switch with
#      --transport dpdk must start without extending or overwriting the root file and without
#      creating the other; one pointed (SWITCHML_DPDK_LOCK_DIR) at a directory of nobody's is
#      refused, saying so.
#   3. DPDK: nobody holds flock on every memif id lock it can open of the switch's socket; a
#      root job over memif must run anyway. AF_XDP (where it runs): nobody holds the interface
#      lock at the old path; a root switch on that interface must start.
# Needs root, unshare and setpriv (util-linux), and a DPDK build; else exits 77 (skipped).
# Usage: lock_files_test.sh PATH_TO_SWITCHML
set -euo pipefail
bin="$1"
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null; then
  echo "SKIPPED: needs root, unshare and setpriv"
  exit 77
fi
if [ -z "${SWITCHML_LOCK_TEST_INNER:-}" ]; then
  if ! unshare --mount --net --propagation private true 2>/dev/null; then
    echo "SKIPPED: cannot make mount and network namespaces here (unshare failed)"
    exit 77
  fi
  exec unshare --mount --net --propagation private env SWITCHML_LOCK_TEST_INNER=1 bash "$0" "$@"
fi

# Inside the namespaces. The binary may live under /tmp or /run (a checkout there), which the
# mounts below hide: it is kept open across them and copied into the fresh /tmp.
exec 9<"$bin"
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t sysfs sysfs /sys  # this network namespace's devices (as `ip netns exec` does)
ip link set lo up
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
dir=$(mktemp -d)
chmod 755 "$dir"
cp /proc/self/fd/9 "$dir/switchml"
exec 9<&-
chmod 755 "$dir/switchml"
bin="$dir/switchml"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
fail=0

# Starts a switch (extra flags in "$@"); sets sw_pid and control, or returns 1 with its log.
start_switch() {
  local log="$1" host="$3"
  shift
  "$bin" switch --control-port 0 --log-level warning "$@" >"$log" 2>&1 &
  sw_pid=$!
  pids+=("$sw_pid")
  for _ in $(seq 200); do
    if grep -q "control port" "$log"; then
      control="$host:$(grep -o 'control port [0-9]*' "$log" | grep -o '[0-9]*$')"
      return 0
    fi
    kill -0 "$sw_pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# Runs a 2-worker job over memif; 0 when both verified.
run_job() {
  local session="$1" rc=0 workers=()
  for r in 0 1; do
    timeout 60 "$bin" worker --switch "$control" --rank "$r" --workers 2 --session "$session" \
      --transport dpdk --size 4096 --iterations 2 --warmup 0 --report --setup-timeout-ms 30000 \
      >"$dir/job$session-$r.log" 2>&1 &
    workers+=("$!")
  done
  for w in "${workers[@]}"; do wait "$w" || rc=1; done
  grep -q "status=ok verified=1" "$dir/job$session-0.log" || rc=1
  grep -q "status=ok verified=1" "$dir/job$session-1.log" || rc=1
  return $rc
}

# --- found 2: symbolic links in a directory nobody made first --------------------------------
port=48900
sock="switchml-memif-$port"
printf 'precious' >/tmp/victim
chmod 644 /tmp/victim
nobody mkdir -m 1777 /tmp/switchml-dpdk
nobody ln -s /tmp/victim "/tmp/switchml-dpdk/$sock.bell"
nobody ln -s /tmp/victim "/tmp/switchml-dpdk/$sock.0.lock"
nobody ln -s /tmp/chosen-by-nobody "/tmp/switchml-dpdk/$sock.1.lock"
if ! start_switch "$dir/switch2.log" --bind 127.0.0.1 --transport dpdk --data-port "$port"; then
  if grep -qi "dpdk.*not built\|EAL\|hugepage\|cannot init" "$dir/switch2.log"; then
    echo "SKIPPED: the dpdk switch does not start here: $(tail -1 "$dir/switch2.log")"
    exit 77
  fi
  echo "FAIL (found 2): the root dpdk switch did not start: $(tail -3 "$dir/switch2.log")"
  exit 1
fi
echo "found 2: root dpdk switch up at $control with nobody's links in /tmp/switchml-dpdk"
if ! printf precious | cmp -s - /tmp/victim; then
  echo "FAIL (found 2): the root file behind nobody's link was written: $(stat -c %s /tmp/victim) bytes"
  fail=1
fi
if [ -e /tmp/chosen-by-nobody ]; then
  echo "FAIL (found 2): the switch created a root file where nobody's link pointed"
  fail=1
fi
# --- found 3: nobody holds every id lock it can open -----------------------------------------
cat >"$dir/hold.py" <<'EOF'
import fcntl, os, sys, time
held = []
for d in sys.argv[2:]:
    for i in range(8):
        p = f"{d}/{sys.argv[1]}.{i}.lock"
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(p)
        except OSError:
            pass
print("holding", len(held), "locks", flush=True)
time.sleep(120)
EOF
kill "$sw_pid"
wait "$sw_pid" 2>/dev/null || true
rm -rf /tmp/switchml-dpdk
port=48910
sock="switchml-memif-$port"
start_switch "$dir/switch3.log" --bind 127.0.0.1 --transport dpdk --data-port "$port" ||
  { echo "FAIL (found 3): the dpdk switch did not start: $(tail -3 "$dir/switch3.log")"; exit 1; }
nobody /usr/bin/python3 "$dir/hold.py" "$sock" /tmp/switchml-dpdk /run/switchml-dpdk \
  >"$dir/hold.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do grep -qs holding "$dir/hold.log" && break; sleep 0.05; done
echo "found 3: nobody: $(cat "$dir/hold.log")"
if run_job 1; then
  echo "found 3: a root job over memif ran verified"
else
  echo "FAIL (found 3): the root job over memif failed: $(tail -2 "$dir/job1-0.log")"
  fail=1
fi
# --- found 2: a lock directory of another user's is refused ----------------------------------
nobody mkdir -m 700 /tmp/theirs
rc=0
SWITCHML_DPDK_LOCK_DIR=/tmp/theirs timeout 30 "$bin" switch --bind 127.0.0.1 --control-port 0 \
  --transport dpdk --data-port 48920 >"$dir/switch-theirs.log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q "belongs to user 65534" "$dir/switch-theirs.log"; then
  echo "FAIL (found 2): a lock directory of nobody's was not refused (exit $rc): $(tail -2 "$dir/switch-theirs.log")"
  fail=1
else
  echo "found 2: refused: $(grep -o 'refusing.*' "$dir/switch-theirs.log" | head -1 | cut -c1-150)"
fi

# --- found 3, AF_XDP: nobody holds the interface lock at the old path -------------------------
ip link add xl0 type veth peer name xl1
ip addr add 10.96.0.1/24 dev xl0
ip link set xl0 up
ip link set xl1 up
ino=$(stat -L -c %i /proc/self/ns/net)
ifindex=$(cat /sys/class/net/xl0/ifindex)
nobody mkdir -m 1777 /tmp/switchml-xdp
nobody /usr/bin/python3 -c "
import fcntl, os, time
fd = os.open('/tmp/switchml-xdp/$ino-$ifindex.lock', os.O_RDONLY | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print('holding', flush=True)
time.sleep(120)" >"$dir/holdx.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do grep -qs holding "$dir/holdx.log" && break; sleep 0.05; done
if start_switch "$dir/switchx.log" --bind 10.96.0.1 --transport xdp --data-port 48930; then
  echo "found 3: root AF_XDP switch up on xl0 while nobody holds the old lock"
elif grep -q "used by another switchml process" "$dir/switchx.log"; then
  echo "FAIL (found 3): nobody's lock kept the AF_XDP switch from starting"
  fail=1
else
  echo "found 3 (AF_XDP): skipped, AF_XDP does not start here: $(tail -1 "$dir/switchx.log")"
fi

[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
