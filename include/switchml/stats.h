// ContextStats: what a worker's Context has counted so far (Context::stats()), a plain value with
// no behaviour, kept apart from context.h so that a consumer of the figures (a metrics exporter, a
// report) needs only this header, not the Context that produces them.
#pragma once

#include <cstdint>

namespace switchml {

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

}  // namespace switchml
