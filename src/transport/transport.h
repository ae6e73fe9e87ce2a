// Datagram transports: move datagrams between endpoints and know nothing of SwitchML.
//
// One interface; backends are chosen by name through one factory (factory.h lists them: "udp",
// kernel UDP with segmentation offloads; "udp-plain", kernel UDP without them; "xdp", AF_XDP;
// "dpdk", memif or a DPDK device; "shm", shared-memory rings between the processes of one host)
// or made directly (memory.h: an in-process network with seeded loss, duplication and
// reordering for tests). Wrappers add behaviour to any backend (lossy.h: seeded loss injection;
// auth.h: per-datagram tags).
//
// Buffers are lent by the transport in both directions, so that a backend with its own packet
// memory (AF_XDP, DPDK) can plug in without copies:
//   - Receive fills RxDatagram views into the transport's memory, valid until the next Receive;
//   - TxBuffer(i) lends the storage for the i-th datagram of the next Send; a TxDatagram may
//     also point at caller-owned memory (a transport copies what it does not own);
//   - where the backend allows (DPDK), a received datagram's memory is also lent for a reply
//     built over it (RxDatagram::reply_buffer), sent like a TxBuffer;
//   - TxBufferTo(i, destination) lends, where the backend allows (shm), memory of the
//     destination itself (for a multicast group: the group's ring, which all its members read):
//     the datagram is built where its receivers read it, and Send only publishes it.
// Thread-safety: a Transport is used by one thread, except Wake() and counters(), which any
// thread may call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/endpoint.h"
#include "switchml/status.h"

namespace switchml::transport {

struct TxDatagram {
  Endpoint destination;
  std::span<const uint8_t> data;
};

struct RxDatagram {
  // The datagram, in memory lent by the transport; valid until the next Receive() call. A
  // datagram longer than the transport's max_datagram_bytes is cut to that length and flagged.
  std::span<const uint8_t> data;
  Endpoint source;
  bool truncated = false;
  // Where the backend allows it (DPDK), the memory of the datagram lent for a reply built over
  // it: it starts at data.data(), and the caller may write a datagram of up to its size there
  // (the received bytes are then gone) and pass it to the next Send, before the next Receive, as
  // it would a TxBuffer: sent without a copy (a switch answering in place). Empty otherwise.
  std::span<uint8_t> reply_buffer;
};

// Counters of a transport since it was opened (relaxed snapshots; readable from any thread).
// A field a backend does not track stays 0.
struct TransportCounters {
  uint64_t datagrams_sent = 0;
  uint64_t datagrams_received = 0;
  uint64_t send_errors = 0;       // datagrams skipped after a per-destination error (e.g. refused)
  uint64_t truncated = 0;         // received datagrams longer than max_datagram_bytes
  uint64_t send_buffer_full = 0;  // Send calls that stopped early on a full send buffer
  uint64_t send_calls = 0;        // system calls (or equivalent) that sent datagrams
  uint64_t receive_calls = 0;     // system calls (or equivalent) that returned datagrams
  uint64_t segmented_sends = 0;   // sends that carried several datagrams as one (UDP GSO)
  uint64_t coalesced_receives = 0;  // receives that returned several datagrams as one (UDP GRO)
  uint64_t loss_dropped_in = 0;     // dropped on purpose by a loss wrapper, received
  uint64_t loss_dropped_out = 0;    // dropped on purpose by a loss wrapper, sent
  uint64_t auth_dropped = 0;  // received from a keyed peer with a tag that did not verify (auth.h)
  uint64_t group_datagrams_received = 0;  // of datagrams_received, through a joined group
  uint64_t malformed = 0;      // received entries that broke the backend's framing, dropped (shm.h)
  uint64_t doorbells = 0;      // wake-ups of sleeping receivers that sends rang (shm.h)
  uint64_t sent_in_place = 0;  // of datagrams_sent, built in their destination's memory (shm.h)
};

// A counter that one thread adds to and any thread reads (relaxed: a snapshot, not a fence).
class SingleWriterCounter {
 public:
  void Add(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// The counters that every backend driven by one I/O thread keeps (UDP, AF_XDP), and their
// snapshot; a backend fills the fields only it keeps into the snapshot itself.
struct SingleWriterTransportCounters {
  SingleWriterCounter datagrams_sent, datagrams_received, send_errors, truncated, send_buffer_full,
      send_calls, receive_calls;
  TransportCounters Snapshot() const;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The address this transport receives on.
  virtual Endpoint local_endpoint() const = 0;

  // The longest datagram this transport receives whole and lends per TxBuffer.
  virtual size_t max_datagram_bytes() const = 0;

  // Hands up to batch.size() datagrams to the network, in order; returns how many were taken
  // (fewer when the send buffer is full: the caller retries the rest later). An error only for
  // a failure of the transport itself, never for one unreachable destination (counted instead).
  // Consecutive datagrams to the same destination with the same length may leave as one
  // segmented send: callers that group their datagrams by destination send faster.
  virtual Result<size_t> Send(std::span<const TxDatagram> batch) = 0;

  // Receives up to batch.size() datagrams into views of the transport's memory, each valid
  // until the next Receive() call. Waits at most `timeout` for the first one (zero: do not
  // wait; more than a day: until data or Wake()); returns 0 on timeout or when woken by Wake().
  virtual Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) = 0;

  // Makes a Receive() blocked in another thread return early. Thread-safe.
  virtual void Wake() = 0;

  // Storage of max_datagram_bytes() for the index-th datagram of the caller's next Send batch,
  // lent by the transport; index < kTxBuffers. Call it again for each batch: a backend with
  // packet memory (AF_XDP) lends another frame for an index whose last one is still in flight.
  // A backend without packet memory of its own lends plain memory allocated and touched once.
  static constexpr size_t kTxBuffers = 1024;
  virtual std::span<uint8_t> TxBuffer(size_t index);

  // As TxBuffer(index), for a datagram the caller will send to `destination`. A backend whose
  // receivers read datagrams from memory it writes (shm) lends the destination's own memory
  // where it has room, so that Send takes the datagram without a copy; others lend
  // TxBuffer(index). The rules that make that possible:
  //   - pass the datagrams built in such buffers to Send in index order, each to the
  //     destination it was lent for (any may be left out: an abandoned buffer costs nothing);
  //     a datagram sent out of that order is still delivered, but may overwrite the memory of
  //     a later one of the same batch;
  //   - once Send has taken the datagram the memory is the destination's: do not write it
  //     again (unlike TxBuffer's); what Send has not taken stays the caller's until the next
  //     call for index 0, which starts another batch.
  virtual std::span<uint8_t> TxBufferTo(size_t index, const Endpoint& destination) {
    return TxBuffer(index);
  }

  virtual TransportCounters counters() const = 0;

  // Multicast results (docs/architecture.md, "Multicast results"): also receive the datagrams
  // sent to the multicast group `group` (an address in 239.0.0.0/8 and a port), joined on the
  // interface with index `interface_index` (0: the loopback interface, for groups of this host),
  // from the next Receive on, until LeaveGroup. Kernel UDP and shm (groups of this host only:
  // shm.h, "Groups") have it; others return UNIMPLEMENTED (wrappers do not pass it on). Datagrams
  // that came through the group are counted in TransportCounters::group_datagrams_received.
  // LeaveGroup ends the views of the last Receive too (shm unmaps the group's ring): call it
  // only once they are no longer read.
  virtual Status JoinGroup(const Endpoint& group, uint32_t interface_index);
  virtual void LeaveGroup() {}

  // A name for logs and reports: "udp (GSO, GRO)", "udp-plain", "memory", "lossy(udp ...)".
  virtual std::string name() const = 0;

 private:
  std::vector<uint8_t> tx_arena_;  // the default TxBuffer's memory, made on first use
};

// Opens `count` transports on consecutive ports, one per worker thread: from base_port, or, with
// base_port 0, from a random base in [20000, 32000) (below Linux's ephemeral range), trying
// another base while a port of the range is taken. open_one(port, &in_use) opens one transport
// and sets in_use when its port was taken. `kind` ("UDP", "shm"), `where` (" on 0.0.0.0") and
// `if_busy` (what the user can do) go into the errors.
using OpenOnePort = std::function<Result<std::unique_ptr<Transport>>(uint16_t port, bool* in_use)>;
Result<std::vector<std::unique_ptr<Transport>>> OpenOnConsecutivePorts(
    uint16_t base_port, size_t count, const std::string& kind, const std::string& where,
    const std::string& if_busy, const OpenOnePort& open_one);

}  // namespace switchml::transport
