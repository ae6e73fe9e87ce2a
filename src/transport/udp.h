// The kernel UDP backend: one nonblocking IPv4 UDP socket per Transport, batched with
// sendmmsg/recvmmsg and, where the kernel has them, UDP segmentation offloads (GSO on send, GRO
// on receive), waiting with poll() on the socket plus an eventfd for Wake().
//
// Ownership: the returned Transport owns its socket and eventfd and closes them on destruction.
// Thread-safety: as Transport (one thread uses it; Wake() and counters() from any thread).
// Blocking: Send never blocks (a full send buffer returns fewer taken); Receive blocks up to
// its timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/status.h"
#include "transport/transport.h"

namespace switchml::transport {

struct UdpOptions {
  uint32_t bind_ipv4 = 0;             // host order; 0 = INADDR_ANY
  uint16_t port = 0;                  // 0 = ephemeral
  int socket_buffer_bytes = 4 << 20;  // SO_RCVBUF and SO_SNDBUF; <= 0 keeps the system default
  size_t max_batch = 64;              // messages per sendmmsg/recvmmsg call; >= 1
  // Received datagrams longer than this are cut to it and flagged truncated; TxBuffer's size.
  size_t max_datagram_bytes = 2048;
  // UDP segmentation offloads, each used only where the kernel supports it (checked when the
  // socket opens; without them the transport falls back to plain batched I/O):
  //   GSO: consecutive datagrams of a Send batch to one destination with one length leave in
  //        one sendmsg (UDP_SEGMENT), up to 64 datagrams or 64 KiB;
  //   GRO: the kernel hands over runs of datagrams of one flow as one buffer (UDP_GRO), which
  //        Receive splits again.
  // Either way the datagrams on the wire are the same.
  bool gso = true;
  bool gro = true;
  // Datagrams sent to multicast groups (docs/architecture.md, "Multicast results"): 0, only
  // within this host (loopback interface, TTL 0); 1..255, on the interface holding bind_ipv4
  // (which must be a specific, non-loopback address) with that TTL, not looped back.
  int multicast_ttl = 0;
};

// A network interface of this host, as a multicast member needs it.
struct NetInterface {
  std::string name;    // e.g. "eth0"
  uint32_t index = 0;  // if_nametoindex
  uint32_t ipv4 = 0;   // the address that selected it, host order
  bool loopback = false;
  bool multicast = false;  // IFF_MULTICAST
};

// The interface this host reaches `destination` through (host order): the one holding
// `source` when that is not 0, else the one holding the source address the kernel's routing
// picks for the destination. Errors name the destination and what failed.
Result<NetInterface> InterfaceToward(uint32_t destination, uint32_t source);

// Opens a UDP transport bound to options.bind_ipv4:options.port. local_endpoint() reports the
// bound address and the actual port (ipv4 0 when bound to INADDR_ANY). Errors name the address
// and say what to do (port in use: kUnavailable; address not local or bad options:
// kInvalidArgument; privileged port: kFailedPrecondition).
Result<std::unique_ptr<Transport>> OpenUdp(const UdpOptions& options);

// Opens `count` transports on consecutive ports base.port .. base.port + count - 1 (all with the
// other options of base), e.g. one per worker thread. With base.port == 0 it draws a random base
// in [20000, 32000) and retries (up to 200 times) while some port of the range is in use.
Result<std::vector<std::unique_ptr<Transport>>> OpenUdpConsecutive(const UdpOptions& base,
                                                                   size_t count);

}  // namespace switchml::transport
