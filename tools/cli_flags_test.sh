#!/usr/bin/env bash
# The switchml commands refuse flag values (and environment variables) that would otherwise be
# misread (clamped, wrapped to 32 bits, or contradictory): each case must exit 2 within seconds,
# before anything runs, with a message naming the flag or variable.
# Usage: cli_flags_test.sh PATH_TO_SWITCHML
set -uo pipefail
bin="$1"
failed=0
# expect "TEXT THE MESSAGE HOLDS" ARGS...
expect() {
  local want="$1"
  shift
  local out rc
  out=$(timeout 10 "$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 2 ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL: switchml $*: exit $rc (want 2), output (want '$want'):"
    echo "$out" | head -5
    failed=1
  else
    echo "ok: switchml $*: $(echo "$out" | head -1)"
  fi
}
sw=(switch --data-port 0 --control-port 0 --bind 127.0.0.1)
# Both silently became --multicast off.
expect "--multicast on cannot go with --no-loopback-multicast" \
  worker --multicast on --no-loopback-multicast
expect "--multicast on cannot go with --no-loopback-multicast" \
  run --multicast on --no-loopback-multicast
expect "--multicast local cannot go with --no-loopback-multicast" \
  worker --multicast local --no-loopback-multicast
expect "--multicast must be auto, local, on or off, not 'lan'" worker --multicast lan
expect "--pin-threads must be on, off or auto, not 'yes'" run --pin-threads yes
# Narrowed to 32 bits: -1 jobs were 4294967295, 4294967297 slots were 1.
expect "--max-jobs must be in 1..1000000, not -1" "${sw[@]}" --max-jobs -1
expect "--slots must be in 1..16384, not 4294967297" "${sw[@]}" --slots 4294967297
expect "--max-workers must be in 1..256, not 4294967298" "${sw[@]}" --max-workers 4294967298
expect "--stats-interval must be >= 0" "${sw[@]}" --stats-interval -5
expect "--nap-us must be in 0..10000" "${sw[@]}" --nap-us 20000
expect "--nap-us and --busy-poll contradict each other" "${sw[@]}" --nap-us 100 --busy-poll
expect "--switch-threads must be 0 (automatic) or in 1..64" run --switch-threads 4294967297
expect "--warmup must be in 0..1000000" run --warmup 4294967296
# --transport auto is run's alone: worker took it through flag parsing and refused it later in
# its own words; switch refused it only when it opened the transport, without naming the flag.
expect "--transport: unknown transport 'auto': use one of udp, udp-plain, xdp, dpdk, shm" \
  worker --transport auto
expect "--transport: unknown transport 'auto': use one of udp" "${sw[@]}" --transport auto
expect "--transport: unknown transport 'bogus'" run --transport bogus
# A negative --seed was cast to uint64_t: run passed 18446744073709551615 on to its workers, whose
# flag parser then refused it as out of range; switch and sim used the wrapped seed.
expect "--seed must be in 0..9223372036854775807, not -1" run --seed -1
expect "--seed must be in 0..9223372036854775807, not -5" worker --seed -5
expect "--seed must be in 0..9223372036854775807, not -1" "${sw[@]}" --seed -1
expect "--seed must be in 0..9223372036854775807, not -1" sim --seed -1 --size 1M
# strtoll clamped to 9223372036854775807; strtod took nan and inf.
expect "--seed 99999999999999999999 is out of range" run --seed 99999999999999999999
expect "--link-gbps wants a finite number, not 'nan'" run --link-gbps nan
expect "--loss wants a finite number, not 'inf'" "${sw[@]}" --loss inf
# --size: 2^62 elements wrapped the byte count to 0 (a 4-byte buffer for 2^62 elements); a size
# the host cannot hold aborted every worker with std::bad_alloc after it had joined the job.
expect "--size 4611686018427387904 is too large: at most 1024G elements" \
  worker --size 4611686018427387904
expect "--size 1099511627777 is too large" run --size 1099511627777
# An output file that cannot be written was refused only after the whole run (run: exit 1).
expect "--json /nonexistent/dir/r.json: there is no directory /nonexistent/dir" \
  run --json /nonexistent/dir/r.json
expect "--json /tmp: is a directory, not a file" run --json /tmp
expect "--csv /nonexistent/dir/r.csv: there is no directory" sim --csv /nonexistent/dir/r.csv
# switch: which port was out of range; a malformed --upstream was taken as given (and one
# without a port went to gRPC's default, 443).
expect "--data-port must be in 0..65535 (0 = pick a free one), not 70000" \
  switch --data-port 70000
expect "--upstream: 'a:1:2' has more than one ':'" "${sw[@]}" --upstream a:1:2 --racks 2
expect "--upstream: bad port 'x'" "${sw[@]}" --upstream 127.0.0.1:x --racks 2
# --window 0 is the automatic window: the message said 1..16384.
expect "--window must be 0 (automatic) or in 1..16384, not -1" run --window -1
libs=$(ldd "$bin" 2>/dev/null)  # not piped into grep -q: pipefail would see ldd's SIGPIPE
if [[ "$libs" == *libasan* || "$libs" == *libtsan* ]]; then
  echo "skipped: the ulimit -v case under a sanitizer (it reserves more address space, and aborts)"
elif [ "$(ulimit -v)" = unlimited ]; then
  # Under a 1 GiB address-space limit (ulimit -v, this subshell only), a 1G tensor cannot fit.
  # under_1gib "GLOB THE LAST LINE MATCHES WITHIN" ARGS...
  under_1gib() {
    local want="$1"
    shift
    local out rc
    out=$( (ulimit -v 1048576; timeout 10 "$bin" "$@") 2>&1)
    rc=$?
    if [ "$rc" -eq 2 ] && [[ "$(echo "$out" | tail -1)" == *$want* ]]; then
      echo "ok: switchml $* under ulimit -v 1 GiB: $(echo "$out" | tail -1)"
    else
      echo "FAIL: switchml $* under ulimit -v 1 GiB: exit $rc (want 2), output (want '$want'):"
      echo "$out" | tail -5
      failed=1
    fi
  }
  under_1gib "cannot allocate the tensors*use a smaller --size" \
    worker --size 1G --switch 127.0.0.1:1 --setup-timeout-ms 2000
  # switchml sim aborted with std::bad_alloc (exit 134).
  under_1gib "cannot allocate the simulated tensors of --size 1073741824 bytes" \
    sim --workers 2 --size 1G --quiet
fi
# switchml sim: 51200 hosts need a route table of 51201^2 entries (10 GB); 819200 hosts failed as
# "cannot allocate the simulated tensors of --size 4096 bytes: use a smaller --size".
expect "--jobs x --workers is 51200 hosts" sim --jobs 200 --workers 256 --size 4K
expect "--jobs x --workers is 32768 hosts" sim --jobs 128 --workers 256 --size 4K
# switchml sim: a star of more than 256 workers failed after building the graph, naming
# max_workers_per_job (no flag of the command).
expect "--workers 257 exceeds the 256 workers one switch aggregates" sim --workers 257 --size 4K
# switchml sim: a --window above --slots was clamped to --slots without a word.
expect "--window 9000 exceeds --slots 8192" sim --window 9000 --slots 8192 --size 1M
# switchml sim's times are int64_t picoseconds: these wrapped to negative times ("-9223372 s
# simulated"), a --gbps of 1e-9 or a --switch-mpps of 1e-300 to nonsense, --buffer-kb wrapped
# when multiplied by 1024, and --baseline-mtu narrowed to 32 bits after the whole run.
expect "--propagation-ns must be in [0, 1e+12], not 1e+17" sim --propagation-ns 1e17 --size 1M
expect "--reorder-ns must be in [0, 1e+12]" sim --reorder 1 --reorder-ns 1e20 --size 1M
expect "--gbps must be in [0.001, 1e+06], not 1e-09" sim --gbps 1e-9 --size 1M
expect "--max-sim-seconds must be in [1e-09, 1e+06]" sim --max-sim-seconds 1e12 --size 1M
expect "--switch-mpps must be 0 (unlimited) or in [1e-09, 1e+09]" sim --switch-mpps 1e-300 --size 1M
expect "--host-latency-ns must be in [0, 1e+12]" sim --host-latency-ns 1e20 --size 1M
expect "--max-timeout-us must be in [0.001, 1e+09]" sim --max-timeout-us 1e17 --size 1M
expect "--buffer-kb must be in 0..1048576" sim --buffer-kb 9007199254740992 --size 1M
expect "--baseline-mtu must be in 1..1048576, not 4294967297" sim --baseline-mtu 4294967297 --size 1M
expect "--timeout-threshold must be in 1..4294967295" sim --timeout-threshold 4294967297 --size 1M
expect "--early-retransmit must be in 0..1000000" sim --early-retransmit 4294967296 --size 1M
# switchml sim --aggregators (server aggregators): contradictions and windows too small to give
# each aggregator a slot of every worker thread's window are refused by name, not run.
expect "--aggregators does not combine with --topology two-level" \
  sim --topology two-level --racks 2 --aggregators 2 --size 1M
expect "--aggregators must be in 0..1024" sim --aggregators -1 --size 1M
expect "--aggregators 8 needs at least one slot of each worker thread's window per aggregator" \
  sim --aggregators 8 --window 16 --threads 4 --size 1M
expect "--aggregator-gbps must be 0 (--gbps) or in [0.001, 1e+06], not 1e-09" \
  sim --aggregators 2 --aggregator-gbps 1e-9 --size 1M
# The AF_XDP transport's environment (docs/xdp.md): "abc" was queue 0, "yes" meant zero-copy.
# Needs root and a build with AF_XDP (the loopback interface serves); skipped, saying so, else.
xdp_out=$(SWITCHML_XDP_QUEUE=abc timeout 10 "$bin" "${sw[@]}" --transport xdp 2>&1)
if [[ "$xdp_out" == *"not compiled into this build"* ]] || [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the SWITCHML_XDP_* cases need root and AF_XDP in the build"
else
  SWITCHML_XDP_QUEUE=abc expect "SWITCHML_XDP_QUEUE must be a queue id (0, 1, ...), not 'abc'" \
    "${sw[@]}" --transport xdp
  SWITCHML_XDP_QUEUE=-1 expect "SWITCHML_XDP_QUEUE must be a queue id" "${sw[@]}" --transport xdp
  SWITCHML_XDP_COPY=yes expect "SWITCHML_XDP_COPY must be 0 or 1" "${sw[@]}" --transport xdp
  # "0" (any value) turned libbpf's warnings on.
  SWITCHML_XDP_DEBUG=yes expect "SWITCHML_XDP_DEBUG must be 0 or 1" "${sw[@]}" --transport xdp
fi
# The DPDK transport's tuning variables (docs/dpdk.md): "abc" was 0, a nap of 0 was 1 us, any
# doorbell setting but "off" was on. Skipped, saying so, without DPDK in the build.
dpdk_out=$(SWITCHML_DPDK_NAP_US=abc timeout 10 "$bin" "${sw[@]}" --transport dpdk 2>&1)
if [[ "$dpdk_out" == *"not in this build"* ]]; then
  echo "skipped: the SWITCHML_DPDK_* cases need DPDK in the build"
else
  SWITCHML_DPDK_NAP_US=abc expect "SWITCHML_DPDK_NAP_US must be a whole number in 1..3600000000" \
    "${sw[@]}" --transport dpdk
  SWITCHML_DPDK_MAX_SLEEP_US=0 expect "SWITCHML_DPDK_MAX_SLEEP_US must be a whole number" \
    "${sw[@]}" --transport dpdk
  SWITCHML_DPDK_SPIN=20x expect "SWITCHML_DPDK_SPIN must be a whole number" \
    "${sw[@]}" --transport dpdk
  SWITCHML_DPDK_DOORBELL=no expect "SWITCHML_DPDK_DOORBELL must be on (the default) or off" \
    "${sw[@]}" --transport dpdk
  SWITCHML_DPDK_POLL=busy expect "SWITCHML_DPDK_POLL must be spin" "${sw[@]}" --transport dpdk
  SWITCHML_DPDK_MEMIF_INTERFACES=8x expect "SWITCHML_DPDK_MEMIF_INTERFACES must be in 1..256" \
    "${sw[@]}" --transport dpdk
fi
exit $failed
