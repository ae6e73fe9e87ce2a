// The in-process backend: a simulated datagram network for tests and simulations, with seeded
// loss, duplication and reordering.
//
// A MemoryNetwork routes datagrams between the transports attached to it by exact endpoint
// (ipv4 and port). Each attached endpoint has an unbounded receive queue. Faults are applied per
// datagram at Send:
//   - dropped with probability `loss`;
//   - otherwise enqueued twice with probability `duplicate`;
//   - each enqueued copy, with probability `reorder`, is inserted at a random position among the
//     last kReorderWindow datagrams already queued instead of at the tail (so reordering needs a
//     backlog: a receiver that drains after every datagram sees none).
// Datagrams to an endpoint nothing is attached to are counted as dropped. The source endpoint of
// a received datagram is the sender's local endpoint.
//
// Ownership and lifetime: Attach returns a Transport that refers to the network; the network
// must outlive every transport attached to it (its destructor CHECKs that none is left). A
// transport detaches on destruction; datagrams still queued for it are discarded.
// Thread-safety: the network and its transports are thread-safe (one mutex guards everything;
// each endpoint has its own condition variable). With a fixed seed and all sends made from one
// thread, the sequence of faults and thus of delivered datagrams is deterministic.
// Blocking: Send never blocks; Receive waits up to its timeout or until Wake().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "base/endpoint.h"
#include "transport/transport.h"

namespace switchml::transport {

struct FaultOptions {
  double loss = 0;       // probability in [0, 1]
  double duplicate = 0;  // probability in [0, 1]
  double reorder = 0;    // probability in [0, 1]
  uint64_t seed = 1;
  // Probability in [0, 1] that a copy is held back and delivered only after 1..late_span more
  // datagrams have been sent on the network (a copy that is late by many round trips).
  double late = 0;
  uint32_t late_span = 256;
};

struct MemoryNetworkCounters {
  uint64_t delivered = 0;   // copies placed in a receive queue (duplicates included)
  uint64_t dropped = 0;     // lost by the loss fault or sent to an unattached endpoint
  uint64_t duplicated = 0;  // extra copies enqueued by the duplicate fault
  uint64_t reordered = 0;   // copies inserted ahead of already queued datagrams
  uint64_t delayed = 0;     // copies held back by the late fault
};

class MemoryNetwork {
 public:
  static constexpr size_t kReorderWindow = 8;

  // CHECKs that the probabilities are within [0, 1].
  explicit MemoryNetwork(FaultOptions faults = {});
  MemoryNetwork(const MemoryNetwork&) = delete;
  MemoryNetwork& operator=(const MemoryNetwork&) = delete;
  ~MemoryNetwork();

  // Attaches a transport receiving at `local`. Port 0 picks a free port (from 49152 up) on that
  // address. CHECKs that `local` is not already attached (a test bug, not an input error).
  // Datagrams longer than max_datagram_bytes are received cut to it and flagged truncated.
  std::unique_ptr<Transport> Attach(Endpoint local, size_t max_datagram_bytes = 2048);

  MemoryNetworkCounters counters() const;

 private:
  class MemoryTransport;
  struct Datagram {
    Endpoint source;
    std::vector<uint8_t> data;
  };
  struct Queue {
    std::deque<Datagram> datagrams;
    std::condition_variable ready;
    bool woken = false;
  };

  // All of these run with mu_ held.
  void Deliver(const Endpoint& source, const TxDatagram& datagram);
  void Enqueue(Queue& queue, const Endpoint& source, std::span<const uint8_t> data);
  double Uniform();

  const FaultOptions faults_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  std::unordered_map<Endpoint, std::unique_ptr<Queue>> queues_;
  MemoryNetworkCounters counters_;
  uint16_t next_ephemeral_port_ = 49152;
  // Copies held back by the late fault, released when sends_ reaches release_at.
  struct Held {
    uint64_t release_at;
    Endpoint destination;
    Datagram datagram;
  };
  std::vector<Held> held_;
  uint64_t sends_ = 0;
};

}  // namespace switchml::transport
