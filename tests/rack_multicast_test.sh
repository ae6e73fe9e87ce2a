#!/usr/bin/env bash
# LAN multicast in the emulated rack of scripts/rack.sh: four workers (of five namespaces: the
# fifth stays idle), each in its own namespace
# behind a 1 Gbit/s tbf-shaped cable to the bridge whose namespace holds the switch (bound to the
# bridge's address, so it sends results to LAN groups). The bridge is the IGMP querier (rack.sh),
# so it forwards a group's datagrams only to the ports whose worker joined it (IGMP snooping).
#   1. every worker with --multicast on: results verified, and the switch's counters show each
#      completed slot sent once to the group (group_sends == completed) and one datagram sent
#      per result (not one per worker), every worker's results came through the group coalesced
#      by GRO, and the idle fifth port carried none of them (the bridge pruned the group);
#   2. rank 3 with --multicast off (a worker that does not join, as a reference worker): every
#      result verified; the switch sends each once to the group and once to rank 3;
#   3. the switch with --no-lan-multicast: a worker with --multicast on fails setup, saying why;
#      workers in the default mode (--multicast auto) run the job with one copy per worker;
#   4. the network drops the group's datagrams toward rank 3 (a filter on its bridge port): with
#      --multicast auto every result is verified, the switch moves rank 3 off the group
#      (group_demoted 1) and keeps sending the others theirs through it, and rank 3 warns.
# Exits 77 (skipped) where namespaces cannot be created. Usage: rack_multicast_test.sh SWITCHML
set -euo pipefail
bin="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=worker_results.sh
source "$here/worker_results.sh"
rack="$here/../scripts/rack.sh"
n=4

# Counter `name` of the session's table in the switch's output file.
counter() { awk -v name="$2" '$1 == name { v = $2 } END { print v + 0 }' "$1"; }
# Datagrams the daemon sent ("daemon: received R, sent S over ...").
sent() { sed -n 's/^daemon: received [0-9]*, sent \([0-9]*\) .*/\1/p' "$1" | tail -1; }

if [ "${2:-}" = "--inside" ]; then
  log="$(mktemp -d)"
  switch_pid=""
  trap '[ -n "$switch_pid" ] && kill "$switch_pid" 2>/dev/null; rm -rf "$log"' EXIT
  read -r -a ips <<<"$RACK_WORKER_IPS"
  status=0
  # rack.sh makes the bridge the IGMP querier: it forwards groups only to the ports that joined
  # (without a querier a Linux bridge floods every port).
  ip -n "$RACK_SWITCH_NS" -d link show br0 | grep -q "mcast_querier 1" ||
    { echo "FAIL: br0 is not an IGMP querier"; exit 1; }
  sleep 1.2  # the bridge's querier counts as present a response interval (1 s) after rack up

  start_switch() {  # $1: output file; more flags after it
    local out="$1"
    shift
    ip netns exec "$RACK_SWITCH_NS" "$bin" switch --bind "$RACK_SWITCH_IP" "$@" >"$out" 2>&1 &
    switch_pid=$!
    for _ in $(seq 50); do
      grep -q "control port" "$out" && return 0
      kill -0 "$switch_pid" 2>/dev/null || break
      sleep 0.1
    done
    echo "FAIL: the switch did not start:"
    cat "$out"
    exit 1
  }
  stop_switch() {  # prints the counters into the switch's output
    kill -TERM "$switch_pid"
    wait "$switch_pid" || { echo "FAIL: the switch exited with an error"; status=1; }
    switch_pid=""
  }
  run_job() {  # $1: session, $2: name; then per rank its --multicast mode
    local session="$1" name="$2"
    shift 2
    local modes=("$@") pids=() r
    for r in $(seq 0 $((n - 1))); do
      ip netns exec "$RACK_NAME-w$r" "$bin" worker --switch "$RACK_SWITCH_IP" --bind "${ips[$r]}" \
        --rank "$r" --workers "$n" --size 1M --dtype float32 --iterations 2 --warmup 1 \
        --session "$session" --setup-timeout-ms 20000 --multicast "${modes[$r]}" \
        --report >"$log/$name-w$r" 2>&1 &
      pids+=($!)
    done
    for r in $(seq 0 $((n - 1))); do
      check_worker "$name (--multicast ${modes[$r]})" "$r" "${pids[$r]}" "$log/$name-w$r" ||
        status=1
    done
  }
  check_counters() {  # $1: switch output, $2: name, $3: copies per result (1 + unicast workers)
    local out="$1" name="$2" copies="$3"
    local completed group sent_total retrans
    completed=$(counter "$out" completed)
    group=$(counter "$out" group_sends)
    retrans=$(counter "$out" retransmitted)
    sent_total=$(sent "$out")
    if [ "$completed" -eq 0 ] || [ "$group" -ne "$completed" ]; then
      echo "FAIL: $name: group_sends $group != completed $completed:"
      cat "$out"
      status=1
    elif [ "$sent_total" -ne $((completed * copies + retrans)) ]; then
      echo "FAIL: $name: sent $sent_total datagrams, expected completed $completed x $copies +" \
        "retransmitted $retrans:"
      cat "$out"
      status=1
    else
      echo "ok: $name: $completed results, each sent once to the group (sent $sent_total" \
        "datagrams for $n workers, $retrans retransmission replies)"
    fi
  }

  # Worker r's counter from its SWITCHML_RESULT line.
  wcounter() { sed -n "s/^SWITCHML_RESULT .* $3=\([0-9]*\) .*/\1/p" "$log/$1-w$2"; }

  start_switch "$log/switch-a"
  run_job 11 all-join on on on on
  stop_switch
  check_counters "$log/switch-a" all-join 1
  # The bridge replicated the results only to the member ports: the idle port p4 (no worker
  # joined there) carried almost nothing, p0 at least the 4 MiB of results.
  bytes() { ip netns exec "$RACK_SWITCH_NS" tc -s qdisc show dev "$1" |
    sed -n 's/.*Sent \([0-9]*\) bytes.*/\1/p' | head -1; }
  if [ "$(bytes p4)" -gt 1000000 ] || [ "$(bytes p0)" -lt 4000000 ]; then
    echo "FAIL: all-join: the bridge did not prune the group to its members: p0 sent" \
      "$(bytes p0) bytes, idle p4 $(bytes p4)"
    status=1
  else
    echo "ok: all-join: idle port p4 sent $(bytes p4) bytes, member port p0 $(bytes p0)"
  fi
  # Every worker got its results through the group, coalesced by UDP GRO (the bridge and the
  # veth pass the switch's segmented sends whole).
  for r in $(seq 0 $((n - 1))); do
    g=$(wcounter all-join "$r" group_received)
    c=$(wcounter all-join "$r" coalesced)
    if [ "${g:-0}" -eq 0 ] || [ "${c:-0}" -eq 0 ]; then
      echo "FAIL: all-join: worker $r: group_received=${g:-?} coalesced=${c:-?}:"
      cat "$log/all-join-w$r"
      status=1
    fi
  done

  start_switch "$log/switch-b"
  run_job 12 one-unicast on on on off
  stop_switch
  check_counters "$log/switch-b" one-unicast 2
  if [ "$(wcounter one-unicast 3 group_received)" != 0 ]; then
    echo "FAIL: one-unicast: the worker that did not join received through the group:"
    cat "$log/one-unicast-w3"
    status=1
  fi

  start_switch "$log/switch-c" --no-lan-multicast
  ip netns exec "$RACK_NAME-w0" "$bin" worker --switch "$RACK_SWITCH_IP" --bind "${ips[0]}" \
    --rank 0 --workers 1 --size 1K --session 13 --setup-timeout-ms 20000 --multicast on \
    >"$log/refused" 2>&1 && rc=0 || rc=$?
  stop_switch
  if [ "$rc" -eq 0 ] || ! grep -q "did not keep LAN multicast group" "$log/refused"; then
    echo "FAIL: a worker with --multicast on did not fail clearly on a switch without it:"
    cat "$log/refused"
    status=1
  else
    echo "ok: refused: $(grep -o 'the switch did not keep[^(]*' "$log/refused" | head -1)"
  fi
  start_switch "$log/switch-d" --no-lan-multicast
  run_job 14 auto-refused auto auto auto auto
  stop_switch
  for r in $(seq 0 $((n - 1))); do
    if [ "$(wcounter auto-refused "$r" group_received)" != 0 ]; then
      echo "FAIL: auto-refused: worker $r received through a group the switch refused:"
      cat "$log/auto-refused-w$r"
      status=1
    fi
  done
  if [ "$(counter "$log/switch-d" group_sends)" != 0 ]; then
    echo "FAIL: auto-refused: a switch with --no-lan-multicast sent to a group:"
    cat "$log/switch-d"
    status=1
  else
    echo "ok: auto-refused: --multicast auto ran with one copy per worker"
  fi

  # 4. The bridge port toward rank 3 drops the groups' datagrams (239.192.0.0/14; everything
  # else passes), as a network that filters multicast would.
  tcs() { ip netns exec "$RACK_SWITCH_NS" tc "$@"; }
  tcs qdisc replace dev p3 root handle 1: htb default 1
  tcs class add dev p3 parent 1: classid 1:1 htb rate 1gbit
  tcs class add dev p3 parent 1: classid 1:2 htb rate 1gbit
  tcs qdisc add dev p3 parent 1:2 handle 20: pfifo limit 0
  tcs filter add dev p3 parent 1: protocol ip prio 1 u32 match ip dst 239.192.0.0/14 classid 1:2
  start_switch "$log/switch-e"
  run_job 15 group-dropped auto auto auto auto
  stop_switch
  filtered=$(tcs -s qdisc show dev p3 | awk '/^qdisc pfifo 20:/ { getline; print $7 + 0 }')
  demoted=$(counter "$log/switch-e" group_demoted)
  if [ "${filtered:-0}" -eq 0 ] || [ "$demoted" -ne 1 ] ||
    [ "$(wcounter group-dropped 0 group_received)" -eq 0 ] ||
    ! grep -q "none on multicast group" "$log/group-dropped-w3"; then
    echo "FAIL: group-dropped: filtered ${filtered:-?} group datagrams toward rank 3; the switch" \
      "demoted $demoted members (expected 1); rank 0 group_received" \
      "$(wcounter group-dropped 0 group_received); rank 3 said:"
    cat "$log/group-dropped-w3" "$log/switch-e"
    status=1
  else
    echo "ok: group-dropped: $filtered group datagrams dropped toward rank 3; the switch moved it" \
      "off the group and every result was verified"
  fi
  exit "$status"
fi

rc=0
timeout 80 "$rack" run --name "smlmc$$" --workers $((n + 1)) --rate 1gbit --mtu 9000 -- \
  bash "$0" "$bin" --inside || rc=$?
case "$rc" in
  0) echo "1 passed, 0 failed" ;;
  77)
    echo "SKIPPED: scripts/rack.sh cannot create network namespaces here (needs root and iproute2)"
    ;;
  124) echo "FAIL: the rack run took over 80 s"; echo "0 passed, 1 failed"; rc=1 ;;
  *) echo "0 passed, 1 failed" ;;
esac
exit "$rc"
