// The transports' table: the one place that knows the kinds by name. Each entry is {name, open,
// capabilities}: the daemon, the worker library and the tools (`--transport`) open a kind by
// its name and ask its Capabilities what it can do; no code outside this file and factory.cc
// compares kind names.
//
// Kinds: "udp" (kernel UDP with segmentation offloads where the kernel has them, else plain
// batched I/O; udp.h), "udp-plain" (kernel UDP without offloads), "xdp" (AF_XDP, xdp.h: the
// interface of bind_ipv4; in builds without libxdp it opens with an error saying so), "dpdk"
// (dpdk.h: memif between the processes of a host by default, or a DPDK device; in builds without
// libdpdk-dev it opens with an error saying so) and "shm" (shm.h: shared-memory rings between the
// processes of one host). A backend joins by adding one entry to the table in factory.cc.
//
// Opening: OpenTransports checks the options, checks that the kind is in this build, fills the
// kind's backend options from the environment (environment.h: the SWITCHML_* variables of dpdk,
// xdp and shm, read there and nowhere else), opens `count` transports on consecutive ports and,
// with loss > 0, wraps each in a seeded loss injector (lossy.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "switchml/status.h"
#include "transport/environment.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace switchml::transport {

// What a kind can do, for the callers that adapt to it. Every field is a fact of the backend
// (the conformance suite checks the ones it can observe), not a policy.
struct Capabilities {
  // Receive lends each datagram's memory for a reply built over it (RxDatagram::reply_buffer).
  bool lends_receive_buffers = false;
  // TxBufferTo lends the destination's own memory (for a multicast group: the ring that all its
  // members read), so that a datagram is built where its receivers read it (group lending).
  bool lends_destination_memory = false;
  // JoinGroup and sends to multicast groups: of this host (interface index 0; loopback groups),
  // and on a LAN interface too.
  bool host_multicast = false;
  bool lan_multicast = false;
  // UDP segmentation offloads (GSO, GRO) where the kernel has them: a Send batch grouped by
  // destination leaves in fewer system calls.
  bool segmentation_offloads = false;
  // Every peer is a process of this host, sharing its cores: round trips are set by the
  // scheduler, not by a path (the automatic window's floor, `run`'s threads and pinning).
  bool host_local = false;
  // One process per network interface: the switch and its workers cannot share one (AF_XDP's
  // program is the interface's).
  bool one_process_per_interface = false;
  // A process that dies without closing its transports leaves files behind (shm's inboxes and
  // groups), which a supervisor removes (shm.h RemoveShmFilesLeftBy, RemoveOwnShmFiles).
  bool files_outlive_processes = false;
  // The longest datagram the kind carries whole (0: any a UDP datagram may be, 65507 bytes):
  // xdp one UMEM frame's room, dpdk one mbuf's. What packet sizes a switch or worker of this
  // kind may use (docs/protocol.md 2.6).
  size_t max_datagram_bytes = 0;
};

using Transports = std::vector<std::unique_ptr<Transport>>;

// One entry of the table.
struct TransportKind {
  const char* name;
  // Opens `count` transports on consecutive ports from options.port (0: a random free range),
  // with options already checked and filled from the environment.
  Result<Transports> (*open)(const TransportOptions& options, size_t count);
  Capabilities capabilities;
  // False when this build lacks the backend (opening it says why, before reading anything).
  bool (*built)();
  // Fills the kind's backend options from the environment (environment.h); nullptr: the kind
  // reads no variable.
  Status (*read_environment)(const EnvironmentLookup& env, TransportOptions* options);
};

// The table, in the order help texts list it.
const std::vector<TransportKind>& TransportTable();

// The entry of `name`, or nullptr.
const TransportKind* FindTransportKind(std::string_view name);

// The capabilities of `kind`; all false for a name that is not in the table.
Capabilities CapabilitiesOf(std::string_view kind);

// The kinds OpenTransport accepts, for help texts and error messages.
std::vector<std::string> TransportKinds();

// "auto" (Config::transport; not a kind of the table, so OpenTransports refuses it): a worker's
// choice made at setup from what the switch serves (Monitor.Status's transport), by
// ChooseAutoTransport.
inline constexpr std::string_view kAutoTransport = "auto";

// The kind a worker opens under "auto" when the switch's data plane serves kind `served` (its
// Monitor.Status answer; empty when the switch does not say) from data port `data_port`:
//   - kernel UDP ("udp", "udp-plain", or a switch that does not say): "udp", the fast kernel one
//     (the two differ only in offloads that each side uses or not on its own);
//   - "shm": "shm" when a live shm transport holds `data_port` in this process's shm directory
//     (shm.h ShmPortHeld; $SWITCHML_SHM_DIR through `env`, else /dev/shm/switchml-<uid>): the
//     switch runs on this host and shares the directory. Otherwise FAILED_PRECONDITION saying
//     so: such a switch is reachable by shm workers of its own host only;
//   - "xdp", "dpdk" and any other kind: FAILED_PRECONDITION naming the kind to set. Auto does
//     not pick them: they need a device, privileges or a process per interface of their own
//     (docs/xdp.md, docs/dpdk.md).
Result<std::string> ChooseAutoTransport(std::string_view served, uint16_t data_port,
                                        const EnvironmentLookup& env);

// Opens one transport bound to options.bind_ipv4:options.port (OpenTransports with count 1).
Result<std::unique_ptr<Transport>> OpenTransport(const TransportOptions& options);

// Opens `count` transports on consecutive ports (one per worker thread), as the header says.
Result<Transports> OpenTransports(const TransportOptions& options, size_t count);

}  // namespace switchml::transport
