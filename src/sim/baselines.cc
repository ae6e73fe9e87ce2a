#include "sim/baselines.h"

#include <algorithm>
#include <cmath>

namespace switchml::sim {

const char* BaselineName(Baseline b) { return b == Baseline::kRing ? "ring" : "halving-doubling"; }

namespace {

struct Flow {
  uint32_t src, dst;  // ranks
  double bytes;       // payload
};

class FlowModel {
 public:
  FlowModel(const Topology& t, const BaselineConfig& c)
      : topo_(t), cfg_(c), busy_(t.links().size(), 0.0), sent_(c.hosts.size(), 0.0) {}

  Status Step(const std::vector<Flow>& flows) {
    std::vector<uint32_t> load(topo_.links().size(), 0);
    std::vector<std::vector<uint32_t>> paths;
    for (const Flow& f : flows) {
      paths.push_back(topo_.Path(cfg_.hosts[f.src], cfg_.hosts[f.dst]));
      if (paths.back().empty()) return InvalidArgumentError("two workers are not connected");
      for (uint32_t l : paths.back()) ++load[l];
    }
    double step = 0;
    for (size_t i = 0; i < flows.size(); ++i) {
      const Flow& f = flows[i];
      const double packets = std::ceil(f.bytes / cfg_.mtu_payload);
      const double wire = f.bytes + packets * cfg_.header_bytes;
      const double packet_wire = std::min<double>(f.bytes, cfg_.mtu_payload) + cfg_.header_bytes;
      double t = cfg_.host_latency_ns * 1e-9;
      double slowest = 0;
      for (size_t k = 0; k < paths[i].size(); ++k) {
        const LinkParams& p = topo_.links()[paths[i][k]].params;
        const double rate = p.gbps * 1e9 / 8;  // bytes per second
        slowest = std::max(slowest, wire * load[paths[i][k]] / rate);
        t += p.propagation_ns * 1e-9;
        if (k > 0) t += cfg_.switch_latency_ns * 1e-9 + packet_wire / rate;
        busy_[paths[i][k]] += wire / rate;
      }
      sent_[f.src] += f.bytes;
      step = std::max(step, t + slowest);
    }
    seconds_ += step;
    ++steps_;
    return Status();
  }

  BaselineResult Result() const {
    BaselineResult r;
    r.seconds = seconds_;
    r.steps = steps_;
    r.bytes_sent_per_worker = *std::max_element(sent_.begin(), sent_.end());
    for (double b : busy_) {
      r.max_link_utilisation = std::max(r.max_link_utilisation, seconds_ > 0 ? b / seconds_ : 0);
    }
    return r;
  }

 private:
  const Topology& topo_;
  const BaselineConfig& cfg_;
  std::vector<double> busy_;
  std::vector<double> sent_;
  double seconds_ = 0;
  uint32_t steps_ = 0;
};

}  // namespace

Result<BaselineResult> SimulateBaseline(Baseline algorithm, const Topology& topology,
                                        const BaselineConfig& config) {
  const uint32_t n = static_cast<uint32_t>(config.hosts.size());
  if (n == 0) return InvalidArgumentError("no workers");
  if (config.mtu_payload == 0) return InvalidArgumentError("mtu_payload must be positive");
  FlowModel m(topology, config);
  const double S = static_cast<double>(config.bytes);
  if (n == 1 || config.bytes == 0) return m.Result();
  if (algorithm == Baseline::kRing) {
    // Reduce-scatter then all-gather: 2 (n - 1) steps, each rank sending one of n blocks to the
    // next rank.
    const double block = std::ceil(S / n);
    std::vector<Flow> flows;
    for (uint32_t r = 0; r < n; ++r) flows.push_back({r, (r + 1) % n, block});
    for (uint32_t s = 0; s < 2 * (n - 1); ++s) {
      Status st = m.Step(flows);
      if (!st.ok()) return st;
    }
    return m.Result();
  }
  // Halving-doubling over the largest power of two p <= n; the other n - p ranks first send their
  // tensor to a partner among the first ones and get the result back at the end.
  uint32_t p = 1;
  while (p * 2 <= n) p *= 2;
  const uint32_t extra = n - p;
  std::vector<Flow> flows;
  if (extra > 0) {
    for (uint32_t r = 0; r < extra; ++r) flows.push_back({p + r, r, S});
    Status st = m.Step(flows);
    if (!st.ok()) return st;
  }
  // Reduce-scatter: exchange half the tensor with the rank p/2 away, then a quarter with p/4...
  // All-gather: the same exchanges in reverse, each block doubling.
  for (int phase = 0; phase < 2; ++phase) {
    for (uint32_t i = 1; i < p; i *= 2) {
      const uint32_t d = phase == 0 ? p / (2 * i) : i;
      flows.clear();
      for (uint32_t r = 0; r < p; ++r) flows.push_back({r, r ^ d, std::ceil(S * d / p)});
      Status st = m.Step(flows);
      if (!st.ok()) return st;
    }
  }
  if (extra > 0) {
    flows.clear();
    for (uint32_t r = 0; r < extra; ++r) flows.push_back({r, p + r, S});
    Status st = m.Step(flows);
    if (!st.ok()) return st;
  }
  return m.Result();
}

}  // namespace switchml::sim
