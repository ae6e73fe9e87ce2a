// The one place that turns a transport's name and options into a Transport, for the daemon, the
// worker library and the tools (`--transport`).
//
// Kinds: "udp" (kernel UDP with segmentation offloads where the kernel has them, else plain
// batched I/O), "udp-plain" (kernel UDP without offloads), "xdp" (AF_XDP, xdp.h: the
// interface of bind_ipv4; in builds without libxdp it opens with an error saying so) and "dpdk"
// (dpdk.h: memif between the processes of a host by default, or a DPDK device; in builds without
// libdpdk-dev it opens with an error saying so) and "shm" (shm.h: shared-memory rings between the
// processes of one host; the directory from $SWITCHML_SHM_DIR, else /dev/shm/switchml-<uid>).
// Kernel-bypass backends join this list by adding an entry to kTransportKinds and a case in
// factory.cc.
// With loss > 0 every transport is wrapped in a seeded loss injector (lossy.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/status.h"
#include "transport/transport.h"

namespace switchml::transport {

inline constexpr const char* kDefaultTransportKind = "udp";

struct TransportOptions {
  std::string kind = kDefaultTransportKind;
  uint32_t bind_ipv4 = 0;  // host order; 0 = any
  uint16_t port = 0;       // 0 = ephemeral (OpenTransports: a random free range)
  size_t max_datagram_bytes = 2048;
  size_t max_batch = 64;              // datagrams or messages per system call
  int socket_buffer_bytes = 4 << 20;  // kernel socket buffers; <= 0 keeps the system default
  // The switch's data plane rather than a worker's (dpdk memif: the server side).
  bool switch_side = false;
  // Datagrams to multicast groups (kernel UDP; udp.h UdpOptions::multicast_ttl): 0, within this
  // host only; 1..255, on the interface holding bind_ipv4 with that TTL.
  int multicast_ttl = 0;
  // shm: slots of each ring of this transport's inbox (a power of two, 2 .. 65536); 0: the
  // default of ShmOptions (shm.h). A worker sizes its own from its window (context.cc).
  uint32_t shm_ring_slots = 0;
  // Drop this fraction of datagrams in each direction (received, and each sent), seeded: for
  // exercising loss recovery. 0 = no wrapper.
  double loss = 0;
  uint64_t loss_seed = 1;
  // OK, or a message naming the bad field and the accepted values.
  Status Validate() const;
};

// The kinds OpenTransport accepts, for help texts and error messages.
std::vector<std::string> TransportKinds();

// Opens one transport bound to options.bind_ipv4:options.port.
Result<std::unique_ptr<Transport>> OpenTransport(const TransportOptions& options);

// Opens `count` transports on consecutive ports (one per worker thread); see OpenUdpConsecutive.
Result<std::vector<std::unique_ptr<Transport>>> OpenTransports(const TransportOptions& options,
                                                               size_t count);

}  // namespace switchml::transport
