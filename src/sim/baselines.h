// Host-based all-reduce baselines on the simulator's links: ring all-reduce and halving-doubling
// (Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather).
//
// Flow-level, not packet-level (docs/simulator.md says why): each algorithm is a sequence of
// steps; in a step every participating worker sends one block to one peer, all at once. A flow's
// time is its wire bytes over its bottleneck link's fair share (the link rate divided by the
// number of the step's flows crossing that link) plus the path's latency (propagation, switch and
// host latency, and one packet's store-and-forward per extra hop); a step ends with its slowest
// flow. The workers' reduction arithmetic is free (as the switch's is), and a step starts only
// when the previous one ended everywhere (a barrier per step: what rings and butterflies do).
// No loss.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/topology.h"
#include "switchml/status.h"

namespace switchml::sim {

enum class Baseline : uint8_t { kRing, kHalvingDoubling };
const char* BaselineName(Baseline b);

struct BaselineConfig {
  std::vector<uint32_t> hosts;  // rank r on hosts[r]
  uint64_t bytes = 0;           // the tensor
  // Transport framing: payload per packet and bytes of headers per packet on the wire (Ethernet,
  // IP, UDP as the SwitchML format pays them, plus a 12-byte transport header as RoCE's BTH).
  uint32_t mtu_payload = 4096;
  uint32_t header_bytes = 66 + 12;
  double switch_latency_ns = 500;
  double host_latency_ns = 0;
};

struct BaselineResult {
  double seconds = 0;
  uint32_t steps = 0;
  double bytes_sent_per_worker = 0;  // payload, the busiest worker
  double max_link_utilisation = 0;   // over the whole run
};

// topology must be Finalize()d.
Result<BaselineResult> SimulateBaseline(Baseline algorithm, const Topology& topology,
                                        const BaselineConfig& config);

}  // namespace switchml::sim
