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
#include "transport/options.h"
#include "transport/transport.h"

namespace switchml::transport {

// A network interface of this host, as a multicast member needs it.
struct NetInterface {
  std::string name;    // e.g. "eth0"
  uint32_t index = 0;  // if_nametoindex
  uint32_t ipv4 = 0;   // the address that selected it, host order
  bool loopback = false;
  bool multicast = false;  // IFF_MULTICAST
  uint32_t mtu = 0;        // SIOCGIFMTU (0: unknown)
};

// The interface this host reaches `destination` through (host order): the one holding
// `source` when that is not 0, else the one holding the source address the kernel's routing
// picks for the destination. Errors name the destination and what failed.
Result<NetInterface> InterfaceToward(uint32_t destination, uint32_t source);

// Opens a UDP transport bound to options.bind_ipv4:options.port, with options.udp (options.h:
// offloads, socket buffers, multicast TTL); kind and loss are the factory's and ignored here.
// local_endpoint() reports the
// bound address and the actual port (ipv4 0 when bound to INADDR_ANY). Errors name the address
// and say what to do (port in use: kUnavailable; address not local or bad options:
// kInvalidArgument; privileged port: kFailedPrecondition).
Result<std::unique_ptr<Transport>> OpenUdp(const TransportOptions& options);

// Opens `count` transports on consecutive ports base.port .. base.port + count - 1 (all with the
// other options of base), e.g. one per worker thread. With base.port == 0 it draws a random base
// in [20000, 32000) and retries (up to 200 times) while some port of the range is in use.
Result<std::vector<std::unique_ptr<Transport>>> OpenUdpConsecutive(const TransportOptions& base,
                                                                   size_t count);

}  // namespace switchml::transport
