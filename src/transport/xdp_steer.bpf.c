// The XDP program of the AF_XDP transport (xdp.h): steers IPv4/UDP datagrams whose destination
// port is in `ports` to the AF_XDP socket at that entry's index of `xsks`; passes everything
// else (ARP, TCP such as gRPC control traffic, other UDP, IP fragments, IP options) to the
// kernel. Compiled at build time with clang -target bpf and embedded in the library.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// The transports' AF_XDP sockets, by index.
struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, 64);
  __type(key, __u32);
  __type(value, __u32);
} switchml_xsks SEC(".maps");

// UDP destination port (network byte order) -> index in switchml_xsks.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 64);
  __type(key, __u16);
  __type(value, __u32);
} switchml_ports SEC(".maps");

SEC("xdp")
int switchml_steer(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* end = (void*)(long)ctx->data_end;
  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP)) return XDP_PASS;
  struct iphdr* ip = (void*)(eth + 1);
  if ((void*)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP) return XDP_PASS;
  if (ip->frag_off & bpf_htons(0x3fff)) return XDP_PASS;  // a fragment: the kernel reassembles
  struct udphdr* udp = (void*)(ip + 1);
  if ((void*)(udp + 1) > end) return XDP_PASS;
  __u16 port = udp->dest;
  __u32* index = bpf_map_lookup_elem(&switchml_ports, &port);
  if (!index) return XDP_PASS;
  return bpf_redirect_map(&switchml_xsks, *index, XDP_PASS);
}

char _license[] SEC("license") = "GPL";
