#include "metrics/context_metrics.h"

#include <prometheus/collectable.h>

#include <utility>

#include "metrics/families.h"

namespace switchml::metrics {
namespace {

class ContextCollector final : public prometheus::Collectable {
 public:
  explicit ContextCollector(std::function<ContextStats()> read) : read_(std::move(read)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const ContextStats s = read_();
    std::vector<prometheus::MetricFamily> out;
    const auto counter = [&](const char* name, const char* help, uint64_t v) {
      Counter(name, help).Add(static_cast<double>(v)).MoveTo(&out);
    };
    const auto gauge = [&](const char* name, const char* help, double v) {
      Gauge(name, help).Add(v).MoveTo(&out);
    };
    counter("switchml_worker_packets_sent_total",
            "Data-plane packets sent, retransmissions included.", s.packets_sent);
    counter("switchml_worker_packets_retransmitted_total", "Packets sent again after a timeout.",
            s.packets_retransmitted);
    counter("switchml_worker_timeouts_total", "Retransmission timeouts that fired.", s.timeouts);
    counter("switchml_worker_results_total", "Slot results received and used.", s.results);
    counter("switchml_worker_duplicates_dropped_total", "Results received twice (dropped).",
            s.duplicates_dropped);
    counter("switchml_worker_stale_dropped_total", "Results of an earlier round or job (dropped).",
            s.stale_dropped);
    counter("switchml_worker_malformed_dropped_total",
            "Datagrams that are no valid result for this worker (dropped).", s.malformed_dropped);
    counter("switchml_worker_foreign_source_dropped_total",
            "Datagrams from a source other than the switch's data ports (dropped).",
            s.foreign_source_dropped);
    counter("switchml_worker_auth_dropped_total",
            "Datagrams whose authentication tag did not verify (dropped).", s.auth_dropped);
    counter("switchml_worker_datagrams_received_total",
            "Datagrams the worker's transports received.", s.datagrams_received);
    counter("switchml_worker_group_datagrams_received_total",
            "Of those, datagrams that came through the job's multicast group.",
            s.group_datagrams_received);
    counter("switchml_worker_coalesced_receives_total",
            "Receives that returned a run of datagrams at once (UDP GRO).", s.coalesced_receives);
    counter("switchml_worker_rtt_samples_total", "Round trips measured.", s.rtt_samples);
    counter("switchml_worker_backoffs_total", "Times the retransmission timeout doubled.",
            s.backoffs);
    // Block-sparse all-reduces (Config::sparse; docs/protocol.md 2.5).
    counter("switchml_worker_sparse_allreduces_total", "Block-sparse all-reduces run.",
            s.sparse_allreduces);
    counter("switchml_worker_sparse_blocks_total",
            "Blocks of the block-sparse all-reduces' tensors (announced).", s.sparse_blocks);
    counter("switchml_worker_sparse_union_blocks_total",
            "Of those, the blocks non-zero on some worker (the union).", s.sparse_union_blocks);
    counter("switchml_worker_sparse_aggregated_blocks_total",
            "Of those, the blocks that crossed the network (the union, or a dense share's every "
            "block).",
            s.sparse_aggregated_blocks);
    counter("switchml_worker_sparse_dense_shares_total",
            "Worker-thread shares of block-sparse all-reduces aggregated whole (dense).",
            s.sparse_dense_shares);
    gauge("switchml_worker_srtt_seconds",
          "Smoothed round trip to the switch (the largest over the worker threads).",
          s.srtt_us * 1e-6);
    gauge("switchml_worker_rttvar_seconds", "Round-trip variation (the largest over the threads).",
          s.rttvar_us * 1e-6);
    gauge("switchml_worker_rto_seconds",
          "Retransmission timeout now (the largest over the threads).", s.rto_us * 1e-6);
    return out;
  }

 private:
  std::function<ContextStats()> read_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> ContextStatsCollector(std::function<ContextStats()> read) {
  return std::make_shared<ContextCollector>(std::move(read));
}

}  // namespace switchml::metrics
