#!/usr/bin/env bash
# An emulated rack on one machine: N worker network namespaces, each joined by a veth pair (its
# "cable") to a bridge (the "switch" ASIC) living in a switch namespace, where the software switch
# runs on an address of the bridge. Every cable is rate-limited with `tc tbf` in both directions.
# See --help. Needs root and iproute2.
set -euo pipefail

readonly kNoNamespaces=77  # namespaces cannot be created here (ctest's skip code)

usage() {
  cat <<'EOF'
usage: scripts/rack.sh COMMAND [options] [-- command ...]

An emulated rack: namespaces NAME-sw (the switch: bridge br0 with address 10.99.0.1/24) and
NAME-w0 .. NAME-w<N-1> (worker i: eth0 with address 10.99.0.<10+i>/24), worker i's eth0
joined by a veth pair to port p<i> of br0. With --switch-hosts K, also K servers for software
switches (aggregators): NAME-s0 .. NAME-s<K-1> (switch host j: eth0 with address
10.99.0.<100+j>/24, joined to port q<j> of br0), each behind a cable of its own, shaped as the
workers' are. Every cable is shaped with `tc qdisc ... tbf` in
both directions (worker i's eth0 egress: worker to switch; port p<i> egress: switch and other
workers to worker i). Traffic between workers crosses two cables, as in a rack. br0 snoops IGMP
and is the querier: multicast groups go only to the ports that joined them.

Commands:
  up      create the rack (removes whatever it created if any step fails or is interrupted)
  down    remove the rack NAME (every namespace NAME-*); no error if it does not exist
  run     up, run the command after `--` with RACK_* variables in its environment, then down,
          always (also on failure, Ctrl-C or SIGTERM); exits with the command's exit code
  exec    run the command after `--` in one namespace of rack NAME: --in sw or --in I (worker I)
  status  list rack NAME's namespaces, addresses and qdiscs
  env     print the RACK_* variables of rack NAME (shell syntax)

Options:
  --name NAME      namespace prefix; must be unique per rack (default smlrack<pid>, so two
                   racks, e.g. CI and a developer, never collide). Letters, digits, '-', '_'.
  --workers N      worker namespaces, 1..64 (default 4)
  --switch-hosts K switch host namespaces (servers that run `switchml switch`, each behind
                   its own cable), 0..64 (default 0: the switch runs in NAME-sw, on the bridge,
                   as a switch ASIC would)
  --rate R         tc rate of every cable in each direction, e.g. 1gbit, 10gbit, 500mbit
                   (default 1gbit; "none" = no shaping)
  --burst B        tbf bucket size (default: 6.4 ms at the rate, at least 64kb: 800kb at
                   1gbit, 8mb at 10gbit; much smaller buckets collapse throughput at 10gbit)
  --latency L      tbf queue, as the longest a packet may wait (default 20ms)
  --mtu M          MTU of every interface (default 9000)
  --bridge-netfilter on|off
                   whether the bridge hands bridged IPv4/IPv6/ARP packets to the switch
                   namespace's netfilter hooks (the net.bridge.bridge-nf-call-* sysctls of the
                   kernel's br_netfilter, 1 in every new namespace where it is built in or
                   loaded). Default off: a rack's switch ASIC runs no host firewall, and with
                   it on every packet crossing the bridge pays for an IP route lookup and the
                   netfilter hooks in whichever process sends it (all systems alike)
  --ingress-shaping
                   shape the worker-to-switch direction at the switch end (port p<i>'s ingress,
                   through an ifb device) instead of at the worker's eth0 egress: for traffic
                   that bypasses the sender's qdisc, such as AF_XDP (switchml --transport xdp)
  --in WHERE       for exec: sw (switch namespace), a worker index, or sJ (switch host J)

Environment given to `run`'s command (and printed by `env`): RACK_NAME, RACK_WORKERS,
RACK_SWITCH_NS, RACK_SWITCH_IP, RACK_WORKER_NS (space-separated), RACK_WORKER_IPS
(space-separated), RACK_SWITCH_HOSTS (K), RACK_SWITCH_HOST_NS and RACK_SWITCH_HOST_IPS
(space-separated; empty without switch hosts), RACK_SUBNET, RACK_RATE, RACK_MTU, RACK_SCRIPT
(this script).

Exit codes: 0 ok; 2 bad usage; 77 the rack cannot be made here (not root, no iproute2,
`ip netns add` refused, e.g. in an unprivileged container, or no tbf qdisc); 1 any other
failure; for run and exec, the command's exit code.

Examples:
  scripts/rack.sh run --workers 4 --rate 1gbit -- bash -c 'ip netns exec $RACK_SWITCH_NS ip a'
  scripts/rack.sh up --name dev --workers 2 --rate 10gbit
  scripts/rack.sh exec --name dev --in 0 -- ping -c 1 10.99.0.1
  scripts/rack.sh down --name dev
  scripts/rack.sh run --workers 4 --switch-hosts 4 -- bash -c 'echo $RACK_SWITCH_HOST_IPS'
EOF
}

die() {
  echo "rack: $*" >&2
  exit 2
}

readonly kSubnet="10.99.0"
switch_ip() { echo "$kSubnet.1"; }
worker_ip() { echo "$kSubnet.$((10 + $1))"; }
switch_host_ip() { echo "$kSubnet.$((100 + $1))"; }

cmd="${1:-}"
[ -n "$cmd" ] || {
  usage >&2
  exit 2
}
shift
case "$cmd" in
  -h | --help)
    usage
    exit 0
    ;;
  up | down | run | exec | status | env) ;;
  *) die "unknown command '$cmd' (see --help)" ;;
esac

name="smlrack$$"
workers=4
switch_hosts=0
rate=1gbit
burst=""
latency=20ms
mtu=9000
ingress_shaping=0
bridge_netfilter=off
where=""
command_args=()
# value FLAG "$@": the value after FLAG; a missing one (or another flag) is a usage error.
value() {
  [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || die "$1 needs a value (see --help)"
  echo "$2"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$(value --name "${@:2}")"; shift 2 ;;
    --workers) workers="$(value --workers "${@:2}")"; shift 2 ;;
    --switch-hosts) switch_hosts="$(value --switch-hosts "${@:2}")"; shift 2 ;;
    --rate) rate="$(value --rate "${@:2}")"; shift 2 ;;
    --burst) burst="$(value --burst "${@:2}")"; shift 2 ;;
    --latency) latency="$(value --latency "${@:2}")"; shift 2 ;;
    --mtu) mtu="$(value --mtu "${@:2}")"; shift 2 ;;
    --bridge-netfilter) bridge_netfilter="$(value --bridge-netfilter "${@:2}")"; shift 2 ;;
    --ingress-shaping) ingress_shaping=1; shift ;;
    --in) where="$(value --in "${@:2}")"; shift 2 ;;
    --)
      shift
      command_args=("$@")
      break
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unexpected argument '$1' (see --help)" ;;
  esac
done

[[ "$name" =~ ^[A-Za-z0-9_-]{1,40}$ ]] || die "--name must be 1-40 letters, digits, '-' or '_', not '$name'"
[[ "$workers" =~ ^[0-9]+$ ]] && [ "$workers" -ge 1 ] && [ "$workers" -le 64 ] ||
  die "--workers must be an integer in 1..64, not '$workers'"
[[ "$switch_hosts" =~ ^[0-9]+$ ]] && [ "$switch_hosts" -le 64 ] ||
  die "--switch-hosts must be an integer in 0..64, not '$switch_hosts'"
[ "$bridge_netfilter" = on ] || [ "$bridge_netfilter" = off ] ||
  die "--bridge-netfilter must be on or off, not '$bridge_netfilter'"
[[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] && [ "$mtu" -le 65000 ] ||
  die "--mtu must be an integer in 576..65000, not '$mtu'"

# Bits per second of a tc rate such as 1gbit, 500mbit, 10gbit, 1000000 (bit/s).
rate_bps() {
  [[ "$1" =~ ^([0-9]+)(bit|kbit|mbit|gbit)?$ ]] || return 1
  local n=${BASH_REMATCH[1]}
  case "${BASH_REMATCH[2]}" in
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
    *) echo "$n" ;;
  esac
}
[ -z "$burst" ] || [[ "$burst" =~ ^[0-9]+(b|kb|mb|k|m)?$ ]] ||
  die "--burst must be a size such as 800kb, 8mb or 100000b, not '$burst'"
[[ "$latency" =~ ^[0-9]+(us|ms|s)$ ]] || die "--latency must be a time such as 20ms, not '$latency'"
if [ "$rate" != none ]; then
  bps=$(rate_bps "$rate") || die "--rate must look like 1gbit, 10gbit, 500mbit or 'none', not '$rate'"
  [ "$bps" -gt 0 ] || die "--rate must be positive"
  if [ -z "$burst" ]; then
    # 6.4 ms of traffic in bytes: bps * 0.0064 / 8 = bps / 1250.
    b=$((bps / 1250))
    [ "$b" -ge 65536 ] || b=65536
    burst="${b}b"
  fi
fi

ns_sw="$name-sw"
ns_w() { echo "$name-w$1"; }
ns_s() { echo "$name-s$1"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "rack: SKIP: needs root to create network namespaces (running as uid $(id -u))" >&2
    exit "$kNoNamespaces"
  fi
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "rack: SKIP: needs iproute2 (ip and tc) to create network namespaces" >&2
    exit "$kNoNamespaces"
  fi
}

# Every namespace of rack $name that exists.
rack_namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$name-(sw|w[0-9]+|s[0-9]+)$" || true
}

rack_down() {
  local ns
  for ns in $(rack_namespaces); do
    # Kill whatever still runs in it, then delete it (its veth ends and qdiscs go with it).
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -TERM 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

shape() {  # shape NS DEV: tbf on DEV's egress in namespace NS
  [ "$rate" = none ] && return 0
  if ! ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" \
    latency "$latency"; then
    echo "rack: SKIP: cannot shape the cables (tc qdisc tbf failed; a kernel without sch_tbf?)" >&2
    exit "$kNoNamespaces"
  fi
}

# attach_host NS PORT IP TAG: a host namespace NS whose eth0 (address IP) is joined by a veth
# pair, its cable, to bridge port PORT, shaped in both directions (TAG names its ifb device).
attach_host() {
  local ns=$1 port=$2 ip=$3 tag=$4
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # Both ends are created inside their namespaces: no name in the host's namespace at all.
  ip -n "$ns" link add eth0 mtu "$mtu" type veth peer name "$port" netns "$ns_sw"
  ip -n "$ns_sw" link set "$port" mtu "$mtu" master br0 up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [ "$ingress_shaping" = 1 ] && [ "$rate" != none ]; then
    # The host's uplink is shaped where it enters the switch: the port's ingress, redirected
    # through ifb<tag>, whose egress carries the tbf.
    if ! ip -n "$ns_sw" link add "ifb$tag" type ifb 2>/dev/null; then
      echo "rack: SKIP: --ingress-shaping needs ifb devices (modprobe ifb)" >&2
      exit "$kNoNamespaces"
    fi
    ip -n "$ns_sw" link set "ifb$tag" up
    shape "$ns_sw" "ifb$tag"
    ip netns exec "$ns_sw" tc qdisc add dev "$port" handle ffff: ingress
    ip netns exec "$ns_sw" tc filter add dev "$port" parent ffff: protocol all u32 \
      match u32 0 0 action mirred egress redirect dev "ifb$tag"
  else
    shape "$ns" eth0
  fi
  shape "$ns_sw" "$port"
}

wait_cable() {  # wait_cable NS PORT: until both ends of the cable are up
  local tries=0
  until ip -n "$1" -o link show eth0 | grep -q "state UP" &&
    ip -n "$ns_sw" -o link show "$2" | grep -q "state UP"; do
    tries=$((tries + 1))
    [ "$tries" -lt 50 ] || { echo "rack: cable $2 did not come up" >&2; exit 1; }
    sleep 0.1
  done
}

rack_up() {
  need_root
  if [ -n "$(rack_namespaces)" ]; then
    echo "rack: a rack named '$name' exists already (scripts/rack.sh down --name $name)" >&2
    exit 1
  fi
  # Whatever fails or interrupts from here on, remove what was created.
  trap 'rack_down' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if ! ip netns add "$ns_sw" 2>/dev/null; then
    echo "rack: SKIP: cannot create network namespaces here (ip netns add $ns_sw failed)" >&2
    trap - EXIT
    exit "$kNoNamespaces"
  fi
  ip -n "$ns_sw" link set lo up
  # The bridge as a switch ASIC: no netfilter on bridged packets (--bridge-netfilter). The
  # sysctls are per namespace and exist only where the kernel has br_netfilter; the bridge's own
  # nf_call_* options default to off.
  local v=0
  [ "$bridge_netfilter" = on ] && v=1
  ip netns exec "$ns_sw" sh -c "for f in /proc/sys/net/bridge/bridge-nf-call-*; do
    [ ! -e \$f ] || echo $v > \$f; done"
  # (A querier counts as present only a query response interval after it is enabled, 10 s by
  # default; until then the bridge floods: 1 s here, set before the querier.)
  ip -n "$ns_sw" link add br0 mtu "$mtu" type bridge mcast_query_response_interval 100
  # A bridge forwards at once (no STP learning delay); it is the rack's switch ASIC. It snoops
  # IGMP and is the segment's querier, so it forwards a multicast group only to the ports whose
  # host joined it (as a switch ASIC replicates to a group's ports), not to every port (what a
  # Linux bridge does while no querier exists): switchml's LAN multicast (--multicast auto or on).
  # Its queries are IGMPv3's (issue 28, found 9): a host that heard an IGMPv2 query answers in
  # IGMPv2 compatibility mode, where hearing another host's report for a group cancels its own
  # pending report of that group and the repeats (report suppression, net/ipv4/igmp.c
  # igmp_heard_report). While the bridge floods reports to every port (no querier counts as
  # present yet), a worker that joined a moment after another could so leave its port out of
  # the group for good: its results then came only as unicast retransmission replies
  # (rack_multicast_test, 1 run in 3 on a fresh Debian 12 machine; bench.py before the wait
  # below). IGMPv3 hosts never suppress reports.
  ip -n "$ns_sw" link set br0 type bridge forward_delay 0 stp_state 0 mcast_snooping 1 \
    mcast_igmp_version 3 mcast_querier 1
  ip -n "$ns_sw" addr add "$(switch_ip)/24" dev br0
  ip -n "$ns_sw" link set br0 up
  local i
  for ((i = 0; i < workers; i++)); do attach_host "$(ns_w "$i")" "p$i" "$(worker_ip "$i")" "$i"; done
  for ((i = 0; i < switch_hosts; i++)); do
    attach_host "$(ns_s "$i")" "q$i" "$(switch_host_ip "$i")" "s$i"
  done
  # Every cable is up at both ends before anyone uses the rack (no ping needed).
  for ((i = 0; i < workers; i++)); do wait_cable "$(ns_w "$i")" "p$i"; done
  for ((i = 0; i < switch_hosts; i++)); do wait_cable "$(ns_s "$i")" "q$i"; done
  # The bridge's querier counts as present a query response interval (1 s, above) after br0
  # came up. A job whose workers joined a LAN multicast group within that second lost the group
  # on some ports (bench.py, 8 workers, the first run on a fresh rack: a rank got every result
  # as a unicast retransmission and none through the group, 2 runs of 2; after this wait, 0 of
  # 2), so the rack is handed over only after it.
  sleep 1.5
  trap - EXIT INT TERM
}

print_env() {
  local i wns="" wips="" sns="" sips=""
  for ((i = 0; i < workers; i++)); do
    wns+="${wns:+ }$(ns_w "$i")"
    wips+="${wips:+ }$(worker_ip "$i")"
  done
  for ((i = 0; i < switch_hosts; i++)); do
    sns+="${sns:+ }$(ns_s "$i")"
    sips+="${sips:+ }$(switch_host_ip "$i")"
  done
  cat <<EOF
RACK_NAME=$name
RACK_WORKERS=$workers
RACK_SWITCH_NS=$ns_sw
RACK_SWITCH_IP=$(switch_ip)
RACK_WORKER_NS="$wns"
RACK_WORKER_IPS="$wips"
RACK_SWITCH_HOSTS=$switch_hosts
RACK_SWITCH_HOST_NS="$sns"
RACK_SWITCH_HOST_IPS="$sips"
RACK_SUBNET=$kSubnet.0/24
RACK_RATE=$rate
RACK_MTU=$mtu
RACK_SCRIPT=$(realpath "$0")
EOF
}

# For commands on an existing rack: its worker count from its namespaces.
existing_rack() {
  need_root
  local n
  n=$(rack_namespaces | grep -c -E -- '-w[0-9]+$' || true)
  if ! rack_namespaces | grep -qx "$ns_sw" || [ "$n" -eq 0 ]; then
    echo "rack: no rack named '$name' (scripts/rack.sh up --name $name)" >&2
    exit 1
  fi
  workers=$n
  switch_hosts=$(rack_namespaces | grep -c -E -- '-s[0-9]+$' || true)
  # Port p0 is shaped in both modes (its egress; eth0 is not with --ingress-shaping).
  rate=$(ip netns exec "$ns_sw" tc qdisc show dev p0 | sed -n 's/.* rate \([^ ]*\).*/\1/p')
  rate=${rate:-none}
  mtu=$(ip -n "$(ns_w 0)" -o link show eth0 | sed -n 's/.* mtu \([0-9]*\).*/\1/p')
}

case "$cmd" in
  up)
    rack_up
    echo "rack: up: $name, $workers workers, $switch_hosts switch hosts, rate" \
      "${rate}${burst:+ (burst $burst)}, MTU $mtu, bridge netfilter $bridge_netfilter" \
      "(scripts/rack.sh down --name $name removes it)" >&2
    print_env
    ;;
  down)
    need_root
    rack_down
    ;;
  env)
    existing_rack
    print_env
    ;;
  status)
    existing_rack
    print_env
    for ns in $(rack_namespaces); do
      echo "== $ns"
      ip -n "$ns" -br addr show
      ip netns exec "$ns" tc qdisc show | grep -v "qdisc noqueue" || true
    done
    ;;
  exec)
    [ ${#command_args[@]} -gt 0 ] || die "exec needs a command after --"
    existing_rack
    case "$where" in
      sw) ns="$ns_sw" ;;
      "") die "exec needs --in sw, --in WORKER_INDEX or --in sJ (switch host J)" ;;
      s[0-9]*)
        [[ "$where" =~ ^s([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "$switch_hosts" ] ||
          die "--in sJ names a switch host 0..$((switch_hosts - 1)), not '$where'"
        ns=$(ns_s "${BASH_REMATCH[1]}")
        ;;
      *)
        [[ "$where" =~ ^[0-9]+$ ]] && [ "$where" -lt "$workers" ] ||
          die "--in must be sw or a worker index 0..$((workers - 1)), not '$where'"
        ns=$(ns_w "$where")
        ;;
    esac
    exec ip netns exec "$ns" "${command_args[@]}"
    ;;
  run)
    [ ${#command_args[@]} -gt 0 ] || die "run needs a command after --"
    rack_up
    trap 'rack_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    echo "rack: up: $name, $workers workers, $switch_hosts switch hosts, rate" \
      "${rate}${burst:+ (burst $burst)}, MTU $mtu, bridge netfilter $bridge_netfilter" >&2
    set -a
    eval "$(print_env)"
    set +a
    rc=0
    "${command_args[@]}" || rc=$?
    exit "$rc"
    ;;
esac
