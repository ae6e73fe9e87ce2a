# Sourced by the namespace tests (netns_test.sh, jumbo_netns_test.sh).
#
# skip_without_netns: exits 77 (skipped), saying why, unless this is root with iproute2.
skip_without_netns() {
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    echo "SKIPPED: needs root and iproute2 to create network namespaces"
    exit 77
  fi
}

# make_hosts TAG NET MTU HOST...: a namespace TAG-br with a bridge br0 (exits 77, skipped, where
# namespaces cannot be made here) and, for each HOST in order, a namespace TAG-HOST joined to the
# bridge by a veth pair of that MTU ("" for the kernel's default), its end named eth0 with address
# NET.1, NET.2, ... (/24), up with lo.
make_hosts() {
  local tag=$1 net=$2 mtu=$3
  shift 3
  local mtu_args=() i=1 h
  [ -n "$mtu" ] && mtu_args=(mtu "$mtu")
  if ! ip netns add "$tag-br" 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here (ip netns add failed)"
    exit 77
  fi
  ip -n "$tag-br" link add br0 type bridge
  ip -n "$tag-br" link set br0 up
  for h in "$@"; do
    ip netns add "$tag-$h"
    ip link add "$tag-$h-a" "${mtu_args[@]}" type veth peer name "$tag-$h-b" "${mtu_args[@]}"
    ip link set "$tag-$h-a" netns "$tag-$h"
    ip link set "$tag-$h-b" netns "$tag-br"
    ip -n "$tag-br" link set "$tag-$h-b" master br0 up
    ip -n "$tag-$h" link set "$tag-$h-a" name eth0
    ip -n "$tag-$h" addr add "$net.$i/24" dev eth0
    ip -n "$tag-$h" link set eth0 up
    ip -n "$tag-$h" link set lo up
    i=$((i + 1))
  done
}
