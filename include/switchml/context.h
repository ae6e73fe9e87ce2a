// Context: one worker's membership in a SwitchML job, and its all-reduce operations.
//
//   switchml::Config config;  config.rank = r;  config.num_workers = n;  ...
//   auto ctx = switchml::Context::Create(config);      // joins the job on the switch
//   if (!ctx.ok()) { std::cerr << ctx.status().ToString(); ... }
//   Status st = (*ctx)->AllReduce(in, out, count, switchml::DataType::kFloat32);
//
// Not a singleton: several contexts may live in one process (each is its own worker).
// Thread-safety: all methods may be called from any thread; all-reduces are carried out in the
// order they were submitted, which must be the same order on every worker of the job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "switchml/config.h"
#include "switchml/export.h"
#include "switchml/rendezvous.h"
#include "switchml/status.h"
#include "switchml/types.h"

namespace switchml {

class Context;

// The handle of an asynchronous all-reduce. Copyable; all copies refer to the same operation.
class SWITCHML_EXPORT AllReduceHandle {
 public:
  AllReduceHandle() = default;
  // Blocks until the operation ends; returns its outcome.
  Status Wait() const;
  // True when the operation has ended (then Wait() does not block).
  bool Test() const;

 private:
  friend class Context;
  struct State;
  explicit AllReduceHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

struct ContextStats {
  uint64_t packets_sent = 0;
  uint64_t packets_retransmitted = 0;
  uint64_t timeouts = 0;
  uint64_t results = 0;
  uint64_t duplicates_dropped = 0;
  uint64_t stale_dropped = 0;
  uint64_t malformed_dropped = 0;
  // Round trips measured (results of packets sent once) and times the retransmission timeout
  // doubled, summed over the worker threads.
  uint64_t rtt_samples = 0;
  uint64_t backoffs = 0;
  // Gauges, the largest over the worker threads (0 before the first round trip was measured):
  // the smoothed round trip, its variation and the retransmission timeout now, in microseconds.
  double srtt_us = 0;
  double rttvar_us = 0;
  double rto_us = 0;
  // Datagrams from a source other than the switch's data ports (dropped unread: only the switch
  // may deliver results).
  uint64_t foreign_source_dropped = 0;
  // With Config::authenticate_data: datagrams whose tag did not verify under the job's key
  // (forged, altered or cut short; dropped unread, before the source check).
  uint64_t auth_dropped = 0;
  // The worker threads' transports: datagrams received, those of them through the job's
  // multicast group (docs/architecture.md, "Multicast results"), and receives that returned a
  // run of datagrams as one buffer (UDP GRO).
  uint64_t datagrams_received = 0;
  uint64_t group_datagrams_received = 0;
  uint64_t coalesced_receives = 0;
  // A job striped over several switch hosts (Config::switch_hosts): the hosts still alive, the
  // failovers off a host that died (per worker thread, the largest), and the blocks aggregated
  // again because of them (summed over the threads).
  uint32_t switch_hosts_alive = 0;
  uint64_t failovers = 0;
  uint64_t blocks_repaired = 0;
  // Block-sparse all-reduces (Config::sparse): how many ran, the blocks (packets) of their
  // tensors, of those the ones non-zero here, and the union's (non-zero on some worker: the only
  // ones aggregated; the rest never crossed the network).
  uint64_t sparse_allreduces = 0;
  uint64_t sparse_blocks = 0;
  uint64_t sparse_own_blocks = 0;
  uint64_t sparse_union_blocks = 0;
  // Of those all-reduces' worker-thread shares, the ones aggregated whole, dense (every block in
  // the union, or Config::sparse_auto's choice), and the blocks that crossed the network (the
  // union's, or a dense share's every block).
  uint64_t sparse_dense_shares = 0;
  uint64_t sparse_aggregated_blocks = 0;
};

class SWITCHML_EXPORT Context {
 public:
  // Validates the config, opens the data-plane transports (one per worker thread) and registers
  // this worker in the job on the switch (on every host of a striped job), meeting the other
  // workers (blocks until every worker has joined, or setup_timeout).
  static Result<std::unique_ptr<Context>> Create(const Config& config);
  // The same, meeting the other workers through `rendezvous` (session-id broadcast, setup
  // barriers, Barrier()) instead of the switch's control plane; null means the control plane.
  // The Context keeps it until destroyed.
  static Result<std::unique_ptr<Context>> Create(const Config& config,
                                                 std::shared_ptr<Rendezvous> rendezvous);
  ~Context();  // stops the worker threads; pending operations fail with CANCELLED

  // Sums `count` elements of every worker's `in` into every worker's `out` (in == out allowed;
  // buffers that overlap otherwise are refused with INVALID_ARGUMENT).
  // Blocks until done. int32 sums are exact (32-bit wrap-around); float32 sums are quantized.
  Status AllReduce(const void* in, void* out, size_t count, DataType dtype);
  // Starts an all-reduce and returns at once; the buffers must stay valid until it ends.
  Result<AllReduceHandle> AllReduceAsync(const void* in, void* out, size_t count, DataType dtype);
  // Waits for every operation submitted so far; returns the first failure, if any.
  Status WaitForAll();
  // A barrier among the job's workers through the rendezvous (by default the switch's control
  // plane).
  Status Barrier();

  uint64_t session_id() const;
  const Config& config() const;
  ContextStats stats() const;

  class Impl;

 private:
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchml
