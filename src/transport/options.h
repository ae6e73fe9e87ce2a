// TransportOptions: what opening a transport takes, for every backend. The fields every backend
// reads come once (address, port, sizes, role, loss); what only one backend reads lives in that
// backend's struct (udp, xdp, dpdk, shm), which the other backends ignore, so that a caller may
// set, say, shm.ring_slots whatever kind it opens.
//
// The factory (factory.h) opens a kind from these options; environment.h fills the backend
// structs from the SWITCHML_* variables of dpdk, xdp and shm (the only place that reads them).
// The backends' own Open functions (udp.h, xdp.h, dpdk.h, shm.h) take the same struct and ignore
// `kind`, `loss` and `loss_seed` (the factory's business).
// Plain data: no I/O, no environment.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "switchml/status.h"

namespace switchml::transport {

inline constexpr const char* kDefaultTransportKind = "udp";

// Kernel UDP (udp.h).
struct UdpOptions {
  // UDP segmentation offloads, each used only where the kernel supports it (checked when the
  // socket opens; without them the transport falls back to plain batched I/O):
  //   GSO: consecutive datagrams of a Send batch to one destination with one length leave in
  //        one sendmsg (UDP_SEGMENT), up to 64 datagrams or 64 KiB;
  //   GRO: the kernel hands over runs of datagrams of one flow as one buffer (UDP_GRO), which
  //        Receive splits again.
  // Either way the datagrams on the wire are the same. The factory's "udp-plain" turns both off.
  bool gso = true;
  bool gro = true;
  int socket_buffer_bytes = 4 << 20;  // SO_RCVBUF and SO_SNDBUF; <= 0 keeps the system default
  // Datagrams sent to multicast groups (docs/architecture.md, "Multicast results"): 0, only
  // within this host (loopback interface, TTL 0); 1..255, on the interface holding bind_ipv4
  // (which must be a specific, non-loopback address) with that TTL, not looped back.
  int multicast_ttl = 0;
};

// How AF_XDP attaches its program (SWITCHML_XDP_MODE).
enum class XdpAttachMode { kAuto, kNative, kGeneric };

// AF_XDP (xdp.h). Each field's variable in brackets (environment.h).
struct XdpOptions {
  // [SWITCHML_XDP_IFACE] empty: the interface of bind_ipv4 (xdp.h).
  std::string interface;
  // [SWITCHML_XDP_QUEUE] the interface queue the sockets bind.
  uint32_t queue = 0;
  // [SWITCHML_XDP_MODE] auto: native where the driver has it, else generic.
  XdpAttachMode mode = XdpAttachMode::kAuto;
  // [SWITCHML_XDP_COPY] never try zero-copy.
  bool copy_only = false;
  // [SWITCHML_XDP_DEBUG] print libbpf's warnings (the verifier's log).
  bool debug = false;
  // [SWITCHML_XDP_LOCK_DIR] the interface lock files' directory; empty: private_dir.h's default.
  std::string lock_dir;
};

// A static neighbour of the dpdk transport (SWITCHML_DPDK_NEIGH).
struct DpdkNeighbour {
  uint32_t ipv4 = 0;  // host order
  std::array<uint8_t, 6> mac{};
};

// DPDK (dpdk.h). Each field's variable in brackets (environment.h).
struct DpdkOptions {
  std::string device;  // [SWITCHML_DPDK_DEVICE] "memif" (the default) or a device (dpdk.h)
  // [SWITCHML_DPDK_EAL] EAL's arguments, used by the first open of the process; empty: dpdk.h's
  // default.
  std::string eal_args;
  // [SWITCHML_DPDK_MEMIF_INTERFACES] memif server interfaces per data port (the worker threads
  // that may connect to one shard), 1..256.
  uint32_t memif_interfaces = 8;
  std::string memif_socket = "switchml-memif";  // [SWITCHML_DPDK_MEMIF_SOCKET] socket prefix
  // [SWITCHML_DPDK_LOCK_DIR] the doorbells' and memif id locks' directory, opened by the first
  // open of the process; empty: private_dir.h's default.
  std::string lock_dir;
  std::vector<DpdkNeighbour> neighbours;  // [SWITCHML_DPDK_NEIGH]
  // Waiting (dpdk.h, "Waiting"):
  // [SWITCHML_DPDK_DOORBELL=on|off] memif: ring sleeping peers, and sleep until rung.
  bool doorbells = true;
  // [SWITCHML_DPDK_POLL=spin] never sleep until the timeout.
  bool spin_only = false;
  // [SWITCHML_DPDK_SPIN] polls before yielding; [SWITCHML_DPDK_YIELD_US] yields before napping;
  // [SWITCHML_DPDK_NAP_US], [SWITCHML_DPDK_MAX_NAP_US] the naps; [SWITCHML_DPDK_MAX_SLEEP_US] the
  // longest sleep on a doorbell. Naps and sleeps are at least 1 us.
  uint32_t spin_polls = 0;
  std::chrono::microseconds yield_for{0};
  std::chrono::microseconds first_nap{20};
  std::chrono::microseconds max_nap{1000};
  std::chrono::microseconds max_sleep{10000};
};

// Shared memory (shm.h).
struct ShmOptions {
  // [SWITCHML_SHM_DIR] where the inboxes live; empty: /dev/shm/switchml-<uid>.
  std::string directory;
  // Slots of each ring of this transport's inbox (a power of two, 2 .. 65536) and rings
  // (senders) per inbox (1 .. 4096). (The switch daemon and the workers choose smaller rings:
  // kShmDataPlaneRingSlots; a worker sizes its own from its window, context.cc.)
  uint32_t ring_slots = 1024;
  uint32_t max_senders = 256;
  // Receive polls its rings this long before it sleeps (0: sleeps at once).
  std::chrono::nanoseconds spin{0};
};

struct TransportOptions {
  std::string kind = kDefaultTransportKind;  // a name of the factory's table (factory.h)
  uint32_t bind_ipv4 = 0;  // host order; 0 = any (each backend says what it makes of it)
  uint16_t port = 0;       // 0 = pick (OpenTransports: a random free range)
  // Received datagrams longer than this are cut to it and flagged truncated; TxBuffer's size.
  size_t max_datagram_bytes = 2048;
  size_t max_batch = 64;  // datagrams per system call or burst; >= 1
  // The switch's data plane rather than a worker's (dpdk memif: the server side).
  bool switch_side = false;
  // Drop this fraction of datagrams in each direction (received, and each sent), seeded: for
  // exercising loss recovery. 0 = no wrapper (lossy.h).
  double loss = 0;
  uint64_t loss_seed = 1;

  UdpOptions udp;
  XdpOptions xdp;
  DpdkOptions dpdk;
  ShmOptions shm;

  // OK, or a message naming the bad field and the accepted values (a kind of the factory's
  // table; loss in [0, 1)). Defined in factory.cc.
  Status Validate() const;
};

}  // namespace switchml::transport
